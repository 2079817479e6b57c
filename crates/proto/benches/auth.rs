//! The per-packet cost of packet authentication.
//!
//! `endpoint_4k/{plain,authenticated,encrypted}`: one 4 KiB data packet of a
//! stream of WRITEs between two endpoints, sender and receiver together:
//! `poll_transmit` at A (emit, gather the payload, ICRC or seal) and
//! `handle_datagram` at B (parse, ICRC or replay window + tag check and
//! decryption, placement), with B's ACKs handed back to A (their cost,
//! about one ACK per four data packets, is included). The difference
//! between the variants is what authentication, and encryption, cost per
//! packet on top of the plain ICRC path.
//!
//! ```text
//! cargo bench -p metaroce-proto --bench auth
//! ```

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use metaroce_proto::{
    AccessFlags, AuthConfig, Endpoint, EndpointConfig, MrInfo, QpCaps, QpHandle, SendWr, Sge,
    WcStatus, WrOp,
};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const A_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const PORT: u16 = 4791;
const MTU: u32 = 4096;
/// One WRITE: 256 packets.
const WRITE_BYTES: u32 = 256 * MTU;

#[derive(Clone, Copy)]
enum Mode {
    Plain,
    Authenticated,
    Encrypted,
}

fn config(ip: IpAddr, seed: u64, mode: Mode) -> EndpointConfig {
    let auth = |encrypt| {
        Some(AuthConfig {
            job_secret: [9; 32],
            encrypt,
            local_ip: ip,
        })
    };
    EndpointConfig {
        device_port: PORT,
        mtu_payload_bytes: MTU,
        seed,
        auth: match mode {
            Mode::Plain => None,
            Mode::Authenticated => auth(false),
            Mode::Encrypted => auth(true),
        },
        ..EndpointConfig::default()
    }
}

struct Side {
    ep: Endpoint,
    qp: QpHandle,
    mr: MrInfo,
}

fn side(ip: IpAddr, seed: u64, mode: Mode) -> Side {
    let mut ep = Endpoint::new(config(ip, seed, mode)).expect("valid config");
    let pd = ep.alloc_pd();
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = ep
        .register_memory(pd, u64::from(WRITE_BYTES), rights)
        .expect("register");
    for (i, b) in ep
        .memory_mut(mr.handle)
        .expect("bytes")
        .iter_mut()
        .enumerate()
    {
        *b = (i as u8).wrapping_mul(7);
    }
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
    };
    let qp = ep.create_qp(pd, caps, rights).expect("QP");
    Side { ep, qp, mr }
}

struct Pair {
    a: Side,
    b: Side,
    now: u64,
    outstanding: usize,
    buf: Vec<u8>,
    acks: Vec<(SocketAddr, Vec<u8>)>,
}

impl Pair {
    fn new(mode: Mode) -> Self {
        let mut a = side(A_IP, 1, mode);
        let mut b = side(B_IP, 2, mode);
        let (a_addr, b_addr) = (SocketAddr::new(A_IP, PORT), SocketAddr::new(B_IP, PORT));
        let (sa, sb) = (a.ep.session_id(), b.ep.session_id());
        a.ep.set_peer_session(b_addr, sb).expect("session");
        b.ep.set_peer_session(a_addr, sa).expect("session");
        a.ep.connect_qp(a.qp, b_addr, b.qp.qpn()).expect("connect");
        b.ep.connect_qp(b.qp, a_addr, a.qp.qpn()).expect("connect");
        let buf = vec![0; a.ep.max_datagram_len()];
        Self {
            a,
            b,
            now: 1_000_000,
            outstanding: 0,
            buf,
            acks: Vec::new(),
        }
    }

    /// Keep two WRITEs posted.
    fn top_up(&mut self) {
        while let Some(c) = self.a.ep.poll_completion() {
            assert_eq!(c.wc.status, WcStatus::Success);
            self.outstanding -= 1;
        }
        while self.outstanding < 2 {
            let wr = SendWr::new(
                0,
                WrOp::Write {
                    remote_addr: self.b.mr.addr,
                    rkey: self.b.mr.rkey,
                },
                vec![Sge {
                    addr: self.a.mr.addr,
                    length: WRITE_BYTES,
                    lkey: self.a.mr.lkey,
                }],
            );
            self.a
                .ep
                .post_send_at(self.now, self.a.qp, wr)
                .expect("post");
            self.outstanding += 1;
        }
    }

    /// Move every data packet A may send now to B, and B's ACKs back;
    /// returns the timed duration and the data packets moved.
    fn round(&mut self) -> (Duration, u64) {
        self.top_up();
        let start = Instant::now();
        let mut moved = 0;
        while let Some(t) = self.a.ep.poll_transmit(self.now, &mut self.buf) {
            let src = SocketAddr::new(A_IP, t.src_port);
            self.b
                .ep
                .handle_datagram(self.now, src, t.ecn, black_box(&self.buf[..t.len]));
            moved += 1;
        }
        self.now += 5_000;
        let mut ack_count = 0;
        while let Some(t) = self.b.ep.poll_transmit(self.now, &mut self.buf) {
            let src = SocketAddr::new(B_IP, t.src_port);
            if self.acks.len() <= ack_count {
                self.acks.push((src, Vec::new()));
            }
            let slot = &mut self.acks[ack_count];
            slot.0 = src;
            slot.1.clear();
            slot.1.extend_from_slice(&self.buf[..t.len]);
            ack_count += 1;
        }
        for (src, ack) in &self.acks[..ack_count] {
            self.a
                .ep
                .handle_datagram(self.now, *src, Default::default(), ack);
        }
        let elapsed = start.elapsed();
        self.now += 5_000;
        self.a.ep.handle_timeout(self.now);
        self.b.ep.handle_timeout(self.now);
        (elapsed, moved)
    }
}

fn endpoint_4k(c: &mut Criterion) {
    let mut group = c.benchmark_group("endpoint_4k");
    group.throughput(Throughput::Bytes(u64::from(MTU)));
    for (name, mode) in [
        ("plain", Mode::Plain),
        ("authenticated", Mode::Authenticated),
        ("encrypted", Mode::Encrypted),
    ] {
        group.bench_function(name, |bench| {
            let mut pair = Pair::new(mode);
            bench.iter_custom(|iters| {
                let (mut time, mut packets) = (Duration::ZERO, 0u64);
                while packets < iters {
                    let (t, n) = pair.round();
                    time += t;
                    packets += n;
                }
                // Rounds move whole windows: scale to exactly `iters` packets.
                time.mul_f64(iters as f64 / packets as f64)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, endpoint_4k);
criterion_main!(benches);
