//! Topology builders: leaf-spine, k-ary fat tree, rail-optimized, and the
//! small shapes unit tests use; each optionally replicated into planes.
//!
//! A topology is plain data: switches with their tier, links with rate and
//! delay, and where each host attaches. Routing needs no tables: a switch
//! sends a packet down if the destination is below it (one port, looked up
//! by the destination's key at that tier) and otherwise up, choosing among
//! its up-ports by ECMP hash or by load.

use crate::Ps;

/// Either end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRef {
    /// A host (NIC), by index.
    Host(u32),
    /// A switch, by index.
    Switch(u32),
}

/// One bidirectional link.
#[derive(Debug, Clone)]
pub struct LinkSpec {
    /// Lower end (host or lower-tier switch).
    pub a: NodeRef,
    /// Upper end.
    pub b: NodeRef,
    /// Rate in bit/s, each direction.
    pub rate_bps: u64,
    /// Propagation delay.
    pub delay_ps: Ps,
    /// Label (index into `Topology::labels`) of the a→b direction.
    pub label_up: u8,
    /// Label of the b→a direction.
    pub label_down: u8,
}

/// Where a switch sits and how it routes.
#[derive(Debug, Clone)]
pub struct SwitchSpec {
    /// Tier: 0 = ToR/leaf, 1 = aggregation (or spine in 2 tiers), 2 = core.
    pub tier: u8,
    /// Plane it belongs to.
    pub plane: u32,
    /// Pod (3-tier) or its own index (others).
    pub pod: u32,
    /// Index among the switches of its tier in its plane.
    pub index: u32,
    /// Whether this switch is at the top tier (never routes up).
    pub top: bool,
}

/// A fabric shape.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Short description.
    pub name: String,
    /// Hosts (NICs).
    pub hosts: u32,
    /// Planes (each its own copy of the switch fabric).
    pub planes: u32,
    /// 1 (single switch or back-to-back), 2 or 3.
    pub tiers: u8,
    /// Switches.
    pub switches: Vec<SwitchSpec>,
    /// Links; a host's links come in plane order.
    pub links: Vec<LinkSpec>,
    /// Per host: its leaf index within a plane.
    pub host_leaf: Vec<u32>,
    /// Per host: its pod.
    pub host_pod: Vec<u32>,
    /// Per host: its leaf's index within its pod.
    pub host_leaf_in_pod: Vec<u32>,
    /// Per host: its port number at its leaf (among the leaf's down ports).
    pub host_slot: Vec<u32>,
    /// Leaves per plane (switch index of leaf `l` in plane `p` is
    /// `plane_base[p] + l`).
    pub leaves_per_plane: u32,
    /// Leaves per pod (fat tree: k/2; others 1).
    pub leaves_per_pod: u32,
    /// First switch index of each plane.
    pub plane_base: Vec<u32>,
    /// Names of link directions ("host_up", "leaf_up", ...), for reports.
    pub labels: Vec<&'static str>,
    /// Links crossed by the longest host-to-host route.
    pub max_hops: u32,
    /// Host link rate (per plane), bit/s.
    pub host_rate_bps: u64,
    /// Per-hop propagation delay of host links.
    pub delay_ps: Ps,
}

/// Knobs common to every builder.
#[derive(Debug, Clone, Copy)]
pub struct LinkParams {
    /// Host link rate (per plane), bit/s.
    pub host_bps: u64,
    /// Switch-to-switch link rate, bit/s.
    pub fabric_bps: u64,
    /// Propagation delay per link.
    pub delay_ps: Ps,
}

const HOST_UP: u8 = 0;
const HOST_DOWN: u8 = 1;
const T1_UP: u8 = 2;
const T1_DOWN: u8 = 3;
const T2_UP: u8 = 4;
const T2_DOWN: u8 = 5;

fn labels(tiers: u8) -> Vec<&'static str> {
    match tiers {
        3 => vec![
            "host_up",
            "tor_down",
            "tor_up",
            "agg_down",
            "agg_up",
            "core_down",
        ],
        2 => vec!["host_up", "leaf_down", "leaf_up", "spine_down"],
        _ => vec!["host_up", "switch_down"],
    }
}

