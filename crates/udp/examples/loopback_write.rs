//! One RDMA WRITE between two MetaRoCE devices in this process, over real
//! UDP sockets on 127.0.0.1, then a check that the bytes arrived.
//!
//! ```sh
//! cargo run -p metaroce-udp --example loopback_write
//! ```
//!
//! The steps are ibverbs': open a device, allocate a protection domain,
//! register memory, create a completion queue and an RC queue pair, walk
//! the QP through INIT, RTR (naming the peer's address and QP number) and
//! RTS, post a work request, poll for its completion.

mod common;
use common::{connect, open, run};

use metaroce_verbs::{AccessFlags, SendWr, WrOp};
use std::error::Error;

const LEN: u64 = 1 << 20;
const ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_READ.0,
);

fn main() -> Result<(), Box<dyn Error>> {
    let a = open(1, LEN, ACCESS)?;
    let b = open(2, LEN, ACCESS)?;
    connect(&a, &b)?;
    connect(&b, &a)?;

    // Fill A's buffer, then WRITE it into B's.
    a.dev.with(|ctx, _| {
        for (i, byte) in ctx.mr_bytes_mut(&a.mr).iter_mut().enumerate() {
            *byte = (i % 251) as u8;
        }
    });
    let write = SendWr::new(
        7,
        WrOp::Write {
            remote_addr: b.mr.addr,
            rkey: b.mr.rkey,
        },
        vec![a.mr.sge(0, LEN as u32)],
    );
    run(&a, write, "WRITE")?;

    // The completion means B acknowledged every byte: they are in place.
    let intact = b.dev.with(|ctx, _| {
        ctx.mr_bytes(&b.mr)
            .iter()
            .enumerate()
            .all(|(i, &v)| v == (i % 251) as u8)
    });
    println!(
        "WRITE of {LEN} B from {} to {}: {}",
        a.dev.addr(),
        b.dev.addr(),
        if intact { "intact" } else { "CORRUPT" }
    );
    if intact {
        Ok(())
    } else {
        Err("the bytes differ".into())
    }
}
