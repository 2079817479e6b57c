//! A rank that never joins is an error naming it, on the root and on the
//! ranks that did join; a rank that dies mid-run (a real process killed
//! with SIGKILL) ends every other rank's collective with an error naming
//! it, never a hang — whether it was an ordinary rank or the root.

mod common;

use common::{cfg, free_root, job};
use metaroce_coll::report::PerfCollective;
use metaroce_coll::{Collective, DataType, OpSpec, ReduceOp};
use metaroce_collnet::perf::{self, Measure};
use metaroce_collnet::{CollNetError, NetComm, NetConfig, connect};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn missing_rank_is_named_after_the_timeout() {
    let root = free_root();
    let c = NetConfig {
        bootstrap_timeout: Duration::from_secs(2),
        ..cfg()
    };
    let t0 = Instant::now();
    let threads: Vec<_> = [0u32, 1, 3]
        .into_iter()
        .map(|rank| {
            let c = c.clone();
            std::thread::spawn(move || connect(&job(rank, 4, root), &c).map(|_| ()))
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    match &results[0] {
        Err(CollNetError::MissingRanks { missing, world, .. }) => {
            assert_eq!((missing.as_slice(), *world), (&[2][..], 4));
        }
        other => panic!("root: {other:?}"),
    }
    for r in &results[1..] {
        let e = r.as_ref().expect_err("a member without rank 2");
        let text = e.to_string();
        assert!(
            text.contains("[2]") && text.contains("never joined"),
            "{text}"
        );
    }
}

#[test]
fn unreachable_root_is_a_clear_error() {
    let root = free_root();
    let c = NetConfig {
        bootstrap_timeout: Duration::from_secs(1),
        ..cfg()
    };
    let e = connect(&job(1, 2, root), &c).expect_err("no root");
    let text = e.to_string();
    assert!(text.contains("cannot reach the root (rank 0)"), "{text}");
}

/// A measurement that fails says why, not that its buffers, which the
/// failed operation still holds, cannot be freed. (A transport failure
/// under collnet's netns test read 'the buffer is in use by a pending
/// operation'.) Here rank 1 stalls: rank 0 never joins its all-reduce.
#[test]
fn a_failed_measurement_reports_its_cause() {
    let root = free_root();
    let idle = std::thread::spawn(move || -> Result<(), CollNetError> {
        let comm = connect(&job(0, 2, root), &cfg())?;
        std::thread::sleep(Duration::from_secs(3));
        drop(comm);
        Ok(())
    });
    let c = NetConfig {
        stall_timeout: Duration::from_secs(1),
        ..cfg()
    };
    let mut comm = match connect(&job(1, 2, root), &c) {
        Ok(comm) => comm,
        Err(e) => panic!("rank 1: {e}; rank 0: {:?}", idle.join()),
    };
    let m = Measure {
        warmup_iters: 1,
        check: 0,
        ..Measure::once(
            PerfCollective::AllReduce,
            1 << 20,
            DataType::Float32,
            ReduceOp::Sum,
        )
    };
    let e = perf::measure_row(&mut comm, &m).expect_err("rank 0 never takes part");
    assert!(matches!(e, CollNetError::Stalled { .. }), "{e}");
    drop(comm);
    idle.join().unwrap().expect("rank 0");
}

const CHILD_RANK: &str = "COLLNET_TEST_CHILD_RANK";
const CHILD_ROOT: &str = "COLLNET_TEST_CHILD_ROOT";
const WORLD: u32 = 4;

fn spec() -> OpSpec {
    OpSpec::new(
        Collective::AllReduce,
        DataType::Float32,
        ReduceOp::Sum,
        256 << 10,
    )
}

/// All-reduces until something fails; returns the error and how many ran.
fn loop_until_error(comm: &mut NetComm) -> (CollNetError, u64) {
    let input = vec![0u8; 1 << 20];
    let mut out = vec![0u8; 1 << 20];
    for i in 0..1_000_000u64 {
        if let Err(e) = comm.run_slices(spec(), &input, &mut out) {
            return (e, i);
        }
    }
    panic!("a million all-reduces and no failure");
}

/// The child process: one rank that runs all-reduces until it is killed.
fn child(rank: u32, root: &str) {
    let mut comm = connect(&job(rank, WORLD, root.parse().unwrap()), &cfg()).unwrap();
    let (e, _) = loop_until_error(&mut comm);
    panic!("the child rank failed before it was killed: {e}");
}

fn dead_rank(victim: u32) {
    let root = free_root();
    let test = format!("dead_rank_{victim}");
    let mut kid = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test, "--nocapture", "--test-threads", "1"])
        .env(CHILD_RANK, victim.to_string())
        .env(CHILD_ROOT, root.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let threads: Vec<_> = (0..WORLD)
        .filter(|&r| r != victim)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut comm = connect(&job(rank, WORLD, root), &cfg()).unwrap();
                let (e, ran) = loop_until_error(&mut comm);
                (rank, e, ran, Instant::now())
            })
        })
        .collect();
    // Let the job run, then kill the victim outright.
    std::thread::sleep(Duration::from_millis(1500));
    kid.kill().unwrap();
    let killed = Instant::now();
    let _ = kid.wait();
    for t in threads {
        let (rank, e, ran, at) = t.join().unwrap();
        let text = e.to_string();
        eprintln!(
            "rank {rank} after {ran} all-reduces, {:?} after the kill: {text}",
            at.saturating_duration_since(killed)
        );
        assert!(ran > 0, "rank {rank} never completed an all-reduce");
        assert!(
            at.saturating_duration_since(killed) < Duration::from_secs(10),
            "rank {rank}"
        );
        let names_victim = if victim == 0 {
            text.contains("rank 0")
        } else {
            text.contains(&format!("rank {victim}"))
        };
        assert!(names_victim, "rank {rank}: {text}");
    }
}

#[test]
fn dead_rank_3() {
    if let (Ok(r), Ok(root)) = (std::env::var(CHILD_RANK), std::env::var(CHILD_ROOT)) {
        return child(r.parse().unwrap(), &root);
    }
    dead_rank(3);
}

#[test]
fn dead_rank_0() {
    if let (Ok(r), Ok(root)) = (std::env::var(CHILD_RANK), std::env::var(CHILD_ROOT)) {
        return child(r.parse().unwrap(), &root);
    }
    dead_rank(0);
}
