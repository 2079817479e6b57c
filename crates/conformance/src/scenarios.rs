//! The scenarios: each sends one sequence of crafted packets and decides
//! the checks (ids of [`crate::catalogue`]) that sequence tests.
//!
//! The region is cut into [`AREA_BYTES`] areas, one per scenario, so that
//! what one scenario placed (or must not have placed) is never touched by
//! another. Every scenario that looks for "nothing placed" first writes a
//! known fill into its area, so the result does not depend on what the
//! region held at the start.

use metaroce_wire::{AUTH_TRAILER_LEN, DATA_HEADER_LEN, Flags, OpHeader, Syndrome, emit_data};

use crate::expect;
use crate::link::Link;
use crate::peer::{Event, Path, Peer, SEGMENT_BYTES, Segment, repair_segments};
use crate::report::Verdicts;
use crate::target::QpRole;

/// Bytes of region each scenario owns.
pub(crate) const AREA_BYTES: u64 = 2048;

/// A scenario: its checks, and the function that runs it.
pub(crate) struct Scenario<L: Link> {
    pub(crate) checks: &'static [&'static str],
    pub(crate) run: fn(&mut Peer<L>, &mut Verdicts) -> Result<(), String>,
}

/// Region offset of area `n`.
fn area(n: u64) -> u64 {
    n * AREA_BYTES
}

/// A recognisable byte pattern: different for every `tag`, no zero bytes.
pub(crate) fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32 * 31 + u32::from(tag) * 97) % 251) as u8 + 1)
        .collect()
}

/// Every scenario, in the order they run (the catalogue's order).
pub(crate) fn all<L: Link>() -> Vec<Scenario<L>> {
    vec![
        Scenario {
            checks: &[
                "ack.cumulative",
                "ack.no-sack-in-order",
                "ack.path-echo",
                "ack.rx-packets",
                "ack.ts-echo",
                "op.write-ack",
                "op.write-placed",
                "op.read-response",
            ],
            run: in_order,
        },
        Scenario {
            checks: &["sack.out-of-order", "sack.filled", "op.any-order-placement"],
            run: out_of_order,
        },
        Scenario {
            checks: &[
                "sack.holes",
                "op.incomplete-not-acked",
                "floor.slides-window",
                "resend.new-psn",
            ],
            run: holes_and_resend,
        },
        Scenario {
            checks: &["repair.rebuilds"],
            run: repair_rebuilds,
        },
        Scenario {
            checks: &["repair.not-enough"],
            run: repair_not_enough,
        },
        Scenario {
            checks: &["dup.same-psn", "dup.not-reexecuted"],
            run: duplicates,
        },
        Scenario {
            checks: &["atomic.fetch-add", "atomic.cmp-swap", "atomic.exactly-once"],
            run: atomics,
        },
        Scenario {
            checks: &["psn.wrap-cumulative", "psn.wrap-sack"],
            run: psn_wrap,
        },
        Scenario {
            checks: &["sack.last-bit", "sack.beyond-window", "floor.skips-unsent"],
            run: window_edge,
        },
        Scenario {
            checks: &["path.new-generation", "path.stale-generation"],
            run: path_generations,
        },
        Scenario {
            checks: &["drop.bad-version"],
            run: |p, v| drop_check(p, v, "drop.bad-version", 9, |b| b[0] = 2, Reseal::Seal),
        },
        Scenario {
            checks: &["drop.bad-type"],
            run: |p, v| drop_check(p, v, "drop.bad-type", 10, |b| b[1] = 3, Reseal::Seal),
        },
        Scenario {
            checks: &["drop.bad-opcode"],
            run: |p, v| drop_check(p, v, "drop.bad-opcode", 11, |b| b[24] = 9, Reseal::Seal),
        },
        Scenario {
            checks: &["drop.truncated"],
            run: |p, v| {
                drop_check(
                    p,
                    v,
                    "drop.truncated",
                    12,
                    // Inside the WRITE's 16-byte extension, trailer room included.
                    |b| b.truncate(DATA_HEADER_LEN + 8 + 4),
                    Reseal::Seal,
                )
            },
        },
        Scenario {
            checks: &["drop.bad-icrc"],
            run: |p, v| {
                drop_check(
                    p,
                    v,
                    "drop.bad-icrc",
                    13,
                    |b| b[DATA_HEADER_LEN + 16] ^= 0x01,
                    Reseal::None,
                )
            },
        },
        Scenario {
            checks: &["drop.offset-beyond-msg-len"],
            run: |p, v| {
                drop_check(
                    p,
                    v,
                    "drop.offset-beyond-msg-len",
                    14,
                    // msg_len 16 for a 64-byte payload at offset 0.
                    |b| b[28..32].copy_from_slice(&16u32.to_be_bytes()),
                    Reseal::Seal,
                )
            },
        },
        Scenario {
            checks: &["drop.payload-on-read-request"],
            run: payload_on_read_request,
        },
        Scenario {
            checks: &["drop.atomic-length"],
            run: atomic_length,
        },
        Scenario {
            checks: &["drop.repair-bad-id"],
            run: repair_bad_id,
        },
        Scenario {
            checks: &["drop.needs-key"],
            run: needs_key,
        },
        Scenario {
            checks: &["accept.reserved-bits"],
            run: reserved_bits,
        },
        Scenario {
            checks: &["op.unknown-qpn"],
            run: unknown_qpn,
        },
        Scenario {
            checks: &["access.bad-rkey", "access.fatal"],
            run: bad_rkey,
        },
        Scenario {
            checks: &["access.out-of-bounds-write"],
            run: out_of_bounds_write,
        },
        Scenario {
            checks: &["access.out-of-bounds-read"],
            run: out_of_bounds_read,
        },
        Scenario {
            checks: &["op.rnr-nak"],
            run: rnr_nak,
        },
        Scenario {
            checks: &["auth.replay"],
            run: replay,
        },
        Scenario {
            checks: &["auth.forged-tag"],
            run: |p, v| {
                let tag_at = |b: &mut Vec<u8>| {
                    let at = b.len() - 1;
                    b[at] ^= 0x01;
                };
                drop_check(p, v, "auth.forged-tag", 22, tag_at, Reseal::None)
            },
        },
        Scenario {
            checks: &["auth.modified-packet-number"],
            run: |p, v| {
                let pn_at = |b: &mut Vec<u8>| {
                    let at = b.len() - AUTH_TRAILER_LEN;
                    // A packet number far above any used, so only the tag
                    // can reject it.
                    b[at] ^= 0x40;
                };
                drop_check(p, v, "auth.modified-packet-number", 23, pn_at, Reseal::None)
            },
        },
        Scenario {
            checks: &["auth.unauthenticated"],
            run: unauthenticated,
        },
    ]
}

