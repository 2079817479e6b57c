//! Scenario files (TOML): topology, switches, transport, workloads, failures.
//!
//! A bad file gives one line naming the file, the line and the key:
//! `scenarios/x.toml:12: unknown field `hostz`, expected one of ...`.

use crate::collective::CollectiveWorkload;
use crate::error::SimError;
use crate::fabric::{BufferModel, EcnConfig, FabricConfig, PfcConfig, Routing};
use crate::hostset::{HostSetConf, shuffled};
use crate::time::{PS_PER_NS, Ps, us_to_ps};
use crate::topology::{FabricSize, LinkParams, NodeRef, Topology};
use crate::workload::{FlowSet, StepTrigger};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The embedded default scenario (`metaroce sim` with no file).
pub const DEFAULT_SCENARIO: &str = include_str!("../../../scenarios/default.toml");

/// Most hosts a scenario may have.
pub const MAX_HOSTS: u64 = 1 << 20;
/// Most memory a scenario's fabric may be estimated to need at setup
/// ([`FabricSize::estimated_bytes`]).
pub const MAX_FABRIC_BYTES: u64 = 16 << 30;
/// Most time-series bins a run may ask for (`end_us / sample_us`; each
/// bin holds a counter per link tier).
pub const MAX_SAMPLE_BINS: f64 = 1e8;
/// Largest `topology.oversubscription`.
pub const MAX_OVERSUBSCRIPTION: u32 = 1024;

/// Transport kinds a scenario may name.
pub const TRANSPORTS: [&str; 4] = ["metaroce", "rocev2", "irn", "ib"];

/// A whole scenario file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name in reports.
    pub name: String,
    /// Seed of every random choice.
    #[serde(default = "one")]
    pub seed: u64,
    /// Stop at this simulated time even if flows are unfinished.
    #[serde(default = "default_end_us")]
    pub end_us: f64,
    /// Width of time-series bins.
    #[serde(default = "default_sample_us")]
    pub sample_us: f64,
    /// The fabric.
    pub topology: TopologyConf,
    /// Switch behaviour.
    #[serde(default)]
    pub switch: SwitchConf,
    /// Host transport.
    #[serde(default)]
    pub transport: TransportConf,
    /// Traffic.
    #[serde(default)]
    pub workload: Vec<WorkloadConf>,
    /// Link, switch and plane failures.
    #[serde(default)]
    pub failure: Vec<FailureConf>,
    /// Links watched bin by bin.
    #[serde(default)]
    pub monitor: Vec<MonitorConf>,
    /// Directory relative file names resolve against (not in the file).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

fn one() -> u64 {
    1
}
fn default_end_us() -> f64 {
    1_000_000.0
}
fn default_sample_us() -> f64 {
    1.0
}

/// Fabric shape.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyConf {
    /// `fat_tree`, `leaf_spine`, `rail`, `star` or `back_to_back`.
    pub kind: String,
    /// Hosts (NICs); for `rail`, servers x rails.
    #[serde(default)]
    pub hosts: u32,
    /// Fat tree arity (default: smallest that holds `hosts`).
    #[serde(default)]
    pub k: u32,
    /// Hosts per ToR up-link (fat tree), or leaf down/up ratio (leaf-spine).
    #[serde(default = "one_u32")]
    pub oversubscription: u32,
    /// Leaf-spine: hosts per leaf; rail: servers per leaf.
    #[serde(default)]
    pub hosts_per_leaf: u32,
    /// Leaf-spine / rail: spine switches (default: hosts_per_leaf / oversubscription).
    #[serde(default)]
    pub spines: u32,
    /// Rail: servers.
    #[serde(default)]
    pub servers: u32,
    /// Rail: NICs per server.
    #[serde(default = "eight")]
    pub rails: u32,
    /// Planes per NIC (each its own fabric).
    #[serde(default = "one_u32")]
    pub planes: u32,
    /// Host link rate per plane, Gb/s (100, 200, 400, 800).
    pub link_gbps: u64,
    /// Switch-to-switch link rate, Gb/s (default: link_gbps).
    #[serde(default)]
    pub fabric_gbps: u64,
    /// Propagation delay per link, ns.
    #[serde(default = "default_latency")]
    pub latency_ns: u64,
}

impl TopologyConf {
    /// Leaf-spine / rail spines: as given, or a leaf's down-ports over
    /// the oversubscription.
    fn spines_or_default(&self) -> u32 {
        if self.spines == 0 {
            (self.hosts_per_leaf / self.oversubscription).max(1)
        } else {
            self.spines
        }
    }

    /// Fat tree arity: as given, or the smallest that holds the hosts.
    fn fat_tree_k(&self) -> u32 {
        if self.k == 0 {
            Topology::fat_tree_k_for(self.hosts, self.oversubscription)
        } else {
            self.k
        }
    }

    /// What this shape builds, counted before building it.
    pub fn size(&self) -> FabricSize {
        let planes = u64::from(self.planes);
        match self.kind.as_str() {
            "fat_tree" => FabricSize::fat_tree(
                self.hosts.into(),
                self.fat_tree_k().into(),
                self.oversubscription.into(),
                planes,
            ),
            "leaf_spine" => FabricSize::leaf_spine(
                self.hosts.into(),
                self.hosts_per_leaf.into(),
                self.spines_or_default().into(),
                1,
                planes,
            ),
            "rail" => FabricSize::rail(
                self.servers.into(),
                self.rails.into(),
                self.hosts_per_leaf.into(),
                self.spines_or_default().into(),
                planes,
            ),
            "star" => FabricSize::leaf_spine(self.hosts.into(), self.hosts.into(), 0, 1, planes),
            _ => FabricSize::back_to_back(),
        }
    }
}

