use super::*;

fn ctx() -> Context {
    Context::open(EndpointConfig::default()).unwrap()
}

fn qp(ctx: &mut Context) -> (ProtectionDomain, QueuePair, CompletionQueue) {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    let init = QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    (pd, ctx.create_qp(pd, &init).unwrap(), cq)
}

#[test]
fn state_machine_requires_attributes_and_order() {
    let mut c = ctx();
    let (_, qp, _) = qp(&mut c);
    assert_eq!(c.qp_state(qp), Some(QpState::Reset));
    let to = |s| QpAttr {
        qp_state: Some(s),
        ..QpAttr::default()
    };
    assert!(matches!(
        c.modify_qp(qp, &to(QpState::Rtr)),
        Err(VerbsError::InvalidTransition { .. })
    ));
    assert!(matches!(
        c.modify_qp(qp, &to(QpState::Init)),
        Err(VerbsError::MissingAttribute {
            attr: "qp_access_flags",
            ..
        })
    ));
    let init = QpAttr {
        qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
        port_num: Some(1),
        ..to(QpState::Init)
    };
    c.modify_qp(qp, &init).unwrap();
    // posting a send before RTS is refused with the index of the bad request
    let wr = SendWr::inline(1, WrOp::Send, vec![1]);
    assert!(matches!(
        c.post_send(qp, &[wr]),
        Err((0, VerbsError::WrongState { .. }))
    ));
    let rtr = QpAttr {
        dest_addr: Some("127.0.0.2:4791".parse().unwrap()),
        dest_qp_num: Some(0x10001),
        path_mtu: Some(9000),
        ..to(QpState::Rtr)
    };
    assert!(matches!(
        c.modify_qp(qp, &rtr),
        Err(VerbsError::BadAttribute {
            attr: "path_mtu",
            ..
        })
    ));
    c.modify_qp(
        qp,
        &QpAttr {
            path_mtu: Some(4096),
            ..rtr
        },
    )
    .unwrap();
    let rts = QpAttr {
        timeout: Some(14),
        retry_cnt: Some(8),
        rnr_retry: Some(7),
        ..to(QpState::Rts)
    };
    assert!(matches!(
        c.modify_qp(qp, &rts),
        Err(VerbsError::BadAttribute { .. })
    ));
    c.modify_qp(
        qp,
        &QpAttr {
            retry_cnt: Some(7),
            ..rts
        },
    )
    .unwrap();
    assert_eq!(c.qp_state(qp), Some(QpState::Rts));
    c.modify_qp(qp, &to(QpState::Err)).unwrap();
    assert_eq!(c.qp_state(qp), Some(QpState::Err));
    assert!(matches!(
        c.modify_qp(qp, &to(QpState::Reset)),
        Err(VerbsError::InvalidTransition { .. })
    ));
}

