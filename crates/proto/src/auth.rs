//! Packet authentication (and optional payload encryption) per connection.
//!
//! Anyone on the fabric who knows a device's address and ports can send it
//! datagrams, and can put any source address on them. Without
//! authentication the core trusts a packet as soon as its source address
//! names a connection, so a spoofer could inject WRITEs (it still needs a
//! valid rkey), replay captured ones, or tear down QPs with forged NAKs.
//!
//! With [`AuthConfig`] set, every packet between two devices carries an
//! AES-256-GCM tag (`metaroce_wire::AuthTrailer`), under a key that only
//! holders of the job's secret can derive (the model of UET's secure
//! domains: one secret per job, handed out by the job launcher):
//!
//! ```text
//! key(S -> R) = HKDF-SHA256(ikm  = job_secret,
//!                           salt = "metaroce v1 packet keys",
//!                           info = addr(S) || session(S) || addr(R) || session(R))
//! addr(X)     = X's IPv6 address (IPv4 mapped, 16 bytes) || X's device port (2, big-endian)
//! session(X)  = X's session id (8, big-endian)
//! ```
//!
//! * Each direction of each connection has its own key (sender first in
//!   `info`), so a packet cannot be reflected back to its sender or moved to
//!   another connection.
//! * The session ids are random per endpoint incarnation
//!   ([`Endpoint::session_id`](crate::Endpoint::session_id)) and exchanged
//!   by the connection manager with the QP numbers
//!   ([`Endpoint::set_peer_session`](crate::Endpoint::set_peer_session)).
//!   They make a restarted device use fresh keys: its packet numbers start
//!   again from 0, and under the old key that would reuse GCM nonces (which
//!   leaks the authentication key), and its peers' old packets would pass a
//!   fresh replay window.
//! * The nonce is four zero bytes and the 64-bit packet number, which the
//!   sender increments for every packet of the connection (data and ACKs
//!   alike), so it never repeats under one key.
//! * The receiver keeps an anti-replay window over packet numbers
//!   ([`ReplayWindow`], [`REPLAY_WINDOW_PACKETS`] wide): a number seen
//!   before, or older than the window, is dropped. The window is updated only
//!   after the tag verified, so forged packets cannot move it.
//!
//! Authentication replaces the ICRC (the tag detects corruption too). With
//! `encrypt` the payload is encrypted and the headers are authenticated
//! only: placement needs them, and they say nothing the traffic pattern does
//! not. ACKs have no payload and are authenticated only.

use hkdf::Hkdf;
use metaroce_wire::{AUTH_TAG_LEN, AUTH_TRAILER_LEN, AuthRepr, AuthTrailer};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use sha2::Sha256;
use std::net::{IpAddr, SocketAddr};

/// Packet authentication settings of an endpoint. Every device of a job
/// gets the same secret; without it a device can neither read nor forge
/// the job's packets.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// The job's 32-byte secret (UET calls the equivalent a secure domain key).
    pub job_secret: [u8; 32],
    /// Encrypt payloads too (AES-GCM confidentiality); otherwise payloads are
    /// authenticated in the clear.
    pub encrypt: bool,
    /// The IP address peers reach this device at. It names this device in
    /// key derivation, so it must be the address peers connect to (the
    /// sans-IO core never learns it from the datagrams it gets).
    pub local_ip: IpAddr,
}

impl core::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print the secret (configs end up in logs and test output).
        f.debug_struct("AuthConfig")
            .field("job_secret", &"<redacted>")
            .field("encrypt", &self.encrypt)
            .field("local_ip", &self.local_ip)
            .finish()
    }
}

/// Width of the anti-replay window, in packet numbers. Spraying over many
/// paths reorders a connection's packets by up to the skew between paths
/// times the packet rate (1 ms of skew at 100 Gbit/s of 4 KiB packets is
/// ~3,000 packets); a packet later than this is dropped like a loss and
/// resent under a new number.
pub const REPLAY_WINDOW_PACKETS: u64 = 4096;

const WINDOW_WORDS: usize = (REPLAY_WINDOW_PACKETS / 64) as usize;
const KDF_SALT: &[u8] = b"metaroce v1 packet keys";

