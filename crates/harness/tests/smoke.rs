use metaroce_harness::rdma::*;
use metaroce_harness::*;
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
    let src = reg_mr(&mut net, &a, len, AccessFlags::LOCAL_WRITE);
    let dst = reg_mr(
        &mut net,
        &b,
        len,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
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
    net.nodes[0].ctx.post_send(a.qp, &[wr]).unwrap();
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

/// The zero-copy send form (`poll_transmit_gather`: headers and trailer in
/// the buffer, payload left in its region) puts exactly the bytes on the
/// wire that the copying form does, for single-span payloads (gathered in
/// place) and multi-span ones (copied whole).
#[test]
fn gathered_transmits_equal_copied_ones() {
    // A full window from the start (no cold start): every packet of both
    // WRITEs is ready before any ACK.
    let mut cfg = EndpointConfig::default();
    cfg.cc_params.initial_window_mss = 0;
    let access = AccessFlags::REMOTE_WRITE;
    // Two identical networks, same seed, same posts: one drained by copy,
    // one by gather; their first transmits must match byte for byte.
    let mut nets: Vec<Network<RdmaNode>> = (0..2)
        .map(|_| Network::new(NetConfig::seeded(9), devices(2, &cfg, 9)))
        .collect();
    let mut streams: Vec<Vec<Vec<u8>>> = Vec::new();
    for (k, net) in nets.iter_mut().enumerate() {
        let (a, b) = connect_qps(net, 0, 1, access);
        let len = 3 * 4096 + 100;
        let src = reg_mr(net, &a, len, AccessFlags::LOCAL_WRITE);
        let dst = reg_mr(
            net,
            &b,
            2 * len,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        );
        for (i, byte) in net.nodes[0].ctx.mr_bytes_mut(&src).iter_mut().enumerate() {
            *byte = (i * 13 % 253) as u8;
        }
        let write = |id, sges| {
            SendWr::new(
                id,
                WrOp::Write {
                    remote_addr: dst.addr,
                    rkey: dst.rkey,
                },
                sges,
            )
        };
        let wrs = [
            write(1, vec![src.sge(0, len as u32)]),
            write(2, vec![src.sge(10, 5000), src.sge(7000, 3000)]),
        ];
        net.nodes[0].ctx.post_send(a.qp, &wrs).unwrap();
        let ctx = &mut net.nodes[0].ctx;
        let mut buf = vec![0u8; ctx.max_datagram_len()];
        let mut out = Vec::new();
        let mut split = 0;
        loop {
            let bytes = if k == 0 {
                let Some(t) = ctx.poll_transmit(0, &mut buf) else {
                    break;
                };
                buf[..t.len].to_vec()
            } else {
                let Some((t, layout)) = ctx.poll_transmit_gather(0, &mut buf) else {
                    break;
                };
                match layout {
                    Layout::Whole => buf[..t.len].to_vec(),
                    Layout::Split {
                        header_len,
                        trailer_len,
                        payload,
                    } => {
                        split += 1;
                        let mut v = buf[..header_len].to_vec();
                        v.extend_from_slice(ctx.payload(&payload));
                        v.extend_from_slice(&buf[header_len..header_len + trailer_len]);
                        assert_eq!(v.len(), t.len);
                        v
                    }
                }
            };
            out.push(bytes);
        }
        if k == 1 {
            // The single-span WRITE's 4 packets go in place, and the first
            // packet of the two-span one (inside its first span); its second
            // straddles the spans and is copied.
            assert_eq!(split, 5, "transmits gathered in place");
        }
        streams.push(out);
    }
    assert_eq!(streams[0].len(), 6, "4 + 2 data packets");
    assert_eq!(streams[0], streams[1]);
}

/// Destroying the last QP toward a peer closes the connection: the
/// endpoint's state toward it returns to zero, and new QPs to the same peer
/// start a fresh connection that works.
#[test]
fn closing_the_last_qp_closes_the_connection() {
    let cfg = EndpointConfig::default();
    let mut net = Network::new(NetConfig::seeded(3), devices(2, &cfg, 3));
    let access = AccessFlags::REMOTE_WRITE;
    for round in 0..2 {
        let (a, b) = connect_qps(&mut net, 0, 1, access);
        let (a2, b2) = connect_qps(&mut net, 0, 1, access);
        assert_eq!(net.nodes[0].ctx.endpoint().connection_count(), 1);
        let src = net.nodes[0]
            .ctx
            .reg_mr(a.pd, 8192, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let dst = net.nodes[1]
            .ctx
            .reg_mr(
                b.pd,
                8192,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        net.nodes[0].ctx.mr_bytes_mut(&src).fill(round + 1);
        let wr = SendWr::new(
            1,
            WrOp::Write {
                remote_addr: dst.addr,
                rkey: dst.rkey,
            },
            vec![src.sge(0, 8192)],
        );
        net.nodes[0].ctx.post_send(a.qp, &[wr]).unwrap();
        let mut done = Vec::new();
        net.run_until(net.now_ns() + 1_000_000_000, |n| {
            done.extend(poll_all(&mut n[0].ctx, a.cq));
            !done.is_empty()
        });
        assert_eq!(done[0].status, WcStatus::Success, "round {round}");
        assert!(
            net.nodes[1]
                .ctx
                .mr_bytes(&dst)
                .iter()
                .all(|&x| x == round + 1)
        );
        net.run_for(1_000_000);
        // One QP left on each side: the connection stays.
        net.nodes[0].ctx.destroy_qp(a.qp).unwrap();
        net.nodes[1].ctx.destroy_qp(b.qp).unwrap();
        assert_eq!(net.nodes[0].ctx.endpoint().connection_count(), 1);
        // The last ones: back to zero on both sides.
        net.nodes[0].ctx.destroy_qp(a2.qp).unwrap();
        net.nodes[1].ctx.destroy_qp(b2.qp).unwrap();
        assert_eq!(net.nodes[0].ctx.endpoint().connection_count(), 0);
        assert_eq!(net.nodes[1].ctx.endpoint().connection_count(), 0);
        assert_eq!(
            net.nodes[0]
                .ctx
                .endpoint()
                .outstanding_messages(net.nodes[1].addr()),
            None
        );
    }
}
