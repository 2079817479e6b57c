//! A port: one direction of a link. An output queue per priority and a
//! serializer, busy until the head packet's last bit is out; behind it the
//! pipe (`pipe.rs`) carries the packet to the far end.
//!
//! Control packets (ACKs, NACKs, CNPs, trimmed headers) go before data and
//! are never paused; data waits while the port is paused by PFC or, with
//! credit-based flow control, until its length is covered by credit.

use super::Sim;
use crate::event::EventKind;
use crate::time::{Ps, serialization_ps};
use crate::topology::{NodeRef, Topology};
use crate::transport::TransportFactory;
use std::collections::VecDeque;

/// The data priority's queue index (PFC and credits act on it alone).
pub(super) const DATA: usize = 0;
/// The control priority's queue index: served first, never paused.
pub(super) const CTRL: usize = 1;

/// Counters of one link direction.
#[derive(Debug, Clone, Copy, Default)]
pub struct PortCounters {
    /// Bytes serialized.
    pub tx_bytes: u64,
    /// Packets serialized.
    pub tx_packets: u64,
    /// Packets dropped at enqueue (buffer full).
    pub drops: u64,
    /// Packets trimmed at enqueue.
    pub trims: u64,
    /// Packets ECN-marked here.
    pub ecn_marks: u64,
    /// Packets lost on the wire (random loss).
    pub wire_losses: u64,
    /// Packets lost because the link was down.
    pub down_losses: u64,
    /// PAUSE frames received (this port was paused).
    pub pauses: u64,
    /// Time spent paused.
    pub paused_ps: Ps,
}

/// One direction of a link: output queues, serializer and pipe.
#[derive(Debug)]
pub struct Port {
    /// Sending node.
    pub owner: NodeRef,
    /// Receiving node.
    pub peer: NodeRef,
    /// Index of the reverse port among the peer's ports (its ingress index).
    pub peer_in: u16,
    /// The opposite direction.
    pub reverse: u32,
    /// Rate, bit/s.
    pub rate_bps: u64,
    /// Propagation delay.
    pub delay_ps: Ps,
    /// Report label.
    pub label: u8,
    /// Link up.
    pub up: bool,
    /// Packet indices waiting, per priority ([`DATA`], [`CTRL`]).
    pub(super) queues: [VecDeque<u32>; 2],
    /// Bytes queued (all priorities).
    pub queued_bytes: u64,
    /// The packet being serialized and its size (kept here so finishing
    /// it does not have to fetch the packet's record).
    pub(super) busy: Option<(u32, u32)>,
    /// Data is paused by a PFC frame from the peer.
    pub(super) paused: bool,
    /// When the current pause began.
    pub(super) paused_since: Ps,
    /// Counters.
    pub c: PortCounters,
    /// Index of its link monitor in the measurements (`u32::MAX`: none).
    pub(super) monitor: u32,
}

impl Port {
    fn new(
        owner: NodeRef,
        peer: NodeRef,
        peer_in: u16,
        rate_bps: u64,
        delay_ps: Ps,
        label: u8,
    ) -> Self {
        Self {
            owner,
            peer,
            peer_in,
            reverse: 0,
            rate_bps,
            delay_ps,
            label,
            up: true,
            queues: [VecDeque::new(), VecDeque::new()],
            queued_bytes: 0,
            busy: None,
            paused: false,
            paused_since: 0,
            c: PortCounters::default(),
            monitor: u32::MAX,
        }
    }

    /// Time to put `bytes` on this link.
    #[inline]
    fn serialization_ps(&self, bytes: u32) -> Ps {
        serialization_ps(u64::from(bytes), self.rate_bps)
    }

    /// Whether a NIC should hand this port a packet now: it is up, idle,
    /// unpaused and has nothing queued (a real NIC fetches work as its
    /// link frees, it does not build a deep queue).
    #[inline]
    pub(super) fn wants_packet(&self) -> bool {
        self.up
            && self.busy.is_none()
            && !self.paused
            && self.queues[DATA].is_empty()
            && self.queues[CTRL].is_empty()
    }

    /// Queue packet `k` of `bytes` at priority `prio`.
    #[inline]
    pub(super) fn enqueue(&mut self, prio: usize, k: u32, bytes: u64) {
        self.queues[prio].push_back(k);
        self.queued_bytes += bytes;
    }
}

