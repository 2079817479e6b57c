//! One `FI_EP_RDM` endpoint: its MetaRoCE device, the connections to its
//! peers, tag matching, the eager and rendezvous protocols, and RMA on
//! registered application memory.
//!
//! Connections. Each direction of a peer pair has its own RC queue pair:
//! an endpoint's first request to a peer creates a QP and asks the peer's
//! connection-manager listener for the other end (`conn`); requests toward
//! that peer (eager messages, RTS, RMA requests) go on that QP, and
//! replies (FIN, RMA acknowledgements and read data) go back on the QP the
//! request came on. Two endpoints that send to each other first at the
//! same moment thus never race to share one QP. Requests posted while the
//! connection is being set up wait in order in the peer's pending queue.
//!
//! Messages. Up to `eager_limit` bytes travel in one SEND behind the
//! provider header (`wire`), into one of the receive slots posted on each
//! QP; the receiver copies the payload out and reposts the slot at once.
//! Larger messages send an RTS naming a region that holds the data; the
//! receiver, once a receive matches, RDMA-READs it into a region of its
//! own and answers FIN, which completes the send. Where a buffer is one
//! contiguous segment (as MPI's are), that region is the application's
//! buffer itself, lent to MetaRoCE for the rendezvous and deregistered
//! when it ends, so the bytes move with no copy in user space. Scattered
//! buffers go through staging regions (cached for reuse) and a copy at
//! each end.
//!
//! Order. A QP delivers in order, and each request carries a
//! per-direction sequence number that the receiver checks, so messages
//! from one peer are matched in the order they were sent (`FI_ORDER_SAS`)
//! even if that guarantee underneath ever weakened.
//!
//! RMA. MetaRoCE can only address its own regions, so `fi_write` and
//! `fi_read` on application memory are requests that the target's provider
//! carries out on the region the key names, after checking the key, the
//! access rights and the bounds; data travels in `eager_limit` chunks.
//!
//! Atomics. For the same reason an atomic (`fi_atomic`, `fi_fetch_atomic`,
//! `fi_compare_atomic`) is one request that the target's provider applies
//! to the region under the key after the same checks, under the
//! process-wide atomic lock, answering with the original values or the
//! reason it refused (`atomic`). A request and its reply each fit one
//! eager message, which bounds the element count (`atomic::max_count`).

use crate::addr::EpAddr;
use crate::atomic::{self, Call, Datatype};
use crate::config::Tunables;
use crate::domain::{CqEntry, CqError, Sinks};
use crate::ffi::log;
use crate::ffi::mem::UserIov;
use crate::flags;
use crate::matching::{MatchQueues, RecvFilter};
use crate::wire::{FLAG_CQ_DATA, FLAG_LAST, FLAG_TAGGED, HEADER_BYTES, Header, Kind, fin_ids};
use metaroce_cm::{Endpoint as CmEndpoint, RemoteBuf};
use metaroce_udp::{Device, DeviceConfig, os_seed};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, Context, EndpointConfig, MemoryRegion, ProtectionDomain, QpAttr,
    QpCaps, QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendWr, VerbsError, WcStatus,
    WorkCompletion, WrOp,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Work request ids of receive slots have this bit; the rest are op ids.
const RECV_BIT: u64 = 1 << 63;
/// Send work requests outstanding per QP before the provider queues.
const SQ_DEPTH: u32 = 1024;
/// Most rendezvous a FIN message answers (the header's id and up to this
/// many less one in its payload).
const FIN_IDS_MAX: usize = 64;
/// Staging regions come in powers of two from this size.
const STAGING_MIN: usize = 64 << 10;

/// Where an endpoint reports one kind of completion.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CqBinding {
    pub(crate) cq: usize,
    /// `FI_SELECTIVE_COMPLETION`: successful ops report only with `FI_COMPLETION`.
    pub(crate) selective: bool,
}

/// Counters bound to an endpoint, by event.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CntrBindings {
    pub(crate) send: Option<usize>,
    pub(crate) recv: Option<usize>,
    pub(crate) read: Option<usize>,
    pub(crate) write: Option<usize>,
    pub(crate) remote_read: Option<usize>,
    pub(crate) remote_write: Option<usize>,
}

/// A send, as the C layer hands it over.
#[derive(Debug)]
pub(crate) struct SendReq {
    pub(crate) iov: UserIov,
    pub(crate) dest: u64,
    pub(crate) tag: u64,
    pub(crate) data: Option<u64>,
    pub(crate) context: usize,
    pub(crate) flags: u64,
    pub(crate) tagged: bool,
}

/// A receive, as the C layer hands it over.
#[derive(Debug)]
pub(crate) struct RecvReq {
    pub(crate) iov: UserIov,
    pub(crate) filter: RecvFilter,
    pub(crate) context: usize,
    pub(crate) flags: u64,
    pub(crate) tagged: bool,
}

/// An RMA request.
#[derive(Debug)]
pub(crate) struct RmaReq {
    pub(crate) iov: UserIov,
    pub(crate) peer: u64,
    pub(crate) addr: u64,
    pub(crate) key: u64,
    pub(crate) data: Option<u64>,
    pub(crate) context: usize,
    pub(crate) flags: u64,
}

/// An atomic, as the C layer hands it over: the operand, compare and
/// result lists hold `count` elements each where the call has them (the
/// operand list is empty for FI_ATOMIC_READ, whose operand is ignored).
#[derive(Debug)]
pub(crate) struct AtomicReq {
    pub(crate) call: Call,
    pub(crate) op: atomic::Op,
    pub(crate) datatype: Datatype,
    /// Elements at the target.
    pub(crate) count: usize,
    pub(crate) operand: UserIov,
    pub(crate) compare: UserIov,
    pub(crate) result: UserIov,
    pub(crate) peer: u64,
    pub(crate) addr: u64,
    pub(crate) key: u64,
    pub(crate) data: Option<u64>,
    pub(crate) context: usize,
    pub(crate) flags: u64,
}

#[derive(Debug)]
struct PostedRecv {
    iov: UserIov,
    context: usize,
    flags: u64,
    tagged: bool,
}

#[derive(Debug)]
struct Unexpected {
    link: u32,
    h: Header,
    body: Vec<u8>,
}

#[derive(Debug)]
enum Op {
    /// A send: eager ones complete with their SEND, rendezvous ones at FIN.
    Send {
        context: usize,
        flags: u64,
        len: usize,
        tag: u64,
        wanted: bool,
        qpn: u32,
        staging: Option<Stage>,
    },
    /// A reply or a control message: nothing to report.
    Control { qpn: u32 },
    /// A rendezvous receive whose READ is in flight.
    RndvRecv {
        recv: PostedRecv,
        h: Header,
        src: u64,
        qpn: u32,
        staging: Stage,
    },
    /// An RMA write waiting for the target's acknowledgement.
    RmaWrite {
        context: usize,
        flags: u64,
        len: usize,
        wanted: bool,
        qpn: u32,
    },
    /// An RMA read collecting the target's data.
    RmaRead {
        context: usize,
        flags: u64,
        iov: UserIov,
        got: usize,
        wanted: bool,
        qpn: u32,
    },
    /// An atomic waiting for the target's reply (and, if it fetches, the
    /// original values for `result`).
    Atomic {
        context: usize,
        flags: u64,
        request: atomic::Request,
        result: UserIov,
        /// Target address and key, for the error text.
        addr: u64,
        key: u64,
        wanted: bool,
        qpn: u32,
    },
}

impl Op {
    fn qpn(&self) -> u32 {
        match self {
            Self::Send { qpn, .. }
            | Self::Control { qpn }
            | Self::RndvRecv { qpn, .. }
            | Self::RmaWrite { qpn, .. }
            | Self::RmaRead { qpn, .. }
            | Self::Atomic { qpn, .. } => *qpn,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum OutState {
    Idle,
    Connecting(u32),
    Ready(u32),
    Failed(String),
}

#[derive(Debug)]
struct Peer {
    addr: EpAddr,
    out: OutState,
    /// Requests posted before the connection was up, in order.
    pending: VecDeque<SendWr>,
    next_seq: u32,
}

#[derive(Debug)]
struct Link {
    qp: QueuePair,
    peer: usize,
    slab: MemoryRegion,
    outstanding: u32,
    backlog: VecDeque<SendWr>,
    expect_seq: u32,
    reorder: BTreeMap<u32, (Header, Vec<u8>)>,
    remote: Option<SocketAddr>,
    dead: Option<String>,
}

/// The region a rendezvous moves its bytes from (send) or into (receive).
#[derive(Debug)]
enum Stage {
    /// A cached staging region holding a copy.
    Copy(MemoryRegion),
    /// The application's own buffer, registered for this rendezvous only.
    Lent(MemoryRegion),
}

impl Stage {
    fn mr(&self) -> &MemoryRegion {
        match self {
            Self::Copy(mr) | Self::Lent(mr) => mr,
        }
    }
}

/// Rendezvous staging regions, cached by power-of-two size.
#[derive(Debug, Default)]
struct Staging {
    free: HashMap<usize, Vec<MemoryRegion>>,
    cached_bytes: usize,
    max_bytes: usize,
}

impl Staging {
    fn get(
        &mut self,
        ctx: &mut Context,
        pd: ProtectionDomain,
        len: usize,
    ) -> Result<MemoryRegion, VerbsError> {
        let class = len.next_power_of_two().max(STAGING_MIN);
        if let Some(mr) = self.free.get_mut(&class).and_then(Vec::pop) {
            self.cached_bytes -= class;
            return Ok(mr);
        }
        ctx.reg_mr(
            pd,
            class as u64,
            AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_READ.0),
        )
    }

    /// A region lent for one rendezvous.
    fn lend(
        ctx: &mut Context,
        pd: ProtectionDomain,
        iov: &UserIov,
        writable: bool,
    ) -> Option<Stage> {
        let memory = iov.lend(writable)?;
        let access = if writable {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::REMOTE_READ
        };
        // A refusal (the region table full) falls back to staging.
        ctx.reg_external_mr(pd, Box::new(memory), access)
            .ok()
            .map(Stage::Lent)
    }

    /// Done with a rendezvous' region: a lent one is deregistered (the
    /// application gets its buffer back), a copy goes back to the cache.
    fn release(&mut self, ctx: &mut Context, stage: Stage) {
        match stage {
            Stage::Copy(mr) => self.put(ctx, mr),
            Stage::Lent(mr) => {
                let _ = ctx.dereg_mr(mr);
            }
        }
    }

    fn put(&mut self, ctx: &mut Context, mr: MemoryRegion) {
        let class = mr.length as usize;
        if self.cached_bytes + class <= self.max_bytes {
            self.cached_bytes += class;
            self.free.entry(class).or_default().push(mr);
        } else {
            let _ = ctx.dereg_mr(mr);
        }
    }
}

/// Provider-level counters, reported at close.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct EpCounters {
    pub(crate) eager_sent: u64,
    pub(crate) rndv_sent: u64,
    /// Of those, sent from the application's buffer in place.
    pub(crate) rndv_sent_in_place: u64,
    pub(crate) rndv_received: u64,
    /// Of those, read straight into the application's buffer.
    pub(crate) rndv_received_in_place: u64,
    pub(crate) unexpected: u64,
    pub(crate) malformed: u64,
    pub(crate) rma_denied: u64,
    pub(crate) atomics_applied: u64,
    pub(crate) atomics_refused: u64,
    pub(crate) connections_out: u64,
    pub(crate) connections_in: u64,
}

/// The connection manager's request parameters (the `params` of its Hello).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct ConnParams {
    /// The connecting endpoint's address (`ip:cm_port`), as its peers' AVs
    /// know it: the receiver's source address for `FI_SOURCE`.
    pub(crate) src: String,
}

