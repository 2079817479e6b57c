//! Every collective, algorithm, type and operator at world sizes 1-8,
//! verified element by element against a local reference while the test
//! network delivers writes and completions in seeded random orders.

use metaroce_coll::testing::{Delivery, NetError, Payload, TestNet, TraceEntry, check};
use metaroce_coll::{
    Action, Algorithm, Buf, CollError, Collective, CommConfig, Communicator, DataType, Loc, OpSpec,
    P2pGroup, Rank, ReduceOp, WriteId,
};

const WORLDS: [u32; 6] = [1, 2, 3, 4, 5, 8];

/// Builds a case's collective for a rank and count.
type MakeCollective = Box<dyn Fn(Rank, u64) -> Collective>;

/// Every (collective, algorithm) pair, built for `rank`.
fn cases(world: u32) -> Vec<(&'static str, Algorithm, MakeCollective)> {
    let root = world / 2;
    vec![
        (
            "all_reduce",
            Algorithm::Ring,
            Box::new(|_, _| Collective::AllReduce),
        ),
        (
            "all_reduce",
            Algorithm::RecursiveDoubling,
            Box::new(|_, _| Collective::AllReduce),
        ),
        (
            "all_reduce",
            Algorithm::HalvingDoubling,
            Box::new(|_, _| Collective::AllReduce),
        ),
        (
            "all_reduce",
            Algorithm::Tree,
            Box::new(|_, _| Collective::AllReduce),
        ),
        (
            "reduce_scatter",
            Algorithm::Ring,
            Box::new(|_, _| Collective::ReduceScatter),
        ),
        (
            "all_gather",
            Algorithm::Ring,
            Box::new(|_, _| Collective::AllGather),
        ),
        (
            "alltoall",
            Algorithm::Direct,
            Box::new(|_, _| Collective::AllToAll),
        ),
        (
            "broadcast",
            Algorithm::Ring,
            Box::new(move |_, _| Collective::Broadcast { root }),
        ),
        (
            "broadcast",
            Algorithm::Tree,
            Box::new(move |_, _| Collective::Broadcast { root }),
        ),
        (
            "reduce",
            Algorithm::Ring,
            Box::new(move |_, _| Collective::Reduce { root }),
        ),
        (
            "barrier",
            Algorithm::Direct,
            Box::new(|_, _| Collective::Barrier),
        ),
        (
            "sendrecv",
            Algorithm::Direct,
            Box::new(move |r, count| {
                Collective::SendRecv(P2pGroup::ring_neighbours(r, world, count))
            }),
        ),
    ]
}

fn spec(
    c: Collective,
    dtype: DataType,
    op: ReduceOp,
    count: u64,
    algorithm: Algorithm,
    in_place: bool,
) -> OpSpec {
    OpSpec {
        collective: c,
        dtype,
        op,
        count,
        in_place,
        algorithm,
        chunk_bytes: None,
        symmetric: false,
    }
}

#[test]
fn every_collective_type_and_operator() {
    // Small slots so that even small buffers span several chunks and the
    // two-slot flow control is exercised.
    let config = CommConfig {
        slots: 2,
        slot_bytes: 16,
        ..CommConfig::default()
    };
    let mut checks = 0;
    for world in WORLDS {
        for (name, algorithm, make) in cases(world) {
            let reduces = make(0, 1).reduces();
            let ops: &[ReduceOp] = if reduces {
                &ReduceOp::ALL
            } else {
                &[ReduceOp::Sum]
            };
            for dtype in DataType::ALL {
                for &op in ops {
                    for (count, in_place) in [
                        (0u64, false),
                        (1, true),
                        (5, false),
                        (19, true),
                        (19, false),
                    ] {
                        let seed = u64::from(world) * 1000 + checks;
                        let f =
                            |r: Rank| spec(make(r, count), dtype, op, count, algorithm, in_place);
                        let report = check(world, config, &f, Delivery::Random(seed), seed)
                            .unwrap_or_else(|e| panic!("{name}/{algorithm} world {world} {dtype} {op} count {count} in_place {in_place}: {e}"));
                        assert_eq!(
                            report.wrong, 0,
                            "{name}/{algorithm} world {world} {dtype} {op} count {count} in_place {in_place}"
                        );
                        checks += 1;
                    }
                }
            }
        }
    }
    assert!(checks > 3000, "{checks}");
}

