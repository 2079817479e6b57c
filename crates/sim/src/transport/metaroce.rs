//! MetaRoCE hosts: the real protocol core ([`metaroce_proto::Endpoint`]) in
//! descriptor mode, so headers move and payload bytes do not.
//!
//! Each host has one endpoint with one virtual memory region. A channel
//! `a -> b` is an RC QP pair; a message is one RDMA WRITE_WITH_IMM whose
//! immediate is the flow tag, so the receiver learns when all the data is
//! placed (its receive completion) and the sender when it is acknowledged
//! (its send completion).

use super::{
    ChannelPlan, FRAME_OVERHEAD_BYTES, HostInfo, MessageEvent, PairStats, Transport,
    TransportError, TransportFactory, TransportStats, Wire,
};
use crate::address::{host_index, host_ip};
use crate::capture::SimCapture;
use crate::time::{Ps, ns_to_ps, ps_to_ns};
use metaroce_proto::{
    AccessFlags, Ecn, Endpoint, EndpointConfig, MrInfo, PacketRepr, PacketSlot, QpCaps, QpHandle,
    RecvWr, SendWr, Sge, WcStatus, WorkQueue, WrOp,
};
use metaroce_wire::{AckRepr, BaseRepr, DataRepr, OpAck, OpHeader, SackBits};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::rc::Rc;

/// Most receives kept posted per channel (replenished as they complete):
/// a channel pre-posts one per message the workload will send over it, up
/// to this many. 40 B each, so posting the maximum on each of 8192 hosts'
/// channels would cost 21 MB for permutations that need one.
const MAX_RECVS_PER_CHANNEL: u32 = 64;
/// Region length: any message fits (the core caps messages at 2 GiB).
const REGION_BYTES: u64 = 1 << 32;

/// Knobs of the MetaRoCE hosts.
#[derive(Debug, Clone)]
pub struct MetaRoceFactory {
    /// Paths (source ports) per connection.
    pub paths: usize,
    /// Payload bytes per data packet.
    pub mtu_payload_bytes: u32,
    /// Overrides of the endpoint defaults applied to every host.
    pub base: EndpointConfig,
    /// Base RTT given to the core instead of the topology's (initial window
    /// and first RTO), ns.
    pub base_rtt_override_ns: Option<u64>,
    /// Packet capture of the hosts it names (`--pcap`).
    pub capture: Option<SimCapture>,
}

impl Default for MetaRoceFactory {
    fn default() -> Self {
        Self {
            paths: 16,
            mtu_payload_bytes: 4096,
            base: EndpointConfig::default(),
            base_rtt_override_ns: None,
            capture: None,
        }
    }
}

#[derive(Debug)]
struct Channel {
    /// `None` once closed.
    qp: Option<QpHandle>,
    /// The receiving host.
    peer: u32,
    rkey: u64,
    raddr: u64,
}

/// One MetaRoCE NIC.
#[derive(Debug)]
pub struct MetaRoceHost {
    ep: Endpoint,
    /// Reused to hand a carried ACK back to the core without allocating.
    ack_scratch: Option<Box<AckRepr>>,
    /// Reused to take packets out of the core without allocating per ACK.
    tx_slot: PacketSlot,
    pd: u32,
    mr: MrInfo,
    channels: Vec<Channel>,
    events: VecDeque<MessageEvent>,
    /// The QP receiving each channel toward this host, by sending host.
    incoming: Vec<(u32, QpHandle)>,
    /// Counters of connections closed since (a connection's counters go
    /// with it).
    closed_pairs: HashMap<u32, PairStats>,
    trimmed_dropped: u64,
    ops: SharedOps,
    /// This host's index and the capture, if it is a captured host.
    capture: Option<(u32, SimCapture)>,
    /// `host{id=H}`, entered whenever the simulator drives this host's
    /// core: its connection spans and events (`--log`) nest in it, so a
    /// filter such as `[host{id=77}]=debug` follows one host.
    span: tracing::Span,
}

impl MetaRoceHost {
    /// Host `peer`'s device address: every host listens on the same port.
    fn device_addr(&self, peer: u32) -> SocketAddr {
        SocketAddr::new(host_ip(peer), self.ep.config().device_port)
    }

    /// The core's counters of the live connection to host `peer`.
    fn live_pair_stats(&self, peer: u32) -> PairStats {
        let addr = self.device_addr(peer);
        self.ep
            .connection_stats(addr)
            .map_or_else(PairStats::default, |c| PairStats {
                retransmissions: c.data_packets_retransmitted,
                timeouts: c.rtos,
                duplicates_received: c.duplicates_received,
            })
    }

