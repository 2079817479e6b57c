//! Direct placement (`direct.rs`): a driver may receive a WRITE payload or
//! a READ response straight into its region, but only into bytes of an
//! open message that have not arrived. Driven by hand here: every data datagram `a` sends is
//! offered to `b` as a driver would (its headers, then the payload copied
//! into the buffer `b` names), and the refusals are checked one by one.

use metaroce_proto::Transmit;
use metaroce_proto::testing::{Pair, Side};
use metaroce_proto::{
    AccessFlags, Ecn, Endpoint, EndpointConfig, MrInfo, QpCaps, QpHandle, SendWr, Sge, WcStatus,
    WrOp,
};

const ALL: AccessFlags = AccessFlags(0xf);
const LEN: usize = 64 << 10;
const MTU: u32 = 8192;

fn end(ep: &mut Endpoint) -> (QpHandle, MrInfo) {
    let pd = ep.alloc_pd();
    let mr = ep
        .register_memory(pd, LEN as u64, AccessFlags::LOCAL_WRITE | ALL)
        .unwrap();
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
    };
    (ep.create_qp(pd, caps, ALL).unwrap(), mr)
}

fn pair(omit_icrc: bool) -> (Pair, QpHandle, MrInfo, MrInfo) {
    let (net, qa, _qb, mr_a, mr_b) = pair_both(omit_icrc);
    (net, qa, mr_a, mr_b)
}

fn pair_both(omit_icrc: bool) -> (Pair, QpHandle, QpHandle, MrInfo, MrInfo) {
    let cfg = |seed| EndpointConfig {
        paths_per_connection: 2,
        mtu_payload_bytes: MTU,
        accept_icrc_omitted: true,
        seed,
        ..EndpointConfig::default()
    };
    let mut net = Pair::new(Pair::A_IP, cfg(1), Pair::B_IP, cfg(2)).unwrap();
    let (qa, mr_a) = end(&mut net.a);
    let (_qb, mr_b) = end(&mut net.b);
    let (a, b) = (net.addr(Side::A), net.addr(Side::B));
    net.a.set_peer_icrc_omission(b, omit_icrc);
    net.b.set_peer_icrc_omission(a, omit_icrc);
    net.connect(qa, _qb).unwrap();
    net.set_now(1_000);
    (net, qa, _qb, mr_a, mr_b)
}

fn write(id: u64, from: &MrInfo, to: &MrInfo, rkey: u64) -> SendWr {
    SendWr::new(
        id,
        WrOp::Write {
            remote_addr: to.addr,
            rkey,
        },
        vec![Sge {
            addr: from.addr,
            length: LEN as u32,
            lkey: from.lkey,
        }],
    )
}

/// `from`'s datagrams, each offered to the other side for direct
/// placement as a driver would; returns how many it took that way (the
/// others are handled whole). A placed datagram's bytes are in: a copy of
/// it has no target.
fn offer_all(net: &mut Pair, from: Side) -> usize {
    offer_all_counting(net, from, false).0
}

/// [`offer_all`], optionally joining each ACK to the data datagram behind
/// it as the UDP driver coalesces them (wire.md 5.3); also counts the
/// placed datagrams that led with an ACK.
fn offer_all_counting(net: &mut Pair, from: Side, coalesce: bool) -> (usize, usize) {
    let src = net.addr(from);
    let mut placed = 0;
    let mut behind_ack = 0;
    let mut held: Option<(Transmit, Vec<u8>)> = None;
    let mut out = Vec::new();
    for (t, bytes) in net.poll_transmits(from) {
        let is_ack = !is_data(&bytes);
        match held.take() {
            Some((_, mut ack)) if !is_ack => {
                ack.extend_from_slice(&bytes);
                out.push((t, ack));
            }
            Some(h) => {
                out.push(h);
                held = Some((t, bytes));
            }
            None if coalesce && is_ack => held = Some((t, bytes)),
            None => out.push((t, bytes)),
        }
    }
    out.extend(held);
    for (t, bytes) in out {
        let now = net.now();
        let head = &bytes[..bytes.len().min(512)];
        let to = net.endpoint_mut(from.other());
        match to.direct_target(src, head, bytes.len()) {
            Some(target) => {
                let hl = target.header_len();
                let buf = to.direct_buffer(&target).expect("a target has a buffer");
                buf.copy_from_slice(&bytes[hl..hl + target.payload_len()]);
                to.handle_direct(now, src, Ecn::NotEct, &bytes[..hl], &target);
                assert!(
                    to.direct_target(src, head, bytes.len()).is_none(),
                    "a copy of a placed datagram had a target"
                );
                placed += 1;
                behind_ack += usize::from(metaroce_wire::first_packet_len(&bytes) < bytes.len());
            }
            None => net.deliver(from, &t, &bytes),
        }
    }
    (placed, behind_ack)
}

