//! The MetaRoCE verbs API: what an ibverbs user expects, over the sans-IO core.
//!
//! The object model and the vocabulary are ibverbs': a [`Context`] (an open
//! device) gives protection domains, memory regions with lkey/rkey and access
//! flags, completion queues polled into a slice of [`WorkCompletion`]s, and
//! RC queue pairs that walk RESET → INIT → RTR → RTS (→ ERR) through
//! [`Context::modify_qp`] with the attribute checks of `ibv_modify_qp`.
//!
//! Like the core, a `Context` is sans-IO: whoever owns it (the UDP datapath's
//! progress engine, the simulator, the test harness) feeds it datagrams and
//! time with [`Context::handle_datagram`] / [`Context::handle_timeout`] and
//! drains [`Context::poll_transmit`]. The application's calls take no clock:
//! the driver owns time. Completions are routed to the QP's send or receive
//! CQ as they happen; a CQ armed with [`Context::req_notify_cq`] puts an
//! event on the completion channel ([`Context::poll_cq_event`]) that the
//! driver turns into a wake-up for a blocked waiter.
//!
//! Everything a driver or an application needs is here: the core's types
//! that these signatures use are re-exported, so neither needs to depend on
//! `metaroce-proto` or `metaroce-wire`.
//!
//! # Example: a WRITE between two contexts, moved by hand
//!
//! Two devices at 10.0.0.1 and 10.0.0.2, no sockets: the loop at the end
//! is the whole "network", handing each datagram from one context to the
//! other. (Over real UDP, `metaroce_udp::Device` does this part; see
//! `crates/udp/examples`.)
//!
//! ```
//! use metaroce_proto::{EndpointConfig, QpCaps};
//! use metaroce_verbs::{
//!     AccessFlags, Context, QpAttr, QpInitAttr, QpState, QpType, SendWr, WcOpcode, WcStatus,
//!     WorkCompletion, WrOp,
//! };
//! use std::net::{IpAddr, SocketAddr};
//!
//! let ip: [IpAddr; 2] = ["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
//! let mut dev: Vec<Context> = (0..2u64)
//!     .map(|seed| Context::open(EndpointConfig { seed, ..EndpointConfig::default() }).unwrap())
//!     .collect();
//! let addr = |i: usize, d: &Context| SocketAddr::new(ip[i], d.device_port());
//! let access = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);
//!
//! // Each side: PD, 64 KiB region, CQ, one RC QP in INIT.
//! let mut side = Vec::new();
//! for d in &mut dev {
//!     let pd = d.alloc_pd();
//!     let mr = d.reg_mr(pd, 65_536, access).unwrap();
//!     let cq = d.create_cq(16).unwrap();
//!     let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4 };
//!     let init = QpInitAttr { send_cq: cq, recv_cq: cq, cap, qp_type: QpType::Rc, sq_sig_all: false };
//!     let qp = d.create_qp(pd, &init).unwrap();
//!     let to_init = QpAttr {
//!         qp_state: Some(QpState::Init),
//!         qp_access_flags: Some(access),
//!         port_num: Some(1),
//!         ..QpAttr::default()
//!     };
//!     d.modify_qp(qp, &to_init).unwrap();
//!     side.push((mr, cq, qp));
//! }
//! // INIT -> RTR (toward the peer's address and QP) -> RTS, on both sides.
//! for i in 0..2 {
//!     let (peer_addr, peer_qpn) = (addr(1 - i, &dev[1 - i]), side[1 - i].2.qp_num());
//!     let rtr = QpAttr {
//!         qp_state: Some(QpState::Rtr),
//!         dest_addr: Some(peer_addr),
//!         dest_qp_num: Some(peer_qpn),
//!         path_mtu: Some(4096),
//!         ..QpAttr::default()
//!     };
//!     let rts = QpAttr {
//!         qp_state: Some(QpState::Rts),
//!         timeout: Some(14),
//!         retry_cnt: Some(7),
//!         rnr_retry: Some(7),
//!         ..QpAttr::default()
//!     };
//!     dev[i].modify_qp(side[i].2, &rtr).unwrap();
//!     dev[i].modify_qp(side[i].2, &rts).unwrap();
//! }
//!
//! // Device 0 writes "hello" into device 1's region.
//! let (mr0, cq0, qp0) = side[0];
//! let mr1 = side[1].0;
//! dev[0].mr_bytes_mut(&mr0)[..5].copy_from_slice(b"hello");
//! let wr = SendWr::new(1, WrOp::Write { remote_addr: mr1.addr, rkey: mr1.rkey }, vec![mr0.sge(0, 5)]);
//! dev[0].post_send_at(0, qp0, &[wr]).unwrap();
//!
//! // The network: move datagrams until device 0 sees the completion.
//! let mut wc = [WorkCompletion {
//!     wr_id: 0, status: WcStatus::Success, opcode: WcOpcode::Send,
//!     byte_len: 0, imm_data: None, qp_num: 0, src_qp: 0,
//! }];
//! let (mut buf, mut now) = (vec![0u8; 65_536], 0u64);
//! while dev[0].poll_cq(cq0, &mut wc).unwrap() == 0 {
//!     for from in 0..2 {
//!         while let Some(t) = dev[from].poll_transmit(now, &mut buf) {
//!             let src = SocketAddr::new(ip[from], t.src_port);
//!             dev[1 - from].handle_datagram(now, src, t.ecn, &buf[..t.len]);
//!         }
//!     }
//!     now += 1_000; // 1 us per round; the core's timers run on this clock
//!     for d in &mut dev {
//!         if d.poll_timeout().is_some_and(|t| t <= now) {
//!             d.handle_timeout(now);
//!         }
//!     }
//!     assert!(now < 1_000_000_000, "no completion");
//! }
//! assert_eq!(wc[0].status, WcStatus::Success);
//! assert_eq!(&dev[1].mr_bytes(&mr1)[..5], b"hello");
//! ```
//!
//! Differences from ibverbs, all deliberate:
//! - keys are 64 bits (`lkey`, `rkey`), random, so a peer cannot guess them;
//! - a region's bytes are owned by the context ([`Context::mr_bytes`]); the
//!   application reads and writes them there (no raw pointers);
//! - the transport retry budget (`retry_cnt`, `timeout`) belongs to the
//!   connection to a peer, which all QPs toward that peer share; per-QP values
//!   are range-checked like ibverbs' but the endpoint config decides;
//! - a QP that reached ERR cannot be reset; create a new one.
#![forbid(unsafe_code)]

