//! The responder: what a request does to the QP it names.
//!
//! This is where the *operation identity* `(qpn, msg_seq, offset)` is used;
//! the path sequence numbers have been dealt with by the connection before a
//! packet gets here. Rules (ibverbs RC semantics over an unordered fabric):
//! - every packet is placed directly where it names (rkey + address, or the
//!   receive it matches + offset), in any order, after the memory checks;
//! - each request message executes exactly once: the QP's window of
//!   `msg_seq`s drops anything already executed (and repeats the op-ack for
//!   it), and per message a range set counts each byte once;
//! - receive completions leave in message order, one posted receive per
//!   receive-consuming message; a message whose receive is not posted yet
//!   is refused with an RNR NAK;
//! - the first fatal error (a remote access or invalid request NAK) is
//!   sticky: it is repeated for every later packet, and once every earlier
//!   message completed, the QP enters the error state.
//!
//! The state is the QP's own (its receive queue and message window, in the
//! QP table); of the connection it needs only the op-ack queue, the count
//! of messages held (the outstanding-operation limit) and the send queue a
//! READ or atomic response goes into.

use super::{Connection, live_qp};
use crate::device_state::DeviceState;
use crate::memory::{AccessFlags, AtomicOp, KeyKind, MemoryError, Span};
use crate::message::{MsgAddress, TxMessage};
use crate::qp::{Qp, QpRunState, RxMessage};
use crate::range_set::RangeSet;
use crate::repair::{self, Placement, RepairRx};
use crate::work::{Completion, WcOpcode, WcStatus};
use metaroce_wire::{DataRepr, Flags, OpHeader, Opcode, RepairId, Syndrome, seq};

/// Most disjoint byte ranges an incoming message may have (holes between
/// arrived segments). A sender has at most 255 packets in flight per path
/// and 256 paths, so a legitimate message never comes near this.
const MAX_RANGES_PER_MESSAGE: usize = 1 << 16;

/// Where the response to request `msg_seq` of responder QP `qp` goes, and
/// the payload bytes per packet it is cut into: the responder QP's own
/// path MTU (`device_mtu` where none was set), as the requester's is for
/// its requests.
fn response_route(qp: &Qp, msg_seq: u32, device_mtu: u32) -> (MsgAddress, u32) {
    let to = MsgAddress {
        qp: qp.handle.index() as u32,
        dst_qpn: qp.remote_qpn,
        msg_seq,
    };
    (to, qp.mtu(device_mtu))
}

/// Where the payload of WRITE packet `repr` from connection `conn_index`
/// would be placed, if a driver may receive it there straight from its
/// socket, before the packet has been read whole and checked: the span of
/// the target region and the offset in it.
///
/// Only into bytes no check could keep from being written later: a WRITE
/// (or WRITE-with-immediate with its receive posted) of an open message of
/// a live QP, inside the window of messages this responder takes, to a
/// region the rkey lets the peer write, and into a range of the message
/// that has not arrived yet. Whatever then happens to the packet (a
/// checksum the kernel rejects, a PSN out of the path's window, a header
/// that did not survive the trip), the bytes it left there belong to a
/// part of an unfinished message that a checked packet must still bring:
/// the message cannot complete before that packet has overwritten them.
pub(crate) fn direct_write_target(
    dev: &mut DeviceState,
    conn_index: u32,
    repr: &DataRepr,
) -> Option<(Span, u64)> {
    if repr.base.flags.contains(Flags::REPAIR) {
        // A recovery shard, not message bytes: held, never placed.
        return None;
    }
    let (rkey, remote_addr) = match repr.op {
        OpHeader::Write { rkey, remote_addr } => (rkey, remote_addr),
        OpHeader::WriteImm {
            rkey, remote_addr, ..
        } => (rkey, remote_addr),
        _ => return None,
    };
    let window = dev.config.max_incoming_ops_per_qp;
    let qp = dev.qps.for_packet(repr.dst_qpn, conn_index)?;
    if qp.state == QpRunState::Error || qp.rx_fatal.is_some() {
        return None;
    }
    let ahead = repr.msg_seq.wrapping_sub(qp.rx_msn);
    if ahead >= window {
        return None;
    }
    if let OpHeader::WriteImm { recv_index, .. } = repr.op
        && recv_index.wrapping_sub(qp.rq_base) as usize >= qp.rq.len()
    {
        return None;
    }
    let start = u64::from(repr.offset);
    let end = start + u64::from(repr.payload_len);
    if let Some(Some(m)) = qp.rx_window.get(ahead as usize)
        && (m.done
            || m.opcode != repr.op.opcode()
            || m.len != repr.msg_len
            || m.ranges.len() >= MAX_RANGES_PER_MESSAGE
            || m.ranges.overlaps(start, end))
    {
        return None;
    }
    if !qp.remote_access.contains(AccessFlags::REMOTE_WRITE) {
        return None;
    }
    let pd = qp.pd;
    let span = dev
        .regions
        .check(
            KeyKind::Remote,
            rkey,
            pd,
            remote_addr,
            u64::from(repr.msg_len),
            AccessFlags::REMOTE_WRITE,
        )
        .ok()?;
    Some((span, start))
}

