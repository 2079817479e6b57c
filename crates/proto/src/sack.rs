//! The receiver's view of one path: a cumulative PSN plus a 256-packet SACK
//! bitmap.
//!
//! A path is one ECMP route, so its packets arrive in the order they were
//! sent: a hole in the bitmap means loss, not reordering, and the sender
//! resends at once. Bit `i` of the bitmap stands for PSN `ack_psn + 1 + i`
//! (PSN `ack_psn` itself is, by definition, the first one missing).

use metaroce_wire::{SACK_BITS, SackBits, seq};

/// What one arriving PSN meant for the path window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxOutcome {
    /// The next expected PSN: the cumulative point moved.
    InOrder,
    /// A new PSN beyond a hole: the packets in the hole are lost.
    AfterGap,
    /// Seen before (a duplicate or a spurious retransmission).
    Duplicate,
    /// Too far ahead to record: the sender broke the 256-packet window.
    OutOfWindow,
}

/// Receiver-side sequence state of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SackBitmap {
    ack_psn: u32,
    /// Bit `i` is bit `i % 32` of word `i / 32`. Words of 32 bits rather than
    /// 64 keep the whole bitmap 4-byte aligned: 36 bytes instead of 40 with
    /// padding, which lets each receive path's record shrink by 8 bytes.
    bits: [u32; WORDS],
}

const WORD_BITS: usize = u32::BITS as usize;
const WORDS: usize = SACK_BITS / WORD_BITS;

impl SackBitmap {
    /// A window expecting `first_psn` next.
    pub fn new(first_psn: u32) -> Self {
        Self {
            ack_psn: first_psn,
            bits: [0; WORDS],
        }
    }

    /// Every PSN before this one has arrived.
    pub fn ack_psn(&self) -> u32 {
        self.ack_psn
    }

    /// The highest PSN that has arrived (`ack_psn - 1` if none beyond the
    /// cumulative point).
    pub fn highest_received(&self) -> u32 {
        let top = self
            .bits
            .iter()
            .enumerate()
            .rev()
            .find(|(_, w)| **w != 0)
            .map(|(i, w)| i * WORD_BITS + (WORD_BITS - 1 - w.leading_zeros() as usize));
        match top {
            Some(i) => self.ack_psn.wrapping_add(1 + i as u32),
            None => self.ack_psn.wrapping_sub(1),
        }
    }

    /// Whether `psn` has arrived.
    pub fn contains(&self, psn: u32) -> bool {
        match seq::seq_diff(psn, self.ack_psn) {
            d if d < 0 => true,
            0 => false,
            d if (d as usize) <= SACK_BITS => self.bit(d as usize - 1),
            _ => false,
        }
    }

    /// Record an arriving PSN.
    pub fn record(&mut self, psn: u32) -> RxOutcome {
        let d = seq::seq_diff(psn, self.ack_psn);
        if d < 0 {
            return RxOutcome::Duplicate;
        }
        if d == 0 {
            let run = self.trailing_ones();
            self.ack_psn = self.ack_psn.wrapping_add(1 + run as u32);
            self.shift_right(1 + run);
            return RxOutcome::InOrder;
        }
        let i = d as usize - 1;
        if i >= SACK_BITS {
            return RxOutcome::OutOfWindow;
        }
        if self.bit(i) {
            return RxOutcome::Duplicate;
        }
        self.bits[i / WORD_BITS] |= 1 << (i % WORD_BITS);
        RxOutcome::AfterGap
    }

    /// Slide the window up to `floor`: the sender no longer expects any PSN
    /// below it (each was acknowledged or declared lost and resent under a
    /// new PSN). Holes below the floor stop pinning the cumulative point.
    pub fn advance_to(&mut self, floor: u32) {
        let k = seq::seq_diff(floor, self.ack_psn);
        if k <= 0 {
            return;
        }
        let k = k as usize;
        // Bit k-1 stands for `floor` itself.
        let floor_received = k <= SACK_BITS && self.bit(k - 1);
        self.shift_right(k);
        self.ack_psn = floor;
        if floor_received {
            let run = self.trailing_ones();
            self.ack_psn = self.ack_psn.wrapping_add(1 + run as u32);
            self.shift_right(1 + run);
        }
    }

    /// Whether any PSN beyond the cumulative point has arrived (there is a hole).
    pub fn has_gap(&self) -> bool {
        self.bits.iter().any(|&w| w != 0)
    }