/// The 18-byte identity of a device in key derivation: IPv6 (IPv4 mapped)
/// address and device port.
fn addr_bytes(addr: SocketAddr) -> [u8; 18] {
    let ip = match addr.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut out = [0u8; 18];
    out[..16].copy_from_slice(&ip.octets());
    out[16..].copy_from_slice(&addr.port().to_be_bytes());
    out
}

/// The AES-256 key protecting packets from `sender` to `receiver` (each
/// named by its address, device port and session id).
pub fn derive_key(
    job_secret: &[u8; 32],
    (sender, sender_session): (SocketAddr, u64),
    (receiver, receiver_session): (SocketAddr, u64),
) -> [u8; 32] {
    let mut info = [0u8; 2 * (18 + 8)];
    info[..18].copy_from_slice(&addr_bytes(sender));
    info[18..26].copy_from_slice(&sender_session.to_be_bytes());
    info[26..44].copy_from_slice(&addr_bytes(receiver));
    info[44..].copy_from_slice(&receiver_session.to_be_bytes());
    let mut key = [0u8; 32];
    Hkdf::<Sha256>::new(Some(KDF_SALT), job_secret)
        .expand(&info, &mut key)
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    key
}

/// The GCM nonce of packet number `packet_number`.
fn nonce(packet_number: u64) -> [u8; 12] {
    let mut nonce = [0u8; 12];
    nonce[4..].copy_from_slice(&packet_number.to_be_bytes());
    nonce
}

/// Why an authenticated packet was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reject {
    /// Its packet number was seen before or is older than the window.
    Replayed,
    /// The tag does not verify (forged, corrupted, or a wrong key).
    BadTag,
}

/// Which packet numbers were received, over the last
/// [`REPLAY_WINDOW_PACKETS`] below the highest one (RFC 4303's anti-replay
/// window, as a ring bitmap in a fixed array so that no packet allocates).
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// One above the highest packet number accepted (0: none yet).
    top: u64,
    /// Bit `n % REPLAY_WINDOW_PACKETS` set: number `n` (in the window) was accepted.
    bits: [u64; WINDOW_WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplayWindow {
    /// An empty window: every packet number is new.
    pub const fn new() -> Self {
        Self {
            top: 0,
            bits: [0; WINDOW_WORDS],
        }
    }

    fn bit(n: u64) -> (usize, u64) {
        let i = n % REPLAY_WINDOW_PACKETS;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Whether `n` may be new: above everything seen, or inside the window
    /// and not seen yet. Changes nothing.
    pub fn is_fresh(&self, n: u64) -> bool {
        if n >= self.top {
            return true;
        }
        if self.top - n > REPLAY_WINDOW_PACKETS {
            return false;
        }
        let (word, mask) = Self::bit(n);
        self.bits[word] & mask == 0
    }

    /// Record `n` as received (call only after its tag verified and
    /// [`is_fresh`](Self::is_fresh) said yes).
    pub fn accept(&mut self, n: u64) {
        if n >= self.top {
            // Slide: numbers between the old top and n were not received.
            let gap = n - self.top;
            if gap >= REPLAY_WINDOW_PACKETS {
                self.bits = [0; WINDOW_WORDS];
            } else {
                for skipped in self.top..n {
                    let (word, mask) = Self::bit(skipped);
                    self.bits[word] &= !mask;
                }
            }
            self.top = n + 1;
        }
        let (word, mask) = Self::bit(n);
        self.bits[word] |= mask;
    }
}

/// The keys and counters of one connection.
pub(crate) struct ConnectionAuth {
    tx: LessSafeKey,
    rx: LessSafeKey,
    encrypt: bool,
    next_packet_number: u64,
    replay: ReplayWindow,
    /// Where an authenticated-only payload is run through the cipher to
    /// compute its tag (kept to avoid an allocation per packet).
    seal_scratch: Vec<u8>,
}

impl core::fmt::Debug for ConnectionAuth {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ConnectionAuth")
            .field("encrypt", &self.encrypt)
            .field("next_packet_number", &self.next_packet_number)
            .finish_non_exhaustive()
    }
}

impl ConnectionAuth {
    /// Keys for the connection between `local` and `peer`, each given with
    /// its session id.
    pub(crate) fn new(
        config: &AuthConfig,
        local: (SocketAddr, u64),
        peer: (SocketAddr, u64),
    ) -> Self {
        let tx_key = derive_key(&config.job_secret, local, peer);
        let rx_key = derive_key(&config.job_secret, peer, local);
        Self {
            tx: cipher(&tx_key),
            rx: cipher(&rx_key),
            encrypt: config.encrypt,
            next_packet_number: 0,
            replay: ReplayWindow::new(),
            seal_scratch: Vec::new(),
        }
    }

    /// Bytes this state occupies (for the per-connection memory figure).
    pub(crate) fn memory_bytes(&self) -> usize {
        size_of::<Self>() + self.seal_scratch.capacity()
    }

    /// Fill the authentication trailer of `datagram` (headers in
    /// `..header_len`, then the payload, then the zeroed trailer): take the
    /// next packet number, encrypt the payload in place if configured, and
    /// write the tag.
    pub(crate) fn seal(&mut self, datagram: &mut [u8], header_len: usize) {
        let packet_number = self.next_packet_number;
        // 2^64 packets at a billion per second last 584 years: the counter
        // cannot run out in a connection's life, and must never wrap.
        self.next_packet_number = packet_number
            .checked_add(1)
            .expect("packet number space exhausted");
        seal_with(
            &self.tx,
            self.encrypt,
            datagram,
            header_len,
            packet_number,
            &mut self.seal_scratch,
        );
    }

    /// Check an authenticated datagram whose headers end at `header_len`
    /// (the payload follows; ACKs have none): replay window first, then the
    /// tag. Returns the plaintext payload: in `datagram`
    /// itself, or decrypted into `plaintext` when payloads are encrypted.
    /// The packet number is recorded only once the tag verified.
    pub(crate) fn open<'a>(
        &mut self,
        datagram: &'a [u8],
        header_len: usize,
        auth: &AuthRepr,
        plaintext: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], Reject> {
        if !self.replay.is_fresh(auth.packet_number) {
            return Err(Reject::Replayed);
        }
        let payload = open_with(
            &self.rx,
            self.encrypt,
            datagram,
            header_len,
            auth,
            plaintext,
        )?;
        self.replay.accept(auth.packet_number);
        Ok(payload)
    }
}