#[test]
fn sizes_from_four_bytes_to_megabytes() {
    let config = CommConfig {
        slots: 4,
        slot_bytes: 64 * 1024,
        ..CommConfig::default()
    };
    let sizes = [4u64, 1000, 64 * 1024 + 4, 1 << 20, 3 << 20];
    for world in [2u32, 3, 5, 8] {
        for (name, algorithm, make) in cases(world) {
            if name == "barrier" {
                continue;
            }
            for &bytes in &sizes {
                // Recursive doubling and trees send the whole buffer per
                // step; keep them to the sizes Auto would give them.
                if matches!(algorithm, Algorithm::RecursiveDoubling | Algorithm::Tree)
                    && bytes > (1 << 20)
                {
                    continue;
                }
                // Megabytes only at 3 (1 MiB) and 8 ranks (3 MiB) keep the
                // test to seconds.
                let largest = match world {
                    3 => 1 << 20,
                    8 => 3 << 20,
                    _ => 64 * 1024 + 4,
                };
                if bytes > largest {
                    continue;
                }
                let count = bytes / 4;
                // Collectives whose count is per rank: keep the total bytes.
                let count = match name {
                    "reduce_scatter" | "all_gather" | "alltoall" => {
                        (count / u64::from(world)).max(1)
                    }
                    _ => count,
                };
                let seed = bytes ^ u64::from(world);
                let f = |r: Rank| {
                    spec(
                        make(r, count),
                        DataType::Float32,
                        ReduceOp::Sum,
                        count,
                        algorithm,
                        bytes % 8 == 0,
                    )
                };
                let report = check(world, config, &f, Delivery::Random(seed), seed)
                    .unwrap_or_else(|e| panic!("{name}/{algorithm} world {world} {bytes} B: {e}"));
                assert_eq!(
                    report.wrong, 0,
                    "{name}/{algorithm} world {world} {bytes} B"
                );
            }
        }
    }
}

#[test]
fn fifo_and_default_config() {
    for world in WORLDS {
        for (name, algorithm, make) in cases(world) {
            let count = 1000;
            let f = |r: Rank| {
                spec(
                    make(r, count),
                    DataType::Bfloat16,
                    ReduceOp::Max,
                    count,
                    algorithm,
                    false,
                )
            };
            let report = check(world, CommConfig::default(), &f, Delivery::Fifo, 7)
                .unwrap_or_else(|e| panic!("{name}/{algorithm} world {world}: {e}"));
            assert_eq!(report.wrong, 0, "{name}/{algorithm} world {world}");
        }
    }
}

#[test]
fn many_delivery_orders() {
    let config = CommConfig {
        slots: 2,
        slot_bytes: 8,
        ..CommConfig::default()
    };
    for seed in 0..40u64 {
        for world in [3u32, 5, 8] {
            for (name, algorithm, make) in cases(world) {
                let f = |r: Rank| {
                    spec(
                        make(r, 23),
                        DataType::Int32,
                        ReduceOp::Sum,
                        23,
                        algorithm,
                        seed % 2 == 0,
                    )
                };
                let report =
                    check(world, config, &f, Delivery::Random(seed), seed).unwrap_or_else(|e| {
                        panic!("{name}/{algorithm} world {world} seed {seed}: {e}")
                    });
                assert_eq!(
                    report.wrong, 0,
                    "{name}/{algorithm} world {world} seed {seed}"
                );
            }
        }
    }
}