/// Two ports per link, its a→b direction then its b→a, and each host's
/// and each switch's ports in link order. A node's port index (its
/// position in that list) is what a peer's `peer_in` names, and what PFC
/// and credits account an ingress by.
pub(super) fn build_ports(topo: &Topology) -> (Vec<Port>, Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let mut ports: Vec<Port> = Vec::with_capacity(topo.links.len() * 2);
    let mut host_ports: Vec<Vec<u32>> = vec![Vec::new(); topo.hosts as usize];
    let mut switch_ports: Vec<Vec<u32>> = vec![Vec::new(); topo.switches.len()];
    let node_ports = |n: NodeRef, host_ports: &Vec<Vec<u32>>, switch_ports: &Vec<Vec<u32>>| match n
    {
        NodeRef::Host(h) => host_ports[h as usize].len(),
        NodeRef::Switch(s) => switch_ports[s as usize].len(),
    };
    for l in &topo.links {
        let up = ports.len() as u32;
        let a_idx = node_ports(l.a, &host_ports, &switch_ports) as u16;
        let b_idx = node_ports(l.b, &host_ports, &switch_ports) as u16;
        ports.push(Port::new(
            l.a, l.b, b_idx, l.rate_bps, l.delay_ps, l.label_up,
        ));
        ports.push(Port::new(
            l.b,
            l.a,
            a_idx,
            l.rate_bps,
            l.delay_ps,
            l.label_down,
        ));
        ports[up as usize].reverse = up + 1;
        ports[up as usize + 1].reverse = up;
        for (node, p) in [(l.a, up), (l.b, up + 1)] {
            match node {
                NodeRef::Host(h) => host_ports[h as usize].push(p),
                NodeRef::Switch(s) => switch_ports[s as usize].push(p),
            }
        }
    }
    (ports, host_ports, switch_ports)
}

impl<F: TransportFactory> Sim<F> {
    /// The port that sends from node `a` to node `b`; an error naming both
    /// when no link joins them.
    pub(super) fn link_port(&self, a: NodeRef, b: NodeRef) -> Result<u32, crate::error::SimError> {
        self.ports
            .iter()
            .position(|p| p.owner == a && p.peer == b)
            .map(|p| p as u32)
            .ok_or_else(|| crate::error::SimError::NoLink {
                a: self.topo.node_name(a),
                b: self.topo.node_name(b),
            })
    }

    /// Start serializing at port `p` if it is up and idle and has a packet
    /// it may send: control first; data unless paused or short of credit.
    #[inline]
    pub(super) fn tx_start(&mut self, now: Ps, p: u32) {
        let port = &self.ports[p as usize];
        if port.busy.is_some() || !port.up {
            return;
        }
        let prio = if !port.queues[CTRL].is_empty() {
            CTRL
        } else if let Some(&k) = port.queues[DATA].front()
            && !port.paused
            && self.credit_covers(p, k)
        {
            DATA
        } else {
            return;
        };
        let k = self.ports[p as usize].queues[prio]
            .pop_front()
            .expect("non-empty");
        let head = self.packets.head(k);
        let (bytes, in_port) = (head.wire.bytes, head.in_port);
        if prio == DATA && !self.credits.is_empty() {
            self.credit_spend(now, p, bytes, in_port);
        }
        let port = &mut self.ports[p as usize];
        port.queued_bytes -= u64::from(bytes);
        port.busy = Some((k, bytes));
        let done = now + port.serialization_ps(bytes);
        match port.owner {
            NodeRef::Switch(s) => self.switch_dequeued(now, s, prio, in_port, u64::from(bytes)),
            NodeRef::Host(h) => self.hosts[h as usize].queued -= 1,
        }
        self.events.schedule(done, EventKind::TxDone(p));
    }

    /// Port `p`'s serializer finished: the packet enters the pipe, and the
    /// port takes its next one.
    #[inline]
    pub(super) fn tx_done(&mut self, now: Ps, p: u32) {
        let port = &mut self.ports[p as usize];
        let Some((k, bytes)) = port.busy.take() else {
            return;
        };
        port.c.tx_bytes += u64::from(bytes);
        port.c.tx_packets += 1;
        if port.monitor != u32::MAX {
            // Spread over the bins its serialization spanned, so a bin never
            // shows more than the link can carry.
            let m = port.monitor as usize;
            let start = now.saturating_sub(port.serialization_ps(bytes));
            self.measured.monitors[m]
                .tx_bytes
                .add_span(start, now, self.bin_ps, u64::from(bytes));
        }
        self.pipe_enter(now, p, k);
        self.wake_port(now, p);
    }

    /// Port `p` may be able to send again (its serializer freed, a pause
    /// lifted, credit came back, its link came up): start it and, at a
    /// host, let the NIC pull more packets.
    #[inline]
    pub(super) fn wake_port(&mut self, now: Ps, p: u32) {
        self.tx_start(now, p);
        if let NodeRef::Host(h) = self.ports[p as usize].owner {
            self.host_pull(now, h);
            // The pull may have found the transport pacing: its deadline
            // must be armed, or the next packet would wait for an ACK.
            self.rearm_host_timer(now, h);
        }
    }
}
