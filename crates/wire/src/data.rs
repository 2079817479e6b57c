//! Data packets: the data header, opcode extension headers and payload.

use crate::base::{BaseHeader, BaseRepr, PacketType};
use crate::bytes::{get_u32, get_u64, set_u32, set_u64};
use crate::{DATA_HEADER_LEN, Error, ICRC_LEN, Result, icrc_ok, trailer_len};

mod field {
    use crate::bytes::Field;

    // Offsets from the start of the datagram; the base header is 0..8.
    pub(super) const PSN: Field = 8..12;
    pub(super) const TIMESTAMP_NS: Field = 12..16;
    pub(super) const DST_QPN: Field = 16..20;
    pub(super) const MSG_SEQ: Field = 20..24;
    pub(super) const OPCODE: usize = 24;
    pub(super) const OP_FLAGS: usize = 25;
    pub(super) const PSN_FLOOR_DELTA: Field = 26..28;
    pub(super) const MSG_LEN: Field = 28..32;
    pub(super) const OFFSET: Field = 32..36;
    pub(super) const EXT: usize = 36;

    // Offsets inside the opcode extension header. Every extension that names
    // remote memory starts with (rkey, remote_addr) so that a responder can
    // check memory access the same way for all of them.
    pub(super) const RKEY: Field = 0..8;
    pub(super) const REMOTE_ADDR: Field = 8..16;
    pub(super) const WRITE_IMM_RECV_INDEX: Field = 16..20;
    pub(super) const WRITE_IMM_IMM: Field = 20..24;
    pub(super) const SEND_RECV_INDEX: Field = 0..4;
    pub(super) const SEND_IMM: Field = 4..8;
    pub(super) const FETCH_ADD_ADD: Field = 16..24;
    pub(super) const CMP_SWAP_COMPARE: Field = 16..24;
    pub(super) const CMP_SWAP_SWAP: Field = 24..32;
    pub(super) const ATOMIC_ORIGINAL: Field = 0..8;
}

/// `op_flags` bit 0: the receiver should raise a solicited event when this
/// message completes (as RoCE's SE bit).
const OP_FLAG_SOLICITED: u8 = 0x01;

/// `op_flags` bit 1: an ACK of this path that the sender heard reported a
/// PSN at or above this packet's floor (its cumulative point, or the top
/// of its SACK), so the floor moved on what the receiver reported and not
/// (only) on what the sender gave up on. A receiver learns from it that an
/// ACK it sent lately reached the sender: a way back known to work.
const OP_FLAG_FLOOR_ACKED: u8 = 0x02;

/// What a data packet does. Decides the size of the extension header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA WRITE into remote memory.
    Write = 0,
    /// RDMA WRITE that also consumes a receive and delivers an immediate.
    WriteImm = 1,
    /// SEND into a posted receive.
    Send = 2,
    /// SEND with an immediate value.
    SendImm = 3,
    /// RDMA READ request; the responder answers with ReadResponse packets.
    ReadRequest = 4,
    /// Data returned for a ReadRequest.
    ReadResponse = 5,
    /// Atomic fetch-and-add on a remote 64-bit word.
    FetchAdd = 6,
    /// Atomic compare-and-swap on a remote 64-bit word.
    CmpSwap = 7,
    /// The original value of the word an atomic operated on.
    AtomicResponse = 8,
}

impl Opcode {
    /// Every opcode, in wire order.
    pub const ALL: [Self; 9] = [
        Self::Write,
        Self::WriteImm,
        Self::Send,
        Self::SendImm,
        Self::ReadRequest,
        Self::ReadResponse,
        Self::FetchAdd,
        Self::CmpSwap,
        Self::AtomicResponse,
    ];

    /// Length of this opcode's extension header.
    pub const fn ext_len(self) -> usize {
        match self {
            Self::Write | Self::ReadRequest => 16,
            Self::WriteImm | Self::FetchAdd => 24,
            Self::Send => 4,
            Self::SendImm | Self::AtomicResponse => 8,
            Self::ReadResponse => 0,
            Self::CmpSwap => 32,
        }
    }

