//! Describing an operation: which collective, on what, with which algorithm.

use std::fmt;
use std::str::FromStr;

use crate::action::Rank;
use crate::datatype::{DataType, ReduceOp};

/// Communicator-wide settings; every rank must use the same ones (they fix
/// the staging layout peers write into and the algorithm choices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommConfig {
    /// Staging slots per peer and direction: how many messages may be in
    /// flight on one directed connection (2..=256). Two is the minimum for
    /// the ring's fused receive-reduce-send steps to make progress; more
    /// slots let more chunks overlap.
    pub slots: u32,
    /// Bytes per staging slot, the largest message (a multiple of 8, so a
    /// chunk of any element type fits whole).
    pub slot_bytes: u64,
    /// All-reduce buffers up to this many bytes use recursive doubling
    /// under [`Algorithm::Auto`], larger ones the ring.
    pub small_allreduce_bytes: u64,
    /// Broadcasts up to this many bytes use the binomial tree under
    /// [`Algorithm::Auto`], larger ones the pipelined chain.
    pub small_broadcast_bytes: u64,
    /// The ranks share CPU cores (more ranks than cores on a host, as when
    /// `coll-perf --ranks 8` runs on two): a rank waiting for a message
    /// waits for the scheduler to run the peer that sends it, so each step
    /// of an algorithm costs more than its bytes. Then [`Algorithm::Auto`]
    /// runs an all-reduce above `small_allreduce_bytes` in a power-of-two
    /// world of four or more by recursive halving-doubling, `2 log2 p`
    /// steps, instead of the ring's `2 (p - 1)` (the same bytes each). Off
    /// by default: with a core per rank, and in the simulator, the ring's
    /// pipelining wins.
    pub ranks_share_cores: bool,
}

impl Default for CommConfig {
    /// 4 slots of 256 KiB per peer and direction (2 MiB of staging per
    /// peer); recursive doubling up to 64 KiB; tree broadcast up to 64 KiB.
    fn default() -> Self {
        Self {
            slots: 4,
            slot_bytes: 256 * 1024,
            small_allreduce_bytes: 64 * 1024,
            small_broadcast_bytes: 64 * 1024,
            ranks_share_cores: false,
        }
    }
}

impl CommConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !(2..=256).contains(&self.slots) {
            return Err(SpecError::Config(format!(
                "slots per peer must be 2..=256, got {}",
                self.slots
            )));
        }
        if self.slot_bytes == 0 || !self.slot_bytes.is_multiple_of(8) {
            return Err(SpecError::Config(format!(
                "slot bytes must be a positive multiple of 8, got {}",
                self.slot_bytes
            )));
        }
        Ok(())
    }
}

/// The collective (or point-to-point group) an operation performs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Collective {
    /// Every rank ends with the reduction of all inputs (`count` elements each).
    AllReduce,
    /// Rank `r` ends with block `r` of the reduction of all inputs; inputs
    /// hold `world × count` elements, outputs `count`.
    ReduceScatter,
    /// Every rank ends with all inputs concatenated in rank order; inputs
    /// hold `count` elements, outputs `world × count`.
    AllGather,
    /// Rank `r` sends block `q` of its input to rank `q` and ends with
    /// block `q` of its output from rank `q`; both hold `world × count`.
    AllToAll,
    /// Every rank ends with the root's `count` elements.
    Broadcast {
        /// Rank whose input is broadcast.
        root: Rank,
    },
    /// The root ends with the reduction of all inputs; other ranks' outputs
    /// are untouched.
    Reduce {
        /// Rank that receives the result.
        root: Rank,
    },
    /// No rank leaves before every rank has entered.
    Barrier,
    /// A group of point-to-point transfers run together (NCCL's
    /// `ncclGroupStart(); ncclSend(..); ncclRecv(..); ncclGroupEnd()`), so
    /// that exchanges in both directions cannot deadlock. `count` is unused.
    SendRecv(P2pGroup),
}

impl Collective {
    /// True for the collectives that combine data with a [`ReduceOp`].
    pub const fn reduces(&self) -> bool {
        matches!(
            self,
            Self::AllReduce | Self::ReduceScatter | Self::Reduce { .. }
        )
    }

    /// The collective's name in nccl-tests' program names (`all_reduce`, ...).
    pub const fn name(&self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllGather => "all_gather",
            Self::AllToAll => "alltoall",
            Self::Broadcast { .. } => "broadcast",
            Self::Reduce { .. } => "reduce",
            Self::Barrier => "barrier",
            Self::SendRecv(_) => "sendrecv",
        }
    }
}

