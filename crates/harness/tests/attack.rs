//! An attacker on the fabric: issue "robustness and security", what must be
//! shown. `cargo test attack` runs these.
//!
//! Three devices on the deterministic network: a genuine requester (node 0)
//! writes several MiB into a target (node 1), and an attacker (node 2) that
//! knows every address, port and QP number but not the job secret:
//! - forges WRITEs that spoof the requester's address, with guessed rkeys and
//!   with the real one, as plain ICRC packets and with made-up tags;
//! - replays datagrams it captured on the wire, as they were and modified;
//! - forges ACKs toward the requester, spoofing the target;
//! - points its own endpoint at the target's QP and writes with guessed rkeys.
//!
//! With authentication on, nothing it sends is acted on: every datagram it
//! gets delivered is counted under one reject counter, the transfer completes
//! with the right bytes and no other byte of the target's memory changes.
//! Without authentication, a spoofer's packets do reach the responder, and
//! there the random 44 bits of the rkey stop it.

use metaroce_harness::rdma::*;
use metaroce_harness::*;
use metaroce_verbs::*;
use metaroce_wire::{
    AckRepr, AuthRepr, AuthTrailer, BaseRepr, DataRepr, Flags, OpHeader, emit_ack, emit_data,
};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

const GENUINE: usize = 0;
const TARGET: usize = 1;
const ATTACKER: usize = 2;

const JOB_SECRET: [u8; 32] = *b"job 42 secret, shared by its ran";
const ATTACKER_SECRET: [u8; 32] = *b"a guess at the job secret, wrong";

const MIB: u64 = 1 << 20;
/// The target region, and where in it the genuine WRITE lands.
const REGION_BYTES: u64 = 12 * MIB;
const TRANSFER_OFFSET: u64 = 2 * MIB;
const TRANSFER_BYTES: u64 = 8 * MIB;

fn config(secret: Option<[u8; 32]>, encrypt: bool) -> EndpointConfig {
    let mut cfg = EndpointConfig {
        auth: secret.map(|job_secret| AuthConfig {
            job_secret,
            encrypt,
            // RdmaNode::new puts each node's own address here.
            local_ip: node_ip(0),
        }),
        ..EndpointConfig::default()
    };
    // A full window from the start: the attacker's rounds are counted
    // against a transfer that is in full flight from its first packet.
    cfg.cc_params.initial_window_mss = 0;
    cfg
}

fn network(seed: u64, genuine: &EndpointConfig, attacker: &EndpointConfig) -> Network<RdmaNode> {
    let mut nodes = devices(2, genuine, seed);
    let mut attacker = attacker.clone();
    attacker.seed = seed ^ 0xbad;
    nodes.push(RdmaNode::new(node_ip(ATTACKER), attacker));
    let net_cfg = NetConfig::seeded(seed).with_link(LinkConfig {
        jitter_ns: 2_000,
        jitter_period_ns: 20_000,
        ..LinkConfig::default()
    });
    Network::new(net_cfg, nodes)
}