/// The simulator's view: with no bytes at all, the same state machine asks
/// for exactly the same writes and computations in the same order.
#[test]
fn sizes_only_runs_the_same_state_machine() {
    let config = CommConfig {
        slots: 3,
        slot_bytes: 4096,
        ..CommConfig::default()
    };
    for world in [2u32, 3, 5, 8] {
        for (name, algorithm, make) in cases(world) {
            let count = 10_000;
            let specs: Vec<OpSpec> = (0..world)
                .map(|r| {
                    spec(
                        make(r, count),
                        DataType::Float16,
                        ReduceOp::Avg,
                        count,
                        algorithm,
                        false,
                    )
                })
                .collect();
            let run = |payload| {
                let mut net = TestNet::new(world, config, Delivery::Random(99), payload).unwrap();
                for (r, s) in specs.iter().enumerate() {
                    let sizes = s.buffer_sizes(r as Rank, world);
                    if payload == Payload::Bytes {
                        net.set_buffers(
                            r as Rank,
                            vec![0; sizes.send_bytes as usize],
                            vec![0; sizes.recv_bytes as usize],
                        );
                    }
                    net.start(r as Rank, s.clone()).unwrap();
                }
                net.run()
                    .unwrap_or_else(|e| panic!("{name}/{algorithm} world {world}: {e}"));
                let stats: Vec<_> = (0..world).map(|r| net.stats(r)).collect();
                (net.trace().to_vec(), stats)
            };
            let (bytes_trace, bytes_stats) = run(Payload::Bytes);
            let (sizes_trace, sizes_stats) = run(Payload::SizesOnly);
            assert_eq!(bytes_trace, sizes_trace, "{name}/{algorithm} world {world}");
            assert_eq!(bytes_stats, sizes_stats);
            let data: u64 = sizes_trace
                .iter()
                .filter_map(|t| match t {
                    TraceEntry::Write { len, .. } => Some(*len),
                    _ => None,
                })
                .sum();
            assert_eq!(data, sizes_stats.iter().map(|s| s.data_bytes).sum::<u64>());
        }
    }
}

/// Operations queued back to back: fast ranks run ahead into the next one
/// and their messages wait in the slow ranks' staging slots.
#[test]
fn queued_operations_overlap_across_ranks() {
    let config = CommConfig {
        slots: 2,
        slot_bytes: 32,
        ..CommConfig::default()
    };
    for world in [2u32, 3, 5] {
        for seed in 0..10 {
            let count = 29u64;
            let mut net =
                TestNet::new(world, config, Delivery::Random(seed), Payload::Bytes).unwrap();
            let inputs: Vec<Vec<i32>> = (0..world)
                .map(|r| (0..count as i32).map(|i| i * 3 + r as i32).collect())
                .collect();
            for r in 0..world {
                let bytes: Vec<u8> = inputs[r as usize]
                    .iter()
                    .flat_map(|x| x.to_ne_bytes())
                    .collect();
                net.set_buffers(r, Vec::new(), bytes);
                for algorithm in [
                    Algorithm::Ring,
                    Algorithm::RecursiveDoubling,
                    Algorithm::Tree,
                ] {
                    net.start(
                        r,
                        spec(
                            Collective::AllReduce,
                            DataType::Int32,
                            ReduceOp::Sum,
                            count,
                            algorithm,
                            true,
                        ),
                    )
                    .unwrap();
                    net.start(
                        r,
                        spec(
                            Collective::Barrier,
                            DataType::Int32,
                            ReduceOp::Sum,
                            0,
                            Algorithm::Auto,
                            false,
                        ),
                    )
                    .unwrap();
                }
            }
            net.run().unwrap();
            // Three in-place sums: n^2 times the first sum.
            let n = world as i32;
            for r in 0..world {
                let got: Vec<i32> = net
                    .buffers(r)
                    .1
                    .chunks_exact(4)
                    .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                    .collect();
                let want: Vec<i32> = (0..count as usize)
                    .map(|i| inputs.iter().map(|x| x[i]).sum::<i32>() * n * n)
                    .collect();
                assert_eq!(got, want, "world {world} seed {seed} rank {r}");
                assert_eq!(net.done(r).len(), 6);
            }
        }
    }
}

