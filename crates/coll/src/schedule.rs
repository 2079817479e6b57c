//! Message schedules: what every rank of an operation sends, to whom, how
//! much, and after what, without running it.
//!
//! A [`Schedule`] is the plans the [`Communicator`](crate::Communicator)
//! runs, seen from the network: the task graph of each rank with the
//! computations folded away, so that only messages and the order between
//! them remain. It is derived from the very plans the socket path executes
//! (`plan::build`), so an outside driver — the packet-level simulator —
//! moves the same messages in the same dependency order as a run over real
//! devices, step for step: same sizes, same chunks, same pipelining.
//!
//! # What a send waits for
//!
//! A rank may post a message once its dependencies ([`RankSchedule::after`]) have
//! happened:
//!
//! - [`Dependency::Received`]: a message from a peer has arrived here (the
//!   data it forwards or folds in, or a partial result it sends on);
//! - [`Dependency::Sent`]: an earlier message of this rank has completed
//!   locally (its bytes are about to be overwritten: recursive doubling
//!   folding into the buffer it just sent from).
//!
//! Local computation is taken to cost no time; a driver that charges for
//! it adds the time between the last dependency and the send. The lists are
//! pruned of what another entry already implies (a send that completed
//! implies everything that send waited for), so they stay short.
//!
//! # The slot window
//!
//! The communicator also holds message `k` to a peer until message
//! `k - window` to the same peer has been written and its staging slot
//! credited back ([`Schedule::window`] is
//! [`CommConfig::slots`]). The receiver credits a slot once it consumed the
//! message: once the message arrived and the receiving task's own
//! dependencies, [`RankSchedule::consume_after`], have happened. A driver
//! modelling flow control waits for both; the credit's own trip back is a
//! zero-length write the schedule does not list.

use crate::action::{Rank, WritePurpose};
use crate::plan::{self, Plan};
use crate::spec::{Algorithm, CommConfig, OpSpec, SpecError};

/// One message of an operation: the `index`-th this operation sends from
/// `from` to `to` (the `index`-th `to` expects from `from`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    /// Sending rank.
    pub from: Rank,
    /// Receiving rank.
    pub to: Rank,
    /// Position among this operation's messages from `from` to `to`.
    pub index: u32,
}

/// An event a send (or the consumption of a received message) waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dependency {
    /// The message has arrived at its receiver (the rank that waits).
    Received(MessageId),
    /// The message's write has completed at its sender (the rank that waits).
    Sent(MessageId),
}

/// A message a rank sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// Which message.
    pub id: MessageId,
    /// Payload bytes (zero for a barrier's signals).
    pub bytes: u64,
    /// Algorithm step (ring: `0..2(n-1)`; recursive doubling: the exchange;
    /// trees: 0 up, 1 down), as [`WritePurpose::Data`] names it.
    pub step: u32,
    /// Pipeline round: which chunk of its block the message carries.
    pub chunk: u32,
    /// This rank's dependencies: `deps[after.0..after.1]`.
    after: (u32, u32),
}

/// A message a rank receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// Which message.
    pub id: MessageId,
    /// Payload bytes.
    pub bytes: u64,
    /// What the receiver waits for, besides the arrival, before it
    /// consumes the message: `deps[consume.0..consume.1]`.
    consume: (u32, u32),
}

/// One rank's share of a schedule.
#[derive(Clone, Debug, Default)]
pub struct RankSchedule {
    /// Sends in the order the plan issues them.
    sends: Vec<Message>,
    /// Receives in the order the plan consumes them.
    receipts: Vec<Receipt>,
    /// The dependency lists of `sends` and `receipts`, back to back.
    deps: Vec<Dependency>,
    /// Positions in `sends`, sorted by (peer, index), and where each peer's
    /// run starts: `(peer, first)` sorted by peer.
    send_order: Vec<u32>,
    send_peers: Vec<(Rank, u32)>,
    /// The same for `receipts`.
    receipt_order: Vec<u32>,
    receipt_peers: Vec<(Rank, u32)>,
}

impl RankSchedule {
    /// The messages this rank sends, in plan order.
    pub fn sends(&self) -> &[Message] {
        &self.sends
    }

