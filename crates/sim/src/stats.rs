//! Small fixed-size statistics: a log-linear histogram and time series.

/// Sub-buckets per power of two (precision about 3 %).
const SUB: u32 = 32;

/// A histogram of u64 values in log-linear buckets: exact below 32, then
/// 32 buckets per power of two. Fixed size, no allocation per sample.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

fn bucket(v: u64) -> usize {
    if v < u64::from(SUB) {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // >= 5
    let shift = exp - SUB.trailing_zeros();
    let sub = (v >> shift) as u32 - SUB; // 0..SUB
    ((exp - SUB.trailing_zeros() + 1) * SUB + sub) as usize
}

fn bucket_high(b: usize) -> u64 {
    let b = b as u32;
    if b < SUB {
        return u64::from(b);
    }
    let group = b / SUB - 1;
    let sub = b % SUB;
    let high = (u128::from(SUB + sub) + 1) << group;
    u64::try_from(high - 1).unwrap_or(u64::MAX)
}

impl Histogram {
    /// Empty.
    pub fn new() -> Self {
        Self {
            counts: vec![0; (64 * SUB) as usize],
            total: 0,
            max: 0,
            sum: 0,
        }
    }

    /// Count one value.
    pub fn record(&mut self, v: u64) {
        self.counts[bucket(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Largest value.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Mean value.
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value at quantile `q` (0..=1): the upper edge of its bucket,
    /// never above the maximum.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_high(b).min(self.max);
            }
        }
        self.max
    }
}

/// A series of per-bin values, grown on demand.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Values by bin.
    pub bins: Vec<u64>,
}

impl Series {
    fn at(&mut self, bin: u64) -> &mut u64 {
        let b = bin as usize;
        if self.bins.len() <= b {
            self.bins.resize(b + 1, 0);
        }
        &mut self.bins[b]
    }

    /// Add `v` to bin `bin`.
    pub fn add_at(&mut self, bin: u64, v: u64) {
        *self.at(bin) += v;
    }

    /// Add `v` spread evenly over `[start, end)` (in bins of `bin`).
    pub fn add_span(&mut self, start: u64, end: u64, bin: u64, v: u64) {
        let bin = bin.max(1);
        let (b0, b1) = (start / bin, end.saturating_sub(1).max(start) / bin);
        if b0 == b1 || end <= start {
            self.add_at(b0, v);
            return;
        }
        let total = end - start;
        let mut given = 0;
        for b in b0..=b1 {
            let lo = start.max(b * bin);
            let hi = end.min((b + 1) * bin);
            let part = if b == b1 {
                v - given
            } else {
                v * (hi - lo) / total
            };
            given += part;
            self.add_at(b, part);
        }
    }

    /// Raise bin `bin` to at least `v`.
    pub fn max_at(&mut self, bin: u64, v: u64) {
        let x = self.at(bin);
        *x = (*x).max(v);
    }
}

/// Exact quantile of a sorted slice (nearest rank).
pub fn sorted_quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_within_precision() {
        let mut h = Histogram::new();
        for v in 0..10_000u64 {
            h.record(v);
        }
        for q in [0.5, 0.9, 0.99] {
            let exact = q * 10_000.0;
            let got = h.quantile(q) as f64;
            assert!((got - exact).abs() / exact < 0.04, "q{q}: {got} vs {exact}");
        }
        assert_eq!(h.quantile(1.0), 9_999);
        assert_eq!(h.quantile(0.0001), 0);
        for v in [0, 1, 31, 32, 33, 1000, 1 << 40, u64::MAX] {
            assert!(bucket_high(bucket(v)) >= v, "{v}");
        }
    }
}
