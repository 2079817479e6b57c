//! State per idle peer and per idle QP, measured: the core keeps per-peer
//! reliability state (paths, windows) shared by every QP toward that peer.

use metaroce_harness::rdma::*;
use metaroce_harness::*;
use metaroce_verbs::*;

#[test]
fn idle_connection_and_qp_memory() {
    let cfg = EndpointConfig::default();
    let mut net = Network::new(NetConfig::seeded(1), devices(2, &cfg, 1));
    let (a, _) = connect_qps(&mut net, 0, 1, AccessFlags(0xf));
    let peer = net.nodes[1].addr();
    let conn_bytes = net.nodes[0].ctx.connection_memory_bytes(peer).unwrap();
    let qp_bytes = net.nodes[0].ctx.qp_memory_bytes(a.qp).unwrap();
    // A second QP toward the same peer adds QP state only, no connection state.
    let (a2, _) = connect_qps(&mut net, 0, 1, AccessFlags(0xf));
    let conn_after = net.nodes[0].ctx.connection_memory_bytes(peer).unwrap();
    eprintln!(
        "idle connection ({} paths): {conn_bytes} B; idle QP: {qp_bytes} B; second QP: {} B; connection after: {conn_after} B",
        cfg.paths_per_connection,
        net.nodes[0].ctx.qp_memory_bytes(a2.qp).unwrap()
    );
    // O(1) state per peer at thousands of peers: at most 1 KiB while idle
    // (a connection that has sent nothing holds no controller state).
    assert!(
        conn_bytes <= 1 << 10,
        "an idle connection holds at most 1 KiB: {conn_bytes}"
    );
    assert!(
        qp_bytes < 1 << 10,
        "an idle QP should stay small: {qp_bytes}"
    );
    assert!(
        conn_after - conn_bytes < 64,
        "QPs must not grow per-peer state"
    );

    // After traffic, the queues' capacity is what remains; it must not keep the
    // transfer's size.
    let src = net.nodes[0]
        .ctx
        .reg_mr(a.pd, 1 << 20, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let b_pd = net.nodes[1].ctx.alloc_pd();
    let _ = b_pd;
    let wr = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: 0,
            rkey: 0,
        },
        vec![src.sge(0, 1 << 20)],
    );
    net.nodes[0].ctx.post_send(a.qp, &[wr]).unwrap();
    net.run_for(10_000_000);
    let wc = poll_all(&mut net.nodes[0].ctx, a.cq);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr);
    assert_eq!(
        net.nodes[0].ctx.endpoint().outstanding_messages(peer),
        Some(0)
    );
}
