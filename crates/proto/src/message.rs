//! Outgoing messages and their segments.
//!
//! A message is one operation's worth of packets toward the peer: a request
//! (WRITE, SEND, READ request, atomic) or a response (READ data, atomic
//! result). It is cut into segments of at most one MTU; each segment is sent
//! on whatever path has room, and resent on another path if lost, always with
//! the same operation identity `(dst_qpn, msg_seq, offset)`. The message
//! records which segments the peer has acknowledged.

use crate::memory::{RegionTable, Span};
use crate::work::WireRequest;
use metaroce_wire::OpHeader;

/// Generation-checked reference to a message slot: a packet still in flight
/// when its message is freed must not touch the slot's next occupant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MsgRef {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

/// One segment of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegRef {
    pub(crate) msg: MsgRef,
    pub(crate) seg: u32,
    /// The message's send attempt this copy belongs to (see [`TxMessage::rewind`]).
    pub(crate) attempt: u16,
}

/// Where the payload bytes come from when a segment is (re)sent.
#[derive(Debug)]
pub(crate) enum Source {
    /// No payload (READ request, atomics).
    Empty,
    /// Copied at post time.
    Inline(Box<[u8]>),
    /// Copied at post time, short enough to keep in the message itself: a
    /// latency test's few bytes cost no allocation and no free. Its length
    /// is the message's payload length; the rest is zero.
    Short([u8; SHORT_INLINE_BYTES]),
    /// Gathered from checked local spans, in order.
    Spans(Vec<Span>),
}

impl Source {
    /// Copy message bytes `offset..offset+out.len()` into `out`.
    pub(crate) fn gather(&self, regions: &RegionTable, offset: u64, out: &mut [u8]) {
        match self {
            Self::Empty => out.fill(0),
            Self::Inline(data) => {
                let start = offset as usize;
                out.copy_from_slice(&data[start..start + out.len()]);
            }
            Self::Short(bytes) => {
                let start = offset as usize;
                out.copy_from_slice(&bytes[start..start + out.len()]);
            }
            Self::Spans(spans) => regions.gather(spans, offset, out),
        }
    }

    /// Inline data, copied: into the message when it is short.
    pub(crate) fn inline(data: &[u8]) -> Self {
        if data.len() <= SHORT_INLINE_BYTES {
            let mut bytes = [0; SHORT_INLINE_BYTES];
            bytes[..data.len()].copy_from_slice(data);
            Self::Short(bytes)
        } else {
            Self::Inline(data.into())
        }
    }
}

/// The longest inline payload kept in the message itself: as many bytes
/// as the heap variants' pointer and length, so the enum grows no larger.
const SHORT_INLINE_BYTES: usize = 16;

impl Source {
    /// Message bytes `offset..offset+len` as one span of region memory, if
    /// they lie in one (see [`RegionTable::contiguous`]).
    pub(crate) fn contiguous(&self, regions: &RegionTable, offset: u64, len: u64) -> Option<Span> {
        match self {
            Self::Spans(spans) if len > 0 => regions.contiguous(spans, offset, len),
            _ => None,
        }
    }
}

/// Whether the message is ours to complete or the peer's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MsgKind {
    /// A request of local QP `qp`: completion waits on the responder.
    Request,
    /// A response (READ data, atomic result): done once acknowledged.
    Response,
}

/// An outgoing message.
#[derive(Debug)]
pub(crate) struct TxMessage {
    pub(crate) kind: MsgKind,
    /// Local QP index (requests: ours; responses: the responder QP).
    pub(crate) qp: u32,
    pub(crate) dst_qpn: u32,
    pub(crate) msg_seq: u32,
    pub(crate) op: OpHeader,
    /// The message length named in every packet (`msg_len`).
    pub(crate) len: u32,
    /// Bytes actually carried as payload (0 for READ requests and atomics,
    /// whose `msg_len` names the bytes to read or the word size).
    pub(crate) payload_len: u32,
    pub(crate) solicited: bool,
    pub(crate) source: Source,
    pub(crate) seg_bytes: u32,
    /// Payload of a short first segment (see `cut_head`); `0`: every
    /// segment but the last is `seg_bytes`.
    pub(crate) head_bytes: u32,
    pub(crate) segs: u32,
    /// Next segment never sent yet.
    pub(crate) next_unsent: u32,
    acked: SegBitmap,
    pub(crate) acked_count: u32,
    /// Bumped by every rewind: acknowledgements of copies sent before it no
    /// longer count, because the peer may have dropped their payload.
    pub(crate) attempt: u16,
    /// Waiting for the RNR timer before resending everything.
    pub(crate) rnr_wait: bool,
    /// Queued in the connection's send queue.
    pub(crate) queued: bool,
    /// Nothing waits on this message's completion (an unsignaled request
    /// with `deferred_ack_ns` on): its last packet does not ask for an
    /// immediate ACK, and the receiver may hold that ACK for data going back.
    pub(crate) ack_deferrable: bool,
    /// Repair packets sent after the data (`repair.rs`): segments
    /// `segs..segs + repair_count` of the message.
    pub(crate) repair_count: u32,
    /// Their payloads, computed when the first one goes.
    pub(crate) repair_shards: Option<Box<[u8]>>,
}

