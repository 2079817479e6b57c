//! SEND and RECV with immediate data between two MetaRoCE devices in this
//! process, over real UDP on 127.0.0.1: the receiver posts receive work
//! requests first (a SEND lands in the next one, in order), the sender's
//! SEND carries 32 bits of immediate data that arrive in the receiver's
//! completion.
//!
//! ```sh
//! cargo run -p metaroce-udp --example send_recv
//! ```

use metaroce_udp::{Device, DeviceConfig};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, QpAttr, QpInitAttr, QpState, QpType, QueuePair,
    RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOp,
};
use metaroce_verbs::{EndpointConfig, QpCaps};
use std::error::Error;

const LEN: u64 = 64 << 10;
const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE;

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

    // B posts two receives, each 4 KiB of its buffer.
    let recvs: Vec<RecvWr> = (0..2)
        .map(|i| RecvWr {
            wr_id: 100 + i,
            sg_list: vec![b.mr.sge(i * 4096, 4096)],
        })
        .collect();
    b.dev
        .with(|ctx, _| ctx.post_recv(b.qp, &recvs))
        .map_err(|(i, e)| format!("post_recv #{i}: {e}"))?;

    // A sends two messages; the second carries immediate data.
    let messages: [&[u8]; 2] = [b"hello over MetaRoCE", b"and goodbye"];
    let sends: Vec<SendWr> = messages
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let op = if i == 0 {
                WrOp::Send
            } else {
                WrOp::SendImm { imm: 0xfeed }
            };
            // Inline: the bytes are copied at post time, no buffer needed.
            SendWr::inline(i as u64, op, text.to_vec())
        })
        .collect();
    a.dev
        .with(|ctx, _now| ctx.post_send(a.qp, &sends))
        .map_err(|(i, e)| format!("post_send #{i}: {e}"))?;

    for (i, text) in messages.iter().enumerate() {
        let sent = wait(&a)?;
        let got = wait(&b)?;
        if sent.status != WcStatus::Success || got.status != WcStatus::Success {
            return Err(format!("SEND {i}: {} / RECV: {}", sent.status, got.status).into());
        }
        let at = (got.wr_id - 100) as usize * 4096;
        let bytes = b
            .dev
            .with(|ctx, _| ctx.mr_bytes(&b.mr)[at..at + got.byte_len as usize].to_vec());
        println!(
            "receive {} got {} B {:?}, immediate {:?}",
            got.wr_id,
            got.byte_len,
            String::from_utf8_lossy(&bytes),
            got.imm_data
        );
        if bytes != *text {
            return Err(format!("message {i} differs").into());
        }
    }
    Ok(())
}
