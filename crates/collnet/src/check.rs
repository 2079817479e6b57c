//! Inputs every rank can compute for every other rank, and the
//! element-by-element check of an operation's output against them.
//!
//! Element `i` of rank `q`'s input is a function of (seed, `q`, `i`) alone,
//! so a rank computes any block of any peer's input on demand and checks
//! its own output block by block without ever holding the others' buffers
//! (256 MiB × 8 ranks would not fit comfortably otherwise). The values
//! follow `metaroce_coll::testing::reference`: reductions are exact in any
//! order (small integers for sums and extrema, ±½, ±1, ±2 for products,
//! wrapping integers), except the float average at world sizes that are
//! not powers of two, compared within its tolerance.

use metaroce_coll::half::{f32_to_bf16, f32_to_f16};
use metaroce_coll::testing::reference::{fold, wrong_elements};
use metaroce_coll::{Collective, DataType, OpSpec, Rank, ReduceOp};

/// Elements checked per block.
const BLOCK_ELEMS: u64 = 1 << 14;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Writes elements `first..first + out.len()/size` of rank `rank`'s input
/// (reductions under `op` exact; `op` `None`: data only moved) into `out`.
pub fn fill_input(
    dtype: DataType,
    op: Option<ReduceOp>,
    seed: u64,
    rank: Rank,
    first: u64,
    out: &mut [u8],
) {
    let e = dtype.size_bytes();
    let base = mix(seed ^ (u64::from(rank) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for (k, x) in out.chunks_exact_mut(e).enumerate() {
        let bits = mix(base.wrapping_add((first + k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        if !dtype.is_float() || op.is_none() {
            x.copy_from_slice(&bits.to_ne_bytes()[..e]);
            continue;
        }
        let v: f32 = match op {
            Some(ReduceOp::Sum | ReduceOp::Avg) => (bits % 17) as f32 - 8.0,
            Some(ReduceOp::Prod) => [0.5, 1.0, 2.0, -0.5, -1.0, -2.0][(bits % 6) as usize],
            _ => (bits % 201) as f32 - 100.0,
        };
        match dtype {
            DataType::Float16 => x.copy_from_slice(&f32_to_f16(v).to_ne_bytes()),
            DataType::Bfloat16 => x.copy_from_slice(&f32_to_bf16(v).to_ne_bytes()),
            DataType::Float32 => x.copy_from_slice(&v.to_ne_bytes()),
            _ => x.copy_from_slice(&f64::from(v).to_ne_bytes()),
        }
    }
}

/// The operator the inputs are made for (`None`: data only moved).
fn input_op(spec: &OpSpec) -> Option<ReduceOp> {
    spec.collective.reduces().then_some(spec.op)
}

/// Elements of rank `rank`'s logical input (its out-of-place send buffer).
fn input_elems(spec: &OpSpec, rank: Rank, world: u32) -> u64 {
    let mut s = spec.clone();
    s.in_place = false;
    s.buffer_sizes(rank, world).send_bytes / spec.dtype.size_bytes() as u64
}

/// Where the input starts in the receive buffer in place, in elements.
fn in_place_input_elem(spec: &OpSpec, rank: Rank) -> u64 {
    match spec.collective {
        Collective::AllGather => u64::from(rank) * spec.count,
        _ => 0,
    }
}

/// Byte a receive buffer holds before an out-of-place operation (so stale
/// bytes count as wrong).
const STALE: u8 = 0xa5;

/// Fills `rank`'s buffers before running `spec`: the input into `send`
/// (out of place) or into its place in `recv` (in place), the rest of
/// `recv` with a stale pattern.
pub fn prepare(spec: &OpSpec, rank: Rank, world: u32, seed: u64, send: &mut [u8], recv: &mut [u8]) {
    let e = spec.dtype.size_bytes() as u64;
    let n = input_elems(spec, rank, world);
    let op = input_op(spec);
    recv.fill(STALE);
    if spec.in_place {
        let at = (in_place_input_elem(spec, rank) * e) as usize;
        let len = (n * e) as usize;
        if len > 0 {
            fill_input(spec.dtype, op, seed, rank, 0, &mut recv[at..at + len]);
        }
    } else {
        let len = (n * e) as usize;
        fill_input(spec.dtype, op, seed, rank, 0, &mut send[..len]);
    }
}

/// Elements of `recv` (rank `rank`'s receive buffer after `spec` ran with
/// inputs from [`prepare`]) that differ from the expected result.
pub fn count_wrong(spec: &OpSpec, rank: Rank, world: u32, seed: u64, recv: &[u8]) -> u64 {
    let dtype = spec.dtype;
    let e = dtype.size_bytes();
    let count = spec.count;
    let op = input_op(spec);
    let approx = (spec.collective.reduces()
        && spec.op == ReduceOp::Avg
        && dtype.is_float()
        && !world.is_power_of_two())
    .then_some(world);
    let input = |q: Rank, first: u64, n: u64| -> Vec<u8> {
        let mut v = vec![0u8; n as usize * e];
        fill_input(dtype, op, seed, q, first, &mut v);
        v
    };
    let reduced = |first: u64, n: u64| -> Vec<u8> {
        let all: Vec<Vec<u8>> = (0..world).map(|q| input(q, first, n)).collect();
        let refs: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        fold(dtype, spec.op, &refs)
    };
    let got = |at_elem: u64, n: u64| -> &[u8] {
        let a = at_elem as usize * e;
        recv.get(a..a + n as usize * e).unwrap_or(&[])
    };
    let mut wrong = 0;
    // Checks `total` output elements at `out_at`, expected block by block.
    let mut blocks = |total: u64, out_at: u64, want: &dyn Fn(u64, u64) -> Vec<u8>, approx| {
        let mut i = 0;
        while i < total {
            let n = BLOCK_ELEMS.min(total - i);
            wrong += wrong_elements(dtype, got(out_at + i, n), &want(i, n), approx);
            i += n;
        }
    };
    match &spec.collective {
        Collective::AllReduce => blocks(count, 0, &|i, n| reduced(i, n), approx),
        Collective::ReduceScatter => {
            let out_at = if spec.in_place {
                u64::from(rank) * count
            } else {
                0
            };
            let base = u64::from(rank) * count;
            blocks(count, out_at, &|i, n| reduced(base + i, n), approx);
        }
        Collective::AllGather => {
            for q in 0..world {
                blocks(count, u64::from(q) * count, &|i, n| input(q, i, n), None);
            }
        }
        Collective::AllToAll => {
            for q in 0..world {
                let from = u64::from(rank) * count;
                blocks(
                    count,
                    u64::from(q) * count,
                    &|i, n| input(q, from + i, n),
                    None,
                );
            }
        }
        Collective::Broadcast { root } => {
            let root = *root;
            blocks(count, 0, &|i, n| input(root, i, n), None);
        }
        Collective::Reduce { root } if *root == rank => {
            blocks(count, 0, &|i, n| reduced(i, n), approx);
        }
        Collective::Reduce { .. } | Collective::Barrier => {}
        Collective::SendRecv(g) => {
            for r in &g.recvs {
                // nccl-tests' pattern: the k-th send of the peer matches;
                // for the ring exchange it is the peer's whole input.
                let from = r.peer;
                blocks(r.count, r.offset, &|i, n| input(from, i, n), None);
            }
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;
    use metaroce_coll::testing::{Delivery, Payload, TestNet};
    use metaroce_coll::{CommConfig, P2pGroup};

    /// The same check as coll's reference, over the in-crate test network:
    /// every collective of the perf tool, in and out of place, is right.
    #[test]
    fn prepared_inputs_check_out_on_the_test_network() {
        let world = 3;
        let count = 1000;
        let specs: Vec<Box<dyn Fn(Rank) -> OpSpec>> = vec![
            Box::new(|_| {
                OpSpec::new(
                    Collective::AllReduce,
                    DataType::Float32,
                    ReduceOp::Avg,
                    count,
                )
            }),
            Box::new(|_| {
                OpSpec::new(
                    Collective::ReduceScatter,
                    DataType::Bfloat16,
                    ReduceOp::Prod,
                    count,
                )
            }),
            Box::new(|_| OpSpec::new(Collective::AllGather, DataType::Int8, ReduceOp::Sum, count)),
            Box::new(|_| {
                OpSpec::new(
                    Collective::AllToAll,
                    DataType::Float64,
                    ReduceOp::Sum,
                    count,
                )
            }),
            Box::new(|_| {
                OpSpec::new(
                    Collective::Broadcast { root: 1 },
                    DataType::Float16,
                    ReduceOp::Sum,
                    count,
                )
            }),
            Box::new(|_| {
                OpSpec::new(
                    Collective::Reduce { root: 2 },
                    DataType::Int64,
                    ReduceOp::Max,
                    count,
                )
            }),
            Box::new(|r| {
                OpSpec::new(
                    Collective::SendRecv(P2pGroup::ring_neighbours(r, world, count)),
                    DataType::Uint8,
                    ReduceOp::Sum,
                    count,
                )
            }),
        ];
        for spec_of in &specs {
            for in_place in [false, true] {
                let mut net = TestNet::new(
                    world,
                    CommConfig::default(),
                    Delivery::Random(3),
                    Payload::Bytes,
                )
                .unwrap();
                for r in 0..world {
                    let mut spec = spec_of(r);
                    spec.in_place = in_place;
                    let sz = spec.buffer_sizes(r, world);
                    let mut send = vec![0; sz.send_bytes as usize];
                    let mut recv = vec![0; sz.recv_bytes as usize];
                    prepare(&spec, r, world, 9, &mut send, &mut recv);
                    net.set_buffers(r, send, recv);
                    net.start(r, spec).unwrap();
                }
                net.run().unwrap();
                for r in 0..world {
                    let mut spec = spec_of(r);
                    spec.in_place = in_place;
                    let wrong = count_wrong(&spec, r, world, 9, net.buffers(r).1);
                    assert_eq!(
                        wrong, 0,
                        "{:?} in place {in_place} rank {r}",
                        spec.collective
                    );
                    // A different seed's expectation does not match.
                    if spec.count > 0
                        && !matches!(spec.collective, Collective::Reduce { root } if root != r)
                    {
                        assert!(count_wrong(&spec, r, world, 10, net.buffers(r).1) > 0);
                    }
                }
            }
        }
    }
}
