//! ACK packets: per-path delivery feedback plus per-QP operation outcomes.

use crate::base::{BaseHeader, BaseRepr, Flags, PacketType};
use crate::bytes::{Field, get_u16, get_u32, set_u16, set_u32};
use crate::{
    ACK_COMPACT_FIXED_LEN, ACK_FIXED_LEN, BASE_HEADER_LEN, Error, ICRC_LEN, MAX_OP_ACKS,
    OP_ACK_LEN, Result, SACK_BITS, SACK_LEN, icrc_ok, trailer_len,
};

mod field {
    use crate::bytes::Field;

    // Offsets from the start of the datagram; the base header is 0..8.
    pub(super) const ACK_PSN: Field = 8..12;
    pub(super) const TS_ECHO: Field = 12..16;
    pub(super) const ACK_DELAY_NS: Field = 16..20;
    pub(super) const RX_PACKETS: Field = 20..24;
    pub(super) const CE_PACKETS: Field = 24..28;
    pub(super) const RATE_HINT_MBPS: Field = 28..32;
    pub(super) const SACK: Field = 32..64;
    // The rest follows the SACK, or takes its place when it is absent
    // (`Flags::SACK_ABSENT`): offsets from the end of the SACK's place.
    pub(super) const OP_ACK_COUNT: usize = 0;
    pub(super) const TRIM_COUNT: usize = 1;
    pub(super) const TRIM_OFFSET: Field = 2..4;
    pub(super) const OP_ACKS: usize = 4;

    // Offsets inside one 16-byte op-ack entry.
    pub(super) const ENTRY_QPN: Field = 0..4;
    pub(super) const ENTRY_MSN: Field = 4..8;
    pub(super) const ENTRY_SYNDROME: usize = 8;
    pub(super) const ENTRY_RESERVED: Field = 9..12;
    pub(super) const ENTRY_NAK_MSG_SEQ: Field = 12..16;
}

/// Outcome reported by an op-ack entry (compare RoCEv2's AETH syndrome).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Syndrome {
    /// Every request with `msg_seq < msn` executed successfully.
    #[default]
    Ack = 0,
    /// Receiver not ready: no receive was posted for message `nak_msg_seq`.
    /// The requester retries that message later; nothing from it on was
    /// executed.
    RnrNak = 1,
    /// Remote access error for `nak_msg_seq`: bad rkey, out of bounds, or
    /// missing permission. Fatal for the QP.
    RemAccessErr = 2,
    /// Invalid request for `nak_msg_seq`: e.g. a SEND longer than the posted
    /// receive, or an opcode the QP does not allow. Fatal for the QP.
    RemInvReqErr = 3,
    /// The responder failed while executing `nak_msg_seq`. Fatal for the QP.
    RemOpErr = 4,
}

impl Syndrome {
    /// Upper-case name used in traces.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ack => "ACK",
            Self::RnrNak => "RNR_NAK",
            Self::RemAccessErr => "REM_ACCESS_ERR",
            Self::RemInvReqErr => "REM_INV_REQ_ERR",
            Self::RemOpErr => "REM_OP_ERR",
        }
    }

    /// Whether this is a negative acknowledgement.
    pub const fn is_nak(self) -> bool {
        !matches!(self, Self::Ack)
    }
}

impl TryFrom<u8> for Syndrome {
    type Error = Error;

    fn try_from(value: u8) -> Result<Self> {
        match value {
            0 => Ok(Self::Ack),
            1 => Ok(Self::RnrNak),
            2 => Ok(Self::RemAccessErr),
            3 => Ok(Self::RemInvReqErr),
            4 => Ok(Self::RemOpErr),
            _ => Err(Error::Malformed("syndrome")),
        }
    }
}