#[test]
fn bad_events_are_errors_not_panics() {
    let config = CommConfig::default();
    let mut c = Communicator::new(1, 3, config).unwrap();
    let s = spec(
        Collective::AllReduce,
        DataType::Float32,
        ReduceOp::Sum,
        1024,
        Algorithm::Ring,
        false,
    );
    c.start(s).unwrap();
    while c.poll_action().is_some() {}
    assert!(matches!(
        c.on_write_done(WriteId(12345)),
        Err(CollError::UnknownWrite(_))
    ));
    let mut c = Communicator::new(1, 3, config).unwrap();
    assert!(matches!(
        c.on_write_arrived(1, 0, 0),
        Err(CollError::BadPeer { .. })
    ));
    let mut c = Communicator::new(1, 3, config).unwrap();
    assert!(matches!(
        c.on_write_arrived(7, 0, 0),
        Err(CollError::BadPeer { .. })
    ));
    // A message with the wrong sequence number for its slot.
    let mut c = Communicator::new(1, 3, config).unwrap();
    let imm = metaroce_coll::imm::Imm::data(0, 5).encode();
    assert!(matches!(
        c.on_write_arrived(0, imm, 4),
        Err(CollError::Protocol { .. })
    ));
    // Once failed, always failed.
    assert!(matches!(
        c.on_write_arrived(0, 0, 4),
        Err(CollError::Failed(_))
    ));
    // A slot index beyond the configured slots.
    let mut c = Communicator::new(1, 3, config).unwrap();
    let imm = metaroce_coll::imm::Imm::data(200, 0).encode();
    assert!(matches!(
        c.on_write_arrived(0, imm, 4),
        Err(CollError::Protocol { .. })
    ));
    // A credit nobody waits for.
    let mut c = Communicator::new(1, 3, config).unwrap();
    let imm = metaroce_coll::imm::Imm::credit(0, 0).encode();
    assert!(matches!(
        c.on_write_arrived(0, imm, 0),
        Err(CollError::Protocol { .. })
    ));
    // A second message into a full slot.
    let mut c = Communicator::new(1, 3, config).unwrap();
    let imm = metaroce_coll::imm::Imm::data(0, 0).encode();
    c.on_write_arrived(0, imm, 4).unwrap();
    assert!(matches!(
        c.on_write_arrived(0, imm, 4),
        Err(CollError::Protocol { .. })
    ));
    // A message of a length the plan does not expect.
    let mut c = Communicator::new(1, 2, config).unwrap();
    c.start(spec(
        Collective::AllReduce,
        DataType::Float32,
        ReduceOp::Sum,
        16,
        Algorithm::Ring,
        false,
    ))
    .unwrap();
    let imm = metaroce_coll::imm::Imm::data(0, 0).encode();
    assert!(matches!(
        c.on_write_arrived(0, imm, 12),
        Err(CollError::Protocol { .. })
    ));
    // Invalid operations.
    let mut c = Communicator::new(0, 2, config).unwrap();
    assert!(
        c.start(spec(
            Collective::Broadcast { root: 2 },
            DataType::Int8,
            ReduceOp::Sum,
            1,
            Algorithm::Auto,
            false
        ))
        .is_err()
    );
    assert!(Communicator::new(2, 2, config).is_err());
    assert!(Communicator::new(0, 2, CommConfig { slots: 1, ..config }).is_err());
}

/// Ranks that disagree on the operation are caught, not silently corrupted.
#[test]
fn mismatched_operations_are_detected() {
    let config = CommConfig {
        slots: 2,
        slot_bytes: 64,
        ..CommConfig::default()
    };
    let mut net = TestNet::new(2, config, Delivery::Fifo, Payload::SizesOnly).unwrap();
    net.start(
        0,
        spec(
            Collective::AllReduce,
            DataType::Float32,
            ReduceOp::Sum,
            100,
            Algorithm::Ring,
            false,
        ),
    )
    .unwrap();
    net.start(
        1,
        spec(
            Collective::AllReduce,
            DataType::Float32,
            ReduceOp::Sum,
            60,
            Algorithm::Ring,
            false,
        ),
    )
    .unwrap();
    assert!(matches!(
        net.run(),
        Err(NetError::Comm {
            error: CollError::Protocol { .. },
            ..
        })
    ));
}

