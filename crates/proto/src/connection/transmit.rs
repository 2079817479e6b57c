//! The send side of a connection: which packet goes next (ACKs, then
//! tail-loss probes, retransmissions, new segments), on which path (round
//! robin among those with window room), and writing it out as bytes,
//! split headers and payload, or a parsed repr.

use super::{
    AckCopy, Connection, FRAME_OVERHEAD_BYTES, PACKET_OVERHEAD_BYTES, PATH_PSN_WINDOW, PathProbe,
    ProbeKind, Resend,
};
use crate::auth::ConnectionAuth;
use crate::device_state::DeviceState;
use crate::ecn::Ecn;
use crate::maybe_ns::MaybeNs;
use crate::message::{MsgKind, MsgRef, SegRef, TxMessage};
use crate::path::{SentPacket, SentState};
use crate::probe_budget::LOSS_MEMORY_BASE_RTTS;
use crate::trace::trace_event;
use crate::transmit::{Layout, Out, PacketKind, PayloadRef, Transmit};
use metaroce_wire::{self as wire, AckRepr, BaseRepr, DataRepr, Flags, ICRC_LEN, OpHeader};

/// How a packet takes its turn among the paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spray {
    /// New data: runs of `path_burst_bytes` per path.
    InRuns,
    /// Resends: one packet per path in turn, whatever `path_burst_bytes`.
    /// A run of resends that lands on a path that died with the packets
    /// they replace loses them all again. On the namespace fabric with one
    /// of two links blackholed, runs of 64 KiB for resends too failed the
    /// transfer with `RetryExcErr` in 2 of 5 runs and moved nothing after
    /// the failure in a third; resent per packet, 4 of 4 were back at 90 %
    /// within 200 ms (runs of new data still stall a failover now and
    /// then, which is why they are off by default on real hosts:
    /// `metaroce_udp::PATH_BURST_BYTES`).
    PerPacket,
}

impl Connection {
    /// Whether an ACK waits to be sent.
    pub(crate) fn has_pending_ack(&self) -> bool {
        !self.ack_copies.is_empty() || !self.ack_now.is_empty()
    }

    /// An ACK waits for its delay.
    #[cfg(test)]
    pub(crate) fn owes_delayed_ack(&self) -> bool {
        !self.ack_pending.is_empty()
    }

    /// Nothing in flight either way: no message awaiting completion or an
    /// ACK, no ACK owed now or later.
    pub(crate) fn is_quiescent(&self) -> bool {
        self.messages_held() == 0 && !self.has_pending_ack() && self.ack_pending.is_empty()
    }

    /// Whether probes still queued after a poll that sent nothing will be
    /// sent: they wait only for the pace (the probe loop sends or drops
    /// every other), so its timer must be armed. A connection that sends
    /// nothing leaves the endpoint's ready queue until an ACK or a timer.
    pub(crate) fn waiting_probes_have_a_timer(&self) -> bool {
        self.path_probes.is_empty() || self.pace_blocked
    }

    /// Emit the connection's next ACK, if one waits (ACKs are never held
    /// back: no window, no pacing).
    pub(crate) fn poll_ack(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        out: &mut Out<'_>,
    ) -> Option<Transmit> {
        // A copy goes right behind its original, before any newer ACK: the
        // peer never sees an older ACK (or op-ack) after a newer one from us.
        if let Some((ack, src_port)) = self.ack_copies.pop_front() {
            return Some(self.put_ack(dev, ack, src_port, out));
        }
        let slot = self.ack_now.pop_front()?;
        Some(self.emit_ack(now_ns, dev, slot, out))
    }

