//! The 8-byte base header that starts every packet.

use core::ops::{BitOr, BitOrAssign};

use crate::bytes::{get_u16, set_u16};
use crate::{BASE_HEADER_LEN, Error, Result, VERSION};

mod field {
    use crate::bytes::Field;

    pub(super) const VERSION: usize = 0;
    pub(super) const PACKET_TYPE: usize = 1;
    pub(super) const FLAGS: usize = 2;
    pub(super) const PATH_SLOT: usize = 3;
    pub(super) const PATH_GEN: Field = 4..6;
    pub(super) const SRC_DEVICE_PORT: Field = 6..8;
}

/// Per-packet flags of the base header.
///
/// Bits other than the named ones are reserved: emitted as zero and ignored
/// (masked off) on parse, so a later minor revision can give them a meaning
/// that old receivers safely ignore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags(pub u8);

impl Flags {
    /// The sender asks for an immediate ACK instead of a delayed one (set on
    /// the last packet of a burst, or when the sender runs out of window).
    pub const ACK_REQUEST: Self = Self(0x01);
    /// This packet resends a segment that was already sent once. Receivers use
    /// it to keep retransmissions out of their congestion and RTT statistics.
    pub const RETRANSMIT: Self = Self(0x02);
    /// The sender believes every segment of this message was delivered but
    /// has had no completion for it: a receiver missing part of the message
    /// (it dropped payload for want of a posted receive) answers with an RNR
    /// NAK so the sender resends the whole message.
    pub const COMPLETION_PROBE: Self = Self(0x04);
    /// The packet ends with an authentication trailer (packet number and
    /// AES-GCM tag, see [`crate::AuthTrailer`]) instead of the ICRC. It
    /// changes the layout, so both devices must agree on it out of band
    /// (they share a job secret); a receiver that expects authentication
    /// drops packets without it, and one that does not drops packets with it.
    pub const AUTHENTICATED: Self = Self(0x08);
    /// The ICRC trailer is present but not computed (sent as zero): the
    /// sender relies on the UDP checksum to protect the datagram, as the
    /// two devices agreed out of band (wire.md section 7.2). A receiver
    /// that has not agreed checks the trailer as usual, so the packet fails
    /// as `BadChecksum`.
    pub const ICRC_OMITTED: Self = Self(0x10);
    /// Data packets: after this packet the sender has no more new data
    /// queued toward this device. A receiver sharing its link among several
    /// senders stops counting this one at once, instead of an epoch later,
    /// so the others' shares rise as soon as it is done. Receivers that
    /// ignore it only lift those shares later.
    pub const SENDER_DRAINED: Self = Self(0x20);
    /// Data packets: a repair packet. Its payload is not message bytes but
    /// one Reed-Solomon recovery shard computed over the message's data
    /// packets (one shard per packet, `payload_len` bytes each, the last
    /// zero-padded), and its `offset` names the shard, not a byte (see
    /// [`crate::RepairId`]). A receiver missing some data packets rebuilds
    /// them from the others and as many repair packets as it lacks data
    /// packets, without waiting a round trip for a resend.
    pub const REPAIR: Self = Self(0x40);
    /// ACK packets: the SACK bitmap is absent (every bit of it zero), and
    /// the fields after it move up by its 32 bytes. A layout bit like
    /// [`Flags::AUTHENTICATED`], written and read by the ACK's own view
    /// ([`crate::AckPacket`]); not in [`Flags::KNOWN`], so no repr carries
    /// it. Most ACKs acknowledge an in-order path and have nothing to
    /// SACK: without the bitmap an ACK is 40 bytes instead of 72.
    pub const SACK_ABSENT: Self = Self(0x80);
    /// Every defined flag bit a repr carries (all but the layout bit
    /// [`Flags::SACK_ABSENT`]).
    pub const KNOWN: Self = Self(0x7f);

    /// No flag set.
    pub const fn empty() -> Self {
        Self(0)
    }

    /// The raw bits.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Set the bits of `other`.
    pub const fn insert(&mut self, other: Self) {
        self.0 |= other.0;
    }

    /// Clear the bits of `other`.
    pub const fn remove(&mut self, other: Self) {
        self.0 &= !other.0;
    }

    /// Only the bits this version defines.
    pub const fn known(self) -> Self {
        Self(self.0 & Self::KNOWN.0)
    }
}

