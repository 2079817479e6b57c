//! The requester: how responses and op-acks complete the work requests of
//! a QP's send queue.
//!
//! WRITEs and SENDs complete on the responder's cumulative op-ack; READs and
//! atomics on their response data, placed into the local scatter list as it
//! arrives. Whatever order messages finish in, completions leave the send
//! queue in posting order; the first error completes its work request with
//! an error status, moves the QP to the error state and flushes everything
//! after it. An RNR NAK parks the message for the RNR timer and then sends
//! it whole again, up to `rnr_retry` times.
//!
//! The state is the QP's own (its send queue, in the QP table); of the
//! connection it needs only its messages (to free or park them) and the
//! progress clock that the retry timer measures from.

use super::{Connection, live_qp};
use crate::device_state::DeviceState;
use crate::memory::{Span, spans_from};
use crate::qp::{QpRunState, SqState};
use crate::work::{Completion, WcOpcode, WcStatus};
use metaroce_wire::{DataRepr, OpAck, OpHeader, Syndrome, seq};

/// Where the payload of READ response `repr` on connection `conn_index`
/// would be placed, if a driver may receive it there straight from its
/// socket (see `direct.rs`): the span of the READ's local buffer and the
/// offset in it. Only into bytes of an outstanding READ that have not
/// arrived, and only where the payload fits in one entry of the scatter
/// list; the READ completes only once checked responses cover them all.
pub(crate) fn direct_read_target(
    dev: &mut DeviceState,
    conn_index: u32,
    repr: &DataRepr,
) -> Option<(Span, u64)> {
    if repr.op != OpHeader::ReadResponse {
        return None;
    }
    let qp = dev.qps.for_packet(repr.dst_qpn, conn_index)?;
    if qp.state == QpRunState::Error {
        return None;
    }
    let entry = qp
        .sq_entry_mut(repr.msg_seq)
        .filter(|e| e.state == SqState::Active)?;
    if entry.opcode != WcOpcode::RdmaRead || repr.msg_len != entry.len {
        return None;
    }
    let off = u64::from(repr.offset);
    let len = u64::from(repr.payload_len);
    if entry.read_ranges.overlaps(off, off + len) {
        return None;
    }
    let (span, skip) = spans_from(&entry.sink, off).next()?;
    (span.len - skip >= len).then_some((*span, skip))
}

/// Place a READ or atomic response. Returns whether it completed its work
/// request (the peer should hear at once that the response arrived).
pub(super) fn on_response(
    conn: &mut Connection,
    dev: &mut DeviceState,
    now_ns: u64,
    repr: &DataRepr,
    payload: &[u8],
) -> bool {
    let conn_index = conn.index();
    let Some(qp) = dev.qp_for_packet(repr.dst_qpn, conn_index) else {
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
            // Empty when the driver received the payload in place
            // (`direct_read_target`); the header says how much came.
            dev.regions.scatter(&sink, off, payload);
            Some(u64::from(repr.payload_len))
        }
        OpHeader::AtomicResponse { original }
            if matches!(opcode, WcOpcode::FetchAdd | WcOpcode::CompSwap) =>
        {
            dev.regions.scatter(&sink, 0, &original.to_le_bytes());
            None
        }
        _ => {
            let entry = live_qp(dev, qp_index)
                .sq_entry_mut(repr.msg_seq)
                .expect("found above");
            entry.sink = sink;
            dev.stats.rx_dropped_ops += 1;
            return false;
        }
    };
    let entry = live_qp(dev, qp_index)
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
    conn.note_progress(now_ns);
    if complete {
        let entry = live_qp(dev, qp_index)
            .sq_entry_mut(repr.msg_seq)
            .expect("found above");
        entry.state = SqState::Done(WcStatus::Success);
        release_completions(conn, dev, qp_index);
    }
    complete
}

