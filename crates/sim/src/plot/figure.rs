//! A figure: a title block naming what was run (and, below it, any notes
//! such as judged targets), a grid of panels, and one legend for all of
//! them to the right, outside every plotting area (a legend inside one
//! would sit over its data).

use super::PlotError;
use super::axis::Axis;
use super::palette::LineStyle;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A figure's only panel (width, height), pixels.
pub(crate) const ALONE_PANEL_PX: (u32, u32) = (600, 360);
/// One panel of a grid of them.
pub(crate) const GRID_PANEL_PX: (u32, u32) = (440, 310);
/// Height of the title and subtitle above the panels.
const HEADER_HEIGHT_PX: u32 = 60;
/// One note line under the subtitle, and the gap below the last one.
const NOTE_ROW_PX: u32 = 18;
const NOTES_GAP_PX: u32 = 8;
/// Space right of the legend.
const RIGHT_MARGIN_PX: u32 = 12;
/// One legend row.
const LEGEND_ROW_PX: i32 = 22;
/// Length of a legend entry's line sample.
const LEGEND_SWATCH_PX: i32 = 28;
/// Text sizes, pixels as rendered.
const TITLE_PX: f64 = 17.0;
const SUBTITLE_PX: f64 = 13.0;
const CAPTION_PX: f64 = 14.0;
const AXIS_TITLE_PX: f64 = 13.0;
const TICK_PX: f64 = 12.0;
const LEGEND_PX: f64 = 13.0;
const NOTE_PX: f64 = 13.0;
const BAR_VALUE_PX: f64 = 11.0;
/// Estimated width of one character of legend text, pixels (sans-serif,
/// at [`LEGEND_PX`]), to size the legend column.
const LEGEND_CHAR_PX: f64 = 7.4;
/// Stroke of a data line, and radius of a marker, pixels.
const LINE_WIDTH_PX: u32 = 2;
const MARKER_RADIUS_PX: i32 = 3;

/// A figure ready to render.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    /// What it shows (`Flow completion time CDF`).
    pub(crate) title: String,
    /// What was run: scenario, seed, transport(s), bin width.
    pub(crate) subtitle: String,
    /// Lines under the subtitle (a suite figure's targets and verdicts).
    pub(crate) notes: Vec<Note>,
    /// Panels, row by row.
    pub(crate) panels: Vec<Panel>,
    /// Panels per row (at most; fewer panels make a narrower figure).
    pub(crate) columns: usize,
    /// One panel's (width, height), pixels.
    pub(crate) panel_px: (u32, u32),
    /// Heading of the legend (`workload`, `transport`, `switch.loss`).
    pub(crate) legend_title: String,
    /// Legend entries, top to bottom.
    pub(crate) legend: Vec<LegendEntry>,
}

/// One plotting area with its axes.
#[derive(Debug, Clone)]
pub(crate) struct Panel {
    /// Above the plot (empty: none).
    pub(crate) caption: String,
    /// Horizontal axis.
    pub(crate) x: Axis,
    /// Vertical axis.
    pub(crate) y: Axis,
    /// Bars, drawn under the lines.
    pub(crate) bars: Vec<Bar>,
    /// Data, drawn last to first so the first (the first legend entry)
    /// lies on top.
    pub(crate) lines: Vec<Line>,
    /// Shown instead when no line has a point (`no completed flows`).
    pub(crate) empty_note: String,
}

/// One data series in data units; the axes place it.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    /// Colour and dash.
    pub(crate) style: LineStyle,
    /// Joined in order. A point an axis cannot place (0 on a log axis)
    /// breaks the line there.
    pub(crate) points: Vec<(f64, f64)>,
    /// Drawn as dots, not joined (one seed's value at a sweep point).
    pub(crate) markers: Vec<(f64, f64)>,
}

/// One bar in data units: `width` wide, centred on `x`, from the foot of
/// the y axis (0, or the bottom of a log axis) up to `value`, with
/// `label` written above it.
#[derive(Debug, Clone)]
pub(crate) struct Bar {
    /// Fill colour.
    pub(crate) style: LineStyle,
    /// Centre, x axis units.
    pub(crate) x: f64,
    /// Width, x axis units.
    pub(crate) width: f64,
    /// Height, y data units; a value the axis cannot place (none, or 0
    /// on a log axis) draws no bar, only the label at the foot.
    pub(crate) value: f64,
    /// Written above the bar (the value, so a bar too short to see still
    /// says what it is).
    pub(crate) label: String,
}

/// One legend row.
#[derive(Debug, Clone)]
pub(crate) struct LegendEntry {
    /// Text.
    pub(crate) label: String,
    /// The sample's colour and dash.
    pub(crate) style: LineStyle,
    /// How the sample is drawn.
    pub(crate) sample: Sample,
}

/// A legend entry's sample, drawn like the series it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sample {
    /// A line.
    Line,
    /// A line with a dot (lines drawn with markers).
    LineWithDot,
    /// A filled block (bars).
    Block,
}