    /// Emit the next packet of this connection into `buf`, if any may go now.
    pub(crate) fn poll_transmit(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        out: &mut Out<'_>,
    ) -> Option<Transmit> {
        if dev.config.deferred_ack_ns > 0
            && !self.ack_pending.is_empty()
            && !(self.send_queue.is_empty() && self.retransmit_queue.is_empty())
        {
            // Data goes to the peer: the ACKs held for it go first, in the
            // same batch (coalesced into the data's datagram where they fit).
            self.ack_owed_now();
        }
        if let Some(t) = self.poll_ack(now_ns, dev, out) {
            return Some(t);
        }
        // A probe is a data packet like any other for the receiver's link:
        // a capped sender's probes keep to its grant too (256 senders
        // probing at once past their grants kept an incast's queue standing).
        if !self.path_probes.is_empty() && self.paced_out(now_ns) {
            return None;
        }
        // A probe that goes as the next new data packet, on this path.
        let mut probe_path = None;
        while let Some(PathProbe {
            path: p,
            carry,
            kind,
        }) = self.path_probes.pop_front()
        {
            let live = |s: &SegRef| {
                self.msgs
                    .get(s.msg)
                    .is_some_and(|m| m.attempt == s.attempt && !m.rnr_wait)
            };
            if kind == ProbeKind::TailCopy {
                // The copy's segment, if nothing answered for it meanwhile.
                let acked = |s: &SegRef| self.msgs.get(s.msg).is_some_and(|m| m.is_acked(s.seg));
                let Some(seg) = carry.filter(|s| live(s) && !acked(s)) else {
                    continue;
                };
                let p = self.quiet_path_from(p, dev);
                dev.stats.tail_copies_sent += 1;
                trace_event!(
                    in: self.trace.enter_path(p),
                    DEBUG,
                    now_ns,
                    "tail copy: an outstanding tail packet again, on a quiet path"
                );
                return Some(self.emit_again(now_ns, dev, p, seg, true, out));
            }
            let cold_copy = kind == ProbeKind::ColdCopy;
            // Tail-loss probe: resend the path's newest outstanding segment on
            // that same path, past its window, asking for an ACK. If the data
            // arrived and only the ACK was lost, the ACK covers everything; if
            // the data was lost, the probe's PSN exposes the gap. A suspect
            // path's probe carries a copy of a segment already resent
            // elsewhere: only its answer matters.
            let own = self.paths[p]
                .inflight
                .iter()
                .rev()
                .filter(|s| s.state() == SentState::Outstanding)
                .map(SentPacket::seg)
                .find(|s| live(s));
            let Some(seg) = own.or(carry.filter(|s| live(s))) else {
                self.paths[p].probe_sent_ns = MaybeNs::NONE;
                continue;
            };
            if self.paths[p].psn_span() + 1 >= PATH_PSN_WINDOW {
                // A probe takes a new PSN: past the receiver's window it
                // would be dropped unanswered, and so would every probe
                // after it. Let the probe timeout decide instead.
                self.paths[p].probe_sent_ns = MaybeNs::some(now_ns);
                continue;
            }
            // A paced sender with new data probes with it, on a plain
            // silence (no later packet acknowledged elsewhere), or whatever
            // the evidence when it sends a packet per round trip or slower
            // (its probe takes the next paced slot anyway). The ACK shows
            // the path's earlier packet arrived or not (the path's SACK),
            // and where only that packet's ACK was lost, nothing is sent
            // twice: at a grant of a packet per path every 670 µs (an
            // all-to-all's sender, one of 127 into each receiver), a lost
            // packet and a lost ACK each left a path silent, and half the
            // probes resent data that had arrived. Where evidence says the
            // packet was lost and new data flows fast, the old segment goes
            // at once.
            let new_data = !cold_copy
                && own.is_some()
                && self.cc.pacing_rate_bps().is_some()
                && (self.paths[p].silent_rounds == 0 || self.sparse_pacing())
                && self.retransmit_queue.is_empty()
                && self.has_unsent_data();
            self.paths[p].probe_sent_ns = MaybeNs::some(now_ns);
            if cold_copy {
                dev.stats.cold_copies_sent += 1;
                trace_event!(
                    in: self.trace.enter_path(p),
                    DEBUG,
                    now_ns,
                    "cold copy: the first packet again, on another path"
                );
                return Some(self.emit_again(now_ns, dev, p, seg, false, out));
            }
            dev.stats.tail_probes += 1;
            self.stats.tail_probes += 1;
            self.paths[p].stats.tail_probes += 1;
            trace_event!(
                in: self.trace.enter_path(p),
                DEBUG,
                now_ns,
                carried = own.is_none(),
                new_data,
                "tail-loss probe: a packet on the silent path, asking for an ACK"
            );
            if new_data {
                probe_path = Some(p);
                break;
            }
            return Some(self.emit_again(now_ns, dev, p, seg, true, out));
        }
        if self.tail_copy_armed && self.send_queue.is_empty() {
            let probes_before = self.path_probes.len();
            self.queue_tail_copies(now_ns, dev);
            if self.path_probes.len() > probes_before {
                // A capped sender's copies are probes: they take the
                // probes' turn, at its pace, and a wait for its next slot
                // must arm the pacing timer (`paced_out`), or they would
                // go only when something else woke the connection (its RTO,
                // 40 us later in a 128-host all-to-all).
                return self.poll_transmit(now_ns, dev, out);
            }
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
            if self.inflight_bytes > 0 && self.cc.awaiting_grant() {
                // Cold, with a packet out: the window is one packet, even
                // when a short first packet (`cold_packet_bytes`) leaves
                // room for more bytes. Copies of it on every path would
                // only wait in the same silent receiver, and the stall
                // that proves them spurious would look shorter than it was.
                return None;
            }
            let bytes = self.wire_bytes(resend.seg);
            let path = self.choose_path(now_ns, dev, bytes, resend.lost_on, Spray::PerPacket)?;
            self.retransmit_queue.pop_front();
            let mut flags = Flags::RETRANSMIT | self.drained_flag();
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
            let mut cold_copies = 0;
            if msg.next_unsent == 0
                && self.inflight_bytes == 0
                && self.cc.awaiting_grant()
                && dev.config.cold_packet_bytes > 0
            {
                // Cold: one packet until the receiver's first word, and a
                // short one (`cold_packet_bytes`), so that many newcomers
                // at once do not fill its queue before any hears of the
                // others.
                if let Some(m) = self.msgs.get_mut(r) {
                    m.cut_head(dev.config.cold_packet_bytes);
                    if m.head_bytes > 0 && u64::from(m.payload_len) > dev.config.bdp_bytes() {
                        cold_copies = (dev.config.cold_copies as usize).min(self.path_count - 1);
                    }
                }
            }
            let msg = self.msgs.get(r).expect("checked above");
            if msg.next_unsent + 1 == msg.segs {
                // The message's last data packet: size its repair now, when
                // it is known whether anything is queued behind it.
                let count = self.repair_packets_for(now_ns, dev, msg);
                let msg = self.msgs.get_mut(r).expect("checked above");
                if msg.repair_count != count {
                    msg.repair_count = count;
                    msg.repair_shards = None;
                }
            }
            let msg = self.msgs.get(r).expect("checked above");
            let seg = SegRef {
                msg: r,
                seg: msg.next_unsent,
                attempt: msg.attempt,
            };
            // The last segment asks for an immediate ACK: completion latency
            // must not wait for the delayed-ACK timer, unless nothing waits
            // on the completion (the receiver may then hold the ACK for
            // data going back).
            let ask_ack = (seg.seg + 1 == msg.segs && !msg.ack_deferrable) || probe_path.is_some();
            let bytes = self.wire_bytes(seg);
            let path = match probe_path {
                // Past the windows; its pacing was checked with the probes.
                Some(p) => p,
                None => self.choose_path(now_ns, dev, bytes, None, Spray::InRuns)?,
            };
            let msg = self.msgs.get_mut(r).expect("checked above");
            msg.next_unsent += 1;
            if !msg.has_unsent() {
                msg.queued = false;
                self.send_queue.pop_front();
            }
            let mut flags = if ask_ack {
                Flags::ACK_REQUEST
            } else {
                Flags::default()
            };
            flags |= self.drained_flag();
            self.stats.data_packets_sent += 1;
            let msg = self.msgs.get(r).expect("checked above");
            if msg.is_repair(seg.seg) {
                dev.stats.repair_packets_sent += 1;
            } else {
                self.stats.payload_bytes_sent += u64::from(msg.seg_range(seg.seg).1);
            }
            // The short cold packet goes again on the next paths, as
            // probes: the whole message waits on it, and a lost one costs
            // a probe timeout (two base RTTs) before anything else moves.
            // A copy costs a few hundred bytes once per cold start.
            for k in 1..=cold_copies {
                let q = (path + k) % self.path_count;
                self.create_paths_through(q, dev);
                self.path_probes.push_back(PathProbe {
                    path: q,
                    carry: Some(seg),
                    kind: ProbeKind::ColdCopy,
                });
            }
            return Some(self.emit_segment(now_ns, dev, path, seg, flags, out));
        }
        None
    }

