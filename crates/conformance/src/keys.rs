//! Packet authentication as wire.md §7.1 specifies it, written from the
//! spec (not shared with the core, so the suite checks the core's reading
//! of the spec rather than repeating it): HKDF-SHA256 key derivation per
//! direction, AES-256-GCM tags with the packet number as nonce, headers as
//! associated data, the payload as plaintext.

use std::net::SocketAddr;

use metaroce_wire::AUTH_TAG_LEN;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use ring::hkdf;

/// HKDF salt (wire.md §7.1).
const KDF_SALT: &[u8] = b"metaroce v1 packet keys";

/// `addr(X)`: the IP as 16 bytes (IPv4 mapped into IPv6) and the device port.
fn addr_bytes(addr: SocketAddr) -> [u8; 18] {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    let mut out = [0u8; 18];
    out[..16].copy_from_slice(&ip.octets());
    out[16..].copy_from_slice(&addr.port().to_be_bytes());
    out
}

struct KeyLen;

impl hkdf::KeyType for KeyLen {
    fn len(&self) -> usize {
        32
    }
}

/// The 32-byte key of the direction from `sender` to `receiver` (devices
/// named by IP and device port, with their session ids).
pub fn derive_key(
    job_secret: &[u8; 32],
    sender: SocketAddr,
    sender_session: u64,
    receiver: SocketAddr,
    receiver_session: u64,
) -> [u8; 32] {
    let mut info = Vec::with_capacity(52);
    info.extend_from_slice(&addr_bytes(sender));
    info.extend_from_slice(&sender_session.to_be_bytes());
    info.extend_from_slice(&addr_bytes(receiver));
    info.extend_from_slice(&receiver_session.to_be_bytes());
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, KDF_SALT).extract(job_secret);
    let info_parts = [info.as_slice()];
    let okm = prk
        .expand(&info_parts, KeyLen)
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    let mut key = [0u8; 32];
    okm.fill(&mut key)
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    key
}

/// The 12-byte GCM nonce: 4 zero bytes and the packet number.
fn nonce(packet_number: u64) -> Nonce {
    let mut bytes = [0u8; 12];
    bytes[4..].copy_from_slice(&packet_number.to_be_bytes());
    Nonce::assume_unique_for_key(bytes)
}

/// One direction's key, and whether payloads are encrypted.
pub(crate) struct DirectionKey {
    cipher: LessSafeKey,
    encrypt: bool,
}

impl DirectionKey {
    /// A key from its 32 bytes.
    pub(crate) fn new(key: &[u8; 32], encrypt: bool) -> Self {
        let unbound = UnboundKey::new(&AES_256_GCM, key).expect("AES-256 takes 32-byte keys");
        Self {
            cipher: LessSafeKey::new(unbound),
            encrypt,
        }
    }

    /// Seal a datagram in place: `headers` are the covered bytes before the
    /// payload, `payload` is replaced by its ciphertext when encrypting;
    /// returns the tag of packet number `packet_number`.
    pub(crate) fn seal(
        &self,
        packet_number: u64,
        headers: &[u8],
        payload: &mut [u8],
    ) -> [u8; AUTH_TAG_LEN] {
        let tag = if self.encrypt {
            self.cipher.seal_in_place_separate_tag(
                nonce(packet_number),
                Aad::from(headers),
                payload,
            )
        } else {
            // Authenticate only: the tag of encrypting the clear payload;
            // the ciphertext is thrown away (wire.md §7.1).
            let mut scratch = payload.to_vec();
            self.cipher.seal_in_place_separate_tag(
                nonce(packet_number),
                Aad::from(headers),
                &mut scratch,
            )
        };
        let tag = tag.expect("AES-GCM seals any packet-sized input");
        let mut out = [0u8; AUTH_TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Check a received datagram's tag; on success return the clear payload
    /// (decrypted when encrypting).
    pub(crate) fn open(
        &self,
        packet_number: u64,
        headers: &[u8],
        payload: &[u8],
        tag: &[u8; AUTH_TAG_LEN],
    ) -> Option<Vec<u8>> {
        if self.encrypt {
            let mut buf = payload.to_vec();
            let opened = self
                .cipher
                .open_in_place_separate_tag(
                    nonce(packet_number),
                    Aad::from(headers),
                    Tag::from(*tag),
                    &mut buf,
                    0..,
                )
                .ok()?;
            Some(opened.to_vec())
        } else {
            let mut scratch = payload.to_vec();
            let want = self.seal(packet_number, headers, &mut scratch);
            // A test tool: timing does not matter, but compare whole tags anyway.
            let same = want.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
            same.then(|| payload.to_vec())
        }
    }
}
