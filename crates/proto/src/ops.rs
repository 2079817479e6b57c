//! Operation semantics: what a data packet or an op-ack does to a QP.
//!
//! This is where the *operation identity* `(qpn, msg_seq, offset)` is used;
//! the path sequence numbers have been dealt with by the connection before a
//! packet gets here. Rules (ibverbs RC semantics over an unordered fabric):
//! - every packet is placed directly where it names (rkey + address, or the
//!   receive it matches + offset), in any order;
//! - each request message executes exactly once: the responder's window of
//!   `msg_seq`s drops anything already executed, and per message a range set
//!   counts each byte once;
//! - completions leave each queue in posting order;
//! - the first error completes its work request with an error status, moves
//!   the QP to the error state and flushes everything after it.

use crate::connection::Connection;
use crate::device_state::DeviceState;
use crate::memory::{AccessFlags, AtomicOp, KeyKind, MemoryError};
use crate::message::{MsgKind, Source, TxMessage};
use crate::qp::{Qp, QpRunState, RxMessage, SqState};
use crate::range_set::RangeSet;
use crate::work::{Completion, WcOpcode, WcStatus, WorkCompletion, WorkQueue};
use metaroce_wire::{DataRepr, Flags, OpAck, OpHeader, Opcode, Syndrome, seq};

/// Most disjoint byte ranges an incoming message may have (holes between
/// arrived segments). A sender has at most 255 packets in flight per path
/// and 256 paths, so a legitimate message never comes near this.
const MAX_RANGES_PER_MESSAGE: usize = 1 << 16;

/// The QP a packet for local `qpn` on connection `conn` belongs to; a miss
/// (not ours, or not bound to that peer) is counted and the packet dropped.
fn qp_for(dev: &mut DeviceState, qpn: u32, conn: u32) -> Option<&mut Qp> {
    let qp = dev.qps.for_packet(qpn, conn);
    if qp.is_none() {
        dev.stats.rx_unknown_qp += 1;
    }
    qp
}

fn mark_dirty(conn: &mut Connection, qp: &mut Qp) {
    if !qp.op_ack_dirty {
        qp.op_ack_dirty = true;
        conn.dirty_qps.push_back(qp.handle.index() as u32);
    }
}

/// Handle the operation carried by a data packet. Returns whether something
/// happened that the peer should hear about at once (a message finished, a
/// NAK, a response completed).
pub(crate) fn on_data(
    conn: &mut Connection,
    dev: &mut DeviceState,
    now_ns: u64,
    repr: &DataRepr,
    payload: &[u8],
) -> bool {
    match repr.op {
        OpHeader::ReadResponse | OpHeader::AtomicResponse { .. } => {
            on_response(conn, dev, now_ns, repr, payload)
        }
        _ => on_request(conn, dev, now_ns, repr, payload),
    }
}

// ------------------------------------------------------------------ responder

