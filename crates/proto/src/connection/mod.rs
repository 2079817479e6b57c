//! A connection: everything one endpoint keeps about one peer device.
//!
//! One connection carries every QP (stream) between the two devices, over
//! `paths_per_connection` paths, under one congestion controller, so the
//! state grows with peers, not with QPs x paths. It owns:
//! - the sending paths ([`TxPath`]) and the receiving view of the peer's
//!   paths ([`RxPath`]);
//! - the outgoing messages and the queues that feed the wire (ACKs first,
//!   then probes, retransmissions, new segments);
//! - the timers: per-path RTO and tail-loss probe, delayed ACK, RNR backoff
//!   and the connection's retry timer that ends in `RetryExcErr`.
//!
//! Its parts, one file each:
//! - [`transmit`]: which packet goes next, on which path, and emitting it;
//! - [`receive`]: a data packet's PSN into its path's [`SackBitmap`], an
//!   ACK into the paths' in-flight lists and the congestion controller;
//! - [`timers`]: deadlines, RTOs, tail-loss probes, path retirement, retries;
//! - [`responder`] and [`requester`]: what operations do at either end of a
//!   QP. They keep their state in the QP table and reach the connection
//!   only through the handful of methods in the "operations" section below.
//!
//! Follow a packet: `Endpoint::post_send` builds a [`TxMessage`] and queues
//! it here ([`Connection::enqueue`]); [`Connection::poll_transmit`] picks a
//! path with room, emits the header and gathers the payload from the memory
//! region; at the peer, [`Connection::on_data`] records the PSN and hands
//! the operation to the responder, which places the bytes; the peer's ACK
//! comes back to [`Connection::on_ack`], which frees the segment, feeds the
//! congestion controller and gives the op-ack to the requester, which
//! completes the work request.

mod receive;
mod requester;
pub(crate) use requester::direct_read_target;
mod responder;
pub(crate) use responder::direct_write_target;
mod timers;
mod transmit;

use crate::admission::SenderState;
use crate::auth::ConnectionAuth;
use crate::cc::{CcConfig, CcMetrics, CongestionController, new_controller};
use crate::device_state::DeviceState;
use crate::maybe_ns::MaybeNs;
use crate::message::{MessageSlab, MsgRef, SegRef, TxMessage};
use crate::path::{PathStats, RxPathStats, SentPacket, SentState, TxPath, initial_psn};
use crate::qp::Qp;
use crate::recent_ports::RecentPorts;
use crate::reorder::GapVerdict;
use crate::replacement_ports::ReplacementPorts;
use crate::rtt::RttEstimator;
use crate::rtt_histogram::RttHistogram;
use crate::sack::SackBitmap;
use crate::trace::{ConnTrace, trace_event};
use metaroce_wire::{AckRepr, Flags, seq};
use std::collections::VecDeque;
use std::net::SocketAddr;

/// The most packets a path may have outstanding: the span of the SACK bitmap.
const PATH_PSN_WINDOW: u32 = 255;
/// Bytes of headers a full data packet adds to its payload (for windows).
const PACKET_OVERHEAD_BYTES: u32 = 64;
/// Bytes the network adds to each datagram on an Ethernet link: a paced
/// sender's grant is a rate on the receiver's link, where these bytes
/// take their time too.
const FRAME_OVERHEAD_BYTES: u64 = metaroce_wire::FRAME_OVERHEAD_LEN as u64;

/// Whether an ACK goes twice, back to back: one lost on the way back then
/// costs nothing. Only the ACKs a sender's recovery waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckCopy {
    No,
    /// The answer to a resend or a duplicate: twice while this
    /// connection's packets are being lost (`ack_copy_horizon_ns`).
    IfLossy,
    /// The answer to a connection's first packet: a cold sender waits a
    /// probe timeout (two RTTs) for it, and knows nothing yet to do
    /// otherwise. One small copy per connection, always.
    Always,
}

/// Receiver-side state of one of the peer's paths.
#[derive(Debug)]
struct RxPath {
    generation: u16,
    window: SackBitmap,
    rx_packets: u32,
    ce_packets: u32,
    /// Payload bytes of the `rx_packets` (counters only).
    payload_bytes: u64,
    /// Duplicates received (counters only).
    duplicates: u64,
    last_ts: u32,
    last_rx_ns: u64,
    unacked: u32,
    ack_queued: bool,
    ack_deadline: MaybeNs,
    /// Moves this path's ACKs to another reverse route (see `on_data`).
    ack_route: u16,
    /// When the ACK route last moved.
    ack_route_moved_ns: u64,
    /// When this path's last ACK left (0: none yet).
    ack_sent_ns: u64,
    /// Whether the next ACK goes twice.
    copy_ack: AckCopy,
    /// Our cumulative ACK point when `ack_port` was picked or last heard:
    /// once the peer's window floor (carried by its data) passes it, the
    /// peer has heard an ACK we sent from that port since.
    ack_port_floor: u32,
    /// When the peer last showed it heard our ACKs from `ack_port` (0: not
    /// since it was picked): a route known to work now, not hoped to.
    ack_port_heard_ns: u64,
    /// The source port this path's ACKs leave from; 0 until the first ACK
    /// (and after a move) picks one.
    ack_port: u16,
    /// Trimmed packets not yet reported: `trim_count` psns from
    /// `trim_first` on (received ones among them are in the SACK).
    trim_count: u8,
    /// See `trim_count`.
    trim_first: u32,
}

