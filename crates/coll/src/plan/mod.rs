//! Plans: one rank's share of an operation as a graph of tasks.
//!
//! A plan is computed once when an operation starts, from nothing but the
//! operation's description and the rank's place in the communicator, so
//! every rank derives the plans of its peers too: the k-th message this rank
//! sends to `p` is the k-th message `p`'s plan expects from it. That is the
//! whole matching protocol (see [`crate::imm`]).
//!
//! A [`Task`] is at most one received message, a list of local computations
//! and at most one sent message, in that order:
//!
//! - a *receive* waits for a message from a peer to land in a staging slot;
//!   the computations consume it (copy it out, or fold it into something),
//!   after which the slot's credit goes back to the sender;
//! - a *send* writes either straight from user memory, or from an outgoing
//!   staging slot that the computations just filled (a ring step's partial
//!   sum), and completes when the write completes locally.
//!
//! Dependencies between tasks come from the bytes they touch ([`hazard`]),
//! plus explicit ones where no bytes carry the order (barrier rounds).
//!
//! The algorithms live one per file: [`ring`] (all-reduce, reduce-scatter,
//! all-gather), [`doubling`] (recursive-doubling all-reduce), [`tree`]
//! (binomial broadcast and all-reduce), [`chain`] (pipelined broadcast and
//! reduce along the ring) and [`direct`] (all-to-all, barrier,
//! point-to-point).

mod chain;
mod direct;
mod doubling;
mod halving;
mod hazard;
mod ring;
mod tree;

use crate::action::{Buf, Loc, Rank, WritePurpose};
use crate::datatype::{DataType, ReduceOp};
use crate::spec::{Algorithm, Collective, CommConfig, OpSpec, SpecError};

/// A byte range in a user buffer ([`Buf::Send`] or [`Buf::Recv`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) buf: Buf,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl Region {
    fn loc(self) -> Loc {
        Loc::new(self.buf, self.offset)
    }
}

/// Where a computation operand lives; slots resolve when the task runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operand {
    /// User memory.
    User(Loc),
    /// The staging slot holding the task's received message.
    InSlot,
    /// The outgoing staging slot of the task's send.
    OutSlot,
}

/// A planned computation ([`crate::ComputeKind`] with symbolic slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Copy {
        dst: Operand,
        src: Operand,
    },
    Reduce {
        dst: Operand,
        a: Operand,
        b: Operand,
    },
    Premultiply {
        dst: Operand,
        src: Operand,
    },
    PostDivide {
        dst: Operand,
    },
}

/// A message this task waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecvPart {
    pub(crate) peer: Rank,
    /// Index among this operation's messages from `peer`.
    pub(crate) index: u32,
    pub(crate) len: u64,
}

/// Where a sent message's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendSource {
    User(Loc),
    OutSlot,
}

/// A message this task sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SendPart {
    pub(crate) peer: Rank,
    /// Index among this operation's messages to `peer`.
    pub(crate) index: u32,
    pub(crate) len: u64,
    pub(crate) src: SendSource,
    pub(crate) purpose: WritePurpose,
    /// Written straight into the peer's output at this byte offset
    /// ([`Builder::send_to`]) instead of into a staging slot.
    pub(crate) into_recv: Option<u64>,
}

/// One node of the plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Task {
    pub(crate) deps: Vec<u32>,
    pub(crate) recv: Option<RecvPart>,
    pub(crate) steps: Vec<Step>,
    /// Bytes every step works on.
    pub(crate) step_len: u64,
    pub(crate) send: Option<SendPart>,
}

/// One rank's tasks for one operation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    pub(crate) tasks: Vec<Task>,
    /// Messages to each rank.
    pub(crate) sends_to: Vec<u32>,
    /// Messages from each rank.
    pub(crate) recvs_from: Vec<u32>,
    pub(crate) algorithm: Option<Algorithm>,
}