impl Topology {
    fn empty(name: String, hosts: u32, planes: u32, tiers: u8, lp: LinkParams) -> Self {
        Self {
            name,
            hosts,
            planes,
            tiers,
            switches: Vec::new(),
            links: Vec::new(),
            host_leaf: vec![0; hosts as usize],
            host_pod: vec![0; hosts as usize],
            host_leaf_in_pod: vec![0; hosts as usize],
            host_slot: vec![0; hosts as usize],
            leaves_per_plane: 0,
            leaves_per_pod: 1,
            plane_base: Vec::new(),
            labels: labels(tiers),
            max_hops: 0,
            host_rate_bps: lp.host_bps,
            delay_ps: lp.delay_ps,
        }
    }

    /// Two hosts joined by one link (no switch).
    pub fn back_to_back(lp: LinkParams) -> Self {
        let mut t = Self::empty("back-to-back".into(), 2, 1, 0, lp);
        t.labels = vec!["host_up", "host_down"];
        t.links.push(LinkSpec {
            a: NodeRef::Host(0),
            b: NodeRef::Host(1),
            rate_bps: lp.host_bps,
            delay_ps: lp.delay_ps,
            label_up: HOST_UP,
            label_down: HOST_DOWN,
        });
        t.plane_base.push(0);
        t.max_hops = 1;
        t
    }

    /// A 2-tier leaf-spine (`spines == 0`: one switch per plane, a star).
    /// Hosts attach `hosts_per_leaf` to a leaf in order, unless `host_leaf`
    /// maps them (rail-optimized).
    pub fn leaf_spine(
        hosts: u32,
        hosts_per_leaf: u32,
        spines: u32,
        links_per_spine: u32,
        planes: u32,
        lp: LinkParams,
    ) -> Self {
        let leaves = hosts.div_ceil(hosts_per_leaf);
        let mut map = Vec::with_capacity(hosts as usize);
        for h in 0..hosts {
            map.push((h / hosts_per_leaf, h % hosts_per_leaf));
        }
        Self::two_tier(
            format!("leaf-spine {hosts} hosts, {leaves} leaves x {spines} spines"),
            hosts,
            leaves,
            &map,
            spines,
            links_per_spine,
            planes,
            lp,
        )
    }