impl Connection {
    /// Remember that our ACKs to the peer from `port` were lost (0: none
    /// chosen yet, nothing to remember): no path picks it anew for a while.
    fn note_bad_ack_port(&mut self, port: u16, now_ns: u64, dev: &DeviceState) {
        if port == 0 {
            return;
        }
        self.bad_ack_ports.note(port);
        // Other paths' ACKs leaving from that port take the same dead way
        // back: move them too, before their senders have to probe. Not
        // those heard from it within four base RTTs (a route shared since
        // an earlier move): the port lives for them, and the probe that
        // condemned it had another cause. In the embedded default's core
        // link failure a live path moved so was sent by the plain step onto
        // the failed link, its ACKs going into it 124.8 µs after it failed.
        // Not where the fabric loses 2 % or more at random (the bar of
        // `replacement_ports`): there probes come from random losses, a
        // port heard a moment ago proves little, and keeping paths on it
        // cost the 10 %/link permutation 6 % (mean of seeds 1-6).
        let recent_ns = if dev.silence_is_evidence() {
            now_ns.saturating_sub(4 * dev.config.base_rtt_ns)
        } else {
            u64::MAX
        };
        for rx in self.rx_paths.iter_mut().flatten() {
            if rx.ack_port == port && rx.ack_port_heard_ns <= recent_ns {
                rx.ack_port = 0;
                rx.ack_port_heard_ns = 0;
            }
        }
    }
}

impl RxPath {
    fn new(psn_base: u32, slot: u8, generation: u16) -> Self {
        Self {
            generation,
            window: SackBitmap::new(initial_psn(psn_base, slot, generation)),
            rx_packets: 0,
            ce_packets: 0,
            payload_bytes: 0,
            duplicates: 0,
            last_ts: 0,
            last_rx_ns: 0,
            unacked: 0,
            ack_queued: false,
            ack_deadline: MaybeNs::NONE,
            ack_route: 0,
            ack_route_moved_ns: 0,
            ack_sent_ns: 0,
            copy_ack: AckCopy::No,
            ack_port_floor: 0,
            ack_port_heard_ns: 0,
            ack_port: 0,
            trim_count: 0,
            trim_first: 0,
        }
    }

    /// Remember that `psn` arrived trimmed. One run per ACK: a psn that
    /// would stretch the run past what an ACK can name starts a new run,
    /// and the older one is left to the sender's loss detection.
    fn note_trimmed(&mut self, psn: u32) {
        if self.trim_count == 0 {
            (self.trim_first, self.trim_count) = (psn, 1);
            return;
        }
        let end = self.trim_first.wrapping_add(u32::from(self.trim_count));
        let first = if seq::seq_lt(psn, self.trim_first) {
            psn
        } else {
            self.trim_first
        };
        let end = if seq::seq_lt(psn, end) {
            end
        } else {
            psn.wrapping_add(1)
        };
        match u8::try_from(end.wrapping_sub(first)) {
            Ok(count) => (self.trim_first, self.trim_count) = (first, count),
            Err(_) => (self.trim_first, self.trim_count) = (psn, 1),
        }
    }

    /// The trimmed run for the next ACK, as (offset from the window's
    /// `ack_psn`, count), and forget it. The part of the run below
    /// `ack_psn` (since received whole) is dropped.
    fn take_trimmed(&mut self) -> (u16, u8) {
        let count = std::mem::take(&mut self.trim_count);
        if count == 0 {
            return (0, 0);
        }
        let ack_psn = self.window.ack_psn();
        let below = seq::seq_diff(ack_psn, self.trim_first).max(0);
        let count = i64::from(count) - i64::from(below);
        let first = if below > 0 { ack_psn } else { self.trim_first };
        match u16::try_from(first.wrapping_sub(ack_psn)) {
            Ok(offset) if count > 0 => (offset, count as u8),
            _ => (0, 0),
        }
    }
}

/// A probe owed on a path: a packet asking for an ACK, past the windows.
#[derive(Debug, Clone, Copy)]
struct PathProbe {
    path: usize,
    /// What it carries when the path has nothing of its own outstanding: a
    /// suspect path's segments were resent elsewhere, a fresh replacement
    /// never had any, a cold copy's path is idle. A tail copy always sends
    /// it.
    carry: Option<SegRef>,
    kind: ProbeKind,
}

