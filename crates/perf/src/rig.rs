//! One side's device set up for a run: the device with the run's
//! endpoint configuration, one MR, one CQ and the QPs in INIT; moving the
//! QPs to RTS toward the peer's [`Endpoint`]; this side's own endpoint for
//! the connection manager; and the completion helpers both sides share.

use crate::params::auth_mode;
use crate::verify::pattern;
use crate::{AuthOpts, LocalOpts, Params, PerfError, Test};
use metaroce_cm::{Endpoint, RemoteBuf};
use metaroce_proto::{AuthConfig, EndpointConfig, QpCaps};
use metaroce_udp::{Device, DeviceConfig, PathMtu, pmtu};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, QpAttr, QpInitAttr, QpState, QpType, QueuePair,
    RecvWr, SendWr, Sge, VerbsError, WcStatus, WorkCompletion,
};
use std::net::{IpAddr, SocketAddr};

const ACCESS_ALL: AccessFlags = AccessFlags(0xf);

/// The largest payload per packet `--mtu` defaults to toward a peer on
/// another host where the path carries more: bigger packets cost less per
/// byte (fewer headers, system calls and protocol passes) but lose more to
/// one drop.
pub const AUTO_MTU_CAP: u32 = pmtu::AUTO_PAYLOAD_CAP;

/// The same default toward a peer on this host, whose datagrams never
/// leave the kernel.
pub const LOCAL_MTU_CAP: u32 = pmtu::LOCAL_PAYLOAD_CAP;

/// Payload bytes of the largest data packet (no extension, ICRC) whose
/// datagram is `datagram` bytes long, for an endpoint with or without
/// packet authentication: the per-packet overhead the core adds.
fn packet_overhead(auth: bool) -> usize {
    let cfg = EndpointConfig {
        auth: auth.then(|| AuthConfig {
            job_secret: [0; 32],
            encrypt: false,
            local_ip: IpAddr::from([127, 0, 0, 1]),
        }),
        ..EndpointConfig::default()
    };
    metaroce_proto::Endpoint::new(cfg)
        .map(|e| e.datagram_len_for_payload(0))
        .unwrap_or(96)
}

/// The payload MTU a run from `local` uses on `path`: `asked` when it fits
/// (an error naming the path when it does not), or, for `asked == 0`, the
/// largest payload that fits, capped at [`LOCAL_MTU_CAP`] toward a peer on
/// this host and [`AUTO_MTU_CAP`] toward any other.
pub fn payload_mtu(
    asked: u32,
    path: &PathMtu,
    auth: bool,
    local: IpAddr,
    peer: IpAddr,
) -> Result<u32, String> {
    let overhead = packet_overhead(auth);
    let fits = path.max_datagram.saturating_sub(overhead);
    let fits = u32::try_from(fits).unwrap_or(u32::MAX).min(65_000);
    if asked == 0 {
        if fits < 64 {
            return Err(format!(
                "the path to {peer} ({}) is too small for MetaRoCE packets",
                path.describe()
            ));
        }
        let cap = if pmtu::is_local_peer(local, peer) {
            LOCAL_MTU_CAP
        } else {
            AUTO_MTU_CAP
        };
        return Ok(fits.min(cap));
    }
    if asked > fits {
        return Err(format!(
            "--mtu {asked}: the path to {peer} ({}) carries at most {fits} payload bytes per packet; \
             {asked} would make {}-byte IP packets, which the path would fragment (leave --mtu out to size packets from the path)",
            path.describe(),
            asked as usize + overhead + pmtu::ip_udp_overhead(peer)
        ));
    }
    Ok(asked)
}

/// Source ports a device of this run keeps for its paths: twice the
/// paths (at least 32), so a retired path can draw a port no live path
/// holds.
pub(crate) fn port_span(p: &Params) -> u16 {
    (p.paths as u16).saturating_mul(2).max(32)
}

/// The RTO floor on real sockets: a thread may wait a scheduler tick
/// (4 ms at HZ=250) for its CPU often enough that an RTO below that fires
/// on healthy paths.
pub const RTO_MIN_NS: u64 = 4_000_000;

