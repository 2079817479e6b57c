//! One axis of a panel: its plotted range, round tick values, log
//! decades, category names, and how a tick is written.
//!
//! A log axis is drawn as a linear axis over `log10` of the data, so every
//! panel has one coordinate type; [`Axis::position`] maps a data value to
//! where it is drawn (or `None` if it cannot be, such as 0 on a log axis).

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use std::ops::Range;

/// A swept x axis goes log when its values span at least this ratio
/// (sweeps' and suite experiments' figures alike).
pub(super) const LOG_X_RATIO: f64 = 10.0;

/// A value axis goes log when its values span this many decades: the
/// loss sweeps run from about 1 to 8,000 Gb/s, where a linear axis
/// would flatten every baseline onto zero.
pub(super) const LOG_Y_DECADES: f64 = 2.0;

/// Most ticks a linear axis aims for; the step is the round number
/// (1, 2 or 5 x 10^k) that gives at most this many.
const TARGET_TICKS: f64 = 6.0;

/// Ticks at given values are kept only if no two are closer than this
/// share of the axis (closer, their labels would overlap).
const MIN_TICK_GAP: f64 = 1.0 / 14.0;

/// Margin on both sides of an axis whose ticks sit at the data's own
/// values (sweep grid points, categories), as a share of its span, so
/// the first and last markers are not cut by the frame.
const VALUE_AXIS_PAD: f64 = 0.06;

/// Ticks from this value up to below [`PLAIN_BELOW`] are written plainly
/// (`0.005`, `20`, `500000`); an axis with any tick outside writes every
/// tick as a power of ten.
const PLAIN_FROM: f64 = 1e-3;
const PLAIN_BELOW: f64 = 1e6;

/// Mantissa sets for log ticks, coarsest first: decades, then 1-2-5, then
/// every integer mantissa.
const LOG_MANTISSAS: [&[f64]; 3] = [
    &[1.0],
    &[1.0, 2.0, 5.0],
    &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
];

/// How data values map onto an axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scale {
    /// Value as is.
    Linear,
    /// `log10` of the value; values <= 0 are not drawn.
    Log10,
}

/// An axis ready to draw: range, ticks and label, in plot coordinates
/// (`log10` of the value on a log axis).
#[derive(Debug, Clone)]
pub(crate) struct Axis {
    /// Axis title, with its unit (`FCT (µs)`).
    pub(crate) label: String,
    scale: Scale,
    range: Range<f64>,
    /// Labelled ticks (grid lines too).
    major: Vec<f64>,
    /// Unlabelled light grid lines (a log axis's 2..9 x 10^k).
    minor: Vec<f64>,
    /// Category names at positions 0, 1, ... (a categorical axis).
    categories: Vec<String>,
}

impl Axis {
    /// A linear axis over `min..=max`, widened to round ticks.
    pub(crate) fn linear(label: impl Into<String>, min: f64, max: f64) -> Self {
        let (min, max) = finite_span(min, max);
        let step = round_step((max - min) / TARGET_TICKS);
        let lo = (min / step + 1e-9).floor() * step;
        let hi = (max / step - 1e-9).ceil() * step;
        let n = ((hi - lo) / step).round() as usize;
        let major = (0..=n).map(|i| snap(lo + i as f64 * step, step)).collect();
        Self {
            label: label.into(),
            scale: Scale::Linear,
            range: lo..hi,
            major,
            minor: Vec::new(),
            categories: Vec::new(),
        }
    }

    /// A linear axis from 0 to at least `max` (rates, queue depths, times).
    pub(crate) fn from_zero(label: impl Into<String>, max: f64) -> Self {
        let max = if max.is_finite() && max > 0.0 {
            max
        } else {
            1.0
        };
        Self::linear(label, 0.0, max)
    }

