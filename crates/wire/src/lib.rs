//! MetaRoCE wire format, version 1.
//!
//! MetaRoCE carries RDMA operations (WRITE, SEND, READ, atomics) over plain
//! UDP datagrams, spreading each queue pair's traffic over many network paths.
//! This crate owns the bytes on the wire and nothing else: it knows how to
//! read and write packets, and which field combinations are meaningful, but
//! keeps no connection state.
//!
//! The design follows smoltcp's split:
//!
//! * typed *views* over byte buffers ([`BaseHeader`], [`DataPacket`],
//!   [`AckPacket`]) with `new_unchecked`, `new_checked` and `check_len`;
//!   once `new_checked` has accepted a buffer, no accessor can panic;
//! * validated *reprs* ([`DataRepr`], [`AckRepr`]) that hold the decoded
//!   fields and can be emitted back into a buffer.
//!
//! Most users only need [`parse`], [`emit_data`] and [`emit_ack`]. Nothing in
//! this crate allocates while parsing or emitting.
//!
//! ```
//! use metaroce_wire::{BaseRepr, DataRepr, Flags, OpHeader, Packet, emit_data, parse};
//!
//! let repr = DataRepr {
//!     base: BaseRepr { flags: Flags::ACK_REQUEST, path_slot: 3, path_gen: 1, src_device_port: 4791 },
//!     psn: 17,
//!     timestamp_ns: 123,
//!     dst_qpn: 5,
//!     msg_seq: 2,
//!     solicited: false,
//!     psn_floor_delta: 0,
//!     floor_acked: false,
//!     msg_len: 8192,
//!     offset: 4096,
//!     op: OpHeader::Write { rkey: 0x42, remote_addr: 0x1000 },
//!     payload_len: 4,
//! };
//! let mut buf = [0u8; 1500];
//! let len = emit_data(&repr, b"data", &mut buf);
//! assert_eq!(len, repr.buffer_len());
//! let packet = parse(&buf[..len])?;
//! assert_eq!(packet, Packet::Data { repr, payload: b"data" });
//! assert!(packet.to_string().starts_with("DATA slot=3 gen=1 psn=17 qpn=5 msg=2 WRITE off=4096/8192 len=4"));
//! # Ok::<(), metaroce_wire::Error>(())
//! ```
//!
//! The normative description of the format lives in `docs/spec/wire.md`;
//! test vectors live in `docs/spec/vectors/`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod ack;
mod auth;
mod base;
mod bytes;
mod data;
mod display;
pub mod seq;

#[cfg(test)]
mod tests;

pub use ack::{AckPacket, AckRepr, OpAck, SackBits, SackIter, Syndrome};
pub use auth::{
    AUTH_TAG_LEN, AUTH_TRAILER_LEN, AuthRepr, AuthTrailer, PACKET_NUMBER_LEN, parse_authenticated,
    trailer_len,
};
pub use base::{BaseHeader, BaseRepr, Flags, PacketType};
pub use data::{DataPacket, DataRepr, OpHeader, Opcode, RepairId};

/// The only protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Length of the base header carried by every packet.
pub const BASE_HEADER_LEN: usize = 8;
/// Length of base header plus data header, before the opcode extension.
pub const DATA_HEADER_LEN: usize = 36;
/// Length of the invariant CRC trailer that ends every packet.
pub const ICRC_LEN: usize = 4;
/// Length of an ACK before its op-ack entries (base header included).
pub const ACK_FIXED_LEN: usize = 68;
/// Length of the selective-ACK bitmap, absent from an ACK with
/// [`Flags::SACK_ABSENT`].
pub const SACK_LEN: usize = 32;
/// Length of an ACK without its SACK bitmap before its op-ack entries.
pub const ACK_COMPACT_FIXED_LEN: usize = ACK_FIXED_LEN - SACK_LEN;
/// Length of one op-ack entry in an ACK.
pub const OP_ACK_LEN: usize = 16;
/// Most op-ack entries one ACK can carry.
pub const MAX_OP_ACKS: usize = 16;
/// Number of packets the selective-ACK bitmap of an ACK describes.
pub const SACK_BITS: usize = 256;
/// Bytes an Ethernet link adds around a MetaRoCE datagram: the Ethernet
/// header and FCS (14 + 4), IPv4 (20) and UDP (8).
pub const FRAME_OVERHEAD_LEN: usize = 46;

