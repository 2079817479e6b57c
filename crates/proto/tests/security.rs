//! Packet authentication and state limits, driven directly on two endpoints
//! by the core's test driver (`metaroce_proto::testing::Pair`: no network
//! model, datagrams are handed across after every step).

use metaroce_proto::testing::{Pair, Side};
use metaroce_proto::{
    AccessFlags, AuthConfig, ConfigError, Endpoint, EndpointConfig, Layout, MemoryError, MrInfo,
    PostError, QpCaps, QpError, QpHandle, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkQueue, WrOp,
};
use metaroce_wire::{self as wire, Flags};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

const A_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const PORT: u16 = 4791;
const SECRET: [u8; 32] = [0x42; 32];
const ALL_REMOTE: AccessFlags = AccessFlags(0xf);

fn config(seed: u64, auth: Option<AuthConfig>) -> EndpointConfig {
    EndpointConfig {
        device_port: PORT,
        paths_per_connection: 4,
        mtu_payload_bytes: 1024,
        seed,
        auth,
        ..EndpointConfig::default()
    }
}

fn auth(local_ip: IpAddr, secret: [u8; 32], encrypt: bool) -> Option<AuthConfig> {
    Some(AuthConfig {
        job_secret: secret,
        encrypt,
        local_ip,
    })
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
    }
}

/// An endpoint's QP and region.
#[derive(Clone, Copy)]
struct End {
    qp: QpHandle,
    mr: MrInfo,
}

/// One region and one QP, accepting every remote operation.
fn end(ep: &mut Endpoint) -> End {
    let pd = ep.alloc_pd();
    let mr = ep
        .register_memory(pd, 64 << 10, AccessFlags::LOCAL_WRITE | ALL_REMOTE)
        .unwrap();
    let qp = ep.create_qp(pd, caps(), ALL_REMOTE).unwrap();
    End { qp, mr }
}

/// Two endpoints with one connected QP each, the session ids handed over
/// first (the connection manager's job), every datagram recorded.
struct Lab {
    net: Pair,
    a: End,
    b: End,
}

fn pair(a_cfg: EndpointConfig, b_cfg: EndpointConfig) -> Lab {
    let mut net = Pair::new(A_IP, a_cfg, B_IP, b_cfg).unwrap();
    let a = end(&mut net.a);
    let b = end(&mut net.b);
    net.exchange_sessions().unwrap();
    net.connect(a.qp, b.qp).unwrap();
    net.record(true);
    net.set_now(1_000);
    Lab { net, a, b }
}

impl Lab {
    /// Move datagrams both ways and fire timers, `rounds` times (5 us each).
    fn run(&mut self, rounds: usize) {
        self.net.run(rounds, 5_000);
    }
}

fn fill(ep: &mut Endpoint, mr: &MrInfo, seed: u8) {
    for (i, b) in ep.memory_mut(mr.handle).unwrap().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(29) ^ seed;
    }
}

fn sge(mr: &MrInfo, offset: u64, length: u32) -> Sge {
    Sge {
        addr: mr.addr + offset,
        length,
        lkey: mr.lkey,
    }
}

fn completions(ep: &mut Endpoint) -> Vec<(WorkQueue, WcOpcode, WcStatus)> {
    std::iter::from_fn(|| ep.poll_completion())
        .map(|c| (c.queue, c.wc.opcode, c.wc.status))
        .collect()
}

