//! A sweep: the x axis is the swept parameter (the plan's `x_axis`, else
//! the grid key with the most numeric values, else the first with
//! several values, as categories), and every combination of the other
//! keys' values is its own line. A line joins only points that differ in
//! x alone: the mean over seeds, with each seed's value as a dot.

use super::PlotError;
use super::axis::{Axis, LOG_X_RATIO, LOG_Y_DECADES, spans};
use super::figure::{Figure, GRID_PANEL_PX, LegendEntry, Line, Panel, Sample};
use super::palette;
use super::unquoted;
use crate::sweep::Row;

/// Panels per row (one per metric).
const COLUMNS: usize = 3;

/// One metric of a sweep's rows, drawn as one panel.
struct Metric {
    caption: &'static str,
    axis: &'static str,
    value: fn(&Row) -> f64,
}

/// The metrics drawn, one panel each.
const METRICS: [Metric; 3] = [
    Metric {
        caption: "makespan",
        axis: "makespan (µs)",
        value: |r| r.makespan_us,
    },
    Metric {
        caption: "median FCT",
        axis: "FCT p50 (µs)",
        value: |r| r.fct_p50_us,
    },
    Metric {
        caption: "99th percentile FCT",
        axis: "FCT p99 (µs)",
        value: |r| r.fct_p99_us,
    },
];

/// The swept parameter: its index among a row's params, and for each of
/// its values (in first-seen order) where it sits on the x axis.
struct XKey {
    index: Option<usize>,
    values: Vec<String>,
    numeric: bool,
}

impl XKey {
    /// The key named `wanted`, else the numeric key with the most
    /// distinct values (the first of equals), else the first key with
    /// several values.
    fn choose(rows: &[Row], wanted: Option<&str>) -> Self {
        let keys = rows.first().map_or(0, |r| r.params.len());
        let distinct = |k: usize| {
            let mut vals: Vec<String> = Vec::new();
            for r in rows {
                if let Some((_, v)) = r.params.get(k)
                    && !vals.contains(v)
                {
                    vals.push(v.clone());
                }
            }
            vals
        };
        let is_num = |vals: &[String]| vals.iter().all(|v| v.parse::<f64>().is_ok());
        let named =
            wanted.and_then(|w| rows.first()?.params.iter().position(|(name, _)| name == w));
        let most_numeric = (0..keys)
            .map(|k| (k, distinct(k)))
            .filter(|(_, v)| v.len() >= 2 && is_num(v))
            .fold(None, |best: Option<(usize, usize)>, (k, v)| match best {
                Some((_, n)) if n >= v.len() => best,
                _ => Some((k, v.len())),
            })
            .map(|(k, _)| k);
        let index = named
            .or(most_numeric)
            .or_else(|| (0..keys).find(|&k| distinct(k).len() >= 2));
        let values = index.map(distinct).unwrap_or_default();
        Self {
            index,
            numeric: !values.is_empty() && is_num(&values),
            values,
        }
    }

    /// Where row `r` sits on the x axis.
    fn position(&self, r: &Row) -> f64 {
        let Some(k) = self.index else { return 0.0 };
        let v = r.params.get(k).map_or("", |(_, v)| v.as_str());
        if self.numeric {
            v.parse().unwrap_or(f64::NAN)
        } else {
            self.values.iter().position(|x| x == v).unwrap_or(0) as f64
        }
    }

    fn axis(&self, rows: &[Row]) -> Axis {
        let label = self
            .index
            .and_then(|k| rows.first()?.params.get(k))
            .map_or("grid point".to_string(), |(name, _)| name.clone());
        if self.numeric {
            let xs: Vec<f64> = self.values.iter().filter_map(|v| v.parse().ok()).collect();
            Axis::at_values(label, &xs, spans(&xs, LOG_X_RATIO))
        } else if self.values.is_empty() {
            Axis::categories(label, vec!["base scenario".into()])
        } else {
            let names = self
                .values
                .iter()
                .map(|v| unquoted(v).to_string())
                .collect();
            Axis::categories(label, names)
        }
    }
}

