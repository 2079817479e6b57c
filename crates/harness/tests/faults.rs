//! The transport under faults: what issue "protocol core" asks to be shown.

use metaroce_harness::rdma::*;
use metaroce_harness::*;
use metaroce_verbs::*;
use std::cell::Cell;
use std::rc::Rc;

/// Data packets start with version 1, type 1.
fn is_data(p: &[u8]) -> bool {
    p.len() > 1 && p[1] == 1
}

struct Pair {
    net: Network<RdmaNode>,
    a: QpEnd,
    b: QpEnd,
}

fn pair(seed: u64, cfg: &EndpointConfig, net_cfg: NetConfig) -> Pair {
    let mut net = Network::new(net_cfg.with_seed(seed), devices(2, cfg, seed));
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (a, b) = connect_qps(&mut net, 0, 1, access);
    Pair { net, a, b }
}

fn fill(ctx: &mut Context, mr: &MemoryRegion, seed: u64) {
    let mut x = seed | 1;
    for b in ctx.mr_bytes_mut(mr) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

fn run_until_completions(
    p: &mut Pair,
    node: usize,
    cq: CompletionQueue,
    n: usize,
    limit_ns: u64,
) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let deadline = p.net.now_ns() + limit_ns;
    let out = p.net.run_until(deadline, |nodes| {
        got.extend(poll_all(&mut nodes[node].ctx, cq));
        got.len() >= n
    });
    assert!(
        matches!(out, RunOutcome::Done { .. }),
        "run ended {out:?} with {} of {n} completions",
        got.len()
    );
    got
}

fn lossy(loss: f64) -> FaultConfig {
    FaultConfig {
        loss,
        duplicate: 0.02,
        reorder: 0.01,
        ..FaultConfig::default()
    }
}

fn jittery() -> NetConfig {
    // Routes differ in delay over time, so sprayed packets arrive out of
    // order across paths (each route stays FIFO, as an ECMP route does).
    NetConfig::default().with_link(LinkConfig {
        jitter_ns: 3_000,
        jitter_period_ns: 20_000,
        ..LinkConfig::default()
    })
}

#[test]
fn write_64mib_with_loss_reordering_and_duplication() {
    let guard = SeedGuard::from_env_or(11);
    let seed = guard.seed();
    let mut p = pair(
        seed,
        &EndpointConfig::default(),
        jittery().with_faults(lossy(0.05)),
    );
    let len: u64 = 64 << 20;
    let src = mr(&mut p, 0, len, AccessFlags::LOCAL_WRITE);
    let dst = mr(
        &mut p,
        1,
        len,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    fill(&mut p.net.nodes[0].ctx, &src, seed);
    let lost = Rc::new(Cell::new(0u64));
    let l = lost.clone();
    p.net.set_tap(Box::new(move |e: &TapEvent<'_>| {
        if matches!(e.fate, Fate::Dropped(_)) && is_data(e.payload) {
            l.set(l.get() + 1);
        }
    }));
    let wr = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        },
        vec![src.sge(0, len as u32)],
    );
    p.net.nodes[0].ctx.post_send(p.a.qp, &[wr]).unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 1, 10_000_000_000);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].byte_len, len as u32);
    assert!(
        p.net.nodes[0].ctx.mr_bytes(&src) == p.net.nodes[1].ctx.mr_bytes(&dst),
        "bytes differ"
    );
    let stats = *p.net.nodes[0].ctx.stats();
    let lost = lost.get();
    let resent = stats.data_packets_retransmitted;
    eprintln!(
        "64 MiB write: {} us simulated, {} data packets, {lost} lost, {resent} resent ({:.3}x), {} dup packets at rx",
        p.net.now_ns() / 1000,
        stats.data_packets_sent,
        resent as f64 / lost as f64,
        p.net.nodes[1].ctx.stats().rx_duplicates
    );
    assert!(lost > 500, "the fault injector must have dropped packets");
    assert!(
        resent as f64 <= 1.3 * lost as f64,
        "resent {resent} vs lost {lost}: not selective"
    );
    assert_eq!(
        p.net.nodes[0]
            .ctx
            .endpoint()
            .outstanding_messages(p.net.nodes[1].addr()),
        Some(0)
    );
}

fn write_wr(
    wr_id: u64,
    src: &MemoryRegion,
    off: u64,
    len: u32,
    dst: &MemoryRegion,
    dst_off: u64,
) -> SendWr {
    SendWr::new(
        wr_id,
        WrOp::Write {
            remote_addr: dst.addr + dst_off,
            rkey: dst.rkey,
        },
        vec![src.sge(off, len)],
    )
}