/// WRITE, READ, SEND and an atomic between `a` and `b`; checks the bytes.
fn exchange_every_kind(p: &mut Lab) {
    fill(&mut p.net.a, &p.a.mr, 0x11);
    fill(&mut p.net.b, &p.b.mr, 0x77);
    let (a_mr, b_mr) = (p.a.mr, p.b.mr);
    p.net
        .b
        .post_recv(
            p.b.qp,
            RecvWr {
                wr_id: 9,
                sg_list: vec![sge(&b_mr, 40_000, 3000)],
            },
        )
        .unwrap();
    let post = |p: &mut Lab, id, op, sg| {
        p.net
            .a
            .post_send(p.a.qp, SendWr::new(id, op, vec![sg]))
            .unwrap();
    };
    post(
        p,
        1,
        WrOp::Write {
            remote_addr: b_mr.addr,
            rkey: b_mr.rkey,
        },
        sge(&a_mr, 0, 10_000),
    );
    post(
        p,
        2,
        WrOp::Read {
            remote_addr: b_mr.addr + 20_000,
            rkey: b_mr.rkey,
        },
        sge(&a_mr, 20_000, 5000),
    );
    post(p, 3, WrOp::Send, sge(&a_mr, 30_000, 3000));
    post(
        p,
        4,
        WrOp::FetchAdd {
            remote_addr: b_mr.addr + 60_000,
            rkey: b_mr.rkey,
            add: 5,
        },
        sge(&a_mr, 60_000, 8),
    );
    let b_word = u64::from_le_bytes(
        p.net.b.memory(b_mr.handle).unwrap()[60_000..60_008]
            .try_into()
            .unwrap(),
    );
    let b_read_src = p.net.b.memory(b_mr.handle).unwrap()[20_000..25_000].to_vec();
    p.run(200);
    let a_wcs = completions(&mut p.net.a);
    assert_eq!(a_wcs.len(), 4, "{a_wcs:?}");
    assert!(a_wcs.iter().all(|w| w.2 == WcStatus::Success), "{a_wcs:?}");
    let b_wcs = completions(&mut p.net.b);
    assert_eq!(
        b_wcs,
        vec![(WorkQueue::Recv, WcOpcode::Recv, WcStatus::Success)]
    );
    let a_mem = p.net.a.memory(a_mr.handle).unwrap().to_vec();
    let b_mem = p.net.b.memory(b_mr.handle).unwrap().to_vec();
    assert_eq!(b_mem[..10_000], a_mem[..10_000], "WRITE");
    assert_eq!(a_mem[20_000..25_000], b_read_src[..], "READ");
    assert_eq!(b_mem[40_000..43_000], a_mem[30_000..33_000], "SEND");
    assert_eq!(
        a_mem[60_000..60_008],
        b_word.to_le_bytes(),
        "FETCH_ADD result"
    );
    assert_eq!(
        b_mem[60_000..60_008],
        (b_word + 5).to_le_bytes(),
        "FETCH_ADD"
    );
}

// ------------------------------------------------------------ authentication

#[test]
fn authenticated_pair_runs_every_operation() {
    for encrypt in [false, true] {
        let mut p = pair(
            config(1, auth(A_IP, SECRET, encrypt)),
            config(2, auth(B_IP, SECRET, encrypt)),
        );
        exchange_every_kind(&mut p);
        for d in p.net.sent(Side::A) {
            assert!(
                wire::BaseHeader::new_checked(&d[..])
                    .unwrap()
                    .flags()
                    .contains(Flags::AUTHENTICATED)
            );
            assert_eq!(wire::parse(d), Err(wire::Error::NeedsKey));
            assert!(wire::parse_authenticated(d).is_ok());
        }
        // The WRITE's payload pattern is on the wire only in the clear.
        let plain = p.net.a.memory(p.a.mr.handle).unwrap()[1024..1088].to_vec();
        let seen = p
            .net
            .sent(Side::A)
            .iter()
            .any(|d| d.windows(64).any(|w| w == plain));
        assert_eq!(seen, !encrypt, "encrypt={encrypt}");
        let s = p.net.b.stats();
        assert_eq!(s.rx_auth_failed + s.rx_replayed + s.rx_unauthenticated, 0);
    }
}

#[test]
fn plain_pair_is_unchanged_on_the_wire() {
    let mut p = pair(config(1, None), config(2, None));
    exchange_every_kind(&mut p);
    for d in p.net.sent(Side::A) {
        assert!(wire::parse(d).is_ok(), "plain packets carry an ICRC");
        assert_eq!(d[2] & Flags::AUTHENTICATED.bits(), 0);
    }
}