/// Why a probe goes: what it sends and how it is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeKind {
    /// A tail-loss probe of a silent path: the path's newest outstanding
    /// segment, else what it carries.
    Silence,
    /// A copy of a cold connection's first packet (transport spec §4,
    /// "Cold copies"): redundancy sent up front, counted as a cold copy,
    /// not as a resend or a tail-loss probe.
    ColdCopy,
    /// A paced sender's tail copy (transport spec §4, "Tail copies"): the
    /// carried segment again, on another path, unless it was acknowledged
    /// meanwhile; counted as a resend.
    TailCopy,
}

impl PathProbe {
    fn on(path: usize, carry: Option<SegRef>) -> Self {
        Self {
            path,
            carry,
            kind: ProbeKind::Silence,
        }
    }
}

/// An entry of the retransmit queue.
#[derive(Debug, Clone, Copy)]
struct Resend {
    seg: SegRef,
    /// The path it was lost on: resend elsewhere if any other path has room.
    lost_on: Option<u8>,
    /// Send even if acknowledged: a probe asking the peer to repeat its op-ack.
    probe: bool,
}

/// Give up on packet `sent` of path `p` (a SACK gap, a trim NACK, a
/// timeout): it is lost, counted on the path, and its segment queued to go
/// again on another path. Returns its bytes on the wire.
fn give_up(
    sent: &mut SentPacket,
    p: usize,
    path_stats: &mut PathStats,
    queue: &mut VecDeque<Resend>,
) -> u64 {
    sent.set_state(SentState::Lost);
    path_stats.packets_lost += 1;
    queue.push_back(Resend {
        seg: sent.seg(),
        lost_on: Some(p as u8),
        probe: false,
    });
    u64::from(sent.wire_bytes)
}

/// Counters of one connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Data packets sent, first transmissions.
    pub data_packets_sent: u64,
    /// Data packets resent (loss, timeout, RNR, probes).
    pub data_packets_retransmitted: u64,
    /// Data packets declared lost.
    pub data_packets_lost: u64,
    /// ACK packets sent.
    pub acks_sent: u64,
    /// ACK packets received.
    pub acks_received: u64,
    /// Payload bytes sent (first transmissions).
    pub payload_bytes_sent: u64,
    /// Path retransmission timeouts.
    pub rtos: u64,
    /// Connection retry timeouts (no progress at all).
    pub retry_timeouts: u64,
    /// Paths retired and replaced.
    pub paths_replaced: u64,
    /// Paths retired because they proved dead (an unanswered probe, losses
    /// in a row) while others delivered, without waiting for an RTO.
    pub path_failovers: u64,
    /// Retired paths heard from afterwards (the failure was a stall).
    pub spurious_failovers: u64,
    /// RTOs proved spurious afterwards (the packets were late, not lost),
    /// and their window cut undone; each RTO counted once.
    pub spurious_rtos: u64,
    /// Retry rounds' and unanswered probes' give-ups proved spurious, per
    /// path.
    pub spurious_give_ups: u64,
    /// RTOs whose packets were proved lost (a later packet of the path
    /// arrived first).
    pub rtos_proved_lost: u64,
    /// Packets given up on for a SACK gap that arrived after all
    /// (reordering within a route).
    pub spurious_gap_losses: u64,
    /// Unanswered probes on a silent connection: the path's packets went
    /// again elsewhere (an RTO's work at the probe's timescale, without
    /// its window cut).
    pub probe_timeouts: u64,
    /// RNR NAKs received.
    pub rnr_naks: u64,
    /// Data packets received that had arrived before (the peer resent
    /// what did not need resending: spurious retransmissions and probes).
    pub duplicates_received: u64,
    /// Data packets sent on the wire, bytes (UDP payload), first
    /// transmissions and retransmissions.
    pub wire_bytes_sent: u64,
    /// Of `wire_bytes_sent`, retransmissions.
    pub wire_bytes_retransmitted: u64,
    /// Tail-loss probes sent (counted in retransmissions too).
    pub tail_probes: u64,
    /// Tail-loss probes the device's budget for speculative packets
    /// refused (asked again a probe timeout later).
    pub probes_deferred: u64,
    /// Data packets received (new on their path; duplicates apart).
    pub data_packets_received: u64,
    /// Payload bytes of those packets.
    pub payload_bytes_received: u64,
    /// Of the data packets received, those that arrived CE marked.
    pub ce_marked_received: u64,
    /// CE marks the peer echoed for the data this side sent.
    pub ce_marks_echoed: u64,
    /// RTT samples taken.
    pub rtt_samples: u64,
    /// Snapshot: smallest RTT sample, ns (0: none yet).
    pub rtt_min_ns: u64,
    /// Snapshot: smoothed RTT over all paths, ns.
    pub srtt_ns: u64,
    /// Snapshot: 99th percentile of the RTT samples, ns (the upper edge of
    /// a histogram bucket about 19 % wide; 0: none yet).
    pub rtt_p99_ns: u64,
    /// Snapshot: the congestion controller's connection window, bytes.
    pub window_bytes: u64,
    /// Snapshot: bytes in flight over all paths.
    pub inflight_bytes: u64,
}

