//! A finished session as either side sees it: figures, verdict, the
//! perftest address lines and the device's counters.

use crate::messages::Report;
use crate::{Figures, Params, Test};
use metaroce_udp::{DeviceCounters, DeviceStats};
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
    /// Every counter of the client device, its connection and paths, at
    /// the session's end.
    pub counters: DeviceCounters,
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

/// A bandwidth session's completions over time: `marks[0]` is the start
/// ([`metaroce_udp::now_ns`] clock, 0 operations), then `(stamp_ns,
/// operations completed by then)` every hundred or so operations (CQ
/// moderation completes them in batches), the last at the final
/// completion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// `(stamp_ns, operations completed)`, both nondecreasing.
    pub marks: Vec<(u64, u64)>,
    /// Bytes per operation (the message size).
    pub bytes_per_op: u64,
}

impl Progress {
    /// When the transfer started (0 for a session without marks).
    pub fn start_ns(&self) -> u64 {
        self.marks.first().map_or(0, |m| m.0)
    }

    /// When the last operation completed (0 for a session without marks).
    pub fn end_ns(&self) -> u64 {
        self.marks.last().map_or(0, |m| m.0)
    }

    /// Bytes whose completion was marked in `[from_ns, to_ns)` (absolute
    /// stamps).
    pub fn bytes_between(&self, from_ns: u64, to_ns: u64) -> u64 {
        let done_before = |t: u64| {
            let i = self.marks.partition_point(|m| m.0 < t);
            i.checked_sub(1).map_or(0, |i| self.marks[i].1)
        };
        done_before(to_ns).saturating_sub(done_before(from_ns)) * self.bytes_per_op
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
    /// Every counter of the server device, its connection and paths.
    pub counters: DeviceCounters,
}
