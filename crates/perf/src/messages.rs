//! The perf tests' connection-manager bodies
//! (`docs/spec/connection-manager.md`): the client's [`Hello`] carries the
//! test's [`Params`], both sides' `Accept` / Hello endpoints are
//! [`metaroce_cm::Endpoint`]s, and the run ends with the client's [`Done`]
//! and the server's [`Report`].

use crate::Params;
use serde::{Deserialize, Serialize};

/// Client → server: the test's name and [`Params`] with the client's
/// endpoint.
pub type Hello = metaroce_cm::Hello<Params>;

/// Client → server at the end.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Done {
    /// Operations the client completed.
    pub completed: u64,
}

/// Server → client at the end.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Report {
    /// The server checked the data it holds (None: nothing to check there).
    pub verified: Option<bool>,
    /// What was checked or what differs.
    pub detail: String,
    /// Datagrams the server's core counted as malformed.
    pub rx_malformed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use metaroce_cm::{Endpoint, RemoteBuf};

    /// The Hello's JSON keeps the field names and nesting of
    /// `docs/spec/connection-manager.md`: `{test, params: {size, iters,
    /// duration_s, qps, tx_depth, verify, mtu, paths, pattern_seed},
    /// endpoint: {...}, last}`.
    #[test]
    fn hello_encoding_matches_the_spec() {
        let h = Hello {
            test: "write-bw".into(),
            params: Params {
                size: 65_536,
                iters: 5000,
                duration_s: 0,
                qps: 1,
                tx_depth: 128,
                verify: true,
                mtu: 4096,
                paths: 16,
                pattern_seed: 9,
                run_infinitely: false,
                buffer_bytes: None,
            },
            endpoint: Endpoint {
                device_port: 4791,
                path_port_span: 32,
                mtu: 4096,
                qpns: vec![0x10000],
                buf: RemoteBuf {
                    addr: 0x7f00_0000_0000,
                    rkey: 5,
                    len: 65_536,
                },
                session_id: 3,
                auth: "none".into(),
                icrc_omission: true,
                key_confirm: None,
                setup_grant_mbps: Some(0),
            },
            last: true,
        };
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"test":"write-bw","params":{"size":65536,"iters":5000,"duration_s":0,"#,
                r#""qps":1,"tx_depth":128,"verify":true,"mtu":4096,"paths":16,"pattern_seed":9},"#,
                r#""endpoint":{"device_port":4791,"path_port_span":32,"mtu":4096,"qpns":[65536],"#,
                r#""buf":{"addr":139637976727552,"rkey":5,"len":65536},"session_id":3,"auth":"none","#,
                r#""icrc_omission":true,"setup_grant_mbps":0},"#,
                r#""last":true}"#
            )
        );
        let back: Hello = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);
        let done = serde_json::to_string(&Done { completed: 42 }).unwrap();
        assert_eq!(done, r#"{"completed":42}"#);
    }
}