fn pattern(ctx: &mut Context, mr: &MemoryRegion, seed: u64) {
    let mut x = seed | 1;
    for b in ctx.mr_bytes_mut(mr) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

fn reg(net: &mut Network<RdmaNode>, node: usize, pd: ProtectionDomain, len: u64) -> MemoryRegion {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    net.nodes[node].ctx.reg_mr(pd, len, access).unwrap()
}

/// A WRITE data packet as the attacker builds it: valid on the wire,
/// claiming to come from `src_device_port`'s path 0.
fn forged_write(
    flags: Flags,
    dst_qpn: u32,
    msg_seq: u32,
    psn: u32,
    rkey: u64,
    remote_addr: u64,
    payload: &[u8],
) -> Vec<u8> {
    let repr = DataRepr {
        base: BaseRepr {
            flags,
            path_slot: 0,
            path_gen: 0,
            src_device_port: DEFAULT_DEVICE_PORT,
        },
        psn,
        timestamp_ns: 0,
        dst_qpn,
        msg_seq,
        solicited: false,
        // Slides the receiver's path window up to this PSN: with a genuine
        // source the packet is always in window (PSNs are not a barrier).
        psn_floor_delta: 0,
        floor_acked: false,
        msg_len: payload.len() as u32,
        offset: 0,
        op: OpHeader::Write { rkey, remote_addr },
        payload_len: payload.len() as u32,
    };
    let mut buf = vec![0; repr.buffer_len()];
    emit_data(&repr, payload, &mut buf);
    buf
}

/// Fill an authentication trailer with a made-up packet number and tag.
fn fake_tag(mut datagram: Vec<u8>, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut tag = [0u8; 16];
    rng.fill_bytes(&mut tag);
    AuthRepr {
        packet_number: rng.next_u64() >> 1,
        tag,
    }
    .emit(&mut AuthTrailer::new_unchecked(&mut datagram[..]));
    datagram
}

/// A guessed rkey: the region index is small and easy to guess, the low 44
/// bits are random.
fn guessed_rkey(real: u64, rng: &mut ChaCha8Rng) -> u64 {
    (real & !((1 << 44) - 1)) | (rng.next_u64() & ((1 << 44) - 1))
}

fn spoofed(src: SocketAddr, dst: SocketAddr, payload: Vec<u8>) -> Datagram {
    Datagram {
        src,
        dst,
        ecn: Ecn::Ect0,
        payload,
    }
}

/// Datagrams delivered between genuine nodes, as the attacker sees them on
/// the wire; and how many of the attacker's own reached each node.
#[derive(Default)]
struct Wire {
    to_target: Vec<Vec<u8>>,
    to_genuine: Vec<Vec<u8>>,
    attacker_delivered: [u64; 3],
}

fn capture(net: &mut Network<RdmaNode>) -> Rc<RefCell<Wire>> {
    let wire = Rc::new(RefCell::new(Wire::default()));
    let w = wire.clone();
    net.set_tap(Box::new(move |e: &TapEvent<'_>| {
        if e.fate != Fate::Delivered {
            return;
        }
        let mut w = w.borrow_mut();
        match (e.src_node, e.dst_node) {
            (GENUINE, Some(TARGET)) => w.to_target.push(e.payload.to_vec()),
            (TARGET, Some(GENUINE)) => w.to_genuine.push(e.payload.to_vec()),
            (ATTACKER, Some(dst)) => w.attacker_delivered[dst] += 1,
            _ => {}
        }
    }));
    wire
}

