//! Round-trip time estimation from echoed timestamps (RFC 6298 smoothing).

/// Smoothed RTT, variation and minimum of one path.
///
/// Kept in 32-bit nanoseconds (16 bytes instead of 32; there is one per
/// path): an RTT sample is at most 2^31 ns, the span of the 32-bit echoed
/// timestamp it is measured with, and the endpoint's base RTT, the only
/// other starting value, is at most `u32::MAX` ns (`EndpointConfig::validate`).
/// Every value the estimator computes is a weighted mean of such inputs, so
/// within the protocol nothing is ever cut. Outside it, times of 4.29 s and
/// more (a pathological RTT) saturate at `u32::MAX` ns (samples one below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttEstimator {
    srtt_ns: u32,
    rttvar_ns: u32,
    /// `u32::MAX` until the first sample (so no flag is needed).
    rtt_ns_min: u32,
    latest_ns: u32,
}

/// `ns`, saturated to 32 bits.
fn saturate(ns: u64) -> u32 {
    u32::try_from(ns).unwrap_or(u32::MAX)
}

impl RttEstimator {
    /// Before any sample, assume the configured base RTT.
    pub fn new(initial_rtt_ns: u64) -> Self {
        let initial = saturate(initial_rtt_ns);
        Self {
            srtt_ns: initial,
            // A quarter, not RFC 6298's half: the initial value is the
            // fabric's base RTT (known, not a guess of a second), and a probe
            // timeout of twice it recovers a lost first packet in one round.
            rttvar_ns: initial / 4,
            rtt_ns_min: u32::MAX,
            latest_ns: initial,
        }
    }

    /// Fold in one sample.
    pub fn update(&mut self, rtt_ns: u64) {
        self.fold(rtt_ns, None);
    }

    /// Fold in one sample of a path whose connection measures others: the
    /// path's first sample is weighed against the connection's estimate
    /// instead of standing alone. A lone first sample makes the deviation
    /// half of it and the probe timeout three times it; a path that carries
    /// a packet every few hundred µs (one of 127 senders into a receiver,
    /// spraying 16 paths) may take only that one sample in its life, and
    /// one packet queued behind an all-to-all's burst held its path's probe
    /// at 126 µs where the connection's said 60.
    pub fn update_with(&mut self, rtt_ns: u64, connection: &Self) {
        self.fold(rtt_ns, Some(connection));
    }

    /// RFC 6298's smoothing of one sample into srtt and rttvar; the first
    /// sample starts from `seed`'s estimate if it has one, else stands alone.
    fn fold(&mut self, rtt_ns: u64, seed: Option<&Self>) {
        // One below `u32::MAX`, which stands for "no sample yet".
        let rtt_ns = saturate(rtt_ns).min(u32::MAX - 1);
        let first = self.rtt_ns_min == u32::MAX;
        self.latest_ns = rtt_ns;
        self.rtt_ns_min = self.rtt_ns_min.min(rtt_ns);
        if first {
            match seed.filter(|s| s.rtt_ns_min != u32::MAX) {
                Some(s) => (self.srtt_ns, self.rttvar_ns) = (s.srtt_ns, s.rttvar_ns),
                None => {
                    self.srtt_ns = rtt_ns;
                    self.rttvar_ns = rtt_ns / 2;
                    return;
                }
            }
        }
        // Computed in 64 bits; each result is a weighted mean of stored
        // values, so it is stored again without loss.
        let (srtt, rttvar, rtt) = (
            u64::from(self.srtt_ns),
            u64::from(self.rttvar_ns),
            u64::from(rtt_ns),
        );
        let err = srtt.abs_diff(rtt);
        self.rttvar_ns = saturate((3 * rttvar + err) / 4);
        self.srtt_ns = saturate((7 * srtt + rtt) / 8);
    }

    /// The RTT's mean deviation.
    pub fn rttvar_ns(&self) -> u64 {
        u64::from(self.rttvar_ns)
    }

    /// Smoothed RTT.
    pub fn srtt_ns(&self) -> u64 {
        u64::from(self.srtt_ns)
    }

    /// Smallest sample seen, `None` before the first.
    pub fn measured_min_ns(&self) -> Option<u64> {
        (self.rtt_ns_min != u32::MAX).then(|| u64::from(self.rtt_ns_min))
    }

    /// Smallest sample seen (`u64::MAX` before the first).
    pub fn rtt_ns_min(&self) -> u64 {
        match self.rtt_ns_min {
            u32::MAX => u64::MAX,
            ns => u64::from(ns),
        }
    }

    /// Latest sample.
    pub fn latest_ns(&self) -> u64 {
        u64::from(self.latest_ns)
    }

    /// The probe timeout before any ACK delay: srtt + 4 deviations, the
    /// deviation taken at least an eighth of srtt (a quiet path's deviation
    /// falls to nothing, and a probe must not fire at the first few hundred
    /// ns of queueing), and at most two srtt (RACK-TLP's PTO, RFC 8985)
    /// unless that leaves less than two deviations. The cap matters where
    /// queues come and go: an all-to-all's RTT samples swing between one
    /// and three base RTTs, the deviation grew to half the srtt, and a lost
    /// last packet waited three srtt for its probe, and as long again when
    /// the probe was lost too: those few messages were the makespan
    /// (128-host all-to-all at 1 %/link). The two deviations keep a margin
    /// where srtt falls far below the deviation (a route that changed
    /// under flapping links): with two srtt alone, one chaos seed's
    /// replacement paths were judged dead before their answers could come,
    /// one after another, for good.
    pub fn probe_timeout_ns(&self) -> u64 {
        let srtt = self.srtt_ns();
        let deviation = self.rttvar_ns().max(srtt / 8);
        (srtt + 4 * deviation).min((2 * srtt).max(srtt + 2 * deviation))
    }