    /// Whether the grant paces us at a packet per round trip or slower:
    /// then a silent path's probe takes the next paced slot whatever it
    /// carries, and new data in it costs the connection nothing.
    fn sparse_pacing(&self) -> bool {
        let Some(rate) = self.cc.pacing_rate_bps() else {
            return false;
        };
        pace_gap_ns(self.last_paced_bytes, rate) >= self.conn_rtt.srtt_ns()
    }

    /// Whether a message has a data packet not yet sent.
    pub(super) fn has_unsent_data(&self) -> bool {
        self.send_queue
            .iter()
            .any(|&r| self.msgs.get(r).is_some_and(|m| m.has_unsent()))
    }

    /// How many repair packets (`repair.rs`) follow message `msg`: none
    /// unless the device is losing packets now, the message is a short
    /// request with payload, nothing is queued behind it (a stream of
    /// messages is bandwidth, not a wait: its losses are revealed and
    /// resent while the rest flows, and repair would only take bandwidth),
    /// and the receiver has not capped our rate (its link is shared:
    /// losses there are congestion).
    fn repair_packets_for(&self, now_ns: u64, dev: &DeviceState, msg: &TxMessage) -> u32 {
        let config = &dev.config;
        let short = msg.segs <= config.repair_max_message_packets
            && msg.segs <= crate::repair::MAX_CODE_DATA_PACKETS;
        let carries_payload = matches!(
            msg.op,
            OpHeader::Write { .. }
                | OpHeader::WriteImm { .. }
                | OpHeader::Send { .. }
                | OpHeader::SendImm { .. }
        ) && msg.payload_len > 0;
        if !short
            || msg.head_bytes > 0
            || self.backlogged_behind(dev)
            || !carries_payload
            || msg.kind != MsgKind::Request
            || !msg.repair_shard_bytes().is_multiple_of(2)
            || !dev
                .loss_rate
                .seen_within(now_ns, LOSS_MEMORY_BASE_RTTS * config.base_rtt_ns)
            || self.cc.pacing_rate_bps().is_some()
        {
            return 0;
        }
        let max = config
            .repair_max_packets
            .min(u32::from(crate::repair::MAX_REPAIR_COUNT))
            .min(msg.segs / crate::repair::DATA_PACKETS_PER_REPAIR_PACKET);
        crate::repair::repair_count(msg.segs, dev.loss_rate.rate(), max)
    }

