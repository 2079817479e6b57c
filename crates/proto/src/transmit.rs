//! What the core hands a driver for every datagram it emits: the
//! [`Transmit`] descriptor (where it goes, what it is, how long), and with
//! the gathering poll the [`Layout`] of its bytes (whole in the buffer, or
//! headers and trailer in the buffer with the payload left in place in a
//! memory region).
//!
//! A leaf of the crate: the endpoint and the connection both speak it, and
//! neither needs the other to do so.

use crate::ecn::Ecn;
use crate::memory::Span;
use crate::packet_repr::PacketSlot;
use std::net::SocketAddr;

/// What a datagram carries, so that a driver can schedule it without
/// parsing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketKind {
    /// A data packet (a segment of a request or a response).
    Data,
    /// An ACK: per-path SACK, ECN and timestamp echo, op-acks. It is not on
    /// the peer's critical path the way data is, so a driver that sends a
    /// batch may put the batch's data first.
    Ack,
}

/// A datagram the endpoint wrote into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Transmit {
    /// Destination: the peer's address and device port.
    pub dst: SocketAddr,
    /// UDP source port: the path's port (its ECMP entropy).
    pub src_port: u16,
    /// ECN codepoint to send with.
    pub ecn: Ecn,
    /// Bytes of the datagram on the wire (UDP payload, trailer included).
    pub len: usize,
    /// Data or ACK.
    pub kind: PacketKind,
    /// A repair packet (data: a recovery shard of its message; transport
    /// spec §4). A driver that reorders a batch sends it behind the batch's
    /// other data packets: ahead of them it is of no use, and a receiver
    /// seeing it first may rebuild packets that are on their way.
    pub repair: bool,
}

/// How a datagram from the gathering poll lies in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// All `Transmit::len` bytes are at the start of the buffer.
    Whole,
    /// The buffer holds the headers (`header_len` bytes) followed by the
    /// trailer (`trailer_len` bytes, the ICRC); the payload stays in its
    /// memory region (resolve it with the endpoint's `payload`). On the
    /// wire: headers, payload, trailer.
    Split {
        /// Header bytes at the start of the buffer; the trailer follows.
        header_len: usize,
        /// Trailer bytes right after the headers in the buffer.
        trailer_len: usize,
        /// Where the payload is.
        payload: PayloadRef,
    },
}

/// A payload left in place in a registered memory region, valid until the
/// endpoint is next changed (resolve it with the endpoint's `payload`
/// before handling more input or polling again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef(pub(crate) Span);

/// Where an emitted packet goes: serialized into the caller's buffer (real
/// datapath, harness) or kept as a parsed header (the simulator, which
/// carries lengths, not bytes).
pub(crate) enum Out<'a> {
    /// The whole datagram into the buffer.
    Bytes(&'a mut [u8]),
    /// Parsed headers only (the simulator).
    Repr(&'a mut PacketSlot),
    /// Headers and trailer into the buffer, the payload left in place in
    /// its memory region when it lies in one (the UDP driver's zero-copy send).
    Gather(&'a mut [u8], &'a mut Layout),
}