#[test]
fn one_blackholed_path_is_abandoned_and_the_transfer_completes() {
    let guard = SeedGuard::from_env_or(12);
    let seed = guard.seed();
    let mut p = pair(seed, &EndpointConfig::default(), jittery());
    let len: u64 = 32 << 20;
    let src = mr(&mut p, 0, len, AccessFlags::LOCAL_WRITE);
    let dst = mr(
        &mut p,
        1,
        len,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    fill(&mut p.net.nodes[0].ctx, &src, seed);
    // Path slot 5's port maps to route (port % 16); blackhole that route 200 us in.
    let peer = p.net.nodes[1].addr();
    let port = p.net.nodes[0].ctx.endpoint().path_ports(peer).unwrap()[5];
    let route = port as usize % 16;
    let t_hole = 200_000;
    p.net.at(t_hole, Action::Blackhole { route, on: true });
    let late = Rc::new(Cell::new(0u64));
    let into_hole = Rc::new(Cell::new(0u64));
    let (l, h) = (late.clone(), into_hole.clone());
    let settle_ns = t_hole + 300_000;
    p.net.set_tap(Box::new(move |e: &TapEvent<'_>| {
        if matches!(e.fate, Fate::Sent)
            && is_data(e.payload)
            && e.src_node == 0
            && e.now_ns > settle_ns
        {
            if e.route == route {
                h.set(h.get() + 1);
            }
            // data on the old path's port after it settled
            if e.payload.len() > 8
                && u16::from_be_bytes([e.payload[4], e.payload[5]]) == 0
                && e.payload[3] == 5
            {
                l.set(l.get() + 1);
            }
        }
    }));
    p.net.nodes[0]
        .ctx
        .post_send(p.a.qp, &[write_wr(1, &src, 0, len as u32, &dst, 0)])
        .unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 1, 10_000_000_000);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert!(
        p.net.nodes[0].ctx.mr_bytes(&src) == p.net.nodes[1].ctx.mr_bytes(&dst),
        "bytes differ"
    );
    let stats = p.net.nodes[0].ctx.stats();
    eprintln!(
        "blackhole: done at {} us, {} data packets into the hole after settling, {} on the retired path, {} paths replaced, {} dropped in the hole",
        p.net.now_ns() / 1000,
        into_hole.get(),
        late.get(),
        stats.paths_replaced,
        p.net.stats().dropped_blackhole
    );
    assert!(
        stats.paths_replaced >= 1,
        "the blackholed path must be retired"
    );
    assert_eq!(
        late.get(),
        0,
        "the retired path (slot 5, generation 0) still carried data"
    );
    assert_ne!(
        p.net.nodes[0].ctx.endpoint().path_ports(peer).unwrap()[5] as usize % 16,
        route
    );
}

fn faulty(seed: u64) -> Pair {
    pair(
        seed,
        &EndpointConfig::default(),
        jittery().with_faults(lossy(0.05)),
    )
}

fn mr(p: &mut Pair, node: usize, len: u64, access: AccessFlags) -> MemoryRegion {
    let pd = if node == 0 { p.a.pd } else { p.b.pd };
    p.net.nodes[node].ctx.reg_mr(pd, len, access).unwrap()
}

const RW: AccessFlags = AccessFlags(1 | 2 | 4 | 8);

#[test]
fn read_under_faults_places_the_responders_bytes() {
    let guard = SeedGuard::from_env_or(13);
    let mut p = faulty(guard.seed());
    let len = 8 << 20;
    let remote = mr(&mut p, 1, len, RW);
    let local = mr(&mut p, 0, len, AccessFlags::LOCAL_WRITE);
    fill(&mut p.net.nodes[1].ctx, &remote, guard.seed());
    let wrs: Vec<SendWr> = (0..8u64)
        .map(|i| {
            let chunk = len / 8;
            SendWr::new(
                i,
                WrOp::Read {
                    remote_addr: remote.addr + i * chunk,
                    rkey: remote.rkey,
                },
                vec![local.sge(i * chunk, chunk as u32)],
            )
        })
        .collect();
    p.net.nodes[0].ctx.post_send(p.a.qp, &wrs).unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 8, 10_000_000_000);
    assert!(wc.iter().enumerate().all(|(i, w)| w.wr_id == i as u64
        && w.status == WcStatus::Success
        && w.opcode == WcOpcode::RdmaRead));
    assert!(p.net.nodes[0].ctx.mr_bytes(&local) == p.net.nodes[1].ctx.mr_bytes(&remote));
}

