//! Reduction kernels over byte slices, the element type chosen at run time.
//!
//! Every kernel walks its slices with `chunks_exact` of the element size and
//! converts each element with `from_ne_bytes` / `to_ne_bytes`, a shape the
//! compiler vectorizes; there is no `unsafe` and no alignment requirement.
//! One monomorphic loop exists per (type, operator), chosen by a `match`
//! outside the loop.
//!
//! Semantics, per element:
//! - integers: `sum` and `prod` wrap (two's complement), `max` / `min` are
//!   the usual order;
//! - floats: IEEE arithmetic in the element's precision (half and bfloat16
//!   in f32, rounded back once to nearest-even: see [`crate::half`]);
//!   overflow gives ±infinity, `inf - inf` and `0 × inf` give NaN;
//! - `max` / `min` on floats follow IEEE maxNum / minNum (C's `fmax`, CUDA's
//!   `__hmax`): a NaN operand is ignored unless both are NaN; `max(+0, -0)`
//!   is `+0` and `min(+0, -0)` is `-0` whatever the operand order;
//! - every NaN a kernel *produces* is the canonical quiet NaN of its type
//!   (f32 `0x7fc00000`, f64 `0x7ff8000000000000`, half `0x7e00`, bfloat16
//!   `0x7fc0`). Every kernel is therefore commutative bit for bit, so ranks
//!   that combine the same two operands in opposite orders (recursive
//!   doubling does) still end with identical bytes.
//!
//! Average ([`ReduceOp::Avg`]) is NCCL's `ncclAvg`:
//! - integer types sum with wrapping and then divide the sum once by the
//!   world size ([`post_divide`]), truncating toward zero (`-7 / 2 = -3`);
//! - floating-point types first multiply every rank's input by
//!   `1/world` rounded to the element type ([`premultiply`]; f32 and the
//!   16-bit types take `(1.0f64 / world) as f32`, rounded again to half or
//!   bfloat16) and then sum. The result is therefore not always the
//!   correctly rounded mean: for world sizes that are not powers of two
//!   `1/world` is inexact, each product rounds, and the sum rounds once per
//!   step; for powers of two the scaling is exact (barring underflow).
//!
//! Both binary kernels accept `Avg` and combine like `Sum`.

use crate::datatype::{DataType, ReduceOp};
use crate::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// Why a kernel refused its arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// Operand slices of different lengths.
    #[error("operand lengths differ: {dst} bytes and {src} bytes")]
    LengthMismatch {
        /// Destination length in bytes.
        dst: usize,
        /// Mismatched source length in bytes.
        src: usize,
    },
    /// A length that is not a whole number of elements.
    #[error("{len} bytes is not a whole number of {dtype} elements ({elem} bytes each)")]
    PartialElement {
        /// Offending length in bytes.
        len: usize,
        /// Element type.
        dtype: DataType,
        /// Element size in bytes.
        elem: usize,
    },
    /// Pre-multiplication asked for an integer type or post-division for a
    /// floating-point one (NCCL averages the two families differently).
    #[error("{what} does not apply to {dtype}")]
    WrongFamily {
        /// Which kernel.
        what: &'static str,
        /// Element type.
        dtype: DataType,
    },
    /// A world size of zero.
    #[error("the world size must be at least 1")]
    ZeroWorld,
}

/// One element type's storage and arithmetic.
trait Elem: Copy {
    const SIZE: usize;
    fn load(bytes: &[u8]) -> Self;
    fn store(self, bytes: &mut [u8]);
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = size_of::<$t>();
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                let mut a = [0u8; size_of::<$t>()];
                a.copy_from_slice(bytes);
                <$t>::from_ne_bytes(a)
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            const SIZE: usize = size_of::<$t>();
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                let mut a = [0u8; size_of::<$t>()];
                a.copy_from_slice(bytes);
                <$t>::from_ne_bytes(a)
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                canonical(a + b)
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                canonical(a * b)
            }
            // maxNum / minNum written as selects (no branches, so the loop
            // vectorizes): a NaN loses to a number, two NaNs give the
            // canonical NaN, and equal operands (+0 and -0 among them)
            // combine their bits so that max prefers +0 and min -0.
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                let m = if a > b || b.is_nan() { a } else { b };
                let m = if a == b {
                    <$t>::from_bits(a.to_bits() & b.to_bits())
                } else {
                    m
                };
                canonical(m)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                let m = if a < b || b.is_nan() { a } else { b };
                let m = if a == b {
                    <$t>::from_bits(a.to_bits() | b.to_bits())
                } else {
                    m
                };
                canonical(m)
            }
        }
    };
}
float_elem!(f32);
float_elem!(f64);

