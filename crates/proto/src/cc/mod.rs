//! Congestion control for MetaRoCE connections.
//!
//! # Design
//!
//! A MetaRoCE connection sprays packets over many paths (one UDP source port
//! per path, each path pinned to one ECMP route, so packets on a path arrive
//! in order). Congestion control therefore works at two levels:
//!
//! * **Per path**: each path has its own window, RTT and ECN state. A path
//!   whose route crosses a congested link sees CE marks and shrinks its own
//!   window, which moves traffic to the other paths instead of slowing the
//!   whole connection.
//! * **Per connection**: one connection window bounds the total bytes in
//!   flight. It starts at the bandwidth-delay product (the connection starts
//!   at line rate), is reduced by exactly the bytes a path gives up when that
//!   path is cut, grows additively while the paths are clean, and is clamped
//!   immediately to the receiver's rate hint (the receiver's share of its
//!   link for this sender), which is what settles an incast within one or
//!   two round trips.
//!
//! # Contract between the connection owner and a controller
//!
//! * Before sending a packet of `pkt` bytes on path `p` the owner checks
//!   `path_inflight(p) + pkt <= path_window(p)` and
//!   `conn_inflight + pkt <= connection_window()`. The owner always allows
//!   one packet on a path whose in-flight count is zero, so the windows can
//!   never stall a connection; controllers nevertheless guarantee that both
//!   windows are always at least one MSS ([`CcConfig::mss_bytes`]).
//! * Path windows never exceed [`CcConfig::max_path_window_bytes`] (but are
//!   never below one MSS, even if that cap is configured smaller).
//! * Events are delivered per path slot in `0..path_count`. Events for an
//!   out-of-range slot are ignored and `path_window` of such a slot reports
//!   one MSS; no method panics, whatever the input.
//! * [`AckSample::path_inflight_bytes`] is the path's in-flight bytes *after*
//!   this ACK's newly acknowledged bytes were removed. Controllers use it to
//!   grow a path's window only while the path actually uses that window.
//! * Time (`now_ns`) is a monotonic clock in nanoseconds supplied by the
//!   owner; controllers never read a clock themselves (sans-IO).
//!
//! The only algorithm today is [`CcAlgorithm::MetaRoce`], see [`MetaRoceCc`].

mod metaroce;
mod receive_only;
pub use metaroce::{MetaRoceCc, MetaRoceParams};
pub(crate) use receive_only::ReceiveOnly;

/// Index of a path in the connection's path table.
pub type PathSlot = usize;

/// Static configuration of a connection's congestion controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CcConfig {
    /// Bytes of one full-size packet on the wire.
    pub mss_bytes: u64,
    /// Local NIC line rate, bits/s.
    pub line_rate_bps: u64,
    /// Configured unloaded fabric RTT, for the initial BDP.
    pub base_rtt_ns: u64,
    /// Number of path slots.
    pub path_count: usize,
    /// Hard cap per path (the 256-packet SACK window x mss).
    pub max_path_window_bytes: u64,
    /// The longest the receiver may hold an ACK (`ack_delay_ns`): a window
    /// sized from a grant must cover a round trip and that wait, or the
    /// ACK clock stalls below the grant.
    pub ack_delay_ns: u64,
    /// NIC planes the paths are spread over (1: one fabric). Each plane is
    /// a fabric of its own, with its own queues and ECN marks.
    pub planes: u16,
}

/// What one ACK told the sender about one path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AckSample {
    /// Time the ACK was processed.
    pub now_ns: u64,
    /// Newly acknowledged bytes on this path by this ACK.
    pub acked_bytes: u64,
    /// Newly acknowledged packets.
    pub acked_packets: u32,
    /// Newly reported CE-marked packets on this path (delta of the cumulative echo).
    pub ce_packets: u32,
    /// RTT sample from the timestamp echo, if any.
    pub rtt_ns: Option<u64>,
    /// The path's smoothed RTT after this sample.
    pub srtt_ns: u64,
    /// The path's bytes in flight after this ACK's acknowledged bytes were removed.
    pub path_inflight_bytes: u64,
}

