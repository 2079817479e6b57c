//! perftest-style tests over the UDP datapath: the client (requester) and
//! server (responder) sides, result figures with perftest's semantics, and
//! the table formats. The `metaroce perf` command is a thin layer on this.
//!
//! Verification: both sides fill or check buffers with the same pattern,
//! a function of the byte offset and a seed the client sends in its Hello.
//! Message `k` uses slot `k % slots` of the buffer, so a slot's bytes are
//! the same whichever message last wrote them.

use crate::cm::{self, CmError, Done, Hello, MsgType, RemoteBuf, Report};
use crate::{Device, DeviceConfig, DeviceStats, Impair, UdpError, now_ns};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, QpAttr, QpInitAttr, QpState, QpType, QueuePair,
    RecvWr, SendWr, Sge, VerbsError, WcOpcode, WcStatus, WorkCompletion, WrOp,
};
use metaroce_verbs::{AuthConfig, EndpointConfig, QpCaps};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// The tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA WRITE bandwidth.
    WriteBw,
    /// RDMA WRITE ping-pong latency (WRITE with immediate, RTT/2).
    WriteLat,
    /// RDMA READ bandwidth.
    ReadBw,
    /// RDMA READ latency (full round trip).
    ReadLat,
    /// SEND bandwidth.
    SendBw,
    /// SEND ping-pong latency (RTT/2).
    SendLat,
    /// FETCH_ADD bandwidth.
    AtomicBw,
    /// FETCH_ADD latency (full round trip).
    AtomicLat,
}

impl Test {
    /// Every test.
    pub const ALL: [Self; 8] = [
        Self::WriteBw,
        Self::WriteLat,
        Self::ReadBw,
        Self::ReadLat,
        Self::SendBw,
        Self::SendLat,
        Self::AtomicBw,
        Self::AtomicLat,
    ];

    /// The subcommand name.
    pub fn name(self) -> &'static str {
        match self {
            Self::WriteBw => "write-bw",
            Self::WriteLat => "write-lat",
            Self::ReadBw => "read-bw",
            Self::ReadLat => "read-lat",
            Self::SendBw => "send-bw",
            Self::SendLat => "send-lat",
            Self::AtomicBw => "atomic-bw",
            Self::AtomicLat => "atomic-lat",
        }
    }

    /// The test named `s`.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }

    /// perftest's title line.
    pub fn title(self) -> &'static str {
        match self {
            Self::WriteBw => "RDMA_Write BW Test",
            Self::WriteLat => "RDMA_Write Latency Test",
            Self::ReadBw => "RDMA_Read BW Test",
            Self::ReadLat => "RDMA_Read Latency Test",
            Self::SendBw => "Send BW Test",
            Self::SendLat => "Send Latency Test",
            Self::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
            Self::AtomicLat => "Atomic FETCH_AND_ADD Latency Test",
        }
    }

    /// A latency test.
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Self::WriteLat | Self::ReadLat | Self::SendLat | Self::AtomicLat
        )
    }

    /// An atomic test (size is always 8).
    pub fn is_atomic(self) -> bool {
        matches!(self, Self::AtomicBw | Self::AtomicLat)
    }

    /// perftest's default message size.
    pub fn default_size(self) -> u64 {
        if self.is_atomic() {
            8
        } else if self.is_lat() {
            2
        } else {
            65_536
        }
    }

    /// perftest's default iteration count.
    pub fn default_iters(self) -> u64 {
        if self == Self::WriteBw { 5000 } else { 1000 }
    }
}

/// Parameters the client sends; the server adopts them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Params {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations (ignored when `duration_s > 0`).
    pub iters: u64,
    /// Run for this many seconds instead (0: by iterations).
    pub duration_s: u64,
    /// QPs.
    pub qps: u32,
    /// Outstanding work requests per QP.
    pub tx_depth: u32,
    /// Verify data.
    pub verify: bool,
    /// MTU payload bytes.
    pub mtu: u32,
    /// Paths per connection.
    pub paths: u32,
    /// Seed of the verification pattern.
    pub pattern_seed: u64,
}

/// Largest message size.
pub const MAX_SIZE: u64 = 64 << 20;
/// Most bytes of buffer per side.
const BUF_CAP: u64 = 64 << 20;
/// Most slots per buffer.
const MAX_SLOTS: u64 = 1024;
/// CQ moderation used for the peak figure (perftest's default).
pub const CQ_MOD: u64 = 100;

impl Params {
    /// Check ranges; the error is one line naming the option.
    pub fn validate(&self, test: Test) -> Result<(), String> {
        if test.is_atomic() && self.size != 8 {
            return Err(format!(
                "-s {}: atomic tests use 8-byte operands",
                self.size
            ));
        }
        if self.size == 0 || self.size > MAX_SIZE {
            return Err(format!("-s {} must be 1 ..= {MAX_SIZE}", self.size));
        }
        if self.duration_s == 0 && self.iters < 5 {
            return Err(format!("-n {} must be at least 5", self.iters));
        }
        if self.duration_s > 3600 {
            return Err(format!("-D {} must be at most 3600 s", self.duration_s));
        }
        if !(1..=64).contains(&self.qps) {
            return Err(format!("-q {} must be 1..=64", self.qps));
        }
        if !(1..=2048).contains(&self.tx_depth) {
            return Err(format!("-t {} must be 1..=2048", self.tx_depth));
        }
        if !(64..=65_000).contains(&self.mtu) {
            return Err(format!("--mtu {} must be 64..=65000", self.mtu));
        }
        if !(1..=128).contains(&self.paths) {
            return Err(format!("--paths {} must be 1..=128", self.paths));
        }
        Ok(())
    }

