//! A finished session as either side sees it: figures, verdict, the
//! perftest address lines and the device's counters.

use crate::messages::Report;
use crate::{Figures, Params, Test};
use metaroce_udp::DeviceStats;
use std::net::SocketAddr;

/// One side's address line (perftest's `local address:` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrLine {
    /// Device address.
    pub dev: SocketAddr,
    /// QP number.
    pub qpn: u32,
    /// Remote key of the buffer.
    pub rkey: u64,
    /// Buffer address.
    pub vaddr: u64,
}

impl AddrLine {
    /// perftest-like rendering.
    pub fn render(&self, which: &str) -> String {
        format!(
            " {which} address: IP {} PORT {} QPN {:#06x} PSN 0x000000 RKey {:#018x} VAddr {:#018x}",
            self.dev.ip(),
            self.dev.port(),
            self.qpn,
            self.rkey,
            self.vaddr
        )
    }
}

/// A finished client session.
#[derive(Debug, Clone)]
pub struct Session {
    /// Figures.
    pub figures: Figures,
    /// Whether the data checked out (None: not checked).
    pub verified: Option<bool>,
    /// What was checked, or what differs.
    pub detail: String,
    /// Local and remote address lines (first QP).
    pub local: AddrLine,
    /// Remote.
    pub remote: AddrLine,
    /// The client device's counters.
    pub stats: DeviceStats,
    /// Datagrams the server counted as malformed.
    pub server_rx_malformed: u64,
    /// Payload bytes per packet the session used (the smaller of the two
    /// sides' offers).
    pub mtu: u32,
    /// What the client's kernel said of the path to the server.
    pub path: metaroce_udp::PathMtu,
    /// When the bytes completed (bandwidth tests; empty for latency tests).
    pub progress: Progress,
    /// Both sides sent data packets without the ICRC (wire.md 7.2).
    pub icrc_omitted: bool,
}

/// A bandwidth session's completions over time: `marks_ns[0]` is the start
/// ([`metaroce_udp::now_ns`] clock) and `marks_ns[i]` when the
/// `i * bytes_per_mark`-th byte completed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The start, then one stamp per `bytes_per_mark` completed.
    pub marks_ns: Vec<u64>,
    /// Bytes between two marks.
    pub bytes_per_mark: u64,
}

impl Progress {
    /// Bytes completed in `[from_ns, to_ns)` (absolute stamps), counted by
    /// marks.
    pub fn bytes_between(&self, from_ns: u64, to_ns: u64) -> u64 {
        let n = self.marks_ns[1.min(self.marks_ns.len())..]
            .iter()
            .filter(|&&t| t >= from_ns && t < to_ns)
            .count() as u64;
        n * self.bytes_per_mark
    }
}

/// A finished server session.
#[derive(Debug, Clone)]
pub struct ServerSession {
    /// The test.
    pub test: Test,
    /// Its parameters.
    pub params: Params,
    /// What the server sent back.
    pub report: Report,
    /// Server (local) and client (remote) address lines.
    pub local: AddrLine,
    /// Remote.
    pub remote: AddrLine,
    /// The server device's counters.
    pub stats: DeviceStats,
}
