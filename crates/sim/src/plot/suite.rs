//! One experiment of a suite ([`crate::suite`]) as a figure: its shown
//! figure per transport, one line per transport when the rows sweep one
//! key over numbers (x the swept value), else bars (one per transport,
//! grouped by row when there are several rows). Under the title, each
//! judged target with MetaRoCE's value and whether it was met, so the
//! figure carries the verdicts the table beside it does.

use super::PlotError;
use super::axis::{Axis, LOG_X_RATIO, LOG_Y_DECADES, min_max, spans};
use super::figure::{Bar, Figure, LegendEntry, Line, Note, Panel, Sample};
use super::palette;
use super::unquoted;
use crate::scenario::TRANSPORTS;
use crate::suite::{ExperimentResult, RowResult, format_figure};
use plotters::style::RGBColor;
use std::path::{Path, PathBuf};

/// The panel (width, height), pixels: with the legend and the notes the
/// figure comes to about 900 x 500.
const PANEL_PX: (u32, u32) = (740, 400);

/// Room above the tallest bar for the value written over it: a linear
/// axis reaches this multiple of the largest value, a log axis this
/// factor above it.
const LINEAR_HEADROOM: f64 = 1.12;
const LOG_HEADROOM: f64 = 1.8;

/// Width of a lone bar, and of a row's group of bars, in category units
/// (1 is the distance between categories).
const BAR_WIDTH: f64 = 0.6;
const GROUP_WIDTH: f64 = 0.8;
/// Share of its slot in a group a bar fills (a hairline between bars).
const BAR_FILL: f64 = 0.9;

/// A note longer than this many characters wraps; the figure is wide
/// enough for it at the notes' size.
const NOTE_CHARS: usize = 112;
/// Failed runs listed under the title; more are counted, not listed.
const MAX_ERROR_NOTES: usize = 4;

/// Note colours: a met target, a missed one or a failed run.
const MET: RGBColor = RGBColor(0x1a, 0x7f, 0x37);
const NOT_MET: RGBColor = RGBColor(0xc0, 0x1c, 0x28);

/// The file name of experiment `id`'s figure (`ID.svg`), or why `id`
/// cannot be one: ids come from a suite file or its JSON, and a figure
/// must land inside the directory asked for, not beside or above it.
pub fn plot_file_name(id: &str) -> Result<String, String> {
    let unfit = id.is_empty()
        || id.starts_with('.')
        || id.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if unfit {
        Err(format!(
            "id '{id}' cannot name a file (it must be non-empty, not start with '.', and hold no '/', '\\\\' or control characters)"
        ))
    } else {
        Ok(format!("{id}.svg"))
    }
}

/// Draw every experiment of `results` into `dir` (which must exist) as
/// `ID.svg`; the paths written, in order. Every id is checked before the
/// first file is written, so a bad one leaves no half-drawn directory;
/// an error names the experiment or the file.
pub fn write_experiment_svgs(
    dir: &Path,
    results: &[ExperimentResult],
) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = Vec::with_capacity(results.len());
    for e in results {
        let name = plot_file_name(&e.id).map_err(|why| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("experiment {why}"),
            )
        })?;
        paths.push(dir.join(name));
    }
    // Errors name the file, as the caller knows only the directory.
    for (e, path) in results.iter().zip(&paths) {
        let svg = experiment_svg(e)
            .map_err(|err| std::io::Error::other(format!("{}: {err}", path.display())))?;
        std::fs::write(path, svg)
            .map_err(|err| std::io::Error::new(err.kind(), format!("{}: {err}", path.display())))?;
    }
    Ok(paths)
}

/// The figure of one experiment's result.
pub fn experiment_svg(e: &ExperimentResult) -> Result<String, PlotError> {
    let transports = transports_of(&e.rows);
    let (panel, sample) = match numeric_sweep(&e.rows) {
        Some((key, xs)) => (sweep_panel(e, &transports, &key, &xs), Sample::LineWithDot),
        None => (bar_panel(e, &transports), Sample::Block),
    };
    let legend = transports
        .iter()
        .map(|t| LegendEntry {
            label: t.clone(),
            style: palette::transport(t),
            sample,
        })
        .collect();
    Figure {
        title: e.title.clone(),
        subtitle: subtitle(e),
        notes: notes(e),
        panels: vec![panel],
        columns: 1,
        panel_px: PANEL_PX,
        legend_title: "transport".into(),
        legend,
    }
    .render()
}