/// What `conn` needs to finish a connection started here.
#[derive(Debug, Clone)]
pub(crate) struct ConnectJob {
    pub(crate) peer: usize,
    pub(crate) target: EpAddr,
    pub(crate) hello: metaroce_cm::Hello<ConnParams>,
}

/// An endpoint.
pub(crate) struct EpState {
    pub(crate) dev: std::sync::Arc<Device>,
    vcq: CompletionQueue,
    pd: ProtectionDomain,
    pub(crate) name: EpAddr,
    /// Unique per endpoint, so a late connection thread never reaches a
    /// later endpoint in the same slot.
    pub(crate) instance: u64,
    pub(crate) cfg: std::sync::Arc<Tunables>,
    pub(crate) av: Option<usize>,
    pub(crate) tx_cq: Option<CqBinding>,
    pub(crate) rx_cq: Option<CqBinding>,
    pub(crate) cntrs: CntrBindings,
    pub(crate) tx_op_flags: u64,
    pub(crate) rx_op_flags: u64,
    pub(crate) enabled: bool,
    /// `FI_DIRECTED_RECV`: receives filter on their source address.
    pub(crate) directed_recv: bool,
    pub(crate) listener: Option<crate::conn::Listener>,
    peers: Vec<Peer>,
    peer_of: HashMap<EpAddr, usize>,
    links: HashMap<u32, Link>,
    msg: MatchQueues<PostedRecv, Unexpected>,
    tagged: MatchQueues<PostedRecv, Unexpected>,
    claimed: HashMap<usize, (u64, Unexpected)>,
    ops: HashMap<u64, Op>,
    next_op: u64,
    staging: Staging,
    wcs: Vec<WorkCompletion>,
    scratch: Vec<u8>,
    /// Rendezvous READs that completed in the batch of completions being
    /// worked, by QP: their FINs go out together at the end of the batch,
    /// a few ids to a message (see [`EpState::send_fins`]).
    fins: Vec<(u32, u64)>,
    /// An RTS was posted without a flush behind it (see `send`).
    rts_held: bool,
    pub(crate) counters: EpCounters,
}

impl std::fmt::Debug for EpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpState").field("name", &self.name).finish()
    }
}

fn verbs_err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The libfabric error for a failed work completion, and why.
fn wc_error(status: WcStatus) -> (i32, &'static str) {
    match status {
        WcStatus::RetryExcErr => (
            flags::EHOSTUNREACH,
            "transport retries exhausted: the peer stopped answering",
        ),
        WcStatus::RnrRetryExcErr => (flags::ETIMEDOUT, "the peer posted no receive in time"),
        WcStatus::RemAccessErr => (
            flags::EACCES,
            "the peer refused the access (key, rights or bounds)",
        ),
        WcStatus::RemInvReqErr | WcStatus::LocLenErr => {
            (flags::EMSGSIZE, "the request did not fit the peer's buffer")
        }
        WcStatus::WrFlushErr => (flags::ECANCELED, "flushed: the connection is in error"),
        _ => (flags::EIO, "the operation failed"),
    }
}

/// The device's own largest payload: the configured MTU, or, when packets
/// are sized per peer from the path, 60 KiB for a device bound to a
/// loopback address (every peer is on this host: nothing is lost on a
/// wire and every packet costs a protocol pass on the CPUs the ranks
/// share) and 8 KiB for any other (larger packets gain little on a wire
/// and cost more to resend).
fn device_mtu(configured: u32, bind_ip: Ipv4Addr) -> u32 {
    match configured {
        0 if bind_ip.is_loopback() => metaroce_udp::pmtu::LOCAL_PAYLOAD_CAP,
        0 => metaroce_udp::pmtu::AUTO_PAYLOAD_CAP,
        m => m,
    }
}

impl EpState {
    /// Start a device for a new endpoint, its verbs objects and its
    /// connection-manager listener.
    pub(crate) fn open(cfg: std::sync::Arc<Tunables>, instance: u64) -> Result<Self, String> {
        let ep_cfg = EndpointConfig {
            device_port: cfg.dev_port,
            mtu_payload_bytes: device_mtu(cfg.mtu, cfg.bind_ip),
            accept_icrc_omitted: !cfg.icrc,
            paths_per_connection: usize::from(cfg.paths),
            path_port_span: cfg.paths.max(2),
            seed: os_seed(),
            base_rtt_ns: 50_000,
            rto_min_ns: cfg.rto_min_us * 1000,
            rto_max_ns: 200_000_000,
            probe_timeout_min_ns: metaroce_udp::PROBE_TIMEOUT_MIN_NS,
            path_burst_bytes: metaroce_udp::PATH_BURST_BYTES,
            ..EndpointConfig::default()
        };
        let mut dc = DeviceConfig::new(ep_cfg, IpAddr::V4(cfg.bind_ip));
        dc.impair = cfg.impair;
        dc.direct_placement = cfg.direct;
        dc.port_fallback = true;
        let dev =
            Device::start(dc).map_err(|e| format!("MetaRoCE device on {}: {e}", cfg.bind_ip))?;
        let (pd, vcq) = dev
            .with(|ctx, _| -> Result<_, VerbsError> {
                let pd = ctx.alloc_pd();
                let cq = ctx.create_cq(1 << 16)?;
                Ok((pd, cq))
            })
            .map_err(verbs_err)?;
        let staging = Staging {
            max_bytes: cfg.staging_cache_bytes,
            ..Staging::default()
        };
        Ok(Self {
            dev: std::sync::Arc::new(dev),
            vcq,
            pd,
            name: EpAddr {
                ip: cfg.bind_ip,
                cm_port: 0,
            },
            instance,
            cfg,
            av: None,
            tx_cq: None,
            rx_cq: None,
            cntrs: CntrBindings::default(),
            tx_op_flags: 0,
            rx_op_flags: 0,
            enabled: false,
            directed_recv: false,
            listener: None,
            peers: Vec::new(),
            peer_of: HashMap::new(),
            links: HashMap::new(),
            msg: MatchQueues::new(false),
            tagged: MatchQueues::new(true),
            claimed: HashMap::new(),
            ops: HashMap::new(),
            next_op: 1,
            staging,
            wcs: vec![WorkCompletion::default(); 64],
            scratch: Vec::new(),
            fins: Vec::new(),
            rts_held: false,
            counters: EpCounters::default(),
        })
    }

    /// The endpoint is closing: drop the operations still in flight and
    /// hand back every application buffer lent to MetaRoCE for one of
    /// their rendezvous (`fi_close` returns the buffers of unfinished
    /// operations to the application, so no late READ or READ response
    /// may reach them after this).
    pub(crate) fn release_lent(&mut self) {
        let dev = self.dev.clone();
        dev.with(|ctx, _| {
            for (_, op) in self.ops.drain() {
                if let Op::Send {
                    staging: Some(Stage::Lent(mr)),
                    ..
                }
                | Op::RndvRecv {
                    staging: Stage::Lent(mr),
                    ..
                } = op
                {
                    let _ = ctx.dereg_mr(mr);
                }
            }
        });
    }

    /// The completion channel the blocking waits sleep on.
    pub(crate) fn verbs_cq(&self) -> CompletionQueue {
        self.vcq
    }

