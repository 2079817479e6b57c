//! What a device remembers about dead routes to a peer after the
//! connection that learned it is gone.
//!
//! A route is a property of the 5-tuple, not of a connection: our ACKs to a
//! peer from source port `x` take the same links whichever connection sends
//! them. Collective libraries and the simulator's channels close a
//! connection when its last QP goes and open a new one for the next step,
//! tens of microseconds later; without this memory the new connection
//! would ack into a failed link again from the port the old one had just
//! learned to avoid, and again find out the slow way (a lost ACK, a probe).

use crate::connection::RouteEvidence;
use std::net::SocketAddr;

/// Peers remembered at most; the oldest entry goes first.
const MAX_PEERS: usize = 64;
/// How long evidence stays good. A failed link may be repaired, but
/// avoiding a healthy port costs one port of the span, nothing more.
const EVIDENCE_LIFETIME_NS: u64 = 10_000_000;

/// Recently closed connections' evidence of dead routes, by peer.
#[derive(Debug, Default)]
pub(crate) struct RouteMemory {
    entries: Vec<(SocketAddr, RouteEvidence, u64)>,
}

impl RouteMemory {
    /// Keep `evidence` about `peer`, learned until `now_ns` (nothing kept if
    /// it holds nothing).
    pub(crate) fn save(&mut self, peer: SocketAddr, evidence: RouteEvidence, now_ns: u64) {
        self.entries.retain(|(p, _, _)| *p != peer);
        if evidence.is_empty() {
            return;
        }
        if self.entries.len() >= MAX_PEERS {
            self.entries.remove(0);
        }
        self.entries.push((peer, evidence, now_ns));
    }

    /// Take what is remembered about `peer`, if it is recent.
    pub(crate) fn take(&mut self, peer: SocketAddr, now_ns: u64) -> Option<RouteEvidence> {
        let i = self.entries.iter().position(|(p, _, _)| *p == peer)?;
        let (_, evidence, saved_ns) = self.entries.remove(i);
        (now_ns.saturating_sub(saved_ns) < EVIDENCE_LIFETIME_NS).then_some(evidence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 4793))
    }

    fn evidence(port: u16) -> RouteEvidence {
        RouteEvidence {
            bad_ack_ports: [port, 0, 0, 0],
        }
    }

    #[test]
    fn evidence_outlives_the_connection_for_a_while() {
        let mut m = RouteMemory::default();
        m.save(peer(1), evidence(4804), 1_000);
        assert_eq!(m.take(peer(2), 2_000), None);
        assert_eq!(m.take(peer(1), 2_000), Some(evidence(4804)));
        // Taken: the new connection holds it now.
        assert_eq!(m.take(peer(1), 3_000), None);
        m.save(peer(1), evidence(4804), 1_000);
        assert_eq!(m.take(peer(1), 1_000 + EVIDENCE_LIFETIME_NS), None);
    }

    #[test]
    fn bounded_and_empty_evidence_is_not_kept() {
        let mut m = RouteMemory::default();
        m.save(peer(1), RouteEvidence::default(), 0);
        assert!(m.entries.is_empty());
        for i in 0..=MAX_PEERS as u16 {
            m.save(
                SocketAddr::from(([10, 0, 1, i as u8], i)),
                evidence(4800 + i),
                0,
            );
        }
        assert_eq!(m.entries.len(), MAX_PEERS);
        assert_eq!(m.take(SocketAddr::from(([10, 0, 1, 0], 0)), 1), None);
    }
}