/// The attacker's own endpoint, pointed at the target's QP (the target never
/// connected to it), posting WRITEs with guessed rkeys.
fn attacker_writes(net: &mut Network<RdmaNode>, target_qpn: u32, dst: &MemoryRegion, seed: u64) {
    let target_addr = net.nodes[TARGET].addr();
    let target_session = net.nodes[TARGET].ctx.session_id();
    let ctx = &mut net.nodes[ATTACKER].ctx;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1024).unwrap();
    let src = ctx.reg_mr(pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    ctx.mr_bytes_mut(&src).fill(0x66);
    let init = QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: QpCaps {
            max_send_wr: 64,
            max_recv_wr: 1,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    let qp = ctx.create_qp(pd, &init).unwrap();
    let to = |s| QpAttr {
        qp_state: Some(s),
        ..QpAttr::default()
    };
    ctx.modify_qp(
        qp,
        &QpAttr {
            qp_access_flags: Some(AccessFlags::NONE),
            port_num: Some(1),
            ..to(QpState::Init)
        },
    )
    .unwrap();
    // Session ids travel in the clear through the connection manager: the
    // attacker may know the target's. It still lacks the job secret.
    ctx.set_peer_session(target_addr, target_session).unwrap();
    ctx.modify_qp(
        qp,
        &QpAttr {
            dest_addr: Some(target_addr),
            dest_qp_num: Some(target_qpn),
            path_mtu: Some(4096),
            ..to(QpState::Rtr)
        },
    )
    .unwrap();
    ctx.modify_qp(
        qp,
        &QpAttr {
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            ..to(QpState::Rts)
        },
    )
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let wrs: Vec<SendWr> = (0..32)
        .map(|i| {
            SendWr::new(
                i,
                WrOp::Write {
                    remote_addr: dst.addr + 10 * MIB + i * 4096,
                    rkey: guessed_rkey(dst.rkey, &mut rng),
                },
                vec![src.sge(0, 4096)],
            )
        })
        .collect();
    ctx.post_send(qp, &wrs).unwrap();
}

fn attack_with_auth(encrypt: bool) {
    let guard = SeedGuard::from_env_or(61 + u64::from(encrypt));
    let seed = guard.seed();
    let mut net = network(
        seed,
        &config(Some(JOB_SECRET), encrypt),
        &config(Some(ATTACKER_SECRET), encrypt),
    );
    let (a, b) = connect_qps(&mut net, GENUINE, TARGET, AccessFlags::REMOTE_WRITE);
    let src = reg(&mut net, GENUINE, a.pd, TRANSFER_BYTES);
    let dst = reg(&mut net, TARGET, b.pd, REGION_BYTES);
    // A second region the genuine peer never uses, to guess keys against.
    let other = reg(&mut net, TARGET, b.pd, MIB);
    pattern(&mut net.nodes[GENUINE].ctx, &src, seed);
    pattern(&mut net.nodes[TARGET].ctx, &dst, seed ^ 1);
    pattern(&mut net.nodes[TARGET].ctx, &other, seed ^ 2);
    let dst_before = net.nodes[TARGET].ctx.mr_bytes(&dst).to_vec();
    let other_before = net.nodes[TARGET].ctx.mr_bytes(&other).to_vec();
    let wire = capture(&mut net);
    attacker_writes(&mut net, b.qp.qp_num(), &dst, seed);

    let wr = SendWr::new(
        7,
        WrOp::Write {
            remote_addr: dst.addr + TRANSFER_OFFSET,
            rkey: dst.rkey,
        },
        vec![src.sge(0, TRANSFER_BYTES as u32)],
    );
    net.nodes[GENUINE].ctx.post_send(a.qp, &[wr]).unwrap();

    let genuine_addr = net.nodes[GENUINE].addr();
    let target_addr = net.nodes[TARGET].addr();
    // Spoofed sources: the genuine devices' IPs, on one of their path ports.
    let as_genuine = SocketAddr::new(genuine_addr.ip(), DEFAULT_DEVICE_PORT);
    let as_target = SocketAddr::new(target_addr.ip(), 4795);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xa77ac);
    let mut completions = Vec::new();
    let mut rounds = 0;
    while completions.is_empty() {
        rounds += 1;
        assert!(rounds < 2_000, "the transfer did not complete under attack");
        net.run_for(10_000);
        completions.extend(poll_all(&mut net.nodes[GENUINE].ctx, a.cq));
        let qpn = b.qp.qp_num();
        let psn = rng.next_u32();
        let aim = dst.addr + 10 * MIB + (rng.next_u64() % MIB);
        let junk = vec![0x66; 512];
        let mut attack = Vec::new();
        // Plain ICRC packets where tags are required, even with the real rkey.
        for rkey in [dst.rkey, guessed_rkey(dst.rkey, &mut rng)] {
            let bytes = forged_write(Flags::empty(), qpn, 0, psn, rkey, aim, &junk);
            attack.push(spoofed(as_genuine, target_addr, bytes));
        }
        // Authenticated-looking packets with made-up tags.
        for rkey in [dst.rkey, other.rkey, guessed_rkey(other.rkey, &mut rng)] {
            let msg_seq = rng.next_u32() % 4;
            let bytes = forged_write(Flags::AUTHENTICATED, qpn, msg_seq, psn, rkey, aim, &junk);
            attack.push(spoofed(as_genuine, target_addr, fake_tag(bytes, &mut rng)));
        }
        // Forged ACKs toward the requester, spoofing the target: if taken,
        // an ACK could complete the WRITE before its bytes arrived.
        let mut ack = AckRepr::new(BaseRepr {
            flags: Flags::AUTHENTICATED,
            path_slot: (rng.next_u32() % 16) as u8,
            path_gen: 0,
            src_device_port: DEFAULT_DEVICE_PORT,
        });
        ack.ack_psn = psn;
        let mut ack_bytes = vec![0; ack.buffer_len()];
        emit_ack(&ack, &mut ack_bytes);
        attack.push(spoofed(
            as_target,
            genuine_addr,
            fake_tag(ack_bytes, &mut rng),
        ));
        // Garbage.
        attack.push(spoofed(as_genuine, target_addr, vec![1, 1, 0x08, 0]));
        // Replays of captured traffic, both ways: as captured (the replay
        // window catches them), and modified, with one bit flipped and a
        // fresh packet number so that they pass the window (the tag catches
        // them).
        {
            let w = wire.borrow();
            for captured in w.to_target.iter().rev().take(3) {
                attack.push(spoofed(as_genuine, target_addr, captured.clone()));
                let mut modified = captured.clone();
                let at = 40 + rng.next_u64() as usize % (modified.len() - 64);
                modified[at] ^= 1 << (rng.next_u32() % 8);
                let mut trailer = AuthTrailer::new_unchecked(&mut modified[..]);
                trailer.set_packet_number(trailer.packet_number() + 1_000_000 + rounds);
                attack.push(spoofed(as_genuine, target_addr, modified));
            }
            if let Some(captured) = w.to_genuine.last() {
                attack.push(spoofed(as_target, genuine_addr, captured.clone()));
            }
            // An old packet, replayed long after: below the window, or seen.
            if w.to_target.len() > 100 && rounds % 10 == 0 {
                attack.push(spoofed(as_genuine, target_addr, w.to_target[5].clone()));
            }
        }
        for datagram in attack {
            net.inject(ATTACKER, datagram);
        }
    }
    // Let the last forgeries arrive and the attacker's endpoint give up.
    net.run_for(2_000_000_000);

    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0].status, WcStatus::Success);
    let dst_after = net.nodes[TARGET].ctx.mr_bytes(&dst).to_vec();
    let range = TRANSFER_OFFSET as usize..(TRANSFER_OFFSET + TRANSFER_BYTES) as usize;
    assert!(
        dst_after[range.clone()] == *net.nodes[GENUINE].ctx.mr_bytes(&src),
        "the genuine bytes did not arrive intact"
    );
    assert!(
        dst_after[..range.start] == dst_before[..range.start]
            && dst_after[range.end..] == dst_before[range.end..],
        "bytes outside the genuine WRITE changed"
    );
    assert!(
        net.nodes[TARGET].ctx.mr_bytes(&other) == other_before.as_slice(),
        "the unused region changed"
    );

    let t = *net.nodes[TARGET].ctx.stats();
    let g = *net.nodes[GENUINE].ctx.stats();
    let w = wire.borrow();
    eprintln!(
        "encrypt={encrypt}: {rounds} attack rounds; target rejected: {} unauthenticated, {} bad tag, {} replayed, {} unknown peer, {} malformed; requester rejected: {} bad tag, {} replayed",
        t.rx_unauthenticated,
        t.rx_auth_failed,
        t.rx_replayed,
        t.rx_unknown_peer,
        t.rx_malformed,
        g.rx_auth_failed,
        g.rx_replayed
    );
    // Every datagram of the attacker that reached a node was dropped under
    // exactly one reject counter; genuine traffic added to none of them.
    assert_eq!(
        w.attacker_delivered[TARGET],
        t.rx_unauthenticated
            + t.rx_auth_failed
            + t.rx_replayed
            + t.rx_unknown_peer
            + t.rx_malformed
    );
    assert_eq!(
        w.attacker_delivered[GENUINE],
        g.rx_unauthenticated
            + g.rx_auth_failed
            + g.rx_replayed
            + g.rx_unknown_peer
            + g.rx_malformed
    );
    assert!(t.rx_unauthenticated >= 2 * rounds);
    assert!(t.rx_auth_failed >= 6 * rounds);
    assert!(t.rx_replayed >= rounds);
    assert!(t.rx_unknown_peer >= 32, "the attacker's own WRITEs");
    assert!(g.rx_auth_failed >= rounds, "forged ACKs");
    assert!(g.rx_replayed > 0, "replayed ACKs");
    // Nothing forged got as far as a memory check.
    assert_eq!(t.rx_remote_access_denied, 0);
    assert_eq!(t.naks_sent, 0);
}

