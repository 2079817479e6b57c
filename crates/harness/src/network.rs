//! The simulated network: event queue, ports, ECMP routes, faults.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

use crate::config::{FaultConfig, LinkConfig, NetConfig, RouteSelect};

/// A UDP datagram between two nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Source address; its IP must be the sending node's [`Node::ip`].
    pub src: SocketAddr,
    /// Destination address; its IP selects the receiving node.
    pub dst: SocketAddr,
    /// ECN codepoint (ports may turn `Ect0` into `Ce`).
    pub ecn: Ecn,
    /// UDP payload.
    pub payload: Vec<u8>,
}

/// ECN codepoint of a datagram: the core's own type (ports may turn
/// `Ect0` into `Ce` when their queue passes the marking threshold; `NotEct`
/// is never marked).
pub use metaroce_verbs::Ecn;

/// A sans-IO endpoint the harness can drive.
pub trait Node {
    /// The node's addresses: its IP (all its datagrams' src IP must match;
    /// dst = node IP routes to it).
    fn ip(&self) -> IpAddr;
    /// A datagram arrived.
    fn handle_datagram(&mut self, now_ns: u64, datagram: Datagram);
    /// Next datagram to send, if any (drained until None after every input).
    fn poll_transmit(&mut self, now_ns: u64) -> Option<Datagram>;
    /// Earliest time the node wants `handle_timeout`, if any.
    fn poll_timeout(&mut self) -> Option<u64>;
    /// The time returned by `poll_timeout` has been reached.
    fn handle_timeout(&mut self, now_ns: u64);
}

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropCause {
    /// Uniform random loss ([`FaultConfig::loss`]).
    Loss,
    /// Gilbert-Elliott burst loss.
    Burst,
    /// The route was blackholed.
    Blackhole,
    /// Sender's egress buffer full.
    EgressTailDrop,
    /// Receiver's ingress (ToR downlink) buffer full.
    IngressTailDrop,
    /// Sender or receiver isolated by link-down.
    LinkDown,
    /// Destination IP belongs to no node.
    Unroutable,
    /// Source IP is not the sending node's IP (a bug in the node).
    BadSource,
}

/// What happened to a datagram, as reported to the tap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fate {
    /// The node emitted it (reported once per `poll_transmit`, before any
    /// queueing; `route` is already known).
    Sent,
    /// Handed to the destination node.
    Delivered,
    /// Dropped.
    Dropped(DropCause),
}

/// One observation of a datagram, passed to the tap.
#[derive(Debug, Clone, Copy)]
pub struct TapEvent<'a> {
    /// Simulated time of the observation.
    pub now_ns: u64,
    /// Id of the sent datagram (a duplicate shares its original's id).
    pub packet_id: u64,
    /// Sending node index.
    pub src_node: usize,
    /// Receiving node index (`None` if the destination IP is unknown).
    pub dst_node: Option<usize>,
    /// ECMP route index.
    pub route: usize,
    /// Payload length.
    pub len: usize,
    /// What happened.
    pub fate: Fate,
    /// ECN codepoint at this point.
    pub ecn: Ecn,
    /// This is the extra copy made by the duplicate fault.
    pub duplicate: bool,
    /// A bit was flipped by the corrupt fault.
    pub corrupted: bool,
    /// The reorder fault delayed this datagram out of its route's FIFO.
    pub reordered: bool,
    /// The payload at this point (after corruption, if any).
    pub payload: &'a [u8],
}

impl TapEvent<'_> {
    /// First 8 payload bytes, zero-padded.
    pub fn first_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        let n = self.payload.len().min(8);
        b[..n].copy_from_slice(&self.payload[..n]);
        b
    }
}

/// Observer of every datagram's fate.
pub type Tap = Box<dyn FnMut(&TapEvent<'_>)>;

/// Per route index counters (aggregated over all node pairs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteStats {
    /// Datagrams delivered that took this route.
    pub delivered: u64,
    /// Payload bytes delivered that took this route.
    pub bytes_delivered: u64,
    /// Datagrams that would have taken this route and were dropped (any cause).
    pub dropped: u64,
}

