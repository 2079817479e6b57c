//! IEEE binary16 (`half`) and bfloat16, kept as `u16` bit patterns.
//!
//! Arithmetic on both happens in f32 and is rounded back once, which is what
//! NCCL does on the GPU. The result is the correctly rounded half (or
//! bfloat16) result for `+` and `×`: f32 carries 24 significand bits, at
//! least 2p+2 for p = 11 (half) and p = 8 (bfloat16), so rounding first to
//! f32 and then to the narrow type never differs from rounding the exact
//! value once (double rounding is innocuous at that width).
//!
//! Conversions:
//! - narrow → f32 is exact (every half and bfloat16 value is an f32 value);
//! - f32 → narrow rounds to nearest, ties to even; values beyond the largest
//!   finite narrow value by half an ulp or more become ±infinity (half:
//!   |x| ≥ 65520); values below half the smallest subnormal become ±0, with
//!   the sign kept; subnormals are produced, not flushed;
//! - infinities stay infinities; a NaN stays a NaN, quiet, with its sign and
//!   the top bits of its payload (half keeps 10, bfloat16 keeps 7).

/// Bit pattern of a canonical quiet half NaN.
pub const F16_NAN: u16 = 0x7e00;
/// Bit pattern of a canonical quiet bfloat16 NaN.
pub const BF16_NAN: u16 = 0x7fc0;

const F16_INF: u16 = 0x7c00;

// The conversions below compute every case and select one, without
// branches, so that a kernel looping over them vectorizes; the tests
// compare them with the case-by-case definitions exhaustively.

/// Converts a half bit pattern to f32, exactly.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let exp = h & 0x7c00;
    // Exponent and mantissa moved to their f32 places, still biased by 15.
    let mag = (h & 0x7fff) << 13;
    // Normal: rebias 15 → 127.
    let normal = mag + ((127 - 15) << 23);
    // Infinity or NaN: all exponent bits set, the payload kept.
    let special = mag | 0x7f80_0000;
    // Zero or subnormal, man × 2^-24: read the mantissa as the fraction of
    // 1.man × 2^-14 and take 2^-14 away, exactly.
    let two_m14 = f32::from_bits(113 << 23);
    let sub = (f32::from_bits(mag + (113 << 23)) - two_m14).to_bits();
    let bits = if exp == 0x7c00 {
        special
    } else if exp == 0 {
        sub
    } else {
        normal
    };
    f32::from_bits(bits | sign)
}

/// Rounds an f32 to the nearest half (ties to even) and returns its bits.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let abs = bits & 0x7fff_ffff;
    // NaN: quiet, with the top payload bits (the quiet bit keeps it a NaN
    // even when those are all zero).
    let nan = 0x7e00 | ((abs >> 13) & 0x03ff);
    // Normal half, |x| in [2^-14, 2^16): rebias, then round on the 13
    // dropped bits, to even on a tie. A carry out of the mantissa bumps the
    // exponent, and out of the largest one gives exactly infinity (|x| ≥ 65520).
    let odd = (abs >> 13) & 1;
    let normal = abs
        .wrapping_sub((127 - 15) << 23)
        .wrapping_add(0x0fff + odd)
        >> 13;
    // Below 2^-14 (subnormal half or zero): adding 0.5 puts the f32 ulp at
    // 2^-24, the half subnormal unit, so the FPU's own round-to-nearest-even
    // does the rounding; rounding up from the largest subnormal yields the
    // smallest normal pattern 0x0400.
    let sub = (f32::from_bits(abs) + 0.5)
        .to_bits()
        .wrapping_sub(0x3f00_0000);
    let mag = if abs > 0x7f80_0000 {
        nan
    } else if abs >= 0x4780_0000 {
        F16_INF as u32 // 2^16 and beyond, infinity included
    } else if abs < 0x3880_0000 {
        sub
    } else {
        normal
    };
    (sign | mag) as u16
}

