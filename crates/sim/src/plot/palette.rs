//! Line colours: a categorical palette that stays apart when printed and
//! for the common colour-vision deficiencies, and one fixed colour per
//! transport so MetaRoCE is the same blue in every figure.

use crate::scenario::TRANSPORTS;
use plotters::style::RGBColor;

/// Ten categorical colours (blue, orange, green, red, purple, brown,
/// pink, grey, olive, cyan); series past ten reuse them dashed.
const CATEGORICAL: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// How one series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LineStyle {
    /// Colour.
    pub(crate) color: RGBColor,
    /// Dashed (the second round through the palette).
    pub(crate) dashed: bool,
}

/// The style of the `i`-th series of a figure.
pub(crate) fn series(i: usize) -> LineStyle {
    LineStyle {
        color: CATEGORICAL[i % CATEGORICAL.len()],
        dashed: (i / CATEGORICAL.len()) % 2 == 1,
    }
}

/// The style of a transport, the same in every figure: its place in
/// [`TRANSPORTS`] (an unknown name after them).
pub(crate) fn transport(name: &str) -> LineStyle {
    series(
        TRANSPORTS
            .iter()
            .position(|t| *t == name)
            .unwrap_or(TRANSPORTS.len()),
    )
}