// ------------------------------------------------------------ path level

/// In-order WRITE on a fresh path; the READ-back also checks the response.
fn in_order<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(1);
    let data = pattern(1, 4 * SEGMENT_BYTES);
    let msg_seq = peer.take_msg_seq(QpRole::Main);
    let segments = peer.write_segments(QpRole::Main, msg_seq, offset, &data);
    let path = peer.fresh_path()?;
    let first = path.next_psn;
    let mark = peer.mark();
    let mut last_ts = 0;
    for (i, segment) in segments.iter().enumerate() {
        // Timestamps 1000 ns apart, so the echo names one packet.
        let ts = 1_000_000 + 1000 * i as u32;
        last_ts = ts;
        let psn = first.wrapping_add(i as u32);
        let bytes = peer.craft_at(&path, psn, 0, segment, ts);
        peer.send(&bytes)?;
    }
    let end = first.wrapping_add(segments.len() as u32);
    match peer.wait_ack_state(mark, &path, end, &[]) {
        Ok(ack) => {
            v.check("ack.cumulative", Ok(()));
            v.check("ack.no-sack-in-order", Ok(()));
            v.check("ack.path-echo", Ok(()));
            v.check(
                "ack.rx-packets",
                if ack.rx_packets == 4 {
                    Ok(())
                } else {
                    Err(format!("rx_packets is {}", ack.rx_packets))
                },
            );
            v.check(
                "ack.ts-echo",
                if ack.ts_echo == last_ts {
                    Ok(())
                } else {
                    Err(format!(
                        "ts_echo is {}, the last packet said {last_ts}",
                        ack.ts_echo
                    ))
                },
            );
        }
        Err(why) => {
            // Tell apart "no ACK for this path" from "an ACK for another path".
            let other = peer.events[mark..].iter().find_map(|e| match e {
                Event::Ack(a) if a.ack_psn == end => Some(a.base),
                _ => None,
            });
            if let Some(base) = other {
                v.check(
                    "ack.path-echo",
                    Err(format!(
                        "the ACK names path {}/{}, the data was on {}/{}",
                        base.path_slot, base.path_gen, path.slot, path.generation
                    )),
                );
            }
            for id in [
                "ack.cumulative",
                "ack.no-sack-in-order",
                "ack.path-echo",
                "ack.rx-packets",
                "ack.ts-echo",
            ] {
                v.check(id, Err(why.clone()));
            }
        }
    }
    let timeout = peer.config.answer_timeout;
    let op = peer.wait_op_ack(mark, QpRole::Main, timeout, |o| {
        expect::executed(o, msg_seq) || o.syndrome.is_nak()
    });
    v.check(
        "op.write-ack",
        match op {
            Some(o)
                if o.syndrome == Syndrome::Ack
                    && o.msn == msg_seq.wrapping_add(1)
                    && o.nak_msg_seq == 0 =>
            {
                Ok(())
            }
            Some(o) => Err(format!(
                "op-ack {} msn {} nak_msg_seq {}",
                o.syndrome.name(),
                o.msn,
                o.nak_msg_seq
            )),
            None => Err("no op-ack reported the WRITE executed".into()),
        },
    );
    let (bytes, problems) = peer.read(QpRole::Main, offset, data.len() as u32)?;
    v.check("op.write-placed", expect::same_bytes(&bytes, &data));
    v.check(
        "op.read-response",
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        },
    );
    Ok(())
}

/// One 3-segment WRITE arriving last segment first.
fn out_of_order<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(2);
    let data = pattern(2, 3 * SEGMENT_BYTES);
    let msg_seq = peer.take_msg_seq(QpRole::Main);
    let segments = peer.write_segments(QpRole::Main, msg_seq, offset, &data);
    let path = peer.fresh_path()?;
    let p = path.next_psn;
    let mark = peer.mark();
    // Sent in order p, p+1, p+2 (floors relative to p), delivered reversed.
    let mut third = segments[2].clone();
    third.flags = Flags::ACK_REQUEST;
    peer.send_segment(&path, p.wrapping_add(2), 2, &third)?;
    v.check(
        "sack.out-of-order",
        peer.wait_ack_state(mark, &path, p, &[1]).map(drop),
    );
    let mut second = segments[1].clone();
    second.flags = Flags::ACK_REQUEST;
    peer.send_segment(&path, p.wrapping_add(1), 1, &second)?;
    let mut first = segments[0].clone();
    first.flags = Flags::ACK_REQUEST;
    peer.send_segment(&path, p, 0, &first)?;
    v.check(
        "sack.filled",
        peer.wait_ack_state(mark, &path, p.wrapping_add(3), &[])
            .map(drop),
    );
    let executed = peer.wait_executed(mark, QpRole::Main, msg_seq);
    let placed = peer
        .read_back(offset, data.len() as u32)
        .and_then(|bytes| expect::same_bytes(&bytes, &data));
    v.check("op.any-order-placement", expect::all([executed, placed]));
    Ok(())
}

