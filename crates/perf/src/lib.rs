//! perftest-style tests over the MetaRoCE UDP datapath, and raw-UDP
//! baselines over the same sockets: the client (requester) and server
//! (responder) sides, result figures with perftest's semantics, and the
//! table formats. The `metaroce perf` command is a thin layer on this.
//!
//! - [`Test`]: the catalogue (`write-bw`, `write-lat`, ... `atomic-lat`);
//! - [`Params`] (sent to the server) and [`LocalOpts`] (each side's own);
//! - [`run_client`], [`serve`] and [`run_loopback`]: the two sides over a
//!   TCP side channel (`metaroce-cm`), or both in one process;
//! - [`Figures`], [`Session`], [`ServerSession`]: what a session measured;
//! - [`header`], [`bw_row`], [`lat_row`], [`json_row`], ...: perftest's
//!   output;
//! - [`raw`]: the raw-UDP baselines (`udp-bw`, `udp-lat`);
//! - [`messages`]: the connection-manager bodies of the tests;
//! - [`fill_pattern`]: the verification pattern both sides compute.

mod catalogue;
mod client;
mod error;
mod figures;
mod loopback;
pub mod messages;
mod params;
pub mod raw;
mod rig;
mod server;
mod session;
mod table;
mod verify;

pub use catalogue::Test;
pub use client::run_client;
pub use error::PerfError;
pub use figures::{BwFigures, Figures, LatFigures};
pub use loopback::run_loopback;
pub use params::{AuthOpts, CQ_MOD, LocalOpts, MAX_SIZE, Params};
pub use rig::{AUTO_MTU_CAP, RTO_MIN_NS, payload_mtu};
pub use server::serve;
pub use session::{AddrLine, Progress, ServerSession, Session};
pub use table::{
    LAT_DURATION_HEADER, LAT_TABLE_HEADER, RESULT_LINE, bw_row, bw_table_header, bw_unit, header,
    json_row, lat_row,
};
pub use verify::fill_pattern;