/// Why a datagram was rejected.
///
/// Receivers drop rejected datagrams and count them by kind; no error ever
/// causes a reply on the wire (a reply to garbage would be an amplifier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The datagram ends before a header, extension or entry it announces.
    #[error("truncated packet")]
    Truncated,
    /// The version byte is not [`VERSION`].
    #[error("unsupported version {0}")]
    BadVersion(u8),
    /// The packet type byte is neither Data nor Ack.
    #[error("unknown packet type {0}")]
    BadType(u8),
    /// The opcode byte of a data packet is unknown.
    #[error("unknown opcode {0}")]
    BadOpcode(u8),
    /// The ICRC trailer does not match the datagram.
    #[error("bad icrc")]
    BadChecksum,
    /// A field holds a value the format forbids; the string names the field.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The packet carries an authentication trailer ([`Flags::AUTHENTICATED`])
    /// and no ICRC: only the holder of the connection key can check it (see
    /// [`parse_authenticated`]).
    #[error("authenticated packet needs the connection key")]
    NeedsKey,
}

/// Result type of this crate.
pub type Result<T> = core::result::Result<T, Error>;

/// A parsed and validated datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
// An ACK repr is a few hundred bytes because it holds its op-ack entries
// inline. Boxing it would allocate in `parse`, which this crate promises not
// to do; packets are parsed on the stack and consumed right away.
#[expect(clippy::large_enum_variant)]
pub enum Packet<'a> {
    /// A data packet and the payload it carries (borrowed from the datagram).
    Data {
        /// The decoded headers.
        repr: DataRepr,
        /// The payload, between the headers and the ICRC.
        payload: &'a [u8],
    },
    /// An acknowledgement.
    Ack(AckRepr),
}

impl Packet<'_> {
    /// The base header fields of either kind of packet.
    pub fn base(&self) -> &BaseRepr {
        match self {
            Packet::Data { repr, .. } => &repr.base,
            Packet::Ack(repr) => &repr.base,
        }
    }

    /// Length of the datagram this packet emits to.
    pub fn buffer_len(&self) -> usize {
        match self {
            Packet::Data { repr, .. } => repr.buffer_len(),
            Packet::Ack(repr) => repr.buffer_len(),
        }
    }

    /// Emit the whole datagram (trailer included, see [`emit_data`]) into
    /// `buf`, returning its length.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`Packet::buffer_len`].
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        match self {
            Packet::Data { repr, payload } => emit_data(repr, payload, buf),
            Packet::Ack(repr) => emit_ack(repr, buf),
        }
    }
}

/// Parse and validate a whole datagram (version, type, lengths, ICRC, field rules).
///
/// An authenticated datagram ([`Flags::AUTHENTICATED`]) has no ICRC, and
/// what protects it needs a key this crate does not have: it is refused with
/// [`Error::NeedsKey`] (after the version, base header and type checks); see
/// [`parse_authenticated`].
///
/// Checks run from the outside in, so the error names the first layer that
/// is wrong: version, packet type, lengths (and opcode, which decides the
/// data header length), then the ICRC, then the rules between fields.
/// The version is checked first of all, before any length: a later version
/// may lay out its headers differently, and its packets should be reported as
/// "wrong version" rather than "truncated".
///
/// Under `cfg(fuzzing)` the ICRC is not checked, so that fuzzers reach the
/// field validation instead of stopping at the checksum.
pub fn parse(datagram: &[u8]) -> Result<Packet<'_>> {
    parse_with(datagram, IcrcPolicy::Required)
}

/// Whether a receiver takes packets whose ICRC the sender omitted
/// ([`Flags::ICRC_OMITTED`], wire.md section 7.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IcrcPolicy {
    /// Every ICRC is checked, flag or not (a packet with the flag and a
    /// zero trailer fails as [`Error::BadChecksum`]).
    #[default]
    Required,
    /// A packet with [`Flags::ICRC_OMITTED`] is taken without checking its
    /// trailer (the UDP checksum protects it); others are checked.
    OmittedAccepted,
}