/// Segments 0, 2, 5 of a 6-segment WRITE, then 1, 3, 4 under new PSNs.
fn holes_and_resend<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(3);
    let data = pattern(3, 6 * SEGMENT_BYTES);
    let msg_seq = peer.take_msg_seq(QpRole::Main);
    let mut segments = peer.write_segments(QpRole::Main, msg_seq, offset, &data);
    for s in &mut segments {
        s.flags = Flags::ACK_REQUEST;
    }
    let path = peer.fresh_path()?;
    let p = path.next_psn;
    let mark = peer.mark();
    // Segment i goes out at PSN p+i; 1, 3 and 4 are "lost": the oldest
    // outstanding PSN, hence the floor, stays at p+1 once p is acked.
    peer.send_segment(&path, p, 0, &segments[0])?;
    peer.send_segment(&path, p.wrapping_add(2), 1, &segments[2])?;
    peer.send_segment(&path, p.wrapping_add(5), 4, &segments[5])?;
    v.check(
        "sack.holes",
        peer.wait_ack_state(mark, &path, p.wrapping_add(1), &[0, 3])
            .map(drop),
    );
    // Let every answer to these arrive before judging op-acks.
    peer.drain(peer.config.quiet_period);
    let premature = peer.events[mark..].iter().find_map(|e| match e {
        Event::Ack(a) => a
            .op_acks()
            .iter()
            .find(|o| o.qpn == peer.local_qpn(QpRole::Main) && expect::executed(o, msg_seq))
            .copied(),
        _ => None,
    });
    v.check(
        "op.incomplete-not-acked",
        match premature {
            Some(o) => Err(format!(
                "an op-ack reported msn {} with half the message missing",
                o.msn
            )),
            None => Ok(()),
        },
    );
    // The lost segments again, at p+6, p+7, p+8: the oldest outstanding
    // PSN is now p+6, so the floor moves there and p+1, p+3, p+4 are given up.
    let resend_mark = peer.mark();
    for (k, &i) in [1usize, 3, 4].iter().enumerate() {
        let mut s = segments[i].clone();
        s.flags = Flags::ACK_REQUEST | Flags::RETRANSMIT;
        peer.send_segment(&path, p.wrapping_add(6 + k as u32), k as u16, &s)?;
    }
    v.check(
        "floor.slides-window",
        peer.wait_ack_state(resend_mark, &path, p.wrapping_add(9), &[])
            .map(drop),
    );
    let executed = peer.wait_executed(mark, QpRole::Main, msg_seq);
    let placed = peer
        .read_back(offset, data.len() as u32)
        .and_then(|bytes| expect::same_bytes(&bytes, &data));
    v.check("resend.new-psn", expect::all([executed, placed]));
    Ok(())
}

// ------------------------------------------------------------ repair packets

/// A 5-segment WRITE, the last segment short, with segment 2 lost: a
/// repair packet stands in for it (wire.md §4.4).
fn repair_rebuilds<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(25);
    // A fill first, so that segment 2's bytes can only come from the rebuild.
    peer.write(QpRole::Main, offset, &pattern(125, 4 * SEGMENT_BYTES + 100))?;
    // Four full segments and a short one: the last shard is zero-padded.
    let data = pattern(25, 4 * SEGMENT_BYTES + 100);
    let msg_seq = peer.take_msg_seq(QpRole::Main);
    let segments = peer.write_segments(QpRole::Main, msg_seq, offset, &data);
    let repair = repair_segments(&segments, 2)?;
    let path = peer.fresh_path()?;
    let p = path.next_psn;
    let mark = peer.mark();
    // Segment i at PSN p+i, floors at p (nothing was acknowledged when
    // they left); segment 2 and the first repair packet are lost, the
    // second repair packet arrives at p+5. Any five of the seven shards
    // rebuild the message, so four data packets and one recovery shard do.
    for i in [0usize, 1, 3, 4] {
        peer.send_segment(&path, p.wrapping_add(i as u32), i as u16, &segments[i])?;
    }
    peer.send_segment(&path, p.wrapping_add(5), 5, &repair[1])?;
    // The repair packet takes a PSN and is acknowledged like a data
    // packet; p+2 never came.
    let counted = peer
        .wait_ack_state(mark, &path, p.wrapping_add(2), &[0, 1, 2])
        .map(drop)
        .map_err(|e| format!("the repair packet's PSN: {e}"));
    // Completed as if segment 2 had arrived: executed, every byte placed.
    let executed = peer.wait_executed(mark, QpRole::Main, msg_seq);
    let placed = peer
        .read_back(offset, data.len() as u32)
        .and_then(|bytes| expect::same_bytes(&bytes, &data));
    v.check("repair.rebuilds", expect::all([counted, executed, placed]));
    Ok(())
}

/// A 5-segment WRITE with two segments lost and one repair packet: one
/// shard cannot make up two, so the message waits for the resends.
fn repair_not_enough<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(26);
    peer.write(QpRole::Main, offset, &pattern(126, 5 * SEGMENT_BYTES))?;
    let data = pattern(26, 5 * SEGMENT_BYTES);
    let msg_seq = peer.take_msg_seq(QpRole::Main);
    let segments = peer.write_segments(QpRole::Main, msg_seq, offset, &data);
    let repair = repair_segments(&segments, 2)?;
    let path = peer.fresh_path()?;
    let p = path.next_psn;
    let mark = peer.mark();
    // Segments 1 and 3 are lost, and of the two repair packets only the
    // first arrives (at p+5): five data shards needed, four held.
    for i in [0usize, 2, 4] {
        peer.send_segment(&path, p.wrapping_add(i as u32), i as u16, &segments[i])?;
    }
    peer.send_segment(&path, p.wrapping_add(5), 5, &repair[0])?;
    peer.wait_ack_state(mark, &path, p.wrapping_add(1), &[0, 2, 3])?;
    // Let every answer to these arrive before judging op-acks.
    peer.drain(peer.config.quiet_period);
    let qpn = peer.local_qpn(QpRole::Main);
    let premature = peer.events[mark..].iter().find_map(|e| match e {
        Event::Ack(a) => a
            .op_acks()
            .iter()
            .find(|o| o.qpn == qpn && expect::executed(o, msg_seq))
            .copied(),
        _ => None,
    });
    let waited = match premature {
        Some(o) => Err(format!(
            "an op-ack reported msn {} with two segments missing and one repair shard",
            o.msn
        )),
        None => Ok(()),
    };
    // The lost segments resent at p+6 and p+7: the oldest outstanding PSN
    // is p+6 then (p+1 and p+3 given up), so the floor moves there. The
    // held shard may rebuild the second once the first is in; either way
    // the bytes must be the message's.
    for (k, &i) in [1usize, 3].iter().enumerate() {
        let mut s = segments[i].clone();
        s.flags = Flags::ACK_REQUEST | Flags::RETRANSMIT;
        peer.send_segment(&path, p.wrapping_add(6 + k as u32), k as u16, &s)?;
    }
    let executed = peer.wait_executed(mark, QpRole::Main, msg_seq);
    let placed = peer
        .read_back(offset, data.len() as u32)
        .and_then(|bytes| expect::same_bytes(&bytes, &data));
    v.check("repair.not-enough", expect::all([waited, executed, placed]));
    Ok(())
}

