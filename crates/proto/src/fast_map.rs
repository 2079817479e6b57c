//! A hash map for the lookups every packet and every post makes: the
//! connection of a peer device (by its address) and the verbs layer's QP
//! table. std's default SipHash costs about as much as the rest of the
//! lookup several times over (some 250 instructions for a `SocketAddr`,
//! measured with callgrind on an 8-byte ping-pong), there to resist
//! collision floods. These tables only ever hold keys this device chose
//! (the peers it connected to, the QPs it created), so a remote sender can
//! make a lookup miss but never lengthen a chain; a multiply-and-rotate
//! over the key's words, seeded, is enough.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// A `HashMap` hashed with [`FastState`].
pub type FastMap<K, V> = HashMap<K, V, FastState>;

/// Builds [`FastHasher`]s from a seed.
#[derive(Debug, Clone, Copy, Default)]
pub struct FastState {
    seed: u64,
}

impl FastState {
    /// Hashers starting from `seed` (maps of different devices hash alike
    /// keys differently).
    pub fn with_seed(seed: u64) -> Self {
        Self { seed }
    }
}

impl BuildHasher for FastState {
    type Hasher = FastHasher;

    fn build_hasher(&self) -> FastHasher {
        FastHasher { state: self.seed }
    }
}

/// Folds each word of the key into the state with a rotate, an xor and a
/// multiply by an odd constant (2^64 / golden ratio); `finish` mixes the
/// high bits down, which `HashMap` takes its bucket index from.
pub struct FastHasher {
    state: u64,
}

const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(23) ^ word).wrapping_mul(MULTIPLIER);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let x = self.state;
        (x ^ (x >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (x >> 29)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.add(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            // The length goes in too: "ab" and "ab\0" differ.
            self.add(u64::from_le_bytes(b) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    /// The keys the endpoint looks up, one per device of a 1,024-host
    /// fabric with 16 devices on each host: no two hash alike, and they
    /// spread over a table's buckets (the low bits) about evenly.
    #[test]
    fn peer_addresses_hash_apart_and_spread() {
        let state = FastState::with_seed(7);
        let keys: Vec<SocketAddr> = (0..1024u32)
            .flat_map(|h| {
                (0..16u16).map(move |d| {
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | h)), 4791 + d)
                })
            })
            .collect();
        let hashes: HashSet<u64> = keys.iter().map(|k| state.hash_one(k)).collect();
        assert_eq!(hashes.len(), keys.len());
        let mut buckets = vec![0u32; 1024];
        for h in &hashes {
            buckets[(*h % 1024) as usize] += 1;
        }
        // 16 keys per bucket on average; a poor hash piles them up.
        assert!(
            buckets.iter().all(|&n| n <= 40),
            "{:?}",
            buckets.iter().max()
        );
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 4791);
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4791);
        assert_ne!(state.hash_one(v6), state.hash_one(v4));
    }

    #[test]
    fn seeds_change_the_hash_and_the_map_works() {
        let k = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4791);
        assert_ne!(
            FastState::with_seed(1).hash_one(k),
            FastState::with_seed(2).hash_one(k)
        );
        let mut m: FastMap<SocketAddr, u32> = FastMap::with_hasher(FastState::with_seed(3));
        m.insert(k, 5);
        assert_eq!(m.get(&k), Some(&5));
        assert_eq!(m.remove(&k), Some(5));
        assert!(m.is_empty());
    }
}
