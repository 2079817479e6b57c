//! Atomics between two MetaRoCE devices in this process, over real UDP on
//! 127.0.0.1: FETCH_ADD and CMP_SWAP on a 64-bit word in B's memory. Each
//! returns the word's old value into A's buffer, and each runs exactly
//! once at B even if its packets are lost and resent.
//!
//! ```sh
//! cargo run -p metaroce-udp --example atomics
//! ```

use metaroce_udp::{Device, DeviceConfig};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, QpAttr, QpInitAttr, QpState, QpType, QueuePair,
    SendWr, WcOpcode, WcStatus, WorkCompletion, WrOp,
};
use metaroce_verbs::{EndpointConfig, QpCaps};
use std::error::Error;

const LEN: u64 = 64;
const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0);

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

/// The little-endian u64 at `offset` of `side`'s buffer.
fn word(side: &Side, offset: usize) -> u64 {
    side.dev.with(|ctx, _| {
        let bytes = &ctx.mr_bytes(&side.mr)[offset..offset + 8];
        u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    })
}

/// Post one atomic whose old value lands at A's buffer offset 0; wait.
fn atomic(a: &Side, op: WrOp) -> Result<u64, Box<dyn Error>> {
    let wr = SendWr::new(1, op, vec![a.mr.sge(0, 8)]);
    a.dev
        .with(|ctx, _now| ctx.post_send(a.qp, &[wr]))
        .map_err(|(i, e)| format!("post_send #{i}: {e}"))?;
    let wc = wait(a)?;
    if wc.status != WcStatus::Success {
        return Err(format!("{:?} failed: {}", wc.opcode, wc.status).into());
    }
    Ok(word(a, 0))
}

fn main() -> Result<(), Box<dyn Error>> {
    let a = open(1)?;
    let b = open(2)?;
    connect(&a, &b)?;
    connect(&b, &a)?;
    b.dev
        .with(|ctx, _| ctx.mr_bytes_mut(&b.mr)[..8].copy_from_slice(&40u64.to_le_bytes()));
    let target = (b.mr.addr, b.mr.rkey);

    let old = atomic(
        &a,
        WrOp::FetchAdd {
            remote_addr: target.0,
            rkey: target.1,
            add: 2,
        },
    )?;
    println!("FETCH_ADD 2: old {old}, now {}", word(&b, 0));
    // Swap 42 for 7 (matches), then 42 for 9 (no longer matches).
    for (compare, swap) in [(42, 7), (42, 9)] {
        let old = atomic(
            &a,
            WrOp::CmpSwap {
                remote_addr: target.0,
                rkey: target.1,
                compare,
                swap,
            },
        )?;
        println!(
            "CMP_SWAP {compare} -> {swap}: old {old}, now {}",
            word(&b, 0)
        );
    }
    if word(&b, 0) == 7 {
        Ok(())
    } else {
        Err("the word is not 7".into())
    }
}
