//! Datapath tests over real sockets on 127.0.0.1 (ports picked at random
//! from free ranges, so parallel tests do not collide).

use crate::capture::{CaptureHook, CapturedDatagram};
use crate::{Device, DeviceConfig, Impair};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, Ecn, EndpointConfig, MemoryRegion, ProtectionDomain, QpAttr,
    QpCaps, QpInitAttr, QpState, QpType, QueuePair, RecvWr, SendWr, WcStatus, WorkCompletion, WrOp,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

type Ends = [(QueuePair, CompletionQueue, ProtectionDomain); 2];

/// Two devices on 127.0.0.1 with one connected RC QP each.
fn two_devices() -> (Device, Device, Ends) {
    two_devices_sized(
        EndpointConfig::default().mtu_payload_bytes,
        4096,
        [None, None],
        true,
    )
}

/// Two devices on 127.0.0.1 of MTU `device_mtu`, with one connected RC QP
/// each of path MTU `path_mtu`, each device with its capture hook, ACKs
/// riding in front of data datagrams if `coalesce`.
fn two_devices_sized(
    device_mtu: u32,
    path_mtu: u32,
    capture: [Option<Arc<dyn CaptureHook>>; 2],
    coalesce: bool,
) -> (Device, Device, Ends) {
    two_devices_with(device_mtu, path_mtu, capture, coalesce, |_| {})
}

/// [`two_devices_sized`], each device's configuration passed through
/// `tweak` before it starts.
fn two_devices_with(
    device_mtu: u32,
    path_mtu: u32,
    capture: [Option<Arc<dyn CaptureHook>>; 2],
    coalesce: bool,
    tweak: impl Fn(&mut DeviceConfig),
) -> (Device, Device, Ends) {
    let cfg = EndpointConfig {
        device_port: 0,
        path_port_span: 16,
        paths_per_connection: 8,
        rto_min_ns: 1_000_000,
        mtu_payload_bytes: device_mtu,
        ..EndpointConfig::default()
    };
    let ip = "127.0.0.1".parse().unwrap();
    let [cap_a, cap_b] = capture;
    let mut dc = DeviceConfig::new(
        EndpointConfig {
            seed: 1,
            ..cfg.clone()
        },
        ip,
    );
    dc.capture = cap_a;
    dc.coalesce = coalesce;
    tweak(&mut dc);
    let a = Device::start(dc).unwrap();
    let mut dc = DeviceConfig::new(EndpointConfig { seed: 2, ..cfg }, ip);
    dc.capture = cap_b;
    dc.coalesce = coalesce;
    tweak(&mut dc);
    let b = Device::start(dc).unwrap();
    let mk = |d: &Device| {
        d.with(|ctx, _| {
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(4096).unwrap();
            let init = QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                cap: QpCaps {
                    max_send_wr: 256,
                    max_recv_wr: 256,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
            };
            let qp = ctx.create_qp(pd, &init).unwrap();
            ctx.modify_qp(
                qp,
                &QpAttr {
                    qp_state: Some(QpState::Init),
                    qp_access_flags: Some(AccessFlags(0xf)),
                    port_num: Some(1),
                    ..QpAttr::default()
                },
            )
            .unwrap();
            (qp, cq, pd)
        })
    };
    let (qa, ca, pa) = mk(&a);
    let (qb, cb, pb) = mk(&b);
    for (d, qp, peer, pqp) in [(&a, qa, b.addr(), qb), (&b, qb, a.addr(), qa)] {
        d.with(|ctx, _| {
            ctx.modify_qp(
                qp,
                &QpAttr {
                    qp_state: Some(QpState::Rtr),
                    dest_addr: Some(peer),
                    dest_qp_num: Some(pqp.qp_num()),
                    path_mtu: Some(path_mtu),
                    ..QpAttr::default()
                },
            )
            .unwrap();
            ctx.modify_qp(
                qp,
                &QpAttr {
                    qp_state: Some(QpState::Rts),
                    timeout: Some(14),
                    retry_cnt: Some(7),
                    rnr_retry: Some(7),
                    ..QpAttr::default()
                },
            )
            .unwrap();
        });
    }
    (a, b, [(qa, ca, pa), (qb, cb, pb)])
}

/// [`two_devices_with`] at `mtu`, each device taking the other's payloads
/// without an ICRC (as loopback peers negotiate it), which is what lets a
/// WRITE's payload be read straight into its region (direct placement).
fn two_devices_omitting_icrc(
    mtu: u32,
    tweak: impl Fn(&mut DeviceConfig),
) -> (Device, Device, Ends) {
    let (a, b, ends) = two_devices_with(mtu, mtu, [None, None], true, |dc| {
        dc.endpoint.accept_icrc_omitted = true;
        tweak(dc);
    });
    let (aa, ba) = (a.addr(), b.addr());
    a.with(|ctx, _| ctx.set_peer_icrc_omission(ba, true));
    b.with(|ctx, _| ctx.set_peer_icrc_omission(aa, true));
    (a, b, ends)
}

