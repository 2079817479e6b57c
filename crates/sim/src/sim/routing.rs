//! Routing: which egress port a switch sends a packet to.
//!
//! Up-down routing needs no per-destination tables: a switch sends a
//! packet down if the destination lies below it (one port, looked up by
//! the destination's key at that tier) and otherwise up, choosing among
//! its live up-ports by the 5-tuple hash (ECMP) or by the shortest queue
//! (adaptive). Without re-convergence a switch avoids only its own dead
//! ports; with it (`FabricConfig::reconverge_ps`), a delay after a link
//! changes state every switch learns which up-ports still lead to each
//! leaf and hashes only over those.

use super::Sim;
use super::port::Port;
use crate::address::host_ipv4_bits;
use crate::event::EventKind;
use crate::fabric::{Routing, ecmp_hash};
use crate::time::Ps;
use crate::topology::{NodeRef, SwitchSpec, Topology};
use crate::transport::{TransportFactory, Wire};

/// The IP protocol number the 5-tuple hash reads: every packet is UDP.
const IP_PROTOCOL_UDP: u8 = 17;

/// The 5-tuple hash of a packet from host `src`, salted: what a switch
/// (salted per switch) and a multi-plane NIC (unsalted) spread flows by.
#[inline]
pub(super) fn five_tuple_hash(src: u32, wire: &Wire, salt: u64) -> u64 {
    ecmp_hash(
        host_ipv4_bits(src),
        host_ipv4_bits(wire.dst),
        wire.src_port,
        wire.dst_port,
        IP_PROTOCOL_UDP,
        salt,
    )
}

/// A switch's up-ports (toward higher tiers) and its down-port table,
/// keyed by what the destination is below it; `u16::MAX` marks no port.
pub(super) fn routing_tables(
    topo: &Topology,
    ports: &[Port],
    spec: &SwitchSpec,
    own: &[u32],
) -> (Vec<u16>, Vec<u16>) {
    let mut up = Vec::new();
    let mut down = Vec::new();
    for (i, &p) in own.iter().enumerate() {
        let key = match ports[p as usize].peer {
            NodeRef::Host(h) => topo.host_slot[h as usize] as usize,
            NodeRef::Switch(o) => {
                let other = &topo.switches[o as usize];
                if other.tier > spec.tier {
                    up.push(i as u16);
                    continue;
                }
                // Key of a lower switch: a ToR under an agg is keyed by
                // its index within the pod; under a spine or a core by
                // its global leaf index or pod.
                (match (topo.tiers, spec.tier) {
                    (3, 1) => other.index % topo.leaves_per_pod.max(1),
                    (3, _) => other.pod,
                    _ => other.index,
                }) as usize
            }
        };
        if down.len() <= key {
            down.resize(key + 1, u16::MAX);
        }
        down[key] = i as u16;
    }
    (up, down)
}

impl<F: TransportFactory> Sim<F> {
    /// If host `dst` lies below switch `s` (the route goes down), the
    /// entry of `s`'s down-port table toward it; `None`: the route goes up.
    #[inline]
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

    /// The port index packet `k` leaves switch `s` by; `None` if no live
    /// route exists.
    #[inline]
    pub(super) fn route(&self, s: u32, k: u32) -> Option<u16> {
        let pkt = self.packets.head(k);
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
        let h = five_tuple_hash(pkt.src, &pkt.wire, sw.salt);
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

    /// A link changed state at `now`: with re-convergence on, routes
    /// re-converge a delay later. A switch failure changes all its links
    /// at one instant: one re-convergence covers them.
    pub(super) fn schedule_reconvergence(&mut self, now: Ps) {
        if let Some(delay) = self.cfg.reconverge_ps {
            let at = now + delay;
            if self.reconverge_at != Some(at) {
                self.reconverge_at = Some(at);
                self.events.schedule(at, EventKind::Reconverge);
            }
        }
    }

    /// Routes re-converge on the links' state now.
    pub(super) fn reconverge(&mut self) {
        self.reconverge_at = None;
        self.recompute_reach();
    }

    /// Recompute which switches can still deliver to which leaf, from the
    /// links' state now (what a routing protocol converges to).
    pub(super) fn recompute_reach(&mut self) {
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
}