/// Replaces any NaN by the canonical quiet NaN of its type.
trait Canonical {
    fn canonical(self) -> Self;
}
impl Canonical for f32 {
    #[inline(always)]
    fn canonical(self) -> Self {
        if self.is_nan() { Self::NAN } else { self }
    }
}
impl Canonical for f64 {
    #[inline(always)]
    fn canonical(self) -> Self {
        if self.is_nan() { Self::NAN } else { self }
    }
}
#[inline(always)]
fn canonical<T: Canonical>(x: T) -> T {
    x.canonical()
}

/// Half and bfloat16: stored as bits, computed through f32.
macro_rules! narrow_elem {
    ($name:ident, $to:ident, $from:ident) => {
        #[derive(Clone, Copy)]
        struct $name(u16);
        impl Elem for $name {
            const SIZE: usize = 2;
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                Self(u16::from_ne_bytes([bytes[0], bytes[1]]))
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.0.to_ne_bytes());
            }
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                Self($from(<f32 as Elem>::sum($to(a.0), $to(b.0))))
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                Self($from(<f32 as Elem>::prod($to(a.0), $to(b.0))))
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Self($from(<f32 as Elem>::max($to(a.0), $to(b.0))))
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Self($from(<f32 as Elem>::min($to(a.0), $to(b.0))))
            }
        }
    };
}
narrow_elem!(F16, f16_to_f32, f32_to_f16);
narrow_elem!(Bf16, bf16_to_f32, f32_to_bf16);

#[inline(always)]
fn fold_in_place<T: Elem>(dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.chunks_exact_mut(T::SIZE).zip(src.chunks_exact(T::SIZE)) {
        f(T::load(d), T::load(s)).store(d);
    }
}

#[inline(always)]
fn fold_to<T: Elem>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(T, T) -> T) {
    for ((d, x), y) in dst
        .chunks_exact_mut(T::SIZE)
        .zip(a.chunks_exact(T::SIZE))
        .zip(b.chunks_exact(T::SIZE))
    {
        f(T::load(x), T::load(y)).store(d);
    }
}

/// Elements per block in the 16-bit kernels: decoded into f32 arrays,
/// combined, encoded back. Fixed-size arrays let the compiler vectorize the
/// conversions, which it does not do element by element.
const NARROW_BLOCK: usize = 16;

/// A 16-bit float format.
trait Narrow: Elem {
    fn widen(bits: u16) -> f32;
    fn narrow(x: f32) -> u16;
}
impl Narrow for F16 {
    #[inline(always)]
    fn widen(bits: u16) -> f32 {
        f16_to_f32(bits)
    }
    #[inline(always)]
    fn narrow(x: f32) -> u16 {
        f32_to_f16(x)
    }
}
impl Narrow for Bf16 {
    #[inline(always)]
    fn widen(bits: u16) -> f32 {
        bf16_to_f32(bits)
    }
    #[inline(always)]
    fn narrow(x: f32) -> u16 {
        f32_to_bf16(x)
    }
}

#[inline(always)]
fn widen_block<N: Narrow>(bytes: &[u8]) -> [f32; NARROW_BLOCK] {
    let mut out = [0f32; NARROW_BLOCK];
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = N::widen(u16::from_ne_bytes([b[0], b[1]]));
    }
    out
}

#[inline(always)]
fn narrow_block<N: Narrow>(x: [f32; NARROW_BLOCK], bytes: &mut [u8]) {
    let mut bits = [0u16; NARROW_BLOCK];
    for (b, v) in bits.iter_mut().zip(x) {
        *b = N::narrow(v);
    }
    for (d, b) in bytes.chunks_exact_mut(2).zip(bits) {
        d.copy_from_slice(&b.to_ne_bytes());
    }
}

