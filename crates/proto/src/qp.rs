//! Queue pairs as the core sees them: one ordered stream of operations in
//! each direction over a connection.
//!
//! The requester side keeps the send queue in posting order: each entry is a
//! message with a `msg_seq`, and completions are released strictly in that
//! order whatever order the messages finished in. The responder side keeps a
//! window of incoming messages indexed by `msg_seq`; it executes each one
//! exactly once, and its cumulative `msn` (every request before it executed)
//! goes back in ACKs.

use crate::memory::{AccessFlags, Span};
use crate::message::MsgRef;
use crate::range_set::RangeSet;
use crate::work::{Completion, WcOpcode, WcStatus, WorkCompletion};
use metaroce_wire::Syndrome;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Handle of a QP: its number. The low 16 bits index the QP table, the high
/// bits are a generation, so a stale number never reaches a reused slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QpHandle(pub u32);

impl QpHandle {
    pub(crate) fn index(self) -> usize {
        (self.0 & 0xffff) as usize
    }

    /// The QP number, as a peer names it in packets.
    pub fn qpn(self) -> u32 {
        self.0
    }
}

/// Limits of one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Posted receive work requests.
    pub max_recv_wr: u32,
}

/// Run state of a QP in the core (the verbs layer keeps the full ibverbs
/// state machine on top).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpRunState {
    /// Created, not bound to a peer yet.
    Unconnected,
    /// Bound to a connection: may send and receive.
    Connected,
    /// Failed or moved to error: everything posted completes with `WrFlushErr`.
    Error,
}

/// Progress of one send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SqState {
    /// Its message is being sent or awaits the responder.
    Active,
    /// Finished with this status; waits for earlier requests to complete.
    Done(WcStatus),
}

/// One posted send work request.
#[derive(Debug)]
pub(crate) struct SqEntry {
    pub(crate) wr_id: u64,
    pub(crate) msg_seq: u32,
    pub(crate) opcode: WcOpcode,
    pub(crate) len: u32,
    pub(crate) signaled: bool,
    pub(crate) state: SqState,
    pub(crate) msg: Option<MsgRef>,
    /// READ / atomic results land here.
    pub(crate) sink: Vec<Span>,
    /// READ response bytes received.
    pub(crate) read_ranges: RangeSet,
    pub(crate) rnr_retries_left: u8,
}

/// One posted receive.
#[derive(Debug)]
pub(crate) struct RqEntry {
    pub(crate) wr_id: u64,
    pub(crate) spans: Vec<Span>,
    pub(crate) capacity: u64,
}

/// An incoming message being assembled at the responder.
#[derive(Debug)]
pub(crate) struct RxMessage {
    pub(crate) opcode: metaroce_wire::Opcode,
    pub(crate) len: u32,
    pub(crate) ranges: RangeSet,
    pub(crate) imm: Option<u32>,
    pub(crate) consumes_recv: bool,
    /// The receive it names (SEND, WRITE_WITH_IMM).
    pub(crate) recv_index: u32,
    pub(crate) done: bool,
    /// The receive completion's status, if it consumed a receive.
    pub(crate) recv_status: WcStatus,
    /// The sender asked for a solicited event when it completes.
    pub(crate) solicited: bool,
    /// Repair packets of the message, until it completes.
    pub(crate) repair: Option<Box<crate::repair::RepairRx>>,
}

/// A QP's state in the core.
#[derive(Debug)]
pub(crate) struct Qp {
    pub(crate) handle: QpHandle,
    pub(crate) pd: u32,
    pub(crate) caps: QpCaps,
    /// Remote operations this QP accepts (ibverbs `qp_access_flags`).
    pub(crate) remote_access: AccessFlags,
    pub(crate) state: QpRunState,
    pub(crate) conn: Option<u32>,
    pub(crate) remote_qpn: u32,
    /// Payload bytes per packet of the messages this QP sends, requests
    /// and READ responses alike (ibverbs' `path_mtu`); `None`: the
    /// device's MTU.
    pub(crate) path_mtu: Option<u32>,
    // requester
    pub(crate) sq: VecDeque<SqEntry>,
    pub(crate) next_msg_seq: u32,
    pub(crate) next_recv_index: u32,
    // responder
    pub(crate) rq: VecDeque<RqEntry>,
    /// recv_index of `rq[0]`.
    pub(crate) rq_base: u32,
    pub(crate) rx_msn: u32,
    /// Messages `rx_msn ..`, by `msg_seq - rx_msn`.
    pub(crate) rx_window: VecDeque<Option<RxMessage>>,
    /// Recovery shard bytes held in `rx_window` (at most
    /// `repair::MAX_REPAIR_BYTES_PER_QP`).
    pub(crate) repair_bytes_held: u64,
    /// A fatal NAK this responder sent (sticky: repeated on every duplicate).
    pub(crate) rx_fatal: Option<(Syndrome, u32)>,
    /// An RNR NAK to report once.
    pub(crate) rx_rnr: Option<u32>,
    /// Queued for the next ACK's op-ack list.
    pub(crate) op_ack_dirty: bool,
}

impl Qp {
    pub(crate) fn new(handle: QpHandle, pd: u32, caps: QpCaps, remote_access: AccessFlags) -> Self {
        Self {
            handle,
            pd,
            caps,
            remote_access,
            state: QpRunState::Unconnected,
            conn: None,
            remote_qpn: 0,
            path_mtu: None,
            sq: VecDeque::new(),
            next_msg_seq: 0,
            next_recv_index: 0,
            rq: VecDeque::new(),
            rq_base: 0,
            rx_msn: 0,
            rx_window: VecDeque::new(),
            repair_bytes_held: 0,
            rx_fatal: None,
            rx_rnr: None,
            op_ack_dirty: false,
        }
    }

