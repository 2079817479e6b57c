//! What a connection has learned about source ports by replacing paths:
//! which ports died, and whether fresh ports are worth drawing.
//!
//! A route is a property of the 5-tuple, so a retired path's port is
//! remembered and not drawn again for a while (it would die on the same
//! link). And a fresh port is a bet on the fabric: with many equal-cost
//! routes and one of them dead, a fresh port almost always lands on a live
//! one, and it spreads the connection's traffic; with two routes and one
//! dead, it is a coin toss, and every miss costs a probe timeout and
//! another replacement. The connection tells the two apart by keeping
//! score: the outcomes of its last few fresh draws (answered, or retired
//! unanswered), and the share of its paths retired in the current burst
//! of retirements or silent with them (the share of routes that died is
//! about the chance that a fresh port lands on a dead one: half when a
//! link of two dies, an eighth when one of eight does). While fresh draws
//! keep failing, or a quarter of the paths or more went or fell silent at
//! once, a replacement takes a port that other paths proved live instead
//! (two paths on one port share a route, which costs spreading, not
//! delivery). The score is forgotten after a quiet while, so a repaired
//! fabric gets fresh ports again.
//!
//! Built with a connection's first retirement: most never retire a path.

use crate::recent_ports::RecentPorts;

/// Retired ports remembered. As many as a connection has paths by default,
/// and more: when a link of two dies, half of a connection's ports are dead
/// at once, and a memory of eight forgot them while their replacements
/// were still being drawn (on the namespace fabric, 64 paths: a dead port
/// drawn again a few milliseconds after it was retired).
const DEAD_PORTS_KEPT: usize = 64;

/// Fresh draws whose outcomes count.
const OUTCOMES_KEPT: u32 = 4;

/// Failures among the last [`OUTCOMES_KEPT`] fresh draws from which
/// replacements take proven ports: half of them, what a fabric with two
/// routes, one dead, gives on average; with eight routes and one dead, two
/// misses in four draws happen about once in twelve failures.
const FAILURES_FOR_PROVEN: u32 = 2;

/// A burst that retires one path in this many (or more) takes proven ports
/// for the rest: a quarter of the routes dead makes a fresh draw a bad bet.
const BURST_SHARE_DENOMINATOR: usize = 4;

/// A burst counts only while the fabric loses less than this share of
/// packets at random. Where it loses more, a probe or its answer is lost
/// often enough that silences come in bursts on live routes too (10 %
/// loss: one suspicion in five ends unanswered), and a fresh port is as
/// good a bet as a proven one.
pub(crate) const RANDOM_LOSS_FOR_BURSTS: f64 = 0.02;

/// See the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct ReplacementPorts {
    dead: RecentPorts<DEAD_PORTS_KEPT>,
    /// The last fresh draws' outcomes, newest in bit 0: 1 failed, 0
    /// answered.
    outcomes: u8,
    /// How many of the bits of `outcomes` are outcomes (at most
    /// [`OUTCOMES_KEPT`]).
    outcome_count: u8,
    /// When the last outcome was recorded.
    last_outcome_ns: u64,
    /// The current burst of retirements: when it began, and how many.
    burst_start_ns: u64,
    burst_retirements: u16,
}

impl ReplacementPorts {
    pub(crate) fn new() -> Self {
        Self {
            dead: RecentPorts::new(),
            outcomes: 0,
            outcome_count: 0,
            last_outcome_ns: 0,
            burst_start_ns: 0,
            burst_retirements: 0,
        }
    }

    /// A path was retired at `now_ns`; a retirement more than `burst_ns`
    /// after the first of the current burst begins a new one.
    pub(crate) fn note_retirement(&mut self, now_ns: u64, burst_ns: u64) {
        if self.burst_retirements == 0 || now_ns.saturating_sub(self.burst_start_ns) > burst_ns {
            self.burst_start_ns = now_ns;
            self.burst_retirements = 0;
        }
        self.burst_retirements = self.burst_retirements.saturating_add(1);
    }

    /// A path on `port` was retired: its route (or its ACKs' way back) is
    /// dead.
    pub(crate) fn note_dead(&mut self, port: u16) {
        self.dead.note(port);
    }

    /// Whether `port` was retired lately.
    pub(crate) fn is_dead(&self, port: u16) -> bool {
        self.dead.contains(port)
    }

    /// A freshly drawn port was answered (`failed` false) or retired
    /// before its first answer (`failed` true).
    pub(crate) fn fresh_outcome(&mut self, now_ns: u64, failed: bool) {
        self.outcomes = (self.outcomes << 1) | u8::from(failed);
        self.outcome_count = (self.outcome_count + 1).min(OUTCOMES_KEPT as u8);
        self.last_outcome_ns = now_ns;
    }

