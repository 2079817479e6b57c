//! Drive an endpoint that authenticates packets with fuzzer-chosen datagrams:
//! raw bytes, and genuine authenticated packets (captured from a peer that
//! holds the job secret) replayed, mutated, cut or extended.
//!
//! # The fixture
//!
//! Two endpoints with the same job secret and each other's session ids (the
//! core's test driver, `metaroce_proto::testing::Pair`): the *target*
//! `127.0.0.1:4791` and the *peer* `127.0.0.2:4791`, one QP each, connected. The target has region `main` (16 KiB, remote write and
//! read) and region `canary` (4 KiB, no remote right, a fixed pattern).
//!
//! Before the steps run, the peer posts a 1 KiB WRITE of a known pattern
//! into `main` (four 256-byte packets), and the target posts one toward the
//! peer whose packets are handed to the peer, so that it answers with ACKs.
//! Everything the peer emitted is *captured* and not delivered: those are
//! genuine authenticated data packets and ACKs the target has not seen.
//!
//! # Input format
//!
//! A sequence of steps, each a tag byte (`tag % 6`) and little-endian fields
//! (a truncated input reads as zeros):
//!
//! | tag | step | fields |
//! | --- | --- | --- |
//! | 0 | `Raw` | length u8, that many bytes: delivered from the peer's address |
//! | 1 | `Mutate` | capture index u8, count u8 (1..=4), then count × (position u16, xor u8): flip bytes of a captured packet |
//! | 2 | `Resize` | capture index u8, length u16: cut a captured packet, or extend it with zeros |
//! | 3 | `Deliver` | capture index u8: the captured packet as it is |
//! | 4 | `Stranger` | capture index u8: the captured packet from an address with no connection |
//! | 5 | `Advance` | nanoseconds u16 (× 1000): advance the clock, fire timers, drain the target's output |
//!
//! # Invariants
//!
//! * nothing panics;
//! * every datagram that is not a genuine captured packet delivered for the
//!   first time from the peer's address is rejected and counted under one
//!   reject counter (malformed, unauthenticated, bad tag, replayed, unknown
//!   peer): an attacker without the secret gets nothing accepted;
//! * a genuine captured packet is accepted the first time and refused as a
//!   replay after;
//! * every byte of `main` is either still zero or the peer's pattern byte at
//!   that place; `canary` never changes.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use metaroce_proto::testing::{Pair, Side};
use metaroce_proto::{
    AccessFlags, AuthConfig, Ecn, Endpoint, EndpointConfig, EndpointStats, MrInfo, QpCaps,
    QpHandle, SendWr, Sge, WrOp,
};

/// The target's address.
pub const TARGET_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// The peer's address.
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// An address with no connection.
pub const STRANGER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const PORT: u16 = 4791;
const MTU: u32 = 256;
const MAIN_BYTES: u64 = 16 << 10;
const WRITE_BYTES: u32 = 1024;
const WRITE_OFFSET: u64 = 4096;
const MAX_STEPS: usize = 256;

fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(151) ^ 0x3c
}

fn config(ip: Ipv4Addr, seed: u64) -> EndpointConfig {
    let mut cfg = EndpointConfig {
        device_port: PORT,
        path_port_span: 8,
        paths_per_connection: 4,
        mtu_payload_bytes: MTU,
        max_send_wr: 16,
        max_recv_wr: 16,
        max_memory_regions: 4,
        max_queue_pairs: 2,
        max_connections: 2,
        seed,
        auth: Some(AuthConfig {
            job_secret: *b"fuzzing job secret, 32 bytes !!!",
            encrypt: seed.is_multiple_of(2),
            local_ip: IpAddr::V4(ip),
        }),
        tail_copy_packets: 0,
        ..EndpointConfig::default()
    };
    // A full window from the first packet: the capture holds the whole
    // transfer's genuine packets, not a cold start's first one.
    cfg.cc_params.initial_window_mss = 0;
    cfg
}

/// One side's QP and region `main`.
struct End {
    qp: QpHandle,
    main: MrInfo,
}

fn setup(ep: &mut Endpoint) -> End {
    let pd = ep.alloc_pd();
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let main = ep.register_memory(pd, MAIN_BYTES, rights).expect("main");
    let qp = ep
        .create_qp(
            pd,
            QpCaps {
                max_send_wr: 8,
                max_recv_wr: 8,
            },
            rights,
        )
        .expect("qp");
    End { qp, main }
}

/// The fixture: target (the core's test driver's `a`), its canary, and the
/// peer's (`b`'s) captured datagrams.
pub struct Fixture {
    pair: Pair,
    target_main: MrInfo,
    canary: MrInfo,
    canary_bytes: Vec<u8>,
    /// Genuine datagrams of the peer, never delivered by the fixture.
    captured: Vec<Vec<u8>>,
    delivered: HashSet<usize>,
    /// `main` as last checked: a byte-wise check runs only when it changed.
    main_seen: Vec<u8>,
    buf: Vec<u8>,
}