/// WRITE all of `src` into `dst` (regions of equal length) as work request
/// `wr_id`, and wait until it completes successfully.
fn write_and_wait(
    a: &Device,
    qa: QueuePair,
    ca: CompletionQueue,
    src: &MemoryRegion,
    dst: &MemoryRegion,
    wr_id: u64,
) {
    a.with(|ctx, _| {
        let op = WrOp::Write {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        };
        let wr = SendWr::new(wr_id, op, vec![src.sge(0, src.length as u32)]);
        ctx.post_send(qa, &[wr]).unwrap();
    });
    let wc = wait_one(a, ca);
    assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success), "{wc:?}");
}

fn wait_one(d: &Device, cq: CompletionQueue) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    let t0 = crate::now_ns();
    loop {
        if d.poll_cq(cq, &mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(
            crate::now_ns() - t0 < 20_000_000_000,
            "no completion in 20 s"
        );
    }
}

/// The longest datagram a device sent.
#[derive(Debug, Default)]
struct Longest(AtomicUsize);

impl CaptureHook for Longest {
    fn datagram(&self, d: &CapturedDatagram<'_>) {
        if d.sent {
            let len = d.parts.iter().map(|p| p.len()).sum();
            self.0.fetch_max(len, Ordering::Relaxed);
        }
    }
}

/// Devices of a 60 KiB MTU whose QPs have a path MTU of 8 KiB (collnet's
/// devices toward a peer on another host) send no datagram longer than the
/// path MTU makes, in a WRITE_WITH_IMM and in the READ responses to a
/// READ, and the data arrives. (Messages were cut by the device MTU: 60 KiB
/// datagrams, which a path of 9000 bytes never delivered.)
#[test]
fn packets_follow_the_qp_path_mtu_below_the_device_mtu() {
    const DEVICE_MTU: u32 = 60 << 10;
    const PATH_MTU: u32 = 8192;
    const LEN: u32 = 256 << 10;
    let hooks = [Arc::new(Longest::default()), Arc::new(Longest::default())];
    // No ACKs riding in front of data: those are bounded by the path the
    // device learned (`learn_path`; loopback's carries 64 KiB), not by a
    // QP's MTU, and would blur what is measured here.
    let (a, b, [(qa, ca, pa), (qb, cb, pb)]) = two_devices_sized(
        DEVICE_MTU,
        PATH_MTU,
        [Some(hooks[0].clone() as _), Some(hooks[1].clone() as _)],
        false,
    );
    let limit = a.with(|ctx, _| ctx.endpoint().datagram_len_for_payload(PATH_MTU));
    let src = a.with(|ctx, _| ctx.reg_mr(pa, u64::from(LEN), AccessFlags(0xf)).unwrap());
    let dst = b.with(|ctx, _| ctx.reg_mr(pb, u64::from(LEN), AccessFlags(0xf)).unwrap());
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    a.with(|ctx, _| ctx.mr_bytes_mut(&src).copy_from_slice(&pattern));
    b.with(|ctx, _| {
        let wr = RecvWr {
            wr_id: 3,
            sg_list: Vec::new(),
        };
        ctx.post_recv(qb, &[wr]).unwrap();
    });
    let sent = a.stats().endpoint.data_packets_sent;
    a.with(|ctx, _| {
        let op = WrOp::WriteImm {
            remote_addr: dst.addr,
            rkey: dst.rkey,
            imm: 1,
        };
        let wr = SendWr::new(1, op, vec![src.sge(0, LEN)]);
        ctx.post_send(qa, &[wr]).unwrap();
    });
    let wc = wait_one(&b, cb);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (3, WcStatus::Success, LEN)
    );
    let wc = wait_one(&a, ca);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "{wc:?}");
    assert!(b.with(|ctx, _| ctx.mr_bytes(&dst) == &pattern[..]));
    assert!(a.stats().endpoint.data_packets_sent - sent >= u64::from(LEN / PATH_MTU));

    // And back by READ: the responder cuts its response by its path MTU.
    a.with(|ctx, _| ctx.mr_bytes_mut(&src).fill(0));
    a.with(|ctx, _| {
        let op = WrOp::Read {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        };
        let wr = SendWr::new(2, op, vec![src.sge(0, LEN)]);
        ctx.post_send(qa, &[wr]).unwrap();
    });
    let wc = wait_one(&a, ca);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success), "{wc:?}");
    assert!(a.with(|ctx, _| ctx.mr_bytes(&src) == &pattern[..]));
    for (name, h) in ["a", "b"].into_iter().zip(&hooks) {
        let longest = h.0.load(Ordering::Relaxed);
        assert!(
            longest <= limit,
            "device {name} sent a {longest}-byte datagram; the path MTU makes {limit}"
        );
    }
}