/// One point-to-point transfer of a [`Collective::SendRecv`] group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2p {
    /// The other rank (may be this rank: a local copy, matched in order
    /// with a receive from this rank).
    pub peer: Rank,
    /// First element in the send (for sends) or receive (for receives) buffer.
    pub offset: u64,
    /// Elements.
    pub count: u64,
}

/// The transfers of a point-to-point group. Messages between two ranks are
/// matched in order: the k-th send to a peer fills the peer's k-th receive
/// from us, and their counts must agree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct P2pGroup {
    /// Transfers out of the send buffer.
    pub sends: Vec<P2p>,
    /// Transfers into the receive buffer.
    pub recvs: Vec<P2p>,
}

impl P2pGroup {
    /// nccl-tests' `sendrecv`: send `count` elements to the next rank and
    /// receive as many from the previous one.
    pub fn ring_neighbours(rank: Rank, world: u32, count: u64) -> Self {
        let world = world.max(1);
        Self {
            sends: vec![P2p {
                peer: (rank + 1) % world,
                offset: 0,
                count,
            }],
            recvs: vec![P2p {
                peer: (rank + world - 1) % world,
                offset: 0,
                count,
            }],
        }
    }
}

/// How an operation moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Chosen by collective and size (see [`Algorithm::resolve`]).
    Auto,
    /// Ring (all-reduce, reduce-scatter, all-gather) or the pipelined chain
    /// along the ring (broadcast, reduce): bandwidth-optimal.
    Ring,
    /// Recursive doubling (all-reduce): log2(world) full-size exchanges,
    /// plus one step before and after when world is not a power of two.
    RecursiveDoubling,
    /// Recursive halving then doubling (all-reduce, Rabenseifner's): a
    /// reduce-scatter and an all-gather of `log2(world)` exchanges each,
    /// sending what the ring sends in far fewer steps.
    HalvingDoubling,
    /// Binomial tree (broadcast; all-reduce as tree reduce then tree
    /// broadcast): 2 log2(world) latency, chunks pipelined.
    Tree,
    /// Each rank writes to every other directly (all-to-all, barrier's
    /// dissemination, point-to-point).
    Direct,
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Ring => "ring",
            Self::RecursiveDoubling => "rd",
            Self::HalvingDoubling => "hd",
            Self::Tree => "tree",
            Self::Direct => "direct",
        })
    }
}

impl FromStr for Algorithm {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "auto" => Self::Auto,
            "ring" => Self::Ring,
            "rd" | "recursive-doubling" | "recursive_doubling" => Self::RecursiveDoubling,
            "hd" | "halving-doubling" | "halving_doubling" | "rabenseifner" => {
                Self::HalvingDoubling
            }
            "tree" => Self::Tree,
            "direct" => Self::Direct,
            _ => {
                return Err(SpecError::Invalid(format!(
                    "unknown algorithm {s:?} (expected auto, ring, rd, hd, tree or direct)"
                )));
            }
        })
    }
}

impl Algorithm {
    /// The algorithm an operation runs: `Auto` becomes a concrete choice,
    /// a concrete one is checked against what the collective implements.
    ///
    /// Under `Auto`: all-reduce of at most
    /// [`CommConfig::small_allreduce_bytes`] uses recursive doubling, larger
    /// the ring (recursive halving-doubling in a power-of-two `world` of
    /// four or more when [`CommConfig::ranks_share_cores`]); broadcast of
    /// at most [`CommConfig::small_broadcast_bytes`] the tree, larger the
    /// chain; reduce-scatter, all-gather and reduce the ring; all-to-all,
    /// barrier and point-to-point are direct.
    pub fn resolve(
        self,
        collective: &Collective,
        bytes: u64,
        world: u32,
        config: &CommConfig,
    ) -> Result<Self, SpecError> {
        let supported: &[Self] = match collective {
            Collective::AllReduce => &[
                Self::Ring,
                Self::RecursiveDoubling,
                Self::HalvingDoubling,
                Self::Tree,
            ],
            Collective::Broadcast { .. } => &[Self::Ring, Self::Tree],
            Collective::ReduceScatter | Collective::AllGather | Collective::Reduce { .. } => {
                &[Self::Ring]
            }
            Collective::AllToAll | Collective::Barrier | Collective::SendRecv(_) => &[Self::Direct],
        };
        let chosen = match self {
            Self::Auto => match collective {
                Collective::AllReduce if bytes <= config.small_allreduce_bytes => {
                    Self::RecursiveDoubling
                }
                Collective::AllReduce
                    if config.ranks_share_cores && world >= 4 && world.is_power_of_two() =>
                {
                    Self::HalvingDoubling
                }
                Collective::Broadcast { .. } if bytes <= config.small_broadcast_bytes => Self::Tree,
                _ => supported[0],
            },
            other => other,
        };
        if !supported.contains(&chosen) {
            return Err(SpecError::UnsupportedAlgorithm {
                collective: collective.name(),
                algorithm: chosen,
            });
        }
        Ok(chosen)
    }
}