mod cq;
mod query;

pub use cq::{CompletionQueue, MAX_CQ, MAX_CQE};
pub use query::{AtomicCap, DeviceAttr, PortAttr, PortState};

use cq::CqTable;
use metaroce_proto::fast_map::FastMap;
use metaroce_proto::{Completion, Endpoint, MrHandle, QpHandle, QpRunState, WorkQueue};
use std::collections::HashMap;
use std::net::SocketAddr;

pub use metaroce_proto::{
    AccessFlags, AuthConfig, CcMetrics, ConfigError, ConnectionStats, Counters,
    DEFAULT_DEVICE_PORT, DirectTarget, Ecn, EndpointConfig, EndpointStats, Layout,
    MAX_PATH_BURST_BYTES, MemoryError, PacketKind, PathStats, PayloadRef, PeerCounters, PostError,
    QpCaps, QpError, RecvWr, RegionMemory, RxPathStats, SendWr, Sge, Transmit, WcOpcode, WcStatus,
    WorkCompletion, WrOp, format_counter_lines,
};

/// A verbs call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// The device config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A memory registration or key failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A post was refused.
    #[error(transparent)]
    Post(#[from] PostError),
    /// A QP operation failed in the core.
    #[error(transparent)]
    Qp(#[from] QpError),
    /// No such object (CQ, QP, PD).
    #[error("unknown {0}")]
    Unknown(&'static str),
    /// The object is still in use (a PD with regions or QPs, a CQ that a
    /// QP completes into): ibverbs' `EBUSY`.
    #[error("{0} is in use")]
    Busy(&'static str),
    /// `modify_qp` asked for a transition ibverbs does not allow.
    #[error("invalid QP transition {from:?} -> {to:?}")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute for the transition is missing.
    #[error("modify_qp to {to:?} needs attribute {attr}")]
    MissingAttribute {
        /// Requested state.
        to: QpState,
        /// The missing attribute.
        attr: &'static str,
    },
    /// An attribute is out of range.
    #[error("attribute {attr} out of range: {reason}")]
    BadAttribute {
        /// The attribute.
        attr: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// The QP is not in a state that allows this call.
    #[error("QP {qpn:#x} is in state {state:?}")]
    WrongState {
        /// The QP.
        qpn: u32,
        /// Its state.
        state: QpState,
    },
    /// The CQ overflowed: completions were lost and the CQ is unusable
    /// (ibverbs raises `IBV_EVENT_CQ_ERR`).
    #[error("completion queue overrun")]
    CqOverrun,
    /// `path_mtu` makes datagrams larger than the path to the peer carries
    /// without IP fragmentation (the driver told the context the path's
    /// limit with [`Context::set_path_max_datagram`]).
    #[error(
        "path_mtu {path_mtu}: the path to {dest} carries at most {max_payload} payload bytes per packet \
         ({max_datagram}-byte datagrams); a {path_mtu}-byte payload makes {datagram}-byte datagrams, which would be fragmented"
    )]
    PathMtuTooLarge {
        /// The peer.
        dest: SocketAddr,
        /// The payload MTU asked for.
        path_mtu: u32,
        /// The datagram it makes.
        datagram: usize,
        /// The largest datagram the path carries.
        max_datagram: usize,
        /// The largest payload that fits.
        max_payload: u32,
    },
}

/// A protection domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProtectionDomain(u32);

/// A registered memory region: its keys, its address range in the
/// device's address space, and the rights it grants. Work requests name
/// parts of it by [`Sge`]s ([`MemoryRegion::sge`]); a peer names it by
/// `addr` and `rkey`.
///
/// ```
/// use metaroce_proto::EndpointConfig;
/// use metaroce_verbs::{AccessFlags, Context};
///
/// let mut ctx = Context::open(EndpointConfig::default()).unwrap();
/// let pd = ctx.alloc_pd();
/// let access = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_READ.0);
/// let mr = ctx.reg_mr(pd, 4096, access).unwrap();
/// // Bytes 1024..1536 of the region, for a work request's gather list.
/// let sge = mr.sge(1024, 512);
/// assert_eq!((sge.addr, sge.length, sge.lkey), (mr.addr + 1024, 512, mr.lkey));
/// // The application reads and writes the region through the context.
/// ctx.mr_bytes_mut(&mr)[1024..1029].copy_from_slice(b"bytes");
/// assert_eq!(&ctx.mr_bytes(&mr)[1024..1029], b"bytes");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRegion {
    handle: MrHandle,
    /// Local key for SGEs.
    pub lkey: u64,
    /// Remote key to give to peers.
    pub rkey: u64,
    /// First address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// Access rights.
    pub access: AccessFlags,
}

impl MemoryRegion {
    /// An SGE covering `len` bytes at `offset` into the region.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset,
            length: len,
            lkey: self.lkey,
        }
    }
}