    /// Whether packets of this opcode may carry payload. Requests for READ and
    /// atomics, and atomic responses, carry their operands in the extension
    /// header only.
    pub const fn allows_payload(self) -> bool {
        match self {
            Self::Write | Self::WriteImm | Self::Send | Self::SendImm | Self::ReadResponse => true,
            Self::ReadRequest | Self::FetchAdd | Self::CmpSwap | Self::AtomicResponse => false,
        }
    }

    /// Whether this is an atomic request (FetchAdd or CmpSwap).
    pub const fn is_atomic_request(self) -> bool {
        matches!(self, Self::FetchAdd | Self::CmpSwap)
    }

    /// Upper-case name used in traces.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Write => "WRITE",
            Self::WriteImm => "WRITE_IMM",
            Self::Send => "SEND",
            Self::SendImm => "SEND_IMM",
            Self::ReadRequest => "READ_REQUEST",
            Self::ReadResponse => "READ_RESPONSE",
            Self::FetchAdd => "FETCH_ADD",
            Self::CmpSwap => "CMP_SWAP",
            Self::AtomicResponse => "ATOMIC_RESPONSE",
        }
    }
}

impl TryFrom<u8> for Opcode {
    type Error = Error;

    fn try_from(value: u8) -> Result<Self> {
        Self::ALL
            .get(usize::from(value))
            .copied()
            .ok_or(Error::BadOpcode(value))
    }
}

/// Which recovery shard a repair packet ([`crate::Flags::REPAIR`]) carries,
/// packed into its `offset` field as `1 << 31 | count << 16 | index`. A
/// receiver needs both numbers to rebuild lost data packets: the code is
/// fixed by the number of data packets (from `msg_len` and the shard size,
/// `payload_len`) and of recovery shards. The top bit puts the offset past
/// any message a repair packet is sent for, so a receiver that ignores the
/// flag (an older one) drops the packet as malformed (section 4.3, rule 1)
/// rather than placing the shard as message bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairId {
    /// This shard's index, below `count`.
    pub index: u16,
    /// How many recovery shards the sender computed for the message
    /// (at most [`RepairId::MAX_COUNT`]).
    pub count: u16,
}

impl RepairId {
    /// The largest count the field holds (15 bits).
    pub const MAX_COUNT: u16 = 0x7fff;

    /// The value of the `offset` field.
    pub const fn to_offset(self) -> u32 {
        1 << 31 | ((self.count & Self::MAX_COUNT) as u32) << 16 | self.index as u32
    }

    /// Read an `offset` field; `None` unless the top bit is set and
    /// `index < count`.
    pub const fn from_offset(offset: u32) -> Option<Self> {
        let id = Self {
            index: offset as u16,
            count: (offset >> 16) as u16 & Self::MAX_COUNT,
        };
        if offset >> 31 == 1 && id.index < id.count {
            Some(id)
        } else {
            None
        }
    }
}

/// The opcode extension header: the per-opcode fields after the data header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpHeader {
    /// See [`Opcode::Write`].
    Write {
        /// Remote key authorising access to the target memory region.
        rkey: u64,
        /// Address of the first byte of the *message* (not of this packet's
        /// payload: that lands at `remote_addr + offset`).
        remote_addr: u64,
    },
    /// See [`Opcode::WriteImm`].
    WriteImm {
        /// Remote key of the target region.
        rkey: u64,
        /// Address of the first byte of the message.
        remote_addr: u64,
        /// Index of the receive this message consumes (see `Send`).
        recv_index: u32,
        /// Immediate value delivered with the completion.
        imm: u32,
    },
    /// See [`Opcode::Send`].
    Send {
        /// Index of the receive buffer this message lands in, counted by the
        /// sender per QP. Naming it explicitly lets segments of different
        /// messages arrive in any order over different paths.
        recv_index: u32,
    },
    /// See [`Opcode::SendImm`].
    SendImm {
        /// Index of the receive buffer this message lands in.
        recv_index: u32,
        /// Immediate value delivered with the completion.
        imm: u32,
    },
    /// See [`Opcode::ReadRequest`]; `msg_len` is the number of bytes to read.
    ReadRequest {
        /// Remote key of the region to read.
        rkey: u64,
        /// Address of the first byte to read.
        remote_addr: u64,
    },
    /// See [`Opcode::ReadResponse`]; the response's `dst_qpn` and `msg_seq`
    /// name the request it answers.
    ReadResponse,
    /// See [`Opcode::FetchAdd`].
    FetchAdd {
        /// Remote key of the region holding the word.
        rkey: u64,
        /// Address of the 64-bit word (8-byte aligned by convention).
        remote_addr: u64,
        /// Value added to the word.
        add: u64,
    },
    /// See [`Opcode::CmpSwap`].
    CmpSwap {
        /// Remote key of the region holding the word.
        rkey: u64,
        /// Address of the 64-bit word.
        remote_addr: u64,
        /// Value the word must hold for the swap to happen.
        compare: u64,
        /// Value written when the comparison holds.
        swap: u64,
    },
    /// See [`Opcode::AtomicResponse`].
    AtomicResponse {
        /// Value of the word before the atomic operation.
        original: u64,
    },
}