impl Fixture {
    /// Build it; `encrypt` picks the payload mode of both endpoints.
    pub fn new(encrypt: bool) -> Self {
        let seed = 2 + u64::from(!encrypt);
        let target_ip = IpAddr::V4(TARGET_IP);
        let peer_ip = IpAddr::V4(PEER_IP);
        let mut pair = Pair::new(
            target_ip,
            config(TARGET_IP, seed),
            peer_ip,
            config(PEER_IP, seed + 10),
        )
        .expect("valid config");
        let target = setup(&mut pair.a);
        let peer = setup(&mut pair.b);
        pair.exchange_sessions().expect("session");
        pair.connect(target.qp, peer.qp).expect("connect");
        let pd = pair.a.alloc_pd();
        let canary = pair
            .a
            .register_memory(pd, 4096, AccessFlags::LOCAL_WRITE)
            .expect("canary");
        let canary_bytes: Vec<u8> = (0..4096).map(|i| (i as u8) ^ 0xa5).collect();
        pair.a
            .memory_mut(canary.handle)
            .expect("real bytes")
            .copy_from_slice(&canary_bytes);
        let src =
            &mut pair.b.memory_mut(peer.main.handle).expect("real bytes")[..WRITE_BYTES as usize];
        for (i, b) in src.iter_mut().enumerate() {
            *b = pattern(WRITE_OFFSET as usize + i);
        }
        let write = |from: &End, to: &MrInfo| {
            SendWr::new(
                1,
                WrOp::Write {
                    remote_addr: to.addr + WRITE_OFFSET,
                    rkey: to.rkey,
                },
                vec![Sge {
                    addr: from.main.addr,
                    length: WRITE_BYTES,
                    lkey: from.main.lkey,
                }],
            )
        };
        pair.b
            .post_send(peer.qp, write(&peer, &target.main))
            .expect("post");
        pair.a
            .post_send(target.qp, write(&target, &peer.main))
            .expect("post");
        // The target's data goes to the peer, which answers with ACKs.
        pair.transfer(Side::A);
        let captured: Vec<Vec<u8>> = pair
            .poll_transmits(Side::B)
            .into_iter()
            .map(|(_, bytes)| bytes)
            .collect();
        assert!(captured.len() >= 5, "data packets and at least one ACK");
        pair.set_now(1_000);
        let buf = vec![0; pair.a.max_datagram_len()];
        Self {
            pair,
            target_main: target.main,
            canary,
            canary_bytes,
            captured,
            delivered: HashSet::new(),
            main_seen: vec![0; MAIN_BYTES as usize],
            buf,
        }
    }

    /// Deliver `datagram` from `src` and say whether it was accepted (no
    /// reject counter moved).
    fn deliver(&mut self, src: SocketAddr, datagram: &[u8]) -> bool {
        let before = rejects(self.pair.a.stats());
        let now = self.pair.now();
        self.pair.a.handle_datagram(now, src, Ecn::Ect0, datagram);
        let after = rejects(self.pair.a.stats());
        assert!(after - before <= 1, "one datagram, one count");
        after == before
    }

    fn peer_src(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(PEER_IP), PORT + 2)
    }

    /// Deliver a datagram that is not a fresh genuine one: it must be rejected.
    /// A datagram may hold several packets (an ACK and what follows it,
    /// wire.md 5.3): the endpoint takes them one by one, and so does this
    /// check, packet by packet.
    fn deliver_forgery(&mut self, datagram: &[u8]) {
        let mut rest = datagram;
        loop {
            let n = metaroce_wire::first_packet_len(rest);
            self.deliver_forged_packet(&rest[..n]);
            rest = &rest[n..];
            if rest.is_empty() {
                return;
            }
        }
    }

    fn deliver_forged_packet(&mut self, packet: &[u8]) {
        if let Some(index) = self.captured.iter().position(|c| c == packet) {
            // The input rebuilt a genuine packet byte for byte.
            return self.deliver_genuine(index);
        }
        let src = self.peer_src();
        assert!(
            !self.deliver(src, packet),
            "a datagram that is no genuine packet was accepted: {packet:02x?}"
        );
    }

    fn deliver_genuine(&mut self, index: usize) {
        let datagram = self.captured[index].clone();
        let src = self.peer_src();
        let fresh = self.delivered.insert(index);
        let replayed_before = self.pair.a.stats().rx_replayed;
        let accepted = self.deliver(src, &datagram);
        assert_eq!(
            accepted, fresh,
            "genuine packet {index}: first accepted, then refused"
        );
        if !fresh {
            assert_eq!(self.pair.a.stats().rx_replayed, replayed_before + 1);
        }
    }

    fn check_memory(&mut self) {
        let main = self
            .pair
            .a
            .memory(self.target_main.handle)
            .expect("real bytes");
        if main != &self.main_seen[..] {
            for (i, &b) in main.iter().enumerate() {
                assert!(
                    b == 0 || b == pattern(i),
                    "main[{i}] = {b:#x}: neither untouched nor the genuine byte"
                );
            }
            self.main_seen.copy_from_slice(main);
        }
        assert_eq!(
            self.pair.a.memory(self.canary.handle).expect("real bytes"),
            &self.canary_bytes[..],
            "canary changed"
        );
    }

    fn captured_index(&self, raw: u8) -> usize {
        usize::from(raw) % self.captured.len()
    }
}

