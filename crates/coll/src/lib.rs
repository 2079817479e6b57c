//! MetaRoCE collectives (work in progress).
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
pub mod spec;
pub mod staging;
pub mod testing;

pub use action::{
    Action, Buf, Compute, ComputeId, ComputeKind, Loc, OpId, Rank, Write, WriteId, WritePurpose,
};
pub use buffers::{ExecError, LocalBuffers};
pub use comm::{CollError, CommStats, Communicator};
pub use datatype::{DataType, ReduceOp};
pub use spec::{Algorithm, BufferSizes, CommConfig, Collective, OpSpec, P2p, P2pGroup, SpecError};
pub use staging::StagingLayout;
