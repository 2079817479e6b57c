//! Verification: both sides fill or check buffers with the same pattern,
//! a function of the byte offset and a seed the client sends in its Hello.
//! Message `k` uses slot `k % slots` of the buffer, so a slot's bytes are
//! the same whichever message last wrote them.

/// The verification pattern's bytes at `offset..offset + out.len()`.
pub fn fill_pattern(seed: u64, offset: u64, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        let pos = offset + i as u64;
        let w = mix(seed ^ (pos >> 3));
        *b = (w >> ((pos & 7) * 8)) as u8;
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    // Word-wise for speed: same bytes as fill_pattern.
    for (w, chunk) in v.chunks_mut(8).enumerate() {
        let bytes = mix(seed ^ w as u64).to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    v
}

/// The offset of the first byte where `a` and `b` differ, over their
/// common length. Compared a block at a time with the slices' own
/// equality (a vectorised `memcmp`), and byte by byte only inside the
/// block that differs: a byte loop over every message kept a send-bw
/// server, which checks each 64 KiB message as it completes, at 13.8 Gb/s
/// against 61.3 without checking.
pub(crate) fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    const BLOCK: usize = 4096;
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    a.chunks(BLOCK)
        .zip(b.chunks(BLOCK))
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .and_then(|(i, (x, y))| {
            x.iter()
                .zip(y.iter())
                .position(|(p, q)| p != q)
                .map(|at| i * BLOCK + at)
        })
}

#[cfg(test)]
mod tests {
    use super::first_diff;

    #[test]
    fn the_first_difference_is_found_in_any_block() {
        let a: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(first_diff(&a, &a), None);
        for at in [0, 1, 4095, 4096, 4097, 12_345, 19_999] {
            let mut b = a.clone();
            b[at] ^= 0x40;
            // A later difference does not hide the first.
            if at + 5_000 < b.len() {
                b[at + 5_000] ^= 0x01;
            }
            assert_eq!(first_diff(&a, &b), Some(at), "changed byte {at}");
        }
        // Only the common length is compared.
        assert_eq!(first_diff(&a[..100], &a), None);
    }
}
