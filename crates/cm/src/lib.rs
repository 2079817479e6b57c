//! MetaRoCE connection manager: how two processes exchange, over a TCP side
//! channel (perftest's model, default port 18515), what they need to connect
//! RC QPs over MetaRoCE. Specified in `docs/spec/connection-manager.md`.
//!
//! - the frame (`"MRCM"`, version, [`MsgType`], length, JSON body):
//!   [`send`] and [`recv`];
//! - [`Endpoint`] / [`RemoteBuf`]: one side's device, QPs, the buffer the
//!   peer may access, session id and packet protection;
//! - [`Hello`]: the client's opening message, its endpoint plus a
//!   tool-defined request (`params`) the connection manager does not read;
//! - [`KeyConfirmation`] / [`Confirm`]: with packet authentication, each
//!   side's proof that it holds the job secret, bound to both session ids,
//!   so different secrets are refused at connect time; [`check_job_secret`]
//!   refuses an all-zero secret.
//!
//! The connection manager knows nothing of any tool: a tool defines its
//! own request parameters and the bodies of the messages after `Accept`
//! (`metaroce-perf` defines `Done` and `Report` bodies for its tests, and
//! other bodies for its raw-UDP baselines). Nothing here depends on the
//! datapath, so a tool may run it before its device exists.

mod confirm;
mod endpoint;
mod frame;
mod hello;

pub use confirm::{Confirm, KeyConfirmation, Role, check_job_secret};
pub use endpoint::{Endpoint, RemoteBuf};
pub use frame::{CmError, MAGIC, MAX_BODY, MsgType, VERSION, recv, send};
pub use hello::Hello;