/// An AES-256-GCM key ready for use (ring: assembly AES-GCM, using the
/// CPU's AES and carry-less multiply instructions, vectorised where the
/// CPU has them).
fn cipher(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte key fits AES-256-GCM"))
}

/// Seal: the tag is AES-256-GCM's over (headers as associated data,
/// payload as plaintext). Encrypted packets carry the ciphertext;
/// authenticated-only packets carry the payload in clear and the same tag
/// (the ciphertext is computed into `scratch` and dropped). Feeding the
/// payload through GCM's encryption path rather than as associated data
/// gives the same authentication and is several times faster in
/// vectorised AES-GCM code, which is tuned for bulk plaintext, not long
/// associated data.
fn seal_with(
    cipher: &LessSafeKey,
    encrypt: bool,
    datagram: &mut [u8],
    header_len: usize,
    packet_number: u64,
    scratch: &mut Vec<u8>,
) {
    let mut trailer = AuthTrailer::new_unchecked(&mut *datagram);
    trailer.set_packet_number(packet_number);
    let covered = trailer.covered_mut();
    let nonce = Nonce::assume_unique_for_key(nonce(packet_number));
    let (headers, payload) = covered.split_at_mut(header_len);
    let tag = if encrypt {
        cipher.seal_in_place_separate_tag(nonce, Aad::from(&*headers), payload)
    } else {
        scratch.clear();
        scratch.extend_from_slice(payload);
        cipher.seal_in_place_separate_tag(nonce, Aad::from(&*headers), scratch)
    }
    .expect("AES-GCM accepts any datagram-sized input");
    let mut tag_bytes = [0u8; AUTH_TAG_LEN];
    tag_bytes.copy_from_slice(tag.as_ref());
    AuthTrailer::new_unchecked(datagram).set_tag(&tag_bytes);
}