impl OpHeader {
    /// The opcode this extension belongs to.
    pub const fn opcode(&self) -> Opcode {
        match self {
            Self::Write { .. } => Opcode::Write,
            Self::WriteImm { .. } => Opcode::WriteImm,
            Self::Send { .. } => Opcode::Send,
            Self::SendImm { .. } => Opcode::SendImm,
            Self::ReadRequest { .. } => Opcode::ReadRequest,
            Self::ReadResponse => Opcode::ReadResponse,
            Self::FetchAdd { .. } => Opcode::FetchAdd,
            Self::CmpSwap { .. } => Opcode::CmpSwap,
            Self::AtomicResponse { .. } => Opcode::AtomicResponse,
        }
    }

    /// Length of the extension on the wire.
    pub const fn len(&self) -> usize {
        self.opcode().ext_len()
    }

    /// Whether the extension is empty on the wire (only ReadResponse's is).
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decode the extension of `opcode` from the start of `ext`.
    pub fn parse(opcode: Opcode, ext: &[u8]) -> Result<Self> {
        let Some(ext) = ext.get(..opcode.ext_len()) else {
            return Err(Error::Truncated);
        };
        use field::*;
        Ok(match opcode {
            Opcode::Write => Self::Write {
                rkey: get_u64(ext, RKEY),
                remote_addr: get_u64(ext, REMOTE_ADDR),
            },
            Opcode::WriteImm => Self::WriteImm {
                rkey: get_u64(ext, RKEY),
                remote_addr: get_u64(ext, REMOTE_ADDR),
                recv_index: get_u32(ext, WRITE_IMM_RECV_INDEX),
                imm: get_u32(ext, WRITE_IMM_IMM),
            },
            Opcode::Send => Self::Send {
                recv_index: get_u32(ext, SEND_RECV_INDEX),
            },
            Opcode::SendImm => Self::SendImm {
                recv_index: get_u32(ext, SEND_RECV_INDEX),
                imm: get_u32(ext, SEND_IMM),
            },
            Opcode::ReadRequest => Self::ReadRequest {
                rkey: get_u64(ext, RKEY),
                remote_addr: get_u64(ext, REMOTE_ADDR),
            },
            Opcode::ReadResponse => Self::ReadResponse,
            Opcode::FetchAdd => Self::FetchAdd {
                rkey: get_u64(ext, RKEY),
                remote_addr: get_u64(ext, REMOTE_ADDR),
                add: get_u64(ext, FETCH_ADD_ADD),
            },
            Opcode::CmpSwap => Self::CmpSwap {
                rkey: get_u64(ext, RKEY),
                remote_addr: get_u64(ext, REMOTE_ADDR),
                compare: get_u64(ext, CMP_SWAP_COMPARE),
                swap: get_u64(ext, CMP_SWAP_SWAP),
            },
            Opcode::AtomicResponse => Self::AtomicResponse {
                original: get_u64(ext, ATOMIC_ORIGINAL),
            },
        })
    }