#[test]
fn attack_on_authenticated_transfer_is_rejected_and_counted() {
    attack_with_auth(false);
}

#[test]
fn attack_on_encrypted_transfer_is_rejected_and_counted() {
    attack_with_auth(true);
}

/// Without authentication a spoofer's WRITE reaches the responder's memory
/// checks. One QP per guess (a wrong rkey moves the responder QP to the
/// error state, as in ibverbs, so each QP gives one guess): each guess has a
/// 2^-44 chance, and none lands.
#[test]
fn attack_without_auth_rkey_guessing_fails() {
    let guard = SeedGuard::from_env_or(63);
    let seed = guard.seed();
    const QPS: usize = 64;
    let plain = config(None, false);
    let mut net = network(seed, &plain, &plain);
    let target_pd = net.nodes[TARGET].ctx.alloc_pd();
    let mut target_qps = Vec::new();
    for _ in 0..QPS {
        let (_, b) = connect_qps_in(
            &mut net,
            (GENUINE, None),
            (TARGET, Some(target_pd)),
            AccessFlags::REMOTE_WRITE,
        );
        target_qps.push(b);
    }
    let dst = reg(&mut net, TARGET, target_pd, MIB);
    pattern(&mut net.nodes[TARGET].ctx, &dst, seed);
    let before = net.nodes[TARGET].ctx.mr_bytes(&dst).to_vec();
    let wire = capture(&mut net);

    let target_addr = net.nodes[TARGET].addr();
    let as_genuine = SocketAddr::new(net.nodes[GENUINE].addr().ip(), DEFAULT_DEVICE_PORT);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e55);
    let guesses_per_qp = 4;
    for b in &target_qps {
        for _ in 0..guesses_per_qp {
            let rkey = guessed_rkey(dst.rkey, &mut rng);
            assert_ne!(rkey, dst.rkey, "a 2^-44 event");
            let aim = dst.addr + (rng.next_u64() % (MIB - 64));
            let bytes = forged_write(
                Flags::empty(),
                b.qp.qp_num(),
                0,
                rng.next_u32(),
                rkey,
                aim,
                &[0x66; 64],
            );
            net.inject(ATTACKER, spoofed(as_genuine, target_addr, bytes));
        }
        net.run_for(20_000);
    }
    net.run_for(10_000_000);

    assert!(
        net.nodes[TARGET].ctx.mr_bytes(&dst) == before.as_slice(),
        "a guessed rkey wrote memory"
    );
    let t = *net.nodes[TARGET].ctx.stats();
    eprintln!(
        "{} spoofed WRITEs delivered: {} refused by the memory checks, {} fatal NAKs",
        wire.borrow().attacker_delivered[TARGET],
        t.rx_remote_access_denied,
        t.naks_sent
    );
    assert_eq!(
        wire.borrow().attacker_delivered[TARGET],
        (QPS * guesses_per_qp) as u64
    );
    // The first guess on each QP reached the key check and failed; the QP
    // then went to the error state and ignores the rest.
    assert_eq!(t.rx_remote_access_denied, QPS as u64);
    assert_eq!(t.naks_sent, QPS as u64);
    for b in &target_qps {
        assert_eq!(net.nodes[TARGET].ctx.qp_state(b.qp), Some(QpState::Err));
    }
}
