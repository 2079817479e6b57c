//! One side's device set up for a run: the device with the run's
//! endpoint configuration, one MR, one CQ and the QPs in INIT; moving the
//! QPs to RTS toward the peer's [`Endpoint`]; this side's own endpoint for
//! the connection manager; and the completion helpers both sides share.

use crate::params::auth_mode;
use crate::verify::pattern;
use crate::{AuthOpts, LocalOpts, Params, PerfError};
use metaroce_cm::{Endpoint, RemoteBuf};
use metaroce_proto::{AuthConfig, EndpointConfig, QpCaps};
use metaroce_udp::{Device, DeviceConfig};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, QpAttr, QpInitAttr, QpState, QpType, QueuePair,
    RecvWr, Sge, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};
use std::net::{IpAddr, SocketAddr};

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

/// One side's device, CQ, QPs and buffer for a run.
pub(crate) struct Rig {
    pub(crate) dev: Device,
    pub(crate) cq: CompletionQueue,
    pub(crate) qps: Vec<QueuePair>,
    pub(crate) mr: MemoryRegion,
    pub(crate) auth: Option<AuthOpts>,
}

/// Start a device on `bind_ip` for a run of `p`, with a `buf_len`-byte MR
/// (filled with the verification pattern of seed `fill`, if any) and
/// `p.qps` QPs in INIT.
pub(crate) fn rig(
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
    dc.port_fallback = local.dev_port_fallback;
    dc.capture = local.capture.clone();
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

/// This side as the connection manager describes it to the peer.
pub(crate) fn local_endpoint(rig: &Rig, p: &Params) -> Endpoint {
    Endpoint {
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
        key_confirm: None,
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

/// A completion array to poll into.
pub(crate) fn empty_wcs() -> Vec<WorkCompletion> {
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