/// Open: check the tag (and decrypt into `scratch` when encrypted). An
/// authenticated-only packet is checked by sealing its clear payload again
/// under the same nonce and comparing tags in constant time.
fn open_with<'a>(
    cipher: &LessSafeKey,
    encrypt: bool,
    datagram: &'a [u8],
    header_len: usize,
    auth: &AuthRepr,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], Reject> {
    let covered = &datagram[..datagram.len() - AUTH_TRAILER_LEN];
    let nonce = Nonce::assume_unique_for_key(nonce(auth.packet_number));
    let (headers, payload) = covered.split_at(header_len);
    scratch.clear();
    scratch.extend_from_slice(payload);
    if encrypt {
        cipher
            .open_in_place_separate_tag(
                nonce,
                Aad::from(headers),
                Tag::from(auth.tag),
                scratch,
                0..,
            )
            .map_err(|_| Reject::BadTag)?;
        Ok(scratch)
    } else {
        let tag = cipher
            .seal_in_place_separate_tag(nonce, Aad::from(headers), scratch)
            .map_err(|_| Reject::BadTag)?;
        // Constant time: how many bytes match must not show in the timing.
        let diff = tag
            .as_ref()
            .iter()
            .zip(&auth.tag)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff != 0 {
            return Err(Reject::BadTag);
        }
        Ok(payload)
    }
}

/// Where the headers of an authenticated datagram end (what encryption
/// leaves in the clear): the data header and extension, or the whole ACK.
fn header_len_of(packet: &metaroce_wire::Packet<'_>) -> usize {
    match packet {
        metaroce_wire::Packet::Data { repr, .. } => repr.header_len(),
        metaroce_wire::Packet::Ack(ack) => ack.covered_len(),
    }
}

/// Fill the authentication trailer of a whole emitted datagram (see
/// `metaroce_wire::emit_data`, which leaves it zero) under `key`, with
/// `packet_number`: what a connection does for every packet it sends. For
/// tools and test vectors; `None` if the datagram is not a well-formed
/// authenticated packet.
pub fn seal_with_key(
    key: &[u8; 32],
    encrypt: bool,
    datagram: &mut [u8],
    packet_number: u64,
) -> Option<()> {
    let header_len = header_len_of(&metaroce_wire::parse_authenticated(datagram).ok()?.0);
    let cipher = cipher(key);
    seal_with(
        &cipher,
        encrypt,
        datagram,
        header_len,
        packet_number,
        &mut Vec::new(),
    );
    Some(())
}

