//! Where staging slots live in each rank's staging area.
//!
//! A rank's staging area is registered once for the communicator and is the
//! only memory peers write into. It holds, for every other rank, `slots`
//! *incoming* slots (where that peer's messages to us land) followed by, for
//! every other rank, `slots` *outgoing* slots (where we build a message that
//! needs computing before it goes out, e.g. a partial sum in a ring
//! reduce-scatter). Each slot is `slot_bytes` long and a message always
//! starts at its slot's first byte.
//!
//! ```text
//! | in: peer 0 slots 0..S | in: peer 1 ... | out: peer 0 slots 0..S | out: peer 1 ... |
//! ```
//!
//! Peers are numbered without ourselves (rank `p` is peer `p` below us and
//! `p - 1` above), so a rank needs `2 (world-1) slots slot_bytes` bytes. The
//! layout is a pure function of (world, rank, slots, slot_bytes): a sender
//! computes where its message lands in the receiver's area without asking.

use crate::action::Rank;

/// The staging geometry of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingLayout {
    world: u32,
    rank: Rank,
    slots: u32,
    slot_bytes: u64,
}

impl StagingLayout {
    /// The layout of `rank` in a communicator of `world` ranks.
    pub const fn new(world: u32, rank: Rank, slots: u32, slot_bytes: u64) -> Self {
        Self {
            world,
            rank,
            slots,
            slot_bytes,
        }
    }

    /// Total bytes the rank must register.
    pub const fn bytes(&self) -> u64 {
        2 * self.peer_count() * self.slots as u64 * self.slot_bytes
    }

    /// Slots per peer and direction.
    pub const fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes per slot.
    pub const fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    const fn peer_count(&self) -> u64 {
        self.world.saturating_sub(1) as u64
    }

    /// Index of `peer` among `viewer`'s peers.
    const fn peer_index(viewer: Rank, peer: Rank) -> u64 {
        if peer < viewer {
            peer as u64
        } else {
            peer as u64 - 1
        }
    }

    /// Offset of incoming slot `slot` for messages from `peer`.
    pub const fn in_slot(&self, peer: Rank, slot: u32) -> u64 {
        (Self::peer_index(self.rank, peer) * self.slots as u64 + slot as u64) * self.slot_bytes
    }

    /// Offset of outgoing slot `slot` for messages to `peer`.
    pub const fn out_slot(&self, peer: Rank, slot: u32) -> u64 {
        let half = self.peer_count() * self.slots as u64 * self.slot_bytes;
        half + (Self::peer_index(self.rank, peer) * self.slots as u64 + slot as u64)
            * self.slot_bytes
    }

    /// Offset, in `peer`'s staging area, of its incoming slot `slot` for
    /// messages from this rank.
    pub const fn remote_in_slot(&self, peer: Rank, slot: u32) -> u64 {
        (Self::peer_index(peer, self.rank) * self.slots as u64 + slot as u64) * self.slot_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_and_receiver_agree() {
        let (world, slots, bytes) = (5, 3, 64);
        for a in 0..world {
            for b in 0..world {
                if a == b {
                    continue;
                }
                let la = StagingLayout::new(world, a, slots, bytes);
                let lb = StagingLayout::new(world, b, slots, bytes);
                for s in 0..slots {
                    assert_eq!(la.remote_in_slot(b, s), lb.in_slot(a, s));
                    assert!(lb.in_slot(a, s) + bytes <= lb.bytes() / 2);
                    assert!(la.out_slot(b, s) >= la.bytes() / 2);
                    assert!(la.out_slot(b, s) + bytes <= la.bytes());
                }
            }
        }
        assert_eq!(StagingLayout::new(1, 0, 4, 1024).bytes(), 0);
        assert_eq!(StagingLayout::new(8, 3, 4, 1024).bytes(), 2 * 7 * 4 * 1024);
    }
}