impl BitOr for Flags {
    type Output = Self;

    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for Flags {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

/// The kind of packet, from the base header's second byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PacketType {
    /// Carries (part of) an RDMA operation or a response to one.
    Data = 1,
    /// Acknowledges data packets of one path and reports operation outcomes.
    Ack = 2,
}

impl TryFrom<u8> for PacketType {
    type Error = Error;

    fn try_from(value: u8) -> Result<Self> {
        match value {
            1 => Ok(Self::Data),
            2 => Ok(Self::Ack),
            other => Err(Error::BadType(other)),
        }
    }
}

/// A read/write view of the base header at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BaseHeader<T> {
    /// Wrap a buffer without checking its length: accessors panic if it is
    /// shorter than [`BASE_HEADER_LEN`].
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wrap a buffer after [`BaseHeader::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Check that the buffer holds a whole base header.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < BASE_HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Protocol version; this crate speaks [`VERSION`] only.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// Raw packet type byte (see [`PacketType`]).
    pub fn packet_type(&self) -> u8 {
        self.buffer.as_ref()[field::PACKET_TYPE]
    }

    /// Flags, reserved bits included.
    pub fn flags(&self) -> Flags {
        Flags(self.buffer.as_ref()[field::FLAGS])
    }

    /// Index of the sender's path this packet belongs to.
    pub fn path_slot(&self) -> u8 {
        self.buffer.as_ref()[field::PATH_SLOT]
    }

    /// Generation of that path slot.
    pub fn path_gen(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::PATH_GEN)
    }

    /// The sending device's base UDP port.
    pub fn src_device_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::SRC_DEVICE_PORT)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BaseHeader<T> {
    /// Set the version byte.
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }

    /// Set the packet type byte.
    pub fn set_packet_type(&mut self, value: PacketType) {
        self.buffer.as_mut()[field::PACKET_TYPE] = value as u8;
    }

    /// Set the flags byte as given (reserved bits included).
    pub fn set_flags(&mut self, value: Flags) {
        self.buffer.as_mut()[field::FLAGS] = value.0;
    }

    /// Set the path slot.
    pub fn set_path_slot(&mut self, value: u8) {
        self.buffer.as_mut()[field::PATH_SLOT] = value;
    }

    /// Set the path generation.
    pub fn set_path_gen(&mut self, value: u16) {
        set_u16(self.buffer.as_mut(), field::PATH_GEN, value);
    }

    /// Set the sending device's base UDP port.
    pub fn set_src_device_port(&mut self, value: u16) {
        set_u16(self.buffer.as_mut(), field::SRC_DEVICE_PORT, value);
    }
}

/// The base header fields a sender chooses (version and type are implied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BaseRepr {
    /// Per-packet flags; only [`Flags::KNOWN`] bits are emitted.
    pub flags: Flags,
    /// Index of the sender's path (0..=255). For ACKs: the data sender's path
    /// being acknowledged, so the ACK can travel back on any path.
    pub path_slot: u8,
    /// Generation of the path slot, bumped whenever the slot is retired and
    /// reused; it keeps late packets of an old path out of the new one's
    /// sequence space.
    pub path_gen: u16,
    /// The sending device's base UDP port. Together with the source IP it
    /// names the peer device, since the UDP source port varies per path (it
    /// is the entropy that steers ECMP hashing).
    pub src_device_port: u16,
}

impl BaseRepr {
    /// Decode the base header. Checks the version and that the type is
    /// `expected`; reserved flag bits are dropped.
    pub(crate) fn parse<T: AsRef<[u8]>>(
        header: &BaseHeader<T>,
        expected: PacketType,
    ) -> Result<Self> {
        if header.version() != VERSION {
            return Err(Error::BadVersion(header.version()));
        }
        let packet_type = header.packet_type();
        if PacketType::try_from(packet_type)? != expected {
            return Err(Error::BadType(packet_type));
        }
        Ok(Self {
            flags: header.flags().known(),
            path_slot: header.path_slot(),
            path_gen: header.path_gen(),
            src_device_port: header.src_device_port(),
        })
    }

    /// Write the base header with version [`VERSION`] and the given type.
    pub(crate) fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        header: &mut BaseHeader<T>,
        packet_type: PacketType,
    ) {
        header.set_version(VERSION);
        header.set_packet_type(packet_type);
        header.set_flags(self.flags.known());
        header.set_path_slot(self.path_slot);
        header.set_path_gen(self.path_gen);
        header.set_src_device_port(self.src_device_port);
    }
}
