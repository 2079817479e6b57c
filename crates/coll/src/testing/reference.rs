//! Inputs with exact reductions, the expected result of every collective
//! computed locally, and an end-to-end check.
//!
//! Floating-point reductions depend on the order of their operands, which
//! differs between algorithms (a ring folds block `b` starting at rank
//! `b+1`, recursive doubling in pairs). The inputs are chosen so that every
//! order gives the same bits: small integers for sums and extrema, ±½, ±1,
//! ±2 for products, all far from rounding in every type. Integers wrap, so
//! any bits do. Only the float average at world sizes that are not powers
//! of two rounds (`1/world` is inexact); it is compared with a tolerance of
//! `16 · world · ε` of its type. Every other element must match bit for
//! bit, and every all-reduce output must be identical on all ranks.

use super::{Delivery, NetError, Payload, SplitMix64, TestNet};
use crate::action::Rank;
use crate::comm::CommStats;
use crate::datatype::{DataType, ReduceOp};
use crate::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::kernels;
use crate::spec::{Collective, CommConfig, OpSpec};

/// `count` elements of `dtype` whose reduction under `op` is exact in any
/// order (`op` `None`: data that is only moved), drawn from `seed`.
pub fn exact_inputs(dtype: DataType, op: Option<ReduceOp>, count: u64, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let e = dtype.size_bytes();
    let mut out = Vec::with_capacity(count as usize * e);
    for _ in 0..count {
        let bits = rng.next_u64();
        if !dtype.is_float() || op.is_none() {
            // Wrapping integers, or data that is only moved: any bits.
            out.extend_from_slice(&bits.to_ne_bytes()[..e]);
            continue;
        }
        let v: f32 = match op {
            Some(ReduceOp::Sum | ReduceOp::Avg) => (bits % 17) as f32 - 8.0,
            Some(ReduceOp::Prod) => [0.5, 1.0, 2.0, -0.5, -1.0, -2.0][(bits % 6) as usize],
            _ => (bits % 201) as f32 - 100.0,
        };
        match dtype {
            DataType::Float16 => out.extend_from_slice(&f32_to_f16(v).to_ne_bytes()),
            DataType::Bfloat16 => out.extend_from_slice(&f32_to_bf16(v).to_ne_bytes()),
            DataType::Float32 => out.extend_from_slice(&v.to_ne_bytes()),
            _ => out.extend_from_slice(&f64::from(v).to_ne_bytes()),
        }
    }
    out
}

/// The reduction of `inputs` (all the same length) under `op`, rank 0 first.
pub fn fold(dtype: DataType, op: ReduceOp, inputs: &[&[u8]]) -> Vec<u8> {
    let world = inputs.len() as u32;
    let scale = op == ReduceOp::Avg && dtype.is_float();
    let load = |x: &[u8]| {
        let mut v = x.to_vec();
        if scale {
            kernels::premultiply_in_place(dtype, &mut v, world).expect("whole elements");
        }
        v
    };
    let mut acc = load(inputs[0]);
    for x in &inputs[1..] {
        kernels::reduce_in_place(op, dtype, &mut acc, &load(x)).expect("same lengths");
    }
    if op == ReduceOp::Avg && !dtype.is_float() {
        kernels::post_divide(dtype, &mut acc, world).expect("whole elements");
    }
    acc
}

/// Bytes of the logical input of `spec` on `rank` (the out-of-place send buffer).
fn input_bytes(spec: &OpSpec, rank: Rank, world: u32) -> u64 {
    let mut s = spec.clone();
    s.in_place = false;
    s.buffer_sizes(rank, world).send_bytes
}

/// Where the input sits in the receive buffer in place.
fn in_place_offset(spec: &OpSpec, rank: Rank) -> u64 {
    match spec.collective {
        Collective::AllGather => u64::from(rank) * spec.count * spec.dtype.size_bytes() as u64,
        _ => 0,
    }
}

/// The receive buffer every rank should end with, given each rank's input
/// and receive buffer before the operation.
pub fn expected_outputs(specs: &[OpSpec], inputs: &[Vec<u8>], before: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let world = specs.len() as u32;
    let s0 = &specs[0];
    let e = s0.dtype.size_bytes();
    let c = s0.count as usize * e;
    let all: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let mut out: Vec<Vec<u8>> = before.to_vec();
    match &s0.collective {
        Collective::AllReduce => {
            let r = fold(s0.dtype, s0.op, &all);
            out.iter_mut().for_each(|o| o.copy_from_slice(&r));
        }
        Collective::ReduceScatter => {
            let r = fold(s0.dtype, s0.op, &all);
            for (q, o) in out.iter_mut().enumerate() {
                let off = if s0.in_place { q * c } else { 0 };
                o[off..off + c].copy_from_slice(&r[q * c..(q + 1) * c]);
            }
        }
        Collective::AllGather => {
            let cat = inputs.concat();
            out.iter_mut().for_each(|o| o.copy_from_slice(&cat));
        }
        Collective::AllToAll => {
            for (q, o) in out.iter_mut().enumerate() {
                for (p, x) in inputs.iter().enumerate() {
                    o[p * c..(p + 1) * c].copy_from_slice(&x[q * c..(q + 1) * c]);
                }
            }
        }
        Collective::Broadcast { root } => {
            let x = &inputs[*root as usize];
            out.iter_mut().for_each(|o| o.copy_from_slice(x));
        }
        Collective::Reduce { root } => {
            out[*root as usize] = fold(s0.dtype, s0.op, &all);
        }
        Collective::Barrier => {}
        Collective::SendRecv(_) => {
            for (q, o) in out.iter_mut().enumerate() {
                let Collective::SendRecv(mine) = &specs[q].collective else {
                    continue;
                };
                let mut seen = vec![0usize; world as usize];
                for r in &mine.recvs {
                    let Collective::SendRecv(theirs) = &specs[r.peer as usize].collective else {
                        continue;
                    };
                    let k = seen[r.peer as usize];
                    seen[r.peer as usize] += 1;
                    let Some(s) = theirs.sends.iter().filter(|s| s.peer as usize == q).nth(k)
                    else {
                        continue;
                    };
                    let src =
                        &inputs[r.peer as usize][s.offset as usize * e..][..s.count as usize * e];
                    o[r.offset as usize * e..][..r.count as usize * e].copy_from_slice(src);
                }
            }
        }
    }
    out
}

