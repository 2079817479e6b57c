//! Configuration of the simulated network: links, routes and faults.

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// How the ECMP route ("lane") of a datagram is chosen among
/// [`NetConfig::routes_per_pair`] parallel routes.
#[derive(Debug, Clone, Copy, Default)]
pub enum RouteSelect {
    /// `route = src_port % routes_per_pair`, so a test can aim at a route by
    /// picking the UDP source port.
    #[default]
    PortModulo,
    /// A fixed (seed-independent) mixing function of the UDP 5-tuple.
    Hash,
    /// A user function `(src, dst, routes_per_pair) -> route`; the result is
    /// reduced modulo `routes_per_pair`.
    Custom(fn(SocketAddr, SocketAddr, usize) -> usize),
}

/// Port and path parameters. The port knobs (`rate_bps`, buffers, ECN
/// threshold, overhead) describe a node's egress port (NIC uplink) and its
/// ingress port (ToR downlink toward the node). The path knobs (`delay_ns`,
/// `jitter_ns`, `jitter_period_ns`) describe the routes between nodes and are
/// always taken from [`NetConfig::link`] (per-node overrides only affect the
/// port knobs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkConfig {
    /// Line rate of both ports, bits per second. Default 100 Gbit/s.
    pub rate_bps: u64,
    /// One-way propagation delay of every route, ns. Default 2_000.
    pub delay_ns: u64,
    /// Maximum extra per-route delay, ns. Each route has its own offset drawn
    /// (from the seed) uniformly in `[0, jitter_ns]`, re-drawn every
    /// `jitter_period_ns`. Default 0.
    pub jitter_ns: u64,
    /// How often route jitter offsets are re-drawn, ns (0 = never: one
    /// offset per route for the whole run). Default 50_000.
    pub jitter_period_ns: u64,
    /// Egress (NIC) buffer, bytes; tail drop above it. Default 1 MiB.
    pub egress_buffer_bytes: u64,
    /// Ingress (ToR downlink) buffer, bytes; tail drop above it. Default 1 MiB.
    pub ingress_buffer_bytes: u64,
    /// ECT(0) datagrams are marked CE when a port's queue (bytes already
    /// queued when the datagram arrives) exceeds this. `None` = never mark.
    /// Default 100 KiB.
    pub ecn_threshold_bytes: Option<u64>,
    /// Whether the egress (NIC) port marks too. A NIC does not ECN-mark its
    /// own transmit queue, so the default is false: only the ToR downlink
    /// (ingress port) marks, as in a real fabric.
    pub egress_ecn_marking: bool,
    /// Bytes added to every payload for serialization and queue accounting
    /// (e.g. 42 for Ethernet+IPv4+UDP headers). Default 0, so timing is
    /// `payload.len() * 8 / rate`.
    pub overhead_bytes: u64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            rate_bps: 100_000_000_000,
            delay_ns: 2_000,
            jitter_ns: 0,
            jitter_period_ns: 50_000,
            egress_buffer_bytes: 1 << 20,
            ingress_buffer_bytes: 1 << 20,
            ecn_threshold_bytes: Some(100 << 10),
            egress_ecn_marking: false,
            overhead_bytes: 0,
        }
    }
}