#[test]
fn send_recv_and_write_with_imm_under_faults_complete_in_order() {
    let guard = SeedGuard::from_env_or(14);
    let mut p = faulty(guard.seed());
    let n = 64u64;
    let size = 20_000u64;
    let src = mr(&mut p, 0, n * size, AccessFlags::LOCAL_WRITE);
    let dst = mr(&mut p, 1, n * size, RW);
    fill(&mut p.net.nodes[0].ctx, &src, guard.seed());
    let recvs: Vec<RecvWr> = (0..n)
        .map(|i| RecvWr {
            wr_id: 1000 + i,
            sg_list: vec![dst.sge(i * size, size as u32)],
        })
        .collect();
    p.net.nodes[1].ctx.post_recv(p.b.qp, &recvs).unwrap();
    let wrs: Vec<SendWr> = (0..n)
        .map(|i| {
            let sge = vec![src.sge(i * size, size as u32)];
            match i % 3 {
                0 => SendWr::new(i, WrOp::Send, sge),
                1 => SendWr::new(i, WrOp::SendImm { imm: i as u32 }, sge),
                _ => SendWr::new(
                    i,
                    WrOp::WriteImm {
                        remote_addr: dst.addr + i * size,
                        rkey: dst.rkey,
                        imm: i as u32,
                    },
                    sge,
                ),
            }
        })
        .collect();
    p.net.nodes[0].ctx.post_send(p.a.qp, &wrs).unwrap();
    let (cqa, cqb) = (p.a.cq, p.b.cq);
    let sent = run_until_completions(&mut p, 0, cqa, n as usize, 10_000_000_000);
    let received = run_until_completions(&mut p, 1, cqb, n as usize, 10_000_000_000);
    for (i, (s, r)) in sent.iter().zip(&received).enumerate() {
        assert_eq!((s.wr_id, s.status), (i as u64, WcStatus::Success));
        assert_eq!(
            (r.wr_id, r.status, r.byte_len),
            (1000 + i as u64, WcStatus::Success, size as u32)
        );
        let (opcode, imm) = match i % 3 {
            0 => (WcOpcode::Recv, None),
            1 => (WcOpcode::Recv, Some(i as u32)),
            _ => (WcOpcode::RecvRdmaWithImm, Some(i as u32)),
        };
        assert_eq!((r.opcode, r.imm_data), (opcode, imm), "receive {i}");
    }
    assert!(p.net.nodes[0].ctx.mr_bytes(&src) == p.net.nodes[1].ctx.mr_bytes(&dst));
}

#[test]
fn atomics_from_two_requesters_apply_exactly_once() {
    let guard = SeedGuard::from_env_or(15);
    let seed = guard.seed();
    let faults = FaultConfig {
        loss: 0.05,
        duplicate: 0.05,
        reorder: 0.01,
        ..FaultConfig::default()
    };
    let mut net = Network::new(
        jittery().with_faults(faults).with_seed(seed),
        devices(3, &EndpointConfig::default(), seed),
    );
    // Nodes 0 and 1 both hammer node 2's counter.
    let (a0, t0) = connect_qps(&mut net, 0, 2, RW);
    let (a1, _) = connect_qps_in(&mut net, (1, None), (2, Some(t0.pd)), RW);
    let target = net.nodes[2].ctx.reg_mr(t0.pd, 16, RW).unwrap();
    let per = 300u64;
    let mut results = Vec::new();
    for (node, end, tgt) in [(0usize, a0, target), (1, a1, target)] {
        let sink = net.nodes[node]
            .ctx
            .reg_mr(end.pd, per * 8, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let wrs: Vec<SendWr> = (0..per)
            .map(|i| {
                SendWr::new(
                    i,
                    WrOp::FetchAdd {
                        remote_addr: tgt.addr,
                        rkey: tgt.rkey,
                        add: 1,
                    },
                    vec![sink.sge(i * 8, 8)],
                )
            })
            .collect();
        net.nodes[node].ctx.post_send(end.qp, &wrs).unwrap();
        results.push((node, end, sink));
    }
    // One compare-and-swap per requester on the second word: exactly one wins.
    let mut cas = Vec::new();
    for (node, end, tgt) in [(0usize, a0, target), (1, a1, target)] {
        let sink = net.nodes[node]
            .ctx
            .reg_mr(end.pd, 8, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let wr = SendWr::new(
            per,
            WrOp::CmpSwap {
                remote_addr: tgt.addr + 8,
                rkey: tgt.rkey,
                compare: 0,
                swap: 7 + node as u64,
            },
            vec![sink.sge(0, 8)],
        );
        net.nodes[node].ctx.post_send(end.qp, &[wr]).unwrap();
        cas.push((node, sink));
    }
    let mut got = [0usize; 2];
    let out = net.run_until(10_000_000_000, |n| {
        for (k, (node, end, _)) in results.iter().enumerate() {
            let wcs = poll_all(&mut n[*node].ctx, end.cq);
            assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
            got[k] += wcs.len();
        }
        got.iter().all(|&g| g == per as usize + 1)
    });
    assert!(matches!(out, RunOutcome::Done { .. }), "{out:?} {got:?}");
    // One counter, two requesters: exactly 2 x per increments.
    let word = u64::from_le_bytes(net.nodes[2].ctx.mr_bytes(&target)[..8].try_into().unwrap());
    assert_eq!(word, 2 * per, "counter");
    // Every original value 0..2*per was returned exactly once, across both.
    let mut seen: Vec<u64> = results
        .iter()
        .flat_map(|(node, _, sink)| {
            net.nodes[*node]
                .ctx
                .mr_bytes(sink)
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>()
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..2 * per).collect::<Vec<_>>());
    // Exactly one compare-and-swap won, and the word holds its value.
    let origs: Vec<u64> = cas
        .iter()
        .map(|(node, sink)| {
            u64::from_le_bytes(net.nodes[*node].ctx.mr_bytes(sink).try_into().unwrap())
        })
        .collect();
    let now = u64::from_le_bytes(net.nodes[2].ctx.mr_bytes(&target)[8..].try_into().unwrap());
    let winners: Vec<usize> = (0..2).filter(|&k| origs[k] == 0).collect();
    assert_eq!(winners.len(), 1, "originals {origs:?}");
    assert_eq!(now, 7 + winners[0] as u64);
    assert_eq!(
        origs[1 - winners[0]],
        now,
        "the loser saw the winner's value"
    );
}

#[test]
fn peer_gone_ends_in_retry_exceeded_then_flushes() {
    let guard = SeedGuard::from_env_or(16);
    let cfg = EndpointConfig::default();
    let mut p = pair(guard.seed(), &cfg, NetConfig::default());
    let src = mr(&mut p, 0, 1 << 20, AccessFlags::LOCAL_WRITE);
    let dst = mr(&mut p, 1, 1 << 20, RW);
    // Warm up, then the peer vanishes for good.
    p.net.nodes[0]
        .ctx
        .post_send(p.a.qp, &[write_wr(1, &src, 0, 4096, &dst, 0)])
        .unwrap();
    let cq = p.a.cq;
    run_until_completions(&mut p, 0, cq, 1, 1_000_000_000);
    p.net.set_link_down(1, true);
    let t0 = p.net.now_ns();
    let wrs: Vec<SendWr> = (2..6)
        .map(|i| write_wr(i, &src, 0, 1 << 18, &dst, 0))
        .collect();
    p.net.nodes[0].ctx.post_send_at(t0, p.a.qp, &wrs).unwrap();
    let wc = run_until_completions(&mut p, 0, cq, 4, 10_000_000_000);
    let elapsed = p.net.now_ns() - t0;
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::RetryExcErr));
    assert!(
        wc[1..].iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{wc:?}"
    );
    assert_eq!(p.net.nodes[0].ctx.qp_state(p.a.qp), Some(QpState::Err));
    // The budget: retry_cnt + 1 backed-off connection timeouts of at most rto_max each.
    let budget: u64 = (0..=cfg.retry_cnt as u32)
        .map(|k| (cfg.rto_min_ns << k).min(cfg.rto_max_ns))
        .sum::<u64>()
        * 2;
    eprintln!(
        "peer gone: RetryExcErr after {} us (budget {} us)",
        elapsed / 1000,
        budget / 1000
    );
    assert!(elapsed <= budget, "took {elapsed} ns, budget {budget} ns");
    // Later work flushes at once and nothing is left behind.
    let now = p.net.now_ns();
    p.net.nodes[0]
        .ctx
        .post_send_at(now, p.a.qp, &[write_wr(9, &src, 0, 8, &dst, 0)])
        .unwrap();
    let wc = poll_all(&mut p.net.nodes[0].ctx, cq);
    assert_eq!((wc[0].wr_id, wc[0].status), (9, WcStatus::WrFlushErr));
    assert_eq!(
        p.net.nodes[0]
            .ctx
            .endpoint()
            .outstanding_messages(p.net.nodes[1].addr()),
        Some(0)
    );
}