    fn slots(&self, test: Test) -> u64 {
        let by_cap = (BUF_CAP / self.size).clamp(1, MAX_SLOTS);
        let mut s = if self.duration_s == 0 {
            by_cap.min(self.iters)
        } else {
            by_cap
        };
        if test.is_atomic() {
            s = 64;
        }
        s.max(1)
    }
}

/// Local options of either side (not sent to the peer).
#[derive(Debug, Clone)]
pub struct LocalOpts {
    /// Receive-side impairment.
    pub impair: Option<Impair>,
    /// Seed of the core (keys, PSNs, ports).
    pub seed: u64,
    /// Device port (0: pick a free range).
    pub dev_port: u16,
    /// GSO / GRO allowed.
    pub offload: bool,
    /// Packet authentication (and optionally encryption) with this job
    /// secret; both sides must run the same.
    pub auth: Option<AuthOpts>,
}

/// Packet protection for a perf run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AuthOpts {
    /// The job's 32-byte secret.
    pub job_secret: [u8; 32],
    /// Encrypt payloads too.
    pub encrypt: bool,
}

impl std::fmt::Debug for AuthOpts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthOpts")
            .field("job_secret", &"<hidden>")
            .field("encrypt", &self.encrypt)
            .finish()
    }
}

/// The name a side's protection goes by in the connection manager.
fn auth_mode(auth: Option<&AuthOpts>) -> &'static str {
    match auth {
        None => "none",
        Some(a) if a.encrypt => "encrypted",
        Some(_) => "authenticated",
    }
}

impl Default for LocalOpts {
    fn default() -> Self {
        Self {
            impair: None,
            seed: crate::os_seed(),
            dev_port: 0,
            offload: true,
            auth: None,
        }
    }
}

/// A perf run failed.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Side channel.
    #[error(transparent)]
    Cm(#[from] CmError),
    /// Datapath.
    #[error(transparent)]
    Udp(#[from] UdpError),
    /// Verbs.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Anything else, with its message.
    #[error("{0}")]
    Other(String),
}

impl From<std::io::Error> for PerfError {
    fn from(e: std::io::Error) -> Self {
        Self::Cm(CmError::Io(e))
    }
}

/// Bandwidth figures (bytes per second; convert for display).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwFigures {
    /// Message size.
    pub size: u64,
    /// Completed operations.
    pub iters: u64,
    /// Best rate over any CQ_MOD completions, bytes/s.
    pub peak_bps: f64,
    /// size × iters ÷ (last completion − first post), bytes/s.
    pub avg_bps: f64,
    /// Million messages per second.
    pub msg_rate_mpps: f64,
}

/// Latency figures in microseconds (perftest semantics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatFigures {
    /// Message size.
    pub size: u64,
    /// Samples.
    pub iters: u64,
    /// Minimum.
    pub t_min: f64,
    /// Maximum (after dropping the 2 largest).
    pub t_max: f64,
    /// Median.
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation.
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// Transactions per second (duration mode).
    pub tps: f64,
}

impl LatFigures {
    /// perftest's statistics of samples in ns (sorted, top 2 dropped,
    /// percentiles at ceil(n p)).
    pub fn from_samples(size: u64, mut ns: Vec<u64>, elapsed_ns: u64) -> Self {
        let total = ns.len() as u64;
        ns.sort_unstable();
        let keep = ns.len().saturating_sub(2).max(1.min(ns.len()));
        ns.truncate(keep);
        let us: Vec<f64> = ns.iter().map(|&v| v as f64 / 1e3).collect();
        let n = us.len().max(1) as f64;
        let avg = us.iter().sum::<f64>() / n;
        let var = us.iter().map(|v| (v - avg) * (v - avg)).sum::<f64>() / n;
        let pct = |p: f64| -> f64 {
            if us.is_empty() {
                return 0.0;
            }
            let idx = ((us.len() as f64 * p).ceil() as usize).clamp(1, us.len()) - 1;
            us[idx]
        };
        Self {
            size,
            iters: total,
            t_min: us.first().copied().unwrap_or(0.0),
            t_max: us.last().copied().unwrap_or(0.0),
            t_typical: if us.is_empty() { 0.0 } else { us[us.len() / 2] },
            t_avg: avg,
            t_stdev: var.sqrt(),
            p99: pct(0.99),
            p99_9: pct(0.999),
            tps: if elapsed_ns > 0 {
                total as f64 * 1e9 / elapsed_ns as f64
            } else {
                0.0
            },
        }
    }
}

/// What a test measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Figures {
    /// A bandwidth test.
    Bw(BwFigures),
    /// A latency test.
    Lat(LatFigures),
}

/// One side's address line (perftest's `local address:` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrLine {
    /// Device address.
    pub dev: SocketAddr,
    /// QP number.
    pub qpn: u32,
    /// Remote key of the buffer.
    pub rkey: u64,
    /// Buffer address.
    pub vaddr: u64,
}

impl AddrLine {
    /// perftest-like rendering.
    pub fn render(&self, which: &str) -> String {
        format!(
            " {which} address: IP {} PORT {} QPN {:#06x} PSN 0x000000 RKey {:#018x} VAddr {:#018x}",
            self.dev.ip(),
            self.dev.port(),
            self.qpn,
            self.rkey,
            self.vaddr
        )
    }
}

/// A finished client session.
#[derive(Debug, Clone)]
pub struct Session {
    /// Figures.
    pub figures: Figures,
    /// Whether the data checked out (None: not checked).
    pub verified: Option<bool>,
    /// What was checked, or what differs.
    pub detail: String,
    /// Local and remote address lines (first QP).
    pub local: AddrLine,
    /// Remote.
    pub remote: AddrLine,
    /// The client device's counters.
    pub stats: DeviceStats,
    /// Datagrams the server counted as malformed.
    pub server_rx_malformed: u64,
}

