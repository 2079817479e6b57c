//! What can go wrong in the simulator, from reading a scenario to running it.
//!
//! Every message is one line, fit to print as it is: the command line shows
//! `to_string()` and nothing else.

use crate::transport::TransportError;

/// A simulator error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// A scenario file, a sweep plan, a suite, a suite run's results or a
    /// file one names is unreadable or invalid. The message names the
    /// file, the line and the key, e.g.
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
    /// A trigger feeds a trigger the workload does not define.
    #[error("trigger {trigger}: feeds unknown trigger {fed}")]
    UnknownFedTrigger {
        /// The feeding trigger.
        trigger: u32,
        /// The trigger it names.
        fed: u32,
    },
    /// The workload's trigger feeds are not sorted by feeding trigger.
    #[error("trigger feeds are not sorted by the feeding trigger")]
    UnsortedFeeds,
    /// A flow has neither a start time nor a trigger, so it would never start.
    #[error("flow {flow}: neither start time nor trigger")]
    FlowNeverStarts {
        /// Flow index.
        flow: usize,
    },
    /// A plane failure names a plane the topology lacks.
    #[error("failure.plane: no plane {plane} (the topology has {planes})")]
    NoPlane {
        /// The plane named.
        plane: u32,
        /// Planes the topology has.
        planes: u32,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_went_wrong() {
        let cases = [
            (
                SimError::NoLink {
                    a: "h0".into(),
                    b: "h1".into(),
                },
                "no link h0 - h1",
            ),
            (
                SimError::FlowFileLine {
                    line: 3,
                    problem: "bad src".into(),
                },
                "line 3: bad src",
            ),
            (
                SimError::PostRefused {
                    flow: 0,
                    src: 0,
                    dst: 1,
                    bytes: 5_000_000_000,
                    cause: TransportError::MessageOver4GiB {
                        bytes: 5_000_000_000,
                    },
                },
                "flow 0 (0->1, 5000000000 B): message of 5000000000 B > 4 GiB",
            ),
            (
                TransportError::NoChannel {
                    transport: Some("rocev2"),
                    channel: 3,
                }
                .into(),
                "rocev2: no channel 3",
            ),
            (
                TransportError::NoChannel {
                    transport: None,
                    channel: 3,
                }
                .into(),
                "no channel 3",
            ),
            (SimError::ShardOutOfRange, "need 0 <= i < n"),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text);
        }
    }
}