/// Every remote access the responder must refuse: bad rkey, out of bounds,
/// missing permission, misaligned atomic. Each gives RemAccessErr (or
/// RemInvReqErr for misalignment) and leaves the target untouched.
#[test]
fn bad_remote_accesses_fail_and_touch_nothing() {
    let guard = SeedGuard::from_env_or(17);
    type Case = (
        &'static str,
        fn(&MemoryRegion, &MemoryRegion, &MemoryRegion) -> SendWr,
        WcStatus,
    );
    let cases: [Case; 8] = [
        (
            "write past the end",
            |s, _, t| write_wr(1, s, 0, 64, t, t.length - 32),
            WcStatus::RemAccessErr,
        ),
        (
            "write before the start",
            |s, _, t| {
                SendWr::new(
                    1,
                    WrOp::Write {
                        remote_addr: t.addr - 8,
                        rkey: t.rkey,
                    },
                    vec![s.sge(0, 16)],
                )
            },
            WcStatus::RemAccessErr,
        ),
        (
            "write with a guessed rkey",
            |s, _, t| {
                SendWr::new(
                    1,
                    WrOp::Write {
                        remote_addr: t.addr,
                        rkey: t.rkey ^ 0x5a5a,
                    },
                    vec![s.sge(0, 16)],
                )
            },
            WcStatus::RemAccessErr,
        ),
        (
            "write to a read-only region",
            |s, ro, _| write_wr(1, s, 0, 16, ro, 0),
            WcStatus::RemAccessErr,
        ),
        (
            "read past the end",
            |s, _, t| {
                SendWr::new(
                    1,
                    WrOp::Read {
                        remote_addr: t.addr + t.length - 8,
                        rkey: t.rkey,
                    },
                    vec![s.sge(0, 16)],
                )
            },
            WcStatus::RemAccessErr,
        ),
        (
            "atomic on a read-only region",
            |s, ro, _| {
                SendWr::new(
                    1,
                    WrOp::FetchAdd {
                        remote_addr: ro.addr,
                        rkey: ro.rkey,
                        add: 1,
                    },
                    vec![s.sge(0, 8)],
                )
            },
            WcStatus::RemAccessErr,
        ),
        (
            "atomic past the end",
            |s, _, t| {
                SendWr::new(
                    1,
                    WrOp::CmpSwap {
                        remote_addr: t.addr + t.length,
                        rkey: t.rkey,
                        compare: 0,
                        swap: 1,
                    },
                    vec![s.sge(0, 8)],
                )
            },
            WcStatus::RemAccessErr,
        ),
        (
            "misaligned atomic",
            |s, _, t| {
                SendWr::new(
                    1,
                    WrOp::FetchAdd {
                        remote_addr: t.addr + 4,
                        rkey: t.rkey,
                        add: 1,
                    },
                    vec![s.sge(0, 8)],
                )
            },
            WcStatus::RemInvReqErr,
        ),
    ];
    for (name, make, expect) in cases {
        let mut p = faulty(guard.seed());
        let src = mr(&mut p, 0, 4096, AccessFlags::LOCAL_WRITE);
        fill(&mut p.net.nodes[0].ctx, &src, 1);
        let target = mr(&mut p, 1, 4096, RW);
        let read_only = mr(&mut p, 1, 4096, AccessFlags::REMOTE_READ);
        fill(&mut p.net.nodes[1].ctx, &target, 2);
        fill(&mut p.net.nodes[1].ctx, &read_only, 3);
        let before = (
            p.net.nodes[1].ctx.mr_bytes(&target).to_vec(),
            p.net.nodes[1].ctx.mr_bytes(&read_only).to_vec(),
        );
        let wr = make(&src, &read_only, &target);
        let follow = write_wr(2, &src, 0, 8, &target, 0);
        p.net.nodes[0].ctx.post_send(p.a.qp, &[wr, follow]).unwrap();
        let cq = p.a.cq;
        let wc = run_until_completions(&mut p, 0, cq, 2, 1_000_000_000);
        assert_eq!((wc[0].wr_id, wc[0].status), (1, expect), "{name}");
        assert_eq!(
            (wc[1].wr_id, wc[1].status),
            (2, WcStatus::WrFlushErr),
            "{name}: later work flushes"
        );
        let after = (
            p.net.nodes[1].ctx.mr_bytes(&target).to_vec(),
            p.net.nodes[1].ctx.mr_bytes(&read_only).to_vec(),
        );
        // The failing request touched nothing. The follow-up WRITE (to the
        // target's first 8 bytes) completes flushed, but may have been
        // placed if it overtook the failing one on another path: MetaRoCE
        // places out of order across paths (docs/spec/transport.md, section
        // 6, a known difference from InfiniBand), so those bytes are not
        // compared.
        assert!(
            before.0[8..] == after.0[8..] && before.1 == after.1,
            "{name}: target memory changed"
        );
        assert_eq!(
            p.net.nodes[0].ctx.qp_state(p.a.qp),
            Some(QpState::Err),
            "{name}"
        );
    }
}