#[test]
fn posts_on_an_error_qp_flush() {
    let mut c = ctx();
    let (pd, qp, cq) = qp(&mut c);
    let mr = c.reg_mr(pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    c.modify_qp(
        qp,
        &QpAttr {
            qp_state: Some(QpState::Err),
            ..QpAttr::default()
        },
    )
    .unwrap();
    c.post_recv(
        qp,
        &[RecvWr {
            wr_id: 7,
            sg_list: vec![mr.sge(0, 64)],
        }],
    )
    .unwrap();
    c.post_send(qp, &[SendWr::new(8, WrOp::Send, vec![mr.sge(0, 8)])])
        .unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    let n = c.poll_cq(cq, &mut wc).unwrap();
    assert_eq!(n, 2);
    assert!(wc[..2].iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (7, 8));
}

#[test]
fn mr_access_rule_and_unknown_objects() {
    let mut c = ctx();
    let pd = c.alloc_pd();
    assert!(matches!(
        c.reg_mr(pd, 64, AccessFlags::REMOTE_WRITE),
        Err(VerbsError::Memory(MemoryError::RemoteWriteNeedsLocalWrite))
    ));
    assert!(matches!(
        c.reg_mr(ProtectionDomain(99), 64, AccessFlags::NONE),
        Err(VerbsError::Unknown(_))
    ));
    assert!(c.create_cq(0).is_err());
    let mr = c.reg_mr(pd, 8, AccessFlags::LOCAL_WRITE).unwrap();
    c.mr_bytes_mut(&mr).copy_from_slice(&[9; 8]);
    assert_eq!(c.mr_bytes(&mr), &[9; 8]);
}

/// Several regions at once: each writable, the same region twice or a
/// deregistered one refused.
#[test]
fn disjoint_region_bytes() {
    let mut c = ctx();
    let pd = c.alloc_pd();
    let a = c.reg_mr(pd, 4, AccessFlags::LOCAL_WRITE).unwrap();
    let b = c.reg_mr(pd, 2, AccessFlags::LOCAL_WRITE).unwrap();
    let [x, y] = c.mr_bytes_disjoint_mut([&a, &b]).unwrap();
    x.copy_from_slice(&[1, 2, 3, 4]);
    y.copy_from_slice(&x[..2]);
    assert_eq!(c.mr_bytes(&b), &[1, 2]);
    assert!(c.mr_bytes_disjoint_mut([&a, &a]).is_none());
    c.dereg_mr(b).unwrap();
    assert!(c.mr_bytes_disjoint_mut([&a, &b]).is_none());
}

#[test]
fn authenticated_device_needs_the_peer_session_before_rtr() {
    let mut c = Context::open(EndpointConfig {
        auth: Some(AuthConfig {
            job_secret: [5; 32],
            encrypt: false,
            local_ip: "127.0.0.1".parse().unwrap(),
        }),
        ..EndpointConfig::default()
    })
    .unwrap();
    let (_, qp, _) = qp(&mut c);
    let to = |s| QpAttr {
        qp_state: Some(s),
        ..QpAttr::default()
    };
    let init = QpAttr {
        qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
        port_num: Some(1),
        ..to(QpState::Init)
    };
    c.modify_qp(qp, &init).unwrap();
    let peer: SocketAddr = "127.0.0.2:4791".parse().unwrap();
    let rtr = QpAttr {
        dest_addr: Some(peer),
        dest_qp_num: Some(0x10001),
        path_mtu: Some(4096),
        ..to(QpState::Rtr)
    };
    assert_eq!(
        c.modify_qp(qp, &rtr),
        Err(VerbsError::Qp(QpError::PeerSessionUnknown(peer)))
    );
    assert_eq!(c.qp_state(qp), Some(QpState::Init), "all-or-nothing");
    c.set_peer_session(peer, 77).unwrap();
    c.modify_qp(qp, &rtr).unwrap();
    assert_ne!(c.session_id(), 0);
}

#[test]
fn busy_objects_are_refused_and_freed_ones_go_stale() {
    let mut c = ctx();
    let (pd, qp, cq) = qp(&mut c);
    let mr = c.reg_mr(pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(c.dealloc_pd(pd), Err(VerbsError::Busy("protection domain")));
    assert_eq!(c.destroy_cq(cq), Err(VerbsError::Busy("completion queue")));
    c.destroy_qp(qp).unwrap();
    c.destroy_cq(cq).unwrap();
    assert_eq!(
        c.destroy_cq(cq),
        Err(VerbsError::Unknown("completion queue"))
    );
    // The slot is reused under a new generation: the old handle misses it.
    let fresh = c.create_cq(4).unwrap();
    assert_ne!(fresh, cq);
    assert!(c.poll_cq(cq, &mut [WorkCompletion::default()]).is_err());
    assert_eq!(c.poll_cq(fresh, &mut [WorkCompletion::default()]), Ok(0));
    assert_eq!(c.dealloc_pd(pd), Err(VerbsError::Busy("protection domain")));
    c.dereg_mr(mr).unwrap();
    c.dealloc_pd(pd).unwrap();
    assert_eq!(
        c.dealloc_pd(pd),
        Err(VerbsError::Unknown("protection domain"))
    );
    assert!(matches!(
        c.reg_mr(pd, 64, AccessFlags::NONE),
        Err(VerbsError::Unknown(_))
    ));
}

#[test]
fn device_and_port_attributes_come_from_the_config() {
    let cfg = EndpointConfig {
        mtu_payload_bytes: 2048,
        max_send_wr: 100,
        max_recv_wr: 50,
        ..EndpointConfig::default()
    };
    let c = Context::open(cfg.clone()).unwrap();
    let dev = c.query_device();
    assert_eq!(dev.max_qp, cfg.max_queue_pairs);
    assert_eq!(
        (dev.max_qp_wr, dev.max_send_wr, dev.max_recv_wr),
        (50, 100, 50)
    );
    assert_eq!(dev.max_mr, cfg.max_memory_regions);
    assert_eq!(dev.max_mr_size, 1 << 40);
    assert_eq!(dev.max_cqe as usize, MAX_CQE);
    assert_eq!(dev.atomic_cap, AtomicCap::Glob);
    assert_eq!(dev.phys_port_cnt, 1);
    let port = c.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    assert_eq!((port.active_mtu_bytes, port.max_mtu_bytes), (2048, 2048));
    assert_eq!(port.max_msg_bytes, cfg.max_message_bytes);
    assert_eq!(port.link_rate_bps, cfg.line_rate_bps);
    assert!(matches!(
        c.query_port(2),
        Err(VerbsError::BadAttribute {
            attr: "port_num",
            ..
        })
    ));
}

/// Two contexts with a connected QP each, exchanging datagrams in memory.
struct Link {
    a: Context,
    b: Context,
    qa: QueuePair,
    qb: QueuePair,
    cq_b: CompletionQueue,
    mr_a: MemoryRegion,
    mr_b: MemoryRegion,
    now: u64,
    /// The longest datagram either side sent.
    longest: usize,
}

impl Link {
    fn new() -> Self {
        Self::with_path_mtu(4096)
    }

    /// Devices of the default MTU (4096), QPs of path MTU `path_mtu`.
    fn with_path_mtu(path_mtu: u32) -> Self {
        let addr_a: SocketAddr = "10.0.0.1:4793".parse().unwrap();
        let addr_b: SocketAddr = "10.0.0.2:4793".parse().unwrap();
        let mut a = Context::open(EndpointConfig {
            seed: 1,
            ..EndpointConfig::default()
        })
        .unwrap();
        let mut b = Context::open(EndpointConfig {
            seed: 2,
            ..EndpointConfig::default()
        })
        .unwrap();
        let (pa, qa, _) = qp(&mut a);
        let (pb, qb, cq_b) = qp(&mut b);
        let mr_a = a.reg_mr(pa, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mr_b = b.reg_mr(pb, 4096, all).unwrap();
        for (c, q, peer, peer_qpn) in [
            (&mut a, qa, addr_b, qb.qp_num()),
            (&mut b, qb, addr_a, qa.qp_num()),
        ] {
            let to = |s| QpAttr {
                qp_state: Some(s),
                ..QpAttr::default()
            };
            c.modify_qp(
                q,
                &QpAttr {
                    qp_access_flags: Some(all),
                    port_num: Some(1),
                    ..to(QpState::Init)
                },
            )
            .unwrap();
            c.modify_qp(
                q,
                &QpAttr {
                    dest_addr: Some(peer),
                    dest_qp_num: Some(peer_qpn),
                    path_mtu: Some(path_mtu),
                    ..to(QpState::Rtr)
                },
            )
            .unwrap();
            c.modify_qp(
                q,
                &QpAttr {
                    timeout: Some(14),
                    retry_cnt: Some(7),
                    rnr_retry: Some(7),
                    ..to(QpState::Rts)
                },
            )
            .unwrap();
        }
        Self {
            a,
            b,
            qa,
            qb,
            cq_b,
            mr_a,
            mr_b,
            now: 1_000,
            longest: 0,
        }
    }

    /// Move datagrams both ways until both sides are quiet.
    fn settle(&mut self) {
        let ip_a = "10.0.0.1".parse().unwrap();
        let ip_b = "10.0.0.2".parse().unwrap();
        let mut buf = vec![0; self.a.max_datagram_len()];
        for _ in 0..100 {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit(self.now, &mut buf) {
                self.longest = self.longest.max(t.len);
                let src = SocketAddr::new(ip_a, t.src_port);
                self.b.handle_datagram(self.now, src, t.ecn, &buf[..t.len]);
                moved = true;
            }
            while let Some(t) = self.b.poll_transmit(self.now, &mut buf) {
                self.longest = self.longest.max(t.len);
                let src = SocketAddr::new(ip_b, t.src_port);
                self.a.handle_datagram(self.now, src, t.ecn, &buf[..t.len]);
                moved = true;
            }
            self.now += 5_000;
            self.a.handle_timeout(self.now);
            self.b.handle_timeout(self.now);
            if !moved && self.a.poll_timeout().is_none() && self.b.poll_timeout().is_none() {
                return;
            }
        }
    }

    fn send(&mut self, wr_id: u64, solicited: bool) {
        let mut wr = SendWr::new(wr_id, WrOp::Send, vec![self.mr_a.sge(0, 16)]);
        wr.solicited = solicited;
        self.a.post_send(self.qa, &[wr]).unwrap();
    }

    fn recv(&mut self, wr_id: u64) {
        let wr = RecvWr {
            wr_id,
            sg_list: vec![self.mr_b.sge(wr_id * 64, 64)],
        };
        self.b.post_recv(self.qb, &[wr]).unwrap();
    }
}

/// A QP's path MTU below the device's cuts its messages into packets of
/// the path MTU: a WRITE's and the READ responses its peer returns. (They
/// were cut by the device MTU, and a path carrying less dropped every
/// packet: collnet's all-reduce over veth with 60 KiB devices and 8 KiB
/// paths ended in retry-exceeded.)
#[test]
fn messages_are_cut_by_the_path_mtu_not_the_device_mtu() {
    let mut l = Link::with_path_mtu(1024);
    let device_mtu = l.a.endpoint().config().mtu_payload_bytes;
    assert!(device_mtu > 1024, "the device MTU must be the larger");
    let limit = l.a.endpoint().datagram_len_for_payload(1024);
    let pattern: Vec<u8> = (0..4000u32).map(|i| (i * 7 + 3) as u8).collect();
    l.a.mr_bytes_mut(&l.mr_a)[..4000].copy_from_slice(&pattern);
    l.b.post_recv(
        l.qb,
        &[RecvWr {
            wr_id: 5,
            sg_list: Vec::new(),
        }],
    )
    .unwrap();
    let write = WrOp::WriteImm {
        remote_addr: l.mr_b.addr,
        rkey: l.mr_b.rkey,
        imm: 9,
    };
    l.a.post_send(l.qa, &[SendWr::new(1, write, vec![l.mr_a.sge(0, 4000)])])
        .unwrap();
    let sent = l.a.stats().data_packets_sent;
    l.settle();
    assert_eq!(&l.b.mr_bytes(&l.mr_b)[..4000], &pattern[..]);
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(l.b.poll_cq(l.cq_b, &mut wc), Ok(1));
    assert_eq!((wc[0].wr_id, wc[0].byte_len), (5, 4000));
    assert!(
        l.a.stats().data_packets_sent - sent >= 4,
        "4000 bytes in 1024-byte packets"
    );
    assert!(
        l.longest <= limit,
        "a {}-byte datagram on a path of {limit}",
        l.longest
    );

    // READ back: the responder cuts its response by its own path MTU.
    l.a.mr_bytes_mut(&l.mr_a).fill(0);
    let read = WrOp::Read {
        remote_addr: l.mr_b.addr,
        rkey: l.mr_b.rkey,
    };
    l.a.post_send(l.qa, &[SendWr::new(2, read, vec![l.mr_a.sge(0, 4000)])])
        .unwrap();
    l.settle();
    assert_eq!(&l.a.mr_bytes(&l.mr_a)[..4000], &pattern[..]);
    assert!(
        l.longest <= limit,
        "a {}-byte datagram on a path of {limit}",
        l.longest
    );
}

#[test]
fn a_path_mtu_outside_64_to_the_device_mtu_is_refused() {
    let mut c = ctx();
    let (_, qp, _) = qp(&mut c);
    c.modify_qp(
        qp,
        &QpAttr {
            qp_state: Some(QpState::Init),
            qp_access_flags: Some(AccessFlags::REMOTE_WRITE),
            port_num: Some(1),
            ..QpAttr::default()
        },
    )
    .unwrap();
    let rtr = |mtu| QpAttr {
        qp_state: Some(QpState::Rtr),
        dest_addr: Some("127.0.0.2:4791".parse().unwrap()),
        dest_qp_num: Some(0x10001),
        path_mtu: Some(mtu),
        ..QpAttr::default()
    };
    for bad in [0, 63, 4097] {
        assert!(
            matches!(
                c.modify_qp(qp, &rtr(bad)),
                Err(VerbsError::BadAttribute {
                    attr: "path_mtu",
                    ..
                })
            ),
            "path_mtu {bad}"
        );
    }
    c.modify_qp(qp, &rtr(64)).unwrap();
}

#[test]
fn an_armed_cq_raises_one_event_for_its_next_completion() {
    let mut l = Link::new();
    l.recv(0);
    l.recv(1);
    // Not armed: completions land, no event.
    l.send(10, false);
    l.settle();
    assert!(!l.b.has_cq_events());
    l.b.req_notify_cq(l.cq_b, false).unwrap();
    assert_eq!(
        l.b.poll_cq_event(),
        None,
        "the completion already there fires nothing"
    );
    l.send(11, false);
    l.settle();
    assert_eq!(l.b.poll_cq_event(), Some(l.cq_b));
    assert_eq!(l.b.poll_cq_event(), None, "one event per arm");
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(l.b.poll_cq(l.cq_b, &mut wc), Ok(2));
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (0, 1));
}

#[test]
fn a_solicited_only_arm_waits_for_a_solicited_receive() {
    let mut l = Link::new();
    for i in 0..3 {
        l.recv(i);
    }
    l.b.req_notify_cq(l.cq_b, true).unwrap();
    l.send(10, false);
    l.settle();
    assert_eq!(
        l.b.poll_cq_event(),
        None,
        "an unsolicited SEND does not wake it"
    );
    l.send(11, true);
    l.settle();
    assert_eq!(l.b.poll_cq_event(), Some(l.cq_b));
    // An error completion wakes a solicited-only waiter too: the QP's
    // remaining receive is flushed when it goes to the error state.
    l.b.req_notify_cq(l.cq_b, true).unwrap();
    l.b.modify_qp(
        l.qb,
        &QpAttr {
            qp_state: Some(QpState::Err),
            ..QpAttr::default()
        },
    )
    .unwrap();
    assert_eq!(l.b.poll_cq_event(), Some(l.cq_b));
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(l.b.poll_cq(l.cq_b, &mut wc), Ok(3));
    assert_eq!(wc[2].status, WcStatus::WrFlushErr);
}

#[test]
fn a_cq_says_whether_a_poll_would_return_something_without_taking_it() {
    let mut l = Link::new();
    l.recv(0);
    assert!(!l.b.cq_has_completions(l.cq_b));
    l.send(10, false);
    l.settle();
    // Twice: looking takes nothing.
    assert!(l.b.cq_has_completions(l.cq_b));
    assert!(l.b.cq_has_completions(l.cq_b));
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(l.b.poll_cq(l.cq_b, &mut wc), Ok(1));
    assert!(!l.b.cq_has_completions(l.cq_b));
    // An unknown CQ says yes, so that the poll that follows reports it.
    l.b.destroy_qp(l.qb).unwrap();
    l.b.destroy_cq(l.cq_b).unwrap();
    assert!(l.b.cq_has_completions(l.cq_b));
}

/// The receiver's promise from connection setup (what the connection
/// manager carries): its only sender starts at the whole line instead of
/// one short cold packet and a round trip. A peer with no connection is an
/// error.
#[test]
fn a_setup_grant_sends_the_first_flight_whole() {
    let first_flight = |grant: bool| {
        let mut l = Link::with_path_mtu(1024);
        if grant {
            let promise = l.b.setup_grant_bps(1);
            assert_eq!(promise, 0, "a lone sender: no cap");
            let b: SocketAddr = "10.0.0.2:4793".parse().unwrap();
            l.a.take_setup_grant(b, promise, l.now).unwrap();
        }
        let write = WrOp::Write {
            remote_addr: l.mr_b.addr,
            rkey: l.mr_b.rkey,
        };
        l.a.post_send(l.qa, &[SendWr::new(1, write, vec![l.mr_a.sge(0, 4000)])])
            .unwrap();
        let mut buf = vec![0; l.a.max_datagram_len()];
        let mut lens = Vec::new();
        while let Some(t) = l.a.poll_transmit(l.now, &mut buf) {
            lens.push(t.len);
        }
        lens
    };
    // Cold: the message's first 256 bytes go in a short packet that asks
    // for the receiver's grant. Granted: full packets from the first.
    let cold = first_flight(false);
    assert!(cold[0] < 1024, "{cold:?}");
    let granted = first_flight(true);
    assert!(
        granted.len() == 4 && granted[..3].iter().all(|&n| n > 1024),
        "4000 bytes in four packets of 1024 or less: {granted:?}"
    );
    let mut c = ctx();
    let stranger: SocketAddr = "10.9.9.9:4793".parse().unwrap();
    assert_eq!(
        c.take_setup_grant(stranger, 0, 0),
        Err(VerbsError::Qp(QpError::NotConnectedTo(stranger)))
    );
}
