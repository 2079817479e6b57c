//! The device's path skew: how much later than another path's packets a
//! live path's packets have been seen to arrive, learned from suspicions
//! that proved wrong.
//!
//! Cross-path RACK (transport spec section 4) suspects a path once its
//! newest packet is overdue past a later packet acknowledged on another
//! path, by a reordering window of half the minimum RTT. On a fabric whose
//! routes carry different queues (ECMP collisions load some links more than
//! others) a live path's packets are routinely later than that: a sender
//! spraying 64 paths at 100 Gb/s, under one packet per path per round
//! trip, found paths suspect 46,109 times on a loss-free 1,024-host
//! permutation, and its probes' late answers retired 14,131 live paths.
//!
//! The fabric says how late a live path can be. A suspect path whose
//! packet sent before the probe is acknowledged after the probe went was
//! late, not lossy: the lateness (the answer's arrival less the probe's
//! departure, which was the deadline) is added to the skew, which every
//! cross-path RACK deadline then waits on top of the window. It is RFC
//! 8985's adaptive reordering window (widened on evidence of a spurious
//! retransmission) with paths in place of sequence order. The skew is at
//! most two minimum RTTs: past that the path's probe timeout (about two
//! smoothed RTTs) comes first anyway. Like the reordering window it is the
//! device's, for all its connections (one proof serves them all); without
//! a new proof it halves every [`MEMORY_RTTS`] smoothed RTTs, back to the
//! bare window on a fabric whose queues even out. On a fabric that loses
//! packets a suspicion that was right brings no proof (the packet is
//! missing, and the probe's answer is for the probe), so nothing widens.

use crate::reorder::MEMORY_RTTS;

/// The skew is at most this many minimum RTTs.
pub(crate) const MAX_SKEW_RTTS: u64 = 2;

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct PathSkew {
    skew_ns: u64,
    /// When the skew last grew.
    changed_ns: u64,
}

impl PathSkew {
    /// The skew in force at `now_ns`: halved for every `MEMORY_RTTS`
    /// smoothed RTTs since it last grew.
    pub(crate) fn skew_ns(&self, now_ns: u64, srtt_ns: u64) -> u64 {
        // Every cross-path RACK deadline asks, on every ACK that advances
        // it: on a fabric that never proved a path late, no division.
        if self.skew_ns == 0 {
            return 0;
        }
        let age_ns = now_ns.saturating_sub(self.changed_ns);
        let halvings = age_ns / (MEMORY_RTTS * srtt_ns.max(1));
        self.skew_ns >> halvings.min(63)
    }

    /// A suspect path's answer came `late_ns` after its probe: its packet
    /// was that much later than the deadline the skew in force allowed.
    pub(crate) fn on_late_answer(
        &mut self,
        now_ns: u64,
        late_ns: u64,
        rtt_min_ns: u64,
        srtt_ns: u64,
    ) {
        let in_force = self.skew_ns(now_ns, srtt_ns);
        self.skew_ns = in_force
            .saturating_add(late_ns)
            .min(MAX_SKEW_RTTS * rtt_min_ns);
        self.changed_ns = now_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_by_each_late_answer_up_to_two_rtts_and_halves_without_one() {
        let mut s = PathSkew::default();
        assert_eq!(s.skew_ns(0, 10_000), 0);
        s.on_late_answer(1_000, 3_000, 10_000, 10_000);
        assert_eq!(s.skew_ns(1_000, 10_000), 3_000);
        // The next suspicion already waited those 3 µs: a further 4 µs
        // late means the path was 7 µs later than the window.
        s.on_late_answer(2_000, 4_000, 10_000, 10_000);
        assert_eq!(s.skew_ns(2_000, 10_000), 7_000);
        s.on_late_answer(3_000, 50_000, 10_000, 10_000);
        assert_eq!(s.skew_ns(3_000, 10_000), 20_000, "at most two RTTs");
        // 64 smoothed RTTs without a late answer: halved, and so on.
        let later = 3_000 + MEMORY_RTTS * 10_000;
        assert_eq!(s.skew_ns(later, 10_000), 10_000);
        assert_eq!(s.skew_ns(later + MEMORY_RTTS * 10_000, 10_000), 5_000);
        assert_eq!(s.skew_ns(u64::MAX, 10_000), 0);
    }
}