/// One operation, as every participating rank describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpSpec {
    /// What to do.
    pub collective: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Elements, in NCCL's meaning for the collective (all-reduce: the
    /// buffer; reduce-scatter: per rank's output; all-gather: per rank's
    /// input; all-to-all: per peer).
    pub count: u64,
    /// In place: one buffer ([`Buf::Recv`](crate::Buf::Recv)) holds input
    /// and output. For reduce-scatter the output is block `rank` of it; for
    /// all-gather the input is block `rank` of it.
    pub in_place: bool,
    /// Algorithm (or `Auto`).
    pub algorithm: Algorithm,
    /// Bytes per pipelined chunk; `None` for the slot size. At most
    /// [`CommConfig::slot_bytes`]; rounded down to whole elements.
    pub chunk_bytes: Option<u64>,
    /// Every rank's output buffer is symmetric: registered so that its
    /// peers may write into it, at the same offsets as their own (a
    /// driver's collective registration, as `metaroce-collnet`'s
    /// `NetComm::alloc_symmetric`). A message whose only use at its
    /// receiver would be a copy from staging into its output is then
    /// written straight there ([`Buf::Recv`](crate::Buf::Recv) targets):
    /// the all-gather halves of the ring all-reduce and of the
    /// halving-doubling all-reduce in a power-of-two world. In both, a
    /// peer's direct write depends on data this rank sent in the same
    /// operation, so it never lands before the rank started it. Other
    /// plans ignore it. Like the rest of the spec, the same on every rank.
    pub symmetric: bool,
}

impl OpSpec {
    /// An out-of-place operation with the automatic algorithm and chunk size.
    pub fn new(collective: Collective, dtype: DataType, op: ReduceOp, count: u64) -> Self {
        Self {
            collective,
            dtype,
            op,
            count,
            in_place: false,
            algorithm: Algorithm::Auto,
            chunk_bytes: None,
            symmetric: false,
        }
    }

    /// The same operation, in place.
    pub fn in_place(mut self) -> Self {
        self.in_place = true;
        self
    }

    /// The same operation with a given algorithm.
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The same operation with a given chunk size.
    pub fn with_chunk_bytes(mut self, chunk_bytes: u64) -> Self {
        self.chunk_bytes = Some(chunk_bytes);
        self
    }

    /// The same operation on symmetric output buffers (see
    /// [`OpSpec::symmetric`]).
    pub fn on_symmetric_buffers(mut self) -> Self {
        self.symmetric = true;
        self
    }

    /// Buffer sizes the driver must provide on `rank` of a `world`-rank
    /// communicator. In place, only the receive buffer exists.
    pub fn buffer_sizes(&self, rank: Rank, world: u32) -> BufferSizes {
        let e = self.dtype.size_bytes() as u64;
        let n = u64::from(world);
        let c = self.count;
        let (send, recv) = match &self.collective {
            Collective::AllReduce => (c, c),
            Collective::ReduceScatter => (n * c, c),
            Collective::AllGather => (c, n * c),
            Collective::AllToAll => (n * c, n * c),
            Collective::Broadcast { root } => (if *root == rank { c } else { 0 }, c),
            Collective::Reduce { root } => (c, if *root == rank { c } else { 0 }),
            Collective::Barrier => (0, 0),
            Collective::SendRecv(g) => (
                g.sends
                    .iter()
                    .map(|p| p.offset + p.count)
                    .max()
                    .unwrap_or(0),
                g.recvs
                    .iter()
                    .map(|p| p.offset + p.count)
                    .max()
                    .unwrap_or(0),
            ),
        };
        if self.in_place {
            BufferSizes {
                send_bytes: 0,
                recv_bytes: send.max(recv) * e,
            }
        } else {
            BufferSizes {
                send_bytes: send * e,
                recv_bytes: recv * e,
            }
        }
    }

