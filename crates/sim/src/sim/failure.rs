//! Link and switch failures and recoveries.
//!
//! A failure takes both directions of a link down at one instant: packets
//! queued at either port are lost, and packets on the wire are lost when
//! they arrive (`pipe.rs`). A switch failure is all its links at once.
//! Routes react as `routing.rs` says: at once around a switch's own dead
//! ports, and everywhere after the re-convergence delay when one is set.

use super::Sim;
use super::loss::{FailedPart, LossCause};
use super::port::{CTRL, DATA};
use crate::error::SimError;
use crate::event::EventKind;
use crate::time::Ps;
use crate::topology::NodeRef;
use crate::transport::TransportFactory;

impl<F: TransportFactory> Sim<F> {
    /// Fail (`up = false`) or restore the link between two nodes at `at`.
    pub fn schedule_link(
        &mut self,
        a: NodeRef,
        b: NodeRef,
        at: Ps,
        up: bool,
    ) -> Result<(), SimError> {
        let port = self.link_port(a, b)?;
        self.events.schedule(at, EventKind::LinkState { port, up });
        Ok(())
    }

    /// Fail the link between `a` and `b` at `at`, and restore it at
    /// `up_at`; the report follows what still runs into it.
    pub fn schedule_link_failure(
        &mut self,
        a: NodeRef,
        b: NodeRef,
        at: Ps,
        up_at: Option<Ps>,
    ) -> Result<(), SimError> {
        self.schedule_link(a, b, at, false)?;
        if let Some(u) = up_at {
            self.schedule_link(a, b, u, true)?;
        }
        let p = self.link_port(a, b)?;
        let part = FailedPart::Link(self.topo.node_name(a), self.topo.node_name(b));
        let ports = vec![p, self.ports[p as usize].reverse];
        self.record_failure(part, ports, at, up_at);
        Ok(())
    }

    /// Fail switch `s` (all its links) at `at`, restore it at `up_at`.
    pub fn schedule_switch_failure(
        &mut self,
        s: u32,
        at: Ps,
        up_at: Option<Ps>,
    ) -> Result<(), SimError> {
        self.schedule_switch(s, at, false)?;
        if let Some(u) = up_at {
            self.schedule_switch(s, u, true)?;
        }
        let part = FailedPart::Switch(self.topo.node_name(NodeRef::Switch(s)));
        let ports = self.switch_ports_both_ways(&[s]);
        self.record_failure(part, ports, at, up_at);
        Ok(())
    }

    /// Fail every switch of plane `plane` at `at` (a plane of a multi-plane
    /// fabric, with its host links), restore them at `up_at`.
    pub fn schedule_plane_failure(
        &mut self,
        plane: u32,
        at: Ps,
        up_at: Option<Ps>,
    ) -> Result<(), SimError> {
        let switches: Vec<u32> = (0..self.topo.switches.len() as u32)
            .filter(|&s| self.topo.switches[s as usize].plane == plane)
            .collect();
        if switches.is_empty() {
            return Err(SimError::NoPlane {
                plane,
                planes: self.topo.planes,
            });
        }
        for &s in &switches {
            self.schedule_switch(s, at, false)?;
            if let Some(u) = up_at {
                self.schedule_switch(s, u, true)?;
            }
        }
        let ports = self.switch_ports_both_ways(&switches);
        self.record_failure(FailedPart::Plane(plane), ports, at, up_at);
        Ok(())
    }

    /// Both directions of every link of `switches`, once each.
    fn switch_ports_both_ways(&self, switches: &[u32]) -> Vec<u32> {
        let mut ports: Vec<u32> = switches
            .iter()
            .flat_map(|&s| self.switches[s as usize].ports.iter().copied())
            .flat_map(|p| [p, self.ports[p as usize].reverse])
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// Fail or restore every link of a switch at `at`.
    pub fn schedule_switch(&mut self, s: u32, at: Ps, up: bool) -> Result<(), SimError> {
        let ports = self
            .switches
            .get(s as usize)
            .ok_or(SimError::NoSwitch(s))?
            .ports
            .clone();
        for p in ports {
            self.events
                .schedule(at, EventKind::LinkState { port: p, up });
        }
        Ok(())
    }

    /// The link of port `p` goes down (`up = false`) or comes back.
    pub(super) fn link_state(&mut self, now: Ps, p: u32, up: bool) {
        self.schedule_reconvergence(now);
        let r = self.ports[p as usize].reverse;
        for d in [p, r] {
            self.ports[d as usize].up = up;
            self.failure_state(now, d, up);
            if up {
                self.credit_reset(d);
                self.wake_port(now, d);
            } else {
                self.flush_dead_port(now, d);
            }
        }
    }

    /// Port `d`'s link died: the packets queued there are lost (their
    /// buffer, and with credits the credit their ingress spent, freed).
    fn flush_dead_port(&mut self, now: Ps, d: u32) {
        for prio in [DATA, CTRL] {
            while let Some(k) = self.ports[d as usize].queues[prio].pop_front() {
                let head = self.packets.head(k);
                let (bytes, in_port) = (u64::from(head.wire.bytes), head.in_port);
                let port = &mut self.ports[d as usize];
                port.queued_bytes -= bytes;
                port.c.down_losses += 1;
                let owner = port.owner;
                match owner {
                    NodeRef::Switch(s) => {
                        self.buffer_release(s, prio, in_port, bytes);
                        if prio == DATA && !self.credits.is_empty() {
                            self.credit_free_ingress(now, s, in_port, bytes as u32);
                        }
                    }
                    NodeRef::Host(h) => self.hosts[h as usize].queued -= 1,
                }
                self.account_loss(now, k, LossCause::Down, Some(d), None);
            }
        }
    }
}