    /// Payload bytes per packet of the messages this QP sends: its path
    /// MTU, or the device's (`device_mtu`) where none was set.
    pub(crate) fn mtu(&self, device_mtu: u32) -> u32 {
        self.path_mtu.unwrap_or(device_mtu)
    }

    /// The send queue entry of `msg_seq`, if still outstanding.
    pub(crate) fn sq_entry_mut(&mut self, msg_seq: u32) -> Option<&mut SqEntry> {
        let front = self.sq.front()?.msg_seq;
        let idx = msg_seq.wrapping_sub(front) as usize;
        self.sq.get_mut(idx).filter(|e| e.msg_seq == msg_seq)
    }

    /// A completion of this QP's (for a receive: its source is the peer QP).
    pub(crate) fn completion(
        &self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm_data: Option<u32>,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm_data,
            qp_num: self.handle.qpn(),
            src_qp: self.remote_qpn,
        }
    }

    /// Enter the error state and flush both queues with `WrFlushErr`, in
    /// order: the send queue first, then the receives.
    pub(crate) fn flush(&mut self, completions: &mut VecDeque<Completion>) {
        self.state = QpRunState::Error;
        while let Some(entry) = self.sq.pop_front() {
            let wc = self.completion(entry.wr_id, WcStatus::WrFlushErr, entry.opcode, 0, None);
            completions.push_back(Completion::send(self.handle, wc));
        }
        while let Some(recv) = self.rq.pop_front() {
            self.rq_base = self.rq_base.wrapping_add(1);
            let wc = self.completion(recv.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0, None);
            completions.push_back(Completion::recv(self.handle, wc, false));
        }
    }

    /// The op-ack this responder reports for the QP.
    pub(crate) fn op_ack(&self) -> metaroce_wire::OpAck {
        let (syndrome, nak_msg_seq) = match (self.rx_fatal, self.rx_rnr) {
            (Some(f), _) => f,
            (None, Some(msg)) => (Syndrome::RnrNak, msg),
            (None, None) => (Syndrome::Ack, 0),
        };
        metaroce_wire::OpAck {
            qpn: self.remote_qpn,
            msn: self.rx_msn,
            syndrome,
            nak_msg_seq,
        }
    }
}

/// Every QP of an endpoint, by the index in the low 16 bits of its number.
#[derive(Debug, Default)]
pub(crate) struct QpTable {
    slots: Vec<Option<Qp>>,
    /// Generation of each slot's current (or last) QP: the high bits of its
    /// number, so a number that outlives its QP misses the slot's next one.
    generations: Vec<u16>,
    /// Indices of the empty slots, lowest first: creating a QP takes the
    /// lowest in O(log n) instead of scanning (a simulated host of a
    /// 1024-rank all-to-all creates two thousand QPs).
    free: BinaryHeap<Reverse<u32>>,
}

impl QpTable {
    /// A new QP in the first free slot, or a new slot while fewer than
    /// `limit` exist; `None` when the table is full.
    pub(crate) fn create(
        &mut self,
        limit: u32,
        pd: u32,
        caps: QpCaps,
        remote_access: AccessFlags,
    ) -> Option<QpHandle> {
        let index = match self.free.pop() {
            Some(Reverse(i)) => i as usize,
            None if self.slots.len() < limit as usize => {
                crate::grow::push(&mut self.slots, None);
                self.generations.push(0);
                self.slots.len() - 1
            }
            None => return None,
        };
        // QPN 0 is never handed out: the generation starts at 1.
        let generation = &mut self.generations[index];
        *generation = generation.wrapping_add(1).max(1);
        let handle = QpHandle((u32::from(*generation) << 16) | index as u32);
        self.slots[index] = Some(Qp::new(handle, pd, caps, remote_access));
        Some(handle)
    }

    /// The QP `handle` names, if it still exists.
    pub(crate) fn get(&self, handle: QpHandle) -> Option<&Qp> {
        self.slots
            .get(handle.index())?
            .as_ref()
            .filter(|q| q.handle == handle)
    }

    /// The QP `handle` names, writable.
    pub(crate) fn get_mut(&mut self, handle: QpHandle) -> Option<&mut Qp> {
        self.slots
            .get_mut(handle.index())?
            .as_mut()
            .filter(|q| q.handle == handle)
    }

    /// The QP in slot `index` (connections list their QPs by slot).
    pub(crate) fn at_mut(&mut self, index: usize) -> Option<&mut Qp> {
        self.slots.get_mut(index)?.as_mut()
    }

    /// The QP a packet naming local `qpn` on connection `conn` is for: it
    /// must exist under exactly that number and be bound to that peer.
    pub(crate) fn for_packet(&mut self, qpn: u32, conn: u32) -> Option<&mut Qp> {
        self.slots
            .get_mut((qpn & 0xffff) as usize)?
            .as_mut()
            .filter(|qp| qp.handle.qpn() == qpn && qp.conn == Some(conn))
    }

    /// Whether any QP lives in protection domain `pd`.
    pub(crate) fn any_in_domain(&self, pd: u32) -> bool {
        self.slots.iter().flatten().any(|q| q.pd == pd)
    }

    /// Free the QP's slot (the caller checked `handle` is live).
    pub(crate) fn remove(&mut self, handle: QpHandle) {
        let index = handle.index();
        if self.slots[index].take().is_some() {
            self.free.push(Reverse(index as u32));
        }
    }
}
