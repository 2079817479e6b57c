//! The provider's own message header, carried at the front of every
//! MetaRoCE SEND between two endpoints.
//!
//! MetaRoCE gives the provider reliable, in-order SENDs on an RC queue
//! pair per direction and RDMA READ; everything libfabric adds on top
//! (tags, remote CQ data, the rendezvous, RMA and atomics on application
//! memory) is said in this header. It is remote input: [`Header::parse`] checks the
//! length and the kind and nothing else is trusted (lengths are re-checked
//! against the payload and against local buffers where they are used).
//!
//! Layout, little-endian, [`HEADER_BYTES`] = 56:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 1 | kind ([`Kind`]) |
//! | 1 | 1 | flags ([`FLAG_TAGGED`], [`FLAG_CQ_DATA`], [`FLAG_LAST`]) |
//! | 2 | 2 | status (0 = success, else a positive `FI_E*` code) |
//! | 4 | 4 | seq: per-direction message sequence (eager and RTS) |
//! | 8 | 8 | tag (atomic requests: the operation, `atomic::Request::to_wire`) |
//! | 16 | 8 | remote CQ data |
//! | 24 | 8 | len: message length (eager: payload length) |
//! | 32 | 8 | addr: remote address (RTS: the sender's staging region) |
//! | 40 | 8 | key: remote key (RTS: the staging region's rkey; RMA, atomics: MR key) |
//! | 48 | 8 | id: the initiator's operation id, echoed in replies |

/// Size of the header in bytes.
pub const HEADER_BYTES: usize = 56;

/// The message carries a tag (tagged queue) rather than being untagged.
pub const FLAG_TAGGED: u8 = 1;
/// `data` is remote CQ data for the target's completion.
pub const FLAG_CQ_DATA: u8 = 2;
/// Last chunk of an RMA transfer.
pub const FLAG_LAST: u8 = 4;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A message with its payload behind the header.
    Eager = 1,
    /// Request to send: the receiver READs `len` bytes at `addr`/`key`.
    Rts = 2,
    /// Receiver → sender: the rendezvous `id` is over (status says how),
    /// and so are any more the payload lists ([`fin_ids`]).
    Fin = 3,
    /// RMA write of the payload at `addr` under `key` (one chunk).
    RmaWrite = 4,
    /// Target → initiator: RMA write `id` applied (status says how).
    RmaWriteAck = 5,
    /// RMA read request of `len` bytes at `addr` under `key`.
    RmaReadReq = 6,
    /// Target → initiator: a chunk of read `id` at offset `addr`.
    RmaReadResp = 7,
    /// Atomic on the elements at `addr` under `key`: `tag` says which
    /// (`atomic::Request`), the payload carries the operands and then the
    /// compare values.
    AtomicReq = 8,
    /// Target → initiator: atomic `id` applied; the payload is the original
    /// values (fetch and compare atomics), or the reason text when status
    /// is an error.
    AtomicResp = 9,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Eager,
            2 => Self::Rts,
            3 => Self::Fin,
            4 => Self::RmaWrite,
            5 => Self::RmaWriteAck,
            6 => Self::RmaReadReq,
            7 => Self::RmaReadResp,
            8 => Self::AtomicReq,
            9 => Self::AtomicResp,
            _ => return None,
        })
    }
}

/// A parsed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Kind.
    pub kind: Kind,
    /// Flags.
    pub flags: u8,
    /// Status of a reply.
    pub status: u16,
    /// Sequence number (eager, RTS).
    pub seq: u32,
    /// Tag.
    pub tag: u64,
    /// Remote CQ data.
    pub data: u64,
    /// Length.
    pub len: u64,
    /// Address.
    pub addr: u64,
    /// Key.
    pub key: u64,
    /// Operation id.
    pub id: u64,
}

/// Why a received message was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than a header.
    #[error("message of {0} bytes is shorter than the {HEADER_BYTES}-byte header")]
    Short(usize),
    /// Unknown kind byte.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// An eager message whose length field disagrees with its payload.
    #[error("eager length {claimed} but {actual} payload bytes")]
    LengthMismatch {
        /// What the header says.
        claimed: u64,
        /// What arrived.
        actual: usize,
    },
}

