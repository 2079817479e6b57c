//! The sender's view of one path: one UDP source port, hence one ECMP route.
//!
//! Each path has its own packet sequence space (a PSN says *when and where* a
//! packet was sent), its own in-flight list, RTT estimate and ECN counters.
//! Because a route delivers in order, the first ACK that reports a PSN beyond
//! a missing one proves the missing one lost.

use crate::message::{MsgRef, SegRef};
use crate::rtt::RttEstimator;
use crate::sack::gave_up_arrived;
use metaroce_wire::{SackBits, seq};
use std::collections::VecDeque;

/// How long a receiver may hold an ACK, from the device configuration
/// (both ends are configured alike): `ack_delay_ns` and `deferred_ack_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckWait {
    pub(crate) delayed_ns: u64,
    pub(crate) deferred_ns: u64,
}

impl AckWait {
    pub(crate) fn of(cfg: &crate::config::EndpointConfig) -> Self {
        Self {
            delayed_ns: cfg.ack_delay_ns,
            deferred_ns: cfg.deferred_ack_ns,
        }
    }
}

/// State of one packet sent on a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SentState {
    Outstanding,
    Acked,
    Lost,
}

/// A packet in a path's in-flight list, in 24 bytes: a 400G fabric
/// simulation holds hundreds of thousands of them at once.
///
/// What it does not store: its PSN, which follows from its position (see
/// [`TxPath::inflight`]). What it packs: the segment reference is stored
/// flat (a nested [`SegRef`] would carry two bytes of padding), and the
/// state shares a word with the segment index (see [`SEG_BITS`]).
#[derive(Clone, Copy)]
pub(crate) struct SentPacket {
    pub(crate) sent_ns: u64,
    msg: MsgRef,
    /// The segment index in the low [`SEG_BITS`] bits, the state above.
    seg_and_state: u32,
    attempt: u16,
    /// Fits 16 bits: the configured MTU is at most 65,000 bytes of payload
    /// (`EndpointConfig::validate`), plus 64 of headers.
    pub(crate) wire_bytes: u16,
}

/// Bits of a segment index. A message has at most 2^26 segments: its
/// payload length is a `u32` and its segments are MTU-sized, with an MTU of
/// at least 64 bytes (`EndpointConfig::validate`), so 30 bits hold any index
/// and leave the top two for the [`SentState`].
const SEG_BITS: u32 = 30;
const SEG_MASK: u32 = (1 << SEG_BITS) - 1;

impl SentPacket {
    /// A packet just sent, outstanding.
    pub(crate) fn new(sent_ns: u64, seg: SegRef, wire_bytes: u16) -> Self {
        // Cannot fail (see `SEG_BITS`); checked because a larger index
        // would silently turn into a different state.
        assert!(seg.seg <= SEG_MASK, "segment index {} too large", seg.seg);
        let mut sent = Self {
            sent_ns,
            msg: seg.msg,
            seg_and_state: seg.seg,
            attempt: seg.attempt,
            wire_bytes,
        };
        sent.set_state(SentState::Outstanding);
        sent
    }

    /// The segment this packet carried.
    pub(crate) fn seg(&self) -> SegRef {
        SegRef {
            msg: self.msg,
            seg: self.seg_and_state & SEG_MASK,
            attempt: self.attempt,
        }
    }

    pub(crate) fn state(&self) -> SentState {
        match self.seg_and_state >> SEG_BITS {
            0 => SentState::Outstanding,
            1 => SentState::Acked,
            _ => SentState::Lost,
        }
    }

    pub(crate) fn set_state(&mut self, state: SentState) {
        let code = match state {
            SentState::Outstanding => 0,
            SentState::Acked => 1,
            SentState::Lost => 2,
        };
        self.seg_and_state = (self.seg_and_state & SEG_MASK) | (code << SEG_BITS);
    }
}

impl std::fmt::Debug for SentPacket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentPacket")
            .field("sent_ns", &self.sent_ns)
            .field("seg", &self.seg())
            .field("wire_bytes", &self.wire_bytes)
            .field("state", &self.state())
            .finish()
    }
}

