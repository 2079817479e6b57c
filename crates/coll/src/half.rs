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

const F16_SIGN: u16 = 0x8000;
const F16_INF: u16 = 0x7c00;

/// Converts a half bit pattern to f32, exactly.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & F16_SIGN) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x03ff);
    let bits = match exp {
        // Zero or subnormal: man × 2^-24, exact in f32.
        0 => {
            let magnitude = man as f32 * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -magnitude } else { magnitude };
        }
        // Infinity or NaN; a NaN's payload moves up unchanged, so it stays a NaN.
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Rounds an f32 to the nearest half (ties to even) and returns its bits.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x007f_ffff;
    if exp == 0xff {
        if man == 0 {
            return sign | F16_INF;
        }
        // Quiet NaN with the top payload bits; the quiet bit keeps it a NaN
        // even when those bits are all zero.
        return sign | F16_INF | 0x0200 | (man >> 13) as u16;
    }
    let e = exp - 127; // unbiased exponent (f32 subnormals land far below half's range)
    if e > 15 {
        return sign | F16_INF;
    }
    if e >= -14 {
        // Normal half: keep 10 mantissa bits, round on the 13 dropped ones.
        // A carry out of the mantissa bumps the exponent, and a carry out of
        // the largest exponent gives exactly the infinity pattern.
        let base = (((e + 15) as u32) << 10) | (man >> 13);
        let dropped = man & 0x1fff;
        let round_up = dropped > 0x1000 || (dropped == 0x1000 && base & 1 == 1);
        return sign | (base + u32::from(round_up)) as u16;
    }
    // Subnormal half (or zero): the value in units of 2^-24 is
    // (1.man) × 2^(e+24) = full × 2^(e+1), full being the 24-bit significand.
    let shift = (-e - 1) as u32; // 14 for e = -15, 24 for e = -25
    if shift > 24 {
        return sign; // below half the smallest subnormal: rounds to zero
    }
    let full = man | 0x0080_0000;
    let kept = full >> shift;
    let dropped = full & ((1 << shift) - 1);
    let half_unit = 1 << (shift - 1);
    let round_up = dropped > half_unit || (dropped == half_unit && kept & 1 == 1);
    // Rounding up from the largest subnormal yields 0x0400, the smallest normal.
    sign | (kept + u32::from(round_up)) as u16
}

/// Converts a bfloat16 bit pattern to f32, exactly.
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Rounds an f32 to the nearest bfloat16 (ties to even) and returns its bits.
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        // Truncate the payload and force the quiet bit so it stays a NaN.
        return ((bits >> 16) as u16) | 0x0040;
    }
    // Add just under half an ulp, plus one more when the kept part is odd:
    // ties go to even, and a carry into the exponent (up to infinity) is the
    // correct rounding. Works unchanged for subnormals.
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7fff + lsb) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

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