    /// The messages this rank receives, in plan order.
    pub fn receipts(&self) -> &[Receipt] {
        &self.receipts
    }

    /// What `send` (one of [`sends`](Self::sends)) waits for.
    pub fn after(&self, send: &Message) -> &[Dependency] {
        &self.deps[send.after.0 as usize..send.after.1 as usize]
    }

    /// What this rank waits for, besides the arrival, before it consumes
    /// `receipt` (one of [`receipts`](Self::receipts)) and credits its slot.
    pub fn consume_after(&self, receipt: &Receipt) -> &[Dependency] {
        &self.deps[receipt.consume.0 as usize..receipt.consume.1 as usize]
    }

    /// Position in [`sends`](Self::sends) of the `index`-th message to `to`.
    pub fn send_position(&self, to: Rank, index: u32) -> Option<usize> {
        lookup(&self.send_peers, &self.send_order, to, index)
    }

    /// Position in [`receipts`](Self::receipts) of the `index`-th message
    /// from `from`.
    pub fn receipt_position(&self, from: Rank, index: u32) -> Option<usize> {
        lookup(&self.receipt_peers, &self.receipt_order, from, index)
    }

    /// Payload bytes this rank sends.
    pub fn bytes_sent(&self) -> u64 {
        self.sends.iter().map(|m| m.bytes).sum()
    }
}

/// Finds message `index` of `peer` through a per-peer index.
fn lookup(peers: &[(Rank, u32)], order: &[u32], peer: Rank, index: u32) -> Option<usize> {
    let at = peers.binary_search_by_key(&peer, |&(p, _)| p).ok()?;
    let first = peers[at].1 as usize;
    let end = peers.get(at + 1).map_or(order.len(), |&(_, f)| f as usize);
    let i = first.checked_add(index as usize)?;
    (i < end).then(|| order[i] as usize)
}

/// Builds the per-peer index over messages given as `(peer, index)` in
/// plan order: within one peer, plan order is index order (the builder
/// numbers messages as it writes them).
fn index_by_peer(keys: impl Iterator<Item = (Rank, u32)>) -> (Vec<u32>, Vec<(Rank, u32)>) {
    let mut sorted: Vec<(Rank, u32, u32)> = keys
        .enumerate()
        .map(|(pos, (peer, index))| (peer, index, pos as u32))
        .collect();
    sorted.sort_unstable();
    let mut peers: Vec<(Rank, u32)> = Vec::new();
    for (i, &(peer, index, _)) in sorted.iter().enumerate() {
        debug_assert!(peers.last().is_some_and(|&(p, _)| p == peer) || index == 0);
        if peers.last().is_none_or(|&(p, _)| p != peer) {
            peers.push((peer, i as u32));
        }
    }
    (sorted.into_iter().map(|(_, _, pos)| pos).collect(), peers)
}

/// Every rank's messages of one operation.
#[derive(Clone, Debug)]
pub struct Schedule {
    world: u32,
    window: u32,
    algorithm: Algorithm,
    ranks: Vec<RankSchedule>,
}

impl Schedule {
    /// The schedule of `spec` on every rank of a `world`-rank communicator
    /// with `config`: the messages the communicators would exchange.
    ///
    /// Point-to-point groups ([`Collective::SendRecv`](crate::Collective::SendRecv))
    /// differ per rank: use [`Schedule::per_rank`] for them.
    pub fn new(spec: &OpSpec, world: u32, config: &CommConfig) -> Result<Self, SpecError> {
        Self::per_rank(world, config, |_| spec.clone())
    }

    /// The schedule of an operation each rank describes with `spec_of(rank)`
    /// (all ranks must describe the same operation, as for
    /// [`Communicator::start`](crate::Communicator::start)).
    pub fn per_rank(
        world: u32,
        config: &CommConfig,
        mut spec_of: impl FnMut(Rank) -> OpSpec,
    ) -> Result<Self, SpecError> {
        config.validate()?;
        if world == 0 {
            return Err(SpecError::Invalid("a world of 0 ranks".into()));
        }
        let mut ranks = Vec::with_capacity(world as usize);
        let mut algorithm = Algorithm::Auto;
        for rank in 0..world {
            let plan = plan::build(&spec_of(rank), rank, world, config)?;
            algorithm = plan.algorithm.unwrap_or(algorithm);
            ranks.push(fold_plan(rank, &plan));
        }
        let schedule = Self {
            world,
            window: config.slots,
            algorithm,
            ranks,
        };
        schedule.check_matched()?;
        Ok(schedule)
    }

