//! The longest round trip this device measured lately, on any path: the
//! RTO of a path that has no sample of its own is at least a quarter more
//! than it, while the fabric is not losing packets
//! (`DeviceState::unsampled_rto_ns`).
//!
//! A fresh path's estimator starts at the fabric's base RTT, so its RTO is
//! the floor (100 µs by default). Where the fabric queues longer than that
//! on some routes, as in a 1,024-host all-to-all of 4 KB messages, whose
//! one-packet flows cannot react to ECN and whose routes are a hash draw
//! (~95-107 µs to the most loaded ToR), every new path's first packet into
//! such a route timed out a few µs before its ACK came back, and was resent
//! for nothing. The device's other paths measured those queues already; a
//! path that has measured nothing borrows their worst.

/// A windowed maximum of RTT samples: the largest of the current window
/// and the one before, each `WINDOW_NS` long, so a sample counts for one to
/// two windows.
#[derive(Debug, Clone, Default)]
pub(crate) struct RttCeiling {
    window_start_ns: u64,
    current_max_ns: u64,
    previous_max_ns: u64,
}

/// How long a sample counts (at least): ten times the default RTO floor,
/// long enough to span a collective's phase and short enough that one
/// host stall does not inflate fresh paths' RTOs for long.
const WINDOW_NS: u64 = 1_000_000;

impl RttCeiling {
    /// Record one RTT sample taken at `now_ns`.
    pub(crate) fn record(&mut self, now_ns: u64, rtt_ns: u64) {
        self.roll(now_ns);
        self.current_max_ns = self.current_max_ns.max(rtt_ns);
    }

    /// The RTO a path without samples should wait at least: the ceiling
    /// and a quarter of it (RFC 6298's margin of four deviations, with the
    /// deviation taken as a sixteenth of the worst case). Windows roll only
    /// as samples come: a device that measures nothing keeps its last
    /// ceiling, which only makes its fresh paths more patient.
    pub(crate) fn unsampled_rto_ns(&self) -> u64 {
        let max = self.current_max_ns.max(self.previous_max_ns);
        max + max / 4
    }

    fn roll(&mut self, now_ns: u64) {
        let age = now_ns.saturating_sub(self.window_start_ns);
        if age >= WINDOW_NS {
            self.previous_max_ns = if age >= 2 * WINDOW_NS {
                0
            } else {
                self.current_max_ns
            };
            self.current_max_ns = 0;
            self.window_start_ns = now_ns;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_counts_for_one_to_two_windows() {
        let mut c = RttCeiling::default();
        assert_eq!(c.unsampled_rto_ns(), 0);
        c.record(10, 80_000);
        c.record(20, 40_000);
        assert_eq!(c.unsampled_rto_ns(), 100_000);
        // Still counted in the next window...
        c.record(WINDOW_NS + 10, 8_000);
        assert_eq!(c.unsampled_rto_ns(), 100_000);
        // ...and forgotten in the one after.
        c.record(2 * WINDOW_NS + 20, 8_000);
        assert_eq!(c.unsampled_rto_ns(), 10_000);
        // After a silence of two windows, the first sample starts afresh.
        c.record(5 * WINDOW_NS, 4_000);
        assert_eq!(c.unsampled_rto_ns(), 5_000);
    }
}
