//! What the examples share: a device with one RC QP and one registered
//! buffer, the QP's move to RTR and RTS toward a peer, and a busy-poll for
//! completions. The single-process examples open two devices on 127.0.0.1
//! and connect them to each other; the two-process one (`write.rs`) opens
//! on its host's address and learns the peer through the connection
//! manager. Each example brings its own buffer size and access rights.
//!
//! Every example compiles this module on its own, so a function one of
//! them does not call would be dead code there: the loopback-only ones say
//! so.

use metaroce_udp::{Device, DeviceConfig};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, EndpointConfig, MemoryRegion, QpAttr, QpCaps, QpInitAttr,
    QpState, QpType, QueuePair, SendWr, WcStatus, WorkCompletion,
};
use std::error::Error;
use std::net::{IpAddr, SocketAddr};

/// One side: its device, CQ, QP and registered buffer.
pub(crate) struct Side {
    pub(crate) dev: Device,
    pub(crate) cq: CompletionQueue,
    pub(crate) qp: QueuePair,
    pub(crate) mr: MemoryRegion,
}

/// Start a device on 127.0.0.1 (port 0: the device picks a free range)
/// with one QP in INIT and a `len`-byte buffer registered with `access`
/// (the QP gets the same remote rights).
#[allow(dead_code)] // write.rs opens on its host's address
pub(crate) fn open(seed: u64, len: u64, access: AccessFlags) -> Result<Side, Box<dyn Error>> {
    open_on("127.0.0.1".parse()?, seed, len, access)
}

/// [`open`] on `ip`, the address the peer reaches this host at.
pub(crate) fn open_on(
    ip: IpAddr,
    seed: u64,
    len: u64,
    access: AccessFlags,
) -> Result<Side, Box<dyn Error>> {
    let config = EndpointConfig {
        device_port: 0,
        seed,
        ..EndpointConfig::default()
    };
    let dev = Device::start(DeviceConfig::new(config, ip))?;
    let (cq, qp, mr) = dev.with(|ctx, _now| -> Result<_, Box<dyn Error>> {
        let pd = ctx.alloc_pd();
        let mr = ctx.reg_mr(pd, len, access)?;
        let cq = ctx.create_cq(64)?;
        let init = QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        };
        let qp = ctx.create_qp(pd, &init)?;
        ctx.modify_qp(
            qp,
            &QpAttr {
                qp_state: Some(QpState::Init),
                qp_access_flags: Some(access),
                port_num: Some(1),
                ..QpAttr::default()
            },
        )?;
        Ok((cq, qp, mr))
    })?;
    Ok(Side { dev, cq, qp, mr })
}

/// Move `side`'s QP to RTR toward `peer`'s QP, then to RTS.
#[allow(dead_code)] // write.rs learns its peer through the connection manager
pub(crate) fn connect(side: &Side, peer: &Side) -> Result<(), Box<dyn Error>> {
    connect_to(side, peer.dev.addr(), peer.qp.qp_num(), 4096)
}

/// Move `side`'s QP to RTR toward QP `dest_qpn` of the device at `dest`
/// with path MTU `mtu`, then to RTS.
pub(crate) fn connect_to(
    side: &Side,
    dest: SocketAddr,
    dest_qpn: u32,
    mtu: u32,
) -> Result<(), Box<dyn Error>> {
    side.dev.with(|ctx, _now| -> Result<(), Box<dyn Error>> {
        ctx.modify_qp(
            side.qp,
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                dest_addr: Some(dest),
                dest_qp_num: Some(dest_qpn),
                path_mtu: Some(mtu),
                ..QpAttr::default()
            },
        )?;
        ctx.modify_qp(
            side.qp,
            &QpAttr {
                qp_state: Some(QpState::Rts),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                ..QpAttr::default()
            },
        )?;
        Ok(())
    })
}

/// Busy-poll `side`'s CQ for one completion.
pub(crate) fn wait(side: &Side) -> Result<WorkCompletion, Box<dyn Error>> {
    let mut wc = [WorkCompletion::default()];
    let start = std::time::Instant::now();
    while side.dev.poll_cq(side.cq, &mut wc)? == 0 {
        if start.elapsed().as_secs() > 10 {
            return Err("no completion in 10 s".into());
        }
    }
    Ok(wc[0])
}

/// Post one work request on `side`'s QP and wait for its completion; an
/// error, naming `what`, unless it succeeded.
#[allow(dead_code)] // send_recv.rs posts a batch
pub(crate) fn run(side: &Side, wr: SendWr, what: &str) -> Result<WorkCompletion, Box<dyn Error>> {
    side.dev
        .with(|ctx, _now| ctx.post_send(side.qp, &[wr]))
        .map_err(|(i, e)| format!("post_send #{i}: {e}"))?;
    let wc = wait(side)?;
    if wc.status != WcStatus::Success {
        return Err(format!("{what} failed: {}", wc.status).into());
    }
    Ok(wc)
}
