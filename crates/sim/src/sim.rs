//! The simulator proper: the arena every fabric element lives in, the
//! event loop that drives them, and the measurements the report is built
//! from.
//!
//! [`Sim`] owns every port, switch, host and packet; elements name each
//! other by index, never by pointer. Each element is one file under
//! `sim/` of `impl Sim` blocks over this arena (the crate docs map which
//! file holds which): `host.rs`, `packet.rs`, `port.rs`, `pipe.rs`,
//! `switch.rs`, `pfc.rs`, `credit.rs`, `routing.rs`, `failure.rs`,
//! `flow.rs`, `tap.rs`. The event loop ([`Sim::run`]) hands each event to its
//! element; a packet goes `host_pull` → `tx_start` / `tx_done` →
//! `pipe_enter` / `pipe_arrive` → `switch_receive` → (port and pipe again,
//! hop by hop) → `host_receive`.
//!
//! Packets live in a slab and are recycled, so the steady state allocates
//! nothing per packet (the protocol core's own ACK records aside).

mod credit;
mod failure;
mod flow;
mod host;
mod loss;
mod packet;
mod pfc;
mod pipe;
mod port;
mod routing;
mod switch;
mod tap;

pub use credit::{CreditConfig, credit_loop_bytes};
pub use loss::{FailedPart, FailureRecord, LossCause, LossCounts};
pub use port::{Port, PortCounters};
pub use switch::TRIM_BYTES;
pub use tap::{TapRecorder, TappedPacket};

use crate::error::SimError;
use crate::event::{EventKind, EventQueue};
use crate::fabric::FabricConfig;
use crate::stats::{Histogram, Series};
use crate::time::{Ps, serialization_ps};
use crate::topology::{NodeRef, Topology};
use crate::transport::{Transport, TransportFactory};
use crate::workload::FlowSet;
use host::HostState;
use packet::Packets;
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use switch::Switch;

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
    /// Every packet lost, by cause, data and control apart.
    pub losses: LossCounts,
    /// Links watched bin by bin ([`Sim::monitor_link`]).
    pub monitors: Vec<LinkMonitor>,
    /// Every failure and what still ran into it.
    pub failures: Vec<FailureRecord>,
    /// Width of a time-series bin.
    pub bin_ps: Ps,
    /// Each port's rate, bit/s (to turn bytes per bin into utilisation).
    pub port_rates_bps: Vec<u64>,
}

/// One watched link direction: its traffic, queue and drops per time bin.
#[derive(Debug, Clone)]
pub struct LinkMonitor {
    /// Name (`a->b`).
    pub name: String,
    /// The port (link direction).
    pub port: u32,
    /// Bytes serialized per bin.
    pub tx_bytes: Series,
    /// Largest queue per bin.
    pub queue_max: Series,
    /// Packets lost at or on it per bin.
    pub drops: Series,
}

