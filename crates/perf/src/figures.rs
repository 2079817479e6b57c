//! What a run measured, with perftest's semantics: bandwidth (peak,
//! average, message rate) and latency statistics.

/// Bandwidth figures (bytes per second; convert for display).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwFigures {
    /// Message size.
    pub size: u64,
    /// Completed operations.
    pub iters: u64,
    /// Best rate held over any stretch of at least [`PEAK_WINDOW_NS`],
    /// bytes/s (0 when not measured: `-N`, `--run_infinitely`).
    pub peak_bps: f64,
    /// size × iters ÷ (last completion − first post), bytes/s.
    pub avg_bps: f64,
    /// Million messages per second.
    pub msg_rate_mpps: f64,
}

/// Latency figures in microseconds (perftest semantics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatFigures {
    /// Message size.
    pub size: u64,
    /// Samples.
    pub iters: u64,
    /// Minimum.
    pub t_min: f64,
    /// Maximum (after dropping the 2 largest).
    pub t_max: f64,
    /// Median.
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation.
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// Transactions per second (duration mode).
    pub tps: f64,
}

impl LatFigures {
    /// perftest's statistics of samples in ns (sorted, top 2 dropped,
    /// percentiles at ceil(n p)).
    pub fn from_samples(size: u64, mut ns: Vec<u64>, elapsed_ns: u64) -> Self {
        let total = ns.len() as u64;
        ns.sort_unstable();
        let keep = ns.len().saturating_sub(2).max(1.min(ns.len()));
        ns.truncate(keep);
        let us: Vec<f64> = ns.iter().map(|&v| v as f64 / 1e3).collect();
        let n = us.len().max(1) as f64;
        let avg = us.iter().sum::<f64>() / n;
        let var = us.iter().map(|v| (v - avg) * (v - avg)).sum::<f64>() / n;
        let pct = |p: f64| -> f64 {
            if us.is_empty() {
                return 0.0;
            }
            let idx = ((us.len() as f64 * p).ceil() as usize).clamp(1, us.len()) - 1;
            us[idx]
        };
        Self {
            size,
            iters: total,
            t_min: us.first().copied().unwrap_or(0.0),
            t_max: us.last().copied().unwrap_or(0.0),
            t_typical: if us.is_empty() { 0.0 } else { us[us.len() / 2] },
            t_avg: avg,
            t_stdev: var.sqrt(),
            p99: pct(0.99),
            p99_9: pct(0.999),
            tps: if elapsed_ns > 0 {
                total as f64 * 1e9 / elapsed_ns as f64
            } else {
                0.0
            },
        }
    }
}

/// What a test measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Figures {
    /// A bandwidth test.
    Bw(BwFigures),
    /// A latency test.
    Lat(LatFigures),
}

/// The best rate over any stretch of at least [`PEAK_WINDOW_NS`] between
/// completion marks (`marks[i] = (ns, operations completed by then)`),
/// for `size`-byte operations. perftest takes its peak over one
/// CQ-moderation interval; completions arrive in bursts (one ACK completes
/// many WRs), so over a single interval that reads far above the link; a
/// millisecond window keeps the figure a rate the transfer really held.
pub(crate) fn peak_bps(marks: &[(u64, u64)], size: u64) -> f64 {
    let mut best = 0.0f64;
    let mut j = 0;
    for i in 0..marks.len() {
        j = j.max(i + 1);
        while j < marks.len() && marks[j].0 - marks[i].0 < PEAK_WINDOW_NS {
            j += 1;
        }
        if j == marks.len() {
            break;
        }
        let bytes = (marks[j].1 - marks[i].1) * size;
        best = best.max(bytes as f64 / ((marks[j].0 - marks[i].0) as f64 / 1e9));
    }
    best
}

/// Shortest stretch the peak bandwidth is measured over.
pub const PEAK_WINDOW_NS: u64 = 1_000_000;

/// Completions between two peak marks (at least; a moderated completion
/// may cover more).
pub(crate) const PEAK_MARK_OPS: u64 = 100;

#[cfg(test)]
mod tests {
    use super::*;

    /// 1 MB per ms for 3 ms, then 4 MB in one ms: the peak is the fast
    /// millisecond, whatever the spacing of the marks.
    #[test]
    fn peak_is_the_best_millisecond() {
        let ms = 1_000_000;
        let marks = [
            (0, 0),
            (ms, 1000),
            (2 * ms, 2000),
            (3 * ms, 3000),
            (4 * ms, 7000),
        ];
        let peak = peak_bps(&marks, 1000);
        assert!((peak - 4e9).abs() < 1.0, "{peak}");
        assert_eq!(peak_bps(&marks[..1], 1000), 0.0);
    }
}