/// The sweep figure of `rows` (a whole sweep or one shard), with grid key
/// `x_axis` on the x axis (`None`: the numeric key with the most values);
/// `about` says what was swept (scenario, seeds, transport).
pub fn sweep_svg(rows: &[Row], x_axis: Option<&str>, about: &str) -> Result<String, PlotError> {
    let ok: Vec<&Row> = rows.iter().filter(|r| r.error.is_none()).collect();
    let x = XKey::choose(rows, x_axis);
    // Lines: every combination of the other keys' values, first seen first.
    let others = |r: &Row| -> Vec<String> {
        r.params
            .iter()
            .enumerate()
            .filter(|(k, _)| Some(*k) != x.index)
            .map(|(_, (_, v))| unquoted(v).to_string())
            .collect()
    };
    let mut lines: Vec<Vec<String>> = Vec::new();
    for r in &ok {
        let key = others(r);
        if !lines.contains(&key) {
            lines.push(key);
        }
    }
    let legend_title = rows.first().map_or(String::new(), |r| {
        r.params
            .iter()
            .enumerate()
            .filter(|(k, _)| Some(*k) != x.index)
            .map(|(_, (name, _))| name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    });
    // Lines that are transports wear their transport's colour.
    let style = |li: usize| match (legend_title.as_str(), lines[li].as_slice()) {
        ("transport.kind", [kind]) => palette::transport(kind),
        _ => palette::series(li),
    };
    let mut panels = Vec::new();
    for Metric {
        caption,
        axis: ylabel,
        value: metric,
    } in METRICS
    {
        let values: Vec<f64> = ok.iter().map(|r| metric(r)).collect();
        let mut drawn = Vec::new();
        for (li, key) in lines.iter().enumerate() {
            let mine: Vec<&&Row> = ok.iter().filter(|r| &others(r) == key).collect();
            let mut xs: Vec<f64> = mine.iter().map(|r| x.position(r)).collect();
            xs.sort_by(f64::total_cmp);
            xs.dedup();
            let points = xs
                .iter()
                .map(|&px| {
                    let at: Vec<f64> = mine
                        .iter()
                        .filter(|r| x.position(r) == px)
                        .map(|r| metric(r))
                        .collect();
                    (px, at.iter().sum::<f64>() / at.len() as f64)
                })
                .collect();
            drawn.push(Line {
                style: style(li),
                points,
                markers: mine.iter().map(|r| (x.position(r), metric(r))).collect(),
            });
        }
        panels.push(Panel {
            caption: caption.into(),
            x: x.axis(rows),
            y: Axis::log_if_spans(ylabel, &values, LOG_Y_DECADES),
            bars: Vec::new(),
            lines: drawn,
            empty_note: "no finished points".into(),
        });
    }
    let legend = lines
        .iter()
        .enumerate()
        .map(|(li, key)| LegendEntry {
            label: if key.is_empty() {
                "mean over seeds".into()
            } else {
                key.join(", ")
            },
            style: style(li),
            sample: Sample::LineWithDot,
        })
        .collect();
    let swept = x
        .index
        .and_then(|k| rows.first()?.params.get(k))
        .map_or("the base scenario".to_string(), |(name, _)| name.clone());
    Figure {
        title: format!("Sweep over {swept}"),
        subtitle: format!("{about} · line: mean over seeds, dots: each seed"),
        notes: Vec::new(),
        panels,
        columns: COLUMNS,
        panel_px: GRID_PANEL_PX,
        legend_title,
        legend,
    }
    .render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::assert_texts;

    fn row(point: usize, paths: u32, loss: &str, seed: u64, makespan_us: f64) -> Row {
        Row {
            point,
            params: vec![
                ("transport.paths".into(), paths.to_string()),
                ("switch.loss".into(), loss.into()),
            ],
            seed,
            finished: true,
            makespan_us,
            fct_p50_us: makespan_us / 4.0,
            fct_p99_us: makespan_us / 2.0,
            goodput_gbps: 1.0,
            busbw_gbs: 0.0,
            drops: 0,
            retransmissions: 0,
            error: None,
        }
    }

    #[test]
    fn one_line_per_other_value_with_x_the_swept_key() {
        let mut rows = Vec::new();
        for (p, paths) in [1, 4, 16].into_iter().enumerate() {
            for (l, loss) in ["0.0", "0.01"].into_iter().enumerate() {
                for seed in [1, 2] {
                    let t = 100.0 * f64::from(paths) + 10.0 * l as f64 + seed as f64;
                    rows.push(row(p * 2 + l, paths, loss, seed, t));
                }
            }
        }
        let svg = sweep_svg(&rows, None, "small mix · seeds 1, 2 · metaroce").unwrap();
        assert_texts(
            &svg,
            &[
                "Sweep over transport.paths",
                "small mix · seeds 1, 2 · metaroce · line: mean over seeds, dots: each seed",
                "switch.loss",
                "0.0",
                "0.01",
                "transport.paths",
                "1",
                "4",
                "16",
                "makespan (µs)",
                "FCT p99 (µs)",
            ],
        );
        // Paths has three values, loss two: paths is the x axis...
        let x = XKey::choose(&rows, None);
        assert_eq!(x.index, Some(0));
        assert!(x.numeric);
        // ... unless the plan names loss.
        let x = XKey::choose(&rows, Some("switch.loss"));
        assert_eq!((x.index, x.values.len()), (Some(1), 2));
        let svg = sweep_svg(&rows, Some("switch.loss"), "s").unwrap();
        assert_texts(&svg, &["Sweep over switch.loss", "transport.paths"]);
    }

    #[test]
    fn text_values_are_categories() {
        let mut rows = vec![row(0, 4, "0.0", 1, 10.0), row(1, 4, "0.0", 1, 20.0)];
        rows[0].params = vec![("transport.kind".into(), "\"metaroce\"".into())];
        rows[1].params = vec![("transport.kind".into(), "\"rocev2\"".into())];
        let svg = sweep_svg(&rows, None, "x").unwrap();
        assert_texts(
            &svg,
            &[
                "Sweep over transport.kind",
                "metaroce",
                "rocev2",
                "mean over seeds",
            ],
        );
    }
}