/// Execute (or refuse) the request a data packet carries. Returns whether
/// something happened that the peer should hear about at once (a message
/// finished, a NAK, a duplicate whose op-ack must be repeated).
pub(super) fn on_request(
    conn: &mut Connection,
    dev: &mut DeviceState,
    now_ns: u64,
    repr: &DataRepr,
    payload: &[u8],
) -> bool {
    let conn_index = conn.index();
    let window = dev.config.max_incoming_ops_per_qp;
    let op_limit = dev.config.max_outstanding_ops_per_connection;
    let Some(qp) = dev.qp_for_packet(repr.dst_qpn, conn_index) else {
        return false;
    };
    let qp_index = qp.handle.index();
    if qp.state == QpRunState::Error {
        // Keep repeating the NAK that put us here.
        conn.queue_op_ack(qp);
        return true;
    }
    let ahead = repr.msg_seq.wrapping_sub(qp.rx_msn);
    let late_repair = repr.base.flags.contains(Flags::REPAIR)
        && ((ahead as i32) < 0
            || qp
                .rx_window
                .get(ahead as usize)
                .is_some_and(|m| m.as_ref().is_some_and(|m| m.done)));
    if late_repair {
        // A repair packet behind a message that completed without it (the
        // usual case: nothing was lost). It asks for nothing: its path's
        // ACK covers it in time, and the op-ack went when the message
        // completed. Answering it at once, as a duplicate, cost a ping-pong
        // two ACK datagrams per message.
        return false;
    }
    if (ahead as i32) < 0 {
        // Executed long ago: a duplicate or a probe. Repeat the op-ack.
        conn.queue_op_ack(qp);
        dev.stats.rx_duplicate_ops += 1;
        return true;
    }
    if ahead >= window
        || qp
            .rx_fatal
            .is_some_and(|(_, m)| seq::seq_lt(m, repr.msg_seq))
    {
        dev.stats.rx_dropped_ops += 1;
        return false;
    }
    let ahead = ahead as usize;
    if qp.rx_window.len() <= ahead {
        crate::grow::resize_with(&mut qp.rx_window, ahead + 1, || None);
    }
    if qp.rx_window[ahead].as_ref().is_some_and(|m| m.done) {
        conn.queue_op_ack(qp);
        dev.stats.rx_duplicate_ops += 1;
        return true;
    }

    // A receive-consuming message needs its receive posted; if it is not,
    // tell the requester to come back later (RNR NAK) and drop the payload.
    let recv_index = match repr.op {
        OpHeader::Send { recv_index } | OpHeader::SendImm { recv_index, .. } => Some(recv_index),
        OpHeader::WriteImm { recv_index, .. } => Some(recv_index),
        _ => None,
    };
    let makes_response = matches!(
        repr.op,
        OpHeader::ReadRequest { .. } | OpHeader::FetchAdd { .. } | OpHeader::CmpSwap { .. }
    );
    if makes_response && conn.messages_held() as u32 >= op_limit {
        // The response would be one more message held for this peer, past
        // the limit: do not execute (the requester resends, and nothing of
        // the request has happened, so that is safe for atomics too).
        dev.stats.rx_over_limit += 1;
        return false;
    }
    if let Some(ri) = recv_index {
        let slot = ri.wrapping_sub(qp.rq_base) as usize;
        if slot >= qp.rq.len() {
            qp.rx_rnr = Some(repr.msg_seq);
            conn.queue_op_ack(qp);
            dev.stats.rnr_naks_sent += 1;
            return true;
        }
    }

    let pd = qp.pd;
    let remote_access = qp.remote_access;
    let msg_len = u64::from(repr.msg_len);
    let entry = qp.rx_window[ahead].get_or_insert_with(|| RxMessage {
        opcode: repr.op.opcode(),
        len: repr.msg_len,
        ranges: RangeSet::new(),
        imm: None,
        consumes_recv: recv_index.is_some(),
        recv_index: recv_index.unwrap_or(0),
        done: false,
        recv_status: WcStatus::Success,
        solicited: repr.solicited,
        repair: None,
    });
    if entry.opcode != repr.op.opcode()
        || entry.len != repr.msg_len
        || recv_index.is_some_and(|r| r != entry.recv_index)
    {
        // Two packets of one message disagree: a broken or hostile peer.
        dev.stats.rx_dropped_ops += 1;
        return false;
    }
    if entry.ranges.len() >= MAX_RANGES_PER_MESSAGE {
        // A peer placing scattered bytes would grow the message's range set
        // (memory, and time per insert) without bound; a sane one has at
        // most one hole per packet in flight. Not placed, so not counted:
        // the requester's completion probe brings the message again.
        dev.stats.rx_over_limit += 1;
        return false;
    }

    let remote_check =
        |dev: &mut DeviceState, rkey: u64, addr: u64, len: u64, need: AccessFlags| {
            let checked = if remote_access.contains(need) {
                dev.regions
                    .check(KeyKind::Remote, rkey, pd, addr, len, need)
            } else {
                Err(MemoryError::NoPermission)
            };
            if checked.is_err() {
                dev.stats.rx_remote_access_denied += 1;
            }
            checked
        };
    let mut fatal: Option<Syndrome> = None;
    let mut response: Option<TxMessage> = None;
    let mut arrived_bytes = None;
    let is_repair = repr.base.flags.contains(Flags::REPAIR);
    if is_repair && !hold_repair(dev, qp_index, ahead, repr, payload) {
        return false;
    }
    match repr.op {
        _ if is_repair => {}
        OpHeader::Write { rkey, remote_addr }
        | OpHeader::WriteImm {
            rkey, remote_addr, ..
        } => {
            match remote_check(dev, rkey, remote_addr, msg_len, AccessFlags::REMOTE_WRITE) {
                Ok(span) => {
                    // Empty when the driver received the payload in place
                    // (`direct_write_target`); the header says how much came.
                    dev.regions.write(span, u64::from(repr.offset), payload);
                    arrived_bytes = Some(repr.payload_len as usize);
                }
                Err(_) => fatal = Some(Syndrome::RemAccessErr),
            }
            if let OpHeader::WriteImm { imm, .. } = repr.op {
                entry_of(live_qp(dev, qp_index), ahead).imm = Some(imm);
            }
        }
        OpHeader::Send { .. } | OpHeader::SendImm { .. } => {
            // Borrow the QP table and the region table side by side: the
            // receive's spans are used in place, not copied, per packet.
            let DeviceState { qps, regions, .. } = &mut *dev;
            let qp = qps.at_mut(qp_index).expect("QP looked up above");
            let slot = recv_index
                .expect("sends carry one")
                .wrapping_sub(qp.rq_base) as usize;
            if msg_len > qp.rq[slot].capacity {
                fatal = Some(Syndrome::RemInvReqErr);
                entry_of(qp, ahead).recv_status = WcStatus::LocLenErr;
            } else {
                if let OpHeader::SendImm { imm, .. } = repr.op {
                    entry_of(qp, ahead).imm = Some(imm);
                }
                regions.scatter(&qp.rq[slot].spans, u64::from(repr.offset), payload);
                arrived_bytes = Some(payload.len());
            }
        }
        OpHeader::ReadRequest { rkey, remote_addr } => {
            match remote_check(dev, rkey, remote_addr, msg_len, AccessFlags::REMOTE_READ) {
                Ok(span) => {
                    let device_mtu = dev.config.mtu_payload_bytes;
                    let (to, mtu) =
                        response_route(live_qp(dev, qp_index), repr.msg_seq, device_mtu);
                    response = Some(TxMessage::read_response(to, repr.msg_len, span, mtu));
                }
                Err(_) => fatal = Some(Syndrome::RemAccessErr),
            }
        }
        OpHeader::FetchAdd {
            rkey, remote_addr, ..
        }
        | OpHeader::CmpSwap {
            rkey, remote_addr, ..
        } => {
            let op = match repr.op {
                OpHeader::FetchAdd { add, .. } => AtomicOp::FetchAdd { add },
                OpHeader::CmpSwap { compare, swap, .. } => AtomicOp::CmpSwap { compare, swap },
                _ => unreachable!("matched above"),
            };
            if remote_addr % 8 != 0 {
                fatal = Some(Syndrome::RemInvReqErr);
            } else {
                match remote_check(dev, rkey, remote_addr, 8, AccessFlags::REMOTE_ATOMIC) {
                    Ok(span) => {
                        // Executed exactly once: the window entry is marked
                        // done below, so a duplicate never gets here.
                        let original = dev.regions.atomic(span, op);
                        let device_mtu = dev.config.mtu_payload_bytes;
                        let (to, mtu) =
                            response_route(live_qp(dev, qp_index), repr.msg_seq, device_mtu);
                        response = Some(TxMessage::atomic_response(to, original, mtu));
                    }
                    Err(_) => fatal = Some(Syndrome::RemAccessErr),
                }
            }
        }
        OpHeader::ReadResponse | OpHeader::AtomicResponse { .. } => {
            unreachable!("routed to on_response")
        }
    }

    let qp = live_qp(dev, qp_index);
    let entry = entry_of(qp, ahead);
    let mut done = if fatal.is_some() || response.is_some() {
        true
    } else if let Some(n) = arrived_bytes {
        let off = u64::from(repr.offset);
        if off == 0 && n as u64 >= msg_len && entry.ranges.is_empty() {
            // The whole message in its first packet (every small one): it
            // is complete, and recording its one range would allocate the
            // set only to drop it at once.
            true
        } else {
            entry.ranges.insert(off, off + n as u64);
            entry.ranges.covered() >= msg_len
        }
    } else {
        false
    };
    if !done && fatal.is_none() && entry.repair.is_some() {
        done = rebuild_lost(dev, qp_index, ahead, repr);
    }
    let qp = live_qp(dev, qp_index);
    let entry = entry_of(qp, ahead);
    if !done {
        if repr.base.flags.contains(Flags::COMPLETION_PROBE) {
            // The requester thinks the whole message arrived; we lack part
            // of it (payload dropped earlier for want of a receive). Have
            // it resend the whole message.
            qp.rx_rnr = Some(repr.msg_seq);
            conn.queue_op_ack(qp);
            return true;
        }
        return false;
    }
    entry.done = true;
    if let Some(held) = entry.repair.take() {
        qp.repair_bytes_held -= held.held_bytes();
    }
    if let Some(syndrome) = fatal {
        qp.rx_fatal = Some((syndrome, repr.msg_seq));
        dev.stats.naks_sent += 1;
    }
    if let Some(msg) = response {
        conn.enqueue(now_ns, dev, msg);
    }
    advance_msn(conn, dev, qp_index);
    true
}