    /// The tail of a drained connection: once nothing new is queued and at
    /// most `tail_copy_packets` packets are outstanding, send each of them
    /// once more on another path. A lost tail packet has no later packet on
    /// its path to reveal it, so it waits a probe timeout (two RTTs and
    /// more) and then the probe's round trip: on a 2 MB transfer one such
    /// loss costs 15 % of its time, and the slowest of a collective's flows
    /// sets its time. The copies cost a few packets per message end, and
    /// need several paths. A copy acknowledged first completes the
    /// segment; the original is then a duplicate.
    ///
    /// Where the receiver granted the whole link (no cap: nobody else
    /// wants it) they are resends, through the windows, sent when the
    /// link is otherwise idle. A capped sender paces at its grant and its
    /// window is a packet or less: as resends its copies waited behind the
    /// window until the tail's ACK came, and were then dropped as acked.
    /// Its copies are probes instead (past the windows, at its pace, each
    /// taking a slot of its own grant, which it has no new data for), on
    /// a quiet path (`quiet_path_from`), each only if its segment is still
    /// unacknowledged when the slot comes, and only where random loss is
    /// common (`DeviceState::silence_is_evidence` false). In the 128-host
    /// all-to-all at 1 %/link, where every sender is capped at a 127th of each
    /// receiver's line and a pair's last losses waited a probe timeout and
    /// then a pace slot each, the mean makespan over seeds 1-24 went from
    /// 948.0 to 926.5 µs.
    ///
    /// Only while the device is seeing losses (a packet proved lost within
    /// 32 base RTTs): where nothing is lost the copies buy nothing, and on
    /// a ping-pong of one-packet messages, every message being its own
    /// tail, they doubled the packets and the per-message system calls:
    /// 8 B `perf write-lat` over loopback took 19.1 µs one way with them
    /// and 10.2 µs without (raw UDP 6.7 µs). And not on a fabric proved to
    /// reorder (`crate::reorder`): there its SACK gaps are mostly late
    /// packets, not lost ones, and the copies only duplicated what was
    /// on its way (adaptive routing: a fifth of all resends).
    fn queue_tail_copies(&mut self, now_ns: u64, dev: &DeviceState) {
        let limit = dev.config.tail_copy_packets as usize;
        if limit == 0
            || self.path_count < 2
            || !dev.probe_budget.loss_seen_lately(now_ns)
            || dev.reorder.is_open()
        {
            self.tail_copy_armed = false;
            return;
        }
        let outstanding: usize = self
            .paths
            .iter()
            .map(|p| {
                p.inflight
                    .iter()
                    .filter(|s| s.state() == SentState::Outstanding)
                    .count()
            })
            .sum();
        if outstanding == 0 || outstanding > limit {
            // Nothing to copy, or not the tail yet.
            if outstanding == 0 {
                self.tail_copy_armed = false;
            }
            return;
        }
        self.tail_copy_armed = false;
        let paced = self.cc.pacing_rate_bps().is_some();
        if paced && dev.silence_is_evidence() {
            // A capped sender copies only where random loss is common (the
            // bar of `replacement_ports`). Below it a lost tail packet is
            // rare, and the copies cost an all-to-all more than the probe
            // timeouts they save: its senders' NICs and the fabric's
            // busiest uplinks run near full, and every pair's copy is one
            // more packet on them (128 hosts, 64 KB per pair, seeds 1-6: at
            // 0.1 % loss per link 845.5 µs with copies against 837.5
            // without, at 1 % end to end 862.2 against 852.8).
            return;
        }
        trace_event!(
            in: self.trace.enter(),
            DEBUG,
            now_ns,
            outstanding,
            paced,
            "tail copies: the last outstanding packets go again on other paths"
        );
        let msgs = &self.msgs;
        for (p, path) in self.paths.iter().enumerate() {
            for sent in path.inflight.iter().filter(|s| {
                // A message with repair packets has its redundancy already.
                s.state() == SentState::Outstanding
                    && msgs.get(s.seg().msg).is_some_and(|m| m.repair_count == 0)
            }) {
                if paced {
                    self.path_probes.push_back(PathProbe {
                        path: (p + 1) % self.path_count,
                        carry: Some(sent.seg()),
                        kind: ProbeKind::TailCopy,
                    });
                } else {
                    self.retransmit_queue.push_back(Resend {
                        seg: sent.seg(),
                        lost_on: Some(p as u8),
                        probe: false,
                    });
                }
            }
        }
    }

    /// The first path from `start` on (round the slots) that is quiet: not
    /// suspect, proven, nothing outstanding (a slot never used counts,
    /// and is opened); `start` if none is. A tail copy goes there: on a
    /// path with a packet outstanding, or one already probed, its loss
    /// would be one more silence for that path's probes to sort out, and
    /// at 10 % loss per link a 32-host all-to-all took 1,337 µs on average
    /// (seeds 1-8) with the copies on the next path whatever it held,
    /// against 1,170 without copies and 1,137 with them on quiet paths.
    fn quiet_path_from(&mut self, start: usize, dev: &DeviceState) -> usize {
        for k in 0..self.path_count {
            let q = (start + k) % self.path_count;
            if q >= self.paths.len() {
                self.create_paths_through(q, dev);
                return q;
            }
            let path = &self.paths[q];
            if path.silent_rounds == 0 && !path.unproven && path.inflight_bytes == 0 {
                return q;
            }
        }
        start
    }

    /// Whether more than two bandwidth-delay products of new data wait
    /// behind the message at the head of the send queue: a stream, not a
    /// message someone waits on.
    fn backlogged_behind(&self, dev: &DeviceState) -> bool {
        let bdp_bytes = dev.config.bdp_bytes();
        let mut behind = 0u64;
        for r in self.send_queue.iter().skip(1) {
            if let Some(m) = self.msgs.get(*r) {
                let sent = u64::from(m.next_unsent.min(m.segs)) * u64::from(m.seg_bytes);
                behind += u64::from(m.payload_len).saturating_sub(sent);
            }
            if behind > 2 * bdp_bytes {
                return true;
            }
        }
        false
    }

    /// The recovery shards of message `r`'s repair packets, computed from
    /// its payload the first time one goes (`repair.rs`).
    fn compute_repair_shards(&mut self, dev: &mut DeviceState, r: MsgRef) {
        let Some(msg) = self.msgs.get(r).filter(|m| m.repair_shards.is_none()) else {
            return;
        };
        let DeviceState {
            regions,
            repair_codes,
            ..
        } = dev;
        let shards = crate::repair::encode(
            repair_codes,
            msg.payload_len,
            msg.repair_shard_bytes(),
            msg.repair_count,
            |at, out| msg.source.gather(regions, at, out),
        );
        if let Some(msg) = self.msgs.get_mut(r) {
            msg.repair_shards = shards;
        }
    }

    fn wire_bytes(&self, seg: SegRef) -> u64 {
        let payload = self.msgs.get(seg.msg).map_or(0, |m| m.seg_range(seg.seg).1);
        u64::from(payload + PACKET_OVERHEAD_BYTES)
    }

