//! A connection: everything one endpoint keeps about one peer device.
//!
//! One connection carries every QP (stream) between the two devices, over
//! `paths_per_connection` paths, under one congestion controller, so the
//! state grows with peers, not with QPs x paths. It owns:
//! - the sending paths ([`TxPath`]) and the receiving view of the peer's
//!   paths ([`RxPath`]);
//! - the outgoing messages and the queues that feed the wire (ACKs first,
//!   then retransmissions, then new segments);
//! - the timers: per-path RTO, delayed ACK, RNR backoff and the
//!   connection's retry timer that ends in `RetryExcErr`.
//!
//! Follow a packet: `Endpoint::post_send` builds a [`TxMessage`] and queues
//! it here; [`Connection::poll_transmit`] picks a path with room, emits the
//! header and gathers the payload from the memory region; at the peer,
//! [`Connection::on_data`] records the PSN in that path's [`SackBitmap`] and
//! hands the operation to the QP logic in `ops.rs`, which places the bytes;
//! the peer's ACK comes back to [`Connection::on_ack`], which frees the
//! segment, feeds the congestion controller and, with the op-ack, completes
//! the work request.

use crate::auth::ConnectionAuth;
use crate::cc::{AckSample, CcConfig, CongestionController, new_controller};
use crate::device_state::DeviceState;
use crate::ecn::Ecn;
use crate::maybe_ns::MaybeNs;
use crate::message::{MessageSlab, MsgKind, MsgRef, SegRef, TxMessage};
use crate::ops;
use crate::path::{PathStats, SentPacket, SentState, TxPath, initial_psn};
use crate::rtt::RttEstimator;
use crate::sack::{RxOutcome, SackBitmap, sack_contains, sack_highest};
use crate::transmit::{Layout, Out, PacketKind, PayloadRef, Transmit};
use metaroce_wire::{self as wire, AckRepr, BaseRepr, DataRepr, Flags, ICRC_LEN, seq};
use rand_core::Rng;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// The most packets a path may have outstanding: the span of the SACK bitmap.
pub(crate) const PATH_PSN_WINDOW: u32 = 255;
/// Bytes of headers a full data packet adds to its payload (for windows).
pub(crate) const PACKET_OVERHEAD_BYTES: u32 = 64;

/// Receiver-side state of one of the peer's paths.
#[derive(Debug)]
pub(crate) struct RxPath {
    generation: u16,
    window: SackBitmap,
    rx_packets: u32,
    ce_packets: u32,
    last_ts: u32,
    last_rx_ns: u64,
    unacked: u32,
    ack_queued: bool,
    ack_deadline: MaybeNs,
}

impl RxPath {
    fn new(psn_base: u32, slot: u8, generation: u16) -> Self {
        Self {
            generation,
            window: SackBitmap::new(initial_psn(psn_base, slot, generation)),
            rx_packets: 0,
            ce_packets: 0,
            last_ts: 0,
            last_rx_ns: 0,
            unacked: 0,
            ack_queued: false,
            ack_deadline: MaybeNs::NONE,
        }
    }
}

/// An entry of the retransmit queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resend {
    pub(crate) seg: SegRef,
    /// The path it was lost on: resend elsewhere if any other path has room.
    pub(crate) lost_on: Option<u8>,
    /// Send even if acknowledged: a probe asking the peer to repeat its op-ack.
    pub(crate) probe: bool,
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
    /// RNR NAKs received.
    pub rnr_naks: u64,
}