    /// Write the extension into the first [`OpHeader::len`] bytes of `ext`.
    ///
    /// # Panics
    ///
    /// If `ext` is shorter than [`OpHeader::len`].
    pub fn emit(&self, ext: &mut [u8]) {
        use field::*;
        match *self {
            Self::Write { rkey, remote_addr } | Self::ReadRequest { rkey, remote_addr } => {
                set_u64(ext, RKEY, rkey);
                set_u64(ext, REMOTE_ADDR, remote_addr);
            }
            Self::WriteImm {
                rkey,
                remote_addr,
                recv_index,
                imm,
            } => {
                set_u64(ext, RKEY, rkey);
                set_u64(ext, REMOTE_ADDR, remote_addr);
                set_u32(ext, WRITE_IMM_RECV_INDEX, recv_index);
                set_u32(ext, WRITE_IMM_IMM, imm);
            }
            Self::Send { recv_index } => set_u32(ext, SEND_RECV_INDEX, recv_index),
            Self::SendImm { recv_index, imm } => {
                set_u32(ext, SEND_RECV_INDEX, recv_index);
                set_u32(ext, SEND_IMM, imm);
            }
            Self::ReadResponse => {}
            Self::FetchAdd {
                rkey,
                remote_addr,
                add,
            } => {
                set_u64(ext, RKEY, rkey);
                set_u64(ext, REMOTE_ADDR, remote_addr);
                set_u64(ext, FETCH_ADD_ADD, add);
            }
            Self::CmpSwap {
                rkey,
                remote_addr,
                compare,
                swap,
            } => {
                set_u64(ext, RKEY, rkey);
                set_u64(ext, REMOTE_ADDR, remote_addr);
                set_u64(ext, CMP_SWAP_COMPARE, compare);
                set_u64(ext, CMP_SWAP_SWAP, swap);
            }
            Self::AtomicResponse { original } => set_u64(ext, ATOMIC_ORIGINAL, original),
        }
    }
}