    /// Whether the receiver's grant, as a pacing rate, holds the next data
    /// packet back until `next_pace_ns` (then the pacing clock wakes us).
    /// The gap follows the last packet at the rate in force now, so a grant
    /// that rises takes effect at once.
    fn paced_out(&mut self, now_ns: u64) -> bool {
        let Some(rate) = self.cc.pacing_rate_bps() else {
            return false;
        };
        self.next_pace_ns = self.pace_due_ns(rate);
        self.pace_blocked = now_ns < self.next_pace_ns;
        self.pace_blocked
    }

    /// When the next data packet is due at `rate_bps`: a gap after the last
    /// packet's slot, or the restart point an ACK set.
    fn pace_due_ns(&self, rate_bps: u64) -> u64 {
        let gap = pace_gap_ns(self.last_paced_bytes, rate_bps);
        self.pace_restart_ns
            .get()
            .unwrap_or(self.last_data_slot_ns + gap)
    }

    /// The pacing slot of a data packet going out now. Unpaced, it is now.
    /// Paced, it is when the packet was due; the NIC serves its
    /// connections in turn, so a paced packet often goes a packet or two
    /// late, and measured from the send time every gap would carry that
    /// lateness: a connection granted 47.5 Gb/s beside an uncapped one on
    /// the same NIC ran at 26. Lateness is kept as credit only up to one
    /// gap and four packets at line rate, so an idle connection does not
    /// save up a burst.
    fn take_pacing_slot(&self, now_ns: u64, dev: &DeviceState) -> u64 {
        let Some(rate) = self.cc.pacing_rate_bps() else {
            return now_ns;
        };
        let mss = u64::from(dev.config.mtu_payload_bytes + PACKET_OVERHEAD_BYTES);
        let credit = pace_gap_ns(self.last_paced_bytes, rate)
            .min(4 * pace_gap_ns(mss, dev.config.line_rate_bps));
        self.pace_due_ns(rate)
            .clamp(now_ns.saturating_sub(credit), now_ns)
    }

    /// Whether a paced sender's next packet stays on the path of its last
    /// one instead of moving on in the round robin (transport spec §5, "A
    /// paced sender keeps to a proven route"): that packet was answered,
    /// unmarked, within a quarter of the connection's fastest round trip
    /// more. A sender capped at a small grant sends under a packet per
    /// path per round trip, so the round robin's next path is one it has
    /// heard nothing of lately, and its windows never bind: on a fabric
    /// whose hashing loads some routes past their line (a failed core
    /// switch takes a quarter of its aggregation switches' uplinks), a
    /// quarter of every sender's packets went on into queues that only
    /// grew. Staying where the last answer was quick and clean, and
    /// leaving at the first slow or marked one, moves the senders off
    /// such routes within a packet each.
    ///
    /// Only while random loss is rare (`DeviceState::silence_is_evidence`):
    /// in the 128-host all-to-all at 1 %/link, staying put cost 1.6 % of
    /// the makespan and raised its RTOs from 110 to 872 (seeds 1-4). And
    /// only on a NIC of one plane: a multi-plane NIC picks the plane by
    /// source port, and a sender that stays on one path stays on one
    /// plane (2 planes, a 64-host all-to-all of 1 MB: 6.6 % slower).
    fn keeps_proven_route(&self, dev: &DeviceState, paced: bool) -> bool {
        if !paced || dev.config.port_planes > 1 || !dev.silence_is_evidence() {
            return false;
        }
        let Some(path) = self.paths.get(usize::from(self.rr_path)) else {
            return false;
        };
        let Some(rtt_min_ns) = self.conn_rtt.measured_min_ns() else {
            return false;
        };
        let quick_ns = rtt_min_ns.saturating_add(rtt_min_ns / PROVEN_ROUTE_SLACK_DIV);
        path.inflight_bytes == 0
            && path.echoed_rx_packets != 0
            && !path.last_echo_marked
            && path.rtt.latest_ns() <= quick_ns
            && path.silent_rounds == 0
            && !path.unproven
    }

    /// Pick a path whose window has room for `bytes`, round robin in turns
    /// of `path_burst_bytes` (`Spray::InRuns`, one packet when 0) or of one
    /// packet (`Spray::PerPacket`), avoiding `avoid` when another path can
    /// take the packet.
    fn choose_path(
        &mut self,
        now_ns: u64,
        dev: &DeviceState,
        bytes: u64,
        avoid: Option<u8>,
        spray: Spray,
    ) -> Option<usize> {
        // Only a sender the receiver did not cap: a capped one's limit is
        // its grant, and the room it leaves in a shared receiver's queue
        // is the other senders'.
        let paced = self.cc.pacing_rate_bps().is_some();
        let allowance = if paced {
            0.0
        } else {
            dev.loss_rate.window_allowance()
        };
        let with_allowance = |window: u64| window + (window as f64 * allowance) as u64;
        if self.inflight_bytes > 0
            && self.inflight_bytes + bytes > with_allowance(self.cc.connection_window())
        {
            // An ACK will wake us, not the pacing clock.
            self.pace_blocked = false;
            return None;
        }
        if self.paced_out(now_ns) {
            return None;
        }
        let n = self.path_count;
        // The turn moves on when this packet would overrun the current
        // path's run. Decided by this packet's size, before it goes: a
        // rule that looked ahead by the last packet's size put a message's
        // full first packet behind the previous message's short last one
        // on one path (64 KiB WRITEs on loopback are a 61,440-byte packet
        // and a 4,096-byte one, and paired that way they moved 9 % less).
        let burst = match spray {
            Spray::InRuns => u64::from(dev.config.path_burst_bytes),
            Spray::PerPacket => 0,
        };
        let run = u64::from(self.path_run_bytes);
        if self.keeps_proven_route(dev, paced) {
            self.path_run_bytes = 0;
        } else if run > 0 && run + bytes > burst {
            self.rr_path = ((usize::from(self.rr_path) + 1) % n.max(1)) as u8;
            self.path_run_bytes = 0;
        }
        for pass in 0..2 {
            for k in 0..n {
                let p = (usize::from(self.rr_path) + k) % n;
                if pass == 0 && n > 1 && avoid == Some(p as u8) {
                    continue;
                }
                if p >= self.paths.len() {
                    // Never used: empty, so it has room.
                    self.create_paths_through(p, dev);
                }
                let path = &self.paths[p];
                if pass == 0
                    && n > 1
                    && (path.silent_rounds > 0 || (path.unproven && path.inflight_bytes > 0))
                {
                    // Suspect (its probe is out), or a replacement whose one
                    // packet is still unanswered: new data goes elsewhere,
                    // unless every other path is full or suspect too.
                    continue;
                }
                let psn_room = path.psn_span() < PATH_PSN_WINDOW;
                let window_room = path.inflight_bytes == 0
                    || path.inflight_bytes + bytes <= with_allowance(self.cc.path_window(p));
                if psn_room && window_room {
                    // A path passed over for want of room starts a run of
                    // its own.
                    if p != usize::from(self.rr_path) {
                        self.rr_path = p as u8;
                        self.path_run_bytes = 0;
                    }
                    // At most a burst (1 MiB) and one packet: fits.
                    self.path_run_bytes = self
                        .path_run_bytes
                        .saturating_add(u32::try_from(bytes).unwrap_or(u32::MAX));
                    return Some(p);
                }
            }
        }
        None
    }