// ------------------------------------------------------------ pattern

/// The verification pattern's bytes at `offset..offset + out.len()`.
pub fn fill_pattern(seed: u64, offset: u64, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        let pos = offset + i as u64;
        let w = mix(seed ^ (pos >> 3));
        *b = (w >> ((pos & 7) * 8)) as u8;
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    // Word-wise for speed: same bytes as fill_pattern.
    for (w, chunk) in v.chunks_mut(8).enumerate() {
        let bytes = mix(seed ^ w as u64).to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    v
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

// ------------------------------------------------------------ device setup

const ACCESS_ALL: AccessFlags = AccessFlags(0xf);

fn endpoint_config(p: &Params, local: &LocalOpts) -> EndpointConfig {
    let mut cfg = EndpointConfig {
        device_port: local.dev_port,
        mtu_payload_bytes: p.mtu,
        paths_per_connection: p.paths as usize,
        path_port_span: (p.paths as u16).max(32),
        seed: local.seed,
        ..EndpointConfig::default()
    };
    // Real sockets on a VM: a thread waits a scheduler tick (4 ms at
    // HZ=250) for its CPU often enough that an RTO below that fires on
    // healthy paths and retires them (measured: ~100 false RTOs per 4000 x
    // 64 KiB at 1 ms, none at 4 ms).
    cfg.base_rtt_ns = 50_000;
    cfg.rto_min_ns = 4_000_000;
    cfg.rto_max_ns = 200_000_000;
    cfg
}

struct Rig {
    dev: Device,
    cq: CompletionQueue,
    qps: Vec<QueuePair>,
    mr: MemoryRegion,
    auth: Option<AuthOpts>,
}

fn rig(
    bind_ip: IpAddr,
    p: &Params,
    local: &LocalOpts,
    buf_len: u64,
    fill: Option<u64>,
) -> Result<Rig, PerfError> {
    let mut ep = endpoint_config(p, local);
    ep.auth = local.auth.map(|a| AuthConfig {
        job_secret: a.job_secret,
        encrypt: a.encrypt,
        local_ip: bind_ip,
    });
    let mut dc = DeviceConfig::new(ep, bind_ip);
    dc.impair = local.impair;
    dc.gso = local.offload;
    dc.gro = local.offload;
    let dev = Device::start(dc)?;
    let depth = p.tx_depth.max(64) * 2;
    let r = dev.with(|ctx, _| -> Result<_, VerbsError> {
        let pd = ctx.alloc_pd();
        let mr = ctx.reg_mr(pd, buf_len, ACCESS_ALL)?;
        if let Some(seed) = fill {
            let pat = pattern(seed, buf_len as usize);
            ctx.mr_bytes_mut(&mr).copy_from_slice(&pat);
        }
        let cq = ctx.create_cq((depth as usize * p.qps as usize * 2).max(4096))?;
        let init = QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap: QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        };
        let mut qps = Vec::new();
        for _ in 0..p.qps {
            let qp = ctx.create_qp(pd, &init)?;
            ctx.modify_qp(
                qp,
                &QpAttr {
                    qp_state: Some(QpState::Init),
                    qp_access_flags: Some(ACCESS_ALL),
                    port_num: Some(1),
                    ..QpAttr::default()
                },
            )?;
            qps.push(qp);
        }
        Ok((cq, qps, mr))
    })?;
    Ok(Rig {
        dev,
        cq: r.0,
        qps: r.1,
        mr: r.2,
        auth: local.auth,
    })
}

fn connect(rig: &Rig, peer_ip: IpAddr, peer: &cm::Endpoint) -> Result<(), PerfError> {
    if peer.qpns.len() != rig.qps.len() {
        return Err(PerfError::Other(format!(
            "peer has {} QPs, this side {}",
            peer.qpns.len(),
            rig.qps.len()
        )));
    }
    let dest = SocketAddr::new(peer_ip, peer.device_port);
    rig.dev.with(|ctx, _| -> Result<(), VerbsError> {
        // The peer's session id enters the keys when packets are
        // authenticated; recording it is harmless otherwise.
        ctx.set_peer_session(dest, peer.session_id)?;
        let mtu = ctx.endpoint().config().mtu_payload_bytes.min(peer.mtu);
        for (qp, &qpn) in rig.qps.iter().zip(&peer.qpns) {
            ctx.modify_qp(
                *qp,
                &QpAttr {
                    qp_state: Some(QpState::Rtr),
                    dest_addr: Some(dest),
                    dest_qp_num: Some(qpn),
                    path_mtu: Some(mtu),
                    ..QpAttr::default()
                },
            )?;
            ctx.modify_qp(
                *qp,
                &QpAttr {
                    qp_state: Some(QpState::Rts),
                    timeout: Some(14),
                    retry_cnt: Some(7),
                    rnr_retry: Some(7),
                    ..QpAttr::default()
                },
            )?;
        }
        Ok(())
    })?;
    Ok(())
}

fn local_endpoint(rig: &Rig, p: &Params) -> cm::Endpoint {
    cm::Endpoint {
        device_port: rig.dev.addr().port(),
        path_port_span: (p.paths as u16).max(32),
        mtu: p.mtu,
        qpns: rig.qps.iter().map(QueuePair::qp_num).collect(),
        buf: RemoteBuf {
            addr: rig.mr.addr,
            rkey: rig.mr.rkey,
            len: rig.mr.length,
        },
        session_id: rig.dev.with(|ctx, _| ctx.session_id()),
        auth: auth_mode(rig.auth.as_ref()).into(),
    }
}

fn wc_error(wc: &WorkCompletion) -> PerfError {
    let hint = match wc.status {
        WcStatus::RetryExcErr => "; the peer stopped answering",
        WcStatus::RemAccessErr => "; the peer refused the access",
        _ => "",
    };
    PerfError::Other(format!(
        "QP {:#x}: work request {} failed: {} ({:?}){hint}",
        wc.qp_num, wc.wr_id, wc.status, wc.status
    ))
}

fn empty_wcs() -> Vec<WorkCompletion> {
    vec![
        WorkCompletion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm_data: None,
            qp_num: 0,
            src_qp: 0,
        };
        64
    ]
}

