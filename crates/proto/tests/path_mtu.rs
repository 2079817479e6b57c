//! A QP's path MTU (`Endpoint::set_qp_path_mtu`) below the device's MTU:
//! its requests and the READ responses it returns are cut into packets of
//! the path MTU. (They were cut by the device MTU whatever the QP's path
//! MTU, and a path or peer carrying less dropped every packet: collnet's
//! all-reduce over veth with 60 KiB devices and 8 KiB paths ended in
//! retry-exceeded.)

use metaroce_proto::testing::{Pair, Side};
use metaroce_proto::{
    AccessFlags, Endpoint, EndpointConfig, MrInfo, QpCaps, QpError, QpHandle, SendWr, Sge,
    WcStatus, WrOp,
};

const DEVICE_MTU: u32 = 4096;
const PATH_MTU: u32 = 1024;
const ALL: AccessFlags = AccessFlags(0xf);

fn end(ep: &mut Endpoint) -> (QpHandle, MrInfo) {
    let pd = ep.alloc_pd();
    let mr = ep
        .register_memory(pd, 64 << 10, AccessFlags::LOCAL_WRITE | ALL)
        .unwrap();
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
    };
    (ep.create_qp(pd, caps, ALL).unwrap(), mr)
}

fn sge(mr: &MrInfo, offset: u64, length: u32) -> Sge {
    Sge {
        addr: mr.addr + offset,
        length,
        lkey: mr.lkey,
    }
}

#[test]
fn path_mtu_is_checked_against_the_device_mtu() {
    let cfg = EndpointConfig {
        mtu_payload_bytes: DEVICE_MTU,
        ..EndpointConfig::default()
    };
    let mut ep = Endpoint::new(cfg).unwrap();
    let (qp, _) = end(&mut ep);
    for bad in [0, 63, DEVICE_MTU + 1] {
        assert_eq!(ep.set_qp_path_mtu(qp, bad), Err(QpError::BadPathMtu(bad)));
    }
    ep.set_qp_path_mtu(qp, 64).unwrap();
    ep.set_qp_path_mtu(qp, DEVICE_MTU).unwrap();
}

#[test]
fn requests_and_read_responses_follow_the_qp_path_mtu() {
    let cfg = |seed| EndpointConfig {
        mtu_payload_bytes: DEVICE_MTU,
        paths_per_connection: 4,
        seed,
        ..EndpointConfig::default()
    };
    let mut net = Pair::new(Pair::A_IP, cfg(1), Pair::B_IP, cfg(2)).unwrap();
    let (qa, mr_a) = end(&mut net.a);
    let (qb, mr_b) = end(&mut net.b);
    net.a.set_qp_path_mtu(qa, PATH_MTU).unwrap();
    net.b.set_qp_path_mtu(qb, PATH_MTU).unwrap();
    net.connect(qa, qb).unwrap();
    net.record(true);
    net.set_now(1_000);
    let limit = net.a.datagram_len_for_payload(PATH_MTU);

    for (i, b) in net
        .a
        .memory_mut(mr_a.handle)
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        *b = (i % 251) as u8;
    }
    let write = WrOp::Write {
        remote_addr: mr_b.addr,
        rkey: mr_b.rkey,
    };
    net.a
        .post_send(qa, SendWr::new(1, write, vec![sge(&mr_a, 0, 10_000)]))
        .unwrap();
    // READ it back into the second half of a's region.
    let read = WrOp::Read {
        remote_addr: mr_b.addr,
        rkey: mr_b.rkey,
    };
    net.a
        .post_send(qa, SendWr::new(2, read, vec![sge(&mr_a, 32 << 10, 10_000)]))
        .unwrap();
    assert!(net.settle(1000, 5_000), "the pair never went quiet");

    let wcs: Vec<_> = std::iter::from_fn(|| net.a.poll_completion())
        .map(|c| (c.wc.wr_id, c.wc.status))
        .collect();
    assert_eq!(wcs, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    let a_mem = net.a.memory(mr_a.handle).unwrap();
    assert_eq!(
        net.b.memory(mr_b.handle).unwrap()[..10_000],
        a_mem[..10_000]
    );
    assert_eq!(a_mem[32 << 10..(32 << 10) + 10_000], a_mem[..10_000]);
    for side in [Side::A, Side::B] {
        let sent = net.sent(side);
        let longest = sent.iter().map(Vec::len).max().unwrap_or(0);
        assert!(
            longest <= limit,
            "{side:?} sent a {longest}-byte datagram; a {PATH_MTU}-byte path MTU makes {limit}"
        );
        assert!(
            sent.len() >= 10_000 / PATH_MTU as usize,
            "{side:?} sent {} datagrams",
            sent.len()
        );
    }
}
