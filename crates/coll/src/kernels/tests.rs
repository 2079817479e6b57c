//! The kernels against a scalar reference written independently of them:
//! integers in i128 then wrapped, narrow floats in exact f64 arithmetic
//! rounded once by brute-force search of every representable value.

use super::*;
use proptest::prelude::*;
use std::sync::OnceLock;

/// Every finite non-negative value of a 16-bit format, ascending, with its bits.
fn table(bf16: bool) -> &'static [(f64, u16)] {
    static F16: OnceLock<Vec<(f64, u16)>> = OnceLock::new();
    static BF16: OnceLock<Vec<(f64, u16)>> = OnceLock::new();
    let build = |max_bits: u16, decode: fn(u16) -> f32| {
        (0..=max_bits)
            .map(|b| (f64::from(decode(b)), b))
            .collect::<Vec<_>>()
    };
    if bf16 {
        BF16.get_or_init(|| build(0x7f7f, bf16_to_f32))
    } else {
        F16.get_or_init(|| build(0x7bff, f16_to_f32))
    }
}

/// Rounds an exact value to the nearest 16-bit float, ties to even, by search.
fn oracle_round(x: f64, bf16: bool) -> u16 {
    let (inf, nan) = if bf16 {
        (0x7f80u16, 0x7fc0u16)
    } else {
        (0x7c00, 0x7e00)
    };
    if x.is_nan() {
        return nan;
    }
    let sign = if x.is_sign_negative() { 0x8000u16 } else { 0 };
    let m = x.abs();
    let t = table(bf16);
    let (max, max_bits) = *t.last().unwrap();
    if m.is_infinite() {
        return sign | inf;
    }
    let i = t.partition_point(|&(v, _)| v < m);
    let (lo, hi) = if i == t.len() {
        // Beyond the largest finite value: the next step up would be infinity,
        // whose pattern is even.
        let (prev, _) = t[t.len() - 2];
        let next = max + (max - prev);
        ((max, max_bits), (next, inf))
    } else if t[i].0 == m {
        return sign | t[i].1;
    } else {
        (t[i - 1], t[i])
    };
    let bits = if m - lo.0 < hi.0 - m {
        lo.1
    } else if m - lo.0 > hi.0 - m {
        hi.1
    } else if lo.1 & 1 == 0 {
        lo.1
    } else {
        hi.1
    };
    sign | bits
}

#[derive(Clone, Copy, Debug)]
enum Prim {
    Sum,
    Prod,
    Max,
    Min,
}

fn prim(op: ReduceOp) -> Prim {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => Prim::Sum,
        ReduceOp::Prod => Prim::Prod,
        ReduceOp::Max => Prim::Max,
        ReduceOp::Min => Prim::Min,
    }
}

fn float_ref(p: Prim, a: f64, b: f64) -> f64 {
    match p {
        Prim::Sum => a + b,
        Prim::Prod => a * b,
        Prim::Max | Prim::Min => {
            if a.is_nan() && b.is_nan() {
                f64::NAN
            } else if a.is_nan() {
                b
            } else if b.is_nan() {
                a
            } else if a == b {
                // Equal, or +0 against -0: max prefers +0, min prefers -0.
                if a.is_sign_negative() != b.is_sign_negative() {
                    if matches!(p, Prim::Max) { 0.0 } else { -0.0 }
                } else {
                    a
                }
            } else if matches!(p, Prim::Max) == (a > b) {
                a
            } else {
                b
            }
        }
    }
}

fn int_ref(p: Prim, a: i128, b: i128, bits: u32, signed: bool) -> i128 {
    let r = match p {
        Prim::Sum => a + b,
        Prim::Prod => a.wrapping_mul(b),
        Prim::Max => a.max(b),
        Prim::Min => a.min(b),
    };
    let modulus = 1i128 << bits;
    let mut w = r.rem_euclid(modulus);
    if signed && w >= modulus / 2 {
        w -= modulus;
    }
    w
}

fn load_int(d: DataType, e: &[u8]) -> (i128, u32, bool) {
    match d {
        DataType::Int8 => (i128::from(i8::from_ne_bytes([e[0]])), 8, true),
        DataType::Uint8 => (i128::from(e[0]), 8, false),
        DataType::Int32 => (
            i128::from(i32::from_ne_bytes(e.try_into().unwrap())),
            32,
            true,
        ),
        DataType::Uint32 => (
            i128::from(u32::from_ne_bytes(e.try_into().unwrap())),
            32,
            false,
        ),
        DataType::Int64 => (
            i128::from(i64::from_ne_bytes(e.try_into().unwrap())),
            64,
            true,
        ),
        DataType::Uint64 => (
            i128::from(u64::from_ne_bytes(e.try_into().unwrap())),
            64,
            false,
        ),
        _ => unreachable!(),
    }
}