#[test]
fn wrong_secret_is_refused_and_the_work_fails() {
    let mut p = pair(
        config(1, auth(A_IP, SECRET, false)),
        config(2, auth(B_IP, [0x43; 32], false)),
    );
    let (a_mr, b_mr) = (p.a.mr, p.b.mr);
    let wr = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: b_mr.addr,
            rkey: b_mr.rkey,
        },
        vec![sge(&a_mr, 0, 4096)],
    );
    p.net.a.post_send(p.a.qp, wr).unwrap();
    // Long enough for the whole retry budget (7 timeouts, backing off).
    for _ in 0..400 {
        p.run(100);
        p.net.advance(1_000_000);
    }
    assert_eq!(
        completions(&mut p.net.a),
        vec![(WorkQueue::Send, WcOpcode::RdmaWrite, WcStatus::RetryExcErr)]
    );
    assert!(p.net.b.stats().rx_auth_failed > 0);
    assert!(p.net.b.memory(b_mr.handle).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn mismatched_modes_fail_closed() {
    // Authenticating sender, plain receiver: the receiver cannot check the
    // tag and drops the packets as unparsable.
    let mut p = pair(config(1, auth(A_IP, SECRET, false)), config(2, None));
    post_inline_write(&mut p, 1);
    p.run(20);
    assert!(p.net.b.stats().rx_malformed > 0);
    assert_eq!(p.net.b.memory(p.b.mr.handle).unwrap()[0], 0);
    // Plain sender, authenticating receiver: dropped as unauthenticated.
    let mut p = pair(config(1, None), config(2, auth(B_IP, SECRET, false)));
    post_inline_write(&mut p, 1);
    p.run(20);
    assert!(p.net.b.stats().rx_unauthenticated > 0);
    assert_eq!(p.net.b.memory(p.b.mr.handle).unwrap()[0], 0);
    // Authenticate-only against encrypting: the tags never verify.
    let mut p = pair(
        config(1, auth(A_IP, SECRET, true)),
        config(2, auth(B_IP, SECRET, false)),
    );
    post_inline_write(&mut p, 1);
    p.run(20);
    assert!(p.net.b.stats().rx_auth_failed > 0);
    assert_eq!(p.net.b.memory(p.b.mr.handle).unwrap()[0], 0);
}

#[test]
fn replayed_datagrams_are_dropped() {
    let mut p = pair(
        config(1, auth(A_IP, SECRET, false)),
        config(2, auth(B_IP, SECRET, false)),
    );
    exchange_every_kind(&mut p);
    let before = *p.net.b.stats();
    let src = SocketAddr::new(A_IP, PORT + 1);
    for d in p.net.sent(Side::A).to_vec() {
        p.net
            .b
            .handle_datagram(p.net.now(), src, metaroce_proto::Ecn::Ect0, &d);
    }
    let after = *p.net.b.stats();
    assert_eq!(
        after.rx_replayed - before.rx_replayed,
        p.net.sent(Side::A).len() as u64
    );
    assert_eq!(
        after.rx_duplicates, before.rx_duplicates,
        "nothing reached the paths"
    );
    assert_eq!(after.rx_duplicate_ops, before.rx_duplicate_ops);
}

#[test]
fn sessions_are_required_and_fixed_per_connection() {
    let mut ep = Endpoint::new(config(1, auth(A_IP, SECRET, false))).unwrap();
    let a = end(&mut ep);
    let b_addr = SocketAddr::new(B_IP, PORT);
    assert_eq!(
        ep.connect_qp(a.qp, b_addr, 7),
        Err(QpError::PeerSessionUnknown(b_addr))
    );
    ep.set_peer_session(b_addr, 1234).unwrap();
    ep.set_peer_session(b_addr, 1234).unwrap();
    ep.connect_qp(a.qp, b_addr, 7).unwrap();
    // The peer restarted: a new session cannot be slipped under live keys.
    assert_eq!(
        ep.set_peer_session(b_addr, 5678),
        Err(QpError::PeerSessionChanged(b_addr))
    );
    // Session ids differ between incarnations (seeds) and are stable per seed.
    let again = Endpoint::new(config(1, None)).unwrap();
    let other = Endpoint::new(config(2, None)).unwrap();
    assert_eq!(again.session_id(), ep.session_id());
    assert_ne!(other.session_id(), ep.session_id());
    // Without auth no session is needed.
    let mut plain = Endpoint::new(config(3, None)).unwrap();
    let q = end(&mut plain);
    plain.connect_qp(q.qp, b_addr, 7).unwrap();
}

#[test]
fn authenticated_transmits_are_whole_and_fit_the_buffer() {
    // A full window from the start (no cold start): all eight packets go
    // out before any ACK.
    let mut a_cfg = config(1, auth(A_IP, SECRET, false));
    a_cfg.cc_params.initial_window_mss = 0;
    let mut p = pair(a_cfg, config(2, auth(B_IP, SECRET, false)));
    let plain = Endpoint::new(config(9, None)).unwrap();
    assert_eq!(
        p.net.a.max_datagram_len(),
        plain.max_datagram_len() - wire::ICRC_LEN + wire::AUTH_TRAILER_LEN
    );
    let wr = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: p.b.mr.addr,
            rkey: p.b.mr.rkey,
        },
        vec![sge(&p.a.mr, 0, 8192)],
    );
    p.net.a.post_send(p.a.qp, wr).unwrap();
    let mut buf = vec![0; p.net.a.max_datagram_len()];
    let mut sent = 0;
    while let Some((t, layout)) = p.net.a.poll_transmit_gather(p.net.now(), &mut buf) {
        assert_eq!(
            layout,
            Layout::Whole,
            "the tag covers the payload: no split send"
        );
        let src = SocketAddr::new(A_IP, t.src_port);
        p.net
            .b
            .handle_datagram(p.net.now(), src, t.ecn, &buf[..t.len]);
        sent += 1;
    }
    assert_eq!(sent, 8);
    assert_eq!(p.net.b.stats().rx_auth_failed, 0);
    assert_eq!(
        p.net.b.memory(p.b.mr.handle).unwrap()[..8192],
        p.net.a.memory(p.a.mr.handle).unwrap()[..8192]
    );
}