/// A read/write view of a data packet: the whole datagram, ICRC included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> DataPacket<T> {
    /// Wrap a buffer without checks. Accessors may panic on a short buffer;
    /// with an unknown opcode the extension is taken to be empty.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wrap a buffer after [`DataPacket::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Check that the buffer holds the data header, the extension its opcode
    /// announces and the trailer (the ICRC, or the authentication trailer
    /// when the base header's flags say so). The opcode has to be known for
    /// that, so an unknown one fails here with [`Error::BadOpcode`].
    ///
    /// After this succeeds no accessor of this view panics.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < DATA_HEADER_LEN + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let opcode = self.opcode()?;
        if len < DATA_HEADER_LEN + opcode.ext_len() + self.trailer_len() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Length of the trailer: [`ICRC_LEN`], or
    /// [`AUTH_TRAILER_LEN`](crate::AUTH_TRAILER_LEN) for an authenticated packet.
    pub fn trailer_len(&self) -> usize {
        trailer_len(self.base().flags())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// A view of the base header.
    pub fn base(&self) -> BaseHeader<&[u8]> {
        BaseHeader::new_unchecked(self.buffer.as_ref())
    }

    /// Per-path packet sequence number.
    pub fn psn(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::PSN)
    }

    /// Sender clock in nanoseconds, truncated to 32 bits.
    pub fn timestamp_ns(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::TIMESTAMP_NS)
    }

    /// Destination queue pair number.
    pub fn dst_qpn(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DST_QPN)
    }

    /// Message sequence number of the operation within its QP.
    pub fn msg_seq(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::MSG_SEQ)
    }

    /// Raw opcode byte.
    pub fn raw_opcode(&self) -> u8 {
        self.buffer.as_ref()[field::OPCODE]
    }

    /// The opcode, or [`Error::BadOpcode`].
    pub fn opcode(&self) -> Result<Opcode> {
        Opcode::try_from(self.raw_opcode())
    }

    /// Raw `op_flags` byte, reserved bits included.
    pub fn op_flags(&self) -> u8 {
        self.buffer.as_ref()[field::OP_FLAGS]
    }

    /// PSNs below `psn - psn_floor_delta` need no acknowledgement.
    pub fn psn_floor_delta(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PSN_FLOOR_DELTA];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Whether the SOLICITED bit of `op_flags` is set.
    pub fn solicited(&self) -> bool {
        self.op_flags() & OP_FLAG_SOLICITED != 0
    }

    /// Whether the FLOOR_ACKED bit of `op_flags` is set.
    pub fn floor_acked(&self) -> bool {
        self.op_flags() & OP_FLAG_FLOOR_ACKED != 0
    }

    /// Total message length in bytes.
    pub fn msg_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::MSG_LEN)
    }

    /// Byte offset of this packet's payload within the message.
    pub fn offset(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::OFFSET)
    }

    /// Length of data header plus extension (0 extension if the opcode is unknown).
    pub fn header_len(&self) -> usize {
        DATA_HEADER_LEN + self.opcode().map_or(0, Opcode::ext_len)
    }

    /// The opcode extension header bytes.
    pub fn ext(&self) -> &[u8] {
        &self.buffer.as_ref()[field::EXT..self.header_len()]
    }

    /// The payload: everything between the headers and the trailer. Its
    /// length is implied by the datagram (UDP) length, as in RoCEv2.
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        &buf[self.header_len()..buf.len() - self.trailer_len()]
    }

    /// The last four bytes as a big-endian number: the ICRC of a packet
    /// without [`Flags::AUTHENTICATED`](crate::Flags::AUTHENTICATED).
    pub fn icrc(&self) -> u32 {
        let buf = self.buffer.as_ref();
        get_u32(buf, buf.len() - ICRC_LEN..buf.len())
    }

    /// Whether the ICRC trailer matches the datagram (never, for an
    /// authenticated packet: its tag needs the key, see [`crate::AuthTrailer`]).
    pub fn verify_icrc(&self) -> bool {
        self.trailer_len() == ICRC_LEN && icrc_ok(self.buffer.as_ref())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DataPacket<T> {
    /// A mutable view of the base header.
    pub fn base_mut(&mut self) -> BaseHeader<&mut [u8]> {
        BaseHeader::new_unchecked(self.buffer.as_mut())
    }

    /// Set the per-path packet sequence number.
    pub fn set_psn(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::PSN, value);
    }

    /// Set the sender timestamp.
    pub fn set_timestamp_ns(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::TIMESTAMP_NS, value);
    }

    /// Set the destination queue pair number.
    pub fn set_dst_qpn(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::DST_QPN, value);
    }

    /// Set the message sequence number.
    pub fn set_msg_seq(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::MSG_SEQ, value);
    }

    /// Set the opcode (this changes where the payload starts).
    pub fn set_opcode(&mut self, value: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = value as u8;
    }

    /// Set the raw `op_flags` byte.
    pub fn set_op_flags(&mut self, value: u8) {
        self.buffer.as_mut()[field::OP_FLAGS] = value;
    }

    /// Set the PSN floor delta.
    pub fn set_psn_floor_delta(&mut self, value: u16) {
        self.buffer.as_mut()[field::PSN_FLOOR_DELTA].copy_from_slice(&value.to_be_bytes());
    }

    /// Set the total message length.
    pub fn set_msg_len(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::MSG_LEN, value);
    }

    /// Set the payload's offset within the message.
    pub fn set_offset(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::OFFSET, value);
    }

    /// The extension header bytes, mutably.
    pub fn ext_mut(&mut self) -> &mut [u8] {
        let end = self.header_len();
        &mut self.buffer.as_mut()[field::EXT..end]
    }

    /// The payload, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        let trailer = self.trailer_len();
        let buf = self.buffer.as_mut();
        let end = buf.len() - trailer;
        &mut buf[start..end]
    }

    /// Compute and write the ICRC trailer.
    pub fn fill_icrc(&mut self) {
        crate::seal(self.buffer.as_mut());
    }
}