/// Counters of one path, kept across replacements of the slot, and (filled
/// when queried, zero while stored) a snapshot of its current state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Data packets sent (including retransmissions).
    pub packets_sent: u64,
    /// Data bytes sent on the wire (UDP payload: headers, data, trailer),
    /// including retransmissions.
    pub bytes_sent: u64,
    /// Of `packets_sent`, retransmissions (loss, timeout, probes).
    pub packets_retransmitted: u64,
    /// Of `bytes_sent`, the retransmissions' bytes.
    pub bytes_retransmitted: u64,
    /// Tail-loss probes: resends (counted in `packets_retransmitted`), or
    /// a paced sender's next new data packet.
    pub tail_probes: u64,
    /// Data packets acknowledged.
    pub packets_acked: u64,
    /// Data packets declared lost (SACK gap or timeout).
    pub packets_lost: u64,
    /// Retransmission timeouts.
    pub rtos: u64,
    /// CE marks echoed by the receiver.
    pub ce_marks: u64,
    /// Times this slot was retired and given a fresh source port.
    pub replacements: u64,
    /// Snapshot: the path's current UDP source port.
    pub src_port: u16,
    /// Snapshot: its generation (bumped by each replacement).
    pub generation: u16,
    /// Snapshot: smallest RTT sample of the current generation, ns (0: none).
    pub rtt_min_ns: u64,
    /// Snapshot: smoothed RTT, ns (the base RTT before any sample).
    pub srtt_ns: u64,
    /// Snapshot: the congestion controller's window for this path, bytes.
    pub window_bytes: u64,
    /// Snapshot: bytes in flight on it.
    pub inflight_bytes: u64,
}

/// Counters of one receive path: the peer's path of one slot, as this
/// side receives it. They count its current generation (a new generation
/// of the slot starts them again, as its sequence space starts again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxPathStats {
    /// Snapshot: the generation received.
    pub generation: u16,
    /// Data packets received (new on the path; duplicates apart), wrapping
    /// as the ACK's `rx_packets` does.
    pub packets_received: u32,
    /// Their payload bytes.
    pub payload_bytes_received: u64,
    /// Of them, those that arrived CE marked (the ACK's `ce_packets`).
    pub ce_marked: u32,
    /// Data packets that had arrived before on this path (resent when they
    /// did not need to be).
    pub duplicates: u64,
}

/// Initial PSN of a path generation. Both ends compute it, so the receiver
/// knows where a fresh path starts even if its first packets are lost; the
/// base is a protocol parameter that must match on both sides (tests move it
/// next to the wrap point).
pub(crate) fn initial_psn(base: u32, slot: u8, generation: u16) -> u32 {
    base.wrapping_add(u32::from(slot) << 20)
        .wrapping_add(u32::from(generation).wrapping_mul(0x9E37_79B9))
}

/// A tail-loss probe put off by the device's budget for speculative
/// packets (`probe_budget.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeHold {
    /// Nothing put off.
    None,
    /// The probe's share is reserved from this time: it goes then.
    Reserved(u64),
    /// The budget had no room: ask again at this time.
    Refused(u64),
}

impl ProbeHold {
    /// Not before when the probe may go (0: any time).
    pub(crate) fn until_ns(self) -> u64 {
        match self {
            Self::None => 0,
            Self::Reserved(t) | Self::Refused(t) => t,
        }
    }
}

/// PSNs `[first, end)` of one path that timers gave up on (declared lost
/// and queued to go again elsewhere), kept until an ACK tells whether one
/// of them arrived after all (the timers were spurious: the peer's host or
/// a queue stalled) or not (they were lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GaveUp {
    pub(crate) first: u32,
    /// The path's next PSN when the latest of these timers fired.
    pub(crate) end: u32,
    /// Path RTOs among the timers (each counted once when proved spurious).
    pub(crate) rtos: u8,
    /// Other timers among them (retry rounds, unanswered probes).
    pub(crate) others: u8,
    /// Every packet sent on the path since `first` was given up on carried
    /// a PSN floor no higher than `first` (`TxPath::floor_span`): the
    /// receiver cannot have skipped `first` for a floor, so a cumulative
    /// `ack_psn` past it proves it arrived, whatever came after it.
    pub(crate) floor_held: bool,
}

