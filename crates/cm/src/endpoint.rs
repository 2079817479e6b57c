//! One side's description of itself: what the peer needs to move its own
//! RC QPs to RTR toward this side and to address this side's memory.

use serde::{Deserialize, Serialize};

/// One memory buffer the peer may access.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoteBuf {
    /// First address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One side's device and QPs. The device's IP is the IP of that side's
/// end of the TCP connection; only the port travels here (so the kernel's
/// routing picks matching addresses on both sides).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Endpoint {
    /// MetaRoCE device port (data and ACKs arrive there).
    pub device_port: u16,
    /// Path source-port span (informational, for firewalls): path source
    /// ports are `device_port + 1 ..= device_port + path_port_span`.
    pub path_port_span: u16,
    /// MTU payload bytes of the device.
    pub mtu: u32,
    /// QP numbers, in the order the QPs pair up.
    pub qpns: Vec<u32>,
    /// The buffer the peer may access.
    pub buf: RemoteBuf,
    /// The device's session id (changes every time the device starts):
    /// with packet authentication it enters the connection's keys, so a
    /// restarted device never reuses a key with old packet numbers.
    /// Absent (a peer that predates it): 0.
    #[serde(default)]
    pub session_id: u64,
    /// Packet protection this side runs: "none", "authenticated" or
    /// "encrypted". Both sides must agree; the secret itself never travels.
    /// Absent (a peer that predates it): "none".
    #[serde(default = "auth_none")]
    pub auth: String,
    /// This side takes data packets whose ICRC the sender omitted (the UDP
    /// checksum protecting them instead, wire.md 7.2). Each side omits it
    /// toward the other only when both say so. Absent (a peer that
    /// predates it): false.
    #[serde(default)]
    pub icrc_omission: bool,
    /// The share of this side's line it promises the peer's sends before
    /// the first ACK, in Mbit/s (0: the whole line, the peer is its only
    /// sender). The peer starts at it instead of a cold round trip
    /// (transport spec §2, "Setup grants"). Absent (a side that promises
    /// nothing, or predates it): the peer starts cold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_grant_mbps: Option<u64>,
    /// With packet authentication, the server's key confirmation in its
    /// `Accept` (64 hex digits, [`crate::KeyConfirmation`]); absent
    /// otherwise and in the client's `Hello`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_confirm: Option<String>,
}

fn auth_none() -> String {
    "none".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that predates `session_id` and `auth` still parses, as an
    /// unprotected endpoint of session 0.
    #[test]
    fn missing_session_and_auth_default() {
        let e: Endpoint = serde_json::from_str(
            r#"{"device_port":1,"path_port_span":32,"mtu":4096,"qpns":[65536],
                "buf":{"addr":0,"rkey":2,"len":8}}"#,
        )
        .unwrap();
        assert_eq!(e.session_id, 0);
        assert_eq!(e.auth, "none");
        assert!(!e.icrc_omission);
        assert_eq!(e.key_confirm, None);
        assert_eq!(e.setup_grant_mbps, None);
    }

    /// A promise travels and comes back as sent; none is left out.
    #[test]
    fn a_setup_grant_round_trips_and_is_left_out_when_absent() {
        let mut e: Endpoint = serde_json::from_str(
            r#"{"device_port":1,"path_port_span":32,"mtu":4096,"qpns":[65536],
                "buf":{"addr":0,"rkey":2,"len":8},"setup_grant_mbps":0}"#,
        )
        .unwrap();
        assert_eq!(e.setup_grant_mbps, Some(0));
        let text = serde_json::to_string(&e).unwrap();
        assert!(text.contains(r#""setup_grant_mbps":0"#), "{text}");
        e.setup_grant_mbps = None;
        let text = serde_json::to_string(&e).unwrap();
        assert!(!text.contains("setup_grant"), "{text}");
    }
}