/// One bit per data segment of a message, set once the peer acknowledged
/// it. The first 64 segments' word lives inline: nearly every message is
/// that short, and a heap bitmap cost each post an allocation and each
/// completion a free.
#[derive(Debug)]
struct SegBitmap {
    first: u64,
    /// Segments 64 and up, 64 a word; empty (no allocation) below that.
    rest: Vec<u64>,
}

impl SegBitmap {
    fn new(segs: u32) -> Self {
        let mut bits = Self {
            first: 0,
            rest: Vec::new(),
        };
        bits.resize(segs);
        bits
    }

    fn resize(&mut self, segs: u32) {
        let words = segs.div_ceil(64) as usize;
        self.rest.resize(words.saturating_sub(1), 0);
    }

    fn get(&self, seg: u32) -> bool {
        let word = match (seg / 64) as usize {
            0 => self.first,
            w => self.rest[w - 1],
        };
        word >> (seg % 64) & 1 == 1
    }

    fn word_mut(&mut self, seg: u32) -> &mut u64 {
        match (seg / 64) as usize {
            0 => &mut self.first,
            w => &mut self.rest[w - 1],
        }
    }

    fn clear(&mut self) {
        self.first = 0;
        self.rest.fill(0);
    }

    /// Bytes held outside the message itself.
    fn heap_bytes(&self) -> usize {
        self.rest.capacity() * 8
    }
}

/// Which stream a message belongs to and its place in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MsgAddress {
    /// Local QP index (requests: the requester; responses: the responder).
    pub(crate) qp: u32,
    /// The peer QP's number, named in every packet.
    pub(crate) dst_qpn: u32,
    /// The request's sequence number in its QP's stream (a response
    /// carries the number of the request it answers).
    pub(crate) msg_seq: u32,
}

impl TxMessage {
    /// A local work request's message, cut into `seg_bytes` segments.
    pub(crate) fn request(
        to: MsgAddress,
        wire: WireRequest,
        solicited: bool,
        source: Source,
        seg_bytes: u32,
    ) -> Self {
        Self::build(MsgKind::Request, to, wire, solicited, source, seg_bytes)
    }

    /// The data of a READ: `len` bytes from `span` of the responder's memory.
    pub(crate) fn read_response(to: MsgAddress, len: u32, span: Span, seg_bytes: u32) -> Self {
        let wire = WireRequest {
            op: OpHeader::ReadResponse,
            msg_len: len,
            payload_len: len,
        };
        Self::build(
            MsgKind::Response,
            to,
            wire,
            false,
            Source::Spans(vec![span]),
            seg_bytes,
        )
    }

    /// The result of an atomic: the word's `original` value, carried in the
    /// header (no payload).
    pub(crate) fn atomic_response(to: MsgAddress, original: u64, seg_bytes: u32) -> Self {
        let wire = WireRequest {
            op: OpHeader::AtomicResponse { original },
            msg_len: 8,
            payload_len: 0,
        };
        Self::build(MsgKind::Response, to, wire, false, Source::Empty, seg_bytes)
    }

    fn build(
        kind: MsgKind,
        to: MsgAddress,
        wire: WireRequest,
        solicited: bool,
        source: Source,
        seg_bytes: u32,
    ) -> Self {
        let segs = wire.payload_len.div_ceil(seg_bytes).max(1);
        Self {
            kind,
            qp: to.qp,
            dst_qpn: to.dst_qpn,
            msg_seq: to.msg_seq,
            op: wire.op,
            len: wire.msg_len,
            payload_len: wire.payload_len,
            solicited,
            source,
            seg_bytes,
            head_bytes: 0,
            segs,
            next_unsent: 0,
            acked: SegBitmap::new(segs),
            acked_count: 0,
            attempt: 0,
            rnr_wait: false,
            queued: false,
            ack_deferrable: false,
            repair_count: 0,
            repair_shards: None,
        }
    }

    /// Byte range of segment `seg`; for a repair packet, its `offset`
    /// field (a [`RepairId`](metaroce_wire::RepairId)) and shard size.
    pub(crate) fn seg_range(&self, seg: u32) -> (u32, u32) {
        if self.is_repair(seg) {
            let id = metaroce_wire::RepairId {
                index: (seg - self.segs) as u16,
                count: self.repair_count as u16,
            };
            return (id.to_offset(), self.repair_shard_bytes());
        }
        // A short head (`cut_head`) is segment 0; the others follow it.
        let (start, len) = match (self.head_bytes, seg) {
            (0, s) => (s * self.seg_bytes, self.seg_bytes),
            (h, 0) => (0, h),
            (h, s) => (h + (s - 1) * self.seg_bytes, self.seg_bytes),
        };
        (start, (start + len).min(self.payload_len) - start)
    }

