//! Ring algorithms: reduce-scatter, all-gather, and all-reduce as the two
//! back to back.
//!
//! The data is cut into `world` blocks and each block into chunks; chunk
//! round `j` is the `j`-th chunk of every block. In one round of
//! reduce-scatter, rank `r` sends its input of block `r-1` to `r+1`
//! (step 0), then `world-2` times receives a partial sum from `r-1`, adds
//! its own input of the same block and passes the result on (steps
//! 1..world-2), and finally receives the partial sum of its own block `r`,
//! which with its own input is the full result (step world-1). Every block
//! travels `world-1` hops and every rank sends `(world-1)/world` of the data:
//! the bandwidth optimum. All-gather circulates the finished blocks the same
//! way, copying each into place and forwarding it from there.
//!
//! Rounds are written one after another and chunk-major (round 0's
//! reduce-scatter and all-gather, then round 1's), but the task graph only
//! orders what shares bytes, so round `j+1` starts as soon as staging slots
//! allow: several chunks are in flight per peer.

use super::{Area, Blocks, Builder, Ctx, Input, tag};

/// The reduce-scatter part of round `j` for blocks of `input`, ending with
/// rank's own block folded into `own_out`.
fn reduce_scatter_round(
    b: &mut Builder,
    ctx: &Ctx,
    blocks: &Blocks,
    input: Area,
    own_out: Area,
    j: u32,
) {
    let (n, r) = (ctx.world, ctx.rank);
    let (prev, next) = (ctx.prev(), ctx.next());
    let block = |s: u32| (r + 2 * n - s - 1) % n;
    b.send_own(next, input.at(blocks.chunk(block(0), j)), tag(0, j));
    for s in 1..n - 1 {
        let own = input.at(blocks.chunk(block(s), j));
        b.recv_fold_send(prev, next, Input::Own(own), tag(s, j));
    }
    let own = input.at(blocks.chunk(r, j));
    let dst = own_out.at(blocks.chunk(r, j));
    b.recv_fold(prev, dst, Input::Own(own));
    b.post_divide(dst);
}

/// The all-gather part of round `j`: rank's own chunk comes from `own_src`,
/// every block lands in `output`. Steps are numbered from `first_step`.
///
/// With `direct` (an all-reduce on symmetric buffers) each chunk is
/// written straight into the next rank's output. Every chunk of a rank's
/// output is written once, by this receive, and then only read
/// (forwarded); before it, the rank read those bytes at most in place, as
/// its own input to the reduce-scatter. A finished chunk can only come
/// after its block's reduce-scatter passed through the rank in this very
/// operation, so after that read, and after the rank started the
/// operation at all. The all-gather collective has no such order: a rank
/// may send its own block before its neighbour has even started (whose
/// driver may still be filling its buffers), so it always goes through
/// staging.
#[allow(clippy::too_many_arguments)]
fn all_gather_round(
    b: &mut Builder,
    ctx: &Ctx,
    blocks: &Blocks,
    own_src: Area,
    output: Area,
    j: u32,
    first_step: u32,
    direct: bool,
) {
    let (n, r) = (ctx.world, ctx.rank);
    let (prev, next) = (ctx.prev(), ctx.next());
    let own = blocks.chunk(r, j);
    b.send_to(
        next,
        own_src.at(own),
        output.at(own),
        direct,
        tag(first_step, j),
    );
    for s in 1..n {
        let dst = output.at(blocks.chunk((r + n - s) % n, j));
        b.recv_into(prev, dst, direct);
        if s < n - 1 {
            b.send_to(next, dst, dst, direct, tag(first_step + s, j));
        }
    }
}

/// Ring all-reduce: balanced blocks of the `count`-element buffer.
pub(super) fn all_reduce(b: &mut Builder, ctx: &Ctx) {
    let (input, output) = (ctx.input(), ctx.output());
    if ctx.world == 1 {
        let all = (0, ctx.count);
        b.load_own(output.at(all), input.at(all));
        b.post_divide(output.at(all));
        return;
    }
    let blocks = Blocks::balanced(ctx.count, ctx.world, ctx.chunk);
    for j in 0..blocks.rounds() {
        reduce_scatter_round(b, ctx, &blocks, input, output, j);
        all_gather_round(
            b,
            ctx,
            &blocks,
            output,
            output,
            j,
            ctx.world - 1,
            ctx.symmetric,
        );
    }
}

/// Ring reduce-scatter: rank `r` gets block `r` of the reduction.
pub(super) fn reduce_scatter(b: &mut Builder, ctx: &Ctx) {
    let input = ctx.input();
    // Out of place the output is its own buffer; in place it is block
    // `rank` of the input.
    let out_base = if ctx.in_place {
        u64::from(ctx.rank) * ctx.count * ctx.elem
    } else {
        0
    };
    // Shift the output area so that block `rank`'s element range lands at
    // out_base.
    let own_start = u64::from(ctx.rank) * ctx.count * ctx.elem;
    let output = Area {
        base: out_base.wrapping_sub(own_start),
        ..ctx.output()
    };
    let blocks = Blocks::equal(ctx.count, ctx.world, ctx.chunk);
    if ctx.world == 1 {
        let all = blocks.whole(0);
        b.load_own(output.at(all), input.at(all));
        b.post_divide(output.at(all));
        return;
    }
    for j in 0..blocks.rounds() {
        reduce_scatter_round(b, ctx, &blocks, input, output, j);
    }
}

/// Ring all-gather: every rank gets every block.
pub(super) fn all_gather(b: &mut Builder, ctx: &Ctx) {
    let output = ctx.output();
    let blocks = Blocks::equal(ctx.count, ctx.world, ctx.chunk);
    // The input is one block: shift it so block `rank`'s range maps onto it.
    let own_start = u64::from(ctx.rank) * ctx.count * ctx.elem;
    let input = if ctx.in_place {
        output
    } else {
        Area {
            base: 0u64.wrapping_sub(own_start),
            ..ctx.input()
        }
    };
    b.copy(
        output.at(blocks.whole(ctx.rank)),
        input.at(blocks.whole(ctx.rank)),
    );
    if ctx.world == 1 {
        return;
    }
    for j in 0..blocks.rounds() {
        all_gather_round(b, ctx, &blocks, input, output, j, 0, false);
    }
}