/// Keep the recovery shard a repair packet carries with its message's
/// receive state (`repair.rs`). `false` (counted, dropped) for a shard that
/// names no valid code, disagrees with the message's earlier shards, or
/// would take the QP past its budget of held shards.
fn hold_repair(
    dev: &mut DeviceState,
    qp_index: usize,
    ahead: usize,
    repr: &DataRepr,
    payload: &[u8],
) -> bool {
    // The wire crate checked the rest (wire.md 4.3: a WRITE or SEND, an
    // even, non-empty shard no longer than the message, index < count);
    // what is left is what this receiver will hold.
    let shard_bytes = repr.payload_len;
    let id = RepairId::from_offset(repr.offset).filter(|id| {
        id.count <= repair::MAX_REPAIR_COUNT
            && shard_bytes > 0
            && repr.msg_len.div_ceil(shard_bytes) <= repair::MAX_CODE_DATA_PACKETS
    });
    let qp = live_qp(dev, qp_index);
    let held = &mut qp.repair_bytes_held;
    let Some(entry) = qp.rx_window[ahead].as_mut() else {
        return false;
    };
    let Some(id) = id else {
        dev.stats.rx_dropped_ops += 1;
        return false;
    };
    if entry.done {
        return true;
    }
    let state = entry
        .repair
        .get_or_insert_with(|| Box::new(RepairRx::new(id.count, shard_bytes)));
    if state.count != id.count || state.shard_bytes != shard_bytes {
        dev.stats.rx_dropped_ops += 1;
        return false;
    }
    let slot = &mut state.shards[usize::from(id.index)];
    if slot.is_some() {
        return true;
    }
    if *held + payload.len() as u64 > repair::MAX_REPAIR_BYTES_PER_QP {
        dev.stats.rx_over_limit += 1;
        return false;
    }
    *held += payload.len() as u64;
    *slot = Some(payload.into());
    state.received += 1;
    dev.stats.rx_repair_packets += 1;
    true
}

