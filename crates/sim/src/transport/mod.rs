//! Host transports: what runs in each simulated NIC.
//!
//! A transport is a sans-IO state machine per host, driven by the simulator
//! exactly as a real datapath drives it: packets in, time in; packets,
//! deadlines and message events out. MetaRoCE ([`metaroce`]) runs the real
//! protocol core; the baselines (RoCEv2 with go-back-N and DCQCN, IRN,
//! InfiniBand-style credits) implement the same trait and slot in beside it.

mod assumptions;
pub mod dcqcn;
pub mod ib;
pub mod irn;
pub mod knobs;
pub mod metaroce;
pub mod rc;
pub mod rocev2;

pub use assumptions::baseline_notes;

use crate::Ps;
use metaroce_proto::{ConfigError, MemoryError, PostError, QpError};

/// Ethernet (14 + 4 FCS), IPv4 (20) and UDP (8) bytes around a UDP payload.
pub const FRAME_OVERHEAD_BYTES: u32 = metaroce_wire::FRAME_OVERHEAD_LEN as u32;
/// The most header bytes any transport here adds to a packet's payload on
/// the wire (frame, plus MetaRoCE's data header and ICRC): what sizes
/// buffers that must hold whole frames (PFC headroom, credits).
pub const MAX_HEADER_BYTES: u32 = FRAME_OVERHEAD_BYTES + 64;

/// Headers of a packet as the fabric sees them: enough for ECMP (the
/// 5-tuple), queueing (its length) and marking (its ECN bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wire {
    /// Destination host index.
    pub dst: u32,
    /// UDP source port (the ECMP entropy).
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// Bytes on the wire (whole frame).
    pub bytes: u32,
    /// Payload bytes of application data it carries (0 for control packets).
    pub payload: u32,
    /// ECN-capable transport (ECT(0)); switches may mark it.
    pub ect: bool,
    /// Congestion experienced (set by a switch).
    pub ce: bool,
    /// A control packet (ACK, NACK, CNP): travels on the control priority.
    pub control: bool,
}

/// Something a transport reports about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageEvent {
    /// The sender's work completed (all data acknowledged).
    Sent {
        /// The message tag given to `post_message`.
        tag: u32,
    },
    /// All the message's data arrived at the receiver.
    Received {
        /// The message tag.
        tag: u32,
    },
    /// The message failed (retry limit, error completion).
    Failed {
        /// The message tag.
        tag: u32,
    },
}

/// Counters every transport reports, summed over hosts in the results.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TransportStats {
    /// Data packets sent for the first time.
    pub data_packets: u64,
    /// Data packets resent.
    pub retransmissions: u64,
    /// ACK packets sent.
    pub acks: u64,
    /// NACK packets sent.
    pub nacks: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Paths retired and replaced (multipath transports).
    pub paths_replaced: u64,
    /// Trimmed packets the transport could not use and dropped.
    pub trimmed_dropped: u64,
}

impl TransportStats {
    /// Every counter as `(name, value)`, in declaration order.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("data_packets", self.data_packets),
            ("retransmissions", self.retransmissions),
            ("acks", self.acks),
            ("nacks", self.nacks),
            ("timeouts", self.timeouts),
            ("paths_replaced", self.paths_replaced),
            ("trimmed_dropped", self.trimmed_dropped),
        ]
    }

    /// Add another host's counters.
    pub fn add(&mut self, o: &Self) {
        self.data_packets += o.data_packets;
        self.retransmissions += o.retransmissions;
        self.acks += o.acks;
        self.nacks += o.nacks;
        self.timeouts += o.timeouts;
        self.paths_replaced += o.paths_replaced;
        self.trimmed_dropped += o.trimmed_dropped;
    }
}

/// What one host's transport counted about one peer (for per-workload
/// figures: a workload's sends are its flows' sender-peer pairs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PairStats {
    /// Data packets resent to the peer.
    pub retransmissions: u64,
    /// Retransmission timeouts on the way to the peer.
    pub timeouts: u64,
    /// Data packets from the peer that had already arrived (spurious
    /// retransmissions and probes, counted where they land).
    pub duplicates_received: u64,
}

impl PairStats {
    /// Add another pair's counters.
    pub fn add(&mut self, o: &Self) {
        self.retransmissions += o.retransmissions;
        self.timeouts += o.timeouts;
        self.duplicates_received += o.duplicates_received;
    }
}

