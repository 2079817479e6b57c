//! Every check of the suite: its id, the spec rule it tests, what passes.
//!
//! This table is the suite's contract with `docs/spec/conformance.md`,
//! which lists the same checks (a unit test keeps the two in step). Section
//! numbers are those of `docs/spec/wire.md`.

/// How strongly the spec asks for what a check tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// A MUST of the spec, or a field's defined meaning.
    Must,
    /// A SHOULD, or what the spec implies without saying MUST.
    Should,
}

/// Which kind of target a check applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// Every target.
    Always,
    /// Only a target without packet authentication.
    Plain,
    /// Only a target with packet authentication (the suite shares its job secret).
    Authenticated,
}

/// One check of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckSpec {
    /// Stable identifier, `group.name`.
    pub id: &'static str,
    /// The spec section (and rule) tested, as cited in reports.
    pub section: &'static str,
    /// What is sent.
    pub stimulus: &'static str,
    /// What the target must do for the check to pass.
    pub expected: &'static str,
    /// MUST or SHOULD.
    pub level: Level,
    /// Which targets it runs against.
    pub applies: Applies,
}

const fn check(
    id: &'static str,
    section: &'static str,
    stimulus: &'static str,
    expected: &'static str,
) -> CheckSpec {
    CheckSpec {
        id,
        section,
        stimulus,
        expected,
        level: Level::Must,
        applies: Applies::Always,
    }
}

const fn should(spec: CheckSpec) -> CheckSpec {
    CheckSpec {
        level: Level::Should,
        ..spec
    }
}

const fn plain(spec: CheckSpec) -> CheckSpec {
    CheckSpec {
        applies: Applies::Plain,
        ..spec
    }
}

const fn authenticated(spec: CheckSpec) -> CheckSpec {
    CheckSpec {
        applies: Applies::Authenticated,
        ..spec
    }
}