/// Rebuild a message's missing data packets from those placed and its
/// recovery shards, once there are enough (`repair.rs`); whether the
/// message is now whole. Repair packets are sent behind the message's data
/// packets (and drivers keep them behind: `Transmit::repair`), so when
/// enough are here the missing packets are most likely lost, not on their
/// way; if they were on their way, a decode was spent for nothing.
fn rebuild_lost(dev: &mut DeviceState, qp_index: usize, ahead: usize, repr: &DataRepr) -> bool {
    let DeviceState {
        qps,
        regions,
        stats,
        repair_codes,
        ..
    } = &mut *dev;
    let Some(qp) = qps.at_mut(qp_index) else {
        return false;
    };
    let Qp {
        rx_window,
        rq,
        rq_base,
        pd,
        remote_access,
        repair_bytes_held,
        ..
    } = qp;
    let Some(Some(entry)) = rx_window.get_mut(ahead) else {
        return false;
    };
    let Some(state) = entry.repair.as_deref() else {
        return false;
    };
    let len = entry.len;
    let missing = repair::missing(len, state.shard_bytes, |s, e| entry.ranges.contains(s, e));
    if missing.is_empty() || missing.len() > usize::from(state.received) {
        return false;
    }
    let rebuilt = match repr.op {
        OpHeader::Write {
            rkey, remote_addr, ..
        }
        | OpHeader::WriteImm {
            rkey, remote_addr, ..
        } => {
            let Ok(span) = regions.check(
                KeyKind::Remote,
                rkey,
                *pd,
                remote_addr,
                u64::from(len),
                AccessFlags::REMOTE_WRITE,
            ) else {
                return false;
            };
            if !remote_access.contains(AccessFlags::REMOTE_WRITE) {
                return false;
            }
            let placement = Placement::Span(span);
            repair::rebuild(repair_codes, regions, &placement, len, state, &missing)
        }
        OpHeader::Send { .. } | OpHeader::SendImm { .. } => {
            let slot = entry.recv_index.wrapping_sub(*rq_base) as usize;
            let Some(recv) = rq.get(slot).filter(|r| u64::from(len) <= r.capacity) else {
                return false;
            };
            let placement = Placement::Spans(&recv.spans);
            repair::rebuild(repair_codes, regions, &placement, len, state, &missing)
        }
        _ => false,
    };
    if !rebuilt {
        return false;
    }
    let shard = u64::from(state.shard_bytes);
    for i in &missing {
        let start = u64::from(*i) * shard;
        entry
            .ranges
            .insert(start, (start + shard).min(u64::from(len)));
    }
    stats.rx_repaired_packets += missing.len() as u64;
    if let Some(held) = entry.repair.take() {
        *repair_bytes_held -= held.held_bytes();
    }
    entry.ranges.covered() >= u64::from(len)
}