/// One per-QP operation acknowledgement carried in an ACK.
///
/// Path-level ACKs only say which packets arrived; op acks say which
/// *operations* the responder has executed, which is what completes work
/// requests at the requester. They are cumulative per QP, so losing an ACK
/// loses nothing that the next one does not repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpAck {
    /// Queue pair number at the *requester* this entry is about.
    pub qpn: u32,
    /// The responder's next expected message sequence for that QP: every
    /// request with `msg_seq < msn` (serial arithmetic) executed successfully.
    pub msn: u32,
    /// Outcome; anything but [`Syndrome::Ack`] concerns `nak_msg_seq`.
    pub syndrome: Syndrome,
    /// The message a NAK refers to (0 and meaningless for [`Syndrome::Ack`]).
    pub nak_msg_seq: u32,
}

impl OpAck {
    /// An all-zero entry (qpn 0, msn 0, Ack).
    pub const ZERO: Self = Self {
        qpn: 0,
        msn: 0,
        syndrome: Syndrome::Ack,
        nak_msg_seq: 0,
    };
}

/// The 256-bit selective-ACK bitmap of an ACK.
///
/// Bit `i` set means psn `ack_psn + 1 + i` was received (`ack_psn` itself was
/// not, or the cumulative point would be further). Bit `i` lives in byte
/// `i / 8` at position `i % 8`, least significant first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct SackBits(pub [u8; 32]);

impl SackBits {
    /// No bit set.
    pub const EMPTY: Self = Self([0; 32]);

    /// No bit set.
    pub const fn new() -> Self {
        Self::EMPTY
    }

    /// Whether bit `i` is set; `false` for `i >= SACK_BITS`.
    pub const fn get(&self, i: usize) -> bool {
        i < SACK_BITS && (self.0[i / 8] >> (i % 8)) & 1 == 1
    }

    /// Set bit `i`. Bits at or beyond [`SACK_BITS`] cannot be represented and
    /// are ignored: the sender learns about those packets from a later ACK.
    pub const fn set(&mut self, i: usize) {
        if i < SACK_BITS {
            self.0[i / 8] |= 1 << (i % 8);
        }
    }

    /// Clear bit `i` (ignored for `i >= SACK_BITS`).
    pub const fn clear(&mut self, i: usize) {
        if i < SACK_BITS {
            self.0[i / 8] &= !(1 << (i % 8));
        }
    }

    /// Clear every bit.
    pub const fn clear_all(&mut self) {
        self.0 = [0; 32];
    }

    /// Whether no bit is set.
    pub const fn is_empty(&self) -> bool {
        let mut i = 0;
        while i < self.0.len() {
            if self.0[i] != 0 {
                return false;
            }
            i += 1;
        }
        true
    }

    /// Number of bits set.
    pub const fn count(&self) -> u32 {
        let mut total = 0;
        let mut i = 0;
        while i < self.0.len() {
            total += self.0[i].count_ones();
            i += 1;
        }
        total
    }

    /// The indices of set bits, ascending.
    pub const fn iter_set(&self) -> SackIter {
        SackIter {
            bits: self.0,
            next: 0,
        }
    }
}

/// Iterator over the set bits of a [`SackBits`], ascending.
#[derive(Debug, Clone)]
pub struct SackIter {
    bits: [u8; 32],
    next: usize,
}

impl Iterator for SackIter {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.next < SACK_BITS {
            let byte = self.bits[self.next / 8] >> (self.next % 8);
            if byte == 0 {
                // Nothing left in this byte: jump to the next one.
                self.next = (self.next / 8 + 1) * 8;
                continue;
            }
            let i = self.next + byte.trailing_zeros() as usize;
            self.next = i + 1;
            return Some(i);
        }
        None
    }
}

/// Length of an ACK before its op-ack entries, for its base flags: without
/// the SACK bitmap when [`Flags::SACK_ABSENT`] is set.
pub(crate) fn fixed_len(flags: Flags) -> usize {
    if flags.contains(Flags::SACK_ABSENT) {
        ACK_COMPACT_FIXED_LEN
    } else {
        ACK_FIXED_LEN
    }
}

