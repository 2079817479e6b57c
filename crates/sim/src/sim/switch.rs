//! A switch: output-queued, one buffer over its egress ports.
//!
//! An arriving packet goes through one pipeline (`switch_receive`), each
//! step a named policy:
//!
//! 1. **route** (`routing.rs`): pick the egress port, or drop for want of
//!    a live route;
//! 2. **admission** (`admits`): the buffer model decides whether it fits;
//!    lossless traffic (data under PFC; everything under credits) is never
//!    refused here, only beyond PFC headroom;
//! 3. **trimming** (`trim`) or a drop, for data that does not fit;
//! 4. **ECN marking** (`mark_ecn`) on the queue the packet found;
//! 5. **enqueue** at the egress port, hold its bytes in the buffer
//!    (`buffer_hold`), and let PFC check the ingress (`pfc.rs`).
//!
//! When the egress port sends it, `switch_dequeued` frees its bytes and
//! lets PFC resume the ingress.

use super::Sim;
use super::loss::LossCause;
use super::port::{CTRL, DATA, Port};
use super::routing::routing_tables;
use super::unit;
use crate::fabric::PfcConfig;
use crate::time::Ps;
use crate::topology::Topology;
use crate::transport::{FRAME_OVERHEAD_BYTES, TransportFactory};

/// Bytes a trimmed packet keeps (headers).
pub const TRIM_BYTES: u32 = 64 + FRAME_OVERHEAD_BYTES;

/// One switch's ports, routes and buffer.
pub(super) struct Switch {
    /// Its ports (global indices), in link order: `ports[i]` is port `i`.
    pub(super) ports: Vec<u32>,
    /// Port indices toward higher tiers.
    pub(super) up: Vec<u16>,
    /// Down port by the destination's key at this tier.
    pub(super) down: Vec<u16>,
    /// Tier: 0 leaf / ToR, then upward.
    pub(super) tier: u8,
    /// Pod (3-tier) or its own index.
    pub(super) pod: u32,
    /// At the top tier: never routes up.
    pub(super) top: bool,
    /// ECMP salt, so tiers do not hash alike.
    pub(super) salt: u64,
    /// Bytes buffered over all egress queues.
    pub(super) used_bytes: u64,
    /// Data bytes buffered per ingress port (PFC accounting).
    pub(super) ingress_bytes: Vec<u64>,
    /// Ingress ports whose upstream is paused.
    pub(super) paused_upstream: Vec<bool>,
    /// PFC headroom of each ingress port, bytes (empty with PFC off).
    pub(super) pfc_headroom: Vec<u64>,
}

/// Every switch, with its routing tables, from the ports `build_ports` made.
pub(super) fn build_switches(
    topo: &Topology,
    ports: &[Port],
    switch_ports: Vec<Vec<u32>>,
    pfc: Option<PfcConfig>,
    seed: u64,
) -> Vec<Switch> {
    topo.switches
        .iter()
        .zip(switch_ports)
        .enumerate()
        .map(|(s, (spec, own))| {
            let (up, down) = routing_tables(topo, ports, spec, &own);
            let n = own.len();
            // An ingress is fed by the link of the port with its index.
            let pfc_headroom = pfc.map_or_else(Vec::new, |pfc| {
                own.iter()
                    .map(|&p| {
                        let link = &ports[p as usize];
                        pfc.headroom_for(link.rate_bps, link.delay_ps)
                    })
                    .collect()
            });
            Switch {
                ports: own,
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
                pfc_headroom,
            }
        })
        .collect()
}

impl<F: TransportFactory> Sim<F> {
    /// Packet `k` arrives at switch `s` on its port `in_port`.
    #[inline]
    pub(super) fn switch_receive(&mut self, now: Ps, s: u32, in_port: u16, k: u32) {
        let Some(out) = self.route(s, k) else {
            self.measured.no_route += 1;
            let head = self.packets.head(k);
            if !self.credits.is_empty() && head.priority() == DATA {
                // Never buffered: the ingress credit is free again at once.
                let bytes = head.wire.bytes;
                self.credit_free_ingress(now, s, in_port, bytes);
            }
            self.account_loss(now, k, LossCause::NoRoute, None, Some(s));
            return;
        };
        let egress = self.switches[s as usize].ports[out as usize];
        let head = self.packets.head_mut(k);
        head.in_port = in_port;
        let bytes = u64::from(head.wire.bytes);
        let mut prio = head.priority();
        let port = &self.ports[egress as usize];
        let queue_bytes = port.queued_bytes;
        self.measured
            .sample_queue(port.label, now / self.bin_ps, queue_bytes);
        // PFC makes the data priority lossless; InfiniBand's credited link
        // layer makes every packet lossless (ACKs ride a credited VL too,
        // and are too few to need credits of their own in this model).
        let lossless = (prio == DATA && self.cfg.pfc.is_some()) || !self.credits.is_empty();
        if lossless {
            if self.pfc_beyond_headroom(s, in_port, bytes) {
                self.measured.headroom_drops += 1;
                self.drop_at(now, egress, k, LossCause::Headroom);
                return;
            }
        } else if !self.admits(s, queue_bytes, bytes) {
            if self.cfg.trimming && prio == DATA {
                self.trim(egress, k);
                prio = CTRL;
            } else {
                self.drop_at(now, egress, k, LossCause::Buffer);
                return;
            }
        }
        if prio == DATA {
            self.mark_ecn(egress, k, queue_bytes);
        }
        let bytes = u64::from(self.packets.head(k).wire.bytes);
        self.ports[egress as usize].enqueue(prio, k, bytes);
        let port = &self.ports[egress as usize];
        if port.monitor != u32::MAX {
            let (m, q) = (port.monitor as usize, port.queued_bytes);
            self.measured.monitors[m]
                .queue_max
                .max_at(now / self.bin_ps, q);
        }
        self.buffer_hold(s, prio, in_port, bytes);
        if prio == DATA {
            self.pfc_after_enqueue(now, s, in_port);
        }
        self.tx_start(now, egress);
    }