fn endpoint_config(p: &Params, local: &LocalOpts, mtu: u32) -> EndpointConfig {
    let mut cfg = EndpointConfig {
        device_port: local.dev_port,
        mtu_payload_bytes: mtu,
        paths_per_connection: p.paths as usize,
        path_port_span: port_span(p),
        seed: local.seed,
        ..EndpointConfig::default()
    };
    // Real sockets on a VM: a thread waits a scheduler tick (4 ms at
    // HZ=250) for its CPU often enough that an RTO below that fires on
    // healthy paths and retires them (measured: ~100 false RTOs per 4000 x
    // 64 KiB at 1 ms, none at 4 ms).
    cfg.base_rtt_ns = 50_000;
    cfg.rto_min_ns = if local.rto_min_ns > 0 {
        local.rto_min_ns
    } else {
        RTO_MIN_NS
    };
    cfg.rto_max_ns = 200_000_000;
    cfg.probe_timeout_min_ns = metaroce_udp::PROBE_TIMEOUT_MIN_NS;
    cfg.path_burst_bytes = local
        .path_burst_bytes
        .unwrap_or(metaroce_udp::PATH_BURST_BYTES);
    cfg
}

/// One side's device, CQ, QPs and buffer for a run.
pub(crate) struct Rig {
    pub(crate) dev: Device,
    pub(crate) cq: CompletionQueue,
    pub(crate) qps: Vec<QueuePair>,
    pub(crate) mr: MemoryRegion,
    pub(crate) auth: Option<AuthOpts>,
    /// The payload MTU this side offers (what its path to the peer carries).
    pub(crate) mtu: u32,
    /// What the kernel said of the path to the peer.
    pub(crate) path: PathMtu,
    /// This side offers to take data packets without ICRC.
    pub(crate) icrc_offer: bool,
}

/// Whether this side offers ICRC omission: asked for, and packets not
/// authenticated (the tag is the trailer then).
fn offers_icrc_omission(local: &LocalOpts) -> bool {
    local.icrc_omission && local.auth.is_none()
}

/// Whether both sides omit the ICRC toward each other.
pub(crate) fn icrc_omitted(rig: &Rig, peer: &Endpoint) -> bool {
    rig.icrc_offer && peer.icrc_omission
}

/// Start a device on `bind_ip` for a run of `p` toward a peer at
/// `peer_ip`, with a `buf_len`-byte MR (filled with the verification
/// pattern of seed `fill`, if any) and `p.qps` QPs in INIT. The payload MTU
/// is `p.mtu` if the path carries it, or sized from the path for
/// `p.mtu == 0`.
pub(crate) fn rig(
    test: Test,
    bind_ip: IpAddr,
    peer_ip: IpAddr,
    p: &Params,
    local: &LocalOpts,
    buf_len: u64,
    fill: Option<u64>,
) -> Result<Rig, PerfError> {
    let path = pmtu::probe_path(bind_ip, peer_ip)
        .map_err(|e| PerfError::Other(format!("path MTU from {bind_ip} to {peer_ip}: {e}")))?;
    let mtu = payload_mtu(p.mtu, &path, local.auth.is_some(), bind_ip, peer_ip)
        .map_err(PerfError::Other)?;
    let mut ep = endpoint_config(p, local, mtu);
    ep.accept_icrc_omitted = offers_icrc_omission(local);
    ep.auth = local.auth.map(|a| AuthConfig {
        job_secret: a.job_secret,
        encrypt: a.encrypt,
        local_ip: bind_ip,
    });
    let mut dc = DeviceConfig::new(ep, bind_ip);
    dc.impair = local.impair;
    dc.gso = local.offload;
    dc.gro = local.offload;
    dc.direct_placement = local.direct_placement;
    dc.port_fallback = local.dev_port_fallback;
    dc.capture = local.capture.clone();
    dc.engine_nice = local.engine_nice;
    dc.app_block_when_contended = local.blocks_when_contended(test);
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
        mtu,
        path,
        icrc_offer: offers_icrc_omission(local),
    })
}