/// A thread blocked in `get_cq_event` on a CQ armed for solicited
/// completions sleeps through an unsolicited SEND and is woken by the
/// solicited one (the engine thread drives progress meanwhile).
#[test]
fn blocked_waiter_wakes_on_a_solicited_send_only() {
    let (a, b, [(qa, _, pa), (qb, cb, pb)]) = two_devices();
    let src = a.with(|ctx, _| ctx.reg_mr(pa, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let dst = b.with(|ctx, _| ctx.reg_mr(pb, 4096, AccessFlags(0xf)).unwrap());
    b.with(|ctx, _| {
        let recvs: Vec<RecvWr> = (0..2)
            .map(|i| RecvWr {
                wr_id: i,
                sg_list: vec![dst.sge(i * 64, 64)],
            })
            .collect();
        ctx.post_recv(qb, &recvs).unwrap();
    });
    b.req_notify_cq(cb, true).unwrap();
    let send = |wr_id, solicited| {
        let mut wr = SendWr::new(wr_id, WrOp::Send, vec![src.sge(0, 64)]);
        wr.solicited = solicited;
        a.with(|ctx, _| ctx.post_send(qa, &[wr]).unwrap());
    };
    std::thread::scope(|s| {
        let waiter = s.spawn(|| b.get_cq_event(std::time::Duration::from_secs(20)));
        send(1, false);
        // Give the unsolicited SEND time to land before the solicited one.
        let t0 = crate::now_ns();
        while b.stats().endpoint.ack_packets_sent == 0 && crate::now_ns() - t0 < 5_000_000_000 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!waiter.is_finished(), "woken by an unsolicited SEND");
        send(2, true);
        assert_eq!(waiter.join().unwrap(), Some(cb));
    });
    let mut wc = [WorkCompletion::default(); 2];
    let mut got = 0;
    let t0 = crate::now_ns();
    while got < 2 {
        got += b.poll_cq(cb, &mut wc[got..]).unwrap();
        assert!(crate::now_ns() - t0 < 5_000_000_000, "receives missing");
    }
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (0, 1));
    assert_eq!(b.get_cq_event(std::time::Duration::from_millis(10)), None);
}

/// A ping-pong of small SENDs: each reply carries the ACK for the message
/// it answers in the same datagram (wire.md 5.3), the bytes arrive intact,
/// and nothing is taken for malformed.
#[test]
fn ping_pong_replies_carry_their_acks() {
    let (a, b, [(qa, ca, pa), (qb, cb, pb)]) = two_devices();
    let ends = [(&a, qa, ca, pa), (&b, qb, cb, pb)];
    let mrs: Vec<_> = ends
        .iter()
        .map(|(d, _, _, pd)| d.with(|ctx, _| ctx.reg_mr(*pd, 4096, AccessFlags(0xf)).unwrap()))
        .collect();
    const ROUNDS: u64 = 200;
    for (k, (d, qp, _, _)) in ends.iter().enumerate() {
        let mr = mrs[k];
        d.with(|ctx, _| {
            let recvs: Vec<RecvWr> = (0..ROUNDS)
                .map(|i| RecvWr {
                    wr_id: i,
                    sg_list: vec![mr.sge(2048, 64)],
                })
                .collect();
            ctx.post_recv(*qp, &recvs).unwrap();
        });
    }
    let send = |k: usize, round: u64| {
        let (d, qp, _, _) = ends[k];
        let mr = mrs[k];
        d.with(|ctx, _| {
            ctx.mr_bytes_mut(&mr)[..8].copy_from_slice(&round.to_le_bytes());
            let wr = SendWr::new(round, WrOp::Send, vec![mr.sge(0, 8)]);
            ctx.post_send(qp, &[wr]).unwrap();
        });
    };
    // Wait for the receive on side k (send completions are unsignaled).
    let take = |k: usize, round: u64| loop {
        let (d, _, cq, _) = ends[k];
        let wc = wait_one(d, cq);
        assert_eq!(wc.status, WcStatus::Success);
        if wc.opcode == metaroce_verbs::WcOpcode::Recv {
            // Deferred: a plain `with` here would flush the ACK on its own.
            let got = d.with_deferred(|ctx, _| ctx.mr_bytes(&mrs[k])[2048..2056].to_vec());
            assert_eq!(got, round.to_le_bytes());
            return;
        }
    };
    for round in 0..ROUNDS {
        send(0, round);
        take(1, round);
        send(1, round);
        take(0, round);
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.endpoint.rx_malformed + sb.endpoint.rx_malformed, 0);
    // Most replies carry their ACK; a thread preempted between taking a
    // completion and replying past the 10 us hold sends it alone, which a
    // loaded CI machine does now and then.
    assert!(
        sa.io.tx_coalesced + sb.io.tx_coalesced >= ROUNDS / 2,
        "ACKs coalesced: {} + {} of {} replies",
        sa.io.tx_coalesced,
        sb.io.tx_coalesced,
        2 * ROUNDS
    );
    // The receiving side handled each such ACK after its own reply had
    // left, not before the data behind it (`DEFER_ACK_MAX_DATAGRAM`)...
    assert!(
        sa.io.rx_acks_deferred + sb.io.rx_acks_deferred >= ROUNDS / 2,
        "ACKs handled after the reply: {} + {}",
        sa.io.rx_acks_deferred,
        sb.io.rx_acks_deferred
    );
    // ...and handled all the same: a signaled send completes, which takes
    // every earlier message acknowledged in order.
    let mr_b = mrs[1];
    b.with(|ctx, _| {
        let recv = RecvWr {
            wr_id: 9_999,
            sg_list: vec![mr_b.sge(2048, 64)],
        };
        ctx.post_recv(qb, &[recv]).unwrap();
    });
    let mr = mrs[0];
    a.with(|ctx, _| {
        let mut wr = SendWr::new(9_999, WrOp::Send, vec![mr.sge(0, 8)]);
        wr.signaled = true;
        ctx.post_send(qa, &[wr]).unwrap();
    });
    let wc = loop {
        let wc = wait_one(&a, ca);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        if wc.wr_id == 9_999 {
            break wc;
        }
    };
    assert_eq!(wc.opcode, metaroce_verbs::WcOpcode::Send);
}

