//! The provider's tunables: every one a libfabric parameter
//! (`fi_param_define`, so `fi_info -e` lists it as `FI_METAROCE_<NAME>`),
//! read once when the provider loads and logged once with its value and
//! where the value came from.

use metaroce_udp::Impair;
use std::net::Ipv4Addr;

/// One tunable: its name as libfabric prefixes it, its default and help.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Name without the `FI_METAROCE_` prefix, lower case.
    pub name: &'static str,
    /// Default value as text.
    pub default: &'static str,
    /// Help shown by `fi_info -e`.
    pub help: &'static str,
}

/// Every tunable the provider reads.
pub const PARAMS: &[Param] = &[
    Param {
        name: "bind_ip",
        default: "127.0.0.1",
        help: "IPv4 address the endpoints bind (MetaRoCE UDP ports and the connection manager's TCP listener); peers reach this endpoint there",
    },
    Param {
        name: "dev_port",
        default: "4793",
        help: "UDP port of an endpoint's MetaRoCE device (its paths send from the ports above it); when taken, as by the other endpoints and ranks on this host, a free range is used; 0: always a free range",
    },
    Param {
        name: "eager_limit",
        default: "16384",
        help: "Largest message sent eagerly (copied into the peer's receive slots); larger ones use a rendezvous over RDMA READ",
    },
    Param {
        name: "recv_slots",
        default: "64",
        help: "Receive slots posted per connection (each eager_limit + 56 bytes)",
    },
    Param {
        name: "paths",
        default: "8",
        help: "MetaRoCE paths (UDP source ports) per connection",
    },
    Param {
        name: "mtu",
        default: "0",
        help: "MetaRoCE payload bytes per datagram; 0: sized toward each peer from the path, the largest whose datagrams leave unfragmented, at most 8192, or 61440 for a device bound to a loopback address (a value the path cannot carry whole fails the connection, naming the path)",
    },
    Param {
        name: "icrc",
        default: "0",
        help: "1: compute and check the ICRC on every data packet; 0: endpoints agree to leave it to the UDP checksum (packets are not authenticated)",
    },
    Param {
        name: "direct",
        default: "1",
        help: "1: receive large WRITE and READ-response payloads straight into their buffers (a peek at the headers, then one read); 0: copy every payload from a receive buffer",
    },
    Param {
        name: "rto_min_us",
        default: "4000",
        help: "Lowest retransmission timeout in microseconds (a VM's scheduler tick makes lower values fire on healthy paths)",
    },
    Param {
        name: "impair",
        default: "",
        help: "Receive-side fault injection of the datapath, e.g. loss=0.05,seed=7 (keys loss, reorder, dup, seed); empty: off",
    },
    Param {
        name: "stats",
        default: "0",
        help: "1: print each endpoint's MetaRoCE counters (data, resends, RTOs, path retirements, ECN) to stderr when it closes (they are always logged at FI_LOG_LEVEL=info)",
    },
    Param {
        name: "linger_ms",
        default: "20",
        help: "Milliseconds an endpoint keeps answering peers after fi_close once nothing is in flight (a peer whose last message's ACK was lost resends it and must be answered); at most 1 s in all; 0: acknowledge what was received and close at once",
    },
    Param {
        name: "staging_cache_mb",
        default: "256",
        help: "MiB of rendezvous staging regions kept registered for reuse",
    },
];

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The environment (or libfabric's config).
    Environment,
    /// The built-in default.
    Default,
}

/// The provider's settings.
#[derive(Debug, Clone)]
pub struct Tunables {
    /// Address endpoints bind.
    pub bind_ip: Ipv4Addr,
    /// Device port tried first (a free range when taken; 0: always one).
    pub dev_port: u16,
    /// Largest eager message in bytes.
    pub eager_limit: usize,
    /// Receive slots per connection.
    pub recv_slots: u32,
    /// Paths per connection.
    pub paths: u16,
    /// Datagram payload bytes; 0: sized from the path toward each peer.
    pub mtu: u32,
    /// Always compute the ICRC (else offer peers to omit it).
    pub icrc: bool,
    /// Direct placement of large payloads (`DeviceConfig::direct_placement`).
    pub direct: bool,
    /// Lowest RTO, µs.
    pub rto_min_us: u64,
    /// Receive-side impairment.
    pub impair: Option<Impair>,
    /// Print counters at close.
    pub stats: bool,
    /// Staging cache bytes.
    pub staging_cache_bytes: usize,
    /// Quiet time an endpoint lingers for at close, ms.
    pub linger_ms: u64,
}

impl Default for Tunables {
    fn default() -> Self {
        Self::from_lookup(|_| None).0
    }
}

