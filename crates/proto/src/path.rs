//! The sender's view of one path: one UDP source port, hence one ECMP route.
//!
//! Each path has its own packet sequence space (a PSN says *when and where* a
//! packet was sent), its own in-flight list, RTT estimate and ECN counters.
//! Because a route delivers in order, the first ACK that reports a PSN beyond
//! a missing one proves the missing one lost.

use crate::message::SegRef;
use crate::rtt::RttEstimator;
use std::collections::VecDeque;

/// State of one packet sent on a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SentState {
    Outstanding,
    Acked,
    Lost,
}

/// A packet in a path's in-flight list.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SentPacket {
    pub(crate) psn: u32,
    pub(crate) sent_ns: u64,
    pub(crate) seg: SegRef,
    /// Fits 16 bits: the configured MTU is at most 65,000 bytes of payload
    /// (`EndpointConfig::validate`), plus 64 of headers. Keeping it small
    /// keeps the entry at 32 bytes; a 400G fabric simulation holds millions.
    pub(crate) wire_bytes: u16,
    pub(crate) state: SentState,
}

/// Counters of one path, kept across replacements of the slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Data packets sent (including retransmissions).
    pub packets_sent: u64,
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
}

/// Initial PSN of a path generation. Both ends compute it, so the receiver
/// knows where a fresh path starts even if its first packets are lost; the
/// base is a protocol parameter that must match on both sides (tests move it
/// next to the wrap point).
pub(crate) fn initial_psn(base: u32, slot: u8, generation: u16) -> u32 {
    base.wrapping_add(u32::from(slot) << 20)
        .wrapping_add(u32::from(generation).wrapping_mul(0x9E37_79B9))
}

/// One sending path.
#[derive(Debug)]
pub(crate) struct TxPath {
    pub(crate) slot: u8,
    pub(crate) generation: u16,
    pub(crate) src_port: u16,
    pub(crate) next_psn: u32,
    pub(crate) inflight: VecDeque<SentPacket>,
    pub(crate) inflight_bytes: u64,
    pub(crate) rtt: RttEstimator,
    pub(crate) consecutive_rtos: u32,
    /// When the path last sent a data packet.
    pub(crate) last_sent_ns: u64,
    /// A tail-loss probe went out since the last ACK on this path.
    pub(crate) probe_sent: bool,
    /// Cumulative receiver counters seen so far (echoes are cumulative so a
    /// lost ACK loses nothing).
    pub(crate) echoed_rx_packets: u32,
    pub(crate) echoed_ce_packets: u32,
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
            inflight: VecDeque::new(),
            inflight_bytes: 0,
            rtt: RttEstimator::new(rtt_ns),
            consecutive_rtos: 0,
            last_sent_ns: 0,
            probe_sent: false,
            echoed_rx_packets: 0,
            echoed_ce_packets: 0,
            stats: PathStats::default(),
        }
    }

    /// Drop acknowledged and lost packets off the front, so the front is the
    /// oldest outstanding packet.
    pub(crate) fn trim_front(&mut self) {
        while self
            .inflight
            .front()
            .is_some_and(|p| p.state != SentState::Outstanding)
        {
            self.inflight.pop_front();
        }
    }

    /// When to send a tail-loss probe: two smoothed RTTs (plus the peer's ACK
    /// delay) after the last transmission without any ACK, once per silence.
    /// Far shorter than the RTO, it recovers a lost ACK or a lost tail
    /// packet on a window-limited path in about one RTT.
    pub(crate) fn probe_deadline(&self, ack_delay_ns: u64) -> Option<u64> {
        if self.probe_sent || self.inflight.is_empty() {
            return None;
        }
        Some(self.last_sent_ns + 2 * self.rtt.srtt_ns() + ack_delay_ns)
    }

    /// When the oldest outstanding packet times out.
    pub(crate) fn rto_deadline(&self, rto_min_ns: u64, rto_max_ns: u64) -> Option<u64> {
        let oldest = self.inflight.front()?;
        let backoff = self.consecutive_rtos.min(10);
        let rto = (self.rtt.rto_ns(rto_min_ns, rto_max_ns) << backoff).min(rto_max_ns);
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
}
