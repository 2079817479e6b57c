//! The device's reordering window: how long a SACK gap waits before it is
//! a loss.
//!
//! A path is one ECMP route, and a route keeps its packets in order, so a
//! packet below the highest PSN its path delivered is lost, and is resent
//! at once (transport spec section 4). Switches that route each packet on
//! its own (adaptive routing, by queue depth) break that: a path's packets
//! overtake each other by the difference between two queues, and every
//! overtaken packet went twice. On a 128-host fat tree with adaptive
//! routing, 2 MB permutation (`scenarios/claims/ft128-perm.toml` with
//! `routing = "adaptive"`), 6,407 of 68,999 packets were resent and
//! nothing was lost.
//!
//! The fabric says which it is. A packet given up on for a gap that the
//! receiver reports received afterwards proves reordering; the window then
//! opens (a quarter of the minimum RTT, doubled per proof, at most one
//! minimum RTT: RFC 8985's bounds, beyond which a late packet is as costly
//! as a lost one), and a gap is a loss only once a packet sent that much
//! later was delivered, or once it is a round trip and that window old.
//! On the same run: 1,246 resends, 258.8 against 280.1 µs (ECMP: 248.9).
//!
//! Reordering is a property of the fabric, not of one peer, so the window
//! is the device's: one proof serves every connection, instead of each
//! paying its own resends to learn it. Without new proof it halves every
//! [`MEMORY_RTTS`] smoothed RTTs, back to exact verdicts on a fabric that
//! keeps order.

/// Smoothed RTTs without a new proof after which the window halves.
pub(crate) const MEMORY_RTTS: u64 = 64;

/// Below this the window is closed (exact verdicts).
const CLOSED_BELOW_NS: u64 = 100;

/// The latest packet a connection gave up on for a SACK gap, kept until an
/// ACK of its path tells whether it arrived after all (8 bytes: it sits in
/// every connection, idle ones too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GapVerdict {
    pub(crate) psn: u32,
    /// The path's generation at the verdict (a renewed path is another
    /// route, and its PSNs another space).
    pub(crate) generation: u16,
    pub(crate) slot: u8,
    /// Packets the path had sent after it when the verdict came (fewer
    /// than the 256-PSN window): only those, and later ones, can carry the
    /// PSN floor that would skip it.
    pub(crate) sent_after: u8,
}

impl GapVerdict {
    /// The path's next PSN when the verdict came.
    pub(crate) fn next_psn(&self) -> u32 {
        self.psn.wrapping_add(1 + u32::from(self.sent_after))
    }
}

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReorderWindow {
    window_ns: u64,
    /// When the window last opened wider or halved.
    changed_ns: u64,
}

impl ReorderWindow {
    /// The window in force at `now_ns` (0: a gap is a loss at once),
    /// halving it first if it has gone unproved for long enough.
    pub(crate) fn window_ns(&mut self, now_ns: u64, srtt_ns: u64) -> u64 {
        if self.window_ns > 0
            && now_ns.saturating_sub(self.changed_ns) >= MEMORY_RTTS * srtt_ns.max(1)
        {
            self.window_ns /= 2;
            if self.window_ns < CLOSED_BELOW_NS {
                self.window_ns = 0;
            }
            self.changed_ns = now_ns;
        }
        self.window_ns
    }

    /// Whether the fabric was proved to reorder lately (the window is
    /// open): a SACK gap is then as likely a late packet as a lost one.
    pub(crate) fn is_open(&self) -> bool {
        self.window_ns > 0
    }

    /// A packet given up on for a gap arrived after all.
    pub(crate) fn on_proof(&mut self, now_ns: u64, rtt_min_ns: u64) {
        let rtt_min_ns = rtt_min_ns.max(1);
        self.window_ns = (self.window_ns * 2).max(rtt_min_ns / 4).min(rtt_min_ns);
        self.changed_ns = now_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_on_proof_doubles_to_one_rtt_and_closes_without_proof() {
        let mut w = ReorderWindow::default();
        assert_eq!(w.window_ns(0, 10_000), 0);
        w.on_proof(1_000, 10_000);
        assert_eq!(w.window_ns(1_000, 10_000), 2_500);
        w.on_proof(2_000, 10_000);
        w.on_proof(3_000, 10_000);
        w.on_proof(4_000, 10_000);
        assert_eq!(w.window_ns(4_000, 10_000), 10_000, "at most one RTT");
        // 64 RTTs without proof: halved, and so on until closed.
        let mut now = 4_000;
        let mut seen = Vec::new();
        while w.window_ns(now, 10_000) > 0 {
            seen.push(w.window_ns(now, 10_000));
            now += MEMORY_RTTS * 10_000;
        }
        assert_eq!(seen[..3], [10_000, 5_000, 2_500]);
        assert!(seen.len() < 10);
    }
}