/// One peer.
#[derive(Debug)]
pub(crate) struct Connection {
    index: u32,
    peer: SocketAddr,
    /// Paths the connection sprays over (`paths_per_connection` once it
    /// has sent; 0 while it only receives).
    path_count: usize,
    /// The paths used so far: always the first slots (see
    /// `create_paths_through`).
    paths: Vec<TxPath>,
    /// Each path's next deadline (RTO or tail probe; `u64::MAX` for none),
    /// refreshed whenever that path changes, so `next_timeout`, which runs
    /// after every packet, reads numbers instead of recomputing every path.
    path_deadlines: Vec<u64>,
    rx_paths: Vec<Option<RxPath>>,
    /// Receive paths with a delayed-ACK deadline set: the timer visits
    /// these, not every receive path (with a hundred paths, walking the
    /// large `RxPath` records was a cache miss each).
    ack_pending: Vec<u8>,
    cc: Box<dyn CongestionController>,
    msgs: MessageSlab,
    send_queue: VecDeque<MsgRef>,
    retransmit_queue: VecDeque<Resend>,
    inflight_bytes: u64,
    /// Pacing (while the receiver's grant caps us): no new data packet
    /// before this time.
    next_pace_ns: u64,
    /// A packet was held back by pacing: wake at `next_pace_ns`.
    pace_blocked: bool,
    /// The last data packet's slot, and its size on the wire. The slot is
    /// when it went out, or, while paced, when it was due: a packet held
    /// behind other connections' packets keeps a little of its lateness
    /// as credit, so the next one is not pushed back too (see
    /// `take_pacing_slot`). Pacing and the idle restart measure from it.
    last_data_slot_ns: u64,
    last_paced_bytes: u64,
    /// After a trim NACK while paced: the next data packet goes at this
    /// time instead of a gap after the last one (see `on_ack`).
    pace_restart_ns: MaybeNs,
    /// How late a spurious timeout showed this peer's answers to be: the
    /// RTO floor for a while (`rto_floor_ns`).
    stall_allowance_ns: u64,
    /// When it was last raised or halved.
    stall_allowance_at_ns: u64,
    /// The path whose turn it is (paths are at most 256).
    rr_path: u8,
    /// Wire bytes sent on `rr_path` in its current turn (see
    /// `EndpointConfig::path_burst_bytes`).
    path_run_bytes: u32,
    ack_now: VecDeque<u8>,
    /// Second copies of ACKs just sent, while the connection is lossy.
    ack_copies: VecDeque<(AckRepr, u16)>,
    /// When a hole or a duplicate last showed on a receive path (0: never).
    rx_loss_seen_ns: u64,
    /// The smallest one-way delay seen on the peer's packets, as our clock
    /// less its 32-bit timestamp (the clocks' offset included), and when
    /// it was first taken (0: none yet); renewed every second so that the
    /// clocks' drift does not age it.
    rx_delay_min: u32,
    rx_delay_min_at_ns: u64,
    /// When we last read a peer's packet much later than its fastest
    /// (this host stalled, or its socket queued): probes for a while
    /// after it ask about ACKs that were late, not lost.
    rx_late_ns: u64,
    /// New data was queued since the tail was last copied.
    tail_copy_armed: bool,
    /// Probes to send.
    path_probes: VecDeque<PathProbe>,
    ack_deadline: Option<u64>,
    /// Local QPs (by slot) whose op-ack the next ACKs must carry.
    dirty_qps: VecDeque<u32>,
    /// Local QPs (by slot) bound to this peer.
    qps: Vec<u32>,
    conn_rtt: RttEstimator,
    /// Cross-path RACK: the send time of the latest-sent packet acknowledged
    /// on any path, and how long it took (send to ACK). A path whose newest
    /// packet went out before it and is still unanswered that much later
    /// (plus a reordering window) is suspect: see `rack_deadline`.
    rack_sent_ns: u64,
    rack_rtt_ns: u64,
    /// The latest packet given up on for a SACK gap. If a later ACK of
    /// its path reports it received, the gap was reordering, not loss.
    gap_lost: Option<GapVerdict>,
    /// Every RTT sample of the connection, for its percentiles.
    rtt_histogram: RttHistogram,
    /// When the connection last made progress (the retry timer's origin).
    last_progress_ns: u64,
    /// When the early completion probe last went (timers.rs,
    /// `completion_probe_deadline`; `u64::MAX`: never): the next waits
    /// until the time since the last progress has doubled.
    completion_probed_at_ns: u64,
    /// Retry timeouts since the last progress.
    timeouts: u32,
    /// A path was retired since the last progress without evidence that
    /// other paths work (the whole connection silent): at most one is.
    blind_retired: bool,
    /// Send data packets with [`Flags::ICRC_OMITTED`] and no ICRC computed:
    /// the peer agreed to take them (`Endpoint::set_peer_icrc_omission`).
    omit_icrc: bool,
    /// Messages parked by an RNR NAK, and when each goes again.
    rnr_timers: Vec<(u64, MsgRef)>,
    /// What admission keeps about this peer as a sender to us.
    admission: SenderState,
    stats: ConnectionStats,
    scratch_segs: Vec<SegRef>,
    /// Ports of retired paths, and how fresh ports fared lately (see
    /// `replacement_ports.rs`); built with the first retirement.
    replacement_ports: Option<Box<ReplacementPorts>>,
    /// Source ports our ACKs to this peer recently left from and were lost
    /// on (a probe asked again, or the peer renewed the path): skipped when
    /// an ACK route moves, so a moved route does not land on a port whose
    /// way back is known dead (see `RxPath::ack_port`).
    bad_ack_ports: RecentPorts<4>,
    /// Keys, packet numbers and the replay window, when the endpoint
    /// authenticates packets. Boxed: 1.6 KiB of keys and replay window
    /// would otherwise sit in every connection of an unauthenticated
    /// endpoint (a simulated 8192-host fabric has 16,384 of them).
    auth: Option<Box<ConnectionAuth>>,
    /// The connection's and its paths' `tracing` spans (see `trace.rs`).
    trace: ConnTrace,
}

