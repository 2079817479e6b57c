//! Direct exchanges: all-to-all, the dissemination barrier, and groups of
//! point-to-point transfers.

use super::{Area, Blocks, Builder, Ctx, tag};
use crate::spec::{P2pGroup, SpecError};

/// All-to-all: block `q` of the input goes to rank `q`, block `q` of the
/// output comes from it.
///
/// All sends are written before all receives. Out of place the order is
/// immaterial; in place it is what makes it correct: the receive into block
/// `q` then comes after the send of block `q` in program order, so it waits
/// until that send no longer needs the bytes.
pub(super) fn all_to_all(b: &mut Builder, ctx: &Ctx) {
    let (n, r) = (ctx.world, ctx.rank);
    let (input, output) = (ctx.input(), ctx.output());
    let blocks = Blocks::equal(ctx.count, n, ctx.chunk);
    b.copy(output.at(blocks.whole(r)), input.at(blocks.whole(r)));
    // Peers in pairwise order (r+1, r+2, ...), so that at any moment the
    // ranks send to different targets.
    for k in 1..n {
        let to = (r + k) % n;
        for j in 0..blocks.rounds() {
            b.send(to, input.at(blocks.chunk(to, j)), tag(k, j));
        }
    }
    for k in 1..n {
        let from = (r + n - k) % n;
        for j in 0..blocks.rounds() {
            b.recv_copy(from, output.at(blocks.chunk(from, j)));
        }
    }
}

/// Dissemination barrier: in round `k` every rank signals `rank + 2^k` and
/// waits for `rank - 2^k`; after `ceil(log2 world)` rounds each rank has
/// heard, directly or through others, from every rank.
pub(super) fn barrier(b: &mut Builder, ctx: &Ctx) {
    let (n, r) = (ctx.world, ctx.rank);
    let mut after: Vec<u32> = Vec::new();
    let mut dist = 1u32;
    let mut round = 0;
    while dist < n {
        b.signal((r + dist) % n, &after, tag(round, 0));
        after = vec![b.wait_signal((r + n - dist) % n)];
        dist = dist.saturating_mul(2);
        round += 1;
    }
}

/// A point-to-point group. Transfers to and from this rank itself pair up
/// in order and become local copies.
pub(super) fn send_recv(b: &mut Builder, ctx: &Ctx, group: &P2pGroup) -> Result<(), SpecError> {
    let (input, output) = (ctx.input(), ctx.output());
    for p in group.sends.iter().chain(&group.recvs) {
        if p.peer >= ctx.world {
            return Err(SpecError::Invalid(format!(
                "peer {} is not in a world of {}",
                p.peer, ctx.world
            )));
        }
        p.offset
            .checked_add(p.count)
            .and_then(|e| e.checked_mul(ctx.elem))
            .ok_or_else(|| SpecError::Invalid("point-to-point range overflows".into()))?;
    }
    let own_sends: Vec<_> = group.sends.iter().filter(|p| p.peer == ctx.rank).collect();
    let own_recvs: Vec<_> = group.recvs.iter().filter(|p| p.peer == ctx.rank).collect();
    if own_sends.len() != own_recvs.len() {
        return Err(SpecError::Invalid(format!(
            "{} sends to self but {} receives from self",
            own_sends.len(),
            own_recvs.len()
        )));
    }
    for (s, r) in own_sends.iter().zip(&own_recvs) {
        if s.count != r.count {
            return Err(SpecError::Invalid(format!(
                "a send to self of {} elements meets a receive of {}",
                s.count, r.count
            )));
        }
        let src = Area {
            base: s.offset * ctx.elem,
            ..input
        };
        let dst = Area {
            base: r.offset * ctx.elem,
            ..output
        };
        b.copy(dst.at((0, s.count)), src.at((0, s.count)));
    }
    for s in group.sends.iter().filter(|p| p.peer != ctx.rank) {
        let src = Area {
            base: s.offset * ctx.elem,
            ..input
        };
        let blocks = Blocks::single(s.count, ctx.chunk);
        for j in 0..blocks.rounds() {
            b.send(s.peer, src.at(blocks.chunk(0, j)), tag(0, j));
        }
    }
    for r in group.recvs.iter().filter(|p| p.peer != ctx.rank) {
        let dst = Area {
            base: r.offset * ctx.elem,
            ..output
        };
        let blocks = Blocks::single(r.count, ctx.chunk);
        for j in 0..blocks.rounds() {
            b.recv_copy(r.peer, dst.at(blocks.chunk(0, j)));
        }
    }
    Ok(())
}