/// A read/write view of an ACK packet: the whole datagram, ICRC included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AckPacket<T> {
    /// Wrap a buffer without checks; accessors may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wrap a buffer after [`AckPacket::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Check the length: the fixed part, an op-ack count of at most
    /// [`MAX_OP_ACKS`], and exactly that many entries followed by the
    /// trailer (the ICRC, or the authentication trailer when the flags say so).
    ///
    /// A datagram shorter than announced is [`Error::Truncated`]; a longer
    /// one is [`Error::Malformed`]`("ack length")`: ACKs have no payload, and
    /// trailing bytes would be a second, unchecked channel.
    /// After this succeeds no accessor of this view panics.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < BASE_HEADER_LEN || len < self.fixed_len() + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let count = usize::from(self.op_ack_count());
        if count > MAX_OP_ACKS {
            return Err(Error::Malformed("op_ack_count"));
        }
        let expected = self.fixed_len() + count * OP_ACK_LEN + self.trailer_len();
        if len < expected {
            Err(Error::Truncated)
        } else if len > expected {
            Err(Error::Malformed("ack length"))
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// A view of the base header.
    pub fn base(&self) -> BaseHeader<&[u8]> {
        BaseHeader::new_unchecked(self.buffer.as_ref())
    }

    /// Whether the SACK bitmap is absent ([`Flags::SACK_ABSENT`]).
    pub fn sack_absent(&self) -> bool {
        self.base().flags().contains(Flags::SACK_ABSENT)
    }

    /// Length before the op-ack entries: [`ACK_FIXED_LEN`], or
    /// [`ACK_COMPACT_FIXED_LEN`] without the SACK bitmap.
    pub fn fixed_len(&self) -> usize {
        fixed_len(self.base().flags())
    }

    /// Where the fields after the SACK's place start.
    fn tail(&self) -> usize {
        self.fixed_len() - (field::OP_ACKS - field::OP_ACK_COUNT)
    }

    fn entry(&self, index: usize) -> Field {
        let start = self.tail() + field::OP_ACKS + index * OP_ACK_LEN;
        start..start + OP_ACK_LEN
    }

    /// Length of the trailer: [`ICRC_LEN`], or
    /// [`AUTH_TRAILER_LEN`](crate::AUTH_TRAILER_LEN) for an authenticated ACK.
    pub fn trailer_len(&self) -> usize {
        trailer_len(self.base().flags())
    }

    /// Cumulative ACK point of the path.
    pub fn ack_psn(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::ACK_PSN)
    }

    /// Echoed timestamp of the most recent data packet.
    pub fn ts_echo(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::TS_ECHO)
    }

    /// Time the receiver held that packet before acking, in ns.
    pub fn ack_delay_ns(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::ACK_DELAY_NS)
    }

    /// Cumulative data packets received on this path generation.
    pub fn rx_packets(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::RX_PACKETS)
    }

    /// Cumulative CE-marked data packets received on this path generation.
    pub fn ce_packets(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::CE_PACKETS)
    }

    /// Receiver's rate hint for this sender in Mbit/s; 0 = none.
    pub fn rate_hint_mbps(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::RATE_HINT_MBPS)
    }

    /// The selective-ACK bitmap (empty when absent).
    pub fn sack(&self) -> SackBits {
        if self.sack_absent() {
            return SackBits::EMPTY;
        }
        let mut bits = [0u8; SACK_LEN];
        bits.copy_from_slice(&self.buffer.as_ref()[field::SACK]);
        SackBits(bits)
    }

    /// Raw op-ack count (may exceed [`MAX_OP_ACKS`] before `check_len`).
    pub fn op_ack_count(&self) -> u8 {
        self.buffer.as_ref()[self.tail() + field::OP_ACK_COUNT]
    }

    /// How many packets, from `ack_psn + trim_offset` on, a switch trimmed
    /// to their headers on the way (0: none reported by this ACK).
    pub fn trim_count(&self) -> u8 {
        self.buffer.as_ref()[self.tail() + field::TRIM_COUNT]
    }

    /// Where the trimmed run starts, counted from `ack_psn`.
    pub fn trim_offset(&self) -> u16 {
        let at = self.tail();
        get_u16(
            self.buffer.as_ref(),
            at + field::TRIM_OFFSET.start..at + field::TRIM_OFFSET.end,
        )
    }

    /// Entry `index`: `None` past the op-ack count or the buffer, otherwise
    /// the entry or [`Error::Malformed`]`("syndrome")`.
    pub fn op_ack(&self, index: usize) -> Option<Result<OpAck>> {
        if index >= usize::from(self.op_ack_count()) {
            return None;
        }
        let raw = self.buffer.as_ref().get(self.entry(index))?;
        let syndrome = match Syndrome::try_from(raw[field::ENTRY_SYNDROME]) {
            Ok(syndrome) => syndrome,
            Err(err) => return Some(Err(err)),
        };
        Some(Ok(OpAck {
            qpn: get_u32(raw, field::ENTRY_QPN),
            msn: get_u32(raw, field::ENTRY_MSN),
            syndrome,
            nak_msg_seq: get_u32(raw, field::ENTRY_NAK_MSG_SEQ),
        }))
    }

    /// The last four bytes as a big-endian number: the ICRC of an ACK
    /// without [`Flags::AUTHENTICATED`](crate::Flags::AUTHENTICATED).
    pub fn icrc(&self) -> u32 {
        let buf = self.buffer.as_ref();
        get_u32(buf, buf.len() - ICRC_LEN..buf.len())
    }

    /// Whether the ICRC trailer matches the datagram (never, for an
    /// authenticated ACK: its tag needs the key).
    pub fn verify_icrc(&self) -> bool {
        self.trailer_len() == ICRC_LEN && icrc_ok(self.buffer.as_ref())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AckPacket<T> {
    /// A mutable view of the base header.
    pub fn base_mut(&mut self) -> BaseHeader<&mut [u8]> {
        BaseHeader::new_unchecked(self.buffer.as_mut())
    }

    /// Set the cumulative ACK point.
    pub fn set_ack_psn(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::ACK_PSN, value);
    }

    /// Set the echoed timestamp.
    pub fn set_ts_echo(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::TS_ECHO, value);
    }

    /// Set the ACK delay.
    pub fn set_ack_delay_ns(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::ACK_DELAY_NS, value);
    }

    /// Set the received-packet counter.
    pub fn set_rx_packets(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::RX_PACKETS, value);
    }

    /// Set the CE-marked packet counter.
    pub fn set_ce_packets(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::CE_PACKETS, value);
    }

    /// Set the rate hint.
    pub fn set_rate_hint_mbps(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::RATE_HINT_MBPS, value);
    }

    /// Set the selective-ACK bitmap. Set the base flags first: with
    /// [`Flags::SACK_ABSENT`] there is no bitmap and this does nothing.
    pub fn set_sack(&mut self, value: &SackBits) {
        if !self.sack_absent() {
            self.buffer.as_mut()[field::SACK].copy_from_slice(&value.0);
        }
    }

    /// Set the op-ack count (after the base flags, which place it).
    pub fn set_op_ack_count(&mut self, value: u8) {
        let at = self.tail() + field::OP_ACK_COUNT;
        self.buffer.as_mut()[at] = value;
    }

    /// Set the trimmed run: `count` packets from `ack_psn + offset` on
    /// (after the base flags, which place it).
    pub fn set_trimmed(&mut self, offset: u16, count: u8) {
        let at = self.tail();
        let buf = self.buffer.as_mut();
        buf[at + field::TRIM_COUNT] = count;
        set_u16(
            buf,
            at + field::TRIM_OFFSET.start..at + field::TRIM_OFFSET.end,
            offset,
        );
    }

    /// Write entry `index` (its reserved bytes as zero).
    ///
    /// # Panics
    ///
    /// If the buffer does not reach the end of that entry.
    pub fn set_op_ack(&mut self, index: usize, value: &OpAck) {
        let range = self.entry(index);
        let raw = &mut self.buffer.as_mut()[range];
        set_u32(raw, field::ENTRY_QPN, value.qpn);
        set_u32(raw, field::ENTRY_MSN, value.msn);
        raw[field::ENTRY_SYNDROME] = value.syndrome as u8;
        raw[field::ENTRY_RESERVED].fill(0);
        set_u32(raw, field::ENTRY_NAK_MSG_SEQ, value.nak_msg_seq);
    }

    /// Compute and write the ICRC trailer.
    pub fn fill_icrc(&mut self) {
        crate::seal(self.buffer.as_mut());
    }
}

