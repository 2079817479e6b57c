//! Per-packet hot paths of the sans-IO core, reported as packets per second
//! per core (`Throughput::Elements` counts packets).
//!
//! Two endpoints live in memory, no sockets (the core's test driver,
//! `metaroce_proto::testing::Pair`): A (127.0.0.1, device port 4791)
//! RDMA-WRITEs into B (127.0.0.2, device port 4791) over one connected QP
//! pair. Virtual time advances half an RTT (5 µs) per hop, so RTT samples
//! match the configured base RTT.
//!
//! Group `per_packet`, one function per path, parameter = payload bytes per
//! packet (the endpoint's MTU, so 64 B packets are the same code path as
//! 4 KiB ones, only with less to copy and checksum):
//!
//! - `build_emit`: `Endpoint::poll_transmit` on A producing first-time data
//!   packets (path choice, header build, payload gather from the MR, ICRC).
//!   Steady state, `iter_custom`: A emits a burst of up to 64 packets into 64
//!   distinct buffers (one `sendmmsg` batch) and only that burst is timed;
//!   delivering it to B, B's ACKs back to A and re-posting WRITEs happen
//!   untimed between bursts. When the congestion window closes a burst early,
//!   the final `None` call is part of the timed work.
//! - `parse_place`: `Endpoint::handle_datagram` on B for recorded data packets
//!   (parse, ICRC check, SACK bookkeeping, op window, bounds check, copy into
//!   the MR). The first 2048 packets A sends are recorded once; every
//!   iteration replays them all into a freshly built B (`iter_batched`,
//!   setup untimed), so no packet is a duplicate. B's ACKs are queued but not
//!   emitted.
//! - `ack_process`: `Endpoint::handle_datagram` on A for B's ACKs (SACK walk
//!   over the path's in-flight list, segment bookkeeping, RTT, congestion
//!   control, op-ack completion). Steady state, `iter_custom`: each round A
//!   emits a burst, B receives it and emits its ACKs (untimed); then only A's
//!   handling of those ACKs is timed. One element is one ACK; how many data
//!   packets an ACK covers is printed on stderr.
//! - `wire_emit`, `wire_parse`: `metaroce_wire::emit_data` and `parse` of one
//!   data packet alone: the part of the above that is the wire format.
//!
//! WRITEs are 256 packets long and four are kept posted, all gathering from
//! one source region and landing in one target region, so the payload working
//! set is 256 packets on each side (1 MiB at 4 KiB) and the per-message work
//! (op-ack, completion, re-post) is amortised over 256 packets.

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use metaroce_proto::testing::{Pair, Side};
use metaroce_proto::{
    AccessFlags, Ecn, Endpoint, EndpointConfig, MrInfo, QpCaps, QpHandle, SendWr, Sge, Transmit,
    WcStatus, WrOp,
};
use metaroce_wire::{BaseRepr, DataRepr, Flags, OpHeader};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const DEVICE_PORT: u16 = 4791;
const A_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const B_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// Payload bytes per packet: a full default MTU, and a tiny one.
const PAYLOADS: [u32; 2] = [4096, 64];
/// Datagrams per transmit burst (one `sendmmsg`/GSO batch of a datapath).
const BURST: usize = 64;
/// Packets per WRITE.
const PACKETS_PER_WRITE: u64 = 256;
/// WRITEs kept posted so A's send queue never runs dry.
const WRITES_IN_FLIGHT: usize = 4;
/// Packets replayed into one fresh B by `parse_place` (8 whole WRITEs).
const REPLAY_PACKETS: usize = 2048;
/// Virtual time of one hop.
const HALF_RTT_NS: u64 = 5_000;
/// Rounds without any packet moving before a bench gives up (a stuck pair
/// would otherwise spin forever).
const MAX_IDLE_ROUNDS: u32 = 1_000;