/// Without any completion for this long, a run gives up (the core's retry
/// limit normally ends it much sooner).
const STALL_NS: u64 = 30_000_000_000;

// ------------------------------------------------------------ client

/// Connect to a server at `server`, run one session of `test`, and return
/// what it measured. `last` tells the server no session follows.
pub fn run_client(
    test: Test,
    server: SocketAddr,
    p: &Params,
    local: &LocalOpts,
    last: bool,
) -> Result<Session, PerfError> {
    p.validate(test).map_err(PerfError::Other)?;
    let mut tcp = TcpStream::connect_timeout(&server, Duration::from_secs(5))
        .map_err(|e| PerfError::Other(format!("cannot reach server {server}: {e}")))?;
    tcp.set_nodelay(true)?;
    let my_ip = tcp.local_addr()?.ip();
    let peer_ip = tcp.peer_addr()?.ip();
    let slots = p.slots(test);
    let buf_len = if test.is_atomic() {
        slots * 8
    } else {
        slots * p.size
    };
    let fill = matches!(
        test,
        Test::WriteBw | Test::SendBw | Test::WriteLat | Test::SendLat
    )
    .then_some(p.pattern_seed);
    let rig = rig(my_ip, p, local, buf_len, fill)?;
    let hello = Hello {
        test: test.name().into(),
        params: p.clone(),
        endpoint: local_endpoint(&rig, p),
        last,
    };
    cm::send(&mut tcp, MsgType::Hello, &hello)?;
    let peer: cm::Endpoint = cm::recv(&mut tcp, MsgType::Accept)?;
    connect(&rig, peer_ip, &peer)?;
    let remote = peer.buf;
    let (figures, completed) = if test.is_lat() {
        client_lat(test, &rig, p, remote)?
    } else {
        client_bw(test, &rig, p, remote, slots)?
    };
    // Client-side verification (READ data lands here).
    let (mut verified, mut detail) = (None, String::new());
    if p.verify && matches!(test, Test::ReadBw | Test::ReadLat) {
        let n = if test == Test::ReadLat {
            1
        } else {
            completed.min(slots)
        };
        let len = (n * p.size) as usize;
        let expect = pattern(p.pattern_seed, len);
        let bad = rig
            .dev
            .with(|ctx, _| first_diff(&ctx.mr_bytes(&rig.mr)[..len], &expect));
        verified = Some(bad.is_none());
        detail = match bad {
            None => format!("{len} bytes read back intact"),
            Some(at) => format!("read data differs at byte {at}"),
        };
    }
    cm::send(&mut tcp, MsgType::Done, &Done { completed })?;
    let report: Report = cm::recv(&mut tcp, MsgType::Report)?;
    if let Some(v) = report.verified {
        verified = Some(v && verified.unwrap_or(true));
        if detail.is_empty() {
            detail = report.detail.clone();
        } else {
            detail = format!("{detail}; {}", report.detail);
        }
    }
    let local_line = AddrLine {
        dev: rig.dev.addr(),
        qpn: rig.qps[0].qp_num(),
        rkey: rig.mr.rkey,
        vaddr: rig.mr.addr,
    };
    let remote_line = AddrLine {
        dev: SocketAddr::new(peer_ip, peer.device_port),
        qpn: peer.qpns[0],
        rkey: remote.rkey,
        vaddr: remote.addr,
    };
    let stats = rig.dev.stats();
    if std::env::var_os("METAROCE_STATS").is_some() {
        let peer_dev = remote_line.dev;
        rig.dev.with(|ctx, _| {
            let ep = ctx.endpoint();
            eprintln!("client cc: {:?}", ep.cc_metrics(peer_dev));
            eprintln!("client connection: {:?}", ep.connection_stats(peer_dev));
        });
    }
    rig.dev.shutdown();
    Ok(Session {
        figures,
        verified,
        detail,
        local: local_line,
        remote: remote_line,
        stats,
        server_rx_malformed: report.rx_malformed,
    })
}

fn bw_wr(
    test: Test,
    k: u64,
    p: &Params,
    slots: u64,
    mr: &MemoryRegion,
    remote: RemoteBuf,
) -> SendWr {
    let slot = k % slots;
    match test {
        Test::AtomicBw | Test::AtomicLat => SendWr::new(
            k,
            WrOp::FetchAdd {
                remote_addr: remote.addr + slot * 8,
                rkey: remote.rkey,
                add: 1,
            },
            vec![mr.sge(slot * 8, 8)],
        ),
        _ => {
            let off = slot * p.size;
            let op = match test {
                Test::ReadBw | Test::ReadLat => WrOp::Read {
                    remote_addr: remote.addr + off,
                    rkey: remote.rkey,
                },
                Test::SendBw | Test::SendLat => WrOp::Send,
                _ => WrOp::Write {
                    remote_addr: remote.addr + off,
                    rkey: remote.rkey,
                },
            };
            SendWr::new(k, op, vec![mr.sge(off, p.size as u32)])
        }
    }
}

