//! Endpoint configuration.
//!
//! Every knob has a unit in its name and a default that suits a datacenter
//! fabric (microsecond RTTs, 100–400 Gbit/s links). The defaults are what the
//! `metaroce` tools, the harness and the simulator start from.

use crate::auth::AuthConfig;
use crate::cc::{CcAlgorithm, MetaRoceParams};
use crate::int_knob;
use crate::knob::Knob;

/// MetaRoCE's default device port: UDP 4793. Not 4791, IANA's RoCEv2 port,
/// which RoCE NICs claim for themselves and which Wireshark decodes as
/// InfiniBand BTH; 4789, 4790 and 4792 next to it are registered too
/// (VXLAN, VXLAN-GPE, unified bus), 4793 is not. The Wireshark dissector
/// (`tools/wireshark/metaroce.lua`) registers on it.
pub const DEFAULT_DEVICE_PORT: u16 = 4793;

/// The largest [`EndpointConfig::path_burst_bytes`]: 1 MiB, sixteen
/// 64 KiB GSO sends.
pub const MAX_PATH_BURST_BYTES: u32 = 1 << 20;

/// Configuration of one [`Endpoint`](crate::Endpoint) (one device).
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointConfig {
    /// The device's base UDP port ([`DEFAULT_DEVICE_PORT`] by default). Data
    /// always arrives here; path source ports are allocated from
    /// `device_port + 1 ..= device_port + path_port_span`.
    pub device_port: u16,
    /// How many source ports the device may use for paths (the pool that
    /// retired paths draw fresh ports from). Must be at least `paths_per_connection`.
    pub path_port_span: u16,
    /// Planes of a multi-plane NIC that picks a packet's plane as its source
    /// port modulo this (1: one plane). A retired path's fresh port keeps
    /// the old port's residue, so paths stay spread evenly over the planes;
    /// a dead plane's packets are the NIC's to move, and come back with it.
    pub port_planes: u16,
    /// Payload bytes per data packet (the segment size). Headers come on top.
    pub mtu_payload_bytes: u32,
    /// Paths (UDP source ports, hence ECMP routes) per connection.
    pub paths_per_connection: usize,
    /// Bytes of data packets (headers included) a connection sends on one
    /// path before the next path takes its turn (while the path's window
    /// has room); `0`: one packet per turn, the finest spray. Resends always
    /// go one packet per turn. A NIC sprays per packet for free; a host
    /// stack pays per datagram wherever a run of packets cannot travel as
    /// one (GSO at the sender, GRO at the receiver: both work per UDP flow,
    /// and a path is a flow). Over two 1500-byte links, 64 paths sprayed per
    /// packet moved 8.8 Gb/s and in runs of 64 KiB 27-29, but a failover
    /// with runs sometimes stalls (`metaroce_udp::PATH_BURST_BYTES`).
    pub path_burst_bytes: u32,
    /// Local link rate, bits/s: the initial window is one bandwidth-delay product.
    pub line_rate_bps: u64,
    /// Unloaded fabric round-trip time used for the initial window and first RTO.
    /// At most `u32::MAX` ns (4.29 s): RTT estimates are kept in 32 bits.
    pub base_rtt_ns: u64,
    /// Lower bound of every retransmission timeout.
    pub rto_min_ns: u64,
    /// Upper bound of every retransmission timeout after backoff.
    pub rto_max_ns: u64,
    /// Connection-level timeouts without progress before outstanding work
    /// fails with `RetryExcErr` (ibverbs `retry_cnt`, 0..=7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (ibverbs `rnr_retry`; 7 means infinite).
    pub rnr_retry: u8,
    /// Delay before a SEND refused for lack of a posted receive is resent.
    pub min_rnr_timer_ns: u64,
    /// Consecutive retransmission timeouts after which a path is retired and
    /// replaced with a fresh source port.
    pub path_retire_after_rtos: u32,
    /// The receiver acknowledges at least every this many packets per path.
    pub ack_every_packets: u32,
    /// ...or this long after the first unacknowledged packet, whichever is first.
    pub ack_delay_ns: u64,
    /// How long the ACK that completes an *unsignaled* request (one whose
    /// sender asked for no completion, so nothing waits on it) may wait for
    /// data going back to the requester to carry it. `0` (the default):
    /// never, such an ACK goes at once like any completing one. Both
    /// devices must agree (like `ack_delay_ns`): the requester's probe
    /// timeout for such a packet allows for this wait. A small all-reduce
    /// beyond 2 ranks answers a partner's message with one to the *next*
    /// partner, so every completing ACK went in a datagram of its own
    /// (transport spec §3, deferred ACKs).
    pub deferred_ack_ns: u64,
    /// For how long after a receive path last showed a hole or a duplicate
    /// (packets, or our ACKs, lost on the way) an ACK that answers a resend
    /// or a duplicate is sent twice. `0`: never. Default 1 ms: on the
    /// 128-host permutation at 10 % loss end to end, seeds 1-5, the mean
    /// makespan went from 373.1 to 349.6 µs (70.3 % of loss-free instead of
    /// 65.9 %) with the ACK-route rule of c3bf440 (the moved-route rule
    /// since gives that back: RESULTS.md); copying every ACK instead gained
    /// as much there but took 2 %
    /// of the bandwidth of a multi-plane permutation (transport spec §3).
    pub ack_copy_horizon_ns: u64,
    /// A drained connection (nothing new queued, several paths) sends each
    /// of its last this many outstanding packets once more on another
    /// path: a lost tail packet otherwise waits a probe timeout. A capped
    /// connection sends them as probes at its pace, each only if its
    /// segment is still unacknowledged then. `0`: never. Default 8: at most
    /// eight packets per message end (1.7 % of a 2 MB transfer), sent only
    /// while the device is losing packets (transport spec §4).
    pub tail_copy_packets: u32,
    /// While the device is losing packets, a message of at most this many
    /// data packets is followed by repair packets (Reed-Solomon recovery
    /// shards, see `repair.rs`), so that the receiver rebuilds a lost packet
    /// instead of waiting a round trip for its resend. `0`: never. Default
    /// 32 (128 KiB at a 4 KiB MTU): a collective's step, not a bulk flow.
    pub repair_max_message_packets: u32,
    /// The most repair packets per message. Default 8.
    pub repair_max_packets: u32,
    /// Lower bound of a connection-level retry round (the silence, with
    /// work outstanding, after which the connection counts one of its
    /// `retry_cnt` retries). `0` (the default): the connection's RTO, so
    /// with `rto_min_ns` 4 ms a peer silent for about a second (4 ms
    /// doubling over eight rounds) fails the connection. A job that learns
    /// of dead peers otherwise (a control channel) sets a floor so that a
    /// peer busy for a second is not taken for dead.
    pub retry_round_min_ns: u64,
    /// Lower bound of every probe timeout (the silence before a tail-loss
    /// probe, and before an unanswered probe counts as a dead path). `0`
    /// (the default): none, a fabric's RTT rules. Hosts that share CPUs
    /// answer late by scheduler noise far above a fabric's RTT deviation:
    /// the UDP datapath sets a floor, or it probes (and retires paths)
    /// when the peer was only off its CPU.
    pub probe_timeout_min_ns: u64,
    /// Cross-path RACK's reordering window, per mille of the connection's
    /// minimum RTT. When a packet sent after a path's newest outstanding
    /// one has been acknowledged on another path, that path is probed once
    /// its newest is overdue by the later packet's round trip (or its own
    /// smoothed RTT, whichever is longer) plus this window, instead of
    /// after a full probe timeout. `0`: off (probe timeouts only). Default
    /// 500, half the minimum RTT (or twice the RTT deviation, if more):
    /// RFC 8985's quarter probed loss-free 128-host permutations three
    /// times as often for nothing (collisions make paths' queues differ),
    /// with no gain under loss over seeds 1-5.
    pub rack_reorder_permille: u32,
    /// Share of the line rate, per mille, the device may spend on
    /// speculative packets (tail-loss probes, and a silent connection's
    /// lone packet sent again elsewhere): see `probe_budget.rs`. `0`: no
    /// limit. Default 250 (a quarter): above what probes cost under random
    /// loss, far below the flood a many-peer start can set off.
    pub probe_share_permille: u32,
    /// Window over which the receiver counts active senders for its rate hint.
    pub rate_hint_epoch_ns: u64,
    /// Share of its line a receiver grants its senders in all when there
    /// are several, on a loss-free fabric without a queue: its loss rate is
    /// taken off for the senders' resends, up to 2.5 % while packets
    /// arrive CE-marked, and 5 % from a newcomer's arrival until the link
    /// is seen idle (see `admission.rs`).
    pub grant_utilisation: f64,
    /// The per-sender fabric term (see `admission.rs`), for fabrics an
    /// operator knows to be over-committed as a whole (oversubscribed
    /// leaf uplinks): while more than this share (per mille) of one
    /// sender's packets arrive CE-marked and the receiver's link is not
    /// full, the receiver cuts that sender's grant. 1000 (the default):
    /// off, and a device-wide term acts only when most of all arrivals
    /// are marked. On a fabric that is not over-committed it costs a
    /// little (marks from passing collisions cut grants for nothing).
    pub fabric_mark_bar_permille: u32,
    /// A connection idle (nothing in flight) for this many base RTTs starts
    /// its next message as a new one would, cold (0: never).
    pub idle_restart_rtts: u64,
    /// Payload of the one packet a cold connection (one that has heard
    /// nothing from its receiver yet, see `idle_restart_rtts`) sends of a
    /// message that needs more than one packet; the rest waits for the
    /// receiver's first ACK. `0`: a full packet. Default 256: n newcomers
    /// toward one receiver put n such packets into its queue before any
    /// of them can hear of the others, and at 256 bytes a thousand of
    /// them (about 330 KB with their headers) stay within two
    /// bandwidth-delay products of a 100 Gb/s, 14 us fabric, where full
    /// 4 KB packets (4.2 MB) overflow a 1 MB buffer four times over. A
    /// message that fits one packet goes whole: nothing waits behind it.
    pub cold_packet_bytes: u32,
    /// Copies of a cold connection's short first packet, each on another
    /// path (transport spec §4, "Cold copies"; 0: none).
    pub cold_copies: u32,
    /// Largest message a work request may carry.
    pub max_message_bytes: u32,
    /// Maximum outstanding send work requests per QP.
    pub max_send_wr: u32,
    /// Maximum posted receive work requests per QP.
    pub max_recv_wr: u32,
    /// Maximum memory regions per endpoint (at most 2^20: the key's index field).
    pub max_memory_regions: u32,
    /// Maximum queue pairs per endpoint (at most 2^16).
    pub max_queue_pairs: u32,
    /// Maximum connections (peers) per endpoint. Connections are created
    /// only by local calls (`connect_qp`), never by an incoming packet.
    pub max_connections: u32,
    /// Maximum bytes of registered memory per endpoint, over all regions.
    pub max_registered_bytes: u64,
    /// Maximum messages one connection holds at once: local requests not yet
    /// completed plus responses (READ data, atomic results) not yet
    /// acknowledged, over all its QPs. A post beyond it is refused with
    /// `PostError::ConnectionBusy`; a peer's READ or atomic beyond it is not
    /// executed (the peer retries), so a peer cannot pile up responses.
    pub max_outstanding_ops_per_connection: u32,
    /// How far ahead of the next expected message a peer's request may be
    /// (the responder's per-QP window, 1..=2^16): requests further ahead are
    /// dropped, which bounds what one QP keeps for a peer.
    pub max_incoming_ops_per_qp: u32,
    /// Path slots a peer may use toward this endpoint (1..=256). Receive
    /// state is kept per slot; packets naming a higher slot are dropped.
    pub max_peer_paths: usize,
    /// Packet authentication and optional encryption; `None` sends packets
    /// with the ICRC only (the wire is then exactly as without this field).
    pub auth: Option<AuthConfig>,
    /// Take data packets whose sender omitted the ICRC (`ICRC_OMITTED`,
    /// wire.md 7.2): the UDP checksum, which the kernel checks, protects
    /// them instead. Off, such packets fail their ICRC check. Which peers
    /// this endpoint omits it toward is per peer
    /// (`Endpoint::set_peer_icrc_omission`), after the peer said it takes
    /// them (the connection manager's `icrc_omission`).
    pub accept_icrc_omitted: bool,
    /// Base of every path's initial PSN. A protocol parameter that must match
    /// on both sides (like perftest's symmetric options); tests set it just
    /// below the wrap point so every path wraps.
    pub psn_base: u32,
    /// Congestion controller for every connection.
    pub cc: CcAlgorithm,
    /// Its tunables ([`MetaRoceParams::KNOBS`]).
    pub cc_params: MetaRoceParams,
    /// Seed of every random choice the endpoint makes (keys, initial PSNs,
    /// replacement ports). Drivers seed it from the OS in production and from
    /// the test's seed in the harness.
    pub seed: u64,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            device_port: DEFAULT_DEVICE_PORT,
            path_port_span: 64,
            port_planes: 1,
            mtu_payload_bytes: 4096,
            paths_per_connection: 16,
            path_burst_bytes: 0,
            line_rate_bps: 100_000_000_000,
            base_rtt_ns: 10_000,
            rto_min_ns: 100_000,
            rto_max_ns: 100_000_000,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer_ns: 10_000,
            path_retire_after_rtos: 2,
            ack_every_packets: 4,
            ack_delay_ns: 4_000,
            deferred_ack_ns: 0,
            ack_copy_horizon_ns: 1_000_000,
            tail_copy_packets: 8,
            repair_max_message_packets: 32,
            repair_max_packets: 8,
            rack_reorder_permille: 500,
            probe_timeout_min_ns: 0,
            retry_round_min_ns: 0,
            probe_share_permille: 250,
            rate_hint_epoch_ns: 50_000,
            grant_utilisation: 1.0,
            fabric_mark_bar_permille: 1000,
            idle_restart_rtts: 16,
            cold_packet_bytes: 256,
            cold_copies: 1,
            max_message_bytes: 1 << 31,
            max_send_wr: 4096,
            max_recv_wr: 4096,
            max_memory_regions: 1 << 16,
            max_queue_pairs: 1 << 16,
            max_connections: 1 << 16,
            max_registered_bytes: 1 << 44,
            max_outstanding_ops_per_connection: 1 << 20,
            max_incoming_ops_per_qp: 1 << 16,
            max_peer_paths: 256,
            auth: None,
            accept_icrc_omitted: false,
            psn_base: 0,
            cc: CcAlgorithm::default(),
            cc_params: MetaRoceParams::default(),
            seed: 0,
        }
    }
}