/// A line of text under a figure's subtitle.
#[derive(Debug, Clone)]
pub(crate) struct Note {
    /// Text.
    pub(crate) text: String,
    /// Its colour (a verdict's: met, not met).
    pub(crate) color: RGBColor,
}

/// A plotters text style at `px` rendered pixels (its SVG backend writes
/// `font-size` as the size / 1.24).
fn font(px: f64) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", px * 1.24).into_font())
}

/// [`font`] in bold.
fn bold(px: f64) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", px * 1.24, FontStyle::Bold).into_font())
}

fn stroke(style: LineStyle) -> ShapeStyle {
    ShapeStyle {
        color: style.color.to_rgba(),
        filled: false,
        stroke_width: LINE_WIDTH_PX,
    }
}

fn plot_err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError(e.to_string())
}

impl Figure {
    /// The figure as a standalone SVG document.
    pub(crate) fn render(&self) -> Result<String, PlotError> {
        let n = self.panels.len().max(1);
        let cols = self.columns.clamp(1, n);
        let rows = n.div_ceil(cols);
        let longest = self
            .legend
            .iter()
            .map(|e| e.label.chars().count())
            .chain([self.legend_title.chars().count()])
            .max()
            .unwrap_or(0);
        let legend_w =
            (longest as f64 * LEGEND_CHAR_PX).ceil() as u32 + LEGEND_SWATCH_PX as u32 + 36;
        let legend_h = (self.legend.len() as u32 + 2) * LEGEND_ROW_PX as u32;
        let (panel_w, panel_h) = self.panel_px;
        let plots_w = cols as u32 * panel_w;
        let body_h = (rows as u32 * panel_h).max(legend_h);
        let header_h = if self.notes.is_empty() {
            HEADER_HEIGHT_PX
        } else {
            HEADER_HEIGHT_PX + self.notes.len() as u32 * NOTE_ROW_PX + NOTES_GAP_PX
        };
        let size = (plots_w + legend_w + RIGHT_MARGIN_PX, header_h + body_h);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
            root.fill(&WHITE).map_err(plot_err)?;
            let (header, body) = root.split_vertically(header_h);
            let centre = size.0 as i32 / 2;
            let top = Pos::new(HPos::Center, VPos::Top);
            header
                .draw(&Text::new(
                    self.title.clone(),
                    (centre, 10),
                    font(TITLE_PX).pos(top),
                ))
                .map_err(plot_err)?;
            header
                .draw(&Text::new(
                    self.subtitle.clone(),
                    (centre, 34),
                    font(SUBTITLE_PX)
                        .color(&RGBColor(0x44, 0x44, 0x44))
                        .pos(top),
                ))
                .map_err(plot_err)?;
            for (i, note) in self.notes.iter().enumerate() {
                header
                    .draw(&Text::new(
                        note.text.clone(),
                        (
                            centre,
                            HEADER_HEIGHT_PX as i32 + i as i32 * NOTE_ROW_PX as i32 - 4,
                        ),
                        font(NOTE_PX).color(&note.color).pos(top),
                    ))
                    .map_err(plot_err)?;
            }
            let (plots, legend) = body.split_horizontally(plots_w);
            let (plots, _) = plots.split_vertically(rows as u32 * panel_h);
            for (panel, area) in self.panels.iter().zip(plots.split_evenly((rows, cols))) {
                panel.draw(&area)?;
            }
            self.draw_legend(&legend)?;
            root.present().map_err(plot_err)?;
        }
        Ok(svg)
    }

    /// The legend column: a heading, then one row per entry.
    fn draw_legend(&self, area: &DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), PlotError> {
        let left = Pos::new(HPos::Left, VPos::Center);
        let x0 = 14;
        let mut y = 34;
        if !self.legend_title.is_empty() {
            area.draw(&Text::new(
                self.legend_title.clone(),
                (x0, y),
                bold(LEGEND_PX).pos(left),
            ))
            .map_err(plot_err)?;
            y += LEGEND_ROW_PX;
        }
        for e in &self.legend {
            let ends = vec![(x0, y), (x0 + LEGEND_SWATCH_PX, y)];
            if e.sample == Sample::Block {
                let half = LEGEND_ROW_PX / 2 - 3;
                area.draw(&Rectangle::new(
                    [(x0, y - half), (x0 + LEGEND_SWATCH_PX, y + half)],
                    e.style.color.filled(),
                ))
                .map_err(plot_err)?;
            } else if e.style.dashed {
                area.draw(&DashedPathElement::new(ends, 6, 4, stroke(e.style)))
                    .map_err(plot_err)?;
            } else {
                area.draw(&PathElement::new(ends, stroke(e.style)))
                    .map_err(plot_err)?;
            }
            if e.sample == Sample::LineWithDot {
                area.draw(&Circle::new(
                    (x0 + LEGEND_SWATCH_PX / 2, y),
                    MARKER_RADIUS_PX,
                    e.style.color.filled(),
                ))
                .map_err(plot_err)?;
            }
            area.draw(&Text::new(
                e.label.clone(),
                (x0 + LEGEND_SWATCH_PX + 8, y),
                font(LEGEND_PX).pos(left),
            ))
            .map_err(plot_err)?;
            y += LEGEND_ROW_PX;
        }
        Ok(())
    }
}