/// Converts a bfloat16 bit pattern to f32, exactly.
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Rounds an f32 to the nearest bfloat16 (ties to even) and returns its bits.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    // Add just under half an ulp, plus one more when the kept part is odd:
    // ties go to even, and a carry into the exponent (up to infinity) is the
    // correct rounding. Works unchanged for subnormals.
    let lsb = (bits >> 16) & 1;
    let rounded = bits.wrapping_add(0x7fff + lsb) >> 16;
    // A NaN keeps its top payload bits and is forced quiet so it stays a NaN.
    let nan = (bits >> 16) | 0x0040;
    (if bits & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Case-by-case definition of half → f32.
    fn f16_to_f32_cases(h: u16) -> f32 {
        let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
        let exp = i32::from((h >> 10) & 0x1f);
        let man = u32::from(h & 0x03ff);
        match exp {
            0 => sign * man as f32 * 2f32.powi(-24),
            0x1f => f32::from_bits((u32::from(h & 0x8000) << 16) | 0x7f80_0000 | (man << 13)),
            _ => sign * (1.0 + man as f32 / 1024.0) * 2f32.powi(exp - 15),
        }
    }

    #[test]
    fn f16_to_f32_matches_its_definition_exhaustively() {
        for h in 0..=u16::MAX {
            assert_eq!(
                f16_to_f32(h).to_bits(),
                f16_to_f32_cases(h).to_bits(),
                "{h:#06x}"
            );
        }
    }

    #[test]
    fn nan_payloads() {
        assert_eq!(f32_to_f16(f32::from_bits(0x7fc0_2000)), 0x7e01);
        assert_eq!(f32_to_f16(f32::from_bits(0xff80_0001)), 0xfe00);
        assert_eq!(f32_to_bf16(f32::from_bits(0xffa0_0000)), 0xffe0);
        assert_eq!(f16_to_f32(0x7c01).to_bits(), 0x7f80_2000);
    }

    #[test]
    fn f16_round_trips_every_non_nan_value() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(f32_to_f16(x) & 0x7c00 == 0x7c00 && f32_to_f16(x) & 0x3ff != 0);
            } else {
                assert_eq!(f32_to_f16(x), h, "{h:#06x}");
            }
        }
    }

    #[test]
    fn bf16_round_trips_every_non_nan_value() {
        for b in 0..=u16::MAX {
            let x = bf16_to_f32(b);
            if x.is_nan() {
                assert!(f32_to_bf16(x) & 0x7f80 == 0x7f80 && f32_to_bf16(x) & 0x7f != 0);
            } else {
                assert_eq!(f32_to_bf16(x), b, "{b:#06x}");
            }
        }
    }

    #[test]
    fn f16_known_values() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        // 65520 is the midpoint between 65504 and the next (non-existent)
        // value 65536: ties to even rounds to infinity.
        assert_eq!(f32_to_f16(65519.996), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(-1e9), 0xfc00);
        // Smallest subnormal 2^-24; half of it ties to even (zero).
        assert_eq!(f32_to_f16(2f32.powi(-24)), 0x0001);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000);
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.0001), 0x0001);
        assert_eq!(f32_to_f16(-2f32.powi(-26)), 0x8000);
        // 1.5 × 2^-24 ties between 1 and 2 units: goes to 2 (even).
        assert_eq!(f32_to_f16(1.5 * 2f32.powi(-24)), 0x0002);
        // Largest subnormal rounds up into the smallest normal.
        assert_eq!(f32_to_f16(2f32.powi(-14) * (1.0 - 2f32.powi(-12))), 0x0400);
        // 1 + 2^-11 is the tie between 1 and 1 + 2^-10: even is 1.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16(f32::NAN) & 0x7e00, 0x7e00);
        assert_eq!(f32_to_f16(f32::from_bits(0xff80_0001)) & 0xfe00, 0xfe00);
    }

    #[test]
    fn bf16_known_values() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80); // tie to even
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(1)), 0x0000); // tiny subnormal
        assert_eq!(f32_to_bf16(f32::from_bits(0x0000_8001)), 0x0001);
        assert_eq!(f32_to_bf16(-0.0), 0x8000);
        // A NaN whose payload lives only in the dropped bits stays a NaN.
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }
}