fn entry_of(qp: &mut Qp, ahead: usize) -> &mut RxMessage {
    qp.rx_window[ahead].as_mut().expect("created by the caller")
}

/// Move the responder's cumulative point over every finished message, in
/// order, releasing receive completions as it goes.
fn advance_msn(conn: &mut Connection, dev: &mut DeviceState, qp_index: usize) {
    let qp = dev.qps.at_mut(qp_index).expect("live QP");
    while let Some(Some(front)) = qp.rx_window.front() {
        if !front.done {
            break;
        }
        if qp.rx_fatal.is_some_and(|(_, m)| m == qp.rx_msn) {
            // The failed message reached the head: everything before it has
            // completed; now the responder QP goes to the error state.
            if front.consumes_recv && front.recv_status != WcStatus::Success {
                let status = front.recv_status;
                let opcode = recv_opcode(front.opcode);
                if let Some(recv) = qp.rq.pop_front() {
                    qp.rq_base = qp.rq_base.wrapping_add(1);
                    let wc = qp.completion(recv.wr_id, status, opcode, 0, None);
                    let solicited = front.solicited;
                    dev.completions
                        .push_back(Completion::recv(qp.handle, wc, solicited));
                }
            }
            conn.queue_op_ack(qp);
            super::requester::enter_error(conn, dev, qp_index);
            return;
        }
        if front.consumes_recv && (front.recv_index != qp.rq_base || qp.rq.is_empty()) {
            // Receives are consumed in order, one per message: a message
            // reaching the head must name the oldest posted receive. Only a
            // broken or hostile peer gets here (two messages naming one
            // receive); fail the QP rather than trust it.
            qp.rx_fatal = Some((Syndrome::RemInvReqErr, qp.rx_msn));
            dev.stats.rx_dropped_ops += 1;
            conn.queue_op_ack(qp);
            super::requester::enter_error(conn, dev, qp_index);
            return;
        }
        let msg = qp.rx_window.pop_front().flatten().expect("front checked");
        qp.rx_msn = qp.rx_msn.wrapping_add(1);
        if msg.consumes_recv {
            let recv = qp.rq.pop_front().expect("checked just above");
            qp.rq_base = qp.rq_base.wrapping_add(1);
            let wc = qp.completion(
                recv.wr_id,
                WcStatus::Success,
                recv_opcode(msg.opcode),
                msg.len,
                msg.imm,
            );
            dev.completions
                .push_back(Completion::recv(qp.handle, wc, msg.solicited));
        }
    }
    conn.queue_op_ack(qp);
}