fn client_bw(
    test: Test,
    rig: &Rig,
    p: &Params,
    remote: RemoteBuf,
    slots: u64,
) -> Result<(Figures, u64), PerfError> {
    let nq = rig.qps.len();
    let depth = u64::from(p.tx_depth);
    let target = if p.duration_s == 0 { p.iters } else { u64::MAX };
    let mut outstanding = vec![0u64; nq];
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut wcs = empty_wcs();
    let start = now_ns();
    let end_at = (p.duration_s > 0).then(|| start + p.duration_s * 1_000_000_000);
    let mut marks = vec![start];
    let mut last_done = start;
    let mut last_progress = start;
    let mut batch: Vec<Vec<SendWr>> = vec![Vec::new(); nq];
    loop {
        let stop_posting = end_at.is_some_and(|e| now_ns() >= e);
        // Post as much as the depth allows, one lock for all QPs.
        let mut any = false;
        for (q, b) in batch.iter_mut().enumerate() {
            b.clear();
            while !stop_posting && outstanding[q] < depth && posted < target {
                // Message k goes on QP k % nq.
                if posted % nq as u64 != q as u64 {
                    break;
                }
                b.push(bw_wr(test, posted, p, slots, &rig.mr, remote));
                outstanding[q] += 1;
                posted += 1;
                any = true;
                if b.len() >= 32 {
                    break;
                }
            }
        }
        if any {
            rig.dev.with(|ctx, now| -> Result<(), PerfError> {
                for (q, b) in batch.iter().enumerate() {
                    if !b.is_empty() {
                        ctx.post_send_at(now, rig.qps[q], b)
                            .map_err(|(i, e)| PerfError::Other(format!("post_send #{i}: {e}")))?;
                    }
                }
                Ok(())
            })?;
        }
        let n = rig.dev.poll_cq(rig.cq, &mut wcs)?;
        let now = now_ns();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(wc_error(wc));
            }
            let q = rig
                .qps
                .iter()
                .position(|qp| qp.qp_num() == wc.qp_num)
                .unwrap_or(0);
            outstanding[q] = outstanding[q].saturating_sub(1);
            completed += 1;
            if completed.is_multiple_of(CQ_MOD) {
                marks.push(now);
            }
            last_done = now;
            last_progress = now;
        }
        if completed >= target || (stop_posting && outstanding.iter().all(|&o| o == 0)) {
            break;
        }
        if now.saturating_sub(last_progress) > STALL_NS {
            return Err(PerfError::Other(format!(
                "no completion for {} s ({completed} of {posted} done)",
                STALL_NS / 1_000_000_000
            )));
        }
    }
    let elapsed = last_done.saturating_sub(start).max(1) as f64 / 1e9;
    let bytes = (completed * p.size) as f64;
    let peak = peak_bps(&marks, CQ_MOD * p.size);
    let avg = bytes / elapsed;
    Ok((
        Figures::Bw(BwFigures {
            size: p.size,
            iters: completed,
            // A run shorter than the window, or one whose only full window
            // caught a slow stretch, still reports a peak no lower than its
            // average (as perftest does).
            peak_bps: peak.max(avg),
            avg_bps: avg,
            msg_rate_mpps: completed as f64 / elapsed / 1e6,
        }),
        completed,
    ))
}

/// The best rate over any stretch of at least [`PEAK_WINDOW_NS`] between
/// completion marks (`marks[i]`: when the `i * bytes_per_mark`-th byte
/// completed). perftest takes its peak over one CQ-moderation interval;
/// completions arrive in bursts (one ACK completes many WRs), so over a
/// single interval that reads far above the link; a millisecond window
/// keeps the figure a rate the transfer really held.
fn peak_bps(marks: &[u64], bytes_per_mark: u64) -> f64 {
    let mut best = 0.0f64;
    let mut j = 0;
    for i in 0..marks.len() {
        j = j.max(i + 1);
        while j < marks.len() && marks[j] - marks[i] < PEAK_WINDOW_NS {
            j += 1;
        }
        if j == marks.len() {
            break;
        }
        let bytes = (j - i) as u64 * bytes_per_mark;
        best = best.max(bytes as f64 / ((marks[j] - marks[i]) as f64 / 1e9));
    }
    best
}

/// Shortest stretch the peak bandwidth is measured over.
const PEAK_WINDOW_NS: u64 = 1_000_000;

fn post_recvs(
    rig: &Rig,
    qp: QueuePair,
    sges: impl Iterator<Item = (u64, Vec<Sge>)>,
) -> Result<(), PerfError> {
    let wrs: Vec<RecvWr> = sges
        .map(|(wr_id, sg_list)| RecvWr { wr_id, sg_list })
        .collect();
    rig.dev.with(|ctx, _| {
        ctx.post_recv(qp, &wrs)
            .map_err(|(i, e)| PerfError::Other(format!("post_recv #{i}: {e}")))
    })
}

/// Receives kept posted on each side of a ping-pong.
const PP_RECVS: u64 = 16;

