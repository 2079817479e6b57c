//! Deterministic, seeded, fault-injecting network harness for MetaRoCE.
//!
//! Puts N sans-IO [`Node`]s (anything that exchanges UDP [`Datagram`]s and
//! has a timer) on a virtual clock (u64 ns) over a simulated fabric:
//!
//! * per node, an **egress port** (rate, buffer with tail drop, ECN marking
//!   threshold) and an **ingress port** toward the node (the ToR downlink,
//!   where incast congests; same knobs, modeled cut-through);
//! * between each ordered pair of nodes, `routes_per_pair` parallel ECMP
//!   **routes**, each a FIFO pipe with propagation delay plus a per-route
//!   jitter offset re-drawn every `jitter_period_ns`, so different routes
//!   reorder naturally but one route never reorders by itself;
//! * **faults** applied in the route: uniform loss, Gilbert-Elliott burst
//!   loss, duplication, bit corruption, intra-route reordering, blackholed
//!   routes, isolated nodes; optionally restricted by a [`FaultScope`].
//!
//! Every random choice derives from [`NetConfig::seed`] (one ChaCha8 stream
//! for faults, a seeded hash for jitter); events are ordered by
//! (time, insertion sequence), so a run is fully reproducible.
//!
//! ```
//! use metaroce_harness::*;
//! use std::net::{IpAddr, Ipv4Addr, SocketAddr};
//!
//! struct Echo { ip: IpAddr, out: Vec<Datagram>, got: usize }
//! impl Node for Echo {
//!     fn ip(&self) -> IpAddr { self.ip }
//!     fn handle_datagram(&mut self, _now: u64, d: Datagram) {
//!         self.got += 1;
//!         if d.payload[0] == 0 {
//!             self.out.push(Datagram { src: d.dst, dst: d.src, ecn: Ecn::NotEct, payload: vec![1] });
//!         }
//!     }
//!     fn poll_transmit(&mut self, _now: u64) -> Option<Datagram> { self.out.pop() }
//!     fn poll_timeout(&mut self) -> Option<u64> { None }
//!     fn handle_timeout(&mut self, _now: u64) {}
//! }
//!
//! let guard = SeedGuard::from_env_or(7);
//! let a = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), 4793);
//! let b = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 4793);
//! let nodes = vec![
//!     Echo { ip: a.ip(), out: vec![Datagram { src: a, dst: b, ecn: Ecn::Ect0, payload: vec![0] }], got: 0 },
//!     Echo { ip: b.ip(), out: vec![], got: 0 },
//! ];
//! let mut net = Network::new(NetConfig::seeded(guard.seed()), nodes);
//! let out = net.run_until(1_000_000, |n| n[0].got == 1);
//! assert!(matches!(out, RunOutcome::Done { .. }));
//! assert_eq!(net.stats().delivered, 2);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod chaos;
mod config;
mod network;
pub mod rdma;
pub mod scenario;
mod seed;

pub use config::{FaultConfig, FaultScope, LinkConfig, NetConfig, RouteSelect};
pub use network::{
    Action, Datagram, DropCause, Ecn, Fate, NetStats, Network, Node, RouteStats, RunOutcome, Tap,
    TapEvent,
};
pub use seed::{SEED_ENV, SeedGuard, seed_from_env_or};

#[cfg(test)]
mod tests;