impl GaveUp {
    /// What an ACK reporting `ack_psn` and `sack`, with `limit` one past the
    /// highest PSN it reports, says of these packets: `Some(true)` one of
    /// them arrived, `Some(false)` not (lost, or too late to tell), `None`
    /// not yet known (`crate::sack::gave_up_arrived`).
    pub(crate) fn arrived(&self, ack_psn: u32, sack: &SackBits, limit: u32) -> Option<bool> {
        let fate = gave_up_arrived(ack_psn, sack, limit, (self.first, self.end), self.end);
        if self.floor_held && fate == Some(false) && seq::seq_lt(self.first, ack_psn) {
            // Past `first` by an arrival, not by a floor: no packet sent
            // since carried a floor above it.
            return Some(true);
        }
        fate
    }
}

/// One sending path.
#[derive(Debug)]
pub(crate) struct TxPath {
    pub(crate) slot: u8,
    pub(crate) generation: u16,
    pub(crate) src_port: u16,
    pub(crate) next_psn: u32,
    /// Packets sent and not yet dropped off the front, oldest first. Entry
    /// `i` has PSN `next_psn - inflight.len() + i` (wrapping), so no entry
    /// stores its PSN: packets are appended only by [`TxPath::push_sent`],
    /// which assigns `next_psn`, and leave only from the front or all at
    /// once, so the PSNs in the list are consecutive and end just below
    /// `next_psn` (a replaced path starts a fresh list).
    pub(crate) inflight: VecDeque<SentPacket>,
    pub(crate) inflight_bytes: u64,
    pub(crate) rtt: RttEstimator,
    pub(crate) consecutive_rtos: u32,
    /// When the path last sent a data packet.
    pub(crate) last_sent_ns: u64,
    /// A tail-loss probe went out since the last ACK on this path.
    /// When the tail-loss probe went out, if one is unanswered.
    pub(crate) probe_sent_ns: crate::maybe_ns::MaybeNs,
    /// A tail-loss probe the device's budget put off.
    pub(crate) probe_hold: ProbeHold,
    /// The packets a timer (a path RTO, a retry round, an unanswered probe
    /// of a silent connection) gave up on, until an ACK tells their fate:
    /// one of them reported received proves the timer spurious.
    pub(crate) gave_up: Option<GaveUp>,
    /// When the oldest packet `gave_up` covers was sent.
    pub(crate) rto_oldest_sent_ns: u64,
    /// Packets lost in a row (SACK gaps) without one acknowledged between.
    pub(crate) consecutive_losses: u32,
    /// When packets of this path were last acknowledged.
    pub(crate) last_acked_ns: u64,
    /// The send time of the latest-sent packet acknowledged on this path.
    pub(crate) last_acked_sent_ns: u64,
    /// Whether the last packet sent asked for an immediate ACK (then a
    /// probe need not wait for the receiver's delayed-ACK timer).
    pub(crate) last_sent_ack_request: bool,
    /// Whether the last packet sent completes an unsignaled request whose
    /// ACK the receiver may hold for `deferred_ack_ns`.
    pub(crate) last_sent_ack_deferred: bool,
    /// Unanswered probe rounds in a row: each doubles the next wait.
    pub(crate) probe_backoff: u32,
    /// Probe timeouts in a row with evidence that others delivered.
    pub(crate) silent_rounds: u32,
    /// A replacement not yet answered: one packet at a time until its first
    /// ACK proves the new route (a fresh port may hash onto the same dead
    /// link as the old one).
    pub(crate) unproven: bool,
    /// This generation's port was drawn fresh (not taken from a path that
    /// proved it live): its first answer, or its retirement before one, is
    /// an outcome for `ReplacementPorts`.
    pub(crate) drawn_fresh: bool,
    /// What the retirement that opened this generation gave up on: the
    /// previous generation's first outstanding psn and when its oldest
    /// outstanding packet was sent (none: not a retirement, or already
    /// heard from). A late ACK of the old generation covering that psn
    /// proves the retirement spurious (see `Connection::on_ack`).
    pub(crate) retired: Option<(u32, u64)>,
    /// Cumulative receiver counters seen so far (echoes are cumulative so a
    /// lost ACK loses nothing).
    pub(crate) echoed_rx_packets: u32,
    pub(crate) echoed_ce_packets: u32,
    /// The newest ACK brought CE marks: the route's queue was past the
    /// marking threshold when its last packet crossed it.
    pub(crate) last_echo_marked: bool,
    /// One past the highest PSN an ACK of this generation reported (its
    /// cumulative point, or the top of its SACK): a data packet whose floor
    /// is at or below it says so (`floor_acked`), and its receiver learns
    /// that an ACK it sent after a packet it had not yet received came back
    /// (transport spec, "Heard ACK ports").
    pub(crate) ack_reported_end: u32,
    pub(crate) stats: PathStats,
}