/// The last message a device receives before it closes completes at the
/// sender: the receiver takes it with its ACK held for a reply that never
/// comes (`with_deferred`), then closes at once; closing sends what is owed.
/// With `linger`, the closing device also answers while the sender's last
/// message is still in flight.
#[test]
fn closing_acknowledges_the_last_message() {
    for linger in [false, true] {
        let (a, b, [(qa, ca, pa), (qb, cb, pb)]) = two_devices();
        let src = a.with(|ctx, _| ctx.reg_mr(pa, 4096, AccessFlags(0xf)).unwrap());
        let dst = b.with(|ctx, _| ctx.reg_mr(pb, 4096, AccessFlags(0xf)).unwrap());
        b.with(|ctx, _| {
            ctx.post_recv(
                qb,
                &[RecvWr {
                    wr_id: 7,
                    sg_list: vec![dst.sge(0, 64)],
                }],
            )
            .unwrap();
        });
        a.with(|ctx, _| {
            let wr = SendWr::new(1, WrOp::Send, vec![src.sge(0, 8)]);
            ctx.post_send(qa, &[wr]).unwrap();
        });
        let wc = wait_one(&b, cb);
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
        b.with_deferred(|_, _| ());
        if linger {
            let quiet = b.linger(
                std::time::Duration::from_millis(5),
                std::time::Duration::from_secs(2),
            );
            assert!(quiet, "the device never went quiet");
        }
        b.shutdown();
        let wc = wait_one(&a, ca);
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "{wc:?}");
    }
}

/// Garbage sprayed at the device port during a transfer is counted as
/// malformed and dropped; the transfer completes intact.
#[test]
fn malformed_spray_during_write() {
    let (a, b, [(qa, ca, pa), (_, _, pb)]) = two_devices();
    let len = 8u64 << 20;
    let src = a.with(|ctx, _| {
        let mr = ctx.reg_mr(pa, len, AccessFlags(0xf)).unwrap();
        for (i, v) in ctx.mr_bytes_mut(&mr).iter_mut().enumerate() {
            *v = (i * 7 + i / 4096) as u8;
        }
        mr
    });
    let dst = b.with(|ctx, _| ctx.reg_mr(pb, len, AccessFlags(0xf)).unwrap());
    let target = b.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let sprayer = std::thread::spawn(move || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut sent = 0u64;
        while !stop2.load(Ordering::Relaxed) || sent < 200 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (x % 1400) as usize;
            let mut d: Vec<u8> = (0..n).map(|i| (x >> (i % 56)) as u8).collect();
            match sent % 4 {
                // Plausible version/type bytes, then garbage.
                0 if d.len() > 4 => d[..4].copy_from_slice(&[1, 1, 1, 0]),
                1 if d.len() > 4 => d[..4].copy_from_slice(&[1, 2, 0, 0]),
                2 => d.clear(),
                _ => {}
            }
            let _ = s.send_to(&d, target);
            sent += 1;
            if sent.is_multiple_of(64) {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        sent
    });
    let wr = SendWr::new(
        9,
        WrOp::Write {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        },
        vec![src.sge(0, len as u32)],
    );
    a.with(|ctx, _| ctx.post_send(qa, &[wr]).unwrap());
    let wc = wait_one(&a, ca);
    stop.store(true, Ordering::Relaxed);
    let sent = sprayer.join().unwrap();
    assert_eq!(wc.status, WcStatus::Success);
    // Let the device read the rest of the garbage.
    let t0 = crate::now_ns();
    while b.stats().endpoint.rx_malformed == 0 && crate::now_ns() - t0 < 2_000_000_000 {
        b.progress();
    }
    let same = a.with(|ca_, _| ca_.mr_bytes(&src).to_vec())
        == b.with(|cb_, _| cb_.mr_bytes(&dst).to_vec());
    assert!(same, "target bytes differ");
    let st = b.stats();
    assert!(
        st.endpoint.rx_malformed > 0,
        "no malformed datagram counted: {st:?}"
    );
    assert!(st.endpoint.rx_malformed <= sent);
    eprintln!(
        "sprayed {sent}, counted malformed {}",
        st.endpoint.rx_malformed
    );
}

