//! Packets in flight: the fabric's record of each, and the slab that holds
//! them.
//!
//! A packet is an index into the slab. The record switches read at every
//! hop ([`PacketHead`]) is kept apart from the transport's body (the core's
//! parsed headers, ~100 B), which only the receiving host reads: the
//! records hops touch stay small and dense, so a hop costs fewer cache
//! misses. Released indices are reused, so a run in its steady state
//! allocates no packet records.

use super::port::{CTRL, DATA};
use crate::paged::PagedVec;
use crate::transport::Wire;

/// What the fabric reads of a packet at every hop.
#[derive(Debug, Clone, Copy)]
pub(super) struct PacketHead {
    /// Headers as the fabric sees them (5-tuple, length, ECN bits).
    pub(super) wire: Wire,
    /// Sending host.
    pub(super) src: u32,
    /// At a switch, the port index it came in on (where PFC and credits
    /// account it); 0 at a host.
    pub(super) in_port: u16,
    /// A switch cut its payload away.
    pub(super) trimmed: bool,
}

impl PacketHead {
    /// The priority it queues at: control packets and trimmed headers go
    /// ahead of data, and PFC never pauses them.
    #[inline]
    pub(super) fn priority(&self) -> usize {
        if self.wire.control || self.trimmed {
            CTRL
        } else {
            DATA
        }
    }
}

/// The packet slab: heads and transport bodies by the same index, and the
/// indices free for reuse.
pub(super) struct Packets<B> {
    heads: PagedVec<PacketHead>,
    bodies: PagedVec<Option<B>>,
    free: PagedVec<u32>,
}

impl<B> Packets<B> {
    /// An empty slab.
    pub(super) fn new() -> Self {
        Self {
            heads: PagedVec::new(),
            bodies: PagedVec::new(),
            free: PagedVec::new(),
        }
    }

    /// Store a new packet; returns its index.
    #[inline]
    pub(super) fn alloc(&mut self, head: PacketHead, body: B) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.heads[i as usize] = head;
                self.bodies[i as usize] = Some(body);
                i
            }
            None => {
                self.heads.push(head);
                self.bodies.push(Some(body));
                self.heads.len() as u32 - 1
            }
        }
    }

    /// Packet `k` is gone (delivered, dropped or lost): free its index.
    #[inline]
    pub(super) fn release(&mut self, k: u32) {
        self.bodies[k as usize] = None;
        self.free.push(k);
    }

    /// Packet `k`'s head.
    #[inline]
    pub(super) fn head(&self, k: u32) -> &PacketHead {
        &self.heads[k as usize]
    }

    /// Packet `k`'s head, to mark or trim it.
    #[inline]
    pub(super) fn head_mut(&mut self, k: u32) -> &mut PacketHead {
        &mut self.heads[k as usize]
    }

    /// Packet `k`'s transport body, left in place (for a tap).
    #[inline]
    pub(super) fn body(&self, k: u32) -> Option<&B> {
        self.bodies[k as usize].as_ref()
    }

    /// Packet `k`'s transport body, for the receiving host.
    #[inline]
    pub(super) fn take_body(&mut self, k: u32) -> Option<B> {
        self.bodies[k as usize].take()
    }

    /// Records ever allocated (the slab's high-water mark).
    pub(super) fn slots(&self) -> usize {
        self.heads.len()
    }
}
