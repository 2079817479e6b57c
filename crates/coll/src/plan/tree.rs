//! Binomial trees: broadcast, and all-reduce as a tree reduction to rank 0
//! followed by a tree broadcast from it.
//!
//! Ranks are numbered relative to the root (`q = rank - root mod world`).
//! The parent of `q` is `q` with its lowest set bit cleared and its children
//! are `q + 1, q + 2, q + 4, ...` below that bit, so the tree is
//! `ceil(log2 world)` deep. Each chunk goes down (or up) the tree on its
//! own, so a large buffer is pipelined through the levels.

use super::{Blocks, Builder, Ctx, Input, binomial, tag};
use crate::action::Rank;

/// Tree broadcast from `root`.
pub(super) fn broadcast(b: &mut Builder, ctx: &Ctx, root: Rank) {
    let n = ctx.world;
    let q = (ctx.rank + n - root) % n;
    let real = |v: u32| (v + root) % n;
    let (input, output) = (ctx.input(), ctx.output());
    let blocks = Blocks::single(ctx.count, ctx.chunk);
    if q == 0 {
        b.copy(output.at(blocks.whole(0)), input.at(blocks.whole(0)));
    }
    let mut children = binomial::children(q, n);
    // Largest subtree first: it has the longest way to go.
    children.reverse();
    for j in 0..blocks.rounds() {
        let chunk = blocks.chunk(0, j);
        let src = if q == 0 {
            input.at(chunk)
        } else {
            b.recv_copy(real(binomial::parent(q)), output.at(chunk));
            output.at(chunk)
        };
        for &c in &children {
            b.send(real(c), src, tag(0, j));
        }
    }
}

/// Tree all-reduce: reduce up to rank 0, broadcast back down.
pub(super) fn all_reduce(b: &mut Builder, ctx: &Ctx) {
    let (n, q) = (ctx.world, ctx.rank);
    let (input, output) = (ctx.input(), ctx.output());
    let blocks = Blocks::single(ctx.count, ctx.chunk);
    b.load_own(output.at(blocks.whole(0)), input.at(blocks.whole(0)));
    let children = binomial::children(q, n);
    for j in 0..blocks.rounds() {
        let acc = output.at(blocks.chunk(0, j));
        // Up: fold every child's subtree result, smallest (earliest) first.
        for &c in &children {
            b.recv_fold(c, acc, Input::Partial(acc));
        }
        if q == 0 {
            b.post_divide(acc);
        } else {
            b.send(binomial::parent(q), acc, tag(0, j));
            // Down: the result overwrites the partial sum once that is sent.
            b.recv_copy(binomial::parent(q), acc);
        }
        for &c in children.iter().rev() {
            b.send(c, acc, tag(1, j));
        }
    }
}