impl Tunables {
    /// Read every tunable through `lookup` (name → value if set), falling
    /// back to the default for unset or invalid values. Returns the
    /// settings and one log line per tunable (invalid values say so).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> (Self, Vec<(bool, String)>) {
        let mut lines = Vec::new();
        let get = |name: &str| -> (String, Source) {
            let p = PARAMS
                .iter()
                .find(|p| p.name == name)
                .expect("every read tunable is in PARAMS");
            match lookup(name) {
                Some(v) => (v, Source::Environment),
                None => (p.default.to_string(), Source::Default),
            }
        };
        let mut out = Self {
            bind_ip: Ipv4Addr::LOCALHOST,
            dev_port: metaroce_udp::DEFAULT_DEVICE_PORT,
            eager_limit: 16384,
            recv_slots: 64,
            paths: 8,
            mtu: 0,
            icrc: false,
            direct: true,
            rto_min_us: 4000,
            impair: None,
            stats: false,
            staging_cache_bytes: 256 << 20,
            linger_ms: 20,
        };
        let mut note = |name: &str, v: &str, src: Source, err: Option<String>| {
            let var = format!("FI_METAROCE_{}", name.to_uppercase());
            let from = match src {
                Source::Environment => "from the environment",
                Source::Default => "default",
            };
            match err {
                None => lines.push((false, format!("{var}={v:?} ({from})"))),
                Some(e) => lines.push((
                    true,
                    format!("{var}={v:?} is invalid ({e}); using the default"),
                )),
            }
        };
        macro_rules! num {
            ($name:literal, $field:ident, $ty:ty, $range:expr) => {{
                let (v, src) = get($name);
                match v.trim().parse::<$ty>() {
                    Ok(n) if ($range).contains(&n) => {
                        out.$field = n.into();
                        note($name, &v, src, None);
                    }
                    Ok(_) => note($name, &v, src, Some(format!("must be in {:?}", $range))),
                    Err(e) => note($name, &v, src, Some(e.to_string())),
                }
            }};
        }
        let (v, src) = get("bind_ip");
        match v.trim().parse::<Ipv4Addr>() {
            Ok(ip) => {
                out.bind_ip = ip;
                note("bind_ip", &v, src, None);
            }
            Err(e) => note("bind_ip", &v, src, Some(e.to_string())),
        }
        num!("dev_port", dev_port, u16, 0..=65_000u16);
        num!("eager_limit", eager_limit, usize, 64..=(1usize << 20));
        num!("recv_slots", recv_slots, u32, 4..=4096u32);
        num!("paths", paths, u16, 1..=64u16);
        let (v, src) = get("mtu");
        match v.trim().parse::<u32>() {
            Ok(n) if n == 0 || (256..=65_000).contains(&n) => {
                out.mtu = n;
                note("mtu", &v, src, None);
            }
            Ok(_) => note("mtu", &v, src, Some("must be 0 or in 256..=65000".into())),
            Err(e) => note("mtu", &v, src, Some(e.to_string())),
        }
        num!("rto_min_us", rto_min_us, u64, 10..=1_000_000u64);
        num!("linger_ms", linger_ms, u64, 0..=1_000u64);
        let (v, src) = get("impair");
        if v.trim().is_empty() {
            note("impair", &v, src, None);
        } else {
            match v.parse::<Impair>() {
                Ok(i) => {
                    out.impair = Some(i);
                    note("impair", &v, src, None);
                }
                Err(e) => note("impair", &v, src, Some(e)),
            }
        }
        let mut flag = |name: &str| -> Option<bool> {
            let (v, src) = get(name);
            match v.trim() {
                "1" | "true" | "yes" | "on" => {
                    note(name, &v, src, None);
                    Some(true)
                }
                "0" | "false" | "no" | "off" | "" => {
                    note(name, &v, src, None);
                    Some(false)
                }
                _ => {
                    note(name, &v, src, Some("expected 0 or 1".into()));
                    None
                }
            }
        };
        out.stats = flag("stats").unwrap_or(false);
        out.icrc = flag("icrc").unwrap_or(false);
        out.direct = flag("direct").unwrap_or(true);
        let (v, src) = get("staging_cache_mb");
        match v.trim().parse::<usize>() {
            Ok(n) if n <= 1 << 20 => {
                out.staging_cache_bytes = n << 20;
                note("staging_cache_mb", &v, src, None);
            }
            _ => note(
                "staging_cache_mb",
                &v,
                src,
                Some("expected MiB, 0..=1048576".into()),
            ),
        }
        (out, lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let (t, lines) = Tunables::from_lookup(|_| None);
        assert_eq!(t.eager_limit, 16384);
        assert_eq!(lines.len(), PARAMS.len());
        assert!(lines.iter().all(|(bad, _)| !bad));
        let (t, lines) = Tunables::from_lookup(|n| match n {
            "eager_limit" => Some("1024".into()),
            "impair" => Some("loss=0.05,seed=7".into()),
            "paths" => Some("0".into()),
            "bind_ip" => Some("nonsense".into()),
            _ => None,
        });
        assert_eq!(t.eager_limit, 1024);
        assert_eq!(t.impair.unwrap().loss, 0.05);
        assert_eq!(t.paths, 8);
        assert_eq!(t.bind_ip, Ipv4Addr::LOCALHOST);
        let bad: Vec<_> = lines.iter().filter(|(b, _)| *b).map(|(_, l)| l).collect();
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].contains("FI_METAROCE_BIND_IP"));
    }
}
