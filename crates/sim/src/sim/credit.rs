//! Credit-based link flow control (InfiniBand-style, instead of PFC): see
//! [`Sim::set_credit_flow_control`]. Credits are bytes of the downstream
//! switch's receive buffer, per port; only data spends them.
//!
//! Two things keep the model honest to the real link layer:
//! - **Sizing.** A link runs at full rate only if its credit covers the
//!   credit loop: the bytes the sender puts on the wire between spending a
//!   credit and seeing it come back (serialization, propagation both ways,
//!   the downstream's forwarding of the packet ahead). Each port's credit is
//!   sized from its own link ([`credit_loop_bytes`]) unless the scenario
//!   gives a figure.
//! - **Recovery.** A packet lost on the wire (random loss, a link or switch
//!   that died under it) never reaches the downstream buffer, so the normal
//!   return path never frees its credit. InfiniBand's link layer does not
//!   leak: both ends send flow-control packets periodically (the sender its
//!   total blocks sent, the receiver its credit limit), and the receiver
//!   adopts the sender's count, which hands back credit for whatever was
//!   lost. The model returns a lost packet's credit at the next
//!   flow-control period plus a round trip of the link. A link that comes
//!   back up starts with full credit again (link training re-initialises the
//!   flow-control state).

use super::Sim;
use crate::event::EventKind;
use crate::time::Ps;
use crate::topology::NodeRef;
use crate::transport::TransportFactory;

/// Credit-based flow control settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditConfig {
    /// Credit per switch-facing port, bytes; `None` sizes each port from
    /// its link ([`credit_loop_bytes`]).
    pub bytes: Option<u64>,
    /// Period of the link-layer flow-control packets that resynchronise
    /// credit after a loss.
    pub resync_ps: Ps,
    /// The largest data frame, bytes (for the loop's serialization terms).
    pub max_frame_bytes: u32,
}

/// Credit a link of `rate_bps` and one-way `delay_ps` needs to run at full
/// rate with frames of up to `max_frame_bytes`: the frame being serialized,
/// the wire's bytes both ways (data out, credit back), and one more frame
/// for the downstream switch to finish the packet ahead of it.
pub fn credit_loop_bytes(rate_bps: u64, delay_ps: Ps, max_frame_bytes: u32) -> u64 {
    let wire_bytes =
        (u128::from(rate_bps) * u128::from(2 * delay_ps)).div_ceil(8 * 1_000_000_000_000);
    u64::try_from(wire_bytes).unwrap_or(u64::MAX / 4) + 3 * u64::from(max_frame_bytes)
}

impl<F: TransportFactory> Sim<F> {
    /// Turn on credit-based flow control (InfiniBand-style, instead of PFC):
    /// every port facing a switch starts with its credit for that switch's
    /// receive buffer on the link; a data packet is transmitted only if its
    /// length is covered, and the credit comes back (one link delay later)
    /// when the downstream switch forwards or discards the packet, or after
    /// a resynchronisation if the packet died on the wire. Data is then
    /// never dropped for lack of buffer, and no PAUSE is ever sent.
    pub fn set_credit_flow_control(&mut self, cfg: CreditConfig) {
        self.credit_cfg = Some(cfg);
        self.credit_initial = self
            .ports
            .iter()
            .map(|p| match p.peer {
                NodeRef::Switch(_) => {
                    let loop_bytes = credit_loop_bytes(p.rate_bps, p.delay_ps, cfg.max_frame_bytes);
                    cfg.bytes.unwrap_or(loop_bytes) as i64
                }
                NodeRef::Host(_) => i64::MAX / 2,
            })
            .collect();
        self.credits.clone_from(&self.credit_initial);
    }

    /// Initial credit of port `p` (for tests and reports); `None` with
    /// credits off.
    pub fn initial_credit(&self, p: u32) -> Option<i64> {
        self.credit_initial.get(p as usize).copied()
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
            self.credit_free_ingress(now, s, in_port, bytes);
        }
    }

    /// Switch `s` no longer holds data of `bytes` that came in on
    /// `in_port` (forwarded, or discarded without being buffered): the
    /// credit goes back to the port feeding that ingress.
    #[inline]
    pub(super) fn credit_free_ingress(&mut self, now: Ps, s: u32, in_port: u16, bytes: u32) {
        let (upstream, delay) = self.upstream_of(s, in_port);
        self.events.schedule(
            now + delay,
            EventKind::Credit {
                port: upstream,
                bytes,
            },
        );
    }

    /// Data of `bytes` sent by port `p` died on the wire: its credit comes
    /// back through the link layer's periodic resynchronisation (the next
    /// flow-control period, then a round trip of the link).
    #[inline]
    pub(super) fn credit_lost_on_wire(&mut self, now: Ps, p: u32, bytes: u32) {
        let Some(cfg) = self.credit_cfg else {
            return;
        };
        if !matches!(self.ports[p as usize].peer, NodeRef::Switch(_)) {
            return;
        }
        let period = cfg.resync_ps.max(1);
        let tick = (now / period + 1) * period;
        let at = tick + 2 * self.ports[p as usize].delay_ps;
        self.events
            .schedule(at, EventKind::Credit { port: p, bytes });
    }

    /// Port `p`'s link came back up: link training resets its credit.
    pub(super) fn credit_reset(&mut self, p: u32) {
        if let Some(&c) = self.credit_initial.get(p as usize) {
            self.credits[p as usize] = c;
        }
    }

    /// Credit of `bytes` comes back to port `p` (never beyond its initial
    /// credit: a return that a link reset already made good is dropped).
    pub(super) fn credit_returned(&mut self, now: Ps, p: u32, bytes: u32) {
        if let Some(c) = self.credits.get_mut(p as usize) {
            *c = (*c + i64::from(bytes)).min(self.credit_initial[p as usize]);
        }
        self.wake_port(now, p);
    }
}