impl Plan {
    /// Lengths of the messages to and from every rank, in order.
    #[cfg(test)]
    pub(crate) fn message_lens(&self) -> (Vec<Vec<u64>>, Vec<Vec<u64>>) {
        let mut sends: Vec<Vec<u64>> = self
            .sends_to
            .iter()
            .map(|&c| vec![u64::MAX; c as usize])
            .collect();
        let mut recvs: Vec<Vec<u64>> = self
            .recvs_from
            .iter()
            .map(|&c| vec![u64::MAX; c as usize])
            .collect();
        for t in &self.tasks {
            if let Some(s) = t.send {
                sends[s.peer as usize][s.index as usize] = s.len;
            }
            if let Some(r) = t.recv {
                recvs[r.peer as usize][r.index as usize] = r.len;
            }
        }
        (sends, recvs)
    }
}

/// Data a step folds in.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Input {
    /// The rank's own input, pre-multiplied on first touch for a float average.
    Own(Region),
    /// A partial result already in user memory.
    Partial(Region),
}

impl Input {
    fn region(self) -> Region {
        match self {
            Self::Own(r) | Self::Partial(r) => r,
        }
    }
}

/// Algorithm step and pipeline round of a message.
pub(crate) const fn tag(step: u32, chunk: u32) -> WritePurpose {
    WritePurpose::Data { step, chunk }
}

/// The sequential program of one rank, turned into a task graph as it is written.
pub(crate) struct Builder {
    /// Float average: own inputs are pre-multiplied when first read.
    scale_own: bool,
    /// Integer average: results are divided once at the end.
    divide: bool,
    plan: Plan,
    hazards: hazard::Hazards,
}

impl Builder {
    fn new(world: u32, dtype: DataType, op: ReduceOp, reduces: bool) -> Self {
        let avg = reduces && op == ReduceOp::Avg;
        Self {
            scale_own: avg && dtype.is_float(),
            divide: avg && !dtype.is_float(),
            plan: Plan {
                sends_to: vec![0; world as usize],
                recvs_from: vec![0; world as usize],
                ..Plan::default()
            },
            hazards: hazard::Hazards::default(),
        }
    }

    /// Adds a task; `reads` and `writes` are the user bytes it touches.
    fn push(&mut self, mut task: Task, reads: &[Region], writes: &[Region], after: &[u32]) -> u32 {
        let id = self.plan.tasks.len() as u32;
        let mut deps = after.to_vec();
        for &r in reads {
            self.hazards.access(id, r, false, &mut deps);
        }
        for &w in writes {
            self.hazards.access(id, w, true, &mut deps);
        }
        deps.sort_unstable();
        deps.dedup();
        deps.retain(|&d| d != id);
        task.deps = deps;
        self.plan.tasks.push(task);
        id
    }

    fn recv_part(&mut self, peer: Rank, len: u64) -> RecvPart {
        let slot = &mut self.plan.recvs_from[peer as usize];
        let index = *slot;
        *slot += 1;
        RecvPart { peer, index, len }
    }

    fn send_part(
        &mut self,
        peer: Rank,
        len: u64,
        src: SendSource,
        purpose: WritePurpose,
    ) -> SendPart {
        let slot = &mut self.plan.sends_to[peer as usize];
        let index = *slot;
        *slot += 1;
        SendPart {
            peer,
            index,
            len,
            src,
            purpose,
            into_recv: None,
        }
    }

    /// `dst ← src` (nothing if empty or the same bytes).
    pub(crate) fn copy(&mut self, dst: Region, src: Region) {
        debug_assert_eq!(dst.len, src.len);
        if dst.len == 0 || dst == src {
            return;
        }
        let task = Task {
            steps: vec![Step::Copy {
                dst: Operand::User(dst.loc()),
                src: Operand::User(src.loc()),
            }],
            step_len: dst.len,
            ..Task::default()
        };
        self.push(task, &[src], &[dst], &[]);
    }