/// A rank that never starts the operation leaves the others pending: the
/// network reports the deadlock with the ranks still waiting.
#[test]
fn a_missing_rank_stalls_visibly() {
    let mut net =
        TestNet::new(3, CommConfig::default(), Delivery::Fifo, Payload::SizesOnly).unwrap();
    for r in 0..2 {
        net.start(
            r,
            spec(
                Collective::AllReduce,
                DataType::Float32,
                ReduceOp::Sum,
                100,
                Algorithm::Ring,
                false,
            ),
        )
        .unwrap();
    }
    assert_eq!(
        net.run(),
        Err(NetError::Stalled {
            pending: vec![0, 1]
        })
    );
}

/// Driving a communicator by hand, the way a verbs driver would.
#[test]
fn two_ranks_by_hand() {
    let config = CommConfig::default();
    let s = small_rd_all_reduce();
    let mut a = Communicator::new(0, 2, config).unwrap();
    a.start(s.clone()).unwrap();
    // The input goes straight to the partner's first slot for rank 0 (out
    // of place, nothing is copied into the output first).
    let Some(Action::Write(w)) = a.poll_action() else {
        panic!()
    };
    assert_eq!(
        (w.peer, w.src, w.len, w.remote_offset),
        (1, Loc::new(Buf::Send, 0), 8, 0)
    );
    assert!(a.poll_action().is_none());
    // The partner's message arrives: fold it with the input into the
    // output at once (our write reads the input, which the fold leaves
    // alone)...
    a.on_write_arrived(1, w.imm, 8).unwrap();
    let Some(Action::Compute(fold)) = a.poll_action() else {
        panic!()
    };
    a.on_compute_done(fold.id).unwrap();
    // ...and finish once our own write is done too. The slot's credit
    // stays: this rank writes to the partner in every all-reduce, and the
    // partner needs that slot again only for its fifth message, of a later
    // operation.
    assert!(a.poll_action().is_none(), "done before its write");
    a.on_write_done(w.id).unwrap();
    assert_eq!(a.poll_action(), Some(Action::Done(metaroce_coll::OpId(0))));
    assert_eq!(a.poll_action(), None);
    assert!(a.is_idle());
    assert_eq!(a.credits_owed(), 1);
    // The next operation's write carries it.
    a.start(s).unwrap();
    let Some(Action::Write(w)) = a.poll_action() else {
        panic!()
    };
    assert!(matches!(
        metaroce_coll::imm::Imm::decode(w.imm),
        metaroce_coll::imm::Imm::Data {
            credit: Some((0, _)),
            ..
        }
    ));
    assert_eq!(a.credits_owed(), 0);
    assert_eq!(a.stats().credit_writes, 0);
}

/// An 8-byte all-reduce by recursive doubling: the small operation whose
/// credits the tests below follow.
fn small_rd_all_reduce() -> OpSpec {
    spec(
        Collective::AllReduce,
        DataType::Int64,
        ReduceOp::Sum,
        1,
        Algorithm::RecursiveDoubling,
        false,
    )
}

