//! Direct placement: a payload received straight into its memory region.
//!
//! A driver that reads datagrams into its own buffers pays a second copy
//! for every payload, from that buffer into the region the packet targets.
//! For large WRITE packets and READ responses it can instead peek at the
//! headers, ask the
//! endpoint where the payload goes ([`Endpoint::direct_target`]), and
//! receive the datagram as three parts: the headers into its buffer, the
//! payload into the region ([`Endpoint::direct_buffer`]), the trailer into
//! its buffer; then hand the headers over ([`Endpoint::handle_direct`]),
//! which does everything `handle_datagram` does except the copy. When both
//! sides send, a data packet usually comes behind the ACK its sender
//! coalesced in front of it (wire spec 5.3): that ACK is then part of the
//! "headers", read whole into the driver's buffer and handled first.
//!
//! The payload lands before the packet has been checked whole, so a target
//! is given only where no later verdict can matter: bytes of an open WRITE
//! message that have not arrived yet, in a region the peer's rkey lets it
//! write (see `connection::responder::direct_write_target`), or bytes of an
//! outstanding READ's local buffer that no response has brought yet
//! (`connection::requester::direct_read_target`). A packet that
//! is then refused (its checksum, its PSN, headers that changed between
//! the peek and the read) leaves bytes that a checked packet must still
//! bring before the message can complete. Packets with an ICRC to check
//! or an authentication tag are never placed directly: their integrity is
//! known only after the payload has been read.
//!
//! [`Endpoint::direct_target`]: crate::Endpoint::direct_target
//! [`Endpoint::direct_buffer`]: crate::Endpoint::direct_buffer
//! [`Endpoint::handle_direct`]: crate::Endpoint::handle_direct

use crate::memory::Span;
use metaroce_wire::DataRepr;

/// Where a datagram's payload goes, from [`crate::Endpoint::direct_target`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectTarget {
    pub(crate) repr: DataRepr,
    pub(crate) span: Span,
    /// Offset of the payload in the span.
    pub(crate) at: u64,
    /// Bytes of the ACK coalesced in front of the data packet (0: none).
    pub(crate) lead_len: usize,
    /// Bytes in front of the payload: the leading ACK and the data
    /// packet's headers.
    pub(crate) header_len: usize,
    pub(crate) datagram_len: usize,
}

impl DirectTarget {
    /// Bytes in front of the payload: headers, and the ACK its sender
    /// coalesced in front of the data packet if there is one.
    pub fn header_len(&self) -> usize {
        self.header_len
    }

    /// Bytes of payload.
    pub fn payload_len(&self) -> usize {
        self.repr.payload_len as usize
    }

    /// Bytes of trailer behind the payload.
    pub fn trailer_len(&self) -> usize {
        self.datagram_len - self.header_len - self.payload_len()
    }

    /// The whole datagram's length.
    pub fn datagram_len(&self) -> usize {
        self.datagram_len
    }
}
