//! Atomics between two MetaRoCE devices in this process, over real UDP on
//! 127.0.0.1: FETCH_ADD and CMP_SWAP on a 64-bit word in B's memory. Each
//! returns the word's old value into A's buffer, and each runs exactly
//! once at B even if its packets are lost and resent.
//!
//! ```sh
//! cargo run -p metaroce-udp --example atomics
//! ```

mod common;
use common::{Side, connect, open, run};

use metaroce_verbs::{AccessFlags, SendWr, WrOp};
use std::error::Error;

const LEN: u64 = 64;
const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0);

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
    run(a, wr, "the atomic")?;
    Ok(word(a, 0))
}

fn main() -> Result<(), Box<dyn Error>> {
    let a = open(1, LEN, ACCESS)?;
    let b = open(2, LEN, ACCESS)?;
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
