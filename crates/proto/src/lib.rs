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
//! - [`endpoint`]: the device and its driving calls: posts (a [`WrOp`]
//!   becomes a message), datagrams in, transmits, timers and completions out;
//!   it owns the device state (`device_state`: memory, the QP table,
//!   completions, counters, the rate hint) and a table of connections;
//! - `connection`: one peer, one file per concern: `transmit` (which
//!   packet, which path), `receive` (data and ACKs), `timers` (RTO,
//!   tail-loss probes, path retirement, retries), and operation semantics as
//!   its children, `responder` (placement, exactly once, RNR, limits) and
//!   `requester` (completions in posting order), which keep their state in
//!   the QP table and reach the connection through a handful of methods;
//! - [`path`] and [`sack`]: per-path sequence spaces, SACK bitmaps, RTT ([`rtt`]);
//! - `message`: an operation cut into MTU segments, each resent on its own;
//! - [`qp`]: the send and receive queues and the responder's message window;
//! - [`memory`]: regions, keys, access checks, placement;
//! - [`auth`]: per-connection packet keys, AES-GCM tags, the anti-replay window;
//! - [`cc`]: congestion control behind one trait;
//! - [`work`]: work requests and completions in ibverbs vocabulary;
//! - [`fast_map`]: the hash map of the per-packet lookups;
//! - leaves that the endpoint and the connection both speak: [`Transmit`]
//!   and [`Layout`] (what a driver sends), [`PacketRepr`] (the simulator's
//!   form), [`Ecn`], [`EndpointStats`];
//! - `trace`: `tracing` spans per connection and path, events at setup
//!   and teardown, losses, resends, RTOs, path retirement, retry timeouts
//!   and QP errors (feature `trace`, on by default; off, or with no
//!   subscriber, they cost nothing measurable);
//! - `testing`: [`testing::Pair`], two endpoints on a virtual clock with a
//!   lossy wire between them, for the crate's tests, benches and the fuzz
//!   targets (not a stable API).
#![forbid(unsafe_code)]

mod admission;
pub mod auth;
pub mod cc;
pub mod config;
mod connection;
mod device_state;
mod direct;
mod ecn;
pub mod endpoint;
pub mod fast_map;
mod grow;
pub mod knob;
mod maybe_ns;
pub mod memory;
mod message;
mod packet_repr;
pub mod path;
mod path_skew;
mod probe_budget;
pub mod qp;
pub mod range_set;
mod recent_ports;
mod reorder;
mod repair;
mod replacement_ports;
pub mod rtt;
mod rtt_ceiling;
mod rtt_histogram;
pub mod sack;
mod seeded_rng;
mod stats;
#[doc(hidden)]
pub mod testing;
mod trace;
mod transmit;
pub mod work;

pub use auth::AuthConfig;
pub use cc::CcMetrics;
pub use config::{ConfigError, DEFAULT_DEVICE_PORT, EndpointConfig, MAX_PATH_BURST_BYTES};
pub use connection::ConnectionStats;
pub use direct::DirectTarget;
pub use ecn::Ecn;
pub use endpoint::{Endpoint, PostError, QpError};
pub use memory::{AccessFlags, MemoryError, MrHandle, MrInfo, RegionMemory};
pub use packet_repr::{PacketRepr, PacketSlot};
pub use path::{PathStats, RxPathStats};
pub use qp::{QpCaps, QpHandle, QpRunState};
pub use stats::{Counters, EndpointStats, PeerCounters, format_counter_lines};
pub use transmit::{Layout, PacketKind, PayloadRef, Transmit};
pub use work::{
    Completion, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WorkQueue, WrOp,
};
