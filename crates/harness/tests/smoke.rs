use metaroce_harness::rdma::*;
use metaroce_harness::*;
use metaroce_proto::EndpointConfig;
use metaroce_verbs::*;

#[test]
fn one_mib_write_no_faults() {
    let guard = SeedGuard::from_env_or(1);
    let cfg = EndpointConfig::default();
    let mut net = Network::new(
        NetConfig::seeded(guard.seed()),
        devices(2, &cfg, guard.seed()),
    );
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (a, b) = connect_qps(&mut net, 0, 1, access);
    let len = 1 << 20;
    let src = net.nodes[0]
        .ctx
        .reg_mr(a.pd, len, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let dst = net.nodes[1]
        .ctx
        .reg_mr(
            b.pd,
            len,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    for (i, b) in net.nodes[0].ctx.mr_bytes_mut(&src).iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    let wr = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        },
        vec![src.sge(0, len as u32)],
    );
    net.nodes[0].ctx.post_send(0, a.qp, &[wr]).unwrap();
    let mut done = Vec::new();
    let out = net.run_until(1_000_000_000, |n| {
        done.extend(poll_all(&mut n[0].ctx, a.cq));
        !done.is_empty()
    });
    eprintln!(
        "{out:?} {:?} {:?}",
        net.nodes[0].ctx.stats(),
        net.stats().delivered
    );
    assert!(matches!(out, RunOutcome::Done { .. }));
    assert_eq!(done[0].status, WcStatus::Success);
    assert_eq!(
        net.nodes[0].ctx.mr_bytes(&src),
        net.nodes[1].ctx.mr_bytes(&dst)
    );
}
