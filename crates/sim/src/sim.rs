//! The simulator proper: ports (serializer + pipe), switches, hosts, the
//! event loop, and the measurements the report is built from.
//!
//! A link direction is a [`Port`]: an output queue per priority, a
//! serializer (busy until the head packet's last bit is out) and a pipe
//! (a FIFO of packets in flight, of which only the head has an event).
//! Switches are output-queued: an arriving packet is routed, admitted or
//! dropped (or trimmed), ECN-marked, and queued at its egress port.
//! Packets live in a slab and are recycled, so the steady state allocates
//! nothing per packet (the protocol core's own ACK records aside).

use crate::Ps;
use crate::event::{EventKind, EventQueue};
use crate::fabric::{BufferModel, FabricConfig, Routing, ecmp_hash};
use crate::paged::PagedVec;
use crate::stats::{Histogram, Series};
use crate::topology::{NodeRef, Topology};
use crate::transport::{HostInfo, MessageEvent, Transport, TransportFactory, Wire};
use crate::workload::FlowSet;
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use std::collections::{HashMap, VecDeque};

const DATA: usize = 0;
const CTRL: usize = 1;
/// Bytes a trimmed packet keeps (headers).
pub const TRIM_BYTES: u32 = 64 + crate::transport::FRAME_OVERHEAD_BYTES;

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
    queues: [VecDeque<u32>; 2],
    /// Bytes queued (all priorities).
    pub queued_bytes: u64,
    /// The packet being serialized and its size (kept here so finishing
    /// it does not have to fetch the packet's record).
    busy: Option<(u32, u32)>,
    paused: bool,
    paused_since: Ps,
    /// Counters.
    pub c: PortCounters,
}

impl Port {
    fn ser_ps(&self, bytes: u32) -> Ps {
        (u128::from(bytes) * 8_000_000_000_000 / u128::from(self.rate_bps)) as Ps
    }
}

struct SwitchState {
    ports: Vec<u32>,
    up: Vec<u16>,
    /// Down port by the destination's key at this tier.
    down: Vec<u16>,
    tier: u8,
    pod: u32,
    top: bool,
    salt: u64,
    used_bytes: u64,
    ingress_bytes: Vec<u64>,
    paused_upstream: Vec<bool>,
}

struct HostState<H> {
    t: H,
    ports: Vec<u32>,
    /// The transport's current deadline.
    timer_at: Option<Ps>,
    /// Earliest timer event in the queue for this host. Deadlines that move
    /// later (an RTO pushed back by every ACK) schedule nothing: the early
    /// event fires, sees the deadline has moved, and re-arms once.
    armed_at: Option<Ps>,
    queued: u32,
    channels: Vec<(u32, u32)>,
}

/// What the fabric reads of a packet at every hop. Kept apart from the
/// transport's body (the core's parsed headers, ~100 B), which only the
/// receiving host reads: the records switches touch stay small and dense,
/// so a hop costs fewer cache misses.
#[derive(Debug, Clone, Copy)]
struct PktHead {
    wire: Wire,
    src: u32,
    in_port: u16,
    trimmed: bool,
}

/// A flow's outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowRun {
    /// When it was posted.
    pub started: Option<Ps>,
    /// When all data arrived.
    pub received: Option<Ps>,
    /// When the sender completed.
    pub sent: Option<Ps>,
    /// Whether it ended in an error.
    pub failed: bool,
}

/// Everything measured during a run, for [`crate::report`].
#[derive(Debug)]
pub struct Measurements {
    /// Per flow.
    pub flows: Vec<FlowRun>,
    /// Queue depth seen by arriving packets, per port label.
    pub queue_hist: Vec<Histogram>,
    /// Payload bytes delivered to hosts per time bin.
    pub delivered: Series,
    /// Largest queue per label per time bin.
    pub queue_max: Vec<Series>,
    /// Packets dropped because no live route existed.
    pub no_route: u64,
    /// Packets dropped beyond PFC headroom.
    pub headroom_drops: u64,
    /// Data packets delivered to hosts.
    pub delivered_packets: u64,
    /// Packets put on host links by NICs.
    pub nic_packets: u64,
}

/// Wall-clock and size figures of a run (not part of the deterministic results).
#[derive(Debug, Clone, Copy, Default)]
pub struct RunPerf {
    /// Events executed.
    pub events: u64,
    /// Most events pending at once.
    pub max_pending: usize,
    /// Packet records ever allocated (the slab's high-water mark).
    pub packet_slots: usize,
}

