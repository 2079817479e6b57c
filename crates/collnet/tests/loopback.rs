//! Every collective over real sockets on 127.0.0.1, verified element by
//! element (#wrong = 0), at 2, 3, 4, 5 and 8 ranks, from 4 bytes to a few
//! MiB, in and out of place, also with 1 % of received datagrams dropped.
//! The sizes up to 256 MiB run in an ignored test (`cargo test --release
//! -p metaroce-collnet -- --ignored`).

mod common;

use common::{cfg, run_ranks, run_ranks_with};
use metaroce_coll::report::PerfCollective;
use metaroce_coll::{DataType, ReduceOp};
use metaroce_collnet::perf::{self, Measure};
use metaroce_collnet::{Impair, NetConfig};

/// Verifies `collectives` at `sizes` on `world` ranks: each size out of
/// place and in place, one timed iteration, one checked run.
fn verify(
    world: u32,
    cfg: &NetConfig,
    collectives: &[PerfCollective],
    sizes: &[u64],
    dtype: DataType,
    op: ReduceOp,
) {
    verify_with(world, cfg, collectives, sizes, dtype, op, |m| m);
}

/// [`verify`], each row's measurement changed by `tweak` first.
fn verify_with(
    world: u32,
    cfg: &NetConfig,
    collectives: &[PerfCollective],
    sizes: &[u64],
    dtype: DataType,
    op: ReduceOp,
    tweak: impl Fn(Measure) -> Measure + Send + Sync + 'static,
) {
    let collectives = collectives.to_vec();
    let sizes = sizes.to_vec();
    let results = run_ranks(world, cfg, move |comm| {
        let mut rows = Vec::new();
        for &c in &collectives {
            for &size in &sizes {
                let m = tweak(Measure {
                    root: 1 % comm.world(),
                    seed: size ^ 0x5eed,
                    ..Measure::once(c, size, dtype, op)
                });
                rows.push((c, size, perf::measure_row(comm, &m)?));
            }
        }
        Ok(rows)
    });
    for (rank, r) in results.into_iter().enumerate() {
        let rows = r.unwrap_or_else(|e| panic!("world {world} rank {rank}: {e}"));
        for (c, size, row) in rows {
            assert_eq!(
                row.out_of_place.wrong,
                Some(0),
                "{} {size} B out of place, world {world}",
                c.name()
            );
            assert_eq!(
                row.in_place.wrong,
                Some(0),
                "{} {size} B in place, world {world}",
                c.name()
            );
        }
    }
}

const SIZES: [u64; 6] = [4, 1000, 65_536, 65_540, 300_000, 3 << 20];

#[test]
fn all_collectives_2_3_4_5_8_ranks() {
    for world in [2, 3, 4, 5, 8] {
        let sizes: &[u64] = if world == 8 { &SIZES[..5] } else { &SIZES };
        verify(
            world,
            &cfg(),
            &PerfCollective::ALL,
            sizes,
            DataType::Float32,
            ReduceOp::Sum,
        );
    }
}

#[test]
fn types_and_operators() {
    for (dtype, op) in [
        (DataType::Bfloat16, ReduceOp::Avg),
        (DataType::Float16, ReduceOp::Prod),
        (DataType::Int64, ReduceOp::Max),
        (DataType::Uint8, ReduceOp::Min),
        (DataType::Float64, ReduceOp::Avg),
    ] {
        verify(
            3,
            &cfg(),
            &[
                PerfCollective::AllReduce,
                PerfCollective::ReduceScatter,
                PerfCollective::Reduce,
            ],
            &[8, 100_000],
            dtype,
            op,
        );
    }
}

#[test]
fn all_collectives_with_one_percent_loss() {
    let lossy = NetConfig {
        impair: Some("loss=0.01,seed=5".parse::<Impair>().unwrap()),
        ..cfg()
    };
    for world in [2, 3, 4, 5, 8] {
        let sizes: &[u64] = if world >= 5 {
            &[4, 65_540, 1 << 20]
        } else {
            &SIZES
        };
        verify(
            world,
            &lossy,
            &PerfCollective::ALL,
            sizes,
            DataType::Float32,
            ReduceOp::Sum,
        );
    }
}

/// 4 bytes to 256 MiB, every collective, at 2, 3, 4, 5 and 8 ranks (long:
/// run in release).
#[test]
#[ignore = "minutes in release; cargo test --release -p metaroce-collnet -- --ignored"]
fn all_collectives_up_to_256_mib() {
    let sizes: Vec<u64> = (2..=28).step_by(2).map(|e| 1u64 << e).collect();
    for world in [2, 3, 4, 5, 8] {
        verify(
            world,
            &cfg(),
            &PerfCollective::ALL,
            &sizes,
            DataType::Float32,
            ReduceOp::Sum,
        );
    }
    let lossy = NetConfig {
        impair: Some("loss=0.01,seed=5".parse::<Impair>().unwrap()),
        ..cfg()
    };
    for world in [2, 3, 4, 5, 8] {
        verify(
            world,
            &lossy,
            &PerfCollective::ALL,
            &[4, 1 << 20, 64 << 20, 256 << 20],
            DataType::Float32,
            ReduceOp::Sum,
        );
    }
}