/// Duplicates at the path level and the operation level.
fn duplicates<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(4);
    let x = pattern(40, 64);
    let y = pattern(41, 64);
    let path = peer.fresh_path()?;
    let p = path.next_psn;
    // WRITE X as msg m at PSN p on the fresh path.
    let m = peer.take_msg_seq(QpRole::Main);
    let write_x = peer.write_segments(QpRole::Main, m, offset, &x).remove(0);
    let mark = peer.mark();
    let x_bytes = peer.send_segment(&path, p, 0, &write_x)?;
    peer.wait_ack_state(mark, &path, p.wrapping_add(1), &[])?;
    peer.wait_executed(mark, QpRole::Main, m)?;
    // WRITE Y over it (m + 1), on the control path.
    peer.write(QpRole::Main, offset, &y)?;
    // X again: byte for byte (same PSN; with authentication the datagram
    // is re-sealed under a new packet number, else it would be a replay),
    // then under a new PSN as a retransmission.
    let dup_mark = peer.mark();
    let again = if peer.authenticated() {
        peer.craft(&path, p, 0, &write_x)
    } else {
        x_bytes
    };
    peer.send(&again)?;
    let mut resent = write_x.clone();
    resent.flags = Flags::ACK_REQUEST | Flags::RETRANSMIT;
    peer.send_segment(&path, p.wrapping_add(1), 0, &resent)?;
    v.check(
        "dup.same-psn",
        peer.wait_ack_state(dup_mark, &path, p.wrapping_add(2), &[])
            .map(drop),
    );
    peer.drain(peer.config.quiet_period);
    v.check(
        "dup.not-reexecuted",
        peer.read_back(offset, y.len() as u32)
            .and_then(|bytes| expect::same_bytes(&bytes, &y))
            .map_err(|e| format!("after X was resent: {e}")),
    );
    Ok(())
}

/// FETCH_ADD, CMP_SWAP, and a FETCH_ADD resent under a new PSN.
///
/// wire.md does not say in which byte order the target word lies in
/// memory (MetaRoCE keeps it little-endian, ibverbs keeps host order); the
/// suite learns the order from the first ATOMIC_RESPONSE (whose `original`
/// must be the written bytes read one way or the other) and then asks for
/// consistency.
fn atomics<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(5);
    let word_addr = peer.addr(offset);
    let rkey = peer.target.rkey;
    let written = 0x1111_2222_3333_4444u64.to_be_bytes();
    peer.write(QpRole::Main, offset, &written)?;
    let local_qpn = peer.local_qpn(QpRole::Main);

    let add = 5;
    let (response, fetch_add) = match peer.atomic(OpHeader::FetchAdd {
        rkey,
        remote_addr: word_addr,
        add,
    }) {
        Ok(answer) => answer,
        Err(e) => {
            v.check("atomic.fetch-add", Err(e));
            return Err("the FETCH_ADD failed".into());
        }
    };
    let original = match response.op {
        OpHeader::AtomicResponse { original } => original,
        _ => 0,
    };
    let big_endian = original == u64::from_be_bytes(written);
    let little_endian = original == u64::from_le_bytes(written);
    let as_bytes = move |value: u64| {
        if big_endian {
            value.to_be_bytes()
        } else {
            value.to_le_bytes()
        }
    };
    let after_add = original.wrapping_add(add);
    let word = peer.read_back(offset, 8)?;
    v.check(
        "atomic.fetch-add",
        if big_endian || little_endian {
            expect::all([
                expect::atomic_response(&response, local_qpn, fetch_add.msg_seq, original),
                expect::same_bytes(&word, &as_bytes(after_add)),
            ])
        } else {
            Err(format!(
                "original is {original:#x}, which is the written bytes in neither byte order"
            ))
        },
    );

    let swap = 0x5a5a_0000_0000_a5a5;
    match peer.atomic(OpHeader::CmpSwap {
        rkey,
        remote_addr: word_addr,
        compare: after_add,
        swap,
    }) {
        Ok((response, segment)) => {
            let word = peer.read_back(offset, 8)?;
            v.check(
                "atomic.cmp-swap",
                expect::all([
                    expect::atomic_response(&response, local_qpn, segment.msg_seq, after_add),
                    expect::same_bytes(&word, &as_bytes(swap)),
                ]),
            );
        }
        Err(e) => v.check("atomic.cmp-swap", Err(e)),
    }

    let mut segment = fetch_add;
    segment.flags = Flags::ACK_REQUEST | Flags::RETRANSMIT;
    let path = peer.fresh_path()?;
    let mark = peer.mark();
    peer.send_segment(&path, path.next_psn, 0, &segment)?;
    peer.wait_ack_state(mark, &path, path.next_psn.wrapping_add(1), &[])?;
    peer.drain(peer.config.quiet_period);
    let word = peer.read_back(offset, 8)?;
    v.check(
        "atomic.exactly-once",
        expect::same_bytes(&word, &as_bytes(swap)).map_err(|e| format!("after the resend: {e}")),
    );
    Ok(())
}

