//! RDMA READ between two MetaRoCE devices in this process, over real UDP
//! on 127.0.0.1: A reads B's buffer (which B registered with remote read
//! access) into its own, without B's application doing anything.
//!
//! ```sh
//! cargo run -p metaroce-udp --example read
//! ```

mod common;
use common::{connect, open, run};

use metaroce_verbs::{AccessFlags, SendWr, WrOp};
use std::error::Error;

const LEN: u64 = 256 << 10;
const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_READ.0);

fn main() -> Result<(), Box<dyn Error>> {
    let a = open(1, LEN, ACCESS)?;
    let b = open(2, LEN, ACCESS)?;
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
    let wc = run(&a, read, "READ")?;
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