    /// Whether a replacement should take a proven port rather than draw a
    /// fresh one: the current burst (younger than `burst_ns`) retired a
    /// quarter of the connection's `path_count` paths or more, counting
    /// with them the `suspect_paths` silent right now (probed, not yet
    /// answered), while the fabric loses few packets at random
    /// (`random_loss`, the device's estimate); or fresh draws failed often
    /// lately (the last outcome younger than `forget_after_ns`).
    ///
    /// The suspects count because a failure silences its paths at once but
    /// retires them one probe timeout at a time: when a link of two dies,
    /// half of the paths fall silent together, and waiting for a quarter
    /// of them to be retired let the first sixteen of 64 draw fresh ports,
    /// half of which hashed onto the dead link and were retired in turn.
    pub(crate) fn prefer_proven(
        &self,
        now_ns: u64,
        path_count: usize,
        suspect_paths: usize,
        burst_ns: u64,
        forget_after_ns: u64,
        random_loss: f64,
    ) -> bool {
        let in_burst = now_ns.saturating_sub(self.burst_start_ns) <= burst_ns;
        let retired = if in_burst {
            usize::from(self.burst_retirements)
        } else {
            0
        };
        let burst_share = random_loss < RANDOM_LOSS_FOR_BURSTS
            && retired > 0
            && (retired + suspect_paths) * BURST_SHARE_DENOMINATOR >= path_count.max(2);
        let mask = (1u16 << self.outcome_count) - 1;
        let misses = now_ns.saturating_sub(self.last_outcome_ns) <= forget_after_ns
            && (u16::from(self.outcomes) & mask).count_ones() >= FAILURES_FOR_PROVEN;
        burst_share || misses
    }
}

#[cfg(test)]
mod tests {
    use super::ReplacementPorts;

    #[test]
    fn proven_ports_after_two_failed_draws_in_four_until_forgotten() {
        let mut r = ReplacementPorts::new();
        let proven = |r: &ReplacementPorts, now| r.prefer_proven(now, 16, 0, 0, 1_000, 0.0);
        assert!(!proven(&r, 0));
        r.fresh_outcome(10, true);
        assert!(!proven(&r, 10), "one miss is not a pattern");
        r.fresh_outcome(20, false);
        r.fresh_outcome(30, true);
        assert!(proven(&r, 30));
        assert!(!proven(&r, 1_031), "forgotten after a quiet while");
        // Answered draws push the misses out of the last four.
        r.fresh_outcome(40, false);
        assert!(proven(&r, 40), "the misses at 10 and 30 still count");
        r.fresh_outcome(50, false);
        assert!(!proven(&r, 50), "the miss at 10 is out");
    }

    #[test]
    fn proven_ports_once_a_burst_retires_a_quarter_of_the_paths() {
        let mut r = ReplacementPorts::new();
        // 16 paths, bursts of 100 ns.
        let proven = |r: &ReplacementPorts, now| r.prefer_proven(now, 16, 0, 100, 1_000_000, 0.0);
        for t in [0, 10, 20] {
            r.note_retirement(t, 100);
        }
        assert!(
            !proven(&r, 20),
            "three of sixteen: fresh ports are a good bet"
        );
        r.note_retirement(30, 100);
        assert!(proven(&r, 30), "four of sixteen");
        assert!(
            !r.prefer_proven(30, 16, 0, 100, 1_000_000, 0.1),
            "not on a fabric that loses a tenth of its packets at random"
        );
        assert!(!proven(&r, 131), "the burst is over");
        // Retirements spread out never make a burst.
        let mut r = ReplacementPorts::new();
        for t in (0..10).map(|k| 1_000 * k) {
            r.note_retirement(t, 100);
            assert!(!proven(&r, t));
        }
    }

    #[test]
    fn paths_silent_now_count_with_the_burst() {
        let mut r = ReplacementPorts::new();
        // 64 paths, one retired, 15 more silent: a quarter at risk.
        r.note_retirement(0, 100);
        assert!(!r.prefer_proven(0, 64, 14, 100, 1_000_000, 0.0));
        assert!(r.prefer_proven(0, 64, 15, 100, 1_000_000, 0.0));
        // Suspects alone, with no retirement in the burst, are only a
        // slow fabric: fresh ports then.
        assert!(!r.prefer_proven(200, 64, 40, 100, 1_000_000, 0.0));
        assert!(!ReplacementPorts::new().prefer_proven(0, 64, 40, 100, 1_000_000, 0.0));
    }

    #[test]
    fn remembers_as_many_dead_ports_as_a_wide_connection_retires() {
        let mut r = ReplacementPorts::new();
        for port in 5000..5064 {
            r.note_dead(port);
        }
        assert!((5000..5064).all(|p| r.is_dead(p)));
        r.note_dead(5064);
        assert!(!r.is_dead(5000) && r.is_dead(5064));
    }
}
