//! A small fixed histogram of RTT samples, for percentiles (p99) that a
//! smoothed estimator cannot give.
//!
//! Log-linear buckets: four per octave (each about 19 % wide), from 512 ns
//! up to 2^32 ns, one bucket below and one above. 94 `u32` counters are
//! 376 bytes, allocated on the first sample, so an idle connection pays for
//! the pointer only. A bucket that would overflow halves every bucket: the
//! shape, which is all a percentile reads, is kept.

/// Sub-buckets per octave, as a power of two.
const SUB_BITS: u32 = 2;
/// Smallest octave with its own buckets: 2^9 ns = 512 ns.
const FIRST_OCTAVE: u32 = 9;
/// Buckets: octaves 9..=31 with four each, one below, one above.
const BUCKETS: usize = 2 + ((32 - FIRST_OCTAVE as usize) << SUB_BITS);

/// Histogram of RTT samples (nanoseconds) with percentile queries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RttHistogram {
    buckets: Option<Box<[u32; BUCKETS]>>,
}

/// Bucket of a sample.
fn bucket_of(rtt_ns: u64) -> usize {
    if rtt_ns < 1 << FIRST_OCTAVE {
        return 0;
    }
    let octave = 63 - rtt_ns.leading_zeros();
    let sub = (rtt_ns >> (octave - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    let i = 1 + ((octave - FIRST_OCTAVE) << SUB_BITS) as usize + sub as usize;
    i.min(BUCKETS - 1)
}

/// Upper edge (exclusive) of bucket `i`, ns: what a percentile reports, so
/// that "p99 = X" reads "99 % of samples were below X".
fn upper_edge_ns(i: usize) -> u64 {
    if i == 0 {
        return 1 << FIRST_OCTAVE;
    }
    if i == BUCKETS - 1 {
        return u64::MAX;
    }
    let k = (i - 1) as u32;
    let octave = FIRST_OCTAVE + (k >> SUB_BITS);
    let sub = u64::from(k & ((1 << SUB_BITS) - 1));
    // Bucket (octave, sub) holds [2^o (1 + sub/4), 2^o (1 + (sub+1)/4)).
    (1u64 << octave) + ((sub + 1) << (octave - SUB_BITS))
}

impl RttHistogram {
    /// Count one sample.
    pub(crate) fn record(&mut self, rtt_ns: u64) {
        let b = self.buckets.get_or_insert_with(|| Box::new([0; BUCKETS]));
        let i = bucket_of(rtt_ns);
        if b[i] == u32::MAX {
            for c in b.iter_mut() {
                *c /= 2;
            }
        }
        b[i] += 1;
    }

    /// Samples counted (after any halving).
    pub(crate) fn samples(&self) -> u64 {
        self.buckets
            .as_ref()
            .map_or(0, |b| b.iter().map(|&c| u64::from(c)).sum())
    }

    /// The `per_mille`/1000 quantile's bucket's upper edge, ns (0 with no
    /// sample). `per_mille` 990 is p99.
    pub(crate) fn quantile_ns(&self, per_mille: u64) -> u64 {
        let Some(b) = self.buckets.as_ref() else {
            return 0;
        };
        let total = self.samples();
        // Smallest rank r with r >= total * q (at least 1).
        let rank = (total * per_mille).div_ceil(1000).max(1);
        let mut seen = 0;
        for (i, &c) in b.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return upper_edge_ns(i);
            }
        }
        upper_edge_ns(BUCKETS - 1)
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.buckets.as_ref().map_or(0, |_| BUCKETS * 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_edges_contain_their_samples() {
        let mut last = 0;
        for ns in (0..40)
            .map(|s| 1u64 << s)
            .flat_map(|x| [x, x + x / 3, x + x / 2])
        {
            let i = bucket_of(ns);
            assert!(i >= last, "{ns}");
            last = i;
            if i < BUCKETS - 1 {
                assert!(ns < upper_edge_ns(i), "{ns} in bucket {i}");
                if i > 0 {
                    assert!(ns >= upper_edge_ns(i - 1), "{ns} in bucket {i}");
                }
            }
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of((1 << 32) - 1), BUCKETS - 2);
    }

    #[test]
    fn p99_of_a_tail() {
        let mut h = RttHistogram::default();
        assert_eq!(h.quantile_ns(990), 0);
        for _ in 0..980 {
            h.record(10_000);
        }
        for _ in 0..20 {
            h.record(1_000_000);
        }
        let p50 = h.quantile_ns(500);
        assert!((10_000..12_500).contains(&p50), "{p50}");
        let p99 = h.quantile_ns(990);
        assert!((1_000_000..1_250_000).contains(&p99), "{p99}");
        assert_eq!(h.samples(), 1000);
    }

    #[test]
    fn saturation_halves_and_keeps_the_shape() {
        let mut h = RttHistogram::default();
        h.record(5_000);
        h.buckets.as_mut().unwrap()[bucket_of(5_000)] = u32::MAX;
        h.record(5_000);
        assert_eq!(h.samples(), u64::from(u32::MAX / 2 + 1));
        assert!(h.quantile_ns(990) > 5_000);
    }
}
