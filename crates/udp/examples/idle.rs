//! What an idle device costs: two connected MetaRoCE devices in this
//! process, one WRITE between them, then nothing to send for a while, with
//! one application thread waiting on B's completion queue in
//! `Device::poll_cq_wait` (as an application waiting for a message does).
//! Prints the CPU time the whole process used in that window (utime +
//! stime of `/proc/self/stat`, every thread: both engines, the waiting
//! thread, this one) as a share of one CPU. The target is < 1 %.
//!
//! ```sh
//! cargo run --release -p metaroce-udp --example idle -- [SECONDS]   # default 5
//! ```

mod common;
use common::{connect, open, run};

use metaroce_verbs::{AccessFlags, SendWr, WorkCompletion, WrOp};
use std::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const LEN: u64 = 1 << 20;
const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);
/// Clock ticks per second of `/proc/<pid>/stat`'s times (`USER_HZ`: 100 on
/// every Linux architecture that has a `/proc`).
const TICKS_PER_S: f64 = 100.0;

/// utime + stime of this process, clock ticks.
fn cpu_ticks() -> Result<u64, Box<dyn Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is the first, utime the 12th, stime the 13th.
    let rest = stat
        .rsplit_once(')')
        .ok_or("/proc/self/stat: no command name")?
        .1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64, Box<dyn Error>> {
        Ok(f.get(i).ok_or("/proc/self/stat: too short")?.parse()?)
    };
    Ok(field(11)? + field(12)?)
}

fn main() -> Result<(), Box<dyn Error>> {
    let secs: u64 = match std::env::args().nth(1) {
        Some(s) => s
            .parse()
            .map_err(|_| format!("SECONDS: not a number: {s}"))?,
        None => 5,
    };
    let a = open(1, LEN, ACCESS)?;
    let b = open(2, LEN, ACCESS)?;
    connect(&a, &b)?;
    connect(&b, &a)?;
    let write = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: b.mr.addr,
            rkey: b.mr.rkey,
        },
        vec![a.mr.sge(0, LEN as u32)],
    );
    run(&a, write, "WRITE")?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| -> Result<(), Box<dyn Error>> {
        s.spawn(|| {
            let mut wc = [WorkCompletion::default(); 4];
            while !stop.load(Ordering::Relaxed) {
                let _ = b
                    .dev
                    .poll_cq_wait(b.cq, &mut wc, Duration::from_millis(100));
            }
        });
        // Past the busy-poll windows and the delayed ACKs of the WRITE.
        std::thread::sleep(Duration::from_millis(500));
        let t0 = Instant::now();
        let before = cpu_ticks()?;
        std::thread::sleep(Duration::from_secs(secs));
        let used_s = cpu_ticks()?.saturating_sub(before) as f64 / TICKS_PER_S;
        let wall_s = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        println!(
            "idle: two connected devices, one thread in poll_cq_wait: {:.0} ms of CPU in {wall_s:.1} s = {:.2} % of a CPU (target < 1 %)",
            used_s * 1e3,
            100.0 * used_s / wall_s
        );
        Ok(())
    })
}
