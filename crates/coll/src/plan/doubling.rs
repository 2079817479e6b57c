//! Recursive doubling all-reduce, for small buffers.
//!
//! With `p` the largest power of two not above `world` and `rem = world - p`,
//! the first `2 rem` ranks pair up before the main exchange: each even rank
//! of them sends its buffer to the odd one above it and sits out; the odd
//! one folds it in and takes part on behalf of both. The `p` remaining
//! ranks, renumbered `0..p`, then exchange their whole buffer `log2 p`
//! times with the partner at distance 1, 2, 4, ... and fold what they
//! receive. Finally each odd rank of the first `2 rem` hands the result to
//! its even partner. Latency is `log2 p` exchanges (+2 when `world` is not a
//! power of two) at the cost of sending the whole buffer each time, which is
//! why it serves only small buffers.
//!
//! Both partners of an exchange compute `mine ⊕ theirs` in opposite operand
//! orders; the kernels are commutative bit for bit (see [`crate::kernels`]),
//! so every rank ends with identical bytes.

use super::{Blocks, Builder, Ctx, Input, tag};

pub(super) fn all_reduce(b: &mut Builder, ctx: &Ctx) {
    let (n, r) = (ctx.world, ctx.rank);
    let (input, output) = (ctx.input(), ctx.output());
    let blocks = Blocks::single(ctx.count, ctx.chunk);
    let all = blocks.whole(0);
    // Work in the output buffer from the start.
    b.load_own(output.at(all), input.at(all));
    let chunks = |b: &mut Builder, f: &mut dyn FnMut(&mut Builder, u32)| {
        for j in 0..blocks.rounds() {
            f(b, j);
        }
    };
    let p = if n.is_power_of_two() {
        n
    } else {
        n.next_power_of_two() / 2
    };
    let rem = n - p;
    // Pre-step: fold pairs below 2·rem.
    let new_rank = if r < 2 * rem {
        if r % 2 == 0 {
            chunks(b, &mut |b, j| {
                b.send(r + 1, output.at(blocks.chunk(0, j)), tag(0, j))
            });
            None
        } else {
            chunks(b, &mut |b, j| {
                let acc = output.at(blocks.chunk(0, j));
                b.recv_fold(r - 1, acc, Input::Partial(acc));
            });
            Some(r / 2)
        }
    } else {
        Some(r - rem)
    };
    if let Some(v) = new_rank {
        let real = |v: u32| if v < rem { 2 * v + 1 } else { v + rem };
        let mut mask = 1;
        let mut step = 1;
        while mask < p {
            let partner = real(v ^ mask);
            chunks(b, &mut |b, j| {
                let acc = output.at(blocks.chunk(0, j));
                b.send(partner, acc, tag(step, j));
                b.recv_fold(partner, acc, Input::Partial(acc));
            });
            mask <<= 1;
            step += 1;
        }
        b.post_divide(output.at(all));
        if r < 2 * rem {
            chunks(b, &mut |b, j| {
                b.send(r - 1, output.at(blocks.chunk(0, j)), tag(step, j))
            });
        }
    } else {
        chunks(b, &mut |b, j| {
            b.recv_copy(r + 1, output.at(blocks.chunk(0, j)))
        });
    }
}
