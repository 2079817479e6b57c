//! [`NetComm`]: a [`Communicator`] driven over a MetaRoCE UDP device.
//!
//! The driver carries out the state machine's actions and feeds it the
//! device's completions:
//!
//! - [`Action::Write`] → one WRITE_WITH_IMM on the QP toward the peer, from
//!   the send, receive or staging region into the peer's staging region at
//!   the given offset, the [`WriteId`] as work-request id; every write is
//!   signaled, and its completion goes back as `on_write_done`;
//! - [`Action::Compute`] → the coll kernels, run on the regions' bytes in
//!   place under the device lock ([`LocalBuffers`]);
//! - a receive completion (WRITE_WITH_IMM) → `on_write_arrived(peer, imm,
//!   len)`, the peer known from the QP, and the receive is reposted at once
//!   (zero scatter entries: the data went to the staging region, the
//!   receive only carries the immediate).
//!
//! Waiting polls for [`NetConfig::poll_before_sleep`] (spinning or
//! yielding), then sleeps: by default armed on its CQ in `get_cq_event`
//! while the device's engine thread drives the sockets, or, with
//! [`NetConfig::sleep_on_socket`], on the device's receive socket in the
//! rank's own thread (`poll_cq_wait`: the datagram that wakes it is taken
//! in by the thread that wants it). Either way it wakes at least every [`ABORT_POLL`] to
//! look for an abort from the control channel ([`crate::control`]) or a
//! stall.

use crate::buffer::{BufferCache, DevBuf};
use crate::control::{ABORT_POLL, Control};
use crate::rig::{PeerAddr, Rig};
use crate::{CollNetError, NetConfig};
use metaroce_cm::RemoteBuf;
use metaroce_coll::{
    Action, Buf, CommConfig, CommStats, Communicator, Compute, LocalBuffers, OpId, OpSpec, Rank,
    Write, WriteId,
};
use metaroce_udp::{Device, DeviceStats};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, RecvWr,
    SendWr, VerbsError, WcOpcode, WcStatus, WorkCompletion, WrOp,
};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// One rank as the bootstrap saw it (for reports such as nccl-tests'
/// device lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Rank.
    pub rank: Rank,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// Device address (IP and MetaRoCE port).
    pub device: std::net::SocketAddr,
}

#[derive(Debug, Clone, Copy)]
struct PeerLink {
    qp: QueuePair,
    staging: RemoteBuf,
}

#[derive(Debug, Clone, Copy)]
struct OpBuffers {
    send: Option<MemoryRegion>,
    recv: Option<MemoryRegion>,
    /// The receive buffer's place among the symmetric buffers, for an
    /// operation on symmetric buffers (its direct writes go to the peers'
    /// buffer of the same place).
    recv_symmetric: Option<usize>,
}

/// Counters of the driver (the state machine's are [`CommStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// WRITE_WITH_IMMs posted.
    pub writes_posted: u64,
    /// Completions taken from the CQ.
    pub completions: u64,
    /// Times the rank slept waiting for a completion event.
    pub sleeps: u64,
    /// Buffer registrations made by [`NetComm::run_slices`]'s cache.
    pub cache_registrations: u64,
}

impl DriverStats {
    /// Every counter as `(name, value)`, in declaration order.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("writes_posted", self.writes_posted),
            ("completions", self.completions),
            ("sleeps", self.sleeps),
            ("cache_registrations", self.cache_registrations),
        ]
    }
}

/// One rank of a communicator over real sockets. Made by
/// [`crate::bootstrap::connect`].
pub struct NetComm {
    rank: Rank,
    world: u32,
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    comm: Communicator,
    staging: Option<MemoryRegion>,
    peers: Vec<Option<PeerLink>>,
    qpn_peer: HashMap<u32, Rank>,
    ops: HashMap<OpId, OpBuffers>,
    done: HashSet<OpId>,
    writes_outstanding: u64,
    wcs: Vec<WorkCompletion>,
    actions: Vec<Action>,
    computed: Vec<metaroce_coll::ComputeId>,
    copied: Vec<WriteId>,
    reposts: Vec<QueuePair>,
    control: Control,
    members: Vec<Member>,
    cache: BufferCache,
    /// Every symmetric buffer allocated, by place: each peer's buffer of
    /// that place (`None` for this rank, and once freed).
    symmetric: Vec<Option<Vec<Option<RemoteBuf>>>>,
    stall: Duration,
    poll_window: Duration,
    yield_polling: bool,
    sleep_on_socket: bool,
    failed: Option<String>,
    finished: bool,
    next_op: u64,
    stats: DriverStats,
}

impl std::fmt::Debug for NetComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device", &self.dev.addr())
            .finish()
    }
}

