//! What the single-process examples share: two devices on 127.0.0.1, each
//! with one RC QP and one registered buffer, connected to each other, and a
//! busy-poll for completions. Each example brings its own buffer size and
//! access rights.

use metaroce_udp::{Device, DeviceConfig};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, EndpointConfig, MemoryRegion, QpAttr, QpCaps, QpInitAttr,
    QpState, QpType, QueuePair, WcOpcode, WcStatus, WorkCompletion,
};
use std::error::Error;

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
pub(crate) fn open(seed: u64, len: u64, access: AccessFlags) -> Result<Side, Box<dyn Error>> {
    let config = EndpointConfig {
        device_port: 0,
        seed,
        ..EndpointConfig::default()
    };
    let dev = Device::start(DeviceConfig::new(config, "127.0.0.1".parse()?))?;
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
pub(crate) fn connect(side: &Side, peer: &Side) -> Result<(), Box<dyn Error>> {
    side.dev.with(|ctx, _now| -> Result<(), Box<dyn Error>> {
        ctx.modify_qp(
            side.qp,
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                dest_addr: Some(peer.dev.addr()),
                dest_qp_num: Some(peer.qp.qp_num()),
                path_mtu: Some(4096),
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
    let mut wc = [WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm_data: None,
        qp_num: 0,
        src_qp: 0,
    }];
    let start = std::time::Instant::now();
    while side.dev.poll_cq(side.cq, &mut wc)? == 0 {
        if start.elapsed().as_secs() > 10 {
            return Err("no completion in 10 s".into());
        }
    }
    Ok(wc[0])
}