/// Whether a datagram's first packet is a data packet.
fn is_data(bytes: &[u8]) -> bool {
    metaroce_wire::BaseHeader::new_checked(bytes)
        .is_ok_and(|h| h.packet_type() == metaroce_wire::PacketType::Data as u8)
}

fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| (i % 249) as u8).collect()
}

#[test]
fn a_write_placed_directly_arrives_and_completes() {
    let (mut net, qa, mr_a, mr_b) = pair(true);
    net.a
        .memory_mut(mr_a.handle)
        .unwrap()
        .copy_from_slice(&pattern());
    net.a
        .post_send(qa, write(1, &mr_a, &mr_b, mr_b.rkey))
        .unwrap();
    // Round trips until the message is out (the first carries one packet,
    // the cold start).
    let mut placed = 0;
    for _ in 0..100 {
        placed += offer_all(&mut net, Side::A);
        net.advance(2_000);
        net.transfer(Side::B);
    }
    // The cold start's short packet (`cold_packet_bytes`), then full ones.
    assert_eq!(
        placed,
        LEN / MTU as usize + 1,
        "every data packet placed directly"
    );
    assert_eq!(net.b.memory(mr_b.handle).unwrap(), &pattern()[..]);
    assert!(net.settle(100, 5_000));
    let wc = net.a.poll_completion().expect("the WRITE completes").wc;
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    assert_eq!(net.b.stats().rx_malformed, 0);
}

#[test]
fn no_target_for_bytes_that_arrived_a_bad_rkey_an_icrc_to_check_or_a_stranger() {
    let (mut net, qa, mr_a, mr_b) = pair(true);
    let src = net.addr(Side::A);
    net.a
        .post_send(qa, write(1, &mr_a, &mr_b, mr_b.rkey))
        .unwrap();
    let sent = net.poll_transmits(Side::A);
    let (t, first) = &sent[0];
    let head = |b: &Vec<u8>| b[..256.min(b.len())].to_vec();
    // A stranger's datagram (another source address).
    let stranger = "10.0.0.9:4791".parse().unwrap();
    assert!(
        net.b
            .direct_target(stranger, &head(first), first.len())
            .is_none()
    );
    // Handled once: its bytes have arrived, a copy of it has no target.
    net.deliver(Side::A, t, first);
    assert!(
        net.b
            .direct_target(src, &head(first), first.len())
            .is_none()
    );
    // The next one does, once it is sent.
    net.advance(2_000);
    net.transfer(Side::B);
    let (_, next) = net.poll_transmits(Side::A).remove(0);
    assert!(net.b.direct_target(src, &head(&next), next.len()).is_some());

    // An rkey that names no region of b's: the WRITE would fail, so no
    // target (the packet goes the usual way and earns the NAK).
    let (mut net, qa, mr_a, mr_b) = pair(true);
    net.a
        .post_send(qa, write(1, &mr_a, &mr_b, mr_b.rkey ^ 0x100))
        .unwrap();
    let (_, bytes) = net.poll_transmits(Side::A).remove(0);
    assert!(
        net.b
            .direct_target(src, &head(&bytes), bytes.len())
            .is_none()
    );

    // Packets that carry an ICRC: their integrity is known only once the
    // payload is read, so never placed before.
    let (mut net, qa, mr_a, mr_b) = pair(false);
    net.a
        .post_send(qa, write(1, &mr_a, &mr_b, mr_b.rkey))
        .unwrap();
    let (_, bytes) = net.poll_transmits(Side::A).remove(0);
    assert!(
        net.b
            .direct_target(src, &head(&bytes), bytes.len())
            .is_none()
    );
}

