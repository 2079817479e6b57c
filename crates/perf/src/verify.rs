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

pub(crate) fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}