/// ECN: a datagram sent ECT(0) or CE arrives with that codepoint (IP_TOS
/// cmsg on send, IP_RECVTOS on receive).
#[test]
fn tos_cmsg_round_trip() {
    use crate::sys;
    let rx = sys::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
    let tx = sys::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
    let dst = rx.local_addr().unwrap().as_socket().unwrap();
    let gro = sys::enable_gro(&rx);
    let gso = sys::probe_gso(&tx);
    for (ecn, tos) in [(Ecn::Ect0, 2u8), (Ecn::Ce, 3), (Ecn::NotEct, 0)] {
        let seg = [7u8; 1000];
        let parts = [&seg[..], &seg[..], &seg[..500]];
        let m = sys::OutMsg {
            dst,
            tos,
            segment: gso.then_some(1000),
            parts: if gso { &parts } else { &parts[..1] },
            datagrams: if gso { parts.len() } else { 1 },
        };
        assert_eq!(sys::send_batch(&tx, std::slice::from_ref(&m)).unwrap(), 1);
        let mut b = sys::RxBatch::new(4);
        let mut got = 0;
        let t0 = crate::now_ns();
        while got == 0 {
            got = b.recv(&rx).unwrap();
            assert!(crate::now_ns() - t0 < 2_000_000_000);
        }
        let total: usize = (0..got).map(|i| b.meta[i].len).sum();
        assert_eq!(total, if gso { 2500 } else { 1000 });
        assert_eq!(sys::ecn_of_tos(b.meta[0].tos), ecn);
        if gso && gro {
            assert!(b.meta[0].segment.is_none_or(|s| s == 1000));
        }
    }
}

/// A peer that dies in the middle of a transfer (its device shut down, its
/// sockets closed) makes the requester's work request end with
/// `RetryExcErr` once the retry budget is spent, and the work behind it
/// flush with `WrFlushErr`: an error completion, not a hang.
#[test]
fn peer_death_mid_transfer_is_retry_exceeded() {
    let (a, b, [(qa, ca, pa), (_, _, pb)]) = two_devices();
    let len = 32u64 << 20;
    let src = a.with(|ctx, _| ctx.reg_mr(pa, len, AccessFlags(0xf)).unwrap());
    let dst = b.with(|ctx, _| ctx.reg_mr(pb, len, AccessFlags(0xf)).unwrap());
    let write = |id| {
        SendWr::new(
            id,
            WrOp::Write {
                remote_addr: dst.addr,
                rkey: dst.rkey,
            },
            vec![src.sge(0, len as u32)],
        )
    };
    a.with(|ctx, _| ctx.post_send(qa, &[write(1), write(2)]).unwrap());
    // Let part of the first WRITE land, then kill the responder.
    let t0 = crate::now_ns();
    while b.stats().endpoint.rx_datagrams < 64 {
        a.progress();
        assert!(
            crate::now_ns() - t0 < 10_000_000_000,
            "transfer never started"
        );
    }
    b.shutdown();
    let first = wait_one(&a, ca);
    assert_eq!(first.wr_id, 1);
    if first.status == WcStatus::Success {
        // On a loaded host the responder's engine may finish the first
        // WRITE before the shutdown takes hold: then the second one is
        // the one cut off mid-transfer.
        let second = wait_one(&a, ca);
        assert_eq!(second.wr_id, 2);
        assert_eq!(second.status, WcStatus::RetryExcErr, "{second:?}");
    } else {
        assert_eq!(first.status, WcStatus::RetryExcErr, "{first:?}");
        let second = wait_one(&a, ca);
        assert_eq!(second.wr_id, 2);
        assert_eq!(second.status, WcStatus::WrFlushErr, "{second:?}");
    }
    let elapsed_ms = (crate::now_ns() - t0) / 1_000_000;
    eprintln!(
        "retry exceeded {elapsed_ms} ms after the start; {:?}",
        a.stats().endpoint
    );
}