/// The send, receive and staging regions' bytes at once (absent ones
/// empty), for a computation.
fn local_buffers<'a>(
    ctx: &'a mut Context,
    send: Option<&MemoryRegion>,
    recv: Option<&MemoryRegion>,
    staging: Option<&MemoryRegion>,
) -> Option<LocalBuffers<'a>> {
    let (s, r, st): (&mut [u8], &mut [u8], &mut [u8]) = match (send, recv, staging) {
        (Some(a), Some(b), Some(c)) => {
            let [a, b, c] = ctx.mr_bytes_disjoint_mut([a, b, c])?;
            (a, b, c)
        }
        (None, Some(b), Some(c)) => {
            let [b, c] = ctx.mr_bytes_disjoint_mut([b, c])?;
            (Default::default(), b, c)
        }
        (Some(a), None, Some(c)) => {
            let [a, c] = ctx.mr_bytes_disjoint_mut([a, c])?;
            (a, Default::default(), c)
        }
        (Some(a), Some(b), None) => {
            let [a, b] = ctx.mr_bytes_disjoint_mut([a, b])?;
            (a, b, Default::default())
        }
        (Some(a), None, None) => {
            let [a] = ctx.mr_bytes_disjoint_mut([a])?;
            (a, Default::default(), Default::default())
        }
        (None, Some(b), None) => {
            let [b] = ctx.mr_bytes_disjoint_mut([b])?;
            (Default::default(), b, Default::default())
        }
        (None, None, Some(c)) => {
            let [c] = ctx.mr_bytes_disjoint_mut([c])?;
            (Default::default(), Default::default(), c)
        }
        (None, None, None) => (Default::default(), Default::default(), Default::default()),
    };
    Some(LocalBuffers {
        send: s,
        recv: r,
        staging: st,
    })
}

impl NetComm {
    pub(crate) fn new(
        rig: Rig,
        peers: Vec<Option<PeerAddr>>,
        control: Control,
        members: Vec<Member>,
        cfg: &NetConfig,
    ) -> Self {
        let rank = rig.comm.rank();
        let world = rig.comm.world();
        let mut qpn_peer = HashMap::new();
        let links = peers
            .iter()
            .enumerate()
            .map(|(q, p)| {
                let qp = rig.qps.get(q).copied().flatten()?;
                qpn_peer.insert(qp.qp_num(), q as Rank);
                p.as_ref().map(|p| PeerLink {
                    qp,
                    staging: p.staging,
                })
            })
            .collect();
        Self {
            rank,
            world,
            dev: rig.dev,
            pd: rig.pd,
            cq: rig.cq,
            comm: rig.comm,
            staging: rig.staging,
            peers: links,
            qpn_peer,
            ops: HashMap::new(),
            done: HashSet::new(),
            writes_outstanding: 0,
            wcs: vec![WorkCompletion::default(); 256],
            actions: Vec::new(),
            computed: Vec::new(),
            copied: Vec::new(),
            reposts: Vec::new(),
            control,
            members,
            cache: BufferCache::default(),
            symmetric: Vec::new(),
            stall: cfg.stall_timeout,
            poll_window: cfg.poll_before_sleep,
            yield_polling: cfg.yield_while_polling,
            sleep_on_socket: cfg.sleep_on_socket,
            failed: None,
            finished: false,
            next_op: 0,
            stats: DriverStats::default(),
        }
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// The communicator-wide settings (the same on every rank).
    pub fn config(&self) -> &CommConfig {
        self.comm.config()
    }

    /// Every rank of the job as the bootstrap saw it, by rank.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The state machine underneath (algorithm choice, counters).
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// The state machine's counters.
    pub fn comm_stats(&self) -> CommStats {
        self.comm.stats()
    }

    /// The driver's counters.
    pub fn driver_stats(&self) -> DriverStats {
        DriverStats {
            cache_registrations: self.cache.registrations,
            ..self.stats
        }
    }

    /// The device's counters.
    pub fn device_stats(&self) -> DeviceStats {
        self.dev.stats()
    }

    /// Every counter of the device, its connections (one per peer rank)
    /// and their paths.
    pub fn device_counters(&self) -> metaroce_udp::DeviceCounters {
        self.dev.counters()
    }

    /// The device's address.
    pub fn device_addr(&self) -> std::net::SocketAddr {
        self.dev.addr()
    }

    // --------------------------------------------------------------- buffers

    /// A zeroed buffer of `len` bytes registered with the device, for use
    /// as an operation's send or receive buffer.
    pub fn alloc(&mut self, len: u64) -> Result<DevBuf, CollNetError> {
        if len == 0 {
            return Ok(DevBuf::empty());
        }
        let pd = self.pd;
        let mr = self
            .dev
            .with(|ctx, _| ctx.reg_mr(pd, len, AccessFlags::LOCAL_WRITE))?;
        Ok(DevBuf {
            mr: Some(mr),
            len,
            symmetric: None,
        })
    }

    /// A zeroed receive buffer of `len` bytes that the peers may write
    /// into: a collective call, made by every rank in the same order with
    /// the same `len` (checked: a rank that asked for another size, or is
    /// at another buffer, fails them all with an error naming it).
    ///
    /// An operation on symmetric buffers ([`OpSpec::symmetric`], the same
    /// on every rank, each passing its buffer of the same place as its
    /// receive buffer) lets a peer write a message straight where it
    /// belongs instead of into a staging slot the receiver then copies
    /// out of (the all-gather halves of the ring and halving-doubling
    /// all-reduces).
    /// The peers learn the buffer's address and key here, through an
    /// all-gather over the communicator. Free it on every rank, once no
    /// operation using it is pending anywhere.
    pub fn alloc_symmetric(&mut self, len: u64) -> Result<DevBuf, CollNetError> {
        self.check_healthy()?;
        if len == 0 {
            return Err(CollNetError::Buffer("a symmetric buffer of 0 bytes".into()));
        }
        let pd = self.pd;
        let access = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);
        let mr = self.dev.with(|ctx, _| ctx.reg_mr(pd, len, access))?;
        let place = self.symmetric.len();
        match self.exchange_symmetric(place, len, mr.addr, mr.rkey) {
            Ok(peers) => {
                self.symmetric.push(Some(peers));
                Ok(DevBuf {
                    mr: Some(mr),
                    len,
                    symmetric: Some(place),
                })
            }
            Err(e) => {
                let _ = self.dev.with(|ctx, _| ctx.dereg_mr(mr));
                Err(e)
            }
        }
    }