impl TxPath {
    pub(crate) fn new(
        slot: u8,
        generation: u16,
        src_port: u16,
        psn_base: u32,
        rtt_ns: u64,
    ) -> Self {
        Self {
            slot,
            generation,
            src_port,
            next_psn: initial_psn(psn_base, slot, generation),
            ack_reported_end: initial_psn(psn_base, slot, generation),
            inflight: VecDeque::new(),
            inflight_bytes: 0,
            rtt: RttEstimator::new(rtt_ns),
            consecutive_rtos: 0,
            last_sent_ns: 0,
            probe_sent_ns: crate::maybe_ns::MaybeNs::NONE,
            probe_hold: ProbeHold::None,
            gave_up: None,
            rto_oldest_sent_ns: 0,
            consecutive_losses: 0,
            last_acked_ns: 0,
            last_acked_sent_ns: 0,
            last_sent_ack_request: false,
            last_sent_ack_deferred: false,
            probe_backoff: 0,
            silent_rounds: 0,
            unproven: false,
            drawn_fresh: false,
            retired: None,
            echoed_rx_packets: 0,
            echoed_ce_packets: 0,
            last_echo_marked: false,
            stats: PathStats::default(),
        }
    }

    /// PSN of the oldest packet in flight (`next_psn` when none is).
    pub(crate) fn first_inflight_psn(&self) -> u32 {
        // Exact modulo 2^32, which is all PSN arithmetic needs.
        self.next_psn.wrapping_sub(self.inflight.len() as u32)
    }

    /// PSNs the in-flight list spans, from its oldest packet up to (not
    /// including) `next_psn`: one per packet, as they are consecutive.
    pub(crate) fn psn_span(&self) -> u32 {
        self.inflight.len() as u32
    }

    /// How far below `next_psn` the PSN floor of the packet about to go
    /// out lies: the oldest packet in flight, or, while the fate of packets
    /// a timer gave up on is unknown, the first of them. A floor above
    /// those would let the receiver skip them unreceived, and an ACK past
    /// them could then not prove that they arrived; held at the first, a
    /// packet that was only late (a stalled peer reading them in the same
    /// batch as later ones) is told from one that was lost. The hold ends
    /// before the span would pass the receiver's window (`window`): a
    /// packet beyond it would be dropped unread.
    pub(crate) fn floor_span(&mut self, window: u32) -> u32 {
        let span = self.psn_span();
        let Some(g) = self.gave_up.as_mut().filter(|g| g.floor_held) else {
            return span;
        };
        let held = self.next_psn.wrapping_sub(g.first);
        if held < window {
            held.max(span)
        } else {
            g.floor_held = false;
            span
        }
    }

    /// A timer (a path RTO if `rto`, else a retry round or an unanswered
    /// probe) is about to give up on this path's outstanding packets:
    /// remember them, so that an ACK reporting one of them later proves the
    /// timer spurious. Timers that fire before the first one's fate is
    /// known join its record while the floor is held (an arrival proves
    /// them all late); otherwise the earlier record, whose packets a floor
    /// may have skipped, gives way.
    pub(crate) fn note_gave_up(&mut self, now_ns: u64, rto: bool) {
        let (rtos, others) = (u8::from(rto), u8::from(!rto));
        match &mut self.gave_up {
            Some(g) if g.floor_held => {
                g.end = self.next_psn;
                g.rtos = g.rtos.saturating_add(rtos);
                g.others = g.others.saturating_add(others);
            }
            // An earlier timer's record stands (as it always did for a
            // retry round or a probe on top of it); an RTO renews it.
            Some(_) if !rto => {}
            _ => {
                self.gave_up = Some(GaveUp {
                    first: self.first_inflight_psn(),
                    end: self.next_psn,
                    rtos,
                    others,
                    floor_held: true,
                });
                self.rto_oldest_sent_ns = self.oldest_outstanding_sent_ns().unwrap_or(now_ns);
            }
        }
    }