    /// A log axis over `min..=max` (both > 0): ticks at whole decades
    /// when two fall inside the data, else at 1-2-5 x 10^k, else at every
    /// mantissa, with light grid lines at the other mantissas; the axis
    /// ends at the whole mantissas around the data.
    pub(crate) fn log(label: impl Into<String>, min: f64, max: f64) -> Self {
        let (mut min, mut max) = (min, max);
        if !(min.is_finite() && min > 0.0) {
            min = if max.is_finite() && max > 0.0 {
                max / 10.0
            } else {
                1.0
            };
        }
        if !(max.is_finite() && max > min) {
            max = min;
        }
        // Ticks: the coarsest set with two values inside the data. The
        // axis ends at the nearest whole mantissas around the data, so
        // a decade the data does not reach is not drawn.
        let last = LOG_MANTISSAS.len() - 1;
        let pick = (0..last)
            .find(|&i| mantissa_values(min, max, LOG_MANTISSAS[i]).len() >= 2)
            .unwrap_or(last);
        let (mut lo, mut hi) = (
            floor_to(min, LOG_MANTISSAS[last]),
            ceil_to(max, LOG_MANTISSAS[last]),
        );
        if hi <= lo * (1.0 + 1e-9) {
            // One value on a whole mantissa: the mantissas either side.
            (lo, hi) = (
                floor_to(lo * 0.99, LOG_MANTISSAS[last]),
                ceil_to(hi * 1.01, LOG_MANTISSAS[last]),
            );
        }
        let major = mantissa_values(lo, hi, LOG_MANTISSAS[pick]);
        let minor: Vec<f64> = if pick < last && (hi / lo).log10() <= 8.0 {
            mantissa_values(lo, hi, LOG_MANTISSAS[last])
                .into_iter()
                .filter(|v| !major.contains(v))
                .collect()
        } else {
            Vec::new()
        };
        Self {
            label: label.into(),
            scale: Scale::Log10,
            range: lo.log10()..hi.log10(),
            major: major.iter().map(|v| v.log10()).collect(),
            minor: minor.iter().map(|v| v.log10()).collect(),
            categories: Vec::new(),
        }
    }

    /// A log axis when `values` are all positive and span at least
    /// `decades` decades, else a linear one from zero.
    pub(crate) fn log_if_spans(label: impl Into<String>, values: &[f64], decades: f64) -> Self {
        let (min, max) = min_max(values);
        if spans(values, 10f64.powf(decades)) {
            Self::log(label, min, max)
        } else {
            Self::from_zero(label, max)
        }
    }

    /// An axis whose ticks are the given values themselves (a sweep's
    /// grid values), on a log scale if `log`; falls back to round ticks
    /// when the values would crowd each other's labels.
    pub(crate) fn at_values(label: impl Into<String>, values: &[f64], log: bool) -> Self {
        let (min, max) = min_max(values);
        let mut axis = if log {
            Self::log(label, min, max)
        } else {
            Self::linear(label, min, max)
        };
        let mut ticks: Vec<f64> = values.iter().filter_map(|&v| axis.position(v)).collect();
        ticks.sort_by(f64::total_cmp);
        ticks.dedup();
        let (lo, hi) = match (ticks.first(), ticks.last()) {
            (Some(&lo), Some(&hi)) if hi > lo => (lo, hi),
            _ => return axis,
        };
        let gap = ticks
            .windows(2)
            .map(|w| w[1] - w[0])
            .fold(f64::MAX, f64::min);
        if gap >= (hi - lo) * MIN_TICK_GAP {
            let pad = (hi - lo) * VALUE_AXIS_PAD;
            axis.range = lo - pad..hi + pad;
            axis.major = ticks;
            axis.minor.clear();
        }
        axis
    }

    /// A categorical axis: one tick per name, at positions 0, 1, ...
    pub(crate) fn categories(label: impl Into<String>, names: Vec<String>) -> Self {
        let n = names.len().max(1) as f64;
        Self {
            label: label.into(),
            scale: Scale::Linear,
            range: -0.5..n - 0.5,
            major: (0..names.len()).map(|i| i as f64).collect(),
            minor: Vec::new(),
            categories: names,
        }
    }

    /// Where data value `v` is drawn; `None` if it cannot be (not finite,
    /// or <= 0 on a log axis).
    pub(crate) fn position(&self, v: f64) -> Option<f64> {
        match self.scale {
            Scale::Linear if v.is_finite() => Some(v),
            Scale::Log10 if v.is_finite() && v > 0.0 => Some(v.log10()),
            _ => None,
        }
    }

    /// The scale.
    #[cfg(test)]
    pub(crate) fn scale(&self) -> Scale {
        self.scale
    }

    /// Labelled tick positions (plot coordinates).
    #[cfg(test)]
    pub(crate) fn major(&self) -> &[f64] {
        &self.major
    }

    /// The label of the tick at plot position `p`.
    pub(crate) fn tick_label(&self, p: f64) -> String {
        if !self.categories.is_empty() {
            let i = p.round();
            return if i >= 0.0 && (i as usize) < self.categories.len() {
                self.categories[i as usize].clone()
            } else {
                String::new()
            };
        }
        // One notation per axis: powers of ten for every tick if one
        // needs them (no `10000` beside `10⁵`).
        let value = |p: f64| match self.scale {
            Scale::Linear => p,
            Scale::Log10 => 10f64.powf(p),
        };
        let powers = self.major.iter().any(|&m| {
            let v = value(m).abs();
            v != 0.0 && !(PLAIN_FROM..PLAIN_BELOW).contains(&(v * (1.0 + 1e-9)))
        });
        let v = value(p);
        if v == 0.0 {
            return "0".into();
        }
        if powers {
            return format_power(v);
        }
        match self.scale {
            Scale::Linear => {
                let step = self
                    .major
                    .windows(2)
                    .map(|w| (w[1] - w[0]).abs())
                    .fold(f64::MAX, f64::min);
                format_linear(v, if step == f64::MAX { v.abs() } else { step })
            }
            Scale::Log10 => format_log(v),
        }
    }
}