/// Check an authenticated datagram's tag under `key` and return its
/// plaintext payload (empty for an ACK); `None` if it is malformed or the
/// tag does not verify. No replay window: for tools and test vectors.
pub fn open_with_key(key: &[u8; 32], encrypt: bool, datagram: &[u8]) -> Option<Vec<u8>> {
    let (packet, auth) = metaroce_wire::parse_authenticated(datagram).ok()?;
    let cipher = cipher(key);
    let mut plaintext = Vec::new();
    let payload = open_with(
        &cipher,
        encrypt,
        datagram,
        header_len_of(&packet),
        &auth,
        &mut plaintext,
    )
    .ok()?;
    Some(payload.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_accepts_each_number_once_in_any_order() {
        let mut w = ReplayWindow::new();
        for n in [5u64, 3, 9, 4, 0, 8] {
            assert!(w.is_fresh(n), "{n}");
            w.accept(n);
            assert!(!w.is_fresh(n), "{n} again");
        }
        for n in [1u64, 2, 6, 7, 10, 1000] {
            assert!(w.is_fresh(n), "{n} never seen");
        }
    }

    #[test]
    fn window_forgets_nothing_inside_and_refuses_everything_below() {
        let mut w = ReplayWindow::new();
        let top = 3 * REPLAY_WINDOW_PACKETS + 17;
        for n in 0..=top {
            w.accept(n);
        }
        // Everything inside the window was seen; below it is too old.
        for n in top + 1 - REPLAY_WINDOW_PACKETS..=top {
            assert!(!w.is_fresh(n), "{n}");
        }
        assert!(!w.is_fresh(top - REPLAY_WINDOW_PACKETS));
        assert!(!w.is_fresh(0));
        assert!(w.is_fresh(top + 1));
    }

    #[test]
    fn window_slide_clears_skipped_numbers() {
        let mut w = ReplayWindow::new();
        w.accept(10);
        // A jump of less than the window: numbers skipped over stay fresh,
        // including ones whose bits were used by numbers a window ago.
        w.accept(10 + REPLAY_WINDOW_PACKETS - 1);
        assert!(!w.is_fresh(10));
        assert!(w.is_fresh(11));
        w.accept(10 + REPLAY_WINDOW_PACKETS + 5);
        // 10 fell out of the window: too old now, which is a refusal too.
        assert!(!w.is_fresh(10));
        assert!(w.is_fresh(10 + REPLAY_WINDOW_PACKETS));
        // A jump past a whole window clears everything.
        w.accept(100 * REPLAY_WINDOW_PACKETS);
        assert!(w.is_fresh(100 * REPLAY_WINDOW_PACKETS - 1));
        assert!(!w.is_fresh(100 * REPLAY_WINDOW_PACKETS));
    }

    #[test]
    fn keys_differ_per_direction_session_and_secret() {
        let a: SocketAddr = "10.0.0.1:4791".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let secret = [7u8; 32];
        let ab = derive_key(&secret, (a, 1), (b, 2));
        assert_ne!(ab, derive_key(&secret, (b, 2), (a, 1)));
        assert_ne!(ab, derive_key(&secret, (a, 3), (b, 2)));
        assert_ne!(ab, derive_key(&secret, (a, 1), (b, 4)));
        assert_ne!(ab, derive_key(&[8u8; 32], (a, 1), (b, 2)));
        let b_other_port: SocketAddr = "10.0.0.2:4792".parse().unwrap();
        assert_ne!(ab, derive_key(&secret, (a, 1), (b_other_port, 2)));
        assert_eq!(ab, derive_key(&secret, (a, 1), (b, 2)));
    }

    fn pair(encrypt: bool) -> (ConnectionAuth, ConnectionAuth) {
        let a: SocketAddr = "10.0.0.1:4791".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let cfg = AuthConfig {
            job_secret: [1; 32],
            encrypt,
            local_ip: a.ip(),
        };
        (
            ConnectionAuth::new(&cfg, (a, 11), (b, 22)),
            ConnectionAuth::new(&cfg, (b, 22), (a, 11)),
        )
    }

    fn datagram(header: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut d = header.to_vec();
        d.extend_from_slice(payload);
        d.extend_from_slice(&[0; 24]);
        d
    }

    fn auth_of(d: &[u8]) -> AuthRepr {
        AuthRepr::parse(&AuthTrailer::new_checked(d).unwrap()).unwrap()
    }

    #[test]
    fn sealed_packets_open_once_and_tampering_fails() {
        for encrypt in [false, true] {
            let (mut a, mut b) = pair(encrypt);
            let mut scratch = Vec::new();
            let mut d = datagram(b"HEADERSHEADERS", b"payload bytes");
            a.seal(&mut d, 14);
            assert_eq!(&d[..14], b"HEADERSHEADERS");
            assert_eq!(&d[14..27] != b"payload bytes", encrypt);
            let auth = auth_of(&d);
            assert_eq!(auth.packet_number, 0);
            assert_eq!(
                b.open(&d, 14, &auth, &mut scratch),
                Ok(&b"payload bytes"[..])
            );
            assert_eq!(b.open(&d, 14, &auth, &mut scratch), Err(Reject::Replayed));
            // Every single-bit change fails, trailer included.
            let mut d2 = datagram(b"HEADERSHEADERS", b"payload bytes");
            a.seal(&mut d2, 14);
            for bit in 0..d2.len() * 8 {
                let mut bad = d2.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                let result = b.open(&bad, 14, &auth_of(&bad), &mut scratch);
                assert!(result.is_err(), "bit {bit} accepted (encrypt {encrypt})");
            }
            // A reflected packet (our own, sent back to us) fails: other key.
            let mut d3 = datagram(b"HEADERSHEADERS", b"x");
            a.seal(&mut d3, 14);
            assert_eq!(
                a.open(&d3, 14, &auth_of(&d3), &mut scratch),
                Err(Reject::BadTag)
            );
            // The genuine one still opens after all those failures.
            assert!(b.open(&d2, 14, &auth_of(&d2), &mut scratch).is_ok());
        }
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let cfg = AuthConfig {
            job_secret: [0xab; 32],
            encrypt: false,
            local_ip: "10.0.0.1".parse().unwrap(),
        };
        let text = format!("{cfg:?}");
        assert!(text.contains("redacted"));
        assert!(!text.contains("171"), "{text}");
    }
}
