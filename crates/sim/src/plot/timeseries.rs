//! Goodput and queue depth over time, from a run's time series: the
//! goodput every host received per bin, and the largest queue per link
//! tier per bin (the tiers `timeseries.json` keys them by).
//!
//! Long runs have more bins than a panel has pixels: consecutive bins
//! are merged, goodput by its mean and queues by their maximum (a peak
//! must not vanish by thinning).

use super::axis::Axis;
use super::figure::{ALONE_PANEL_PX, Figure, LegendEntry, Line, Panel, Sample};
use super::palette;
use super::{PlotError, RunView};
use crate::report::TimeSeries;

/// Most points drawn per series.
const MAX_POINTS: usize = 1500;

/// Runs longer than this many µs are drawn in ms.
const MS_ABOVE_US: f64 = 20_000.0;

/// Queues deeper than this many bytes are drawn in MB, else in kB.
const MB_ABOVE_BYTES: f64 = 10e6;

/// A time axis unit.
#[derive(Debug, Clone, Copy)]
pub(super) struct TimeUnit {
    name: &'static str,
    us_per_unit: f64,
}

impl TimeUnit {
    /// µs, or ms for runs longer than [`MS_ABOVE_US`].
    pub(super) fn for_span_us(span_us: f64) -> Self {
        if span_us > MS_ABOVE_US {
            Self {
                name: "ms",
                us_per_unit: 1e3,
            }
        } else {
            Self {
                name: "µs",
                us_per_unit: 1.0,
            }
        }
    }

    /// The time axis for a run of `span_us`.
    pub(super) fn axis(self, span_us: f64) -> Axis {
        Axis::from_zero(format!("time ({})", self.name), span_us / self.us_per_unit)
    }
}

/// A byte-count axis unit.
#[derive(Debug, Clone, Copy)]
pub(super) struct ByteUnit {
    name: &'static str,
    bytes_per_unit: f64,
}

impl ByteUnit {
    /// kB, or MB for queues deeper than [`MB_ABOVE_BYTES`].
    pub(super) fn for_max_bytes(max: f64) -> Self {
        if max > MB_ABOVE_BYTES {
            Self {
                name: "MB",
                bytes_per_unit: 1e6,
            }
        } else {
            Self {
                name: "kB",
                bytes_per_unit: 1e3,
            }
        }
    }
}

/// How long a series runs, µs.
pub(super) fn span_us(ts: &TimeSeries) -> f64 {
    let bins = ts
        .queue_max_bytes
        .iter()
        .map(|(_, v)| v.len())
        .chain([ts.goodput_gbps.len()])
        .max()
        .unwrap_or(0);
    bins as f64 * ts.bin_us
}

/// Deepest queue of any tier, bytes.
pub(super) fn max_queue_bytes(ts: &TimeSeries) -> f64 {
    ts.queue_max_bytes
        .iter()
        .flat_map(|(_, v)| v.iter())
        .fold(0u64, |a, &b| a.max(b)) as f64
}

/// Goodput per (merged) bin, `(time in unit, Gb/s)` at each bin's middle.
pub(super) fn goodput_points(ts: &TimeSeries, unit: TimeUnit) -> Vec<(f64, f64)> {
    merged(&ts.goodput_gbps, ts.bin_us, unit, |chunk| {
        chunk.iter().sum::<f64>() / chunk.len() as f64
    })
}

/// One tier's largest queue per (merged) bin, `(time in unit, bytes in
/// unit)`.
pub(super) fn queue_points(
    bins: &[u64],
    bin_us: f64,
    time: TimeUnit,
    bytes: ByteUnit,
) -> Vec<(f64, f64)> {
    let as_f64: Vec<f64> = bins.iter().map(|&b| b as f64).collect();
    merged(&as_f64, bin_us, time, |chunk| {
        chunk.iter().copied().fold(0.0, f64::max) / bytes.bytes_per_unit
    })
}

/// The y axis of queue depths in `unit`.
pub(super) fn queue_axis(max_bytes: f64, unit: ByteUnit) -> Axis {
    Axis::from_zero(
        format!("largest queue ({})", unit.name),
        max_bytes / unit.bytes_per_unit,
    )
}

/// The y axis of goodput up to `max_gbps`.
pub(super) fn goodput_axis(max_gbps: f64) -> Axis {
    Axis::from_zero("goodput (Gb/s)", max_gbps)
}

/// `values` (one per bin of `bin_us`) merged `k` bins at a time so at
/// most [`MAX_POINTS`] remain, each merged bin by `merge`, placed at its
/// middle.
fn merged(
    values: &[f64],
    bin_us: f64,
    unit: TimeUnit,
    merge: impl Fn(&[f64]) -> f64,
) -> Vec<(f64, f64)> {
    let k = values.len().div_ceil(MAX_POINTS).max(1);
    values
        .chunks(k)
        .enumerate()
        .map(|(i, chunk)| {
            let mid_us = (i * k) as f64 * bin_us + chunk.len() as f64 * bin_us / 2.0;
            (mid_us / unit.us_per_unit, merge(chunk))
        })
        .collect()
}