/// Plotters draws an axis as this coordinate: the range, and exactly
/// these ticks (its own log key points are not round numbers).
impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let share = (v - self.range.start) / (self.range.end - self.range.start);
        let pixels = f64::from(limit.1 - limit.0);
        if !share.is_finite() {
            return limit.0;
        }
        limit.0 + (pixels * share + 1e-3).floor() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.minor.clone()
        } else {
            self.major.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

/// Smallest and largest finite value (`(0, 0)` when there are none).
/// Whether the finite `values` are all positive and the largest is at
/// least `ratio` times the smallest: where an axis goes log.
pub(super) fn spans(values: &[f64], ratio: f64) -> bool {
    let (min, max) = min_max(values);
    min > 0.0 && max / min >= ratio
}

/// The smallest and largest finite value; `(0, 0)` when there is none.
pub(super) fn min_max(values: &[f64]) -> (f64, f64) {
    let (mut min, mut max) = (f64::MAX, f64::MIN);
    for &v in values.iter().filter(|v| v.is_finite()) {
        min = min.min(v);
        max = max.max(v);
    }
    if min > max { (0.0, 0.0) } else { (min, max) }
}

/// A span with room: finite, and `max > min` (one value gets a unit, or
/// a tenth of itself, on either side).
fn finite_span(min: f64, max: f64) -> (f64, f64) {
    let min = if min.is_finite() { min } else { 0.0 };
    let max = if max.is_finite() { max.max(min) } else { min };
    if max > min {
        (min, max)
    } else {
        let d = if min == 0.0 { 1.0 } else { min.abs() / 10.0 };
        (min - d, max + d)
    }
}

/// The round step (1, 2 or 5 x 10^k) nearest above `raw`.
fn round_step(raw: f64) -> f64 {
    let raw = if raw.is_finite() && raw > 0.0 {
        raw
    } else {
        1.0
    };
    let decade = 10f64.powf(raw.log10().floor());
    let m = raw / decade;
    let m = if m <= 1.0 + 1e-9 {
        1.0
    } else if m <= 2.0 + 1e-9 {
        2.0
    } else if m <= 5.0 + 1e-9 {
        5.0
    } else {
        10.0
    };
    m * decade
}

/// `v` rounded to the precision of `step` (no `0.30000000000000004`).
fn snap(v: f64, step: f64) -> f64 {
    let digits = decimals(step) as i32;
    let scale = 10f64.powi(digits);
    let r = (v * scale).round() / scale;
    if r == 0.0 { 0.0 } else { r }
}

/// Decimal places that write multiples of `step` exactly.
fn decimals(step: f64) -> usize {
    if step >= 1.0 || step <= 0.0 || !step.is_finite() {
        0
    } else {
        (-step.log10().floor()) as usize
    }
}

/// A linear tick in plain notation: to the precision of its step,
/// trailing zeros dropped (`0.5`, `1`, `1500`).
fn format_linear(v: f64, step: f64) -> String {
    let s = format!("{:.*}", decimals(step), v);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A log tick (a round mantissa times a power of ten) in plain notation.
fn format_log(v: f64) -> String {
    let (m, exp) = mantissa_exp(v);
    let places = if exp < 0 { (-exp) as usize } else { 0 };
    format!("{:.places$}", m * 10f64.powi(exp))
}

/// `v` as `10ⁿ` (mantissa 1) or `m×10ⁿ`.
fn format_power(v: f64) -> String {
    let (m, exp) = mantissa_exp(v);
    let sup = superscript(exp);
    if (m - 1.0).abs() < 1e-9 {
        format!("10{sup}")
    } else if (m + 1.0).abs() < 1e-9 {
        format!("−10{sup}")
    } else {
        let m = format!("{m:.2}");
        let m = m.trim_end_matches('0').trim_end_matches('.');
        format!("{m}×10{sup}")
    }
}

/// `v` as `m x 10^exp` with `1 <= |m| < 10`, robust to `v` being a hair
/// off a power of ten (as `10^log10(x)` is).
fn mantissa_exp(v: f64) -> (f64, i32) {
    if v == 0.0 || !v.is_finite() {
        return (0.0, 0);
    }
    let exp = (v.abs().log10() + 1e-9).floor() as i32;
    let m = v / 10f64.powi(exp);
    ((m * 1e6).round() / 1e6, exp)
}

/// An integer in Unicode superscript digits.
fn superscript(n: i32) -> String {
    const DIGITS: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    let mut s = String::new();
    if n < 0 {
        s.push('⁻');
    }
    for c in n.unsigned_abs().to_string().chars() {
        s.push(DIGITS[c.to_digit(10).unwrap_or(0) as usize]);
    }
    s
}

/// The largest `m x 10^k` (m in `set`) at or below `v` (> 0).
fn floor_to(v: f64, set: &[f64]) -> f64 {
    let exp = v.log10().floor();
    let decade = 10f64.powf(exp);
    set.iter()
        .rev()
        .map(|m| m * decade)
        .find(|&c| c <= v * (1.0 + 1e-9))
        .unwrap_or_else(|| set[set.len() - 1] * decade / 10.0)
}

/// The smallest `m x 10^k` (m in `set`) at or above `v` (> 0).
fn ceil_to(v: f64, set: &[f64]) -> f64 {
    let exp = v.log10().floor();
    let decade = 10f64.powf(exp);
    set.iter()
        .map(|m| m * decade)
        .find(|&c| c >= v * (1.0 - 1e-9))
        .unwrap_or(decade * 10.0)
}

/// Every `m x 10^k` (m in `set`) in `lo..=hi`.
fn mantissa_values(lo: f64, hi: f64, set: &[f64]) -> Vec<f64> {
    let mut out = Vec::new();
    let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    for e in e0..=e1 {
        let decade = 10f64.powi(e);
        for m in set {
            let v = m * decade;
            if v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9) {
                out.push(v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(a: &Axis) -> Vec<String> {
        a.major().iter().map(|&p| a.tick_label(p)).collect()
    }

    #[test]
    fn linear_ticks_are_round() {
        // The example: a 0..1967 range gave 393, 787, 1180, ...
        let a = Axis::from_zero("t", 1967.0);
        assert_eq!(labels(&a), ["0", "500", "1000", "1500", "2000"]);
        let a = Axis::linear("f", 0.0, 1.0);
        assert_eq!(labels(&a), ["0", "0.2", "0.4", "0.6", "0.8", "1"]);
        let a = Axis::from_zero("q", 0.0);
        assert!(labels(&a).len() >= 2);
    }

    #[test]
    fn log_ticks_are_decades_or_one_two_five() {
        let a = Axis::log("fct", 3.2, 4100.0);
        assert_eq!(a.scale(), Scale::Log10);
        assert_eq!(labels(&a), ["10", "100", "1000"]);
        assert_eq!(a.range, 3f64.log10()..5000f64.log10());
        let a = Axis::log("fct", 2.0, 3e6);
        assert_eq!(labels(&a), ["10¹", "10²", "10³", "10⁴", "10⁵", "10⁶"]);
        let a = Axis::log("fct", 2.0, 3e5);
        assert_eq!(labels(&a), ["10", "100", "1000", "10000", "100000"]);
        let a = Axis::log("fct", 31.0, 180.0);
        assert_eq!(labels(&a), ["50", "100", "200"]);
        let a = Axis::log("fct", 0.004, 0.03);
        assert_eq!(labels(&a), ["0.005", "0.01", "0.02"]);
        let a = Axis::log("one", 42.0, 42.0);
        assert_eq!(labels(&a), ["40", "50"]);
        let a = Axis::log("one", 40.0, 40.0);
        assert_eq!(labels(&a), ["30", "40", "50"]);
    }

    #[test]
    fn value_ticks_stand_at_the_values_unless_they_crowd() {
        let a = Axis::at_values("paths", &[1.0, 4.0, 16.0], true);
        assert_eq!(labels(&a), ["1", "4", "16"]);
        let a = Axis::at_values("loss", &[0.0, 0.001, 0.01, 0.05], false);
        assert_eq!(labels(&a), ["0", "0.01", "0.02", "0.03", "0.04", "0.05"]);
    }

    #[test]
    fn an_axis_writes_every_tick_in_one_notation() {
        let a = Axis::from_zero("bytes", 1.6e6);
        assert_eq!(labels(&a), ["0", "5×10⁵", "10⁶", "1.5×10⁶", "2×10⁶"]);
    }

    #[test]
    fn powers_are_written_with_superscripts() {
        assert_eq!(format_power(1e6), "10⁶");
        assert_eq!(format_power(2e-5), "2×10⁻⁵");
    }
}