    /// Bytes of the operation as NCCL sizes it for algorithm choice (the
    /// all-reduce buffer, the broadcast buffer, ...).
    pub fn bytes(&self) -> u64 {
        self.count * self.dtype.size_bytes() as u64
    }
}

/// Buffer sizes of one rank for one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSizes {
    /// Bytes of [`Buf::Send`](crate::Buf::Send) (0 in place).
    pub send_bytes: u64,
    /// Bytes of [`Buf::Recv`](crate::Buf::Recv).
    pub recv_bytes: u64,
}

/// An operation or configuration that cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Bad communicator settings.
    #[error("invalid communicator configuration: {0}")]
    Config(String),
    /// A malformed operation.
    #[error("invalid operation: {0}")]
    Invalid(String),
    /// The collective does not implement that algorithm.
    #[error("{collective} has no {algorithm} algorithm")]
    UnsupportedAlgorithm {
        /// Collective name.
        collective: &'static str,
        /// Requested algorithm.
        algorithm: Algorithm,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_choice_by_size() {
        let c = CommConfig::default();
        let ar = Collective::AllReduce;
        assert_eq!(
            Algorithm::Auto.resolve(&ar, 8, 8, &c),
            Ok(Algorithm::RecursiveDoubling)
        );
        assert_eq!(
            Algorithm::Auto.resolve(&ar, 64 * 1024, 8, &c),
            Ok(Algorithm::RecursiveDoubling)
        );
        assert_eq!(
            Algorithm::Auto.resolve(&ar, 64 * 1024 + 1, 8, &c),
            Ok(Algorithm::Ring)
        );
        let bc = Collective::Broadcast { root: 0 };
        assert_eq!(Algorithm::Auto.resolve(&bc, 8, 8, &c), Ok(Algorithm::Tree));
        assert_eq!(
            Algorithm::Auto.resolve(&bc, 1 << 20, 8, &c),
            Ok(Algorithm::Ring)
        );
        assert_eq!(
            Algorithm::Auto.resolve(&Collective::AllToAll, 8, 8, &c),
            Ok(Algorithm::Direct)
        );
        assert!(matches!(
            Algorithm::Tree.resolve(&Collective::AllGather, 8, 8, &c),
            Err(SpecError::UnsupportedAlgorithm { .. })
        ));
        // Ranks sharing cores: fewer steps for a power-of-two world of 4+.
        let shared = CommConfig {
            ranks_share_cores: true,
            ..CommConfig::default()
        };
        let big = 1 << 20;
        assert_eq!(
            Algorithm::Auto.resolve(&ar, big, 8, &shared),
            Ok(Algorithm::HalvingDoubling)
        );
        assert_eq!(
            Algorithm::Auto.resolve(&ar, big, 4, &shared),
            Ok(Algorithm::HalvingDoubling)
        );
        for world in [2, 3, 6] {
            assert_eq!(
                Algorithm::Auto.resolve(&ar, big, world, &shared),
                Ok(Algorithm::Ring)
            );
        }
        assert_eq!(
            Algorithm::Auto.resolve(&ar, 8, 8, &shared),
            Ok(Algorithm::RecursiveDoubling)
        );
    }

    #[test]
    fn buffer_sizes_follow_nccl() {
        let s = OpSpec::new(
            Collective::ReduceScatter,
            DataType::Float32,
            ReduceOp::Sum,
            10,
        );
        assert_eq!(
            s.buffer_sizes(0, 4),
            BufferSizes {
                send_bytes: 160,
                recv_bytes: 40
            }
        );
        assert_eq!(
            s.clone().in_place().buffer_sizes(0, 4),
            BufferSizes {
                send_bytes: 0,
                recv_bytes: 160
            }
        );
        let g = OpSpec::new(Collective::AllGather, DataType::Uint8, ReduceOp::Sum, 3);
        assert_eq!(
            g.buffer_sizes(1, 3),
            BufferSizes {
                send_bytes: 3,
                recv_bytes: 9
            }
        );
    }

    #[test]
    fn config_checks() {
        assert!(CommConfig::default().validate().is_ok());
        assert!(
            CommConfig {
                slots: 1,
                ..CommConfig::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            CommConfig {
                slot_bytes: 12,
                ..CommConfig::default()
            }
            .validate()
            .is_err()
        );
    }
}
