//! What can go wrong in the simulator, from reading a scenario to running it.
//!
//! Every message is one line, fit to print as it is: the command line shows
//! `to_string()` and nothing else.

use crate::transport::TransportError;

/// A simulator error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// A scenario file, a sweep plan or a file one names is unreadable or
    /// invalid. The message names the file, the line and the key, e.g.
    /// `x.toml:7: switch.routing: must be ecmp or adaptive`.
    #[error("{0}")]
    Scenario(String),
    /// A line of a flow file (CSV or htsim connection matrix) is malformed
    /// or names hosts the topology lacks.
    #[error("line {line}: {problem}")]
    FlowFileLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// A flow names a host the topology lacks, or the same host twice.
    #[error("flow {flow}: bad hosts {src}->{dst}")]
    FlowHosts {
        /// Flow index.
        flow: usize,
        /// Sending host.
        src: u32,
        /// Receiving host.
        dst: u32,
    },
    /// A flow waits on a trigger the workload does not define.
    #[error("flow {flow}: unknown trigger {trigger}")]
    UnknownTrigger {
        /// Flow index.
        flow: usize,
        /// The trigger it names.
        trigger: u32,
    },
    /// A flow has neither a start time nor a trigger, so it would never start.
    #[error("flow {flow}: neither start time nor trigger")]
    FlowNeverStarts {
        /// Flow index.
        flow: usize,
    },
    /// A link failure names two nodes no link joins.
    #[error("no link {a} - {b}")]
    NoLink {
        /// One end's name.
        a: String,
        /// The other end's name.
        b: String,
    },
    /// A switch failure names a switch index the topology lacks.
    #[error("no switch {0}")]
    NoSwitch(u32),
    /// A host's transport could not be built, or a channel not opened.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A host's transport refused a flow's message when the flow started.
    #[error("flow {flow} ({src}->{dst}, {bytes} B): {cause}")]
    PostRefused {
        /// Flow index.
        flow: u32,
        /// Sending host.
        src: u32,
        /// Receiving host.
        dst: u32,
        /// Message length.
        bytes: u64,
        /// Why the transport refused it.
        cause: TransportError,
    },
    /// A sweep shard is not written `i/n`.
    #[error("expected i/n")]
    ShardSyntax,
    /// A sweep shard's index is not a number.
    #[error("bad i")]
    ShardIndex,
    /// A sweep shard's count is not a number.
    #[error("bad n")]
    ShardCount,
    /// A sweep shard's index is not below its count.
    #[error("need 0 <= i < n")]
    ShardOutOfRange,
}