#[test]
fn bad_local_key_is_a_local_protection_error() {
    let guard = SeedGuard::from_env_or(18);
    let mut p = faulty(guard.seed());
    let src = mr(&mut p, 0, 4096, AccessFlags::LOCAL_WRITE);
    let dst = mr(&mut p, 1, 4096, RW);
    let mut bad = src.sge(0, 64);
    bad.lkey ^= 1;
    let wrs = [
        write_wr(1, &src, 0, 64, &dst, 0),
        SendWr::new(
            2,
            WrOp::Write {
                remote_addr: dst.addr,
                rkey: dst.rkey,
            },
            vec![bad],
        ),
        write_wr(3, &src, 0, 64, &dst, 0),
    ];
    p.net.nodes[0].ctx.post_send(p.a.qp, &wrs).unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 3, 1_000_000_000);
    let got: Vec<_> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
}

#[test]
fn send_waits_for_a_receive_and_a_short_receive_is_a_length_error() {
    let guard = SeedGuard::from_env_or(19);
    let mut p = faulty(guard.seed());
    let src = mr(&mut p, 0, 1 << 16, AccessFlags::LOCAL_WRITE);
    let dst = mr(&mut p, 1, 1 << 16, RW);
    fill(&mut p.net.nodes[0].ctx, &src, 4);
    // No receive posted yet: the SEND is refused (RNR) and retried.
    p.net.nodes[0]
        .ctx
        .post_send(
            p.a.qp,
            &[SendWr::new(1, WrOp::Send, vec![src.sge(0, 30_000)])],
        )
        .unwrap();
    p.net.run_for(300_000);
    assert!(poll_all(&mut p.net.nodes[0].ctx, p.a.cq).is_empty());
    assert!(p.net.nodes[1].ctx.stats().rnr_naks_sent > 0);
    p.net.nodes[1]
        .ctx
        .post_recv(
            p.b.qp,
            &[RecvWr {
                wr_id: 10,
                sg_list: vec![dst.sge(0, 30_000)],
            }],
        )
        .unwrap();
    let cqa = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cqa, 1, 1_000_000_000);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(
        p.net.nodes[0].ctx.mr_bytes(&src)[..30_000],
        p.net.nodes[1].ctx.mr_bytes(&dst)[..30_000]
    );
    // A receive that is too small: LocLenErr at the receiver, RemInvReqErr at the sender.
    p.net.nodes[1]
        .ctx
        .post_recv(
            p.b.qp,
            &[RecvWr {
                wr_id: 11,
                sg_list: vec![dst.sge(40_000, 100)],
            }],
        )
        .unwrap();
    let now = p.net.now_ns();
    p.net.nodes[0]
        .ctx
        .post_send_at(
            now,
            p.a.qp,
            &[SendWr::new(2, WrOp::Send, vec![src.sge(0, 200)])],
        )
        .unwrap();
    let wc = run_until_completions(&mut p, 0, cqa, 1, 1_000_000_000);
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::RemInvReqErr));
    let cqb = p.b.cq;
    let rc = run_until_completions(&mut p, 1, cqb, 2, 1_000_000_000);
    assert_eq!((rc[1].wr_id, rc[1].status), (11, WcStatus::LocLenErr));
    assert!(
        p.net.nodes[1].ctx.mr_bytes(&dst)[40_000..40_100]
            .iter()
            .all(|&b| b == 0),
        "nothing placed"
    );
}