    /// `dst ← own input src`, pre-multiplied for a float average.
    pub(crate) fn load_own(&mut self, dst: Region, src: Region) {
        if !self.scale_own {
            return self.copy(dst, src);
        }
        if dst.len == 0 {
            return;
        }
        let task = Task {
            steps: vec![Step::Premultiply {
                dst: Operand::User(dst.loc()),
                src: Operand::User(src.loc()),
            }],
            step_len: dst.len,
            ..Task::default()
        };
        self.push(task, &[src], &[dst], &[]);
    }

    /// The integer average's final division of a result (nothing otherwise).
    pub(crate) fn post_divide(&mut self, r: Region) {
        if !self.divide || r.len == 0 {
            return;
        }
        let task = Task {
            steps: vec![Step::PostDivide {
                dst: Operand::User(r.loc()),
            }],
            step_len: r.len,
            ..Task::default()
        };
        self.push(task, &[r], &[r], &[]);
    }

    /// Sends user bytes as they are.
    pub(crate) fn send(&mut self, peer: Rank, src: Region, purpose: WritePurpose) {
        self.send_user(peer, src, purpose, None);
    }

    /// Sends user bytes as they are, into a staging slot or (`into_recv`)
    /// straight into the peer's output at that offset.
    fn send_user(
        &mut self,
        peer: Rank,
        src: Region,
        purpose: WritePurpose,
        into_recv: Option<u64>,
    ) {
        if src.len == 0 {
            return;
        }
        let mut send = self.send_part(peer, src.len, SendSource::User(src.loc()), purpose);
        send.into_recv = into_recv;
        self.push(
            Task {
                send: Some(send),
                ..Task::default()
            },
            &[src],
            &[],
            &[],
        );
    }

    /// Sends the rank's own input, pre-multiplied (through an outgoing slot)
    /// for a float average.
    pub(crate) fn send_own(&mut self, peer: Rank, src: Region, purpose: WritePurpose) {
        if !self.scale_own {
            return self.send(peer, src, purpose);
        }
        if src.len == 0 {
            return;
        }
        let send = self.send_part(peer, src.len, SendSource::OutSlot, purpose);
        let task = Task {
            steps: vec![Step::Premultiply {
                dst: Operand::OutSlot,
                src: Operand::User(src.loc()),
            }],
            step_len: src.len,
            send: Some(send),
            ..Task::default()
        };
        self.push(task, &[src], &[], &[]);
    }

    /// Sends user bytes `src` meant for the peer's output at `at` (where
    /// this rank's output has them too): through a staging slot, or with
    /// `direct` (a symmetric operation, [`OpSpec::symmetric`]) straight
    /// there. The peer's plan takes it with [`Builder::recv_into`] of the
    /// same region and the same `direct`.
    ///
    /// Direct only where the peer cannot touch those bytes between the
    /// moment the data may land (once it has sent us whatever the data
    /// depends on, in this operation) and its receiving task: no task of
    /// its own reads or writes them in between. They may still be the
    /// source of a write the peer made to us earlier, not yet completed at
    /// the peer; we consumed it before sending this, and a transport never
    /// places a message again once its receiver has it whole (MetaRoCE's
    /// responder drops duplicates of a completed message), so a resend
    /// read from the overwritten bytes lands nowhere.
    pub(crate) fn send_to(
        &mut self,
        peer: Rank,
        src: Region,
        at: Region,
        direct: bool,
        purpose: WritePurpose,
    ) {
        debug_assert_eq!((at.buf, at.len), (Buf::Recv, src.len));
        self.send_user(peer, src, purpose, direct.then_some(at.offset));
    }

