//! Verdicts on what the target sent, as pure functions of the packets:
//! the spec's rules for ACK, op-ack and response contents, testable
//! against canned responses without a target.

use metaroce_wire::{AckRepr, DataRepr, OpAck, Opcode, Syndrome, seq};

/// Whether `ack` says exactly: every PSN before `ack_psn` received, and
/// of the later ones those of SACK bits `sack_bits` (wire.md §5). The
/// error says what differs.
pub fn ack_state(ack: &AckRepr, ack_psn: u32, sack_bits: &[usize]) -> Result<(), String> {
    let got: Vec<usize> = ack.sack.iter_set().collect();
    let mut want = sack_bits.to_vec();
    want.sort_unstable();
    want.dedup();
    if ack.ack_psn == ack_psn && got == want {
        return Ok(());
    }
    Err(format!(
        "has ack_psn {} and SACK bits {got:?}, expected ack_psn {ack_psn} and bits {want:?}",
        ack.ack_psn
    ))
}

/// Whether `op` reports message `msg_seq` executed: `msn` past it, no NAK
/// about it (wire.md §5.1: every request with `msg_seq < msn` executed).
pub fn executed(op: &OpAck, msg_seq: u32) -> bool {
    seq::seq_gt(op.msn, msg_seq) && !(op.syndrome.is_nak() && op.nak_msg_seq == msg_seq)
}

/// Whether `op` is exactly the NAK `syndrome` for `msg_seq`; the error says
/// what it is instead. The spec fixes `nak_msg_seq` and the syndrome; `msn`
/// must not claim the NAKed message executed.
pub fn nak(op: &OpAck, syndrome: Syndrome, msg_seq: u32) -> Result<(), String> {
    if op.syndrome == syndrome && op.nak_msg_seq == msg_seq && !seq::seq_gt(op.msn, msg_seq) {
        return Ok(());
    }
    Err(format!(
        "op-ack {} msn {} nak_msg_seq {}, expected {} for msg_seq {msg_seq} with msn at most {msg_seq}",
        op.syndrome.name(),
        op.msn,
        op.nak_msg_seq,
        syndrome.name()
    ))
}

/// Compare bytes read back with what should be there; the error names the
/// first difference.
pub fn same_bytes(got: &[u8], want: &[u8]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    if got.len() != want.len() {
        return Err(format!("read {} bytes, expected {}", got.len(), want.len()));
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    Err(format!(
        "byte {at} is {:#04x}, expected {:#04x} ({} of {} bytes differ)",
        got[at],
        want[at],
        got.iter().zip(want).filter(|(a, b)| a != b).count(),
        want.len()
    ))
}

/// Reassembles a READ response (wire.md §4.1, §4.2 ReadResponse) and
/// notes every way its packets break the spec.
#[derive(Debug)]
pub struct ReadAssembly {
    local_qpn: u32,
    msg_seq: u32,
    len: u32,
    bytes: Vec<u8>,
    have: Vec<bool>,
    problems: Vec<String>,
}

impl ReadAssembly {
    /// Expect `len` bytes answering `msg_seq`, addressed to `local_qpn`.
    pub fn new(local_qpn: u32, msg_seq: u32, len: u32) -> Self {
        Self {
            local_qpn,
            msg_seq,
            len,
            bytes: vec![0; len as usize],
            have: vec![false; len as usize],
            problems: Vec::new(),
        }
    }

    /// Take one data packet from the target; ones for other messages are ignored.
    pub fn add(&mut self, repr: &DataRepr, payload: &[u8]) {
        if repr.dst_qpn != self.local_qpn || repr.msg_seq != self.msg_seq {
            return;
        }
        if repr.opcode() != Opcode::ReadResponse {
            self.problems.push(format!(
                "a {} answered the READ, not READ_RESPONSE",
                repr.opcode()
            ));
            return;
        }
        if repr.msg_len != self.len {
            self.problems.push(format!(
                "a response segment has msg_len {}, the READ asked for {}",
                repr.msg_len, self.len
            ));
        }
        let start = repr.offset as usize;
        let end = start + payload.len();
        if end > self.bytes.len() {
            self.problems.push(format!(
                "a response segment covers {start}..{end}, beyond the {} bytes asked for",
                self.len
            ));
            return;
        }
        if self.have[start..end].iter().all(|&h| h) && !payload.is_empty() {
            // A retransmitted segment: harmless, but it must say the same.
            if self.bytes[start..end] != *payload {
                self.problems.push(format!(
                    "two response segments for {start}..{end} carry different bytes"
                ));
            }
            return;
        }
        self.bytes[start..end].copy_from_slice(payload);
        self.have[start..end].fill(true);
    }

    /// Whether every byte arrived.
    pub fn complete(&self) -> bool {
        self.have.iter().all(|&h| h)
    }

    /// How many bytes arrived.
    pub fn received(&self) -> usize {
        self.have.iter().filter(|&&h| h).count()
    }

    /// The bytes and the problems seen.
    pub fn finish(self) -> (Vec<u8>, Vec<String>) {
        (self.bytes, self.problems)
    }
}

/// Check an ATOMIC_RESPONSE (wire.md §4.2): to the requester's QP, the
/// request's msg_seq, `original` as expected.
pub fn atomic_response(
    repr: &DataRepr,
    local_qpn: u32,
    msg_seq: u32,
    original: u64,
) -> Result<(), String> {
    let metaroce_wire::OpHeader::AtomicResponse { original: got } = repr.op else {
        return Err(format!(
            "answered with {}, not ATOMIC_RESPONSE",
            repr.opcode()
        ));
    };

    if repr.dst_qpn != local_qpn || repr.msg_seq != msg_seq {
        return Err(format!(
            "the response names QP {} msg_seq {}, expected QP {local_qpn} msg_seq {msg_seq}",
            repr.dst_qpn, repr.msg_seq
        ));
    }
    if got != original {
        return Err(format!("original is {got:#x}, the word held {original:#x}"));
    }
    Ok(())
}

/// Join several failures into one verdict.
pub fn all(results: impl IntoIterator<Item = Result<(), String>>) -> Result<(), String> {
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}