#[test]
fn psns_wrap_around_mid_transfer() {
    let guard = SeedGuard::from_env_or(20);
    let cfg = EndpointConfig {
        psn_base: u32::MAX - 40,
        ..EndpointConfig::default()
    };
    let mut p = pair(guard.seed(), &cfg, jittery().with_faults(lossy(0.05)));
    let len = 16 << 20;
    let src = mr(&mut p, 0, len, AccessFlags::LOCAL_WRITE);
    let dst = mr(&mut p, 1, len, RW);
    fill(&mut p.net.nodes[0].ctx, &src, 5);
    p.net.nodes[0]
        .ctx
        .post_send(p.a.qp, &[write_wr(1, &src, 0, len as u32, &dst, 0)])
        .unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 1, 10_000_000_000);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert!(p.net.nodes[0].ctx.mr_bytes(&src) == p.net.nodes[1].ctx.mr_bytes(&dst));
}

/// Multi-SGE gather at the requester, multi-SGE scatter at the responder,
/// inline data, and READ into a scatter list.
#[test]
fn scatter_gather_lists_and_inline_data() {
    let guard = SeedGuard::from_env_or(21);
    let mut p = faulty(guard.seed());
    let src = mr(&mut p, 0, 1 << 16, AccessFlags::LOCAL_WRITE);
    let dst = mr(&mut p, 1, 1 << 16, RW);
    fill(&mut p.net.nodes[0].ctx, &src, 6);
    fill(&mut p.net.nodes[1].ctx, &dst, 7);
    // SEND gathered from three pieces into a receive scattered over two.
    let gather = vec![src.sge(100, 5000), src.sge(20_000, 3), src.sge(9000, 7000)];
    let scatter = vec![dst.sge(30_000, 6000), dst.sge(50_000, 7000)];
    p.net.nodes[1]
        .ctx
        .post_recv(
            p.b.qp,
            &[RecvWr {
                wr_id: 1,
                sg_list: scatter,
            }],
        )
        .unwrap();
    let inline = b"inline bytes travel at post time".to_vec();
    // READ from the target into two local pieces.
    let read = SendWr::new(
        3,
        WrOp::Read {
            remote_addr: dst.addr + 100,
            rkey: dst.rkey,
        },
        vec![src.sge(40_000, 10), src.sge(41_000, 5000)],
    );
    let wrs = [
        SendWr::new(1, WrOp::Send, gather.clone()),
        SendWr::inline(
            2,
            WrOp::Write {
                remote_addr: dst.addr + 60_000,
                rkey: dst.rkey,
            },
            inline.clone(),
        ),
        read,
    ];
    let expected_read = p.net.nodes[1].ctx.mr_bytes(&dst)[100..100 + 5010].to_vec();
    p.net.nodes[0].ctx.post_send(p.a.qp, &wrs).unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 3, 1_000_000_000);
    assert!(wc.iter().all(|w| w.status == WcStatus::Success), "{wc:?}");
    let s = p.net.nodes[0].ctx.mr_bytes(&src).to_vec();
    let d = p.net.nodes[1].ctx.mr_bytes(&dst).to_vec();
    let sent: Vec<u8> = [&s[100..5100], &s[20_000..20_003], &s[9000..16_000]].concat();
    let placed: Vec<u8> = [&d[30_000..36_000], &d[50_000..50_000 + sent.len() - 6000]].concat();
    assert_eq!(sent, placed);
    assert_eq!(&d[60_000..60_000 + inline.len()], &inline[..]);
    assert_eq!(
        [&s[40_000..40_010], &s[41_000..46_000]].concat(),
        expected_read
    );
}