    /// Ranks.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// Messages that may be in flight on one directed connection (the
    /// communicator's staging slots per peer).
    pub fn window(&self) -> u32 {
        self.window
    }

    /// The algorithm the operation runs ([`Algorithm::Auto`] resolved).
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// One rank's messages.
    ///
    /// # Panics
    ///
    /// If `rank` is not below [`world`](Self::world).
    pub fn rank(&self, rank: Rank) -> &RankSchedule {
        &self.ranks[rank as usize]
    }

    /// Every rank's messages, rank 0 first.
    pub fn ranks(&self) -> &[RankSchedule] {
        &self.ranks
    }

    /// Messages over all ranks.
    pub fn messages(&self) -> usize {
        self.ranks.iter().map(|r| r.sends.len()).sum()
    }

    /// The message `id`, if the operation sends it.
    pub fn message(&self, id: MessageId) -> Option<&Message> {
        let r = self.ranks.get(id.from as usize)?;
        r.send_position(id.to, id.index).map(|i| &r.sends[i])
    }

    /// The receiver's side of message `id`.
    pub fn receipt(&self, id: MessageId) -> Option<&Receipt> {
        let r = self.ranks.get(id.to as usize)?;
        r.receipt_position(id.from, id.index)
            .map(|i| &r.receipts[i])
    }

    /// The message whose slot `id` reuses: `window` messages earlier on
    /// the same connection. `id` may be written only once that one is
    /// written and consumed ([`RankSchedule::consume_after`]).
    pub fn slot_predecessor(&self, id: MessageId) -> Option<MessageId> {
        let index = id.index.checked_sub(self.window)?;
        Some(MessageId { index, ..id })
    }

    /// Every message sent is the one its receiver expects, with the same
    /// length, and every expected one is sent: the plans agree.
    fn check_matched(&self) -> Result<(), SpecError> {
        let mismatch = |what: String| Err(SpecError::Invalid(format!("plans disagree: {what}")));
        let (mut sent, mut expected) = (0usize, 0usize);
        for r in &self.ranks {
            sent += r.sends.len();
            expected += r.receipts.len();
            for m in &r.sends {
                match self.receipt(m.id) {
                    Some(x) if x.bytes == m.bytes => {}
                    Some(x) => {
                        return mismatch(format!(
                            "{:?} has {} bytes, its receiver expects {}",
                            m.id, m.bytes, x.bytes
                        ));
                    }
                    None => return mismatch(format!("nobody expects {:?}", m.id)),
                }
            }
        }
        if sent != expected {
            return mismatch(format!("{sent} messages sent, {expected} expected"));
        }
        Ok(())
    }
}

/// The message schedule of `spec` on a `world`-rank communicator: a
/// shorthand for [`Schedule::new`].
pub fn schedule(spec: &OpSpec, world: u32, config: &CommConfig) -> Result<Schedule, SpecError> {
    Schedule::new(spec, world, config)
}

