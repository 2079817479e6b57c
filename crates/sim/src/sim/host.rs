//! A host: one NIC running a transport, with a port per plane.
//!
//! The transport is a sans-IO state machine; the host drives it as a real
//! datapath would. After every input (a packet, a timer, a posted
//! message) `host_service` takes its message events, lets the NIC pull
//! packets, and re-arms its timer. The NIC pulls only while a plane can
//! send at once; a packet's UDP source port picks its plane.

use super::Sim;
use super::loss::LossCause;
use super::packet::PacketHead;
use super::routing::five_tuple_hash;
use crate::error::SimError;
use crate::event::EventKind;
use crate::time::Ps;
use crate::topology::Topology;
use crate::transport::{HostInfo, Transport, TransportFactory, Wire};

/// One host's transport, ports and timer.
pub(super) struct HostState<H> {
    /// The transport (one NIC).
    pub(super) transport: H,
    /// Its port on each plane.
    pub(super) ports: Vec<u32>,
    /// The transport's current deadline.
    timer_at: Option<Ps>,
    /// Earliest timer event in the queue for this host. Deadlines that move
    /// later (an RTO pushed back by every ACK) schedule nothing: the early
    /// event fires, sees the deadline has moved, and re-arms once.
    armed_at: Option<Ps>,
    /// Packets the NIC pulled that have not started serializing.
    pub(super) queued: u32,
    /// Every channel it sends on, by destination host: the transport's
    /// channel number and the messages still to finish on it (at zero the
    /// channel is closed and its state released).
    pub(super) channels: std::collections::HashMap<u32, (u32, u32)>,
    /// How many hosts have channels to this one over the run.
    pub(super) senders_to_me: u32,
}

/// A transport per host from `factory`, each with its ports from `build_ports`.
pub(super) fn build_hosts<F: TransportFactory>(
    topo: &Topology,
    factory: &F,
    host_ports: Vec<Vec<u32>>,
    seed: u64,
) -> Result<Vec<HostState<F::Host>>, SimError> {
    let base_rtt_ps = super::base_rtt(topo);
    let mut hosts = Vec::with_capacity(topo.hosts as usize);
    for (h, ports) in (0..topo.hosts).zip(host_ports) {
        let info = HostInfo {
            index: h,
            line_rate_bps: topo.host_rate_bps * u64::from(topo.planes),
            base_rtt_ps,
            seed,
        };
        hosts.push(HostState {
            transport: factory.host(&info)?,
            ports,
            timer_at: None,
            armed_at: None,
            queued: 0,
            channels: std::collections::HashMap::new(),
            senders_to_me: 0,
        });
    }
    Ok(hosts)
}

impl<F: TransportFactory> Sim<F> {
    /// Packet `k` reaches its destination host `h`.
    #[inline]
    pub(super) fn host_receive(&mut self, now: Ps, h: u32, k: u32) {
        if self.cfg.loss_e2e > 0.0 && super::unit(&mut self.rng) < self.cfg.loss_e2e {
            self.account_loss(now, k, LossCause::EndToEnd, None, None);
            return;
        }
        let body = self
            .packets
            .take_body(k)
            .expect("a packet in flight has a body");
        let head = self.packets.head(k);
        let (wire, src, trimmed) = (head.wire, head.src, head.trimmed);
        self.packets.release(k);
        if wire.payload > 0 && !trimmed {
            self.measured
                .delivered
                .add_at(now / self.bin_ps, u64::from(wire.payload));
            self.measured.delivered_packets += 1;
        }
        self.hosts[h as usize]
            .transport
            .handle_packet(now, src, &wire, trimmed, &body);
        self.host_service(now, h);
    }

    /// After any input to host `h`: take its message events, let its NIC
    /// pull packets, re-arm its timer.
    #[inline]
    pub(super) fn host_service(&mut self, now: Ps, h: u32) {
        while let Some(ev) = self.hosts[h as usize].transport.poll_event() {
            self.message_event(now, ev);
        }
        self.host_pull(now, h);
        self.rearm_host_timer(now, h);
    }

