//! MetaRoCE packet-level fabric simulator.
//!
//! A discrete-event simulator in the htsim tradition, with Rust ownership
//! instead of pointers: every component lives in an arena (`Vec`) and is
//! named by its index; one event heap orders everything by (time, insertion
//! sequence), so a run is a pure function of the scenario and the seed.
//!
//! - [`event`]: the event list;
//! - [`sim`]: ports (output queue + serializer + pipe), output-queued
//!   switches (buffers, ECN, PFC, trimming, ECMP/adaptive routing,
//!   failures, loss), hosts, and the event loop;
//! - [`topology`]: leaf-spine, fat tree, rail-optimized, multi-plane;
//! - [`transport`]: the host model trait, and MetaRoCE running the real
//!   protocol core in descriptor mode (no payload bytes move);
//! - [`workload`]: permutation, incast, all-to-all, ring all-reduce (as
//!   dependent steps), htsim `.cm` and CSV flows, background load;
//! - [`scenario`]: TOML scenario files; [`run`]: a scenario end to end;
//! - [`report`]: results JSON, the summary table, per-flow CSV, SVG plots;
//! - [`sweep`]: grids of scenario points run in parallel, shardable.
//!
//! Time is `u64` picoseconds ([`Ps`]); the protocol core gets nanoseconds.
#![forbid(unsafe_code)]

pub mod event;
pub mod fabric;
pub mod paged;
pub mod report;
pub mod run;
pub mod scenario;
pub mod sim;
pub mod stats;
pub mod sweep;
pub mod topology;
pub mod transport;
pub mod workload;

/// Simulated time in picoseconds.
pub type Ps = u64;
/// Picoseconds per nanosecond.
pub const PS_PER_NS: Ps = 1_000;
/// Picoseconds per microsecond.
pub const PS_PER_US: Ps = 1_000_000;

pub use run::{Outcome, Perf, run_scenario};
pub use scenario::{Scenario, ScenarioError};