    /// Make the first segment `head_bytes` long, the others following it
    /// `seg_bytes` apart: a cold connection's one packet (see
    /// `EndpointConfig::cold_packet_bytes`). Only before anything of the
    /// message went and only where it is shorter than a segment; a message
    /// with a short head gets no repair packets (their shards are whole
    /// segments).
    pub(crate) fn cut_head(&mut self, head_bytes: u32) {
        if head_bytes == 0
            || head_bytes >= self.seg_bytes
            || self.head_bytes != 0
            || self.next_unsent != 0
            || self.attempt != 0
            || self.acked_count != 0
            || self.repair_count != 0
            || self.payload_len <= self.seg_bytes
        {
            return;
        }
        self.head_bytes = head_bytes;
        self.segs = 1 + (self.payload_len - head_bytes).div_ceil(self.seg_bytes);
        self.acked.resize(self.segs);
    }

    /// Bytes per recovery shard: one data packet's size; a one-packet
    /// message's own length (rounded up to even, as the code needs).
    pub(crate) fn repair_shard_bytes(&self) -> u32 {
        if self.segs == 1 {
            self.payload_len + self.payload_len % 2
        } else {
            self.seg_bytes
        }
    }

    /// Whether segment `seg` is a repair packet rather than data.
    pub(crate) fn is_repair(&self, seg: u32) -> bool {
        seg >= self.segs
    }

    /// Whether `seg` needs no (further) sending: a data segment the peer
    /// acknowledged, or a repair packet (never resent).
    pub(crate) fn is_acked(&self, seg: u32) -> bool {
        if self.is_repair(seg) {
            return true;
        }
        self.acked.get(seg)
    }

    /// Mark a segment acknowledged; true if it was new.
    pub(crate) fn ack(&mut self, seg: u32) -> bool {
        if self.is_repair(seg) {
            return false;
        }
        let word = self.acked.word_mut(seg);
        let bit = 1 << (seg % 64);
        if *word & bit != 0 {
            return false;
        }
        *word |= bit;
        self.acked_count += 1;
        true
    }

    pub(crate) fn fully_acked(&self) -> bool {
        self.acked_count == self.segs
    }

    /// A request every packet of which was acknowledged, that still waits
    /// for its completion (an op-ack or a READ's response), and not for a
    /// receive the peer lacked (RNR).
    pub(crate) fn awaits_completion_only(&self) -> bool {
        self.kind == MsgKind::Request && self.fully_acked() && !self.rnr_wait
    }

    /// Forget acknowledgements so every segment goes again (after an RNR NAK:
    /// the peer dropped the payload for want of a receive).
    pub(crate) fn rewind(&mut self) {
        self.acked.clear();
        self.acked_count = 0;
        self.next_unsent = 0;
        self.attempt = self.attempt.wrapping_add(1);
    }

    pub(crate) fn has_unsent(&self) -> bool {
        self.next_unsent < self.segs + self.repair_count && !self.rnr_wait
    }
}

/// A slab of messages with generations.
#[derive(Debug, Default)]
pub(crate) struct MessageSlab {
    slots: Vec<(u32, Option<TxMessage>)>,
    free: Vec<u32>,
    live: usize,
}

impl MessageSlab {
    pub(crate) fn insert(&mut self, msg: TxMessage) -> MsgRef {
        self.live += 1;
        if let Some(slot) = self.free.pop() {
            let entry = &mut self.slots[slot as usize];
            entry.1 = Some(msg);
            return MsgRef {
                slot,
                generation: entry.0,
            };
        }
        crate::grow::push(&mut self.slots, (0, Some(msg)));
        MsgRef {
            slot: (self.slots.len() - 1) as u32,
            generation: 0,
        }
    }