fn client_lat(
    test: Test,
    rig: &Rig,
    p: &Params,
    remote: RemoteBuf,
) -> Result<(Figures, u64), PerfError> {
    let qp = rig.qps[0];
    let pingpong = matches!(test, Test::WriteLat | Test::SendLat);
    let recv_sge = |_: u64| -> Vec<Sge> {
        if test == Test::SendLat {
            vec![rig.mr.sge(0, p.size as u32)]
        } else {
            Vec::new()
        }
    };
    if pingpong {
        post_recvs(rig, qp, (0..PP_RECVS).map(|i| (i, recv_sge(i))))?;
    }
    let target = if p.duration_s == 0 { p.iters } else { u64::MAX };
    let start = now_ns();
    let end_at = (p.duration_s > 0).then(|| start + p.duration_s * 1_000_000_000);
    let mut samples = Vec::with_capacity(target.min(1 << 20) as usize);
    let mut wcs = empty_wcs();
    let mut k = 0u64;
    while k < target && end_at.is_none_or(|e| now_ns() < e) {
        let wr = match test {
            Test::WriteLat => {
                let mut w = SendWr::new(
                    k,
                    WrOp::WriteImm {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                        imm: k as u32,
                    },
                    vec![rig.mr.sge(0, p.size as u32)],
                );
                w.signaled = false;
                w
            }
            Test::SendLat => {
                let mut w = SendWr::new(k, WrOp::Send, vec![rig.mr.sge(0, p.size as u32)]);
                w.signaled = false;
                w
            }
            _ => bw_wr(test, k, p, 1, &rig.mr, remote),
        };
        let t0 = now_ns();
        rig.dev.with(|ctx, now| {
            ctx.post_send_at(now, qp, std::slice::from_ref(&wr))
                .map_err(|(_, e)| PerfError::Other(format!("post_send: {e}")))
        })?;
        // Wait for the answer: a receive (ping-pong) or the completion.
        let t1 = loop {
            let n = rig.dev.poll_cq(rig.cq, &mut wcs)?;
            let mut got = None;
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    return Err(wc_error(wc));
                }
                let is_recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
                if pingpong == is_recv {
                    got = Some(now_ns());
                }
            }
            if let Some(t) = got {
                break t;
            }
            if now_ns().saturating_sub(t0) > STALL_NS {
                return Err(PerfError::Other("no answer for 30 s".into()));
            }
        };
        if pingpong {
            post_recvs(rig, qp, std::iter::once((k + PP_RECVS, recv_sge(k))))?;
        }
        let rtt = t1 - t0;
        samples.push(if pingpong { rtt / 2 } else { rtt });
        k += 1;
    }
    let elapsed = now_ns() - start;
    Ok((
        Figures::Lat(LatFigures::from_samples(p.size, samples, elapsed)),
        k,
    ))
}

// ------------------------------------------------------------ server

/// A finished server session.
#[derive(Debug, Clone)]
pub struct ServerSession {
    /// The test.
    pub test: Test,
    /// Its parameters.
    pub params: Params,
    /// What the server sent back.
    pub report: Report,
    /// Server (local) and client (remote) address lines.
    pub local: AddrLine,
    /// Remote.
    pub remote: AddrLine,
    /// The server device's counters.
    pub stats: DeviceStats,
}

/// Serve sessions of `test` on `listener` until a client marks its session
/// as the last one. `on_session` sees each finished session.
pub fn serve(
    listener: &TcpListener,
    test: Test,
    local: &LocalOpts,
    on_session: &mut dyn FnMut(&ServerSession),
) -> Result<(), PerfError> {
    loop {
        let (mut tcp, _) = listener.accept()?;
        tcp.set_nodelay(true)?;
        let hello: Hello = cm::recv(&mut tcp, MsgType::Hello)?;
        let refuse = |tcp: &mut TcpStream, msg: String| -> PerfError {
            let _ = cm::send(tcp, MsgType::Error, &msg);
            PerfError::Other(msg)
        };
        if hello.test != test.name() {
            return Err(refuse(
                &mut tcp,
                format!(
                    "server runs {}, client asked for {}",
                    test.name(),
                    hello.test
                ),
            ));
        }
        if let Err(e) = hello.params.validate(test) {
            return Err(refuse(&mut tcp, e));
        }
        let mine = auth_mode(local.auth.as_ref());
        if hello.endpoint.auth != mine {
            return Err(refuse(
                &mut tcp,
                format!(
                    "packet protection differs: server runs {mine}, client {} (--auth / --encrypt and METAROCE_JOB_SECRET must match)",
                    hello.endpoint.auth
                ),
            ));
        }
        let s = server_session(&mut tcp, test, &hello, local)?;
        on_session(&s);
        if hello.last {
            return Ok(());
        }
    }
}

