//! The endpoint: one device's protocol state, driven sans-IO.
//!
//! The caller owns sockets, clocks and buffers (quinn-proto's contract):
//! - inputs: [`Endpoint::handle_datagram`] for every received datagram and
//!   [`Endpoint::handle_timeout`] when [`Endpoint::poll_timeout`]'s deadline
//!   passes; application commands (`post_send`, `post_recv`, ...);
//! - outputs, drained after every input in this order:
//!   [`Endpoint::poll_transmit`] until `None`, then
//!   [`Endpoint::poll_timeout`], then [`Endpoint::poll_completion`].
//!
//! Every input from the driver carries `now_ns`, a monotonic time in
//! nanoseconds; application commands do not: the endpoint stamps a post
//! with the latest time it was given (by an input, a poll or
//! [`Endpoint::set_time`]), as the driver owns time. A driver that posts on
//! behalf of a timed event says when with [`Endpoint::post_send_at`]. The
//! endpoint never reads a clock, never sleeps, and draws every random value
//! from the seed in its config; the UDP datapath, the fabric simulator and
//! the deterministic harness all drive it through these same calls.

use crate::auth::{ConnectionAuth, Reject};
use crate::config::{ConfigError, EndpointConfig};
use crate::connection::{Connection, ConnectionStats};
use crate::device_state::DeviceState;
use crate::direct::DirectTarget;
use crate::ecn::Ecn;
use crate::fast_map::{FastMap, FastState};
use crate::memory::{AccessFlags, KeyKind, MemoryError, MrHandle, MrInfo, Span};
use crate::message::{MsgAddress, Source, TxMessage};
use crate::packet_repr::{PacketRepr, PacketSlot};
use crate::path::PathStats;
use crate::qp::{Qp, QpCaps, QpHandle, QpRunState, SqEntry, SqState};
use crate::range_set::RangeSet;
use crate::stats::{Counters, EndpointStats, PeerCounters};
use crate::transmit::{Layout, Out, PayloadRef, Transmit};
use crate::work::{Completion, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};
use metaroce_wire as wire;
use rand_chacha::ChaCha20Rng;
use rand_core::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;

/// The longest opcode extension header (CmpSwap's, wire.md 4.2).
const MAX_EXTENSION_LEN: usize = 32;

/// Zeros standing in for payload bytes of packets handled as reprs.
static ZERO_PAYLOAD: [u8; 65_536] = [0; 65_536];

/// Why a post was refused outright (ibverbs returns these from
/// `ibv_post_send`/`ibv_post_recv`; everything else becomes a completion).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// No such QP.
    #[error("unknown QP {0:#x}")]
    UnknownQp(u32),
    /// The QP cannot take this post in its state.
    #[error("QP {0:#x} is not connected")]
    InvalidState(u32),
    /// The queue is full.
    #[error("queue full ({0} outstanding)")]
    QueueFull(u32),
    /// The message is larger than `max_message_bytes`.
    #[error("message of {0} bytes exceeds the maximum")]
    MessageTooLarge(u64),
    /// The QP's connection already holds `max_outstanding_ops_per_connection`
    /// messages; post again once some complete.
    #[error("connection busy ({0} outstanding operations, the limit)")]
    ConnectionBusy(u32),
    /// The request is malformed (e.g. inline data on a READ, an atomic whose
    /// local buffer is not 8 bytes).
    #[error("invalid work request: {0}")]
    Invalid(&'static str),
    /// A receive buffer's key, rights or bounds are wrong.
    #[error("bad receive buffer: {0}")]
    BadBuffer(MemoryError),
}

/// Why a QP could not be created or bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QpError {
    /// The QP table is full.
    #[error("too many QPs (limit {0})")]
    TooManyQps(u32),
    /// The connection table is full.
    #[error("too many connections (limit {0})")]
    TooManyConnections(u32),
    /// No such QP.
    #[error("unknown QP {0:#x}")]
    UnknownQp(u32),
    /// Already bound to a peer.
    #[error("QP {0:#x} is already connected")]
    AlreadyConnected(u32),
    /// Caps over the endpoint's limits.
    #[error("QP caps exceed the endpoint limits")]
    BadCaps,
    /// Authentication is configured and the peer's session id is not known:
    /// call `set_peer_session` with the id the connection manager got from it.
    #[error("no session id for peer {0} (authentication needs one)")]
    PeerSessionUnknown(SocketAddr),
    /// A connection to the peer exists under another session id (the peer
    /// restarted): its keys cannot change under live QPs.
    #[error("peer {0} already has a connection under another session id")]
    PeerSessionChanged(SocketAddr),
    /// A path MTU below 64 bytes of payload or above the device's MTU.
    #[error("path MTU {0}: must be 64 up to the device MTU")]
    BadPathMtu(u32),
    /// No QP of this device is connected to the peer.
    #[error("no connection to peer {0}")]
    NotConnectedTo(SocketAddr),
}

/// A connection and the endpoint's scheduling marks for it. Replacing the
/// slot (a new or closed connection) clears both marks.
#[derive(Debug)]
struct ConnSlot {
    conn: Connection,
    /// Queued in `Endpoint::ready`.
    in_ready: bool,
    /// Queued in `Endpoint::ack_ready`.
    in_ack_ready: bool,
    /// The deadline the connection has in the endpoint's timer heap.
    timer_deadline: Option<u64>,
    /// Queued in `Endpoint::dirty_timers`: its deadline may have moved.
    timer_dirty: bool,
}

impl ConnSlot {
    fn new(conn: Connection) -> Self {
        Self {
            conn,
            in_ready: false,
            in_ack_ready: false,
            timer_deadline: None,
            timer_dirty: false,
        }
    }
}

/// One device's protocol state.
#[derive(Debug)]
pub struct Endpoint {
    dev: DeviceState,
    conns: Vec<ConnSlot>,
    /// Slots of closed connections, reused before `conns` grows.
    free_conns: Vec<u32>,
    conn_by_peer: FastMap<SocketAddr, u32>,
    ready: VecDeque<u32>,
    /// Connections with an ACK to send: served before `ready` (see
    /// `poll_out`).
    ack_ready: VecDeque<u32>,
    /// Connections' next deadlines (min-heap; entries go stale and are
    /// dropped lazily, see `drop_stale_timers`).
    timers: BinaryHeap<Reverse<(u64, u32)>>,
    /// Connections whose deadline may have moved since their entry in
    /// `timers` was made (see `flush_timers`).
    dirty_timers: Vec<u32>,
    next_pd: u32,
    /// This incarnation's random id, mixed into every packet key.
    session_id: u64,
    /// Session ids of peers, given by the connection manager; read when the
    /// connection to a peer is created.
    peer_sessions: HashMap<SocketAddr, u64>,
    /// Peers that agreed to take data packets without ICRC
    /// ([`set_peer_icrc_omission`](Self::set_peer_icrc_omission)).
    icrc_omitted_peers: Vec<SocketAddr>,
    /// Whether this endpoint takes packets whose ICRC was omitted
    /// ([`EndpointConfig::accept_icrc_omitted`]).
    icrc_policy: wire::IcrcPolicy,
    /// Decrypted payload of the packet being handled (encrypted mode); kept
    /// to reuse its allocation.
    plaintext: Vec<u8>,
    /// The latest time an input or poll carried: what a post is stamped
    /// with when the caller gives none.
    now_ns: u64,
    /// Connections admission wants a raised grant pushed to (reused).
    regrants: Vec<u32>,
}

/// Mixed into the seed for the session id, so that drawing it leaves the
/// stream of keys, PSNs and ports exactly as it was before sessions existed.
const SESSION_SEED_DOMAIN: u64 = 0x5e55_1d00_a07b_e11e;