/// [`parse`], with the receiver's [`IcrcPolicy`].
pub fn parse_with(datagram: &[u8], icrc: IcrcPolicy) -> Result<Packet<'_>> {
    let Some(&version) = datagram.first() else {
        return Err(Error::Truncated);
    };
    if version != VERSION {
        return Err(Error::BadVersion(version));
    }
    let header = BaseHeader::new_checked(datagram)?;
    let packet_type = PacketType::try_from(header.packet_type())?;
    if header.flags().contains(Flags::AUTHENTICATED) {
        return Err(Error::NeedsKey);
    }
    let skip_icrc =
        icrc == IcrcPolicy::OmittedAccepted && header.flags().contains(Flags::ICRC_OMITTED);
    let check_icrc = |d: &[u8]| if skip_icrc { Ok(()) } else { check_icrc(d) };
    match packet_type {
        PacketType::Data => {
            let packet = DataPacket::new_checked(datagram)?;
            check_icrc(datagram)?;
            let repr = DataRepr::parse(&packet)?;
            let payload = &datagram[repr.header_len()..datagram.len() - ICRC_LEN];
            Ok(Packet::Data { repr, payload })
        }
        PacketType::Ack => {
            let packet = AckPacket::new_checked(datagram)?;
            check_icrc(datagram)?;
            Ok(Packet::Ack(AckRepr::parse(&packet)?))
        }
    }
}

/// The length of the first packet in a datagram.
///
/// A datagram carries one packet, or an ACK followed by more packets
/// (wire.md section 5.3, coalescing: a device sends the ACK for what it
/// received in the datagram of its own reply, one datagram through the
/// network stack instead of two). An ACK's length is fixed by its flags
/// (`SACK_ABSENT`), op-ack count and trailer, so what follows it is the
/// next packet, parsed and
/// checked on its own. For any other datagram, and for an ACK whose length
/// cannot be told (truncated, a bad count), the whole datagram: the parser
/// then says what is wrong with it.
pub fn first_packet_len(datagram: &[u8]) -> usize {
    let len = datagram.len();
    let Ok(header) = BaseHeader::new_checked(datagram) else {
        return len;
    };
    if header.version() != VERSION || header.packet_type() != PacketType::Ack as u8 {
        return len;
    }
    let fixed = ack::fixed_len(header.flags());
    let Some(&count) = datagram.get(fixed - 4) else {
        return len;
    };
    let count = usize::from(count);
    if count > MAX_OP_ACKS {
        return len;
    }
    let ack_len = fixed + count * OP_ACK_LEN + trailer_len(header.flags());
    ack_len.min(len)
}

/// Compute and write the ICRC into the last [`ICRC_LEN`] bytes of `datagram`,
/// covering everything before it.
///
/// # Panics
///
/// If `datagram` is shorter than [`ICRC_LEN`].
pub fn seal(datagram: &mut [u8]) {
    assert!(
        datagram.len() >= ICRC_LEN,
        "datagram shorter than the icrc trailer"
    );
    let (covered, trailer) = datagram.split_at_mut(datagram.len() - ICRC_LEN);
    trailer.copy_from_slice(&icrc(covered).to_be_bytes());
}

/// The ICRC of a datagram whose trailer starts right after `covered`.
///
/// It is CRC32C (Castagnoli), the CRC that NICs and CPUs accelerate, over
/// every byte before the trailer. Unlike RoCEv2's ICRC no field is masked:
/// MetaRoCE runs over UDP end to end and no router rewrites any of the bytes
/// covered.
pub fn icrc(covered: &[u8]) -> u32 {
    crc32c::crc32c(covered)
}

/// The ICRC of a datagram whose covered bytes come in pieces (a header in
/// one buffer, the payload in place in a memory region), in order: the same
/// value as [`icrc`] over their concatenation, without concatenating.
pub fn icrc_parts(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(0, |crc, part| crc32c::crc32c_append(crc, part))
}

/// Whether the trailer of `datagram` matches its contents.
fn icrc_ok(datagram: &[u8]) -> bool {
    match datagram.len().checked_sub(ICRC_LEN) {
        Some(at) => {
            let (covered, trailer) = datagram.split_at(at);
            icrc(covered).to_be_bytes() == trailer
        }
        None => false,
    }
}

