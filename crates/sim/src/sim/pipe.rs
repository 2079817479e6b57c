//! The pipe: the wire behind a port. A delay line: each packet's arrival
//! at the far end is its own event, one propagation delay after its last
//! bit left the serializer (FIFO, since departures are in time order and
//! ties fire in insertion order), so no per-port queue is touched twice.
//!
//! Packets die on the wire two ways: random loss (`FabricConfig::loss`,
//! drawn once per packet per link) and a link that is down when the packet
//! leaves or arrives.

use super::loss::LossCause;
use super::port::DATA;
use super::{Sim, unit};
use crate::event::EventKind;
use crate::time::Ps;
use crate::topology::NodeRef;
use crate::transport::TransportFactory;

impl<F: TransportFactory> Sim<F> {
    /// Packet `k`, sent by port `p`, died on the wire: free it, and let the
    /// link layer recover the credit it spent (credits only).
    #[inline]
    fn lost_on_wire(&mut self, now: Ps, p: u32, k: u32, cause: LossCause) {
        let head = self.packets.head(k);
        if !self.credits.is_empty() && head.priority() == DATA {
            let bytes = head.wire.bytes;
            self.credit_lost_on_wire(now, p, bytes);
        }
        self.account_loss(now, k, cause, Some(p), None);
    }

    /// Packet `k`'s last bit left port `p`: it crosses the wire unless lost.
    #[inline]
    pub(super) fn pipe_enter(&mut self, now: Ps, p: u32, k: u32) {
        self.tap_departure(now, p, k);
        // Drawn for every packet, even on a dead link, so one failure does
        // not shift every later random choice.
        let lost = self.cfg.loss > 0.0 && unit(&mut self.rng) < self.cfg.loss;
        let port = &mut self.ports[p as usize];
        if !port.up {
            port.c.down_losses += 1;
            self.lost_on_wire(now, p, k, LossCause::Down);
        } else if lost {
            port.c.wire_losses += 1;
            self.lost_on_wire(now, p, k, LossCause::Wire);
        } else {
            self.events.schedule(
                now + port.delay_ps,
                EventKind::PipeArrive { port: p, pkt: k },
            );
        }
    }

    /// Packet `k` reaches the far end of port `p`'s link: a switch forwards
    /// it, a host takes it, unless the link died while it was in flight.
    #[inline]
    pub(super) fn pipe_arrive(&mut self, now: Ps, p: u32, k: u32) {
        let port = &mut self.ports[p as usize];
        if !port.up {
            port.c.down_losses += 1;
            self.lost_on_wire(now, p, k, LossCause::Down);
            return;
        }
        let (peer, peer_in) = (port.peer, port.peer_in);
        match peer {
            NodeRef::Switch(s) => self.switch_receive(now, s, peer_in, k),
            NodeRef::Host(h) => self.host_receive(now, h, k),
        }
    }
}