fn config(mtu: u32) -> EndpointConfig {
    EndpointConfig {
        device_port: DEVICE_PORT,
        mtu_payload_bytes: mtu,
        ..EndpointConfig::default()
    }
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
    }
}

/// Fill a region with a pattern: the test data, and every page faulted in
/// before anything is timed.
fn fill(ep: &mut Endpoint, mr: &MrInfo, seed: u8) {
    let bytes = ep.memory_mut(mr.handle).expect("regions have real bytes");
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ seed;
    }
}

/// One side's QP and region.
#[derive(Clone, Copy)]
struct End {
    qp: QpHandle,
    mr: MrInfo,
}

/// The requester's setup: one QP and the region its WRITEs gather from.
fn setup_requester(ep: &mut Endpoint, msg_len: u64) -> End {
    let pd = ep.alloc_pd();
    let mr = ep
        .register_memory(pd, msg_len, AccessFlags::LOCAL_WRITE)
        .expect("register source");
    fill(ep, &mr, 0x5a);
    let qp = ep
        .create_qp(pd, caps(), AccessFlags::NONE)
        .expect("create QP");
    End { qp, mr }
}

/// The responder's setup: one QP that accepts WRITEs into its target
/// region, bound to the requester's QP. Deterministic (seeded keys, QP
/// numbers), so every endpoint set up this way for the same
/// `requester_qpn` has the same QP number and rkey: recorded packets
/// replay into any fresh one.
fn setup_responder(ep: &mut Endpoint, msg_len: u64, requester_qpn: u32) -> End {
    let pd = ep.alloc_pd();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = ep
        .register_memory(pd, msg_len, access)
        .expect("register target");
    fill(ep, &mr, 0xee);
    let qp = ep
        .create_qp(pd, caps(), AccessFlags::NONE)
        .expect("create QP");
    ep.set_qp_remote_access(qp, AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
        .expect("QP access");
    ep.connect_qp(qp, SocketAddr::new(A_IP, DEVICE_PORT), requester_qpn)
        .expect("connect B");
    End { qp, mr }
}

/// A fresh responder endpoint, as B of a [`Bench`] is.
fn responder(mtu: u32, msg_len: u64, requester_qpn: u32) -> (Endpoint, End) {
    let mut ep = Endpoint::new(config(mtu)).expect("valid config");
    let end = setup_responder(&mut ep, msg_len, requester_qpn);
    (ep, end)
}

/// A datagram kept for later delivery.
struct Datagram {
    at_ns: u64,
    src: SocketAddr,
    ecn: Ecn,
    bytes: Vec<u8>,
}

/// A connected pair (the core's test driver) and the bench's bookkeeping
/// around it: bursts into distinct buffers, ACKs collected per round.
struct Bench {
    pair: Pair,
    a: End,
    b: End,
    msg_len: u64,
    next_wr_id: u64,
    outstanding: usize,
    /// A's transmit buffers, one per packet of a burst.
    bufs: Vec<Vec<u8>>,
    /// What A wrote into `bufs[..sent.len()]`.
    sent: Vec<Transmit>,
    /// B's ACKs of the last round (`acks[..ack_count]`; buffers are reused).
    acks: Vec<(Transmit, Vec<u8>)>,
    ack_count: usize,
    b_buf: Vec<u8>,
    idle_rounds: u32,
}

impl Bench {
    fn new(mtu: u32) -> Self {
        let msg_len = PACKETS_PER_WRITE * u64::from(mtu);
        let mut pair = Pair::new(A_IP, config(mtu), B_IP, config(mtu)).expect("valid config");
        let a = setup_requester(&mut pair.a, msg_len);
        let b = setup_responder(&mut pair.b, msg_len, a.qp.qpn());
        pair.a
            .connect_qp(a.qp, pair.addr(Side::B), b.qp.qpn())
            .expect("connect A");
        pair.set_now(1_000_000);
        let len = pair.a.max_datagram_len();
        let b_buf = vec![0; pair.b.max_datagram_len()];
        Self {
            pair,
            a,
            b,
            msg_len,
            next_wr_id: 0,
            outstanding: 0,
            bufs: (0..BURST).map(|_| vec![0; len]).collect(),
            sent: Vec::with_capacity(BURST),
            acks: Vec::new(),
            ack_count: 0,
            b_buf,
            idle_rounds: 0,
        }
    }

    /// Reap A's completions and keep `WRITES_IN_FLIGHT` WRITEs posted.
    fn top_up(&mut self) {
        while let Some(c) = self.pair.a.poll_completion() {
            assert_eq!(c.wc.status, WcStatus::Success, "WRITE failed: {c:?}");
            self.outstanding -= 1;
        }
        while self.outstanding < WRITES_IN_FLIGHT {
            let op = WrOp::Write {
                remote_addr: self.b.mr.addr,
                rkey: self.b.mr.rkey,
            };
            let sge = Sge {
                addr: self.a.mr.addr,
                length: self.msg_len as u32,
                lkey: self.a.mr.lkey,
            };
            let wr = SendWr::new(self.next_wr_id, op, vec![sge]);
            self.pair.a.post_send(self.a.qp, wr).expect("post WRITE");
            self.next_wr_id += 1;
            self.outstanding += 1;
        }
    }

    /// A emits up to `max` packets into `bufs`: the timed part of `build_emit`.
    #[inline(always)]
    fn emit_burst(&mut self, max: usize) -> usize {
        self.sent.clear();
        let now = self.pair.now();
        while self.sent.len() < max {
            let n = self.sent.len();
            match self.pair.a.poll_transmit(now, &mut self.bufs[n]) {
                Some(t) => self.sent.push(t),
                None => break,
            }
        }
        self.sent.len()
    }

    /// Hand the last burst to B.
    fn deliver_burst(&mut self) {
        self.pair.set_now(self.pair.now() + HALF_RTT_NS);
        for (t, buf) in self.sent.iter().zip(&self.bufs) {
            debug_assert_eq!(t.dst, SocketAddr::new(B_IP, DEVICE_PORT));
            self.pair.deliver(Side::A, t, &buf[..t.len]);
        }
    }

    /// Drain B's ACKs into `acks`, firing its delayed-ACK timer so no ACK is
    /// held back (B sends no data, so its only deadlines are delayed ACKs).
    fn collect_acks(&mut self) {
        self.ack_count = 0;
        for _ in 0..4 {
            let now = self.pair.now();
            while let Some(t) = self.pair.b.poll_transmit(now, &mut self.b_buf) {
                if self.ack_count == self.acks.len() {
                    self.acks.push((t, vec![0; self.b_buf.len()]));
                }
                let slot = &mut self.acks[self.ack_count];
                slot.0 = t;
                slot.1[..t.len].copy_from_slice(&self.b_buf[..t.len]);
                self.ack_count += 1;
            }
            match self.pair.b.poll_timeout() {
                Some(d) => {
                    self.pair.set_now(d);
                    self.pair.b.handle_timeout(self.pair.now());
                }
                None => break,
            }
        }
        self.pair.set_now(self.pair.now() + HALF_RTT_NS);
    }

    /// A handles B's ACKs `range` (after `collect_acks`).
    #[inline(always)]
    fn deliver_acks(&mut self, range: std::ops::Range<usize>) {
        for (t, buf) in &self.acks[range] {
            self.pair.deliver(Side::B, t, &buf[..t.len]);
        }
    }

    /// Guard against a pair that stopped moving.
    fn note_progress(&mut self, moved: usize) {
        if moved > 0 {
            self.idle_rounds = 0;
        } else {
            self.idle_rounds += 1;
            assert!(
                self.idle_rounds < MAX_IDLE_ROUNDS,
                "the pair stopped moving packets"
            );
        }
    }

    /// A and B exchanged only first transmissions and ACKs: what was timed
    /// is the path we meant to time.
    fn assert_clean(&self) {
        let (a, b) = (self.pair.a.stats(), self.pair.b.stats());
        assert_eq!(a.data_packets_retransmitted, 0, "A retransmitted: {a:?}");
        assert_eq!(a.ack_packets_sent, 0, "A sent ACKs: {a:?}");
        assert_eq!(
            a.rx_malformed + a.rx_unknown_peer + a.rx_unknown_qp + a.rx_stale_path,
            0,
            "{a:?}"
        );
        assert_eq!(
            b.rx_malformed + b.rx_duplicates + b.rx_out_of_window + b.rx_dropped_ops,
            0,
            "{b:?}"
        );
    }
}

/// `build_emit`: time only A's `poll_transmit` bursts.
fn run_build_emit(pair: &mut Bench, iters: u64) -> Duration {
    let mut timed = Duration::ZERO;
    let mut done = 0u64;
    while done < iters {
        let want = (iters - done).min(BURST as u64) as usize;
        let start = Instant::now();
        let n = pair.emit_burst(want);
        timed += start.elapsed();
        black_box(&pair.bufs);
        done += n as u64;
        pair.note_progress(n);
        pair.deliver_burst();
        pair.collect_acks();
        pair.deliver_acks(0..pair.ack_count);
        pair.top_up();
    }
    timed
}

/// `ack_process`: time only A's handling of B's ACKs.
fn run_ack_process(pair: &mut Bench, iters: u64) -> Duration {
    let mut timed = Duration::ZERO;
    let mut done = 0u64;
    while done < iters {
        pair.emit_burst(BURST);
        pair.deliver_burst();
        pair.collect_acks();
        let k = pair.ack_count.min((iters - done) as usize);
        let start = Instant::now();
        pair.deliver_acks(0..k);
        timed += start.elapsed();
        pair.deliver_acks(k..pair.ack_count);
        done += k as u64;
        pair.note_progress(pair.ack_count);
        pair.top_up();
    }
    timed
}

/// The first `REPLAY_PACKETS` data packets A sends to a fresh B, as B
/// receives them, and the requester QP number they were recorded with.
fn record_data_packets(mtu: u32) -> (Vec<Datagram>, u32) {
    let mut pair = Bench::new(mtu);
    pair.top_up();
    let mut packets = Vec::with_capacity(REPLAY_PACKETS);
    while packets.len() < REPLAY_PACKETS {
        let n = pair.emit_burst(BURST.min(REPLAY_PACKETS - packets.len()));
        pair.note_progress(n);
        let at_ns = pair.pair.now() + HALF_RTT_NS;
        for (t, buf) in pair.sent.iter().zip(&pair.bufs) {
            let src = SocketAddr::new(A_IP, t.src_port);
            packets.push(Datagram {
                at_ns,
                src,
                ecn: t.ecn,
                bytes: buf[..t.len].to_vec(),
            });
        }
        pair.deliver_burst();
        pair.collect_acks();
        pair.deliver_acks(0..pair.ack_count);
        pair.top_up();
    }
    pair.assert_clean();
    (packets, pair.a.qp.qpn())
}

/// Replay recorded packets into a responder: the timed part of `parse_place`.
#[inline(always)]
fn replay(b: &mut Endpoint, packets: &[Datagram]) {
    for p in packets {
        b.handle_datagram(p.at_ns, p.src, p.ecn, &p.bytes);
    }
}

/// A full data packet of `payload_len` bytes, as A would send it.
fn sample_data_packet(payload_len: u32) -> (DataRepr, Vec<u8>) {
    let repr = DataRepr {
        base: BaseRepr {
            flags: Flags::default(),
            path_slot: 5,
            path_gen: 0,
            src_device_port: DEVICE_PORT,
        },
        psn: 0x0050_0123,
        timestamp_ns: 1_234_567,
        dst_qpn: 0x0001_0000,
        msg_seq: 3,
        solicited: false,
        psn_floor_delta: 17,
        floor_acked: false,
        msg_len: payload_len * PACKETS_PER_WRITE as u32,
        offset: payload_len * 42,
        op: OpHeader::Write {
            rkey: 0x0000_0123_4567_89ab,
            remote_addr: 0x7f00_0000_0000,
        },
        payload_len,
    };
    let payload = (0..payload_len)
        .map(|i| (i as u8).wrapping_mul(31))
        .collect();
    (repr, payload)
}

fn per_packet(c: &mut Criterion) {
    let mut group = c.benchmark_group("per_packet");
    group.throughput(Throughput::Elements(1));

    for mtu in PAYLOADS {
        let mut pair = Bench::new(mtu);
        pair.top_up();
        group.bench_function(BenchmarkId::new("build_emit", mtu), |b| {
            b.iter_custom(|iters| run_build_emit(&mut pair, iters));
        });
        pair.assert_clean();
    }

    for mtu in PAYLOADS {
        let (packets, requester_qpn) = record_data_packets(mtu);
        let msg_len = PACKETS_PER_WRITE * u64::from(mtu);
        // Check once that a replay is all fresh, valid packets that land.
        let (mut check, check_end) = responder(mtu, msg_len, requester_qpn);
        replay(&mut check, &packets);
        let s = check.stats();
        assert_eq!(s.rx_datagrams, REPLAY_PACKETS as u64);
        assert_eq!(
            s.rx_malformed
                + s.rx_unknown_peer
                + s.rx_unknown_qp
                + s.rx_duplicates
                + s.rx_duplicate_ops,
            0
        );
        let mut source = Endpoint::new(config(mtu)).expect("valid config");
        let source_end = setup_requester(&mut source, msg_len);
        assert_eq!(
            check.memory(check_end.mr.handle),
            source.memory(source_end.mr.handle),
            "payload landed"
        );

        group.throughput(Throughput::Elements(REPLAY_PACKETS as u64));
        group.bench_function(BenchmarkId::new("parse_place", mtu), |b| {
            b.iter_batched(
                || responder(mtu, msg_len, requester_qpn).0,
                |mut r| {
                    replay(&mut r, &packets);
                    r
                },
                BatchSize::PerIteration,
            );
        });
        group.throughput(Throughput::Elements(1));
    }

    {
        let mtu = PAYLOADS[0];
        let mut pair = Bench::new(mtu);
        pair.top_up();
        group.bench_function(BenchmarkId::new("ack_process", mtu), |b| {
            b.iter_custom(|iters| run_ack_process(&mut pair, iters));
        });
        pair.assert_clean();
        let peer = SocketAddr::new(B_IP, DEVICE_PORT);
        let stats = pair.pair.a.connection_stats(peer).expect("connected");
        eprintln!(
            "ack_process/{mtu}: {} ACKs for {} data packets ({:.2} data packets per ACK)",
            stats.acks_received,
            stats.data_packets_sent,
            stats.data_packets_sent as f64 / stats.acks_received.max(1) as f64
        );
    }

    for mtu in PAYLOADS {
        let (repr, payload) = sample_data_packet(mtu);
        let mut buf = vec![0u8; repr.buffer_len()];
        group.bench_function(BenchmarkId::new("wire_emit", mtu), |b| {
            b.iter(|| {
                metaroce_wire::emit_data(black_box(&repr), black_box(&payload), black_box(&mut buf))
            });
        });
        let len = metaroce_wire::emit_data(&repr, &payload, &mut buf);
        let datagram = &buf[..len];
        assert!(
            matches!(metaroce_wire::parse(datagram), Ok(metaroce_wire::Packet::Data { repr: r, .. }) if r == repr)
        );
        group.bench_function(BenchmarkId::new("wire_parse", mtu), |b| {
            b.iter(|| metaroce_wire::parse(black_box(datagram)));
        });
    }

    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = per_packet
}
criterion_main!(benches);
