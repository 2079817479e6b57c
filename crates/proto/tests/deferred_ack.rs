//! Deferred ACKs (`EndpointConfig::deferred_ack_ns`): the ACK that
//! completes an unsignaled request waits for data going back to the
//! requester, and rides ahead of it; with no such data it goes when the
//! deferral ends, and the requester's tail-loss probe waits for that. A
//! signaled request is acknowledged at once, as without the option.

use metaroce_proto::testing::{Pair, Side};
use metaroce_proto::{
    AccessFlags, Endpoint, EndpointConfig, MrInfo, QpCaps, QpHandle, SendWr, WcStatus, WrOp,
};

const DEFER_NS: u64 = 200_000;
const ALL: AccessFlags = AccessFlags(0xf);

fn end(ep: &mut Endpoint) -> (QpHandle, MrInfo) {
    let pd = ep.alloc_pd();
    let mr = ep
        .register_memory(pd, 4096, AccessFlags::LOCAL_WRITE | ALL)
        .unwrap();
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
    };
    (ep.create_qp(pd, caps, ALL).unwrap(), mr)
}

fn pair(deferred_ack_ns: u64) -> (Pair, QpHandle, MrInfo, QpHandle, MrInfo) {
    let cfg = |seed| EndpointConfig {
        paths_per_connection: 2,
        deferred_ack_ns,
        // The ACKs are counted: no copy of the answer to the first packet.
        ack_copy_horizon_ns: 0,
        seed,
        ..EndpointConfig::default()
    };
    let mut net = Pair::new(Pair::A_IP, cfg(1), Pair::B_IP, cfg(2)).unwrap();
    let (qa, mr_a) = end(&mut net.a);
    let (qb, mr_b) = end(&mut net.b);
    net.connect(qa, qb).unwrap();
    net.set_now(1_000);
    (net, qa, mr_a, qb, mr_b)
}

/// An 8-byte inline WRITE from `from` into `to`'s region.
fn write(id: u64, to: &MrInfo, signaled: bool) -> SendWr {
    let mut wr = SendWr::inline(
        id,
        WrOp::Write {
            remote_addr: to.addr,
            rkey: to.rkey,
        },
        vec![7; 8],
    );
    wr.signaled = signaled;
    wr
}

fn acks_sent(net: &Pair, side: Side) -> u64 {
    net.endpoint(side).stats().ack_packets_sent
}

#[test]
fn an_unsignaled_write_s_ack_rides_on_the_data_going_back() {
    let (mut net, qa, mr_a, qb, mr_b) = pair(DEFER_NS);
    net.a.post_send(qa, write(1, &mr_b, false)).unwrap();
    assert_eq!(net.transfer(Side::A), 1);
    assert_eq!(net.b.memory(mr_b.handle).unwrap()[..8], [7; 8]);
    // B holds the ACK: nothing to send, a deadline a deferral away.
    net.advance(10_000);
    assert_eq!(net.transfer(Side::B), 0, "B acknowledged at once");
    assert_eq!(acks_sent(&net, Side::B), 0);
    let deadline = net.b.poll_timeout().expect("the held ACK's deadline");
    assert!(deadline >= 1_000 + DEFER_NS, "deadline {deadline}");
    // B writes back: the ACK goes with that data, not after the deferral.
    net.b.post_send(qb, write(2, &mr_a, false)).unwrap();
    let sent = net.transfer(Side::B);
    assert!(sent >= 1);
    assert_eq!(acks_sent(&net, Side::B), 1);
    assert_eq!(net.a.memory(mr_a.handle).unwrap()[..8], [7; 8]);
    // A's write is acknowledged: nothing of it is left to probe.
    assert_eq!(net.a.stats().tail_probes, 0);
    assert!(net.settle(100, 5_000));
    assert_eq!(net.a.stats().tail_probes + net.b.stats().tail_probes, 0);
    assert_eq!(net.a.stats().data_packets_retransmitted, 0);
}

#[test]
fn a_held_ack_goes_alone_when_the_deferral_ends_and_no_probe_fires_first() {
    let (mut net, qa, _mr_a, _qb, mr_b) = pair(DEFER_NS);
    net.a.post_send(qa, write(1, &mr_b, false)).unwrap();
    assert_eq!(net.transfer(Side::A), 1);
    assert!(net.settle(100, 5_000), "the pair never went quiet");
    assert_eq!(acks_sent(&net, Side::B), 1);
    assert!(
        net.now() >= 1_000 + DEFER_NS,
        "acknowledged at {}",
        net.now()
    );
    // The requester allowed for the wait: no probe, no timeout, no resend.
    let a = net.a.stats();
    assert_eq!(
        (a.tail_probes, a.rtos, a.data_packets_retransmitted),
        (0, 0, 0)
    );
}

#[test]
fn a_signaled_write_is_acknowledged_at_once() {
    let (mut net, qa, _mr_a, _qb, mr_b) = pair(DEFER_NS);
    net.a.post_send(qa, write(1, &mr_b, true)).unwrap();
    assert_eq!(net.transfer(Side::A), 1);
    assert_eq!(net.transfer(Side::B), 1);
    assert_eq!(acks_sent(&net, Side::B), 1);
    let wc = net.a.poll_completion().expect("a completion").wc;
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
}

#[test]
fn without_the_option_an_unsignaled_write_is_acknowledged_at_once() {
    let (mut net, qa, _mr_a, _qb, mr_b) = pair(0);
    net.a.post_send(qa, write(1, &mr_b, false)).unwrap();
    assert_eq!(net.transfer(Side::A), 1);
    assert_eq!(net.transfer(Side::B), 1);
    assert_eq!(acks_sent(&net, Side::B), 1);
}

#[test]
fn a_lost_deferred_write_is_recovered() {
    let (mut net, qa, _mr_a, _qb, mr_b) = pair(DEFER_NS);
    // The first datagram A sends is lost.
    net.set_filter(Some(Box::new(|hop: &metaroce_proto::testing::Hop<'_>| {
        if hop.from == Side::A && hop.index == 0 {
            metaroce_proto::testing::Fate::Drop
        } else {
            metaroce_proto::testing::Fate::Deliver
        }
    })));
    net.a.post_send(qa, write(1, &mr_b, false)).unwrap();
    assert!(net.settle(1000, 5_000), "the pair never went quiet");
    assert_eq!(net.b.memory(mr_b.handle).unwrap()[..8], [7; 8]);
    assert!(net.a.stats().data_packets_retransmitted >= 1);
}
