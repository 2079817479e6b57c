//! The flow completion time CDF: one curve per workload group, on a log
//! µs axis. Groups of one run differ by orders of magnitude (a 64 kB
//! all-to-all beside a 1 MB all-reduce), and within a group the tail is
//! what a linear axis squeezes into its last pixels.

use super::PlotError;
use super::RunView;
use super::axis::Axis;
use super::figure::{ALONE_PANEL_PX, Figure, LegendEntry, Line, Panel, Sample};
use super::palette::{self, LineStyle};

/// Most steps drawn per curve; larger groups keep every flow of their
/// slowest [`TAIL_POINTS`] and an even sample of the rest.
const MAX_POINTS: usize = 2000;
const TAIL_POINTS: usize = 250;

/// The FCT CDF of one run: a curve per workload group.
pub fn fct_cdf_svg(run: &RunView<'_>) -> Result<String, PlotError> {
    let curves: Vec<(&str, LineStyle, &[f64])> = run
        .fcts
        .iter()
        .enumerate()
        .map(|(i, g)| (g.name.as_str(), palette::series(i), g.fcts_us.as_slice()))
        .collect();
    let legend = curves
        .iter()
        .map(|&(name, style, fcts)| LegendEntry {
            label: format!("{name} ({} flows)", fcts.len()),
            style,
            sample: Sample::Line,
        })
        .collect();
    Figure {
        title: "Flow completion time CDF".into(),
        subtitle: run.about(),
        notes: Vec::new(),
        panels: vec![panel(String::new(), &curves)],
        columns: 1,
        panel_px: ALONE_PANEL_PX,
        legend_title: "workload".into(),
        legend,
    }
    .render()
}

/// A CDF panel with one curve per `(name, style, ascending FCTs in µs)`.
pub(super) fn panel(caption: String, curves: &[(&str, LineStyle, &[f64])]) -> Panel {
    let all = curves.iter().flat_map(|(_, _, f)| f.iter().copied());
    let (min, max) = match all.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v))) {
        // No completed flow: an empty 1 µs to 1 ms axis under the note.
        (lo, hi) if lo > hi => (1.0, 1000.0),
        span => span,
    };
    Panel {
        caption,
        x: Axis::log("flow completion time (µs)", min, max),
        y: Axis::linear("fraction of flows", 0.0, 1.0),
        bars: Vec::new(),
        lines: curves
            .iter()
            .map(|&(_, style, fcts)| Line {
                style,
                points: cdf_points(fcts),
                markers: Vec::new(),
            })
            .collect(),
        empty_note: "no completed flows".into(),
    }
}

/// The empirical CDF of ascending `fcts` as a staircase: at each FCT
/// the fraction of flows at or below it steps up from the previous one.
/// Thinned to about [`MAX_POINTS`] steps with the tail kept whole.
fn cdf_points(fcts: &[f64]) -> Vec<(f64, f64)> {
    let n = fcts.len();
    let step = if n <= MAX_POINTS {
        1
    } else {
        n.div_ceil(MAX_POINTS - TAIL_POINTS)
    };
    let mut below = 0.0;
    let mut out = Vec::new();
    for (i, &v) in fcts.iter().enumerate() {
        if i % step == 0 || i + TAIL_POINTS >= n {
            let frac = (i + 1) as f64 / n as f64;
            out.push((v, below));
            out.push((v, frac));
            below = frac;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::assert_texts;
    use crate::report::{GroupFcts, TimeSeries};

    /// The FCT figure draws no time series.
    fn no_series() -> TimeSeries {
        TimeSeries {
            bin_us: 1.0,
            goodput_gbps: Vec::new(),
            queue_max_bytes: Vec::new(),
            links: Vec::new(),
        }
    }

    #[test]
    fn renders_titled_svg_with_a_curve_per_group() {
        let fcts = vec![
            GroupFcts {
                name: "permutation 16".into(),
                fcts_us: (1..=16).map(|i| 40.0 + f64::from(i)).collect(),
            },
            GroupFcts {
                name: "all-to-all 8".into(),
                fcts_us: vec![3.0, 5.0, 900.0],
            },
        ];
        let series = no_series();
        let run = RunView {
            scenario: "tiny mix",
            seed: 7,
            transport: "metaroce",
            fcts: &fcts,
            series: &series,
        };
        let svg = fct_cdf_svg(&run).unwrap();
        assert_texts(
            &svg,
            &[
                "Flow completion time CDF",
                "tiny mix · seed 7 · metaroce",
                "workload",
                "permutation 16 (16 flows)",
                "all-to-all 8 (3 flows)",
                "flow completion time (µs)",
                "fraction of flows",
                "10",
                "100",
            ],
        );
        // Each curve in its own colour.
        assert!(svg.contains("stroke=\"#1F77B4\""));
        assert!(svg.contains("stroke=\"#FF7F0E\""));
    }

    #[test]
    fn a_run_without_completed_flows_still_renders() {
        let fcts = vec![GroupFcts {
            name: "incast 4:1".into(),
            fcts_us: Vec::new(),
        }];
        let series = no_series();
        let run = RunView {
            scenario: "stuck",
            seed: 1,
            transport: "ib",
            fcts: &fcts,
            series: &series,
        };
        let svg = fct_cdf_svg(&run).unwrap();
        assert_texts(&svg, &["no completed flows", "incast 4:1 (0 flows)"]);
        let svg = crate::plot::throughput_svg(&run).unwrap();
        assert_texts(&svg, &["no samples"]);
        let svg = crate::plot::queues_svg(&run).unwrap();
        assert_texts(&svg, &["no samples"]);
    }

    #[test]
    fn big_groups_are_thinned_but_keep_their_tail() {
        let fcts: Vec<f64> = (0..100_000).map(f64::from).collect();
        let pts = cdf_points(&fcts);
        assert!(pts.len() <= 2 * (MAX_POINTS + TAIL_POINTS), "{}", pts.len());
        assert_eq!(pts.last(), Some(&(99_999.0, 1.0)));
        let tail = &pts[pts.len() - 2 * TAIL_POINTS..];
        assert_eq!(tail[0].0, (100_000 - TAIL_POINTS) as f64);
        // A staircase: x and y never go down.
        assert!(pts.windows(2).all(|w| w[1].0 >= w[0].0 && w[1].1 >= w[0].1));
    }
}