/// A validated ACK.
///
/// Equality compares the first `op_ack_count` entries only; entries past the
/// count are not part of the packet.
#[derive(Debug, Clone, Eq)]
pub struct AckRepr {
    /// Base header fields; `path_slot`/`path_gen` name the *data sender's*
    /// path being acknowledged.
    pub base: BaseRepr,
    /// Cumulative: every psn before this one (serial arithmetic) was received
    /// on this path, and this one was not yet.
    pub ack_psn: u32,
    /// `timestamp_ns` of the most recent data packet received on this path.
    pub ts_echo: u32,
    /// How long the receiver held that packet before acking; the sender
    /// subtracts it from the measured RTT.
    pub ack_delay_ns: u32,
    /// Cumulative data packets received on this path generation (wraps).
    pub rx_packets: u32,
    /// Cumulative CE-marked data packets received on this path generation
    /// (wraps); the ECN signal for per-path congestion control.
    pub ce_packets: u32,
    /// Receiver's share of its bandwidth for this sender, Mbit/s; 0 = no hint.
    pub rate_hint_mbps: u32,
    /// Packets received above `ack_psn`.
    pub sack: SackBits,
    /// Op-ack entries; only the first `op_ack_count` are meaningful.
    pub op_acks: [OpAck; MAX_OP_ACKS],
    /// Number of meaningful entries in `op_acks` (at most [`MAX_OP_ACKS`]).
    pub op_ack_count: u8,
    /// A trimming switch cut `trim_count` packets of this path to their
    /// headers, from psn `ack_psn + trim_offset` on (those between that
    /// the SACK reports arrived whole): a NACK, so the sender resends them
    /// now instead of after a round of loss detection. 0: none.
    pub trim_count: u8,
    /// See `trim_count`.
    pub trim_offset: u16,
}

