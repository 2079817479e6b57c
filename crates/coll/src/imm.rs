//! The 32-bit immediate data of every write.
//!
//! ```text
//!  31  30  29      22 21                                     0
//! +---+---+----------+----------------------------------------+
//! | 0 | 0 |   slot   |       low 22 bits of the message seq     |  data
//! +---+---+----------+---------+----------+-------------------+
//! | 0 | 1 |   slot   | seq (7) |  cslot   |    cseq (7)       |  data + credit
//! +---+---+----------+---------+----------+-------------------+
//! | 1 |    slot (8)  |        low 23 bits of the message seq    |  credit
//! +---+--------------+------------------------------------------+
//! ```
//!
//! - data: a message landed in staging slot `slot` of the sender's
//!   connection to us; `seq` numbers the messages on that directed
//!   connection (sender → receiver) from 0 for the communicator's life.
//! - credit: the receiver consumed the message `seq` that sat in slot
//!   `slot`, which the sender may now overwrite.
//! - data + credit: both at once, the credit (`cslot`, `cseq`) for a
//!   message of the opposite direction. A rank that owes a peer a credit
//!   and is about to write to that peer anyway lets the credit ride on the
//!   write, instead of a zero-length write of its own: in a small
//!   all-reduce every message is answered by one the other way, so this
//!   halves the datagrams (and their acknowledgements) per operation.
//!
//! Nothing else needs to travel. Both ends derive the same plan from the
//! same operation description, so the connection sequence number alone
//! names the operation, algorithm step and chunk a message belongs to (the
//! plan maps it back); the slot is carried so the receiver need not know the
//! sender's full 64-bit count, and the low sequence bits let it check the
//! message is the one it expects in that slot, turning a mismatched
//! operation order between ranks into an error instead of silent
//! corruption. The check is weaker (7 bits) in a write that carries a
//! credit: a rank whose order is off is still caught at the next plain
//! message, or by a length that does not match the plan.

/// Bit 31 set: a credit.
const CREDIT: u32 = 1 << 31;
/// Bit 30 set (with bit 31 clear): data carrying a credit.
const PIGGYBACK: u32 = 1 << 30;
const SLOT_SHIFT: u32 = 23;
const SEQ_MASK: u32 = (1 << SLOT_SHIFT) - 1;
const DATA_SLOT_SHIFT: u32 = 22;
const DATA_SEQ_BITS: u32 = 22;
/// Sequence bits of each half of a data + credit immediate.
const PIGGY_SEQ_BITS: u32 = 7;

/// Mask of the sequence-number bits a credit immediate carries.
pub const SEQ_BITS_MASK: u64 = SEQ_MASK as u64;

/// The low `bits` bits of a sequence number, as an immediate carries them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqLow {
    /// The bits.
    pub value: u32,
    /// How many (7, 22 or 23).
    pub bits: u32,
}

impl SeqLow {
    const fn of(seq: u64, bits: u32) -> Self {
        Self {
            value: (seq & ((1 << bits) - 1)) as u32,
            bits,
        }
    }

    /// Whether `seq` has these low bits.
    pub const fn matches(self, seq: u64) -> bool {
        seq & ((1 << self.bits) - 1) == self.value as u64
    }
}

impl std::fmt::Display for SeqLow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (low {} bits)", self.value, self.bits)
    }
}

/// A decoded immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Imm {
    /// A data message in `slot`, maybe with a credit for the opposite
    /// direction.
    Data {
        /// Staging slot index.
        slot: u8,
        /// Low bits of the message's connection sequence number.
        seq_low: SeqLow,
        /// A credit riding along: the slot and sequence bits of a message
        /// the writer consumed.
        credit: Option<(u8, SeqLow)>,
    },
    /// The receiver consumed the message in `slot`.
    Credit {
        /// Staging slot index.
        slot: u8,
        /// Low bits of the consumed message's sequence number.
        seq_low: SeqLow,
    },
}