/// One rank whose host runs more ranks than cores makes the whole job
/// choose recursive halving-doubling for a large all-reduce (each rank
/// knows only its own host; the root combines them at bootstrap), and
/// every rank then runs the same plan: the operation completes and
/// verifies.
#[test]
fn one_oversubscribed_host_sets_the_algorithm_for_all() {
    use metaroce_coll::Algorithm;
    const WORLD: u32 = 4;
    let results = run_ranks_with(
        WORLD,
        |rank| {
            let mut c = cfg();
            c.comm.ranks_share_cores = rank == 2;
            c
        },
        |comm| {
            let m = Measure::once(
                PerfCollective::AllReduce,
                1 << 20,
                DataType::Float32,
                ReduceOp::Sum,
            );
            let spec = perf::spec_for(
                m.collective,
                m.bytes / 4,
                m.dtype,
                m.op,
                m.root,
                comm.rank(),
                comm.world(),
            );
            let chosen = comm.communicator().algorithm_for(&spec).unwrap();
            let row = perf::measure_row(comm, &m)?;
            Ok((chosen, row.out_of_place.wrong))
        },
    );
    for (rank, r) in results.into_iter().enumerate() {
        let (chosen, wrong) = r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(chosen, Algorithm::HalvingDoubling, "rank {rank}");
        assert_eq!(wrong, Some(0), "rank {rank}");
    }
}

/// Symmetric receive buffers (`-R 2`): the all-reduce's all-gather writes
/// each block straight into the peer's output (halving-doubling at 4 and
/// 8 ranks, the ring at 2, 3 and 4), every size verified in and out of
/// place, also with 1 % of received datagrams dropped (resends of the
/// reduce-scatter then race the peer's writes into the same bytes). Each
/// row runs two operations back to back, the second on buffers the
/// driver refilled in between: a peer must not write into them before
/// their rank has started (the all-gather collective, which would, goes
/// through staging; it is checked here too).
#[test]
fn symmetric_buffers_take_direct_writes() {
    use metaroce_coll::Algorithm;
    let lossy = NetConfig {
        impair: Some("loss=0.01,seed=7".parse::<Impair>().unwrap()),
        ..cfg()
    };
    let hd = Algorithm::HalvingDoubling;
    let ring = Algorithm::Ring;
    let sizes = [4u64, 65_540, 300_000, 3 << 20];
    for (world, algorithm, c) in [
        (4u32, hd, cfg()),
        (8, hd, cfg()),
        (4, hd, lossy.clone()),
        (8, hd, lossy.clone()),
        (2, ring, cfg()),
        (3, ring, lossy.clone()),
        (4, ring, cfg()),
    ] {
        // Two timed operations, then the checked one on refilled buffers;
        // the all-reduce on the given algorithm, the all-gather on its one.
        let symmetric = move |m: Measure| Measure {
            algorithm: match m.collective {
                PerfCollective::AllReduce => algorithm,
                _ => Algorithm::Auto,
            },
            symmetric: true,
            iters: 2,
            ..m
        };
        let both = [PerfCollective::AllReduce, PerfCollective::AllGather];
        verify_with(
            world,
            &c,
            &both,
            &sizes,
            DataType::Float32,
            ReduceOp::Sum,
            symmetric,
        );
        let all_reduce = [PerfCollective::AllReduce];
        verify_with(
            world,
            &c,
            &all_reduce,
            &sizes,
            DataType::Bfloat16,
            ReduceOp::Sum,
            symmetric,
        );
    }
}

/// A symmetric buffer is a collective allocation: ranks that ask for
/// different sizes all fail with an error naming both, and an operation on
/// symmetric buffers refuses a receive buffer that is not one.
#[test]
fn symmetric_buffers_misused_are_clear_errors() {
    use metaroce_coll::{Collective, OpSpec};
    let results = run_ranks(3, &cfg(), |comm| {
        let len = if comm.rank() == 1 { 2048 } else { 1024 };
        Ok(comm
            .alloc_symmetric(len)
            .map(|_| ())
            .unwrap_err()
            .to_string())
    });
    for (rank, r) in results.into_iter().enumerate() {
        // The mismatch fails the communicator too, so the rank's run ends
        // in the same error.
        let e = r.unwrap_or_else(|e| e.to_string());
        assert!(e.contains("symmetric buffers differ"), "rank {rank}: {e}");
        assert!(e.contains("2048 bytes"), "rank {rank}: {e}");
    }
    let results = run_ranks(2, &cfg(), |comm| {
        let recv = comm.alloc(64)?;
        let spec = OpSpec::new(Collective::AllReduce, DataType::Float32, ReduceOp::Sum, 16)
            .in_place()
            .on_symmetric_buffers();
        Ok(comm.start(spec, None, Some(&recv)).unwrap_err().to_string())
    });
    for (rank, r) in results.into_iter().enumerate() {
        let e = r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert!(e.contains("alloc_symmetric"), "rank {rank}: {e}");
    }
}