/// A simulation: a topology, a transport on every host, a workload.
pub struct Sim<F: TransportFactory> {
    topo: Topology,
    cfg: FabricConfig,
    ports: Vec<Port>,
    switches: Vec<SwitchState>,
    hosts: Vec<HostState<F::Host>>,
    pkts: PagedVec<PktHead>,
    /// Transport bodies, by the same index as `pkts`.
    bodies: PagedVec<Option<<F::Host as Transport>::Packet>>,
    free: PagedVec<u32>,
    q: EventQueue,
    rng: ChaCha8Rng,
    work: FlowSet,
    trig_got: Vec<u32>,
    trig_flows: Vec<Vec<u32>>,
    waiting: usize,
    last_done: Ps,
    end_ps: Ps,
    m: Measurements,
    error: Option<String>,
    bin_ps: Ps,
    /// Credit-based link flow control (InfiniBand-style): credits in bytes
    /// per port; empty when off. See [`Sim::set_credit_flow_control`].
    credits: Vec<i64>,
    /// Converged routes (with `cfg.reconverge_ps`): whether switch `s` can
    /// still deliver to leaf `l`, at `s * leaves + l`. Empty when off.
    reach: Vec<bool>,
    /// Leaves per plane (one more than the largest `host_leaf`).
    leaves: usize,
    /// A re-convergence already scheduled at this time.
    reconverge_at: Option<Ps>,
}

fn ip(h: u32) -> u32 {
    0x0a00_0000 | (h + 1)
}

impl<F: TransportFactory> Sim<F> {
    /// Build the fabric, the hosts and the channels every flow needs.
    pub fn new(
        topo: Topology,
        cfg: FabricConfig,
        factory: &F,
        work: FlowSet,
        seed: u64,
        end_ps: Ps,
    ) -> Result<Self, String> {
        let mut ports: Vec<Port> = Vec::with_capacity(topo.links.len() * 2);
        let mut node_ports: Vec<Vec<u32>> = vec![Vec::new(); topo.hosts as usize];
        let mut sw_ports: Vec<Vec<u32>> = vec![Vec::new(); topo.switches.len()];
        let nports = |n: NodeRef, node_ports: &Vec<Vec<u32>>, sw_ports: &Vec<Vec<u32>>| match n {
            NodeRef::Host(h) => node_ports[h as usize].len(),
            NodeRef::Switch(s) => sw_ports[s as usize].len(),
        };
        for l in &topo.links {
            let up = ports.len() as u32;
            let a_idx = nports(l.a, &node_ports, &sw_ports) as u16;
            let b_idx = nports(l.b, &node_ports, &sw_ports) as u16;
            for (owner, peer, peer_in, label) in [
                (l.a, l.b, b_idx, l.label_up),
                (l.b, l.a, a_idx, l.label_down),
            ] {
                ports.push(Port {
                    owner,
                    peer,
                    peer_in,
                    reverse: 0,
                    rate_bps: l.rate_bps,
                    delay_ps: l.delay_ps,
                    label,
                    up: true,
                    queues: [VecDeque::new(), VecDeque::new()],
                    queued_bytes: 0,
                    busy: None,
                    paused: false,
                    paused_since: 0,
                    c: PortCounters::default(),
                });
            }
            ports[up as usize].reverse = up + 1;
            ports[up as usize + 1].reverse = up;
            match l.a {
                NodeRef::Host(h) => node_ports[h as usize].push(up),
                NodeRef::Switch(s) => sw_ports[s as usize].push(up),
            }
            match l.b {
                NodeRef::Host(h) => node_ports[h as usize].push(up + 1),
                NodeRef::Switch(s) => sw_ports[s as usize].push(up + 1),
            }
        }
        // Routing: a switch's up ports go to higher tiers; down ports are
        // keyed by what the destination is below.
        let mut switches = Vec::with_capacity(topo.switches.len());
        for (s, spec) in topo.switches.iter().enumerate() {
            let mut up = Vec::new();
            let mut down = Vec::new();
            for (i, &p) in sw_ports[s].iter().enumerate() {
                match ports[p as usize].peer {
                    NodeRef::Host(h) => {
                        let key = topo.host_slot[h as usize] as usize;
                        if down.len() <= key {
                            down.resize(key + 1, u16::MAX);
                        }
                        down[key] = i as u16;
                    }
                    NodeRef::Switch(o) => {
                        let other = &topo.switches[o as usize];
                        if other.tier > spec.tier {
                            up.push(i as u16);
                        } else {
                            // Key of a lower switch: a ToR under an agg is keyed by
                            // its index within the pod; under a spine or a core by
                            // its global leaf index or pod.
                            let key = match (topo.tiers, spec.tier) {
                                (3, 1) => other.index % topo.leaves_per_pod.max(1),
                                (3, _) => other.pod,
                                _ => other.index,
                            } as usize;
                            if down.len() <= key {
                                down.resize(key + 1, u16::MAX);
                            }
                            down[key] = i as u16;
                        }
                    }
                }
            }
            let n = sw_ports[s].len();
            switches.push(SwitchState {
                ports: sw_ports[s].clone(),
                up,
                down,
                tier: spec.tier,
                pod: spec.pod,
                top: spec.top,
                salt: seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
                    ^ (s as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                used_bytes: 0,
                ingress_bytes: vec![0; n],
                paused_upstream: vec![false; n],
            });
        }
        let base_rtt_ps = base_rtt(&topo);
        let mut hosts = Vec::with_capacity(topo.hosts as usize);
        for h in 0..topo.hosts {
            let info = HostInfo {
                index: h,
                line_rate_bps: topo.host_rate_bps * u64::from(topo.planes),
                base_rtt_ps,
                seed,
            };
            hosts.push(HostState {
                t: factory.host(&info)?,
                ports: std::mem::take(&mut node_ports[h as usize]),
                timer_at: None,
                armed_at: None,
                queued: 0,
                channels: Vec::new(),
            });
        }
        let labels = topo.labels.len();
        let bin_ps = cfg.sample_ps.max(1);
        let mut sim = Self {
            cfg,
            ports,
            switches,
            hosts,
            pkts: PagedVec::new(),
            bodies: PagedVec::new(),
            free: PagedVec::new(),
            q: EventQueue::new(),
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_fab1),
            trig_got: vec![0; work.triggers.len()],
            trig_flows: vec![Vec::new(); work.triggers.len()],
            waiting: 0,
            last_done: 0,
            end_ps,
            m: Measurements {
                flows: vec![FlowRun::default(); work.flows.len()],
                queue_hist: (0..labels).map(|_| Histogram::new()).collect(),
                delivered: Series::default(),
                queue_max: (0..labels).map(|_| Series::default()).collect(),
                no_route: 0,
                headroom_drops: 0,
                delivered_packets: 0,
                nic_packets: 0,
            },
            work,
            error: None,
            bin_ps,
            credits: Vec::new(),
            reach: Vec::new(),
            leaves: 0,
            reconverge_at: None,
            topo,
        };
        sim.setup_flows(factory)?;
        if sim.cfg.reconverge_ps.is_some() {
            sim.leaves = sim
                .topo
                .host_leaf
                .iter()
                .max()
                .map_or(0, |&l| l as usize + 1);
            sim.recompute_reach();
        }
        Ok(sim)
    }