    /// The bitmap as carried in an ACK.
    pub fn to_wire(&self) -> SackBits {
        // Byte `i / 8`, bit `i % 8` stands for bit `i`: words little-endian.
        let mut out = SackBits([0; 32]);
        for (bytes, word) in out.0.chunks_exact_mut(4).zip(&self.bits) {
            bytes.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    fn bit(&self, i: usize) -> bool {
        self.bits[i / WORD_BITS] >> (i % WORD_BITS) & 1 == 1
    }

    fn trailing_ones(&self) -> usize {
        let mut n = 0;
        for &w in &self.bits {
            let t = w.trailing_ones() as usize;
            n += t;
            if t < WORD_BITS {
                break;
            }
        }
        n
    }

    fn shift_right(&mut self, n: usize) {
        if n >= SACK_BITS {
            self.bits = [0; WORDS];
            return;
        }
        let (words, bits) = (n / WORD_BITS, n % WORD_BITS);
        for i in 0..WORDS {
            let lo = self.bits.get(i + words).copied().unwrap_or(0);
            let hi = self.bits.get(i + words + 1).copied().unwrap_or(0);
            self.bits[i] = if bits == 0 {
                lo
            } else {
                (lo >> bits) | (hi << (WORD_BITS - bits))
            };
        }
    }
}

/// Whether the bitmap in an ACK marks `psn` (relative to its `ack_psn`).
pub fn sack_contains(ack_psn: u32, sack: &SackBits, psn: u32) -> bool {
    match seq::seq_diff(psn, ack_psn) {
        d if d < 0 => true,
        0 => false,
        d if (d as usize) <= SACK_BITS => sack.get(d as usize - 1),
        _ => false,
    }
}

/// The highest PSN an ACK reports as received, if it reports any beyond the
/// cumulative point. Every unacknowledged PSN below it is lost.
pub fn sack_highest(ack_psn: u32, sack: &SackBits) -> Option<u32> {
    // Word by word from the top: an in-order path's bitmap is empty, and this
    // runs on every ACK.
    let byte = (0..sack.0.len()).rev().find(|&i| sack.0[i] != 0)?;
    let bit = byte * 8 + 7 - sack.0[byte].leading_zeros() as usize;
    Some(ack_psn.wrapping_add(1 + bit as u32))
}

/// What an ACK says of PSNs `[first, end)` the sender gave up on (an RTO,
/// a SACK gap), when `next` was the first PSN it sent after giving up and
/// `limit` is one past the highest PSN the ACK reports.
///
/// `Some(true)`: one of them arrived after all. `Some(false)`: too late to
/// tell. `None`: not yet known. A SACK bit is proof; a cumulative
/// `ack_psn` past `first` is proof only while nothing from `next` on has
/// arrived, because only those later packets carry a PSN floor
/// (`psn_floor_delta`) that makes the receiver skip what was given up.
pub fn gave_up_arrived(
    ack_psn: u32,
    sack: &SackBits,
    limit: u32,
    (first, end): (u32, u32),
    next: u32,
) -> Option<bool> {
    let in_bitmap = (0..seq::seq_diff(end, first).clamp(0, SACK_BITS as i32 + 1) as u32)
        .map(|k| first.wrapping_add(k))
        .any(|psn| seq::seq_diff(psn, ack_psn) > 0 && sack_contains(ack_psn, sack, psn));
    let later_arrived = seq::seq_lt(next, limit);
    if in_bitmap {
        Some(true)
    } else if seq::seq_lt(first, ack_psn) {
        Some(!later_arrived)
    } else {
        later_arrived.then_some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn a_floor_is_not_taken_for_an_arrival() {
        let none = SackBits::EMPTY;
        // Gave up on 10..12; 12 was the next PSN sent. ack_psn 11: 10 came.
        assert_eq!(gave_up_arrived(11, &none, 11, (10, 12), 12), Some(true));
        // ack_psn 13 with 12 received: 12's floor may have skipped 10..12.
        assert_eq!(gave_up_arrived(13, &none, 13, (10, 12), 12), Some(false));
        // 11 in the bitmap beside a hole at 10: proof, whatever came later.
        let mut bits = SackBits::EMPTY;
        bits.set(0);
        bits.set(2);
        assert_eq!(gave_up_arrived(10, &bits, 14, (10, 12), 12), Some(true));
        // Nothing said yet of 10..12, nothing later arrived: wait.
        assert_eq!(gave_up_arrived(10, &none, 10, (10, 12), 12), None);
    }

    #[test]
    fn in_order_and_gaps() {
        assert_eq!(size_of::<SackBitmap>(), 36);
        let mut w = SackBitmap::new(10);
        assert_eq!(w.record(10), RxOutcome::InOrder);
        assert_eq!(w.record(12), RxOutcome::AfterGap);
        assert_eq!(w.record(13), RxOutcome::AfterGap);
        assert_eq!(w.ack_psn(), 11);
        assert!(w.has_gap());
        assert_eq!(w.record(12), RxOutcome::Duplicate);
        assert_eq!(w.record(11), RxOutcome::InOrder);
        assert_eq!(w.ack_psn(), 14);
        assert!(!w.has_gap());
        assert_eq!(w.record(9), RxOutcome::Duplicate);
        assert_eq!(w.record(14 + 257), RxOutcome::OutOfWindow);
        assert_eq!(w.record(14 + 256), RxOutcome::AfterGap);
    }

    #[test]
    fn wire_bitmap_matches() {
        let mut w = SackBitmap::new(u32::MAX - 2);
        for psn in [u32::MAX, 0, 5, 200] {
            w.record(psn);
        }
        let bits = w.to_wire();
        for psn in [u32::MAX, 0, 5, 200] {
            assert!(sack_contains(w.ack_psn(), &bits, psn));
        }
        assert!(!sack_contains(w.ack_psn(), &bits, 1));
        assert_eq!(sack_highest(w.ack_psn(), &bits), Some(200));
        assert_eq!(sack_highest(0, &SackBits([0; 32])), None);
        let mut top = SackBits([0; 32]);
        top.set(255);
        top.set(3);
        assert_eq!(sack_highest(10, &top), Some(10 + 256));
    }

    #[test]
    fn floor_skips_holes_and_keeps_what_arrived() {
        let mut w = SackBitmap::new(100);
        w.record(101);
        w.record(102);
        w.record(104);
        assert_eq!(w.ack_psn(), 100);
        w.advance_to(101); // 100 is abandoned; 101, 102 arrived
        assert_eq!(w.ack_psn(), 103);
        assert!(w.contains(104) && !w.contains(105));
        w.advance_to(90); // an old floor changes nothing
        assert_eq!(w.ack_psn(), 103);
        w.advance_to(1000); // far beyond the bitmap
        assert_eq!(w.ack_psn(), 1000);
        assert!(!w.has_gap());
    }

    proptest! {
        /// A floor never acknowledges a PSN at or above it that did not arrive,
        /// and every PSN that arrived at or above it is still reported.
        #[test]
        fn floors_are_sound(start in any::<u32>(), arrivals in proptest::collection::vec(0u32..200, 0..100), floor in 0u32..300) {
            let mut w = SackBitmap::new(start);
            let mut seen = BTreeSet::new();
            for off in arrivals {
                if w.record(start.wrapping_add(off)) != RxOutcome::OutOfWindow { seen.insert(off); }
            }
            w.advance_to(start.wrapping_add(floor));
            let bits = w.to_wire();
            for o in floor..floor + 256 {
                let psn = start.wrapping_add(o);
                prop_assert_eq!(sack_contains(w.ack_psn(), &bits, psn), seen.contains(&o), "offset {}", o);
            }
        }

        /// Against a set model: any arrival order, any start near the wrap.
        #[test]
        fn matches_a_set_model(start in any::<u32>(), offsets in proptest::collection::vec(0u32..300, 0..400)) {
            let mut w = SackBitmap::new(start);
            let mut seen = BTreeSet::new();
            for off in offsets {
                let psn = start.wrapping_add(off);
                let cum = seq::seq_diff(w.ack_psn(), start) as u32;
                let outcome = w.record(psn);
                if off >= cum + 257 {
                    prop_assert_eq!(outcome, RxOutcome::OutOfWindow);
                    continue;
                }
                let fresh = seen.insert(off);
                prop_assert_eq!(outcome == RxOutcome::Duplicate, !fresh);
                // cumulative point = first offset not seen
                let expect = (0..).find(|o| !seen.contains(o)).unwrap();
                prop_assert_eq!(w.ack_psn(), start.wrapping_add(expect));
                let bits = w.to_wire();
                for o in expect..expect + 300 {
                    let psn = start.wrapping_add(o);
                    prop_assert_eq!(sack_contains(w.ack_psn(), &bits, psn), seen.contains(&o) && o <= expect + 256);
                    prop_assert_eq!(w.contains(psn), seen.contains(&o) && o <= expect + 256);
                }
            }
        }
    }

    #[test]
    fn highest_received_follows_arrivals_beyond_holes() {
        let mut w = SackBitmap::new(100);
        assert_eq!(w.highest_received(), 99);
        w.record(100);
        assert_eq!(w.highest_received(), 100);
        w.record(104);
        assert_eq!(w.highest_received(), 104);
        w.record(140);
        assert_eq!(w.highest_received(), 140);
        w.record(102);
        assert_eq!(w.highest_received(), 140);
    }
}