    /// Destroy `qp` toward host `peer`; if that closes the connection,
    /// keep its counters (they would go with it).
    fn destroy_keeping_counters(&mut self, qp: QpHandle, peer: u32) {
        let before = self.live_pair_stats(peer);
        let _ = self.ep.destroy_qp(qp);
        let addr = self.device_addr(peer);
        if self.ep.connection_stats(addr).is_none() {
            self.closed_pairs.entry(peer).or_default().add(&before);
        }
    }

    /// Record a packet that reached this host, if it is captured.
    fn capture_received(&self, now: Ps, from: SocketAddr, wire: &Wire, ecn: Ecn, p: &PacketRepr) {
        if let Some((me, cap)) = &self.capture {
            let to = SocketAddr::new(host_ip(*me), wire.dst_port);
            cap.record(ps_to_ns(now), from, to, ecn, p);
        }
    }

    /// The endpoint (for inspection in tests and reports).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    fn drain_completions(&mut self) {
        while let Some(c) = self.ep.poll_completion() {
            let wc = c.wc;
            match c.queue {
                WorkQueue::Send => self.events.push_back(if wc.status == WcStatus::Success {
                    MessageEvent::Sent {
                        tag: wc.wr_id as u32,
                    }
                } else {
                    MessageEvent::Failed {
                        tag: wc.wr_id as u32,
                    }
                }),
                WorkQueue::Recv => {
                    if wc.status == WcStatus::Success {
                        if let Some(tag) = wc.imm_data {
                            self.events.push_back(MessageEvent::Received { tag });
                        }
                        // Keep the receive queue topped up.
                        let _ = self.ep.post_recv(
                            c.qp,
                            RecvWr {
                                wr_id: 0,
                                sg_list: Vec::new(),
                            },
                        );
                    }
                }
            }
        }
    }
}

/// A MetaRoCE packet in flight in the simulator: the core's parsed headers,
/// stored compactly, since an 8192-host 400G fabric holds over half a
/// million packets in flight. A data packet shares its message's op header;
/// an ACK keeps its SACK bits and op-acks out of line, and only when it has
/// any (the core's `AckRepr` keeps room for every op-ack an ACK may carry,
/// 320 B, while most ACKs of a clean path carry neither).
#[derive(Debug)]
pub enum MetaRocePacket {
    /// A data packet's headers.
    Data(CompactData),
    /// An ACK.
    Ack(CompactAck),
}

impl MetaRocePacket {
    /// The core's parsed form of this packet, as its sender emitted it (for
    /// capture: [`crate::capture::SimCapture::record`]).
    pub fn to_repr(&self) -> PacketRepr {
        match self {
            Self::Data(d) => PacketRepr::Data(d.repr()),
            Self::Ack(a) => {
                let mut ack = Box::new(AckRepr::new(a.base));
                a.fill(&mut ack);
                PacketRepr::Ack(ack)
            }
        }
    }
}

/// A data packet's fields, with the op header (rkey, address, immediate:
/// 40 bytes, the same on every packet of a message) shared by reference:
/// 48 bytes where the core's `DataRepr` takes 80.
#[derive(Debug)]
pub struct CompactData {
    base: BaseRepr,
    solicited: bool,
    psn_floor_delta: u16,
    floor_acked: bool,
    psn: u32,
    timestamp_ns: u32,
    dst_qpn: u32,
    msg_seq: u32,
    msg_len: u32,
    offset: u32,
    payload_len: u32,
    op: Rc<OpHeader>,
}

impl CompactData {
    fn new(d: &DataRepr, op: Rc<OpHeader>) -> Self {
        debug_assert_eq!(*op, d.op, "a message's packets share its op header");
        Self {
            base: d.base,
            solicited: d.solicited,
            psn_floor_delta: d.psn_floor_delta,
            floor_acked: d.floor_acked,
            psn: d.psn,
            timestamp_ns: d.timestamp_ns,
            dst_qpn: d.dst_qpn,
            msg_seq: d.msg_seq,
            msg_len: d.msg_len,
            offset: d.offset,
            payload_len: d.payload_len,
            op,
        }
    }

    /// The core's form.
    pub fn repr(&self) -> DataRepr {
        DataRepr {
            base: self.base,
            psn: self.psn,
            timestamp_ns: self.timestamp_ns,
            dst_qpn: self.dst_qpn,
            msg_seq: self.msg_seq,
            solicited: self.solicited,
            psn_floor_delta: self.psn_floor_delta,
            floor_acked: self.floor_acked,
            msg_len: self.msg_len,
            offset: self.offset,
            op: *self.op,
            payload_len: self.payload_len,
        }
    }
}