/// Why a transport refused to build a host, open a channel or take a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// `post_message` named a channel `open_channel` never returned.
    #[error("{}no channel {channel}", transport_prefix(*.transport))]
    NoChannel {
        /// The baseline's name, when a baseline refused it.
        transport: Option<&'static str>,
        /// The channel named.
        channel: u32,
    },
    /// One RDMA WRITE carries at most 4 GiB.
    #[error("message of {bytes} B > 4 GiB")]
    MessageOver4GiB {
        /// Message length.
        bytes: u64,
    },
    /// A part of a message needs more packets than a PSN space holds.
    #[error("message too large")]
    MessageTooManyPackets {
        /// Packets the part needs.
        packets: u64,
    },
    /// The protocol core refused the endpoint configuration.
    #[error(transparent)]
    EndpointConfig(#[from] ConfigError),
    /// The protocol core refused to register the host's memory region.
    #[error("register memory: {0}")]
    RegisterMemory(MemoryError),
    /// The protocol core refused to create or connect a QP.
    #[error(transparent)]
    Qp(#[from] QpError),
    /// The protocol core refused to post a message's send.
    #[error("post_send: {0}")]
    PostSend(PostError),
    /// The protocol core refused to post a receive for a channel.
    #[error(transparent)]
    PostRecv(PostError),
}

/// `"name: "` for a named baseline, nothing for MetaRoCE.
fn transport_prefix(transport: Option<&'static str>) -> String {
    transport.map_or_else(String::new, |t| format!("{t}: "))
}

/// One host's transport (one NIC).
pub trait Transport {
    /// What a packet carries besides its [`Wire`] headers.
    type Packet;

    /// The next packet to put on the wire, if the transport has one now.
    /// The simulator calls this only when the NIC can take a packet.
    fn poll_packet(&mut self, now: Ps) -> Option<(Wire, Self::Packet)>;

    /// A packet from host `src` arrived; `trimmed` if a switch cut its payload.
    fn handle_packet(
        &mut self,
        now: Ps,
        src: u32,
        wire: &Wire,
        trimmed: bool,
        packet: &Self::Packet,
    );

    /// The earliest time `handle_timeout` must run.
    fn poll_timeout(&mut self) -> Option<Ps>;

    /// Fire timers due at `now`.
    fn handle_timeout(&mut self, now: Ps);

    /// Start sending a message of `bytes` on `channel` (from
    /// [`TransportFactory::open_channel`]); events carry `tag`.
    fn post_message(
        &mut self,
        now: Ps,
        channel: u32,
        bytes: u64,
        tag: u32,
    ) -> Result<(), TransportError>;

    /// The next message event.
    fn poll_event(&mut self) -> Option<MessageEvent>;

    /// Counters.
    fn stats(&self) -> TransportStats;

    /// Bytes of transport state held (for the memory report), if known.
    fn memory_bytes(&self) -> usize {
        0
    }

    /// This host's counters by name (a row of `counters.csv`); every host
    /// of one transport names the same ones in the same order. The
    /// default is [`stats`](Self::stats)'.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.stats().fields()
    }

    /// Channel `channel` (from `open_channel`) carried its last message:
    /// release what it holds on the sending side. Counters survive.
    fn close_send_channel(&mut self, channel: u32) {
        let _ = channel;
    }

    /// The channel from host `from` carried its last message: release the
    /// receiving side. Counters survive.
    fn close_recv_channel(&mut self, from: u32) {
        let _ = from;
    }

    /// What this host counted about host `peer` (all zero if it keeps no
    /// per-peer counters).
    fn pair_stats(&self, peer: u32) -> PairStats {
        let _ = peer;
        PairStats::default()
    }
}

/// Facts about a host a transport is built for.
#[derive(Debug, Clone, Copy)]
pub struct HostInfo {
    /// Host index in the topology.
    pub index: u32,
    /// Total NIC rate over all planes, bit/s.
    pub line_rate_bps: u64,
    /// Unloaded round-trip time across the fabric's longest path.
    pub base_rtt_ps: Ps,
    /// Scenario seed.
    pub seed: u64,
}

/// What the workload will do over a channel, known when it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelPlan {
    /// How many flows the workload sends over the channel, so a receiver
    /// can pre-post what it needs, as an application would.
    pub messages: u32,
    /// How many hosts open channels to the receiver over the run: the
    /// peers an application connects at its start (a collective's
    /// communicator), so the receiver can promise each a share of its line.
    pub senders_to_receiver: u32,
}

/// Builds hosts and wires channels between them (the out-of-band setup a
/// real deployment does over TCP or a connection manager).
pub trait TransportFactory: Clone {
    /// The per-host transport.
    type Host: Transport;

    /// A new host.
    fn host(&self, info: &HostInfo) -> Result<Self::Host, TransportError>;

    /// Open a one-way message channel from `a` to `b` at `now` (its first
    /// message); returns `a`'s channel number. Called once per ordered
    /// pair that carries flows.
    fn open_channel(
        &self,
        now: Ps,
        a: &mut Self::Host,
        a_index: u32,
        b: &mut Self::Host,
        b_index: u32,
        plan: ChannelPlan,
    ) -> Result<u32, TransportError>;
}