impl Endpoint {
    /// A new endpoint; refuses an invalid config.
    pub fn new(config: EndpointConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let session_id = ChaCha20Rng::seed_from_u64(config.seed ^ SESSION_SEED_DOMAIN).next_u64();
        let icrc_policy = if config.accept_icrc_omitted {
            wire::IcrcPolicy::OmittedAccepted
        } else {
            wire::IcrcPolicy::Required
        };
        Ok(Self {
            dev: DeviceState::new(config),
            conns: Vec::new(),
            free_conns: Vec::new(),
            // Seeded per device: two devices hash the same peers apart.
            conn_by_peer: FastMap::with_hasher(FastState::with_seed(session_id)),
            ready: VecDeque::new(),
            ack_ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            dirty_timers: Vec::new(),
            next_pd: 1,
            session_id,
            peer_sessions: HashMap::new(),
            icrc_omitted_peers: Vec::new(),
            icrc_policy,
            plaintext: Vec::new(),
            now_ns: 0,
            regrants: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.dev.config
    }

    /// Counters.
    pub fn stats(&self) -> &EndpointStats {
        &self.dev.stats
    }

    /// The largest datagram the endpoint emits: size `poll_transmit`'s buffer to this.
    pub fn max_datagram_len(&self) -> usize {
        self.datagram_len_for_payload(self.dev.config.mtu_payload_bytes)
    }

    /// The largest datagram (UDP payload) a data packet carrying
    /// `payload_bytes` of payload can be with this endpoint's trailer: the
    /// data header, the longest opcode extension (32 bytes), the payload
    /// and the ICRC or authentication trailer. A path must carry this
    /// unfragmented for `payload_bytes` to be a usable MTU on it.
    pub fn datagram_len_for_payload(&self, payload_bytes: u32) -> usize {
        let trailer = if self.dev.config.auth.is_some() {
            wire::AUTH_TRAILER_LEN
        } else {
            wire::ICRC_LEN
        };
        wire::DATA_HEADER_LEN + MAX_EXTENSION_LEN + payload_bytes as usize + trailer
    }

    /// The inverse of [`datagram_len_for_payload`](Self::datagram_len_for_payload):
    /// the most payload per packet that keeps every datagram within
    /// `max_datagram_bytes` (0 if not even an empty packet fits).
    pub fn payload_for_datagram_len(&self, max_datagram_bytes: usize) -> u32 {
        let overhead = self.datagram_len_for_payload(0);
        u32::try_from(max_datagram_bytes.saturating_sub(overhead)).unwrap_or(u32::MAX)
    }

    /// This endpoint's session id: random per incarnation (drawn from the
    /// config's seed), it goes into every packet key when authentication is
    /// configured. The connection manager sends it to peers with the QP
    /// number; they pass it to [`set_peer_session`](Self::set_peer_session).
    pub fn session_id(&self) -> u64 {
        self.session_id
    }

    /// Send data packets toward the peer device at `peer` with their ICRC
    /// omitted (`omit`), or with it (the default): call it with `true` only
    /// when the peer has said it takes them
    /// ([`EndpointConfig::accept_icrc_omitted`] on its side, exchanged by
    /// the connection manager) and the datagrams go with a UDP checksum
    /// (wire.md 7.2). Authenticated connections ignore it: their tag is
    /// their trailer. Applies to a connection that exists and to one made
    /// later.
    pub fn set_peer_icrc_omission(&mut self, peer: SocketAddr, omit: bool) {
        self.icrc_omitted_peers.retain(|p| *p != peer);
        if omit {
            self.icrc_omitted_peers.push(peer);
        }
        if let Some(&c) = self.conn_by_peer.get(&peer) {
            self.conns[c as usize].conn.set_omit_icrc(omit);
        }
    }

    /// The share of its line the peer device at `peer` promised this
    /// device when their QPs were connected (bits/s; 0: no cap, we are its
    /// only sender), as [`setup_grant_bps`](Self::setup_grant_bps) gave it
    /// on the peer's side. A connection that has sent nothing yet starts at
    /// it instead of a cold round trip; otherwise it is ignored (the
    /// receiver's ACKs say more). `Err` if no connection to `peer` exists.
    pub fn take_setup_grant(
        &mut self,
        peer: SocketAddr,
        rate_bps: u64,
        now_ns: u64,
    ) -> Result<(), QpError> {
        let &c = self
            .conn_by_peer
            .get(&peer)
            .ok_or(QpError::NotConnectedTo(peer))?;
        self.conns[c as usize]
            .conn
            .take_setup_grant(rate_bps, now_ns, &mut self.dev);
        self.mark_ready(c);
        Ok(())
    }

    /// The share of this device's line it can promise each of `senders`
    /// peers at connection setup (bits/s; 0 for a lone sender: no cap).
    /// The shares of all of them add up to the line, so however they
    /// start they cannot overrun the device's link by more than the
    /// admission's own first round trip would.
    pub fn setup_grant_bps(&self, senders: u32) -> u64 {
        crate::admission::setup_share_bps(self.dev.config.line_rate_bps, senders)
    }

    /// Record the session id of the peer device at `peer` (its IP and device
    /// port), as learned from the connection manager. With authentication
    /// configured, [`connect_qp`](Self::connect_qp) to a peer needs it. The
    /// same id again is a no-op; another id once a connection to the peer
    /// exists is refused (the keys of live QPs cannot change).
    pub fn set_peer_session(&mut self, peer: SocketAddr, session_id: u64) -> Result<(), QpError> {
        match self.peer_sessions.get(&peer) {
            Some(&known) if known == session_id => return Ok(()),
            Some(_) if self.conn_by_peer.contains_key(&peer) => {
                return Err(QpError::PeerSessionChanged(peer));
            }
            None if self.peer_sessions.len() >= self.dev.config.max_connections as usize => {
                // Bounded like the connections it prepares.
                return Err(QpError::TooManyConnections(self.dev.config.max_connections));
            }
            _ => {}
        }
        self.peer_sessions.insert(peer, session_id);
        Ok(())
    }

    // -------------------------------------------------------------- memory

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> u32 {
        self.next_pd += 1;
        self.next_pd - 1
    }

    /// Whether any memory region or QP lives in protection domain `pd`
    /// (ibverbs refuses to deallocate such a domain).
    pub fn pd_in_use(&self, pd: u32) -> bool {
        self.dev.regions.any_in_domain(pd) || self.dev.qps.any_in_domain(pd)
    }

    /// Register a region of `length` zeroed bytes owned by the endpoint.
    pub fn register_memory(
        &mut self,
        pd: u32,
        length: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, MemoryError> {
        self.dev
            .regions
            .register(pd, length, access, false, &mut self.dev.rng)
    }

    /// Register a region that has a length but no bytes (the simulator's
    /// descriptors): writes are discarded, reads give zeros.
    pub fn register_virtual_memory(
        &mut self,
        pd: u32,
        length: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, MemoryError> {
        self.dev
            .regions
            .register(pd, length, access, true, &mut self.dev.rng)
    }

    /// Register memory the driver lends for as long as the region lives
    /// (see [`RegionMemory`](crate::RegionMemory)).
    pub fn register_external_memory(
        &mut self,
        pd: u32,
        memory: Box<dyn crate::RegionMemory>,
        access: AccessFlags,
    ) -> Result<MrInfo, MemoryError> {
        self.dev
            .regions
            .register_external(pd, memory, access, &mut self.dev.rng)
    }

    /// Deregister a region; its keys stop working at once.
    pub fn deregister_memory(&mut self, mr: MrHandle) -> Result<(), MemoryError> {
        self.dev.regions.deregister(mr)
    }

    /// The region's bytes (`None` for virtual or unknown regions).
    pub fn memory(&self, mr: MrHandle) -> Option<&[u8]> {
        self.dev.regions.bytes(mr)
    }

    /// The region's bytes, writable.
    pub fn memory_mut(&mut self, mr: MrHandle) -> Option<&mut [u8]> {
        self.dev.regions.bytes_mut(mr)
    }

    /// The bytes of several distinct regions at once, all writable (a
    /// driver computing from one region into another); `None` when a
    /// handle is stale or virtual or two handles name the same region.
    pub fn memory_disjoint_mut<const N: usize>(
        &mut self,
        mrs: [MrHandle; N],
    ) -> Option<[&mut [u8]; N]> {
        self.dev.regions.bytes_disjoint_mut(mrs)
    }

    /// Live memory regions.
    pub fn memory_regions(&self) -> u32 {
        self.dev.regions.live()
    }

    /// Bytes registered over all live regions (see `max_registered_bytes`).
    pub fn registered_bytes(&self) -> u64 {
        self.dev.regions.bytes_registered()
    }

    // ----------------------------------------------------------------- QPs

    /// Create a QP in protection domain `pd` that accepts the remote
    /// operations in `remote_access` (ibverbs `qp_access_flags`).
    pub fn create_qp(
        &mut self,
        pd: u32,
        caps: QpCaps,
        remote_access: AccessFlags,
    ) -> Result<QpHandle, QpError> {
        let cfg = &self.dev.config;
        if caps.max_send_wr == 0
            || caps.max_recv_wr == 0
            || caps.max_send_wr > cfg.max_send_wr
            || caps.max_recv_wr > cfg.max_recv_wr
        {
            return Err(QpError::BadCaps);
        }
        let limit = cfg.max_queue_pairs;
        self.dev
            .qps
            .create(limit, pd, caps, remote_access)
            .ok_or(QpError::TooManyQps(limit))
    }

    /// Bind a QP to the peer device at `remote` (its IP and device port) and
    /// its QP `remote_qpn`: the ibverbs INIT→RTR step. The connection to that
    /// peer is created on first use and shared by every QP toward it.
    pub fn connect_qp(
        &mut self,
        qp: QpHandle,
        remote: SocketAddr,
        remote_qpn: u32,
    ) -> Result<(), QpError> {
        let qpn = qp.qpn();
        let known = self.qp(qp).ok_or(QpError::UnknownQp(qpn))?;
        if known.conn.is_some() {
            return Err(QpError::AlreadyConnected(qpn));
        }
        let conn = match self.conn_by_peer.get(&remote) {
            Some(&c) => c,
            None => {
                let limit = self.dev.config.max_connections;
                if self.connection_count() as u32 >= limit {
                    return Err(QpError::TooManyConnections(limit));
                }
                let auth = match &self.dev.config.auth {
                    None => None,
                    Some(config) => {
                        let peer_session = *self
                            .peer_sessions
                            .get(&remote)
                            .ok_or(QpError::PeerSessionUnknown(remote))?;
                        let local = SocketAddr::new(config.local_ip, self.dev.config.device_port);
                        Some(Box::new(ConnectionAuth::new(
                            config,
                            (local, self.session_id),
                            (remote, peer_session),
                        )))
                    }
                };
                // The only place a connection is created: from a local call,
                // never from a packet (see `handle_datagram`).
                let c = match self.free_conns.pop() {
                    Some(c) => {
                        self.conns[c as usize] =
                            ConnSlot::new(Connection::new(c, remote, &self.dev, auth));
                        c
                    }
                    None => {
                        let c = self.conns.len() as u32;
                        // Most simulated hosts talk to one or two peers.
                        crate::grow::push(
                            &mut self.conns,
                            ConnSlot::new(Connection::new(c, remote, &self.dev, auth)),
                        );
                        c
                    }
                };
                self.conn_by_peer.insert(remote, c);
                if self.icrc_omitted_peers.contains(&remote) {
                    self.conns[c as usize].conn.set_omit_icrc(true);
                }
                c
            }
        };
        self.conns[conn as usize].conn.bind_qp(qp.index() as u32);
        let q = self.qp_mut(qp).expect("checked above");
        q.conn = Some(conn);
        q.remote_qpn = remote_qpn;
        q.state = QpRunState::Connected;
        Ok(())
    }

    /// Set the payload bytes per packet of the messages `qp` sends from now
    /// on (ibverbs' `path_mtu`, part of the INIT→RTR step): its requests'
    /// segments and the READ responses it returns. At most the device's
    /// MTU, which is what a QP uses until this is called; messages already
    /// posted keep the segments they were cut into.
    pub fn set_qp_path_mtu(&mut self, qp: QpHandle, payload_bytes: u32) -> Result<(), QpError> {
        if !(64..=self.dev.config.mtu_payload_bytes).contains(&payload_bytes) {
            return Err(QpError::BadPathMtu(payload_bytes));
        }
        let q = self.qp_mut(qp).ok_or(QpError::UnknownQp(qp.qpn()))?;
        q.path_mtu = Some(payload_bytes);
        Ok(())
    }

    /// Set the remote operations a QP accepts (ibverbs `qp_access_flags`).
    pub fn set_qp_remote_access(
        &mut self,
        qp: QpHandle,
        access: AccessFlags,
    ) -> Result<(), QpError> {
        let q = self.qp_mut(qp).ok_or(QpError::UnknownQp(qp.qpn()))?;
        q.remote_access = access;
        Ok(())
    }

    /// Move a QP to the error state (ibverbs modify to ERR): everything
    /// outstanding completes with `WrFlushErr`.
    pub fn set_qp_error(&mut self, qp: QpHandle) -> Result<(), QpError> {
        let q = self.qp(qp).ok_or(QpError::UnknownQp(qp.qpn()))?;
        match q.conn {
            Some(c) => {
                self.conns[c as usize]
                    .conn
                    .fail_qp(&mut self.dev, qp.index());
                self.mark_ready(c);
            }
            None => self.dev.flush_qp(qp.index()),
        }
        Ok(())
    }

    /// Destroy a QP; its number stops matching at once. Outstanding work is
    /// dropped without completions (ibverbs: destroy after draining).
    pub fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), QpError> {
        let q = self.qp(qp).ok_or(QpError::UnknownQp(qp.qpn()))?;
        if let Some(c) = q.conn {
            if self.conns[c as usize].conn.unbind_qp(qp.index() as u32) {
                self.mark_ready(c);
            } else {
                self.close_connection(c);
            }
        }
        self.dev.qps.remove(qp);
        Ok(())
    }

    /// The last QP toward a peer is gone: drop everything held for it
    /// (paths, windows, queues, keys, the peer's session id), so state
    /// returns to zero, and a peer that restarts is met by a fresh
    /// connection under new keys. Packets still in flight from it are then
    /// from an unknown peer, counted and dropped.
    fn close_connection(&mut self, c: u32) {
        let peer = self.conns[c as usize].conn.peer();
        crate::trace::trace_event!(
            in: self.conns[c as usize].conn.trace().enter(),
            INFO,
            now_ns = self.now_ns,
            "connection torn down: its last QP is gone"
        );
        self.conn_by_peer.remove(&peer);
        self.peer_sessions.remove(&peer);
        self.conns[c as usize] = ConnSlot::new(Connection::closed(c, &self.dev));
        self.free_conns.push(c);
        // Its timer-heap entries are stale now (a closed slot has no
        // deadline) and go at the next refresh; its ready-queue entry, if
        // any, finds nothing to send.
        self.drop_stale_timers();
    }

    /// The core's run state of a QP.
    pub fn qp_state(&self, qp: QpHandle) -> Option<QpRunState> {
        self.qp(qp).map(|q| q.state)
    }

    fn qp(&self, qp: QpHandle) -> Option<&Qp> {
        self.dev.qps.get(qp)
    }

    fn qp_mut(&mut self, qp: QpHandle) -> Option<&mut Qp> {
        self.dev.qps.get_mut(qp)
    }

    // ------------------------------------------------------------- posting

    /// Post a send work request (ibverbs `ibv_post_send`), stamped with the
    /// latest time the endpoint was given. Immediate refusals are errors;
    /// everything else, including local protection errors, ends in a
    /// completion.
    pub fn post_send(&mut self, qp: QpHandle, wr: SendWr) -> Result<(), PostError> {
        self.post_send_from(None, qp, &wr, false)
    }

    /// [`post_send`](Self::post_send) at `now_ns`: for a driver that posts
    /// on behalf of an event it schedules (the simulator's workload, the
    /// harness's scripts). The time is taken as given, and moves the
    /// endpoint's clock on if it is later.
    pub fn post_send_at(&mut self, now_ns: u64, qp: QpHandle, wr: SendWr) -> Result<(), PostError> {
        self.post_send_from(Some(now_ns), qp, &wr, false)
    }

    /// [`post_send_at`](Self::post_send_at) (with `now_ns`, else
    /// [`post_send`](Self::post_send)) of a request the caller keeps, as a
    /// verbs layer posting from the application's list does: nothing of it
    /// is cloned, and inline data is copied once, into the message.
    /// `signal_all` (the QP's `sq_sig_all`) makes it signaled whatever its
    /// own flag says.
    pub fn post_send_from(
        &mut self,
        now_ns: Option<u64>,
        qp: QpHandle,
        wr: &SendWr,
        signal_all: bool,
    ) -> Result<(), PostError> {
        let now_ns = match now_ns {
            Some(t) => {
                self.set_time(t);
                t
            }
            None => self.now_ns,
        };
        self.post_send_stamped(now_ns, qp, wr, wr.signaled || signal_all)
    }

    /// Tell the endpoint the time without any other input (a driver about
    /// to let the application post). Time only moves forward: an earlier
    /// value is ignored.
    pub fn set_time(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
    }

    fn post_send_stamped(
        &mut self,
        now_ns: u64,
        qp: QpHandle,
        wr: &SendWr,
        signaled: bool,
    ) -> Result<(), PostError> {
        let qpn = qp.qpn();
        let max_msg = u64::from(self.dev.config.max_message_bytes);
        let q = self.qp(qp).ok_or(PostError::UnknownQp(qpn))?;
        // Cut by the QP's path MTU, not the device's: a peer or path that
        // carries less would never receive the larger segments.
        let mtu = q.mtu(self.dev.config.mtu_payload_bytes);
        let conn = match q.state {
            QpRunState::Unconnected => return Err(PostError::InvalidState(qpn)),
            QpRunState::Connected | QpRunState::Error => q.conn,
        };
        if q.sq.len() as u32 >= q.caps.max_send_wr {
            return Err(PostError::QueueFull(q.caps.max_send_wr));
        }
        let conn_limit = self.dev.config.max_outstanding_ops_per_connection;
        if q.state == QpRunState::Connected
            && let Some(c) = conn
            && self.conns[c as usize].conn.messages_held() as u32 >= conn_limit
        {
            return Err(PostError::ConnectionBusy(conn_limit));
        }
        let len = match &wr.inline_data {
            Some(data) => {
                if wr.op.writes_locally() {
                    return Err(PostError::Invalid("inline data on a READ or atomic"));
                }
                data.len() as u64
            }
            None => wr.sg_list.iter().map(|s| u64::from(s.length)).sum(),
        };
        if len > max_msg {
            return Err(PostError::MessageTooLarge(len));
        }
        if wr.op.is_atomic() && len != 8 {
            return Err(PostError::Invalid("atomic needs one 8-byte local buffer"));
        }
        let (pd, flushing) = (
            q.pd,
            q.state == QpRunState::Error || q.sq.back().is_some_and(sq_failed),
        );

        // Local checks: a bad lkey is a completion with LocProtErr, in order.
        let need = if wr.op.writes_locally() {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::NONE
        };
        let spans = self.check_sges(pd, &wr.sg_list, need);
        let state = match (&spans, flushing) {
            (_, true) => SqState::Done(WcStatus::WrFlushErr),
            (Err(_), false) => SqState::Done(WcStatus::LocProtErr),
            (Ok(_), false) => SqState::Active,
        };
        let rnr_retries_left = self.dev.config.rnr_retry;
        let q = self.qp_mut(qp).expect("checked above");
        let msg_seq = q.next_msg_seq;
        q.next_msg_seq = q.next_msg_seq.wrapping_add(1);
        let mut entry = SqEntry {
            wr_id: wr.wr_id,
            msg_seq,
            opcode: wr.op.wc_opcode(),
            len: len as u32,
            signaled,
            state,
            msg: None,
            sink: Vec::new(),
            read_ranges: RangeSet::new(),
            rnr_retries_left,
        };
        if state == SqState::Active {
            let spans = spans.expect("active means checked");
            let wire = wr.op.wire_request(len as u32, &mut q.next_recv_index);
            let source = match (wire.payload_len, &wr.inline_data) {
                (0, _) => {
                    entry.sink = spans;
                    Source::Empty
                }
                (_, Some(data)) => Source::inline(data),
                (_, None) => Source::Spans(spans),
            };
            let to = MsgAddress {
                qp: qp.index() as u32,
                dst_qpn: q.remote_qpn,
                msg_seq,
            };
            let mut msg = TxMessage::request(to, wire, wr.solicited, source, mtu);
            msg.ack_deferrable = !signaled && self.dev.config.deferred_ack_ns > 0;
            let c = conn.expect("connected QPs have a connection");
            entry.msg = Some(self.conns[c as usize].conn.enqueue(now_ns, &self.dev, msg));
            self.mark_ready(c);
        }
        let q = self.qp_mut(qp).expect("checked above");
        crate::grow::push_back(&mut q.sq, entry);
        if state != SqState::Active {
            match conn {
                Some(c) => {
                    self.conns[c as usize]
                        .conn
                        .release_completions(&mut self.dev, qp.index());
                    self.mark_ready(c);
                }
                None => self.dev.flush_qp(qp.index()),
            }
        }
        Ok(())
    }

    fn check_sges(
        &self,
        pd: u32,
        sges: &[Sge],
        need: AccessFlags,
    ) -> Result<Vec<Span>, MemoryError> {
        sges.iter()
            .map(|s| {
                self.dev.regions.check(
                    KeyKind::Local,
                    s.lkey,
                    pd,
                    s.addr,
                    u64::from(s.length),
                    need,
                )
            })
            .collect()
    }

    /// Post a receive work request (ibverbs `ibv_post_recv`).
    pub fn post_recv(&mut self, qp: QpHandle, wr: RecvWr) -> Result<(), PostError> {
        let qpn = qp.qpn();
        let q = self.qp(qp).ok_or(PostError::UnknownQp(qpn))?;
        if q.rq.len() as u32 >= q.caps.max_recv_wr {
            return Err(PostError::QueueFull(q.caps.max_recv_wr));
        }
        let spans = self
            .check_sges(q.pd, &wr.sg_list, AccessFlags::LOCAL_WRITE)
            .map_err(PostError::BadBuffer)?;
        let capacity = spans.iter().map(|s| s.len).sum();
        let q = self.qp_mut(qp).expect("checked above");
        if q.state == QpRunState::Error {
            let wc = WorkCompletion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm_data: None,
                qp_num: qpn,
                src_qp: q.remote_qpn,
            };
            self.dev
                .completions
                .push_back(Completion::recv(qp, wc, false));
            return Ok(());
        }
        crate::grow::push_back(
            &mut q.rq,
            crate::qp::RqEntry {
                wr_id: wr.wr_id,
                spans,
                capacity,
            },
        );
        Ok(())
    }

    // ------------------------------------------------------------- driving

    /// Feed one received datagram. `src` is the sender's IP and UDP source
    /// port; `ecn` its ECN codepoint. Malformed or unexpected datagrams are
    /// counted and dropped; nothing here can panic on remote input.
    ///
    /// No datagram creates state: one from a device without a connection
    /// (connections are made only by a local `connect_qp`) is counted in
    /// `rx_unknown_peer` and dropped after one lookup in the connection
    /// table, before any cryptography and without allocating.
    ///
    /// A datagram may hold an ACK followed by more packets (coalescing,
    /// [`wire::first_packet_len`]); each is taken in turn, checked on its
    /// own, and one that is malformed does not lose the others.
    pub fn handle_datagram(&mut self, now_ns: u64, src: SocketAddr, ecn: Ecn, data: &[u8]) {
        self.set_time(now_ns);
        self.count_arrival(now_ns, data.len(), ecn);
        let mut rest = data;
        loop {
            let n = wire::first_packet_len(rest);
            self.handle_one_packet(now_ns, src, ecn, &rest[..n]);
            rest = &rest[n..];
            if rest.is_empty() {
                return;
            }
        }
    }

    /// A datagram of `bytes` reached the device: counted, and its arrival
    /// time told to admission (which watches the link into the device).
    fn count_arrival(&mut self, now_ns: u64, bytes: usize, ecn: Ecn) {
        self.dev.stats.rx_datagrams += 1;
        self.dev.stats.rx_bytes += bytes as u64;
        self.dev.stats.rx_ce_marked += u64::from(ecn == Ecn::Ce);
        self.dev.admission.note_arrival(now_ns, bytes as u64);
    }

    /// The ACK that came coalesced in front of a datagram's data, handled
    /// after the rest of that datagram went through
    /// [`handle_datagram`](Self::handle_datagram) (which counted the
    /// datagram): a driver may answer the data first and handle the ACK,
    /// which nothing in the answer depends on, once the answer has left.
    /// `ack` is the datagram's first packet
    /// ([`metaroce_wire::first_packet_len`] bytes).
    pub fn handle_coalesced_ack(&mut self, now_ns: u64, src: SocketAddr, ecn: Ecn, ack: &[u8]) {
        self.set_time(now_ns);
        self.dev.stats.rx_bytes += ack.len() as u64;
        self.handle_one_packet(now_ns, src, ecn, ack);
    }

    /// Direct placement, first step (see `direct.rs`): `head` is the start
    /// of a datagram of `datagram_len` bytes from `src`, still in the
    /// driver's socket. If it is one WRITE packet or READ response (alone,
    /// or behind one coalesced ACK) whose payload may go straight into its
    /// region, where: the driver then receives the headers
    /// ([`DirectTarget::header_len`] bytes, the ACK included) into its own buffer,
    /// the payload into [`direct_buffer`](Self::direct_buffer) and the
    /// trailer behind it, and calls [`handle_direct`](Self::handle_direct).
    /// None: receive it as usual.
    pub fn direct_target(
        &mut self,
        src: SocketAddr,
        head: &[u8],
        datagram_len: usize,
    ) -> Option<DirectTarget> {
        if self.dev.config.auth.is_some() || self.icrc_policy != wire::IcrcPolicy::OmittedAccepted {
            return None;
        }
        // The data may come behind the ACK its sender coalesced into the
        // same datagram (a two-way exchange: each side's data carries its
        // ACKs of the other's). The ACK's length is in its header; it rides
        // in the head buffer and is handled first, as in handle_datagram.
        // (An ACK cut short by the head buffer reads as the whole head:
        // no data packet behind it, no target.)
        let lead_len = match wire::first_packet_len(head) {
            n if n < head.len() => n,
            _ => 0,
        };
        let data_head = &head[lead_len..];
        let header = wire::BaseHeader::new_checked(data_head).ok()?;
        if header.packet_type() != wire::PacketType::Data as u8
            || !header.flags().contains(wire::Flags::ICRC_OMITTED)
            || header.flags().contains(wire::Flags::AUTHENTICATED)
        {
            return None;
        }
        let repr = wire::DataRepr::parse_head(data_head, datagram_len - lead_len).ok()?;
        let peer = SocketAddr::new(src.ip(), repr.base.src_device_port);
        let c = *self.conn_by_peer.get(&peer)?;
        let conn_index = self.conns[c as usize].conn.index();
        let (span, at) = crate::connection::direct_write_target(&mut self.dev, conn_index, &repr)
            .or_else(|| {
            crate::connection::direct_read_target(&mut self.dev, conn_index, &repr)
        })?;
        let target = DirectTarget {
            repr,
            span,
            at,
            lead_len,
            header_len: lead_len + repr.header_len(),
            datagram_len,
        };
        self.direct_buffer(&target)?;
        Some(target)
    }

    /// The region bytes a [`DirectTarget`]'s payload is received into.
    pub fn direct_buffer(&mut self, target: &DirectTarget) -> Option<&mut [u8]> {
        self.dev
            .regions
            .span_bytes_mut(target.span, target.at, target.repr.payload_len.into())
    }

    /// Direct placement, last step: the datagram `target` was given for
    /// came in, its payload in the region and `head` its headers as read.
    /// The packet is handled as [`handle_datagram`](Self::handle_datagram)
    /// would, without copying the payload. Headers that differ from the
    /// peeked ones (another datagram was read) drop the packet as
    /// malformed: what it left in the region is in bytes still to come.
    pub fn handle_direct(
        &mut self,
        now_ns: u64,
        src: SocketAddr,
        ecn: Ecn,
        head: &[u8],
        target: &DirectTarget,
    ) {
        self.set_time(now_ns);
        self.count_arrival(now_ns, target.datagram_len, ecn);
        let lead_len = target.lead_len;
        let (Some(lead), Some(data_head)) = (head.get(..lead_len), head.get(lead_len..)) else {
            self.dev.stats.rx_malformed += 1;
            return;
        };
        if !lead.is_empty() {
            self.handle_one_packet(now_ns, src, ecn, lead);
        }
        match wire::DataRepr::parse_head(data_head, target.datagram_len - lead_len) {
            Ok(repr) if repr == target.repr => self.dispatch_data(now_ns, src, ecn, &repr, &[]),
            _ => self.dev.stats.rx_malformed += 1,
        }
    }

    /// One packet of a datagram.
    fn handle_one_packet(&mut self, now_ns: u64, src: SocketAddr, ecn: Ecn, data: &[u8]) {
        if self.dev.config.auth.is_some() {
            self.handle_authenticated(now_ns, src, ecn, data);
            return;
        }
        let Ok(packet) = wire::parse_with(data, self.icrc_policy) else {
            self.dev.stats.rx_malformed += 1;
            return;
        };
        match packet {
            wire::Packet::Data { repr, payload } => {
                self.dispatch_data(now_ns, src, ecn, &repr, payload)
            }
            wire::Packet::Ack(ack) => self.dispatch_ack(now_ns, src, &ack),
        }
    }

    /// The receive path with authentication configured: structure, then the
    /// peer's connection, then the replay window and the tag, and only then
    /// the protocol.
    fn handle_authenticated(&mut self, now_ns: u64, src: SocketAddr, ecn: Ecn, data: &[u8]) {
        let Ok(header) = wire::BaseHeader::new_checked(data) else {
            self.dev.stats.rx_malformed += 1;
            return;
        };
        if header.version() == wire::VERSION && !header.flags().contains(wire::Flags::AUTHENTICATED)
        {
            // A plain packet where every packet must carry a tag: whatever
            // it says, it cannot be trusted.
            self.dev.stats.rx_unauthenticated += 1;
            return;
        }
        let Ok((packet, auth)) = wire::parse_authenticated(data) else {
            self.dev.stats.rx_malformed += 1;
            return;
        };
        let Some(c) = self.connection_of(src, packet.base().src_device_port) else {
            return;
        };
        let header_len = match &packet {
            wire::Packet::Data { repr, .. } => repr.header_len(),
            wire::Packet::Ack(ack) => ack.covered_len(),
        };
        let mut plaintext = std::mem::take(&mut self.plaintext);
        let conn_auth = self.conns[c as usize]
            .conn
            .auth_mut()
            .expect("connections get keys when authentication is configured");
        match conn_auth.open(data, header_len, &auth, &mut plaintext) {
            Err(Reject::Replayed) => self.dev.stats.rx_replayed += 1,
            Err(Reject::BadTag) => self.dev.stats.rx_auth_failed += 1,
            Ok(payload) => match &packet {
                wire::Packet::Data { repr, .. } => {
                    self.conns[c as usize]
                        .conn
                        .on_data(now_ns, &mut self.dev, ecn, repr, payload);
                    self.mark_ready(c);
                }
                wire::Packet::Ack(ack) => {
                    self.conns[c as usize]
                        .conn
                        .on_ack(now_ns, &mut self.dev, ack);
                    self.mark_ready(c);
                }
            },
        }
        self.plaintext = plaintext;
    }

    /// Feed one packet given as parsed headers (the simulator's form): the
    /// same processing as [`handle_datagram`](Self::handle_datagram) after
    /// parsing, with the payload taken as `payload_len` zero bytes. Field
    /// rules are still checked; an invalid repr is counted as malformed.
    ///
    /// With authentication configured, a repr must carry the AUTHENTICATED
    /// flag (else `rx_unauthenticated`); there are no bytes to check a tag
    /// on, so the simulator models authentication's wire length, not its
    /// protection.
    pub fn handle_packet(&mut self, now_ns: u64, src: SocketAddr, ecn: Ecn, packet: &PacketRepr) {
        self.set_time(now_ns);
        self.count_arrival(now_ns, packet.wire_len(), ecn);
        let flags = match packet {
            PacketRepr::Data(repr) => repr.base.flags,
            PacketRepr::Ack(ack) => ack.base.flags,
        };
        if self.dev.config.auth.is_some() && !flags.contains(wire::Flags::AUTHENTICATED) {
            self.dev.stats.rx_unauthenticated += 1;
            return;
        }
        match packet {
            PacketRepr::Data(repr) => {
                let len = repr.payload_len as usize;
                if repr.validate().is_err() || len > ZERO_PAYLOAD.len() {
                    self.dev.stats.rx_malformed += 1;
                    return;
                }
                // A repair packet's shard is not message bytes: without
                // bytes, it rebuilds lengths only (`repair.rs`).
                let payload = if repr.base.flags.contains(wire::Flags::REPAIR) {
                    &[][..]
                } else {
                    &ZERO_PAYLOAD[..len]
                };
                self.dispatch_data(now_ns, src, ecn, repr, payload);
            }
            PacketRepr::Ack(ack) => self.dispatch_ack(now_ns, src, ack),
        }
    }

    /// Feed the header of a data packet that a trimming switch cut on the
    /// way (UET-style trimming: the payload dropped, the header forwarded
    /// at high priority). The receiver NACKs it in the next ACK of its
    /// path, sent at once, and the sender resends it without waiting for
    /// loss detection (docs/spec/transport.md §4). Only the simulator
    /// delivers trimmed headers: the UDP driver never sees one (a switch
    /// that trims a UDP datagram leaves a packet whose length and ICRC no
    /// longer match, which [`handle_datagram`](Self::handle_datagram)
    /// counts as malformed).
    pub fn handle_trimmed(&mut self, now_ns: u64, src: SocketAddr, repr: &wire::DataRepr) {
        self.set_time(now_ns);
        self.dev.stats.rx_datagrams += 1;
        if self.dev.config.auth.is_some() && !repr.base.flags.contains(wire::Flags::AUTHENTICATED) {
            self.dev.stats.rx_unauthenticated += 1;
            return;
        }
        if repr.validate().is_err() {
            self.dev.stats.rx_malformed += 1;
            return;
        }
        let Some(c) = self.connection_of(src, repr.base.src_device_port) else {
            return;
        };
        self.conns[c as usize]
            .conn
            .on_trimmed(now_ns, &mut self.dev, repr);
        self.mark_ready(c);
    }

    fn connection_of(&mut self, src: SocketAddr, src_device_port: u16) -> Option<u32> {
        let peer = SocketAddr::new(src.ip(), src_device_port);
        let c = self.conn_by_peer.get(&peer).copied();
        if c.is_none() {
            self.dev.stats.rx_unknown_peer += 1;
        }
        c
    }

    fn dispatch_data(
        &mut self,
        now_ns: u64,
        src: SocketAddr,
        ecn: Ecn,
        repr: &wire::DataRepr,
        payload: &[u8],
    ) {
        let Some(c) = self.connection_of(src, repr.base.src_device_port) else {
            return;
        };
        self.conns[c as usize]
            .conn
            .on_data(now_ns, &mut self.dev, ecn, repr, payload);
        self.mark_ready(c);
    }

    fn dispatch_ack(&mut self, now_ns: u64, src: SocketAddr, ack: &wire::AckRepr) {
        let Some(c) = self.connection_of(src, ack.base.src_device_port) else {
            return;
        };
        self.conns[c as usize]
            .conn
            .on_ack(now_ns, &mut self.dev, ack);
        self.mark_ready(c);
    }

    /// After anything touched connection `c`: queue it for transmission if
    /// it has output, and refresh its entry in the timer heap.
    fn mark_ready(&mut self, c: u32) {
        let slot = &mut self.conns[c as usize];
        if !slot.in_ready && slot.conn.has_pending_output() {
            slot.in_ready = true;
            self.ready.push_back(c);
        }
        if !slot.in_ack_ready && slot.conn.has_pending_ack() {
            slot.in_ack_ready = true;
            self.ack_ready.push_back(c);
        }
        self.refresh_timer(c);
    }

    /// Connection `c` changed: its deadline may have moved. Recomputed
    /// once, when the heap is next read (`flush_timers`), not after every
    /// event: one round trip of an 8-byte ping-pong touches its connection
    /// about six times (the request, its completion, the reply's post, the
    /// reply and ACK built), and each recomputation walks every timer the
    /// connection has.
    fn refresh_timer(&mut self, c: u32) {
        let slot = &mut self.conns[c as usize];
        if !slot.timer_dirty {
            slot.timer_dirty = true;
            self.dirty_timers.push(c);
        }
    }

    /// Bring the timer heap up to date with every connection that changed
    /// since it was last read.
    fn flush_timers(&mut self) {
        if self.dirty_timers.is_empty() {
            return;
        }
        let mut dirty = std::mem::take(&mut self.dirty_timers);
        for c in dirty.drain(..) {
            let slot = &mut self.conns[c as usize];
            // A slot replaced since it was queued starts clean.
            if !std::mem::take(&mut slot.timer_dirty) {
                continue;
            }
            let deadline = slot.conn.next_timeout(&self.dev);
            if deadline != slot.timer_deadline {
                slot.timer_deadline = deadline;
                if let Some(d) = deadline {
                    self.timers.push(Reverse((d, c)));
                }
            }
        }
        self.dirty_timers = dirty;
        self.drop_stale_timers();
        // Entries whose deadline moved later stay in the heap until they
        // surface; every ACK can move a retransmission deadline, so sweep
        // them out once they outnumber the live ones (amortised O(1)).
        if self.timers.len() > 2 * self.conns.len() + 8 {
            let conns = &self.conns;
            self.timers
                .retain(|&Reverse((d, c))| conns[c as usize].timer_deadline == Some(d));
        }
    }

    /// Pop heap entries that no longer match their connection's deadline,
    /// so the top is always current.
    fn drop_stale_timers(&mut self) {
        while let Some(&Reverse((d, c))) = self.timers.peek() {
            if self.conns[c as usize].timer_deadline == Some(d) {
                break;
            }
            self.timers.pop();
        }
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) may have something
    /// to send: an ACK is due or a connection is queued to send (which may
    /// still find no window). `false` means it has nothing. A driver that
    /// holds its sends back for a moment (to let a reply carry an ACK)
    /// times the hold from when this first became true, not from when it
    /// last looked.
    pub fn wants_to_transmit(&self) -> bool {
        !self.ack_ready.is_empty() || !self.ready.is_empty()
    }

    /// Write the next datagram to send into `buf` (at least
    /// [`max_datagram_len`](Self::max_datagram_len) bytes). Call until `None`.
    pub fn poll_transmit(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<Transmit> {
        assert!(
            buf.len() >= self.max_datagram_len(),
            "transmit buffer smaller than max_datagram_len"
        );
        self.poll_out(now_ns, &mut Out::Bytes(buf))
    }

    /// Like [`poll_transmit`](Self::poll_transmit), but a data packet whose
    /// payload lies in one memory region leaves it there: the buffer gets
    /// the headers and the ICRC trailer, and [`Layout::Split`] says where the
    /// payload is, so a driver can send it with scatter/gather I/O instead
    /// of copying every payload byte once more. Other packets are written
    /// whole ([`Layout::Whole`]).
    pub fn poll_transmit_gather(
        &mut self,
        now_ns: u64,
        buf: &mut [u8],
    ) -> Option<(Transmit, Layout)> {
        assert!(
            buf.len() >= self.max_datagram_len(),
            "transmit buffer smaller than max_datagram_len"
        );
        let mut layout = Layout::Whole;
        let t = self.poll_out(now_ns, &mut Out::Gather(buf, &mut layout))?;
        Some((t, layout))
    }

    /// The payload bytes a [`Layout::Split`] transmit refers to. Empty if
    /// the region went away (it cannot while the caller holds the endpoint
    /// between polling and sending, which is how a driver uses it).
    pub fn payload(&self, payload: &PayloadRef) -> &[u8] {
        self.dev.regions.slice(payload.0).unwrap_or_default()
    }

    /// Like [`poll_transmit`](Self::poll_transmit), but the packet comes back
    /// as parsed headers and no payload is gathered (the simulator's form).
    /// `Transmit::len` is still the packet's full length on the wire.
    pub fn poll_packet(&mut self, now_ns: u64) -> Option<(Transmit, PacketRepr)> {
        let mut slot = PacketSlot::new();
        let t = self.poll_packet_into(now_ns, &mut slot)?;
        Some((
            t,
            slot.take().expect("a transmit always produces its packet"),
        ))
    }

    /// [`poll_packet`](Self::poll_packet) into a reused slot (read it with
    /// [`PacketSlot::packet`]): no allocation per ACK.
    pub fn poll_packet_into(&mut self, now_ns: u64, slot: &mut PacketSlot) -> Option<Transmit> {
        slot.clear();
        self.poll_out(now_ns, &mut Out::Repr(slot))
    }

    fn poll_out(&mut self, now_ns: u64, out: &mut Out<'_>) -> Option<Transmit> {
        self.set_time(now_ns);
        // ACKs first, whoever they are for. Taking them in the connections'
        // round robin held each behind one data packet per other busy
        // connection: in an all-to-all over 1024 hosts, behind a thousand
        // packets (335 us at 100 Gb/s), so every sender's RTT looked like
        // a deep queue and its probes and RTOs fired for nothing. ACKs are
        // a few percent of the bytes; a NIC answers them out of band.
        while let Some(c) = self.ack_ready.pop_front() {
            let slot = &mut self.conns[c as usize];
            slot.in_ack_ready = false;
            if let Some(t) = slot.conn.poll_ack(now_ns, &mut self.dev, out) {
                self.dev.stats.tx_datagrams += 1;
                self.dev.stats.tx_bytes += t.len as u64;
                self.mark_ready(c);
                return Some(t);
            }
        }
        while let Some(c) = self.ready.pop_front() {
            let slot = &mut self.conns[c as usize];
            slot.in_ready = false;
            let sent = slot.conn.poll_transmit(now_ns, &mut self.dev, out);
            if let Some(t) = &sent {
                self.dev.stats.tx_datagrams += 1;
                self.dev.stats.tx_bytes += t.len as u64;
                // One packet per connection per turn: peers share the NIC fairly.
                self.mark_ready(c);
                return sent;
            }
            // Nothing may go now (no window): it leaves the ready queue until
            // an ACK or a timer changes that; its deadline may have moved.
            debug_assert!(
                slot.conn.waiting_probes_have_a_timer(),
                "probes left queued without the pacing timer that would send them"
            );
            self.refresh_timer(c);
        }
        None
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) must be called.
    ///
    /// Connections' deadlines live in a heap, brought up to date here for
    /// the connections that changed since the last look, so an endpoint
    /// with thousands of peers (an incast receiver in the simulator) does
    /// not scan them all, and one that changed five times is looked at
    /// once.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        self.flush_timers();
        let conns = self.timers.peek().map(|Reverse((d, _))| *d);
        match (conns, self.dev.admission.regrant_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Fire every timer due at `now_ns`. Extra calls are harmless.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        self.set_time(now_ns);
        loop {
            // A connection fired below may be due again at once.
            self.flush_timers();
            let Some(&Reverse((d, c))) = self.timers.peek() else {
                break;
            };
            if d > now_ns {
                break;
            }
            self.timers.pop();
            // Clear first so mark_ready re-inserts whatever comes next.
            self.conns[c as usize].timer_deadline = None;
            self.conns[c as usize]
                .conn
                .on_timeout(now_ns, &mut self.dev);
            self.mark_ready(c);
        }
        self.push_grants(now_ns);
    }

    /// Room on our link was released: tell the senders below their share
    /// now (admission's rule 5).
    fn push_grants(&mut self, now_ns: u64) {
        let mut regrants = std::mem::take(&mut self.regrants);
        self.dev.admission.take_regrants(now_ns, &mut regrants);
        for &c in &regrants {
            let Some(slot) = self.conns.get_mut(c as usize) else {
                continue;
            };
            if slot.conn.push_grant() {
                self.dev.stats.grants_pushed += 1;
                self.mark_ready(c);
            }
        }
        regrants.clear();
        self.regrants = regrants;
    }

    /// Whether [`poll_completion`](Self::poll_completion) has something:
    /// a driver that polls often asks this first, cheaply.
    #[inline]
    pub fn has_completion(&self) -> bool {
        !self.dev.completions.is_empty()
    }

    /// The next work completion, in the order they happened.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.dev.completions.pop_front()
    }

    // --------------------------------------------------------- observation

    /// Connections (peers).
    pub fn connection_count(&self) -> usize {
        self.conns.len() - self.free_conns.len()
    }

    /// Every counter at this moment: the device's, and each open
    /// connection's with its controller's and its paths', ordered by peer.
    pub fn counters(&self) -> Counters {
        let mut connections: Vec<PeerCounters> = self
            .conn_by_peer
            .iter()
            .map(|(&peer, &c)| {
                let conn = &self.conns[c as usize].conn;
                PeerCounters {
                    peer,
                    connection: conn.stats(),
                    cc: conn.cc_metrics(),
                    paths: conn.path_stats(&self.dev),
                    rx_paths: conn.rx_path_stats(),
                }
            })
            .collect();
        connections.sort_by_key(|c| c.peer);
        Counters {
            device: self.dev.stats,
            connections,
        }
    }

    /// Counters of the connection to `peer`.
    pub fn connection_stats(&self, peer: SocketAddr) -> Option<ConnectionStats> {
        self.conn_by_peer
            .get(&peer)
            .map(|&c| self.conns[c as usize].conn.stats())
    }

    /// Per-path counters of the connection to `peer`, by slot.
    pub fn path_stats(&self, peer: SocketAddr) -> Option<Vec<PathStats>> {
        self.conn_by_peer
            .get(&peer)
            .map(|&c| self.conns[c as usize].conn.path_stats(&self.dev))
    }

    /// The congestion controller's view of the connection to `peer`.
    pub fn cc_metrics(&self, peer: SocketAddr) -> Option<crate::cc::CcMetrics> {
        self.conn_by_peer
            .get(&peer)
            .map(|&c| self.conns[c as usize].conn.cc_metrics())
    }

    /// Current source ports of the connection's paths, by slot.
    pub fn path_ports(&self, peer: SocketAddr) -> Option<Vec<u16>> {
        self.conn_by_peer.get(&peer).map(|&c| {
            let conn = &self.conns[c as usize].conn;
            (0..self.dev.config.paths_per_connection)
                .map(|slot| conn.path_port(slot, &self.dev))
                .collect()
        })
    }

    /// Bytes the connection to `peer` holds (paths, queues, controller).
    pub fn connection_memory_bytes(&self, peer: SocketAddr) -> Option<usize> {
        self.conn_by_peer.get(&peer).map(|&c| {
            // The slot's scheduling marks count as the connection's.
            size_of::<ConnSlot>() - size_of::<Connection>()
                + self.conns[c as usize].conn.memory_bytes()
        })
    }

    /// Bytes the receiver's admission state holds (one entry per sender
    /// heard from recently; counted apart from the connections).
    pub fn admission_memory_bytes(&self) -> usize {
        self.dev.admission.memory_bytes()
    }

    /// Bytes a QP holds.
    pub fn qp_memory_bytes(&self, qp: QpHandle) -> Option<usize> {
        self.qp(qp).map(|q| {
            size_of::<Option<Qp>>()
                + q.sq.capacity() * size_of::<SqEntry>()
                + q.rq.capacity() * size_of::<crate::qp::RqEntry>()
                + q.rx_window.capacity() * size_of::<Option<crate::qp::RxMessage>>()
        })
    }

    /// Send every delayed ACK with the next transmits instead of at its
    /// deadline: for a driver about to close the device, so that the last
    /// messages it received are acknowledged before it goes.
    pub fn ack_owed_now(&mut self) {
        let live: Vec<u32> = self.conn_by_peer.values().copied().collect();
        for c in live {
            self.conns[c as usize].conn.ack_owed_now();
            self.mark_ready(c);
        }
    }

    /// Whether any connection holds a delayed ACK (one waiting for its
    /// deadline).
    #[cfg(test)]
    fn ack_pending_anywhere(&self) -> bool {
        self.conn_by_peer
            .values()
            .any(|&c| self.conns[c as usize].conn.owes_delayed_ack())
    }

    /// Whether any connection still has work in flight: messages awaiting
    /// completion or an ACK, or ACKs owed.
    pub fn is_quiescent(&self) -> bool {
        self.conn_by_peer
            .values()
            .all(|&c| self.conns[c as usize].conn.is_quiescent())
    }

    /// Messages (requests awaiting completion, responses awaiting ACK) held
    /// toward `peer`; zero when the connection is idle.
    pub fn outstanding_messages(&self, peer: SocketAddr) -> Option<usize> {
        self.conn_by_peer
            .get(&peer)
            .map(|&c| self.conns[c as usize].conn.messages_held())
    }
}

fn sq_failed(e: &SqEntry) -> bool {
    matches!(e.state, SqState::Done(s) if s != WcStatus::Success)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Side;
    use crate::testing::fixture::{self, ALL, End, completions, lab, statuses};
    use crate::work::WrOp;

    fn write(wr_id: u64, from: &End, to: &End, len: u32) -> SendWr {
        SendWr::new(
            wr_id,
            WrOp::Write {
                remote_addr: to.mr.addr,
                rkey: to.mr.rkey,
            },
            vec![from.sge(0, len)],
        )
    }

    /// An ACK followed by a data packet in one datagram (wire.md 5.3) is
    /// taken as both; bytes after an ACK that do not parse are counted as
    /// malformed without losing the ACK.
    #[test]
    fn a_coalesced_ack_and_data_packet_are_both_taken() {
        use crate::transmit::PacketKind;
        // Without ACK copies: the answer to a connection's first packet
        // would otherwise go twice (a third datagram here).
        let no_copies = |seed| EndpointConfig {
            ack_copy_horizon_ns: 0,
            ..fixture::config(seed)
        };
        let mut l = lab(no_copies(1), no_copies(2));
        let (a, b) = (l.a, l.b);
        // A's write reaches B, which then owes A an ACK...
        l.pair.a.post_send(a.qp, write(1, &a, &b, 8)).unwrap();
        assert_eq!(l.pair.transfer(Side::A), 1);
        // ...and B answers with a write of its own: both in one datagram.
        l.pair.b.memory_mut(b.mr.handle).unwrap()[..8].fill(7);
        l.pair.b.post_send(b.qp, write(2, &b, &a, 8)).unwrap();
        let out = l.pair.poll_transmits(Side::B);
        let ack = out.iter().find(|(t, _)| t.kind == PacketKind::Ack).unwrap();
        let data = out
            .iter()
            .find(|(t, _)| t.kind == PacketKind::Data)
            .unwrap();
        assert_eq!(out.len(), 2, "{out:?}");
        let mut both = ack.1.clone();
        both.extend_from_slice(&data.1);
        assert_eq!(wire::first_packet_len(&both), ack.1.len());
        let before = *l.pair.a.stats();
        l.pair.deliver(Side::B, &data.0, &both);
        let after = *l.pair.a.stats();
        assert_eq!(after.rx_datagrams, before.rx_datagrams + 1);
        assert_eq!(after.rx_malformed, before.rx_malformed);
        assert_eq!(
            statuses(&mut l.pair, Side::A),
            [(1, WcStatus::Success)],
            "the ACK in front completed A's write"
        );
        assert_eq!(&l.pair.a.memory(a.mr.handle).unwrap()[..8], &[7; 8]);
        assert!(l.pair.settle(1_000, 1_000));
        let done = completions(&mut l.pair, Side::B);
        assert_eq!(done.iter().map(|c| c.wc.wr_id).collect::<Vec<_>>(), [2]);
        // An ACK with three stray bytes after it: the ACK is still taken.
        let mut stray = ack.1.clone();
        stray.extend_from_slice(&[1, 2, 3]);
        let before = *l.pair.a.stats();
        l.pair.deliver(Side::B, &ack.0, &stray);
        let after = *l.pair.a.stats();
        assert_eq!(after.rx_malformed, before.rx_malformed + 1);
        assert_eq!(after.rx_datagrams, before.rx_datagrams + 1);
    }

    /// A device about to close sends every delayed ACK at once, and is
    /// quiescent only once nothing is owed or in flight.
    #[test]
    fn acks_owed_leave_at_once_when_the_device_closes() {
        use crate::transmit::PacketKind;
        let slow_acks = EndpointConfig {
            ack_delay_ns: 1_000_000,
            ack_every_packets: 64,
            ..fixture::config(2)
        };
        let mut l = lab(fixture::config(1), slow_acks);
        let (a, b) = (l.a, l.b);
        assert!(l.pair.a.is_quiescent() && l.pair.b.is_quiescent());
        // A 64-packet WRITE over four paths: packets that ask for no ACK
        // leave B owing one until its delay.
        l.pair
            .a
            .post_send(a.qp, write(1, &a, &b, 64 * 1024))
            .unwrap();
        assert!(!l.pair.a.is_quiescent());
        let mut owed = 0;
        for _ in 0..10_000 {
            l.pair.transfer(Side::A);
            if l.pair.b.ack_pending_anywhere() {
                owed += 1;
                l.pair.b.ack_owed_now();
                let out = l.pair.poll_transmits(Side::B);
                assert!(out.iter().any(|(t, _)| t.kind == PacketKind::Ack));
                assert!(!l.pair.b.ack_pending_anywhere());
                for (t, bytes) in &out {
                    l.pair.deliver(Side::B, t, bytes);
                }
            }
            l.pair.transfer(Side::B);
            if !completions(&mut l.pair, Side::A).is_empty() {
                break;
            }
            l.pair.advance(1_000);
        }
        assert!(owed > 0, "B never owed a delayed ACK");
        assert!(l.pair.settle(10_000, 1_000));
        assert!(l.pair.a.is_quiescent() && l.pair.b.is_quiescent());
    }

    /// A packet that finds its path quiet for the ACK delay is acknowledged
    /// at once: holding its ACK would gather no other packet of the path,
    /// only add the delay to the sender's round trip. Packets that come
    /// together still share a delayed one.
    #[test]
    fn a_packet_on_a_quiet_path_is_acknowledged_at_once() {
        use crate::transmit::PacketKind;
        let one_path = |seed| EndpointConfig {
            paths_per_connection: 1,
            ..fixture::config(seed)
        };
        let mut l = lab(one_path(1), one_path(2));
        let (a, b) = (l.a, l.b);
        let delay_ns = one_path(2).ack_delay_ns;
        l.pair
            .a
            .post_send(a.qp, write(1, &a, &b, 32 * 1024))
            .unwrap();
        // The cold packet and its answer; then the window opens.
        l.pair.transfer(Side::A);
        l.pair.transfer(Side::B);
        let plain: Vec<_> = l
            .pair
            .poll_transmits(Side::A)
            .into_iter()
            .filter(|(t, bytes)| {
                t.kind == PacketKind::Data
                    && matches!(wire::parse(bytes), Ok(wire::Packet::Data { repr, .. })
                        if !repr.base.flags.contains(wire::Flags::ACK_REQUEST))
            })
            .collect();
        assert!(plain.len() >= 3, "{} plain data packets", plain.len());
        let acks_from_b = |l: &mut fixture::Lab| {
            let out = l.pair.poll_transmits(Side::B);
            out.iter()
                .filter(|(t, _)| t.kind == PacketKind::Ack)
                .count()
        };
        // Two back to back: the first found the path quiet (its ACK goes
        // now), the second waits for company.
        l.pair.advance(delay_ns);
        l.pair.deliver(Side::A, &plain[0].0, &plain[0].1);
        assert_eq!(acks_from_b(&mut l), 1);
        assert!(!l.pair.b.ack_pending_anywhere());
        l.pair.deliver(Side::A, &plain[1].0, &plain[1].1);
        assert_eq!(acks_from_b(&mut l), 0);
        assert!(l.pair.b.ack_pending_anywhere());
        // Its delay runs out, and the path stays quiet: the next packet's
        // ACK goes at once too, not a delay later.
        l.pair.advance(delay_ns);
        assert_eq!(acks_from_b(&mut l), 1);
        l.pair.deliver(Side::A, &plain[2].0, &plain[2].1);
        assert_eq!(acks_from_b(&mut l), 1);
        assert!(!l.pair.b.ack_pending_anywhere());
    }

    /// With `path_burst_bytes`, consecutive data packets take one path in
    /// runs of that many bytes before the next path's turn (so that a host
    /// stack can move each run as one GSO send); with 0, every packet
    /// takes the next path.
    #[test]
    fn data_packets_take_each_path_in_runs_of_path_burst_bytes() {
        use crate::transmit::PacketKind;
        let slots = |burst: u32| -> Vec<u8> {
            let cfg = |seed| EndpointConfig {
                path_burst_bytes: burst,
                ..fixture::config(seed)
            };
            let mut l = lab(cfg(1), cfg(2));
            let (a, b) = (l.a, l.b);
            l.pair
                .a
                .post_send(a.qp, write(1, &a, &b, 64 * 1024))
                .unwrap();
            // The cold packet and its answer; then the window opens.
            l.pair.transfer(Side::A);
            l.pair.transfer(Side::B);
            l.pair
                .poll_transmits(Side::A)
                .into_iter()
                .filter(|(t, _)| t.kind == PacketKind::Data)
                .filter_map(|(_, bytes)| match wire::parse(&bytes) {
                    Ok(wire::Packet::Data { repr, .. }) => Some(repr.base.path_slot),
                    _ => None,
                })
                .collect()
        };
        let runs =
            |v: &[u8]| -> Vec<usize> { v.chunk_by(|x, y| x == y).map(<[u8]>::len).collect() };
        let sprayed = slots(0);
        assert!(sprayed.len() >= 8, "{sprayed:?}");
        assert!(runs(&sprayed).iter().all(|&r| r == 1), "{sprayed:?}");
        // Three packets of 1,024 bytes and their headers fit 3.5 KiB; a
        // fourth would not.
        let bursts = slots(3 * 1024 + 512);
        assert!(bursts.len() >= 8, "{bursts:?}");
        let r = runs(&bursts);
        assert!(r[..r.len() - 1].iter().all(|&n| n == 3), "{bursts:?}");
        assert!(
            bursts
                .windows(2)
                .filter(|w| w[0] != w[1])
                .all(|w| (w[0] + 1) % 4 == w[1]),
            "{bursts:?}"
        );
    }

    /// Resends go one packet per path in turn even when new data goes in
    /// runs: a run of resends on a path that dies with the packets they
    /// replace would lose them all again.
    #[test]
    fn resends_go_one_packet_per_path_when_new_data_goes_in_runs() {
        use crate::testing::{Fate, Hop};
        let cfg = |seed| EndpointConfig {
            path_burst_bytes: 3 * 1024 + 512,
            ..fixture::config(seed)
        };
        let mut l = lab(cfg(1), cfg(2));
        let (a, b) = (l.a, l.b);
        let data_slot = |bytes: &[u8]| match wire::parse(bytes) {
            Ok(wire::Packet::Data { repr, .. }) => Some((
                repr.base.path_slot,
                repr.base.flags.contains(wire::Flags::RETRANSMIT),
            )),
            _ => None,
        };
        // Path 0 loses every first send: its runs of new data all go again.
        l.pair.set_filter(Some(Box::new(move |h: &Hop<'_>| {
            match (h.from, data_slot(h.bytes)) {
                (Side::A, Some((0, false))) => Fate::Drop,
                _ => Fate::Deliver,
            }
        })));
        l.pair.record(true);
        l.pair
            .a
            .post_send(a.qp, write(1, &a, &b, 64 * 1024))
            .unwrap();
        assert!(l.pair.settle(10_000, 1_000), "the WRITE did not complete");
        assert_eq!(statuses(&mut l.pair, Side::A), vec![(1, WcStatus::Success)]);
        let sent: Vec<(u8, bool)> = l
            .pair
            .sent(Side::A)
            .iter()
            .filter_map(|d| data_slot(d))
            .collect();
        // Resends other than the silent path's own probes (those go on the
        // path they probe, by design).
        let resent: Vec<u8> = sent
            .iter()
            .filter(|&&(s, r)| r && s != 0)
            .map(|(s, _)| *s)
            .collect();
        assert!(resent.len() >= 3, "{sent:?}");
        assert!(
            resent.windows(2).all(|w| w[0] != w[1]),
            "resends in a run on one path: {resent:?}"
        );
        // New data did go in runs.
        let first: Vec<u8> = sent.iter().filter(|(_, r)| !*r).map(|(s, _)| *s).collect();
        assert!(
            first.windows(3).any(|w| w[0] == w[1] && w[1] == w[2]),
            "{first:?}"
        );
    }

    /// A cold connection sends one packet until its receiver's first ACK;
    /// of a message longer than a packet that one is short
    /// (`cold_packet_bytes`), so that many newcomers at once fill little of
    /// the receiver's queue. The rest follows the ACK, and every byte lands.
    #[test]
    fn a_cold_connections_one_packet_is_short_and_the_rest_follows_the_ack() {
        use crate::transmit::PacketKind;
        let mut l = lab(fixture::config(1), fixture::config(2));
        let (a, b) = (l.a, l.b);
        let data: Vec<u8> = (0..4000u32).map(|i| (i * 7 + 3) as u8).collect();
        l.pair.a.memory_mut(a.mr.handle).unwrap()[..4000].copy_from_slice(&data);
        l.pair.a.post_send(a.qp, write(1, &a, &b, 4000)).unwrap();
        let sent = l.pair.poll_transmits(Side::A);
        let data_packets: Vec<_> = sent
            .iter()
            .filter(|(t, _)| t.kind == PacketKind::Data)
            .collect();
        assert_eq!(data_packets.len(), 1, "one packet while cold");
        let Ok(wire::Packet::Data { repr, .. }) = wire::parse(&data_packets[0].1) else {
            panic!("a data packet")
        };
        let cold = EndpointConfig::default().cold_packet_bytes;
        assert_eq!((repr.offset, repr.payload_len), (0, cold));
        for (t, bytes) in &sent {
            l.pair.deliver(Side::A, t, bytes);
        }
        assert!(l.pair.settle(100, 1_000));
        assert_eq!(statuses(&mut l.pair, Side::A), [(1, WcStatus::Success)]);
        assert_eq!(
            &l.pair.b.memory_mut(b.mr.handle).unwrap()[..4000],
            &data[..]
        );
        // 256 bytes, then 3,744 in four packets of at most 1 KiB.
        assert_eq!(l.pair.a.stats().data_packets_sent, 5);
        // A warm connection's next message is cut as before.
        l.pair.a.post_send(a.qp, write(2, &a, &b, 4000)).unwrap();
        assert!(l.pair.settle(100, 1_000));
        assert_eq!(l.pair.a.stats().data_packets_sent, 9);
    }

    /// A cold connection's short first packet goes twice, the copy on
    /// another path, when its message is longer than a bandwidth-delay
    /// product: the whole message waits on that packet. With the original
    /// lost, the copy's ACK opens the window and the message completes
    /// without waiting for a probe timeout (two base RTTs).
    #[test]
    fn a_long_messages_cold_packet_goes_twice_and_a_lost_one_costs_nothing() {
        use crate::transmit::PacketKind;
        // 10 Gb/s over a 10 us round trip: a BDP is 12.5 kB.
        let cfg = |seed| EndpointConfig {
            line_rate_bps: 10_000_000_000,
            ..fixture::config(seed)
        };
        let mut l = lab(cfg(1), cfg(2));
        let (a, b) = (l.a, l.b);
        let len = 32 << 10;
        let data: Vec<u8> = (0..len).map(|i| (i * 5 + 1) as u8).collect();
        l.pair.a.memory_mut(a.mr.handle).unwrap()[..len as usize].copy_from_slice(&data);
        l.pair.a.post_send(a.qp, write(1, &a, &b, len)).unwrap();
        let sent = l.pair.poll_transmits(Side::A);
        let data_packets: Vec<_> = sent
            .iter()
            .filter(|(t, _)| t.kind == PacketKind::Data)
            .collect();
        assert_eq!(data_packets.len(), 2, "the cold packet and its copy");
        let heads: Vec<_> = data_packets
            .iter()
            .map(|(t, bytes)| {
                let Ok(wire::Packet::Data { repr, .. }) = wire::parse(bytes) else {
                    panic!("a data packet")
                };
                (t.src_port, repr.offset, repr.payload_len)
            })
            .collect();
        let cold = EndpointConfig::default().cold_packet_bytes;
        assert_ne!(heads[0].0, heads[1].0, "two paths: {heads:?}");
        assert!(heads.iter().all(|h| (h.1, h.2) == (0, cold)), "{heads:?}");
        // The original is lost; only the copy arrives.
        let t0 = l.pair.now();
        let (t, bytes) = data_packets[1];
        l.pair.deliver(Side::A, t, bytes);
        assert!(l.pair.settle(100, 500));
        assert_eq!(statuses(&mut l.pair, Side::A), [(1, WcStatus::Success)]);
        assert_eq!(
            &l.pair.b.memory_mut(b.mr.handle).unwrap()[..len as usize],
            &data[..]
        );
        assert_eq!(l.pair.a.stats().probe_timeouts, 0);
        let base_rtt_ns = l.pair.a.config().base_rtt_ns;
        let done = l.pair.a.stats();
        assert!(
            l.pair.now() - t0 < 2 * base_rtt_ns,
            "took {} ns: {done:?}",
            l.pair.now() - t0
        );

        // A message within a BDP starts with one packet, as before.
        let mut l = lab(cfg(3), cfg(4));
        let (a, b) = (l.a, l.b);
        l.pair.a.post_send(a.qp, write(1, &a, &b, 8 << 10)).unwrap();
        let sent = l.pair.poll_transmits(Side::A);
        assert_eq!(
            sent.iter()
                .filter(|(t, _)| t.kind == PacketKind::Data)
                .count(),
            1
        );
    }

    #[test]
    fn a_trimmed_packet_is_nacked_and_resent_at_once() {
        use crate::transmit::PacketKind;
        let mut l = lab(fixture::config(1), fixture::config(2));
        let (a, b) = (l.a, l.b);
        l.pair.a.post_send(a.qp, write(1, &a, &b, 512)).unwrap();
        let sent = l.pair.poll_transmits(Side::A);
        let (t, bytes) = sent
            .iter()
            .find(|(t, _)| t.kind == PacketKind::Data)
            .expect("the WRITE's one packet");
        // A switch cut it to its header: B gets the header only.
        let Ok(wire::Packet::Data { repr, .. }) = wire::parse(bytes) else {
            panic!("a data packet")
        };
        let src = SocketAddr::new(l.pair.addr(Side::A).ip(), t.src_port);
        let now = l.pair.now();
        l.pair.b.handle_trimmed(now, src, &repr);
        assert_eq!(l.pair.b.stats().rx_trimmed, 1);
        // B's ACK names it at once, and A resends it with no time passing.
        let acks = l.pair.poll_transmits(Side::B);
        let (ack_t, ack_bytes) = acks
            .iter()
            .find(|(t, _)| t.kind == PacketKind::Ack)
            .expect("an ACK at once");
        let Ok(wire::Packet::Ack(ack)) = wire::parse(ack_bytes) else {
            panic!("an ACK")
        };
        assert_eq!(ack.trimmed(), Some((repr.psn, 1)), "{ack}");
        l.pair.deliver(Side::B, ack_t, ack_bytes);
        assert_eq!(l.pair.a.stats().trim_nacks, 1);
        let resent = l.pair.poll_transmits(Side::A);
        assert!(
            resent.iter().any(|(t, _)| t.kind == PacketKind::Data),
            "resent before any timer"
        );
        for (t, bytes) in &resent {
            l.pair.deliver(Side::A, t, bytes);
        }
        let (rt, rbytes) = resent
            .iter()
            .find(|(t, _)| t.kind == PacketKind::Data)
            .expect("checked above");
        assert!(l.pair.settle(10_000, 1_000));
        assert_eq!(completions(&mut l.pair, Side::A).len(), 1);
        let s = l.pair.a.stats();
        assert_eq!(
            (s.rtos, s.tail_probes, s.data_packets_retransmitted),
            (0, 0, 1)
        );
        // A trimmed copy of a packet B already has whole is not NACKed.
        let Ok(wire::Packet::Data { repr: again, .. }) = wire::parse(rbytes) else {
            panic!("a data packet")
        };
        let src = SocketAddr::new(l.pair.addr(Side::A).ip(), rt.src_port);
        l.pair.b.handle_trimmed(l.pair.now(), src, &again);
        assert_eq!(l.pair.b.stats().rx_trimmed, 1);
    }

    #[test]
    fn posts_are_refused_outright_for_what_no_completion_can_say() {
        let mut l = lab(fixture::config(1), fixture::config(2));
        let (a, b) = (l.a, l.b);
        let peer = l.pair.addr(Side::B);
        let ep = &mut l.pair.a;
        let stale = QpHandle(a.qp.qpn() ^ (1 << 16));
        assert_eq!(
            ep.post_send(stale, write(1, &a, &b, 8)),
            Err(PostError::UnknownQp(stale.qpn()))
        );
        let pd = ep.alloc_pd();
        let caps = QpCaps {
            max_send_wr: 1,
            max_recv_wr: 1,
        };
        let lone = ep.create_qp(pd, caps, ALL).unwrap();
        assert_eq!(
            ep.post_send(lone, write(1, &a, &b, 8)),
            Err(PostError::InvalidState(lone.qpn())),
            "not connected yet"
        );
        let inline_read = SendWr::inline(
            1,
            WrOp::Read {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![0; 8],
        );
        assert!(matches!(
            ep.post_send(a.qp, inline_read),
            Err(PostError::Invalid(_))
        ));
        let wide_atomic = SendWr::new(
            1,
            WrOp::FetchAdd {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
                add: 1,
            },
            vec![a.sge(0, 16)],
        );
        assert!(matches!(
            ep.post_send(a.qp, wide_atomic),
            Err(PostError::Invalid(_))
        ));
        let max = ep.config().max_message_bytes;
        let mut huge = write(1, &a, &b, max);
        huge.sg_list.push(a.sge(0, 1));
        assert_eq!(
            ep.post_send(a.qp, huge),
            Err(PostError::MessageTooLarge(u64::from(max) + 1))
        );
        // Nothing was queued by the refusals.
        assert!(ep.poll_completion().is_none());
        assert_eq!(ep.outstanding_messages(peer), Some(0));
    }

    #[test]
    fn a_bad_local_key_completes_in_order_and_flushes_the_rest() {
        let mut l = lab(fixture::config(1), fixture::config(2));
        let (a, b) = (l.a, l.b);
        let mut bad = write(2, &a, &b, 64);
        bad.sg_list[0].lkey ^= 1;
        l.pair.a.post_send(a.qp, write(1, &a, &b, 64)).unwrap();
        l.pair.a.post_send(a.qp, bad).unwrap();
        l.pair.a.post_send(a.qp, write(3, &a, &b, 64)).unwrap();
        assert!(
            completions(&mut l.pair, Side::A).is_empty(),
            "the error waits for the WRITE before it"
        );
        assert!(l.pair.settle(1_000, 1_000));
        let wcs = statuses(&mut l.pair, Side::A);
        assert_eq!(
            wcs,
            [
                (1, WcStatus::Success),
                (2, WcStatus::LocProtErr),
                (3, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(l.pair.a.qp_state(a.qp), Some(QpRunState::Error));
    }

    #[test]
    fn a_post_without_a_clock_is_stamped_with_the_latest_time() {
        // The connection's retry timer starts at the post that finds it
        // idle: its deadline shows the stamp.
        let retry_deadline = |stamp: Option<u64>| {
            let mut l = lab(fixture::config(1), fixture::config(2));
            let (a, b) = (l.a, l.b);
            l.pair.set_now(7_000_000);
            let wr = write(1, &a, &b, 64);
            match stamp {
                Some(t) => l.pair.a.post_send_at(t, a.qp, wr).unwrap(),
                None => l.pair.a.post_send(a.qp, wr).unwrap(),
            }
            l.pair.a.poll_timeout().unwrap()
        };
        let clockless = retry_deadline(None);
        assert_eq!(clockless, retry_deadline(Some(7_000_000)));
        assert_eq!(
            retry_deadline(Some(5_000_000)),
            clockless - 2_000_000,
            "an explicit time is taken as given"
        );
    }

    #[test]
    fn a_send_names_the_next_receive_and_completes_with_its_bytes() {
        let mut l = lab(fixture::config(1), fixture::config(2));
        let (a, b) = (l.a, l.b);
        for i in 0..2 {
            let recv = RecvWr {
                wr_id: 10 + i,
                sg_list: vec![b.sge(i * 1000, 1000)],
            };
            l.pair.b.post_recv(b.qp, recv).unwrap();
        }
        l.pair.a.memory_mut(a.mr.handle).unwrap()[..300].fill(7);
        l.pair
            .a
            .post_send(
                a.qp,
                SendWr::new(1, WrOp::SendImm { imm: 9 }, vec![a.sge(0, 300)]),
            )
            .unwrap();
        l.pair
            .a
            .post_send(a.qp, SendWr::new(2, WrOp::Send, vec![a.sge(0, 100)]))
            .unwrap();
        assert!(l.pair.settle(1_000, 1_000));
        let recvs: Vec<_> = completions(&mut l.pair, Side::B)
            .iter()
            .map(|c| (c.wc.wr_id, c.wc.opcode, c.wc.byte_len, c.wc.imm_data))
            .collect();
        assert_eq!(
            recvs,
            [
                (10, WcOpcode::Recv, 300, Some(9)),
                (11, WcOpcode::Recv, 100, None)
            ]
        );
        assert_eq!(l.pair.b.memory(b.mr.handle).unwrap()[..300], [7; 300]);
        assert_eq!(completions(&mut l.pair, Side::A).len(), 2);
    }
}
