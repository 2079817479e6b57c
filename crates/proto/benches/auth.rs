//! The per-packet cost of packet authentication.
//!
//! `endpoint_4k/{plain,authenticated,encrypted}`: one 4 KiB data packet of a
//! stream of WRITEs between two endpoints, sender and receiver together:
//! `poll_transmit` at A (emit, gather the payload, ICRC or seal) and
//! `handle_datagram` at B (parse, ICRC or replay window + tag check and
//! decryption, placement), with B's ACKs handed back to A by the core's
//! test driver (`metaroce_proto::testing::Pair`; their cost,
//! about one ACK per four data packets, is included). The difference
//! between the variants is what authentication, and encryption, cost per
//! packet on top of the plain ICRC path.
//!
//! ```text
//! cargo bench -p metaroce-proto --bench auth
//! ```

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use metaroce_proto::testing::{Pair, Side};
use metaroce_proto::{
    AccessFlags, AuthConfig, Endpoint, EndpointConfig, MrInfo, QpCaps, QpHandle, SendWr, Sge,
    WcStatus, WrOp,
};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
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

/// One side's QP and region.
struct End {
    qp: QpHandle,
    mr: MrInfo,
}

fn setup(ep: &mut Endpoint) -> End {
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
    End { qp, mr }
}

/// The core's test driver with one connected QP pair.
struct Bench {
    pair: Pair,
    a: End,
    b: End,
    outstanding: usize,
}

impl Bench {
    fn new(mode: Mode) -> Self {
        let mut pair = Pair::new(A_IP, config(A_IP, 1, mode), B_IP, config(B_IP, 2, mode))
            .expect("valid config");
        let a = setup(&mut pair.a);
        let b = setup(&mut pair.b);
        pair.exchange_sessions().expect("session");
        pair.connect(a.qp, b.qp).expect("connect");
        pair.set_now(1_000_000);
        Self {
            pair,
            a,
            b,
            outstanding: 0,
        }
    }

    /// Keep two WRITEs posted.
    fn top_up(&mut self) {
        while let Some(c) = self.pair.a.poll_completion() {
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
            self.pair.a.post_send(self.a.qp, wr).expect("post");
            self.outstanding += 1;
        }
    }

    /// Move every data packet A may send now to B, and B's ACKs back;
    /// returns the timed duration and the data packets moved.
    fn round(&mut self) -> (Duration, u64) {
        self.top_up();
        let start = Instant::now();
        let moved = self.pair.transfer(Side::A);
        self.pair.set_now(self.pair.now() + 5_000);
        self.pair.transfer(Side::B);
        let elapsed = start.elapsed();
        self.pair.advance(5_000);
        (elapsed, black_box(moved) as u64)
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
            let mut pair = Bench::new(mode);
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