fn on_request(
    conn: &mut Connection,
    dev: &mut DeviceState,
    now_ns: u64,
    repr: &DataRepr,
    payload: &[u8],
) -> bool {
    let conn_index = conn.index;
    let window = dev.config.max_incoming_ops_per_qp;
    let op_limit = dev.config.max_outstanding_ops_per_connection;
    let Some(qp) = qp_for(dev, repr.dst_qpn, conn_index) else {
        return false;
    };
    let qp_index = qp.handle.index();
    if qp.state == QpRunState::Error {
        // Keep repeating the NAK that put us here.
        mark_dirty(conn, qp);
        return true;
    }
    let ahead = repr.msg_seq.wrapping_sub(qp.rx_msn);
    if (ahead as i32) < 0 {
        // Executed long ago: a duplicate or a probe. Repeat the op-ack.
        mark_dirty(conn, qp);
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
        mark_dirty(conn, qp);
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
    if makes_response && conn.msgs.live() as u32 >= op_limit {
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
            mark_dirty(conn, qp);
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
    match repr.op {
        OpHeader::Write { rkey, remote_addr }
        | OpHeader::WriteImm {
            rkey, remote_addr, ..
        } => {
            match remote_check(dev, rkey, remote_addr, msg_len, AccessFlags::REMOTE_WRITE) {
                Ok(span) => {
                    dev.regions.write(span, u64::from(repr.offset), payload);
                    arrived_bytes = Some(payload.len());
                }
                Err(_) => fatal = Some(Syndrome::RemAccessErr),
            }
            if let OpHeader::WriteImm { imm, .. } = repr.op {
                entry_of(qp_mut(dev, qp_index), ahead).imm = Some(imm);
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
                    let qp = qp_mut(dev, qp_index);
                    response = Some(TxMessage::new(
                        MsgKind::Response,
                        qp_index as u32,
                        qp.remote_qpn,
                        repr.msg_seq,
                        OpHeader::ReadResponse,
                        repr.msg_len,
                        repr.msg_len,
                        false,
                        Source::Spans(vec![span]),
                        dev.config.mtu_payload_bytes,
                    ));
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
                        let qp = qp_mut(dev, qp_index);
                        response = Some(TxMessage::new(
                            MsgKind::Response,
                            qp_index as u32,
                            qp.remote_qpn,
                            repr.msg_seq,
                            OpHeader::AtomicResponse { original },
                            8,
                            0,
                            false,
                            Source::Empty,
                            dev.config.mtu_payload_bytes,
                        ));
                    }
                    Err(_) => fatal = Some(Syndrome::RemAccessErr),
                }
            }
        }
        OpHeader::ReadResponse | OpHeader::AtomicResponse { .. } => {
            unreachable!("routed to on_response")
        }
    }

    let qp = qp_mut(dev, qp_index);
    let entry = entry_of(qp, ahead);
    let done = if fatal.is_some() || response.is_some() {
        true
    } else if let Some(n) = arrived_bytes {
        let off = u64::from(repr.offset);
        entry.ranges.insert(off, off + n as u64);
        entry.ranges.covered() >= msg_len
    } else {
        false
    };
    if !done {
        if repr.base.flags.contains(Flags::COMPLETION_PROBE) {
            // The requester thinks the whole message arrived; we lack part
            // of it (payload dropped earlier for want of a receive). Have
            // it resend the whole message.
            qp.rx_rnr = Some(repr.msg_seq);
            mark_dirty(conn, qp);
            return true;
        }
        return false;
    }
    entry.done = true;
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

fn qp_mut(dev: &mut DeviceState, index: usize) -> &mut Qp {
    dev.qps.at_mut(index).expect("QP looked up by the caller")
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
                    let wc = recv_wc(qp, recv.wr_id, status, opcode, 0, None);
                    dev.completions.push_back(Completion {
                        qp: qp.handle,
                        queue: WorkQueue::Recv,
                        wc,
                    });
                }
            }
            mark_dirty(conn, qp);
            enter_error(conn, dev, qp_index);
            return;
        }
        if front.consumes_recv && (front.recv_index != qp.rq_base || qp.rq.is_empty()) {
            // Receives are consumed in order, one per message: a message
            // reaching the head must name the oldest posted receive. Only a
            // broken or hostile peer gets here (two messages naming one
            // receive); fail the QP rather than trust it.
            qp.rx_fatal = Some((Syndrome::RemInvReqErr, qp.rx_msn));
            dev.stats.rx_dropped_ops += 1;
            mark_dirty(conn, qp);
            enter_error(conn, dev, qp_index);
            return;
        }
        let msg = qp.rx_window.pop_front().flatten().expect("front checked");
        qp.rx_msn = qp.rx_msn.wrapping_add(1);
        if msg.consumes_recv {
            let recv = qp.rq.pop_front().expect("checked just above");
            qp.rq_base = qp.rq_base.wrapping_add(1);
            let wc = recv_wc(
                qp,
                recv.wr_id,
                WcStatus::Success,
                recv_opcode(msg.opcode),
                msg.len,
                msg.imm,
            );
            dev.completions.push_back(Completion {
                qp: qp.handle,
                queue: WorkQueue::Recv,
                wc,
            });
        }
    }
    mark_dirty(conn, qp);
}