#[test]
fn simulator_form_carries_the_flag_and_its_length() {
    let mut p = pair(
        config(1, auth(A_IP, SECRET, false)),
        config(2, auth(B_IP, SECRET, false)),
    );
    post_inline_write(&mut p, 3);
    let (t, repr) = p.net.a.poll_packet(p.net.now()).unwrap();
    assert_eq!(t.len, repr.wire_len());
    let metaroce_proto::PacketRepr::Data(data) = &repr else {
        panic!("a data packet first");
    };
    assert!(data.base.flags.contains(Flags::AUTHENTICATED));
    assert_eq!(t.len, data.header_len() + 100 + wire::AUTH_TRAILER_LEN);
    // A plain repr is refused by an authenticating endpoint.
    let mut plain = *data;
    plain.base.flags.remove(Flags::AUTHENTICATED);
    let src = SocketAddr::new(A_IP, t.src_port);
    p.net.b.handle_packet(
        p.net.now(),
        src,
        t.ecn,
        &metaroce_proto::PacketRepr::Data(plain),
    );
    assert_eq!(p.net.b.stats().rx_unauthenticated, 1);
    p.net.b.handle_packet(p.net.now(), src, t.ecn, &repr);
    assert_eq!(p.net.b.stats().rx_unauthenticated, 1);
}

// ------------------------------------------------------------------- limits

#[test]
fn connection_limit_and_stateless_first_contact() {
    let mut ep = Endpoint::new(EndpointConfig {
        max_connections: 2,
        ..config(1, None)
    })
    .unwrap();
    let pd = ep.alloc_pd();
    let peer = |i: u8| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, i)), PORT);
    for i in 1..=2 {
        let qp = ep.create_qp(pd, caps(), ALL_REMOTE).unwrap();
        ep.connect_qp(qp, peer(i), 5).unwrap();
    }
    let qp = ep.create_qp(pd, caps(), ALL_REMOTE).unwrap();
    assert_eq!(
        ep.connect_qp(qp, peer(3), 5),
        Err(QpError::TooManyConnections(2))
    );
    // A second QP toward a known peer shares its connection: no new state.
    ep.connect_qp(qp, peer(1), 6).unwrap();
    assert_eq!(ep.connection_count(), 2);

    // A flood of valid packets from devices we never connected to creates
    // nothing: each is counted and dropped.
    let mut repr = wire::DataRepr {
        base: wire::BaseRepr {
            flags: Flags::empty(),
            path_slot: 0,
            path_gen: 0,
            src_device_port: PORT,
        },
        psn: 0,
        timestamp_ns: 0,
        dst_qpn: qp.qpn(),
        msg_seq: 0,
        solicited: false,
        psn_floor_delta: 0,
        floor_acked: false,
        msg_len: 8,
        offset: 0,
        op: wire::OpHeader::Write {
            rkey: 1,
            remote_addr: 0,
        },
        payload_len: 8,
    };
    let mut buf = vec![0; 256];
    for i in 0..10_000u32 {
        repr.psn = i;
        let len = wire::emit_data(&repr, &[0; 8], &mut buf);
        let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x0b00_0000 + i)), 5000);
        ep.handle_datagram(0, src, metaroce_proto::Ecn::Ect0, &buf[..len]);
    }
    assert_eq!(ep.stats().rx_unknown_peer, 10_000);
    assert_eq!(ep.connection_count(), 2);
}