    /// Rail-optimized: `servers` servers with `rails` NICs each; NIC `r` of
    /// every server in a group of `servers_per_leaf` attaches to that group's
    /// rail-`r` leaf; all leaves meet at the spines. NIC `s * rails + r` is
    /// host index.
    pub fn rail(
        servers: u32,
        rails: u32,
        servers_per_leaf: u32,
        spines: u32,
        planes: u32,
        lp: LinkParams,
    ) -> Self {
        let hosts = servers * rails;
        let groups = servers.div_ceil(servers_per_leaf);
        let leaves = groups * rails;
        let mut map = Vec::with_capacity(hosts as usize);
        for h in 0..hosts {
            let (s, r) = (h / rails, h % rails);
            map.push(((s / servers_per_leaf) * rails + r, s % servers_per_leaf));
        }
        Self::two_tier(
            format!(
                "rail-optimized {servers} servers x {rails} NICs, {leaves} leaves x {spines} spines"
            ),
            hosts,
            leaves,
            &map,
            spines,
            1,
            planes,
            lp,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn two_tier(
        name: String,
        hosts: u32,
        leaves: u32,
        map: &[(u32, u32)],
        spines: u32,
        links_per_spine: u32,
        planes: u32,
        lp: LinkParams,
    ) -> Self {
        let tiers = if spines == 0 { 1 } else { 2 };
        let mut t = Self::empty(name, hosts, planes, tiers, lp);
        t.leaves_per_plane = leaves;
        for (h, &(leaf, slot)) in map.iter().enumerate() {
            t.host_leaf[h] = leaf;
            t.host_pod[h] = leaf;
            t.host_slot[h] = slot;
        }
        for p in 0..planes {
            let base = t.switches.len() as u32;
            t.plane_base.push(base);
            for l in 0..leaves {
                t.switches.push(SwitchSpec {
                    tier: 0,
                    plane: p,
                    pod: l,
                    index: l,
                    top: spines == 0,
                });
            }
            for s in 0..spines {
                t.switches.push(SwitchSpec {
                    tier: 1,
                    plane: p,
                    pod: s,
                    index: s,
                    top: true,
                });
            }
        }
        t.link_hosts(hosts, planes, &lp);
        for p in 0..planes {
            let base = t.plane_base[p as usize];
            for l in 0..leaves {
                for s in 0..spines {
                    for _ in 0..links_per_spine {
                        t.links.push(LinkSpec {
                            a: NodeRef::Switch(base + l),
                            b: NodeRef::Switch(base + leaves + s),
                            rate_bps: lp.fabric_bps,
                            delay_ps: lp.delay_ps,
                            label_up: T1_UP,
                            label_down: T1_DOWN,
                        });
                    }
                }
            }
        }
        t.max_hops = if spines == 0 { 2 } else { 4 };
        t
    }

    /// Link every host to its leaf (ToR) in every plane, in host order with
    /// planes inner, so a host's links are contiguous.
    fn link_hosts(&mut self, hosts: u32, planes: u32, lp: &LinkParams) {
        for h in 0..hosts {
            for p in 0..planes {
                self.links.push(LinkSpec {
                    a: NodeRef::Host(h),
                    b: NodeRef::Switch(self.plane_base[p as usize] + self.host_leaf[h as usize]),
                    rate_bps: lp.host_bps,
                    delay_ps: lp.delay_ps,
                    label_up: HOST_UP,
                    label_down: HOST_DOWN,
                });
            }
        }
    }

    /// The smallest even `k` whose k-ary fat tree (with `oversub` hosts per
    /// ToR up-port) holds `hosts`.
    pub fn fat_tree_k_for(hosts: u32, oversub: u32) -> u32 {
        let mut k = 2;
        while !Self::fat_tree_holds(k, oversub, hosts) {
            k += 2;
        }
        k
    }

    /// Whether a k-ary fat tree with `oversub` hosts per ToR up-port
    /// holds `hosts` (k³/4 · oversub of them, in `u64`).
    pub fn fat_tree_holds(k: u32, oversub: u32, hosts: u32) -> bool {
        u64::from(k).saturating_pow(3) / 4 * u64::from(oversub) >= u64::from(hosts)
    }

    /// A 3-tier k-ary fat tree: k pods of k/2 ToRs (each with `k/2 * oversub`
    /// hosts and k/2 up-links) and k/2 aggregation switches, (k/2)^2 cores.
    /// Only the pods the hosts need are built.
    pub fn fat_tree(hosts: u32, k: u32, oversub: u32, planes: u32, lp: LinkParams) -> Self {
        let half = k / 2;
        let per_tor = half * oversub;
        let per_pod = per_tor * half;
        let pods = hosts.div_ceil(per_pod);
        let tors = hosts.div_ceil(per_tor);
        let mut t = Self::empty(
            format!("fat tree k={k} {hosts} hosts, {pods} pods, oversubscription {oversub}:1"),
            hosts,
            planes,
            3,
            lp,
        );
        t.leaves_per_plane = tors;
        t.leaves_per_pod = half;
        for h in 0..hosts {
            let tor = h / per_tor;
            t.host_leaf[h as usize] = tor;
            t.host_pod[h as usize] = tor / half;
            t.host_leaf_in_pod[h as usize] = tor % half;
            t.host_slot[h as usize] = h % per_tor;
        }
        let cores = half * half;
        for p in 0..planes {
            let base = t.switches.len() as u32;
            t.plane_base.push(base);
            for tor in 0..tors {
                t.switches.push(SwitchSpec {
                    tier: 0,
                    plane: p,
                    pod: tor / half,
                    index: tor,
                    top: false,
                });
            }
            for a in 0..pods * half {
                t.switches.push(SwitchSpec {
                    tier: 1,
                    plane: p,
                    pod: a / half,
                    index: a,
                    top: false,
                });
            }
            for c in 0..cores {
                t.switches.push(SwitchSpec {
                    tier: 2,
                    plane: p,
                    pod: 0,
                    index: c,
                    top: true,
                });
            }
        }
        t.link_hosts(hosts, planes, &lp);
        for p in 0..planes {
            let base = t.plane_base[p as usize];
            let agg0 = base + tors;
            let core0 = agg0 + pods * half;
            for tor in 0..tors {
                let pod = tor / half;
                for a in 0..half {
                    t.links.push(LinkSpec {
                        a: NodeRef::Switch(base + tor),
                        b: NodeRef::Switch(agg0 + pod * half + a),
                        rate_bps: lp.fabric_bps,
                        delay_ps: lp.delay_ps,
                        label_up: T1_UP,
                        label_down: T1_DOWN,
                    });
                }
            }
            for pod in 0..pods {
                for a in 0..half {
                    for c in 0..half {
                        t.links.push(LinkSpec {
                            a: NodeRef::Switch(agg0 + pod * half + a),
                            b: NodeRef::Switch(core0 + a * half + c),
                            rate_bps: lp.fabric_bps,
                            delay_ps: lp.delay_ps,
                            label_up: T2_UP,
                            label_down: T2_DOWN,
                        });
                    }
                }
            }
        }
        t.max_hops = 6;
        t
    }

    /// A readable name for a node ("h12", "tor3", "p1.spine0", ...).
    pub fn node_name(&self, n: NodeRef) -> String {
        match n {
            NodeRef::Host(h) => format!("h{h}"),
            NodeRef::Switch(s) => {
                let sw = &self.switches[s as usize];
                let kind = match (self.tiers, sw.tier) {
                    (3, 0) => "tor",
                    (3, 1) => "agg",
                    (3, _) => "core",
                    (2, 0) => "leaf",
                    (2, _) => "spine",
                    _ => "switch",
                };
                if self.planes > 1 {
                    format!("p{}.{kind}{}", sw.plane, sw.index)
                } else {
                    format!("{kind}{}", sw.index)
                }
            }
        }
    }

    /// The node named `name` (see [`node_name`](Self::node_name)).
    pub fn find_node(&self, name: &str) -> Option<NodeRef> {
        if let Some(h) = name.strip_prefix('h').and_then(|s| s.parse::<u32>().ok()) {
            return (h < self.hosts).then_some(NodeRef::Host(h));
        }
        (0..self.switches.len() as u32)
            .map(NodeRef::Switch)
            .find(|&n| self.node_name(n) == name)
    }
}

/// How many hosts, switches and links a fabric will have, computed from
/// its shape before anything is allocated (in `u64`, so an absurd shape
/// cannot overflow), and the memory that much fabric needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricSize {
    /// Hosts (NICs).
    pub hosts: u64,
    /// Switches over all planes.
    pub switches: u64,
    /// Links over all planes.
    pub links: u64,
}

/// Bytes one host costs at setup (its transport's state, NIC, counters),
/// rounded up from MetaRoCE's, the largest: a 10^5-host star measured
/// 198 MiB peak RSS, about 1.5 KiB per host beyond its link.
const HOST_BYTES: u64 = 2048;
/// Bytes one link costs (two ports with their queues and counters, a
/// pipe): measured about 480 B (2·10^5 extra leaf-spine links, +47 MiB).
const LINK_BYTES: u64 = 512;
/// Bytes one switch costs (its port lists and routing keys): measured
/// about 230 B.
const SWITCH_BYTES: u64 = 256;

impl FabricSize {
    /// Two hosts on one link.
    pub fn back_to_back() -> Self {
        Self {
            hosts: 2,
            switches: 0,
            links: 1,
        }
    }

