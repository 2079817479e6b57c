//! The communicator: one rank's sans-IO state machine.
//!
//! It owns the connection state toward every peer (staging slots, credits,
//! message sequence numbers, which outlive any one operation) and runs the
//! operations it is given one after another, each from its [plan]. It owns
//! no thread, socket, timer or byte of data: the driver feeds it events and
//! drains [`Action`]s.
//!
//! [plan]: crate::plan

use std::collections::{HashMap, VecDeque};

use crate::action::{
    Action, Buf, Compute, ComputeId, ComputeKind, Loc, OpId, Rank, Write, WriteId, WritePurpose,
};
use crate::datatype::{DataType, ReduceOp};
use crate::imm::{Imm, SeqLow};
use crate::plan::{self, Operand, Plan, SendSource, Step};
use crate::spec::{Algorithm, CommConfig, OpSpec, SpecError};
use crate::staging::StagingLayout;

/// An event or operation the communicator cannot accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollError {
    /// The operation or configuration is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A write completion for a write this communicator did not issue (or
    /// already completed).
    #[error("completion for unknown write {0:?}")]
    UnknownWrite(WriteId),
    /// A compute completion for a computation not outstanding.
    #[error("completion for unknown computation {0:?}")]
    UnknownCompute(ComputeId),
    /// A peer outside the communicator, or this rank itself.
    #[error("rank {peer} is not a peer of rank {rank} in a world of {world}")]
    BadPeer {
        /// The offending rank.
        peer: Rank,
        /// This rank.
        rank: Rank,
        /// World size.
        world: u32,
    },
    /// A peer broke the slot protocol: a message in a slot that is still
    /// full, a sequence number other than the expected one, a credit for a
    /// slot not in use, a slot index out of range, or a message of the
    /// wrong length. Usually ranks disagree on the order or parameters of
    /// operations.
    #[error("protocol violation by rank {peer}: {what}")]
    Protocol {
        /// The peer at fault.
        peer: Rank,
        /// What went wrong.
        what: String,
    },
    /// An earlier error left the communicator unusable.
    #[error("the communicator failed earlier: {0}")]
    Failed(String),
}

/// Counters of one communicator's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommStats {
    /// Data writes posted.
    pub data_writes: u64,
    /// Payload bytes of the data writes.
    pub data_bytes: u64,
    /// Credit writes posted (credits of their own, zero-length).
    pub credit_writes: u64,
    /// Credits that rode on a data write to the same peer instead.
    pub credits_piggybacked: u64,
    /// Computations emitted.
    pub computes: u64,
    /// Bytes of the computations (per operand).
    pub compute_bytes: u64,
    /// Operations completed.
    pub ops_done: u64,
}

/// One staging slot of the connection toward a peer.
#[derive(Clone, Copy, Debug)]
struct TxSlot {
    /// The only sequence number allowed to use the slot next.
    next_seq: u64,
    /// In use by a message whose write or credit is outstanding.
    busy: Option<TxBusy>,
}

#[derive(Clone, Copy, Debug)]
struct TxBusy {
    seq: u64,
    /// The local write completed (the outgoing slot may be reused).
    written: bool,
    /// The receiver consumed it (its incoming slot may be rewritten).
    credited: bool,
}

/// One staging slot of the connection from a peer.
#[derive(Clone, Copy, Debug)]
struct RxSlot {
    /// The sequence number that lands here next.
    expected_seq: u64,
    /// Length of the message sitting in the slot, not yet consumed.
    arrived: Option<u64>,
}

/// Both directions with one peer.
#[derive(Debug)]
struct Link {
    /// First sequence number of the next operation's messages to the peer.
    tx_base: u64,
    tx: Vec<TxSlot>,
    /// First sequence number of the next operation's messages from the peer.
    rx_base: u64,
    rx: Vec<RxSlot>,
    /// Credits owed to the peer (slot, message), oldest first: held until
    /// a data write to the peer can carry one, or the communicator runs out
    /// of work for now (see [`Communicator::poll_action`] for the one it
    /// may keep even then).
    owed: VecDeque<(u8, u64)>,
    /// The last operation that wrote data to the peer.
    last_write_op: Option<u64>,
}