/// Apply an op-ack from the responder.
pub(super) fn on_op_ack(conn: &mut Connection, dev: &mut DeviceState, now_ns: u64, ack: &OpAck) {
    let conn_index = conn.index();
    let rnr_timer_ns = dev.config.min_rnr_timer_ns;
    let infinite_rnr = dev.config.rnr_retry == 7;
    let Some(qp) = dev.qp_for_packet(ack.qpn, conn_index) else {
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
                if !conn.rnr_waiting(msg_ref) {
                    conn.count_rnr_nak();
                    progressed = true;
                    if entry.rnr_retries_left == 0 {
                        entry.state = SqState::Done(WcStatus::RnrRetryExcErr);
                    } else {
                        if !infinite_rnr {
                            entry.rnr_retries_left -= 1;
                        }
                        let r = msg_ref.expect("checked above");
                        conn.start_rnr_backoff(r, now_ns + rnr_timer_ns);
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
        conn.note_progress(now_ns);
        release_completions(conn, dev, qp_index);
    }
}

/// Release finished send work requests from the head of the queue, in
/// posting order; the first error moves the QP to the error state.
pub(super) fn release_completions(conn: &mut Connection, dev: &mut DeviceState, qp_index: usize) {
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
            let byte_len = if status == WcStatus::Success {
                entry.len
            } else {
                0
            };
            let wc = qp.completion(entry.wr_id, status, entry.opcode, byte_len, None);
            dev.completions.push_back(Completion::send(qp.handle, wc));
        }
        if status != WcStatus::Success {
            crate::trace::trace_event!(
                in: conn.trace.enter(),
                INFO,
                qpn = qp.handle.qpn(),
                wr_id = entry.wr_id,
                opcode = ?entry.opcode,
                status = ?status,
                "work request failed: its QP goes to the error state"
            );
            enter_error(conn, dev, qp_index);
            return;
        }
    }
}

/// Move a QP to the error state: cancel its messages and flush both queues
/// with `WrFlushErr`, in order.
pub(super) fn enter_error(conn: &mut Connection, dev: &mut DeviceState, qp_index: usize) {
    conn.cancel_qp_messages(qp_index as u32);
    #[cfg(feature = "trace")]
    if let Some(qp) = dev.qps.at_mut(qp_index)
        && qp.state != QpRunState::Error
    {
        crate::trace::trace_event!(
            in: conn.trace.enter(),
            INFO,
            qpn = qp.handle.qpn(),
            remote_qpn = qp.remote_qpn,
            flushed_sends = qp.sq.len(),
            flushed_recvs = qp.rq.len(),
            "QP error: both queues flushed"
        );
    }
    dev.flush_qp(qp_index);
}

/// The peer is unreachable: the oldest outstanding request of every QP on
/// the connection fails with `status`, and each QP goes to the error state.
pub(super) fn fail_connection(conn: &mut Connection, dev: &mut DeviceState, status: WcStatus) {
    for qp_index in conn.bound_qps().to_vec() {
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

#[cfg(test)]
mod tests {
    use crate::config::EndpointConfig;
    use crate::qp::QpRunState;
    use crate::testing::Side;
    use crate::testing::fixture::{self, completions, lab, statuses};
    use crate::work::{SendWr, WcStatus, WrOp};

    #[test]
    fn rnr_retries_run_out_in_rnr_retry_exc_err() {
        let a_cfg = EndpointConfig {
            rnr_retry: 2,
            ..fixture::config(1)
        };
        let mut l = lab(a_cfg, fixture::config(2));
        let a = l.a;
        let send = SendWr::new(1, WrOp::Send, vec![a.sge(0, 64)]);
        l.pair.a.post_send(a.qp, send).unwrap();
        assert!(l.pair.settle(1_000, 1_000));
        let wcs = completions(&mut l.pair, Side::A);
        assert_eq!(wcs.len(), 1);
        assert_eq!(wcs[0].wc.status, WcStatus::RnrRetryExcErr);
        let peer = l.pair.addr(Side::B);
        assert_eq!(l.pair.a.connection_stats(peer).unwrap().rnr_naks, 3);
        assert_eq!(l.pair.a.qp_state(a.qp), Some(QpRunState::Error));
    }

    #[test]
    fn a_remote_access_error_fails_its_request_and_flushes_the_later_ones() {
        let mut l = lab(fixture::config(1), fixture::config(2));
        let (a, b) = (l.a, l.b);
        let write = |wr_id, rkey| {
            SendWr::new(
                wr_id,
                WrOp::Write {
                    remote_addr: b.mr.addr,
                    rkey,
                },
                vec![a.sge(0, 64)],
            )
        };
        l.pair.a.post_send(a.qp, write(1, b.mr.rkey)).unwrap();
        l.pair.a.post_send(a.qp, write(2, b.mr.rkey ^ 1)).unwrap();
        l.pair.a.post_send(a.qp, write(3, b.mr.rkey)).unwrap();
        assert!(l.pair.settle(1_000, 1_000));
        let wcs = statuses(&mut l.pair, Side::A);
        assert_eq!(
            wcs,
            [
                (1, WcStatus::Success),
                (2, WcStatus::RemAccessErr),
                (3, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(l.pair.b.stats().rx_remote_access_denied, 1);
    }
}