/// A congestion controller for one MetaRoCE connection.
pub trait CongestionController: std::fmt::Debug + Send {
    /// Short algorithm name for logs and stats.
    fn name(&self) -> &'static str;
    /// An ACK arrived for `path`.
    fn on_ack(&mut self, path: PathSlot, sample: &AckSample);
    /// Loss detected by a SACK gap on `path` (one call per lost packet batch).
    fn on_loss(&mut self, path: PathSlot, lost_bytes: u64, now_ns: u64);
    /// The receiver reported packets of `path` trimmed to their headers
    /// by a switch: lost to a full queue, so congestion, never a random
    /// loss. By default the same as a loss.
    fn on_trim(&mut self, path: PathSlot, lost_bytes: u64, now_ns: u64) {
        self.on_loss(path, lost_bytes, now_ns);
    }
    /// Retransmission timeout on `path` (no ACK for an RTO).
    fn on_rto(&mut self, path: PathSlot, now_ns: u64);
    /// Receiver rate hint from an ACK (bits/s; 0 = no hint) and the connection's smoothed RTT.
    fn on_rate_hint(&mut self, rate_bps: u64, srtt_ns: u64, now_ns: u64);
    /// The path slot was retired and reopened with a fresh source port: forget its history;
    /// a replacement path starts on probation (small window, grows quickly while clean).
    fn on_path_replaced(&mut self, path: PathSlot, now_ns: u64);
    /// Current window of `path` in bytes (always >= one MSS).
    fn path_window(&self, path: PathSlot) -> u64;
    /// An RTO on `path` proved spurious (a packet it gave up on arrived):
    /// undo its cut.
    fn on_spurious_rto(&mut self, path: PathSlot, now_ns: u64) {
        let _ = (path, now_ns);
    }
    /// The rate to pace new packets at, if any (the receiver's grant).
    fn pacing_rate_bps(&self) -> Option<u64> {
        None
    }
    /// The connection sent nothing for long enough that what it knows of
    /// the receiver is stale, and has a message to send again.
    fn on_idle_restart(&mut self, now_ns: u64) {
        let _ = now_ns;
    }
    /// The receiver's grant given at connection setup, before any data
    /// (bits/s; 0 = no cap): it may replace the cold start's first round
    /// trip. By default ignored.
    fn on_setup_grant(&mut self, rate_bps: u64, now_ns: u64) {
        let _ = (rate_bps, now_ns);
    }
    /// Whether the controller holds the connection to one packet until the
    /// receiver's first ACK (a cold start).
    fn awaiting_grant(&self) -> bool {
        false
    }
    /// Current connection window in bytes (always >= one MSS).
    fn connection_window(&self) -> u64;
    /// Snapshot for stats/tracing.
    fn metrics(&self) -> CcMetrics;
    /// Bytes of memory the controller holds (for the per-peer memory figure).
    fn memory_bytes(&self) -> usize;
}

/// Snapshot of a controller's state for stats and tracing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CcMetrics {
    /// Current connection window, bytes.
    pub connection_window: u64,
    /// Receiver rate cap in force, bits/s (0 = none).
    pub rate_cap_bps: u64,
    /// Number of ECN-triggered path window reductions.
    pub ecn_reductions: u64,
    /// Number of loss-triggered (SACK gap) path window reductions.
    pub loss_reductions: u64,
    /// Number of RTO-triggered path window reductions.
    pub rto_reductions: u64,
    /// Losses not taken as congestion (no recent ECN on their path).
    pub random_losses: u64,
}

/// Selects a congestion-control algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CcAlgorithm {
    /// Per-path ECN AIMD plus connection AIMD plus receiver rate hint.
    #[default]
    MetaRoce,
}

/// Builds a controller for `algorithm` with its tunables.
pub fn new_controller(
    algorithm: CcAlgorithm,
    config: &CcConfig,
    params: &MetaRoceParams,
) -> Box<dyn CongestionController> {
    match algorithm {
        CcAlgorithm::MetaRoce => Box::new(MetaRoceCc::new(*config, *params)),
    }
}
