//! Figures of a run, of a comparison of transports, of a sweep, and of
//! each experiment of a suite, as SVG documents drawn with plotters.
//!
//! Every figure is titled with what it shows and says below the title
//! which scenario, seed(s) and transport(s) it comes from; its legend
//! stands right of the panels, never over data; ticks are round numbers
//! (1, 2 or 5 x 10^k), log axes where the data spans decades.
//!
//! | file | figure |
//! |---|---|
//! | `axis.rs` | one axis: range, round ticks, log decades, categories |
//! | `palette.rs` | series colours; one fixed colour per transport |
//! | `figure.rs` | title block and notes, grid of panels (lines, bars), legend outside them |
//! | `fct_cdf.rs` | FCT CDF, log µs, one curve per workload group |
//! | `timeseries.rs` | goodput and queue depth per tier over time |
//! | `compare.rs` | several transports of one scenario, overlaid per panel |
//! | `sweep.rs` | a sweep: x the swept parameter, one line per other value |
//! | `suite.rs` | a suite's experiment: a line or bars per transport, targets and verdicts |

mod axis;
mod compare;
mod fct_cdf;
mod figure;
mod palette;
mod suite;
mod sweep;
mod timeseries;

use crate::report::{GroupFcts, TimeSeries};

pub use compare::comparison_svg;
pub use fct_cdf::fct_cdf_svg;
pub use suite::{experiment_svg, plot_file_name, write_experiment_svgs};
pub use sweep::sweep_svg;
pub use timeseries::{queues_svg, throughput_svg};

/// A swept value as the reader knows it: TOML strings without quotes.
fn unquoted(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v)
}

/// A figure could not be drawn (the SVG backend failed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plot: {0}")]
pub struct PlotError(pub String);

impl From<PlotError> for std::io::Error {
    fn from(e: PlotError) -> Self {
        Self::other(e)
    }
}

/// One run as its figures see it.
#[derive(Debug, Clone, Copy)]
pub struct RunView<'a> {
    /// Scenario name.
    pub scenario: &'a str,
    /// Seed.
    pub seed: u64,
    /// Transport (`metaroce`, `rocev2`, ...).
    pub transport: &'a str,
    /// Completion times per workload group.
    pub fcts: &'a [GroupFcts],
    /// Goodput and queues over time.
    pub series: &'a TimeSeries,
}

impl RunView<'_> {
    /// `scenario · seed N · transport`, the line under every title.
    fn about(&self) -> String {
        format!(
            "{} · seed {} · {}",
            self.scenario, self.seed, self.transport
        )
    }
}

/// Test helper: every one of `texts` is a whole text element of `svg`.
#[cfg(test)]
pub(crate) fn assert_texts(svg: &str, texts: &[&str]) {
    assert!(svg.starts_with("<svg"), "not an SVG document");
    assert!(svg.trim_end().ends_with("</svg>"), "unterminated SVG");
    for t in texts {
        assert!(
            svg.contains(&format!(">\n{t}\n</text>")),
            "no text element {t:?}"
        );
    }
}