    /// As [`Topology::leaf_spine`] builds it.
    pub fn leaf_spine(
        hosts: u64,
        hosts_per_leaf: u64,
        spines: u64,
        links_per_spine: u64,
        planes: u64,
    ) -> Self {
        let leaves = hosts.div_ceil(hosts_per_leaf.max(1));
        Self::two_tier(hosts, leaves, spines, links_per_spine, planes)
    }

    /// As [`Topology::rail`] builds it.
    pub fn rail(servers: u64, rails: u64, servers_per_leaf: u64, spines: u64, planes: u64) -> Self {
        let leaves = servers
            .div_ceil(servers_per_leaf.max(1))
            .saturating_mul(rails);
        Self::two_tier(servers.saturating_mul(rails), leaves, spines, 1, planes)
    }

    fn two_tier(hosts: u64, leaves: u64, spines: u64, links_per_spine: u64, planes: u64) -> Self {
        let fabric_links = leaves
            .saturating_mul(spines)
            .saturating_mul(links_per_spine);
        Self {
            hosts,
            switches: leaves.saturating_add(spines).saturating_mul(planes),
            links: hosts.saturating_add(fabric_links).saturating_mul(planes),
        }
    }

    /// As [`Topology::fat_tree`] builds it (only the pods the hosts need).
    pub fn fat_tree(hosts: u64, k: u64, oversub: u64, planes: u64) -> Self {
        let half = (k / 2).max(1);
        let per_tor = half.saturating_mul(oversub);
        let per_pod = per_tor.saturating_mul(half);
        let pods = hosts.div_ceil(per_pod.max(1));
        let tors = hosts.div_ceil(per_tor.max(1));
        let aggs = pods.saturating_mul(half);
        let cores = half.saturating_mul(half);
        Self {
            hosts,
            switches: tors
                .saturating_add(aggs)
                .saturating_add(cores)
                .saturating_mul(planes),
            links: hosts
                .saturating_add(tors.saturating_mul(half))
                .saturating_add(aggs.saturating_mul(half))
                .saturating_mul(planes),
        }
    }