    /// Admission: whether switch `s`'s buffer model takes `bytes` more for
    /// an egress queue holding `queue_bytes`.
    #[inline]
    fn admits(&self, s: u32, queue_bytes: u64, bytes: u64) -> bool {
        let used = self.switches[s as usize].used_bytes;
        self.cfg.buffer.admits(used, queue_bytes, bytes)
    }

    /// Trimming: cut data packet `k` to its headers, which then travel on
    /// the control priority (the receiver learns of the loss at once).
    #[inline]
    fn trim(&mut self, egress: u32, k: u32) {
        let head = self.packets.head_mut(k);
        head.trimmed = true;
        head.wire.bytes = head.wire.bytes.min(TRIM_BYTES);
        self.ports[egress as usize].c.trims += 1;
    }

    /// ECN marking of data packet `k` that found `queue_bytes` at its
    /// egress queue: RED on that length, for ECN-capable packets not
    /// already marked.
    #[inline]
    fn mark_ecn(&mut self, egress: u32, k: u32, queue_bytes: u64) {
        let Some(ecn) = self.cfg.ecn else {
            return;
        };
        let head = self.packets.head_mut(k);
        if !head.wire.ect || head.wire.ce {
            return;
        }
        let p = ecn.mark_probability(queue_bytes);
        if p >= 1.0 || (p > 0.0 && unit(&mut self.rng) < p) {
            head.wire.ce = true;
            self.ports[egress as usize].c.ecn_marks += 1;
        }
    }

    /// Drop packet `k` at enqueue, counted at its egress port.
    #[inline]
    fn drop_at(&mut self, now: Ps, egress: u32, k: u32, cause: LossCause) {
        self.ports[egress as usize].c.drops += 1;
        self.account_loss(now, k, cause, Some(egress), None);
    }

    /// Switch `s`'s buffer takes `bytes` queued at `prio`, come in on
    /// `in_port` (data is also accounted to its ingress when PFC is on).
    #[inline]
    fn buffer_hold(&mut self, s: u32, prio: usize, in_port: u16, bytes: u64) {
        let sw = &mut self.switches[s as usize];
        sw.used_bytes += bytes;
        if prio == DATA && self.cfg.pfc.is_some() {
            sw.ingress_bytes[in_port as usize] += bytes;
        }
    }

    /// The reverse of [`Self::buffer_hold`]: the packet left switch `s`'s
    /// buffer, sent or lost with its port.
    #[inline]
    pub(super) fn buffer_release(&mut self, s: u32, prio: usize, in_port: u16, bytes: u64) {
        let sw = &mut self.switches[s as usize];
        sw.used_bytes -= bytes;
        if prio == DATA && self.cfg.pfc.is_some() {
            sw.ingress_bytes[in_port as usize] -= bytes;
        }
    }

    /// A packet of `bytes` at `prio`, come in on `in_port`, started
    /// leaving switch `s`: free its buffer and let its ingress resume.
    #[inline]
    pub(super) fn switch_dequeued(
        &mut self,
        now: Ps,
        s: u32,
        prio: usize,
        in_port: u16,
        bytes: u64,
    ) {
        self.buffer_release(s, prio, in_port, bytes);
        if prio == DATA {
            self.pfc_after_dequeue(now, s, in_port);
        }
    }

    /// The port feeding switch `s`'s ingress `in_port` (the reverse of its
    /// port `in_port`) and that link's delay: where PFC frames and returned
    /// credits go.
    #[inline]
    pub(super) fn upstream_of(&self, s: u32, in_port: u16) -> (u32, Ps) {
        let own = self.switches[s as usize].ports[in_port as usize];
        let upstream = self.ports[own as usize].reverse;
        (upstream, self.ports[upstream as usize].delay_ps)
    }
}
