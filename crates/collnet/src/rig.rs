//! One rank's device set up for a communicator: the UDP device, a
//! protection domain, one CQ for everything, the staging region peers
//! write into, and one RC QP per peer in INIT with its receives posted
//! (before anyone learns its number, so no peer can write before a receive
//! is there). [`connect`] moves a peer's QP on to RTS.

use crate::{CollNetError, NetConfig};
use metaroce_cm::RemoteBuf;
use metaroce_coll::{Communicator, Rank};
use metaroce_udp::{Device, DeviceConfig};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, EndpointConfig, MemoryRegion, ProtectionDomain, QpAttr, QpCaps,
    QpInitAttr, QpState, QpType, QueuePair, RecvWr, VerbsError,
};
use std::net::{IpAddr, SocketAddr};

/// Receives kept posted per peer QP, and the send queue depth: at most
/// `slots` data messages and about as many credits are in flight on one
/// directed connection at once (see `metaroce_coll`'s driving contract),
/// with room to spare for credits whose local completion lags.
pub(crate) fn queue_depth(slots: u32) -> u32 {
    4 * slots + 16
}

/// A rank's device and the verbs objects of its communicator.
pub(crate) struct Rig {
    pub(crate) dev: Device,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    /// `None` in a world of one (no peer, no staging).
    pub(crate) staging: Option<MemoryRegion>,
    /// By peer rank; `None` at this rank's own index.
    pub(crate) qps: Vec<Option<QueuePair>>,
    pub(crate) comm: Communicator,
}

/// The largest payload per packet a path-sized MTU takes ([`NetConfig::mtu`]
/// 0) toward a peer on another host.
pub const AUTO_MTU_CAP: u32 = metaroce_udp::pmtu::AUTO_PAYLOAD_CAP;

/// The same cap toward a peer on this host. 60 KiB payloads cut a 4 MiB
/// all-reduce's CPU time at 8 ranks on 2 cores by about a fifth against
/// 8 KiB (BENCHMARKS.md).
pub const LOCAL_MTU_CAP: u32 = metaroce_udp::pmtu::LOCAL_PAYLOAD_CAP;

/// The device's own largest payload: the configured MTU, or, when packets
/// are sized per peer from the path, the local cap for a device bound to a
/// loopback address (every peer on this host) and [`AUTO_MTU_CAP`] for any
/// other (a peer on this host then still gets the local cap only if both
/// devices take it, see `payload_mtu_toward`).
///
/// Packets follow each QP's path MTU whatever the device's MTU, but the
/// device MTU is also the transport's MSS on every connection (congestion
/// windows, probe and admission budgets are counted in it): a routable
/// device at the local cap would run its 8 KiB-packet connections to
/// other hosts with windows sized for 60 KiB packets, and the netns test
/// (four ranks over veth, every peer remote) ran no faster for it.
pub(crate) fn device_mtu(cfg: &NetConfig, ip: IpAddr) -> u32 {
    match cfg.mtu {
        0 if ip.is_loopback() => LOCAL_MTU_CAP,
        0 => AUTO_MTU_CAP,
        m => m,
    }
}

/// Paths per connection ([`NetConfig::paths`] 0) toward peers on other
/// hosts: enough source ports for ECMP to spread a connection over a
/// fabric's links.
pub const AUTO_PATHS: u32 = 8;

/// Paths per connection ([`NetConfig::paths`] 0) of a device bound to a
/// loopback address (every peer on this host). Loopback has one route, so
/// spraying buys nothing there, and each path costs per-datagram work:
/// every path is a socket of its own (a burst over 8 paths leaves in up
/// to 8 `sendmmsg` calls, not one), and the receiver acknowledges each
/// path on its own (a 60 KiB-packet message spread over 8 paths got about
/// one ACK per data packet). 1 MiB all-reduce at 8 ranks on 2 cores, per
/// operation and rank: 48 ACKs sent with 8 paths, 18 with 1; 78
/// `sendmmsg` calls against 21; busbw +28 % in ten interleaved runs
/// (BENCHMARKS.md, collectives round 12).
pub const LOCAL_PATHS: u32 = 1;

/// The device's paths per connection: the configured count, or when it is
/// 0, [`LOCAL_PATHS`] for a device bound to a loopback address and
/// [`AUTO_PATHS`] for any other (like [`device_mtu`], a routable device
/// cannot tell which of its peers share its host).
pub(crate) fn device_paths(cfg: &NetConfig, ip: IpAddr) -> u32 {
    match cfg.paths {
        0 if ip.is_loopback() => LOCAL_PATHS,
        0 => AUTO_PATHS,
        p => p,
    }
}