#[test]
fn qp_limits() {
    let mut ep = Endpoint::new(EndpointConfig {
        max_queue_pairs: 3,
        max_send_wr: 2,
        max_recv_wr: 2,
        ..config(1, None)
    })
    .unwrap();
    let pd = ep.alloc_pd();
    let small = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
    };
    assert_eq!(
        ep.create_qp(pd, caps(), ALL_REMOTE),
        Err(QpError::BadCaps),
        "caps above the endpoint's per-QP limits"
    );
    let qps: Vec<_> = (0..3)
        .map(|_| ep.create_qp(pd, small, ALL_REMOTE).unwrap())
        .collect();
    assert_eq!(
        ep.create_qp(pd, small, ALL_REMOTE),
        Err(QpError::TooManyQps(3))
    );
    ep.destroy_qp(qps[0]).unwrap();
    ep.create_qp(pd, small, ALL_REMOTE).unwrap();
    // Outstanding operations per QP: the send queue depth.
    ep.connect_qp(qps[1], SocketAddr::new(B_IP, PORT), 5)
        .unwrap();
    let mr = ep
        .register_memory(pd, 4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let wr = || SendWr::new(1, WrOp::Send, vec![sge(&mr, 0, 16)]);
    ep.post_send(qps[1], wr()).unwrap();
    ep.post_send(qps[1], wr()).unwrap();
    assert_eq!(ep.post_send(qps[1], wr()), Err(PostError::QueueFull(2)));
}

#[test]
fn outstanding_operations_per_connection_limit() {
    let cfg = |seed| EndpointConfig {
        max_outstanding_ops_per_connection: 3,
        ..config(seed, None)
    };
    let mut p = pair(cfg(1), cfg(2));
    // A second QP pair on the same connection.
    let pd = p.net.a.alloc_pd();
    let a2 = p.net.a.create_qp(pd, caps(), ALL_REMOTE).unwrap();
    let b_pd = p.net.b.alloc_pd();
    let b2 = p.net.b.create_qp(b_pd, caps(), ALL_REMOTE).unwrap();
    p.net.connect(a2, b2).unwrap();
    let b_mr = p.b.mr;
    let write = |id| {
        SendWr::inline(
            id,
            WrOp::Write {
                remote_addr: b_mr.addr,
                rkey: b_mr.rkey,
            },
            vec![5; 64],
        )
    };
    let qp = p.a.qp;
    p.net.a.post_send(qp, write(1)).unwrap();
    p.net.a.post_send(qp, write(2)).unwrap();
    p.net.a.post_send(a2, write(3)).unwrap();
    assert_eq!(
        p.net.a.post_send(a2, write(4)),
        Err(PostError::ConnectionBusy(3))
    );
    p.run(50);
    assert_eq!(completions(&mut p.net.a).len(), 3);
    // Room again once they completed.
    p.net.a.post_send(a2, write(5)).unwrap();
}

#[test]
fn responder_executes_no_read_beyond_its_limit_and_the_requester_recovers() {
    let mut p = pair(
        config(1, None),
        EndpointConfig {
            max_outstanding_ops_per_connection: 1,
            ..config(2, None)
        },
    );
    fill(&mut p.net.b, &p.b.mr, 0x33);
    let (a_mr, b_mr) = (p.a.mr, p.b.mr);
    for i in 0..4u64 {
        let wr = SendWr::new(
            i,
            WrOp::Read {
                remote_addr: b_mr.addr + i * 8192,
                rkey: b_mr.rkey,
            },
            vec![sge(&a_mr, i * 8192, 8192)],
        );
        p.net.a.post_send(p.a.qp, wr).unwrap();
    }
    for _ in 0..100 {
        p.run(100);
        p.net.advance(200_000);
    }
    let wcs = completions(&mut p.net.a);
    assert_eq!(wcs.len(), 4, "{wcs:?}");
    assert!(wcs.iter().all(|w| w.2 == WcStatus::Success), "{wcs:?}");
    assert!(p.net.b.stats().rx_over_limit > 0, "some READs waited");
    assert_eq!(
        p.net.a.memory(a_mr.handle).unwrap()[..32768],
        p.net.b.memory(b_mr.handle).unwrap()[..32768]
    );
}

