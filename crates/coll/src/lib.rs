//! MetaRoCE collectives: all-reduce, reduce-scatter, all-gather, all-to-all,
//! broadcast, reduce, barrier and point-to-point groups, as sans-IO state
//! machines over one-sided RDMA WRITE_WITH_IMM.
//!
//! A [`Communicator`] is one rank's state machine. It owns no socket,
//! thread, timer or data byte: the driver feeds it events and drains
//! [`Action`]s, so the same code runs over a real device (a verbs QP per
//! peer, WRITE_WITH_IMM posted with `post_send`, receive completions from
//! `poll_cq`), over the in-crate test network ([`testing`]), and in a
//! discrete-event simulator that knows only lengths. Algorithms, chunking,
//! the immediate-data encoding, flow control and the algorithm choice are
//! described in `docs/collectives.md`.
//!
//! # Driving contract
//!
//! 1. Every rank creates `Communicator::new(rank, world, config)` with the
//!    same [`CommConfig`], allocates and registers a staging area of
//!    [`staging_layout().bytes()`](StagingLayout::bytes) once, and tells
//!    its peers where it is (address and rkey: the driver's bootstrap). The
//!    staging area is the only memory peers ever write.
//! 2. Each operation is [`start`](Communicator::start)ed with an [`OpSpec`];
//!    every rank starts the same operations in the same order (a
//!    point-to-point group only on the ranks it involves). The driver
//!    provides the buffers [`OpSpec::buffer_sizes`] names: [`Buf::Send`]
//!    (read only) and [`Buf::Recv`]; in place only the latter.
//! 3. The driver drains [`poll_action`](Communicator::poll_action) after
//!    every call and carries out each action:
//!    - [`Action::Write`]: post a WRITE_WITH_IMM of `len` bytes (possibly
//!      zero: no scatter-gather entry) from the local [`Loc`] to the peer's
//!      staging area at `remote_offset`, with `imm` as immediate data and
//!      the [`WriteId`] as work-request id. The source may be in any of the
//!      three buffers, so the driver registers the operation's user buffers
//!      too (or keeps a registration cache). The source must stay untouched
//!      until the write completes, and the state machine guarantees it is.
//!    - [`Action::Compute`]: run it ([`LocalBuffers::execute`], or the
//!      driver's own kernels) and report
//!      [`on_compute_done`](Communicator::on_compute_done); a simulator
//!      charges time for `len` bytes instead and reports it later.
//!    - [`Action::Done`]: the operation is finished on this rank.
//! 4. Completions go back in: a send completion as
//!    [`on_write_done`](Communicator::on_write_done), a receive completion
//!    of a WRITE_WITH_IMM as
//!    [`on_write_arrived`](Communicator::on_write_arrived)`(peer, imm,
//!    byte_len)`. Each incoming WRITE_WITH_IMM consumes a posted receive:
//!    keep at least `2 × slots` receives posted per peer (at most `slots`
//!    data messages and `slots` credits can be outstanding toward a rank
//!    from one peer) and repost one per completion.
//! 5. Events may come in any order the transport produces: completions of
//!    different peers interleave freely, and even one peer's messages may be
//!    reordered. Any error ([`CollError`]) leaves the communicator failed;
//!    the driver abandons it. There is no clock inside: detecting a peer
//!    that died (QP error, timeout) is the driver's job.
//!
//! # Staging slots and credits
//!
//! Each directed connection `a → b` has `slots` staging slots of
//! `slot_bytes` in `b`'s staging area ([`StagingLayout`]). The messages
//! `a` sends `b` are numbered from 0 for the communicator's life; message
//! `k` goes to slot `k mod slots`, and may be written only when message
//! `k - slots` (the slot's previous occupant) has been *credited*: `b`
//! consumed it (copied it out or folded it into something) and returned a
//! zero-length WRITE_WITH_IMM whose immediate names the slot. A slot is
//! never overwritten before its consumer is done, without any
//! synchronization beyond the credits themselves, and a fast rank may run
//! into the next operation while a slow one is still in this one: its
//! messages simply wait in the slow rank's slots. The immediate encoding is
//! in [`imm`]. Messages that need computing before they leave (a ring
//! step's partial sum) are built in an outgoing slot of the sender's own
//! staging area, reused only once both its write and its credit are back.
//!
//! # Example
//!
//! ```
//! use metaroce_coll::testing::{Delivery, Payload, TestNet};
//! use metaroce_coll::{Collective, CommConfig, DataType, OpSpec, ReduceOp};
//!
//! // Three ranks sum 1000 floats over a network that delivers in a
//! // shuffled order.
//! let mut net = TestNet::new(3, CommConfig::default(), Delivery::Random(7), Payload::Bytes)?;
//! let spec = OpSpec::new(Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 1000);
//! for rank in 0..3 {
//!     let input: Vec<u8> = (0..1000).flat_map(|i| (i as f32 * (rank + 1) as f32).to_ne_bytes()).collect();
//!     net.set_buffers(rank, input, vec![0; 4000]);
//!     net.start(rank, spec.clone())?;
//! }
//! net.run()?;
//! let out = net.buffers(2).1;
//! assert_eq!(f32::from_ne_bytes(out[40..44].try_into().unwrap()), 10.0 * 6.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Map
//!
//! - [`datatype`], [`half`], [`kernels`]: element types, NCCL's operators,
//!   half/bfloat16, the reduction kernels over byte slices;
//! - [`spec`]: describing an operation and choosing its algorithm;
//! - `plan`: each algorithm as a task graph for one rank;
//! - [`schedule`](mod@schedule): those task graphs as messages and their dependencies,
//!   for drivers that move data without reducing it (the simulator);
//! - `comm`: the communicator running plans over slots and credits;
//! - [`action`], [`imm`], [`staging`]: what crosses the driver boundary;
//! - [`testing`]: the deterministic in-process network and reference;
//! - [`report`]: nccl-tests' output format and options.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod action;
mod buffers;
mod comm;
pub mod datatype;
pub mod half;
pub mod imm;
pub mod kernels;
mod plan;
pub mod report;
pub mod schedule;
pub mod spec;
pub mod staging;
pub mod testing;

pub use action::{
    Action, Buf, Compute, ComputeId, ComputeKind, Loc, OpId, Rank, Write, WriteId, WritePurpose,
};
pub use buffers::{ExecError, LocalBuffers};
pub use comm::{CollError, CommStats, Communicator};
pub use datatype::{DataType, ReduceOp};
pub use schedule::{Dependency, Message, MessageId, RankSchedule, Receipt, Schedule, schedule};
pub use spec::{Algorithm, BufferSizes, Collective, CommConfig, OpSpec, P2p, P2pGroup, SpecError};
pub use staging::StagingLayout;