/// Four senders into one receiver: the receiver's rate hint and ECN keep the
/// ToR queue bounded and every transfer completes intact.
#[test]
fn incast_settles_without_drops() {
    let guard = SeedGuard::from_env_or(22);
    let seed = guard.seed();
    let senders = 4;
    let mut net = Network::new(
        NetConfig::seeded(seed),
        devices(senders + 1, &EndpointConfig::default(), seed),
    );
    let len = 8u64 << 20;
    let mut ends = Vec::new();
    for s in 0..senders {
        let (a, b) = connect_qps(&mut net, s, senders, RW);
        let src = net.nodes[s]
            .ctx
            .reg_mr(a.pd, len, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let dst = net.nodes[senders].ctx.reg_mr(b.pd, len, RW).unwrap();
        fill(&mut net.nodes[s].ctx, &src, s as u64 + 1);
        net.nodes[s]
            .ctx
            .post_send(a.qp, &[write_wr(1, &src, 0, len as u32, &dst, 0)])
            .unwrap();
        ends.push((a, src, dst));
    }
    let mut done = vec![false; senders];
    let out = net.run_until(1_000_000_000, |n| {
        for (s, (a, _, _)) in ends.iter().enumerate() {
            if let Some(w) = poll_all(&mut n[s].ctx, a.cq).first() {
                assert_eq!(w.status, WcStatus::Success);
                done[s] = true;
            }
        }
        done.iter().all(|&d| d)
    });
    assert!(matches!(out, RunOutcome::Done { .. }), "{out:?}");
    for (s, (_, src, dst)) in ends.iter().enumerate() {
        assert!(net.nodes[s].ctx.mr_bytes(src) == net.nodes[senders].ctx.mr_bytes(dst));
    }
    let st = net.stats();
    let ideal_ns = (senders as u64 * len * 8) as f64 / 100.0; // at 100 Gbit/s
    eprintln!(
        "incast {senders}:1 of {} MiB each: {} us ({:.0}% of line rate), {} CE marks, {} ToR drops",
        len >> 20,
        net.now_ns() / 1000,
        100.0 * ideal_ns / net.now_ns() as f64,
        st.ce_marked,
        st.dropped_ingress_tail
    );
    assert_eq!(st.dropped_ingress_tail, 0, "the ToR buffer overflowed");
}

/// The largest message size the issue asks for: 1 GiB in one WRITE, with loss.
/// `cargo test --release -p metaroce-harness --test faults -- --ignored one_gib`
#[test]
#[ignore = "long: 1 GiB of memory on each side"]
fn one_gib_write() {
    let guard = SeedGuard::from_env_or(23);
    let mut p = pair(
        guard.seed(),
        &EndpointConfig::default(),
        jittery().with_faults(lossy(0.01)),
    );
    let len: u64 = 1 << 30;
    let src = mr(&mut p, 0, len, AccessFlags::LOCAL_WRITE);
    let dst = mr(&mut p, 1, len, RW);
    fill(&mut p.net.nodes[0].ctx, &src, 8);
    p.net.nodes[0]
        .ctx
        .post_send(p.a.qp, &[write_wr(1, &src, 0, len as u32, &dst, 0)])
        .unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 1, 100_000_000_000);
    assert_eq!(
        (wc[0].status, wc[0].byte_len),
        (WcStatus::Success, len as u32)
    );
    assert!(p.net.nodes[0].ctx.mr_bytes(&src) == p.net.nodes[1].ctx.mr_bytes(&dst));
    eprintln!("1 GiB write: {} us simulated", p.net.now_ns() / 1000);
}

#[test]
fn reordering_within_a_route_is_learnt_and_not_resent() {
    // Switches that route each packet on its own (adaptive routing) break
    // the in-order route a SACK gap verdict relies on. The first reordered
    // packet is resent for nothing; its late arrival proves the gap was
    // reordering, and from then on gaps wait for the reordering window.
    let guard = SeedGuard::from_env_or(5);
    let seed = guard.seed();
    let faults = FaultConfig {
        reorder: 0.1,
        reorder_delay_ns: 8_000,
        ..FaultConfig::default()
    };
    // A 20 us round trip: the reordering stays within one RTT, as the
    // queues of a loaded fabric's other routes would make it.
    let net = NetConfig::default()
        .with_link(LinkConfig {
            delay_ns: 10_000,
            ..LinkConfig::default()
        })
        .with_faults(faults);
    let mut p = pair(seed, &EndpointConfig::default(), net);
    let len: u64 = 16 << 20;
    let src = mr(&mut p, 0, len, AccessFlags::LOCAL_WRITE);
    let dst = mr(
        &mut p,
        1,
        len,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    fill(&mut p.net.nodes[0].ctx, &src, seed);
    let wr = write_wr(1, &src, 0, len as u32, &dst, 0);
    p.net.nodes[0].ctx.post_send(p.a.qp, &[wr]).unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 1, 10_000_000_000);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert!(
        p.net.nodes[0].ctx.mr_bytes(&src) == p.net.nodes[1].ctx.mr_bytes(&dst),
        "bytes differ"
    );
    let stats = *p.net.nodes[0].ctx.stats();
    eprintln!(
        "16 MiB write, 10 % of packets reordered by up to 8 us: {} sent, {} resent, {} gap losses proved spurious",
        stats.data_packets_sent, stats.data_packets_retransmitted, stats.spurious_gap_losses
    );
    assert!(
        stats.spurious_gap_losses > 0,
        "the reordering must have been noticed"
    );
    assert!(
        stats.data_packets_retransmitted * 100 <= stats.data_packets_sent,
        "{} of {} packets resent: reordering taken for loss",
        stats.data_packets_retransmitted,
        stats.data_packets_sent
    );
}

