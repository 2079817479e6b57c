//! Recursive halving-doubling all-reduce (Rabenseifner's): a reduce-scatter
//! by recursive halving, then an all-gather by recursive doubling.
//!
//! Among `p` ranks (a power of two; the others fold in before and get the
//! result after, as in recursive doubling) the buffer is cut into `p`
//! blocks. In the reduce-scatter, at distance `p/2, p/4, ..., 1`, each rank
//! keeps half of the blocks it still reduces (the lower half if its bit at
//! that distance is clear), sends the other half to its partner and folds
//! the partner's copy of the half it keeps: after `log2 p` exchanges rank
//! `v` holds the full reduction of block `v`. The all-gather retraces the
//! steps at distance `1, 2, ..., p/2`, each rank sending everything it has
//! and copying in the partner's, so the ranges double back to the whole
//! buffer.
//!
//! Every rank sends `2 (p-1)/p` of the buffer, as in the ring, but in
//! `2 log2 p` steps instead of `2 (p-1)`: where each step costs more than
//! its bytes (ranks sharing cores, whose every step waits for the
//! scheduler), it is the faster of the two. The price is that a step's
//! blocks all go to one partner, with no pipelining along a ring.

use super::doubling::Pairing;
use super::{Blocks, Builder, Ctx, tag};

pub(super) fn all_reduce(b: &mut Builder, ctx: &Ctx) {
    let Some((pairing, v, whole)) = Pairing::begin(b, ctx) else {
        return;
    };
    let output = ctx.output();
    let p = pairing.p;
    let blocks = Blocks::balanced(ctx.count, p, ctx.chunk);
    // Every message of a step, in the same order on both ends: blocks in
    // ascending order, each chunk by chunk.
    let each_chunk =
        |b: &mut Builder, (lo, hi): (u32, u32), f: &mut dyn FnMut(&mut Builder, u32, u32)| {
            for blk in lo..hi {
                for j in 0..blocks.rounds() {
                    if blocks.chunk(blk, j).1 > 0 {
                        f(b, blk, j);
                    }
                }
            }
        };
    let (mut lo, mut hi) = (0u32, p);
    let mut step = 1;
    let mut mask = p / 2;
    while mask >= 1 {
        let partner = pairing.real(v ^ mask);
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if v & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let first = step == 1;
        each_chunk(b, give, &mut |b, blk, j| {
            pairing.send_chunk(b, ctx, first, partner, blocks.chunk(blk, j), tag(step, j))
        });
        each_chunk(b, keep, &mut |b, blk, j| {
            pairing.fold_chunk(b, ctx, first, partner, blocks.chunk(blk, j))
        });
        (lo, hi) = keep;
        mask /= 2;
        step += 1;
    }
    debug_assert_eq!((lo, hi), (v, v + 1));
    b.post_divide(output.at(blocks.whole(v)));
    // On symmetric buffers, with nobody paired up, each block goes straight
    // into the partner's output, where it belongs. The partner last touched
    // those bytes when it sent them to us in the reduce-scatter step of the
    // same distance (its give-half is our keep-half); nothing it does after
    // that reads or writes them (its shorter-distance all-gather steps fill
    // other blocks); and the block depends on that send, so it never lands
    // before the partner has started this operation.
    let direct = ctx.symmetric && !pairing.paired();
    let mut mask = 1;
    while mask < p {
        let partner = pairing.real(v ^ mask);
        let size = hi - lo;
        let theirs = if v & mask == 0 {
            (hi, hi + size)
        } else {
            (lo - size, lo)
        };
        each_chunk(b, (lo, hi), &mut |b, blk, j| {
            let at = output.at(blocks.chunk(blk, j));
            b.send_to(partner, at, at, direct, tag(step, j));
        });
        each_chunk(b, theirs, &mut |b, blk, j| {
            b.recv_into(partner, output.at(blocks.chunk(blk, j)), direct);
        });
        (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
        mask *= 2;
        step += 1;
    }
    pairing.hand_back(b, ctx.rank, output, &whole, step);
}