impl Connection {
    ///
    /// The send side (paths and their congestion state, a few hundred bytes
    /// per path) is built with the first message: a connection that only
    /// receives, and only sends ACKs, never needs it (half the connections
    /// of a permutation, and all 1023 of an incast receiver's).
    pub(crate) fn new(
        index: u32,
        peer: SocketAddr,
        dev: &DeviceState,
        auth: Option<Box<ConnectionAuth>>,
    ) -> Self {
        let mut conn = Self::with_paths(index, peer, dev, auth, 0);
        conn.trace = ConnTrace::open(peer, index);
        trace_event!(in: conn.trace.enter(), INFO, "connection set up");
        conn
    }

    /// Build the send side if this is the connection's first message.
    pub(super) fn ensure_send_side(&mut self, dev: &DeviceState) {
        if self.path_count != 0 {
            return;
        }
        let fresh = Self::with_paths(
            self.index,
            self.peer,
            dev,
            None,
            dev.config.paths_per_connection,
        );
        self.path_count = fresh.path_count;
        self.cc = fresh.cc;
    }

    /// Build paths up to slot `p` (of `path_count`) if they do not exist.
    ///
    /// A path is a few hundred bytes here and in the controller, and most
    /// connections of a large collective carry a few packets: a 4 KB
    /// all-to-all over 1024 hosts opens a million connections and uses one
    /// path of each. So paths are built on first use, and `paths` always
    /// holds the first slots: the round robin reaches slot `paths.len()`
    /// before any later one, and a path built late is exactly what it would
    /// have been if built with the connection (generation 0 on its default
    /// port, nothing in flight, the base RTT), since nothing touches a path
    /// before its first packet. Code reading all paths reads only these;
    /// the rest hold nothing to read.
    fn create_paths_through(&mut self, p: usize, dev: &DeviceState) {
        debug_assert!(p < self.path_count, "slot {p} of {}", self.path_count);
        while self.paths.len() <= p.min(self.path_count.saturating_sub(1)) {
            let slot = self.paths.len();
            // Grown from one: most connections of a large collective use
            // one or two paths.
            crate::grow::push(&mut self.paths, Self::default_path(slot, dev));
            crate::grow::push(&mut self.path_deadlines, u64::MAX);
            self.open_path_trace(slot);
        }
    }

    /// Path `slot` as built before its first packet.
    fn default_path(slot: usize, dev: &DeviceState) -> TxPath {
        let cfg = &dev.config;
        TxPath::new(
            slot as u8,
            0,
            cfg.device_port + 1 + slot as u16,
            cfg.psn_base,
            cfg.base_rtt_ns,
        )
    }

    /// Path `p` starts a generation: its span, and an event in it.
    fn open_path_trace(&mut self, p: usize) {
        let path = &self.paths[p];
        self.trace.open_path(p, path.generation, path.src_port);
        trace_event!(in: self.trace.enter_path(p), DEBUG, "path opened");
    }