    /// Receives a message into `dst`: copied out of its staging slot, or,
    /// `direct`, written there by the peer ([`Builder::send_to`]), and then
    /// there is nothing to copy: the task stands for its arrival, which is
    /// when the bytes are there, so the tasks that read `dst` wait for it.
    pub(crate) fn recv_into(&mut self, peer: Rank, dst: Region, direct: bool) {
        if dst.len == 0 {
            return;
        }
        let recv = self.recv_part(peer, dst.len);
        let steps = if direct {
            Vec::new()
        } else {
            vec![Step::Copy {
                dst: Operand::User(dst.loc()),
                src: Operand::InSlot,
            }]
        };
        let task = Task {
            recv: Some(recv),
            steps,
            step_len: dst.len,
            ..Task::default()
        };
        self.push(task, &[], &[dst], &[]);
    }

    /// Receives a message into `dst`, through its staging slot.
    pub(crate) fn recv_copy(&mut self, peer: Rank, dst: Region) {
        self.recv_into(peer, dst, false);
    }

    /// The steps computing `dst ← with ⊕ message`.
    fn fold_steps(&self, dst: Operand, with: Input) -> Vec<Step> {
        let a = Operand::User(with.region().loc());
        match with {
            Input::Own(_) if self.scale_own => vec![
                Step::Premultiply { dst, src: a },
                Step::Reduce {
                    dst,
                    a: dst,
                    b: Operand::InSlot,
                },
            ],
            _ => vec![Step::Reduce {
                dst,
                a,
                b: Operand::InSlot,
            }],
        }
    }

    /// Receives a message and folds it: `dst ← with ⊕ message`.
    pub(crate) fn recv_fold(&mut self, peer: Rank, dst: Region, with: Input) {
        debug_assert_eq!(dst.len, with.region().len);
        if dst.len == 0 {
            return;
        }
        let recv = self.recv_part(peer, dst.len);
        let task = Task {
            recv: Some(recv),
            steps: self.fold_steps(Operand::User(dst.loc()), with),
            step_len: dst.len,
            ..Task::default()
        };
        self.push(task, &[with.region()], &[dst], &[]);
    }

    /// Receives a message from `from`, folds it with `with` into an
    /// outgoing slot and sends that to `to`: one ring or chain step.
    pub(crate) fn recv_fold_send(
        &mut self,
        from: Rank,
        to: Rank,
        with: Input,
        purpose: WritePurpose,
    ) {
        let len = with.region().len;
        if len == 0 {
            return;
        }
        let recv = self.recv_part(from, len);
        let send = self.send_part(to, len, SendSource::OutSlot, purpose);
        let task = Task {
            recv: Some(recv),
            steps: self.fold_steps(Operand::OutSlot, with),
            step_len: len,
            send: Some(send),
            ..Task::default()
        };
        self.push(task, &[with.region()], &[], &[]);
    }

    /// A zero-length message to `peer` after `after`.
    pub(crate) fn signal(&mut self, peer: Rank, after: &[u32], purpose: WritePurpose) -> u32 {
        let send = self.send_part(peer, 0, SendSource::User(Loc::new(Buf::Recv, 0)), purpose);
        self.push(
            Task {
                send: Some(send),
                ..Task::default()
            },
            &[],
            &[],
            after,
        )
    }

    /// Waits for a zero-length message from `peer`.
    pub(crate) fn wait_signal(&mut self, peer: Rank) -> u32 {
        let recv = self.recv_part(peer, 0);
        self.push(
            Task {
                recv: Some(recv),
                ..Task::default()
            },
            &[],
            &[],
            &[],
        )
    }

    fn finish(mut self, algorithm: Algorithm) -> Plan {
        self.plan.algorithm = Some(algorithm);
        self.plan
    }
}

/// Element ranges of `blocks` consecutive blocks, each cut into chunks of at
/// most `chunk` elements; round `j` is the `j`-th chunk of every block.
#[derive(Clone, Debug)]
pub(crate) struct Blocks {
    starts: Vec<u64>,
    lens: Vec<u64>,
    chunk: u64,
}