/// Which message an op header belongs to: destination host, QP and
/// message sequence number.
type OpKey = (u32, u32, u32);

/// The op headers of the messages a host has packets of in flight, so each
/// is stored once. Entries no packet holds any more are swept out once they
/// outnumber the rest.
#[derive(Debug, Default)]
struct SharedOps {
    last: Option<(OpKey, Rc<OpHeader>)>,
    by_message: HashMap<OpKey, Rc<OpHeader>>,
    live_after_sweep: usize,
}

impl SharedOps {
    fn get(&mut self, key: OpKey, op: &OpHeader) -> Rc<OpHeader> {
        // Consecutive packets mostly belong to one message.
        if let Some((k, rc)) = &self.last
            && *k == key
            && **rc == *op
        {
            return rc.clone();
        }
        let rc = match self.by_message.get(&key) {
            Some(rc) if **rc == *op => rc.clone(),
            _ => {
                let rc = Rc::new(*op);
                self.by_message.insert(key, rc.clone());
                if self.by_message.len() > 2 * self.live_after_sweep + 64 {
                    // The map holds one reference: more means packets.
                    self.by_message.retain(|_, rc| Rc::strong_count(rc) > 1);
                    self.live_after_sweep = self.by_message.len();
                }
                rc
            }
        };
        self.last = Some((key, rc.clone()));
        rc
    }
}

/// An ACK's fields; the rarely used ones out of line.
#[derive(Debug)]
pub struct CompactAck {
    base: BaseRepr,
    ack_psn: u32,
    ts_echo: u32,
    ack_delay_ns: u32,
    rx_packets: u32,
    ce_packets: u32,
    rate_hint_mbps: u32,
    extras: Option<Box<AckExtras>>,
}

/// SACK bits (set only after a gap on the path), op-acks (one per
/// completed or refused operation) and a trim NACK (only where switches
/// trim).
#[derive(Debug)]
struct AckExtras {
    sack: SackBits,
    op_acks: Box<[OpAck]>,
    trim_offset: u16,
    trim_count: u8,
}

impl CompactAck {
    fn from_repr(ack: &AckRepr) -> Self {
        let extras = (ack.sack != SackBits::EMPTY
            || !ack.op_acks().is_empty()
            || ack.trim_count > 0)
            .then(|| {
                Box::new(AckExtras {
                    sack: ack.sack,
                    op_acks: ack.op_acks().into(),
                    trim_offset: ack.trim_offset,
                    trim_count: ack.trim_count,
                })
            });
        Self {
            base: ack.base,
            ack_psn: ack.ack_psn,
            ts_echo: ack.ts_echo,
            ack_delay_ns: ack.ack_delay_ns,
            rx_packets: ack.rx_packets,
            ce_packets: ack.ce_packets,
            rate_hint_mbps: ack.rate_hint_mbps,
            extras,
        }
    }

    fn fill(&self, ack: &mut AckRepr) {
        *ack = AckRepr::new(self.base);
        ack.ack_psn = self.ack_psn;
        ack.ts_echo = self.ts_echo;
        ack.ack_delay_ns = self.ack_delay_ns;
        ack.rx_packets = self.rx_packets;
        ack.ce_packets = self.ce_packets;
        ack.rate_hint_mbps = self.rate_hint_mbps;
        if let Some(extras) = &self.extras {
            ack.sack = extras.sack;
            ack.trim_offset = extras.trim_offset;
            ack.trim_count = extras.trim_count;
            for op_ack in &extras.op_acks {
                let pushed = ack.push_op_ack(*op_ack);
                debug_assert!(pushed, "an ACK's own op-acks fit it");
            }
        }
    }
}

impl Transport for MetaRoceHost {
    type Packet = MetaRocePacket;

    fn poll_packet(&mut self, now: Ps) -> Option<(Wire, MetaRocePacket)> {
        let _host = self.span.clone().entered();
        let t = self.ep.poll_packet_into(ps_to_ns(now), &mut self.tx_slot)?;
        if let Some((me, cap)) = &self.capture
            && let Some(p) = self.tx_slot.packet()
        {
            let src = SocketAddr::new(host_ip(*me), t.src_port);
            cap.record(ps_to_ns(now), src, t.dst, t.ecn, p);
        }
        let (payload, control, repr) = match self.tx_slot.packet()? {
            PacketRepr::Data(d) => {
                let key = (host_index(t.dst.ip()), d.dst_qpn, d.msg_seq);
                let body = CompactData::new(d, self.ops.get(key, &d.op));
                (d.payload_len, false, MetaRocePacket::Data(body))
            }
            PacketRepr::Ack(a) => (0, true, MetaRocePacket::Ack(CompactAck::from_repr(a))),
        };
        let wire = Wire {
            dst: host_index(t.dst.ip()),
            src_port: t.src_port,
            dst_port: t.dst.port(),
            bytes: t.len as u32 + FRAME_OVERHEAD_BYTES,
            payload,
            ect: t.ecn != Ecn::NotEct,
            ce: t.ecn == Ecn::Ce,
            control,
        };
        Some((wire, repr))
    }

