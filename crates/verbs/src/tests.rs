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
    let mut wc = [WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm_data: None,
        qp_num: 0,
        src_qp: 0,
    }; 4];
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
        Err(VerbsError::Qp(metaroce_proto::QpError::PeerSessionUnknown(
            peer
        )))
    );
    assert_eq!(c.qp_state(qp), Some(QpState::Init), "all-or-nothing");
    c.set_peer_session(peer, 77).unwrap();
    c.modify_qp(qp, &rtr).unwrap();
    assert_ne!(c.session_id(), 0);
}