    /// Append a packet just sent under PSN `next_psn`, and move `next_psn`
    /// on: the one place that keeps `inflight` and `next_psn` in step.
    pub(crate) fn push_sent(&mut self, sent: SentPacket) {
        // Grown from one entry: with 128 paths per connection most paths
        // hold one or two packets at a time.
        crate::grow::push_back(&mut self.inflight, sent);
        self.next_psn = self.next_psn.wrapping_add(1);
    }

    /// Drop acknowledged and lost packets off the front, so the front is the
    /// oldest outstanding packet.
    pub(crate) fn trim_front(&mut self) {
        while self
            .inflight
            .front()
            .is_some_and(|p| p.state() != SentState::Outstanding)
        {
            self.inflight.pop_front();
        }
    }

    /// When to send a tail-loss probe: two smoothed RTTs (plus the peer's ACK
    /// delay) after the last transmission without any ACK, once per silence.
    /// Far shorter than the RTO, it recovers a lost ACK or a lost tail
    /// packet on a window-limited path in about one RTT.
    /// How long the receiver may wait before it acknowledges the last
    /// packet sent on this path: nothing if it asked for an immediate ACK,
    /// the deferred-ACK time if it completes an unsignaled request, else
    /// the delayed-ACK time.
    pub(crate) fn ack_wait_ns(&self, ack_wait: AckWait) -> u64 {
        if self.last_sent_ack_request {
            0
        } else if self.last_sent_ack_deferred {
            ack_wait.deferred_ns.max(ack_wait.delayed_ns)
        } else {
            ack_wait.delayed_ns
        }
    }

    /// The probe timeout: how long silence on this path may last before a
    /// tail-loss probe, then before the probe counts as unanswered. RACK-TLP's
    /// rule in datacenter units: a smoothed RTT plus four deviations, plus
    /// the receiver's delayed-ACK time unless the last packet asked for an
    /// immediate ACK; doubled per unanswered round in a row.
    pub(crate) fn pto_ns(&self, ack_wait: AckWait, pto_min_ns: u64) -> u64 {
        let delay = self.ack_wait_ns(ack_wait);
        let base = (self.rtt.probe_timeout_ns() + delay).max(pto_min_ns);
        base << self.probe_backoff.min(10)
    }

    /// When a tail-loss probe is due: a probe timeout after the oldest
    /// packet still outstanding was sent (later sends on a dead route must
    /// not put the question off).
    pub(crate) fn probe_deadline(&self, ack_wait: AckWait, pto_min_ns: u64) -> Option<u64> {
        if self.probe_sent_ns.is_some() {
            return None;
        }
        let oldest_ns = self.oldest_outstanding_sent_ns()?;
        // Re-armed by every ACK of the path (RACK-TLP): a path that answers
        // is alive, and probing it again at once (its oldest packet is old
        // only because it waits behind a queue) would only feed the queue.
        Some(
            (oldest_ns.max(self.last_acked_ns) + self.pto_ns(ack_wait, pto_min_ns))
                .max(self.probe_hold.until_ns()),
        )
    }

    /// The oldest packet still outstanding on this path.
    pub(crate) fn oldest_outstanding(&self) -> Option<&SentPacket> {
        self.inflight
            .iter()
            .find(|s| s.state() == SentState::Outstanding)
    }

    /// When the oldest packet still outstanding on this path was sent.
    pub(crate) fn oldest_outstanding_sent_ns(&self) -> Option<u64> {
        self.oldest_outstanding().map(|s| s.sent_ns)
    }

    /// When an unanswered probe proves the path dead (if other paths of
    /// the connection deliver meanwhile) or, on a silent connection, sends
    /// its packets again elsewhere.
    pub(crate) fn probe_timeout(&self, ack_wait: AckWait, pto_min_ns: u64) -> Option<u64> {
        let sent = self.probe_sent_ns.get()?;
        (!self.inflight.is_empty()).then(|| sent + self.pto_ns(ack_wait, pto_min_ns))
    }