fn server_session(
    tcp: &mut TcpStream,
    test: Test,
    hello: &Hello,
    local: &LocalOpts,
) -> Result<ServerSession, PerfError> {
    let p = &hello.params;
    let my_ip = tcp.local_addr()?.ip();
    let peer_ip = tcp.peer_addr()?.ip();
    let slots = p.slots(test);
    let buf_len = if test.is_atomic() {
        slots * 8
    } else {
        slots * p.size
    };
    let fill = matches!(test, Test::ReadBw | Test::ReadLat).then_some(p.pattern_seed);
    let rig = rig(my_ip, p, local, buf_len, fill)?;
    connect(&rig, peer_ip, &hello.endpoint)?;
    let nq = rig.qps.len() as u64;
    let pingpong = matches!(test, Test::WriteLat | Test::SendLat);
    let recv_sge = |j: u64, q: u64| -> Vec<Sge> {
        match test {
            Test::SendBw => {
                let slot = (j * nq + q) % slots;
                vec![rig.mr.sge(slot * p.size, p.size as u32)]
            }
            Test::SendLat => vec![rig.mr.sge(0, p.size as u32)],
            _ => Vec::new(),
        }
    };
    let mut posted_recv = vec![0u64; rig.qps.len()];
    let initial = if test == Test::SendBw {
        u64::from(p.tx_depth.max(64)) * 2
    } else {
        PP_RECVS
    };
    if test == Test::SendBw || pingpong {
        for (q, qp) in rig.qps.iter().enumerate() {
            post_recvs(&rig, *qp, (0..initial).map(|j| (j, recv_sge(j, q as u64))))?;
            posted_recv[q] = initial;
        }
    }
    cm::send(tcp, MsgType::Accept, &local_endpoint(&rig, p))?;
    let mut bad = None;
    let mut received = 0u64;
    let done: Done = if test == Test::SendBw || pingpong {
        let expect = (test == Test::SendBw && p.verify)
            .then(|| pattern(p.pattern_seed, (slots * p.size) as usize));
        let mut wcs = empty_wcs();
        let mut spins = 0u32;
        tcp.set_nonblocking(true)?;
        loop {
            let n = rig.dev.poll_cq(rig.cq, &mut wcs)?;
            let mut repost: Vec<(usize, u64)> = Vec::new();
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    if wc.status == WcStatus::WrFlushErr {
                        continue;
                    }
                    return Err(wc_error(wc));
                }
                if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    continue;
                }
                received += 1;
                let q = rig
                    .qps
                    .iter()
                    .position(|qp| qp.qp_num() == wc.qp_num)
                    .unwrap_or(0);
                if let Some(exp) = &expect
                    && bad.is_none()
                {
                    let slot = (wc.wr_id * nq + q as u64) % slots;
                    let off = (slot * p.size) as usize;
                    let len = p.size as usize;
                    let diff = rig.dev.with(|ctx, _| {
                        first_diff(&ctx.mr_bytes(&rig.mr)[off..off + len], &exp[off..off + len])
                    });
                    if let Some(at) = diff {
                        bad = Some(format!("message {} differs at byte {at}", wc.wr_id));
                    } else if wc.byte_len as u64 != p.size {
                        bad = Some(format!("message {} has {} bytes", wc.wr_id, wc.byte_len));
                    }
                }
                repost.push((q, wc.wr_id));
                if pingpong {
                    let mut w = if test == Test::WriteLat {
                        SendWr::new(
                            wc.wr_id,
                            WrOp::WriteImm {
                                remote_addr: hello.endpoint.buf.addr,
                                rkey: hello.endpoint.buf.rkey,
                                imm: 0,
                            },
                            vec![rig.mr.sge(0, p.size as u32)],
                        )
                    } else {
                        SendWr::new(wc.wr_id, WrOp::Send, vec![rig.mr.sge(0, p.size as u32)])
                    };
                    w.signaled = false;
                    let qp = rig.qps[q];
                    rig.dev.with(|ctx, now| {
                        ctx.post_send_at(now, qp, std::slice::from_ref(&w))
                            .map_err(|(_, e)| PerfError::Other(format!("post_send: {e}")))
                    })?;
                }
            }
            for (q, _) in repost {
                let j = posted_recv[q];
                posted_recv[q] += 1;
                post_recvs(
                    &rig,
                    rig.qps[q],
                    std::iter::once((j, recv_sge(j, q as u64))),
                )?;
            }
            spins += 1;
            if n == 0 && spins >= 64 {
                spins = 0;
                let mut b = [0u8; 1];
                match tcp.peek(&mut b) {
                    Ok(0) => return Err(PerfError::Other("client closed the side channel".into())),
                    Ok(_) => {
                        tcp.set_nonblocking(false)?;
                        break cm::recv(tcp, MsgType::Done)?;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    } else {
        cm::recv(tcp, MsgType::Done)?
    };
    // Server-side verification.
    let (verified, detail) = if !p.verify && test != Test::AtomicLat && test != Test::AtomicBw {
        (None, String::new())
    } else {
        match test {
            Test::WriteBw => {
                let len = (done.completed.min(slots) * p.size) as usize;
                let expect = pattern(p.pattern_seed, len);
                let diff = rig
                    .dev
                    .with(|ctx, _| first_diff(&ctx.mr_bytes(&rig.mr)[..len], &expect));
                match diff {
                    None => (Some(true), format!("{len} bytes written intact")),
                    Some(at) => (Some(false), format!("written data differs at byte {at}")),
                }
            }
            Test::SendBw => {
                if let Some(b) = bad {
                    (Some(false), b)
                } else if received != done.completed {
                    (
                        Some(false),
                        format!("{received} messages received, {} sent", done.completed),
                    )
                } else {
                    (Some(true), format!("{received} messages received intact"))
                }
            }
            Test::AtomicBw | Test::AtomicLat => {
                let sum: u64 = rig.dev.with(|ctx, _| {
                    ctx.mr_bytes(&rig.mr)
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .sum()
                });
                (
                    Some(sum == done.completed),
                    format!("counters sum to {sum}, {} fetch-adds done", done.completed),
                )
            }
            _ => (None, String::new()),
        }
    };
    let stats = rig.dev.stats();
    if std::env::var_os("METAROCE_STATS").is_some() {
        eprintln!("server stats: {stats:?}");
    }
    let report = Report {
        verified,
        detail,
        rx_malformed: stats.endpoint.rx_malformed,
    };
    cm::send(tcp, MsgType::Report, &report)?;
    // Wait for the client to close so its last ACKs are not lost to a
    // device shut down under them.
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = tcp.read(&mut [0u8; 1]);
    let local_line = AddrLine {
        dev: rig.dev.addr(),
        qpn: rig.qps[0].qp_num(),
        rkey: rig.mr.rkey,
        vaddr: rig.mr.addr,
    };
    let remote_line = AddrLine {
        dev: SocketAddr::new(peer_ip, hello.endpoint.device_port),
        qpn: hello.endpoint.qpns[0],
        rkey: hello.endpoint.buf.rkey,
        vaddr: hello.endpoint.buf.addr,
    };
    rig.dev.shutdown();
    Ok(ServerSession {
        test,
        params: p.clone(),
        report,
        local: local_line,
        remote: remote_line,
        stats,
    })
}

// ------------------------------------------------------------ output

/// perftest's dashed line.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's header block for a test (title and settings).
pub fn header(test: Test, p: &Params, local: &LocalOpts) -> String {
    let mut s = String::new();
    s.push_str(RESULT_LINE);
    s.push('\n');
    s.push_str(&format!("                    {}\n", test.title()));
    s.push_str(" Dual-port       : OFF\t\tDevice         : metaroce-udp\n");
    s.push_str(&format!(
        " Number of qps   : {}\t\tTransport type : MetaRoCE/UDP\n",
        p.qps
    ));
    s.push_str(" Connection type : RC\t\tUsing SRQ      : OFF\n");
    s.push_str(" PCIe relax order: OFF\t\tLock-free      : OFF\n");
    s.push_str(&format!(" TX depth        : {}\n", p.tx_depth));
    s.push_str(&format!(" CQ Moderation   : {CQ_MOD}\n"));
    s.push_str(&format!(" Mtu             : {}[B]\n", p.mtu));
    s.push_str(" Link type       : Ethernet\n");
    s.push_str(&format!(" Paths           : {}\n", p.paths));
    s.push_str(" Max inline data : 0[B]\n");
    s.push_str(" rdma_cm QPs\t : OFF\n");
    s.push_str(" Data ex. method : Ethernet (TCP side channel)\n");
    s.push_str(&format!(
        " Packet auth     : {}\n",
        match auth_mode(local.auth.as_ref()) {
            "none" => "OFF (ICRC only)",
            "authenticated" => "AES-256-GCM, payload in clear",
            _ => "AES-256-GCM, payload encrypted",
        }
    ));
    s.push_str(RESULT_LINE);
    s
}

/// The bandwidth table header.
pub fn bw_table_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"
    }
}