    /// The connection's spans, for events the endpoint emits about it.
    #[cfg(feature = "trace")]
    pub(crate) fn trace(&self) -> &ConnTrace {
        &self.trace
    }

    /// UDP source port of path `slot`, also before the send side exists
    /// (ACKs of a receive-only connection are sprayed over the same ports).
    pub(crate) fn path_port(&self, slot: usize, dev: &DeviceState) -> u16 {
        match self.paths.get(slot) {
            Some(path) => path.src_port,
            None => dev.config.device_port + 1 + slot as u16,
        }
    }

    /// What a closed connection's slot holds until it is reused: no paths,
    /// no queues, nothing allocated, never ready and never due.
    pub(crate) fn closed(index: u32, dev: &DeviceState) -> Self {
        let nowhere = SocketAddr::from(([0, 0, 0, 0], 0));
        Self::with_paths(index, nowhere, dev, None, 0)
    }

    fn with_paths(
        index: u32,
        peer: SocketAddr,
        dev: &DeviceState,
        auth: Option<Box<ConnectionAuth>>,
        n: usize,
    ) -> Self {
        let cfg = &dev.config;
        let mss = u64::from(cfg.mtu_payload_bytes + PACKET_OVERHEAD_BYTES);
        let cc: Box<dyn CongestionController> = if n == 0 {
            // No send side yet: nothing to steer (see `cc::ReceiveOnly`).
            Box::new(crate::cc::ReceiveOnly)
        } else {
            new_controller(
                cfg.cc,
                &CcConfig {
                    mss_bytes: mss,
                    line_rate_bps: cfg.line_rate_bps,
                    base_rtt_ns: cfg.base_rtt_ns,
                    path_count: n,
                    max_path_window_bytes: u64::from(PATH_PSN_WINDOW) * mss,
                    planes: cfg.port_planes,
                    ack_delay_ns: cfg.ack_delay_ns,
                },
                &cfg.cc_params,
            )
        };
        Self {
            index,
            peer,
            path_count: n,
            path_deadlines: Vec::new(),
            paths: Vec::new(),
            rx_paths: Vec::new(),
            ack_pending: Vec::new(),
            cc,
            msgs: MessageSlab::default(),
            send_queue: VecDeque::new(),
            retransmit_queue: VecDeque::new(),
            inflight_bytes: 0,
            next_pace_ns: 0,
            pace_blocked: false,
            last_data_slot_ns: 0,
            last_paced_bytes: 0,
            pace_restart_ns: MaybeNs::NONE,
            stall_allowance_ns: 0,
            stall_allowance_at_ns: 0,
            rr_path: 0,
            path_run_bytes: 0,
            ack_now: VecDeque::new(),
            ack_copies: VecDeque::new(),
            rx_loss_seen_ns: 0,
            rx_delay_min: 0,
            rx_delay_min_at_ns: 0,
            rx_late_ns: 0,
            tail_copy_armed: false,
            path_probes: VecDeque::new(),
            ack_deadline: None,
            dirty_qps: VecDeque::new(),
            qps: Vec::new(),
            conn_rtt: RttEstimator::new(cfg.base_rtt_ns),
            rack_sent_ns: 0,
            rack_rtt_ns: 0,
            gap_lost: None,
            rtt_histogram: RttHistogram::default(),
            last_progress_ns: 0,
            completion_probed_at_ns: u64::MAX,
            blind_retired: false,
            timeouts: 0,
            omit_icrc: false,
            rnr_timers: Vec::new(),
            admission: SenderState::default(),
            stats: ConnectionStats::default(),
            scratch_segs: Vec::new(),
            replacement_ports: None,
            bad_ack_ports: RecentPorts::new(),
            auth,
            trace: ConnTrace::none(),
        }
    }

    /// Omit the ICRC of data packets toward this peer (it agreed to take
    /// them so) or not. Packets keep it when authenticated: the tag is
    /// their trailer.
    pub(crate) fn set_omit_icrc(&mut self, omit: bool) {
        self.omit_icrc = omit;
    }

    /// Whether data packets leave without their ICRC computed.
    fn omits_icrc(&self) -> bool {
        self.omit_icrc && self.auth.is_none()
    }

    /// The base flags every packet of this connection carries.
    fn base_flags(&self, flags: Flags) -> Flags {
        if self.auth.is_some() {
            flags | Flags::AUTHENTICATED
        } else {
            flags
        }
    }

