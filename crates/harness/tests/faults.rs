//! The transport under faults: what issue "protocol core" asks to be shown.

use metaroce_harness::rdma::*;
use metaroce_harness::*;
use metaroce_proto::EndpointConfig;
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

fn run_until_completions(p: &mut Pair, node: usize, cq: CompletionQueue, n: usize, limit_ns: u64) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let deadline = p.net.now_ns() + limit_ns;
    let out = p.net.run_until(deadline, |nodes| {
        got.extend(poll_all(&mut nodes[node].ctx, cq));
        got.len() >= n
    });
    assert!(matches!(out, RunOutcome::Done { .. }), "run ended {out:?} with {} of {n} completions", got.len());
    got
}

fn lossy(loss: f64) -> FaultConfig {
    FaultConfig { loss, duplicate: 0.02, reorder: 0.01, ..FaultConfig::default() }
}

fn jittery() -> NetConfig {
    // Routes differ in delay over time, so sprayed packets arrive out of
    // order across paths (each route stays FIFO, as an ECMP route does).
    NetConfig::default().with_link(LinkConfig { jitter_ns: 3_000, jitter_period_ns: 20_000, ..LinkConfig::default() })
}

#[test]
fn write_64mib_with_loss_reordering_and_duplication() {
    let guard = SeedGuard::from_env_or(11);
    let seed = guard.seed();
    let mut p = pair(seed, &EndpointConfig::default(), jittery().with_faults(lossy(0.05)));
    let len: u64 = 64 << 20;
    let src = p.net.nodes[0].ctx.reg_mr(p.a.pd, len, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p.net.nodes[1].ctx.reg_mr(p.b.pd, len, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
    fill(&mut p.net.nodes[0].ctx, &src, seed);
    let lost = Rc::new(Cell::new(0u64));
    let l = lost.clone();
    p.net.set_tap(Box::new(move |e: &TapEvent<'_>| {
        if matches!(e.fate, Fate::Dropped(_)) && is_data(e.payload) {
            l.set(l.get() + 1);
        }
    }));
    let wr = SendWr::new(1, WrOp::Write { remote_addr: dst.addr, rkey: dst.rkey }, vec![src.sge(0, len as u32)]);
    p.net.nodes[0].ctx.post_send(0, p.a.qp, &[wr]).unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 1, 10_000_000_000);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].byte_len, len as u32);
    assert!(p.net.nodes[0].ctx.mr_bytes(&src) == p.net.nodes[1].ctx.mr_bytes(&dst), "bytes differ");
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
    eprintln!("{stats:?}\n{:?}", p.net.stats());
    assert!(lost > 500, "the fault injector must have dropped packets");
    assert!(resent as f64 <= 1.3 * lost as f64, "resent {resent} vs lost {lost}: not selective");
    assert_eq!(p.net.nodes[0].ctx.endpoint().outstanding_messages(p.net.nodes[1].addr()), Some(0));
}

fn write_wr(wr_id: u64, src: &MemoryRegion, off: u64, len: u32, dst: &MemoryRegion, dst_off: u64) -> SendWr {
    SendWr::new(wr_id, WrOp::Write { remote_addr: dst.addr + dst_off, rkey: dst.rkey }, vec![src.sge(off, len)])
}

#[test]
fn one_blackholed_path_is_abandoned_and_the_transfer_completes() {
    let guard = SeedGuard::from_env_or(12);
    let seed = guard.seed();
    let mut p = pair(seed, &EndpointConfig::default(), jittery());
    let len: u64 = 32 << 20;
    let src = p.net.nodes[0].ctx.reg_mr(p.a.pd, len, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p.net.nodes[1].ctx.reg_mr(p.b.pd, len, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
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
        if matches!(e.fate, Fate::Sent) && is_data(e.payload) && e.src_node == 0 && e.now_ns > settle_ns {
            if e.route == route {
                h.set(h.get() + 1);
            }
            // data on the old path's port after it settled
            if e.payload.len() > 8 && u16::from_be_bytes([e.payload[4], e.payload[5]]) == 0 && e.payload[3] == 5 {
                l.set(l.get() + 1);
            }
        }
    }));
    p.net.nodes[0].ctx.post_send(0, p.a.qp, &[write_wr(1, &src, 0, len as u32, &dst, 0)]).unwrap();
    let cq = p.a.cq;
    let wc = run_until_completions(&mut p, 0, cq, 1, 10_000_000_000);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert!(p.net.nodes[0].ctx.mr_bytes(&src) == p.net.nodes[1].ctx.mr_bytes(&dst), "bytes differ");
    let stats = p.net.nodes[0].ctx.stats();
    eprintln!(
        "blackhole: done at {} us, {} data packets into the hole after settling, {} on the retired path, {} paths replaced, {} dropped in the hole",
        p.net.now_ns() / 1000,
        into_hole.get(),
        late.get(),
        stats.paths_replaced,
        p.net.stats().dropped_blackhole
    );
    eprintln!("{:?}", p.net.nodes[0].ctx.endpoint().path_stats(peer).unwrap().iter().map(|s| (s.rtos, s.replacements, s.packets_lost)).collect::<Vec<_>>());
    assert!(stats.paths_replaced >= 1, "the blackholed path must be retired");
    assert_eq!(late.get(), 0, "the retired path (slot 5, generation 0) still carried data");
    assert_ne!(p.net.nodes[0].ctx.endpoint().path_ports(peer).unwrap()[5] as usize % 16, route);
}