    fn handle_packet(
        &mut self,
        now: Ps,
        src: u32,
        wire: &Wire,
        trimmed: bool,
        packet: &MetaRocePacket,
    ) {
        let _host = self.span.clone().entered();
        if trimmed {
            // The header of a packet a switch trimmed: a NACK for it goes
            // back at once. Only data is ever trimmed.
            match packet {
                MetaRocePacket::Data(d) => {
                    let from = SocketAddr::new(host_ip(src), wire.src_port);
                    self.ep.handle_trimmed(ps_to_ns(now), from, &d.repr());
                    self.drain_completions();
                }
                MetaRocePacket::Ack(_) => self.trimmed_dropped += 1,
            }
            return;
        }
        let ecn = if wire.ce {
            Ecn::Ce
        } else if wire.ect {
            Ecn::Ect0
        } else {
            Ecn::NotEct
        };
        let from = SocketAddr::new(host_ip(src), wire.src_port);
        match packet {
            MetaRocePacket::Data(d) => {
                let repr = PacketRepr::Data(d.repr());
                self.capture_received(now, from, wire, ecn, &repr);
                self.ep.handle_packet(ps_to_ns(now), from, ecn, &repr);
            }
            MetaRocePacket::Ack(compact) => {
                let mut ack = self
                    .ack_scratch
                    .take()
                    .unwrap_or_else(|| Box::new(AckRepr::new(compact.base)));
                compact.fill(&mut ack);
                let repr = PacketRepr::Ack(ack);
                self.capture_received(now, from, wire, ecn, &repr);
                self.ep.handle_packet(ps_to_ns(now), from, ecn, &repr);
                if let PacketRepr::Ack(ack) = repr {
                    self.ack_scratch = Some(ack);
                }
            }
        }
        self.drain_completions();
    }

    fn poll_timeout(&mut self) -> Option<Ps> {
        self.ep.poll_timeout().map(ns_to_ps)
    }

    fn handle_timeout(&mut self, now: Ps) {
        let _host = self.span.clone().entered();
        self.ep.handle_timeout(ps_to_ns(now));
        self.drain_completions();
    }

    fn post_message(
        &mut self,
        now: Ps,
        channel: u32,
        bytes: u64,
        tag: u32,
    ) -> Result<(), TransportError> {
        let _host = self.span.clone().entered();
        let no_channel = TransportError::NoChannel {
            transport: None,
            channel,
        };
        let ch = self
            .channels
            .get(channel as usize)
            .ok_or(no_channel.clone())?;
        let qp = ch.qp.ok_or(no_channel)?;
        let length = u32::try_from(bytes).map_err(|_| TransportError::MessageOver4GiB { bytes })?;
        let wr = SendWr::new(
            u64::from(tag),
            WrOp::WriteImm {
                remote_addr: ch.raddr,
                rkey: ch.rkey,
                imm: tag,
            },
            vec![Sge {
                addr: self.mr.addr,
                length,
                lkey: self.mr.lkey,
            }],
        );
        self.ep
            .post_send_at(ps_to_ns(now), qp, wr)
            .map_err(TransportError::PostSend)?;
        self.drain_completions();
        Ok(())
    }

    fn poll_event(&mut self) -> Option<MessageEvent> {
        self.events.pop_front()
    }

    fn stats(&self) -> TransportStats {
        let s = self.ep.stats();
        TransportStats {
            data_packets: s.data_packets_sent,
            retransmissions: s.data_packets_retransmitted,
            acks: s.ack_packets_sent,
            // Trim NACKs: one per trimmed header, in the next ACK of its path.
            nacks: s.naks_sent + s.rnr_naks_sent + s.rx_trimmed,
            timeouts: s.rtos,
            paths_replaced: s.paths_replaced,
            trimmed_dropped: self.trimmed_dropped,
        }
    }