fn check_icrc(datagram: &[u8]) -> Result<()> {
    // Fuzzers cannot forge a CRC; skipping the check lets them explore the
    // field validation behind it (smoltcp does the same with checksums).
    if cfg!(fuzzing) || icrc_ok(datagram) {
        Ok(())
    } else {
        Err(Error::BadChecksum)
    }
}

/// Emit a full data packet (header, payload and ICRC) into `buf`, returning
/// its length ([`DataRepr::buffer_len`]).
///
/// If `repr.base.flags` has [`Flags::AUTHENTICATED`], the trailer is the
/// authentication trailer, written as zeros: the caller, which holds the
/// key, fills in the packet number and tag (see [`AuthTrailer`]).
///
/// # Panics
///
/// If `payload.len()` differs from `repr.payload_len`, or `buf` is shorter
/// than `repr.buffer_len()`.
pub fn emit_data(repr: &DataRepr, payload: &[u8], buf: &mut [u8]) -> usize {
    assert_eq!(
        payload.len(),
        repr.payload_len as usize,
        "payload length differs from repr.payload_len"
    );
    let len = repr.buffer_len();
    let header_len = repr.header_len();
    let payload_end = header_len + payload.len();
    let datagram = &mut buf[..len];
    repr.emit_header(datagram);
    datagram[header_len..payload_end].copy_from_slice(payload);
    finish_trailer(datagram, payload_end);
    len
}

/// Seal an ICRC-protected datagram, or zero the authentication trailer that
/// starts at `covered_len` for the key holder to fill.
fn finish_trailer(datagram: &mut [u8], covered_len: usize) {
    if datagram.len() - covered_len == ICRC_LEN {
        seal(datagram);
    } else {
        datagram[covered_len..].fill(0);
    }
}

/// Emit a full ACK (ICRC included) into `buf`, returning its length
/// ([`AckRepr::buffer_len`]). An authenticated ACK gets a zeroed
/// authentication trailer, as in [`emit_data`].
///
/// # Panics
///
/// If `buf` is shorter than `repr.buffer_len()`.
pub fn emit_ack(repr: &AckRepr, buf: &mut [u8]) -> usize {
    let len = repr.buffer_len();
    let datagram = &mut buf[..len];
    repr.emit(datagram);
    finish_trailer(datagram, repr.covered_len());
    len
}

/// Fuzzing oracle shared by the cargo-fuzz target and the corpus test.
///
/// Parses `data`; when that succeeds, re-emits the packet, re-parses the
/// result and asserts that nothing changed. Panics on any disagreement.
/// Authenticated datagrams go through [`parse_authenticated`] (and must be
/// refused by [`parse`]); their trailer, which emitting leaves to the key
/// holder, is copied over before comparing.
#[doc(hidden)]
pub fn fuzz_check(data: &[u8]) {
    if let Ok((packet, auth)) = parse_authenticated(data) {
        assert_eq!(parse(data), Err(Error::NeedsKey), "parse accepted a tag");
        assert_eq!(packet.buffer_len(), data.len(), "re-emitted length differs");
        let emit_with_trailer = |packet: &Packet<'_>| {
            let mut buf = vec![0u8; data.len()];
            packet.emit(&mut buf);
            auth.emit(&mut AuthTrailer::new_unchecked(&mut buf[..]));
            buf
        };
        let buf = emit_with_trailer(&packet);
        let again = parse_authenticated(&buf).expect("re-emitted packet must parse");
        assert_eq!(again, (packet.clone(), auth), "re-parsed packet differs");
        assert_eq!(
            emit_with_trailer(&again.0),
            buf,
            "emit is not deterministic"
        );
        return;
    }
    let Ok(packet) = parse(data) else {
        return;
    };
    // Both packet kinds have an exact length, so a packet that parsed must
    // re-emit to exactly as many bytes as it came from.
    assert_eq!(packet.buffer_len(), data.len(), "re-emitted length differs");
    let mut buf = vec![0u8; data.len()];
    let len = packet.emit(&mut buf);
    assert_eq!(len, data.len());
    let again = parse(&buf).expect("re-emitted packet must parse");
    assert_eq!(again, packet, "re-parsed packet differs");
    // Emitting is canonical: emitting the re-parsed packet gives the same bytes.
    let mut buf2 = vec![0u8; len];
    again.emit(&mut buf2);
    assert_eq!(buf, buf2, "emit is not deterministic");
}