/// The whole suite, in the order it runs.
pub const CHECKS: &[CheckSpec] = &[
    // In-order data on a fresh path.
    check(
        "ack.cumulative",
        "wire.md §5 ack_psn",
        "a 4-segment WRITE in PSN order on a fresh path, ACK_REQUEST on the last",
        "an ACK with ack_psn = first PSN + 4",
    ),
    check(
        "ack.no-sack-in-order",
        "wire.md §5 sack",
        "(same packets)",
        "that ACK's SACK bitmap is empty",
    ),
    check(
        "ack.path-echo",
        "wire.md §3 path_slot, path_gen; §5",
        "(same packets)",
        "the ACK names the data packets' path_slot and path_gen",
    ),
    check(
        "ack.rx-packets",
        "wire.md §5 rx_packets",
        "(same packets)",
        "rx_packets = 4 (data packets received on this path generation)",
    ),
    check(
        "ack.ts-echo",
        "wire.md §5 ts_echo",
        "(same packets, each with its own timestamp_ns)",
        "ts_echo = timestamp_ns of the last packet",
    ),
    check(
        "op.write-ack",
        "wire.md §5.1 msn, §5.2 Ack",
        "(same WRITE, msg_seq m)",
        "an op-ack for the requester's QP with msn = m + 1, syndrome Ack, nak_msg_seq 0",
    ),
    check(
        "op.write-placed",
        "wire.md §4.2 remote_addr, §4.1 offset",
        "READ back the written bytes",
        "the region holds the WRITE's bytes at remote_addr + offset",
    ),
    check(
        "op.read-response",
        "wire.md §4.1 msg_seq, dst_qpn; §4.2 ReadResponse",
        "a READ request",
        "READ_RESPONSE packets to the requester's QP with the request's msg_seq and msg_len, covering every byte once",
    ),
    // Reordering.
    check(
        "sack.out-of-order",
        "wire.md §5 sack",
        "PSNs p+2, p+1, p of one 3-segment WRITE on a fresh path, in that order",
        "after p+2 alone: ack_psn = p and SACK bit 1 only",
    ),
    check(
        "sack.filled",
        "wire.md §5 ack_psn",
        "(then p+1 and p)",
        "ack_psn = p + 3, SACK empty",
    ),
    check(
        "op.any-order-placement",
        "wire.md §6",
        "(same WRITE, segments arriving last to first)",
        "the message completes (msn = m + 1) and READ shows every segment at its offset",
    ),
    // Loss and resend with new PSNs.
    check(
        "sack.holes",
        "wire.md §5 sack",
        "segments 0, 2, 5 of a 6-segment WRITE at PSNs p, p+2, p+5",
        "ack_psn = p + 1, SACK bits exactly {0, 3}",
    ),
    check(
        "op.incomplete-not-acked",
        "wire.md §5.1 msn",
        "(same, segments 1, 3, 4 missing)",
        "no op-ack reports the WRITE executed (msn stays at most m)",
    ),
    check(
        "floor.slides-window",
        "wire.md §4.1 psn_floor_delta",
        "segments 1, 3, 4 resent at PSNs p+6..p+8 with RETRANSMIT and the floor at p+6",
        "ack_psn = p + 9, SACK empty (p+1, p+3, p+4 never arrive)",
    ),
    check(
        "resend.new-psn",
        "wire.md §6",
        "(same)",
        "the WRITE completes (msn = m + 1) and READ shows all six segments",
    ),
    // Repair packets: recovery shards that stand in for lost data packets.
    check(
        "repair.rebuilds",
        "wire.md §4.4",
        "a 5-segment WRITE (the last one short) with segment 2 withheld, then repair shard 1 of 2",
        "the repair packet is acknowledged like a data packet, the WRITE completes (msn = m + 1) and READ shows every byte, segment 2's too",
    ),
    check(
        "repair.not-enough",
        "wire.md §4.4",
        "a 5-segment WRITE with segments 1 and 3 withheld and only repair shard 0 of 2, later 1 and 3 resent under new PSNs",
        "no op-ack reports the WRITE executed before the resends; after them it completes and READ shows every byte",
    ),
    // Duplicates and exactly-once.
    check(
        "dup.same-psn",
        "wire.md §5 ack_psn, sack",
        "a packet resent with a PSN already acknowledged, then the next PSN",
        "ack_psn = next PSN + 1 and SACK empty: the duplicate added nothing",
    ),
    check(
        "dup.not-reexecuted",
        "wire.md §4.1 msg_seq, §5.1 msn",
        "WRITE X (msg m), WRITE Y to the same bytes (m+1), then m again, at its old PSN and at a new one",
        "READ shows Y: an executed message is not executed again",
    ),
    check(
        "atomic.fetch-add",
        "wire.md §4.2 FetchAdd, AtomicResponse",
        "FETCH_ADD of 5 on a word holding V",
        "an ATOMIC_RESPONSE to the requester's QP with the request's msg_seq and original = V; the word holds V + 5",
    ),
    check(
        "atomic.cmp-swap",
        "wire.md §4.2 CmpSwap, AtomicResponse",
        "CMP_SWAP compare = V + 5, swap = S",
        "original = V + 5; the word holds S",
    ),
    check(
        "atomic.exactly-once",
        "wire.md §4.1 msg_seq, §6",
        "the FETCH_ADD resent under a new PSN with RETRANSMIT",
        "the word still holds S: the add did not run twice",
    ),
    // Sequence-number edges.
    check(
        "psn.wrap-cumulative",
        "wire.md §1 serial arithmetic, §4.1 psn",
        "a fresh path walked (by psn_floor_delta 0) to PSN 2^32 - 3; PSNs 2^32-3 .. 2^32-1 and 0, 1 with 2^32 - 1 withheld",
        "an ACK with ack_psn = 2^32 - 1 (the withheld PSN)",
    ),
    check(
        "psn.wrap-sack",
        "wire.md §1, §5 sack",
        "(same)",
        "that ACK's SACK bits are exactly {0, 1} (PSNs 0 and 1 past the wrap)",
    ),
    check(
        "sack.last-bit",
        "wire.md §5 sack",
        "PSN p, then PSN p + 257 (p+1 .. p+256 withheld)",
        "ack_psn = p + 1, SACK bit 255 only",
    ),
    check(
        "sack.beyond-window",
        "wire.md §5 sack",
        "then PSN p + 258, one past the bitmap",
        "no ACK reports it or moves: any ACK keeps ack_psn = p + 1 and bits within {255}",
    ),
    check(
        "floor.skips-unsent",
        "wire.md §4.1 psn_floor_delta",
        "then PSN p + 259 with psn_floor_delta 0",
        "ack_psn = p + 260, SACK empty",
    ),
    check(
        "path.new-generation",
        "wire.md §3 path_gen",
        "two packets on (slot s, gen 1), then one on (s, gen 2)",
        "the ACK for (s, 2) has ack_psn = first PSN + 1: a new sequence space",
    ),
    check(
        "path.stale-generation",
        "wire.md §3 path_gen, §8",
        "then a WRITE on (s, gen 1) again",
        "no ACK for (s, 1), the bytes are not placed, and (s, 2) is undisturbed",
    ),
    // Datagrams a receiver must reject: dropped silently, not counted, not placed.
    check(
        "drop.bad-version",
        "wire.md §8 step 1, §9",
        "a WRITE with version 2 (ICRC valid) on a fresh path",
        "no ACK for the path; the next packet's ACK shows its PSN missing; nothing placed",
    ),
    check(
        "drop.bad-type",
        "wire.md §8 step 2",
        "packet_type 3",
        "dropped silently, not counted, nothing placed",
    ),
    check(
        "drop.bad-opcode",
        "wire.md §8 step 3, §9",
        "opcode 9",
        "dropped silently, not counted, nothing placed",
    ),
    check(
        "drop.truncated",
        "wire.md §8 step 3",
        "a WRITE cut inside its extension header (ICRC recomputed)",
        "dropped silently, not counted, nothing placed",
    ),
    check(
        "drop.bad-icrc",
        "wire.md §7, §8 step 4",
        "a WRITE with one payload bit flipped",
        "dropped silently, not counted, nothing placed",
    ),
    check(
        "drop.offset-beyond-msg-len",
        "wire.md §4.3 rule 1",
        "a WRITE with offset + payload length > msg_len",
        "dropped silently, not counted, nothing placed",
    ),
    check(
        "drop.payload-on-read-request",
        "wire.md §4.3 rule 2",
        "a READ request carrying payload",
        "dropped silently, not counted, no READ response",
    ),
    check(
        "drop.atomic-length",
        "wire.md §4.3 rule 3",
        "a FETCH_ADD with msg_len 16",
        "dropped silently, not counted, the word unchanged",
    ),
    check(
        "drop.repair-bad-id",
        "wire.md §4.3 (repair packets), §4.4 offset",
        "a one-packet WRITE's valid repair shard 0 of 1 with REPAIR set but the offset's top bit clear (1 << 16)",
        "dropped silently, not counted, nothing placed (not rebuilt from the shard)",
    ),
    plain(check(
        "drop.needs-key",
        "wire.md §8 (receiver not configured for authentication)",
        "a WRITE with AUTHENTICATED and a 24-byte trailer",
        "dropped silently, not counted, nothing placed",
    )),
    check(
        "accept.reserved-bits",
        "wire.md §1 reserved, §9",
        "a WRITE with the reserved flag bit 7 and op_flags bits 2..7 set",
        "accepted as if clear: counted, executed, placed",
    ),
    // Operation-level errors.
    check(
        "op.unknown-qpn",
        "wire.md §8 (unknown QP)",
        "a WRITE to a QPN the target does not have",
        "nothing placed, no NAK, and the real QP still executes the next WRITE",
    ),
    check(
        "access.bad-rkey",
        "wire.md §5.2 RemAccessErr, §4.2 rkey",
        "a WRITE with a guessed rkey on QP 1",
        "an op-ack REM_ACCESS_ERR with nak_msg_seq = the WRITE's msg_seq; nothing placed",
    ),
    check(
        "access.fatal",
        "wire.md §5.2 (syndromes 2..4 are fatal)",
        "then a valid WRITE on QP 1",
        "not executed: nothing placed, no op-ack reports it done",
    ),
    should(check(
        "access.out-of-bounds-write",
        "wire.md §5.2 RemAccessErr",
        "a WRITE on QP 2 running 4 bytes past the region's end",
        "REM_ACCESS_ERR for it; the in-bounds bytes are not placed either",
    )),
    check(
        "access.out-of-bounds-read",
        "wire.md §5.2 RemAccessErr",
        "a READ on QP 3 running past the region's end",
        "REM_ACCESS_ERR for it and no READ_RESPONSE data",
    ),
    check(
        "op.rnr-nak",
        "wire.md §5.2 RnrNak, §4.2 recv_index",
        "a SEND on QP 4, which has no receive posted",
        "an op-ack RNR_NAK with nak_msg_seq = the SEND's msg_seq and msn = that msg_seq",
    ),
    // Authentication.
    authenticated(check(
        "auth.target-authenticates",
        "wire.md §7.1",
        "(every datagram the target sent during the run)",
        "each has AUTHENTICATED, a tag valid under the target-to-suite key, and a packet number never used before",
    )),
    authenticated(check(
        "auth.replay",
        "wire.md §7.1 anti-replay, §8 step 8",
        "an accepted datagram sent again byte for byte",
        "no answer at all for its path",
    )),
    authenticated(check(
        "auth.forged-tag",
        "wire.md §7.1, §8 step 8",
        "a WRITE whose tag has one bit flipped",
        "dropped silently, not counted, nothing placed",
    )),
    authenticated(check(
        "auth.modified-packet-number",
        "wire.md §7.1 nonce",
        "a WRITE whose packet number was changed after sealing",
        "dropped silently, not counted, nothing placed",
    )),
    authenticated(check(
        "auth.unauthenticated",
        "wire.md §8 step 6",
        "a plain WRITE with an ICRC",
        "dropped silently, not counted, nothing placed",
    )),
];

/// The catalogue entry of `id`.
pub fn spec_of(id: &str) -> Option<&'static CheckSpec> {
    CHECKS.iter().find(|c| c.id == id)
}
