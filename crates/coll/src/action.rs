//! What a [`Communicator`](crate::Communicator) asks its driver to do.
//!
//! Two kinds of work leave the state machine: one-sided writes into a peer's
//! staging memory ([`Write`]) and local computation over the rank's own
//! buffers ([`Compute`]). Both name memory by [`Loc`] (a buffer and a byte
//! offset), never by address, so one action means the same thing to a verbs
//! driver (which maps the buffers to registered memory regions), to the
//! in-crate test network (which holds the bytes in `Vec`s) and to a
//! simulator (which holds no bytes at all and only needs `len`).

use std::fmt;

use crate::datatype::{DataType, ReduceOp};

/// A rank in a communicator, `0..world`.
pub type Rank = u32;

/// One of the three memory areas a rank works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The operation's input buffer (`sendbuff` in NCCL). Never written.
    /// In-place operations have none: their input lives in [`Buf::Recv`].
    Send,
    /// The operation's output buffer (`recvbuff`).
    Recv,
    /// The rank's staging area, registered once for the communicator's life
    /// and the only memory peers write into (see
    /// [`StagingLayout`](crate::StagingLayout)).
    Staging,
}

/// A byte position in one of a rank's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Which buffer.
    pub buf: Buf,
    /// Byte offset from the buffer's start.
    pub offset: u64,
}

impl Loc {
    /// A location in `buf` at `offset` bytes.
    pub const fn new(buf: Buf, offset: u64) -> Self {
        Self { buf, offset }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.buf {
            Buf::Send => "send",
            Buf::Recv => "recv",
            Buf::Staging => "staging",
        };
        write!(f, "{name}+{}", self.offset)
    }
}

/// Identifies one operation started on a communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// Identifies one [`Write`]; a verbs driver uses it as the work request id
/// and hands it back through
/// [`on_write_done`](crate::Communicator::on_write_done).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WriteId(pub u64);

/// Identifies one [`Compute`], handed back through
/// [`on_compute_done`](crate::Communicator::on_compute_done).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComputeId(pub u64);

/// Why a write is sent; for tracing and simulation only (nothing of it
/// travels except what [`Write::imm`] encodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WritePurpose {
    /// Payload of a collective: the algorithm's step and the chunk (pipeline
    /// round) it belongs to.
    Data {
        /// Algorithm step (ring: 0 ..2(n-1); recursive doubling: the
        /// distance's bit index; trees: 0 up, 1 down).
        step: u32,
        /// Pipeline round of the chunk within its block.
        chunk: u32,
    },
    /// A zero-length credit return: the receiver has consumed a staging slot.
    Credit,
}

/// Post an RDMA WRITE_WITH_IMM: `len` bytes from this rank's `src` into the
/// peer's buffer `target` at `remote_offset`, with immediate data `imm`.
/// The target is the peer's staging area, except in an operation on
/// symmetric buffers ([`OpSpec::symmetric`](crate::OpSpec::symmetric)),
/// where a message whose only use is to be copied into the peer's output
/// is written there directly ([`Buf::Recv`], the output of the same
/// operation at the peer).
///
/// `len` may be zero (credits, barrier messages): a WRITE_WITH_IMM without
/// payload (no scatter-gather entry; `src` and `remote_offset` mean nothing
/// then), which still consumes a receive at the peer and delivers `imm`.
/// The source bytes must stay unchanged until the driver reports
/// [`on_write_done`](crate::Communicator::on_write_done) with this
/// [`id`](Self::id); the state machine never touches them before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// Pass back on local completion.
    pub id: WriteId,
    /// The operation it belongs to (credits belong to the operation that
    /// consumed the slot).
    pub op: OpId,
    /// Target rank.
    pub peer: Rank,
    /// Source in this rank's buffers.
    pub src: Loc,
    /// The peer's buffer written: [`Buf::Staging`], or [`Buf::Recv`] for a
    /// direct write of a symmetric operation.
    pub target: Buf,
    /// Byte offset in that buffer.
    pub remote_offset: u64,
    /// Bytes to write.
    pub len: u64,
    /// Immediate data (see [`crate::imm`]).
    pub imm: u32,
    /// What the write is for.
    pub purpose: WritePurpose,
}

/// A local computation over `len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComputeKind {
    /// `dst ← src`.
    Copy {
        /// Destination.
        dst: Loc,
        /// Source.
        src: Loc,
    },
    /// `dst ← a ⊕ b`, element by element; `dst` may be the same location as
    /// `a` (never overlapping it partially), never the same as `b`.
    Reduce {
        /// Destination.
        dst: Loc,
        /// Left operand.
        a: Loc,
        /// Right operand.
        b: Loc,
    },
    /// `dst ← src × (1/world)`: the float average's pre-multiplication of a
    /// rank's own input ([`crate::kernels::premultiply`]); `dst` may equal `src`.
    Premultiply {
        /// Destination.
        dst: Loc,
        /// Source.
        src: Loc,
    },
    /// `dst ← dst / world`: the integer average's final division
    /// ([`crate::kernels::post_divide`]).
    PostDivide {
        /// Data divided in place.
        dst: Loc,
    },
}

/// Run a local computation, then report
/// [`on_compute_done`](crate::Communicator::on_compute_done).
///
/// A driver with bytes runs it with [`LocalBuffers`](crate::LocalBuffers)
/// (or its own kernels); a simulator charges time for `len` bytes and skips it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compute {
    /// Pass back on completion.
    pub id: ComputeId,
    /// The operation it belongs to.
    pub op: OpId,
    /// What to compute.
    pub kind: ComputeKind,
    /// Bytes per operand.
    pub len: u64,
    /// Element type of the operation.
    pub dtype: DataType,
    /// Reduction operator of the operation ([`ReduceOp::Sum`] for non-reducing ones).
    pub reduce_op: ReduceOp,
    /// World size (the average's divisor).
    pub world: u32,
}

/// Work for the driver, drained with
/// [`poll_action`](crate::Communicator::poll_action).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Post a one-sided write.
    Write(Write),
    /// Run a local computation.
    Compute(Compute),
    /// The operation finished on this rank: its output buffer is final and
    /// its buffers are no longer referenced.
    Done(OpId),
}
