//! MetaRoCE collectives over real sockets: the `metaroce-coll` state
//! machines driven over the UDP device, the bootstrap that assembles a
//! communicator from processes on one or many hosts, failure propagation,
//! and the nccl-tests-style measurement behind `metaroce coll-perf`.
//!
//! ```no_run
//! use metaroce_coll::{Collective, DataType, OpSpec, ReduceOp};
//! use metaroce_collnet::{Job, NetConfig, connect};
//!
//! // MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, as torch.distributed.
//! let job = Job::from_env()?;
//! let mut comm = connect(&job, &NetConfig::default())?;
//! let spec = OpSpec::new(Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 1024);
//! let input: Vec<u8> = (0..1024).flat_map(|i| (i as f32).to_ne_bytes()).collect();
//! let mut output = vec![0u8; 4096];
//! comm.run_slices(spec, &input, &mut output)?;
//! comm.finish()?;
//! # Ok::<(), metaroce_collnet::CollNetError>(())
//! ```
//!
//! - [`Job`]: who is in the job and where the root is (environment or host
//!   file);
//! - [`connect`] ([`bootstrap`]): the TCP rendezvous through rank 0, one
//!   QP per peer, the staging regions exchanged;
//! - [`NetComm`]: one rank's communicator over its device — registered
//!   buffers ([`DevBuf`]), [`start`](NetComm::start) /
//!   [`wait`](NetComm::wait), [`run_slices`](NetComm::run_slices) with a
//!   registration cache, [`finish`](NetComm::finish);
//! - `control`: the TCP connections kept to the root, through which a
//!   failure or a dead rank ends every rank's operation with an error;
//! - [`check`]: inputs every rank can compute for every other rank, and
//!   the element-by-element verification;
//! - [`perf`]: nccl-tests' measurement loop.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod bootstrap;
mod buffer;
pub mod check;
mod comm;
mod control;
mod error;
mod job;
pub mod perf;
mod rig;

pub use bootstrap::connect;
pub use buffer::DevBuf;
pub use comm::{DriverStats, Member, NetComm};
pub use error::CollNetError;
pub use job::{DEFAULT_PORT, Job};
pub use metaroce_udp::Impair;
pub use rig::{
    AUTO_MTU_CAP, AUTO_PATHS, LOCAL_MTU_CAP, LOCAL_PATHS, SHARED_CORES_RX_MARK_BYTES, offload_on,
};

use metaroce_coll::CommConfig;
use std::time::Duration;

