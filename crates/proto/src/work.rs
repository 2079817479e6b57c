//! Work requests and work completions, in ibverbs vocabulary.

use crate::qp::QpHandle;
use metaroce_wire::OpHeader;

/// A scatter/gather element: `length` bytes at `addr` in the region of `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Start address (in the region's IOVA range).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u64,
}

/// What a send work request does (ibverbs `ibv_wr_opcode` with its operands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOp {
    /// RDMA WRITE of the local data to `remote_addr` under `rkey`.
    Write { remote_addr: u64, rkey: u64 },
    /// RDMA WRITE that also consumes a receive at the target and delivers `imm`.
    WriteImm {
        remote_addr: u64,
        rkey: u64,
        imm: u32,
    },
    /// SEND into the peer's next posted receive.
    Send,
    /// SEND with an immediate value.
    SendImm { imm: u32 },
    /// RDMA READ of `remote_addr` under `rkey` into the local scatter list.
    Read { remote_addr: u64, rkey: u64 },
    /// 64-bit fetch-and-add; the original value lands in the local 8-byte SGE.
    FetchAdd {
        remote_addr: u64,
        rkey: u64,
        add: u64,
    },
    /// 64-bit compare-and-swap; the original value lands in the local 8-byte SGE.
    CmpSwap {
        remote_addr: u64,
        rkey: u64,
        compare: u64,
        swap: u64,
    },
}

impl WrOp {
    /// The completion opcode a requester sees for this operation.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            Self::Write { .. } | Self::WriteImm { .. } => WcOpcode::RdmaWrite,
            Self::Send | Self::SendImm { .. } => WcOpcode::Send,
            Self::Read { .. } => WcOpcode::RdmaRead,
            Self::FetchAdd { .. } => WcOpcode::FetchAdd,
            Self::CmpSwap { .. } => WcOpcode::CompSwap,
        }
    }

    /// Whether the operation consumes a posted receive at the target.
    pub fn consumes_receive(&self) -> bool {
        matches!(
            self,
            Self::WriteImm { .. } | Self::Send | Self::SendImm { .. }
        )
    }

    /// Whether the operation is an atomic.
    pub fn is_atomic(&self) -> bool {
        matches!(self, Self::FetchAdd { .. } | Self::CmpSwap { .. })
    }

    /// Whether the operation brings data back into the local buffers (READ
    /// data, an atomic's original value), which must then be writable.
    pub fn writes_locally(&self) -> bool {
        matches!(self, Self::Read { .. }) || self.is_atomic()
    }

    /// The request this operation sends for `len` bytes of local data: its
    /// op header, the `msg_len` every packet names and the payload it
    /// carries. A receive-consuming operation names the next receive of
    /// the target QP, taken from `next_recv_index`.
    pub(crate) fn wire_request(&self, len: u32, next_recv_index: &mut u32) -> WireRequest {
        let mut take_recv_index = || {
            let r = *next_recv_index;
            *next_recv_index = r.wrapping_add(1);
            r
        };
        let carries = |op| WireRequest {
            op,
            msg_len: len,
            payload_len: len,
        };
        match *self {
            Self::Write { remote_addr, rkey } => carries(OpHeader::Write { rkey, remote_addr }),
            Self::WriteImm {
                remote_addr,
                rkey,
                imm,
            } => carries(OpHeader::WriteImm {
                rkey,
                remote_addr,
                recv_index: take_recv_index(),
                imm,
            }),
            Self::Send => carries(OpHeader::Send {
                recv_index: take_recv_index(),
            }),
            Self::SendImm { imm } => carries(OpHeader::SendImm {
                recv_index: take_recv_index(),
                imm,
            }),
            // A READ request names the bytes to read and carries none.
            Self::Read { remote_addr, rkey } => WireRequest {
                op: OpHeader::ReadRequest { rkey, remote_addr },
                msg_len: len,
                payload_len: 0,
            },
            // Atomics name the 8-byte word; their operands are in the header.
            Self::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => WireRequest {
                op: OpHeader::FetchAdd {
                    rkey,
                    remote_addr,
                    add,
                },
                msg_len: 8,
                payload_len: 0,
            },
            Self::CmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => WireRequest {
                op: OpHeader::CmpSwap {
                    rkey,
                    remote_addr,
                    compare,
                    swap,
                },
                msg_len: 8,
                payload_len: 0,
            },
        }
    }
}

