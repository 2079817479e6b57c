//! What can go wrong between ranks over real sockets.

use metaroce_coll::{CollError, ExecError, Rank};
use metaroce_udp::UdpError;
use metaroce_verbs::VerbsError;
use std::time::Duration;

/// A communicator over sockets failed.
#[derive(Debug, thiserror::Error)]
pub enum CollNetError {
    /// The job description is unusable (environment, host file, options).
    #[error("job setup: {0}")]
    Job(String),
    /// Ranks that never joined the communicator before the bootstrap
    /// timeout.
    #[error("bootstrap: rank(s) {missing:?} of {world} never joined within {timeout:?}")]
    MissingRanks {
        /// The ranks that did not show up.
        missing: Vec<Rank>,
        /// World size.
        world: u32,
        /// How long the root waited.
        timeout: Duration,
    },
    /// The TCP side channel failed or the root refused this rank.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// The datapath (sockets, device) failed.
    #[error(transparent)]
    Udp(#[from] UdpError),
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The state machine refused an operation or an event.
    #[error(transparent)]
    Coll(#[from] CollError),
    /// A computation could not run on the buffers given.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A write to or from a peer failed at the transport: the peer stopped
    /// answering (retry exhausted), refused the access, or the QP broke.
    #[error("rank {rank}: {what} with rank {peer} failed: {status}")]
    Transport {
        /// This rank.
        rank: Rank,
        /// The peer of the failed work request.
        peer: Rank,
        /// What the work request was.
        what: &'static str,
        /// The completion status, in words.
        status: String,
    },
    /// Another rank failed (or died): the job is over. The reason names
    /// the rank.
    #[error("aborted: {0}")]
    Aborted(String),
    /// Nothing happened for too long while an operation was pending.
    #[error("rank {rank}: no progress for {idle:?} with an operation pending")]
    Stalled {
        /// This rank.
        rank: Rank,
        /// How long nothing happened.
        idle: Duration,
    },
    /// A buffer that does not fit the operation.
    #[error("buffer: {0}")]
    Buffer(String),
}