/// Move this side's QPs to RTR toward `peer` (its device at `peer_ip`)
/// and on to RTS.
pub(crate) fn connect(rig: &Rig, peer_ip: IpAddr, peer: &Endpoint) -> Result<(), PerfError> {
    if peer.qpns.len() != rig.qps.len() {
        return Err(PerfError::Other(format!(
            "peer has {} QPs, this side {}",
            peer.qpns.len(),
            rig.qps.len()
        )));
    }
    let dest = SocketAddr::new(peer_ip, peer.device_port);
    // The context refuses a path_mtu the path cannot carry, and the engine
    // follows the path's MTU from here on.
    rig.dev.learn_path(dest)?;
    rig.dev.with(|ctx, now_ns| -> Result<(), VerbsError> {
        // The peer's session id enters the keys when packets are
        // authenticated; recording it is harmless otherwise.
        ctx.set_peer_session(dest, peer.session_id)?;
        ctx.set_peer_icrc_omission(dest, icrc_omitted(rig, peer));
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
        if let Some(mbps) = peer.setup_grant_mbps {
            ctx.take_setup_grant(dest, mbps.saturating_mul(1_000_000), now_ns)?;
        }
        Ok(())
    })?;
    Ok(())
}

/// This side as the connection manager describes it to the peer.
pub(crate) fn local_endpoint(rig: &Rig, p: &Params) -> Endpoint {
    Endpoint {
        device_port: rig.dev.addr().port(),
        path_port_span: port_span(p),
        mtu: rig.mtu,
        qpns: rig.qps.iter().map(QueuePair::qp_num).collect(),
        buf: RemoteBuf {
            addr: rig.mr.addr,
            rkey: rig.mr.rkey,
            len: rig.mr.length,
        },
        session_id: rig.dev.with(|ctx, _| ctx.session_id()),
        auth: auth_mode(rig.auth.as_ref()).into(),
        icrc_omission: rig.icrc_offer,
        key_confirm: None,
        // A session has one peer: it may start at the whole line (0). A
        // share is rounded up to the next Mbit/s, so it never becomes 0.
        setup_grant_mbps: Some(
            rig.dev
                .with(|ctx, _| ctx.setup_grant_bps(1))
                .div_ceil(1_000_000),
        ),
    }
}

/// A failed work completion as a one-line error.
pub(crate) fn wc_error(wc: &WorkCompletion) -> PerfError {
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

/// Make `wr` carry the first `len` bytes of the rig's buffer inline, as a
/// latency test's ping or pong does when perftest's inline default covers
/// its size: the bytes are copied into the request when it is posted, as a
/// NIC copies them into the WQE, and taken from the buffer once (it does
/// not change during a latency test).
pub(crate) fn set_inline(rig: &Rig, wr: &mut SendWr, len: u64) {
    wr.sg_list.clear();
    wr.inline_data = Some(
        rig.dev
            .with(|ctx, _| ctx.mr_bytes(&rig.mr)[..len as usize].to_vec()),
    );
}

/// A completion array to poll into.
pub(crate) fn empty_wcs() -> Vec<WorkCompletion> {
    vec![WorkCompletion::default(); 64]
}

/// Without any completion for this long, a run gives up (the core's retry
/// limit normally ends it much sooner).
pub(crate) const STALL_NS: u64 = 30_000_000_000;

/// Post receives `(wr_id, scatter list)` on `qp`.
pub(crate) fn post_recvs(
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
pub(crate) const PP_RECVS: u64 = 16;

/// Shut the rig's device down; a failure gets the device's counters at
/// the moment it was seen attached ([`PerfError::counters`]), so they can
/// be printed for runs that fail too.
pub(crate) fn finish_rig<T>(rig: Rig, result: Result<T, PerfError>) -> Result<T, PerfError> {
    let result = result.map_err(|e| e.with_counters(rig.dev.counters()));
    rig.dev.shutdown();
    result
}