    pub(crate) fn get(&self, r: MsgRef) -> Option<&TxMessage> {
        match self.slots.get(r.slot as usize) {
            Some((generation, Some(m))) if *generation == r.generation => Some(m),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, r: MsgRef) -> Option<&mut TxMessage> {
        match self.slots.get_mut(r.slot as usize) {
            Some((generation, Some(m))) if *generation == r.generation => Some(m),
            _ => None,
        }
    }

    pub(crate) fn remove(&mut self, r: MsgRef) -> Option<TxMessage> {
        let entry = self.slots.get_mut(r.slot as usize)?;
        if entry.0 != r.generation {
            return None;
        }
        let msg = entry.1.take()?;
        entry.0 = entry.0.wrapping_add(1);
        self.free.push(r.slot);
        self.live -= 1;
        Some(msg)
    }

    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Bytes held by the slab and its messages' acknowledgement bitmaps.
    pub(crate) fn memory_bytes(&self) -> usize {
        let per_msg: usize = self
            .slots
            .iter()
            .filter_map(|(_, m)| m.as_ref())
            .map(|m| m.acked.heap_bytes())
            .sum();
        self.slots.capacity() * size_of::<(u32, Option<TxMessage>)>()
            + self.free.capacity() * 4
            + per_msg
    }

    /// Whether any held message satisfies `pred` (no allocation).
    pub(crate) fn any(&self, mut pred: impl FnMut(&TxMessage) -> bool) -> bool {
        self.slots
            .iter()
            .any(|(_, m)| m.as_ref().is_some_and(&mut pred))
    }

    /// References of every live message satisfying `pred`.
    pub(crate) fn refs_where(&self, mut pred: impl FnMut(&TxMessage) -> bool) -> Vec<MsgRef> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, (generation, m))| {
                m.as_ref().filter(|m| pred(m)).map(|_| MsgRef {
                    slot: i as u32,
                    generation: *generation,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(len: u32) -> TxMessage {
        let to = MsgAddress {
            qp: 0,
            dst_qpn: 1,
            msg_seq: 0,
        };
        let wire = WireRequest {
            op: OpHeader::Send { recv_index: 0 },
            msg_len: len,
            payload_len: len,
        };
        TxMessage::request(to, wire, false, Source::Empty, 100)
    }

    #[test]
    fn segments_cover_the_message() {
        let m = msg(250);
        assert_eq!(m.segs, 3);
        assert_eq!(m.seg_range(0), (0, 100));
        assert_eq!(m.seg_range(2), (200, 50));
        assert_eq!(msg(0).segs, 1);
        assert_eq!(msg(0).seg_range(0), (0, 0));
    }

    #[test]
    fn a_short_head_shifts_the_segments_after_it() {
        let mut m = msg(250);
        m.cut_head(30);
        assert_eq!(m.segs, 4);
        let ranges: Vec<_> = (0..m.segs).map(|s| m.seg_range(s)).collect();
        assert_eq!(ranges, [(0, 30), (30, 100), (130, 100), (230, 20)]);
        assert_eq!(ranges.iter().map(|r| r.1).sum::<u32>(), 250);
        for s in 0..m.segs {
            assert!(m.ack(s));
        }
        assert!(m.fully_acked());
        // 64 segments exactly, then one more for the head: the bitmap grows.
        let mut m = msg(6400);
        m.cut_head(1);
        assert_eq!(m.segs, 65);
        assert!(m.ack(64));
    }

    #[test]
    fn a_head_is_cut_only_before_anything_went_and_where_it_is_shorter() {
        let mut one = msg(100);
        one.cut_head(30);
        assert_eq!(
            (one.segs, one.seg_range(0)),
            (1, (0, 100)),
            "one packet goes whole"
        );
        let mut started = msg(250);
        started.next_unsent = 1;
        started.cut_head(30);
        assert_eq!(started.head_bytes, 0);
        let mut whole = msg(250);
        whole.cut_head(100);
        assert_eq!((whole.head_bytes, whole.segs), (0, 3));
        let mut twice = msg(250);
        twice.cut_head(30);
        twice.cut_head(10);
        assert_eq!(twice.seg_range(0), (0, 30));
    }

    #[test]
    fn acks_count_once_and_rewind() {
        let mut m = msg(250);
        assert!(m.ack(1));
        assert!(!m.ack(1));
        m.ack(0);
        m.ack(2);
        assert!(m.fully_acked());
        m.rewind();
        assert!(!m.is_acked(1) && m.acked_count == 0);
    }

    #[test]
    fn stale_refs_miss() {
        let mut s = MessageSlab::default();
        let a = s.insert(msg(1));
        s.remove(a).unwrap();
        let b = s.insert(msg(2));
        assert_eq!(a.slot, b.slot);
        assert!(s.get(a).is_none());
        assert_eq!(s.get(b).unwrap().len, 2);
    }

    #[test]
    fn inline_and_span_gather() {
        let regions = RegionTable::new(1);
        let long: Vec<u8> = (0..40).collect();
        for (data, offset) in [(&[1u8, 2, 3, 4][..], 1), (&long[..], 33)] {
            let src = Source::inline(data);
            let mut out = [0u8; 2];
            src.gather(&regions, offset, &mut out);
            assert_eq!(out, data[offset as usize..offset as usize + 2]);
        }
        assert!(matches!(Source::inline(&[7; 16]), Source::Short(_)));
        assert!(matches!(Source::inline(&long), Source::Inline(_)));
        // Kept inline without making every message larger.
        assert_eq!(size_of::<Source>(), size_of::<Vec<Span>>());
    }
}
