//! SEND and RECV with immediate data between two MetaRoCE devices in this
//! process, over real UDP on 127.0.0.1: the receiver posts receive work
//! requests first (a SEND lands in the next one, in order), the sender's
//! SEND carries 32 bits of immediate data that arrive in the receiver's
//! completion.
//!
//! ```sh
//! cargo run -p metaroce-udp --example send_recv
//! ```

mod common;
use common::{connect, open, wait};

use metaroce_verbs::{AccessFlags, RecvWr, SendWr, WcStatus, WrOp};
use std::error::Error;

const LEN: u64 = 64 << 10;
const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE;

fn main() -> Result<(), Box<dyn Error>> {
    let a = open(1, LEN, ACCESS)?;
    let b = open(2, LEN, ACCESS)?;
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