    /// Take host `h`'s transport's next deadline and arm its timer: after
    /// anything that may have moved it, including a NIC pull (a paced
    /// sender asked for a packet too early sets its pacing deadline then).
    #[inline]
    pub(super) fn rearm_host_timer(&mut self, now: Ps, h: u32) {
        let host = &mut self.hosts[h as usize];
        host.timer_at = host.transport.poll_timeout().map(|t| t.max(now));
        self.arm_timer(h);
    }

    /// Schedule host `h`'s timer event unless one at or before its
    /// deadline is already queued.
    #[inline]
    fn arm_timer(&mut self, h: u32) {
        let host = &mut self.hosts[h as usize];
        if let Some(t) = host.timer_at
            && host.armed_at.is_none_or(|a| t < a)
        {
            host.armed_at = Some(t);
            self.events.schedule(t, EventKind::HostTimer(h));
        }
    }

    /// Host `h`'s timer event: fire the transport's timers if due, else
    /// re-arm for the deadline that moved.
    pub(super) fn host_timer(&mut self, now: Ps, h: u32) {
        let host = &mut self.hosts[h as usize];
        if host.armed_at != Some(now) {
            return; // superseded by an earlier arming
        }
        host.armed_at = None;
        match host.timer_at {
            Some(t) if t <= now => {
                host.transport.handle_timeout(now);
                self.host_service(now, h);
            }
            _ => self.arm_timer(h),
        }
    }

    /// Host `h`'s NIC takes packets from its transport while a plane can
    /// send now and its pull-ahead queue has room.
    #[inline]
    pub(super) fn host_pull(&mut self, now: Ps, h: u32) {
        let planes = self.hosts[h as usize].ports.len();
        loop {
            let host = &self.hosts[h as usize];
            let idle = host
                .ports
                .iter()
                .any(|&p| self.ports[p as usize].wants_packet());
            if !idle || host.queued >= self.cfg.nic_queue_packets.max(1) * planes as u32 {
                return;
            }
            let Some((wire, body)) = self.hosts[h as usize].transport.poll_packet(now) else {
                return;
            };
            let p = self.nic_plane_port(h, &wire);
            let head = PacketHead {
                wire,
                src: h,
                in_port: 0,
                trimmed: false,
            };
            let prio = head.priority();
            let k = self.packets.alloc(head, body);
            self.measured.nic_packets += 1;
            self.ports[p as usize].enqueue(prio, k, u64::from(wire.bytes));
            self.hosts[h as usize].queued += 1;
            self.tx_start(now, p);
        }
    }

    /// The port host `h`'s NIC puts `wire` on. The plane is the UDP source
    /// port modulo the planes: the entropy the transport already picks per
    /// path also picks the plane, so a transport that spreads its ports
    /// evenly spreads evenly over planes, and one that pins a flow to a port
    /// (a RoCE QP) pins it to one plane. A hash of the 5-tuple instead left
    /// planes empty or doubled at random: 16 paths over 8 planes by hash
    /// keep about 12 % of the planes idle. If that plane's link is down the
    /// NIC (which knows its own links) spreads the packet over the live
    /// planes by the 5-tuple hash, so a dead plane's load does not land on
    /// one neighbour.
    #[inline]
    fn nic_plane_port(&self, h: u32, wire: &Wire) -> u32 {
        let ports = &self.hosts[h as usize].ports;
        let planes = ports.len();
        let plane = usize::from(wire.src_port) % planes;
        if planes == 1 || self.ports[ports[plane] as usize].up {
            return ports[plane];
        }
        let live = ports.iter().filter(|&&p| self.ports[p as usize].up).count();
        if live == 0 {
            return ports[plane];
        }
        let pick = (five_tuple_hash(h, wire, 0) % live as u64) as usize;
        *ports
            .iter()
            .filter(|&&p| self.ports[p as usize].up)
            .nth(pick)
            .expect("pick < live")
    }
}
