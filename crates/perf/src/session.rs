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
