//! Plans agree across ranks: what one rank sends a peer, in order and
//! length, is exactly what the peer's plan expects from it.

use super::*;
use crate::spec::{P2p, P2pGroup};

fn collectives(world: u32, rank: Rank) -> Vec<(Collective, Vec<Algorithm>)> {
    let root = (world - 1).min(2);
    vec![
        (
            Collective::AllReduce,
            vec![
                Algorithm::Ring,
                Algorithm::RecursiveDoubling,
                Algorithm::Tree,
            ],
        ),
        (Collective::ReduceScatter, vec![Algorithm::Ring]),
        (Collective::AllGather, vec![Algorithm::Ring]),
        (Collective::AllToAll, vec![Algorithm::Direct]),
        (
            Collective::Broadcast { root },
            vec![Algorithm::Ring, Algorithm::Tree],
        ),
        (Collective::Reduce { root }, vec![Algorithm::Ring]),
        (Collective::Barrier, vec![Algorithm::Direct]),
        (
            Collective::SendRecv(P2pGroup::ring_neighbours(rank, world, 37)),
            vec![Algorithm::Direct],
        ),
    ]
}

#[test]
fn sends_match_receives_everywhere() {
    let config = CommConfig {
        slot_bytes: 64,
        ..CommConfig::default()
    };
    for world in [1u32, 2, 3, 4, 5, 8, 13] {
        for count in [0u64, 1, 3, 100, 333] {
            for chunk in [4u64, 24] {
                for in_place in [false, true] {
                    for (i, (_, algos)) in collectives(world, 0).iter().enumerate() {
                        for &algorithm in algos {
                            let plans: Vec<Plan> = (0..world)
                                .map(|r| {
                                    let spec = OpSpec {
                                        collective: collectives(world, r)[i].0.clone(),
                                        dtype: DataType::Float32,
                                        op: ReduceOp::Avg,
                                        count,
                                        in_place,
                                        algorithm,
                                        chunk_bytes: Some(chunk),
                                        symmetric: in_place,
                                    };
                                    build(&spec, r, world, &config).unwrap()
                                })
                                .collect();
                            let (sends, recvs): (Vec<_>, Vec<_>) =
                                plans.iter().map(Plan::message_lens).unzip();
                            for a in 0..world {
                                assert_eq!(plans[a as usize].sends_to[a as usize], 0);
                                for b in 0..world {
                                    assert_eq!(
                                        sends[a as usize][b as usize],
                                        recvs[b as usize][a as usize],
                                        "world {world} count {count} chunk {chunk} in_place {in_place} {:?} {algorithm} {a}->{b}",
                                        collectives(world, a)[i].0
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn ring_all_reduce_moves_the_bandwidth_optimum() {
    // 2 (n-1)/n of the buffer leaves every rank.
    let config = CommConfig::default();
    let spec = OpSpec::new(
        Collective::AllReduce,
        DataType::Float32,
        ReduceOp::Sum,
        1 << 20,
    )
    .with_algorithm(Algorithm::Ring);
    for world in [2u32, 3, 4, 8] {
        let plan = build(&spec, 1, world, &config).unwrap();
        let sent: u64 = plan
            .tasks
            .iter()
            .filter_map(|t| t.send)
            .map(|s| s.len)
            .sum();
        let bytes = 4u64 << 20;
        let want = 2 * (u64::from(world) - 1) * bytes / u64::from(world);
        assert!(
            sent.abs_diff(want) <= 8 * u64::from(world),
            "world {world}: {sent} vs {want}"
        );
    }
}

#[test]
fn bad_specs_are_errors() {
    let config = CommConfig::default();
    let base = OpSpec::new(
        Collective::Broadcast { root: 4 },
        DataType::Int32,
        ReduceOp::Sum,
        8,
    );
    assert!(matches!(
        build(&base, 0, 4, &config),
        Err(SpecError::Invalid(_))
    ));
    let chunk =
        OpSpec::new(Collective::AllReduce, DataType::Float64, ReduceOp::Sum, 8).with_chunk_bytes(4);
    assert!(matches!(
        build(&chunk, 0, 4, &config),
        Err(SpecError::Invalid(_))
    ));
    let huge = OpSpec::new(
        Collective::AllGather,
        DataType::Float64,
        ReduceOp::Sum,
        u64::MAX / 4,
    );
    assert!(matches!(
        build(&huge, 0, 4, &config),
        Err(SpecError::Invalid(_))
    ));
    let p2p = OpSpec::new(
        Collective::SendRecv(P2pGroup {
            sends: vec![P2p {
                peer: 9,
                offset: 0,
                count: 1,
            }],
            recvs: vec![],
        }),
        DataType::Int8,
        ReduceOp::Sum,
        0,
    );
    assert!(matches!(
        build(&p2p, 0, 4, &config),
        Err(SpecError::Invalid(_))
    ));
    let unmatched_self = OpSpec::new(
        Collective::SendRecv(P2pGroup {
            sends: vec![P2p {
                peer: 0,
                offset: 0,
                count: 1,
            }],
            recvs: vec![],
        }),
        DataType::Int8,
        ReduceOp::Sum,
        0,
    );
    assert!(matches!(
        build(&unmatched_self, 0, 4, &config),
        Err(SpecError::Invalid(_))
    ));
    let wrong_algo = base.clone().with_algorithm(Algorithm::RecursiveDoubling);
    assert!(matches!(
        build(&wrong_algo, 0, 8, &config),
        Err(SpecError::UnsupportedAlgorithm { .. })
    ));
}

#[test]
fn binomial_tree_shape() {
    use binomial::{children, parent};
    assert_eq!(children(0, 8), [1, 2, 4]);
    assert_eq!(children(4, 8), [5, 6]);
    assert_eq!(children(6, 8), [7]);
    assert_eq!(children(0, 5), [1, 2, 4]);
    assert_eq!(children(4, 5), Vec::<u32>::new());
    assert_eq!(children(0, 1), Vec::<u32>::new());
    for n in 1..40u32 {
        // Every non-root node is its parent's child exactly once.
        for q in 1..n {
            assert_eq!(
                children(parent(q), n).iter().filter(|&&c| c == q).count(),
                1
            );
        }
    }
}