/// Walk a fresh path to the end of the PSN space and across it.
fn psn_wrap<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let path = peer.fresh_path()?;
    let target_psn = u32::MAX - 2; // 2^32 - 3
    let mut psn = path.next_psn;
    let mark = peer.mark();
    // Jumps of 2^30 with psn_floor_delta 0: each tells the receiver that
    // nothing below it is outstanding, so its window follows.
    peer.send_filler(&path, psn, 0, Flags::empty())?;
    while metaroce_wire::seq::seq_diff(target_psn, psn) > (1 << 30)
        || metaroce_wire::seq::seq_diff(target_psn, psn) < 0
    {
        psn = psn.wrapping_add(1 << 30);
        peer.send_filler(&path, psn, 0, Flags::empty())?;
    }
    peer.send_filler(&path, target_psn, 0, Flags::empty())?;
    peer.send_filler(&path, u32::MAX - 1, 0, Flags::empty())?;
    // 2^32 - 1 withheld (lost); 0 and 1 arrive, the floor stays at 2^32 - 1.
    peer.send_filler(&path, 0, 1, Flags::empty())?;
    peer.send_filler(&path, 1, 2, Flags::ACK_REQUEST)?;
    match peer.wait_ack_state(mark, &path, u32::MAX, &[0, 1]) {
        Ok(_) => {
            v.check("psn.wrap-cumulative", Ok(()));
            v.check("psn.wrap-sack", Ok(()));
        }
        Err(why) => {
            let last = peer.acks_for(mark, &path).last().cloned();
            let cumulative_ok = last.as_ref().is_some_and(|a| a.ack_psn == u32::MAX);
            v.check(
                "psn.wrap-cumulative",
                if cumulative_ok {
                    Ok(())
                } else {
                    Err(why.clone())
                },
            );
            v.check("psn.wrap-sack", Err(why));
        }
    }
    Ok(())
}

/// The last bit of the SACK bitmap, one past it, and a floor over unsent PSNs.
fn window_edge<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let path = peer.fresh_path()?;
    let p = path.next_psn;
    let mark = peer.mark();
    peer.send_filler(&path, p, 0, Flags::ACK_REQUEST)?;
    peer.wait_ack_state(mark, &path, p.wrapping_add(1), &[])?;
    // p+1 .. p+256 "lost": the floor stays at p+1.
    let edge_mark = peer.mark();
    peer.send_filler(&path, p.wrapping_add(257), 256, Flags::ACK_REQUEST)?;
    v.check(
        "sack.last-bit",
        peer.wait_ack_state(edge_mark, &path, p.wrapping_add(1), &[255])
            .map(drop),
    );
    let beyond_mark = peer.mark();
    peer.send_filler(&path, p.wrapping_add(258), 257, Flags::ACK_REQUEST)?;
    peer.drain(peer.config.quiet_period);
    let wrong = peer
        .acks_for(beyond_mark, &path)
        .into_iter()
        .find(|a| a.ack_psn != p.wrapping_add(1) || a.sack.iter_set().any(|i| i != 255));
    v.check(
        "sack.beyond-window",
        match wrong {
            Some(a) => Err(format!(
                "an ACK {}",
                expect::ack_state(&a, p.wrapping_add(1), &[255]).unwrap_err()
            )),
            None => Ok(()),
        },
    );
    let floor_mark = peer.mark();
    peer.send_filler(&path, p.wrapping_add(259), 0, Flags::ACK_REQUEST)?;
    v.check(
        "floor.skips-unsent",
        peer.wait_ack_state(floor_mark, &path, p.wrapping_add(260), &[])
            .map(drop),
    );
    Ok(())
}

/// A slot's generation moves on; a late packet of the old one arrives.
fn path_generations<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(8);
    let fill = pattern(80, 64);
    peer.write(QpRole::Main, offset, &fill)?;
    let old = peer.fresh_path()?;
    let new = peer.generation_of(&old, old.generation + 1);
    let p = old.next_psn;
    let q = new.next_psn;
    let mark = peer.mark();
    peer.send_filler(&old, p, 0, Flags::empty())?;
    peer.send_filler(&old, p.wrapping_add(1), 0, Flags::ACK_REQUEST)?;
    peer.wait_ack_state(mark, &old, p.wrapping_add(2), &[])?;
    let new_mark = peer.mark();
    peer.send_filler(&new, q, 0, Flags::ACK_REQUEST)?;
    v.check(
        "path.new-generation",
        peer.wait_ack_state(new_mark, &new, q.wrapping_add(1), &[])
            .map(drop),
    );
    // A late WRITE of the old generation, carrying the next message.
    let msg_seq = peer.peek_msg_seq(QpRole::Main);
    let late = peer
        .write_segments(QpRole::Main, msg_seq, offset, &pattern(81, 64))
        .remove(0);
    let late_mark = peer.mark();
    peer.send_segment(&old, p.wrapping_add(2), 0, &late)?;
    peer.drain(peer.config.quiet_period);
    let answered = peer.acks_for(late_mark, &old);
    peer.send_filler(&new, q.wrapping_add(1), 0, Flags::ACK_REQUEST)?;
    let undisturbed = peer
        .wait_ack_state(late_mark, &new, q.wrapping_add(2), &[])
        .map(drop)
        .map_err(|e| format!("generation 2 after the late packet: {e}"));
    let placed = peer
        .read_back(offset, fill.len() as u32)
        .and_then(|bytes| expect::same_bytes(&bytes, &fill))
        .map_err(|e| format!("the late WRITE was placed: {e}"));
    let silent = match answered.first() {
        Some(a) => Err(format!(
            "the old generation was acknowledged: ack_psn {}",
            a.ack_psn
        )),
        None => Ok(()),
    };
    v.check(
        "path.stale-generation",
        expect::all([silent, undisturbed, placed]),
    );
    Ok(())
}

// ------------------------------------------------------------ rejected datagrams

/// How a mutated datagram gets its protection back.
#[derive(Clone, Copy)]
enum Reseal {
    /// Mutate the clear datagram, then seal it (ICRC or tag): the
    /// mutation is the only fault.
    Seal,
    /// Leave it as mutated.
    None,
}

