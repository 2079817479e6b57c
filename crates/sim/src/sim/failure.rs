//! Link and switch failures and recoveries.
//!
//! A failure takes both directions of a link down at one instant: packets
//! queued at either port are lost, and packets on the wire are lost when
//! they arrive (`pipe.rs`). A switch failure is all its links at once.
//! Routes react as `routing.rs` says: at once around a switch's own dead
//! ports, and everywhere after the re-convergence delay when one is set.

use super::Sim;
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
        let p = self
            .ports
            .iter()
            .position(|p| p.owner == a && p.peer == b)
            .ok_or_else(|| SimError::NoLink {
                a: self.topo.node_name(a),
                b: self.topo.node_name(b),
            })?;
        self.events
            .schedule(at, EventKind::LinkState { port: p as u32, up });
        Ok(())
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
                match port.owner {
                    NodeRef::Switch(s) => {
                        self.buffer_release(s, prio, in_port, bytes);
                        if prio == DATA && !self.credits.is_empty() {
                            self.credit_free_ingress(now, s, in_port, bytes as u32);
                        }
                    }
                    NodeRef::Host(h) => self.hosts[h as usize].queued -= 1,
                }
                self.packets.release(k);
            }
        }
    }
}