fn recv_opcode(op: Opcode) -> WcOpcode {
    if op == Opcode::WriteImm {
        WcOpcode::RecvRdmaWithImm
    } else {
        WcOpcode::Recv
    }
}

fn recv_wc(
    qp: &Qp,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len,
        imm_data: imm,
        qp_num: qp.handle.qpn(),
        src_qp: qp.remote_qpn,
    }
}

// ------------------------------------------------------------------ requester

fn on_response(
    conn: &mut Connection,
    dev: &mut DeviceState,
    now_ns: u64,
    repr: &DataRepr,
    payload: &[u8],
) -> bool {
    let conn_index = conn.index;
    let Some(qp) = qp_for(dev, repr.dst_qpn, conn_index) else {
        return false;
    };
    let qp_index = qp.handle.index();
    if qp.state == QpRunState::Error {
        return false;
    }
    let Some(entry) = qp
        .sq_entry_mut(repr.msg_seq)
        .filter(|e| e.state == SqState::Active)
    else {
        // Already complete: a duplicate of a response.
        dev.stats.rx_duplicate_ops += 1;
        return false;
    };
    let (opcode, len) = (entry.opcode, entry.len);
    let sink = std::mem::take(&mut entry.sink);
    let off = u64::from(repr.offset);
    let placed = match repr.op {
        OpHeader::ReadResponse if opcode == WcOpcode::RdmaRead && repr.msg_len == len => {
            dev.regions.scatter(&sink, off, payload);
            Some(payload.len() as u64)
        }
        OpHeader::AtomicResponse { original }
            if matches!(opcode, WcOpcode::FetchAdd | WcOpcode::CompSwap) =>
        {
            dev.regions.scatter(&sink, 0, &original.to_le_bytes());
            None
        }
        _ => {
            let entry = qp_mut(dev, qp_index)
                .sq_entry_mut(repr.msg_seq)
                .expect("found above");
            entry.sink = sink;
            dev.stats.rx_dropped_ops += 1;
            return false;
        }
    };
    let entry = qp_mut(dev, qp_index)
        .sq_entry_mut(repr.msg_seq)
        .expect("found above");
    entry.sink = sink;
    let complete = match placed {
        Some(n) => {
            entry.read_ranges.insert(off, off + n);
            len == 0 || entry.read_ranges.covered() >= u64::from(len)
        }
        None => true,
    };
    conn.last_progress_ns = now_ns;
    conn.timeouts = 0;
    if complete {
        let entry = qp_mut(dev, qp_index)
            .sq_entry_mut(repr.msg_seq)
            .expect("found above");
        entry.state = SqState::Done(WcStatus::Success);
        release_completions(conn, dev, qp_index);
    }
    complete
}