#[test]
fn memory_limits() {
    let mut ep = Endpoint::new(EndpointConfig {
        max_memory_regions: 3,
        max_registered_bytes: 100_000,
        ..config(1, None)
    })
    .unwrap();
    let pd = ep.alloc_pd();
    let a = ep
        .register_memory(pd, 60_000, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(
        ep.register_memory(pd, 40_001, AccessFlags::LOCAL_WRITE),
        Err(MemoryError::TooManyBytes {
            length: 40_001,
            limit: 100_000
        })
    );
    ep.register_memory(pd, 20_000, AccessFlags::LOCAL_WRITE)
        .unwrap();
    ep.register_virtual_memory(pd, 20_000, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(ep.registered_bytes(), 100_000);
    assert_eq!(
        ep.register_memory(pd, 1, AccessFlags::LOCAL_WRITE),
        Err(MemoryError::TooManyRegions(3))
    );
    ep.deregister_memory(a.handle).unwrap();
    assert_eq!(ep.registered_bytes(), 40_000);
    ep.register_memory(pd, 60_000, AccessFlags::LOCAL_WRITE)
        .unwrap();
}

/// A WRITE toward `b`'s QP from `a`'s address, on a chosen path slot and
/// message number, straight into `b`.
fn inject_write(p: &mut Lab, path_slot: u8, msg_seq: u32) {
    let repr = wire::DataRepr {
        base: wire::BaseRepr {
            flags: Flags::empty(),
            path_slot,
            path_gen: 0,
            src_device_port: PORT,
        },
        psn: 1 << 30,
        timestamp_ns: 0,
        dst_qpn: p.b.qp.qpn(),
        msg_seq,
        solicited: false,
        psn_floor_delta: 0,
        floor_acked: false,
        msg_len: 16,
        offset: 0,
        op: wire::OpHeader::Write {
            rkey: p.b.mr.rkey,
            remote_addr: p.b.mr.addr,
        },
        payload_len: 8,
    };
    let mut buf = vec![0; 256];
    let len = wire::emit_data(&repr, &[9; 8], &mut buf);
    let src = SocketAddr::new(A_IP, PORT + 1);
    p.net
        .b
        .handle_datagram(p.net.now(), src, metaroce_proto::Ecn::Ect0, &buf[..len]);
}

#[test]
fn peer_path_and_incoming_window_limits() {
    let mut p = pair(
        config(1, None),
        EndpointConfig {
            max_peer_paths: 4,
            max_incoming_ops_per_qp: 8,
            ..config(2, None)
        },
    );
    let memory = p
        .net
        .b
        .connection_memory_bytes(p.net.addr(Side::A))
        .unwrap();
    inject_write(&mut p, 200, 0);
    assert_eq!(p.net.b.stats().rx_over_limit, 1);
    assert_eq!(
        p.net
            .b
            .connection_memory_bytes(p.net.addr(Side::A))
            .unwrap(),
        memory,
        "no receive state for a slot past the limit"
    );
    inject_write(&mut p, 3, 8);
    assert_eq!(
        p.net.b.stats().rx_dropped_ops,
        1,
        "beyond the per-QP window"
    );
    let qp_bytes = p.net.b.qp_memory_bytes(p.b.qp).unwrap();
    inject_write(&mut p, 3, 7);
    assert_eq!(p.net.b.stats().rx_dropped_ops, 1, "inside the window");
    assert!(p.net.b.qp_memory_bytes(p.b.qp).unwrap() > qp_bytes);
}

#[test]
fn new_limits_are_validated() {
    let bad = |cfg: EndpointConfig| cfg.validate().unwrap_err().field;
    let base = config(1, None);
    let cases: [(EndpointConfig, &str); 5] = [
        (
            EndpointConfig {
                max_registered_bytes: 0,
                ..base.clone()
            },
            "max_registered_bytes",
        ),
        (
            EndpointConfig {
                max_outstanding_ops_per_connection: 0,
                ..base.clone()
            },
            "max_outstanding_ops_per_connection",
        ),
        (
            EndpointConfig {
                max_incoming_ops_per_qp: (1 << 16) + 1,
                ..base.clone()
            },
            "max_incoming_ops_per_qp",
        ),
        (
            EndpointConfig {
                max_peer_paths: 0,
                ..base.clone()
            },
            "max_peer_paths",
        ),
        (
            EndpointConfig {
                max_peer_paths: 257,
                ..base.clone()
            },
            "max_peer_paths",
        ),
    ];
    for (cfg, field) in cases {
        assert_eq!(bad(cfg), field);
    }
    let _: Option<ConfigError> = base.validate().err();
}

/// A's QP posts a 100-byte inline WRITE of `byte` to the start of B's region.
fn post_inline_write(p: &mut Lab, byte: u8) {
    let wr = SendWr::inline(
        1,
        WrOp::Write {
            remote_addr: p.b.mr.addr,
            rkey: p.b.mr.rkey,
        },
        vec![byte; 100],
    );
    p.net.a.post_send(p.a.qp, wr).unwrap();
}

// ------------------------------------------------------------ ICRC omission

fn omitting(seed: u64, accept: bool) -> EndpointConfig {
    EndpointConfig {
        accept_icrc_omitted: accept,
        ..config(seed, None)
    }
}

/// Both sides agreed (each accepts, each omits toward the other): every
/// operation runs; every data packet carries `ICRC_OMITTED` and a zero
/// trailer, fails a receiver that requires the ICRC and passes one that
/// accepts its omission; ACKs keep their ICRC.
#[test]
fn icrc_omission_agreed_runs_every_operation() {
    let mut p = pair(omitting(1, true), omitting(2, true));
    let (a_addr, b_addr) = (p.net.addr(Side::A), p.net.addr(Side::B));
    p.net.a.set_peer_icrc_omission(b_addr, true);
    p.net.b.set_peer_icrc_omission(a_addr, true);
    exchange_every_kind(&mut p);
    let mut data = 0;
    for side in [Side::A, Side::B] {
        for d in p.net.sent(side) {
            let flags = wire::BaseHeader::new_checked(&d[..]).unwrap().flags();
            let is_data = d[1] == 1;
            assert_eq!(flags.contains(Flags::ICRC_OMITTED), is_data, "{d:02x?}");
            if is_data {
                data += 1;
                assert_eq!(d[d.len() - 4..], [0; 4], "the trailer goes as zeros");
                assert_eq!(wire::parse(d), Err(wire::Error::BadChecksum));
                assert!(wire::parse_with(d, wire::IcrcPolicy::OmittedAccepted).is_ok());
            } else {
                assert!(wire::parse(d).is_ok(), "ACKs keep their ICRC");
            }
        }
    }
    assert!(data > 10, "{data} data packets");
    assert_eq!(p.net.b.stats().rx_malformed, 0);
}

/// A receiver that has not agreed checks the ICRC as always: the omitted
/// ones fail, nothing is placed, the datagrams count as malformed.
#[test]
fn icrc_omission_not_accepted_fails_closed() {
    let mut p = pair(omitting(1, false), omitting(2, false));
    let b_addr = p.net.addr(Side::B);
    p.net.a.set_peer_icrc_omission(b_addr, true);
    fill(&mut p.net.a, &p.a.mr, 0x33);
    let (a_mr, b_mr) = (p.a.mr, p.b.mr);
    p.net
        .a
        .post_send(
            p.a.qp,
            SendWr::new(
                1,
                WrOp::Write {
                    remote_addr: b_mr.addr,
                    rkey: b_mr.rkey,
                },
                vec![sge(&a_mr, 0, 4096)],
            ),
        )
        .unwrap();
    p.run(50);
    assert!(p.net.b.stats().rx_malformed > 0);
    assert!(
        p.net.b.memory(b_mr.handle).unwrap()[..4096]
            .iter()
            .all(|&x| x == 0),
        "bytes placed from packets whose ICRC was never checked"
    );
}

/// Authenticated connections keep their tag and never set the flag, even
/// when told to omit the ICRC.
#[test]
fn icrc_omission_is_ignored_when_authenticated() {
    let mut p = pair(
        EndpointConfig {
            accept_icrc_omitted: true,
            ..config(1, auth(A_IP, SECRET, false))
        },
        EndpointConfig {
            accept_icrc_omitted: true,
            ..config(2, auth(B_IP, SECRET, false))
        },
    );
    let b_addr = p.net.addr(Side::B);
    p.net.a.set_peer_icrc_omission(b_addr, true);
    exchange_every_kind(&mut p);
    for d in p.net.sent(Side::A) {
        let flags = wire::BaseHeader::new_checked(&d[..]).unwrap().flags();
        assert!(flags.contains(Flags::AUTHENTICATED));
        assert!(!flags.contains(Flags::ICRC_OMITTED));
    }
}