fn store_int(d: DataType, v: i128, out: &mut [u8]) {
    let bytes = (v as u64).to_ne_bytes();
    let n = d.size_bytes();
    if cfg!(target_endian = "little") {
        out.copy_from_slice(&bytes[..n]);
    } else {
        out.copy_from_slice(&bytes[8 - n..]);
    }
}

/// One element of `a ⊕ b`, by the reference.
fn reference_elem(op: ReduceOp, d: DataType, a: &[u8], b: &[u8], out: &mut [u8]) {
    let p = prim(op);
    match d {
        DataType::Float16 | DataType::Bfloat16 => {
            let bf = d == DataType::Bfloat16;
            let dec = if bf { bf16_to_f32 } else { f16_to_f32 };
            let x = f64::from(dec(u16::from_ne_bytes([a[0], a[1]])));
            let y = f64::from(dec(u16::from_ne_bytes([b[0], b[1]])));
            // Exact in f64: 11- or 8-bit significands.
            let r = oracle_round(float_ref(p, x, y), bf);
            out.copy_from_slice(&r.to_ne_bytes());
        }
        DataType::Float32 => {
            let x = f64::from(f32::from_ne_bytes(a.try_into().unwrap()));
            let y = f64::from(f32::from_ne_bytes(b.try_into().unwrap()));
            // f64 has 53 ≥ 2·24 + 2 bits: rounding through it is exact rounding.
            let r = float_ref(p, x, y) as f32;
            let r = if r.is_nan() { f32::NAN } else { r };
            out.copy_from_slice(&r.to_ne_bytes());
        }
        DataType::Float64 => {
            let x = f64::from_ne_bytes(a.try_into().unwrap());
            let y = f64::from_ne_bytes(b.try_into().unwrap());
            let r = float_ref(p, x, y);
            let r = if r.is_nan() { f64::NAN } else { r };
            out.copy_from_slice(&r.to_ne_bytes());
        }
        _ => {
            let (x, bits, signed) = load_int(d, a);
            let (y, _, _) = load_int(d, b);
            store_int(d, int_ref(p, x, y, bits, signed), out);
        }
    }
}

fn reference(op: ReduceOp, d: DataType, a: &[u8], b: &[u8]) -> Vec<u8> {
    let n = d.size_bytes();
    let mut out = vec![0u8; a.len()];
    for ((o, x), y) in out
        .chunks_exact_mut(n)
        .zip(a.chunks_exact(n))
        .zip(b.chunks_exact(n))
    {
        reference_elem(op, d, x, y, o);
    }
    out
}

fn any_dtype() -> impl Strategy<Value = DataType> {
    proptest::sample::select(DataType::ALL.to_vec())
}

fn float_dtype() -> impl Strategy<Value = DataType> {
    proptest::sample::select(
        DataType::ALL
            .into_iter()
            .filter(|d| d.is_float())
            .collect::<Vec<_>>(),
    )
}

fn int_dtype() -> impl Strategy<Value = DataType> {
    proptest::sample::select(
        DataType::ALL
            .into_iter()
            .filter(|d| !d.is_float())
            .collect::<Vec<_>>(),
    )
}

fn any_op() -> impl Strategy<Value = ReduceOp> {
    proptest::sample::select(ReduceOp::ALL.to_vec())
}

/// Two operand buffers of the same whole number of elements.
fn operands() -> impl Strategy<Value = (DataType, Vec<u8>, Vec<u8>)> {
    operands_of(any_dtype())
}

fn operands_of(
    types: impl Strategy<Value = DataType>,
) -> impl Strategy<Value = (DataType, Vec<u8>, Vec<u8>)> {
    (types, 0usize..40).prop_flat_map(|(d, n)| {
        let len = n * d.size_bytes();
        (
            Just(d),
            proptest::collection::vec(any::<u8>(), len),
            proptest::collection::vec(any::<u8>(), len),
        )
    })
}

/// A 16-bit float value near a rounding boundary of the other format or of
/// itself: midpoints, midpoints nudged by one f32 ulp, overflow and
/// subnormal edges.
fn edge_f32(bf16: bool) -> impl Strategy<Value = f32> {
    (0..=max_bits(bf16), -1i32..=1, any::<bool>())
        .prop_map(move |(b, nudge, neg)| edge_value(bf16, b, nudge, neg))
}