/// A configuration value is out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid endpoint config: {field} {reason}")]
pub struct ConfigError {
    /// The offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl EndpointConfig {
    /// One bandwidth-delay product: the bytes the line carries in a base
    /// round trip.
    pub fn bdp_bytes(&self) -> u64 {
        let bytes = u128::from(self.line_rate_bps) * u128::from(self.base_rtt_ns) / 8_000_000_000;
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }

    /// Whether this endpoint's hosts share their CPUs (a probe-timeout
    /// floor is set, as the UDP datapath does): silences then come from
    /// stalls as well as dead routes, and the verdicts on silence ask for
    /// stronger evidence (transport spec §4-§5).
    pub fn hosts_share_cpus(&self) -> bool {
        self.probe_timeout_min_ns > 0
    }

    /// The tunables of the protocol's behaviour by name (limits, keys and
    /// identities are set in code, not here). Ranges are what
    /// [`validate`](Self::validate) accepts or tighter; fields that depend
    /// on each other are checked again there.
    pub const KNOBS: &'static [Knob<Self>] = &[
        int_knob!(Self, paths_per_connection: usize, 1, 256, "paths (UDP source ports, hence ECMP routes) per connection"),
        int_knob!(Self, path_burst_bytes: u32, 0, MAX_PATH_BURST_BYTES, "bytes of data packets sent on one path before the next path's turn (0: one packet, per-packet spraying)"),
        int_knob!(Self, path_port_span: u16, 1, 4096, "source ports a device may draw paths from (at least paths_per_connection)"),
        int_knob!(Self, port_planes: u16, 1, 64, "NIC planes picked by source port modulo this; a retired path keeps its plane"),
        int_knob!(Self, mtu_payload_bytes: u32, 64, 65_000, "payload bytes per data packet"),
        int_knob!(Self, base_rtt_ns: u64, 1, u32::MAX, "unloaded round trip: the initial window and the first RTO"),
        int_knob!(Self, rto_min_ns: u64, 1, 60_000_000_000u64, "lower bound of every retransmission timeout"),
        int_knob!(Self, rto_max_ns: u64, 1, 60_000_000_000u64, "upper bound of every retransmission timeout after backoff"),
        int_knob!(Self, retry_cnt: u8, 0, 7, "timeouts without progress before work fails with RetryExcErr (ibverbs retry_cnt)"),
        int_knob!(Self, rnr_retry: u8, 0, 7, "receiver-not-ready retries (7: infinite)"),
        int_knob!(Self, min_rnr_timer_ns: u64, 1, 1_000_000_000, "delay before a SEND refused for want of a receive is resent"),
        int_knob!(Self, path_retire_after_rtos: u32, 1, 64, "consecutive timeouts after which a path is retired and replaced"),
        int_knob!(Self, ack_every_packets: u32, 1, 255, "the receiver acknowledges at least every this many packets per path"),
        int_knob!(Self, ack_delay_ns: u64, 1, 1_000_000_000, "...or this long after the first unacknowledged packet"),
        int_knob!(Self, deferred_ack_ns: u64, 0, 1_000_000_000, "the ACK completing an unsignaled request may wait this long for data back to the requester to carry it (0: never), ns"),
        int_knob!(Self, ack_copy_horizon_ns: u64, 0, 1_000_000_000, "an ACK answering a resend or a duplicate goes twice for this long after a hole or a duplicate (0: never), ns"),
        int_knob!(Self, tail_copy_packets: u32, 0, 64, "a drained connection copies its last this many outstanding packets onto other paths while losing packets (a capped one at its pace; 0: never)"),
        int_knob!(Self, repair_max_message_packets: u32, 0, 240, "while the device is losing packets, messages of at most this many packets carry repair packets (0: never)"),
        int_knob!(Self, repair_max_packets: u32, 0, 16, "the most repair packets per message"),
        int_knob!(Self, rack_reorder_permille: u32, 0, 4000, "cross-path RACK: a path is probed once its newest packet is overdue past a later one acknowledged elsewhere by this many per mille of the minimum RTT (0: off)"),
        int_knob!(Self, retry_round_min_ns: u64, 0, 60_000_000_000u64, "lower bound of a connection-level retry round, ns (0: the RTO); the give-up comes after about 2^(retry_cnt+1) times the first round (less where rto_max_ns caps the doubling)"),
        int_knob!(Self, probe_timeout_min_ns: u64, 0, 1_000_000_000, "lower bound of every probe timeout, ns (0: none; the UDP datapath sets one for hosts whose CPUs are shared)"),
        int_knob!(Self, probe_share_permille: u32, 0, 1000, "share of the line rate, per mille, a device may spend on tail-loss probes and other speculative resends (0: no limit)"),
        int_knob!(Self, rate_hint_epoch_ns: u64, 1, 1_000_000_000, "window over which a receiver counts active senders for its rate hint"),
        int_knob!(Self, max_peer_paths: usize, 1, 256, "path slots a peer may use toward this endpoint"),
        crate::real_knob!(
            Self,
            grant_utilisation,
            0.1,
            1.0,
            "share of its line a receiver grants its senders in all when there are several, less its loss rate, up to 2.5 % while packets arrive CE-marked, and 5 % from a newcomer's arrival until its link is seen idle"
        ),
        int_knob!(Self, fabric_mark_bar_permille: u32, 0, 1000, "per-sender fabric term for a fabric over-committed as a whole (oversubscribed uplinks): while more than this share, per mille, of a sender's packets arrive CE-marked on a receiver link that is not full, the receiver cuts that sender's grant (1000: off)"),
        int_knob!(Self, idle_restart_rtts: u64, 0, 1_000_000, "base RTTs idle after which a connection starts its next message cold (0: never)"),
        int_knob!(Self, cold_packet_bytes: u32, 0, 1 << 20, "payload of a cold connection's one packet of a message that needs more than one (0: a full packet)"),
        int_knob!(Self, cold_copies: u32, 0, 8, "copies of a cold connection's short first packet, each on another path (0: none)"),
    ];

    /// Check every field's range; the endpoint refuses a config that fails.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, reason| Err(ConfigError { field, reason });
        if self.paths_per_connection == 0 || self.paths_per_connection > 256 {
            return bad("paths_per_connection", "must be 1..=256");
        }
        if self.port_planes == 0 || self.port_planes > 64 {
            return bad("port_planes", "must be 1..=64");
        }
        if (self.path_port_span as usize) < self.paths_per_connection {
            return bad("path_port_span", "must be at least paths_per_connection");
        }
        if u32::from(self.device_port) + u32::from(self.path_port_span) > u32::from(u16::MAX) {
            return bad("device_port", "plus path_port_span must fit in a UDP port");
        }
        if self.path_burst_bytes > MAX_PATH_BURST_BYTES {
            return bad("path_burst_bytes", "must be 0..=1048576");
        }
        if !(64..=65_000).contains(&self.mtu_payload_bytes) {
            return bad("mtu_payload_bytes", "must be 64..=65000");
        }
        if self.line_rate_bps < 1_000_000 {
            return bad("line_rate_bps", "must be at least 1 Mbit/s");
        }
        if self.base_rtt_ns == 0 || self.rto_min_ns == 0 || self.rto_max_ns < self.rto_min_ns {
            return bad(
                "rto_min_ns",
                "base_rtt_ns, rto_min_ns must be > 0 and rto_max_ns >= rto_min_ns",
            );
        }
        if self.base_rtt_ns > u64::from(u32::MAX) {
            // It seeds every path's RTT estimate, which is kept in 32 bits
            // (`RttEstimator`): a larger base would be cut.
            return bad("base_rtt_ns", "must be at most 2^32 - 1 ns (4.29 s)");
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return bad("retry_cnt", "retry_cnt and rnr_retry must be 0..=7");
        }
        if self.ack_every_packets == 0 {
            return bad("ack_every_packets", "must be at least 1");
        }
        if self.max_memory_regions == 0 || self.max_memory_regions > (1 << 20) {
            return bad("max_memory_regions", "must be 1..=2^20");
        }
        if self.max_queue_pairs == 0 || self.max_queue_pairs > (1 << 16) {
            return bad("max_queue_pairs", "must be 1..=2^16");
        }
        if self.max_send_wr == 0 || self.max_recv_wr == 0 || self.max_connections == 0 {
            return bad(
                "max_send_wr",
                "queue and connection limits must be at least 1",
            );
        }
        if self.path_retire_after_rtos == 0 {
            return bad("path_retire_after_rtos", "must be at least 1");
        }
        if self.max_registered_bytes == 0 {
            return bad("max_registered_bytes", "must be at least 1");
        }
        if self.max_outstanding_ops_per_connection == 0 {
            return bad("max_outstanding_ops_per_connection", "must be at least 1");
        }
        if self.max_incoming_ops_per_qp == 0 || self.max_incoming_ops_per_qp > (1 << 16) {
            return bad("max_incoming_ops_per_qp", "must be 1..=2^16");
        }
        if self.max_peer_paths == 0 || self.max_peer_paths > 256 {
            return bad("max_peer_paths", "must be 1..=256");
        }
        for k in MetaRoceParams::KNOBS {
            let v = (k.get)(&self.cc_params);
            if !(k.min..=k.max).contains(&v) {
                return bad(
                    k.name,
                    "congestion-control parameter out of range (see MetaRoceParams::KNOBS)",
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_rtt_fits_the_32_bit_rtt_estimate() {
        let base = EndpointConfig::default();
        let with = |base_rtt_ns| EndpointConfig {
            base_rtt_ns,
            ..base.clone()
        };
        assert_eq!(with(u64::from(u32::MAX)).validate(), Ok(()));
        let err = with(u64::from(u32::MAX) + 1).validate().unwrap_err();
        assert_eq!(err.field, "base_rtt_ns");
    }
}
