//! The MetaRoCE protocol core, sans-IO.
//!
//! It carries RDMA operations (WRITE, WRITE_WITH_IMM, READ, SEND/RECV,
//! FETCH_ADD, CMP_SWAP) reliably over a lossy, multipath UDP fabric. It owns
//! no socket, no thread and no clock: the caller feeds it datagrams and time
//! and drains packets, deadlines and completions (see [`Endpoint`] for the
//! calling contract). The UDP datapath, the fabric simulator and the
//! deterministic harness all drive this same code.
//!
//! Map of the crate, following a packet:
//! - [`endpoint`]: the device: memory, QPs, connections, the driving calls;
//! - `connection`: one peer: paths, queues, ACKs, timers;
//! - [`path`] and [`sack`]: per-path sequence spaces, SACK bitmaps, RTT ([`rtt`]);
//! - `message`: an operation cut into MTU segments, each resent on its own;
//! - `ops`: what an operation does at the responder and how the requester
//!   completes it (exactly once, completions in order);
//! - [`memory`]: regions, keys, access checks, placement;
//! - [`auth`]: per-connection packet keys, AES-GCM tags, the anti-replay window;
//! - [`cc`]: congestion control behind one trait;
//! - [`work`]: work requests and completions in ibverbs vocabulary.
#![forbid(unsafe_code)]

pub mod auth;
pub mod cc;
pub mod config;
mod connection;
mod device_state;
mod ecn;
pub mod endpoint;
mod grow;
mod maybe_ns;
pub mod memory;
mod message;
mod packet_repr;
pub mod path;
pub mod qp;
pub mod range_set;
mod rate_hint;
pub mod rtt;
pub mod sack;
mod seeded_rng;
mod stats;
#[doc(hidden)]
pub mod testing;
mod transmit;
pub mod work;

pub use auth::AuthConfig;
pub use config::{ConfigError, EndpointConfig};
pub use connection::ConnectionStats;
pub use ecn::Ecn;
pub use endpoint::{Endpoint, PostError, QpError};
pub use memory::{AccessFlags, MemoryError, MrHandle, MrInfo};
pub use packet_repr::{PacketRepr, PacketSlot};
pub use path::PathStats;
pub use qp::{QpCaps, QpHandle, QpRunState};
pub use stats::EndpointStats;
pub use transmit::{Layout, PacketKind, PayloadRef, Transmit};
pub use work::{
    Completion, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WorkQueue, WrOp,
};