    pub(crate) fn rto_deadline(
        &self,
        rto_min_ns: u64,
        rto_max_ns: u64,
        unsampled_rto_ns: u64,
    ) -> Option<u64> {
        let oldest = self.inflight.front()?;
        let backoff = self.consecutive_rtos.min(10);
        let mut rto = self.rtt.rto_ns(rto_min_ns, rto_max_ns);
        if self.rtt.measured_min_ns().is_none() {
            rto = rto.max(unsampled_rto_ns.min(rto_max_ns));
        }
        let rto = (rto << backoff).min(rto_max_ns);
        Some(oldest.sent_ns + rto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_psns_differ_per_slot_and_generation() {
        let a = initial_psn(0, 1, 0);
        assert_ne!(a, initial_psn(0, 2, 0));
        assert_ne!(a, initial_psn(0, 1, 1));
        assert_eq!(initial_psn(u32::MAX, 0, 0), u32::MAX);
    }

    fn seg(slot: u32, generation: u32, seg: u32, attempt: u16) -> SegRef {
        SegRef {
            msg: MsgRef { slot, generation },
            seg,
            attempt,
        }
    }

    #[test]
    fn sent_packet_round_trips_every_state_and_field_limit() {
        assert_eq!(size_of::<SentPacket>(), 24);
        let states = [SentState::Outstanding, SentState::Acked, SentState::Lost];
        for (slot, generation, index, attempt, wire_bytes, sent_ns) in [
            (0, 0, 0, 0, 0, 0),
            (u32::MAX, u32::MAX, SEG_MASK, u16::MAX, u16::MAX, u64::MAX),
            (7, 1 << 31, 1 << 26, 1 << 15, 4160, 1 << 40),
        ] {
            let r = seg(slot, generation, index, attempt);
            let mut p = SentPacket::new(sent_ns, r, wire_bytes);
            assert_eq!(p.state(), SentState::Outstanding);
            // Every transition, including back to outstanding.
            for &from in &states {
                for &to in &states {
                    p.set_state(from);
                    assert_eq!(p.state(), from);
                    p.set_state(to);
                    assert_eq!(p.state(), to);
                    assert_eq!(p.seg(), r);
                    assert_eq!((p.sent_ns, p.wire_bytes), (sent_ns, wire_bytes));
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "too large")]
    fn sent_packet_refuses_an_index_that_would_clobber_the_state() {
        SentPacket::new(0, seg(0, 0, SEG_MASK + 1, 0), 0);
    }

    /// The RTO of a path runs from its oldest packet: at least the
    /// device's recent RTT ceiling while the path has no sample of its own
    /// (a 1,024-host all-to-all's one-packet flows met 95-107 µs queues
    /// against the 100 µs floor), its own estimate once it has one.
    #[test]
    fn rto_waits_for_the_device_ceiling_until_the_path_has_a_sample() {
        let (floor, max) = (100_000, 10_000_000);
        let mut path = TxPath::new(0, 0, 1, 0, 10_000);
        assert_eq!(path.rto_deadline(floor, max, 0), None);
        path.push_sent(SentPacket::new(1_000, seg(0, 0, 0, 0), 100));
        assert_eq!(path.rto_deadline(floor, max, 0), Some(101_000));
        // Unsampled: the ceiling (the device measured 120 µs lately).
        assert_eq!(path.rto_deadline(floor, max, 150_000), Some(151_000));
        // Never past the RTO's cap.
        assert_eq!(path.rto_deadline(floor, 120_000, 150_000), Some(121_000));
        // Sampled: the path's own estimate; the ceiling no longer counts.
        path.rtt.update(8_000);
        assert_eq!(path.rto_deadline(floor, max, 150_000), Some(101_000));
    }

    #[test]
    fn inflight_psns_follow_from_positions_across_the_wrap() {
        let mut path = TxPath::new(0, 0, 1, u32::MAX - 1, 10_000);
        assert_eq!(path.first_inflight_psn(), u32::MAX - 1);
        assert_eq!(path.psn_span(), 0);
        for i in 0..4 {
            path.push_sent(SentPacket::new(i, seg(0, 0, i as u32, 0), 100));
        }
        assert_eq!(path.next_psn, 2);
        assert_eq!(path.first_inflight_psn(), u32::MAX - 1);
        assert_eq!(path.psn_span(), 4);
        path.inflight[0].set_state(SentState::Acked);
        path.inflight[1].set_state(SentState::Lost);
        path.trim_front();
        // The packets sent third and fourth, under PSNs 0 and 1.
        assert_eq!(path.first_inflight_psn(), 0);
        assert_eq!(path.inflight[0].seg().seg, 2);
        assert_eq!(path.psn_span(), 2);
        path.inflight.clear();
        assert_eq!(path.first_inflight_psn(), path.next_psn);
    }
}