fn recv_opcode(op: Opcode) -> WcOpcode {
    if op == Opcode::WriteImm {
        WcOpcode::RecvRdmaWithImm
    } else {
        WcOpcode::Recv
    }
}

#[cfg(test)]
mod tests {
    use crate::config::EndpointConfig;
    use crate::testing::fixture::{self, End, completions, lab, statuses};
    use crate::testing::{Fate, Side};
    use crate::transmit::PacketKind;
    use crate::work::{RecvWr, SendWr, WcStatus, WrOp};
    use metaroce_wire as wire;

    fn write(wr_id: u64, from: &End, to: &End, offset: u64, len: u32) -> SendWr {
        SendWr::new(
            wr_id,
            WrOp::Write {
                remote_addr: to.mr.addr + offset,
                rkey: to.mr.rkey,
            },
            vec![from.sge(offset, len)],
        )
    }

    #[test]
    fn a_packet_of_an_executed_message_repeats_the_op_ack() {
        let mut l = lab(fixture::config(1), fixture::config(2));
        let (a, b) = (l.a, l.b);
        l.pair.record(true);
        l.pair.a.post_send(a.qp, write(1, &a, &b, 0, 2048)).unwrap();
        assert!(l.pair.settle(1_000, 1_000));
        assert_eq!(statuses(&mut l.pair, Side::A), [(1, WcStatus::Success)]);
        let first = l.pair.sent(Side::A)[0].clone();
        let before = *l.pair.b.stats();
        let src = std::net::SocketAddr::new(crate::testing::Pair::A_IP, 4792);
        let now = l.pair.now();
        l.pair.b.handle_datagram(now, src, crate::Ecn::Ect0, &first);
        let after = *l.pair.b.stats();
        assert_eq!(after.rx_duplicates, before.rx_duplicates + 1);
        assert_eq!(after.rx_duplicate_ops, before.rx_duplicate_ops + 1);
        // Executed once: the bytes are the same and nothing completes again,
        // but the requester hears the op-ack again at once (in an ACK and,
        // a duplicate being a sign of lost ACKs, its copy).
        let acks = l.pair.poll_transmits(Side::B);
        assert_eq!(acks.len(), 2);
        for (t, bytes) in &acks {
            assert_eq!(t.kind, PacketKind::Ack);
            let Ok(wire::Packet::Ack(ack)) = wire::parse(bytes) else {
                panic!("an ACK");
            };
            let op_acks = ack.op_acks();
            assert_eq!((op_acks[0].qpn, op_acks[0].msn), (a.qp.qpn(), 1));
        }
        assert!(completions(&mut l.pair, Side::B).is_empty());
    }

