//! A deterministic in-process network for testing communicators.
//!
//! [`TestNet`] holds every rank of a communicator in one process, like
//! quinn's `Pair`: it turns each rank's [`Write`]s into deliveries (copying
//! the bytes into the target's staging area), runs [`Compute`]s on the
//! rank's buffers, and feeds the completions back, one event at a time in
//! an order chosen by a seeded generator ([`Delivery`]). The same seed gives
//! the same run.
//!
//! It checks the driving contract as it goes: a write's source bytes must
//! not change between posting and local completion (except by the direct
//! write of a symmetric operation from the peer that already took them in,
//! see [`OpSpec::symmetric`]), writes must stay inside the target's staging
//! area (or output, for a direct write), and a run that ends with an
//! operation still pending is a deadlock ([`NetError::Stalled`]).
//!
//! With [`Payload::SizesOnly`] the network holds no bytes at all and runs no
//! computation, only lengths: the way a discrete-event simulator drives the
//! same state machine. [`TestNet::trace`] records what each rank asked for,
//! so the two modes can be compared action for action.
//!
//! [`reference`](mod@reference) builds inputs whose reductions are exact and the expected
//! outputs of every collective, and [`check`] runs an operation end to end
//! and compares element by element.

pub mod reference;

use std::collections::VecDeque;

use crate::action::{Action, Compute, Loc, OpId, Rank, Write, WriteId, WritePurpose};
use crate::buffers::{ExecError, LocalBuffers};
use crate::comm::{CollError, CommStats, Communicator};
use crate::spec::{CommConfig, OpSpec};

pub use reference::{CheckReport, check};

/// The order in which pending events happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// First posted, first delivered, across the whole network.
    Fifo,
    /// Any pending event next, chosen uniformly by a generator with this
    /// seed: writes overtake each other, completions come before or after
    /// arrivals, computations take arbitrarily long.
    Random(u64),
}

/// Whether the network carries data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Buffers hold bytes; writes copy them and computations run.
    Bytes,
    /// Only lengths: no buffer, no copy, no kernel.
    SizesOnly,
}

/// Something the network or a rank refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// A communicator rejected an event.
    #[error("rank {rank}: {error}")]
    Comm {
        /// The rank.
        rank: Rank,
        /// Its error.
        error: CollError,
    },
    /// A computation or a write's bytes could not be applied.
    #[error("rank {rank}: {error}")]
    Exec {
        /// The rank.
        rank: Rank,
        /// What failed.
        error: ExecError,
    },
    /// A write's source changed before the write completed locally.
    #[error("rank {rank}: source of write {write:?} changed before it completed")]
    SourceChanged {
        /// The writing rank.
        rank: Rank,
        /// The write.
        write: WriteId,
    },
    /// Nothing left to deliver but operations still pending: a deadlock.
    #[error("stalled with operations pending on ranks {pending:?}")]
    Stalled {
        /// Ranks whose communicator is not idle.
        pending: Vec<Rank>,
    },
}

/// One thing a rank asked its driver for (sizes only, as a simulator sees it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceEntry {
    /// A write of `len` bytes to `peer`.
    Write {
        /// Writing rank.
        rank: Rank,
        /// Target.
        peer: Rank,
        /// Bytes.
        len: u64,
        /// Why.
        purpose: WritePurpose,
    },
    /// A computation over `len` bytes.
    Compute {
        /// Computing rank.
        rank: Rank,
        /// Bytes per operand.
        len: u64,
    },
    /// An operation finished on `rank`.
    Done {
        /// The rank.
        rank: Rank,
        /// The operation.
        op: OpId,
    },
}

#[derive(Debug)]
enum Event {
    /// A posted write reaches its target's memory.
    Place {
        from: Rank,
        write: Write,
        bytes: Vec<u8>,
    },
    /// The target's receive completion.
    Arrive {
        to: Rank,
        from: Rank,
        id: WriteId,
        imm: u32,
        len: u64,
    },
    /// The writer's local completion.
    WriteDone {
        at: Rank,
        peer: Rank,
        id: WriteId,
        src: Loc,
        bytes: Vec<u8>,
    },
    /// A computation finishes.
    ComputeDone { at: Rank, compute: Compute },
}

#[derive(Debug)]
struct Node {
    comm: Communicator,
    send: Vec<u8>,
    recv: Vec<u8>,
    staging: Vec<u8>,
    done: Vec<OpId>,
    /// Byte ranges `(offset, len)` of `recv` that direct writes of each
    /// peer overwrote (by peer rank).
    overwritten_by: Vec<Vec<(u64, u64)>>,
    /// This rank's writes that have arrived at their target.
    arrived: std::collections::HashSet<WriteId>,
}