/// A queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueuePair(QpHandle);

impl QueuePair {
    /// The QP number to give to the peer.
    pub fn qp_num(&self) -> u32 {
        self.0.qpn()
    }
}

/// ibverbs QP states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained (not used by MetaRoCE; accepted as a query result only).
    Sqd,
    /// Send queue error (UC/UD only).
    Sqe,
    /// Error: everything flushes.
    Err,
}

/// QP types. MetaRoCE implements reliable connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QpType {
    /// Reliable connected.
    #[default]
    Rc,
}

/// `ibv_qp_init_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// CQ for send completions.
    pub send_cq: CompletionQueue,
    /// CQ for receive completions.
    pub recv_cq: CompletionQueue,
    /// Queue sizes.
    pub cap: QpCaps,
    /// Transport type.
    pub qp_type: QpType,
    /// Every send request is signaled.
    pub sq_sig_all: bool,
}

/// `ibv_qp_attr`: set what the transition needs, leave the rest `None`.
///
/// | transition | required |
/// |---|---|
/// | RESET → INIT | `qp_access_flags`, `port_num` (1) |
/// | INIT → RTR | `dest_addr`, `dest_qp_num`, `path_mtu` (64 up to the device's MTU) |
/// | RTR → RTS | `timeout` (0..=31), `retry_cnt` (0..=7), `rnr_retry` (0..=7) |
/// | any → ERR | nothing |
///
/// ```
/// use metaroce_proto::{EndpointConfig, QpCaps};
/// use metaroce_verbs::{AccessFlags, Context, QpAttr, QpInitAttr, QpState, QpType, VerbsError};
///
/// let mut ctx = Context::open(EndpointConfig::default()).unwrap();
/// let pd = ctx.alloc_pd();
/// let cq = ctx.create_cq(16).unwrap();
/// let cap = QpCaps { max_send_wr: 8, max_recv_wr: 8 };
/// let init = QpInitAttr { send_cq: cq, recv_cq: cq, cap, qp_type: QpType::Rc, sq_sig_all: false };
/// let qp = ctx.create_qp(pd, &init).unwrap();
/// let to = |state| QpAttr { qp_state: Some(state), ..QpAttr::default() };
///
/// // A transition without its attributes is refused, naming what is missing.
/// let err = ctx.modify_qp(qp, &to(QpState::Init)).unwrap_err();
/// assert!(matches!(err, VerbsError::MissingAttribute { attr: "qp_access_flags", .. }));
///
/// let access = AccessFlags::REMOTE_WRITE;
/// ctx.modify_qp(qp, &QpAttr { qp_access_flags: Some(access), port_num: Some(1), ..to(QpState::Init) })
///     .unwrap();
/// let peer = "10.0.0.2:4793".parse().unwrap();
/// ctx.modify_qp(qp, &QpAttr {
///     dest_addr: Some(peer),
///     dest_qp_num: Some(0x10000),
///     path_mtu: Some(4096),
///     ..to(QpState::Rtr)
/// })
/// .unwrap();
/// ctx.modify_qp(qp, &QpAttr {
///     timeout: Some(14),
///     retry_cnt: Some(7),
///     rnr_retry: Some(7),
///     ..to(QpState::Rts)
/// })
/// .unwrap();
/// assert_eq!(ctx.qp_state(qp), Some(QpState::Rts));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// Target state (required).
    pub qp_state: Option<QpState>,
    /// INIT: remote operations the QP accepts.
    pub qp_access_flags: Option<AccessFlags>,
    /// INIT: port number (1).
    pub port_num: Option<u8>,
    /// RTR: the peer device's address (IP and MetaRoCE device port).
    pub dest_addr: Option<SocketAddr>,
    /// RTR: the peer's QP number.
    pub dest_qp_num: Option<u32>,
    /// RTR: path MTU, payload bytes per packet (64 up to the device's):
    /// the QP's messages, and the READ responses it returns, are cut into
    /// packets of this size.
    pub path_mtu: Option<u32>,
    /// RTS: ACK timeout exponent (4.096 us x 2^timeout), 0..=31.
    pub timeout: Option<u8>,
    /// RTS: transport retries, 0..=7.
    pub retry_cnt: Option<u8>,
    /// RTS: RNR retries, 0..=7 (7 = infinite).
    pub rnr_retry: Option<u8>,
}