/// `bin width` for subtitles: `1 µs bins`.
pub(super) fn bins_note(ts: &TimeSeries) -> String {
    let k = ts
        .goodput_gbps
        .len()
        .max(ts.queue_max_bytes.first().map_or(0, |(_, v)| v.len()))
        .div_ceil(MAX_POINTS)
        .max(1);
    format!("{} µs bins", trim_float(ts.bin_us * k as f64))
}

/// `x` without trailing zeros (`1`, `2.5`).
fn trim_float(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Goodput delivered to hosts over time.
pub fn throughput_svg(run: &RunView<'_>) -> Result<String, PlotError> {
    let ts = run.series;
    let span = span_us(ts);
    let unit = TimeUnit::for_span_us(span);
    let points = goodput_points(ts, unit);
    let max = points.iter().map(|p| p.1).fold(0.0, f64::max);
    let style = palette::transport(run.transport);
    Figure {
        title: "Goodput delivered to hosts".into(),
        subtitle: format!("{} · {}", run.about(), bins_note(ts)),
        notes: Vec::new(),
        panels: vec![Panel {
            caption: String::new(),
            x: unit.axis(span),
            y: goodput_axis(max),
            bars: Vec::new(),
            lines: vec![Line {
                style,
                points,
                markers: Vec::new(),
            }],
            empty_note: "no samples".into(),
        }],
        columns: 1,
        panel_px: ALONE_PANEL_PX,
        legend_title: "transport".into(),
        legend: vec![LegendEntry {
            label: run.transport.to_string(),
            style,
            sample: Sample::Line,
        }],
    }
    .render()
}

/// The largest queue per link tier over time.
pub fn queues_svg(run: &RunView<'_>) -> Result<String, PlotError> {
    let ts = run.series;
    let span = span_us(ts);
    let time = TimeUnit::for_span_us(span);
    let max = max_queue_bytes(ts);
    let bytes = ByteUnit::for_max_bytes(max);
    let (lines, legend): (Vec<Line>, Vec<LegendEntry>) = ts
        .queue_max_bytes
        .iter()
        .enumerate()
        .map(|(i, (tier, bins))| {
            let style = palette::series(i);
            let line = Line {
                style,
                points: queue_points(bins, ts.bin_us, time, bytes),
                markers: Vec::new(),
            };
            let entry = LegendEntry {
                label: tier.clone(),
                style,
                sample: Sample::Line,
            };
            (line, entry)
        })
        .unzip();
    Figure {
        title: "Largest queue per link tier".into(),
        subtitle: format!("{} · {}", run.about(), bins_note(ts)),
        notes: Vec::new(),
        panels: vec![Panel {
            caption: String::new(),
            x: time.axis(span),
            y: queue_axis(max, bytes),
            bars: Vec::new(),
            lines,
            empty_note: "no samples".into(),
        }],
        columns: 1,
        panel_px: ALONE_PANEL_PX,
        legend_title: "link tier".into(),
        legend,
    }
    .render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::assert_texts;

    fn series(bins: usize) -> TimeSeries {
        TimeSeries {
            bin_us: 1.0,
            goodput_gbps: (0..bins).map(|i| (i % 100) as f64).collect(),
            queue_max_bytes: vec![
                ("host_up".into(), (0..bins as u64).map(|i| i * 10).collect()),
                ("leaf_up".into(), vec![0; bins]),
            ],
            links: Vec::new(),
        }
    }

    fn view(ts: &TimeSeries) -> RunView<'_> {
        RunView {
            scenario: "tiny",
            seed: 3,
            transport: "rocev2",
            fcts: &[],
            series: ts,
        }
    }

    #[test]
    fn throughput_is_titled_with_unit_labels() {
        let ts = series(1967);
        let svg = throughput_svg(&view(&ts)).unwrap();
        assert_texts(
            &svg,
            &[
                "Goodput delivered to hosts",
                "tiny · seed 3 · rocev2 · 2 µs bins",
                "goodput (Gb/s)",
                "time (µs)",
                "transport",
                "rocev2",
                "500",
                "2000",
            ],
        );
    }

    #[test]
    fn queues_have_a_legend_entry_per_tier() {
        let ts = series(50_000);
        let svg = queues_svg(&view(&ts)).unwrap();
        assert_texts(
            &svg,
            &[
                "Largest queue per link tier",
                "tiny · seed 3 · rocev2 · 34 µs bins",
                "largest queue (kB)",
                "time (ms)",
                "link tier",
                "host_up",
                "leaf_up",
            ],
        );
    }

    #[test]
    fn merged_bins_keep_queue_peaks() {
        let mut bins = vec![0u64; 10_000];
        bins[4321] = 7_000;
        let unit = TimeUnit::for_span_us(10_000.0);
        let kb = ByteUnit::for_max_bytes(7_000.0);
        let pts = queue_points(&bins, 1.0, unit, kb);
        assert!(pts.len() <= MAX_POINTS);
        assert_eq!(pts.iter().map(|p| p.1).fold(0.0, f64::max), 7.0);
    }
}