/// CPU time the named thread of this process has run, ns
/// (`/proc/self/task/*/schedstat`); None where the kernel lacks it.
fn thread_cpu_ns(name: &str) -> Option<u64> {
    for t in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = t.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let stat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
            return stat.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

/// Spin, then block: a connected device with nothing to do uses under 1 %
/// of a CPU (its engine spins for the busy-poll window after the last
/// activity, then sleeps in ppoll until a datagram, a post or a deadline),
/// and so does an application thread waiting in `poll_cq_wait` for a
/// completion that does not come.
#[test]
fn idle_device_uses_under_one_percent_of_a_cpu() {
    let (a, b, [(qa, ca, pa), (_, cb, pb)]) = two_devices();
    // Some traffic first, so the engines have been busy.
    let src = a.with(|ctx, _| ctx.reg_mr(pa, 1 << 20, AccessFlags(0xf)).unwrap());
    let dst = b.with(|ctx, _| ctx.reg_mr(pb, 1 << 20, AccessFlags(0xf)).unwrap());
    let wr = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        },
        vec![src.sge(0, 1 << 20)],
    );
    a.with(|ctx, _| ctx.post_send(qa, &[wr]).unwrap());
    assert_eq!(wait_one(&a, ca).status, WcStatus::Success);
    // The application stops polling; let the busy-poll windows and the
    // delayed ACKs pass. One thread keeps waiting on b's CQ.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("mr-idle-poller".into())
            .spawn_scoped(s, || {
                let mut wc = [WorkCompletion::default(); 4];
                while !stop.load(Ordering::Relaxed) {
                    let _ = b.poll_cq_wait(cb, &mut wc, std::time::Duration::from_millis(100));
                }
            })
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut names = [a.addr().port(), b.addr().port()]
            .map(|p| format!("mr-engine-{p}"))
            .to_vec();
        names.push("mr-idle-poller".into());
        let before = names
            .iter()
            .map(|n| thread_cpu_ns(n))
            .collect::<Option<Vec<_>>>();
        let window_ns = 2_000_000_000u64;
        std::thread::sleep(std::time::Duration::from_nanos(window_ns));
        let after: Option<Vec<u64>> = names.iter().map(|n| thread_cpu_ns(n)).collect();
        stop.store(true, Ordering::Relaxed);
        let (Some(before), Some(after)) = (before, after) else {
            eprintln!("SKIP idle CPU: no per-thread schedstat");
            return;
        };
        for (i, name) in names.iter().enumerate() {
            let used = after[i] - before[i];
            let pct = 100.0 * used as f64 / window_ns as f64;
            eprintln!(
                "{name}: {:.3} ms of CPU in 2 s idle ({pct:.3} %)",
                used as f64 / 1e6
            );
            assert!(pct < 1.0, "{name} used {pct:.2} % of a CPU while idle");
        }
    });
}

/// Large WRITEs whose payloads the receiver takes straight into the region
/// (direct placement) arrive intact, as with the copy, and so do READ
/// responses taken straight into the READ's buffer.
#[test]
fn direct_placement_receives_writes_into_the_region() {
    const MTU: u32 = 60 << 10;
    const LEN: u32 = 4 << 20;
    // The impairment drops, duplicates and holds back directly placed
    // datagrams as it does others.
    let lossy: Impair = "loss=0.05,dup=0.05,reorder=0.05,seed=3".parse().unwrap();
    for (direct, impair) in [(true, None), (false, None), (true, Some(lossy))] {
        let (a, b, [(qa, ca, pa), (_qb, _cb, pb)]) = two_devices_omitting_icrc(MTU, |dc| {
            dc.direct_placement = direct;
            dc.impair = impair;
        });
        let src = a.with(|ctx, _| ctx.reg_mr(pa, u64::from(LEN), AccessFlags(0xf)).unwrap());
        let dst = b.with(|ctx, _| ctx.reg_mr(pb, u64::from(LEN), AccessFlags(0xf)).unwrap());
        let pattern: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8).collect();
        a.with(|ctx, _| ctx.mr_bytes_mut(&src).copy_from_slice(&pattern));
        for round in 0..4u64 {
            write_and_wait(&a, qa, ca, &src, &dst, round);
        }
        assert!(b.with(|ctx, _| ctx.mr_bytes(&dst) == &pattern[..]));
        // And back by READ.
        a.with(|ctx, _| ctx.mr_bytes_mut(&src).fill(0));
        a.with(|ctx, _| {
            let op = WrOp::Read {
                remote_addr: dst.addr,
                rkey: dst.rkey,
            };
            let wr = SendWr::new(9, op, vec![src.sge(0, LEN)]);
            ctx.post_send(qa, &[wr]).unwrap();
        });
        let wc = wait_one(&a, ca);
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success), "{wc:?}");
        assert!(a.with(|ctx, _| ctx.mr_bytes(&src) == &pattern[..]));
        let placed = [b.stats().io.rx_direct, a.stats().io.rx_direct];
        if direct {
            assert!(placed.iter().all(|&p| p > 0), "placed directly: {placed:?}");
        } else {
            assert_eq!(placed, [0, 0]);
        }
        assert_eq!(b.stats().endpoint.rx_malformed, 0);
        if impair.is_some() {
            let io = b.stats().io;
            assert!(io.impair_dropped > 0 && io.impair_duplicated > 0, "{io:?}");
        }
    }
}