impl Blocks {
    /// `count` elements split into `n` blocks as evenly as possible.
    pub(crate) fn balanced(count: u64, n: u32, chunk: u64) -> Self {
        let n64 = u64::from(n);
        let bound = |b: u64| ((u128::from(b) * u128::from(count)) / u128::from(n64)) as u64;
        let starts: Vec<u64> = (0..n64).map(bound).collect();
        let lens = (0..n64).map(|b| bound(b + 1) - bound(b)).collect();
        Self {
            starts,
            lens,
            chunk,
        }
    }

    /// `n` blocks of `count` elements each.
    pub(crate) fn equal(count: u64, n: u32, chunk: u64) -> Self {
        Self {
            starts: (0..u64::from(n)).map(|b| b * count).collect(),
            lens: vec![count; n as usize],
            chunk,
        }
    }

    /// One block of `count` elements.
    pub(crate) fn single(count: u64, chunk: u64) -> Self {
        Self::equal(count, 1, chunk)
    }

    /// Pipeline rounds: chunks of the largest block.
    pub(crate) fn rounds(&self) -> u32 {
        let max = self.lens.iter().copied().max().unwrap_or(0);
        max.div_ceil(self.chunk) as u32
    }

    /// Elements `(start, len)` of chunk `j` of block `b` (`len` may be 0).
    pub(crate) fn chunk(&self, b: u32, j: u32) -> (u64, u64) {
        let (start, len) = (self.starts[b as usize], self.lens[b as usize]);
        let off = (u64::from(j) * self.chunk).min(len);
        (start + off, self.chunk.min(len - off))
    }

    /// Elements `(start, len)` of all of block `b`.
    pub(crate) fn whole(&self, b: u32) -> (u64, u64) {
        (self.starts[b as usize], self.lens[b as usize])
    }
}

/// Where an operation's data lives, in bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Area {
    pub(crate) buf: Buf,
    /// Byte offset of element 0.
    pub(crate) base: u64,
    pub(crate) elem: u64,
}

impl Area {
    /// The region of elements `(start, len)`.
    pub(crate) fn at(self, (start, len): (u64, u64)) -> Region {
        // `base` may be "negative" (wrapped) when an area is shifted so that
        // one block's element range maps onto a smaller buffer.
        Region {
            buf: self.buf,
            offset: self.base.wrapping_add(start * self.elem),
            len: len * self.elem,
        }
    }
}

/// What every algorithm needs to know about the operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub(crate) rank: Rank,
    pub(crate) world: u32,
    pub(crate) count: u64,
    pub(crate) elem: u64,
    /// Elements per chunk.
    pub(crate) chunk: u64,
    pub(crate) in_place: bool,
    /// The output buffers are symmetric ([`OpSpec::symmetric`]).
    pub(crate) symmetric: bool,
}

impl Ctx {
    /// The input area, element 0 of the whole input.
    pub(crate) fn input(&self) -> Area {
        let buf = if self.in_place { Buf::Recv } else { Buf::Send };
        Area {
            buf,
            base: 0,
            elem: self.elem,
        }
    }

    /// The output area.
    pub(crate) fn output(&self) -> Area {
        Area {
            buf: Buf::Recv,
            base: 0,
            elem: self.elem,
        }
    }

    pub(crate) fn next(&self) -> Rank {
        (self.rank + 1) % self.world
    }

    pub(crate) fn prev(&self) -> Rank {
        (self.rank + self.world - 1) % self.world
    }
}