/// Network-wide counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams emitted by nodes.
    pub sent: u64,
    /// Datagrams handed to nodes (duplicates included).
    pub delivered: u64,
    /// Payload bytes handed to nodes.
    pub bytes_delivered: u64,
    /// Dropped by [`DropCause::Loss`].
    pub dropped_loss: u64,
    /// Dropped by [`DropCause::Burst`].
    pub dropped_burst: u64,
    /// Dropped by [`DropCause::Blackhole`].
    pub dropped_blackhole: u64,
    /// Dropped by [`DropCause::EgressTailDrop`].
    pub dropped_egress_tail: u64,
    /// Dropped by [`DropCause::IngressTailDrop`].
    pub dropped_ingress_tail: u64,
    /// Dropped by [`DropCause::LinkDown`].
    pub dropped_link_down: u64,
    /// Dropped by [`DropCause::Unroutable`].
    pub dropped_unroutable: u64,
    /// Dropped by [`DropCause::BadSource`].
    pub dropped_bad_source: u64,
    /// Extra copies created.
    pub duplicated: u64,
    /// Datagrams with a flipped bit.
    pub corrupted: u64,
    /// Datagrams given the intra-route reorder delay.
    pub reordered: u64,
    /// ECT(0) -> CE transitions (egress or ingress).
    pub ce_marked: u64,
    /// `handle_timeout` calls.
    pub timeouts_fired: u64,
    /// `handle_timeout` calls after which the node still asked for a
    /// timeout at or before now (no progress; a livelock symptom).
    pub stalled_timeouts: u64,
    /// Events processed (all runs).
    pub events: u64,
    /// Per route index, `routes_per_pair` entries.
    pub per_route: Vec<RouteStats>,
}

impl NetStats {
    /// Drops of one cause.
    pub fn dropped(&self, cause: DropCause) -> u64 {
        match cause {
            DropCause::Loss => self.dropped_loss,
            DropCause::Burst => self.dropped_burst,
            DropCause::Blackhole => self.dropped_blackhole,
            DropCause::EgressTailDrop => self.dropped_egress_tail,
            DropCause::IngressTailDrop => self.dropped_ingress_tail,
            DropCause::LinkDown => self.dropped_link_down,
            DropCause::Unroutable => self.dropped_unroutable,
            DropCause::BadSource => self.dropped_bad_source,
        }
    }

    /// Drops of all causes.
    pub fn dropped_total(&self) -> u64 {
        self.dropped_loss
            + self.dropped_burst
            + self.dropped_blackhole
            + self.dropped_egress_tail
            + self.dropped_ingress_tail
            + self.dropped_link_down
            + self.dropped_unroutable
            + self.dropped_bad_source
    }

    fn dropped_mut(&mut self, cause: DropCause) -> &mut u64 {
        match cause {
            DropCause::Loss => &mut self.dropped_loss,
            DropCause::Burst => &mut self.dropped_burst,
            DropCause::Blackhole => &mut self.dropped_blackhole,
            DropCause::EgressTailDrop => &mut self.dropped_egress_tail,
            DropCause::IngressTailDrop => &mut self.dropped_ingress_tail,
            DropCause::LinkDown => &mut self.dropped_link_down,
            DropCause::Unroutable => &mut self.dropped_unroutable,
            DropCause::BadSource => &mut self.dropped_bad_source,
        }
    }
}

/// A scheduled change to the network, see [`Network::at`].
#[derive(Debug, Clone)]
pub enum Action {
    /// Blackhole (or restore) route index `route` for all pairs.
    Blackhole {
        /// Route index.
        route: usize,
        /// true = blackholed.
        on: bool,
    },
    /// Set [`FaultConfig::loss`].
    SetLoss(f64),
    /// Isolate (or reconnect) a node: everything to/from it is dropped.
    LinkDown {
        /// Node index.
        node: usize,
        /// true = isolated.
        on: bool,
    },
    /// Replace the whole fault config.
    SetFaults(FaultConfig),
}

/// Why [`Network::run_until`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// The `done` predicate returned true.
    Done {
        /// Time at which it did.
        now_ns: u64,
    },
    /// The next event is after the deadline; the clock was advanced to the
    /// deadline.
    Deadline,
    /// No events and no timers remain (the clock stays at the last event).
    Idle,
    /// `max_events` events were processed in this run (or a node emitted
    /// more than `max_events` datagrams in one drain): livelock guard.
    EventLimit,
}

const NO_NODE: usize = usize::MAX;

#[derive(Debug, Clone)]
struct InFlight {
    id: u64,
    src: usize,
    dst: usize,
    route: usize,
    dgram: Datagram,
    duplicate: bool,
    corrupted: bool,
    reordered: bool,
}