#[derive(Debug)]
struct QpMeta {
    pd: ProtectionDomain,
    init: QpInitAttr,
    state: QpState,
}

/// An open MetaRoCE device (`ibv_context`), sans-IO: the owner feeds it
/// datagrams ([`Context::handle_datagram`]) and time
/// ([`Context::handle_timeout`] when [`Context::poll_timeout`] is due),
/// and sends what [`Context::poll_transmit`] gives. The crate
/// documentation has a whole WRITE driven this way; over real sockets
/// `metaroce_udp::Device` owns the context and does the driving.
///
/// ```
/// use metaroce_proto::EndpointConfig;
/// use metaroce_verbs::Context;
///
/// let ctx = Context::open(EndpointConfig { device_port: 4793, ..EndpointConfig::default() })
///     .unwrap();
/// assert_eq!(ctx.device_port(), 4793);
/// // A bad configuration is an error, not a panic.
/// assert!(Context::open(EndpointConfig { mtu_payload_bytes: 0, ..EndpointConfig::default() })
///     .is_err());
/// ```
#[derive(Debug)]
pub struct Context {
    endpoint: Endpoint,
    cqs: CqTable,
    qps: FastMap<QpHandle, QpMeta>,
    pds: Vec<ProtectionDomain>,
    /// The largest datagram (UDP payload) each peer's path carries
    /// unfragmented, as the driver learned it; no entry: no limit known.
    path_max_datagram: HashMap<SocketAddr, usize>,
}

impl Context {
    /// Open a device with this configuration.
    pub fn open(config: EndpointConfig) -> Result<Self, VerbsError> {
        Ok(Self {
            endpoint: Endpoint::new(config)?,
            cqs: CqTable::default(),
            qps: FastMap::default(),
            pds: Vec::new(),
            path_max_datagram: HashMap::new(),
        })
    }

    /// The driver's word on the path to `dest`: it carries datagrams (UDP
    /// payloads) of at most `max_datagram_bytes` without IP fragmentation
    /// (the path MTU less the IP and UDP headers). `modify_qp` to RTR then
    /// refuses a `path_mtu` whose packets would not fit
    /// ([`VerbsError::PathMtuTooLarge`]); [`max_payload_to`](Self::max_payload_to)
    /// says what does. Call again when the path MTU changes.
    pub fn set_path_max_datagram(&mut self, dest: SocketAddr, max_datagram_bytes: usize) {
        self.path_max_datagram.insert(dest, max_datagram_bytes);
    }

    /// Send data packets toward the peer device at `dest` without their
    /// ICRC (`true`) or with it: see
    /// [`Endpoint::set_peer_icrc_omission`](metaroce_proto::Endpoint::set_peer_icrc_omission).
    pub fn set_peer_icrc_omission(&mut self, dest: SocketAddr, omit: bool) {
        self.endpoint.set_peer_icrc_omission(dest, omit);
    }

    /// The largest payload per packet toward `dest`: the device MTU, lowered
    /// to what the path carries if the driver said
    /// ([`set_path_max_datagram`](Self::set_path_max_datagram)).
    pub fn max_payload_to(&self, dest: SocketAddr) -> u32 {
        let device = self.endpoint.config().mtu_payload_bytes;
        match self.path_max_datagram.get(&dest) {
            Some(&max) => device.min(self.endpoint.payload_for_datagram_len(max)),
            None => device,
        }
    }

    /// The protocol endpoint underneath (stats, configuration).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Counters.
    pub fn stats(&self) -> &EndpointStats {
        self.endpoint.stats()
    }

    /// Every counter of the device, its connections and their paths
    /// ([`Counters::lines`] names them the way `metaroce perf --stats`
    /// prints them).
    pub fn counters(&self) -> Counters {
        self.endpoint.counters()
    }

    /// The device's address as peers must name it: its IP and device port.
    pub fn device_port(&self) -> u16 {
        self.endpoint.config().device_port
    }

    /// This device's session id, which the connection manager sends to
    /// peers along with QP numbers (it goes into packet keys when the
    /// config has `auth`; see `Endpoint::session_id`).
    pub fn session_id(&self) -> u64 {
        self.endpoint.session_id()
    }

    /// Record the session id the connection manager received from the peer
    /// device at `peer`; with `auth` configured, moving a QP toward that
    /// peer to RTR needs it (see `Endpoint::set_peer_session`).
    pub fn set_peer_session(
        &mut self,
        peer: SocketAddr,
        session_id: u64,
    ) -> Result<(), VerbsError> {
        Ok(self.endpoint.set_peer_session(peer, session_id)?)
    }

    /// The share of this device's line it promises each of `senders` peers
    /// when their QPs are connected (bits/s; 0: the whole line, no cap),
    /// for the connection manager to send them (see
    /// `Endpoint::setup_grant_bps`).
    pub fn setup_grant_bps(&self, senders: u32) -> u64 {
        self.endpoint.setup_grant_bps(senders)
    }

