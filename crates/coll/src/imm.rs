//! The 32-bit immediate data of every write.
//!
//! ```text
//!  31  30        23 22                              0
//! +---+------------+---------------------------------+
//! | K |    slot    |  low 23 bits of the message seq  |
//! +---+------------+---------------------------------+
//! ```
//!
//! - `K = 0`: a data message landed in staging slot `slot` of the sender's
//!   connection to us; `seq` numbers the messages on that directed
//!   connection (sender → receiver) from 0 for the communicator's life.
//! - `K = 1`: a credit: the receiver consumed the message `seq` that sat in
//!   slot `slot`, which the sender may now overwrite.
//!
//! Nothing else needs to travel. Both ends derive the same plan from the
//! same operation description, so the connection sequence number alone
//! names the operation, algorithm step and chunk a message belongs to (the
//! plan maps it back); the slot is carried so the receiver need not know the
//! sender's full 64-bit count, and the 23 sequence bits let it check the
//! message is the one it expects in that slot (at most `slots` messages are
//! outstanding per connection, far fewer than 2^23), turning a mismatched
//! operation order between ranks into an error instead of silent
//! corruption.

/// Bit 31 set: a credit.
const CREDIT: u32 = 1 << 31;
const SLOT_SHIFT: u32 = 23;
const SEQ_MASK: u32 = (1 << SLOT_SHIFT) - 1;

/// Mask of the sequence-number bits an immediate carries.
pub const SEQ_BITS_MASK: u64 = SEQ_MASK as u64;

/// A decoded immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Imm {
    /// A data message in `slot`.
    Data {
        /// Staging slot index.
        slot: u8,
        /// Low 23 bits of the message's connection sequence number.
        seq_low: u32,
    },
    /// The receiver consumed the message in `slot`.
    Credit {
        /// Staging slot index.
        slot: u8,
        /// Low 23 bits of the consumed message's sequence number.
        seq_low: u32,
    },
}

impl Imm {
    /// Packs into 32 bits.
    pub const fn encode(self) -> u32 {
        match self {
            Self::Data { slot, seq_low } => ((slot as u32) << SLOT_SHIFT) | (seq_low & SEQ_MASK),
            Self::Credit { slot, seq_low } => {
                CREDIT | ((slot as u32) << SLOT_SHIFT) | (seq_low & SEQ_MASK)
            }
        }
    }

    /// Unpacks 32 bits; every value is some immediate (validity against the
    /// connection's state is the communicator's check).
    pub const fn decode(imm: u32) -> Self {
        let slot = ((imm >> SLOT_SHIFT) & 0xff) as u8;
        let seq_low = imm & SEQ_MASK;
        if imm & CREDIT != 0 {
            Self::Credit { slot, seq_low }
        } else {
            Self::Data { slot, seq_low }
        }
    }

    /// A data immediate for message `seq` in `slot`.
    pub const fn data(slot: u8, seq: u64) -> Self {
        Self::Data {
            slot,
            seq_low: (seq & SEQ_BITS_MASK) as u32,
        }
    }

    /// A credit immediate for the consumed message `seq` in `slot`.
    pub const fn credit(slot: u8, seq: u64) -> Self {
        Self::Credit {
            slot,
            seq_low: (seq & SEQ_BITS_MASK) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(imm in any::<u32>()) {
            prop_assert_eq!(Imm::decode(imm).encode(), imm);
        }
    }

    #[test]
    fn layout() {
        assert_eq!(Imm::data(3, 5).encode(), 0x0180_0005);
        assert_eq!(Imm::credit(255, (1 << 23) + 7).encode(), 0xff80_0007);
        assert_eq!(
            Imm::decode(0x8000_0001),
            Imm::Credit {
                slot: 0,
                seq_low: 1
            }
        );
    }
}