    #[test]
    fn a_send_before_its_receive_is_refused_not_placed_then_lands() {
        let mut l = lab(fixture::config(1), fixture::config(2));
        let (a, b) = (l.a, l.b);
        l.pair.a.memory_mut(a.mr.handle).unwrap()[..4096].fill(3);
        let send = SendWr::new(1, WrOp::Send, vec![a.sge(0, 4096)]);
        l.pair.a.post_send(a.qp, send).unwrap();
        l.pair.run(50, 1_000);
        assert!(l.pair.b.stats().rnr_naks_sent > 0);
        let peer = l.pair.addr(Side::B);
        assert!(l.pair.a.connection_stats(peer).unwrap().rnr_naks > 0);
        assert!(
            statuses(&mut l.pair, Side::A).is_empty(),
            "waits, not fails"
        );
        assert!(
            l.pair.b.memory(b.mr.handle).unwrap()[..4096]
                .iter()
                .all(|&x| x == 0),
            "nothing placed without a receive"
        );
        let recv = RecvWr {
            wr_id: 5,
            sg_list: vec![b.sge(0, 4096)],
        };
        l.pair.b.post_recv(b.qp, recv).unwrap();
        assert!(l.pair.settle(1_000, 1_000));
        assert_eq!(statuses(&mut l.pair, Side::A), [(1, WcStatus::Success)]);
        assert_eq!(statuses(&mut l.pair, Side::B), [(5, WcStatus::Success)]);
        assert_eq!(l.pair.b.memory(b.mr.handle).unwrap()[..4096], [3; 4096]);
    }

    #[test]
    fn a_read_past_the_responders_limit_waits_and_is_executed_later() {
        let b_cfg = EndpointConfig {
            max_outstanding_ops_per_connection: 1,
            ..fixture::config(2)
        };
        let mut l = lab(fixture::config(1), b_cfg);
        let (a, b) = (l.a, l.b);
        l.pair.b.memory_mut(b.mr.handle).unwrap()[..8192].fill(9);
        for i in 0..2u64 {
            let read = SendWr::new(
                i,
                WrOp::Read {
                    remote_addr: b.mr.addr + i * 4096,
                    rkey: b.mr.rkey,
                },
                vec![a.sge(i * 4096, 4096)],
            );
            l.pair.a.post_send(a.qp, read).unwrap();
        }
        assert!(l.pair.settle(10_000, 1_000));
        assert!(l.pair.b.stats().rx_over_limit > 0, "the second READ waited");
        assert_eq!(
            statuses(&mut l.pair, Side::A),
            [(0, WcStatus::Success), (1, WcStatus::Success)]
        );
        assert_eq!(l.pair.a.memory(a.mr.handle).unwrap()[..8192], [9; 8192]);
    }

    #[test]
    fn requests_beyond_the_incoming_window_are_dropped_until_it_moves() {
        let b_cfg = EndpointConfig {
            max_incoming_ops_per_qp: 2,
            ..fixture::config(2)
        };
        // A starts at a full window (no cold start), so that all four go
        // out in the first round trip.
        let mut a_cfg = fixture::config(1);
        a_cfg.cc_params.initial_window_mss = 0;
        let mut l = lab(a_cfg, b_cfg);
        let (a, b) = (l.a, l.b);
        // Message 0's first transmission is lost, so messages 2 and 3
        // arrive two or more ahead of the responder's next one.
        l.pair.set_filter(Some(Box::new(|hop| {
            let first_try = hop.index < 16;
            match wire::parse(hop.bytes) {
                Ok(wire::Packet::Data { repr, .. }) if repr.msg_seq == 0 && first_try => Fate::Drop,
                _ => Fate::Deliver,
            }
        })));
        for i in 0..4u64 {
            let wr = write(i, &a, &b, i * 1024, 1024);
            l.pair.a.post_send(a.qp, wr).unwrap();
        }
        assert!(l.pair.settle(10_000, 1_000));
        assert!(l.pair.b.stats().rx_dropped_ops > 0);
        let all_ok: Vec<_> = (0..4).map(|i| (i, WcStatus::Success)).collect();
        assert_eq!(statuses(&mut l.pair, Side::A), all_ok);
    }
}