    /// The peer device at `peer` promised this device `rate_bps` (0: the
    /// whole line) when their QPs were connected: a connection that has
    /// sent nothing starts at it instead of a cold round trip (see
    /// `Endpoint::take_setup_grant`). Call after moving a QP toward the
    /// peer to RTR.
    pub fn take_setup_grant(
        &mut self,
        peer: SocketAddr,
        rate_bps: u64,
        now_ns: u64,
    ) -> Result<(), VerbsError> {
        Ok(self.endpoint.take_setup_grant(peer, rate_bps, now_ns)?)
    }

    /// `ibv_query_device`: the device's limits.
    pub fn query_device(&self) -> DeviceAttr {
        let cfg = self.endpoint.config();
        DeviceAttr {
            max_qp: cfg.max_queue_pairs,
            max_qp_wr: cfg.max_send_wr.min(cfg.max_recv_wr),
            max_send_wr: cfg.max_send_wr,
            max_recv_wr: cfg.max_recv_wr,
            max_sge: u32::MAX,
            max_cq: MAX_CQ,
            max_cqe: MAX_CQE as u32,
            max_mr: cfg.max_memory_regions,
            max_mr_size: metaroce_proto::memory::MAX_REGION_BYTES.min(cfg.max_registered_bytes),
            atomic_cap: AtomicCap::Glob,
            max_connections: cfg.max_connections,
            phys_port_cnt: 1,
        }
    }

