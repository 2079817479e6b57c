//! MetaRoCE real UDP datapath: sockets per path, batched I/O (sendmmsg /
//! recvmmsg, UDP GSO / GRO), ECN, a progress engine per device, a TCP
//! connection manager and the perftest-style tools behind `metaroce perf`.
//!
//! - [`Device`]: a device bound to an IP and a port range, driving a
//!   [`metaroce_verbs::Context`] on real sockets;
//! - [`cm`]: the connection manager's wire messages (see
//!   `docs/spec/connection-manager.md`);
//! - [`perf`]: perftest-style bandwidth and latency tests, and the raw-UDP
//!   baselines;
//! - [`Impair`]: receive-side loss / reorder / duplication for tests.
//!
//! `unsafe` is confined to the syscalls in `sys` (and the network-namespace
//! test setup); every block says why it is sound in a `// SAFETY:` comment,
//! which the lint below enforces.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cm;
mod device;
mod impair;
pub mod perf;
pub mod raw;
mod sys;

pub use device::{Device, DeviceConfig, DeviceStats, IoStats, UdpError, now_ns, os_seed};
pub use impair::Impair;

#[cfg(test)]
mod tests;
