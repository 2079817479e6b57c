//! The authentication trailer of packets that carry [`Flags::AUTHENTICATED`].
//!
//! When two devices share a job secret, every packet between them is
//! protected by AES-256-GCM under a key of its own connection and direction
//! (the protocol core derives the keys; this crate only lays out the bytes).
//! Such a packet ends, instead of the 4-byte ICRC, with
//!
//! ```text
//! ... covered bytes ... | packet_number (8) | tag (16)
//! ```
//!
//! * `packet_number` counts the packets the sender sent on this connection in
//!   this direction. It is the AEAD nonce (four zero bytes, then the number,
//!   big-endian), so it is never repeated under one key, and the receiver's
//!   anti-replay window works on it. A changed number changes the nonce, so
//!   it is authenticated without being part of the associated data.
//! * `tag` is the AES-256-GCM tag of encrypting the payload with the headers
//!   as associated data. Encrypted packets carry that ciphertext;
//!   authenticated-only packets carry the payload in clear (the receiver
//!   recomputes the tag). See `docs/spec/wire.md`.
//!
//! The tag replaces the ICRC: it detects corruption as well as forgery, so a
//! second checksum would only cost time.
//!
//! Nothing here can check a tag: that needs the key. [`crate::parse`]
//! therefore refuses authenticated datagrams ([`Error::NeedsKey`]), and
//! [`parse_authenticated`] checks their structure and fields and hands back
//! the trailer for the caller to verify before acting on the packet.

use crate::base::{BaseHeader, Flags, PacketType};
use crate::bytes::get_u64;
use crate::{AckPacket, AckRepr, DataPacket, DataRepr, Error, Packet, Result, VERSION};

/// Length of the packet number in the authentication trailer.
pub const PACKET_NUMBER_LEN: usize = 8;
/// Length of the AES-GCM tag in the authentication trailer.
pub const AUTH_TAG_LEN: usize = 16;
/// Length of the whole authentication trailer (packet number and tag).
pub const AUTH_TRAILER_LEN: usize = PACKET_NUMBER_LEN + AUTH_TAG_LEN;

/// Length of the trailer a packet with these flags ends with: the ICRC, or
/// the authentication trailer when [`Flags::AUTHENTICATED`] is set.
pub const fn trailer_len(flags: Flags) -> usize {
    if flags.contains(Flags::AUTHENTICATED) {
        AUTH_TRAILER_LEN
    } else {
        crate::ICRC_LEN
    }
}

/// A read/write view of the authentication trailer at the end of a
/// datagram (the whole datagram is wrapped, like the other views).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthTrailer<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AuthTrailer<T> {
    /// Wrap a datagram without checks: accessors panic if it is shorter than
    /// [`AUTH_TRAILER_LEN`].
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wrap a datagram after [`AuthTrailer::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let trailer = Self::new_unchecked(buffer);
        trailer.check_len()?;
        Ok(trailer)
    }

    /// Check that the datagram holds a base header and the trailer. After
    /// this succeeds no accessor panics.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < crate::BASE_HEADER_LEN + AUTH_TRAILER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn start(&self) -> usize {
        self.buffer.as_ref().len() - AUTH_TRAILER_LEN
    }

    /// Everything before the trailer: what the tag covers.
    pub fn covered(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.start()]
    }

    /// The sender's packet number (the nonce).
    pub fn packet_number(&self) -> u64 {
        let at = self.start();
        get_u64(self.buffer.as_ref(), at..at + PACKET_NUMBER_LEN)
    }

    /// The AES-GCM tag.
    pub fn tag(&self) -> [u8; AUTH_TAG_LEN] {
        let mut tag = [0u8; AUTH_TAG_LEN];
        tag.copy_from_slice(&self.buffer.as_ref()[self.start() + PACKET_NUMBER_LEN..]);
        tag
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AuthTrailer<T> {
    /// Set the packet number.
    pub fn set_packet_number(&mut self, value: u64) {
        let at = self.start();
        self.buffer.as_mut()[at..at + PACKET_NUMBER_LEN].copy_from_slice(&value.to_be_bytes());
    }

    /// Set the tag.
    pub fn set_tag(&mut self, value: &[u8; AUTH_TAG_LEN]) {
        let at = self.start() + PACKET_NUMBER_LEN;
        self.buffer.as_mut()[at..].copy_from_slice(value);
    }

    /// The covered bytes, mutably (to encrypt the payload in place).
    pub fn covered_mut(&mut self) -> &mut [u8] {
        let end = self.start();
        &mut self.buffer.as_mut()[..end]
    }
}

/// The decoded authentication trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct AuthRepr {
    /// The sender's packet number on this connection and direction.
    pub packet_number: u64,
    /// The AES-GCM tag as carried (unverified).
    pub tag: [u8; AUTH_TAG_LEN],
}

impl AuthRepr {
    /// Decode the trailer (nothing to validate: every value is possible).
    pub fn parse<T: AsRef<[u8]>>(trailer: &AuthTrailer<T>) -> Result<Self> {
        trailer.check_len()?;
        Ok(Self {
            packet_number: trailer.packet_number(),
            tag: trailer.tag(),
        })
    }

    /// Write the trailer into the last [`AUTH_TRAILER_LEN`] bytes of the
    /// wrapped datagram.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, trailer: &mut AuthTrailer<T>) {
        trailer.set_packet_number(self.packet_number);
        trailer.set_tag(&self.tag);
    }
}

/// Parse an authenticated datagram: version, type, lengths (with the
/// 24-byte trailer) and field rules, exactly as [`crate::parse`] does for
/// ICRC-protected ones, and return the packet with its trailer.
///
/// **The tag is not verified**: nothing in the packet may be acted on
/// before the caller has checked the tag with the connection key. A datagram
/// without [`Flags::AUTHENTICATED`] is `Malformed("flags")`.
pub fn parse_authenticated(datagram: &[u8]) -> Result<(Packet<'_>, AuthRepr)> {
    let Some(&version) = datagram.first() else {
        return Err(Error::Truncated);
    };
    if version != VERSION {
        return Err(Error::BadVersion(version));
    }
    let header = BaseHeader::new_checked(datagram)?;
    if !header.flags().contains(Flags::AUTHENTICATED) {
        return Err(Error::Malformed("flags"));
    }
    let packet = match PacketType::try_from(header.packet_type())? {
        PacketType::Data => {
            let repr = DataRepr::parse(&DataPacket::new_checked(datagram)?)?;
            let payload = &datagram[repr.header_len()..datagram.len() - AUTH_TRAILER_LEN];
            Packet::Data { repr, payload }
        }
        PacketType::Ack => Packet::Ack(AckRepr::parse(&AckPacket::new_checked(datagram)?)?),
    };
    let auth = AuthRepr::parse(&AuthTrailer::new_checked(datagram)?)?;
    Ok((packet, auth))
}