/// Whether a device bound to `ip` uses UDP GSO and GRO: as
/// [`NetConfig::offload`] says, or when it says nothing, everywhere but on
/// a loopback address whose ranks have a core each (not
/// `CommConfig::ranks_share_cores`).
///
/// Loopback packets are sized up to [`LOCAL_MTU_CAP`], so a GSO message of
/// them holds one datagram and offload only ever batches small ones. Two
/// ranks with a core each then answer every message at once, and batching
/// hurt them: once they drifted apart by one operation, an 8-byte
/// all-reduce's data went two at a time, GRO-coalesced (with a
/// `SO_MEMINFO` query per such batch at the receiver), and the ACK could
/// not ride in front of a data datagram that was not alone in its flush;
/// without offload they stay in step, one datagram each way per operation
/// with the ACK in front (5.9 against 8.2 µs, eleven interleaved runs).
/// Where ranks share cores, a rank taken off its CPU finds several small
/// messages waiting, and batching them pays: 8 bytes at 8 ranks on 2 cores
/// took 99 µs with offload and 221 µs without (BENCHMARKS.md, collectives
/// round 14). 1 MiB all-reduces are unchanged either way.
pub fn offload_on(cfg: &NetConfig, ip: IpAddr) -> bool {
    cfg.offload
        .unwrap_or(!ip.is_loopback() || cfg.comm.ranks_share_cores)
}

/// How many bytes may wait in the receive socket of a device bound to a
/// loopback address whose ranks share cores before the datagrams taken
/// from it count as CE-marked (the device's receive-queue ECN; its default,
/// 512 KiB, applies everywhere else).
///
/// On such a host a receive queue builds because its rank is off its CPU
/// (2 to 4 ranks per vCPU at 4 and 8 ranks on 2), not because a link is
/// full, and cutting the senders' windows for it only made them wait in
/// turn. 1 MiB all-reduce on 2 vCPUs, nine interleaved rounds: 4 ranks
/// 1.675 GB/s busbw against 1.574 with 512 KiB, 8 ranks 0.632 against
/// 0.544 (no marking at all: 1.684 and 0.627). 4 MiB still marks well
/// before the 16 MiB socket buffer fills.
pub const SHARED_CORES_RX_MARK_BYTES: u32 = 4 << 20;

fn endpoint_config(cfg: &NetConfig, ip: IpAddr) -> EndpointConfig {
    let paths = device_paths(cfg, ip);
    EndpointConfig {
        device_port: cfg.device_port,
        mtu_payload_bytes: device_mtu(cfg, ip),
        accept_icrc_omitted: cfg.icrc_omission,
        paths_per_connection: paths as usize,
        path_port_span: paths as u16,
        seed: cfg.seed,
        // Real sockets on a shared machine: a thread often waits a
        // scheduler tick for its CPU, and an RTO below that fires on
        // healthy paths (see metaroce-perf's rig for the measurement).
        base_rtt_ns: 50_000,
        rto_min_ns: cfg.rto_min_ns,
        deferred_ack_ns: cfg.deferred_ack_ns,
        // Dead ranks are found through the control channel in
        // milliseconds; the transport's own give-up may take its time, so
        // that a rank descheduled or busy for a second on a crowded host
        // is not declared dead: retry rounds of at least 100 ms, doubling
        // to 2 s, give up after about 9 s of silence (from the 4 ms RTO
        // alone it was about 1 s, which a 256 MiB verification pass under
        // the device lock once outlasted).
        rto_max_ns: 2_000_000_000,
        retry_round_min_ns: 100_000_000,
        probe_timeout_min_ns: metaroce_udp::PROBE_TIMEOUT_MIN_NS,
        path_burst_bytes: metaroce_udp::PATH_BURST_BYTES,
        ..EndpointConfig::default()
    }
}