/// What a work request is on the wire: its op header, the message length
/// every packet names, and the payload bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WireRequest {
    pub(crate) op: OpHeader,
    /// `msg_len`: bytes written, sent or read; 8 for an atomic's word.
    pub(crate) msg_len: u32,
    /// Payload bytes: the data of a WRITE or SEND, 0 for READ requests and
    /// atomics.
    pub(crate) payload_len: u32,
}

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// Local data (source for WRITE/SEND, destination for READ/atomics).
    pub sg_list: Vec<Sge>,
    /// Inline data: copied at post time, no local key needed (WRITE/SEND only).
    pub inline_data: Option<Vec<u8>>,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Ask the target to raise a solicited event.
    pub solicited: bool,
}

impl SendWr {
    /// A signaled request with a scatter/gather list.
    pub fn new(wr_id: u64, op: WrOp, sg_list: Vec<Sge>) -> Self {
        Self {
            wr_id,
            op,
            sg_list,
            inline_data: None,
            signaled: true,
            solicited: false,
        }
    }

    /// A signaled request whose payload is copied at post time.
    pub fn inline(wr_id: u64, op: WrOp, data: Vec<u8>) -> Self {
        Self {
            wr_id,
            op,
            sg_list: Vec::new(),
            inline_data: Some(data),
            signaled: true,
            solicited: false,
        }
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// Where an incoming SEND's bytes go.
    pub sg_list: Vec<Sge>,
}

/// Completion status (`ibv_wc_status`), same names and order as ibverbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// The operation succeeded.
    Success = 0,
    /// A receive buffer was too small for the incoming SEND.
    LocLenErr = 1,
    /// An internal QP consistency error (e.g. a malformed work request).
    LocQpOpErr = 2,
    /// Unused (EE contexts).
    LocEecOpErr = 3,
    /// A local key or its access rights did not allow the access.
    LocProtErr = 4,
    /// Flushed: the QP was in the error state.
    WrFlushErr = 5,
    /// Unused (memory windows).
    MwBindErr = 6,
    /// An unexpected response from the peer.
    BadRespErr = 7,
    /// A local access error on a received message.
    LocAccessErr = 8,
    /// The responder rejected the request (e.g. SEND longer than the receive).
    RemInvReqErr = 9,
    /// Bad rkey, bounds or permission at the responder.
    RemAccessErr = 10,
    /// The responder failed to execute the operation.
    RemOpErr = 11,
    /// Transport retries exhausted: the peer is unreachable.
    RetryExcErr = 12,
    /// Receiver-not-ready retries exhausted.
    RnrRetryExcErr = 13,
    /// Unused.
    LocRddViolErr = 14,
    /// Unused.
    RemInvRdReqErr = 15,
    /// The responder aborted the operation.
    RemAbortErr = 16,
    /// Unused.
    InvEecnErr = 17,
    /// Unused.
    InvEecStateErr = 18,
    /// A fatal local error.
    FatalErr = 19,
    /// Response timeout.
    RespTimeoutErr = 20,
    /// Any other error.
    GeneralErr = 21,
}

impl WcStatus {
    /// ibverbs' text for the status (`ibv_wc_status_str`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocEecOpErr => "local EE context operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::MwBindErr => "memory management operation error",
            Self::BadRespErr => "bad response error",
            Self::LocAccessErr => "local access error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::LocRddViolErr => "local RDD violation error",
            Self::RemInvRdReqErr => "remote invalid RD request",
            Self::RemAbortErr => "aborted error",
            Self::InvEecnErr => "invalid EE context number",
            Self::InvEecStateErr => "invalid EE context state",
            Self::FatalErr => "fatal error",
            Self::RespTimeoutErr => "response timeout error",
            Self::GeneralErr => "general error",
        }
    }
}

impl core::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Completion opcode (`ibv_wc_opcode`); receive completions have bit 7 set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// A SEND finished.
    Send = 0,
    /// An RDMA WRITE finished.
    RdmaWrite = 1,
    /// An RDMA READ finished.
    RdmaRead = 2,
    /// A compare-and-swap finished.
    CompSwap = 3,
    /// A fetch-and-add finished.
    FetchAdd = 4,
    /// A receive consumed by a SEND.
    Recv = 128,
    /// A receive consumed by a WRITE_WITH_IMM.
    RecvRdmaWithImm = 129,
}