    /// The core's device counters (`metaroce perf --stats`' names), the
    /// trimmed packets dropped, and the connections open at the end.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut c = self.ep.stats().fields();
        c.push(("trimmed_dropped", self.trimmed_dropped));
        c.push(("connections_open", self.ep.connection_count() as u64));
        c
    }

    fn pair_stats(&self, peer: u32) -> PairStats {
        let mut s = self.closed_pairs.get(&peer).copied().unwrap_or_default();
        s.add(&self.live_pair_stats(peer));
        s
    }

    fn close_send_channel(&mut self, channel: u32) {
        let _host = self.span.clone().entered();
        if let Some(ch) = self.channels.get_mut(channel as usize)
            && let Some(qp) = ch.qp.take()
        {
            let peer = ch.peer;
            self.destroy_keeping_counters(qp, peer);
        }
    }

    fn close_recv_channel(&mut self, from: u32) {
        let _host = self.span.clone().entered();
        if let Some(i) = self.incoming.iter().position(|&(f, _)| f == from) {
            let (_, qp) = self.incoming.swap_remove(i);
            self.destroy_keeping_counters(qp, from);
        }
    }
}

impl TransportFactory for MetaRoceFactory {
    type Host = MetaRoceHost;

    fn host(&self, info: &HostInfo) -> Result<MetaRoceHost, TransportError> {
        // Every host on the base's device port (MetaRoCE's default, 4793,
        // not RoCEv2's 4791, which the RoCE baselines keep, unless the
        // scenario's `device_port` says otherwise). Path source ports
        // follow it, so it enters every ECMP hash.
        let cfg = EndpointConfig {
            paths_per_connection: self.paths,
            path_port_span: self.base.path_port_span.max(self.paths as u16 * 2),
            mtu_payload_bytes: self.mtu_payload_bytes,
            line_rate_bps: info.line_rate_bps,
            base_rtt_ns: self
                .base_rtt_override_ns
                .unwrap_or(ps_to_ns(info.base_rtt_ps).max(1)),
            seed: info
                .seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(u64::from(info.index)),
            ..self.base.clone()
        };
        let mut ep = Endpoint::new(cfg)?;
        let pd = ep.alloc_pd();
        let mr = ep
            .register_virtual_memory(pd, REGION_BYTES, AccessFlags(0xf))
            .map_err(TransportError::RegisterMemory)?;
        Ok(MetaRoceHost {
            ep,
            pd,
            mr,
            channels: Vec::new(),
            events: VecDeque::new(),
            incoming: Vec::new(),
            closed_pairs: HashMap::new(),
            trimmed_dropped: 0,
            ack_scratch: None,
            tx_slot: PacketSlot::new(),
            ops: SharedOps::default(),
            capture: self
                .capture
                .as_ref()
                .filter(|c| c.captures(info.index))
                .map(|c| (info.index, c.clone())),
            span: tracing::info_span!(target: "metaroce_proto", "host", id = info.index),
        })
    }

    fn open_channel(
        &self,
        now: Ps,
        a: &mut MetaRoceHost,
        a_index: u32,
        b: &mut MetaRoceHost,
        b_index: u32,
        plan: ChannelPlan,
    ) -> Result<u32, TransportError> {
        let recvs = plan.messages.clamp(1, MAX_RECVS_PER_CHANNEL);
        let caps = QpCaps {
            max_send_wr: 1024,
            max_recv_wr: recvs,
        };
        let access = AccessFlags(0xf);
        let qa = a.ep.create_qp(a.pd, caps, access)?;
        let qb = b.ep.create_qp(b.pd, caps, access)?;
        let port = self.base.device_port;
        a.span.in_scope(|| {
            a.ep.connect_qp(qa, SocketAddr::new(host_ip(b_index), port), qb.qpn())
        })?;
        b.span.in_scope(|| {
            b.ep.connect_qp(qb, SocketAddr::new(host_ip(a_index), port), qa.qpn())
        })?;
        // The out-of-band setup carries `b`'s promise to `a`: its share of
        // its line among the peers that connect to it.
        let grant_bps = b.ep.setup_grant_bps(plan.senders_to_receiver);
        a.span.in_scope(|| {
            a.ep.take_setup_grant(
                SocketAddr::new(host_ip(b_index), port),
                grant_bps,
                ps_to_ns(now),
            )
        })?;
        for _ in 0..recvs {
            b.ep.post_recv(
                qb,
                RecvWr {
                    wr_id: 0,
                    sg_list: Vec::new(),
                },
            )
            .map_err(TransportError::PostRecv)?;
        }
        b.incoming.push((a_index, qb));
        a.channels.push(Channel {
            qp: Some(qa),
            peer: b_index,
            rkey: b.mr.rkey,
            raddr: b.mr.addr,
        });
        Ok(a.channels.len() as u32 - 1)
    }
}
