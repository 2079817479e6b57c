//! perftest-style tests over the MetaRoCE UDP datapath, and raw-UDP
//! baselines over the same sockets: the client (requester) and server
//! (responder) sides, result figures with perftest's semantics, and the
//! table formats. The `metaroce perf` command is a thin layer on this.
//!
//! - [`Test`]: the catalogue (`write-bw`, `write-lat`, ... `atomic-lat`);
//! - [`Params`] (sent to the server) and [`LocalOpts`] (each side's own,
//!   such as the client's [`RateLimit`]);
//! - [`run_client`] (and [`run_client_with`], reporting intervals of an
//!   endless run), [`serve`] and [`run_loopback`]: the two sides over a
//!   TCP side channel (`metaroce-cm`), or both in one process;
//! - [`Figures`], [`Session`], [`ServerSession`]: what a session measured;
//! - [`header`], [`bw_row`], [`lat_row`], ...: perftest's tables;
//!   [`json_report`]: perftest's JSON report with the run's parameters;
//! - [`raw`]: the raw-UDP baselines (`udp-bw`, `udp-lat`);
//! - [`messages`]: the connection-manager bodies of the tests;
//! - [`fill_pattern`]: the verification pattern both sides compute.

mod catalogue;
mod client;
mod error;
mod figures;
mod json;
mod loopback;
pub mod messages;
mod params;
mod rate;
pub mod raw;
mod rig;
mod server;
mod session;
mod table;
mod verify;

pub use catalogue::Test;
pub use client::{IntervalFn, run_client, run_client_with};
pub use error::PerfError;
pub use figures::{BwFigures, Figures, LatFigures, PEAK_WINDOW_NS};
pub use json::{JSON_SCHEMA_VERSION, JsonReport, JsonResults, JsonRun, json_report, json_results};
pub use loopback::run_loopback;
pub use params::{
    AuthOpts, CQ_MOD, CQ_MOD_SIZE_LIMIT, CYCLE_BUFFER_BYTES, INFINITE_REPORT_S, LocalOpts,
    MAX_BUFFER_BYTES, MAX_CQ_MOD, MAX_INLINE, MAX_SIZE, Measure, POST_LIST, Params,
};
pub use rate::{RateLimit, RateUnits};
pub use rig::{AUTO_MTU_CAP, LOCAL_MTU_CAP, RTO_MIN_NS, payload_mtu};
pub use server::serve;
pub use session::{AddrLine, Progress, ServerSession, Session};
pub use table::{
    LAT_DURATION_HEADER, LAT_TABLE_HEADER, RESULT_LINE, bw_row, bw_table_header, bw_unit, header,
    lat_row,
};
pub use verify::fill_pattern;