    fn op_id(&mut self) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        id
    }

    fn peer_index(&mut self, addr: EpAddr) -> usize {
        if let Some(&i) = self.peer_of.get(&addr) {
            return i;
        }
        self.peers.push(Peer {
            addr,
            out: OutState::Idle,
            pending: VecDeque::new(),
            next_seq: 0,
        });
        self.peer_of.insert(addr, self.peers.len() - 1);
        self.peers.len() - 1
    }

    fn resolve_dest(&mut self, s: &Sinks<'_>, fi_addr: u64) -> Result<usize, i32> {
        let av = self.av.and_then(|a| s.avs.get(a)).ok_or(flags::ENOAV)?;
        let addr = av.lookup(fi_addr).ok_or(flags::EINVAL)?;
        Ok(self.peer_index(addr))
    }

    fn source_of(&self, s: &Sinks<'_>, peer: usize) -> u64 {
        self.av
            .and_then(|a| s.avs.get(a))
            .map_or(flags::ADDR_NOTAVAIL, |av| {
                av.source_of(&self.peers[peer].addr)
            })
    }

    // ------------------------------------------------------------ reporting

    fn tx_wanted(&self, flags_: u64) -> bool {
        match self.tx_cq {
            None => false,
            Some(b) => {
                flags_ & flags::INJECT == 0 && (!b.selective || flags_ & flags::COMPLETION != 0)
            }
        }
    }

    fn rx_wanted(&self, flags_: u64) -> bool {
        match self.rx_cq {
            None => false,
            Some(b) => !b.selective || flags_ & flags::COMPLETION != 0,
        }
    }

    fn report(
        s: &mut Sinks<'_>,
        cq: Option<CqBinding>,
        cntr: Option<usize>,
        wanted: bool,
        entry: CqEntry,
        err: Option<(i32, usize, String)>,
    ) {
        match err {
            Some((code, olen, text)) => {
                log::warn(&text);
                if let Some(c) = cntr.and_then(|c| s.cntrs.get_mut(c)) {
                    c.err += 1;
                }
                if let Some(q) = cq.and_then(|b| s.cqs.get_mut(b.cq)) {
                    q.push_err(CqError {
                        entry,
                        olen,
                        err: code,
                        text,
                    });
                }
            }
            None => {
                if let Some(c) = cntr.and_then(|c| s.cntrs.get_mut(c)) {
                    c.value += 1;
                }
                if wanted && let Some(q) = cq.and_then(|b| s.cqs.get_mut(b.cq)) {
                    q.push(entry);
                }
            }
        }
    }

    fn peer_desc(&self, qpn: u32) -> String {
        match self.links.get(&qpn) {
            Some(l) => {
                let dev = l
                    .remote
                    .map_or_else(|| "not yet known".to_string(), |r| r.to_string());
                format!(
                    "peer {} (QP {qpn:#x}, peer device {dev})",
                    self.peers[l.peer].addr
                )
            }
            None => format!("QP {qpn:#x}"),
        }
    }

    /// Report a finished (or failed) op.
    fn finish_op(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        op: Op,
        err: Option<(i32, String)>,
    ) {
        match op {
            Op::Send {
                context,
                flags: f,
                len,
                tag,
                wanted,
                staging,
                ..
            } => {
                if let Some(stage) = staging {
                    self.staging.release(ctx, stage);
                }
                let entry = CqEntry {
                    op_context: context,
                    flags: f,
                    len,
                    tag,
                    src: flags::ADDR_NOTAVAIL,
                    ..CqEntry::default()
                };
                Self::report(
                    s,
                    self.tx_cq,
                    self.cntrs.send,
                    wanted,
                    entry,
                    err.map(|(c, t)| (c, 0, t)),
                );
            }
            Op::Control { .. } => {
                if let Some((_, t)) = err {
                    log::warn(&t);
                }
            }
            Op::RndvRecv {
                recv,
                h,
                src,
                staging,
                ..
            } => {
                self.staging.release(ctx, staging);
                self.complete_recv(s, recv, src, &h, h.len as usize, err);
            }
            Op::RmaWrite {
                context,
                flags: f,
                len,
                wanted,
                ..
            } => {
                let entry = CqEntry {
                    op_context: context,
                    flags: f,
                    len,
                    src: flags::ADDR_NOTAVAIL,
                    ..CqEntry::default()
                };
                Self::report(
                    s,
                    self.tx_cq,
                    self.cntrs.write,
                    wanted,
                    entry,
                    err.map(|(c, t)| (c, 0, t)),
                );
            }
            Op::RmaRead {
                context,
                flags: f,
                iov,
                wanted,
                ..
            } => {
                let entry = CqEntry {
                    op_context: context,
                    flags: f,
                    len: iov.len(),
                    buf: iov.first_addr(),
                    src: flags::ADDR_NOTAVAIL,
                    ..CqEntry::default()
                };
                Self::report(
                    s,
                    self.tx_cq,
                    self.cntrs.read,
                    wanted,
                    entry,
                    err.map(|(c, t)| (c, 0, t)),
                );
            }
            Op::Atomic {
                context,
                flags: f,
                request,
                wanted,
                ..
            } => {
                let entry = CqEntry {
                    op_context: context,
                    flags: f,
                    src: flags::ADDR_NOTAVAIL,
                    ..CqEntry::default()
                };
                // fi_endpoint(3): fetch and compare atomics count as reads,
                // base atomics as writes.
                let cntr = if request.call.fetches() {
                    self.cntrs.read
                } else {
                    self.cntrs.write
                };
                Self::report(
                    s,
                    self.tx_cq,
                    cntr,
                    wanted,
                    entry,
                    err.map(|(c, t)| (c, 0, t)),
                );
            }
        }
    }

    /// A receive got a message of `msg_len` bytes (already copied in).
    fn complete_recv(
        &self,
        s: &mut Sinks<'_>,
        recv: PostedRecv,
        src: u64,
        h: &Header,
        msg_len: usize,
        err: Option<(i32, String)>,
    ) {
        let mut f = flags::RECV
            | if recv.tagged {
                flags::TAGGED
            } else {
                flags::MSG
            };
        if h.has(FLAG_CQ_DATA) {
            f |= flags::REMOTE_CQ_DATA;
        }
        let len = msg_len.min(recv.iov.len());
        let entry = CqEntry {
            op_context: recv.context,
            flags: f,
            len,
            buf: recv.iov.first_addr(),
            data: if h.has(FLAG_CQ_DATA) { h.data } else { 0 },
            tag: h.tag,
            src,
        };
        let err = match err {
            Some((c, t)) => Some((c, 0, t)),
            None if msg_len > recv.iov.len() => Some((
                flags::ETRUNC,
                msg_len - recv.iov.len(),
                format!(
                    "message of {msg_len} bytes (tag {:#x}) truncated to the {}-byte receive buffer",
                    h.tag,
                    recv.iov.len()
                ),
            )),
            None => None,
        };
        let wanted = self.rx_wanted(recv.flags);
        Self::report(s, self.rx_cq, self.cntrs.recv, wanted, entry, err);
    }

    // ------------------------------------------------------------- posting

    /// Post `wr` on `qpn`, or queue it behind earlier ones.
    fn post(&mut self, ctx: &mut Context, s: &mut Sinks<'_>, qpn: u32, wr: SendWr) {
        let Some(link) = self.links.get_mut(&qpn) else {
            return;
        };
        if let Some(why) = link.dead.clone() {
            if let Some(op) = self.ops.remove(&wr.wr_id) {
                let text = format!("{}: {why}", self.peer_desc(qpn));
                self.finish_op(ctx, s, op, Some((flags::EHOSTUNREACH, text)));
            }
            return;
        }
        if link.outstanding >= SQ_DEPTH || !link.backlog.is_empty() {
            link.backlog.push_back(wr);
            return;
        }
        let qp = link.qp;
        let id = wr.wr_id;
        match ctx.post_send(qp, &[wr]) {
            Ok(()) => link.outstanding += 1,
            Err((_, e)) => {
                if let Some(op) = self.ops.remove(&id) {
                    let text = format!("{}: post_send refused: {e}", self.peer_desc(qpn));
                    self.finish_op(ctx, s, op, Some((flags::EIO, text)));
                }
            }
        }
    }

    fn drain_backlog(&mut self, ctx: &mut Context, s: &mut Sinks<'_>, qpn: u32) {
        loop {
            let Some(link) = self.links.get_mut(&qpn) else {
                return;
            };
            if link.outstanding >= SQ_DEPTH {
                return;
            }
            let Some(wr) = link.backlog.pop_front() else {
                return;
            };
            let qp = link.qp;
            let id = wr.wr_id;
            match ctx.post_send(qp, &[wr]) {
                Ok(()) => link.outstanding += 1,
                Err((_, e)) => {
                    if let Some(op) = self.ops.remove(&id) {
                        let text = format!("{}: post_send refused: {e}", self.peer_desc(qpn));
                        self.finish_op(ctx, s, op, Some((flags::EIO, text)));
                    }
                }
            }
        }
    }

    /// Send `datagram`, the request of op `id` that the peer answers (an
    /// RMA read, an atomic), to `peer`. Its SEND's completion is a control
    /// completion: the op completes when the answer is in.
    fn request_answered(
        &mut self,
        s: &mut Sinks<'_>,
        peer: usize,
        id: u64,
        datagram: Vec<u8>,
    ) -> Option<ConnectJob> {
        let dev = self.dev.clone();
        dev.with(|ctx, _| {
            let cid = self.op_id();
            self.ops.insert(cid, Op::Control { qpn: 0 });
            let job = self.request(ctx, s, peer, SendWr::inline(cid, WrOp::Send, datagram));
            self.fix_op_qpn(peer, id);
            job
        })
    }

    /// Send a request to `peer`: on its connection if up, else queued
    /// behind the connection set-up (which this may start).
    fn request(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        peer: usize,
        wr: SendWr,
    ) -> Option<ConnectJob> {
        match self.peers[peer].out.clone() {
            OutState::Ready(qpn) => {
                self.post(ctx, s, qpn, wr);
                None
            }
            OutState::Connecting(_) => {
                self.peers[peer].pending.push_back(wr);
                None
            }
            OutState::Failed(why) => {
                if let Some(op) = self.ops.remove(&wr.wr_id) {
                    let text = format!("peer {}: {why}", self.peers[peer].addr);
                    self.finish_op(ctx, s, op, Some((flags::EHOSTUNREACH, text)));
                }
                None
            }
            OutState::Idle => {
                self.peers[peer].pending.push_back(wr);
                match self.new_link(ctx, s, peer) {
                    Ok(qpn) => {
                        self.peers[peer].out = OutState::Connecting(qpn);
                        self.counters.connections_out += 1;
                        Some(self.connect_job(ctx, peer, qpn))
                    }
                    Err(e) => {
                        self.fail_peer(ctx, s, peer, format!("could not create a QP: {e}"));
                        None
                    }
                }
            }
        }
    }

    fn connect_job(&self, ctx: &Context, peer: usize, qpn: u32) -> ConnectJob {
        let hello = metaroce_cm::Hello {
            test: "libfabric-rdm".into(),
            params: ConnParams {
                src: self.name.to_string(),
            },
            endpoint: self.cm_endpoint(ctx, qpn),
            last: false,
        };
        ConnectJob {
            peer,
            target: self.peers[peer].addr,
            hello,
        }
    }

    fn cm_endpoint(&self, ctx: &Context, qpn: u32) -> CmEndpoint {
        CmEndpoint {
            device_port: ctx.device_port(),
            path_port_span: self.cfg.paths.max(2),
            mtu: device_mtu(self.cfg.mtu, self.cfg.bind_ip),
            qpns: vec![qpn],
            buf: RemoteBuf {
                addr: 0,
                rkey: 0,
                len: 0,
            },
            session_id: ctx.session_id(),
            auth: "none".into(),
            // The provider runs unauthenticated: no job secret to confirm.
            key_confirm: None,
            setup_grant_mbps: None,
            // Unauthenticated, so the UDP checksum alone can cover payloads.
            icrc_omission: !self.cfg.icrc,
        }
    }

    /// A QP in INIT with its receive slots posted.
    fn new_link(
        &mut self,
        ctx: &mut Context,
        _s: &mut Sinks<'_>,
        peer: usize,
    ) -> Result<u32, VerbsError> {
        let slots = self.cfg.recv_slots;
        let slot_bytes = self.slot_bytes();
        let qp = ctx.create_qp(
            self.pd,
            &QpInitAttr {
                send_cq: self.vcq,
                recv_cq: self.vcq,
                cap: QpCaps {
                    max_send_wr: SQ_DEPTH,
                    max_recv_wr: slots,
                },
                qp_type: QpType::Rc,
                sq_sig_all: true,
            },
        )?;
        let access = AccessFlags(
            AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0,
        );
        ctx.modify_qp(
            qp,
            &QpAttr {
                qp_state: Some(QpState::Init),
                qp_access_flags: Some(access),
                port_num: Some(1),
                ..QpAttr::default()
            },
        )?;
        let slab = ctx.reg_mr(
            self.pd,
            u64::from(slots) * slot_bytes as u64,
            AccessFlags::LOCAL_WRITE,
        )?;
        let qpn = qp.qp_num();
        let wrs: Vec<RecvWr> = (0..slots)
            .map(|i| RecvWr {
                wr_id: RECV_BIT | (u64::from(qpn) << 20) | u64::from(i),
                sg_list: vec![slab.sge(u64::from(i) * slot_bytes as u64, slot_bytes as u32)],
            })
            .collect();
        ctx.post_recv(qp, &wrs).map_err(|(_, e)| e)?;
        self.links.insert(
            qpn,
            Link {
                qp,
                peer,
                slab,
                outstanding: 0,
                backlog: VecDeque::new(),
                expect_seq: 0,
                reorder: BTreeMap::new(),
                remote: None,
                dead: None,
            },
        );
        Ok(qpn)
    }

    fn slot_bytes(&self) -> usize {
        self.cfg.eager_limit + HEADER_BYTES
    }

    /// What the path to `dest` carries unfragmented, in payload bytes per
    /// packet, and an error naming the path when the configured MTU is
    /// more. Asks the kernel, so it runs outside the device lock.
    fn path_payload(&self, dest: SocketAddr) -> Result<u32, String> {
        let path = self
            .dev
            .learn_path(dest)
            .map_err(|e| format!("the path to {dest}: {e}"))?;
        let overhead = self
            .dev
            .with(|ctx, _| ctx.endpoint().datagram_len_for_payload(0));
        let fits = u32::try_from(path.max_datagram.saturating_sub(overhead)).unwrap_or(u32::MAX);
        if self.cfg.mtu != 0 && self.cfg.mtu > fits {
            return Err(format!(
                "FI_METAROCE_MTU={}: the path to {dest} ({}) carries at most {fits} payload bytes \
                 per packet unfragmented (0 sizes packets from the path)",
                self.cfg.mtu,
                path.describe()
            ));
        }
        if fits < 256 {
            return Err(format!(
                "the path to {dest} ({}) is too small for MetaRoCE packets",
                path.describe()
            ));
        }
        Ok(fits)
    }

    fn to_rts(
        ctx: &mut Context,
        qp: QueuePair,
        dest: SocketAddr,
        remote: &CmEndpoint,
        path_payload: u32,
    ) -> Result<(), VerbsError> {
        ctx.set_peer_session(dest, remote.session_id)?;
        ctx.set_peer_icrc_omission(
            dest,
            remote.icrc_omission && ctx.endpoint().config().accept_icrc_omitted,
        );
        let mtu = ctx
            .endpoint()
            .config()
            .mtu_payload_bytes
            .min(remote.mtu.max(256))
            .min(path_payload);
        ctx.modify_qp(
            qp,
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                dest_addr: Some(dest),
                dest_qp_num: Some(remote.qpns[0]),
                path_mtu: Some(mtu),
                ..QpAttr::default()
            },
        )?;
        ctx.modify_qp(
            qp,
            &QpAttr {
                qp_state: Some(QpState::Rts),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                ..QpAttr::default()
            },
        )
    }

    /// The connection manager answered for the connection to `peer`.
    pub(crate) fn finish_connect(
        &mut self,
        s: &mut Sinks<'_>,
        peer: usize,
        answer: Result<CmEndpoint, String>,
    ) {
        let OutState::Connecting(qpn) = self.peers[peer].out.clone() else {
            return;
        };
        let dev = self.dev.clone();
        let ip = IpAddr::V4(self.peers[peer].addr.ip);
        let answer = answer.and_then(|remote| {
            let fits = self.path_payload(SocketAddr::new(ip, remote.device_port))?;
            Ok((remote, fits))
        });
        dev.with(|ctx, _| {
            let result = answer.and_then(|(remote, fits)| {
                if remote.qpns.len() != 1 {
                    return Err(format!(
                        "the peer answered with {} QPs, not 1",
                        remote.qpns.len()
                    ));
                }
                let dest =
                    SocketAddr::new(IpAddr::V4(self.peers[peer].addr.ip), remote.device_port);
                let qp = self.links[&qpn].qp;
                Self::to_rts(ctx, qp, dest, &remote, fits).map_err(verbs_err)?;
                if let Some(l) = self.links.get_mut(&qpn) {
                    l.remote = Some(dest);
                }
                Ok(())
            });
            match result {
                Ok(()) => {
                    log::debug(&format!(
                        "connected to peer {} (QP {qpn:#x})",
                        self.peers[peer].addr
                    ));
                    self.peers[peer].out = OutState::Ready(qpn);
                    let pending: Vec<SendWr> = self.peers[peer].pending.drain(..).collect();
                    for wr in pending {
                        self.post(ctx, s, qpn, wr);
                    }
                }
                Err(why) => {
                    let why = format!("connection set-up failed: {why}");
                    if let Some(l) = self.links.get_mut(&qpn) {
                        l.dead = Some(why.clone());
                    }
                    self.fail_peer(ctx, s, peer, why);
                }
            }
        });
    }

    fn fail_peer(&mut self, ctx: &mut Context, s: &mut Sinks<'_>, peer: usize, why: String) {
        self.peers[peer].out = OutState::Failed(why.clone());
        let pending: Vec<SendWr> = self.peers[peer].pending.drain(..).collect();
        let who = self.peers[peer].addr;
        for wr in pending {
            if let Some(op) = self.ops.remove(&wr.wr_id) {
                self.finish_op(
                    ctx,
                    s,
                    op,
                    Some((flags::EHOSTUNREACH, format!("peer {who}: {why}"))),
                );
            }
        }
    }

    /// A peer's connection manager asks for a connection toward this
    /// endpoint: a QP in RTS toward its QP, and this side's answer.
    pub(crate) fn accept(
        &mut self,
        s: &mut Sinks<'_>,
        hello: &metaroce_cm::Hello<ConnParams>,
    ) -> Result<CmEndpoint, String> {
        let src: EpAddr = hello.params.src.parse()?;
        if hello.endpoint.qpns.len() != 1 {
            return Err(format!(
                "{} QPs offered, expected 1",
                hello.endpoint.qpns.len()
            ));
        }
        if hello.endpoint.auth != "none" {
            return Err(format!(
                "packet protection {:?} is not what this endpoint runs (none)",
                hello.endpoint.auth
            ));
        }
        let peer = self.peer_index(src);
        let dest = SocketAddr::new(IpAddr::V4(src.ip), hello.endpoint.device_port);
        let fits = self.path_payload(dest)?;
        let dev = self.dev.clone();
        dev.with(|ctx, _| {
            let qpn = self.new_link(ctx, s, peer).map_err(verbs_err)?;
            let qp = self.links[&qpn].qp;
            if let Err(e) = Self::to_rts(ctx, qp, dest, &hello.endpoint, fits) {
                let _ = ctx.destroy_qp(qp);
                self.links.remove(&qpn);
                return Err(verbs_err(e));
            }
            if let Some(l) = self.links.get_mut(&qpn) {
                l.remote = Some(dest);
            }
            self.counters.connections_in += 1;
            log::debug(&format!("accepted peer {src} (QP {qpn:#x})"));
            Ok(self.cm_endpoint(ctx, qpn))
        })
    }

    // ------------------------------------------------------------ requests

    /// `fi_send` and friends.
    pub(crate) fn send(
        &mut self,
        s: &mut Sinks<'_>,
        r: SendReq,
    ) -> Result<Option<ConnectJob>, i32> {
        let peer = self.resolve_dest(s, r.dest)?;
        let len = r.iov.len();
        if len as u64 > u64::from(u32::MAX >> 1) {
            return Err(flags::EMSGSIZE);
        }
        let id = self.op_id();
        let mut h = Header::new(Kind::Eager);
        if r.tagged {
            h.flags |= FLAG_TAGGED;
        }
        if let Some(d) = r.data {
            h.flags |= FLAG_CQ_DATA;
            h.data = d;
        }
        h.tag = r.tag;
        h.len = len as u64;
        h.id = id;
        h.seq = self.peers[peer].next_seq;
        let wanted = self.tx_wanted(r.flags);
        let cq_flags = flags::SEND | if r.tagged { flags::TAGGED } else { flags::MSG };
        let eager = len <= self.cfg.eager_limit;
        let dev = self.dev.clone();
        let post = |ctx: &mut Context, _| -> Result<Option<ConnectJob>, i32> {
            let (msg, staging) = if eager {
                let mut m = Vec::with_capacity(HEADER_BYTES + len);
                h.write(&mut m);
                r.iov.gather_into(&mut m);
                self.counters.eager_sent += 1;
                (m, None)
            } else {
                let stage = match Staging::lend(ctx, self.pd, &r.iov, false) {
                    Some(stage) => stage,
                    None => {
                        let mr = self.staging.get(ctx, self.pd, len).map_err(|e| {
                            log::warn(&format!("rendezvous staging of {len} bytes: {e}"));
                            flags::ENOMEM
                        })?;
                        r.iov.gather_to_slice(&mut ctx.mr_bytes_mut(&mr)[..len]);
                        Stage::Copy(mr)
                    }
                };
                if matches!(stage, Stage::Lent(_)) {
                    self.counters.rndv_sent_in_place += 1;
                }
                h.kind = Kind::Rts;
                h.addr = stage.mr().addr;
                h.key = stage.mr().rkey;
                let mut m = Vec::with_capacity(HEADER_BYTES);
                h.write(&mut m);
                self.counters.rndv_sent += 1;
                (m, Some(stage))
            };
            self.peers[peer].next_seq = self.peers[peer].next_seq.wrapping_add(1);
            let qpn = match self.peers[peer].out {
                OutState::Ready(q) | OutState::Connecting(q) => q,
                _ => 0,
            };
            self.ops.insert(
                id,
                Op::Send {
                    context: r.context,
                    flags: cq_flags,
                    len,
                    tag: r.tag,
                    wanted,
                    qpn,
                    staging,
                },
            );
            let wr = SendWr::inline(id, WrOp::Send, msg);
            let job = self.request(ctx, s, peer, wr);
            self.fix_op_qpn(peer, id);
            Ok(job)
        };
        // An RTS waits for the next flush (this thread's next poll, which
        // flushes first thing, or the device's hold limit): a burst of
        // rendezvous sends (an MPI window) then leaves in one flush, the
        // RTSes to a path in one GSO datagram, which the peer takes in
        // whole (GRO) and acknowledges once, instead of a datagram, two
        // receive calls and an ACK each at the receiver.
        let job = if eager {
            dev.with(post)?
        } else {
            let job = dev.with_deferred(post)?;
            self.rts_held = true;
            job
        };
        Ok(job)
    }

    /// A request's op learns the QP it went on once the connection exists.
    fn fix_op_qpn(&mut self, peer: usize, id: u64) {
        let (OutState::Ready(q) | OutState::Connecting(q)) = self.peers[peer].out else {
            return;
        };
        #[allow(clippy::single_match)]
        match self.ops.get_mut(&id) {
            Some(
                Op::Send { qpn, .. }
                | Op::RmaWrite { qpn, .. }
                | Op::RmaRead { qpn, .. }
                | Op::Atomic { qpn, .. },
            ) => *qpn = q,
            _ => {}
        }
    }

    /// `fi_recv` / `fi_trecv` (without peek or claim).
    pub(crate) fn recv(&mut self, s: &mut Sinks<'_>, r: RecvReq) -> Result<(), i32> {
        let recv = PostedRecv {
            iov: r.iov,
            context: r.context,
            flags: r.flags,
            tagged: r.tagged,
        };
        let q = if r.tagged {
            &mut self.tagged
        } else {
            &mut self.msg
        };
        match q.take_unexpected(&r.filter) {
            Some((src, _tag, u)) => {
                // Deferred: the application's reply to this message, posted
                // next, carries the ACK for it (as in `progress`).
                let dev = self.dev.clone();
                dev.with_deferred(|ctx, _| self.consume(ctx, s, recv, src, u));
            }
            None => q.post(r.filter, recv),
        }
        Ok(())
    }

    /// `FI_PEEK` (with `FI_CLAIM` or `FI_DISCARD`): look for a message
    /// that arrived unexpected.
    pub(crate) fn peek(&mut self, s: &mut Sinks<'_>, r: RecvReq) -> Result<(), i32> {
        let q = if r.tagged {
            &mut self.tagged
        } else {
            &mut self.msg
        };
        let found = q.peek_unexpected(&r.filter).map(|(src, _, u)| (*src, u.h));
        let f = flags::RECV | if r.tagged { flags::TAGGED } else { flags::MSG };
        let Some((src, h)) = found else {
            let entry = CqEntry {
                op_context: r.context,
                flags: f,
                src: flags::ADDR_NOTAVAIL,
                ..CqEntry::default()
            };
            // A failed peek is a normal outcome, not worth a warning.
            if let Some(q) = self.rx_cq.and_then(|b| s.cqs.get_mut(b.cq)) {
                q.push_err(CqError {
                    entry,
                    olen: 0,
                    err: flags::ENOMSG,
                    text: "no unexpected message matches the peek".into(),
                });
            }
            return Ok(());
        };
        if r.flags & (flags::CLAIM | flags::DISCARD) != 0 {
            let q = if r.tagged {
                &mut self.tagged
            } else {
                &mut self.msg
            };
            let (src, _, u) = q.take_unexpected(&r.filter).expect("peeked above");
            if r.flags & flags::DISCARD != 0 {
                let dev = self.dev.clone();
                dev.with(|ctx, _| self.discard(ctx, s, u));
            } else {
                self.claimed.insert(r.context, (src, u));
            }
        }
        let mut cf = f;
        if h.has(FLAG_CQ_DATA) {
            cf |= flags::REMOTE_CQ_DATA;
        }
        let entry = CqEntry {
            op_context: r.context,
            flags: cf,
            len: h.len as usize,
            buf: 0,
            data: if h.has(FLAG_CQ_DATA) { h.data } else { 0 },
            tag: h.tag,
            src,
        };
        if let Some(q) = self.rx_cq.and_then(|b| s.cqs.get_mut(b.cq)) {
            q.push(entry);
        }
        Ok(())
    }

    /// `FI_CLAIM` receive: take the message an earlier peek claimed for
    /// this context (`FI_DISCARD`: drop it).
    pub(crate) fn claim(&mut self, s: &mut Sinks<'_>, r: RecvReq) -> Result<(), i32> {
        let (src, u) = self.claimed.remove(&r.context).ok_or(flags::EINVAL)?;
        let recv = PostedRecv {
            iov: r.iov,
            context: r.context,
            flags: r.flags,
            tagged: r.tagged,
        };
        let dev = self.dev.clone();
        dev.with(|ctx, _| {
            if r.flags & flags::DISCARD != 0 {
                let h = u.h;
                self.discard(ctx, s, u);
                self.complete_recv(s, recv, src, &h, 0, None);
            } else {
                self.consume(ctx, s, recv, src, u);
            }
        });
        Ok(())
    }

    /// Drop an unexpected message; a rendezvous sender is told (FIN) so
    /// its send completes.
    fn discard(&mut self, ctx: &mut Context, s: &mut Sinks<'_>, u: Unexpected) {
        if u.h.kind == Kind::Rts {
            self.send_fin(ctx, s, u.link, u.h.id, 0);
        }
    }

    fn send_fin(&mut self, ctx: &mut Context, s: &mut Sinks<'_>, qpn: u32, id: u64, status: u16) {
        let mut fin = Header::new(Kind::Fin);
        fin.id = id;
        fin.status = status;
        self.control(ctx, s, qpn, fin, &[]);
    }

    /// FINs for the rendezvous READs the last batch of completions
    /// finished: one message per QP carries up to `FIN_IDS_MAX` of them (the
    /// first in the header, the rest as the payload). Under a stream of
    /// large messages a batch often finishes several, and every FIN saved
    /// is a datagram less each way (the FIN and its ACK) and a receive
    /// slot less at the sender. Nothing waits for the batching: what the
    /// batch posts leaves in one flush after it either way.
    fn send_fins(&mut self, ctx: &mut Context, s: &mut Sinks<'_>) {
        if self.fins.is_empty() {
            return;
        }
        let mut fins = std::mem::take(&mut self.fins);
        // Group by QP, keeping each QP's completion order.
        fins.sort_by_key(|&(qpn, _)| qpn);
        // The ids must fit a receive slot at the peer, sized by the same
        // eager limit as ours.
        let per_msg = 1 + (self.cfg.eager_limit / 8).min(FIN_IDS_MAX - 1);
        let mut payload = Vec::with_capacity(8 * (per_msg - 1));
        for group in fins.chunk_by(|a, b| a.0 == b.0) {
            let qpn = group[0].0;
            for chunk in group.chunks(per_msg) {
                let mut fin = Header::new(Kind::Fin);
                fin.id = chunk[0].1;
                payload.clear();
                for &(_, id) in &chunk[1..] {
                    payload.extend_from_slice(&id.to_le_bytes());
                }
                self.control(ctx, s, qpn, fin, &payload);
            }
        }
        fins.clear();
        self.fins = fins;
    }

    fn control(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        qpn: u32,
        h: Header,
        payload: &[u8],
    ) {
        let id = self.op_id();
        self.ops.insert(id, Op::Control { qpn });
        self.post(
            ctx,
            s,
            qpn,
            SendWr::inline(id, WrOp::Send, h.with_payload(payload)),
        );
    }

    /// `fi_cancel`: a posted receive with this context completes with
    /// `FI_ECANCELED`.
    pub(crate) fn cancel(&mut self, s: &mut Sinks<'_>, context: usize) -> bool {
        let found = self
            .tagged
            .cancel(|r| r.context == context)
            .or_else(|| self.msg.cancel(|r| r.context == context));
        let Some(recv) = found else {
            return false;
        };
        let entry = CqEntry {
            op_context: context,
            flags: flags::RECV
                | if recv.tagged {
                    flags::TAGGED
                } else {
                    flags::MSG
                },
            buf: recv.iov.first_addr(),
            src: flags::ADDR_NOTAVAIL,
            ..CqEntry::default()
        };
        if let Some(q) = self.rx_cq.and_then(|b| s.cqs.get_mut(b.cq)) {
            q.push_err(CqError {
                entry,
                olen: 0,
                err: flags::ECANCELED,
                text: "receive canceled".into(),
            });
        }
        true
    }

    /// A matched message: eager data is copied in, a rendezvous starts its READ.
    fn consume(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        recv: PostedRecv,
        src: u64,
        u: Unexpected,
    ) {
        match u.h.kind {
            Kind::Rts => self.start_read(ctx, s, recv, src, u.link, u.h),
            _ => {
                recv.iov.scatter_from(0, &u.body);
                self.complete_recv(s, recv, src, &u.h, u.body.len(), None);
            }
        }
    }

    fn start_read(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        recv: PostedRecv,
        src: u64,
        qpn: u32,
        h: Header,
    ) {
        let Ok(len) = u32::try_from(h.len) else {
            let text = format!(
                "{}: rendezvous of {} bytes is too large",
                self.peer_desc(qpn),
                h.len
            );
            self.send_fin(ctx, s, qpn, h.id, flags::EMSGSIZE as u16);
            self.complete_recv(s, recv, src, &h, 0, Some((flags::EMSGSIZE, text)));
            return;
        };
        // Straight into the receive buffer when it is one segment that
        // holds the whole message.
        let lent = (recv.iov.len() >= len as usize)
            .then(|| Staging::lend(ctx, self.pd, &recv.iov, true))
            .flatten();
        let staging = match lent {
            Some(stage) => stage,
            None => match self.staging.get(ctx, self.pd, len as usize) {
                Ok(mr) => Stage::Copy(mr),
                Err(e) => {
                    let text = format!(
                        "{}: staging for a {len}-byte rendezvous: {e}",
                        self.peer_desc(qpn)
                    );
                    self.send_fin(ctx, s, qpn, h.id, flags::ENOMEM as u16);
                    self.complete_recv(s, recv, src, &h, 0, Some((flags::ENOMEM, text)));
                    return;
                }
            },
        };
        self.counters.rndv_received += 1;
        if matches!(staging, Stage::Lent(_)) {
            self.counters.rndv_received_in_place += 1;
        }
        let id = self.op_id();
        let sge = staging.mr().sge(0, len);
        self.ops.insert(
            id,
            Op::RndvRecv {
                recv,
                h,
                src,
                qpn,
                staging,
            },
        );
        let wr = SendWr::new(
            id,
            WrOp::Read {
                remote_addr: h.addr,
                rkey: h.key,
            },
            vec![sge],
        );
        self.post(ctx, s, qpn, wr);
    }

    /// `fi_write` / `fi_writedata` / `fi_inject_write`.
    pub(crate) fn rma_write(
        &mut self,
        s: &mut Sinks<'_>,
        r: RmaReq,
    ) -> Result<Option<ConnectJob>, i32> {
        let peer = self.resolve_dest(s, r.peer)?;
        let id = self.op_id();
        let wanted = self.tx_wanted(r.flags);
        let len = r.iov.len();
        let mut data = Vec::with_capacity(len);
        r.iov.gather_into(&mut data);
        self.ops.insert(
            id,
            Op::RmaWrite {
                context: r.context,
                flags: flags::RMA | flags::WRITE,
                len,
                wanted,
                qpn: 0,
            },
        );
        let chunk = self.cfg.eager_limit;
        let dev = self.dev.clone();
        let job = dev.with(|ctx, _| {
            let mut job = None;
            let mut off = 0usize;
            loop {
                let n = chunk.min(len - off);
                let mut h = Header::new(Kind::RmaWrite);
                h.addr = r.addr.wrapping_add(off as u64);
                h.key = r.key;
                h.len = n as u64;
                h.id = id;
                let last = off + n == len;
                if last {
                    h.flags |= FLAG_LAST;
                    if let Some(d) = r.data {
                        h.flags |= FLAG_CQ_DATA;
                        h.data = d;
                    }
                }
                // Only the last chunk's SEND completion is tied to the op;
                // the others are plain control sends.
                let wr_id = if last {
                    id
                } else {
                    let cid = self.op_id();
                    self.ops.insert(cid, Op::Control { qpn: 0 });
                    cid
                };
                let wr = SendWr::inline(wr_id, WrOp::Send, h.with_payload(&data[off..off + n]));
                if let Some(j) = self.request(ctx, s, peer, wr) {
                    job = Some(j);
                }
                off += n;
                if last {
                    break;
                }
            }
            self.fix_op_qpn(peer, id);
            job
        });
        Ok(job)
    }

    /// `fi_read`.
    pub(crate) fn rma_read(
        &mut self,
        s: &mut Sinks<'_>,
        r: RmaReq,
    ) -> Result<Option<ConnectJob>, i32> {
        let peer = self.resolve_dest(s, r.peer)?;
        let id = self.op_id();
        let wanted = self.tx_wanted(r.flags);
        let mut h = Header::new(Kind::RmaReadReq);
        h.addr = r.addr;
        h.key = r.key;
        h.len = r.iov.len() as u64;
        h.id = id;
        self.ops.insert(
            id,
            Op::RmaRead {
                context: r.context,
                flags: flags::RMA | flags::READ,
                iov: r.iov,
                got: 0,
                wanted,
                qpn: 0,
            },
        );
        Ok(self.request_answered(s, peer, id, h.with_payload(&[])))
    }

    /// `fi_atomic`, `fi_fetch_atomic`, `fi_compare_atomic` and their
    /// vector, message and inject forms.
    pub(crate) fn atomic(
        &mut self,
        s: &mut Sinks<'_>,
        r: AtomicReq,
    ) -> Result<Option<ConnectJob>, i32> {
        let request = atomic::Request::new(r.call, r.op, r.datatype, r.count, self.cfg.eager_limit)
            .map_err(|e| {
                log::warn(&format!("{}: {e}", r.call.function()));
                e.fi_errno()
            })?;
        let n = request.target_bytes();
        let lists_fit = (request.op == atomic::Op::Read || r.operand.len() == n)
            && (request.call != Call::Compare || r.compare.len() == n)
            && (!request.call.fetches() || r.result.len() == n);
        if !lists_fit {
            log::warn(&format!(
                "{}: the local buffers ({} operand, {} compare, {} result bytes) \
                 do not hold the {} elements of {} the target gets",
                r.call.function(),
                r.operand.len(),
                r.compare.len(),
                r.result.len(),
                r.count,
                r.datatype.name()
            ));
            return Err(flags::EINVAL);
        }
        let peer = self.resolve_dest(s, r.peer)?;
        let id = self.op_id();
        let mut h = Header::new(Kind::AtomicReq);
        h.tag = request.to_wire();
        h.addr = r.addr;
        h.key = r.key;
        h.id = id;
        if let Some(d) = r.data {
            h.flags |= FLAG_CQ_DATA;
            h.data = d;
        }
        // Operands are copied now, so inject and the caller's buffer reuse
        // after return both hold; results land at the reply.
        let mut payload = Vec::with_capacity(request.payload_bytes());
        if request.op != atomic::Op::Read {
            r.operand.gather_into(&mut payload);
        }
        if request.call == Call::Compare {
            r.compare.gather_into(&mut payload);
        }
        h.len = payload.len() as u64;
        // A fetch's completion says its results are in: FI_INJECT (about
        // the operand buffer) does not suppress it.
        let wanted = if request.call.fetches() {
            self.tx_wanted(r.flags & !flags::INJECT)
        } else {
            self.tx_wanted(r.flags)
        };
        let cq_flags = flags::ATOMIC
            | if request.call.fetches() {
                flags::READ
            } else {
                flags::WRITE
            };
        self.ops.insert(
            id,
            Op::Atomic {
                context: r.context,
                flags: cq_flags,
                request,
                result: r.result,
                addr: r.addr,
                key: r.key,
                wanted,
                qpn: 0,
            },
        );
        Ok(self.request_answered(s, peer, id, h.with_payload(&payload)))
    }

    // ------------------------------------------------------------ progress

    /// Take the device's completions and act on them.
    pub(crate) fn progress(&mut self, s: &mut Sinks<'_>) -> bool {
        let dev = self.dev.clone();
        if self.rts_held {
            self.rts_held = false;
            dev.flush();
        }
        let mut did = false;
        for _ in 0..8 {
            let n = match dev.poll_cq(self.vcq, &mut self.wcs) {
                Ok(n) => n,
                Err(e) => {
                    log::warn(&format!("polling the MetaRoCE completion queue: {e}"));
                    0
                }
            };
            if n == 0 {
                break;
            }
            did = true;
            // The batch is worked from the scratch array itself, lent out
            // for the while (no copy per batch).
            let wcs = std::mem::take(&mut self.wcs);
            // Deferred: the application's answer to what arrived, posted
            // next, leaves ahead of the ACKs (and of any reply this makes).
            dev.with_deferred(|ctx, _| {
                for wc in &wcs[..n] {
                    self.on_wc(ctx, s, wc);
                }
                self.send_fins(ctx, s);
            });
            let short = n < wcs.len();
            self.wcs = wcs;
            // A short batch emptied the device's queue: polling again now
            // would only cost another empty receive pass (a system call);
            // the caller's next poll comes soon enough.
            if short {
                break;
            }
        }
        did
    }

    fn on_wc(&mut self, ctx: &mut Context, s: &mut Sinks<'_>, wc: &WorkCompletion) {
        if wc.wr_id & RECV_BIT != 0 {
            let qpn = ((wc.wr_id >> 20) & 0xffff_ffff) as u32;
            let slot = (wc.wr_id & 0xf_ffff) as usize;
            self.on_recv_slot(ctx, s, qpn, slot, wc);
            return;
        }
        if let Some(l) = self.links.get_mut(&wc.qp_num) {
            l.outstanding = l.outstanding.saturating_sub(1);
        }
        let op = self.ops.remove(&wc.wr_id);
        if wc.status != WcStatus::Success {
            let (code, why) = wc_error(wc.status);
            let st = ctx.stats();
            let text = format!(
                "{}: {why} ({}); MetaRoCE so far: {} data packets resent, {} RTOs, {} paths retired",
                self.peer_desc(wc.qp_num),
                wc.status,
                st.data_packets_retransmitted,
                st.rtos,
                st.paths_replaced
            );
            if wc.status != WcStatus::WrFlushErr {
                self.fail_link(ctx, s, wc.qp_num, text.clone());
            }
            if let Some(op) = op {
                self.finish_op(ctx, s, op, Some((code, text)));
            }
        } else if let Some(op) = op {
            match op {
                Op::Send { staging: None, .. } | Op::Control { .. } => {
                    self.finish_op(ctx, s, op, None)
                }
                Op::RndvRecv {
                    recv,
                    h,
                    src,
                    qpn,
                    staging,
                } => {
                    if let Stage::Copy(mr) = &staging {
                        let n = (h.len as usize).min(mr.length as usize);
                        recv.iov.scatter_from(0, &ctx.mr_bytes(mr)[..n]);
                    }
                    // Answered at the end of the batch, with the other
                    // READs it completed (`send_fins`).
                    self.fins.push((qpn, h.id));
                    self.staging.release(ctx, staging);
                    self.complete_recv(s, recv, src, &h, h.len as usize, None);
                }
                // Waiting for the peer's FIN / acknowledgement / data.
                other => {
                    self.ops.insert(wc.wr_id, other);
                }
            }
        }
        self.drain_backlog(ctx, s, wc.qp_num);
    }

    /// A QP failed: everything waiting on it fails with the reason.
    fn fail_link(&mut self, ctx: &mut Context, s: &mut Sinks<'_>, qpn: u32, why: String) {
        let Some(link) = self.links.get_mut(&qpn) else {
            return;
        };
        if link.dead.is_some() {
            return;
        }
        link.dead = Some(why.clone());
        let peer = link.peer;
        let backlog: Vec<SendWr> = link.backlog.drain(..).collect();
        if self.peers[peer].out == OutState::Ready(qpn) {
            self.peers[peer].out = OutState::Failed(why.clone());
        }
        let mut ids: Vec<u64> = backlog.iter().map(|w| w.wr_id).collect();
        ids.extend(
            self.ops
                .iter()
                .filter(|(_, op)| op.qpn() == qpn && !matches!(op, Op::Control { .. }))
                .map(|(id, _)| *id),
        );
        for id in ids {
            if let Some(op) = self.ops.remove(&id) {
                self.finish_op(ctx, s, op, Some((flags::EHOSTUNREACH, why.clone())));
            }
        }
    }

    fn on_recv_slot(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        qpn: u32,
        slot: usize,
        wc: &WorkCompletion,
    ) {
        let slot_bytes = self.slot_bytes();
        let Some(link) = self.links.get(&qpn) else {
            return;
        };
        if wc.status != WcStatus::Success {
            return;
        }
        let start = slot * slot_bytes;
        let n = (wc.byte_len as usize).min(slot_bytes);
        let bytes = ctx.mr_bytes(&link.slab);
        let mut msg = std::mem::take(&mut self.scratch);
        msg.clear();
        if let Some(b) = bytes.get(start..start + n) {
            msg.extend_from_slice(b);
        }
        let wr = RecvWr {
            wr_id: wc.wr_id,
            sg_list: vec![link.slab.sge(start as u64, slot_bytes as u32)],
        };
        if let Err((_, e)) = ctx.post_recv(link.qp, &[wr]) {
            log::warn(&format!(
                "{}: reposting a receive slot: {e}",
                self.peer_desc(qpn)
            ));
        }
        self.on_message(ctx, s, qpn, &msg);
        self.scratch = msg;
    }

    fn on_message(&mut self, ctx: &mut Context, s: &mut Sinks<'_>, qpn: u32, msg: &[u8]) {
        let (h, payload) = match Header::parse(msg) {
            Ok(x) => x,
            Err(e) => {
                self.counters.malformed += 1;
                log::warn(&format!(
                    "{}: dropped a malformed message: {e}",
                    self.peer_desc(qpn)
                ));
                return;
            }
        };
        match h.kind {
            Kind::Eager | Kind::Rts => self.on_ordered(ctx, s, qpn, h, payload),
            Kind::Fin => {
                for id in fin_ids(&h, payload) {
                    // Only a send's id: a FIN naming another op leaves it be.
                    if !matches!(self.ops.get(&id), Some(Op::Send { .. })) {
                        continue;
                    }
                    let Some(op) = self.ops.remove(&id) else {
                        continue;
                    };
                    let err = (h.status != 0).then(|| {
                        (
                            i32::from(h.status),
                            format!(
                                "{}: the receiver refused the rendezvous (error {})",
                                self.peer_desc(qpn),
                                h.status
                            ),
                        )
                    });
                    self.finish_op(ctx, s, op, err);
                }
            }
            Kind::RmaWrite => self.on_rma_write(ctx, s, qpn, h, payload),
            Kind::RmaWriteAck => {
                if let Some(op @ Op::RmaWrite { .. }) = self.ops.remove(&h.id) {
                    let err = (h.status != 0).then(|| {
                        (
                            i32::from(h.status),
                            format!(
                                "{}: RMA write refused by the target (error {})",
                                self.peer_desc(qpn),
                                h.status
                            ),
                        )
                    });
                    self.finish_op(ctx, s, op, err);
                }
            }
            Kind::RmaReadReq => self.on_rma_read_req(ctx, s, qpn, h),
            Kind::RmaReadResp => self.on_rma_read_resp(ctx, s, qpn, h, payload),
            Kind::AtomicReq => self.on_atomic_req(ctx, s, qpn, h, payload),
            Kind::AtomicResp => self.on_atomic_resp(ctx, s, qpn, h, payload),
        }
    }

    fn on_ordered(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        qpn: u32,
        h: Header,
        payload: &[u8],
    ) {
        let Some(link) = self.links.get_mut(&qpn) else {
            return;
        };
        if h.seq != link.expect_seq {
            if (h.seq.wrapping_sub(link.expect_seq) as i32) > 0 {
                link.reorder.insert(h.seq, (h, payload.to_vec()));
            }
            return;
        }
        link.expect_seq = link.expect_seq.wrapping_add(1);
        self.deliver(ctx, s, qpn, h, payload);
        loop {
            let Some(link) = self.links.get_mut(&qpn) else {
                return;
            };
            let Some((h, p)) = link.reorder.remove(&link.expect_seq) else {
                return;
            };
            link.expect_seq = link.expect_seq.wrapping_add(1);
            self.deliver(ctx, s, qpn, h, &p);
        }
    }

    fn deliver(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        qpn: u32,
        h: Header,
        payload: &[u8],
    ) {
        let peer = self.links[&qpn].peer;
        let src = self.source_of(s, peer);
        let tagged = h.has(FLAG_TAGGED);
        // Once per message: formatted only when debug logging is on.
        if log::debug_enabled() {
            log::debug(&format!(
                "{}: {:?} seq {} tag {:#x} len {} from fi_addr {src:#x}",
                self.peer_desc(qpn),
                h.kind,
                h.seq,
                h.tag,
                h.len
            ));
        }
        let q = if tagged {
            &mut self.tagged
        } else {
            &mut self.msg
        };
        match q.match_posted(src, h.tag) {
            Some(recv) => match h.kind {
                Kind::Rts => self.start_read(ctx, s, recv, src, qpn, h),
                _ => {
                    recv.iov.scatter_from(0, payload);
                    self.complete_recv(s, recv, src, &h, payload.len(), None);
                }
            },
            None => {
                self.counters.unexpected += 1;
                q.push_unexpected(
                    src,
                    h.tag,
                    Unexpected {
                        link: qpn,
                        h,
                        body: payload.to_vec(),
                    },
                );
            }
        }
    }

    fn on_rma_write(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        qpn: u32,
        h: Header,
        payload: &[u8],
    ) {
        let res = s
            .mrs
            .resolve(h.key, h.addr, payload.len() as u64, flags::REMOTE_WRITE)
            .and_then(|(region, off)| {
                region
                    .write_at(off, payload)
                    .ok_or(crate::domain::AccessError::OutOfBounds {
                        key: h.key,
                        addr: h.addr,
                        len: h.len,
                    })
            });
        match res {
            Err(e) => {
                self.counters.rma_denied += 1;
                log::warn(&format!("{}: RMA write refused: {e}", self.peer_desc(qpn)));
                let mut ack = Header::new(Kind::RmaWriteAck);
                ack.id = h.id;
                ack.status = flags::EACCES as u16;
                self.control(ctx, s, qpn, ack, &[]);
            }
            Ok(()) if h.has(FLAG_LAST) => {
                let mut ack = Header::new(Kind::RmaWriteAck);
                ack.id = h.id;
                self.control(ctx, s, qpn, ack, &[]);
                if let Some(c) = self.cntrs.remote_write.and_then(|c| s.cntrs.get_mut(c)) {
                    c.value += 1;
                }
                if h.has(FLAG_CQ_DATA) {
                    let peer = self.links[&qpn].peer;
                    let entry = CqEntry {
                        op_context: 0,
                        flags: flags::RMA | flags::REMOTE_WRITE | flags::REMOTE_CQ_DATA,
                        len: 0,
                        data: h.data,
                        src: self.source_of(s, peer),
                        ..CqEntry::default()
                    };
                    if let Some(q) = self.rx_cq.and_then(|b| s.cqs.get_mut(b.cq)) {
                        q.push(entry);
                    }
                }
            }
            Ok(()) => {}
        }
    }

    fn on_rma_read_req(&mut self, ctx: &mut Context, s: &mut Sinks<'_>, qpn: u32, h: Header) {
        let chunk = self.cfg.eager_limit;
        match s.mrs.resolve(h.key, h.addr, h.len, flags::REMOTE_READ) {
            Err(e) => {
                self.counters.rma_denied += 1;
                log::warn(&format!("{}: RMA read refused: {e}", self.peer_desc(qpn)));
                let mut r = Header::new(Kind::RmaReadResp);
                r.id = h.id;
                r.status = flags::EACCES as u16;
                r.flags = FLAG_LAST;
                self.control(ctx, s, qpn, r, &[]);
            }
            Ok((region, off)) => {
                let total = h.len as usize;
                let mut done = 0usize;
                let mut buf = Vec::with_capacity(chunk.min(total));
                loop {
                    let n = chunk.min(total - done);
                    buf.clear();
                    // In bounds: `resolve` checked the whole range.
                    let _ = region.read_at(off + done as u64, n, &mut buf);
                    let mut r = Header::new(Kind::RmaReadResp);
                    r.id = h.id;
                    r.addr = done as u64;
                    r.len = n as u64;
                    done += n;
                    if done == total {
                        r.flags = FLAG_LAST;
                    }
                    let payload = std::mem::take(&mut buf);
                    self.control(ctx, s, qpn, r, &payload);
                    buf = payload;
                    if done == total {
                        break;
                    }
                }
                if let Some(c) = self.cntrs.remote_read.and_then(|c| s.cntrs.get_mut(c)) {
                    c.value += 1;
                }
            }
        }
    }

    fn on_rma_read_resp(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        qpn: u32,
        h: Header,
        payload: &[u8],
    ) {
        let Some(Op::RmaRead { iov, got, .. }) = self.ops.get_mut(&h.id) else {
            return;
        };
        if h.status == 0
            && let Ok(off) = usize::try_from(h.addr)
        {
            *got += iov.scatter_from(off, payload);
        }
        if h.has(FLAG_LAST) || h.status != 0 {
            let op = self.ops.remove(&h.id).expect("looked up above");
            let err = (h.status != 0).then(|| {
                (
                    i32::from(h.status),
                    format!(
                        "{}: RMA read refused by the target (error {})",
                        self.peer_desc(qpn),
                        h.status
                    ),
                )
            });
            self.finish_op(ctx, s, op, err);
        }
    }

    /// A peer's atomic: apply it and answer with the original values, or
    /// with the reason it was refused.
    fn on_atomic_req(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        qpn: u32,
        h: Header,
        payload: &[u8],
    ) {
        let mut reply = Header::new(Kind::AtomicResp);
        reply.id = h.id;
        match self.apply_atomic(s, &h, payload) {
            Ok((request, original)) => {
                self.counters.atomics_applied += 1;
                reply.len = original.len() as u64;
                self.control(ctx, s, qpn, reply, &original);
                // fi_endpoint(3): fetch and compare atomics count as remote
                // reads, base atomics as remote writes.
                let (cntr, remote) = if request.call.fetches() {
                    (self.cntrs.remote_read, flags::REMOTE_READ)
                } else {
                    (self.cntrs.remote_write, flags::REMOTE_WRITE)
                };
                if let Some(c) = cntr.and_then(|c| s.cntrs.get_mut(c)) {
                    c.value += 1;
                }
                if h.has(FLAG_CQ_DATA) {
                    let peer = self.links[&qpn].peer;
                    let entry = CqEntry {
                        op_context: 0,
                        flags: flags::ATOMIC | remote | flags::REMOTE_CQ_DATA,
                        data: h.data,
                        src: self.source_of(s, peer),
                        ..CqEntry::default()
                    };
                    if let Some(q) = self.rx_cq.and_then(|b| s.cqs.get_mut(b.cq)) {
                        q.push(entry);
                    }
                }
            }
            Err((code, why)) => {
                self.counters.atomics_refused += 1;
                log::warn(&format!("{}: atomic refused: {why}", self.peer_desc(qpn)));
                reply.status = u16::try_from(code).unwrap_or(flags::EIO as u16);
                // The reason travels back for the initiator's error entry.
                let mut text = why.into_bytes();
                text.truncate(self.cfg.eager_limit.min(512));
                reply.len = text.len() as u64;
                self.control(ctx, s, qpn, reply, &text);
            }
        }
    }

    /// Check a peer's atomic against the region its key names and apply
    /// it; the request and the original values it fetches.
    fn apply_atomic(
        &self,
        s: &Sinks<'_>,
        h: &Header,
        payload: &[u8],
    ) -> Result<(atomic::Request, Vec<u8>), (i32, String)> {
        let request = atomic::Request::from_wire(h.tag, self.cfg.eager_limit)
            .map_err(|e| (e.fi_errno(), e.to_string()))?;
        if payload.len() != request.payload_bytes() {
            return Err((
                flags::EINVAL,
                format!(
                    "{} payload bytes for {} elements of {} ({} expected)",
                    payload.len(),
                    request.count,
                    request.datatype.name(),
                    request.payload_bytes()
                ),
            ));
        }
        let n = request.target_bytes();
        let (region, off) = s
            .mrs
            .resolve(h.key, h.addr, n as u64, request.access_needed())
            .map_err(|e| (flags::EACCES, e.to_string()))?;
        let oob = || {
            (
                flags::EACCES,
                crate::domain::AccessError::OutOfBounds {
                    key: h.key,
                    addr: h.addr,
                    len: n as u64,
                }
                .to_string(),
            )
        };
        // Read, compute and write back before any other atomic of this
        // process runs (`atomic`'s atomicity).
        let _serial = atomic::TARGET_LOCK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut elements = Vec::with_capacity(n);
        region.read_at(off, n, &mut elements).ok_or_else(oob)?;
        let original = if request.call.fetches() {
            elements.clone()
        } else {
            Vec::new()
        };
        if request.op.modifies() {
            request
                .apply(&mut elements, payload)
                .map_err(|e| (e.fi_errno(), e.to_string()))?;
            region.write_at(off, &elements).ok_or_else(oob)?;
        }
        Ok((request, original))
    }

    /// The target's reply to an atomic: the original values land in the
    /// result buffers before the completion is written.
    fn on_atomic_resp(
        &mut self,
        ctx: &mut Context,
        s: &mut Sinks<'_>,
        qpn: u32,
        h: Header,
        payload: &[u8],
    ) {
        if !matches!(self.ops.get(&h.id), Some(Op::Atomic { .. })) {
            return;
        }
        let op = self.ops.remove(&h.id).expect("looked up above");
        let Op::Atomic {
            request,
            ref result,
            addr,
            key,
            ..
        } = op
        else {
            return;
        };
        let what = format!(
            "{}: atomic {} on {} (count {} at {addr:#x}, key {key:#x})",
            self.peer_desc(qpn),
            request.op.name(),
            request.datatype.name(),
            request.count
        );
        let err = if h.status != 0 {
            Some((
                i32::from(h.status),
                format!(
                    "{what} refused by the target: {}",
                    String::from_utf8_lossy(payload)
                ),
            ))
        } else if request.call.fetches() && payload.len() != request.target_bytes() {
            Some((
                flags::EIO,
                format!(
                    "{what}: the target answered with {} bytes of original values, not {}",
                    payload.len(),
                    request.target_bytes()
                ),
            ))
        } else {
            if request.call.fetches() {
                result.scatter_from(0, payload);
            }
            None
        };
        self.finish_op(ctx, s, op, err);
    }

    /// Counters for the close-time report.
    pub(crate) fn summary(&self) -> String {
        let st = self.dev.stats();
        let e = st.endpoint;
        let c = self.counters;
        format!(
            "endpoint {}: MetaRoCE data packets sent {}, resent {}, lost {}, RTOs {}, tail probes {}, repair packets sent {} / packets rebuilt {}, paths retired {}, \
             ACKs sent {}, received datagrams {} (duplicates {}, unknown QP {}, stale path {}, out of window {}), progress gaps over 200 us {}, \
             ECN-marked {}, impairment drops {}; provider: eager {}, rendezvous sent {} ({} in place) / received {} ({} in place), unexpected {}, malformed {}, \
             RMA refused {}, atomics applied {} / refused {}, connections out {} / in {}; \
             unmatched at close: {} receives, {} unexpected",
            self.name,
            e.data_packets_sent,
            e.data_packets_retransmitted,
            e.data_packets_lost,
            e.rtos,
            e.tail_probes,
            e.repair_packets_sent,
            e.rx_repaired_packets,
            e.paths_replaced,
            e.ack_packets_sent,
            e.rx_datagrams,
            e.rx_duplicates,
            e.rx_unknown_qp,
            e.rx_stale_path,
            e.rx_out_of_window,
            st.io.progress_gaps_over_200us,
            st.io.rx_queue_ce_marks,
            st.io.impair_dropped,
            c.eager_sent,
            c.rndv_sent,
            c.rndv_sent_in_place,
            c.rndv_received,
            c.rndv_received_in_place,
            c.unexpected,
            c.malformed,
            c.rma_denied,
            c.atomics_applied,
            c.atomics_refused,
            c.connections_out,
            c.connections_in,
            self.msg.posted_len() + self.tagged.posted_len(),
            self.msg.unexpected_len() + self.tagged.unexpected_len(),
        )
    }
}