/// One peer.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) index: u32,
    pub(crate) peer: SocketAddr,
    pub(crate) paths: Vec<TxPath>,
    /// Each path's next deadline (RTO or tail probe; `u64::MAX` for none),
    /// refreshed whenever that path changes, so `next_timeout`, which runs
    /// after every packet, reads numbers instead of recomputing every path.
    path_deadlines: Vec<u64>,
    rx_paths: Vec<Option<RxPath>>,
    /// Receive paths with a delayed-ACK deadline set: the timer visits
    /// these, not every receive path (with a hundred paths, walking the
    /// large `RxPath` records was a cache miss each).
    ack_pending: Vec<u8>,
    pub(crate) cc: Box<dyn CongestionController>,
    pub(crate) msgs: MessageSlab,
    send_queue: VecDeque<MsgRef>,
    pub(crate) retransmit_queue: VecDeque<Resend>,
    inflight_bytes: u64,
    rr_path: usize,
    ack_rr: usize,
    ack_now: VecDeque<u8>,
    path_probes: VecDeque<usize>,
    ack_deadline: Option<u64>,
    pub(crate) dirty_qps: VecDeque<u32>,
    pub(crate) qps: Vec<u32>,
    pub(crate) conn_rtt: RttEstimator,
    pub(crate) last_progress_ns: u64,
    pub(crate) timeouts: u32,
    pub(crate) rnr_timers: Vec<(u64, MsgRef)>,
    pub(crate) in_ready: bool,
    /// The deadline this connection has in the endpoint's timer heap.
    pub(crate) timer_deadline: Option<u64>,
    pub(crate) rx_epoch_seen: u64,
    pub(crate) stats: ConnectionStats,
    scratch_segs: Vec<SegRef>,
    /// Keys, packet numbers and the replay window, when the endpoint
    /// authenticates packets. Boxed: 1.6 KiB of keys and replay window
    /// would otherwise sit in every connection of an unauthenticated
    /// endpoint (a simulated 8192-host fabric has 16,384 of them).
    pub(crate) auth: Option<Box<ConnectionAuth>>,
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
        Self::with_paths(index, peer, dev, auth, 0)
    }

    /// Build the send side if this is the connection's first message.
    fn ensure_send_side(&mut self, dev: &DeviceState) {
        if !self.paths.is_empty() {
            return;
        }
        let fresh = Self::with_paths(
            self.index,
            self.peer,
            dev,
            None,
            dev.config.paths_per_connection,
        );
        self.paths = fresh.paths;
        self.path_deadlines = fresh.path_deadlines;
        self.cc = fresh.cc;
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
        let paths = (0..n)
            .map(|slot| {
                TxPath::new(
                    slot as u8,
                    0,
                    cfg.device_port + 1 + slot as u16,
                    cfg.psn_base,
                    cfg.base_rtt_ns,
                )
            })
            .collect();
        let mss = u64::from(cfg.mtu_payload_bytes + PACKET_OVERHEAD_BYTES);
        let cc = new_controller(
            cfg.cc,
            &CcConfig {
                mss_bytes: mss,
                line_rate_bps: cfg.line_rate_bps,
                base_rtt_ns: cfg.base_rtt_ns,
                path_count: n,
                max_path_window_bytes: u64::from(PATH_PSN_WINDOW) * mss,
            },
        );
        Self {
            index,
            peer,
            path_deadlines: vec![u64::MAX; n],
            paths,
            rx_paths: Vec::new(),
            ack_pending: Vec::new(),
            cc,
            msgs: MessageSlab::default(),
            send_queue: VecDeque::new(),
            retransmit_queue: VecDeque::new(),
            inflight_bytes: 0,
            rr_path: 0,
            ack_rr: 0,
            ack_now: VecDeque::new(),
            path_probes: VecDeque::new(),
            ack_deadline: None,
            dirty_qps: VecDeque::new(),
            qps: Vec::new(),
            conn_rtt: RttEstimator::new(cfg.base_rtt_ns),
            last_progress_ns: 0,
            timeouts: 0,
            rnr_timers: Vec::new(),
            in_ready: false,
            timer_deadline: None,
            rx_epoch_seen: u64::MAX,
            stats: ConnectionStats::default(),
            scratch_segs: Vec::new(),
            auth,
        }
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
            + self.dirty_qps.capacity() * 4
            + self.qps.capacity() * 4
            + self.msgs.memory_bytes()
            + self.cc.memory_bytes()
            + self.auth.as_deref().map_or(0, ConnectionAuth::memory_bytes)
    }

    /// Sum of per-path statistics.
    pub(crate) fn path_stats(&self) -> Vec<PathStats> {
        self.paths.iter().map(|p| p.stats).collect()
    }

    /// Whether anything waits to be sent.
    pub(crate) fn has_pending_output(&self) -> bool {
        !self.ack_now.is_empty()
            || !self.path_probes.is_empty()
            || !self.retransmit_queue.is_empty()
            || !self.send_queue.is_empty()
    }

    // ---------------------------------------------------------------- messages

    /// Queue a new message for transmission.
    pub(crate) fn enqueue(&mut self, now_ns: u64, dev: &DeviceState, msg: TxMessage) -> MsgRef {
        self.ensure_send_side(dev);
        if self.msgs.live() == 0 {
            // Work starts: the retry timer measures from here.
            self.last_progress_ns = now_ns;
            self.timeouts = 0;
        }
        let r = self.msgs.insert(msg);
        self.queue_for_send(r);
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
    pub(crate) fn drop_all_messages(&mut self) {
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
    pub(crate) fn free_msg(&mut self, r: MsgRef) {
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

    // ------------------------------------------------------------ transmission

    /// Emit the next packet of this connection into `buf`, if any may go now.
    pub(crate) fn poll_transmit(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        out: &mut Out<'_>,
    ) -> Option<Transmit> {
        if let Some(slot) = self.ack_now.pop_front() {
            return Some(self.emit_ack(now_ns, dev, slot, out));
        }
        while let Some(p) = self.path_probes.pop_front() {
            // Tail-loss probe: resend the path's newest outstanding segment on
            // that same path, past its window, asking for an ACK. If the data
            // arrived and only the ACK was lost, the ACK covers everything; if
            // the data was lost, the probe's PSN exposes the gap.
            let Some(seg) = self.paths[p]
                .inflight
                .iter()
                .rev()
                .filter(|s| s.state() == SentState::Outstanding)
                .map(SentPacket::seg)
                .find(|s| {
                    self.msgs
                        .get(s.msg)
                        .is_some_and(|m| m.attempt == s.attempt && !m.rnr_wait)
                })
            else {
                continue;
            };
            self.stats.data_packets_retransmitted += 1;
            dev.stats.data_packets_retransmitted += 1;
            dev.stats.tail_probes += 1;
            let flags = Flags::RETRANSMIT | Flags::ACK_REQUEST;
            return Some(self.emit_segment(now_ns, dev, p, seg, flags, out));
        }
        while let Some(resend) = self.retransmit_queue.front().copied() {
            let Some(msg) = self.msgs.get(resend.seg.msg) else {
                self.retransmit_queue.pop_front();
                continue;
            };
            let stale = msg.attempt != resend.seg.attempt || msg.rnr_wait;
            if stale || (!resend.probe && msg.is_acked(resend.seg.seg)) {
                self.retransmit_queue.pop_front();
                continue;
            }
            let bytes = self.wire_bytes(resend.seg);
            let path = self.choose_path(bytes, resend.lost_on)?;
            self.retransmit_queue.pop_front();
            let mut flags = Flags::RETRANSMIT;
            if resend.probe {
                flags |= Flags::ACK_REQUEST | Flags::COMPLETION_PROBE;
            }
            self.stats.data_packets_retransmitted += 1;
            dev.stats.data_packets_retransmitted += 1;
            return Some(self.emit_segment(now_ns, dev, path, resend.seg, flags, out));
        }
        while let Some(r) = self.send_queue.front().copied() {
            let Some(msg) = self.msgs.get(r).filter(|m| m.has_unsent()) else {
                self.send_queue.pop_front();
                if let Some(m) = self.msgs.get_mut(r) {
                    m.queued = false;
                }
                continue;
            };
            let seg = SegRef {
                msg: r,
                seg: msg.next_unsent,
                attempt: msg.attempt,
            };
            let last = seg.seg + 1 == msg.segs;
            let bytes = self.wire_bytes(seg);
            let path = self.choose_path(bytes, None)?;
            let msg = self.msgs.get_mut(r).expect("checked above");
            msg.next_unsent += 1;
            if !msg.has_unsent() {
                msg.queued = false;
                self.send_queue.pop_front();
            }
            // The last segment asks for an immediate ACK: completion latency
            // must not wait for the delayed-ACK timer.
            let flags = if last {
                Flags::ACK_REQUEST
            } else {
                Flags::default()
            };
            self.stats.data_packets_sent += 1;
            self.stats.payload_bytes_sent +=
                u64::from(self.msgs.get(r).map_or(0, |m| m.seg_range(seg.seg).1));
            return Some(self.emit_segment(now_ns, dev, path, seg, flags, out));
        }
        None
    }

    fn wire_bytes(&self, seg: SegRef) -> u64 {
        let payload = self.msgs.get(seg.msg).map_or(0, |m| m.seg_range(seg.seg).1);
        u64::from(payload + PACKET_OVERHEAD_BYTES)
    }

    /// Pick a path whose window has room for `bytes`, round robin, avoiding
    /// `avoid` when another path can take the packet.
    fn choose_path(&mut self, bytes: u64, avoid: Option<u8>) -> Option<usize> {
        if self.inflight_bytes > 0 && self.inflight_bytes + bytes > self.cc.connection_window() {
            return None;
        }
        let n = self.paths.len();
        for pass in 0..2 {
            for k in 0..n {
                let p = (self.rr_path + k) % n;
                if pass == 0 && n > 1 && avoid == Some(p as u8) {
                    continue;
                }
                let path = &self.paths[p];
                let psn_room = path.psn_span() < PATH_PSN_WINDOW;
                let window_room = path.inflight_bytes == 0
                    || path.inflight_bytes + bytes <= self.cc.path_window(p);
                if psn_room && window_room {
                    self.rr_path = (p + 1) % n;
                    return Some(p);
                }
            }
        }
        None
    }

    fn emit_segment(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        p: usize,
        seg: SegRef,
        flags: Flags,
        out: &mut Out<'_>,
    ) -> Transmit {
        let msg = self.msgs.get(seg.msg).expect("caller checked the message");
        let (offset, payload_len) = msg.seg_range(seg.seg);
        let wire_bytes = payload_len + PACKET_OVERHEAD_BYTES;
        let mss = u64::from(dev.config.mtu_payload_bytes + PACKET_OVERHEAD_BYTES);
        let mut flags = flags;
        if self.paths[p].inflight_bytes + u64::from(wire_bytes) + mss > self.cc.path_window(p) {
            // This packet fills the path's window: ask for an ACK now rather
            // than after the delayed-ACK timer, or the path would idle.
            flags |= Flags::ACK_REQUEST;
        }
        let flags = self.base_flags(flags);
        let path = &mut self.paths[p];
        path.trim_front();
        // How far below this packet the oldest one still in flight is.
        let psn_floor_delta = path.psn_span() as u16;
        let repr = DataRepr {
            base: BaseRepr {
                flags,
                path_slot: path.slot,
                path_gen: path.generation,
                src_device_port: dev.config.device_port,
            },
            psn: path.next_psn,
            timestamp_ns: now_ns as u32,
            dst_qpn: msg.dst_qpn,
            msg_seq: msg.msg_seq,
            solicited: msg.solicited,
            psn_floor_delta,
            msg_len: msg.len,
            offset,
            op: msg.op,
            payload_len,
        };
        let header_len = repr.header_len();
        let total = repr.buffer_len();
        // The whole datagram in `buf`: header, the payload gathered behind
        // it, then the ICRC or the authentication trailer.
        let write_whole = |buf: &mut [u8], auth: &mut Option<Box<ConnectionAuth>>| {
            repr.emit_header(&mut buf[..header_len]);
            msg.source.gather(
                &dev.regions,
                u64::from(offset),
                &mut buf[header_len..header_len + payload_len as usize],
            );
            seal(auth, &mut buf[..total], header_len);
        };
        match out {
            Out::Bytes(buf) => write_whole(buf, &mut self.auth),
            // An authenticated packet is written whole: its tag covers (and,
            // encrypted, rewrites) the payload, which the AEAD takes as one slice.
            Out::Gather(buf, layout) if self.auth.is_some() => {
                write_whole(buf, &mut self.auth);
                **layout = Layout::Whole;
            }
            Out::Gather(buf, layout) => {
                let span =
                    msg.source
                        .contiguous(&dev.regions, u64::from(offset), u64::from(payload_len));
                let payload = span.and_then(|s| dev.regions.slice(s));
                if let (Some(span), Some(payload)) = (span, payload) {
                    // Header, then the trailer right behind it in the
                    // buffer; the driver sends header, payload, trailer.
                    repr.emit_header(&mut buf[..header_len]);
                    let crc = wire::icrc_parts(&[&buf[..header_len], payload]);
                    buf[header_len..header_len + ICRC_LEN].copy_from_slice(&crc.to_be_bytes());
                    **layout = Layout::Split {
                        header_len,
                        trailer_len: ICRC_LEN,
                        payload: PayloadRef(span),
                    };
                } else {
                    write_whole(buf, &mut self.auth);
                    **layout = Layout::Whole;
                }
            }
            // The simulator carries the header only: no payload is gathered.
            Out::Repr(slot) => slot.put_data(repr),
        }
        path.push_sent(SentPacket::new(
            now_ns,
            seg,
            u16::try_from(wire_bytes).unwrap_or(u16::MAX),
        ));
        path.last_sent_ns = now_ns;
        path.inflight_bytes += u64::from(wire_bytes);
        path.stats.packets_sent += 1;
        self.inflight_bytes += u64::from(wire_bytes);
        dev.stats.data_packets_sent += 1;
        let src_port = path.src_port;
        self.refresh_path_deadline(p, dev);
        Transmit {
            dst: self.peer,
            src_port,
            ecn: Ecn::Ect0,
            len: total,
            kind: PacketKind::Data,
        }
    }

    fn emit_ack(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        slot: u8,
        out: &mut Out<'_>,
    ) -> Transmit {
        let rate_hint_mbps = dev.rate_hint.share_mbps();
        let flags = self.base_flags(Flags::default());
        let rx = self.rx_paths[slot as usize]
            .as_mut()
            .expect("ACKs are queued for known paths");
        rx.ack_queued = false;
        rx.ack_deadline = MaybeNs::NONE;
        rx.unacked = 0;
        let mut ack = AckRepr::new(BaseRepr {
            flags,
            path_slot: slot,
            path_gen: rx.generation,
            src_device_port: dev.config.device_port,
        });
        ack.ack_psn = rx.window.ack_psn();
        ack.sack = rx.window.to_wire();
        ack.ts_echo = rx.last_ts;
        ack.ack_delay_ns = now_ns
            .saturating_sub(rx.last_rx_ns)
            .min(u64::from(u32::MAX)) as u32;
        ack.rx_packets = rx.rx_packets;
        ack.ce_packets = rx.ce_packets;
        ack.rate_hint_mbps = rate_hint_mbps;
        while let Some(&q) = self.dirty_qps.front() {
            let Some(qp) = dev.qps.at_mut(q as usize) else {
                self.dirty_qps.pop_front();
                continue;
            };
            if !ack.push_op_ack(qp.op_ack()) {
                break;
            }
            qp.op_ack_dirty = false;
            qp.rx_rnr = None;
            self.dirty_qps.pop_front();
        }
        let len = match out {
            Out::Bytes(buf) | Out::Gather(buf, _) => {
                let len = wire::emit_ack(&ack, buf);
                seal(&mut self.auth, &mut buf[..len], ack.covered_len());
                if let Out::Gather(_, layout) = out {
                    **layout = Layout::Whole;
                }
                len
            }
            Out::Repr(slot) => {
                let len = ack.buffer_len();
                slot.put_ack(ack);
                len
            }
        };
        self.stats.acks_sent += 1;
        dev.stats.ack_packets_sent += 1;
        // ACKs are sprayed over our own paths, round robin: one bad reverse
        // route then costs each data path only a fraction of its ACKs, which
        // the next (cumulative) ACK makes good.
        self.ack_rr = (self.ack_rr + 1) % dev.config.paths_per_connection.max(1);
        let src_port = self.path_port(self.ack_rr, dev);
        Transmit {
            dst: self.peer,
            src_port,
            ecn: Ecn::NotEct,
            len,
            kind: PacketKind::Ack,
        }
    }
}

/// Finish a datagram whose headers end at `header_len`: ICRC, or the
/// connection's packet number and tag (the trailer left zero by the emitter).
fn seal(auth: &mut Option<Box<ConnectionAuth>>, datagram: &mut [u8], header_len: usize) {
    match auth {
        Some(auth) => auth.seal(datagram, header_len),
        None => wire::seal(datagram),
    }
}

impl Connection {
    // ------------------------------------------------------------------ receive

    /// A data packet from the peer.
    pub(crate) fn on_data(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        ecn: Ecn,
        repr: &DataRepr,
        payload: &[u8],
    ) {
        let slot = repr.base.path_slot;
        let generation = repr.base.path_gen;
        if slot as usize >= dev.config.max_peer_paths {
            // Receive state is per slot: a peer may not make us keep more.
            dev.stats.rx_over_limit += 1;
            return;
        }
        if self.rx_paths.len() <= slot as usize {
            self.rx_paths.resize_with(slot as usize + 1, || None);
        }
        let psn_base = dev.config.psn_base;
        let rx = self.rx_paths[slot as usize]
            .get_or_insert_with(|| RxPath::new(psn_base, slot, generation));
        if rx.generation != generation {
            if (generation.wrapping_sub(rx.generation) as i16) < 0 {
                dev.stats.rx_stale_path += 1;
                return;
            }
            *rx = RxPath::new(psn_base, slot, generation);
        }
        rx.window
            .advance_to(repr.psn.wrapping_sub(u32::from(repr.psn_floor_delta)));
        let outcome = rx.window.record(repr.psn);
        if outcome == RxOutcome::OutOfWindow {
            dev.stats.rx_out_of_window += 1;
            return;
        }
        if outcome == RxOutcome::Duplicate {
            dev.stats.rx_duplicates += 1;
        } else {
            rx.rx_packets = rx.rx_packets.wrapping_add(1);
            if ecn == Ecn::Ce {
                rx.ce_packets = rx.ce_packets.wrapping_add(1);
            }
        }
        rx.last_ts = repr.timestamp_ns;
        rx.last_rx_ns = now_ns;
        rx.unacked += 1;
        dev.rate_hint.note_sender(&mut self.rx_epoch_seen, now_ns);

        // Operation level: runs for duplicates too, so a probe makes the
        // responder repeat its op-ack; placement itself is idempotent.
        let op_event = ops::on_data(self, dev, now_ns, repr, payload);

        let rx = self.rx_paths[slot as usize]
            .as_mut()
            .expect("created above");
        let immediate = outcome != RxOutcome::InOrder
            || repr.base.flags.contains(Flags::ACK_REQUEST)
            || op_event
            || rx.unacked >= dev.config.ack_every_packets;
        if immediate {
            if !rx.ack_queued {
                rx.ack_queued = true;
                self.ack_now.push_back(slot);
            }
        } else if !rx.ack_deadline.is_some() {
            let deadline = now_ns + dev.config.ack_delay_ns;
            rx.ack_deadline = MaybeNs::some(deadline);
            if !self.ack_pending.contains(&slot) {
                self.ack_pending.push(slot);
            }
            self.ack_deadline = Some(self.ack_deadline.map_or(deadline, |d| d.min(deadline)));
        }
    }

    /// An ACK from the peer.
    pub(crate) fn on_ack(&mut self, now_ns: u64, dev: &mut DeviceState, ack: &AckRepr) {
        self.stats.acks_received += 1;
        for op_ack in ack.op_acks() {
            ops::on_op_ack(self, dev, now_ns, op_ack);
        }
        let p = ack.base.path_slot as usize;
        if p >= self.paths.len() || self.paths[p].generation != ack.base.path_gen {
            dev.stats.rx_stale_path += 1;
            return;
        }
        let highest = sack_highest(ack.ack_psn, &ack.sack);
        let limit = highest.map_or(ack.ack_psn, |h| h.wrapping_add(1));
        let mut acked_bytes = 0u64;
        let mut acked_packets = 0u32;
        let mut lost_bytes = 0u64;
        let mut lost_packets = 0u64;
        // Reused across ACKs: no allocation per packet.
        let mut newly_acked_segs = std::mem::take(&mut self.scratch_segs);
        {
            let path = &mut self.paths[p];
            let first_psn = path.first_inflight_psn();
            for (i, sent) in path.inflight.iter_mut().enumerate() {
                let psn = first_psn.wrapping_add(i as u32);
                if !seq::seq_lt(psn, limit) {
                    break;
                }
                if sent.state() != SentState::Outstanding {
                    continue;
                }
                if sack_contains(ack.ack_psn, &ack.sack, psn) {
                    sent.set_state(SentState::Acked);
                    acked_bytes += u64::from(sent.wire_bytes);
                    acked_packets += 1;
                    newly_acked_segs.push(sent.seg());
                } else {
                    // Below the highest PSN received on an in-order route:
                    // this one is lost. Resend it at once on another path.
                    sent.set_state(SentState::Lost);
                    lost_bytes += u64::from(sent.wire_bytes);
                    lost_packets += 1;
                    path.stats.packets_lost += 1;
                    self.retransmit_queue.push_back(Resend {
                        seg: sent.seg(),
                        lost_on: Some(p as u8),
                        probe: false,
                    });
                }
            }
            path.inflight_bytes -= acked_bytes + lost_bytes;
            path.trim_front();
            path.stats.packets_acked += u64::from(acked_packets);
        }
        self.inflight_bytes -= acked_bytes + lost_bytes;
        self.stats.data_packets_lost += lost_packets;
        dev.stats.data_packets_lost += lost_packets;
        for seg in newly_acked_segs.drain(..) {
            self.on_segment_acked(seg);
        }
        self.scratch_segs = newly_acked_segs;

        // RTT from the echoed timestamp, less the time the receiver held it.
        let path = &mut self.paths[p];
        let echo_age = (now_ns as u32).wrapping_sub(ack.ts_echo);
        let rtt_sample = (echo_age < (1 << 31))
            .then(|| u64::from(echo_age.saturating_sub(ack.ack_delay_ns)).max(1));
        if let Some(rtt) = rtt_sample
            && acked_packets > 0
        {
            path.rtt.update(rtt);
            self.conn_rtt.update(rtt);
        }
        // ECN: the receiver's counters are cumulative; only a newer ACK counts.
        let mut ce_delta = 0;
        if seq::seq_diff(ack.rx_packets, path.echoed_rx_packets) > 0 {
            ce_delta = ack.ce_packets.wrapping_sub(path.echoed_ce_packets);
            path.echoed_rx_packets = ack.rx_packets;
            path.echoed_ce_packets = ack.ce_packets;
            path.stats.ce_marks += u64::from(ce_delta);
        }
        path.probe_sent = false;
        if acked_bytes > 0 {
            path.consecutive_rtos = 0;
            self.last_progress_ns = now_ns;
            self.timeouts = 0;
        }
        let srtt_ns = path.rtt.srtt_ns();
        let sample = AckSample {
            now_ns,
            acked_bytes,
            acked_packets,
            ce_packets: ce_delta,
            rtt_ns: rtt_sample.filter(|_| acked_packets > 0),
            srtt_ns,
            path_inflight_bytes: path.inflight_bytes,
        };
        if acked_packets > 0 || ce_delta > 0 {
            self.cc.on_ack(p, &sample);
        }
        if lost_bytes > 0 {
            self.cc.on_loss(p, lost_bytes, now_ns);
        }
        if ack.rate_hint_mbps > 0 {
            self.cc.on_rate_hint(
                u64::from(ack.rate_hint_mbps) * 1_000_000,
                self.conn_rtt.srtt_ns(),
                now_ns,
            );
        }
        self.refresh_path_deadline(p, dev);
    }

    fn on_segment_acked(&mut self, seg: SegRef) {
        let Some(msg) = self.msgs.get_mut(seg.msg) else {
            return;
        };
        if msg.attempt != seg.attempt || !msg.ack(seg.seg) {
            return;
        }
        // A response is done once the requester has every segment; a request
        // waits for the responder's op-ack or response.
        if msg.kind == MsgKind::Response && msg.fully_acked() {
            self.msgs.remove(seg.msg);
        }
    }

    // ------------------------------------------------------------------ timers

    /// The connection's earliest deadline.
    pub(crate) fn next_timeout(&self, dev: &DeviceState) -> Option<u64> {
        let mut t = self.ack_deadline;
        let mut fold = |d: Option<u64>| {
            if let Some(d) = d {
                t = Some(t.map_or(d, |x| x.min(d)));
            }
        };
        if let Some(&d) = self.path_deadlines.iter().min()
            && d != u64::MAX
        {
            fold(Some(d));
        }
        for &(d, _) in &self.rnr_timers {
            fold(Some(d));
        }
        fold(self.retry_deadline(dev));
        t
    }

    fn refresh_path_deadline(&mut self, p: usize, dev: &DeviceState) {
        let cfg = &dev.config;
        let path = &self.paths[p];
        let rto = path
            .rto_deadline(cfg.rto_min_ns, cfg.rto_max_ns)
            .unwrap_or(u64::MAX);
        let probe = path.probe_deadline(cfg.ack_delay_ns).unwrap_or(u64::MAX);
        self.path_deadlines[p] = rto.min(probe);
    }

    fn refresh_all_path_deadlines(&mut self, dev: &DeviceState) {
        for p in 0..self.paths.len() {
            self.refresh_path_deadline(p, dev);
        }
    }

    fn retry_deadline(&self, dev: &DeviceState) -> Option<u64> {
        if self.msgs.live() == 0 {
            return None;
        }
        let cfg = &dev.config;
        let rto = self.conn_rtt.rto_ns(cfg.rto_min_ns, cfg.rto_max_ns);
        Some(self.last_progress_ns + (rto << self.timeouts.min(16)).min(cfg.rto_max_ns))
    }

    /// Fire every deadline that has passed.
    pub(crate) fn on_timeout(&mut self, now_ns: u64, dev: &mut DeviceState) {
        // Delayed ACKs.
        if self.ack_deadline.is_some_and(|d| d <= now_ns) {
            self.ack_deadline = None;
            let mut i = 0;
            while i < self.ack_pending.len() {
                let slot = self.ack_pending[i];
                let Some(rx) = self
                    .rx_paths
                    .get_mut(usize::from(slot))
                    .and_then(Option::as_mut)
                else {
                    self.ack_pending.swap_remove(i);
                    continue;
                };
                match rx.ack_deadline.get() {
                    Some(d) if d <= now_ns => {
                        rx.ack_deadline = MaybeNs::NONE;
                        if !rx.ack_queued {
                            rx.ack_queued = true;
                            self.ack_now.push_back(slot);
                        }
                        self.ack_pending.swap_remove(i);
                    }
                    Some(d) => {
                        self.ack_deadline = Some(self.ack_deadline.map_or(d, |x| x.min(d)));
                        i += 1;
                    }
                    // Sent since (an ACK went out for other reasons).
                    None => {
                        self.ack_pending.swap_remove(i);
                    }
                }
            }
        }
        // Path retransmission timeouts and tail probes. The cached per-path
        // deadlines are exact (refreshed on every change to a path), so only
        // paths whose deadline has passed need a look: a connection with a
        // hundred paths wakes for one path's timer at a time.
        let (rto_min, rto_max) = (dev.config.rto_min_ns, dev.config.rto_max_ns);
        for p in 0..self.paths.len() {
            if self.path_deadlines[p] > now_ns {
                continue;
            }
            if self.paths[p]
                .rto_deadline(rto_min, rto_max)
                .is_some_and(|d| d <= now_ns)
            {
                self.path_timeout(now_ns, dev, p);
            } else if self.paths[p]
                .probe_deadline(dev.config.ack_delay_ns)
                .is_some_and(|d| d <= now_ns)
            {
                self.paths[p].probe_sent = true;
                self.path_probes.push_back(p);
            }
            self.refresh_path_deadline(p, dev);
        }
        // RNR backoff.
        let mut fired = Vec::new();
        self.rnr_timers.retain(|&(d, r)| {
            if d <= now_ns {
                fired.push(r);
                false
            } else {
                true
            }
        });
        for r in fired {
            self.resend_whole(r);
        }
        // The connection's retry timer: no progress at all for an RTO.
        if self.retry_deadline(dev).is_some_and(|d| d <= now_ns) {
            self.retry_timeout(now_ns, dev);
            // Every path lost its packets: refresh them all.
            self.refresh_all_path_deadlines(dev);
        }
    }

    fn path_timeout(&mut self, now_ns: u64, dev: &mut DeviceState, p: usize) {
        let oldest_sent_ns = self.paths[p]
            .inflight
            .iter()
            .find(|s| s.state() == SentState::Outstanding)
            .map(|s| s.sent_ns);
        let lost = self.mark_path_lost(p);
        self.inflight_bytes -= lost;
        let path = &mut self.paths[p];
        path.consecutive_rtos += 1;
        path.stats.rtos += 1;
        self.stats.rtos += 1;
        dev.stats.rtos += 1;
        self.cc.on_rto(p, now_ns);
        // Retire the path only if it is singled out: other paths of this
        // connection delivered after this path's lost packet was sent. When
        // the whole connection is silent (an incast drowning every path, or
        // a dead peer) a new source port would not help, and churning ports
        // would only throw away path state.
        // Past a few timeouts in a row, a fresh port is worth a try anyway:
        // with one path, or every path on failed routes, nothing else can be
        // singled out.
        let others_progressed = oldest_sent_ns.is_some_and(|t| self.last_progress_ns > t);
        let rtos = self.paths[p].consecutive_rtos;
        let retire_after = dev.config.path_retire_after_rtos;
        if (others_progressed && rtos >= retire_after) || rtos >= retire_after + 2 {
            self.retire_path(now_ns, dev, p);
        }
    }

    /// Mark every outstanding packet of path `p` lost and queue it for
    /// retransmission elsewhere; returns the bytes taken out of flight.
    fn mark_path_lost(&mut self, p: usize) -> u64 {
        let path = &mut self.paths[p];
        let mut lost = 0;
        for sent in path
            .inflight
            .iter_mut()
            .filter(|s| s.state() == SentState::Outstanding)
        {
            sent.set_state(SentState::Lost);
            lost += u64::from(sent.wire_bytes);
            path.stats.packets_lost += 1;
            self.stats.data_packets_lost += 1;
            self.retransmit_queue.push_back(Resend {
                seg: sent.seg(),
                lost_on: Some(p as u8),
                probe: false,
            });
        }
        path.inflight.clear();
        path.inflight_bytes = 0;
        lost
    }

    /// Retire a path that keeps losing and reopen its slot on a fresh source
    /// port: a new port is a new ECMP hash, hence most likely a new route.
    fn retire_path(&mut self, now_ns: u64, dev: &mut DeviceState, p: usize) {
        let lost = self.mark_path_lost(p);
        self.inflight_bytes -= lost;
        let cfg = &dev.config;
        let in_use: Vec<u16> = self.paths.iter().map(|x| x.src_port).collect();
        let span = cfg.path_port_span;
        let free: Vec<u16> = (1..=span)
            .map(|k| cfg.device_port + k)
            .filter(|port| !in_use.contains(port))
            .collect();
        let old = &self.paths[p];
        let port = if free.is_empty() {
            old.src_port
        } else {
            free[(dev.rng.next_u64() % free.len() as u64) as usize]
        };
        let mut stats = old.stats;
        stats.replacements += 1;
        let generation = old.generation.wrapping_add(1);
        let mut fresh = TxPath::new(
            old.slot,
            generation,
            port,
            cfg.psn_base,
            self.conn_rtt.srtt_ns(),
        );
        fresh.stats = stats;
        self.paths[p] = fresh;
        self.cc.on_path_replaced(p, now_ns);
        self.stats.paths_replaced += 1;
        dev.stats.paths_replaced += 1;
    }

    fn retry_timeout(&mut self, now_ns: u64, dev: &mut DeviceState) {
        self.timeouts += 1;
        self.stats.retry_timeouts += 1;
        dev.stats.retry_timeouts += 1;
        if self.timeouts > u32::from(dev.config.retry_cnt) {
            ops::fail_connection(self, dev, crate::work::WcStatus::RetryExcErr);
            return;
        }
        // Restart the clock for the next round, and probe: for every request
        // whose packets were all acknowledged but whose completion never came
        // (a lost op-ack or response), resend its last segment asking for an
        // immediate ACK; the responder repeats its op-ack for duplicates.
        self.last_progress_ns = now_ns;
        // Everything still in flight goes again now: a path whose own RTO has
        // backed off past this round must not sit out the retry budget.
        for p in 0..self.paths.len() {
            let lost = self.mark_path_lost(p);
            self.inflight_bytes -= lost;
        }
        for r in self
            .msgs
            .refs_where(|m| m.kind == MsgKind::Request && m.fully_acked() && !m.rnr_wait)
        {
            let msg = self.msgs.get(r).expect("listed above");
            let seg = SegRef {
                msg: r,
                seg: msg.segs - 1,
                attempt: msg.attempt,
            };
            self.retransmit_queue.push_back(Resend {
                seg,
                lost_on: None,
                probe: true,
            });
        }
    }
}