#[test]
fn headers_that_changed_after_the_peek_drop_the_packet_and_it_comes_again() {
    let (mut net, qa, mr_a, mr_b) = pair(true);
    net.a
        .memory_mut(mr_a.handle)
        .unwrap()
        .copy_from_slice(&pattern());
    let src = net.addr(Side::A);
    net.a
        .post_send(qa, write(1, &mr_a, &mr_b, mr_b.rkey))
        .unwrap();
    let mut sent = net.poll_transmits(Side::A);
    let (t, bytes) = sent.remove(0);
    let target = net
        .b
        .direct_target(src, &bytes[..256], bytes.len())
        .unwrap();
    // The read brought another datagram: garbage where this one's payload
    // belongs, and headers that are not the peeked ones.
    net.b.direct_buffer(&target).unwrap().fill(0xee);
    let now = net.now();
    net.b
        .handle_direct(now, src, Ecn::NotEct, &[0u8; 8], &target);
    assert_eq!(net.b.stats().rx_malformed, 1);
    // The range is still to come: the same datagram has a target again,
    // and the rest of the message goes through.
    assert!(
        net.b
            .direct_target(src, &bytes[..256], bytes.len())
            .is_some()
    );
    net.deliver(Side::A, &t, &bytes);
    for (t, b) in sent {
        net.deliver(Side::A, &t, &b);
    }
    assert!(net.settle(100, 5_000));
    assert_eq!(net.b.memory(mr_b.handle).unwrap(), &pattern()[..]);
}

/// READ responses go straight into the READ's local buffer (and a copy of
/// one whose bytes arrived has no target, as `offer_all` checks).
#[test]
fn read_responses_placed_directly_complete_the_read() {
    let (mut net, qa, mr_a, mr_b) = pair(true);
    net.b
        .memory_mut(mr_b.handle)
        .unwrap()
        .copy_from_slice(&pattern());
    let read = WrOp::Read {
        remote_addr: mr_b.addr,
        rkey: mr_b.rkey,
    };
    let sge = Sge {
        addr: mr_a.addr,
        length: LEN as u32,
        lkey: mr_a.lkey,
    };
    net.a
        .post_send(qa, SendWr::new(7, read, vec![sge]))
        .unwrap();
    let mut placed = 0;
    for _ in 0..100 {
        net.transfer(Side::A);
        net.advance(2_000);
        placed += offer_all(&mut net, Side::B);
    }
    // The responder's connection starts cold too: a short first response.
    assert_eq!(
        placed,
        LEN / MTU as usize + 1,
        "every response placed directly"
    );
    assert_eq!(net.a.memory(mr_a.handle).unwrap(), &pattern()[..]);
    let wc = net.a.poll_completion().expect("the READ completes").wc;
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
}

/// Both sides write at once: each side's data carries, coalesced in front,
/// the ACK of what it received (wire.md 5.3). The ACK rides in the head and
/// is handled first; the payload behind it is still placed directly.
#[test]
fn data_behind_a_coalesced_ack_is_placed_directly() {
    let (mut net, qa, qb, mr_a, mr_b) = pair_both(true);
    net.a
        .memory_mut(mr_a.handle)
        .unwrap()
        .copy_from_slice(&pattern());
    let reversed: Vec<u8> = pattern().into_iter().rev().collect();
    net.b
        .memory_mut(mr_b.handle)
        .unwrap()
        .copy_from_slice(&reversed);
    // Each side writes its half of its region into the other half of the
    // peer's.
    let half = (LEN / 2) as u64;
    let wr = |from: &MrInfo, to: &MrInfo| {
        SendWr::new(
            7,
            WrOp::Write {
                remote_addr: to.addr + half,
                rkey: to.rkey,
            },
            vec![Sge {
                addr: from.addr,
                length: half as u32,
                lkey: from.lkey,
            }],
        )
    };
    net.a.post_send(qa, wr(&mr_a, &mr_b)).unwrap();
    net.b.post_send(qb, wr(&mr_b, &mr_a)).unwrap();
    let (mut placed, mut behind_ack) = (0, 0);
    for _ in 0..100 {
        for side in [Side::A, Side::B] {
            let (p, b) = offer_all_counting(&mut net, side, true);
            placed += p;
            behind_ack += b;
        }
        net.advance(2_000);
    }
    // Each side's cold start sends one short packet first.
    let packets = 2 * (LEN / 2 / MTU as usize + 1);
    assert_eq!(placed, packets, "every data packet placed directly");
    assert!(behind_ack > 0, "no data packet came behind an ACK");
    let h = LEN / 2;
    assert_eq!(&net.b.memory(mr_b.handle).unwrap()[h..], &pattern()[..h]);
    assert_eq!(&net.a.memory(mr_a.handle).unwrap()[h..], &reversed[..h]);
    assert!(net.settle(100, 5_000));
    for ep in [&mut net.a, &mut net.b] {
        let wc = ep.poll_completion().expect("the WRITE completes").wc;
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
        assert_eq!(ep.stats().rx_malformed, 0);
    }
}