    fn setup_flows(&mut self, factory: &F) -> Result<(), String> {
        // One channel per ordered (src, dst) pair, shared by its flows.
        let mut chan: HashMap<(u32, u32), u32> = HashMap::new();
        let mut messages: HashMap<(u32, u32), u32> = HashMap::new();
        for f in &self.work.flows {
            *messages.entry((f.src, f.dst)).or_insert(0) += 1;
        }
        for i in 0..self.work.flows.len() {
            let f = &self.work.flows[i];
            let (src, dst) = (f.src, f.dst);
            if src >= self.topo.hosts || dst >= self.topo.hosts || src == dst {
                return Err(format!("flow {i}: bad hosts {src}->{dst}"));
            }
            if let std::collections::hash_map::Entry::Vacant(e) = chan.entry((src, dst)) {
                let (a, b) = pair_mut(&mut self.hosts, src as usize, dst as usize);
                let c =
                    factory.open_channel(&mut a.t, src, &mut b.t, dst, messages[&(src, dst)])?;
                e.insert(c);
                a.channels.push((dst, c));
            }
            if !f.background {
                self.waiting += 1;
            }
            match (f.start, f.trigger) {
                (_, Some(t)) => self
                    .trig_flows
                    .get_mut(t as usize)
                    .ok_or_else(|| format!("flow {i}: unknown trigger {t}"))?
                    .push(i as u32),
                (Some(s), None) => self.q.schedule(s, EventKind::FlowStart(i as u32)),
                (None, None) => return Err(format!("flow {i}: neither start time nor trigger")),
            }
        }
        Ok(())
    }

    /// Fail (`up = false`) or restore the link between two nodes at `at`.
    pub fn schedule_link(
        &mut self,
        a: NodeRef,
        b: NodeRef,
        at: Ps,
        up: bool,
    ) -> Result<(), String> {
        let p = self
            .ports
            .iter()
            .position(|p| p.owner == a && p.peer == b)
            .ok_or_else(|| {
                format!(
                    "no link {} - {}",
                    self.topo.node_name(a),
                    self.topo.node_name(b)
                )
            })?;
        self.q
            .schedule(at, EventKind::LinkState { port: p as u32, up });
        Ok(())
    }

    /// Fail or restore every link of a switch at `at`.
    pub fn schedule_switch(&mut self, s: u32, at: Ps, up: bool) -> Result<(), String> {
        let ports = self
            .switches
            .get(s as usize)
            .ok_or_else(|| format!("no switch {s}"))?
            .ports
            .clone();
        for p in ports {
            self.q.schedule(at, EventKind::LinkState { port: p, up });
        }
        Ok(())
    }