impl Measurements {
    /// The queue a packet found at an egress port labelled `label`, in time bin `bin`.
    #[inline]
    fn sample_queue(&mut self, label: u8, bin: u64, queue_bytes: u64) {
        let label = label as usize;
        self.queue_hist[label].record(queue_bytes);
        self.queue_max[label].max_at(bin, queue_bytes);
    }
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
    /// Builds hosts and opens channels (as their first message starts).
    factory: F,
    topo: Topology,
    cfg: FabricConfig,
    /// Two per link, `2i` its a→b direction and `2i + 1` its b→a.
    ports: Vec<Port>,
    switches: Vec<Switch>,
    hosts: Vec<HostState<F::Host>>,
    packets: Packets<<F::Host as Transport>::Packet>,
    events: EventQueue,
    /// Every random choice of the fabric (wire loss, ECN marks), in event order.
    rng: ChaCha8Rng,
    work: FlowSet,
    /// Completions each trigger has seen.
    trigger_seen: Vec<u32>,
    /// Flows each trigger starts.
    trigger_flows: Vec<Vec<u32>>,
    /// Awaited (non-background) flows not yet finished.
    waiting: usize,
    /// When the last awaited flow finished.
    last_done: Ps,
    end_ps: Ps,
    measured: Measurements,
    /// An error that stops the run at the end of the current event.
    error: Option<SimError>,
    /// Width of a time-series bin.
    bin_ps: Ps,
    /// Credit-based link flow control (InfiniBand-style): credits in bytes
    /// per port; empty when off. See [`Sim::set_credit_flow_control`].
    credits: Vec<i64>,
    /// Each port's credit at start (and after its link comes back up).
    credit_initial: Vec<i64>,
    /// Credit settings, when credits are on.
    credit_cfg: Option<CreditConfig>,
    /// The failure (index into the measurements) each port is down for;
    /// `u32::MAX` while up.
    port_failure: Vec<u32>,
    /// Converged routes (with `cfg.reconverge_ps`): whether switch `s` can
    /// still deliver to leaf `l`, at `s * leaves + l`. Empty when off.
    reach: Vec<bool>,
    /// Leaves per plane (one more than the largest `host_leaf`).
    leaves: usize,
    /// A re-convergence already scheduled at this time.
    reconverge_at: Option<Ps>,
    /// Packet capture on chosen links ([`Sim::tap_links`]); `None`: none.
    tap: Option<tap::LinkTap<<F::Host as Transport>::Packet>>,
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
    ) -> Result<Self, SimError> {
        let (ports, host_ports, switch_ports) = port::build_ports(&topo);
        let port_rates_bps = ports.iter().map(|p| p.rate_bps).collect();
        let switches = switch::build_switches(&topo, &ports, switch_ports, cfg.pfc, seed);
        let hosts = host::build_hosts(&topo, factory, host_ports, seed)?;
        let labels = topo.labels.len();
        let bin_ps = cfg.sample_ps.max(1);
        let mut sim = Self {
            factory: factory.clone(),
            cfg,
            ports,
            switches,
            hosts,
            packets: Packets::new(),
            events: EventQueue::new(),
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_fab1),
            trigger_seen: vec![0; work.triggers.len()],
            trigger_flows: vec![Vec::new(); work.triggers.len()],
            waiting: 0,
            last_done: 0,
            end_ps,
            measured: Measurements {
                flows: vec![FlowRun::default(); work.flows.len()],
                queue_hist: (0..labels).map(|_| Histogram::new()).collect(),
                delivered: Series::default(),
                queue_max: (0..labels).map(|_| Series::default()).collect(),
                no_route: 0,
                headroom_drops: 0,
                delivered_packets: 0,
                nic_packets: 0,
                losses: LossCounts::default(),
                monitors: Vec::new(),
                failures: Vec::new(),
                bin_ps,
                port_rates_bps,
            },
            work,
            error: None,
            bin_ps,
            credits: Vec::new(),
            credit_initial: Vec::new(),
            credit_cfg: None,
            port_failure: Vec::new(),
            reach: Vec::new(),
            leaves: 0,
            reconverge_at: None,
            tap: None,
            topo,
        };
        sim.port_failure = vec![u32::MAX; sim.ports.len()];
        sim.setup_flows()?;
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
        &self.hosts[h as usize].transport
    }

    /// Current simulated time.
    pub fn now(&self) -> Ps {
        self.events.now()
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
            events: self.events.executed(),
            max_pending: self.events.max_pending(),
            packet_slots: self.packets.slots(),
        }
    }

    /// Measurements so far.
    pub fn measurements(&self) -> &Measurements {
        &self.measured
    }

    /// Sum of every host's transport counters.
    pub fn transport_stats(&self) -> crate::transport::TransportStats {
        let mut s = crate::transport::TransportStats::default();
        for h in &self.hosts {
            s.add(&h.transport.stats());
        }
        s
    }

    /// Run until every awaited flow is done, the end time, or nothing is
    /// left to do; `progress` is called every 2^16 events.
    pub fn run(&mut self, mut progress: impl FnMut(&Self)) -> Result<(), SimError> {
        while let Some(t) = self.events.peek_time() {
            if t > self.end_ps || self.waiting == 0 {
                break;
            }
            let (now, ev) = self.events.pop().expect("peeked");
            match ev {
                EventKind::TxDone(p) => self.tx_done(now, p),
                EventKind::PipeArrive { port, pkt } => self.pipe_arrive(now, port, pkt),
                EventKind::HostTimer(h) => self.host_timer(now, h),
                EventKind::FlowStart(f) => self.flow_start(now, f),
                EventKind::Pfc { port, pause, .. } => self.pfc_frame_arrives(now, port, pause),
                EventKind::LinkState { port, up } => self.link_state(now, port, up),
                EventKind::Credit { port, bytes } => self.credit_returned(now, port, bytes),
                EventKind::Reconverge => self.reconverge(),
            }
            if let Some(e) = self.error.take() {
                return Err(e);
            }
            if self.events.executed() & 0xffff == 0 {
                progress(self);
            }
        }
        let now = self.events.now();
        self.close_pause_intervals(now);
        Ok(())
    }
}

impl<F: TransportFactory> Sim<F> {
    /// Watch both directions of the link between `a` and `b` bin by bin.
    pub fn monitor_link(&mut self, a: NodeRef, b: NodeRef) -> Result<(), SimError> {
        let p = self.link_port(a, b)?;
        let r = self.ports[p as usize].reverse;
        for (port, from, to) in [(p, a, b), (r, b, a)] {
            let name = format!("{}->{}", self.topo.node_name(from), self.topo.node_name(to));
            self.monitor_port(port, name);
        }
        Ok(())
    }

    /// Watch port `p` bin by bin under `name` (once: a second call keeps
    /// the first name); returns the monitor's index.
    pub fn monitor_port(&mut self, p: u32, name: String) -> u32 {
        let port = &mut self.ports[p as usize];
        if port.monitor != u32::MAX {
            return port.monitor;
        }
        port.monitor = self.measured.monitors.len() as u32;
        self.measured.monitors.push(LinkMonitor {
            name,
            port: p,
            tx_bytes: Series::default(),
            queue_max: Series::default(),
            drops: Series::default(),
        });
        port.monitor
    }

    /// The ports that deliver to host `h` (its leaf's down ports, one per
    /// plane): where an incast toward `h` queues.
    pub fn ports_into_host(&self, h: u32) -> Vec<u32> {
        (0..self.ports.len() as u32)
            .filter(|&p| self.ports[p as usize].peer == NodeRef::Host(h))
            .collect()
    }
}

/// A uniform draw in [0, 1) with 53 random bits.
#[inline]
fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Unloaded round trip over the longest route: propagation both ways plus
/// one full-size data packet and one ACK serialized at every hop.
pub fn base_rtt(t: &Topology) -> Ps {
    let hops = u64::from(t.max_hops);
    let ser = |bytes: u64| serialization_ps(bytes, t.host_rate_bps);
    2 * hops * t.delay_ps + hops * (ser(4096 + 100) + ser(100))
}