impl Panel {
    fn draw(&self, area: &DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), PlotError> {
        let mut builder = ChartBuilder::on(area);
        builder
            .margin_top(8)
            .margin_right(20)
            .margin_left(4)
            .margin_bottom(10)
            .x_label_area_size(46)
            .y_label_area_size(62);
        if !self.caption.is_empty() {
            builder.caption(&self.caption, font(CAPTION_PX));
        }
        let mut chart = builder
            .build_cartesian_2d(self.x.clone(), self.y.clone())
            .map_err(plot_err)?;
        let (x, y) = (&self.x, &self.y);
        chart
            .configure_mesh()
            .x_desc(x.label.as_str())
            .y_desc(y.label.as_str())
            .x_label_formatter(&|v| x.tick_label(*v))
            .y_label_formatter(&|v| y.tick_label(*v))
            .label_style(font(TICK_PX))
            .axis_desc_style(font(AXIS_TITLE_PX))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(BLACK.mix(0.05))
            .axis_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        // The frame's top and right edges (plotters draws the other two
        // as the axes).
        let (xr, yr) = (chart.x_range(), chart.y_range());
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(xr.start, yr.end), (xr.end, yr.end), (xr.end, yr.start)],
                BLACK,
            )))
            .map_err(plot_err)?;
        let place = |&(vx, vy): &(f64, f64)| Some((x.position(vx)?, y.position(vy)?));
        let mut drawn = self.draw_bars(&mut chart)?;
        for line in self.lines.iter().rev() {
            for run in runs(&line.points, place) {
                drawn = true;
                if line.style.dashed {
                    chart
                        .draw_series(DashedLineSeries::new(run, 6, 4, stroke(line.style)))
                        .map_err(plot_err)?;
                } else {
                    chart
                        .draw_series(LineSeries::new(run, stroke(line.style)))
                        .map_err(plot_err)?;
                }
            }
            let dots: Vec<(f64, f64)> = line.markers.iter().filter_map(place).collect();
            drawn |= !dots.is_empty();
            chart
                .draw_series(
                    dots.into_iter()
                        .map(|p| Circle::new(p, MARKER_RADIUS_PX, line.style.color.filled())),
                )
                .map_err(plot_err)?;
        }
        if !drawn && !self.empty_note.is_empty() {
            let mid = ((xr.start + xr.end) / 2.0, (yr.start + yr.end) / 2.0);
            chart
                .draw_series(std::iter::once(Text::new(
                    self.empty_note.clone(),
                    mid,
                    font(CAPTION_PX)
                        .color(&RGBColor(0x66, 0x66, 0x66))
                        .pos(Pos::new(HPos::Center, VPos::Center)),
                )))
                .map_err(plot_err)?;
        }
        Ok(())
    }

    /// The bars and their labels; whether there were any.
    fn draw_bars(
        &self,
        chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<Axis, Axis>>,
    ) -> Result<bool, PlotError> {
        let yr = chart.y_range();
        // Bars stand on 0 when the axis shows it, else on its bottom (a
        // log axis, which cannot place 0, or one whose values are all far
        // from 0).
        let foot = self
            .y
            .position(0.0)
            .filter(|zero| yr.contains(zero) || *zero == yr.end)
            .unwrap_or(yr.start);
        let below = Pos::new(HPos::Center, VPos::Bottom);
        for bar in &self.bars {
            let (Some(left), Some(right)) = (
                self.x.position(bar.x - bar.width / 2.0),
                self.x.position(bar.x + bar.width / 2.0),
            ) else {
                continue;
            };
            let top = self
                .y
                .position(bar.value)
                .map(|t| t.clamp(yr.start, yr.end));
            if let Some(top) = top {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(left, foot), (right, top)],
                        bar.style.color.filled(),
                    )))
                    .map_err(plot_err)?;
            }
            // The label sits just above the bar's top (or its foot when
            // there is no bar), a few pixels clear of it.
            let at = top.unwrap_or(foot).max(foot);
            let centre = self.x.position(bar.x).unwrap_or(left);
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((centre, at))
                        + Text::new(bar.label.clone(), (0, -3), font(BAR_VALUE_PX).pos(below)),
                ))
                .map_err(plot_err)?;
        }
        Ok(!self.bars.is_empty())
    }
}

/// The stretches of `points` that `place` can put on the plot, each
/// placed: a point it cannot place ends one stretch.
fn runs(
    points: &[(f64, f64)],
    place: impl Fn(&(f64, f64)) -> Option<(f64, f64)>,
) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut cur = Vec::new();
    for p in points {
        match place(p) {
            Some(q) => cur.push(q),
            None if !cur.is_empty() => out.push(std::mem::take(&mut cur)),
            None => {}
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