    /// Turn on credit-based flow control (InfiniBand-style, instead of PFC):
    /// every port facing a switch starts with `bytes` of credit for that
    /// switch's receive buffer on the link; a data packet is transmitted
    /// only if its length is covered, and the credit comes back (one link
    /// delay later) when the downstream switch forwards the packet. Data is
    /// then never dropped for lack of buffer, and no PAUSE is ever sent.
    pub fn set_credit_flow_control(&mut self, bytes: u64) {
        self.credits = self
            .ports
            .iter()
            .map(|p| match p.peer {
                NodeRef::Switch(_) => bytes as i64,
                NodeRef::Host(_) => i64::MAX / 2,
            })
            .collect();
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The ports (for reports and tests).
    pub fn ports(&self) -> &[Port] {
        &self.ports
    }

    /// The flows.
    pub fn workload(&self) -> &FlowSet {
        &self.work
    }

    /// A host's transport.
    pub fn host(&self, h: u32) -> &F::Host {
        &self.hosts[h as usize].t
    }

    /// Current simulated time.
    pub fn now(&self) -> Ps {
        self.q.now()
    }

    /// Time the last waited-for flow completed.
    pub fn last_done(&self) -> Ps {
        self.last_done
    }

    /// Flows still awaited.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Size and event figures.
    pub fn perf(&self) -> RunPerf {
        RunPerf {
            events: self.q.executed(),
            max_pending: self.q.max_pending(),
            packet_slots: self.pkts.len(),
        }
    }

    /// Measurements so far.
    pub fn measurements(&self) -> &Measurements {
        &self.m
    }

    /// Sum of every host's transport counters.
    pub fn transport_stats(&self) -> crate::transport::TransportStats {
        let mut s = crate::transport::TransportStats::default();
        for h in &self.hosts {
            s.add(&h.t.stats());
        }
        s
    }

    /// Run until every awaited flow is done, the end time, or nothing is
    /// left to do; `progress` is called every 2^16 events.
    pub fn run(&mut self, mut progress: impl FnMut(&Self)) -> Result<(), String> {
        while let Some(t) = self.q.peek_time() {
            if t > self.end_ps || self.waiting == 0 {
                break;
            }
            let (now, ev) = self.q.pop().expect("peeked");
            match ev {
                EventKind::TxDone(p) => self.tx_done(now, p),
                EventKind::PipeArrive { port, pkt } => self.pipe_arrive(now, port, pkt),
                EventKind::HostTimer(h) => self.host_timer(now, h),
                EventKind::FlowStart(f) => self.flow_start(now, f),
                EventKind::Pfc { port, pause, .. } => self.pfc(now, port, pause),
                EventKind::LinkState { port, up } => self.link_state(now, port, up),
                EventKind::Credit { port, bytes } => self.credit(now, port, bytes),
                EventKind::Reconverge => {
                    self.reconverge_at = None;
                    self.recompute_reach();
                }
            }
            if let Some(e) = self.error.take() {
                return Err(e);
            }
            if self.q.executed() & 0xffff == 0 {
                progress(self);
            }
        }
        // Close open pause intervals for the report.
        let now = self.q.now();
        for p in &mut self.ports {
            if p.paused {
                p.c.paused_ps += now - p.paused_since;
                p.paused_since = now;
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------ packets

    fn alloc(&mut self, head: PktHead, body: <F::Host as Transport>::Packet) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.pkts[i as usize] = head;
                self.bodies[i as usize] = Some(body);
                i
            }
            None => {
                self.pkts.push(head);
                self.bodies.push(Some(body));
                self.pkts.len() as u32 - 1
            }
        }
    }

    fn release(&mut self, i: u32) {
        self.bodies[i as usize] = None;
        self.free.push(i);
    }

    // -------------------------------------------------------------- ports

    fn tx_start(&mut self, now: Ps, p: u32) {
        let port = &mut self.ports[p as usize];
        if port.busy.is_some() || !port.up {
            return;
        }
        let credit_ok = |k: Option<&u32>| {
            self.credits.is_empty()
                || k.is_some_and(|&k| {
                    self.credits[p as usize] >= i64::from(self.pkts[k as usize].wire.bytes)
                })
        };
        let prio = if !port.queues[CTRL].is_empty() {
            CTRL
        } else if !port.paused
            && !port.queues[DATA].is_empty()
            && credit_ok(port.queues[DATA].front())
        {
            DATA
        } else {
            return;
        };
        let k = port.queues[prio].pop_front().expect("non-empty");
        let pkt = &self.pkts[k as usize];
        let bytes = pkt.wire.bytes;
        if !self.credits.is_empty() && prio == DATA {
            self.credits[p as usize] -= i64::from(bytes);
            if let NodeRef::Switch(s) = port.owner {
                // The packet leaves this switch's buffer: its credit goes
                // back to the port it came in from.
                let upstream = self.ports
                    [self.switches[s as usize].ports[pkt.in_port as usize] as usize]
                    .reverse;
                let delay = self.ports[upstream as usize].delay_ps;
                self.q.schedule(
                    now + delay,
                    EventKind::Credit {
                        port: upstream,
                        bytes,
                    },
                );
            }
        }
        let port = &mut self.ports[p as usize];
        port.queued_bytes -= u64::from(bytes);
        port.busy = Some((k, bytes));
        let done = now + port.ser_ps(bytes);
        match port.owner {
            NodeRef::Switch(s) => {
                let sw = &mut self.switches[s as usize];
                sw.used_bytes -= u64::from(bytes);
                if let (Some(pfc), DATA) = (self.cfg.pfc, prio) {
                    let i = pkt.in_port as usize;
                    sw.ingress_bytes[i] -= u64::from(bytes);
                    if sw.paused_upstream[i] && sw.ingress_bytes[i] <= pfc.xon_bytes {
                        sw.paused_upstream[i] = false;
                        let upstream = self.ports[sw.ports[i] as usize].reverse;
                        let delay = self.ports[upstream as usize].delay_ps;
                        self.q.schedule(
                            now + delay,
                            EventKind::Pfc {
                                port: upstream,
                                prio: 0,
                                pause: false,
                            },
                        );
                    }
                }
            }
            NodeRef::Host(h) => self.hosts[h as usize].queued -= 1,
        }
        self.q.schedule(done, EventKind::TxDone(p));
    }

    fn tx_done(&mut self, now: Ps, p: u32) {
        let port = &mut self.ports[p as usize];
        let Some((k, bytes)) = port.busy.take() else {
            return;
        };
        port.c.tx_bytes += u64::from(bytes);
        port.c.tx_packets += 1;
        let lost = self.cfg.loss > 0.0 && unit(&mut self.rng) < self.cfg.loss;
        let port = &mut self.ports[p as usize];
        if !port.up {
            port.c.down_losses += 1;
            self.release(k);
        } else if lost {
            port.c.wire_losses += 1;
            self.release(k);
        } else {
            // The pipe is a delay line: each packet's arrival is its own
            // event (FIFO, since departures are in time order and ties fire
            // in insertion order), so no per-port queue is touched twice.
            self.q.schedule(
                now + port.delay_ps,
                EventKind::PipeArrive { port: p, pkt: k },
            );
        }
        self.tx_start(now, p);
        if let NodeRef::Host(h) = self.ports[p as usize].owner {
            self.host_pull(now, h);
        }
    }

    fn pipe_arrive(&mut self, now: Ps, p: u32, k: u32) {
        let port = &mut self.ports[p as usize];
        if !port.up {
            port.c.down_losses += 1;
            self.release(k);
            return;
        }
        let (peer, peer_in) = (port.peer, port.peer_in);
        match peer {
            NodeRef::Switch(s) => self.switch_receive(now, s, peer_in, k),
            NodeRef::Host(h) => self.host_receive(now, h, k),
        }
    }

    // ----------------------------------------------------------- switches

    /// If host `dst` lies below switch `s` (the route goes down), the
    /// entry of `s`'s down-port table toward it; `None`: the route goes up.
    fn down_key(&self, s: u32, dst: usize) -> Option<usize> {
        let sw = &self.switches[s as usize];
        let topo = &self.topo;
        let below = match (sw.tier, topo.tiers) {
            (_, _) if sw.top => true,
            (0, _) => topo.host_leaf[dst] == topo.switches[s as usize].index,
            (1, 3) => topo.host_pod[dst] == sw.pod,
            _ => false,
        };
        if !below {
            return None;
        }
        let key = match (sw.tier, topo.tiers) {
            (0, _) => topo.host_slot[dst],
            (1, 3) => topo.host_leaf_in_pod[dst],
            (_, 3) => topo.host_pod[dst],
            _ => topo.host_leaf[dst],
        };
        Some(key as usize)
    }

    fn route(&mut self, s: u32, k: u32) -> Option<u16> {
        let pkt = &self.pkts[k as usize];
        let dst = pkt.wire.dst as usize;
        let sw = &self.switches[s as usize];
        let topo = &self.topo;
        if let Some(key) = self.down_key(s, dst) {
            let i = *sw.down.get(key)?;
            return (i != u16::MAX && self.ports[sw.ports[i as usize] as usize].up).then_some(i);
        }
        let ports = &self.ports;
        // With converged routes, an up-port also needs a next switch that
        // can still reach the destination's leaf.
        let (reach, leaves) = (&self.reach, self.leaves);
        let leaf = topo.host_leaf[dst] as usize;
        let usable = |i: u16| {
            let port = &ports[sw.ports[i as usize] as usize];
            port.up
                && (reach.is_empty()
                    || match port.peer {
                        NodeRef::Switch(next) => reach[next as usize * leaves + leaf],
                        NodeRef::Host(_) => true,
                    })
        };
        let live = sw.up.iter().filter(|&&i| usable(i)).count();
        if live == 0 {
            return None;
        }
        let h = ecmp_hash(
            ip(pkt.src),
            ip(pkt.wire.dst),
            pkt.wire.src_port,
            pkt.wire.dst_port,
            17,
            sw.salt,
        );
        let start = (h % live as u64) as usize;
        let lives = || sw.up.iter().copied().filter(|&i| usable(i));
        match self.cfg.routing {
            Routing::Ecmp => lives().nth(start),
            Routing::Adaptive => {
                // The least-queued live up-port; ties go to the first from
                // the hashed start, so equal queues still spread flows.
                // Walked in place: no allocation per packet.
                let mut best = None;
                let mut best_q = u64::MAX;
                for i in lives().skip(start).chain(lives().take(start)) {
                    let q = ports[sw.ports[i as usize] as usize].queued_bytes;
                    if q < best_q {
                        best_q = q;
                        best = Some(i);
                    }
                }
                best
            }
        }
    }

    /// Recompute which switches can still deliver to which leaf, from the
    /// links' state now (what a routing protocol converges to).
    fn recompute_reach(&mut self) {
        let n = self.switches.len();
        // One host per leaf stands for it: reachability is per leaf, as
        // routes are (a host's own link is its last hop, which no other
        // route replaces).
        let mut rep = vec![u32::MAX; self.leaves];
        for (h, &l) in self.topo.host_leaf.iter().enumerate() {
            if rep[l as usize] == u32::MAX {
                rep[l as usize] = h as u32;
            }
        }
        // 0 unknown, 1 reachable, 2 not.
        let mut memo = vec![0u8; n * self.leaves];
        for s in 0..n {
            for (l, &h) in rep.iter().enumerate() {
                if h != u32::MAX {
                    self.can_reach(s as u32, l, h, &mut memo);
                }
            }
        }
        self.reach = memo.iter().map(|&m| m == 1).collect();
    }

    /// Whether switch `s` can deliver to leaf `leaf` (host `h` on it): down
    /// the one port toward it when it lies below `s`, else up through any
    /// live port whose next switch can. Up then down, so no loops.
    fn can_reach(&self, s: u32, leaf: usize, h: u32, memo: &mut [u8]) -> bool {
        let at = s as usize * self.leaves + leaf;
        if memo[at] != 0 {
            return memo[at] == 1;
        }
        let sw = &self.switches[s as usize];
        let next = |i: u16| {
            let port = &self.ports[sw.ports[i as usize] as usize];
            match port.peer {
                NodeRef::Switch(c) if port.up => Some(c),
                _ => None,
            }
        };
        let ok = match self.down_key(s, h as usize) {
            // The leaf itself: the last hop is the host's own link.
            Some(_) if sw.tier == 0 => true,
            Some(key) => sw
                .down
                .get(key)
                .and_then(|&i| (i != u16::MAX).then_some(i))
                .and_then(next)
                .is_some_and(|c| self.can_reach(c, leaf, h, memo)),
            None => sw
                .up
                .iter()
                .filter_map(|&i| next(i))
                .any(|c| self.can_reach(c, leaf, h, memo)),
        };
        memo[at] = if ok { 1 } else { 2 };
        ok
    }

    fn switch_receive(&mut self, now: Ps, s: u32, in_port: u16, k: u32) {
        let Some(out) = self.route(s, k) else {
            self.m.no_route += 1;
            self.release(k);
            return;
        };
        let gp = self.switches[s as usize].ports[out as usize];
        let pkt = &mut self.pkts[k as usize];
        pkt.in_port = in_port;
        let bytes = u64::from(pkt.wire.bytes);
        let mut prio = if pkt.wire.control || pkt.trimmed {
            CTRL
        } else {
            DATA
        };
        let port = &self.ports[gp as usize];
        let qlen = port.queued_bytes;
        let sw = &self.switches[s as usize];
        let label = port.label as usize;
        self.m.queue_hist[label].record(qlen);
        self.m.queue_max[label].max_at(now / self.bin_ps, qlen);
        // Admission.
        let fits = match self.cfg.buffer {
            BufferModel::PerPort { bytes: cap } => qlen + bytes <= cap,
            BufferModel::Shared { bytes: cap, alpha } => {
                sw.used_bytes + bytes <= cap
                    && (qlen + bytes) as f64 <= alpha * (cap - sw.used_bytes) as f64
            }
        };
        let lossless = (self.cfg.pfc.is_some() || !self.credits.is_empty()) && prio == DATA;
        if lossless {
            if let Some(pfc) = self.cfg.pfc
                && sw.ingress_bytes[in_port as usize] + bytes > pfc.xoff_bytes + pfc.headroom_bytes
            {
                self.m.headroom_drops += 1;
                self.ports[gp as usize].c.drops += 1;
                self.release(k);
                return;
            }
        } else if !fits {
            if self.cfg.trimming && prio == DATA {
                let pkt = &mut self.pkts[k as usize];
                pkt.trimmed = true;
                pkt.wire.bytes = pkt.wire.bytes.min(TRIM_BYTES);
                prio = CTRL;
                self.ports[gp as usize].c.trims += 1;
            } else {
                self.ports[gp as usize].c.drops += 1;
                self.release(k);
                return;
            }
        }
        let pkt = &mut self.pkts[k as usize];
        if let Some(ecn) = self.cfg.ecn
            && pkt.wire.ect
            && prio == DATA
            && !pkt.wire.ce
        {
            let p = ecn.mark_probability(qlen);
            if p >= 1.0 || (p > 0.0 && unit(&mut self.rng) < p) {
                pkt.wire.ce = true;
                self.ports[gp as usize].c.ecn_marks += 1;
            }
        }
        let bytes = u64::from(self.pkts[k as usize].wire.bytes);
        let port = &mut self.ports[gp as usize];
        port.queues[prio].push_back(k);
        port.queued_bytes += bytes;
        let sw = &mut self.switches[s as usize];
        sw.used_bytes += bytes;
        if lossless && let Some(pfc) = self.cfg.pfc {
            let i = in_port as usize;
            sw.ingress_bytes[i] += bytes;
            if !sw.paused_upstream[i] && sw.ingress_bytes[i] >= pfc.xoff_bytes {
                sw.paused_upstream[i] = true;
                let upstream = self.ports[sw.ports[i] as usize].reverse;
                let delay = self.ports[upstream as usize].delay_ps;
                self.q.schedule(
                    now + delay,
                    EventKind::Pfc {
                        port: upstream,
                        prio: 0,
                        pause: true,
                    },
                );
            }
        }
        self.tx_start(now, gp);
    }

    fn pfc(&mut self, now: Ps, p: u32, pause: bool) {
        let port = &mut self.ports[p as usize];
        if port.paused == pause {
            return;
        }
        port.paused = pause;
        if pause {
            port.c.pauses += 1;
            port.paused_since = now;
        } else {
            port.c.paused_ps += now - port.paused_since;
            self.tx_start(now, p);
            if let NodeRef::Host(h) = self.ports[p as usize].owner {
                self.host_pull(now, h);
            }
        }
    }

    fn credit(&mut self, now: Ps, p: u32, bytes: u32) {
        if let Some(c) = self.credits.get_mut(p as usize) {
            *c += i64::from(bytes);
        }
        self.tx_start(now, p);
        if let NodeRef::Host(h) = self.ports[p as usize].owner {
            self.host_pull(now, h);
        }
    }

    fn link_state(&mut self, now: Ps, p: u32, up: bool) {
        if let Some(delay) = self.cfg.reconverge_ps {
            // A switch failure changes all its links at one instant: one
            // re-convergence covers them.
            let at = now + delay;
            if self.reconverge_at != Some(at) {
                self.reconverge_at = Some(at);
                self.q.schedule(at, EventKind::Reconverge);
            }
        }
        let r = self.ports[p as usize].reverse;
        for d in [p, r] {
            self.ports[d as usize].up = up;
            if !up {
                // Queued packets at a dead port are lost.
                for prio in [DATA, CTRL] {
                    while let Some(k) = self.ports[d as usize].queues[prio].pop_front() {
                        let bytes = u64::from(self.pkts[k as usize].wire.bytes);
                        let port = &mut self.ports[d as usize];
                        port.queued_bytes -= bytes;
                        port.c.down_losses += 1;
                        match port.owner {
                            NodeRef::Switch(s) => {
                                let sw = &mut self.switches[s as usize];
                                sw.used_bytes -= bytes;
                                if prio == DATA && self.cfg.pfc.is_some() {
                                    let i = self.pkts[k as usize].in_port as usize;
                                    sw.ingress_bytes[i] -= bytes;
                                }
                            }
                            NodeRef::Host(h) => self.hosts[h as usize].queued -= 1,
                        }
                        self.release(k);
                    }
                }
            } else {
                self.tx_start(now, d);
                if let NodeRef::Host(h) = self.ports[d as usize].owner {
                    self.host_pull(now, h);
                }
            }
        }
    }

    // -------------------------------------------------------------- hosts

    fn host_receive(&mut self, now: Ps, h: u32, k: u32) {
        let body = self.bodies[k as usize]
            .take()
            .expect("a packet in flight has a body");
        let pkt = &self.pkts[k as usize];
        let (wire, src, trimmed) = (pkt.wire, pkt.src, pkt.trimmed);
        self.release(k);
        if wire.payload > 0 && !trimmed {
            self.m
                .delivered
                .add_at(now / self.bin_ps, u64::from(wire.payload));
            self.m.delivered_packets += 1;
        }
        self.hosts[h as usize]
            .t
            .handle_packet(now, src, &wire, trimmed, &body);
        self.host_service(now, h);
    }

    /// After any input to host `h`: take its message events, let its NIC
    /// pull packets, re-arm its timer.
    fn host_service(&mut self, now: Ps, h: u32) {
        while let Some(ev) = self.hosts[h as usize].t.poll_event() {
            self.message_event(now, ev);
        }
        self.host_pull(now, h);
        let host = &mut self.hosts[h as usize];
        host.timer_at = host.t.poll_timeout().map(|t| t.max(now));
        self.arm(h);
    }

    fn arm(&mut self, h: u32) {
        let host = &mut self.hosts[h as usize];
        if let Some(t) = host.timer_at
            && host.armed_at.is_none_or(|a| t < a)
        {
            host.armed_at = Some(t);
            self.q.schedule(t, EventKind::HostTimer(h));
        }
    }

    fn host_timer(&mut self, now: Ps, h: u32) {
        let host = &mut self.hosts[h as usize];
        if host.armed_at != Some(now) {
            return; // superseded by an earlier arming
        }
        host.armed_at = None;
        match host.timer_at {
            Some(t) if t <= now => {
                host.t.handle_timeout(now);
                self.host_service(now, h);
            }
            _ => self.arm(h),
        }
    }

    fn host_pull(&mut self, now: Ps, h: u32) {
        let planes = self.hosts[h as usize].ports.len();
        loop {
            let host = &self.hosts[h as usize];
            // Pull only when a plane can send now (a real NIC fetches work
            // as its link frees, it does not build a deep queue).
            let idle = host.ports.iter().any(|&p| {
                let port = &self.ports[p as usize];
                port.up
                    && port.busy.is_none()
                    && !port.paused
                    && port.queues[DATA].is_empty()
                    && port.queues[CTRL].is_empty()
            });
            if !idle || host.queued >= self.cfg.nic_queue_packets.max(1) * planes as u32 {
                return;
            }
            let Some((wire, body)) = self.hosts[h as usize].t.poll_packet(now) else {
                return;
            };
            let host = &self.hosts[h as usize];
            let mut plane = if planes == 1 {
                0
            } else {
                (ecmp_hash(ip(h), ip(wire.dst), wire.src_port, wire.dst_port, 17, 0)
                    % planes as u64) as usize
            };
            // The NIC knows its own links: skip a dead plane.
            for _ in 0..planes {
                if self.ports[host.ports[plane] as usize].up {
                    break;
                }
                plane = (plane + 1) % planes;
            }
            let p = host.ports[plane];
            let k = self.alloc(
                PktHead {
                    wire,
                    src: h,
                    in_port: 0,
                    trimmed: false,
                },
                body,
            );
            self.m.nic_packets += 1;
            let prio = if wire.control { CTRL } else { DATA };
            let port = &mut self.ports[p as usize];
            port.queues[prio].push_back(k);
            port.queued_bytes += u64::from(wire.bytes);
            self.hosts[h as usize].queued += 1;
            self.tx_start(now, p);
        }
    }

    // -------------------------------------------------------------- flows

    fn flow_start(&mut self, now: Ps, f: u32) {
        let spec = &self.work.flows[f as usize];
        let (src, dst, bytes) = (spec.src, spec.dst, spec.bytes);
        let host = &mut self.hosts[src as usize];
        let ch = host
            .channels
            .iter()
            .find(|&&(d, _)| d == dst)
            .map(|&(_, c)| c)
            .expect("channel opened at setup");
        self.m.flows[f as usize].started = Some(now);
        if let Err(e) = host.t.post_message(now, ch, bytes, f) {
            self.error = Some(format!("flow {f} ({src}->{dst}, {bytes} B): {e}"));
            return;
        }
        self.host_service(now, src);
    }

    fn message_event(&mut self, now: Ps, ev: MessageEvent) {
        let (tag, trig) = match ev {
            MessageEvent::Sent { tag } => {
                self.m.flows[tag as usize].sent = Some(now);
                (tag, self.work.flows[tag as usize].on_send)
            }
            MessageEvent::Received { tag } => {
                self.m.flows[tag as usize].received = Some(now);
                (tag, self.work.flows[tag as usize].on_recv)
            }
            MessageEvent::Failed { tag } => {
                self.m.flows[tag as usize].failed = true;
                (tag, None)
            }
        };
        let run = self.m.flows[tag as usize];
        let finished_now = match ev {
            MessageEvent::Failed { .. } => run.received.is_none() || run.sent.is_none(),
            MessageEvent::Sent { .. } => run.received.is_some() && !run.failed,
            MessageEvent::Received { .. } => run.sent.is_some() && !run.failed,
        };
        if finished_now && !self.work.flows[tag as usize].background {
            self.waiting -= 1;
            self.last_done = now;
        }
        if let Some(t) = trig {
            let t = t as usize;
            self.trig_got[t] += 1;
            if self.trig_got[t] == self.work.triggers[t].needed {
                for i in 0..self.trig_flows[t].len() {
                    let f = self.trig_flows[t][i];
                    self.q.schedule(now, EventKind::FlowStart(f));
                }
            }
        }
    }
}

fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Unloaded round trip over the longest route: propagation both ways plus
/// one full-size data packet and one ACK serialized at every hop.
pub fn base_rtt(t: &Topology) -> Ps {
    let hops = u64::from(t.max_hops);
    let ser = |bytes: u64| bytes * 8_000_000_000_000 / t.host_rate_bps;
    2 * hops * t.delay_ps + hops * (ser(4096 + 100) + ser(100))
}

fn pair_mut<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    assert_ne!(a, b);
    if a < b {
        let (x, y) = v.split_at_mut(b);
        (&mut x[a], &mut y[0])
    } else {
        let (x, y) = v.split_at_mut(a);
        (&mut y[0], &mut x[b])
    }
}