impl Header {
    /// A header of `kind` with every other field zero.
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            flags: 0,
            status: 0,
            seq: 0,
            tag: 0,
            data: 0,
            len: 0,
            addr: 0,
            key: 0,
            id: 0,
        }
    }

    /// Whether `flag` is set.
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Append the header's bytes to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.push(self.flags);
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        for v in [self.tag, self.data, self.len, self.addr, self.key, self.id] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// The header and its payload as one message.
    pub fn with_payload(&self, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
        self.write(&mut out);
        out.extend_from_slice(payload);
        out
    }

    /// Parse a received message into its header and payload. An eager,
    /// RMA data or atomic message must carry exactly `len` payload bytes.
    pub fn parse(msg: &[u8]) -> Result<(Self, &[u8]), WireError> {
        if msg.len() < HEADER_BYTES {
            return Err(WireError::Short(msg.len()));
        }
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&msg[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let kind = Kind::from_u8(msg[0]).ok_or(WireError::UnknownKind(msg[0]))?;
        let h = Self {
            kind,
            flags: msg[1],
            status: u16::from_le_bytes([msg[2], msg[3]]),
            seq: u32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]),
            tag: u64_at(8),
            data: u64_at(16),
            len: u64_at(24),
            addr: u64_at(32),
            key: u64_at(40),
            id: u64_at(48),
        };
        let payload = &msg[HEADER_BYTES..];
        let carries_payload = matches!(
            kind,
            Kind::Eager | Kind::RmaWrite | Kind::RmaReadResp | Kind::AtomicReq | Kind::AtomicResp
        );
        if carries_payload && h.len != payload.len() as u64 {
            return Err(WireError::LengthMismatch {
                claimed: h.len,
                actual: payload.len(),
            });
        }
        Ok((h, payload))
    }
}

/// The rendezvous ids a FIN answers, all with its status: the header's id,
/// then any more its payload lists (little-endian `u64`s; a trailing
/// partial id is ignored).
pub fn fin_ids<'a>(h: &Header, payload: &'a [u8]) -> impl Iterator<Item = u64> + 'a {
    let more = payload.chunks_exact(8).map(|b| {
        let mut id = [0u8; 8];
        id.copy_from_slice(b);
        u64::from_le_bytes(id)
    });
    std::iter::once(h.id).chain(more)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut h = Header::new(Kind::Eager);
        h.flags = FLAG_TAGGED | FLAG_CQ_DATA;
        h.seq = 7;
        h.tag = 0xdead_beef;
        h.data = 42;
        h.len = 3;
        h.id = 9;
        let msg = h.with_payload(b"abc");
        assert_eq!(msg.len(), HEADER_BYTES + 3);
        let (p, payload) = Header::parse(&msg).unwrap();
        assert_eq!(p, h);
        assert_eq!(payload, b"abc");
    }

    #[test]
    fn fin_lists_its_ids() {
        let mut h = Header::new(Kind::Fin);
        h.id = 5;
        let mut payload = Vec::new();
        for id in [6u64, u64::MAX] {
            payload.extend_from_slice(&id.to_le_bytes());
        }
        let msg = h.with_payload(&payload);
        let (p, body) = Header::parse(&msg).unwrap();
        assert_eq!(fin_ids(&p, body).collect::<Vec<_>>(), [5, 6, u64::MAX]);
        // A lone FIN, and one whose payload ends in a partial id.
        assert_eq!(fin_ids(&p, &[]).collect::<Vec<_>>(), [5]);
        assert_eq!(fin_ids(&p, &payload[..11]).collect::<Vec<_>>(), [5, 6]);
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(Header::parse(&[1; 10]), Err(WireError::Short(10)));
        let mut msg = Header::new(Kind::Fin).with_payload(&[]);
        msg[0] = 99;
        assert_eq!(Header::parse(&msg), Err(WireError::UnknownKind(99)));
        let mut h = Header::new(Kind::Eager);
        h.len = 100;
        assert!(matches!(
            Header::parse(&h.with_payload(b"x")),
            Err(WireError::LengthMismatch { .. })
        ));
        // Atomic requests and replies carry exactly their length.
        let mut a = Header::new(Kind::AtomicReq);
        a.len = 16;
        assert!(Header::parse(&a.with_payload(&[0; 16])).is_ok());
        assert!(matches!(
            Header::parse(&a.with_payload(&[0; 8])),
            Err(WireError::LengthMismatch { .. })
        ));
        let r = Header::new(Kind::AtomicResp);
        assert!(matches!(
            Header::parse(&r.with_payload(&[0; 8])),
            Err(WireError::LengthMismatch { .. })
        ));
        // Every prefix of a valid message is refused or parsed, never a panic.
        let full = h.with_payload(&[0; 100]);
        for n in 0..full.len() {
            let _ = Header::parse(&full[..n]);
        }
    }
}