/// Elements of `got` that differ from `want` (bitwise, or within the float
/// average's tolerance when `approx`).
pub fn wrong_elements(dtype: DataType, got: &[u8], want: &[u8], approx_world: Option<u32>) -> u64 {
    let e = dtype.size_bytes();
    if got.len() != want.len() {
        return (got.len().max(want.len()) / e) as u64;
    }
    let decode = |x: &[u8]| -> f64 {
        match dtype {
            DataType::Float16 => f64::from(f16_to_f32(u16::from_ne_bytes([x[0], x[1]]))),
            DataType::Bfloat16 => f64::from(bf16_to_f32(u16::from_ne_bytes([x[0], x[1]]))),
            DataType::Float32 => f64::from(f32::from_ne_bytes(x.try_into().expect("4 bytes"))),
            _ => f64::from_ne_bytes(x.try_into().expect("8 bytes")),
        }
    };
    let eps = match dtype {
        DataType::Float16 => 2f64.powi(-10),
        DataType::Bfloat16 => 2f64.powi(-7),
        DataType::Float32 => 2f64.powi(-23),
        _ => 2f64.powi(-52),
    };
    got.chunks_exact(e)
        .zip(want.chunks_exact(e))
        .filter(|(g, w)| match approx_world {
            Some(n) if g != w => (decode(g) - decode(w)).abs() > 16.0 * f64::from(n) * eps,
            _ => g != w,
        })
        .count() as u64
}

/// The outcome of one [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// Elements differing from the reference, summed over ranks (nccl-tests' `#wrong`).
    pub wrong: u64,
    /// Events the network processed.
    pub events: u64,
    /// Each rank's communicator counters.
    pub stats: Vec<CommStats>,
}

/// Runs `spec_of(rank)` on a fresh network of `world` ranks with exact
/// inputs drawn from `seed`, and compares every rank's output with the
/// reference. A network error (deadlock, protocol violation, contract
/// breach) is an `Err`.
pub fn check(
    world: u32,
    config: CommConfig,
    spec_of: &dyn Fn(Rank) -> OpSpec,
    delivery: Delivery,
    seed: u64,
) -> Result<CheckReport, NetError> {
    let specs: Vec<OpSpec> = (0..world).map(spec_of).collect();
    let mut net = TestNet::new(world, config, delivery, Payload::Bytes)
        .map_err(|error| NetError::Comm { rank: 0, error })?;
    let mut inputs = Vec::new();
    let mut before = Vec::new();
    let mut sends = Vec::new();
    for (r, spec) in specs.iter().enumerate() {
        let r = r as Rank;
        let e = spec.dtype.size_bytes() as u64;
        let op = spec.collective.reduces().then_some(spec.op);
        let rank_seed = seed.wrapping_mul(0x9e37_79b9).wrapping_add(u64::from(r));
        let input = exact_inputs(spec.dtype, op, input_bytes(spec, r, world) / e, rank_seed);
        let sizes = spec.buffer_sizes(r, world);
        let mut recv: Vec<u8> = (0..sizes.recv_bytes).map(|i| 0xa5 ^ (i as u8)).collect();
        let send = if spec.in_place {
            let off = in_place_offset(spec, r) as usize;
            if !input.is_empty() {
                recv[off..off + input.len()].copy_from_slice(&input);
            }
            Vec::new()
        } else {
            input.clone()
        };
        before.push(recv.clone());
        sends.push(send.clone());
        inputs.push(input);
        net.set_buffers(r, send, recv);
    }
    let want = expected_outputs(&specs, &inputs, &before);
    for (r, spec) in specs.iter().enumerate() {
        net.start(r as Rank, spec.clone())?;
    }
    net.run()?;
    let s0 = &specs[0];
    let approx = (s0.collective.reduces()
        && s0.op == ReduceOp::Avg
        && s0.dtype.is_float()
        && !world.is_power_of_two())
    .then_some(world);
    let mut wrong = 0;
    for (r, w) in want.iter().enumerate() {
        let (send, recv) = net.buffers(r as Rank);
        wrong += wrong_elements(s0.dtype, recv, w, approx);
        // The input is never written.
        wrong += wrong_elements(s0.dtype, send, &sends[r], None);
    }
    if s0.collective == Collective::AllReduce {
        let first = net.buffers(0).1.to_vec();
        for r in 1..world {
            wrong += wrong_elements(s0.dtype, net.buffers(r).1, &first, None);
        }
    }
    Ok(CheckReport {
        wrong,
        events: net.events_run(),
        stats: (0..world).map(|r| net.stats(r)).collect(),
    })
}