/// Plans `spec` for `rank` of `world`.
pub(crate) fn build(
    spec: &OpSpec,
    rank: Rank,
    world: u32,
    config: &CommConfig,
) -> Result<Plan, SpecError> {
    if world == 0 || rank >= world {
        return Err(SpecError::Invalid(format!(
            "rank {rank} is not in a world of {world}"
        )));
    }
    let elem = spec.dtype.size_bytes() as u64;
    let chunk_bytes = spec.chunk_bytes.unwrap_or(config.slot_bytes);
    if chunk_bytes < elem || chunk_bytes > config.slot_bytes {
        return Err(SpecError::Invalid(format!(
            "chunk of {chunk_bytes} bytes must hold one {} element and fit a {}-byte slot",
            spec.dtype, config.slot_bytes
        )));
    }
    // Every byte offset must be representable: the largest buffer is
    // world × count elements.
    let too_big = || {
        SpecError::Invalid(format!(
            "{} elements overflow a 64-bit byte count",
            spec.count
        ))
    };
    spec.count
        .checked_mul(u64::from(world))
        .and_then(|x| x.checked_mul(elem))
        .ok_or_else(too_big)?;
    let reduces = spec.collective.reduces();
    let algorithm = spec
        .algorithm
        .resolve(&spec.collective, spec.bytes(), world, config)?;
    let ctx = Ctx {
        rank,
        world,
        count: spec.count,
        elem,
        chunk: chunk_bytes / elem,
        in_place: spec.in_place,
        symmetric: spec.symmetric,
    };
    let mut b = Builder::new(world, spec.dtype, spec.op, reduces);
    let check_root = |root: Rank| {
        if root >= world {
            Err(SpecError::Invalid(format!(
                "root {root} is not in a world of {world}"
            )))
        } else {
            Ok(())
        }
    };
    match (&spec.collective, algorithm) {
        (Collective::AllReduce, Algorithm::Ring) => ring::all_reduce(&mut b, &ctx),
        (Collective::AllReduce, Algorithm::RecursiveDoubling) => doubling::all_reduce(&mut b, &ctx),
        (Collective::AllReduce, Algorithm::HalvingDoubling) => halving::all_reduce(&mut b, &ctx),
        (Collective::AllReduce, Algorithm::Tree) => tree::all_reduce(&mut b, &ctx),
        (Collective::ReduceScatter, _) => ring::reduce_scatter(&mut b, &ctx),
        (Collective::AllGather, _) => ring::all_gather(&mut b, &ctx),
        (Collective::Broadcast { root }, Algorithm::Tree) => {
            check_root(*root)?;
            tree::broadcast(&mut b, &ctx, *root)
        }
        (Collective::Broadcast { root }, _) => {
            check_root(*root)?;
            chain::broadcast(&mut b, &ctx, *root)
        }
        (Collective::Reduce { root }, _) => {
            check_root(*root)?;
            chain::reduce(&mut b, &ctx, *root)
        }
        (Collective::AllToAll, _) => direct::all_to_all(&mut b, &ctx),
        (Collective::Barrier, _) => direct::barrier(&mut b, &ctx),
        (Collective::SendRecv(group), _) => direct::send_recv(&mut b, &ctx, group)?,
        (c, a) => {
            return Err(SpecError::UnsupportedAlgorithm {
                collective: c.name(),
                algorithm: a,
            });
        }
    }
    Ok(b.finish(algorithm))
}

/// Binomial-tree helpers on ranks relative to a root.
pub(crate) mod binomial {
    /// The lowest set bit of `q`, or a bit above `n` for the root.
    fn low_bit(q: u32, n: u32) -> u32 {
        if q == 0 {
            n.next_power_of_two().max(1) * 2
        } else {
            q & q.wrapping_neg()
        }
    }

    /// Parent of relative rank `q > 0`: `q` without its lowest set bit.
    pub(crate) fn parent(q: u32) -> u32 {
        q & (q - 1)
    }

    /// Children of relative rank `q` in a tree of `n`, smallest subtree first.
    pub(crate) fn children(q: u32, n: u32) -> Vec<u32> {
        let lb = low_bit(q, n);
        let mut out = Vec::new();
        let mut m = 1u32;
        while m < lb {
            match q.checked_add(m) {
                Some(c) if c < n => out.push(c),
                _ => break,
            }
            m <<= 1;
        }
        out
    }
}

#[cfg(test)]
mod tests;
