//! Credit-based link flow control (InfiniBand-style, instead of PFC): see
//! [`Sim::set_credit_flow_control`]. Credits are bytes of the downstream
//! switch's receive buffer, per port; only data spends them.

use super::Sim;
use crate::event::EventKind;
use crate::time::Ps;
use crate::topology::NodeRef;
use crate::transport::TransportFactory;

impl<F: TransportFactory> Sim<F> {
    /// Turn on credit-based flow control (InfiniBand-style, instead of PFC):
    /// every port facing a switch starts with `bytes` of credit for that
    /// switch's receive buffer on the link; a data packet is transmitted
    /// only if its length is covered, and the credit comes back (one link
    /// delay later) when the downstream switch forwards the packet. Data is
    /// then never dropped for lack of buffer, and no PAUSE is ever sent.
    pub fn set_credit_flow_control(&mut self, bytes: u64) {
        self.credits = self
            .ports
            .iter()
            .map(|p| match p.peer {
                NodeRef::Switch(_) => bytes as i64,
                NodeRef::Host(_) => i64::MAX / 2,
            })
            .collect();
    }

    /// Whether port `p` has credit for data packet `k` (always, with
    /// credits off).
    #[inline]
    pub(super) fn credit_covers(&self, p: u32, k: u32) -> bool {
        self.credits.is_empty()
            || self.credits[p as usize] >= i64::from(self.packets.head(k).wire.bytes)
    }

    /// Port `p` sends data of `bytes`, come in on `in_port` if `p` is a
    /// switch's: spend its credit, and give the credit for the buffer the
    /// packet leaves back to the port it came in from.
    #[inline]
    pub(super) fn credit_spend(&mut self, now: Ps, p: u32, bytes: u32, in_port: u16) {
        self.credits[p as usize] -= i64::from(bytes);
        if let NodeRef::Switch(s) = self.ports[p as usize].owner {
            let (upstream, delay) = self.upstream_of(s, in_port);
            self.events.schedule(
                now + delay,
                EventKind::Credit {
                    port: upstream,
                    bytes,
                },
            );
        }
    }

    /// Credit of `bytes` comes back to port `p`.
    pub(super) fn credit_returned(&mut self, now: Ps, p: u32, bytes: u32) {
        if let Some(c) = self.credits.get_mut(p as usize) {
            *c += i64::from(bytes);
        }
        self.wake_port(now, p);
    }
}