impl Node {
    fn buffers(&mut self) -> LocalBuffers<'_> {
        LocalBuffers {
            send: &self.send,
            recv: &mut self.recv,
            staging: &mut self.staging,
        }
    }
}

/// SplitMix64: small, seedable, good enough to shuffle events.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Every rank of one communicator and the network between them.
#[derive(Debug)]
pub struct TestNet {
    nodes: Vec<Node>,
    events: VecDeque<Event>,
    rng: Option<SplitMix64>,
    payload: Payload,
    trace: Vec<TraceEntry>,
    events_run: u64,
}

impl TestNet {
    /// A network of `world` ranks sharing `config`.
    pub fn new(
        world: u32,
        config: CommConfig,
        delivery: Delivery,
        payload: Payload,
    ) -> Result<Self, CollError> {
        let mut nodes = Vec::with_capacity(world as usize);
        for rank in 0..world {
            let comm = Communicator::new(rank, world, config)?;
            let staging = match payload {
                Payload::Bytes => vec![0u8; comm.staging_layout().bytes() as usize],
                Payload::SizesOnly => Vec::new(),
            };
            nodes.push(Node {
                comm,
                send: Vec::new(),
                recv: Vec::new(),
                staging,
                done: Vec::new(),
                overwritten_by: vec![Vec::new(); world as usize],
                arrived: std::collections::HashSet::new(),
            });
        }
        Ok(Self {
            nodes,
            events: VecDeque::new(),
            rng: match delivery {
                Delivery::Fifo => None,
                Delivery::Random(seed) => Some(SplitMix64::new(seed)),
            },
            payload,
            trace: Vec::new(),
            events_run: 0,
        })
    }