/// Start the device on `bind_ip` and build rank `rank`'s objects.
pub(crate) fn rig(
    rank: Rank,
    world: u32,
    cfg: &NetConfig,
    bind_ip: IpAddr,
) -> Result<Rig, CollNetError> {
    let comm = Communicator::new(rank, world, cfg.comm)?;
    let mut dc = DeviceConfig::new(endpoint_config(cfg, bind_ip), bind_ip);
    dc.impair = cfg.impair;
    dc.port_fallback = cfg.device_port_fallback;
    let offload = offload_on(cfg, bind_ip);
    dc.gso = offload;
    dc.gro = offload;
    dc.busy_poll_ns = cfg.busy_poll_ns;
    if bind_ip.is_loopback() && cfg.comm.ranks_share_cores {
        dc.rx_queue_mark_bytes = SHARED_CORES_RX_MARK_BYTES;
    }

    dc.capture.clone_from(&cfg.capture);
    let dev = Device::start(dc)?;
    let depth = queue_depth(cfg.comm.slots);
    let peers = world.saturating_sub(1) as usize;
    let staging_bytes = comm.staging_layout().bytes();
    let (pd, cq, staging, qps) = dev.with(|ctx, _| -> Result<_, VerbsError> {
        let pd = ctx.alloc_pd();
        let staging = if staging_bytes > 0 {
            Some(ctx.reg_mr(
                pd,
                staging_bytes,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )?)
        } else {
            None
        };
        let cq = ctx.create_cq((2 * depth as usize * peers).max(64))?;
        let init = QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap: QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
            },
            qp_type: QpType::Rc,
            // Writes copied at post time go unsignaled (`comm::post_write`).
            sq_sig_all: false,
        };
        let mut qps = Vec::with_capacity(world as usize);
        for peer in 0..world {
            if peer == rank {
                qps.push(None);
                continue;
            }
            let qp = ctx.create_qp(pd, &init)?;
            ctx.modify_qp(
                qp,
                &QpAttr {
                    qp_state: Some(QpState::Init),
                    qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
                    port_num: Some(1),
                    ..QpAttr::default()
                },
            )?;
            let wrs: Vec<RecvWr> = (0..depth)
                .map(|_| RecvWr {
                    wr_id: u64::from(peer),
                    sg_list: Vec::new(),
                })
                .collect();
            ctx.post_recv(qp, &wrs).map_err(|(_, e)| e)?;
            qps.push(Some(qp));
        }
        Ok((pd, cq, staging, qps))
    })?;
    Ok(Rig {
        dev,
        pd,
        cq,
        staging,
        qps,
        comm,
    })
}

/// What this rank needs to reach one peer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PeerAddr {
    pub(crate) device: SocketAddr,
    pub(crate) mtu: u32,
    pub(crate) qpn: u32,
    pub(crate) session_id: u64,
    pub(crate) staging: RemoteBuf,
    /// The peer takes data packets without ICRC.
    pub(crate) icrc_omission: bool,
}

/// The payload per packet toward `to`: the smaller of the two devices'
/// MTUs and of what the path carries unfragmented (a fragmented datagram
/// is lost whole with any fragment, and loses the spraying's entropy).
fn payload_mtu_toward(
    rig: &Rig,
    cfg: &NetConfig,
    peer: Rank,
    to: &PeerAddr,
) -> Result<u32, CollNetError> {
    let path = rig.dev.learn_path(to.device)?;
    let overhead = rig
        .dev
        .with(|ctx, _| ctx.endpoint().datagram_len_for_payload(0));
    let fits = u32::try_from(path.max_datagram.saturating_sub(overhead)).unwrap_or(u32::MAX);
    if cfg.mtu != 0 && cfg.mtu > fits {
        return Err(CollNetError::Bootstrap(format!(
            "MTU {} bytes: the path to rank {peer} at {} ({}) carries at most {fits} payload bytes \
             per packet unfragmented (leave the MTU unset to size packets from the path)",
            cfg.mtu,
            to.device,
            path.describe()
        )));
    }
    if fits < 256 {
        return Err(CollNetError::Bootstrap(format!(
            "the path to rank {peer} at {} ({}) is too small for MetaRoCE packets",
            to.device,
            path.describe()
        )));
    }
    let cap = match cfg.mtu {
        0 if metaroce_udp::pmtu::is_local_peer(rig.dev.addr().ip(), to.device.ip()) => {
            LOCAL_MTU_CAP
        }
        0 => AUTO_MTU_CAP,
        m => m,
    };
    Ok(cap.min(to.mtu).min(fits))
}

/// Move the QP toward `peer` to RTR and RTS.
pub(crate) fn connect(
    rig: &Rig,
    cfg: &NetConfig,
    peer: Rank,
    to: &PeerAddr,
) -> Result<(), CollNetError> {
    let qp = rig.qps[peer as usize].ok_or_else(|| {
        CollNetError::Bootstrap(format!("rank {peer} is this rank: no QP toward itself"))
    })?;
    let mtu = payload_mtu_toward(rig, cfg, peer, to)?;
    let omit_icrc = cfg.icrc_omission && to.icrc_omission;
    rig.dev.with(|ctx, _| -> Result<(), VerbsError> {
        ctx.set_peer_session(to.device, to.session_id)?;
        ctx.set_peer_icrc_omission(to.device, omit_icrc);
        ctx.modify_qp(
            qp,
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                dest_addr: Some(to.device),
                dest_qp_num: Some(to.qpn),
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
    })?;
    Ok(())
}