    /// Retransmission timeout: srtt + 4 rttvar, within the bounds.
    pub fn rto_ns(&self, rto_min_ns: u64, rto_max_ns: u64) -> u64 {
        (self.srtt_ns() + 4 * u64::from(self.rttvar_ns)).clamp(rto_min_ns, rto_max_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_and_bounds_rto() {
        let mut r = RttEstimator::new(10_000);
        // The initial deviation is a quarter of the (known) base RTT.
        assert_eq!(r.rto_ns(1_000, 1_000_000), 20_000);
        for _ in 0..100 {
            r.update(4_000);
        }
        assert_eq!(r.srtt_ns(), 4_000);
        assert_eq!(r.rtt_ns_min(), 4_000);
        assert_eq!(r.rto_ns(50_000, 1_000_000), 50_000);
        r.update(40_000);
        assert!(r.srtt_ns() > 4_000 && r.srtt_ns() < 40_000);
    }

    /// The estimator as it was with 64-bit fields, before any saturation.
    struct Wide {
        srtt: u64,
        rttvar: u64,
        min: u64,
        latest: u64,
    }

    impl Wide {
        fn update(&mut self, rtt: u64) {
            let first = self.min == u64::MAX;
            self.latest = rtt;
            self.min = self.min.min(rtt);
            if first {
                (self.srtt, self.rttvar) = (rtt, rtt / 2);
                return;
            }
            self.rttvar = (3 * self.rttvar + self.srtt.abs_diff(rtt)) / 4;
            self.srtt = (7 * self.srtt + rtt) / 8;
        }
    }

    proptest::proptest! {
        /// Within the protocol's range (a base RTT up to `u32::MAX` ns,
        /// samples up to 2^31 ns) the 32-bit fields lose nothing.
        #[test]
        fn matches_64_bit_fields_in_protocol_range(
            initial in 1..=u64::from(u32::MAX),
            samples in proptest::collection::vec(
                proptest::prop_oneof![1u64..=1 << 31, 1u64..100_000], 0..50),
        ) {
            let mut r = RttEstimator::new(initial);
            let mut w = Wide { srtt: initial, rttvar: initial / 2, min: u64::MAX, latest: initial };
            for rtt in samples {
                r.update(rtt);
                w.update(rtt);
                proptest::prop_assert_eq!(
                    (r.srtt_ns(), r.rtt_ns_min(), r.latest_ns()),
                    (w.srtt, w.min, w.latest)
                );
                proptest::prop_assert_eq!(r.rto_ns(1, u64::MAX), w.srtt + 4 * w.rttvar);
            }
        }
    }

    #[test]
    fn a_paths_first_sample_is_weighed_against_the_connections() {
        let mut connection = RttEstimator::new(10_000);
        for rtt in [20_000, 22_000, 18_000, 20_000] {
            connection.update(rtt);
        }
        // Alone, a first sample of 42 µs has a deviation of 21 µs: srtt and
        // four deviations would be 126 µs, capped at two srtt, 84. Weighed
        // against the connection's 20 µs, the probe comes near its own.
        let mut alone = RttEstimator::new(10_000);
        alone.update(42_000);
        assert_eq!(alone.probe_timeout_ns(), 84_000);
        let mut path = RttEstimator::new(10_000);
        path.update_with(42_000, &connection);
        assert_eq!(path.rtt_ns_min(), 42_000);
        assert_eq!(path.latest_ns(), 42_000);
        assert!(path.srtt_ns() > connection.srtt_ns() && path.srtt_ns() < 25_000);
        assert!(
            path.probe_timeout_ns() < 50_000,
            "{}",
            path.probe_timeout_ns()
        );
        // Later samples are the path's own.
        let before = path;
        path.update_with(10_000, &connection);
        let mut own = before;
        own.update(10_000);
        assert_eq!(path, own);
        // A connection without a sample has nothing to weigh it against.
        let mut first = RttEstimator::new(10_000);
        first.update_with(42_000, &RttEstimator::new(10_000));
        assert_eq!(first, alone);
    }

    #[test]
    fn the_probe_timeout_is_srtt_and_four_deviations_within_its_bounds() {
        let mut r = RttEstimator::new(10_000);
        for _ in 0..100 {
            r.update(10_000);
        }
        // A quiet path: the deviation floor, an eighth of srtt.
        assert_eq!(r.probe_timeout_ns(), 15_000);
        // Queues that come and go: at most two srtt.
        for rtt in [20_000, 20_000] {
            r.update(rtt);
        }
        assert!(r.rttvar_ns() < r.srtt_ns() / 2);
        assert!(r.srtt_ns() + 4 * r.rttvar_ns() > 2 * r.srtt_ns());
        assert_eq!(r.probe_timeout_ns(), 2 * r.srtt_ns());
        // An srtt far under its deviation keeps two deviations of margin.
        let mut r = RttEstimator::new(10_000);
        for rtt in [40_000, 1_000, 1_000, 1_000, 1_000] {
            r.update(rtt);
        }
        assert!(r.rttvar_ns() > r.srtt_ns() / 2);
        assert_eq!(r.probe_timeout_ns(), r.srtt_ns() + 2 * r.rttvar_ns());
    }

    #[test]
    fn saturates_beyond_the_protocol_range() {
        assert_eq!(size_of::<RttEstimator>(), 16);
        let max = u64::from(u32::MAX);
        let mut r = RttEstimator::new(u64::MAX);
        assert_eq!((r.srtt_ns(), r.rtt_ns_min()), (max, u64::MAX));
        // A sample is never taken for "none yet".
        r.update(u64::MAX);
        assert_eq!((r.rtt_ns_min(), r.latest_ns()), (max - 1, max - 1));
    }
}
