//! The endpoint's random stream (rkeys, fresh path source ports).
//!
//! Kept as a seed and a position in the ChaCha20 stream, 32 bytes, instead
//! of a live generator with its 256-byte block buffer: draws are rare
//! (memory registration, path replacement), so rebuilding the generator at
//! each costs nothing that matters, while a simulated fabric holds 8192
//! endpoints. The numbers drawn are exactly those of one uninterrupted
//! `ChaCha20Rng` seeded the same way.

use core::convert::Infallible;
use rand_chacha::ChaCha20Rng;
use rand_core::{Rng, SeedableRng, TryRng};

/// A ChaCha20 stream stored as (seed, word position).
#[derive(Debug, Clone)]
pub(crate) struct SeededRng {
    seed: u64,
    word_pos: u128,
}

impl SeededRng {
    /// The stream `ChaCha20Rng::seed_from_u64(seed)` would give.
    pub(crate) fn new(seed: u64) -> Self {
        Self { seed, word_pos: 0 }
    }

    fn draw<T>(&mut self, f: impl FnOnce(&mut ChaCha20Rng) -> T) -> T {
        let mut rng = ChaCha20Rng::seed_from_u64(self.seed);
        rng.set_word_pos(self.word_pos);
        let out = f(&mut rng);
        self.word_pos = rng.get_word_pos();
        out
    }
}

impl TryRng for SeededRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.draw(|r| r.next_u32()))
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.draw(|r| r.next_u64()))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.draw(|r| r.fill_bytes(dst));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_the_same_numbers_as_one_live_generator() {
        let mut live = ChaCha20Rng::seed_from_u64(42);
        let mut stored = SeededRng::new(42);
        for i in 0..200 {
            match i % 3 {
                0 => assert_eq!(stored.next_u64(), live.next_u64()),
                1 => assert_eq!(stored.next_u32(), live.next_u32()),
                _ => {
                    let (mut a, mut b) = ([0u8; 13], [0u8; 13]);
                    stored.fill_bytes(&mut a);
                    live.fill_bytes(&mut b);
                    assert_eq!(a, b);
                }
            }
        }
    }

    #[test]
    fn sixteen_bytes_are_two_u64_draws() {
        // `RegionTable::insert` draws both keys at once on this.
        let mut by_word = SeededRng::new(7);
        let mut by_bytes = SeededRng::new(7);
        for skew in 0..3 {
            for _ in 0..skew {
                by_word.next_u32();
                by_bytes.next_u32();
            }
            let words = [by_word.next_u64(), by_word.next_u64()];
            let mut b = [0u8; 16];
            by_bytes.fill_bytes(&mut b);
            assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), words[0]);
            assert_eq!(u64::from_le_bytes(b[8..].try_into().unwrap()), words[1]);
        }
    }
}