/// `bytes` in the largest binary unit that keeps it at least 1.
fn human_bytes(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

fn one_u32() -> u32 {
    1
}
fn eight() -> u32 {
    8
}
fn default_latency() -> u64 {
    1000
}

/// Switch behaviour.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchConf {
    /// Per-port buffer, bytes (ignored when `shared_buffer_bytes` is set).
    #[serde(default = "default_buffer")]
    pub buffer_bytes: u64,
    /// Shared buffer per switch, bytes (dynamic threshold).
    #[serde(default)]
    pub shared_buffer_bytes: u64,
    /// Dynamic-threshold alpha.
    #[serde(default = "one_f")]
    pub alpha: f64,
    /// ECN Kmin, bytes (0 with kmax 0: no ECN).
    #[serde(default)]
    pub ecn_kmin_bytes: u64,
    /// ECN Kmax, bytes.
    #[serde(default)]
    pub ecn_kmax_bytes: u64,
    /// ECN Pmax.
    #[serde(default = "one_f")]
    pub ecn_pmax: f64,
    /// PFC on the data priority.
    #[serde(default)]
    pub pfc: bool,
    /// PFC XOFF per ingress port, bytes.
    #[serde(default = "default_xoff")]
    pub pfc_xoff_bytes: u64,
    /// PFC XON, bytes.
    #[serde(default = "default_xon")]
    pub pfc_xon_bytes: u64,
    /// PFC headroom per ingress port, bytes (absent: computed per ingress
    /// from its link's rate and delay and the MTU, the standard formula).
    #[serde(default)]
    pub pfc_headroom_bytes: Option<u64>,
    /// Trim instead of drop.
    #[serde(default)]
    pub trimming: bool,
    /// `ecmp` or `adaptive`.
    #[serde(default = "default_routing")]
    pub routing: String,
    /// Random loss per packet per link (a route of n links loses
    /// 1 - (1 - loss)^n of its packets).
    #[serde(default)]
    pub loss: f64,
    /// Random loss per packet end to end, the same for every route (drawn
    /// once per packet, data and ACKs alike, as it reaches its host).
    #[serde(default)]
    pub loss_e2e: f64,
    /// Routing re-convergence delay after a link or switch failure or
    /// recovery, µs (absent: switches avoid only their own dead ports).
    #[serde(default)]
    pub reconverge_us: Option<f64>,
}

fn default_buffer() -> u64 {
    1 << 20
}
fn one_f() -> f64 {
    1.0
}
fn default_xoff() -> u64 {
    64 << 10
}
fn default_xon() -> u64 {
    32 << 10
}
fn default_routing() -> String {
    "ecmp".into()
}

impl Default for SwitchConf {
    fn default() -> Self {
        toml::from_str("").expect("defaults")
    }
}

/// Host transport.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TransportConf {
    /// `metaroce`, or a baseline: `rocev2`, `irn`, `ib` (see docs/baselines.md).
    #[serde(default = "default_transport")]
    pub kind: String,
    /// Baselines: QPs per flow (QP scaling; each QP hashes to its own path).
    #[serde(default = "one_u32")]
    pub qps: u32,
    /// Baselines `rocev2` and `irn`: DCQCN rate control on.
    #[serde(default = "yes")]
    pub dcqcn: bool,
    /// Paths per connection; absent: [`PATHS_PER_PLANE`] on each plane of
    /// the topology for each [`PATHS_LINE_STEP_GBPS`] of line (see
    /// [`Scenario::paths_per_connection`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<usize>,
    /// Payload bytes per packet.
    #[serde(default = "default_mtu")]
    pub mtu_bytes: u32,
    /// Minimum RTO, µs.
    #[serde(default)]
    pub rto_min_us: f64,
    /// MetaRoCE hosts' UDP device port (paths send from the ports above
    /// it); absent: MetaRoCE's default, 4793. It enters every ECMP hash,
    /// and captures show it (the dissector's port preference follows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_port: Option<u16>,
    /// Every other key: a tunable of one of the transports, by name
    /// (`transport::knobs`; e.g. `ack_delay_ns`, `ecn_gain`,
    /// `dcqcn_timer_us`, `ib_credit_bytes`). Checked when the file is read.
    #[serde(flatten)]
    pub knobs: std::collections::BTreeMap<String, toml::Value>,
}

impl TransportConf {
    /// The tunables as numbers (in key order); non-numeric values were
    /// refused when the file was read.
    pub fn knob_values(&self) -> Vec<(String, f64)> {
        self.knobs
            .iter()
            .filter_map(|(k, v)| knob_number(v).map(|n| (k.clone(), n)))
            .collect()
    }
}

fn knob_number(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        _ => None,
    }
}

