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
    let collectives = collectives.to_vec();
    let sizes = sizes.to_vec();
    let results = run_ranks(world, cfg, move |comm| {
        let mut rows = Vec::new();
        for &c in &collectives {
            for &size in &sizes {
                let m = Measure {
                    root: 1 % comm.world(),
                    seed: size ^ 0x5eed,
                    ..Measure::once(c, size, dtype, op)
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