/// The common shape of the `drop.*` and most `auth.*` checks: a WRITE of
/// new bytes over a known fill, mutated by `mutate`, sent alone on a fresh
/// path with ACK_REQUEST. Passes if the target does not answer for that
/// path, a following packet's ACK shows the PSN missing, and the fill is
/// intact.
fn drop_check<L: Link>(
    peer: &mut Peer<L>,
    v: &mut Verdicts,
    id: &'static str,
    area_index: u64,
    mutate: impl FnOnce(&mut Vec<u8>),
    reseal: Reseal,
) -> Result<(), String> {
    let offset = area(area_index);
    let fill = pattern(area_index as u8, 64);
    peer.write(QpRole::Main, offset, &fill)?;
    let msg_seq = peer.peek_msg_seq(QpRole::Main);
    let mut segment = peer
        .write_segments(QpRole::Main, msg_seq, offset, &pattern(200, 64))
        .remove(0);
    segment.flags = Flags::ACK_REQUEST;
    let path = peer.fresh_path()?;
    let bytes = match reseal {
        Reseal::Seal => {
            // The fault is the only one: mutate the clear datagram, then seal.
            let (mut bytes, header_len) = peer.craft_clear(&path, path.next_psn, 0, &segment);
            mutate(&mut bytes);
            peer.seal_datagram(&mut bytes, header_len);
            bytes
        }
        Reseal::None => {
            let mut bytes = peer.craft(&path, path.next_psn, 0, &segment);
            mutate(&mut bytes);
            bytes
        }
    };
    judge_dropped(peer, v, id, &path, &bytes, offset, &fill)
}

/// Send `bytes` as the first packet of `path`, then decide `id`: silence,
/// PSN not counted, `fill` still at `offset`.
fn judge_dropped<L: Link>(
    peer: &mut Peer<L>,
    v: &mut Verdicts,
    id: &'static str,
    path: &Path,
    bytes: &[u8],
    offset: u64,
    fill: &[u8],
) -> Result<(), String> {
    let p = path.next_psn;
    let mark = peer.mark();
    peer.send(bytes)?;
    peer.drain(peer.config.quiet_period);
    let silent = match peer.acks_for(mark, path).first() {
        Some(a) => Err(format!(
            "the target answered it: an ACK with ack_psn {}",
            a.ack_psn
        )),
        None => Ok(()),
    };
    // The next PSN, still expecting p (floor delta 1).
    let probe_mark = peer.mark();
    peer.send_filler(path, p.wrapping_add(1), 1, Flags::ACK_REQUEST)?;
    let not_counted = peer
        .wait_ack_state(probe_mark, path, p, &[0])
        .map(drop)
        .map_err(|e| format!("the next ACK must show the rejected PSN missing: {e}"));
    let placed = peer
        .read_back(offset, fill.len() as u32)
        .and_then(|got| expect::same_bytes(&got, fill))
        .map_err(|e| format!("nothing may be placed: {e}"));
    v.check(id, expect::all([silent, not_counted, placed]));
    Ok(())
}

fn payload_on_read_request<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(15);
    let fill = pattern(15, 64);
    peer.write(QpRole::Main, offset, &fill)?;
    let msg_seq = peer.peek_msg_seq(QpRole::Main);
    let request = Segment {
        dst_qpn: peer.qpn(QpRole::Main),
        msg_seq,
        op: OpHeader::ReadRequest {
            rkey: peer.target.rkey,
            remote_addr: peer.addr(offset),
        },
        msg_len: 64,
        offset: 0,
        payload: Vec::new(),
        flags: Flags::ACK_REQUEST,
    };
    let path = peer.fresh_path()?;
    // Emit a clean request, then splice 8 payload bytes in before the trailer.
    let clean = peer.craft(&path, path.next_psn, 0, &request);
    let header_len = DATA_HEADER_LEN + 16;
    let mut bytes = clean[..header_len].to_vec();
    bytes.extend_from_slice(&[0xee; 8]);
    bytes.extend_from_slice(&clean[header_len..]);
    peer.seal_datagram(&mut bytes, header_len);
    let mark = peer.mark();
    judge_dropped(
        peer,
        v,
        "drop.payload-on-read-request",
        &path,
        &bytes,
        offset,
        &fill,
    )?;
    if !peer.responses_to(mark, QpRole::Main, msg_seq).is_empty() {
        v.check(
            "drop.payload-on-read-request",
            Err("the target answered the READ".into()),
        );
    }
    Ok(())
}

fn atomic_length<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(16);
    let fill = pattern(16, 16);
    peer.write(QpRole::Main, offset, &fill)?;
    let msg_seq = peer.peek_msg_seq(QpRole::Main);
    let segment = Segment {
        dst_qpn: peer.qpn(QpRole::Main),
        msg_seq,
        op: OpHeader::FetchAdd {
            rkey: peer.target.rkey,
            remote_addr: peer.addr(offset),
            add: 1,
        },
        msg_len: 8,
        offset: 0,
        payload: Vec::new(),
        flags: Flags::ACK_REQUEST,
    };
    let path = peer.fresh_path()?;
    let bytes = peer.craft_tweaked(&path, path.next_psn, 0, &segment, 0, |b| {
        b[28..32].copy_from_slice(&16u32.to_be_bytes());
    });
    let mark = peer.mark();
    judge_dropped(peer, v, "drop.atomic-length", &path, &bytes, offset, &fill)?;
    if !peer.responses_to(mark, QpRole::Main, msg_seq).is_empty() {
        v.check(
            "drop.atomic-length",
            Err("the target answered the atomic".into()),
        );
    }
    Ok(())
}

/// A repair packet whose `offset` is no repair id (wire.md §4.3): count 1,
/// index 0, but the top bit clear. Its payload is the real shard 0 of 1 of
/// a one-packet WRITE, which alone would rebuild the whole message: a
/// receiver that read the id without checking the top bit would place it.
fn repair_bad_id<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(27);
    let fill = pattern(27, 64);
    peer.write(QpRole::Main, offset, &fill)?;
    let msg_seq = peer.peek_msg_seq(QpRole::Main);
    let segments = peer.write_segments(QpRole::Main, msg_seq, offset, &pattern(208, 64));
    let mut repair = repair_segments(&segments, 1)?.remove(0);
    // Also past msg_len, so a receiver ignoring REPAIR drops it too (rule 1).
    repair.offset = 1 << 16;
    let path = peer.fresh_path()?;
    let bytes = peer.craft(&path, path.next_psn, 0, &repair);
    judge_dropped(peer, v, "drop.repair-bad-id", &path, &bytes, offset, &fill)
}