#[derive(Debug)]
enum EventKind {
    /// Finished serializing on the sender's egress port; enters the route.
    EnterRoute(InFlight),
    /// Last bit reaches the receiver's ToR; enters the ingress port.
    IngressArrive(InFlight),
    /// Handed to the receiver.
    Deliver(InFlight),
    Timer(usize),
    Action(Action),
}

#[derive(Debug)]
struct Event {
    time: u64,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    // Reversed: BinaryHeap is a max-heap, we want the earliest (time, seq).
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// A FIFO port: tracks bytes queued until each packet's departure.
#[derive(Debug, Default)]
struct Port {
    /// (departure time, bytes), departure times non-decreasing.
    queue: VecDeque<(u64, u64)>,
    queued_bytes: u64,
    busy_until: u64,
}

impl Port {
    fn occupancy(&mut self, now: u64) -> u64 {
        while let Some(&(t, b)) = self.queue.front() {
            if t > now {
                break;
            }
            self.queued_bytes -= b;
            self.queue.pop_front();
        }
        self.queued_bytes
    }

    fn push(&mut self, departure: u64, bytes: u64) {
        self.busy_until = departure;
        self.queued_bytes += bytes;
        self.queue.push_back((departure, bytes));
    }
}

#[derive(Debug, Default)]
struct RouteState {
    last_arrival: u64,
    /// Gilbert-Elliott bad state.
    bad: bool,
}

/// N sans-IO nodes on a virtual clock over simulated, faulty links.
///
/// Path of a datagram: sender's egress port (rate, buffer, ECN) -> route
/// (faults, propagation delay + per-route jitter, FIFO) -> receiver's ingress
/// port (cut-through: an idle port adds no delay, a busy one spaces datagrams
/// by their serialization time; buffer, ECN) -> `handle_datagram`.
/// Uncongested, jitter-free one-way latency is therefore
/// `serialization_ns(len) + delay_ns`.
pub struct Network<N: Node> {
    /// The endpoints, indexed by node index (tests may reach in between runs).
    pub nodes: Vec<N>,
    config: NetConfig,
    now: u64,
    rng: ChaCha8Rng,
    queue: BinaryHeap<Event>,
    seq: u64,
    next_packet_id: u64,
    timer_at: Vec<Option<u64>>,
    egress: Vec<Port>,
    ingress: Vec<Port>,
    routes: HashMap<(usize, usize, usize), RouteState>,
    blackholed: Vec<bool>,
    link_down: Vec<bool>,
    by_ip: HashMap<IpAddr, usize>,
    stats: NetStats,
    tap: Option<Tap>,
    transmit_overflow: bool,
}

impl<N: Node> std::fmt::Debug for Network<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("nodes", &self.nodes.len())
            .field("now_ns", &self.now)
            .field("seed", &self.config.seed)
            .field("pending_events", &self.queue.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<N: Node> Network<N> {
    /// Build a network at time 0.
    ///
    /// # Panics
    /// If `routes_per_pair` is 0 or two nodes share an IP.
    pub fn new(config: NetConfig, nodes: Vec<N>) -> Self {
        assert!(config.routes_per_pair >= 1, "routes_per_pair must be >= 1");
        let mut by_ip = HashMap::new();
        for (i, n) in nodes.iter().enumerate() {
            if let Some(j) = by_ip.insert(n.ip(), i) {
                panic!("nodes {j} and {i} share IP {}", n.ip());
            }
        }
        let n = nodes.len();
        let r = config.routes_per_pair;
        Self {
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            nodes,
            now: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            next_packet_id: 0,
            timer_at: vec![None; n],
            egress: (0..n).map(|_| Port::default()).collect(),
            ingress: (0..n).map(|_| Port::default()).collect(),
            routes: HashMap::new(),
            blackholed: vec![false; r],
            link_down: vec![false; n],
            by_ip,
            stats: NetStats {
                per_route: vec![RouteStats::default(); r],
                ..NetStats::default()
            },
            tap: None,
            transmit_overflow: false,
            config,
        }
    }

    /// Current simulated time, ns.
    pub fn now_ns(&self) -> u64 {
        self.now
    }

    /// The seed of this network.
    pub fn seed(&self) -> u64 {
        self.config.seed
    }

    /// The configuration (faults reflect runtime changes).
    pub fn config(&self) -> &NetConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> &NetStats {
        &self.stats
    }

    /// Zero all counters.
    pub fn reset_stats(&mut self) {
        self.stats = NetStats {
            per_route: vec![RouteStats::default(); self.config.routes_per_pair],
            ..NetStats::default()
        };
    }

    /// Index of the node owning `ip`.
    pub fn node_index(&self, ip: IpAddr) -> Option<usize> {
        self.by_ip.get(&ip).copied()
    }

    /// The ECMP route index a datagram `src -> dst` takes.
    pub fn route_of(&self, src: SocketAddr, dst: SocketAddr) -> usize {
        select_route(
            self.config.route_select,
            src,
            dst,
            self.config.routes_per_pair,
        )
    }

    /// Number of scheduled events (datagrams in flight, timers, actions).
    pub fn pending_events(&self) -> usize {
        self.queue.len()
    }

    /// Install the tap (replacing any previous one).
    pub fn set_tap(&mut self, tap: Tap) {
        self.tap = Some(tap);
    }

    /// Remove and return the tap.
    pub fn take_tap(&mut self) -> Option<Tap> {
        self.tap.take()
    }

    /// Blackhole (or restore) route index `route` for all pairs, now.
    ///
    /// # Panics
    /// If `route >= routes_per_pair`.
    pub fn blackhole_route(&mut self, route: usize, on: bool) {
        self.blackholed[route] = on;
    }

    /// Whether route index `route` is blackholed.
    pub fn is_blackholed(&self, route: usize) -> bool {
        self.blackholed[route]
    }

    /// Isolate (or reconnect) node `node`, now.
    pub fn set_link_down(&mut self, node: usize, on: bool) {
        self.link_down[node] = on;
    }

    /// Whether node `node` is isolated.
    pub fn is_link_down(&self, node: usize) -> bool {
        self.link_down[node]
    }

    /// Set the uniform loss probability, now.
    pub fn set_loss(&mut self, p: f64) {
        self.config.faults.loss = p;
    }

    /// Mutable access to the fault config (takes effect for datagrams
    /// entering a route from now on).
    pub fn faults_mut(&mut self) -> &mut FaultConfig {
        &mut self.config.faults
    }

    /// Send `datagram` from node `src_node`'s egress port now, whatever its
    /// source address says. A real fabric does no source-address
    /// validation, so this is how a test plays an attacker that spoofs
    /// another node's address (nodes' own datagrams with a foreign source
    /// are [`DropCause::BadSource`], a node bug). Egress, route faults and
    /// ingress apply as to any datagram, and the tap sees it with
    /// `src_node == src_node`.
    ///
    /// # Panics
    /// If `src_node` is not a node index.
    pub fn inject(&mut self, src_node: usize, datagram: Datagram) {
        assert!(src_node < self.nodes.len(), "no node {src_node}");
        self.send_checked(src_node, datagram, false);
    }

    /// Override the port knobs of one node (affects datagrams queued from
    /// now on).
    pub fn set_node_link(&mut self, node: usize, link: LinkConfig) {
        self.config.node_links.insert(node, link);
    }

    /// Schedule `action` at `time_ns` (or now, if in the past). Actions at
    /// the same time apply in the order they were scheduled, after events
    /// already scheduled for that time.
    pub fn at(&mut self, time_ns: u64, action: Action) {
        let t = time_ns.max(self.now);
        self.push(t, EventKind::Action(action));
    }

    /// `run_until(now + duration_ns, |_| false)`; unlike `run_until`, an
    /// [`RunOutcome::Idle`] network still has its clock advanced to
    /// `now + duration_ns` (nothing could have happened meanwhile).
    pub fn run_for(&mut self, duration_ns: u64) -> RunOutcome {
        let deadline = self.now.saturating_add(duration_ns);
        let out = self.run_until(deadline, |_| false);
        if out == RunOutcome::Idle {
            self.now = self.now.max(deadline);
        }
        out
    }

    /// Run the simulation.
    ///
    /// First drains every node's `poll_transmit` and (re)schedules its timer
    /// (so work posted from outside gets sent), then checks `done`, then
    /// processes events in (time, insertion) order, calling `done` after
    /// each. Events at exactly `deadline_ns` are processed.
    pub fn run_until(
        &mut self,
        deadline_ns: u64,
        mut done: impl FnMut(&mut [N]) -> bool,
    ) -> RunOutcome {
        self.transmit_overflow = false;
        for i in 0..self.nodes.len() {
            self.after_input(i);
        }
        if self.transmit_overflow {
            return RunOutcome::EventLimit;
        }
        if done(&mut self.nodes) {
            return RunOutcome::Done { now_ns: self.now };
        }
        let mut processed = 0u64;
        loop {
            let Some(next) = self.queue.peek() else {
                return RunOutcome::Idle;
            };
            if next.time > deadline_ns {
                self.now = self.now.max(deadline_ns);
                return RunOutcome::Deadline;
            }
            if processed >= self.config.max_events {
                return RunOutcome::EventLimit;
            }
            let Some(ev) = self.queue.pop() else {
                return RunOutcome::Idle;
            };
            self.now = self.now.max(ev.time);
            if !self.process(ev) {
                continue;
            }
            processed += 1;
            self.stats.events += 1;
            if self.transmit_overflow {
                return RunOutcome::EventLimit;
            }
            if done(&mut self.nodes) {
                return RunOutcome::Done { now_ns: self.now };
            }
        }
    }

    fn push(&mut self, time: u64, kind: EventKind) {
        let seq = self.seq;
        self.seq += 1;
        self.queue.push(Event { time, seq, kind });
    }

    /// Drain transmits of node `i`, then reschedule its timer.
    fn after_input(&mut self, i: usize) {
        let mut count = 0u64;
        while let Some(d) = self.nodes[i].poll_transmit(self.now) {
            self.send(i, d);
            count += 1;
            if count > self.config.max_events {
                self.transmit_overflow = true;
                break;
            }
        }
        self.reschedule(i);
    }

    fn reschedule(&mut self, i: usize) {
        if let Some(t) = self.nodes[i].poll_timeout() {
            let t = t.max(self.now);
            if self.timer_at[i].is_none_or(|p| t < p) {
                self.timer_at[i] = Some(t);
                self.push(t, EventKind::Timer(i));
            }
        }
    }

    /// Process one event; false if it was a stale timer (not counted).
    fn process(&mut self, ev: Event) -> bool {
        match ev.kind {
            EventKind::Timer(i) => {
                if self.timer_at[i] != Some(ev.time) {
                    return false;
                }
                self.timer_at[i] = None;
                match self.nodes[i].poll_timeout() {
                    Some(t) if t <= self.now => {
                        self.stats.timeouts_fired += 1;
                        self.nodes[i].handle_timeout(self.now);
                        self.after_input(i);
                        if self.nodes[i].poll_timeout().is_some_and(|t| t <= self.now) {
                            self.stats.stalled_timeouts += 1;
                        }
                    }
                    _ => self.reschedule(i),
                }
            }
            EventKind::Action(a) => self.apply(a),
            EventKind::EnterRoute(p) => self.enter_route(p),
            EventKind::IngressArrive(p) => self.ingress_arrive(p),
            EventKind::Deliver(p) => self.deliver(p),
        }
        true
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Blackhole { route, on } => self.blackhole_route(route, on),
            Action::SetLoss(p) => self.set_loss(p),
            Action::LinkDown { node, on } => self.set_link_down(node, on),
            Action::SetFaults(f) => self.config.faults = f,
        }
    }

    fn emit(&mut self, fate: Fate, p: &InFlight) {
        if let Some(tap) = self.tap.as_mut() {
            tap(&TapEvent {
                now_ns: self.now,
                packet_id: p.id,
                src_node: p.src,
                dst_node: (p.dst != NO_NODE).then_some(p.dst),
                route: p.route,
                len: p.dgram.payload.len(),
                fate,
                ecn: p.dgram.ecn,
                duplicate: p.duplicate,
                corrupted: p.corrupted,
                reordered: p.reordered,
                payload: &p.dgram.payload,
            });
        }
    }

    fn drop_packet(&mut self, p: &InFlight, cause: DropCause) {
        *self.stats.dropped_mut(cause) += 1;
        self.stats.per_route[p.route].dropped += 1;
        self.emit(Fate::Dropped(cause), p);
    }

    /// Node `src` emitted `dgram` now: egress port.
    fn send(&mut self, src: usize, dgram: Datagram) {
        self.send_checked(src, dgram, true);
    }

    /// [`Self::send`], with the source-address check optional (see [`Self::inject`]).
    fn send_checked(&mut self, src: usize, dgram: Datagram, check_source: bool) {
        let id = self.next_packet_id;
        self.next_packet_id += 1;
        self.stats.sent += 1;
        let route = self.route_of(dgram.src, dgram.dst);
        let dst = self.node_index(dgram.dst.ip()).unwrap_or(NO_NODE);
        let mut p = InFlight {
            id,
            src,
            dst,
            route,
            dgram,
            duplicate: false,
            corrupted: false,
            reordered: false,
        };
        self.emit(Fate::Sent, &p);
        if check_source && p.dgram.src.ip() != self.nodes[src].ip() {
            return self.drop_packet(&p, DropCause::BadSource);
        }
        if dst == NO_NODE {
            return self.drop_packet(&p, DropCause::Unroutable);
        }
        if self.link_down[src] || self.link_down[dst] {
            return self.drop_packet(&p, DropCause::LinkDown);
        }
        let link = self.config.node_link(src);
        let bytes = p.dgram.payload.len() as u64 + link.overhead_bytes;
        let ser = link.serialization_ns(p.dgram.payload.len());
        let (buffer, threshold) = (
            link.egress_buffer_bytes,
            link.ecn_threshold_bytes.filter(|_| link.egress_ecn_marking),
        );
        let port = &mut self.egress[src];
        let occ = port.occupancy(self.now);
        if occ + bytes > buffer {
            return self.drop_packet(&p, DropCause::EgressTailDrop);
        }
        if mark_ce(&mut p.dgram.ecn, occ, threshold) {
            self.stats.ce_marked += 1;
        }
        let departure = self.now.max(port.busy_until) + ser;
        port.push(departure, bytes);
        self.push(departure, EventKind::EnterRoute(p));
    }

    /// Finished on the egress port: route faults, then propagation.
    fn enter_route(&mut self, mut p: InFlight) {
        if self.link_down[p.src] || self.link_down[p.dst] {
            return self.drop_packet(&p, DropCause::LinkDown);
        }
        let faults = &self.config.faults;
        let in_scope = faults.scope.matches(p.src, p.dst, &p.dgram.payload);
        if self.blackholed[p.route] && (in_scope || !faults.scope.blackholes_obey_scope) {
            return self.drop_packet(&p, DropCause::Blackhole);
        }
        let key = (p.src, p.dst, p.route);
        let mut duplicate = false;
        if in_scope {
            let rng = &mut self.rng;
            if chance(rng, faults.loss) {
                return self.drop_packet(&p, DropCause::Loss);
            }
            let state = self.routes.entry(key).or_default();
            if faults.burst_enter > 0.0 || state.bad {
                let flip = if state.bad {
                    faults.burst_exit
                } else {
                    faults.burst_enter
                };
                if chance(rng, flip) {
                    state.bad = !state.bad;
                }
                if state.bad && chance(rng, faults.burst_loss) {
                    return self.drop_packet(&p, DropCause::Burst);
                }
            }
            if !p.dgram.payload.is_empty() && chance(rng, faults.corrupt) {
                let bits = p.dgram.payload.len() as u64 * 8;
                let bit = rng.next_u64() % bits;
                p.dgram.payload[(bit / 8) as usize] ^= 1 << (bit % 8);
                p.corrupted = true;
                self.stats.corrupted += 1;
            }
            p.reordered = chance(rng, faults.reorder);
            duplicate = chance(rng, faults.duplicate);
        }
        let base = self.now + self.config.link.delay_ns + self.jitter(key);
        let arrival = if p.reordered {
            self.stats.reordered += 1;
            base + range_incl(&mut self.rng, 1, self.config.faults.reorder_delay_ns.max(1))
        } else {
            let state = self.routes.entry(key).or_default();
            let a = base.max(state.last_arrival);
            state.last_arrival = a;
            a
        };
        if duplicate {
            self.stats.duplicated += 1;
            let extra = range_incl(
                &mut self.rng,
                1,
                self.config.faults.duplicate_delay_ns.max(1),
            );
            let mut copy = p.clone();
            copy.duplicate = true;
            self.push(arrival + extra, EventKind::IngressArrive(copy));
        }
        self.push(arrival, EventKind::IngressArrive(p));
    }

    /// Reached the receiver's ToR: ingress (downlink) port.
    fn ingress_arrive(&mut self, mut p: InFlight) {
        if self.link_down[p.dst] {
            return self.drop_packet(&p, DropCause::LinkDown);
        }
        let uplink_ser = self
            .config
            .node_link(p.src)
            .serialization_ns(p.dgram.payload.len());
        let link = self.config.node_link(p.dst);
        let bytes = p.dgram.payload.len() as u64 + link.overhead_bytes;
        let ser = link.serialization_ns(p.dgram.payload.len());
        let (buffer, threshold) = (link.ingress_buffer_bytes, link.ecn_threshold_bytes);
        let now = self.now;
        let port = &mut self.ingress[p.dst];
        let occ = port.occupancy(now);
        if occ + bytes > buffer {
            return self.drop_packet(&p, DropCause::IngressTailDrop);
        }
        if mark_ce(&mut p.dgram.ecn, occ, threshold) {
            self.stats.ce_marked += 1;
        }
        // Cut-through: the downlink may start as soon as the first bit
        // reaches the ToR (`now` minus the sender's serialization time), so
        // an idle port of equal rate delivers at `now`; a busy one
        // serializes after its backlog, a slower one takes its own time.
        let first_bit = now.saturating_sub(uplink_ser);
        let start = first_bit.max(port.busy_until);
        let delivery = (start + ser).max(now);
        port.push(delivery, bytes);
        self.push(delivery, EventKind::Deliver(p));
    }

    fn deliver(&mut self, p: InFlight) {
        if self.link_down[p.dst] {
            return self.drop_packet(&p, DropCause::LinkDown);
        }
        let len = p.dgram.payload.len() as u64;
        self.stats.delivered += 1;
        self.stats.bytes_delivered += len;
        let rs = &mut self.stats.per_route[p.route];
        rs.delivered += 1;
        rs.bytes_delivered += len;
        self.emit(Fate::Delivered, &p);
        let dst = p.dst;
        self.nodes[dst].handle_datagram(self.now, p.dgram);
        self.after_input(dst);
    }

    /// Current jitter offset of a route pipe: a seeded hash of the pipe and
    /// the jitter epoch, uniform in `[0, jitter_ns]`.
    fn jitter(&self, (src, dst, route): (usize, usize, usize)) -> u64 {
        let link = &self.config.link;
        if link.jitter_ns == 0 {
            return 0;
        }
        let epoch = self.now.checked_div(link.jitter_period_ns).unwrap_or(0);
        let mut h = mix(self.config.seed ^ 0x6a09_e667_f3bc_c908);
        for w in [src as u64, dst as u64, route as u64, epoch] {
            h = mix(h ^ w);
        }
        match link.jitter_ns.checked_add(1) {
            Some(m) => h % m,
            None => h,
        }
    }
}

fn mark_ce(ecn: &mut Ecn, occupancy: u64, threshold: Option<u64>) -> bool {
    if *ecn == Ecn::Ect0 && threshold.is_some_and(|t| occupancy > t) {
        *ecn = Ecn::Ce;
        true
    } else {
        false
    }
}

/// SplitMix64 finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn ip_words(ip: IpAddr) -> [u64; 2] {
    match ip {
        IpAddr::V4(v4) => [u64::from(u32::from(v4)), 4],
        IpAddr::V6(v6) => {
            let x = u128::from(v6);
            [(x >> 64) as u64 ^ 6, x as u64]
        }
    }
}

fn select_route(sel: RouteSelect, src: SocketAddr, dst: SocketAddr, routes: usize) -> usize {
    match sel {
        RouteSelect::PortModulo => usize::from(src.port()) % routes,
        RouteSelect::Hash => {
            const UDP: u64 = 17;
            let [s0, s1] = ip_words(src.ip());
            let [d0, d1] = ip_words(dst.ip());
            let ports = (u64::from(src.port()) << 16) | u64::from(dst.port());
            let mut h = mix(UDP);
            for w in [s0, s1, d0, d1, ports] {
                h = mix(h ^ w);
            }
            (h % routes as u64) as usize
        }
        RouteSelect::Custom(f) => f(src, dst, routes) % routes,
    }
}

/// Uniform in [0, 1).
fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Bernoulli(p); draws nothing when p <= 0 or p >= 1.
fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    if p <= 0.0 || p.is_nan() {
        false
    } else if p >= 1.0 {
        true
    } else {
        unit(rng) < p
    }
}

/// Uniform in [lo, hi] (hi >= lo).
fn range_incl(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> u64 {
    match (hi - lo).checked_add(1) {
        Some(span) => lo + rng.next_u64() % span,
        None => rng.next_u64(),
    }
}