    /// Ranks.
    pub fn world(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// Gives `rank` its buffers for the next operation (ignored sizes-only).
    pub fn set_buffers(&mut self, rank: Rank, send: Vec<u8>, recv: Vec<u8>) {
        let node = &mut self.nodes[rank as usize];
        node.send = send;
        node.recv = recv;
        node.overwritten_by.iter_mut().for_each(Vec::clear);
    }

    /// `rank`'s send and receive buffers.
    pub fn buffers(&self, rank: Rank) -> (&[u8], &[u8]) {
        let node = &self.nodes[rank as usize];
        (&node.send, &node.recv)
    }

    /// `rank`'s communicator.
    pub fn comm(&self, rank: Rank) -> &Communicator {
        &self.nodes[rank as usize].comm
    }

    /// Counters of `rank`'s communicator.
    pub fn stats(&self, rank: Rank) -> CommStats {
        self.nodes[rank as usize].comm.stats()
    }

    /// Operations finished on `rank`, in order.
    pub fn done(&self, rank: Rank) -> &[OpId] {
        &self.nodes[rank as usize].done
    }

    /// Everything the ranks asked for so far, in the order they asked.
    pub fn trace(&self) -> &[TraceEntry] {
        &self.trace
    }

    /// Events processed so far.
    pub fn events_run(&self) -> u64 {
        self.events_run
    }

    /// Starts an operation on `rank`.
    pub fn start(&mut self, rank: Rank, spec: OpSpec) -> Result<OpId, NetError> {
        let id = self.nodes[rank as usize]
            .comm
            .start(spec)
            .map_err(|error| NetError::Comm { rank, error })?;
        self.drain(rank)?;
        Ok(id)
    }

    /// Turns `rank`'s pending actions into events.
    fn drain(&mut self, rank: Rank) -> Result<(), NetError> {
        while let Some(action) = self.nodes[rank as usize].comm.poll_action() {
            match action {
                Action::Write(w) => {
                    self.trace.push(TraceEntry::Write {
                        rank,
                        peer: w.peer,
                        len: w.len,
                        purpose: w.purpose,
                    });
                    let bytes = match self.payload {
                        Payload::Bytes => {
                            let node = &mut self.nodes[rank as usize];
                            let b = node.buffers();
                            b.read(w.src, w.len)
                                .map_err(|error| NetError::Exec { rank, error })?
                                .to_vec()
                        }
                        Payload::SizesOnly => Vec::new(),
                    };
                    self.events.push_back(Event::Place {
                        from: rank,
                        write: w,
                        bytes,
                    });
                }
                Action::Compute(c) => {
                    self.trace.push(TraceEntry::Compute { rank, len: c.len });
                    self.events.push_back(Event::ComputeDone {
                        at: rank,
                        compute: c,
                    });
                }
                Action::Done(op) => {
                    self.trace.push(TraceEntry::Done { rank, op });
                    self.nodes[rank as usize].done.push(op);
                }
            }
        }
        Ok(())
    }

    /// Checks that write `id`'s source still holds the bytes it was posted
    /// with; `peer` (its target) is set once it has arrived there, and then
    /// bytes that the peer's direct writes overwrote since do not count
    /// (the peer took this write in before it could send them; a transport
    /// does not place a message again once its receiver has it whole).
    fn source_unchanged(
        &mut self,
        rank: Rank,
        id: WriteId,
        src: Loc,
        bytes: &[u8],
        peer: Option<Rank>,
    ) -> Result<(), NetError> {
        if self.payload == Payload::SizesOnly {
            return Ok(());
        }
        let node = &mut self.nodes[rank as usize];
        let now = node
            .buffers()
            .read(src, bytes.len() as u64)
            .map_err(|error| NetError::Exec { rank, error })?
            .to_vec();
        let excused = |i: usize| {
            let at = src.offset + i as u64;
            src.buf == crate::Buf::Recv
                && peer.is_some_and(|q| {
                    node.arrived.contains(&id)
                        && node.overwritten_by[q as usize]
                            .iter()
                            .any(|&(o, l)| (o..o + l).contains(&at))
                })
        };
        if (0..bytes.len()).any(|i| now[i] != bytes[i] && !excused(i)) {
            return Err(NetError::SourceChanged { rank, write: id });
        }
        Ok(())
    }

    /// Processes one event; `false` when none is pending.
    pub fn step(&mut self) -> Result<bool, NetError> {
        let event = match &mut self.rng {
            _ if self.events.is_empty() => return Ok(false),
            None => self.events.pop_front(),
            Some(rng) => {
                let i = rng.below(self.events.len());
                self.events.swap_remove_back(i)
            }
        };
        let Some(event) = event else { return Ok(false) };
        self.events_run += 1;
        match event {
            Event::Place { from, write, bytes } => {
                self.source_unchanged(from, write.id, write.src, &bytes, None)?;
                let to = write.peer;
                if self.payload == Payload::Bytes && write.len > 0 {
                    let node = &mut self.nodes[to as usize];
                    let dst = Loc::new(write.target, write.remote_offset);
                    let mut b = node.buffers();
                    b.write(dst, write.len)
                        .map_err(|error| NetError::Exec { rank: to, error })?
                        .copy_from_slice(&bytes);
                    if write.target == crate::Buf::Recv {
                        node.overwritten_by[from as usize].push((write.remote_offset, write.len));
                    }
                }
                self.events.push_back(Event::Arrive {
                    to,
                    from,
                    id: write.id,
                    imm: write.imm,
                    len: write.len,
                });
                self.events.push_back(Event::WriteDone {
                    at: from,
                    peer: to,
                    id: write.id,
                    src: write.src,
                    bytes,
                });
            }
            Event::Arrive {
                to,
                from,
                id,
                imm,
                len,
            } => {
                self.nodes[from as usize].arrived.insert(id);
                self.nodes[to as usize]
                    .comm
                    .on_write_arrived(from, imm, len)
                    .map_err(|error| NetError::Comm { rank: to, error })?;
                self.drain(to)?;
            }
            Event::WriteDone {
                at,
                peer,
                id,
                src,
                bytes,
            } => {
                self.source_unchanged(at, id, src, &bytes, Some(peer))?;
                self.nodes[at as usize]
                    .comm
                    .on_write_done(id)
                    .map_err(|error| NetError::Comm { rank: at, error })?;
                self.drain(at)?;
            }
            Event::ComputeDone { at, compute } => {
                if self.payload == Payload::Bytes {
                    let node = &mut self.nodes[at as usize];
                    node.buffers()
                        .execute(&compute)
                        .map_err(|error| NetError::Exec { rank: at, error })?;
                }
                self.nodes[at as usize]
                    .comm
                    .on_compute_done(compute.id)
                    .map_err(|error| NetError::Comm { rank: at, error })?;
                self.drain(at)?;
            }
        }
        Ok(true)
    }

    /// Runs until nothing is pending; an operation left unfinished is a
    /// deadlock.
    pub fn run(&mut self) -> Result<(), NetError> {
        while self.step()? {}
        let pending: Vec<Rank> = (0..self.world())
            .filter(|&r| !self.nodes[r as usize].comm.is_idle())
            .collect();
        if !pending.is_empty() {
            return Err(NetError::Stalled { pending });
        }
        Ok(())
    }
}