/// A validated data packet header (everything but the payload bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRepr {
    /// Base header fields.
    pub base: BaseRepr,
    /// Per-path packet sequence number: says *when and where* the packet was
    /// sent. It is consecutive per path (serial arithmetic, see [`crate::seq`])
    /// and drives loss detection and ACKs, never reassembly.
    pub psn: u32,
    /// Sender clock in ns, truncated to 32 bits; echoed in ACKs for RTT.
    pub timestamp_ns: u32,
    /// Destination queue pair number.
    pub dst_qpn: u32,
    /// Message sequence number of the operation within its QP. With
    /// `dst_qpn` and `offset` it says *what* the packet carries, independent
    /// of the path it took, so retransmissions may use any path.
    pub msg_seq: u32,
    /// SOLICITED bit of `op_flags`.
    pub solicited: bool,
    /// The sender expects no acknowledgement for any PSN of this path below
    /// `psn - psn_floor_delta`: each was acknowledged or declared lost and
    /// resent (under a new PSN) elsewhere. A receiver slides its SACK window
    /// up to that floor, so a lost PSN, which is never sent again, cannot
    /// pin the window.
    pub psn_floor_delta: u16,
    /// FLOOR_ACKED bit of `op_flags`: an ACK of this path that the sender
    /// heard reported a PSN at or above the floor ([`Self::psn_floor`]).
    pub floor_acked: bool,
    /// Total message length in bytes (bytes to read, for a ReadRequest).
    pub msg_len: u32,
    /// Byte offset of this packet's payload within the message.
    pub offset: u32,
    /// Opcode and its extension header.
    pub op: OpHeader,
    /// Payload length in bytes.
    pub payload_len: u32,
}

impl DataRepr {
    /// Decode and validate a data packet's headers.
    ///
    /// Checks version, type and the field rules ([`DataRepr::validate`]); the
    /// ICRC is a datagram-level check left to [`crate::parse`] (or
    /// [`DataPacket::verify_icrc`]). The packet must have passed
    /// [`DataPacket::check_len`].
    pub fn parse<T: AsRef<[u8]>>(packet: &DataPacket<T>) -> Result<Self> {
        packet.check_len()?;
        Self::from_headers(packet, packet.opcode()?, packet.payload().len())
    }

    /// Decode and validate the headers of a data packet of which only the
    /// first bytes, `head`, were read, out of a datagram of `datagram_len`
    /// bytes (the payload's length follows from the datagram's, as in
    /// [`DataRepr::parse`]): for a receiver that reads the headers first and
    /// then lets the payload go straight where it belongs. `head` must hold
    /// the data header and the opcode's extension; the trailer is not read.
    pub fn parse_head(head: &[u8], datagram_len: usize) -> Result<Self> {
        if head.len() < DATA_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let packet = DataPacket::new_unchecked(head);
        let opcode = packet.opcode()?;
        let header_len = DATA_HEADER_LEN + opcode.ext_len();
        let trailer = packet.trailer_len();
        if head.len() < header_len || datagram_len < header_len + trailer {
            return Err(Error::Truncated);
        }
        Self::from_headers(&packet, opcode, datagram_len - header_len - trailer)
    }

    /// The repr of `packet`'s headers (whose length was checked), carrying
    /// `payload_len` bytes of payload; validated.
    fn from_headers<T: AsRef<[u8]>>(
        packet: &DataPacket<T>,
        opcode: Opcode,
        payload_len: usize,
    ) -> Result<Self> {
        let base = BaseRepr::parse(&packet.base(), PacketType::Data)?;
        let op = OpHeader::parse(opcode, packet.ext())?;
        let payload_len =
            u32::try_from(payload_len).map_err(|_| Error::Malformed("payload_len"))?;
        let repr = Self {
            base,
            psn: packet.psn(),
            timestamp_ns: packet.timestamp_ns(),
            dst_qpn: packet.dst_qpn(),
            msg_seq: packet.msg_seq(),
            solicited: packet.solicited(),
            floor_acked: packet.floor_acked(),
            psn_floor_delta: packet.psn_floor_delta(),
            msg_len: packet.msg_len(),
            offset: packet.offset(),
            op,
            payload_len,
        };
        repr.validate()?;
        Ok(repr)
    }