/// One link of two dies under a bulk WRITE with runs of 64 KiB per path,
/// at 1 % random loss, on a host-like configuration (RTO floor 4 ms, the
/// UDP datapath's probe floor, 64 paths over 128 ports): the transfer must
/// not stall. Each run returns (completion µs, longest gap between two
/// data packets delivered after the failure, µs).
fn link_of_two_dies_under_runs(seed: u64) -> (u64, u64) {
    let cfg = EndpointConfig {
        mtu_payload_bytes: 1428,
        paths_per_connection: 64,
        path_port_span: 128,
        base_rtt_ns: 50_000,
        rto_min_ns: 4_000_000,
        rto_max_ns: 200_000_000,
        probe_timeout_min_ns: 250_000,
        path_burst_bytes: 65_536,
        ..EndpointConfig::default()
    };
    // Two routes by 5-tuple hash, as the kernel's L4 ECMP over two links;
    // the sender's 25 Gb/s port is the bottleneck, its queue deep (no ECN
    // there): losses come in runs when it overflows.
    let net_cfg = NetConfig {
        routes_per_pair: 2,
        route_select: RouteSelect::Hash,
        link: LinkConfig {
            rate_bps: 25_000_000_000,
            delay_ns: 15_000,
            jitter_ns: 5_000,
            jitter_period_ns: 20_000,
            ..LinkConfig::default()
        },
        faults: FaultConfig {
            loss: 0.01,
            ..FaultConfig::default()
        },
        max_events: 500_000_000,
        ..NetConfig::default()
    };
    let mut net = Network::new(net_cfg.with_seed(seed), devices(2, &cfg, seed));
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE;
    let (a, b) = connect_qps(&mut net, 0, 1, access);
    let len: u64 = 256 << 20;
    let chunk: u64 = 1 << 20;
    let src = net.nodes[0]
        .ctx
        .reg_mr(a.pd, len, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let dst = net.nodes[1].ctx.reg_mr(b.pd, len, access).unwrap();
    let t_hole = 20_000_000;
    net.at(t_hole, Action::Blackhole { route: 0, on: true });
    // (last delivery, longest gap after the failure)
    let gaps = Rc::new(Cell::new((0u64, 0u64)));
    let g = gaps.clone();
    net.set_tap(Box::new(move |e: &TapEvent<'_>| {
        if matches!(e.fate, Fate::Delivered) && is_data(e.payload) && e.src_node == 0 {
            let (last, longest) = g.get();
            let longest = if e.now_ns > t_hole {
                longest.max(e.now_ns - last.max(t_hole))
            } else {
                longest
            };
            g.set((e.now_ns, longest));
        }
    }));
    let n = len / chunk;
    for i in 0..n {
        let mut wr = write_wr(i, &src, i * chunk, chunk as u32, &dst, i * chunk);
        wr.signaled = i + 1 == n;
        net.nodes[0].ctx.post_send(a.qp, &[wr]).unwrap();
    }
    let mut wcs = Vec::new();
    let out = net.run_until(3_000_000_000, |nodes| {
        wcs.extend(poll_all(&mut nodes[0].ctx, a.cq));
        !wcs.is_empty()
    });
    assert!(
        matches!(out, RunOutcome::Done { .. }),
        "seed {seed}: {out:?}"
    );
    assert_eq!(wcs[0].status, WcStatus::Success, "seed {seed}");
    (net.now_ns() / 1000, gaps.get().1 / 1000)
}

/// A link of two dies under runs of 64 KiB per path: the transfer goes on
/// at once. Until stop 58 this stalled on 5 of seeds 1-64 (20, 43, 54, 61
/// and 64: 119.1-226.2 ms against about 92, delivery gaps of 2.8-16.0 ms).
/// Every moved ACK route of the receiver piled onto a port that looked
/// heard but sat on the dead link: the sender's floor had passed the
/// port's mark on what it gave up on, or on an ACK sent before the pick.
/// The port now counts as heard only through a floor the sender heard
/// reported (the data header's FLOOR_ACKED bit) past the highest PSN the
/// receiver had at the pick (transport spec, "Heard ACK ports"): 91.2-94.9
/// ms on all of seeds 1-64 (`METAROCE_SEED=N` for one seed; by default the
/// two slowest stalls of before, 20 and 54).
#[test]
fn a_link_of_two_dying_under_runs_of_packets_does_not_stall_the_transfer() {
    // 256 MiB at 25 Gb/s: 85.9 ms on the wire, about 92 ms healthy.
    let seeds: Vec<u64> = match std::env::var(SEED_ENV) {
        Ok(_) => vec![seed_from_env_or(20)],
        Err(_) => vec![20, 54],
    };
    for seed in seeds {
        let guard = SeedGuard::new(seed);
        let (done_us, gap_us) = link_of_two_dies_under_runs(guard.seed());
        eprintln!(
            "link of two dies, runs of 64 KiB, seed {seed}: done at {done_us} us, longest delivery gap after the failure {gap_us} us"
        );
        assert!(done_us < 100_000, "seed {seed}: done at {done_us} us");
        assert!(gap_us < 5_000, "seed {seed}: a gap of {gap_us} us");
    }
}