    /// Bytes of heap and inline state this connection holds (for the
    /// per-peer memory figure).
    pub(crate) fn memory_bytes(&self) -> usize {
        let paths: usize = self
            .paths
            .iter()
            .map(|p| size_of::<TxPath>() + p.inflight.capacity() * size_of::<SentPacket>())
            .sum();
        size_of::<Self>()
            + paths
            + self.rx_paths.capacity() * size_of::<Option<RxPath>>()
            + self.send_queue.capacity() * size_of::<MsgRef>()
            + self.retransmit_queue.capacity() * size_of::<Resend>()
            + self.ack_now.capacity()
            + self.ack_copies.capacity() * size_of::<(AckRepr, u16)>()
            + self.dirty_qps.capacity() * 4
            + self.qps.capacity() * 4
            + self.msgs.memory_bytes()
            + self.cc.memory_bytes()
            + self.rtt_histogram.memory_bytes()
            + self.auth.as_deref().map_or(0, ConnectionAuth::memory_bytes)
            + self.trace.memory_bytes()
    }

    /// Per-path counters with each path's current state (every slot, also
    /// those not used yet).
    pub(crate) fn path_stats(&self, dev: &DeviceState) -> Vec<PathStats> {
        let unused: Vec<TxPath> = (self.paths.len()..self.path_count)
            .map(|slot| Self::default_path(slot, dev))
            .collect();
        self.paths
            .iter()
            .chain(&unused)
            .enumerate()
            .map(|(slot, p)| PathStats {
                src_port: p.src_port,
                generation: p.generation,
                rtt_min_ns: Some(p.rtt.rtt_ns_min())
                    .filter(|&n| n != u64::MAX)
                    .unwrap_or(0),
                srtt_ns: p.rtt.srtt_ns(),
                window_bytes: self.cc.path_window(slot),
                inflight_bytes: p.inflight_bytes,
                ..p.stats
            })
            .collect()
    }

    /// Each receive path's counters, by the peer's slot (`None`: a slot
    /// the peer has not sent on).
    pub(crate) fn rx_path_stats(&self) -> Vec<Option<RxPathStats>> {
        self.rx_paths
            .iter()
            .map(|rx| {
                rx.as_ref().map(|rx| RxPathStats {
                    generation: rx.generation,
                    packets_received: rx.rx_packets,
                    payload_bytes_received: rx.payload_bytes,
                    ce_marked: rx.ce_packets,
                    duplicates: rx.duplicates,
                })
            })
            .collect()
    }

    /// Whether anything waits to be sent.
    pub(crate) fn has_pending_output(&self) -> bool {
        !self.ack_now.is_empty()
            || !self.ack_copies.is_empty()
            || !self.path_probes.is_empty()
            || !self.retransmit_queue.is_empty()
            || !self.send_queue.is_empty()
            // Each ACK at a drained connection's tail may make it short
            // enough to copy (see `queue_tail_copies`).
            || (self.tail_copy_armed && self.inflight_bytes > 0)
    }

    // ---------------------------------------------------------------- messages

    /// Queue a new message for transmission.
    pub(crate) fn enqueue(&mut self, now_ns: u64, dev: &DeviceState, msg: TxMessage) -> MsgRef {
        self.ensure_send_side(dev);
        let idle_ns = dev
            .config
            .idle_restart_rtts
            .saturating_mul(dev.config.base_rtt_ns);
        if idle_ns > 0
            && self.inflight_bytes == 0
            && self.stats.data_packets_sent > 0
            && now_ns.saturating_sub(self.last_data_slot_ns) > idle_ns
        {
            // Idle long enough that the receiver's last grant says nothing
            // about now (others may have started toward it meanwhile).
            self.cc.on_idle_restart(now_ns);
        }
        if self.msgs.live() == 0 {
            // Work starts: the retry timer measures from here.
            self.last_progress_ns = now_ns;
            self.timeouts = 0;
        }
        let r = self.msgs.insert(msg);
        self.queue_for_send(r);
        self.tail_copy_armed = true;
        r
    }

    fn queue_for_send(&mut self, r: MsgRef) {
        if let Some(m) = self.msgs.get_mut(r)
            && !m.queued
        {
            m.queued = true;
            self.send_queue.push_back(r);
        }
    }

    /// The peer is gone: drop every message, every queued packet and all
    /// in-flight accounting.
    fn drop_all_messages(&mut self) {
        for r in self.msgs.refs_where(|_| true) {
            self.msgs.remove(r);
        }
        self.send_queue.clear();
        self.retransmit_queue.clear();
        self.rnr_timers.clear();
        for p in &mut self.paths {
            p.inflight.clear();
            p.inflight_bytes = 0;
        }
        self.path_deadlines.fill(u64::MAX);
        self.inflight_bytes = 0;
    }

    /// Forget a message (completed, failed or cancelled). Packets still in
    /// flight for it are ignored when acknowledged.
    fn free_msg(&mut self, r: MsgRef) {
        self.msgs.remove(r);
    }