    /// The floor: the sender expects no acknowledgement for any PSN of
    /// this path below it (`psn - psn_floor_delta`, modulo 2^32).
    pub fn psn_floor(&self) -> u32 {
        self.psn.wrapping_sub(u32::from(self.psn_floor_delta))
    }

    /// Check the rules between fields that [`DataRepr::parse`] enforces:
    ///
    /// * the payload lies inside the message: `offset + payload_len <= msg_len`;
    /// * opcodes without payload (ReadRequest, atomics, AtomicResponse) carry none;
    /// * atomic requests and responses work on one 64-bit word:
    ///   `msg_len == 8` and `offset == 0`;
    /// * a repair packet ([`crate::Flags::REPAIR`]) belongs to a WRITE or
    ///   SEND, names a shard ([`RepairId`]) and carries an even, non-empty
    ///   shard no longer than the message rounded up to even.
    ///
    /// Senders may call it before emitting; emit itself does not check.
    pub fn validate(&self) -> Result<()> {
        let opcode = self.op.opcode();
        if !opcode.allows_payload() && self.payload_len != 0 {
            return Err(Error::Malformed("payload_len"));
        }
        if opcode.is_atomic_request() || opcode == Opcode::AtomicResponse {
            if self.msg_len != 8 {
                return Err(Error::Malformed("msg_len"));
            }
            if self.offset != 0 {
                return Err(Error::Malformed("offset"));
            }
        }
        if self.base.flags.contains(crate::Flags::REPAIR) {
            // A recovery shard of a request's payload: the offset names the
            // shard, and a shard is one data packet's size, so never longer
            // than the message (rounded up to an even length).
            let request_with_payload = matches!(
                opcode,
                Opcode::Write | Opcode::WriteImm | Opcode::Send | Opcode::SendImm
            );
            if !request_with_payload {
                return Err(Error::Malformed("flags"));
            }
            if RepairId::from_offset(self.offset).is_none() {
                return Err(Error::Malformed("offset"));
            }
            if self.payload_len == 0
                || !self.payload_len.is_multiple_of(2)
                || self.payload_len > self.msg_len.saturating_add(1)
            {
                return Err(Error::Malformed("payload_len"));
            }
            return Ok(());
        }
        // u64 so that offset + payload_len cannot wrap around.
        if u64::from(self.offset) + u64::from(self.payload_len) > u64::from(self.msg_len) {
            return Err(Error::Malformed("offset"));
        }
        Ok(())
    }

    /// The opcode.
    pub const fn opcode(&self) -> Opcode {
        self.op.opcode()
    }

    /// Data header plus extension: where the payload starts.
    pub const fn header_len(&self) -> usize {
        DATA_HEADER_LEN + self.op.len()
    }

    /// Whole datagram length: headers, payload and trailer (the ICRC, or the
    /// authentication trailer when `base.flags` has
    /// [`Flags::AUTHENTICATED`](crate::Flags::AUTHENTICATED)).
    pub const fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len as usize + trailer_len(self.base.flags)
    }

    /// Write the headers (base, data, extension) into `buf[..header_len]`.
    /// Reserved bits and fields are written as zero. Nothing is validated;
    /// see [`DataRepr::validate`].
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`DataRepr::header_len`].
    pub fn emit_header(&self, buf: &mut [u8]) {
        let header_len = self.header_len();
        let mut packet = DataPacket::new_unchecked(&mut buf[..header_len]);
        self.base.emit(&mut packet.base_mut(), PacketType::Data);
        packet.set_psn(self.psn);
        packet.set_timestamp_ns(self.timestamp_ns);
        packet.set_dst_qpn(self.dst_qpn);
        packet.set_msg_seq(self.msg_seq);
        packet.set_opcode(self.op.opcode());
        let mut op_flags = 0;
        if self.solicited {
            op_flags |= OP_FLAG_SOLICITED;
        }
        if self.floor_acked {
            op_flags |= OP_FLAG_FLOOR_ACKED;
        }
        packet.set_op_flags(op_flags);
        packet.set_psn_floor_delta(self.psn_floor_delta);
        packet.set_msg_len(self.msg_len);
        packet.set_offset(self.offset);
        self.op.emit(packet.ext_mut());
    }
}