/// How a rank runs its communicator over sockets. `comm` must be the same
/// on every rank (the bootstrap refuses a rank whose settings differ); the
/// rest is each rank's own.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Staging slots, slot size and algorithm thresholds.
    pub comm: CommConfig,
    /// MTU payload bytes per packet. 0 (the default): sized toward each
    /// peer from the path, the largest payload whose packets leave
    /// unfragmented, at most [`AUTO_MTU_CAP`] toward another host and
    /// [`LOCAL_MTU_CAP`] toward a rank on this one; a value the path to a peer
    /// cannot carry whole is an error when that peer is connected.
    pub mtu: u32,
    /// Paths (UDP source ports) per connection. 0 (the default):
    /// [`AUTO_PATHS`], or [`LOCAL_PATHS`] for a device bound to a loopback
    /// address (every peer on this host).
    pub paths: u32,
    /// Receive-side impairment of this rank's device.
    pub impair: Option<Impair>,
    /// Seed of the device (keys, PSNs).
    pub seed: u64,
    /// The device's UDP port (paths' source ports above it); 0: a free
    /// range. Default [`DEFAULT_DEVICE_PORT`](metaroce_udp::DEFAULT_DEVICE_PORT), 4793.
    pub device_port: u16,
    /// If `device_port`'s range is taken (another rank on this host), pick
    /// a free range instead of failing. On by default; off for a port the
    /// user named.
    pub device_port_fallback: bool,
    /// UDP GSO / GRO allowed. `None` (the default): on, except for a
    /// device bound to a loopback address (every peer on this host) when
    /// the ranks have a core each (`comm.ranks_share_cores` off), see
    /// [`offload_on`].
    pub offload: Option<bool>,
    /// How long the device's engine spins after activity before sleeping.
    /// 0 (the default): never spin; with several ranks per core a spinning
    /// engine takes the CPU its peers need.
    pub busy_poll_ns: u64,
    /// Smallest retransmission timeout.
    pub rto_min_ns: u64,
    /// How long a rank may hold the ACK of a peer's small write (one
    /// copied at post time, which the writer does not wait for) for its
    /// own next write to that peer to carry (the transport's
    /// `deferred_ack_ns`; every rank must use the same value). A small
    /// all-reduce beyond 2 ranks answers a partner's message with one to
    /// the next partner, so those ACKs went alone: half the datagrams of an
    /// 8-byte all-reduce. 0: never hold. Default 500 µs, about one 8-byte
    /// all-reduce at 8 ranks on 2 cores (in five interleaved rounds there,
    /// 8 B took 603 / 479 / 467 µs with 0 / 300 µs / 1 ms; at 4 ranks 166
    /// / 155 / 153 µs); a lost last packet of such a write waits that much
    /// longer for its tail-loss probe.
    pub deferred_ack_ns: u64,
    /// How long the root waits for every rank to join (and a rank for the
    /// root to listen).
    pub bootstrap_timeout: Duration,
    /// An operation with no progress for this long fails.
    pub stall_timeout: Duration,
    /// After the last progress, keep polling the CQ this long before
    /// sleeping on its completion event. 0 (the default): sleep at once,
    /// never spin. A rank with a core of its own gains latency from a few
    /// tens of microseconds; ranks sharing cores lose by it.
    pub poll_before_sleep: Duration,
    /// Give the CPU up between polls of that window (`sched_yield`), as MPI
    /// does when it runs more ranks than cores: a rank that waits lets the
    /// ranks sharing its core run, yet takes its answer without two thread
    /// wake-ups (the device's engine, then its own). Off by default.
    pub yield_while_polling: bool,
    /// After the polling window, sleep on the device's receive socket in
    /// the rank's own thread (the device's `poll_cq_wait`, which takes in
    /// the datagram that wakes it itself, the engine standing aside) instead
    /// of on the CQ's completion event while the device's engine thread
    /// drives the sockets (two wake-ups per completion: engine, then rank).
    /// Off by default. Pays where ranks share cores (8 ranks on 2 cores:
    /// about a fifth less CPU per all-reduce, a third fewer context
    /// switches); costs where each rank has a core, whose engine then
    /// works in parallel with it (2 ranks on 2 cores: half the bus
    /// bandwidth at 4-16 MiB). BENCHMARKS.md, round 4.
    pub sleep_on_socket: bool,
    /// Offer peers to leave the ICRC out of data packets, where the UDP
    /// checksum already covers them (the wire spec's ICRC omission; both
    /// ends must offer). On by default: collectives run unauthenticated,
    /// and on loopback the CRC was a tenth of a rank's CPU.
    pub icrc_omission: bool,
    /// Sees every datagram the rank's device sends and receives (a packet
    /// capture: `metaroce_udp::PcapCapture`); `None`, the default: none.
    pub capture: Option<std::sync::Arc<dyn metaroce_udp::CaptureHook>>,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            comm: CommConfig::default(),
            mtu: 0,
            paths: 0,
            impair: None,
            seed: metaroce_udp::os_seed(),
            device_port: metaroce_udp::DEFAULT_DEVICE_PORT,
            device_port_fallback: true,
            offload: None,
            busy_poll_ns: 0,
            rto_min_ns: 4_000_000,
            deferred_ack_ns: 500_000,
            bootstrap_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(60),
            poll_before_sleep: Duration::ZERO,
            yield_while_polling: false,
            sleep_on_socket: false,
            icrc_omission: true,
            capture: None,
        }
    }
}