fn yes() -> bool {
    true
}
fn ten() -> u32 {
    10
}
fn default_interval() -> f64 {
    20.0
}
fn default_order() -> String {
    "rank".into()
}
fn default_step_trigger() -> String {
    "received".into()
}
fn default_algorithm() -> String {
    "auto".into()
}
fn default_transport() -> String {
    "metaroce".into()
}
/// MetaRoCE's default paths per connection on each plane of a 100 Gb/s
/// NIC: enough that a spraying connection fills the parallel uplinks of
/// a plane. Planes multiply the routes, so a multi-plane NIC gets this
/// many per plane (a NIC picks a packet's plane from its source port,
/// `host.rs`), and so does each further 100 Gb/s of line
/// ([`PATHS_LINE_STEP_GBPS`]).
pub const PATHS_PER_PLANE: usize = 16;

/// Each step of this much line rate (Gb/s, rounded up) adds
/// [`PATHS_PER_PLANE`] paths on each plane, so a path keeps the same share
/// of the line, two to three packets per base round trip of a three-tier
/// fabric, and a collision on one hashed route holds the same share of a
/// flow whatever the line. With 16 paths at 400 Gb/s each path carried
/// ten packets per round trip: the 1,024-host permutation at 400 Gb/s
/// (`scenarios/claims/ft1024-perm-400g.toml`, seeds 1-3) took 239 µs
/// with 16 paths, 217 with 32, 212 with 64 and 207 with 128 (whose one
/// packet per path and round trip set off 2,400 tail-loss probes for
/// nothing). Transport spec §5.
pub const PATHS_LINE_STEP_GBPS: u64 = 100;
fn default_mtu() -> u32 {
    4096
}

impl Default for TransportConf {
    fn default() -> Self {
        toml::from_str("").expect("defaults")
    }
}

/// One traffic source.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConf {
    /// `permutation`, `incast`, `all_to_all`, `ring_allreduce`, `collective`,
    /// `probes`, `cm`, `csv`, `background`.
    pub kind: String,
    /// Bytes per flow (all-reduce: the buffer size).
    #[serde(default)]
    pub bytes: u64,
    /// Start time, µs.
    #[serde(default)]
    pub start_us: f64,
    /// Name in reports (default: the kind and its size, e.g. `permutation 128`).
    #[serde(default)]
    pub name: Option<String>,
    /// Hosts taking part, in order (see [`crate::hostset`]; default all).
    #[serde(default)]
    pub hosts: Option<HostSetConf>,
    /// Hosts taking part: the first N of `hosts` (default all of them).
    #[serde(default)]
    pub ranks: u32,
    /// Collectives: ranks in `"rank"` order (the order of `hosts`) or a
    /// seeded `"random"` order (htsim's all-reduce generator).
    #[serde(default = "default_order")]
    pub order: String,
    /// Collectives: a dependency on a received message is met when the
    /// message was `"received"` (the library's data dependency) or when its
    /// sender had it acknowledged, `"sent"` (htsim's generator).
    #[serde(default = "default_step_trigger")]
    pub step_trigger: String,
    /// `collective`: which one, by nccl-tests' name (`all_reduce`,
    /// `all_gather`, `reduce_scatter`, `alltoall`, `broadcast`, `reduce`,
    /// `sendrecv`).
    #[serde(default)]
    pub collective: String,
    /// `collective`: the library's algorithm (`auto`, `ring`, `tree`,
    /// `rd`, `hd`, `direct`).
    #[serde(default = "default_algorithm")]
    pub algorithm: String,
    /// `collective` broadcast and reduce: the root, a position in the ranks.
    #[serde(default)]
    pub root: u32,
    /// Collectives: bytes per pipelined chunk (0: the library's default,
    /// its 256 KiB staging slot).
    #[serde(default)]
    pub chunk_bytes: u64,
    /// Collectives: staging slots per peer, the messages in flight on one
    /// connection (0: the library's default, 4).
    #[serde(default)]
    pub slots: u32,
    /// Incast senders: the first N of `hosts` other than the receiver
    /// (default all of them).
    #[serde(default)]
    pub senders: u32,
    /// Incast receiver.
    #[serde(default)]
    pub receiver: u32,
    /// All-to-all: one peer at a time.
    #[serde(default)]
    pub serial: bool,
    /// `cm`/`csv`: the file (relative to the scenario file).
    #[serde(default)]
    pub file: String,
    /// Background: offered load per host (0..1).
    #[serde(default)]
    pub load: f64,
    /// Background: stop generating at, µs.
    #[serde(default)]
    pub until_us: f64,
    /// Probes: message sizes, bytes (each size its own group).
    #[serde(default)]
    pub sizes: Vec<u64>,
    /// Probes: messages of each size per pair.
    #[serde(default = "ten")]
    pub count: u32,
    /// Probes: time between two probes of a pair, µs.
    #[serde(default = "default_interval")]
    pub interval_us: f64,
}

/// A failure (and optional recovery).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FailureConf {
    /// When it fails, µs.
    pub at_us: f64,
    /// When it recovers, µs (never if absent).
    #[serde(default)]
    pub up_at_us: Option<f64>,
    /// A link by its two ends, e.g. `["tor0", "agg1"]`.
    #[serde(default)]
    pub link: Vec<String>,
    /// A whole switch, e.g. `"core3"`.
    #[serde(default)]
    pub switch: String,
    /// A whole plane of a multi-plane fabric (every switch in it, with its
    /// host links), by index.
    #[serde(default)]
    pub plane: Option<u32>,
}