/// `dst ← a ⊕ b` for a 16-bit format, `a` being `dst` itself when `None`.
#[inline(always)]
fn fold_narrow<N: Narrow>(dst: &mut [u8], a: Option<&[u8]>, b: &[u8], f: impl Fn(f32, f32) -> f32) {
    let block = 2 * NARROW_BLOCK;
    let whole = dst.len() / block * block;
    let (dst_blocks, dst_tail) = dst.split_at_mut(whole);
    let (b_blocks, b_tail) = b.split_at(whole);
    for (i, (d, y)) in dst_blocks
        .chunks_exact_mut(block)
        .zip(b_blocks.chunks_exact(block))
        .enumerate()
    {
        let x = match a {
            Some(a) => widen_block::<N>(&a[i * block..(i + 1) * block]),
            None => widen_block::<N>(d),
        };
        let y = widen_block::<N>(y);
        let mut r = [0f32; NARROW_BLOCK];
        for ((r, x), y) in r.iter_mut().zip(x).zip(y) {
            *r = f(x, y);
        }
        narrow_block::<N>(r, d);
    }
    // The last partial block, element by element.
    let a_tail = a.map(|a| &a[whole..]);
    for (i, (d, y)) in dst_tail
        .chunks_exact_mut(2)
        .zip(b_tail.chunks_exact(2))
        .enumerate()
    {
        let x = match a_tail {
            Some(a) => u16::from_ne_bytes([a[2 * i], a[2 * i + 1]]),
            None => u16::from_ne_bytes([d[0], d[1]]),
        };
        let r = f(N::widen(x), N::widen(u16::from_ne_bytes([y[0], y[1]])));
        d.copy_from_slice(&N::narrow(r).to_ne_bytes());
    }
}

fn narrow_typed<N: Narrow>(op: ReduceOp, dst: &mut [u8], a: Option<&[u8]>, b: &[u8]) {
    match op.combiner() {
        ReduceOp::Sum | ReduceOp::Avg => fold_narrow::<N>(dst, a, b, <f32 as Elem>::sum),
        ReduceOp::Prod => fold_narrow::<N>(dst, a, b, <f32 as Elem>::prod),
        ReduceOp::Max => fold_narrow::<N>(dst, a, b, <f32 as Elem>::max),
        ReduceOp::Min => fold_narrow::<N>(dst, a, b, <f32 as Elem>::min),
    }
}

fn in_place_typed<T: Elem>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    match op.combiner() {
        ReduceOp::Sum | ReduceOp::Avg => fold_in_place(dst, src, T::sum),
        ReduceOp::Prod => fold_in_place(dst, src, T::prod),
        ReduceOp::Max => fold_in_place(dst, src, T::max),
        ReduceOp::Min => fold_in_place(dst, src, T::min),
    }
}

fn to_typed<T: Elem>(op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    match op.combiner() {
        ReduceOp::Sum | ReduceOp::Avg => fold_to(dst, a, b, T::sum),
        ReduceOp::Prod => fold_to(dst, a, b, T::prod),
        ReduceOp::Max => fold_to(dst, a, b, T::max),
        ReduceOp::Min => fold_to(dst, a, b, T::min),
    }
}

fn check_len(dtype: DataType, len: usize) -> Result<(), KernelError> {
    let elem = dtype.size_bytes();
    if !len.is_multiple_of(elem) {
        return Err(KernelError::PartialElement { len, dtype, elem });
    }
    Ok(())
}

fn check_same(dst: usize, src: usize) -> Result<(), KernelError> {
    if dst != src {
        return Err(KernelError::LengthMismatch { dst, src });
    }
    Ok(())
}

/// `dst[i] = dst[i] ⊕ src[i]` for every element.
pub fn reduce_in_place(
    op: ReduceOp,
    dtype: DataType,
    dst: &mut [u8],
    src: &[u8],
) -> Result<(), KernelError> {
    check_same(dst.len(), src.len())?;
    check_len(dtype, dst.len())?;
    match dtype {
        DataType::Int8 => in_place_typed::<i8>(op, dst, src),
        DataType::Uint8 => in_place_typed::<u8>(op, dst, src),
        DataType::Int32 => in_place_typed::<i32>(op, dst, src),
        DataType::Uint32 => in_place_typed::<u32>(op, dst, src),
        DataType::Int64 => in_place_typed::<i64>(op, dst, src),
        DataType::Uint64 => in_place_typed::<u64>(op, dst, src),
        DataType::Float16 => narrow_typed::<F16>(op, dst, None, src),
        DataType::Float32 => in_place_typed::<f32>(op, dst, src),
        DataType::Float64 => in_place_typed::<f64>(op, dst, src),
        DataType::Bfloat16 => narrow_typed::<Bf16>(op, dst, None, src),
    }
    Ok(())
}

/// `dst[i] = a[i] ⊕ b[i]` for every element (three distinct slices; for
/// `dst` aliasing `a` use [`reduce_in_place`]).
pub fn reduce(
    op: ReduceOp,
    dtype: DataType,
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
) -> Result<(), KernelError> {
    check_same(dst.len(), a.len())?;
    check_same(dst.len(), b.len())?;
    check_len(dtype, dst.len())?;
    match dtype {
        DataType::Int8 => to_typed::<i8>(op, dst, a, b),
        DataType::Uint8 => to_typed::<u8>(op, dst, a, b),
        DataType::Int32 => to_typed::<i32>(op, dst, a, b),
        DataType::Uint32 => to_typed::<u32>(op, dst, a, b),
        DataType::Int64 => to_typed::<i64>(op, dst, a, b),
        DataType::Uint64 => to_typed::<u64>(op, dst, a, b),
        DataType::Float16 => narrow_typed::<F16>(op, dst, Some(a), b),
        DataType::Float32 => to_typed::<f32>(op, dst, a, b),
        DataType::Float64 => to_typed::<f64>(op, dst, a, b),
        DataType::Bfloat16 => narrow_typed::<Bf16>(op, dst, Some(a), b),
    }
    Ok(())
}