fn needs_key<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(17);
    let fill = pattern(17, 64);
    peer.write(QpRole::Main, offset, &fill)?;
    let msg_seq = peer.peek_msg_seq(QpRole::Main);
    let segment = peer
        .write_segments(QpRole::Main, msg_seq, offset, &pattern(201, 64))
        .remove(0);
    let path = peer.fresh_path()?;
    let mut repr_bytes = peer.craft(&path, path.next_psn, 0, &segment);
    // Rebuild with AUTHENTICATED and a made-up trailer.
    let header_and_payload = repr_bytes.len() - 4;
    repr_bytes.truncate(header_and_payload);
    repr_bytes[2] |= Flags::AUTHENTICATED.bits() | Flags::ACK_REQUEST.bits();
    repr_bytes.extend_from_slice(&[0x5c; AUTH_TRAILER_LEN]);
    judge_dropped(peer, v, "drop.needs-key", &path, &repr_bytes, offset, &fill)
}

fn reserved_bits<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(18);
    let data = pattern(18, 64);
    let msg_seq = peer.take_msg_seq(QpRole::Main);
    let mut segment = peer
        .write_segments(QpRole::Main, msg_seq, offset, &data)
        .remove(0);
    // Flags: the reserved bit 7 set beside ACK_REQUEST.
    segment.flags = Flags(Flags::ACK_REQUEST.bits() | 0x80);
    let path = peer.fresh_path()?;
    // op_flags: reserved bits 2..7 set, SOLICITED and FLOOR_ACKED clear.
    let bytes = peer.craft_tweaked(&path, path.next_psn, 0, &segment, 0, |b| b[25] = 0xfc);
    let mark = peer.mark();
    peer.send(&bytes)?;
    let counted = peer
        .wait_ack_state(mark, &path, path.next_psn.wrapping_add(1), &[])
        .map(drop);
    let executed = peer.wait_executed(mark, QpRole::Main, msg_seq);
    let placed = peer
        .read_back(offset, data.len() as u32)
        .and_then(|got| expect::same_bytes(&got, &data));
    v.check(
        "accept.reserved-bits",
        expect::all([counted, executed, placed]),
    );
    Ok(())
}

// ------------------------------------------------------------ operation level

fn unknown_qpn<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(19);
    let fill = pattern(19, 64);
    peer.write(QpRole::Main, offset, &fill)?;
    // A QPN none of the target's QPs has.
    let unknown = (1..=u32::MAX)
        .map(|k| {
            peer.qpn(QpRole::Main)
                .wrapping_add(k.wrapping_mul(0x9e37_79b9))
        })
        .find(|q| !peer.target.qpns.contains(q))
        .expect("some QPN is free");
    let msg_seq = peer.peek_msg_seq(QpRole::Main);
    let mut segment = peer
        .write_segments(QpRole::Main, msg_seq, offset, &pattern(202, 64))
        .remove(0);
    segment.dst_qpn = unknown;
    let path = peer.fresh_path()?;
    let mark = peer.mark();
    peer.send_segment(&path, path.next_psn, 0, &segment)?;
    peer.drain(peer.config.quiet_period);
    let naked = match peer.events[mark..].iter().find_map(|e| match e {
        Event::Ack(a) => a.op_acks().iter().find(|o| o.syndrome.is_nak()).copied(),
        _ => None,
    }) {
        Some(o) => Err(format!(
            "the target sent {} for QP {}",
            o.syndrome.name(),
            o.qpn
        )),
        None => Ok(()),
    };
    let placed = peer
        .read_back(offset, fill.len() as u32)
        .and_then(|got| expect::same_bytes(&got, &fill))
        .map_err(|e| format!("nothing may be placed: {e}"));
    let still_works = peer
        .write(QpRole::Main, offset, &fill)
        .map(drop)
        .map_err(|e| format!("the main QP stopped working: {e}"));
    v.check("op.unknown-qpn", expect::all([naked, placed, still_works]));
    Ok(())
}

/// A WRITE on `role` whose target is refused; returns the NAK verdict.
fn refused_write<L: Link>(
    peer: &mut Peer<L>,
    role: QpRole,
    rkey: u64,
    offset: u64,
    data: &[u8],
) -> Result<(u32, Result<(), String>), String> {
    let msg_seq = peer.take_msg_seq(role);
    let mut segment = peer.write_segments(role, msg_seq, offset, data).remove(0);
    if let OpHeader::Write { rkey: k, .. } = &mut segment.op {
        *k = rkey;
    }
    let path = peer.fresh_path()?;
    let mark = peer.mark();
    peer.send_segment(&path, path.next_psn, 0, &segment)?;
    let timeout = peer.config.answer_timeout;
    let nak = peer.wait_op_ack(mark, role, timeout, |o| {
        o.syndrome.is_nak() || expect::executed(o, msg_seq)
    });
    let verdict = match nak {
        Some(o) => expect::nak(&o, Syndrome::RemAccessErr, msg_seq),
        None => Err(format!(
            "no op-ack for QP {} within {timeout:?}",
            peer.qpn(role)
        )),
    };
    Ok((msg_seq, verdict))
}

fn bad_rkey<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(20);
    let fill = pattern(20, 64);
    peer.write(QpRole::Main, offset, &fill)?;
    // A guess differing from the real key in its random bits.
    let guessed = peer.target.rkey ^ 0x0000_5a5a_0000_0100;
    let (msg_seq, nak) = refused_write(peer, QpRole::BadRkey, guessed, offset, &pattern(203, 64))?;
    let placed = peer
        .read_back(offset, fill.len() as u32)
        .and_then(|got| expect::same_bytes(&got, &fill))
        .map_err(|e| format!("nothing may be placed: {e}"));
    v.check("access.bad-rkey", expect::all([nak, placed]));

    // The QP is in error now: a valid WRITE on it must not execute.
    let offset = area(21);
    let fill = pattern(21, 64);
    peer.write(QpRole::Main, offset, &fill)?;
    let next = peer.take_msg_seq(QpRole::BadRkey);
    let segment = peer
        .write_segments(QpRole::BadRkey, next, offset, &pattern(204, 64))
        .remove(0);
    let path = peer.fresh_path()?;
    let mark = peer.mark();
    peer.send_segment(&path, path.next_psn, 0, &segment)?;
    peer.drain(peer.config.quiet_period * 2);
    let qpn = peer.local_qpn(QpRole::BadRkey);
    let executed = peer.events[mark..].iter().find_map(|e| match e {
        Event::Ack(a) => a
            .op_acks()
            .iter()
            .find(|o| o.qpn == qpn && (expect::executed(o, next) || expect::executed(o, msg_seq)))
            .copied(),
        _ => None,
    });
    let not_executed = match executed {
        Some(o) => Err(format!("an op-ack reported msn {} on the failed QP", o.msn)),
        None => Ok(()),
    };
    let placed = peer
        .read_back(offset, fill.len() as u32)
        .and_then(|got| expect::same_bytes(&got, &fill))
        .map_err(|e| format!("the WRITE after the fatal NAK was placed: {e}"));
    v.check("access.fatal", expect::all([not_executed, placed]));
    Ok(())
}