impl Link {
    fn new(slots: u32) -> Self {
        Self {
            tx_base: 0,
            tx: (0..u64::from(slots))
                .map(|s| TxSlot {
                    next_seq: s,
                    busy: None,
                })
                .collect(),
            rx_base: 0,
            rx: (0..u64::from(slots))
                .map(|s| RxSlot {
                    expected_seq: s,
                    arrived: None,
                })
                .collect(),
            owed: VecDeque::new(),
            last_write_op: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for dependencies, the message, or a slot.
    Waiting,
    /// Running step `0`-based index.
    Computing(usize),
    /// Write posted, waiting for its local completion.
    Writing,
    Done,
}

#[derive(Clone, Copy, Debug)]
struct TaskState {
    deps_left: u32,
    phase: Phase,
}

/// What a write id stands for.
#[derive(Clone, Copy, Debug)]
enum WriteRecord {
    Data { peer: Rank, seq: u64, task: u32 },
    Credit,
}

/// A queued operation.
#[derive(Debug)]
struct Queued {
    id: OpId,
    spec: OpSpec,
    plan: Plan,
}

/// The operation running now.
#[derive(Debug)]
struct Active {
    id: OpId,
    dtype: DataType,
    reduce_op: ReduceOp,
    plan: Plan,
    state: Vec<TaskState>,
    dependents: Vec<Vec<u32>>,
    /// Per peer: sequence number of this operation's first message to it,
    /// and the task sending each of its messages.
    send_base: Vec<u64>,
    send_task: Vec<Vec<u32>>,
    recv_base: Vec<u64>,
    recv_task: Vec<Vec<u32>>,
    left: usize,
}

impl Active {
    fn send_task_for(&self, peer: Rank, seq: u64) -> Option<u32> {
        let i = seq.checked_sub(self.send_base[peer as usize])?;
        self.send_task[peer as usize]
            .get(usize::try_from(i).ok()?)
            .copied()
    }

    fn recv_task_for(&self, peer: Rank, seq: u64) -> Option<u32> {
        let i = seq.checked_sub(self.recv_base[peer as usize])?;
        self.recv_task[peer as usize]
            .get(usize::try_from(i).ok()?)
            .copied()
    }
}

/// One rank of a communicator.
///
/// See the crate documentation for the driving contract.
#[derive(Debug)]
pub struct Communicator {
    rank: Rank,
    world: u32,
    config: CommConfig,
    layout: StagingLayout,
    links: Vec<Link>,
    queue: VecDeque<Queued>,
    active: Option<Active>,
    actions: VecDeque<Action>,
    writes: HashMap<WriteId, WriteRecord>,
    computes: HashMap<ComputeId, u32>,
    next_op: u64,
    next_write: u64,
    next_compute: u64,
    /// Tasks whose readiness must be (re)examined.
    ready: Vec<u32>,
    stats: CommStats,
    failed: Option<String>,
}

impl Communicator {
    /// Rank `rank` of a `world`-rank communicator.
    pub fn new(rank: Rank, world: u32, config: CommConfig) -> Result<Self, CollError> {
        config.validate()?;
        if world == 0 || rank >= world {
            return Err(
                SpecError::Invalid(format!("rank {rank} is not in a world of {world}")).into(),
            );
        }
        Ok(Self {
            rank,
            world,
            config,
            layout: StagingLayout::new(world, rank, config.slots, config.slot_bytes),
            links: (0..world).map(|_| Link::new(config.slots)).collect(),
            queue: VecDeque::new(),
            active: None,
            actions: VecDeque::new(),
            writes: HashMap::new(),
            computes: HashMap::new(),
            next_op: 0,
            next_write: 0,
            next_compute: 0,
            ready: Vec::new(),
            stats: CommStats::default(),
            failed: None,
        })
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// The settings.
    pub fn config(&self) -> &CommConfig {
        &self.config
    }

    /// Sets [`CommConfig::ranks_share_cores`] for the operations started
    /// from now on (a job learns it at bootstrap, after its communicators
    /// exist). It changes what `Algorithm::Auto` picks, so every rank must
    /// set the same value before the same operation.
    pub fn set_ranks_share_cores(&mut self, shared: bool) {
        self.config.ranks_share_cores = shared;
    }

    /// Where slots live in this rank's staging area (and, by the same rule,
    /// in every peer's).
    pub fn staging_layout(&self) -> StagingLayout {
        self.layout
    }

    /// Counters so far.
    pub fn stats(&self) -> CommStats {
        self.stats
    }

    /// Credits owed to peers and not yet sent (kept for a data write to
    /// carry; see [`poll_action`](Self::poll_action)).
    pub fn credits_owed(&self) -> usize {
        self.links.iter().map(|l| l.owed.len()).sum()
    }

    /// True when no operation is running or queued.
    pub fn is_idle(&self) -> bool {
        self.active.is_none() && self.queue.is_empty()
    }

    /// Queues an operation; it starts when the ones before it are done.
    /// Every rank must start the same operations in the same order (point
    /// to point groups only on the ranks they involve).
    pub fn start(&mut self, spec: OpSpec) -> Result<OpId, CollError> {
        self.check_alive()?;
        let plan = plan::build(&spec, self.rank, self.world, &self.config)?;
        let id = OpId(self.next_op);
        self.next_op += 1;
        self.queue.push_back(Queued { id, spec, plan });
        if self.active.is_none() {
            self.activate_next();
            self.drain_ready()?;
        }
        Ok(id)
    }

    /// The algorithm an operation would run with, without starting it.
    pub fn algorithm_for(&self, spec: &OpSpec) -> Result<Algorithm, CollError> {
        Ok(spec
            .algorithm
            .resolve(&spec.collective, spec.bytes(), self.world, &self.config)?)
    }

    /// The next action for the driver, if any.
    ///
    /// Credits owed to peers come out last: once nothing else is queued and
    /// no computation is outstanding (its end may start a write to the
    /// same peer, which then carries the credit instead).
    ///
    /// Even then one credit owed to a peer may stay, for the next data
    /// write to it to carry, when
    /// - this rank wrote data to that peer in this operation or the one
    ///   before (a small all-reduce writes to every partner in every
    ///   operation; a ring never writes to the rank it receives from, whose
    ///   credits all go), and
    /// - the slot it frees is next needed by one of the peer's messages of
    ///   a later operation than the running one.
    ///
    /// A kept credit so never holds up a message of the running operation
    /// (of any rank's: the messages it holds up are of later operations
    /// than the holder's own), and the lowest operation any rank runs always
    /// moves. It halves the datagrams (writes and their acknowledgements)
    /// of a small all-reduce beyond 2 ranks, where a partner's credit falls
    /// due while this rank writes to another partner.
    pub fn poll_action(&mut self) -> Option<Action> {
        if self.actions.is_empty() && self.computes.is_empty() {
            self.flush_credits();
        }
        self.actions.pop_front()
    }

    /// Queues owed credits as zero-length writes of their own, all but the
    /// one [`poll_action`](Self::poll_action) lets a rank keep. Called
    /// whenever the communicator runs out of work for now. (Keeping any
    /// credit across waits deadlocked: message `k + slots` needs the very
    /// slot message `k`'s credit frees, and a peer may want to send it
    /// before anything else we wait for. Hence the kept credit's rule.)
    fn flush_credits(&mut self) {
        let op = self.active.as_ref().map_or(OpId(self.next_op), |a| a.id);
        let slots = u64::from(self.config.slots);
        for peer in 0..self.world {
            let link = &mut self.links[peer as usize];
            let writes_to_peer = link.last_write_op.is_some_and(|w| w + 1 >= op.0);
            // The credit kept: the newest message's, and only if the slot it
            // frees is next needed by a message of a later operation than
            // the running one (`rx_base` is where the running operation's
            // messages from the peer end).
            let keep = link
                .owed
                .iter()
                .enumerate()
                .max_by_key(|(_, (_, seq))| *seq)
                .filter(|(_, (_, seq))| writes_to_peer && seq + slots >= link.rx_base)
                .map(|(i, _)| i);
            let kept = keep.and_then(|i| link.owed.remove(i));
            while let Some((slot, seq)) = self.links[peer as usize].owed.pop_front() {
                let id = self.write_id();
                self.writes.insert(id, WriteRecord::Credit);
                self.stats.credit_writes += 1;
                self.actions.push_back(Action::Write(Write {
                    id,
                    op,
                    peer,
                    src: Loc::new(Buf::Staging, 0),
                    target: Buf::Staging,
                    remote_offset: 0,
                    len: 0,
                    imm: Imm::credit(slot, seq).encode(),
                    purpose: WritePurpose::Credit,
                }));
            }
            self.links[peer as usize].owed.extend(kept);
        }
    }

    /// Our write `id` completed locally: its source may be reused.
    pub fn on_write_done(&mut self, id: WriteId) -> Result<(), CollError> {
        self.check_alive()?;
        let Some(rec) = self.writes.remove(&id) else {
            return self.fail(CollError::UnknownWrite(id));
        };
        if let WriteRecord::Data { peer, seq, task } = rec {
            let slot = (seq % u64::from(self.config.slots)) as usize;
            let tx = &mut self.links[peer as usize].tx[slot];
            match &mut tx.busy {
                Some(b) if b.seq == seq && !b.written => b.written = true,
                _ => unreachable!("a recorded data write owns its slot until written"),
            }
            self.release_tx_slot(peer, slot);
            self.complete(task);
            self.drain_ready()?;
        }
        Ok(())
    }

    /// A peer's WRITE_WITH_IMM of `len` bytes landed in our staging area:
    /// the receive completion, with the immediate data.
    pub fn on_write_arrived(&mut self, peer: Rank, imm: u32, len: u64) -> Result<(), CollError> {
        self.check_alive()?;
        if peer >= self.world || peer == self.rank {
            return self.fail(CollError::BadPeer {
                peer,
                rank: self.rank,
                world: self.world,
            });
        }
        let slots = self.config.slots;
        let protocol = |what: String| CollError::Protocol { peer, what };
        match Imm::decode(imm) {
            Imm::Data {
                slot,
                seq_low,
                credit,
            } => {
                if u32::from(slot) >= slots {
                    return self.fail(protocol(format!("data in slot {slot} of {slots}")));
                }
                let rx = self.links[peer as usize].rx[slot as usize];
                if rx.arrived.is_some() {
                    return self.fail(protocol(format!(
                        "data into slot {slot}, which still holds message {}",
                        rx.expected_seq
                    )));
                }
                if !seq_low.matches(rx.expected_seq) {
                    return self.fail(protocol(format!(
                        "message {seq_low} in slot {slot}, expected {}",
                        rx.expected_seq
                    )));
                }
                if len > self.config.slot_bytes {
                    return self.fail(protocol(format!("{len}-byte message exceeds the slot")));
                }
                if let Some((cslot, cseq)) = credit {
                    self.take_credit(peer, cslot, cseq)?;
                }
                self.links[peer as usize].rx[slot as usize].arrived = Some(len);
                let seq = rx.expected_seq;
                if let Some(t) = self
                    .active
                    .as_ref()
                    .and_then(|a| a.recv_task_for(peer, seq))
                {
                    self.ready.push(t);
                }
            }
            Imm::Credit { slot, seq_low } => self.take_credit(peer, slot, seq_low)?,
        }
        self.drain_ready()
    }

    /// Computation `id` finished (a simulator may report it after the time
    /// it models, a CPU driver right after running it).
    pub fn on_compute_done(&mut self, id: ComputeId) -> Result<(), CollError> {
        self.check_alive()?;
        let Some(task) = self.computes.remove(&id) else {
            return self.fail(CollError::UnknownCompute(id));
        };
        let active = self
            .active
            .as_mut()
            .expect("a computation belongs to the running operation");
        let Phase::Computing(i) = active.state[task as usize].phase else {
            unreachable!("an outstanding computation's task is computing");
        };
        if i + 1 < active.plan.tasks[task as usize].steps.len() {
            active.state[task as usize].phase = Phase::Computing(i + 1);
            self.emit_step(task, i + 1);
        } else {
            self.after_steps(task);
        }
        self.drain_ready()
    }

    /// The peer consumed our message (`seq_low`) in `slot`.
    fn take_credit(&mut self, peer: Rank, slot: u8, seq_low: SeqLow) -> Result<(), CollError> {
        let slots = self.config.slots;
        if u32::from(slot) >= slots {
            return self.fail(CollError::Protocol {
                peer,
                what: format!("credit for slot {slot} of {slots}"),
            });
        }
        let tx = &mut self.links[peer as usize].tx[slot as usize];
        match &mut tx.busy {
            Some(b) if !b.credited && seq_low.matches(b.seq) => b.credited = true,
            _ => {
                return self.fail(CollError::Protocol {
                    peer,
                    what: format!(
                        "credit for message {seq_low} in slot {slot}, which is not awaiting one"
                    ),
                });
            }
        }
        self.release_tx_slot(peer, slot as usize);
        Ok(())
    }

    fn check_alive(&self) -> Result<(), CollError> {
        match &self.failed {
            Some(why) => Err(CollError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    fn fail<T>(&mut self, e: CollError) -> Result<T, CollError> {
        self.failed = Some(e.to_string());
        Err(e)
    }

    /// Frees a sending slot once both its write and its credit are back, and
    /// wakes the task whose message uses it next.
    fn release_tx_slot(&mut self, peer: Rank, slot: usize) {
        let slots = u64::from(self.config.slots);
        let tx = &mut self.links[peer as usize].tx[slot];
        let Some(b) = tx.busy else { return };
        if !(b.written && b.credited) {
            return;
        }
        tx.busy = None;
        tx.next_seq = b.seq + slots;
        let next = tx.next_seq;
        if let Some(t) = self
            .active
            .as_ref()
            .and_then(|a| a.send_task_for(peer, next))
        {
            self.ready.push(t);
        }
    }

    fn activate_next(&mut self) {
        while self.active.is_none() {
            let Some(q) = self.queue.pop_front() else {
                return;
            };
            let world = self.world as usize;
            let n = q.plan.tasks.len();
            let mut dependents = vec![Vec::new(); n];
            let mut state = Vec::with_capacity(n);
            let mut send_task = vec![Vec::new(); world];
            let mut recv_task = vec![Vec::new(); world];
            for (p, &c) in q.plan.sends_to.iter().enumerate() {
                send_task[p] = vec![u32::MAX; c as usize];
            }
            for (p, &c) in q.plan.recvs_from.iter().enumerate() {
                recv_task[p] = vec![u32::MAX; c as usize];
            }
            for (i, t) in q.plan.tasks.iter().enumerate() {
                for &d in &t.deps {
                    dependents[d as usize].push(i as u32);
                }
                state.push(TaskState {
                    deps_left: t.deps.len() as u32,
                    phase: Phase::Waiting,
                });
                if let Some(s) = t.send {
                    send_task[s.peer as usize][s.index as usize] = i as u32;
                }
                if let Some(r) = t.recv {
                    recv_task[r.peer as usize][r.index as usize] = i as u32;
                }
            }
            let mut send_base = vec![0; world];
            let mut recv_base = vec![0; world];
            for p in 0..world {
                let link = &mut self.links[p];
                send_base[p] = link.tx_base;
                recv_base[p] = link.rx_base;
                link.tx_base += u64::from(q.plan.sends_to[p]);
                link.rx_base += u64::from(q.plan.recvs_from[p]);
            }
            self.ready
                .extend((0..n as u32).filter(|&i| state[i as usize].deps_left == 0));
            if n == 0 {
                self.actions.push_back(Action::Done(q.id));
                self.stats.ops_done += 1;
                continue;
            }
            self.active = Some(Active {
                id: q.id,
                dtype: q.spec.dtype,
                reduce_op: if q.spec.collective.reduces() {
                    q.spec.op
                } else {
                    ReduceOp::Sum
                },
                plan: q.plan,
                state,
                dependents,
                send_base,
                send_task,
                recv_base,
                recv_task,
                left: n,
            });
        }
    }

    /// Examines every task marked ready until none is left.
    fn drain_ready(&mut self) -> Result<(), CollError> {
        while let Some(t) = self.ready.pop() {
            self.try_start(t)?;
        }
        Ok(())
    }

    /// Starts task `t` if its dependencies are done, its message has
    /// arrived and its sending slot is free.
    fn try_start(&mut self, t: u32) -> Result<(), CollError> {
        let slots = u64::from(self.config.slots);
        let Some(active) = self.active.as_ref() else {
            return Ok(());
        };
        let st = active.state[t as usize];
        if st.deps_left > 0 || st.phase != Phase::Waiting {
            return Ok(());
        }
        let task = &active.plan.tasks[t as usize];
        let has_steps = !task.steps.is_empty();
        let recv = task
            .recv
            .map(|r| (r, active.recv_base[r.peer as usize] + u64::from(r.index)));
        let send = task
            .send
            .map(|s| (s, active.send_base[s.peer as usize] + u64::from(s.index)));
        if let Some((r, seq)) = recv {
            let rx = &self.links[r.peer as usize].rx[(seq % slots) as usize];
            if rx.expected_seq != seq {
                return Ok(());
            }
            match rx.arrived {
                None => return Ok(()),
                Some(len) if len != r.len => {
                    let what = format!("message {seq} has {len} bytes, the plan expects {}", r.len);
                    return self.fail(CollError::Protocol { peer: r.peer, what });
                }
                Some(_) => {}
            }
        }
        if let Some((s, seq)) = send {
            let tx = &mut self.links[s.peer as usize].tx[(seq % slots) as usize];
            if tx.busy.is_some() || tx.next_seq != seq {
                return Ok(());
            }
            // Claim the slot now: the steps may be filling its outgoing half.
            tx.busy = Some(TxBusy {
                seq,
                written: false,
                credited: false,
            });
        }
        if has_steps {
            let active = self.active.as_mut().expect("checked above");
            active.state[t as usize].phase = Phase::Computing(0);
            self.emit_step(t, 0);
        } else {
            self.after_steps(t);
        }
        Ok(())
    }

    fn resolve(&self, t: u32, op: Operand) -> Loc {
        let slots = u64::from(self.config.slots);
        let active = self
            .active
            .as_ref()
            .expect("operands resolve in the active operation");
        let task = &active.plan.tasks[t as usize];
        match op {
            Operand::User(loc) => loc,
            Operand::InSlot => {
                let r = task
                    .recv
                    .expect("an in-slot operand belongs to a receiving task");
                let seq = active.recv_base[r.peer as usize] + u64::from(r.index);
                Loc::new(
                    Buf::Staging,
                    self.layout.in_slot(r.peer, (seq % slots) as u32),
                )
            }
            Operand::OutSlot => {
                let s = task
                    .send
                    .expect("an out-slot operand belongs to a sending task");
                let seq = active.send_base[s.peer as usize] + u64::from(s.index);
                Loc::new(
                    Buf::Staging,
                    self.layout.out_slot(s.peer, (seq % slots) as u32),
                )
            }
        }
    }

    fn emit_step(&mut self, t: u32, i: usize) {
        let active = self
            .active
            .as_ref()
            .expect("steps run in the active operation");
        let task = &active.plan.tasks[t as usize];
        let (step, len) = (task.steps[i], task.step_len);
        let (op, dtype, reduce_op) = (active.id, active.dtype, active.reduce_op);
        let r = |x| self.resolve(t, x);
        let kind = match step {
            Step::Copy { dst, src } => ComputeKind::Copy {
                dst: r(dst),
                src: r(src),
            },
            Step::Reduce { dst, a, b } => ComputeKind::Reduce {
                dst: r(dst),
                a: r(a),
                b: r(b),
            },
            Step::Premultiply { dst, src } => ComputeKind::Premultiply {
                dst: r(dst),
                src: r(src),
            },
            Step::PostDivide { dst } => ComputeKind::PostDivide { dst: r(dst) },
        };
        let id = ComputeId(self.next_compute);
        self.next_compute += 1;
        self.stats.computes += 1;
        self.stats.compute_bytes += len;
        self.computes.insert(id, t);
        self.actions.push_back(Action::Compute(Compute {
            id,
            op,
            kind,
            len,
            dtype,
            reduce_op,
            world: self.world,
        }));
    }

    /// The task's steps are done: give back its received slot, post its
    /// write, or finish it.
    fn after_steps(&mut self, t: u32) {
        let slots = u64::from(self.config.slots);
        let active = self.active.as_ref().expect("task of the active operation");
        let op = active.id;
        let task = &active.plan.tasks[t as usize];
        let recv = task
            .recv
            .map(|r| (r, active.recv_base[r.peer as usize] + u64::from(r.index)));
        let send = task
            .send
            .map(|s| (s, active.send_base[s.peer as usize] + u64::from(s.index)));
        if let Some((r, seq)) = recv {
            let slot = (seq % slots) as usize;
            let rx = &mut self.links[r.peer as usize].rx[slot];
            rx.arrived = None;
            rx.expected_seq = seq + slots;
            self.links[r.peer as usize]
                .owed
                .push_back((slot as u8, seq));
        }
        let Some((s, seq)) = send else {
            return self.complete(t);
        };
        let slot = (seq % slots) as u32;
        let src = match s.src {
            SendSource::User(loc) => loc,
            SendSource::OutSlot => Loc::new(Buf::Staging, self.layout.out_slot(s.peer, slot)),
        };
        let id = self.write_id();
        let active = self.active.as_mut().expect("task of the active operation");
        active.state[t as usize].phase = Phase::Writing;
        self.writes.insert(
            id,
            WriteRecord::Data {
                peer: s.peer,
                seq,
                task: t,
            },
        );
        self.stats.data_writes += 1;
        self.stats.data_bytes += s.len;
        self.links[s.peer as usize].last_write_op = Some(op.0);
        let imm = match self.links[s.peer as usize].owed.pop_front() {
            Some((cslot, cseq)) => {
                self.stats.credits_piggybacked += 1;
                Imm::data_with_credit(slot as u8, seq, cslot, cseq)
            }
            None => Imm::data(slot as u8, seq),
        };
        self.actions.push_back(Action::Write(Write {
            id,
            op,
            peer: s.peer,
            src,
            // A direct message still takes its slot's turn (the credit
            // protocol is the same); only its bytes skip the slot.
            target: if s.into_recv.is_some() {
                Buf::Recv
            } else {
                Buf::Staging
            },
            remote_offset: s
                .into_recv
                .unwrap_or_else(|| self.layout.remote_in_slot(s.peer, slot)),
            len: s.len,
            imm: imm.encode(),
            purpose: s.purpose,
        }));
    }

    fn write_id(&mut self) -> WriteId {
        let id = WriteId(self.next_write);
        self.next_write += 1;
        id
    }

    /// Task `t` is finished: release its dependents, maybe the operation.
    fn complete(&mut self, t: u32) {
        let active = self.active.as_mut().expect("task of the active operation");
        active.state[t as usize].phase = Phase::Done;
        active.left -= 1;
        for i in 0..active.dependents[t as usize].len() {
            let d = active.dependents[t as usize][i];
            let st = &mut active.state[d as usize];
            st.deps_left -= 1;
            if st.deps_left == 0 {
                self.ready.push(d);
            }
        }
        if active.left == 0 {
            let id = active.id;
            self.active = None;
            self.ready.clear();
            self.stats.ops_done += 1;
            self.actions.push_back(Action::Done(id));
            self.activate_next();
        }
    }
}