/// Drives `comms` by hand until none has an action: computations done at
/// once, writes completed and delivered at once. `on_done` sees each
/// finished operation (and may start another). Returns every write's
/// sender and immediate, in order.
fn drive_at_once(
    comms: &mut [Communicator],
    mut on_done: impl FnMut(&mut Communicator),
) -> Vec<(Rank, metaroce_coll::imm::Imm)> {
    use metaroce_coll::imm::Imm;
    let mut imms = Vec::new();
    for _ in 0..10_000 {
        let mut any = false;
        for me in 0..comms.len() {
            while let Some(act) = comms[me].poll_action() {
                any = true;
                match act {
                    Action::Compute(k) => comms[me].on_compute_done(k.id).unwrap(),
                    Action::Write(w) => {
                        let imm = Imm::decode(w.imm);
                        if matches!(imm, Imm::Credit { .. }) {
                            assert_eq!(w.len, 0, "a credit with a payload");
                        }
                        imms.push((me as Rank, imm));
                        comms[me].on_write_done(w.id).unwrap();
                        comms[w.peer as usize]
                            .on_write_arrived(me as Rank, w.imm, w.len)
                            .unwrap();
                    }
                    Action::Done(_) => on_done(&mut comms[me]),
                }
            }
        }
        if !any {
            return imms;
        }
    }
    panic!("still busy after 10,000 rounds");
}

/// Beyond 2 ranks a small all-reduce owes a partner its credit while it
/// writes to the other partner; the credit waits for the next operation's
/// write to that partner instead of costing a write (and its
/// acknowledgement) of its own.
#[test]
fn small_all_reduce_credits_ride_at_four_ranks() {
    const WORLD: u32 = 4;
    const OPS: u64 = 10;
    let mut comms: Vec<Communicator> = (0..WORLD)
        .map(|r| Communicator::new(r, WORLD, CommConfig::default()).unwrap())
        .collect();
    for c in &mut comms {
        c.start(small_rd_all_reduce()).unwrap();
    }
    // Each rank starts its next operation when its last one is done, the
    // way a blocking benchmark loop does.
    drive_at_once(&mut comms, |c| {
        if c.stats().ops_done < OPS {
            c.start(small_rd_all_reduce()).unwrap();
        }
    });
    for c in &comms {
        let st = c.stats();
        assert_eq!(st.ops_done, OPS);
        // Two partners, one message to each per operation.
        assert_eq!(st.data_writes, 2 * OPS);
        assert_eq!(
            st.credit_writes + st.credits_piggybacked + c.credits_owed() as u64,
            2 * OPS
        );
        assert!(
            st.credit_writes <= 2,
            "rank {}: {} credits on writes of their own in {OPS} operations",
            c.rank(),
            st.credit_writes
        );
    }
}

/// With the next operation queued behind, the credit for the partner's
/// message rides on the next operation's write to it instead.
#[test]
fn credits_ride_on_the_next_write() {
    use metaroce_coll::imm::Imm;
    let mut comms: Vec<Communicator> = (0..2)
        .map(|r| Communicator::new(r, 2, CommConfig::default()).unwrap())
        .collect();
    for c in &mut comms {
        c.start(small_rd_all_reduce()).unwrap();
        c.start(small_rd_all_reduce()).unwrap();
    }
    let imms = drive_at_once(&mut comms, |_| {});
    assert!(comms.iter().all(Communicator::is_idle));
    let piggy: u64 = comms.iter().map(|c| c.stats().credits_piggybacked).sum();
    assert!(piggy >= 1, "no credit rode on a data write: {imms:?}");
    assert!(
        imms.iter().any(|(_, i)| matches!(
            i,
            Imm::Data {
                credit: Some(_),
                ..
            }
        )),
        "{imms:?}"
    );
    // Every consumed message is credited exactly once, one way or the
    // other, or still owed (kept for the next operation's write).
    for c in &comms {
        let st = c.stats();
        assert_eq!(
            st.credit_writes + st.credits_piggybacked + c.credits_owed() as u64,
            2
        );
        assert_eq!(st.credit_writes, 0, "both credits rode or are kept");
    }
}