fn rejects(s: &EndpointStats) -> u64 {
    s.rx_malformed + s.rx_unauthenticated + s.rx_auth_failed + s.rx_replayed + s.rx_unknown_peer
}

/// Little-endian reader over the input; reads past the end give zeros.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let start = self.at.min(self.data.len());
        let end = (self.at + n).min(self.data.len());
        self.at += n;
        &self.data[start..end]
    }

    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
}

/// Run one input (both payload modes; the first input byte picks which).
pub fn run(data: &[u8]) {
    let Some((&mode, steps)) = data.split_first() else {
        return;
    };
    let mut fx = Fixture::new(mode & 1 == 1);
    let mut input = Reader { data: steps, at: 0 };
    for _ in 0..MAX_STEPS {
        if input.done() {
            break;
        }
        match input.u8() % 6 {
            0 => {
                let len = usize::from(input.u8());
                let raw = input.bytes(len).to_vec();
                fx.deliver_forgery(&raw);
            }
            1 => {
                let index = fx.captured_index(input.u8());
                let mut packet = fx.captured[index].clone();
                let edits = 1 + usize::from(input.u8() % 4);
                let mut changed = false;
                for _ in 0..edits {
                    let at = usize::from(input.u16()) % packet.len();
                    let xor = input.u8();
                    packet[at] ^= xor;
                    changed |= xor != 0;
                }
                if changed {
                    fx.deliver_forgery(&packet);
                }
            }
            2 => {
                let index = fx.captured_index(input.u8());
                let mut packet = fx.captured[index].clone();
                let len = usize::from(input.u16()) % 2048;
                if len != packet.len() {
                    packet.resize(len, 0);
                    fx.deliver_forgery(&packet);
                }
            }
            3 => {
                let index = fx.captured_index(input.u8());
                fx.deliver_genuine(index);
            }
            4 => {
                let index = fx.captured_index(input.u8());
                let packet = fx.captured[index].clone();
                let src = SocketAddr::new(IpAddr::V4(STRANGER_IP), PORT);
                let unknown_before = fx.pair.a.stats().rx_unknown_peer;
                assert!(!fx.deliver(src, &packet), "accepted from a stranger");
                assert_eq!(fx.pair.a.stats().rx_unknown_peer, unknown_before + 1);
            }
            _ => {
                let now = fx.pair.now() + u64::from(input.u16()) * 1000;
                fx.pair.set_now(now);
                fx.pair.a.handle_timeout(now);
                let mut sent = 0;
                while let Some(t) = fx.pair.a.poll_transmit(now, &mut fx.buf) {
                    assert!(t.len <= fx.buf.len());
                    sent += 1;
                    if sent > 1024 {
                        break;
                    }
                }
                while fx.pair.a.poll_completion().is_some() {}
            }
        }
        fx.check_memory();
    }
}

/// One step, for writing seeds.
#[derive(Debug, Clone)]
pub enum Step {
    /// Raw bytes from the peer's address.
    Raw(Vec<u8>),
    /// Xor bytes of a captured packet: (position, value) pairs, 1..=4.
    Mutate(u8, Vec<(u16, u8)>),
    /// Cut or extend a captured packet.
    Resize(u8, u16),
    /// A captured packet as it is.
    Deliver(u8),
    /// A captured packet from an address with no connection.
    Stranger(u8),
    /// Advance the clock by this many microseconds.
    Advance(u16),
}

/// Encode a seed: the mode byte, then the steps.
pub fn encode(encrypt: bool, steps: &[Step]) -> Vec<u8> {
    let mut out = vec![u8::from(encrypt)];
    for step in steps {
        match step {
            Step::Raw(bytes) => {
                let bytes = &bytes[..bytes.len().min(255)];
                out.extend([0, bytes.len() as u8]);
                out.extend_from_slice(bytes);
            }
            Step::Mutate(index, edits) => {
                let edits = &edits[..edits.len().clamp(1, 4)];
                out.extend([1, *index, (edits.len() - 1) as u8]);
                for (at, xor) in edits {
                    out.extend(at.to_le_bytes());
                    out.push(*xor);
                }
            }
            Step::Resize(index, len) => {
                out.extend([2, *index]);
                out.extend(len.to_le_bytes());
            }
            Step::Deliver(index) => out.extend([3, *index]),
            Step::Stranger(index) => out.extend([4, *index]),
            Step::Advance(us) => {
                out.push(5);
                out.extend(us.to_le_bytes());
            }
        }
    }
    out
}

/// The genuine datagrams a fixture captures (for seeds that embed them).
pub fn captured(encrypt: bool) -> Vec<Vec<u8>> {
    Fixture::new(encrypt).captured
}