    /// `ibv_query_port`: the link of port `port_num` (the device has port 1).
    pub fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError> {
        if port_num != 1 {
            return Err(VerbsError::BadAttribute {
                attr: "port_num",
                reason: "the device has port 1 only",
            });
        }
        let cfg = self.endpoint.config();
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu_bytes: cfg.mtu_payload_bytes,
            active_mtu_bytes: cfg.mtu_payload_bytes,
            max_msg_bytes: cfg.max_message_bytes,
            link_rate_bps: cfg.line_rate_bps,
            device_port: cfg.device_port,
            paths_per_connection: cfg.paths_per_connection,
        })
    }

    // --------------------------------------------------------------- objects

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self) -> ProtectionDomain {
        let pd = ProtectionDomain(self.endpoint.alloc_pd());
        self.pds.push(pd);
        pd
    }

    /// `ibv_dealloc_pd`; refused while a memory region or a QP lives in it.
    pub fn dealloc_pd(&mut self, pd: ProtectionDomain) -> Result<(), VerbsError> {
        self.check_pd(pd)?;
        if self.endpoint.pd_in_use(pd.0) {
            return Err(VerbsError::Busy("protection domain"));
        }
        self.pds.retain(|&p| p != pd);
        Ok(())
    }

    /// `ibv_reg_mr`: a zeroed region of `length` bytes.
    pub fn reg_mr(
        &mut self,
        pd: ProtectionDomain,
        length: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.check_pd(pd)?;
        Ok(Self::region(
            self.endpoint.register_memory(pd.0, length, access)?,
        ))
    }

    /// A region over memory the caller lends for as long as the region is
    /// registered (what `ibv_reg_mr` of application memory is; the plain
    /// [`reg_mr`](Self::reg_mr) allocates). Its length is the memory's.
    pub fn reg_external_mr(
        &mut self,
        pd: ProtectionDomain,
        memory: Box<dyn RegionMemory>,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.check_pd(pd)?;
        Ok(Self::region(
            self.endpoint
                .register_external_memory(pd.0, memory, access)?,
        ))
    }

    /// A region with a length and no bytes (for the simulator).
    pub fn reg_virtual_mr(
        &mut self,
        pd: ProtectionDomain,
        length: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.check_pd(pd)?;
        Ok(Self::region(
            self.endpoint
                .register_virtual_memory(pd.0, length, access)?,
        ))
    }

    fn region(info: metaroce_proto::MrInfo) -> MemoryRegion {
        MemoryRegion {
            handle: info.handle,
            lkey: info.lkey,
            rkey: info.rkey,
            addr: info.addr,
            length: info.length,
            access: info.access,
        }
    }

    fn check_pd(&self, pd: ProtectionDomain) -> Result<(), VerbsError> {
        if self.pds.contains(&pd) {
            Ok(())
        } else {
            Err(VerbsError::Unknown("protection domain"))
        }
    }

    /// `ibv_dereg_mr`.
    pub fn dereg_mr(&mut self, mr: MemoryRegion) -> Result<(), VerbsError> {
        Ok(self.endpoint.deregister_memory(mr.handle)?)
    }

    /// The region's bytes.
    pub fn mr_bytes(&self, mr: &MemoryRegion) -> &[u8] {
        self.endpoint.memory(mr.handle).unwrap_or(&[])
    }

    /// The region's bytes, writable (fill a source buffer before posting).
    pub fn mr_bytes_mut(&mut self, mr: &MemoryRegion) -> &mut [u8] {
        self.endpoint.memory_mut(mr.handle).unwrap_or(&mut [])
    }

    /// The bytes of several distinct regions at once, all writable, for
    /// local computation from one region into another (a reduction reading
    /// a receive region and writing a result region). `None` when a region
    /// is deregistered or virtual, or the same region is named twice.
    pub fn mr_bytes_disjoint_mut<const N: usize>(
        &mut self,
        mrs: [&MemoryRegion; N],
    ) -> Option<[&mut [u8]; N]> {
        self.endpoint.memory_disjoint_mut(mrs.map(|m| m.handle))
    }

    /// `ibv_create_cq` with room for `cqe` completions.
    pub fn create_cq(&mut self, cqe: usize) -> Result<CompletionQueue, VerbsError> {
        self.cqs.create(cqe)
    }

    /// `ibv_destroy_cq`; refused while a QP completes into it.
    pub fn destroy_cq(&mut self, cq: CompletionQueue) -> Result<(), VerbsError> {
        if !self.cqs.exists(cq) {
            return Err(VerbsError::Unknown("completion queue"));
        }
        let used = self
            .qps
            .values()
            .any(|m| m.init.send_cq == cq || m.init.recv_cq == cq);
        if used {
            return Err(VerbsError::Busy("completion queue"));
        }
        self.cqs.destroy(cq)
    }

    /// `ibv_poll_cq`: move up to `wc.len()` completions into `wc`, oldest
    /// first; returns how many.
    pub fn poll_cq(
        &mut self,
        cq: CompletionQueue,
        wc: &mut [WorkCompletion],
    ) -> Result<usize, VerbsError> {
        self.dispatch_completions();
        self.cqs.poll(cq, wc)
    }

    /// Whether `cq` holds a completion a poll would return (or an overrun
    /// it would report): a driver checks it before it blocks a thread that
    /// polls `cq`. An unknown CQ answers true, so the poll reports it.
    pub fn cq_has_completions(&mut self, cq: CompletionQueue) -> bool {
        self.dispatch_completions();
        self.cqs.has_completions(cq)
    }

    /// `ibv_req_notify_cq`: arm `cq` so that its next completion (with
    /// `solicited_only`: its next solicited receive completion, or any
    /// completion in error) puts one event on the completion channel. The
    /// arm is one-shot; completions already in the CQ do not fire it.
    pub fn req_notify_cq(
        &mut self,
        cq: CompletionQueue,
        solicited_only: bool,
    ) -> Result<(), VerbsError> {
        self.dispatch_completions();
        self.cqs.arm(cq, solicited_only)
    }

    /// `ibv_get_cq_event` without blocking: the CQ of the oldest event on
    /// the completion channel, if any. A driver blocks on it for the
    /// application (the UDP device's `get_cq_event`).
    pub fn poll_cq_event(&mut self) -> Option<CompletionQueue> {
        self.dispatch_completions();
        self.cqs.next_event()
    }

    /// Whether the completion channel has an event: a driver checks it
    /// after every input, and wakes a blocked waiter when it does.
    pub fn has_cq_events(&self) -> bool {
        self.cqs.has_events()
    }

    /// `ibv_create_qp` (RC).
    pub fn create_qp(
        &mut self,
        pd: ProtectionDomain,
        init: &QpInitAttr,
    ) -> Result<QueuePair, VerbsError> {
        self.check_pd(pd)?;
        for cq in [init.send_cq, init.recv_cq] {
            if !self.cqs.exists(cq) {
                return Err(VerbsError::Unknown("completion queue"));
            }
        }
        let handle = self.endpoint.create_qp(pd.0, init.cap, AccessFlags::NONE)?;
        self.qps.insert(
            handle,
            QpMeta {
                pd,
                init: *init,
                state: QpState::Reset,
            },
        );
        Ok(QueuePair(handle))
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&mut self, qp: QueuePair) -> Result<(), VerbsError> {
        self.qps
            .remove(&qp.0)
            .ok_or(VerbsError::Unknown("queue pair"))?;
        self.endpoint.destroy_qp(qp.0)?;
        Ok(())
    }

    /// `ibv_query_qp`'s state: the core may have moved a QP to ERR on its own
    /// (a failed operation, an unreachable peer).
    pub fn qp_state(&self, qp: QueuePair) -> Option<QpState> {
        let meta = self.qps.get(&qp.0)?;
        match self.endpoint.qp_state(qp.0)? {
            QpRunState::Error => Some(QpState::Err),
            _ => Some(meta.state),
        }
    }

    /// `ibv_modify_qp`: one transition, all-or-nothing, with the attributes
    /// ibverbs requires for it.
    pub fn modify_qp(&mut self, qp: QueuePair, attr: &QpAttr) -> Result<(), VerbsError> {
        let from = self.qp_state(qp).ok_or(VerbsError::Unknown("queue pair"))?;
        let to = attr.qp_state.ok_or(VerbsError::MissingAttribute {
            to: from,
            attr: "qp_state",
        })?;
        let missing = |attr| VerbsError::MissingAttribute { to, attr };
        match (from, to) {
            (_, QpState::Err) => {
                self.endpoint.set_qp_error(qp.0)?;
            }
            (QpState::Reset, QpState::Init) => {
                let access = attr.qp_access_flags.ok_or(missing("qp_access_flags"))?;
                check_qp_access(access)?;
                if attr.port_num.ok_or(missing("port_num"))? != 1 {
                    return Err(VerbsError::BadAttribute {
                        attr: "port_num",
                        reason: "the device has port 1 only",
                    });
                }
                self.endpoint.set_qp_remote_access(qp.0, access)?;
            }
            (QpState::Init, QpState::Init) => {
                if let Some(access) = attr.qp_access_flags {
                    check_qp_access(access)?;
                    self.endpoint.set_qp_remote_access(qp.0, access)?;
                }
            }
            (QpState::Init, QpState::Rtr) => {
                let dest = attr.dest_addr.ok_or(missing("dest_addr"))?;
                let dest_qpn = attr.dest_qp_num.ok_or(missing("dest_qp_num"))?;
                let mtu = attr.path_mtu.ok_or(missing("path_mtu"))?;
                if mtu < 64 || mtu > self.endpoint.config().mtu_payload_bytes {
                    return Err(VerbsError::BadAttribute {
                        attr: "path_mtu",
                        reason: "below 64 or above the device MTU",
                    });
                }
                if let Some(&max_datagram) = self.path_max_datagram.get(&dest) {
                    let datagram = self.endpoint.datagram_len_for_payload(mtu);
                    if datagram > max_datagram {
                        return Err(VerbsError::PathMtuTooLarge {
                            dest,
                            path_mtu: mtu,
                            datagram,
                            max_datagram,
                            max_payload: self.endpoint.payload_for_datagram_len(max_datagram),
                        });
                    }
                }
                // The QP's messages are cut into packets of this size (not
                // the device's MTU, which the peer or the path may not take).
                self.endpoint.set_qp_path_mtu(qp.0, mtu)?;
                self.endpoint.connect_qp(qp.0, dest, dest_qpn)?;
            }
            (QpState::Rtr, QpState::Rts) => {
                let timeout = attr.timeout.ok_or(missing("timeout"))?;
                let retry = attr.retry_cnt.ok_or(missing("retry_cnt"))?;
                let rnr = attr.rnr_retry.ok_or(missing("rnr_retry"))?;
                if timeout > 31 || retry > 7 || rnr > 7 {
                    return Err(VerbsError::BadAttribute {
                        attr: "timeout/retry_cnt/rnr_retry",
                        reason: "timeout 0..=31, retry_cnt and rnr_retry 0..=7",
                    });
                }
            }
            (QpState::Rts, QpState::Rts) => {}
            (from, to) => return Err(VerbsError::InvalidTransition { from, to }),
        }
        self.qps.get_mut(&qp.0).expect("looked up above").state = to;
        Ok(())
    }

    // ------------------------------------------------------------------ posting

    /// `ibv_post_send`: posts in order and stops at the first request it
    /// refuses, returning its index (ibverbs' `bad_wr`) with the reason.
    /// Like ibverbs, it takes no clock: the requests are stamped with the
    /// latest time the driver gave the device (see [`Context::set_time`]).
    pub fn post_send(&mut self, qp: QueuePair, wrs: &[SendWr]) -> Result<(), (usize, VerbsError)> {
        self.post_sends(None, qp, wrs)
    }

    /// [`post_send`](Self::post_send) at `now_ns`, for a driver that posts
    /// on behalf of an event it schedules (a simulator or test script);
    /// the time is used as given.
    pub fn post_send_at(
        &mut self,
        now_ns: u64,
        qp: QueuePair,
        wrs: &[SendWr],
    ) -> Result<(), (usize, VerbsError)> {
        self.post_sends(Some(now_ns), qp, wrs)
    }

    fn post_sends(
        &mut self,
        now_ns: Option<u64>,
        qp: QueuePair,
        wrs: &[SendWr],
    ) -> Result<(), (usize, VerbsError)> {
        let state = self
            .qp_state(qp)
            .ok_or((0, VerbsError::Unknown("queue pair")))?;
        let meta = self
            .qps
            .get(&qp.0)
            .ok_or((0, VerbsError::Unknown("queue pair")))?;
        if !matches!(state, QpState::Rts | QpState::Err) {
            return Err((
                0,
                VerbsError::WrongState {
                    qpn: qp.qp_num(),
                    state,
                },
            ));
        }
        let sig_all = meta.init.sq_sig_all;
        for (i, wr) in wrs.iter().enumerate() {
            self.endpoint
                .post_send_from(now_ns, qp.0, wr, sig_all)
                .map_err(|e| (i, e.into()))?;
        }
        self.dispatch_completions();
        Ok(())
    }

    /// `ibv_post_recv`: allowed from INIT on (ibverbs refuses it in RESET).
    pub fn post_recv(&mut self, qp: QueuePair, wrs: &[RecvWr]) -> Result<(), (usize, VerbsError)> {
        let state = self
            .qp_state(qp)
            .ok_or((0, VerbsError::Unknown("queue pair")))?;
        if state == QpState::Reset {
            return Err((
                0,
                VerbsError::WrongState {
                    qpn: qp.qp_num(),
                    state,
                },
            ));
        }
        for (i, wr) in wrs.iter().enumerate() {
            self.endpoint
                .post_recv(qp.0, wr.clone())
                .map_err(|e| (i, e.into()))?;
        }
        self.dispatch_completions();
        Ok(())
    }

    // ------------------------------------------------------------------ driving

    /// Feed a received datagram (see [`Endpoint::handle_datagram`]).
    pub fn handle_datagram(&mut self, now_ns: u64, src: SocketAddr, ecn: Ecn, data: &[u8]) {
        self.endpoint.handle_datagram(now_ns, src, ecn, data);
        self.dispatch_completions();
    }

    /// [`Endpoint::handle_coalesced_ack`], then hand out completions.
    pub fn handle_coalesced_ack(&mut self, now_ns: u64, src: SocketAddr, ecn: Ecn, ack: &[u8]) {
        self.endpoint.handle_coalesced_ack(now_ns, src, ecn, ack);
        self.dispatch_completions();
    }

    /// Where a waiting datagram's payload may be received directly (see
    /// [`Endpoint::direct_target`]).
    pub fn direct_target(
        &mut self,
        src: SocketAddr,
        head: &[u8],
        datagram_len: usize,
    ) -> Option<DirectTarget> {
        self.endpoint.direct_target(src, head, datagram_len)
    }

    /// The region bytes a [`DirectTarget`]'s payload goes into.
    pub fn direct_buffer(&mut self, target: &DirectTarget) -> Option<&mut [u8]> {
        self.endpoint.direct_buffer(target)
    }

    /// Feed a datagram received by direct placement (see
    /// [`Endpoint::handle_direct`]).
    pub fn handle_direct(
        &mut self,
        now_ns: u64,
        src: SocketAddr,
        ecn: Ecn,
        head: &[u8],
        target: &DirectTarget,
    ) {
        self.endpoint.handle_direct(now_ns, src, ecn, head, target);
        self.dispatch_completions();
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) may have something
    /// to send (see [`Endpoint::wants_to_transmit`]).
    pub fn wants_to_transmit(&self) -> bool {
        self.endpoint.wants_to_transmit()
    }

    /// Next datagram to send (see [`Endpoint::poll_transmit`]).
    pub fn poll_transmit(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<Transmit> {
        self.endpoint.poll_transmit(now_ns, buf)
    }

    /// Next datagram, payload left in place where it can be (see
    /// [`Endpoint::poll_transmit_gather`]).
    pub fn poll_transmit_gather(
        &mut self,
        now_ns: u64,
        buf: &mut [u8],
    ) -> Option<(Transmit, Layout)> {
        self.endpoint.poll_transmit_gather(now_ns, buf)
    }

    /// The bytes a [`Layout::Split`] transmit's payload refers to.
    pub fn payload(&self, payload: &PayloadRef) -> &[u8] {
        self.endpoint.payload(payload)
    }

    /// Next deadline.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        self.endpoint.poll_timeout()
    }

    /// Tell the device the time without any other input: a driver calls it
    /// before letting the application post, so that posts are stamped with
    /// the present rather than with the last packet's time. Time only
    /// moves forward.
    pub fn set_time(&mut self, now_ns: u64) {
        self.endpoint.set_time(now_ns);
    }

    /// Send every delayed ACK with the next transmits (see
    /// [`Endpoint::ack_owed_now`]): before the driver closes the device.
    pub fn ack_owed_now(&mut self) {
        self.endpoint.ack_owed_now();
    }

    /// Fire due timers.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        self.endpoint.handle_timeout(now_ns);
        self.dispatch_completions();
    }

    /// The buffer size `poll_transmit` needs.
    pub fn max_datagram_len(&self) -> usize {
        self.endpoint.max_datagram_len()
    }

    #[inline]
    fn dispatch_completions(&mut self) {
        // Most calls (every empty poll of a busy-polling loop) find nothing:
        // told so without setting up the loop below.
        if self.endpoint.has_completion() {
            self.dispatch_pending_completions();
        }
    }

    fn dispatch_pending_completions(&mut self) {
        while let Some(Completion {
            qp,
            queue,
            wc,
            solicited,
        }) = self.endpoint.poll_completion()
        {
            let Some(meta) = self.qps.get(&qp) else {
                continue;
            };
            let cq = match queue {
                WorkQueue::Send => meta.init.send_cq,
                WorkQueue::Recv => meta.init.recv_cq,
            };
            self.cqs.push(cq, wc, solicited);
        }
    }

    /// The PD a QP was created in.
    pub fn qp_pd(&self, qp: QueuePair) -> Option<ProtectionDomain> {
        self.qps.get(&qp.0).map(|m| m.pd)
    }

    /// Bytes held by the connection toward `peer`.
    pub fn connection_memory_bytes(&self, peer: SocketAddr) -> Option<usize> {
        self.endpoint.connection_memory_bytes(peer)
    }

    /// Bytes held by a QP in the core.
    pub fn qp_memory_bytes(&self, qp: QueuePair) -> Option<usize> {
        self.endpoint.qp_memory_bytes(qp.0)
    }
}

/// A QP's access flags name the remote operations it accepts; LOCAL_WRITE
/// is accepted and ignored, as ibverbs does, since applications often pass
/// the same flags as for their MRs.
fn check_qp_access(access: AccessFlags) -> Result<(), VerbsError> {
    let known = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    if access.0 & !known.0 != 0 {
        return Err(VerbsError::BadAttribute {
            attr: "qp_access_flags",
            reason: "unknown access flag bits",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