/// `N of M targets met · rerun: COMMAND`.
fn subtitle(e: &ExperimentResult) -> String {
    let verdicts = e.rows.iter().flat_map(|r| &r.targets);
    let (met, total) = verdicts.fold((0, 0), |(met, total), (_, _, ok)| {
        (met + usize::from(*ok), total + 1)
    });
    let judged = if total == 0 {
        "no targets".to_string()
    } else {
        format!("{met} of {total} targets met (MetaRoCE's value below)")
    };
    format!("{judged} · rerun: {}", e.command)
}

/// The transports of `rows` in the order of every other figure
/// ([`TRANSPORTS`]), any other name after them alphabetically.
fn transports_of(rows: &[RowResult]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in rows.iter().flat_map(|r| r.shown.keys()) {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names.sort_by_key(|n| {
        (
            TRANSPORTS
                .iter()
                .position(|t| t == n)
                .unwrap_or(TRANSPORTS.len()),
            n.clone(),
        )
    });
    names
}

/// A row's `key=value`, or `None` for the lone row of an experiment
/// without a sweep (written empty, or as the tables' `—`).
fn split_variant(variant: &str) -> Option<(&str, &str)> {
    let v = variant.trim();
    if v.is_empty() || v == "—" {
        return None;
    }
    v.split_once('=')
}

/// The last part of a dotted key (`switch.loss` -> `loss`): enough to
/// tell rows apart in a note, whose axis names the whole key.
fn short_key(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

/// A row as a note names it: `loss=0.01`, `routing=adaptive`, or the
/// variant as written when it is not `key=value`.
fn row_tag(variant: &str) -> String {
    match split_variant(variant) {
        Some((k, v)) => format!("{}={}", short_key(k), unquoted(v)),
        None => variant.trim().to_string(),
    }
}

/// The swept key and each row's value, when the rows (two or more) all
/// sweep the same key over finite numbers; else `None` (bars).
fn numeric_sweep(rows: &[RowResult]) -> Option<(String, Vec<f64>)> {
    if rows.len() < 2 {
        return None;
    }
    let mut key: Option<&str> = None;
    let mut xs = Vec::with_capacity(rows.len());
    for r in rows {
        let (k, v) = split_variant(&r.variant)?;
        if *key.get_or_insert(k) != k {
            return None;
        }
        let x: f64 = v.trim().parse().ok()?;
        if !x.is_finite() {
            return None;
        }
        xs.push(x);
    }
    Some((key?.to_string(), xs))
}

/// The value of `transport` in `row`; NaN (drawn as a gap) when its run
/// failed or gave no value.
fn value(row: &RowResult, transport: &str) -> f64 {
    row.shown
        .get(transport)
        .copied()
        .flatten()
        .unwrap_or(f64::NAN)
}

/// The y axis of `values`: log when they are all positive and span
/// [`LOG_Y_DECADES`], else linear from 0 (or from the lowest value when
/// one is negative); with `headroom`, room above the largest for a label.
fn value_axis(label: &str, values: &[f64], headroom: bool) -> Axis {
    if !values.iter().any(|v| v.is_finite()) {
        return Axis::from_zero(label, 1.0);
    }
    let (min, max) = min_max(values);
    if spans(values, 10f64.powf(LOG_Y_DECADES)) {
        // Whole decades: a bar's foot at the decade below the smallest
        // value keeps the smallest bar visible (its height is its share
        // of a decade), and the largest point clear of the frame.
        let top = if headroom { max * LOG_HEADROOM } else { max };
        let decade = |v: f64, round: fn(f64) -> f64| 10f64.powf(round(v.log10()));
        return Axis::log(label, decade(min, f64::floor), decade(top, f64::ceil));
    }
    let room = if headroom { LINEAR_HEADROOM } else { 1.0 };
    if min < 0.0 {
        let top = max.max(0.0);
        Axis::linear(label, min, top + (top - min) * (room - 1.0))
    } else {
        Axis::from_zero(label, max * room)
    }
}

/// A line per transport over the swept values, each point marked.
fn sweep_panel(e: &ExperimentResult, transports: &[String], key: &str, xs: &[f64]) -> Panel {
    let log_x = spans(xs, LOG_X_RATIO);
    // Rows in the suite's order need not be in x order; a line must be.
    let mut order: Vec<usize> = (0..e.rows.len()).collect();
    order.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
    let lines: Vec<Line> = transports
        .iter()
        .map(|t| {
            let points: Vec<(f64, f64)> = order
                .iter()
                .map(|&i| (xs[i], value(&e.rows[i], t)))
                .collect();
            let markers = points.iter().copied().filter(|p| p.1.is_finite()).collect();
            Line {
                style: palette::transport(t),
                points,
                markers,
            }
        })
        .collect();
    let values: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .collect();
    Panel {
        caption: String::new(),
        x: Axis::at_values(key, xs, log_x),
        y: value_axis(&e.shown, &values, false),
        bars: Vec::new(),
        lines,
        empty_note: "no run gave a value".into(),
    }
}

/// Bars: one per transport for a lone row; for several rows, a group per
/// row (named by its swept value) with a bar per transport.
fn bar_panel(e: &ExperimentResult, transports: &[String]) -> Panel {
    let mut bars = Vec::new();
    let x = if e.rows.len() == 1 {
        for (i, t) in transports.iter().enumerate() {
            bars.push(bar(&e.rows[0], t, i as f64, BAR_WIDTH));
        }
        Axis::categories("transport", transports.to_vec())
    } else {
        let slot = GROUP_WIDTH / transports.len().max(1) as f64;
        for (g, row) in e.rows.iter().enumerate() {
            for (k, t) in transports.iter().enumerate() {
                let centre = g as f64 - GROUP_WIDTH / 2.0 + (k as f64 + 0.5) * slot;
                bars.push(bar(row, t, centre, slot * BAR_FILL));
            }
        }
        let keys: Vec<Option<&str>> = e
            .rows
            .iter()
            .map(|r| split_variant(&r.variant).map(|(k, _)| k))
            .collect();
        let label = match keys.first() {
            Some(Some(k)) if keys.iter().all(|other| *other == Some(*k)) => (*k).to_string(),
            _ => "row".to_string(),
        };
        let names = e
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| match split_variant(&r.variant) {
                Some((_, v)) => unquoted(v).to_string(),
                None if r.variant.trim().is_empty() => format!("row {}", i + 1),
                None => r.variant.trim().to_string(),
            })
            .collect();
        Axis::categories(label, names)
    };
    let values: Vec<f64> = bars.iter().map(|b| b.value).collect();
    Panel {
        caption: String::new(),
        x,
        y: value_axis(&e.shown, &values, true),
        bars,
        lines: Vec::new(),
        empty_note: "no run gave a value".into(),
    }
}

fn bar(row: &RowResult, transport: &str, x: f64, width: f64) -> Bar {
    let v = value(row, transport);
    Bar {
        style: palette::transport(transport),
        x,
        width,
        value: v,
        label: format_figure(v.is_finite().then_some(v)),
    }
}

/// Under the title: each target once, with its value and verdict per
/// row it was judged on (`label: 0.923 at loss=0.01 (met)`), then the
/// runs that failed.
fn notes(e: &ExperimentResult) -> Vec<Note> {
    let tagged = e.rows.len() > 1;
    // Targets in first-judged order, each with its rows' verdicts.
    let mut targets: Vec<(&str, Vec<String>, bool)> = Vec::new();
    for row in &e.rows {
        for (label, v, met) in &row.targets {
            let at = if tagged {
                format!(" at {}", row_tag(&row.variant))
            } else {
                String::new()
            };
            let verdict = format!(
                "{}{at} ({})",
                format_figure(*v),
                if *met { "met" } else { "not met" }
            );
            match targets.iter_mut().find(|(l, _, _)| l == label) {
                Some((_, verdicts, all_met)) => {
                    verdicts.push(verdict);
                    *all_met &= *met;
                }
                None => targets.push((label, vec![verdict], *met)),
            }
        }
    }
    let mut notes = Vec::new();
    for (label, verdicts, all_met) in targets {
        let text = format!("{}: {}", readable(label), verdicts.join(", "));
        push_wrapped(&mut notes, &text, if all_met { MET } else { NOT_MET });
    }
    let failures: Vec<String> = e
        .rows
        .iter()
        .flat_map(|row| {
            let at = if tagged {
                format!(" at {}", row_tag(&row.variant))
            } else {
                String::new()
            };
            row.errors
                .iter()
                .map(move |err| format!("run failed{at}: {err}"))
        })
        .collect();
    for failure in failures.iter().take(MAX_ERROR_NOTES) {
        notes.push(Note {
            text: clipped(failure, NOTE_CHARS),
            color: NOT_MET,
        });
    }
    if failures.len() > MAX_ERROR_NOTES {
        notes.push(Note {
            text: format!(
                "and {} more failed runs (see the table)",
                failures.len() - MAX_ERROR_NOTES
            ),
            color: NOT_MET,
        });
    }
    notes
}

/// A target's label with its comparisons as the signs a reader expects
/// (`>=` -> `≥`).
fn readable(label: &str) -> String {
    label.replace(">=", "≥").replace("<=", "≤")
}

/// `text` as notes of at most [`NOTE_CHARS`] characters, broken at
/// spaces, the continuation lines indented.
fn push_wrapped(notes: &mut Vec<Note>, text: &str, color: RGBColor) {
    let mut line = String::new();
    for word in text.split(' ') {
        let len = line.chars().count();
        if len > 0 && len + 1 + word.chars().count() > NOTE_CHARS {
            notes.push(Note {
                text: std::mem::take(&mut line),
                color,
            });
            line.push_str("    ");
        } else if len > 0 {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.trim().is_empty() {
        notes.push(Note { text: line, color });
    }
}

/// `text` cut to `max` characters, an ellipsis marking the cut.
fn clipped(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let kept: String = text.chars().take(max.saturating_sub(1)).collect();
        format!("{kept}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::assert_texts;
    use std::collections::BTreeMap;

    fn shown(values: [Option<f64>; 4]) -> BTreeMap<String, Option<f64>> {
        ["metaroce", "rocev2", "irn", "ib"]
            .iter()
            .zip(values)
            .map(|(t, v)| (t.to_string(), v))
            .collect()
    }

    fn row(variant: &str, values: [Option<f64>; 4]) -> RowResult {
        RowResult {
            variant: variant.into(),
            shown: shown(values),
            targets: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// A loss sweep over two decades whose values span four: log x, log y.
    fn loss_sweep() -> ExperimentResult {
        let mut rows = vec![
            row(
                "switch.loss=0.001",
                [Some(8731.0), Some(1111.6), Some(1618.9), Some(922.4)],
            ),
            row(
                "switch.loss=0.01",
                [Some(8132.9), Some(180.9), Some(851.7), Some(616.1)],
            ),
            row(
                "switch.loss=0.1",
                [Some(3445.2), Some(1.12), Some(106.8), None],
            ),
        ];
        rows[1].targets.push((
            "goodput >= 85 % of loss-free at 1 %/link".into(),
            Some(0.92276),
            true,
        ));
        rows[2].errors.push("ib: flows unfinished".into());
        ExperimentResult {
            id: "loss-link-perm".into(),
            title: "Random loss per link".into(),
            shown: "goodput_gbps".into(),
            rows,
            command: "metaroce sim suite scenarios/claims --only loss-link-perm".into(),
        }
    }

    fn single_row() -> ExperimentResult {
        let mut r = row("", [Some(0.803), Some(0.104), Some(0.056), Some(0.559)]);
        r.targets
            .push((">= 90 % of line rate".into(), Some(0.803), false));
        r.targets
            .push((">= 1.5 x RoCEv2's goodput".into(), Some(7.69), true));
        ExperimentResult {
            id: "collisions-perm".into(),
            title: "ECMP collisions".into(),
            shown: "line_rate_fraction".into(),
            rows: vec![r],
            command: "metaroce sim suite scenarios/claims --only collisions-perm".into(),
        }
    }

    #[test]
    fn a_sweep_and_a_single_row_are_drawn_with_legend_and_targets() {
        let dir = std::env::temp_dir().join(format!("metaroce-suite-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let results = [loss_sweep(), single_row()];
        let paths = write_experiment_svgs(&dir, &results).unwrap();
        assert_eq!(
            paths,
            [
                dir.join("loss-link-perm.svg"),
                dir.join("collisions-perm.svg")
            ]
        );
        let sweep = std::fs::read_to_string(&paths[0]).unwrap();
        assert_texts(
            &sweep,
            &[
                "Random loss per link",
                "metaroce",
                "rocev2",
                "irn",
                "ib",
                "transport",
                "goodput_gbps",
                "switch.loss",
                "goodput ≥ 85 % of loss-free at 1 %/link: 0.923 at loss=0.01 (met)",
                "run failed at loss=0.1: ib: flows unfinished",
                // (plotters writes an apostrophe as an entity)
                "1 of 1 targets met (MetaRoCE&apos;s value below) · rerun: metaroce sim suite scenarios/claims --only loss-link-perm",
                // Log x at the swept values, log y in decades.
                "0.001",
                "0.01",
                "0.1",
                "1",
                "1000",
            ],
        );
        let bars = std::fs::read_to_string(&paths[1]).unwrap();
        assert_texts(
            &bars,
            &[
                "ECMP collisions",
                "metaroce",
                "rocev2",
                "irn",
                "ib",
                "line_rate_fraction",
                "≥ 90 % of line rate: 0.803 (not met)",
                "≥ 1.5 x RoCEv2&apos;s goodput: 7.690 (met)",
                "0.803",
                "0.104",
            ],
        );
        for svg in [&sweep, &bars] {
            assert!(svg.len() < 60_000, "{} bytes", svg.len());
            assert!(!svg.contains("@font-face"), "embeds a font");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn rows_are_a_line_sweep_only_over_numbers_of_one_key() {
        let e = loss_sweep();
        let (key, xs) = numeric_sweep(&e.rows).unwrap();
        assert_eq!((key.as_str(), xs), ("switch.loss", vec![0.001, 0.01, 0.1]));
        let routing = [
            row("switch.routing=\"ecmp\"", [Some(1.0); 4]),
            row("switch.routing=\"adaptive\"", [Some(2.0); 4]),
        ];
        assert!(numeric_sweep(&routing).is_none());
        assert!(numeric_sweep(&single_row().rows).is_none());
        let mixed = [row("a=1", [None; 4]), row("b=2", [None; 4])];
        assert!(numeric_sweep(&mixed).is_none());
        // Text values: grouped bars named by the value, unquoted.
        let e = ExperimentResult {
            rows: routing.to_vec(),
            ..single_row()
        };
        let svg = experiment_svg(&e).unwrap();
        assert_texts(&svg, &["ecmp", "adaptive", "switch.routing"]);
    }

    /// The bottom edge (y + height) of every rectangle of `svg` wider
    /// than `min_width` pixels.
    fn rect_bottoms(svg: &str, min_width: f64) -> Vec<f64> {
        let attr = |tag: &str, name: &str| -> f64 {
            let start = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            let len = tag[start..].find('"').unwrap();
            tag[start..start + len].parse().unwrap()
        };
        svg.split("<rect")
            .skip(1)
            .map(|t| &t[..t.find("/>").unwrap()])
            .filter(|t| attr(t, "width") > min_width)
            .filter(|t| t.contains("fill=\"#") && !t.contains("#FFFFFF"))
            .map(|t| attr(t, "y") + attr(t, "height"))
            .collect()
    }

    #[test]
    fn bars_on_a_log_axis_stand_on_its_bottom() {
        // 0.001 to 0.2: a log axis from 0.001 to 1, every bar rising from
        // its foot (not hanging from log10 = 0 at the top).
        let e = ExperimentResult {
            rows: vec![row(
                "",
                [Some(0.153), Some(0.021), Some(0.102), Some(0.0014)],
            )],
            ..single_row()
        };
        let svg = experiment_svg(&e).unwrap();
        let bottoms = rect_bottoms(&svg, 40.0);
        assert_eq!(bottoms.len(), 4, "{bottoms:?}");
        assert!(bottoms.iter().all(|b| *b == bottoms[0]), "{bottoms:?}");
        assert_texts(&svg, &["0.001", "0.01", "0.1", "1"]);
    }

    #[test]
    fn transports_keep_the_figures_order() {
        assert_eq!(
            transports_of(&single_row().rows),
            ["metaroce", "rocev2", "irn", "ib"]
        );
    }

    #[test]
    fn ids_that_would_leave_the_directory_are_refused() {
        assert_eq!(plot_file_name("fail-plane-4").unwrap(), "fail-plane-4.svg");
        for bad in ["", "../x", "a/b", ".hidden", "a\\b"] {
            assert!(plot_file_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn long_notes_wrap_at_spaces() {
        let mut notes = Vec::new();
        let text = "word ".repeat(60);
        push_wrapped(&mut notes, text.trim(), MET);
        assert!(notes.len() >= 2);
        assert!(notes.iter().all(|n| n.text.chars().count() <= NOTE_CHARS));
        assert!(notes[1].text.starts_with("    word"));
    }
}