/// The factor [`premultiply`] applies: `1/world` rounded to `dtype`, as raw
/// native-endian bytes of one element. `None` for integer types.
pub fn avg_scale_bytes(dtype: DataType, world: u32) -> Option<Vec<u8>> {
    let inv = 1.0f64 / f64::from(world.max(1));
    match dtype {
        DataType::Float16 => Some(f32_to_f16(inv as f32).to_ne_bytes().to_vec()),
        DataType::Bfloat16 => Some(f32_to_bf16(inv as f32).to_ne_bytes().to_vec()),
        DataType::Float32 => Some((inv as f32).to_ne_bytes().to_vec()),
        DataType::Float64 => Some(inv.to_ne_bytes().to_vec()),
        _ => None,
    }
}

fn scale_typed<T: Elem>(dst: &mut [u8], src: Option<&[u8]>, k: T) {
    match src {
        Some(src) => {
            for (d, s) in dst.chunks_exact_mut(T::SIZE).zip(src.chunks_exact(T::SIZE)) {
                T::prod(T::load(s), k).store(d);
            }
        }
        None => {
            for d in dst.chunks_exact_mut(T::SIZE) {
                T::prod(T::load(d), k).store(d);
            }
        }
    }
}

fn premultiply_inner(
    dtype: DataType,
    dst: &mut [u8],
    src: Option<&[u8]>,
    world: u32,
) -> Result<(), KernelError> {
    if world == 0 {
        return Err(KernelError::ZeroWorld);
    }
    if let Some(src) = src {
        check_same(dst.len(), src.len())?;
    }
    check_len(dtype, dst.len())?;
    let Some(k) = avg_scale_bytes(dtype, world) else {
        return Err(KernelError::WrongFamily {
            what: "pre-multiplication (float average)",
            dtype,
        });
    };
    match dtype {
        DataType::Float16 => scale_typed(dst, src, F16::load(&k)),
        DataType::Bfloat16 => scale_typed(dst, src, Bf16::load(&k)),
        DataType::Float32 => scale_typed(dst, src, f32::load(&k)),
        DataType::Float64 => scale_typed(dst, src, f64::load(&k)),
        _ => unreachable!("avg_scale_bytes returned Some for an integer type"),
    }
    Ok(())
}

/// `dst[i] = src[i] × (1/world)` for a floating-point type: the first half
/// of a float average.
pub fn premultiply(
    dtype: DataType,
    dst: &mut [u8],
    src: &[u8],
    world: u32,
) -> Result<(), KernelError> {
    premultiply_inner(dtype, dst, Some(src), world)
}

/// [`premultiply`] with the destination as its own source.
pub fn premultiply_in_place(
    dtype: DataType,
    data: &mut [u8],
    world: u32,
) -> Result<(), KernelError> {
    premultiply_inner(dtype, data, None, world)
}

macro_rules! divide_each {
    ($data:expr, $t:ty, $wide:ty, $n:expr) => {
        for d in $data.chunks_exact_mut(size_of::<$t>()) {
            let x = <$t as Elem>::load(d) as $wide;
            // Rust's integer division truncates toward zero, like NCCL's.
            ((x / $n as $wide) as $t).store(d);
        }
    };
}

/// `data[i] = data[i] / world` for an integer type, truncating toward zero:
/// the second half of an integer average.
pub fn post_divide(dtype: DataType, data: &mut [u8], world: u32) -> Result<(), KernelError> {
    if world == 0 {
        return Err(KernelError::ZeroWorld);
    }
    check_len(dtype, data.len())?;
    match dtype {
        DataType::Int8 => divide_each!(data, i8, i64, world),
        DataType::Uint8 => divide_each!(data, u8, u64, world),
        DataType::Int32 => divide_each!(data, i32, i64, world),
        DataType::Uint32 => divide_each!(data, u32, u64, world),
        DataType::Int64 => divide_each!(data, i64, i64, world),
        DataType::Uint64 => divide_each!(data, u64, u64, world),
        _ => {
            return Err(KernelError::WrongFamily {
                what: "post-division (integer average)",
                dtype,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