/// A work completion (`ibv_wc`). When `status` is not `Success`, only
/// `wr_id`, `status`, `opcode` and `qp_num` are meaningful.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: bytes placed; READ: bytes read).
    pub byte_len: u32,
    /// Immediate data of SEND_WITH_IMM / WRITE_WITH_IMM receives.
    pub imm_data: Option<u32>,
    /// The local QP number.
    pub qp_num: u32,
    /// The remote QP number (receives).
    pub src_qp: u32,
}

impl Default for WorkCompletion {
    /// A zeroed completion (ibverbs' all-zero `ibv_wc`: a successful SEND
    /// of work request 0), for sizing the arrays `poll_cq` fills.
    fn default() -> Self {
        Self {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm_data: None,
            qp_num: 0,
            src_qp: 0,
        }
    }
}

/// Which queue of a QP a completion belongs to (it picks the CQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkQueue {
    /// The send queue.
    Send,
    /// The receive queue.
    Recv,
}

/// A work completion and where it belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The QP it belongs to.
    pub qp: QpHandle,
    /// Its queue (picks the send or receive CQ).
    pub queue: WorkQueue,
    /// The completion itself.
    pub wc: WorkCompletion,
    /// A receive completion of a message whose sender asked for a
    /// solicited event (`SendWr::solicited`, the wire's SOLICITED flag): it
    /// wakes a CQ armed for solicited completions only.
    pub solicited: bool,
}

impl Completion {
    /// A send queue completion.
    pub(crate) fn send(qp: QpHandle, wc: WorkCompletion) -> Self {
        Self {
            qp,
            queue: WorkQueue::Send,
            wc,
            solicited: false,
        }
    }

    /// A receive queue completion.
    pub(crate) fn recv(qp: QpHandle, wc: WorkCompletion, solicited: bool) -> Self {
        Self {
            qp,
            queue: WorkQueue::Recv,
            wc,
            solicited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_maps_to_its_wire_request() {
        let (remote_addr, rkey) = (0x7f00_0000_1000, 0xabc);
        let mut next_recv = 5;
        let mut map = |op: WrOp, len| {
            let w = op.wire_request(len, &mut next_recv);
            (w.op, w.msg_len, w.payload_len)
        };
        assert_eq!(
            map(WrOp::Write { remote_addr, rkey }, 100),
            (OpHeader::Write { rkey, remote_addr }, 100, 100)
        );
        let write_imm = WrOp::WriteImm {
            remote_addr,
            rkey,
            imm: 7,
        };
        let header = OpHeader::WriteImm {
            rkey,
            remote_addr,
            recv_index: 5,
            imm: 7,
        };
        assert_eq!(map(write_imm, 100), (header, 100, 100));
        assert_eq!(
            map(WrOp::Send, 10),
            (OpHeader::Send { recv_index: 6 }, 10, 10)
        );
        assert_eq!(
            map(WrOp::SendImm { imm: 1 }, 0),
            (
                OpHeader::SendImm {
                    recv_index: 7,
                    imm: 1
                },
                0,
                0
            )
        );
        // A READ names what to read and carries nothing; atomics name their
        // 8-byte word; neither uses a receive.
        assert_eq!(
            map(WrOp::Read { remote_addr, rkey }, 4096),
            (OpHeader::ReadRequest { rkey, remote_addr }, 4096, 0)
        );
        let fetch_add = WrOp::FetchAdd {
            remote_addr,
            rkey,
            add: 3,
        };
        let header = OpHeader::FetchAdd {
            rkey,
            remote_addr,
            add: 3,
        };
        assert_eq!(map(fetch_add, 8), (header, 8, 0));
        let cmp_swap = WrOp::CmpSwap {
            remote_addr,
            rkey,
            compare: 1,
            swap: 2,
        };
        let header = OpHeader::CmpSwap {
            rkey,
            remote_addr,
            compare: 1,
            swap: 2,
        };
        assert_eq!(map(cmp_swap, 8), (header, 8, 0));
        assert_eq!(next_recv, 8, "only receive-consuming operations take one");
    }

    #[test]
    fn operation_classes() {
        let read = WrOp::Read {
            remote_addr: 0,
            rkey: 0,
        };
        assert!(read.writes_locally() && !read.is_atomic() && !read.consumes_receive());
        assert!(WrOp::Send.consumes_receive() && !WrOp::Send.writes_locally());
        assert_eq!(read.wc_opcode(), WcOpcode::RdmaRead);
        assert_eq!(WorkCompletion::default().status, WcStatus::Success);
    }
}