    /// Memory the fabric needs at setup, estimated from its element counts
    /// (flows and packets in flight come on top).
    pub fn estimated_bytes(&self) -> u64 {
        self.hosts
            .saturating_mul(HOST_BYTES)
            .saturating_add(self.switches.saturating_mul(SWITCH_BYTES))
            .saturating_add(self.links.saturating_mul(LINK_BYTES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LP: LinkParams = LinkParams {
        host_bps: 100_000_000_000,
        fabric_bps: 100_000_000_000,
        delay_ps: 1_000_000,
    };

    #[test]
    fn fat_tree_sizes() {
        assert_eq!(Topology::fat_tree_k_for(128, 1), 8);
        assert_eq!(Topology::fat_tree_k_for(1024, 1), 16);
        let t = Topology::fat_tree(128, 8, 1, 1, LP);
        // 32 ToRs, 32 aggs, 16 cores; 128 host links + 128 tor-agg + 128 agg-core.
        assert_eq!(t.switches.len(), 80);
        assert_eq!(t.links.len(), 384);
        assert_eq!(t.find_node("core3"), Some(NodeRef::Switch(67)));
    }

    /// The counts computed before building are the counts built.
    #[test]
    fn fabric_size_matches_what_is_built() {
        let size = |t: &Topology| FabricSize {
            hosts: u64::from(t.hosts),
            switches: t.switches.len() as u64,
            links: t.links.len() as u64,
        };
        let t = Topology::fat_tree(100, 8, 2, 2, LP);
        assert_eq!(FabricSize::fat_tree(100, 8, 2, 2), size(&t));
        let t = Topology::leaf_spine(37, 8, 3, 2, 2, LP);
        assert_eq!(FabricSize::leaf_spine(37, 8, 3, 2, 2), size(&t));
        let t = Topology::leaf_spine(9, 9, 0, 1, 1, LP);
        assert_eq!(FabricSize::leaf_spine(9, 9, 0, 1, 1), size(&t));
        let t = Topology::rail(5, 4, 2, 3, 2, LP);
        assert_eq!(FabricSize::rail(5, 4, 2, 3, 2), size(&t));
        assert_eq!(
            FabricSize::back_to_back(),
            size(&Topology::back_to_back(LP))
        );
    }

    #[test]
    fn rail_maps_nics_to_rail_leaves() {
        let t = Topology::rail(4, 8, 2, 4, 1, LP);
        assert_eq!(t.hosts, 32);
        // server 1 NIC 3 -> group 0, rail 3 leaf; server 2 NIC 3 -> group 1.
        assert_eq!(t.host_leaf[11], 3);
        assert_eq!(t.host_leaf[19], 11);
        assert_eq!(t.leaves_per_plane, 16);
    }
}