impl PartialEq for AckRepr {
    fn eq(&self, other: &Self) -> bool {
        self.base == other.base
            && self.ack_psn == other.ack_psn
            && self.ts_echo == other.ts_echo
            && self.ack_delay_ns == other.ack_delay_ns
            && self.rx_packets == other.rx_packets
            && self.ce_packets == other.ce_packets
            && self.rate_hint_mbps == other.rate_hint_mbps
            && self.sack == other.sack
            && self.op_acks() == other.op_acks()
            && self.trimmed() == other.trimmed()
    }
}

impl AckRepr {
    /// An ACK with every field zero and no op acks.
    pub const fn new(base: BaseRepr) -> Self {
        Self {
            base,
            ack_psn: 0,
            ts_echo: 0,
            ack_delay_ns: 0,
            rx_packets: 0,
            ce_packets: 0,
            rate_hint_mbps: 0,
            sack: SackBits::EMPTY,
            op_acks: [OpAck::ZERO; MAX_OP_ACKS],
            op_ack_count: 0,
            trim_count: 0,
            trim_offset: 0,
        }
    }

    /// The trimmed run this ACK reports, as (first psn, count), if any.
    pub fn trimmed(&self) -> Option<(u32, u8)> {
        (self.trim_count > 0).then(|| {
            (
                self.ack_psn.wrapping_add(u32::from(self.trim_offset)),
                self.trim_count,
            )
        })
    }

