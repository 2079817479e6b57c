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

use super::{Area, Blocks, Builder, Ctx, Input, tag};
use crate::action::{Rank, WritePurpose};

/// How ranks beyond the largest power of two take part in the doubling
/// algorithms (this one and [`super::halving`]): the first `2·rem` pair
/// up, each even one folding its buffer into the odd one above it and
/// sitting out until the odd one hands it the result.
pub(super) struct Pairing {
    /// The largest power of two not above `world`: the ranks that exchange.
    pub(super) p: u32,
    rem: u32,
    /// Nobody pairs up (`world` is a power of two above one) and the
    /// input was not loaded into the output: the first exchange reads the
    /// input itself (`Input::Own`) and folds into the output, so an
    /// out-of-place operation does not copy its input over before its
    /// first send (at 8 bytes between two ranks that copy, a local task on
    /// the round trip's critical path, was about 2 µs of ~9).
    pub(super) input_unread: bool,
}

impl Pairing {
    fn new(world: u32) -> Self {
        let p = if world.is_power_of_two() {
            world
        } else {
            world.next_power_of_two() / 2
        };
        Self {
            p,
            rem: world - p,
            input_unread: false,
        }
    }

    /// The start both doubling plans share. In a power-of-two world above
    /// one, nothing (see `input_unread`). Otherwise the input loaded into
    /// the output buffer (they work in it from then on), then the pre-step
    /// over the whole buffer as one block. `None` for a rank that sits out
    /// (its whole part is emitted here); else the pairing, this rank's
    /// number among the `p` that exchange, and that one block.
    pub(super) fn begin(b: &mut Builder, ctx: &Ctx) -> Option<(Self, u32, Blocks)> {
        let (input, output) = (ctx.input(), ctx.output());
        let whole = Blocks::single(ctx.count, ctx.chunk);
        let mut pairing = Self::new(ctx.world);
        if ctx.world > 1 && pairing.rem == 0 {
            pairing.input_unread = true;
            return Some((pairing, ctx.rank, whole));
        }
        let all = whole.whole(0);
        b.load_own(output.at(all), input.at(all));
        let v = pairing.fold_in(b, ctx.rank, output, &whole)?;
        Some((pairing, v, whole))
    }

    /// Sends `range` of this rank's buffer to `partner`: in the `first`
    /// exchange of an unread input, the input itself (pre-multiplied for a
    /// float average), else the partial result in the output.
    pub(super) fn send_chunk(
        &self,
        b: &mut Builder,
        ctx: &Ctx,
        first: bool,
        partner: Rank,
        range: (u64, u64),
        purpose: WritePurpose,
    ) {
        if first && self.input_unread {
            b.send_own(partner, ctx.input().at(range), purpose);
        } else {
            b.send(partner, ctx.output().at(range), purpose);
        }
    }

    /// Folds `partner`'s copy of `range` into the output: with the input
    /// in the `first` exchange of an unread input, else with the partial
    /// result already there.
    pub(super) fn fold_chunk(
        &self,
        b: &mut Builder,
        ctx: &Ctx,
        first: bool,
        partner: Rank,
        range: (u64, u64),
    ) {
        let acc = ctx.output().at(range);
        let with = if first && self.input_unread {
            Input::Own(ctx.input().at(range))
        } else {
            Input::Partial(acc)
        };
        b.recv_fold(partner, acc, with);
    }

    /// Whether ranks beyond the power of two pair up (fold in before,
    /// are handed the result after).
    pub(super) fn paired(&self) -> bool {
        self.rem > 0
    }

    /// The real rank of exchanging rank `v` (`0..p`).
    pub(super) fn real(&self, v: u32) -> Rank {
        if v < self.rem {
            2 * v + 1
        } else {
            v + self.rem
        }
    }

    /// The pre-step, on `output` (the whole buffer, chunk by chunk):
    /// returns this rank's number among the `p` that exchange, or `None`
    /// for a rank that sits out, whose whole part (handing its buffer
    /// over, then receiving the result) is emitted here.
    pub(super) fn fold_in(
        &self,
        b: &mut Builder,
        r: Rank,
        output: Area,
        whole: &Blocks,
    ) -> Option<u32> {
        if r >= 2 * self.rem {
            return Some(r - self.rem);
        }
        if r.is_multiple_of(2) {
            for j in 0..whole.rounds() {
                b.send(r + 1, output.at(whole.chunk(0, j)), tag(0, j));
            }
            for j in 0..whole.rounds() {
                b.recv_copy(r + 1, output.at(whole.chunk(0, j)));
            }
            None
        } else {
            for j in 0..whole.rounds() {
                let acc = output.at(whole.chunk(0, j));
                b.recv_fold(r - 1, acc, Input::Partial(acc));
            }
            Some(r / 2)
        }
    }

    /// The post-step: an odd rank below `2·rem` hands the result to the
    /// even rank that sat out.
    pub(super) fn hand_back(
        &self,
        b: &mut Builder,
        r: Rank,
        output: Area,
        whole: &Blocks,
        step: u32,
    ) {
        if r < 2 * self.rem {
            for j in 0..whole.rounds() {
                b.send(r - 1, output.at(whole.chunk(0, j)), tag(step, j));
            }
        }
    }
}

pub(super) fn all_reduce(b: &mut Builder, ctx: &Ctx) {
    let Some((pairing, v, blocks)) = Pairing::begin(b, ctx) else {
        return;
    };
    let output = ctx.output();
    let all = blocks.whole(0);
    let mut mask = 1;
    let mut step = 1;
    while mask < pairing.p {
        let partner = pairing.real(v ^ mask);
        for j in 0..blocks.rounds() {
            let range = blocks.chunk(0, j);
            pairing.send_chunk(b, ctx, step == 1, partner, range, tag(step, j));
            pairing.fold_chunk(b, ctx, step == 1, partner, range);
        }
        mask <<= 1;
        step += 1;
    }
    b.post_divide(output.at(all));
    pairing.hand_back(b, ctx.rank, output, &blocks, step);
}