impl Imm {
    /// Packs into 32 bits.
    pub const fn encode(self) -> u32 {
        match self {
            Self::Data {
                slot,
                seq_low,
                credit: None,
            } => ((slot as u32) << DATA_SLOT_SHIFT) | seq_low.value,
            Self::Data {
                slot,
                seq_low,
                credit: Some((cslot, cseq)),
            } => {
                PIGGYBACK
                    | ((slot as u32) << DATA_SLOT_SHIFT)
                    | (seq_low.value << 15)
                    | ((cslot as u32) << PIGGY_SEQ_BITS)
                    | cseq.value
            }
            Self::Credit { slot, seq_low } => {
                CREDIT | ((slot as u32) << SLOT_SHIFT) | seq_low.value
            }
        }
    }

    /// Unpacks 32 bits; every value is some immediate (validity against the
    /// connection's state is the communicator's check).
    pub const fn decode(imm: u32) -> Self {
        if imm & CREDIT != 0 {
            return Self::Credit {
                slot: ((imm >> SLOT_SHIFT) & 0xff) as u8,
                seq_low: SeqLow {
                    value: imm & SEQ_MASK,
                    bits: 23,
                },
            };
        }
        let slot = ((imm >> DATA_SLOT_SHIFT) & 0xff) as u8;
        if imm & PIGGYBACK == 0 {
            return Self::Data {
                slot,
                seq_low: SeqLow {
                    value: imm & ((1 << DATA_SEQ_BITS) - 1),
                    bits: DATA_SEQ_BITS,
                },
                credit: None,
            };
        }
        let low = (1 << PIGGY_SEQ_BITS) - 1;
        Self::Data {
            slot,
            seq_low: SeqLow {
                value: (imm >> 15) & low,
                bits: PIGGY_SEQ_BITS,
            },
            credit: Some((
                ((imm >> PIGGY_SEQ_BITS) & 0xff) as u8,
                SeqLow {
                    value: imm & low,
                    bits: PIGGY_SEQ_BITS,
                },
            )),
        }
    }

    /// A data immediate for message `seq` in `slot`.
    pub const fn data(slot: u8, seq: u64) -> Self {
        Self::Data {
            slot,
            seq_low: SeqLow::of(seq, DATA_SEQ_BITS),
            credit: None,
        }
    }

    /// A data immediate for message `seq` in `slot` carrying the credit for
    /// the consumed message `credit_seq` in `credit_slot`.
    pub const fn data_with_credit(slot: u8, seq: u64, credit_slot: u8, credit_seq: u64) -> Self {
        Self::Data {
            slot,
            seq_low: SeqLow::of(seq, PIGGY_SEQ_BITS),
            credit: Some((credit_slot, SeqLow::of(credit_seq, PIGGY_SEQ_BITS))),
        }
    }

    /// A credit immediate for the consumed message `seq` in `slot`.
    pub const fn credit(slot: u8, seq: u64) -> Self {
        Self::Credit {
            slot,
            seq_low: SeqLow::of(seq, 23),
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
        assert_eq!(Imm::data(3, 5).encode(), 0x00c0_0005);
        assert_eq!(Imm::data(3, (1 << 22) + 5), Imm::data(3, 5));
        assert_eq!(Imm::credit(255, (1 << 23) + 7).encode(), 0xff80_0007);
        assert_eq!(
            Imm::decode(0x8000_0001),
            Imm::Credit {
                slot: 0,
                seq_low: SeqLow { value: 1, bits: 23 }
            }
        );
        // Data in slot 2, message 129 (low 7 bits 1), credit for slot 255,
        // message 3.
        let both = Imm::data_with_credit(2, 129, 255, 3);
        assert_eq!(
            both.encode(),
            0x4000_0000 | 2 << 22 | 1 << 15 | 255 << 7 | 3
        );
        assert_eq!(Imm::decode(both.encode()), both);
        let Imm::Data {
            seq_low,
            credit: Some((cs, cq)),
            ..
        } = both
        else {
            panic!("a data + credit immediate")
        };
        assert!(seq_low.matches(129) && seq_low.matches(1) && !seq_low.matches(130));
        assert_eq!(cs, 255);
        assert!(cq.matches(3 + 128));
    }
}