    /// Rewind a message after an RNR NAK once its timer fires.
    fn resend_whole(&mut self, r: MsgRef) {
        if let Some(m) = self.msgs.get_mut(r) {
            m.rnr_wait = false;
            m.rewind();
            m.queued = false;
            self.queue_for_send(r);
        }
    }

    /// Drop every message of local QP `qp` (it failed or was destroyed).
    pub(crate) fn cancel_qp_messages(&mut self, qp: u32) {
        for r in self.msgs.refs_where(|m| m.qp == qp) {
            self.msgs.remove(r);
        }
    }

    // -------------------------------------------------------- for the endpoint

    /// The peer device's address (IP and device port).
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Counters, with the connection's current RTT and window.
    pub(crate) fn stats(&self) -> ConnectionStats {
        ConnectionStats {
            rtt_min_ns: self.conn_rtt.measured_min_ns().unwrap_or(0),
            srtt_ns: self.conn_rtt.srtt_ns(),
            rtt_p99_ns: self.rtt_histogram.quantile_ns(990),
            window_bytes: if self.path_count == 0 {
                0
            } else {
                self.cc.connection_window()
            },
            inflight_bytes: self.inflight_bytes,
            ..self.stats
        }
    }

    /// The congestion controller's view.
    pub(crate) fn cc_metrics(&self) -> CcMetrics {
        self.cc.metrics()
    }

    /// Messages held: local requests not yet completed and responses not
    /// yet acknowledged, over every QP (`max_outstanding_ops_per_connection`
    /// bounds it).
    pub(crate) fn messages_held(&self) -> usize {
        self.msgs.live()
    }

    /// Carry local QP `qp_index` to this peer from now on.
    pub(crate) fn bind_qp(&mut self, qp_index: u32) {
        self.qps.push(qp_index);
    }

    /// Stop carrying local QP `qp_index` and drop its messages; returns
    /// whether any QP is left (if not, the endpoint closes the connection).
    pub(crate) fn unbind_qp(&mut self, qp_index: u32) -> bool {
        self.cancel_qp_messages(qp_index);
        self.qps.retain(|&i| i != qp_index);
        !self.qps.is_empty()
    }

    /// The packet keys, when the endpoint authenticates.
    pub(crate) fn auth_mut(&mut self) -> Option<&mut ConnectionAuth> {
        self.auth.as_deref_mut()
    }

    /// Move local QP `qp_index` to the error state: its messages are
    /// cancelled, both its queues flushed in order.
    pub(crate) fn fail_qp(&mut self, dev: &mut DeviceState, qp_index: usize) {
        requester::enter_error(self, dev, qp_index);
    }

    /// Release the send completions at the head of QP `qp_index`'s queue
    /// that are ready (after a post that completed at once).
    pub(crate) fn release_completions(&mut self, dev: &mut DeviceState, qp_index: usize) {
        requester::release_completions(self, dev, qp_index);
    }

    // ------------------------------------------------------------- operations
    //
    // All the responder and the requester touch of a connection.

    /// The connection's slot in the endpoint (QPs name it when bound).
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// Have the next ACK carry `qp`'s op-ack (its cumulative MSN, and its
    /// NAK if any).
    fn queue_op_ack(&mut self, qp: &mut Qp) {
        if !qp.op_ack_dirty {
            qp.op_ack_dirty = true;
            self.dirty_qps.push_back(qp.handle.index() as u32);
        }
    }

    /// The peer answered: restart the retry timer's clock and budget.
    fn note_progress(&mut self, now_ns: u64) {
        self.last_progress_ns = now_ns;
        self.timeouts = 0;
        self.blind_retired = false;
    }

    /// Whether message `msg` (if it still exists) already waits out an RNR
    /// NAK; a message that is gone counts as waiting (nothing to park).
    fn rnr_waiting(&self, msg: Option<MsgRef>) -> bool {
        msg.and_then(|r| self.msgs.get(r))
            .is_none_or(|m| m.rnr_wait)
    }

    /// Count an RNR NAK from the peer.
    fn count_rnr_nak(&mut self) {
        self.stats.rnr_naks += 1;
    }

    /// Park message `msg` until `until_ns`, then send it whole again (the
    /// peer dropped its payload for want of a receive).
    fn start_rnr_backoff(&mut self, msg: MsgRef, until_ns: u64) {
        self.msgs
            .get_mut(msg)
            .expect("checked by the caller")
            .rnr_wait = true;
        self.rnr_timers.push((until_ns, msg));
    }

    /// Local QPs (by slot) bound to this peer.
    fn bound_qps(&self) -> &[u32] {
        &self.qps
    }
}

/// The QP in slot `index`, which the caller knows is live (looked up by
/// number a moment before, or bound to the connection).
fn live_qp(dev: &mut DeviceState, index: usize) -> &mut Qp {
    dev.qps.at_mut(index).expect("live QP")
}