/// Folds one rank's task graph into its messages and their dependencies.
///
/// A task is done once its send completed (if it sends) or once its
/// received message arrived and its dependencies are done (computation
/// being free). Each task's "done" condition is a set of network events,
/// built from its dependencies' sets in plan order (dependencies always
/// precede their dependents) and pruned of events that a `Sent` in the same
/// set already implies. Events are coded `task << 1 | sent` while folding
/// (sets are runs of one pool, no allocation per task) and named by message
/// at the end.
fn fold_plan(rank: Rank, plan: &Plan) -> RankSchedule {
    let tasks = &plan.tasks;
    let mut out = RankSchedule::default();
    // Per task: its done set, `pool[done[t].0..done[t].1]`.
    let mut pool: Vec<u32> = Vec::new();
    let mut done: Vec<(u32, u32)> = Vec::with_capacity(tasks.len());
    // Per task with a send: what it waited for, `pool[waited[t]..]`.
    let mut waited: Vec<(u32, u32)> = vec![(0, 0); tasks.len()];
    let mut waits: Vec<u32> = Vec::new();
    let received = |t: usize| (t as u32) << 1;
    let sent = |t: usize| (t as u32) << 1 | 1;
    let name = |e: u32| {
        let t = &tasks[(e >> 1) as usize];
        if e & 1 == 1 {
            let s = t.send.expect("a sent event belongs to a sending task");
            Dependency::Sent(MessageId {
                from: rank,
                to: s.peer,
                index: s.index,
            })
        } else {
            let r = t
                .recv
                .expect("a received event belongs to a receiving task");
            Dependency::Received(MessageId {
                from: r.peer,
                to: rank,
                index: r.index,
            })
        }
    };
    for (i, task) in tasks.iter().enumerate() {
        waits.clear();
        for &d in &task.deps {
            debug_assert!((d as usize) < i, "dependencies precede dependents");
            let (a, b) = done[d as usize];
            waits.extend_from_slice(&pool[a as usize..b as usize]);
        }
        prune(&mut waits, &pool, &waited);
        if let Some(r) = task.recv {
            let start = out.deps.len() as u32;
            out.deps.extend(waits.iter().map(|&e| name(e)));
            out.receipts.push(Receipt {
                id: MessageId {
                    from: r.peer,
                    to: rank,
                    index: r.index,
                },
                bytes: r.len,
                consume: (start, out.deps.len() as u32),
            });
            waits.push(received(i));
        }
        let first = pool.len() as u32;
        match task.send {
            Some(s) => {
                let (step, chunk) = match s.purpose {
                    WritePurpose::Data { step, chunk } => (step, chunk),
                    WritePurpose::Credit => (0, 0),
                };
                let start = out.deps.len() as u32;
                out.deps.extend(waits.iter().map(|&e| name(e)));
                out.sends.push(Message {
                    id: MessageId {
                        from: rank,
                        to: s.peer,
                        index: s.index,
                    },
                    bytes: s.len,
                    step,
                    chunk,
                    after: (start, out.deps.len() as u32),
                });
                pool.extend_from_slice(&waits);
                waited[i] = (first, pool.len() as u32);
                pool.push(sent(i));
                done.push((pool.len() as u32 - 1, pool.len() as u32));
            }
            None => {
                pool.extend_from_slice(&waits);
                done.push((first, pool.len() as u32));
            }
        }
    }
    (out.send_order, out.send_peers) =
        index_by_peer(out.sends.iter().map(|m| (m.id.to, m.id.index)));
    (out.receipt_order, out.receipt_peers) =
        index_by_peer(out.receipts.iter().map(|m| (m.id.from, m.id.index)));
    out
}

