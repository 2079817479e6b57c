//! Pipelined chains along the ring: broadcast and reduce.
//!
//! Broadcast passes each chunk from the root to `root+1`, which copies it
//! into place and forwards it to `root+2`, and so on; reduce runs the other
//! way round, from `root+1` toward the root, each rank folding in its own
//! input and passing the partial result on, the root folding the last.
//! With several chunks in flight every link carries data at once, so a
//! large buffer costs about one buffer time plus `world-1` chunk times
//! (NCCL's ring broadcast and reduce do the same).

use super::{Blocks, Builder, Ctx, Input, tag};
use crate::action::Rank;

/// Chain broadcast from `root`.
pub(super) fn broadcast(b: &mut Builder, ctx: &Ctx, root: Rank) {
    let n = ctx.world;
    let q = (ctx.rank + n - root) % n;
    let (input, output) = (ctx.input(), ctx.output());
    let blocks = Blocks::single(ctx.count, ctx.chunk);
    if q == 0 {
        b.copy(output.at(blocks.whole(0)), input.at(blocks.whole(0)));
        if n > 1 {
            for j in 0..blocks.rounds() {
                b.send(ctx.next(), input.at(blocks.chunk(0, j)), tag(0, j));
            }
        }
        return;
    }
    for j in 0..blocks.rounds() {
        let dst = output.at(blocks.chunk(0, j));
        b.recv_copy(ctx.prev(), dst);
        if q < n - 1 {
            b.send(ctx.next(), dst, tag(q, j));
        }
    }
}

/// Chain reduce to `root`.
pub(super) fn reduce(b: &mut Builder, ctx: &Ctx, root: Rank) {
    let n = ctx.world;
    // Position along the chain: root+1 starts (0), the root ends (n-1).
    let q = (ctx.rank + 2 * n - root - 1) % n;
    let (input, output) = (ctx.input(), ctx.output());
    let blocks = Blocks::single(ctx.count, ctx.chunk);
    if n == 1 {
        let all = blocks.whole(0);
        b.load_own(output.at(all), input.at(all));
        b.post_divide(output.at(all));
        return;
    }
    for j in 0..blocks.rounds() {
        let own = input.at(blocks.chunk(0, j));
        if q == 0 {
            b.send_own(ctx.next(), own, tag(0, j));
        } else if q < n - 1 {
            b.recv_fold_send(ctx.prev(), ctx.next(), Input::Own(own), tag(q, j));
        } else {
            let dst = output.at(blocks.chunk(0, j));
            b.recv_fold(ctx.prev(), dst, Input::Own(own));
            b.post_divide(dst);
        }
    }
}