    /// Decode and validate an ACK (version, type, syndromes). The ICRC is left
    /// to [`crate::parse`] (or [`AckPacket::verify_icrc`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &AckPacket<T>) -> Result<Self> {
        packet.check_len()?;
        let mut repr = Self::new(BaseRepr::parse(&packet.base(), PacketType::Ack)?);
        repr.ack_psn = packet.ack_psn();
        repr.ts_echo = packet.ts_echo();
        repr.ack_delay_ns = packet.ack_delay_ns();
        repr.rx_packets = packet.rx_packets();
        repr.ce_packets = packet.ce_packets();
        repr.rate_hint_mbps = packet.rate_hint_mbps();
        repr.sack = packet.sack();
        if !packet.sack_absent() && repr.sack.is_empty() {
            // One encoding per ACK: an empty bitmap is sent absent.
            return Err(Error::Malformed("sack"));
        }
        let mut index = 0;
        while let Some(op_ack) = packet.op_ack(index) {
            repr.op_acks[index] = op_ack?;
            index += 1;
        }
        repr.op_ack_count = packet.op_ack_count();
        repr.trim_count = packet.trim_count();
        repr.trim_offset = packet.trim_offset();
        Ok(repr)
    }

    /// The meaningful op-ack entries (`op_ack_count` capped at [`MAX_OP_ACKS`]).
    pub fn op_acks(&self) -> &[OpAck] {
        &self.op_acks[..usize::from(self.op_ack_count).min(MAX_OP_ACKS)]
    }

    /// Append an op-ack entry; `false` (and nothing changes) when full.
    pub fn push_op_ack(&mut self, op_ack: OpAck) -> bool {
        let count = self.op_acks().len();
        if count == MAX_OP_ACKS {
            return false;
        }
        self.op_acks[count] = op_ack;
        self.op_ack_count = (count + 1) as u8;
        true
    }

    /// Whole datagram length, trailer included (the ICRC, or the
    /// authentication trailer when `base.flags` has
    /// [`Flags::AUTHENTICATED`](crate::Flags::AUTHENTICATED)).
    pub fn buffer_len(&self) -> usize {
        self.covered_len() + trailer_len(self.base.flags)
    }

    /// Length of the ACK without its trailer: the bytes [`AckRepr::emit`]
    /// writes. Without the SACK bitmap when no bit of it is set.
    pub fn covered_len(&self) -> usize {
        fixed_len(self.layout_flags()) + self.op_acks().len() * OP_ACK_LEN
    }

    /// The base flags as emitted: [`Flags::SACK_ABSENT`] added when the
    /// SACK is empty (one encoding per ACK).
    fn layout_flags(&self) -> Flags {
        let mut flags = self.base.flags.known();
        if self.sack.is_empty() {
            flags.insert(Flags::SACK_ABSENT);
        }
        flags
    }

    /// Write the ACK except the trailer (that is, [`AckRepr::covered_len`]
    /// bytes at the start of `buf`); reserved fields are written as zero.
    /// Use [`crate::emit_ack`] to also seal it.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`AckRepr::covered_len`].
    pub fn emit(&self, buf: &mut [u8]) {
        let op_acks = self.op_acks();
        let mut packet = AckPacket::new_unchecked(&mut buf[..self.covered_len()]);
        self.base.emit(&mut packet.base_mut(), PacketType::Ack);
        // The layout bit goes first: it places every field after the SACK.
        packet.base_mut().set_flags(self.layout_flags());
        packet.set_ack_psn(self.ack_psn);
        packet.set_ts_echo(self.ts_echo);
        packet.set_ack_delay_ns(self.ack_delay_ns);
        packet.set_rx_packets(self.rx_packets);
        packet.set_ce_packets(self.ce_packets);
        packet.set_rate_hint_mbps(self.rate_hint_mbps);
        packet.set_sack(&self.sack);
        packet.set_op_ack_count(op_acks.len() as u8);
        packet.set_trimmed(self.trim_offset, self.trim_count);
        for (index, op_ack) in op_acks.iter().enumerate() {
            packet.set_op_ack(index, op_ack);
        }
    }
}