/// A link direction to watch bin by bin (utilisation, queue, drops in
/// `timeseries.json`): both directions of the link between two nodes.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorConf {
    /// The link by its two ends, e.g. `["tor0", "agg1"]`.
    pub link: Vec<String>,
}

/// What a failure takes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureTarget {
    /// The link between two nodes.
    Link(NodeRef, NodeRef),
    /// A switch.
    Switch(u32),
    /// A plane.
    Plane(u32),
}

/// A failure as the simulator schedules it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureSpec {
    /// What fails.
    pub target: FailureTarget,
    /// When.
    pub at: Ps,
    /// When it comes back, if it does.
    pub up_at: Option<Ps>,
}

/// Everything a run needs, built from a [`Scenario`].
#[derive(Debug, Clone)]
pub struct Built {
    /// Fabric.
    pub topo: Topology,
    /// Switch config.
    pub fabric: FabricConfig,
    /// Flows.
    pub flows: FlowSet,
    /// Failures.
    pub failures: Vec<FailureSpec>,
    /// Links watched (both directions of each).
    pub monitors: Vec<(NodeRef, NodeRef)>,
    /// End of the run.
    pub end_ps: Ps,
}

fn line_of(text: &str, key: &str) -> usize {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    text.lines()
        .position(|l| {
            let l = l.trim_start();
            l.strip_prefix(leaf)
                .is_some_and(|r| r.trim_start().starts_with('='))
        })
        .map_or(1, |i| i + 1)
}

/// The line of `key` inside the `index`-th `[[table]]` of `text` (the
/// table's header line if the key is not written there).
fn line_in_table(text: &str, table: &str, index: usize, key: &str) -> usize {
    let header = format!("[[{table}]]");
    let mut seen = 0;
    let mut start = None;
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if t == header {
            if seen == index {
                start = Some(i);
            } else if start.is_some() {
                break;
            }
            seen += 1;
        } else if let Some(from) = start {
            if t.starts_with('[') {
                return from + 1;
            }
            if t.strip_prefix(key)
                .is_some_and(|r| r.trim_start().starts_with('='))
            {
                return i + 1;
            }
        }
    }
    start.map_or(1, |i| i + 1)
}

/// The library collective a `ring_allreduce` or `collective` workload
/// runs (`ring_allreduce` is the all-reduce with the ring algorithm); a bad
/// key gives `(key, why)`.
fn collective_workload(w: &WorkloadConf) -> Result<CollectiveWorkload, (&'static str, String)> {
    let step = if w.step_trigger == "sent" {
        StepTrigger::Sent
    } else {
        StepTrigger::Received
    };
    let mut c = CollectiveWorkload::ring_allreduce(w.bytes, step);
    if w.kind == "collective" {
        c.collective = w.collective.parse().map_err(|_| {
            (
                "collective",
                format!(
                    "unknown collective '{}' (all_reduce, all_gather, reduce_scatter, alltoall, broadcast, reduce or sendrecv)",
                    w.collective
                ),
            )
        })?;
        c.algorithm = w
            .algorithm
            .parse()
            .map_err(|err: metaroce_coll::SpecError| ("algorithm", err.to_string()))?;
        c.root = w.root;
    } else if !w.collective.is_empty() || w.algorithm != "auto" || w.root != 0 {
        return Err((
            "kind",
            "ring_allreduce is the ring all-reduce; collective, algorithm and root need kind = \"collective\"".into(),
        ));
    }
    c.chunk_bytes = (w.chunk_bytes > 0).then_some(w.chunk_bytes);
    c.slots = (w.slots > 0).then_some(w.slots);
    Ok(c)
}

/// The hosts and roles a workload of `w` runs on, out of `hosts`.
struct Placement {
    /// The hosts, in order (incast: the senders).
    hosts: Vec<u32>,
}

fn place(w: &WorkloadConf, hosts: u32, seed: u64) -> Result<Placement, (&'static str, String)> {
    let mut set = match &w.hosts {
        Some(h) => h.resolve(hosts, seed).map_err(|e| ("hosts", e))?,
        None => (0..hosts).collect(),
    };
    if w.kind == "incast" {
        if w.receiver >= hosts {
            return Err((
                "receiver",
                format!("host {} is beyond the topology's {hosts} hosts", w.receiver),
            ));
        }
        set.retain(|&h| h != w.receiver);
        if w.senders > 0 {
            if w.senders as usize > set.len() {
                return Err((
                    "senders",
                    format!(
                        "{} senders, but only {} hosts besides the receiver",
                        w.senders,
                        set.len()
                    ),
                ));
            }
            set.truncate(w.senders as usize);
        }
    } else if w.ranks > 0 {
        if w.ranks as usize > set.len() {
            return Err((
                "ranks",
                format!(
                    "{} ranks, but the workload has {} hosts",
                    w.ranks,
                    set.len()
                ),
            ));
        }
        set.truncate(w.ranks as usize);
    }
    let needs_two = matches!(
        w.kind.as_str(),
        "permutation" | "all_to_all" | "ring_allreduce" | "collective" | "background" | "probes"
    );
    if needs_two && set.len() < 2 || w.kind == "incast" && set.is_empty() {
        return Err((
            "hosts",
            format!(
                "{} needs at least 2 hosts, has {}",
                w.kind,
                set.len() + usize::from(w.kind == "incast")
            ),
        ));
    }
    if matches!(w.kind.as_str(), "ring_allreduce" | "collective") && w.order == "random" {
        set = shuffled(&set, seed);
    }
    Ok(Placement { hosts: set })
}

