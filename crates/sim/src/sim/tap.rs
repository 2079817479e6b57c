//! The tap: a capture point on chosen links (`metaroce sim --pcap FILE
//! --pcap-links tor0-agg1`).
//!
//! A tapped link direction hands every packet it puts on the wire to a
//! recorder the driver installs, as a passive optical tap at the sending end
//! of the cable would see it: after the port's queue (so with the ECN mark a
//! switch gave it) and before the wire's random loss (so a packet the wire
//! then loses is recorded, and missing at the far end). The timestamp is
//! when its last bit left the port. A link that is down carries nothing;
//! packets a switch trimmed are not handed over (the transports that run on
//! tapped links drop them unread).
//!
//! The fabric knows packets only as their [`Wire`] headers and an opaque
//! transport body, so the recorder, not the tap, turns a body into bytes:
//! the tap stays the same for every transport. Untapped runs pay one
//! `Option` test per packet per hop.

use super::Sim;
use crate::error::SimError;
use crate::time::Ps;
use crate::topology::NodeRef;
use crate::transport::{Transport, TransportFactory, Wire};

/// One packet as a tapped link carried it.
#[derive(Debug, Clone, Copy)]
pub struct TappedPacket<'a> {
    /// When its last bit left the port.
    pub at: Ps,
    /// The host that sent it.
    pub src_host: u32,
    /// Its headers as the fabric saw them on this link (ECN as marked so far).
    pub wire: &'a Wire,
}

/// What a tap hands each packet to: the packet and its transport body.
pub type TapRecorder<B> = Box<dyn FnMut(TappedPacket<'_>, &B)>;

/// The tapped link directions and the recorder they feed.
pub(super) struct LinkTap<B> {
    /// Whether each port (link direction) is tapped, by port index.
    tapped: Vec<bool>,
    record: TapRecorder<B>,
}

impl<F: TransportFactory> Sim<F> {
    /// Tap both directions of each link in `links` (its two ends, in either
    /// order), handing every packet they carry to `record`. Replaces an
    /// earlier tap. A pair of nodes with no link between them is an error
    /// naming them.
    pub fn tap_links(
        &mut self,
        links: &[(NodeRef, NodeRef)],
        record: TapRecorder<<F::Host as Transport>::Packet>,
    ) -> Result<(), SimError> {
        let mut tapped = vec![false; self.ports.len()];
        for &(a, b) in links {
            let p = self.link_port(a, b)? as usize;
            tapped[p] = true;
            tapped[self.ports[p].reverse as usize] = true;
        }
        self.tap = Some(LinkTap { tapped, record });
        Ok(())
    }

    /// Packet `k` is leaving port `p` for its wire: record it if `p` is
    /// tapped. Draws no random number, so tapping never changes a run.
    #[inline]
    pub(super) fn tap_departure(&mut self, now: Ps, p: u32, k: u32) {
        let Some(tap) = self.tap.as_mut() else {
            return;
        };
        if !tap.tapped[p as usize] || !self.ports[p as usize].up {
            return;
        }
        let head = self.packets.head(k);
        if head.trimmed {
            return;
        }
        if let Some(body) = self.packets.body(k) {
            let packet = TappedPacket {
                at: now,
                src_host: head.src,
                wire: &head.wire,
            };
            (tap.record)(packet, body);
        }
    }
}
