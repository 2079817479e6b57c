//! MetaRoCE packet-level fabric simulator.
//!
//! A discrete-event simulator in the htsim tradition, with Rust ownership
//! instead of pointers: every component lives in an arena (`Vec`) and is
//! named by its index; one event heap orders everything by (time, insertion
//! sequence), so a run is a pure function of the scenario and the seed.
//!
//! # Where things are
//!
//! - [`scenario`]: TOML scenario files; [`run`]: a scenario end to end;
//!   [`sweep`]: grids of scenario points run in parallel, shardable;
//! - [`topology`]: leaf-spine, fat tree, rail-optimized, multi-plane;
//! - [`workload`]: permutation, incast, all-to-all, htsim `.cm` and CSV
//!   flows, background load; [`collective`]: the collectives library's
//!   own schedules (ring all-reduce and the rest) as dependent flows;
//! - [`transport`]: the host model trait, and MetaRoCE running the real
//!   protocol core in descriptor mode (no payload bytes move), beside the
//!   RoCEv2, IRN and InfiniBand baselines;
//! - [`fabric`]: the switch and link policies and their knobs (buffer
//!   admission, ECN, PFC thresholds, trimming, up-port choice, ECMP hash);
//! - [`sim`]: the simulator, one fabric element per file over one arena:
//!
//!   | file | element |
//!   |---|---|
//!   | `sim.rs` | the arena ([`sim::Sim`]), the event loop, measurements |
//!   | `sim/host.rs` | a host: its transport, timer, and NIC pulling packets onto a plane |
//!   | `sim/packet.rs` | the packet slab (fabric head, transport body) |
//!   | `sim/port.rs` | a port (link direction): priority queues, serializer |
//!   | `sim/pipe.rs` | the wire: random loss, dead links, propagation delay |
//!   | `sim/switch.rs` | a switch: route, admission, trimming, ECN marking, enqueue, buffer |
//!   | `sim/pfc.rs` | PFC: ingress XOFF / XON, PAUSE and RESUME frames |
//!   | `sim/credit.rs` | credit-based link flow control (InfiniBand) |
//!   | `sim/routing.rs` | up-down routes, ECMP / adaptive choice, re-convergence |
//!   | `sim/failure.rs` | link and switch failures and recoveries |
//!   | `sim/flow.rs` | driving the workload: channels, starts, completions, triggers |
//!   | `sim/tap.rs` | packet capture on chosen links |
//!
//! - [`event`]: the event list; [`paged`]: the paged vector packets live in;
//! - [`report`]: results JSON, the summary table, per-flow CSV, the time
//!   series; [`plot`]: the SVG figures (FCT CDF, goodput, queues, the
//!   comparison of transports, sweeps); [`stats`]: histograms and time
//!   series;
//! - [`time`]: picoseconds ([`Ps`]) and unit conversions;
//!   [`address`]: the host address plan; [`error`]: [`SimError`].
//!
//! # A packet's way
//!
//! A host's transport hands its NIC a packet (`sim/host.rs`, `host_pull`);
//! the NIC hashes it onto a plane and queues it at that plane's port. The
//! port (`sim/port.rs`) serializes it (`tx_start`, then `tx_done` when the
//! last bit is out) into the pipe (`sim/pipe.rs`, `pipe_enter`), which
//! loses it or delivers it a link delay later (`pipe_arrive`). At a switch
//! (`sim/switch.rs`, `switch_receive`) it is routed (`sim/routing.rs`),
//! admitted or trimmed or dropped, perhaps ECN-marked, and queued at its
//! egress port, while PFC (`sim/pfc.rs`) or credits (`sim/credit.rs`) push
//! back on its ingress. Port, pipe and switch repeat hop by hop until the
//! pipe hands it to the destination host (`host_receive`), whose transport
//! takes it and answers through its own NIC.
//!
//! Time is `u64` picoseconds ([`Ps`]); the protocol core gets nanoseconds.
#![forbid(unsafe_code)]

pub mod address;
pub mod capture;
pub mod collective;
pub mod error;
pub mod event;
pub mod fabric;
pub mod hostset;
pub mod paged;
pub mod plot;
pub mod report;
pub mod run;
pub mod scenario;
pub mod sim;
pub mod stats;
pub mod suite;
pub mod sweep;
pub mod time;
pub mod topology;
pub mod transport;
pub mod workload;

pub use error::SimError;
pub use run::{Outcome, Perf, RunOptions, run_scenario, run_scenario_with};
pub use scenario::Scenario;
pub use time::{PS_PER_NS, PS_PER_US, Ps};