/// Sorts and dedups the events of `set` and drops what a `Sent` in it
/// implies: a send that completed had everything it waited for
/// (`pool[waited[task]]`).
fn prune(set: &mut Vec<u32>, pool: &[u32], waited: &[(u32, u32)]) {
    set.sort_unstable();
    set.dedup();
    if set.len() < 2 {
        return;
    }
    let implied = |e: u32| {
        set.iter().any(|&s| {
            let (a, b) = waited[(s >> 1) as usize];
            s & 1 == 1 && pool[a as usize..b as usize].contains(&e)
        })
    };
    let keep: Vec<u32> = set.iter().copied().filter(|&e| !implied(e)).collect();
    *set = keep;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Collective, DataType, ReduceOp};

    fn spec(c: Collective, count: u64) -> OpSpec {
        OpSpec::new(c, DataType::Uint8, ReduceOp::Sum, count)
    }

    #[test]
    fn ring_allreduce_moves_the_optimal_volume_with_one_dependency_per_step() {
        let (n, s) = (8u32, 8 * 4096u64);
        let sched = schedule(
            &spec(Collective::AllReduce, s).with_algorithm(Algorithm::Ring),
            n,
            &CommConfig::default(),
        )
        .unwrap();
        assert_eq!(sched.algorithm(), Algorithm::Ring);
        for r in 0..n {
            let rs = sched.rank(r);
            // 2(n-1)/n · S per rank.
            assert_eq!(rs.bytes_sent(), 2 * u64::from(n - 1) * s / u64::from(n));
            assert_eq!(rs.sends().len(), 2 * (n as usize - 1));
            let next = (r + 1) % n;
            let prev = (r + n - 1) % n;
            for (k, m) in rs.sends().iter().enumerate() {
                assert_eq!(m.id.to, next);
                assert_eq!(m.step, k as u32);
                let after = rs.after(m);
                if k == 0 {
                    // Step 0 sends its own input: nothing to wait for.
                    assert!(after.is_empty());
                } else {
                    // Every later step forwards what step k-1 brought in.
                    assert_eq!(
                        after,
                        [Dependency::Received(MessageId {
                            from: prev,
                            to: r,
                            index: k as u32 - 1
                        })]
                    );
                }
            }
        }
    }

    #[test]
    fn ring_allreduce_volume_holds_when_blocks_are_chunked_and_uneven() {
        let cfg = CommConfig {
            slot_bytes: 1024,
            ..CommConfig::default()
        };
        for (n, s) in [(3u32, 10_000u64), (5, 4099), (16, 100_000)] {
            let sched = schedule(
                &spec(Collective::AllReduce, s).with_algorithm(Algorithm::Ring),
                n,
                &cfg,
            )
            .unwrap();
            let total: u64 = sched.ranks().iter().map(RankSchedule::bytes_sent).sum();
            // Every block travels 2(n-1) hops.
            assert_eq!(total, 2 * u64::from(n - 1) * s);
            assert!(
                sched
                    .ranks()
                    .iter()
                    .flat_map(|r| r.sends())
                    .all(|m| m.bytes <= 1024)
            );
        }
    }

    #[test]
    fn every_message_is_expected_by_exactly_one_receiver() {
        let cfg = CommConfig {
            slot_bytes: 64,
            ..CommConfig::default()
        };
        let cases: Vec<(Collective, Algorithm)> = vec![
            (Collective::AllReduce, Algorithm::Ring),
            (Collective::AllReduce, Algorithm::RecursiveDoubling),
            (Collective::AllReduce, Algorithm::Tree),
            (Collective::ReduceScatter, Algorithm::Ring),
            (Collective::AllGather, Algorithm::Ring),
            (Collective::AllToAll, Algorithm::Direct),
            (Collective::Broadcast { root: 1 }, Algorithm::Ring),
            (Collective::Broadcast { root: 1 }, Algorithm::Tree),
            (Collective::Reduce { root: 1 }, Algorithm::Ring),
            (Collective::Barrier, Algorithm::Direct),
        ];
        for world in [2u32, 3, 5, 8] {
            for count in [1u64, 100, 333] {
                for (c, a) in &cases {
                    let sched =
                        schedule(&spec(c.clone(), count).with_algorithm(*a), world, &cfg).unwrap();
                    let mut receipts = 0;
                    for (r, rs) in sched.ranks().iter().enumerate() {
                        receipts += rs.receipts().len();
                        for m in rs.sends() {
                            assert_eq!(m.id.from, r as u32);
                            let x = sched.receipt(m.id).expect("expected");
                            assert_eq!((x.id, x.bytes), (m.id, m.bytes));
                            assert_eq!(sched.message(m.id), Some(m));
                            // Dependencies name events of this rank that exist.
                            for d in rs.after(m) {
                                match *d {
                                    Dependency::Received(id) => {
                                        assert_eq!(id.to, m.id.from);
                                        assert!(sched.message(id).is_some());
                                    }
                                    Dependency::Sent(id) => {
                                        assert_eq!(id.from, m.id.from);
                                        let p = rs.send_position(id.to, id.index).unwrap();
                                        let me = rs.send_position(m.id.to, m.id.index).unwrap();
                                        assert!(p < me, "a send waits only for earlier ones");
                                    }
                                }
                            }
                        }
                    }
                    assert_eq!(receipts, sched.messages(), "{c:?} {a} world {world}");
                }
            }
        }
    }

    #[test]
    fn tree_broadcast_forwards_each_chunk_to_every_child() {
        let cfg = CommConfig {
            slot_bytes: 64,
            ..CommConfig::default()
        };
        let sched = schedule(
            &spec(Collective::Broadcast { root: 0 }, 256).with_algorithm(Algorithm::Tree),
            8,
            &cfg,
        )
        .unwrap();
        // Rank 4 (children 5 and 6) forwards chunk j to both after
        // receiving chunk j from rank 0.
        let rs = sched.rank(4);
        assert_eq!(rs.sends().len(), 2 * 4);
        for m in rs.sends() {
            assert_eq!(
                rs.after(m),
                [Dependency::Received(MessageId {
                    from: 0,
                    to: 4,
                    index: m.chunk
                })]
            );
        }
        // Every rank but the root receives the whole buffer once.
        for r in 1..8 {
            let got: u64 = sched.rank(r).receipts().iter().map(|x| x.bytes).sum();
            assert_eq!(got, 256);
        }
    }

    #[test]
    fn doubling_waits_for_its_own_send_before_folding_over_it() {
        // In place, the first exchange sends the buffer it then folds into.
        let sched = schedule(
            &spec(Collective::AllReduce, 1000)
                .with_algorithm(Algorithm::RecursiveDoubling)
                .in_place(),
            4,
            &CommConfig::default(),
        )
        .unwrap();
        let rs = sched.rank(0);
        // Exchange 2 (with rank 2) sends the sum of exchange 1: after
        // receiving from rank 1 and after its own first send completed
        // (the fold overwrote the bytes that send read).
        let second = rs.sends()[1];
        assert_eq!(second.id.to, 2);
        let after = rs.after(&second);
        assert!(after.contains(&Dependency::Received(MessageId {
            from: 1,
            to: 0,
            index: 0
        })));
        assert!(after.contains(&Dependency::Sent(rs.sends()[0].id)));
    }

    #[test]
    fn doubling_out_of_place_sends_its_input_without_copying_it_first() {
        let sched = schedule(
            &spec(Collective::AllReduce, 1000).with_algorithm(Algorithm::RecursiveDoubling),
            4,
            &CommConfig::default(),
        )
        .unwrap();
        let rs = sched.rank(0);
        // The first send waits for nothing (no copy of the input into the
        // output before it), and the fold into the output does not wait
        // for it: it read the input, which nothing overwrites.
        let first = rs.sends()[0];
        assert!(rs.after(&first).is_empty(), "{:?}", rs.after(&first));
        let second = rs.sends()[1];
        assert!(!rs.after(&second).contains(&Dependency::Sent(first.id)));
    }

    #[test]
    fn slot_predecessor_is_window_messages_back() {
        let sched = schedule(
            &spec(Collective::AllToAll, 1 << 20),
            3,
            &CommConfig::default(),
        )
        .unwrap();
        assert_eq!(sched.window(), 4);
        let id = MessageId {
            from: 0,
            to: 1,
            index: 3,
        };
        assert_eq!(sched.slot_predecessor(id), None);
        assert_eq!(
            sched.slot_predecessor(MessageId { index: 5, ..id }),
            Some(MessageId { index: 1, ..id })
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        let cfg = CommConfig::default();
        assert!(schedule(&spec(Collective::AllReduce, 8), 0, &cfg).is_err());
        assert!(schedule(&spec(Collective::Broadcast { root: 9 }, 8), 4, &cfg).is_err());
        let bad = CommConfig {
            slots: 1,
            ..CommConfig::default()
        };
        assert!(schedule(&spec(Collective::AllReduce, 8), 4, &bad).is_err());
    }

    #[test]
    fn builds_128_ranks_of_8_mib_quickly() {
        let t = std::time::Instant::now();
        let sched = schedule(
            &spec(Collective::AllReduce, 8 << 20),
            128,
            &CommConfig::default(),
        )
        .unwrap();
        assert_eq!(sched.messages(), 128 * 254);
        // Generous for a debug build on a loaded machine; a release build
        // takes a few milliseconds.
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }
}