/// Apply an op-ack from the responder.
pub(crate) fn on_op_ack(conn: &mut Connection, dev: &mut DeviceState, now_ns: u64, ack: &OpAck) {
    let conn_index = conn.index;
    let rnr_timer_ns = dev.config.min_rnr_timer_ns;
    let infinite_rnr = dev.config.rnr_retry == 7;
    let Some(qp) = qp_for(dev, ack.qpn, conn_index) else {
        return;
    };
    let qp_index = qp.handle.index();
    if qp.state != QpRunState::Connected {
        return;
    }
    let mut progressed = false;
    // Cumulative: every request before `msn` executed successfully. WRITEs
    // and SENDs complete on this; READs and atomics wait for their data.
    for entry in qp.sq.iter_mut() {
        if !seq::seq_lt(entry.msg_seq, ack.msn) {
            break;
        }
        if entry.state == SqState::Active
            && matches!(entry.opcode, WcOpcode::RdmaWrite | WcOpcode::Send)
        {
            entry.state = SqState::Done(WcStatus::Success);
            progressed = true;
        }
    }
    match ack.syndrome {
        Syndrome::Ack => {}
        Syndrome::RnrNak => {
            if let Some(entry) = qp
                .sq_entry_mut(ack.nak_msg_seq)
                .filter(|e| e.state == SqState::Active)
            {
                let msg_ref = entry.msg;
                let waiting = msg_ref
                    .and_then(|r| conn.msgs.get(r))
                    .is_none_or(|m| m.rnr_wait);
                if !waiting {
                    conn.stats.rnr_naks += 1;
                    progressed = true;
                    if entry.rnr_retries_left == 0 {
                        entry.state = SqState::Done(WcStatus::RnrRetryExcErr);
                    } else {
                        if !infinite_rnr {
                            entry.rnr_retries_left -= 1;
                        }
                        let r = msg_ref.expect("checked above");
                        conn.msgs.get_mut(r).expect("checked above").rnr_wait = true;
                        conn.rnr_timers.push((now_ns + rnr_timer_ns, r));
                    }
                }
            }
        }
        fatal => {
            let status = match fatal {
                Syndrome::RemAccessErr => WcStatus::RemAccessErr,
                Syndrome::RemInvReqErr => WcStatus::RemInvReqErr,
                _ => WcStatus::RemOpErr,
            };
            if let Some(entry) = qp
                .sq_entry_mut(ack.nak_msg_seq)
                .filter(|e| e.state == SqState::Active)
            {
                entry.state = SqState::Done(status);
                progressed = true;
                // Nothing after a failed request may execute: stop sending
                // the later ones (they will be flushed).
                let failed = ack.nak_msg_seq;
                for later in qp.sq.iter_mut().filter(|e| seq::seq_lt(failed, e.msg_seq)) {
                    if let Some(r) = later.msg.take() {
                        conn.free_msg(r);
                    }
                    later.state = SqState::Done(WcStatus::WrFlushErr);
                }
            }
        }
    }
    if progressed {
        conn.last_progress_ns = now_ns;
        conn.timeouts = 0;
        release_completions(conn, dev, qp_index);
    }
}

/// Release finished send work requests from the head of the queue, in
/// posting order; the first error moves the QP to the error state.
pub(crate) fn release_completions(conn: &mut Connection, dev: &mut DeviceState, qp_index: usize) {
    let qp = dev.qps.at_mut(qp_index).expect("live QP");
    while let Some(front) = qp.sq.front() {
        let SqState::Done(status) = front.state else {
            break;
        };
        let entry = qp.sq.pop_front().expect("front exists");
        if let Some(r) = entry.msg {
            conn.free_msg(r);
        }
        if entry.signaled || status != WcStatus::Success {
            let wc = WorkCompletion {
                wr_id: entry.wr_id,
                status,
                opcode: entry.opcode,
                byte_len: if status == WcStatus::Success {
                    entry.len
                } else {
                    0
                },
                imm_data: None,
                qp_num: qp.handle.qpn(),
                src_qp: qp.remote_qpn,
            };
            dev.completions.push_back(Completion {
                qp: qp.handle,
                queue: WorkQueue::Send,
                wc,
            });
        }
        if status != WcStatus::Success {
            enter_error(conn, dev, qp_index);
            return;
        }
    }
}

/// Move a QP to the error state: cancel its messages and flush both queues
/// with `WrFlushErr`, in order.
pub(crate) fn enter_error(conn: &mut Connection, dev: &mut DeviceState, qp_index: usize) {
    conn.cancel_qp_messages(qp_index as u32);
    dev.flush_qp(qp_index);
}

/// The peer is unreachable: the oldest outstanding request of every QP on
/// the connection fails with `status`, and each QP goes to the error state.
pub(crate) fn fail_connection(conn: &mut Connection, dev: &mut DeviceState, status: WcStatus) {
    for qp_index in conn.qps.clone() {
        let Some(qp) = dev.qps.at_mut(qp_index as usize) else {
            continue;
        };
        if qp.state == QpRunState::Error {
            continue;
        }
        let Some(first_active) = qp.sq.iter_mut().find(|e| e.state == SqState::Active) else {
            continue;
        };
        first_active.state = SqState::Done(status);
        for later in qp.sq.iter_mut().filter(|e| e.state == SqState::Active) {
            later.state = SqState::Done(WcStatus::WrFlushErr);
        }
        release_completions(conn, dev, qp_index as usize);
    }
    conn.drop_all_messages();
}
