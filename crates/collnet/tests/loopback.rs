//! Every collective over real sockets on 127.0.0.1, verified element by
//! element (#wrong = 0), at 2, 3, 4, 5 and 8 ranks, from 4 bytes to a few
//! MiB, in and out of place, also with 1 % of received datagrams dropped.
//! The sizes up to 256 MiB run in an ignored test (`cargo test --release
//! -p metaroce-collnet -- --ignored`).

mod common;

use common::{cfg, run_ranks};
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
    let collectives = collectives.to_vec();
    let sizes = sizes.to_vec();
    let results = run_ranks(world, cfg, move |comm| {
        let mut rows = Vec::new();
        for &c in &collectives {
            for &size in &sizes {
                let m = Measure {
                    collective: c,
                    bytes: size,
                    dtype,
                    op,
                    root: 1 % comm.world(),
                    iters: 1,
                    warmup_iters: 0,
                    agg_iters: 1,
                    check: 1,
                    blocking: 0,
                    average: 1,
                    seed: size ^ 0x5eed,
                    algorithm: metaroce_coll::Algorithm::Auto,
                };
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
    use common::{free_root, job};
    use metaroce_coll::Algorithm;
    use metaroce_collnet::connect;
    const WORLD: u32 = 4;
    let root = free_root();
    let threads: Vec<_> = (0..WORLD)
        .map(|rank| {
            let mut c = NetConfig {
                seed: 2000 + u64::from(rank),
                ..cfg()
            };
            c.comm.ranks_share_cores = rank == 2;
            std::thread::spawn(move || {
                let mut comm = connect(&job(rank, WORLD, root), &c)?;
                let m = Measure {
                    collective: PerfCollective::AllReduce,
                    bytes: 1 << 20,
                    dtype: DataType::Float32,
                    op: ReduceOp::Sum,
                    root: 0,
                    iters: 1,
                    warmup_iters: 0,
                    agg_iters: 1,
                    check: 1,
                    blocking: 0,
                    average: 1,
                    seed: 7,
                    algorithm: Algorithm::Auto,
                };
                let spec = perf::spec_for(
                    m.collective,
                    m.bytes / 4,
                    m.dtype,
                    ReduceOp::Sum,
                    0,
                    rank,
                    WORLD,
                );
                let chosen = comm.communicator().algorithm_for(&spec).unwrap();
                let row = perf::measure_row(&mut comm, &m)?;
                comm.finish()?;
                Ok::<_, metaroce_collnet::CollNetError>((
                    chosen == Algorithm::HalvingDoubling,
                    row.out_of_place.wrong,
                ))
            })
        })
        .collect();
    for (rank, t) in threads.into_iter().enumerate() {
        let (hd, wrong) = t.join().unwrap().unwrap();
        assert!(hd, "rank {rank} did not choose halving-doubling");
        assert_eq!(wrong, Some(0), "rank {rank}");
    }
}