/// The largest finite pattern of the 16-bit format.
fn max_bits(bf16: bool) -> u16 {
    if bf16 { 0x7f7f } else { 0x7bff }
}

/// The midpoint between 16-bit pattern `b` and the next one up, nudged by
/// `nudge` f32 ulps, negated if `neg`.
fn edge_value(bf16: bool, b: u16, nudge: i32, neg: bool) -> f32 {
    let dec = if bf16 { bf16_to_f32 } else { f16_to_f32 };
    let lo = f64::from(dec(b));
    let hi = if b < max_bits(bf16) {
        f64::from(dec(b + 1))
    } else {
        // The virtual step past the largest value: 2^128 for bfloat16,
        // beyond f32, so in f64 (in f32 it was infinity, the midpoint
        // too, and the nudge made it a NaN).
        2.0 * lo - f64::from(dec(b - 1))
    };
    // The midpoint needs one bit more than the format: exact in f32.
    let mid = ((lo + hi) / 2.0) as f32;
    let nudged = f32::from_bits((mid.to_bits() as i64 + i64::from(nudge)) as u32);
    if neg { -nudged } else { nudged }
}

/// The overflow ties of both formats, every nudge and sign: the cases the
/// random edge strategy reaches about once in ten runs.
#[test]
fn rounding_at_the_overflow_tie() {
    for bf16 in [false, true] {
        let top = max_bits(bf16);
        for b in top - 2..=top {
            for nudge in -1..=1 {
                for neg in [false, true] {
                    let x = edge_value(bf16, b, nudge, neg);
                    assert!(!x.is_nan(), "{b:#x} {nudge} {neg}");
                    let got = if bf16 { f32_to_bf16(x) } else { f32_to_f16(x) };
                    assert_eq!(
                        got,
                        oracle_round(f64::from(x), bf16),
                        "{x:e} {:#x}",
                        x.to_bits()
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn binary_kernels_match_reference((d, a, b) in operands(), op in any_op()) {
        let want = reference(op, d, &a, &b);
        let mut out = vec![0u8; a.len()];
        reduce(op, d, &mut out, &a, &b).unwrap();
        prop_assert_eq!(&out, &want, "{} {}", op, d);
        let mut acc = a.clone();
        reduce_in_place(op, d, &mut acc, &b).unwrap();
        prop_assert_eq!(&acc, &want);
        // Commutative bit for bit (what recursive doubling relies on).
        let mut swapped = vec![0u8; a.len()];
        reduce(op, d, &mut swapped, &b, &a).unwrap();
        prop_assert_eq!(&swapped, &want);
    }

    #[test]
    fn f16_rounding_matches_search(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        prop_assume!(!x.is_nan());
        prop_assert_eq!(f32_to_f16(x), oracle_round(f64::from(x), false));
    }

    #[test]
    fn bf16_rounding_matches_search(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        prop_assume!(!x.is_nan());
        prop_assert_eq!(f32_to_bf16(x), oracle_round(f64::from(x), true));
    }

    #[test]
    fn f16_rounding_edges(x in edge_f32(false)) {
        prop_assert_eq!(f32_to_f16(x), oracle_round(f64::from(x), false), "{:e} {:#x}", x, x.to_bits());
    }

    #[test]
    fn bf16_rounding_edges(x in edge_f32(true)) {
        prop_assert_eq!(f32_to_bf16(x), oracle_round(f64::from(x), true), "{:e} {:#x}", x, x.to_bits());
    }

    #[test]
    fn premultiply_matches_reference((d, a, _b) in operands_of(float_dtype()), world in 1u32..9) {
        let mut out = vec![0u8; a.len()];
        let k = avg_scale_bytes(d, world).unwrap();
        let n = d.size_bytes();
        let mut want = vec![0u8; a.len()];
        for (w, x) in want.chunks_exact_mut(n).zip(a.chunks_exact(n)) {
            reference_elem(ReduceOp::Prod, d, x, &k, w);
        }
        premultiply(d, &mut out, &a, world).unwrap();
        prop_assert_eq!(&out, &want);
        let mut inplace = a.clone();
        premultiply_in_place(d, &mut inplace, world).unwrap();
        prop_assert_eq!(&inplace, &want);
    }

    #[test]
    fn post_divide_truncates_toward_zero((d, a, _b) in operands_of(int_dtype()), world in 1u32..300) {
        let n = d.size_bytes();
        let mut want = vec![0u8; a.len()];
        for (w, x) in want.chunks_exact_mut(n).zip(a.chunks_exact(n)) {
            let (v, _, _) = load_int(d, x);
            // i128 division truncates toward zero.
            store_int(d, v / i128::from(world), w);
        }
        let mut out = a.clone();
        post_divide(d, &mut out, world).unwrap();
        prop_assert_eq!(&out, &want);
    }
}

#[test]
fn avg_scale_is_rounded_inverse() {
    assert_eq!(
        avg_scale_bytes(DataType::Float32, 4).unwrap(),
        0.25f32.to_ne_bytes()
    );
    assert_eq!(
        avg_scale_bytes(DataType::Float32, 3).unwrap(),
        ((1.0f64 / 3.0) as f32).to_ne_bytes()
    );
    // 1/3 in half is 0x3555 (0.33325...).
    assert_eq!(
        avg_scale_bytes(DataType::Float16, 3).unwrap(),
        0x3555u16.to_ne_bytes()
    );
    assert_eq!(avg_scale_bytes(DataType::Int32, 3), None);
}

#[test]
fn float_special_values() {
    let f = |x: f32| x.to_ne_bytes().to_vec();
    let run = |op, a: f32, b: f32| {
        let mut out = vec![0u8; 4];
        reduce(op, DataType::Float32, &mut out, &f(a), &f(b)).unwrap();
        f32::from_ne_bytes(out.try_into().unwrap())
    };
    assert_eq!(run(ReduceOp::Sum, f32::MAX, f32::MAX), f32::INFINITY);
    assert_eq!(
        run(ReduceOp::Sum, f32::INFINITY, f32::NEG_INFINITY).to_bits(),
        f32::NAN.to_bits()
    );
    assert_eq!(
        run(ReduceOp::Prod, 0.0, f32::INFINITY).to_bits(),
        f32::NAN.to_bits()
    );
    assert_eq!(run(ReduceOp::Max, f32::NAN, 1.0), 1.0);
    assert_eq!(run(ReduceOp::Min, 1.0, f32::NAN), 1.0);
    assert_eq!(run(ReduceOp::Max, -0.0, 0.0).to_bits(), 0);
    assert_eq!(run(ReduceOp::Min, 0.0, -0.0).to_bits(), 0x8000_0000);
    // A NaN with a payload comes out canonical.
    let payload = f32::from_bits(0x7fa0_0001);
    assert_eq!(run(ReduceOp::Sum, payload, 1.0).to_bits(), 0x7fc0_0000);

    // Half overflow: 65504 + 16 = 65520 is the tie to infinity.
    let h = |b: u16| b.to_ne_bytes().to_vec();
    let mut out = vec![0u8; 2];
    reduce(
        ReduceOp::Sum,
        DataType::Float16,
        &mut out,
        &h(0x7bff),
        &h(0x4c00),
    )
    .unwrap();
    assert_eq!(u16::from_ne_bytes([out[0], out[1]]), 0x7c00);
    reduce(
        ReduceOp::Sum,
        DataType::Float16,
        &mut out,
        &h(0x7bff),
        &h(0x4bff),
    )
    .unwrap();
    assert_eq!(u16::from_ne_bytes([out[0], out[1]]), 0x7bff);
    // Two smallest subnormals add exactly.
    reduce(
        ReduceOp::Sum,
        DataType::Float16,
        &mut out,
        &h(0x0001),
        &h(0x0001),
    )
    .unwrap();
    assert_eq!(u16::from_ne_bytes([out[0], out[1]]), 0x0002);
}

#[test]
fn bad_lengths_are_errors() {
    let mut d = vec![0u8; 6];
    assert_eq!(
        reduce_in_place(ReduceOp::Sum, DataType::Float32, &mut d, &[0u8; 6]),
        Err(KernelError::PartialElement {
            len: 6,
            dtype: DataType::Float32,
            elem: 4
        })
    );
    assert_eq!(
        reduce_in_place(ReduceOp::Sum, DataType::Uint8, &mut d, &[0u8; 5]),
        Err(KernelError::LengthMismatch { dst: 6, src: 5 })
    );
    assert!(matches!(
        post_divide(DataType::Float32, &mut [0u8; 4], 2),
        Err(KernelError::WrongFamily { .. })
    ));
    assert!(matches!(
        premultiply_in_place(DataType::Int32, &mut [0u8; 4], 2),
        Err(KernelError::WrongFamily { .. })
    ));
    assert_eq!(
        post_divide(DataType::Int32, &mut [0u8; 4], 0),
        Err(KernelError::ZeroWorld)
    );
}