/// Short WRITEs over a lossy socket: once the device has seen losses, each
/// is followed by repair packets, and the receiver rebuilds lost datagrams
/// from them, real bytes read back from where the others were placed
/// (directly, by the driver), instead of waiting for resends.
#[test]
fn lost_datagrams_of_short_writes_are_rebuilt_from_repair_packets() {
    const LEN: u32 = 8 * 4096;
    let lossy: Impair = "loss=0.03,seed=5".parse().unwrap();
    let (a, b, [(qa, ca, pa), (_qb, _cb, pb)]) =
        two_devices_with(4096, 4096, [None, None], true, |dc| {
            dc.impair = Some(lossy);
        });
    let src = a.with(|ctx, _| ctx.reg_mr(pa, u64::from(LEN), AccessFlags(0xf)).unwrap());
    let dst = b.with(|ctx, _| ctx.reg_mr(pb, u64::from(LEN), AccessFlags(0xf)).unwrap());
    for round in 0..300u64 {
        let pattern: Vec<u8> = (0..LEN as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7 ^ round) as u8)
            .collect();
        a.with(|ctx, _| ctx.mr_bytes_mut(&src).copy_from_slice(&pattern));
        write_and_wait(&a, qa, ca, &src, &dst, round);
        assert!(
            b.with(|ctx, _| ctx.mr_bytes(&dst) == &pattern[..]),
            "round {round}: the bytes differ"
        );
    }
    let (tx, rx) = (a.stats().endpoint, b.stats().endpoint);
    assert!(tx.repair_packets_sent > 0, "{tx:?}");
    assert!(rx.rx_repaired_packets > 0, "{rx:?}");
    assert_eq!(rx.rx_malformed, 0, "{rx:?}");
}

/// Two devices writing large messages to each other at once: each one's
/// receive queue holds the peer's data interleaved with the ACKs of its own,
/// and the data is still placed directly, not copied by the batch read
/// that takes over at the first ACK.
#[test]
fn direct_placement_holds_in_a_two_way_exchange() {
    const MTU: u32 = 60 << 10;
    const LEN: u32 = 4 << 20;
    const ROUNDS: u64 = 6;
    let (a, b, [(qa, ca, pa), (qb, cb, pb)]) = two_devices_omitting_icrc(MTU, |_| {});
    let len = u64::from(LEN);
    // Each side's region: its source in the first half, the peer's target
    // in the second.
    let ra = a.with(|ctx, _| ctx.reg_mr(pa, 2 * len, AccessFlags(0xf)).unwrap());
    let rb = b.with(|ctx, _| ctx.reg_mr(pb, 2 * len, AccessFlags(0xf)).unwrap());
    let pattern = |salt: u32| -> Vec<u8> { (0..LEN).map(|i| ((i ^ salt) % 251) as u8).collect() };
    a.with(|ctx, _| ctx.mr_bytes_mut(&ra)[..LEN as usize].copy_from_slice(&pattern(1)));
    b.with(|ctx, _| ctx.mr_bytes_mut(&rb)[..LEN as usize].copy_from_slice(&pattern(2)));
    for round in 0..ROUNDS {
        for (dev, qp, from, to) in [(&a, qa, &ra, &rb), (&b, qb, &rb, &ra)] {
            dev.with(|ctx, _| {
                let op = WrOp::Write {
                    remote_addr: to.addr + len,
                    rkey: to.rkey,
                };
                let wr = SendWr::new(round, op, vec![from.sge(0, LEN)]);
                ctx.post_send(qp, &[wr]).unwrap();
            });
        }
        for (dev, cq) in [(&a, ca), (&b, cb)] {
            let wc = wait_one(dev, cq);
            assert_eq!((wc.wr_id, wc.status), (round, WcStatus::Success), "{wc:?}");
        }
    }
    assert!(b.with(|ctx, _| ctx.mr_bytes(&rb)[LEN as usize..] == pattern(1)[..]));
    assert!(a.with(|ctx, _| ctx.mr_bytes(&ra)[LEN as usize..] == pattern(2)[..]));
    // Data datagrams each side received: at least the message's packets.
    let data = ROUNDS * len.div_ceil(u64::from(MTU));
    for (name, dev) in [("a", &a), ("b", &b)] {
        let io = dev.stats().io;
        eprintln!(
            "{name}: {} of {data} data datagrams placed directly ({io:?})",
            io.rx_direct
        );
        assert!(
            io.rx_direct * 4 >= data * 3,
            "{name}: only {} of {data} data datagrams placed directly",
            io.rx_direct
        );
    }
}