/// Big operations as a simulator would run them, no bytes: how many
/// events a 256 MiB all-reduce costs and how long the state machines take.
/// `cargo test --release -p metaroce-coll --test collectives -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a check"]
fn large_operations_sizes_only() {
    for world in [2u32, 4, 8] {
        for (name, algorithm, make) in cases(world) {
            if matches!(algorithm, Algorithm::RecursiveDoubling | Algorithm::Tree)
                || name == "barrier"
            {
                continue;
            }
            let count = (256u64 << 20) / 4;
            let count = match name {
                "reduce_scatter" | "all_gather" | "alltoall" => count / u64::from(world),
                _ => count,
            };
            let t = std::time::Instant::now();
            let mut net = TestNet::new(
                world,
                CommConfig::default(),
                Delivery::Random(1),
                Payload::SizesOnly,
            )
            .unwrap();
            for r in 0..world {
                net.start(
                    r,
                    spec(
                        make(r, count),
                        DataType::Float32,
                        ReduceOp::Sum,
                        count,
                        algorithm,
                        false,
                    ),
                )
                .unwrap();
            }
            net.run().unwrap();
            let s = net.stats(0);
            println!(
                "{name:>14}/{algorithm:<6} world {world}: {:>7} events, rank 0 {:>5} writes {:>10} bytes, {:>6.1} ms",
                net.events_run(),
                s.data_writes,
                s.data_bytes,
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}

/// Symmetric output buffers (`OpSpec::symmetric`): every collective and
/// algorithm still gives the reference's bytes, whatever order writes and
/// completions come in (the test network checks that a direct write lands
/// only where its receiver no longer needs the bytes, and that a write's
/// source changes before its completion only by the direct write of the
/// peer that already took it in). The ring all-reduce's all-gather and
/// the halving-doubling all-reduce in a power-of-two world use it: they
/// compute that many fewer copies, one per all-gather message, and move
/// the same bytes.
#[test]
fn symmetric_buffers_take_the_all_gather_without_a_copy() {
    let config = CommConfig {
        slots: 2,
        slot_bytes: 16,
        ..CommConfig::default()
    };
    let mut direct_runs = 0;
    for world in [1u32, 2, 3, 4, 5, 8, 16] {
        for (name, algorithm, make) in cases(world) {
            let reduces = make(0, 1).reduces();
            let ops: &[ReduceOp] = if reduces {
                &[ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max]
            } else {
                &[ReduceOp::Sum]
            };
            for dtype in [DataType::Float32, DataType::Int64, DataType::Float16] {
                for &op in ops {
                    for (count, in_place) in [(1u64, false), (19, true), (19, false), (97, true)] {
                        for seed in 0..3u64 {
                            let seed = seed * 7919 + u64::from(world) * 31 + count;
                            let plain = |r: Rank| {
                                spec(make(r, count), dtype, op, count, algorithm, in_place)
                            };
                            let symmetric = |r: Rank| plain(r).on_symmetric_buffers();
                            let what = format!(
                                "{name}/{algorithm} world {world} {dtype} {op} count {count} in_place {in_place} seed {seed}"
                            );
                            let s = check(world, config, &symmetric, Delivery::Random(seed), seed)
                                .unwrap_or_else(|e| panic!("{what}: {e}"));
                            assert_eq!(s.wrong, 0, "{what}");
                            let p = check(world, config, &plain, Delivery::Random(seed), seed)
                                .unwrap_or_else(|e| panic!("{what}: {e}"));
                            let sum = |r: &[metaroce_coll::CommStats], f: fn(&metaroce_coll::CommStats) -> u64| {
                                r.iter().map(f).sum::<u64>()
                            };
                            assert_eq!(
                                sum(&s.stats, |c| c.data_bytes),
                                sum(&p.stats, |c| c.data_bytes),
                                "{what}"
                            );
                            let direct = world > 1
                                && count > 0
                                && match (name, algorithm) {
                                    ("all_reduce", Algorithm::HalvingDoubling) => {
                                        world.is_power_of_two()
                                    }
                                    ("all_reduce", Algorithm::Ring) => true,
                                    _ => false,
                                };
                            let copies_saved =
                                sum(&p.stats, |c| c.computes) - sum(&s.stats, |c| c.computes);
                            if direct {
                                // One all-gather message per chunk and step.
                                assert!(copies_saved > 0, "{what}");
                                direct_runs += 1;
                            } else {
                                assert_eq!(copies_saved, 0, "{what}");
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(direct_runs > 100, "{direct_runs}");
}
