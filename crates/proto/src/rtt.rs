//! Round-trip time estimation from echoed timestamps (RFC 6298 smoothing).

/// Smoothed RTT, variation and minimum of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttEstimator {
    srtt_ns: u64,
    rttvar_ns: u64,
    rtt_ns_min: u64,
    latest_ns: u64,
}

impl RttEstimator {
    /// Before any sample, assume the configured base RTT.
    pub fn new(initial_rtt_ns: u64) -> Self {
        Self {
            srtt_ns: initial_rtt_ns,
            rttvar_ns: initial_rtt_ns / 2,
            rtt_ns_min: u64::MAX,
            latest_ns: initial_rtt_ns,
        }
    }

    /// Fold in one sample.
    pub fn update(&mut self, rtt_ns: u64) {
        // `rtt_ns_min` stays `u64::MAX` until the first sample (so no flag
        // is needed: this estimator is kept per path).
        let rtt_ns = rtt_ns.min(u64::MAX - 1);
        let first = self.rtt_ns_min == u64::MAX;
        self.latest_ns = rtt_ns;
        self.rtt_ns_min = self.rtt_ns_min.min(rtt_ns);
        if first {
            self.srtt_ns = rtt_ns;
            self.rttvar_ns = rtt_ns / 2;
            return;
        }
        let err = self.srtt_ns.abs_diff(rtt_ns);
        self.rttvar_ns = (3 * self.rttvar_ns + err) / 4;
        self.srtt_ns = (7 * self.srtt_ns + rtt_ns) / 8;
    }

    /// Smoothed RTT.
    pub fn srtt_ns(&self) -> u64 {
        self.srtt_ns
    }

    /// Smallest sample seen (`u64::MAX` before the first).
    pub fn rtt_ns_min(&self) -> u64 {
        self.rtt_ns_min
    }

    /// Latest sample.
    pub fn latest_ns(&self) -> u64 {
        self.latest_ns
    }

    /// Retransmission timeout: srtt + 4 rttvar, within the bounds.
    pub fn rto_ns(&self, rto_min_ns: u64, rto_max_ns: u64) -> u64 {
        (self.srtt_ns + 4 * self.rttvar_ns).clamp(rto_min_ns, rto_max_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_and_bounds_rto() {
        let mut r = RttEstimator::new(10_000);
        assert_eq!(r.rto_ns(1_000, 1_000_000), 30_000);
        for _ in 0..100 {
            r.update(4_000);
        }
        assert_eq!(r.srtt_ns(), 4_000);
        assert_eq!(r.rtt_ns_min(), 4_000);
        assert_eq!(r.rto_ns(50_000, 1_000_000), 50_000);
        r.update(40_000);
        assert!(r.srtt_ns() > 4_000 && r.srtt_ns() < 40_000);
    }
}
