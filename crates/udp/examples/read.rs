//! RDMA READ between two MetaRoCE devices in this process, over real UDP
//! on 127.0.0.1: A reads B's buffer (which B registered with remote read
//! access) into its own, without B's application doing anything.
//!
//! ```sh
//! cargo run -p metaroce-udp --example read
//! ```

use metaroce_udp::{Device, DeviceConfig};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, QpAttr, QpInitAttr, QpState, QpType, QueuePair,
    SendWr, WcOpcode, WcStatus, WorkCompletion, WrOp,
};
use metaroce_verbs::{EndpointConfig, QpCaps};
use std::error::Error;

const LEN: u64 = 256 << 10;
const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_READ.0);

/// One side: its device, CQ, QP and registered buffer.
struct Side {
    dev: Device,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

/// Start a device on 127.0.0.1 (port 0: the device picks a free range)
/// with one QP in INIT and a `LEN`-byte buffer.
fn open(seed: u64) -> Result<Side, Box<dyn Error>> {
    let config = EndpointConfig {
        device_port: 0,
        seed,
        ..EndpointConfig::default()
    };
    let dev = Device::start(DeviceConfig::new(config, "127.0.0.1".parse()?))?;
    let (cq, qp, mr) = dev.with(|ctx, _now| -> Result<_, Box<dyn Error>> {
        let pd = ctx.alloc_pd();
        let mr = ctx.reg_mr(pd, LEN, ACCESS)?;
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
                qp_access_flags: Some(ACCESS),
                port_num: Some(1),
                ..QpAttr::default()
            },
        )?;
        Ok((cq, qp, mr))
    })?;
    Ok(Side { dev, cq, qp, mr })
}

/// Move `side`'s QP to RTR toward `peer`'s QP, then to RTS.
fn connect(side: &Side, peer: &Side) -> Result<(), Box<dyn Error>> {
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
fn wait(side: &Side) -> Result<WorkCompletion, Box<dyn Error>> {
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

fn main() -> Result<(), Box<dyn Error>> {
    let a = open(1)?;
    let b = open(2)?;
    connect(&a, &b)?;
    connect(&b, &a)?;

    b.dev.with(|ctx, _| {
        for (i, byte) in ctx.mr_bytes_mut(&b.mr).iter_mut().enumerate() {
            *byte = (i * 7 % 256) as u8;
        }
    });
    // READ B's whole buffer into A's: the SGE says where the data lands.
    let read = SendWr::new(
        1,
        WrOp::Read {
            remote_addr: b.mr.addr,
            rkey: b.mr.rkey,
        },
        vec![a.mr.sge(0, LEN as u32)],
    );
    a.dev
        .with(|ctx, _now| ctx.post_send(a.qp, &[read]))
        .map_err(|(i, e)| format!("post_send #{i}: {e}"))?;
    let wc = wait(&a)?;
    if wc.status != WcStatus::Success {
        return Err(format!("READ failed: {}", wc.status).into());
    }
    let same = a.dev.with(|ctx, _| ctx.mr_bytes(&a.mr).to_vec())
        == b.dev.with(|ctx, _| ctx.mr_bytes(&b.mr).to_vec());
    println!(
        "READ of {LEN} B: {:?}, {}",
        wc.opcode,
        if same {
            "same bytes on both sides"
        } else {
            "DIFFERENT"
        }
    );
    if same {
        Ok(())
    } else {
        Err("the bytes differ".into())
    }
}