impl LinkConfig {
    /// Serialization time of `bytes` payload bytes (plus overhead), rounded up.
    pub fn serialization_ns(&self, bytes: usize) -> u64 {
        let bits = (bytes as u128 + u128::from(self.overhead_bytes)) * 8;
        let rate = u128::from(self.rate_bps.max(1));
        let ns = (bits * 1_000_000_000).div_ceil(rate);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// Which datagrams the random faults (loss, burst loss, duplicate, corrupt,
/// reorder) apply to. Default: everything, both directions.
///
/// Blackholes and link-down ignore the scope unless
/// [`FaultScope::blackholes_obey_scope`] is set; queue tail drops and ECN
/// marking never look at it.
#[derive(Debug, Clone, Default)]
pub struct FaultScope {
    /// Only datagrams sent by these node indices (`None` = any sender).
    pub from_nodes: Option<Vec<usize>>,
    /// Only datagrams destined to these node indices (`None` = any receiver).
    pub to_nodes: Option<Vec<usize>>,
    /// Only datagrams whose payload satisfies this predicate (`None` = all),
    /// e.g. `Some(|p| p[0] == DATA_OPCODE)` to hit data but not ACKs.
    pub payload_filter: Option<fn(&[u8]) -> bool>,
    /// If true, route blackholes also only drop datagrams in scope.
    pub blackholes_obey_scope: bool,
}

impl FaultScope {
    /// Whether a datagram from `src` to `dst` with `payload` is in scope.
    pub fn matches(&self, src: usize, dst: usize, payload: &[u8]) -> bool {
        self.from_nodes.as_ref().is_none_or(|v| v.contains(&src))
            && self.to_nodes.as_ref().is_none_or(|v| v.contains(&dst))
            && self.payload_filter.is_none_or(|f| f(payload))
    }
}

/// Random faults, applied per datagram in the route (after the egress queue).
/// All probabilities are in `[0, 1]`; all draws come from the network's
/// single seeded ChaCha8 generator.
#[derive(Debug, Clone)]
pub struct FaultConfig {
    /// Uniform random drop probability.
    pub loss: f64,
    /// Gilbert-Elliott: probability (per datagram on a route) of a route
    /// entering its bad state. 0 disables burst loss. Default 0.
    pub burst_enter: f64,
    /// Gilbert-Elliott: probability (per datagram) of leaving the bad state.
    /// Default 0.25 (mean burst ~4 datagrams).
    pub burst_exit: f64,
    /// Gilbert-Elliott: drop probability while in the bad state. Default 1.0.
    pub burst_loss: f64,
    /// Probability of delivering a second copy.
    pub duplicate: f64,
    /// The copy arrives `1..=duplicate_delay_ns` ns after the original.
    /// Default 1_000.
    pub duplicate_delay_ns: u64,
    /// Probability of flipping one random payload bit.
    pub corrupt: f64,
    /// Probability of intra-route reordering: the datagram gets an extra
    /// delay of `1..=reorder_delay_ns` and escapes the route's FIFO order.
    pub reorder: f64,
    /// Maximum extra delay of a reordered datagram. Default 10_000.
    pub reorder_delay_ns: u64,
    /// Which datagrams the faults above apply to.
    pub scope: FaultScope,
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            loss: 0.0,
            burst_enter: 0.0,
            burst_exit: 0.25,
            burst_loss: 1.0,
            duplicate: 0.0,
            duplicate_delay_ns: 1_000,
            corrupt: 0.0,
            reorder: 0.0,
            reorder_delay_ns: 10_000,
            scope: FaultScope::default(),
        }
    }
}

/// Whole-network configuration. Pub fields + `Default`, plus `with_*`
/// builder helpers.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Seed of every random choice (faults, jitter). Default 0.
    pub seed: u64,
    /// Number of parallel ECMP routes between each ordered pair of nodes.
    /// Default 16.
    pub routes_per_pair: usize,
    /// ECMP route selection. Default [`RouteSelect::PortModulo`].
    pub route_select: RouteSelect,
    /// Default link/port parameters for every node, and the route timing.
    pub link: LinkConfig,
    /// Per-node port overrides (node index -> link), for the port knobs only.
    pub node_links: BTreeMap<usize, LinkConfig>,
    /// Random faults.
    pub faults: FaultConfig,
    /// Livelock guard: a single `run_until` processes at most this many
    /// events. Default 50 million.
    pub max_events: u64,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            routes_per_pair: 16,
            route_select: RouteSelect::PortModulo,
            link: LinkConfig::default(),
            node_links: BTreeMap::new(),
            faults: FaultConfig::default(),
            max_events: 50_000_000,
        }
    }
}

impl NetConfig {
    /// Default config with the given seed.
    pub fn seeded(seed: u64) -> Self {
        Self {
            seed,
            ..Self::default()
        }
    }
    /// Set the seed.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Set the number of ECMP routes per pair (must be >= 1).
    #[must_use]
    pub fn with_routes(mut self, routes_per_pair: usize) -> Self {
        self.routes_per_pair = routes_per_pair;
        self
    }
    /// Set the route selection.
    #[must_use]
    pub fn with_route_select(mut self, route_select: RouteSelect) -> Self {
        self.route_select = route_select;
        self
    }
    /// Set the default link.
    #[must_use]
    pub fn with_link(mut self, link: LinkConfig) -> Self {
        self.link = link;
        self
    }
    /// Override the port knobs of one node.
    #[must_use]
    pub fn with_node_link(mut self, node: usize, link: LinkConfig) -> Self {
        self.node_links.insert(node, link);
        self
    }
    /// Set the faults.
    #[must_use]
    pub fn with_faults(mut self, faults: FaultConfig) -> Self {
        self.faults = faults;
        self
    }
    /// Set the event limit of one `run_until`.
    #[must_use]
    pub fn with_max_events(mut self, max_events: u64) -> Self {
        self.max_events = max_events;
        self
    }
    /// The link (port knobs) of `node`.
    pub fn node_link(&self, node: usize) -> &LinkConfig {
        self.node_links.get(&node).unwrap_or(&self.link)
    }
}