impl Scenario {
    /// MetaRoCE's paths per connection: `transport.paths`, or
    /// [`PATHS_PER_PLANE`] times the planes and the steps of
    /// [`PATHS_LINE_STEP_GBPS`] in the host's line (at most 256).
    pub fn paths_per_connection(&self) -> usize {
        self.transport.paths.unwrap_or_else(|| {
            // A line is 1..=1,600 Gb/s (checked when read): 1..=16 steps.
            let steps = self
                .topology
                .link_gbps
                .div_ceil(PATHS_LINE_STEP_GBPS)
                .clamp(1, 16) as usize;
            (PATHS_PER_PLANE * self.topology.planes.max(1) as usize * steps).min(256)
        })
    }

    /// Hosts the topology will have (without building it).
    pub fn host_count(&self) -> u32 {
        let t = &self.topology;
        match t.kind.as_str() {
            "rail" => t.servers.saturating_mul(t.rails),
            "back_to_back" => 2,
            _ => t.hosts,
        }
    }

    /// The seed a workload's random choices use.
    fn workload_seed(seed: u64, i: usize) -> u64 {
        seed.wrapping_add(i as u64 * 0x1000_0001)
    }

    /// Parse `text`; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, SimError> {
        let mut s: Self = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(1, |sp| {
                text[..sp.start.min(text.len())].matches('\n').count() + 1
            });
            let msg = e.message().replace('\n', " ");
            SimError::Scenario(format!("{origin}:{line}: {msg}"))
        })?;
        s.validate(text, origin)?;
        s.base_dir = Path::new(origin)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Ok(s)
    }

    /// Read and parse a file.
    pub fn load(path: &Path) -> Result<Self, SimError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SimError::Scenario(format!("{}: {e}", path.display())))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The embedded default.
    pub fn default_scenario() -> Self {
        Self::parse(DEFAULT_SCENARIO, "default.toml")
            .expect("the embedded default scenario is valid")
    }

    fn validate(&self, text: &str, origin: &str) -> Result<(), SimError> {
        let bad = |key: &str, why: &str| {
            Err(SimError::Scenario(format!(
                "{origin}:{}: {key}: {why}",
                line_of(text, key)
            )))
        };
        let t = &self.topology;
        if !["fat_tree", "leaf_spine", "rail", "star", "back_to_back"].contains(&t.kind.as_str()) {
            return bad(
                "topology.kind",
                "must be fat_tree, leaf_spine, rail, star or back_to_back",
            );
        }
        if t.kind == "rail" {
            if t.servers == 0 || t.rails == 0 || t.hosts_per_leaf == 0 {
                return bad(
                    "topology.servers",
                    "rail needs servers, rails and hosts_per_leaf (servers per leaf)",
                );
            }
        } else if t.kind != "back_to_back" && t.hosts < 2 {
            return bad("topology.hosts", "must be at least 2");
        }
        if t.kind == "leaf_spine" && t.hosts_per_leaf == 0 {
            return bad("topology.hosts_per_leaf", "must be at least 1");
        }
        if t.link_gbps == 0 || t.link_gbps > 1600 {
            return bad("topology.link_gbps", "must be 1..=1600");
        }
        if t.planes == 0 || t.planes > 16 {
            return bad("topology.planes", "must be 1..=16");
        }
        if !(1..=MAX_OVERSUBSCRIPTION).contains(&t.oversubscription) {
            return bad(
                "topology.oversubscription",
                &format!("must be 1..={MAX_OVERSUBSCRIPTION}"),
            );
        }
        if t.k % 2 == 1 {
            return bad("topology.k", "must be even");
        }
        // Bound the fabric before anything is allocated for it.
        let hosts = match t.kind.as_str() {
            "rail" => u64::from(t.servers) * u64::from(t.rails),
            "back_to_back" => 2,
            _ => u64::from(t.hosts),
        };
        if hosts > MAX_HOSTS {
            let key = if t.kind == "rail" {
                "topology.servers"
            } else {
                "topology.hosts"
            };
            return bad(
                key,
                &format!("{hosts} hosts is more than the simulator's limit of 2^20 = {MAX_HOSTS}"),
            );
        }
        if t.kind == "fat_tree"
            && t.k > 0
            && !Topology::fat_tree_holds(t.k, t.oversubscription, t.hosts)
        {
            return bad(
                "topology.k",
                &format!("k={} holds fewer than {} hosts", t.k, t.hosts),
            );
        }
        let size = t.size();
        let need = size.estimated_bytes();
        if need > MAX_FABRIC_BYTES {
            return bad(
                "topology",
                &format!(
                    "{} hosts, {} switches and {} links would need about {} of memory; the limit is {} (see docs/scenario.md)",
                    size.hosts,
                    size.switches,
                    size.links,
                    human_bytes(need),
                    human_bytes(MAX_FABRIC_BYTES)
                ),
            );
        }
        let sw = &self.switch;
        if !["ecmp", "adaptive"].contains(&sw.routing.as_str()) {
            return bad("switch.routing", "must be ecmp or adaptive");
        }
        if !(0.0..1.0).contains(&sw.loss) {
            return bad("switch.loss", "must be in [0, 1)");
        }
        if !(0.0..1.0).contains(&sw.loss_e2e) {
            return bad("switch.loss_e2e", "must be in [0, 1)");
        }
        if sw
            .reconverge_us
            .is_some_and(|d| !(d >= 0.0 && d.is_finite()))
        {
            return bad("switch.reconverge_us", "must be a finite time >= 0");
        }
        if sw.ecn_kmax_bytes < sw.ecn_kmin_bytes {
            return bad("switch.ecn_kmax_bytes", "must be >= ecn_kmin_bytes");
        }
        if !(0.0..=1.0).contains(&sw.ecn_pmax) {
            return bad("switch.ecn_pmax", "must be in [0, 1]");
        }
        if sw.pfc && sw.pfc_xon_bytes > sw.pfc_xoff_bytes {
            return bad("switch.pfc_xon_bytes", "must be <= pfc_xoff_bytes");
        }
        if !TRANSPORTS.contains(&self.transport.kind.as_str()) {
            return bad("transport.kind", "must be metaroce, rocev2, irn or ib");
        }
        if !(1..=256).contains(&self.transport.qps) {
            return bad("transport.qps", "must be 1..=256");
        }
        if self
            .transport
            .paths
            .is_some_and(|p| !(1..=256).contains(&p))
        {
            return bad("transport.paths", "must be 1..=256");
        }
        for (name, value) in &self.transport.knobs {
            let key = format!("transport.{name}");
            let Some(n) = knob_number(value) else {
                return bad(&key, "must be a number");
            };
            if let Err(why) = crate::transport::knobs::check(name, n) {
                return bad(&key, &why);
            }
        }
        {
            // Settings that must agree with each other (rto_min <= rto_max...).
            let mut ep = metaroce_proto::EndpointConfig::default();
            let values = self.transport.knob_values();
            crate::transport::knobs::apply_all(
                metaroce_proto::EndpointConfig::KNOBS,
                &mut ep,
                &values,
            );
            ep.path_port_span = ep.path_port_span.max(ep.paths_per_connection as u16);
            if let Err(e) = ep.validate() {
                return bad(&format!("transport.{}", e.field), e.reason);
            }
            if let Some(port) = self.transport.device_port {
                // The hosts draw paths from the span above the port (at
                // least two ports per path: see MetaRoceFactory::host).
                let paths = values
                    .iter()
                    .find(|(k, _)| k == "paths_per_connection")
                    .map_or(self.paths_per_connection(), |(_, v)| *v as usize);
                let span = u32::from(ep.path_port_span).max(2 * paths as u32);
                if port == 0 || u32::from(port) + span > u32::from(u16::MAX) {
                    return bad(
                        "transport.device_port",
                        &format!(
                            "must be 1..={}: the {span} path ports above it must fit in a UDP port",
                            u32::from(u16::MAX) - span
                        ),
                    );
                }
            }
        }
        let positive = |t: f64| t > 0.0 && t.is_finite();
        if !positive(self.end_us) || !positive(self.sample_us) {
            return bad("end_us", "end_us and sample_us must be finite and > 0");
        }
        if self.end_us / self.sample_us > MAX_SAMPLE_BINS {
            return bad(
                "sample_us",
                &format!(
                    "end_us / sample_us = {:.0} time-series bins; at most {MAX_SAMPLE_BINS:.0} (raise sample_us)",
                    self.end_us / self.sample_us
                ),
            );
        }
        if !(64..=65_000).contains(&self.transport.mtu_bytes) {
            return bad("transport.mtu_bytes", "must be 64..=65000");
        }
        for w in &self.workload {
            let kinds = [
                "permutation",
                "incast",
                "all_to_all",
                "ring_allreduce",
                "collective",
                "cm",
                "csv",
                "background",
                "probes",
            ];
            if !kinds.contains(&w.kind.as_str()) {
                return bad("kind", &format!("unknown workload kind '{}'", w.kind));
            }
            if matches!(w.kind.as_str(), "cm" | "csv") && w.file.is_empty() {
                return bad("file", "cm and csv workloads need a file");
            }
            if w.kind == "probes" {
                if w.sizes.is_empty() || w.sizes.contains(&0) {
                    return bad("sizes", "probes need sizes, each > 0 bytes");
                }
                if w.count == 0 || w.interval_us.is_nan() || w.interval_us <= 0.0 {
                    return bad("count", "probes need count >= 1 and interval_us > 0");
                }
                continue;
            }
            if !matches!(w.kind.as_str(), "cm" | "csv") && w.bytes == 0 {
                return bad("bytes", &format!("{} workload needs bytes > 0", w.kind));
            }
        }
        let hosts = self.host_count();
        for (i, w) in self.workload.iter().enumerate() {
            let at = |key: &str, why: String| {
                Err(SimError::Scenario(format!(
                    "{origin}:{}: workload.{key}: {why}",
                    line_in_table(text, "workload", i, key)
                )))
            };
            if !["rank", "random"].contains(&w.order.as_str()) {
                return at("order", "must be rank or random".into());
            }
            if !["received", "sent"].contains(&w.step_trigger.as_str()) {
                return at("step_trigger", "must be received or sent".into());
            }
            if matches!(w.kind.as_str(), "cm" | "csv") {
                continue;
            }
            let placed = match place(w, hosts, Self::workload_seed(self.seed, i)) {
                Ok(p) => p,
                Err((key, why)) => return at(key, why),
            };
            if matches!(w.kind.as_str(), "ring_allreduce" | "collective") {
                let c = match collective_workload(w) {
                    Ok(c) => c,
                    Err((key, why)) => return at(key, why),
                };
                if let Err(why) = c.check(placed.hosts.len() as u32) {
                    let key = match why {
                        metaroce_coll::SpecError::UnsupportedAlgorithm { .. } => "algorithm",
                        metaroce_coll::SpecError::Config(_) => "slots",
                        metaroce_coll::SpecError::Invalid(_) if w.root > 0 => "root",
                        metaroce_coll::SpecError::Invalid(_) => "bytes",
                    };
                    return at(key, why.to_string());
                }
            }
        }
        Ok(())
    }

    /// Build the topology, switch config, flows and failures.
    pub fn build(&self, seed: u64) -> Result<Built, SimError> {
        let t = &self.topology;
        let e = SimError::Scenario;
        let lp = LinkParams {
            host_bps: t.link_gbps * 1_000_000_000,
            fabric_bps: if t.fabric_gbps == 0 {
                t.link_gbps
            } else {
                t.fabric_gbps
            } * 1_000_000_000,
            delay_ps: t.latency_ns * PS_PER_NS,
        };
        let topo = match t.kind.as_str() {
            "fat_tree" => {
                Topology::fat_tree(t.hosts, t.fat_tree_k(), t.oversubscription, t.planes, lp)
            }
            "leaf_spine" => Topology::leaf_spine(
                t.hosts,
                t.hosts_per_leaf,
                t.spines_or_default(),
                1,
                t.planes,
                lp,
            ),
            "rail" => Topology::rail(
                t.servers,
                t.rails,
                t.hosts_per_leaf,
                t.spines_or_default(),
                t.planes,
                lp,
            ),
            "star" => Topology::leaf_spine(t.hosts, t.hosts, 0, 1, t.planes, lp),
            _ => Topology::back_to_back(lp),
        };
        let sw = &self.switch;
        let fabric = FabricConfig {
            buffer: if sw.shared_buffer_bytes > 0 {
                BufferModel::Shared {
                    bytes: sw.shared_buffer_bytes,
                    alpha: sw.alpha,
                }
            } else {
                BufferModel::PerPort {
                    bytes: sw.buffer_bytes,
                }
            },
            ecn: (sw.ecn_kmax_bytes > 0).then_some(EcnConfig {
                kmin_bytes: sw.ecn_kmin_bytes,
                kmax_bytes: sw.ecn_kmax_bytes,
                pmax: sw.ecn_pmax,
            }),
            pfc: sw.pfc.then_some(PfcConfig {
                xoff_bytes: sw.pfc_xoff_bytes,
                xon_bytes: sw.pfc_xon_bytes,
                headroom_bytes: sw.pfc_headroom_bytes,
                max_frame_bytes: self.transport.mtu_bytes + crate::transport::MAX_HEADER_BYTES,
            }),
            trimming: sw.trimming,
            routing: if sw.routing == "adaptive" {
                Routing::Adaptive
            } else {
                Routing::Ecmp
            },
            loss: sw.loss,
            loss_e2e: sw.loss_e2e,
            sample_ps: us_to_ps(self.sample_us),
            nic_queue_packets: 2,
            reconverge_ps: sw.reconverge_us.map(us_to_ps),
        };
        let hosts = topo.hosts;
        let mut flows = FlowSet::default();
        for (i, w) in self.workload.iter().enumerate() {
            let start = us_to_ps(w.start_us);
            let wseed = Self::workload_seed(seed, i);
            let placed = if matches!(w.kind.as_str(), "cm" | "csv") {
                Vec::new()
            } else {
                place(w, hosts, wseed)
                    .map_err(|(key, why)| e(format!("workload {i}: {key}: {why}")))?
                    .hosts
            };
            let name = w.name.as_deref();
            match w.kind.as_str() {
                "permutation" => flows.permutation(&placed, w.bytes, start, wseed, name),
                "incast" => flows.incast(&placed, w.receiver, w.bytes, start, name),
                "all_to_all" => flows.all_to_all(&placed, w.bytes, start, w.serial, name),
                "probes" => flows.probes(
                    &placed,
                    &w.sizes,
                    w.count,
                    us_to_ps(w.interval_us),
                    start,
                    name,
                ),
                "ring_allreduce" | "collective" => {
                    let c = collective_workload(w)
                        .map_err(|(key, why)| e(format!("workload {i}: {key}: {why}")))?;
                    flows
                        .collective(&placed, &c, start, name)
                        .map_err(|err| e(format!("workload {i}: {err}")))?;
                }
                "background" => {
                    let until = if w.until_us > 0.0 {
                        w.until_us
                    } else {
                        self.end_us
                    };
                    flows.background(
                        &placed,
                        w.load,
                        topo.host_rate_bps * u64::from(topo.planes),
                        w.bytes,
                        start,
                        us_to_ps(until),
                        wseed,
                    );
                }
                kind => {
                    let path = self.base_dir.join(&w.file);
                    let text = std::fs::read_to_string(&path)
                        .map_err(|err| e(format!("{}: {err}", path.display())))?;
                    let r = if kind == "cm" {
                        flows.from_cm(&text, hosts)
                    } else {
                        flows.from_csv(&text, hosts)
                    };
                    // `file:line: problem`, as for the scenario file itself.
                    r.map_err(|err| match err {
                        SimError::FlowFileLine { line, problem } => {
                            e(format!("{}:{line}: {problem}", path.display()))
                        }
                        other => other,
                    })?;
                }
            }
        }
        let mut failures = Vec::new();
        for f in &self.failure {
            let at = us_to_ps(f.at_us);
            let up_at = f.up_at_us.map(us_to_ps);
            let target = if let Some(p) = f.plane {
                if p >= topo.planes {
                    return Err(e(format!(
                        "failure.plane: no plane {p} (the topology has {})",
                        topo.planes
                    )));
                }
                FailureTarget::Plane(p)
            } else if !f.switch.is_empty() {
                let Some(NodeRef::Switch(s)) = topo.find_node(&f.switch) else {
                    return Err(e(format!("failure.switch: no switch named '{}'", f.switch)));
                };
                FailureTarget::Switch(s)
            } else if f.link.len() == 2 {
                let find = |n: &str| {
                    topo.find_node(n)
                        .ok_or_else(|| e(format!("failure.link: no node named '{n}'")))
                };
                FailureTarget::Link(find(&f.link[0])?, find(&f.link[1])?)
            } else {
                return Err(e(
                    "failure: give link = [a, b], switch = name or plane = index".into(),
                ));
            };
            failures.push(FailureSpec { target, at, up_at });
        }
        let mut monitors = Vec::new();
        for m in &self.monitor {
            if m.link.len() != 2 {
                return Err(e(
                    "monitor.link: give the link's two ends, e.g. [\"tor0\", \"agg1\"]".into(),
                ));
            }
            let find = |n: &str| {
                topo.find_node(n)
                    .ok_or_else(|| e(format!("monitor.link: no node named '{n}'")))
            };
            monitors.push((find(&m.link[0])?, find(&m.link[1])?));
        }
        Ok(Built {
            topo,
            fabric,
            flows,
            failures,
            monitors,
            end_ps: us_to_ps(self.end_us),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_scenario_parses() {
        let s = Scenario::default_scenario();
        assert!(!s.workload.is_empty());
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text =
            "name = \"x\"\n[topology]\nkind = \"star\"\nhosts = 4\nlink_gbps = 100\nhostz = 3\n";
        let e = Scenario::parse(text, "x.toml").unwrap_err().to_string();
        assert!(e.starts_with("x.toml:6:"), "{e}");
        assert!(e.contains("hostz"), "{e}");
        assert!(!e.contains('\n'));
    }

    /// Huge fabrics are refused before anything is allocated, with the
    /// memory they would need.
    #[test]
    fn huge_fabrics_are_refused_with_their_memory() {
        let star = |hosts: u64| {
            format!("name = \"x\"\n[topology]\nkind = \"star\"\nhosts = {hosts}\nlink_gbps = 100\n")
        };
        let e = Scenario::parse(&star(4_000_000_000), "x.toml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "x.toml:4: topology.hosts: 4000000000 hosts is more than the simulator's limit of 2^20 = 1048576"
        );
        assert!(Scenario::parse(&star(1 << 20), "x.toml").is_ok());
        // Few hosts, but a fabric of 10^6 x 10^4 links.
        let wide = "name = \"x\"\n[topology]\nkind = \"leaf_spine\"\nhosts = 1000000\nhosts_per_leaf = 1\nspines = 10000\nlink_gbps = 100\n";
        let e = Scenario::parse(wide, "x.toml").unwrap_err().to_string();
        assert!(
            e.contains("10001000000 links would need about 4.7 TiB"),
            "{e}"
        );
        // Rail's servers x rails is checked without overflowing.
        let rail = "name = \"x\"\n[topology]\nkind = \"rail\"\nservers = 4000000000\nrails = 8\nhosts_per_leaf = 2\nlink_gbps = 100\n";
        let e = Scenario::parse(rail, "x.toml").unwrap_err().to_string();
        assert!(e.contains("32000000000 hosts"), "{e}");
        // A fat tree's explicit k, however large, is counted, not built.
        let ft = "name = \"x\"\n[topology]\nkind = \"fat_tree\"\nhosts = 16\nk = 2000000\nlink_gbps = 100\n";
        let e = Scenario::parse(ft, "x.toml").unwrap_err().to_string();
        assert!(e.contains("would need about"), "{e}");
    }

    #[test]
    fn bad_value_names_key_and_line() {
        let text = "name = \"x\"\n[topology]\nkind = \"star\"\nhosts = 4\nlink_gbps = 100\n[switch]\nrouting = \"spray\"\n";
        let e = Scenario::parse(text, "x.toml").unwrap_err().to_string();
        assert_eq!(e, "x.toml:7: switch.routing: must be ecmp or adaptive");
    }
}