    /// Every rank's address and key for its symmetric buffer of `place`
    /// (`None` for this rank), after checking that all of them are at
    /// that place with `len` bytes; a mismatch fails the communicator.
    fn exchange_symmetric(
        &mut self,
        place: usize,
        len: u64,
        addr: u64,
        rkey: u64,
    ) -> Result<Vec<Option<RemoteBuf>>, CollNetError> {
        let mut mine = [0u8; SYMMETRIC_ENTRY_BYTES];
        for (i, v) in [place as u64, len, addr, rkey].iter().enumerate() {
            mine[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        let mut all = vec![0u8; SYMMETRIC_ENTRY_BYTES * self.world as usize];
        let spec = OpSpec::new(
            metaroce_coll::Collective::AllGather,
            metaroce_coll::DataType::Uint8,
            metaroce_coll::ReduceOp::Sum,
            SYMMETRIC_ENTRY_BYTES as u64,
        );
        self.run_slices(spec, &mine, &mut all)?;
        let mut peers = vec![None; self.world as usize];
        for (q, entry) in all.chunks_exact(SYMMETRIC_ENTRY_BYTES).enumerate() {
            let v =
                |i: usize| u64::from_le_bytes(entry[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            let (their_place, their_len) = (v(0), v(1));
            if their_place != place as u64 || their_len != len {
                let e = CollNetError::Buffer(format!(
                    "symmetric buffers differ: rank {} allocated {len} bytes as its symmetric buffer {place}, rank {q} {their_len} bytes as its buffer {their_place}",
                    self.rank
                ));
                return Err(self.fail(e));
            }
            if q as Rank != self.rank {
                peers[q] = Some(RemoteBuf {
                    addr: v(2),
                    rkey: v(3),
                    len: their_len,
                });
            }
        }
        Ok(peers)
    }

    /// Releases a buffer; refused while a started operation uses it.
    pub fn free(&mut self, buf: DevBuf) -> Result<(), CollNetError> {
        let Some(mr) = buf.mr else { return Ok(()) };
        let in_use = self
            .ops
            .values()
            .any(|o| o.send == Some(mr) || o.recv == Some(mr));
        if in_use {
            // After a failure, the operation stays pending for good: say
            // why it never finished rather than only that it holds the
            // buffer.
            self.check_healthy()?;
            return Err(CollNetError::Buffer(
                "the buffer is in use by a pending operation".into(),
            ));
        }
        self.dev.with(|ctx, _| ctx.dereg_mr(mr))?;
        if let Some(place) = buf.symmetric {
            self.symmetric[place] = None;
        }
        Ok(())
    }

    /// Runs `f` on the buffer's bytes.
    pub fn with_buf<R>(&self, buf: &DevBuf, f: impl FnOnce(&[u8]) -> R) -> R {
        match &buf.mr {
            Some(mr) => self
                .dev
                .with(|ctx, _| f(&ctx.mr_bytes(mr)[..buf.len as usize])),
            None => f(&[]),
        }
    }

    /// Runs `f` on the buffer's bytes, writable (fill an input, clear an
    /// output). Do not change a buffer an operation in flight uses.
    pub fn with_buf_mut<R>(&self, buf: &DevBuf, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match &buf.mr {
            Some(mr) => self
                .dev
                .with(|ctx, _| f(&mut ctx.mr_bytes_mut(mr)[..buf.len as usize])),
            None => f(&mut []),
        }
    }

    /// Copies `buf`'s first `out.len()` bytes into `out`, a few MiB per
    /// hold of the device lock: between pieces the engine keeps receiving
    /// and acknowledging (a 256 MiB pass under one hold silenced the rank
    /// for half a second, long enough for its peers' transports to give
    /// up on it).
    pub fn read_buf(&self, buf: &DevBuf, out: &mut [u8]) {
        let Some(mr) = &buf.mr else { return };
        let n = out.len().min(buf.len as usize);
        for at in (0..n).step_by(COPY_PIECE_BYTES) {
            let end = (at + COPY_PIECE_BYTES).min(n);
            self.dev
                .with(|ctx, _| out[at..end].copy_from_slice(&ctx.mr_bytes(mr)[at..end]));
        }
    }

    /// Copies `bytes` into `buf` from its start, a few MiB per hold of the
    /// device lock (see [`read_buf`](Self::read_buf)). Do not change a
    /// buffer an operation in flight uses.
    pub fn write_buf(&self, buf: &DevBuf, bytes: &[u8]) {
        let Some(mr) = &buf.mr else { return };
        let n = bytes.len().min(buf.len as usize);
        for at in (0..n).step_by(COPY_PIECE_BYTES) {
            let end = (at + COPY_PIECE_BYTES).min(n);
            self.dev
                .with(|ctx, _| ctx.mr_bytes_mut(mr)[at..end].copy_from_slice(&bytes[at..end]));
        }
    }

    /// Runs `f` on two distinct buffers' bytes at once, both writable.
    pub fn with_bufs_mut<R>(
        &self,
        a: &DevBuf,
        b: &DevBuf,
        f: impl FnOnce(&mut [u8], &mut [u8]) -> R,
    ) -> Result<R, CollNetError> {
        let (la, lb) = (a.len as usize, b.len as usize);
        match (&a.mr, &b.mr) {
            (Some(x), Some(y)) => self.dev.with(|ctx, _| {
                let [p, q] = ctx
                    .mr_bytes_disjoint_mut([x, y])
                    .ok_or_else(|| CollNetError::Buffer("two views of one buffer".into()))?;
                Ok(f(&mut p[..la], &mut q[..lb]))
            }),
            (Some(x), None) => Ok(self
                .dev
                .with(|ctx, _| f(&mut ctx.mr_bytes_mut(x)[..la], &mut []))),
            (None, Some(y)) => Ok(self
                .dev
                .with(|ctx, _| f(&mut [], &mut ctx.mr_bytes_mut(y)[..lb]))),
            (None, None) => Ok(f(&mut [], &mut [])),
        }
    }

    // ------------------------------------------------------------ operations

    /// Starts `spec` (see `metaroce_coll`'s contract: every rank starts the
    /// same operations in the same order) on these buffers, sized as
    /// [`OpSpec::buffer_sizes`] says (at least; only that prefix is
    /// used). In place, `send` must be `None`. Returns at once; the
    /// operation progresses whenever the rank waits.
    pub fn start(
        &mut self,
        spec: OpSpec,
        send: Option<&DevBuf>,
        recv: Option<&DevBuf>,
    ) -> Result<OpId, CollNetError> {
        self.check_healthy()?;
        let sizes = spec.buffer_sizes(self.rank, self.world);
        let pick = |b: Option<&DevBuf>, need: u64, what: &str| -> Result<_, CollNetError> {
            match b {
                _ if need == 0 => Ok(None),
                Some(b) if b.len >= need => Ok(b.mr),
                Some(b) => Err(CollNetError::Buffer(format!(
                    "{what} buffer of {} bytes, the operation needs {need}",
                    b.len
                ))),
                None => Err(CollNetError::Buffer(format!(
                    "the operation needs a {need}-byte {what} buffer"
                ))),
            }
        };
        if spec.in_place && send.is_some_and(|s| !s.is_empty()) {
            return Err(CollNetError::Buffer(
                "an in-place operation takes no send buffer".into(),
            ));
        }
        let recv_symmetric = recv.and_then(|b| b.symmetric);
        if spec.symmetric
            && sizes.recv_bytes > 0
            && recv_symmetric.is_none_or(|p| self.symmetric.get(p).is_none_or(Option::is_none))
        {
            return Err(CollNetError::Buffer(
                "an operation on symmetric buffers needs a receive buffer from alloc_symmetric"
                    .into(),
            ));
        }
        let bufs = OpBuffers {
            send: pick(send, sizes.send_bytes, "send")?,
            recv: pick(recv, sizes.recv_bytes, "receive")?,
            recv_symmetric: recv_symmetric.filter(|_| spec.symmetric),
        };
        if bufs.send.is_some() && bufs.send == bufs.recv {
            return Err(CollNetError::Buffer(
                "send and receive buffers are the same: use an in-place operation".into(),
            ));
        }
        // The state machine numbers operations from 0 in start order; the
        // buffers must be known before its first action comes out.
        let id = OpId(self.next_op);
        self.ops.insert(id, bufs);
        match self.comm.start(spec) {
            Ok(got) => {
                assert_eq!(
                    got, id,
                    "the state machine numbers operations in start order"
                );
                self.next_op += 1;
                Ok(got)
            }
            Err(e) => {
                self.ops.remove(&id);
                Err(self.fail(e.into()))
            }
        }
    }

    /// Waits until operation `op` is finished on this rank.
    pub fn wait(&mut self, op: OpId) -> Result<(), CollNetError> {
        self.drive(|me| me.done.contains(&op))?;
        self.done.remove(&op);
        Ok(())
    }

    /// Waits until every started operation is finished on this rank.
    pub fn wait_all(&mut self) -> Result<(), CollNetError> {
        self.drive(|me| me.comm.is_idle())?;
        self.done.clear();
        Ok(())
    }

    /// Starts `spec` and waits for it.
    pub fn run(
        &mut self,
        spec: OpSpec,
        send: Option<&DevBuf>,
        recv: Option<&DevBuf>,
    ) -> Result<(), CollNetError> {
        let op = self.start(spec, send, recv)?;
        self.wait(op)
    }

    /// Runs `spec` on plain slices: they are copied into registered
    /// buffers kept for reuse (registered once, grown when a larger size
    /// comes), and the result copied back into `recv`. In place, `send`
    /// is ignored and `recv` holds the input.
    pub fn run_slices(
        &mut self,
        spec: OpSpec,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<(), CollNetError> {
        let sizes = spec.buffer_sizes(self.rank, self.world);
        if (!spec.in_place && (send.len() as u64) < sizes.send_bytes)
            || (recv.len() as u64) < sizes.recv_bytes
        {
            return Err(CollNetError::Buffer(format!(
                "slices of {} and {} bytes, the operation needs {} and {}",
                send.len(),
                recv.len(),
                sizes.send_bytes,
                sizes.recv_bytes
            )));
        }
        let sb = self.cached(false, sizes.send_bytes)?;
        let rb = self.cached(true, sizes.recv_bytes)?;
        let n_send = sizes.send_bytes as usize;
        let n_recv = sizes.recv_bytes as usize;
        self.write_buf(&sb, &send[..n_send]);
        self.write_buf(&rb, &recv[..n_recv]);
        let send_buf = (!spec.in_place)
            .then(|| sb.prefix(sizes.send_bytes))
            .flatten();
        let recv_buf = rb.prefix(sizes.recv_bytes);
        self.run(spec, send_buf.as_ref(), recv_buf.as_ref())?;
        self.read_buf(&rb, &mut recv[..n_recv]);
        Ok(())
    }

    fn cached(&mut self, recv: bool, len: u64) -> Result<DevBuf, CollNetError> {
        let have = if recv {
            self.cache.recv
        } else {
            self.cache.send
        };
        if let Some(b) = have
            && b.len >= len
        {
            return Ok(b);
        }
        if let Some(old) = have {
            self.free(old)?;
        }
        let b = self.alloc(len.max(have.map_or(0, |h| h.len * 2)))?;
        self.cache.registrations += 1;
        if recv {
            self.cache.recv = Some(b);
        } else {
            self.cache.send = Some(b);
        }
        Ok(b)
    }

    /// A barrier across all ranks.
    pub fn barrier(&mut self) -> Result<(), CollNetError> {
        let spec = OpSpec::new(
            metaroce_coll::Collective::Barrier,
            metaroce_coll::DataType::Uint8,
            metaroce_coll::ReduceOp::Sum,
            0,
        );
        self.run(spec, None, None)
    }

    /// Ends this rank's part in the job: waits until its own writes have
    /// completed, then for every other rank to get there too (so nobody
    /// closes a device a peer still writes to), then closes. Dropping a
    /// `NetComm` does the same, ignoring errors.
    pub fn finish(mut self) -> Result<(), CollNetError> {
        self.finish_inner()
    }

    fn finish_inner(&mut self) -> Result<(), CollNetError> {
        if std::mem::replace(&mut self.finished, true) {
            return Ok(());
        }
        if self.failed.is_none() {
            self.drive(|me| me.comm.is_idle() && me.writes_outstanding == 0)?;
        }
        self.control
            .finish(self.stall)
            .map_err(CollNetError::Aborted)
    }

    // --------------------------------------------------------------- driving

    fn check_healthy(&self) -> Result<(), CollNetError> {
        match &self.failed {
            Some(why) => Err(CollNetError::Aborted(format!(
                "the communicator failed earlier: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Records a failure of this rank and reports it to the others.
    fn fail(&mut self, e: CollNetError) -> CollNetError {
        if self.failed.is_none() {
            let why = match &e {
                CollNetError::Aborted(r) => r.clone(),
                other => format!("rank {} failed: {other}", self.rank),
            };
            if !matches!(e, CollNetError::Aborted(_)) {
                self.control.report_failure(&why);
            }
            self.failed = Some(why);
        }
        e
    }

    /// Runs actions and completions until `until` holds, sleeping on the
    /// CQ's completion events in between.
    fn drive(&mut self, until: impl Fn(&Self) -> bool) -> Result<(), CollNetError> {
        self.check_healthy()?;
        let mut last_progress = Instant::now();
        loop {
            match self.pump() {
                Ok(true) => last_progress = Instant::now(),
                Ok(false) => {}
                Err(e) => return Err(self.fail(e)),
            }
            if until(self) {
                return Ok(());
            }
            match self.poll_completions() {
                Ok(0) => {}
                Ok(_) => {
                    last_progress = Instant::now();
                    continue;
                }
                Err(e) => return Err(self.fail(e)),
            }
            if let Some(why) = self.control.aborted() {
                return Err(self.fail(CollNetError::Aborted(why)));
            }
            let idle = last_progress.elapsed();
            if idle >= self.stall {
                let e = CollNetError::Stalled {
                    rank: self.rank,
                    idle,
                };
                return Err(self.fail(e));
            }
            // Before sleeping, keep polling for a short while when allowed:
            // on a rank with a core of its own the answer to a small
            // message usually comes within microseconds, far sooner than
            // two thread wake-ups (engine, then this thread) deliver it.
            if !self.poll_window.is_zero() && idle < self.poll_window {
                if self.yield_polling {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            if self.sleep_on_socket {
                // Sleep on the device's receive socket in this thread
                // (`poll_cq_wait`): the datagram that completes our work
                // wakes this thread, which takes it in itself, rather than
                // waking the engine, which then wakes this thread.
                match self.wait_completions(ABORT_POLL.min(self.stall - idle)) {
                    Ok(0) => {}
                    Ok(_) => last_progress = Instant::now(),
                    Err(e) => return Err(self.fail(e)),
                }
                self.stats.sleeps += 1;
                continue;
            }
            // Arm, then look once more: a completion that landed between
            // the poll and the arm would not fire the event.
            let cq = self.cq;
            if let Err(e) = self.dev.req_notify_cq(cq, false) {
                return Err(self.fail(e.into()));
            }
            match self.poll_completions() {
                Ok(0) => {}
                Ok(_) => {
                    last_progress = Instant::now();
                    continue;
                }
                Err(e) => return Err(self.fail(e)),
            }
            self.stats.sleeps += 1;
            let _ = self.dev.get_cq_event(ABORT_POLL.min(self.stall - idle));
        }
    }

    /// Carries out every pending action; true if there were any.
    fn pump(&mut self) -> Result<bool, CollNetError> {
        let mut any = false;
        loop {
            self.actions.clear();
            while let Some(a) = self.comm.poll_action() {
                self.actions.push(a);
            }
            if self.actions.is_empty() {
                // Everything this pass posted leaves now, in one flush,
                // writes ahead of the ACKs the completions before made due.
                if any {
                    self.dev.flush();
                }
                return Ok(any);
            }
            any = true;
            self.computed.clear();
            self.copied.clear();
            let Self {
                dev,
                actions,
                computed,
                copied,
                ops,
                done,
                peers,
                staging,
                symmetric,
                writes_outstanding,
                stats,
                rank,
                ..
            } = self;
            dev.with_deferred(|ctx, _| -> Result<(), CollNetError> {
                for a in actions.drain(..) {
                    match a {
                        Action::Write(w) => {
                            let targets = Targets {
                                peers,
                                ops,
                                staging: staging.as_ref(),
                                symmetric,
                            };
                            if post_write(ctx, *rank, &targets, &w)? {
                                copied.push(w.id);
                            } else {
                                // Only uncopied writes are signaled.
                                *writes_outstanding += 1;
                            }
                            stats.writes_posted += 1;
                        }
                        Action::Compute(c) => {
                            run_compute(ctx, ops, staging.as_ref(), &c)?;
                            computed.push(c.id);
                        }
                        Action::Done(op) => {
                            ops.remove(&op);
                            done.insert(op);
                        }
                    }
                }
                Ok(())
            })?;
            // A write whose bytes were copied at post time no longer needs
            // its source: that is all its local completion means to the
            // state machine, so it hears of it now rather than a round
            // trip later (the transport's completion is then only counted).
            for i in 0..self.copied.len() {
                let id = self.copied[i];
                self.comm.on_write_done(id)?;
            }
            for i in 0..self.computed.len() {
                let id = self.computed[i];
                self.comm.on_compute_done(id)?;
            }
        }
    }

    /// Takes what the CQ holds and feeds it to the state machine; returns
    /// how many completions there were.
    fn poll_completions(&mut self) -> Result<usize, CollNetError> {
        let n = self.dev.poll_cq(self.cq, &mut self.wcs)?;
        self.take_completions(n)
    }

    /// Like [`poll_completions`](Self::poll_completions), but with none
    /// there, sleeps on the device's receive socket (and posts from other
    /// threads, and the transport's next deadline) for up to `max_wait`
    /// first.
    fn wait_completions(&mut self, max_wait: Duration) -> Result<usize, CollNetError> {
        let n = self.dev.poll_cq_wait(self.cq, &mut self.wcs, max_wait)?;
        self.take_completions(n)
    }

    /// Feeds the first `n` entries of `wcs` to the state machine.
    fn take_completions(&mut self, n: usize) -> Result<usize, CollNetError> {
        self.stats.completions += n as u64;
        self.reposts.clear();
        for i in 0..n {
            let wc = self.wcs[i];
            let peer = self.qpn_peer.get(&wc.qp_num).copied();
            if wc.status != WcStatus::Success {
                let what = if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    "a receive"
                } else {
                    "a write"
                };
                let hint = match wc.status {
                    WcStatus::RetryExcErr => " (the peer stopped answering)",
                    WcStatus::RemAccessErr => " (the peer refused the access)",
                    WcStatus::WrFlushErr => " (the connection had already failed)",
                    _ => "",
                };
                return Err(CollNetError::Transport {
                    rank: self.rank,
                    peer: peer.unwrap_or(u32::MAX),
                    what,
                    status: format!("{}{hint}", wc.status),
                });
            }
            match wc.opcode {
                WcOpcode::RdmaWrite => {
                    self.writes_outstanding -= 1;
                    if wc.wr_id & INLINE_WR == 0 {
                        self.comm.on_write_done(WriteId(wc.wr_id))?;
                    }
                }
                WcOpcode::RecvRdmaWithImm => {
                    let Some(peer) = peer else {
                        return Err(CollNetError::Bootstrap(format!(
                            "a receive completion on QP {:#x}, which is no peer's",
                            wc.qp_num
                        )));
                    };
                    let imm = wc.imm_data.unwrap_or(0);
                    self.comm
                        .on_write_arrived(peer, imm, u64::from(wc.byte_len))?;
                    if let Some(l) = &self.peers[peer as usize] {
                        self.reposts.push(l.qp);
                    }
                }
                other => {
                    return Err(CollNetError::Bootstrap(format!(
                        "unexpected completion {other:?} on QP {:#x}",
                        wc.qp_num
                    )));
                }
            }
        }
        if !self.reposts.is_empty() {
            let reposts = &self.reposts;
            let qpn_peer = &self.qpn_peer;
            // Deferred: the writes these completions lead to, posted next,
            // leave ahead of the ACKs for what arrived.
            self.dev.with_deferred(|ctx, _| -> Result<(), VerbsError> {
                for qp in reposts {
                    let wr = RecvWr {
                        wr_id: u64::from(qpn_peer[&qp.qp_num()]),
                        sg_list: Vec::new(),
                    };
                    ctx.post_recv(*qp, std::slice::from_ref(&wr))
                        .map_err(|(_, e)| e)?;
                }
                Ok(())
            })?;
        }
        Ok(n)
    }
}

fn region_of(
    ops: &HashMap<OpId, OpBuffers>,
    staging: Option<&MemoryRegion>,
    op: OpId,
    buf: Buf,
) -> Option<MemoryRegion> {
    match buf {
        Buf::Staging => staging.copied(),
        Buf::Send => ops.get(&op)?.send,
        Buf::Recv => ops.get(&op)?.recv,
    }
}

/// What each rank says about one symmetric buffer in
/// [`NetComm::alloc_symmetric`]'s all-gather: its place, length, address
/// and key (four little-endian u64).
const SYMMETRIC_ENTRY_BYTES: usize = 32;

/// Bytes copied into or out of a region per hold of the device lock.
const COPY_PIECE_BYTES: usize = 4 << 20;

/// Writes up to this many bytes go inline: copied at post time, so the
/// state machine may reuse their source at once.
const INLINE_MAX_BYTES: u64 = 4096;
/// Work-request id bit of an inline write (the state machine's write ids
/// are sequence numbers far below it). Such writes go unsignaled: their
/// source is free at post time, nothing waits on their completion, and the
/// peer may then hold their ACK for its own next write to carry
/// ([`NetConfig::deferred_ack_ns`](crate::NetConfig)).
const INLINE_WR: u64 = 1 << 63;

/// What a write may name: the peers' staging areas and symmetric
/// buffers, and this rank's buffers.
struct Targets<'a> {
    peers: &'a [Option<PeerLink>],
    ops: &'a HashMap<OpId, OpBuffers>,
    staging: Option<&'a MemoryRegion>,
    symmetric: &'a [Option<Vec<Option<RemoteBuf>>>],
}

impl Targets<'_> {
    /// The peer's buffer `w` writes into: its staging area, or for a
    /// direct write its symmetric buffer of the place this operation's
    /// receive buffer has here.
    fn remote(&self, rank: Rank, link: &PeerLink, w: &Write) -> Result<RemoteBuf, CollNetError> {
        if w.target != Buf::Recv {
            return Ok(link.staging);
        }
        self.ops
            .get(&w.op)
            .and_then(|o| o.recv_symmetric)
            .and_then(|p| self.symmetric.get(p)?.as_ref()?.get(w.peer as usize).copied().flatten())
            .ok_or_else(|| {
                CollNetError::Buffer(format!(
                    "rank {rank}: a direct write to rank {} outside an operation on symmetric buffers",
                    w.peer
                ))
            })
    }
}

/// Posts one WRITE_WITH_IMM; true when its bytes were copied at post time
/// (inline or zero-length), so its source is free already.
fn post_write(
    ctx: &mut Context,
    rank: Rank,
    targets: &Targets<'_>,
    w: &Write,
) -> Result<bool, CollNetError> {
    let (ops, staging) = (targets.ops, targets.staging);
    let link = targets
        .peers
        .get(w.peer as usize)
        .copied()
        .flatten()
        .ok_or_else(|| CollNetError::Buffer(format!("rank {rank} has no link to {}", w.peer)))?;
    let remote = targets.remote(rank, &link, w)?;
    if w.remote_offset.saturating_add(w.len) > remote.len {
        return Err(CollNetError::Buffer(format!(
            "rank {rank}: a {}-byte write at {} past the end of rank {}'s {}-byte buffer",
            w.len, w.remote_offset, w.peer, remote.len
        )));
    }
    let op = WrOp::WriteImm {
        remote_addr: remote.addr + w.remote_offset,
        rkey: remote.rkey,
        imm: w.imm,
    };
    let (mut wr, copied) = if w.len == 0 {
        (SendWr::new(w.id.0 | INLINE_WR, op, Vec::new()), true)
    } else {
        let mr = region_of(ops, staging, w.op, w.src.buf).ok_or_else(|| {
            CollNetError::Buffer(format!("write source {} has no registered buffer", w.src))
        })?;
        let len = u32::try_from(w.len)
            .map_err(|_| CollNetError::Buffer(format!("a {}-byte write", w.len)))?;
        if w.len <= INLINE_MAX_BYTES {
            let at = w.src.offset as usize;
            let bytes = ctx
                .mr_bytes(&mr)
                .get(at..at + len as usize)
                .ok_or_else(|| {
                    CollNetError::Buffer(format!("write source {} out of its buffer", w.src))
                })?
                .to_vec();
            (SendWr::inline(w.id.0 | INLINE_WR, op, bytes), true)
        } else {
            (
                SendWr::new(w.id.0, op, vec![mr.sge(w.src.offset, len)]),
                false,
            )
        }
    };
    wr.signaled = !copied;
    ctx.post_send(link.qp, std::slice::from_ref(&wr))
        .map_err(|(_, e)| CollNetError::Verbs(e))?;
    Ok(copied)
}

fn run_compute(
    ctx: &mut Context,
    ops: &HashMap<OpId, OpBuffers>,
    staging: Option<&MemoryRegion>,
    c: &Compute,
) -> Result<(), CollNetError> {
    let bufs = ops
        .get(&c.op)
        .ok_or_else(|| CollNetError::Buffer(format!("no buffers for operation {:?}", c.op)))?;
    let mut local = local_buffers(ctx, bufs.send.as_ref(), bufs.recv.as_ref(), staging)
        .ok_or_else(|| CollNetError::Buffer("an operation's buffer was freed".into()))?;
    local.execute(c)?;
    Ok(())
}

impl Drop for NetComm {
    fn drop(&mut self) {
        let _ = self.finish_inner();
    }
}