fn out_of_bounds_write<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let len = peer.target.region_len;
    let tail = len - 8;
    let fill = pattern(30, 8);
    peer.write(QpRole::Main, tail, &fill)?;
    // 8 bytes at len - 4: the first 4 inside, the last 4 past the end.
    let (_, nak) = refused_write(
        peer,
        QpRole::OutOfBoundsWrite,
        peer.target.rkey,
        len - 4,
        &pattern(205, 8),
    )?;
    let placed = peer
        .read_back(tail, 8)
        .and_then(|got| expect::same_bytes(&got, &fill))
        .map_err(|e| format!("the in-bounds half was placed: {e}"));
    v.check("access.out-of-bounds-write", expect::all([nak, placed]));
    Ok(())
}

fn out_of_bounds_read<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let len = peer.target.region_len;
    let role = QpRole::OutOfBoundsRead;
    let mark = peer.mark();
    let msg_seq = peer.peek_msg_seq(role);
    let result = peer.read(role, len - 16, 64);
    let timeout = peer.config.answer_timeout;
    let verdict = match result {
        Ok(_) => Err("the target returned the READ's data".into()),
        Err(_) => {
            let nak = peer.wait_op_ack(mark, role, timeout, |o| o.syndrome.is_nak());
            let data = peer.responses_to(mark, role, msg_seq);
            expect::all([
                match nak {
                    Some(o) => expect::nak(&o, Syndrome::RemAccessErr, msg_seq),
                    None => Err("no NAK".into()),
                },
                if data.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{} READ_RESPONSE packets came back", data.len()))
                },
            ])
        }
    };
    v.check("access.out-of-bounds-read", verdict);
    Ok(())
}

fn rnr_nak<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let role = QpRole::Rnr;
    let msg_seq = peer.take_msg_seq(role);
    let segment = Segment {
        dst_qpn: peer.qpn(role),
        msg_seq,
        op: OpHeader::Send { recv_index: 0 },
        msg_len: 32,
        offset: 0,
        payload: pattern(206, 32),
        flags: Flags::ACK_REQUEST,
    };
    let path = peer.fresh_path()?;
    let mark = peer.mark();
    peer.send_segment(&path, path.next_psn, 0, &segment)?;
    let timeout = peer.config.answer_timeout;
    let verdict = match peer.wait_op_ack(mark, role, timeout, |o| {
        o.syndrome.is_nak() || expect::executed(o, msg_seq)
    }) {
        Some(o) => expect::nak(&o, Syndrome::RnrNak, msg_seq).and_then(|()| {
            if o.msn == msg_seq {
                Ok(())
            } else {
                Err(format!("msn is {}, expected {msg_seq}", o.msn))
            }
        }),
        None => Err(format!(
            "no op-ack for QP {} within {timeout:?}",
            peer.qpn(role)
        )),
    };
    v.check("op.rnr-nak", verdict);
    Ok(())
}

// ------------------------------------------------------------ authentication

fn replay<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let path = peer.fresh_path()?;
    let p = path.next_psn;
    let mark = peer.mark();
    let original = peer.send_filler(&path, p, 0, Flags::ACK_REQUEST)?;
    peer.wait_ack_state(mark, &path, p.wrapping_add(1), &[])?;
    peer.drain(peer.config.quiet_period);
    let replay_mark = peer.mark();
    peer.send(&original)?;
    peer.drain(peer.config.quiet_period);
    v.check(
        "auth.replay",
        match peer.acks_for(replay_mark, &path).first() {
            Some(a) => Err(format!(
                "the target answered the replay: ack_psn {}",
                a.ack_psn
            )),
            None => Ok(()),
        },
    );
    Ok(())
}

fn unauthenticated<L: Link>(peer: &mut Peer<L>, v: &mut Verdicts) -> Result<(), String> {
    let offset = area(24);
    let fill = pattern(24, 64);
    peer.write(QpRole::Main, offset, &fill)?;
    let msg_seq = peer.peek_msg_seq(QpRole::Main);
    let segment = peer
        .write_segments(QpRole::Main, msg_seq, offset, &pattern(207, 64))
        .remove(0);
    let path = peer.fresh_path()?;
    // The same WRITE as a plain packet: no AUTHENTICATED, an ICRC.
    let mut repr = metaroce_wire::DataRepr {
        base: metaroce_wire::BaseRepr {
            flags: Flags::ACK_REQUEST,
            path_slot: path.slot,
            path_gen: path.generation,
            src_device_port: peer.config.local.port(),
        },
        psn: path.next_psn,
        timestamp_ns: 0,
        dst_qpn: segment.dst_qpn,
        msg_seq,
        solicited: false,
        psn_floor_delta: 0,
        floor_acked: false,
        msg_len: segment.msg_len,
        offset: 0,
        op: segment.op,
        payload_len: segment.payload.len() as u32,
    };
    repr.base.flags.remove(Flags::AUTHENTICATED);
    let mut bytes = vec![0u8; repr.buffer_len()];
    emit_data(&repr, &segment.payload, &mut bytes);
    judge_dropped(
        peer,
        v,
        "auth.unauthenticated",
        &path,
        &bytes,
        offset,
        &fill,
    )
}