/// The latency table header (iterations mode).
pub const LAT_TABLE_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
/// The latency table header with `-D`.
pub const LAT_DURATION_HEADER: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// Bytes/s in the table's unit.
pub fn bw_unit(bps: f64, gbits: bool) -> f64 {
    if gbits {
        bps * 8.0 / 1e9
    } else {
        bps / (1u64 << 20) as f64
    }
}

/// One bandwidth row.
pub fn bw_row(f: &BwFigures, gbits: bool) -> String {
    format!(
        " {:<7}    {:<7}          {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        f.size,
        f.iters,
        bw_unit(f.peak_bps, gbits),
        bw_unit(f.avg_bps, gbits),
        f.msg_rate_mpps
    )
}

/// One latency row.
pub fn lat_row(f: &LatFigures, duration: bool) -> String {
    if duration {
        format!(
            " {:<7}        {:<10}        {:<7.2}        {:<7.2}",
            f.size, f.iters, f.t_avg, f.tps
        )
    } else {
        format!(
            " {:<7} {:<7}          {:<7.2}        {:<7.2}      {:<7.2}  \t{:<7.2}     \t{:<7.2}\t\t{:<7.2}  \t\t{:<7.2}",
            f.size, f.iters, f.t_min, f.t_max, f.t_typical, f.t_avg, f.t_stdev, f.p99, f.p99_9
        )
    }
}

/// perftest `--out_json` keys for one row.
pub fn json_row(fig: &Figures, gbits: bool) -> serde_json::Value {
    match fig {
        Figures::Bw(f) => serde_json::json!({
            "MsgSize": f.size,
            "n_iterations": f.iters,
            "BW_peak": bw_unit(f.peak_bps, gbits),
            "BW_average": bw_unit(f.avg_bps, gbits),
            "MsgRate": f.msg_rate_mpps,
        }),
        Figures::Lat(f) => serde_json::json!({
            "MsgSize": f.size,
            "n_iterations": f.iters,
            "t_min": f.t_min,
            "t_max": f.t_max,
            "t_typical": f.t_typical,
            "t_avg": f.t_avg,
            "t_stdev": f.t_stdev,
            "percentile_99": f.p99,
            "percentile_99_9": f.p99_9,
        }),
    }
}

/// Run the server on a thread and the client here: both ends in one
/// process over 127.0.0.1 (`--loopback`). `sizes` are run as sessions in
/// order; `on_session` sees each client session as it finishes.
pub fn run_loopback(
    test: Test,
    listener: TcpListener,
    sizes: &[u64],
    p: &Params,
    local: &LocalOpts,
    on_session: &mut dyn FnMut(&Session),
) -> Result<(), PerfError> {
    let server_addr = listener.local_addr()?;
    let mut server_local = local.clone();
    server_local.seed = local.seed ^ 0x5151_5151;
    let server = std::thread::Builder::new()
        .name("mr-perf-server".into())
        .spawn(move || serve(&listener, test, &server_local, &mut |_| {}))
        .map_err(|e| PerfError::Other(format!("spawn server: {e}")))?;
    let mut result = Ok(());
    for (i, &size) in sizes.iter().enumerate() {
        let mut pp = p.clone();
        pp.size = size;
        match run_client(test, server_addr, &pp, local, i + 1 == sizes.len()) {
            Ok(s) => on_session(&s),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_err() {
        // Unblock a server waiting in accept.
        let _ = TcpStream::connect_timeout(&server_addr, Duration::from_millis(200));
        drop(server);
        return result;
    }
    match server.join() {
        Ok(r) => r,
        Err(_) => Err(PerfError::Other("server thread panicked".into())),
    }
}