/// Reads into a guessed place (the next packet of the message placed
/// last, read without a peek): WRITEs in flight together, whose packets
/// interleave in the receive socket, and garbage sprayed at the device
/// port meanwhile make many guesses wrong; a wrong guess leaves its bytes
/// only where the message's own packets still have to come, so every
/// message arrives intact, and the bytes of the messages finished before
/// stay as they were.
#[test]
fn guessed_reads_that_miss_leave_received_bytes_intact() {
    const MTU: u32 = 60 << 10;
    const PART: u64 = 512 << 10;
    const PARTS: u64 = 8;
    let (a, b, [(qa, ca, pa), (_qb, _cb, pb)]) = two_devices_omitting_icrc(MTU, |_| {});
    let len = PART * PARTS;
    let src = a.with(|ctx, _| ctx.reg_mr(pa, len, AccessFlags(0xf)).unwrap());
    let dst = b.with(|ctx, _| ctx.reg_mr(pb, 2 * len, AccessFlags(0xf)).unwrap());
    let target = b.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let sprayer = std::thread::spawn(move || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut x = 0x0bad_cafe_f00d_1234u64;
        while !stop2.load(Ordering::Relaxed) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Up to 64 KiB: as long as a guessed packet, or longer.
            let n = (x % 65_000) as usize;
            let mut d: Vec<u8> = (0..n).map(|i| (x >> (i % 56)) as u8).collect();
            if d.len() > 4 {
                d[..4].copy_from_slice(&[1, 2, 0, 0]);
            }
            let _ = s.send_to(&d, target);
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
    });
    // The second half of the target: written once, first, and then left
    // alone: nothing afterwards may change it.
    let kept: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
    a.with(|ctx, _| ctx.mr_bytes_mut(&src).copy_from_slice(&kept));
    a.with(|ctx, _| {
        let op = WrOp::Write {
            remote_addr: dst.addr + len,
            rkey: dst.rkey,
        };
        ctx.post_send(qa, &[SendWr::new(100, op, vec![src.sge(0, len as u32)])])
            .unwrap();
    });
    let wc = wait_one(&a, ca);
    assert_eq!((wc.wr_id, wc.status), (100, WcStatus::Success), "{wc:?}");
    // Six rounds with all parts at once (their packets interleave, so
    // guesses miss and the device stops guessing), then four with one
    // part at a time (guesses hit again, so guessing comes back while the
    // sprayer keeps making some of them miss).
    for round in 0..10u64 {
        let pattern: Vec<u8> = (0..len)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 9 ^ round) as u8)
            .collect();
        a.with(|ctx, _| ctx.mr_bytes_mut(&src).copy_from_slice(&pattern));
        let write = |k: u64| {
            let op = WrOp::Write {
                remote_addr: dst.addr + k * PART,
                rkey: dst.rkey,
            };
            SendWr::new(k, op, vec![src.sge(k * PART, PART as u32)])
        };
        if round < 6 {
            a.with(|ctx, _| {
                let wrs: Vec<SendWr> = (0..PARTS).map(write).collect();
                ctx.post_send(qa, &wrs).unwrap();
            });
            for _ in 0..PARTS {
                let wc = wait_one(&a, ca);
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            }
        } else {
            for k in 0..PARTS {
                a.with(|ctx, _| ctx.post_send(qa, &[write(k)]).unwrap());
                let wc = wait_one(&a, ca);
                assert_eq!((wc.wr_id, wc.status), (k, WcStatus::Success), "{wc:?}");
            }
        }
        b.with(|ctx, _| {
            let got = ctx.mr_bytes(&dst);
            assert!(
                got[..len as usize] == pattern[..],
                "round {round}: the bytes differ"
            );
            assert!(
                got[len as usize..] == kept[..],
                "round {round}: finished bytes changed"
            );
        });
    }
    stop.store(true, Ordering::Relaxed);
    sprayer.join().unwrap();
    let io = b.stats().io;
    eprintln!(
        "placed {}, of them guessed {}; guesses missed {}",
        io.rx_direct, io.rx_direct_guessed, io.rx_direct_misguessed
    );
    // Reads at a guessed place were made, and every byte above survived
    // them. How many hit is not asserted: it depends on the order the
    // sender's paths deliver in, and a device that keeps missing stops
    // guessing until the guesses it keeps score of come true again.
    assert!(io.rx_direct_guessed + io.rx_direct_misguessed > 0, "{io:?}");
}

/// The clock the driver stamps everything with (`CLOCK_MONOTONIC` read
/// directly): never 0 (0 means "never" in the driver's state), never
/// backwards, and in step with `Instant`.
#[test]
fn now_ns_is_monotonic_and_in_step_with_instant() {
    let t0 = crate::now_ns();
    let i0 = std::time::Instant::now();
    assert!(t0 > 0);
    let mut last = t0;
    for _ in 0..10_000 {
        let t = crate::now_ns();
        assert!(t >= last, "{t} < {last}");
        last = t;
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    let dt = crate::now_ns() - t0;
    let di = i0.elapsed().as_nanos() as u64;
    assert!(dt >= 20_000_000, "{dt}");
    assert!(
        dt.abs_diff(di) < 5_000_000,
        "now_ns {dt} against Instant {di}"
    );
}
