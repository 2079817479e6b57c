//! One scenario under several transports, in one figure: a panel per
//! workload group's FCT CDF, one for goodput over time and one per link
//! tier's largest queue, each with the transports overlaid in their fixed
//! colours, so a reader compares them within a panel on the same axes.

use super::fct_cdf;
use super::figure::{Figure, GRID_PANEL_PX, LegendEntry, Line, Panel, Sample};
use super::palette;
use super::timeseries::{self, ByteUnit, TimeUnit};
use super::{PlotError, RunView};

/// Panels per row.
const COLUMNS: usize = 3;

/// The comparison figure of `runs` (the same scenario and seed, one run
/// per transport).
pub fn comparison_svg<'a>(runs: &[RunView<'a>]) -> Result<String, PlotError> {
    let mut panels = Vec::new();
    // FCT: one panel per group, by the first run's group names.
    let groups: Vec<&str> = runs
        .first()
        .map(|r| r.fcts.iter().map(|g| g.name.as_str()).collect())
        .unwrap_or_default();
    for (gi, name) in groups.iter().enumerate() {
        let curves: Vec<(&str, palette::LineStyle, &[f64])> = runs
            .iter()
            .map(|r| {
                let fcts = r
                    .fcts
                    .get(gi)
                    .filter(|g| g.name == *name)
                    .map_or(&[][..], |g| g.fcts_us.as_slice());
                (r.transport, palette::transport(r.transport), fcts)
            })
            .collect();
        panels.push(fct_cdf::panel(format!("FCT CDF: {name}"), &curves));
    }
    // Time series on one time axis for every run.
    let span = runs
        .iter()
        .map(|r| timeseries::span_us(r.series))
        .fold(0.0, f64::max);
    let time = TimeUnit::for_span_us(span);
    let goodput: Vec<Line> = runs
        .iter()
        .map(|r| Line {
            style: palette::transport(r.transport),
            points: timeseries::goodput_points(r.series, time),
            markers: Vec::new(),
        })
        .collect();
    let max_gbps = goodput
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    panels.push(Panel {
        caption: "goodput delivered to hosts".into(),
        x: time.axis(span),
        y: timeseries::goodput_axis(max_gbps),
        bars: Vec::new(),
        lines: goodput,
        empty_note: "no samples".into(),
    });
    let tiers: Vec<&str> = runs
        .first()
        .map(|r| {
            r.series
                .queue_max_bytes
                .iter()
                .map(|(t, _)| t.as_str())
                .collect()
        })
        .unwrap_or_default();
    for tier in tiers {
        let bins = |r: &RunView<'a>| -> &'a [u64] {
            r.series
                .queue_max_bytes
                .iter()
                .find(|(t, _)| t == tier)
                .map_or(&[][..], |(_, v)| v.as_slice())
        };
        let max = runs
            .iter()
            .flat_map(|r| bins(r).iter())
            .fold(0u64, |a, &b| a.max(b)) as f64;
        let unit = ByteUnit::for_max_bytes(max);
        panels.push(Panel {
            caption: format!("largest queue: {tier}"),
            x: time.axis(span),
            y: timeseries::queue_axis(max, unit),
            bars: Vec::new(),
            lines: runs
                .iter()
                .map(|r| Line {
                    style: palette::transport(r.transport),
                    points: timeseries::queue_points(bins(r), r.series.bin_us, time, unit),
                    markers: Vec::new(),
                })
                .collect(),
            empty_note: "no samples".into(),
        });
    }
    let names: Vec<&str> = runs.iter().map(|r| r.transport).collect();
    let subtitle = match runs.first() {
        Some(r) => format!(
            "{} · seed {} · {} · {}",
            r.scenario,
            r.seed,
            names.join(", "),
            timeseries::bins_note(r.series)
        ),
        None => "no runs".into(),
    };
    Figure {
        title: "Transports compared".into(),
        subtitle,
        notes: Vec::new(),
        panels,
        columns: COLUMNS,
        panel_px: GRID_PANEL_PX,
        legend_title: "transport".into(),
        legend: runs
            .iter()
            .enumerate()
            .map(|(i, r)| LegendEntry {
                label: match runs[..i].iter().find(|e| same_run(e, r)) {
                    Some(e) => format!("{} (same as {})", r.transport, e.transport),
                    None => r.transport.to_string(),
                },
                style: palette::transport(r.transport),
                sample: Sample::Line,
            })
            .collect(),
    }
    .render()
}

/// Whether two runs drew the same figures (IRN is RoCEv2 when nothing is
/// lost): one's lines lie exactly under the other's, so the legend says so.
fn same_run(a: &RunView<'_>, b: &RunView<'_>) -> bool {
    a.fcts == b.fcts && a.series == b.series
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::assert_texts;
    use crate::report::{GroupFcts, TimeSeries};

    #[test]
    fn overlays_every_transport_in_every_panel() {
        let fcts = vec![GroupFcts {
            name: "incast 8:1".into(),
            fcts_us: vec![10.0, 20.0, 400.0],
        }];
        let ts = TimeSeries {
            bin_us: 1.0,
            goodput_gbps: vec![10.0, 90.0, 95.0, 40.0],
            queue_max_bytes: vec![("tor_down".into(), vec![0, 30_000, 120_000, 0])],
            links: Vec::new(),
        };
        let mut other = ts.clone();
        other.goodput_gbps[1] = 80.0;
        let runs: Vec<RunView<'_>> = ["metaroce", "rocev2", "ib"]
            .into_iter()
            .map(|t| RunView {
                scenario: "incast 8",
                seed: 1,
                transport: t,
                fcts: &fcts,
                series: if t == "rocev2" { &other } else { &ts },
            })
            .collect();
        let svg = comparison_svg(&runs).unwrap();
        assert_texts(
            &svg,
            &[
                "Transports compared",
                "incast 8 · seed 1 · metaroce, rocev2, ib · 1 µs bins",
                "FCT CDF: incast 8:1",
                "goodput delivered to hosts",
                "largest queue: tor_down",
                "transport",
                "metaroce",
                "rocev2",
                "ib (same as metaroce)",
            ],
        );
    }
}