    /// A segment sent again past the windows on path `p`, asking for an
    /// immediate ACK: a tail-loss probe, a tail copy or a cold copy.
    /// `resend`: counted as a retransmission (a cold copy is counted as
    /// a cold copy only).
    fn emit_again(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        p: usize,
        seg: SegRef,
        resend: bool,
        out: &mut Out<'_>,
    ) -> Transmit {
        if resend {
            self.stats.data_packets_retransmitted += 1;
            dev.stats.data_packets_retransmitted += 1;
        }
        let flags = Flags::RETRANSMIT | Flags::ACK_REQUEST | self.drained_flag();
        self.emit_segment(now_ns, dev, p, seg, flags, out)
    }

    /// `SENDER_DRAINED` if nothing is queued after the packet now going
    /// out: the receiver may give our share of its link to its other
    /// senders at once. Resends say it too: a resend of the drained
    /// message's tail, sent after the drained packet, would otherwise count
    /// us as a sender again for an epoch.
    fn drained_flag(&self) -> Flags {
        if self.send_queue.is_empty() && self.retransmit_queue.is_empty() {
            Flags::SENDER_DRAINED
        } else {
            Flags::default()
        }
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
        let repair = self.msgs.get(seg.msg).is_some_and(|m| m.is_repair(seg.seg));
        if repair && !matches!(out, Out::Repr(_)) {
            self.compute_repair_shards(dev, seg.msg);
        }
        let msg = self.msgs.get(seg.msg).expect("caller checked the message");
        let (offset, payload_len) = msg.seg_range(seg.seg);
        // A first send of a message's last packet that asks for no ACK: the
        // receiver may hold the completing ACK for `deferred_ack_ns`.
        let ack_deferred =
            msg.ack_deferrable && seg.seg + 1 == msg.segs && !flags.contains(Flags::RETRANSMIT);
        let wire_bytes = payload_len + PACKET_OVERHEAD_BYTES;
        let mss = u64::from(dev.config.mtu_payload_bytes + PACKET_OVERHEAD_BYTES);
        let mut flags = flags;
        if repair {
            flags |= Flags::REPAIR;
        }
        // A deferred last packet with nothing queued behind it: the sender
        // would not idle for want of window, so it need not hurry the ACK.
        let nothing_behind =
            ack_deferred && self.send_queue.is_empty() && self.retransmit_queue.is_empty();
        if !nothing_behind
            && (self.paths[p].inflight_bytes + u64::from(wire_bytes) + mss > self.cc.path_window(p)
                || self.inflight_bytes + u64::from(wire_bytes) + mss > self.cc.connection_window())
        {
            // This packet fills the path's or the connection's window: ask
            // for an ACK now rather than after the delayed-ACK timer, or
            // the sender would idle (a lone packet on a path never fills
            // the receiver's count of packets per ACK).
            flags |= Flags::ACK_REQUEST;
        }
        self.last_data_slot_ns = self.take_pacing_slot(now_ns, dev);
        self.last_paced_bytes = u64::from(wire_bytes) + FRAME_OVERHEAD_BYTES;
        self.pace_blocked = false;
        self.pace_restart_ns = MaybeNs::NONE;
        let omit_icrc = self.omits_icrc();
        let flags = if omit_icrc {
            self.base_flags(flags) | Flags::ICRC_OMITTED
        } else {
            self.base_flags(flags)
        };
        let path = &mut self.paths[p];
        path.trim_front();
        // How far below this packet the oldest one still in flight is (or
        // the first a timer gave up on, until its fate is known).
        let psn_floor_delta = path.floor_span(PATH_PSN_WINDOW) as u16;
        let floor_acked = !metaroce_wire::seq::seq_lt(
            path.ack_reported_end,
            path.next_psn.wrapping_sub(u32::from(psn_floor_delta)),
        );
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
            floor_acked,
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
            let payload = &mut buf[header_len..header_len + payload_len as usize];
            if repair {
                // Shard `index` of the ones computed for the message.
                let at = (seg.seg - msg.segs) as usize * payload.len();
                match msg.repair_shards.as_deref() {
                    Some(shards) => payload.copy_from_slice(&shards[at..at + payload.len()]),
                    None => payload.fill(0),
                }
            } else {
                msg.source.gather(&dev.regions, u64::from(offset), payload);
            }
            if omit_icrc {
                // Agreed with the peer: the UDP checksum protects the
                // datagram, and the trailer goes as zeros (wire.md 7.2).
                buf[total - ICRC_LEN..total].fill(0);
            } else {
                seal(auth, &mut buf[..total], header_len);
            }
        };
        match out {
            Out::Bytes(buf) => write_whole(buf, &mut self.auth),
            // An authenticated packet is written whole: its tag covers (and,
            // encrypted, rewrites) the payload, which the AEAD takes as one slice.
            Out::Gather(buf, layout) if self.auth.is_some() || repair => {
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
                    let crc = if omit_icrc {
                        0
                    } else {
                        wire::icrc_parts(&[&buf[..header_len], payload])
                    };
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
        path.last_sent_ack_request = flags.contains(Flags::ACK_REQUEST);
        path.last_sent_ack_deferred = ack_deferred && !path.last_sent_ack_request;
        path.inflight_bytes += u64::from(wire_bytes);
        path.stats.packets_sent += 1;
        path.stats.bytes_sent += u64::from(wire_bytes);
        self.stats.wire_bytes_sent += u64::from(wire_bytes);
        if flags.contains(Flags::RETRANSMIT) {
            path.stats.packets_retransmitted += 1;
            path.stats.bytes_retransmitted += u64::from(wire_bytes);
            self.stats.wire_bytes_retransmitted += u64::from(wire_bytes);
        }
        self.inflight_bytes += u64::from(wire_bytes);
        dev.stats.data_packets_sent += 1;
        let src_port = path.src_port;
        #[cfg(feature = "trace")]
        if flags.contains(Flags::RETRANSMIT) {
            trace_event!(
                in: self.trace.enter_path(p),
                TRACE,
                now_ns,
                psn = repr.psn,
                msg_seq = repr.msg_seq,
                offset,
                payload_len,
                completion_probe = flags.contains(Flags::COMPLETION_PROBE),
                "retransmit"
            );
        }
        self.refresh_path_deadline(p, dev);
        Transmit {
            dst: self.peer,
            src_port,
            ecn: Ecn::Ect0,
            len: total,
            kind: PacketKind::Data,
            repair,
        }
    }

    fn emit_ack(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        slot: u8,
        out: &mut Out<'_>,
    ) -> Transmit {
        let rate_hint_mbps = dev.admission.grant_mbps(&mut self.admission, now_ns);
        let flags = self.base_flags(Flags::default());
        if self.rx_paths[slot as usize]
            .as_ref()
            .is_some_and(|rx| rx.ack_port == 0)
        {
            let (route, port) = self.pick_ack_port(now_ns, dev, slot);
            let rx = self.rx_paths[slot as usize]
                .as_mut()
                .expect("checked above");
            rx.ack_route = route;
            rx.ack_port = port;
            rx.ack_port_floor = rx.window.highest_received().wrapping_add(1);
            rx.ack_port_heard_ns = 0;
            if route != 0 || rx.generation != 0 {
                trace_event!(
                    in: self.trace.enter(),
                    DEBUG,
                    now_ns,
                    slot,
                    generation = rx.generation,
                    route,
                    port,
                    "ACK route picked for a renewed or moved path"
                );
            }
        }
        let rx = self.rx_paths[slot as usize]
            .as_mut()
            .expect("ACKs are queued for known paths");
        let src_port = rx.ack_port;
        let copy_ack = std::mem::replace(&mut rx.copy_ack, AckCopy::No);
        rx.ack_sent_ns = now_ns;
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
        (ack.trim_offset, ack.trim_count) = rx.take_trimmed();
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
        // The ACKs of the peer's path (slot, generation) all take one
        // reverse route, chosen by the pair: if that route dies, the peer
        // sees its path go silent, retires it, and the new generation moves
        // the ACKs to a new reverse route too. (Spraying ACKs over every
        // route instead would keep feeding a dead one for ever.)
        // A horizon of 0 turns every copy off, the first answer's too.
        let horizon_ns = dev.config.ack_copy_horizon_ns;
        let copy = horizon_ns > 0
            && match copy_ack {
                AckCopy::No => false,
                AckCopy::Always => true,
                AckCopy::IfLossy => {
                    self.rx_loss_seen_ns != 0
                        && now_ns.saturating_sub(self.rx_loss_seen_ns) < horizon_ns
                }
            };
        if copy && self.ack_copies.len() < usize::from(self.path_count.max(1) as u8) {
            // This connection's packets are being lost on the way to us
            // (holes in a path's PSNs, or resends we already had): ACKs are
            // lost on the way back as often. The ACK that answers a resend
            // or a duplicate is the one the sender's recovery waits for (a
            // probe's verdict, a cold start's first packet, a lost tail):
            // lost, it costs a probe timeout and often a healthy path. So
            // that ACK goes twice, back to back on the same route: both are
            // lost only with the square of the loss rate. Only that one:
            // copying every ACK of a lossy connection took 2 % of the
            // forward links' bandwidth (ACKs share them with data going the
            // other way) and slowed a bandwidth-bound run by as much.
            self.ack_copies.push_back((ack.clone(), src_port));
        }
        self.put_ack(dev, ack, src_port, out)
    }

    /// The route for the ACKs of the peer's path `slot`: from its current
    /// route on, the first port whose ACKs were not lost lately and that no
    /// other path's ACKs use (a moved route that lands on another path's
    /// port would share its fate). Returns the route and its port.
    fn pick_ack_port(&self, now_ns: u64, dev: &DeviceState, slot: u8) -> (u16, u16) {
        let rx = self.rx_paths[slot as usize]
            .as_ref()
            .expect("ACKs are queued for known paths");
        let (generation, mut route) = (rx.generation, rx.ack_route);
        // A renewed path (its sender found it dead, route or ACKs) or a
        // route moved on a probe: a port whose ACKs other paths' senders
        // have heard lately (within a few base RTTs) is a sure way back,
        // where a fresh one is a coin toss when a link is dead; sharing it
        // costs only spreading of ACKs, which are small. The least shared
        // one. Moves need it as much as renewals: on the namespace fabric
        // with a link blackholed, plain steps for moves sent half the moved
        // ACK routes into the dead link, the sender lost sight of live
        // paths, and goodput stayed at 10-21 % of healthy in 3 runs of 6
        // (109-131 % in 3 of 3 with heard ports). Under congestion it costs
        // nothing: in the simulated plane-scaling permutation (seed 1) it
        // gives the best absolute goodput of the rules tried, at 1 plane
        // (5308 Gb/s; plain steps 5154, no moves 5278, heard ports on
        // second moves only 5075) and at 8 (37777; 37260, 37676, 37467),
        // with one other path on the picked port on average. The per-plane
        // ratio that suite target judges (0.890 here, 0.904 with plain
        // steps, 0.923 with second moves only) rose with the other rules
        // only because their 1-plane reference got slower. (Heard ports for
        // moves only after the peer renewed a path lately still collapsed
        // the fabric 1 run of 3: the moves come first. Heard ports for
        // second moves only let ACKs go into the failed core link of the
        // embedded default for 119 us, against 41.5.)
        if route != 0 || generation != 0 {
            let recent_ns = now_ns.saturating_sub(4 * dev.config.base_rtt_ns);
            // On the plane the plain step would give: a multi-plane NIC
            // picks the plane by source port, and ACKs piled onto one plane
            // queue behind each other there (8 planes: per-plane goodput
            // 0.883 without this, 0.904 before heard ports).
            let planes = dev.config.port_planes.max(1);
            let plane =
                ack_port(dev, slot, generation.wrapping_add(route.wrapping_mul(7))) % planes;
            let heard = self
                .rx_paths
                .iter()
                .enumerate()
                .filter_map(|(s, x)| x.as_ref().filter(|_| s != usize::from(slot)))
                .filter(|x| x.ack_port != 0 && x.ack_port_heard_ns > recent_ns)
                .filter(|x| x.ack_port % planes == plane)
                .filter(|x| !self.bad_ack_ports.contains(x.ack_port))
                .min_by_key(|x| {
                    let sharing = self
                        .rx_paths
                        .iter()
                        .flatten()
                        .filter(|y| y.ack_port == x.ack_port)
                        .count();
                    (sharing, u64::MAX - x.ack_port_heard_ns)
                })
                .map(|x| x.ack_port);
            if let Some(port) = heard {
                return (route, port);
            }
        }
        let taken = |port: u16| {
            self.rx_paths.iter().enumerate().any(|(s, x)| {
                s != usize::from(slot) && x.as_ref().is_some_and(|x| x.ack_port == port)
            })
        };
        let mut port = 0;
        for _ in 0..dev.config.path_port_span.max(1) {
            port = ack_port(dev, slot, generation.wrapping_add(route.wrapping_mul(7)));
            if !self.bad_ack_ports.contains(port) && !taken(port) {
                break;
            }
            route = route.wrapping_add(1);
        }
        (route, port)
    }

    /// Emit a built ACK into `out`.
    fn put_ack(
        &mut self,
        dev: &mut DeviceState,
        ack: AckRepr,
        src_port: u16,
        out: &mut Out<'_>,
    ) -> Transmit {
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
        Transmit {
            dst: self.peer,
            src_port,
            ecn: Ecn::NotEct,
            len,
            kind: PacketKind::Ack,
            repair: false,
        }
    }
}

/// The source port the ACKs of the peer's path `(slot, generation)` leave
/// from: one of our path ports, spread by slot, moved by every generation.
fn ack_port(dev: &DeviceState, slot: u8, generation: u16) -> u16 {
    let span = u32::from(dev.config.path_port_span.max(1));
    let k = (u32::from(slot) + u32::from(generation).wrapping_mul(37)) % span;
    dev.config.device_port + 1 + k as u16
}

/// Finish a datagram whose headers end at `header_len`: ICRC, or the
/// connection's packet number and tag (the trailer left zero by the emitter).
fn seal(auth: &mut Option<Box<ConnectionAuth>>, datagram: &mut [u8], header_len: usize) {
    match auth {
        Some(auth) => auth.seal(datagram, header_len),
        None => wire::seal(datagram),
    }
}

/// A route is proven quick for `Connection::keeps_proven_route` when its
/// last round trip came within this fraction of the connection's fastest
/// (a quarter). Half let the senders of a loss-free 128-host all-to-all
/// stay on routes whose queues had begun to build (787.3 µs against 762.6
/// with a quarter, seeds 1-2); an eighth sent them off routes whose
/// queues were only building, onto ones they knew nothing of (the same
/// all-to-all with a core switch down: 1,306.8 µs against 1,071.8).
const PROVEN_ROUTE_SLACK_DIV: u64 = 4;

/// The time `bytes` take on the wire at `rate_bps`: a paced sender's gap
/// after a packet of that size.
pub(super) fn pace_gap_ns(bytes: u64, rate_bps: u64) -> u64 {
    bytes * 8_000_000_000 / rate_bps.max(1)
}
