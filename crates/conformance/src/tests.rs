//! The suite's check logic against canned responses, its key derivation
//! and tags against the spec's vectors, and the catalogue against
//! `docs/spec/conformance.md`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path as FsPath;
use std::rc::Rc;
use std::time::Duration;

use metaroce_wire::{
    AckRepr, BaseRepr, DataRepr, Flags, OpAck, OpHeader, RepairId, SackBits, Syndrome, emit_ack,
    parse_authenticated,
};

use crate::expect::{self, ReadAssembly};
use crate::keys::{DirectionKey, derive_key};
use crate::link::Link;
use crate::peer::{Event, Peer, SEGMENT_BYTES, repair_segments};
use crate::scenarios;
use crate::{CHECKS, Config, InitialPsn, Outcome, QpRole, TargetInfo, run_with_link, spec_of};

fn ack(ack_psn: u32, bits: &[usize]) -> AckRepr {
    let mut a = AckRepr::new(BaseRepr {
        flags: Flags::empty(),
        path_slot: 3,
        path_gen: 1,
        src_device_port: 4793,
    });
    a.ack_psn = ack_psn;
    let mut sack = SackBits::new();
    for &i in bits {
        sack.set(i);
    }
    a.sack = sack;
    a
}

fn op(msn: u32, syndrome: Syndrome, nak_msg_seq: u32) -> OpAck {
    OpAck {
        qpn: 7,
        msn,
        syndrome,
        nak_msg_seq,
    }
}

// ------------------------------------------------------------ expect

#[test]
fn ack_state_demands_exact_cumulative_point_and_bits() {
    assert_eq!(expect::ack_state(&ack(10, &[0, 3]), 10, &[3, 0]), Ok(()));
    let e = expect::ack_state(&ack(10, &[0]), 10, &[0, 3]).unwrap_err();
    assert!(e.contains("bits [0]") && e.contains("[0, 3]"), "{e}");
    assert!(expect::ack_state(&ack(11, &[]), 10, &[]).is_err());
    // Bits past the wrap are plain indices.
    assert_eq!(
        expect::ack_state(&ack(u32::MAX, &[0, 1]), u32::MAX, &[0, 1]),
        Ok(())
    );
}

#[test]
fn executed_follows_serial_msn_and_ignores_naks_for_other_messages() {
    assert!(expect::executed(&op(5, Syndrome::Ack, 0), 4));
    assert!(!expect::executed(&op(5, Syndrome::Ack, 0), 5));
    // msn wrapped past u32::MAX: msg_seq u32::MAX is before 1.
    assert!(expect::executed(&op(1, Syndrome::Ack, 0), u32::MAX));
    // A NAK naming the message is never "executed".
    assert!(!expect::executed(&op(9, Syndrome::RemAccessErr, 4), 4));
    assert!(expect::executed(&op(9, Syndrome::RnrNak, 8), 4));
}

#[test]
fn nak_needs_syndrome_message_and_an_msn_that_does_not_claim_it() {
    assert_eq!(
        expect::nak(&op(4, Syndrome::RemAccessErr, 4), Syndrome::RemAccessErr, 4),
        Ok(())
    );
    assert!(expect::nak(&op(4, Syndrome::RnrNak, 4), Syndrome::RemAccessErr, 4).is_err());
    assert!(expect::nak(&op(4, Syndrome::RemAccessErr, 3), Syndrome::RemAccessErr, 4).is_err());
    let e = expect::nak(&op(5, Syndrome::RemAccessErr, 4), Syndrome::RemAccessErr, 4).unwrap_err();
    assert!(e.contains("msn 5"), "{e}");
}

#[test]
fn same_bytes_names_the_first_difference() {
    assert_eq!(expect::same_bytes(b"abc", b"abc"), Ok(()));
    let e = expect::same_bytes(b"abd", b"abc").unwrap_err();
    assert!(e.starts_with("byte 2 is 0x64, expected 0x63"), "{e}");
    assert!(
        expect::same_bytes(b"ab", b"abc")
            .unwrap_err()
            .contains("read 2 bytes")
    );
}

fn response(local_qpn: u32, msg_seq: u32, msg_len: u32, offset: u32, payload_len: u32) -> DataRepr {
    DataRepr {
        base: BaseRepr {
            flags: Flags::empty(),
            path_slot: 0,
            path_gen: 1,
            src_device_port: 4793,
        },
        psn: 1,
        timestamp_ns: 0,
        dst_qpn: local_qpn,
        msg_seq,
        solicited: false,
        psn_floor_delta: 0,
        floor_acked: false,
        msg_len,
        offset,
        op: OpHeader::ReadResponse,
        payload_len,
    }
}

#[test]
fn read_assembly_collects_segments_in_any_order_and_notes_bad_ones() {
    let mut r = ReadAssembly::new(7, 3, 8);
    r.add(&response(7, 3, 8, 4, 4), b"efgh");
    assert!(!r.complete());
    r.add(&response(7, 4, 8, 0, 4), b"XXXX"); // another message: ignored
    r.add(&response(8, 3, 8, 0, 4), b"XXXX"); // another QP: ignored
    r.add(&response(7, 3, 8, 0, 4), b"abcd");
    assert!(r.complete());
    r.add(&response(7, 3, 8, 0, 4), b"abcd"); // a harmless retransmission
    let (bytes, problems) = r.finish();
    assert_eq!(bytes, b"abcdefgh");
    assert!(problems.is_empty(), "{problems:?}");

    let mut r = ReadAssembly::new(7, 3, 8);
    r.add(&response(7, 3, 16, 0, 4), b"abcd"); // wrong msg_len
    r.add(&response(7, 3, 8, 6, 4), b"abcd"); // beyond the READ
    r.add(&response(7, 3, 8, 0, 4), b"zzzz"); // different bytes for 0..4
    let mut wrong = response(7, 3, 8, 0, 0);
    wrong.op = OpHeader::AtomicResponse { original: 1 };
    r.add(&wrong, b"");
    let (_, problems) = r.finish();
    assert_eq!(problems.len(), 4, "{problems:?}");
}

#[test]
fn atomic_response_checks_qp_message_and_original() {
    let mut r = response(7, 3, 8, 0, 0);
    r.op = OpHeader::AtomicResponse { original: 41 };
    assert_eq!(expect::atomic_response(&r, 7, 3, 41), Ok(()));
    assert!(
        expect::atomic_response(&r, 7, 3, 42)
            .unwrap_err()
            .contains("0x29")
    );
    assert!(expect::atomic_response(&r, 7, 4, 41).is_err());
    r.op = OpHeader::ReadResponse;
    assert!(expect::atomic_response(&r, 7, 3, 41).is_err());
}

// ------------------------------------------------------------ repair shards

#[test]
fn repair_segments_are_the_messages_recovery_shards() {
    let peer = Peer::new(Canned::new(|_| Vec::new()), target(), fast_config());
    // Three full segments and a 10-byte one.
    let data = scenarios::pattern(9, 3 * SEGMENT_BYTES + 10);
    let segments = peer.write_segments(QpRole::Main, 4, 0, &data);
    let repair = repair_segments(&segments, 2).unwrap();
    assert_eq!(repair.len(), 2);
    for (i, r) in repair.iter().enumerate() {
        let id = RepairId {
            index: i as u16,
            count: 2,
        };
        assert_eq!(r.offset, id.to_offset());
        assert_eq!(r.offset, 1 << 31 | 2 << 16 | i as u32);
        assert!(r.flags.contains(Flags::REPAIR));
        // Every other field is the message's own.
        assert_eq!(
            (r.dst_qpn, r.msg_seq, r.msg_len, r.op),
            (segments[0].dst_qpn, 4, data.len() as u32, segments[0].op)
        );
        assert_eq!(r.payload.len(), SEGMENT_BYTES);
    }
    // Segments 1 and 3 lost: the two shards give them back, the short
    // last one zero-padded to the shard size.
    let mut shards: Vec<Option<Vec<u8>>> = vec![
        Some(segments[0].payload.clone()),
        None,
        Some(segments[2].payload.clone()),
        None,
    ];
    shards.extend(repair.iter().map(|r| Some(r.payload.clone())));
    let code = reed_solomon_erasure::galois_8::ReedSolomon::new(4, 2).unwrap();
    code.reconstruct_data(&mut shards).unwrap();
    let rebuilt = |i: usize| shards[i].clone().unwrap();
    assert_eq!(rebuilt(1), segments[1].payload);
    assert_eq!(&rebuilt(3)[..10], &data[3 * SEGMENT_BYTES..]);
    assert!(rebuilt(3)[10..].iter().all(|&b| b == 0));
    // A one-packet message: one shard of its length rounded up to even.
    let one = peer.write_segments(QpRole::Main, 5, 0, &data[..63]);
    let shard = repair_segments(&one, 1).unwrap().remove(0);
    assert_eq!(shard.payload.len(), 64);
    assert_eq!(shard.msg_len, 63);
}

/// Multiplication in GF(2^8) modulo x^8 + x^4 + x^3 + x^2 + 1 (wire.md §4.4).
fn gf_mul(a: u8, b: u8) -> u8 {
    let (mut a, mut b, mut product) = (u16::from(a), b, 0u16);
    while b != 0 {
        if b & 1 == 1 {
            product ^= a;
        }
        a <<= 1;
        if a & 0x100 != 0 {
            a ^= 0x11d;
        }
        b >>= 1;
    }
    product as u8
}

#[test]
fn repair_shards_follow_the_construction_wire_md_gives() {
    // Two data shards: the Vandermonde rows are [1, r]; the top square
    // [[1, 0], [1, 1]] is its own inverse in characteristic 2, so row r of
    // the product is [1 + r, r], and recovery shard j (row 2 + j) is
    // (3 + j)·d0 + (2 + j)·d1 with + as XOR: 3·d0 + 2·d1, then 2·d0 + 3·d1.
    let peer = Peer::new(Canned::new(|_| Vec::new()), target(), fast_config());
    let data = scenarios::pattern(10, 2 * SEGMENT_BYTES);
    let segments = peer.write_segments(QpRole::Main, 0, 0, &data);
    let repair = repair_segments(&segments, 2).unwrap();
    let (d0, d1) = (&segments[0].payload, &segments[1].payload);
    for (j, (c0, c1)) in [(3u8, 2u8), (2, 3)].into_iter().enumerate() {
        let want: Vec<u8> = d0
            .iter()
            .zip(d1)
            .map(|(&a, &b)| gf_mul(c0, a) ^ gf_mul(c1, b))
            .collect();
        assert_eq!(repair[j].payload, want, "recovery shard {j}");
    }
}

// ------------------------------------------------------------ keys

/// A vector of `docs/spec/vectors/auth`: its key line and bytes.
struct AuthVector {
    fields: Vec<(String, String)>,
    derived_key: Option<String>,
    plaintext: Option<Vec<u8>>,
    verify: Option<String>,
    bytes: Vec<u8>,
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn read_auth_vector(path: &FsPath) -> AuthVector {
    let text = std::fs::read_to_string(path).unwrap();
    let mut v = AuthVector {
        fields: Vec::new(),
        derived_key: None,
        plaintext: None,
        verify: None,
        bytes: Vec::new(),
    };
    let mut data = String::new();
    for line in text.lines() {
        if let Some(c) = line.strip_prefix('#') {
            let c = c.trim();
            if let Some(rest) = c.strip_prefix("key:") {
                v.fields = rest
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, val)| (k.to_string(), val.to_string()))
                    .collect();
            } else if let Some(rest) = c.strip_prefix("derived_key:") {
                v.derived_key = Some(rest.trim().to_string());
            } else if let Some(rest) = c.strip_prefix("plaintext:") {
                v.plaintext = Some(hex(rest));
            } else if let Some(rest) = c.strip_prefix("verify:") {
                v.verify = Some(rest.trim().to_string());
            }
        } else {
            data.push_str(line);
        }
    }
    v.bytes = hex(&data);
    v
}

fn number(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

#[test]
fn keys_and_tags_match_the_spec_vectors() {
    let dir = FsPath::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/spec/vectors/auth");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("invalid-")
        {
            continue;
        }
        let v = read_auth_vector(&path);
        let Some(want_key) = &v.derived_key else {
            continue;
        };
        let field = |k: &str| {
            v.fields
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, val)| val.clone())
                .unwrap_or_else(|| panic!("{}: no {k}", path.display()))
        };
        let secret: [u8; 32] = hex(&field("secret")).try_into().unwrap();
        let sender: SocketAddr = field("sender").parse().unwrap();
        let receiver: SocketAddr = field("receiver").parse().unwrap();
        let key = derive_key(
            &secret,
            sender,
            number(&field("sender_session")),
            receiver,
            number(&field("receiver_session")),
        );
        assert_eq!(&hex(want_key), &key, "{}: derived key", path.display());

        let encrypt = field("encrypt") == "true";
        let (packet, auth) = parse_authenticated(&v.bytes).unwrap();
        let header_len = match &packet {
            metaroce_wire::Packet::Data { repr, .. } => repr.header_len(),
            metaroce_wire::Packet::Ack(a) => a.covered_len(),
        };
        let covered_end = v.bytes.len() - metaroce_wire::AUTH_TRAILER_LEN;
        let opened = DirectionKey::new(&key, encrypt).open(
            auth.packet_number,
            &v.bytes[..header_len],
            &v.bytes[header_len..covered_end],
            &auth.tag,
        );
        match v.verify.as_deref() {
            Some("accept") => {
                let clear = opened.unwrap_or_else(|| panic!("{}: tag rejected", path.display()));
                let want = v
                    .plaintext
                    .clone()
                    .unwrap_or_else(|| v.bytes[header_len..covered_end].to_vec());
                assert_eq!(clear, want, "{}: payload", path.display());
                // Sealing the clear payload again gives the vector's tag.
                let mut payload = clear.clone();
                let tag = DirectionKey::new(&key, encrypt).seal(
                    auth.packet_number,
                    &v.bytes[..header_len],
                    &mut payload,
                );
                assert_eq!(tag, auth.tag, "{}: tag", path.display());
            }
            Some("reject") => assert!(opened.is_none(), "{}: tag accepted", path.display()),
            other => panic!("{}: verify {other:?}", path.display()),
        }
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} auth vectors checked");
}

// ------------------------------------------------------------ catalogue

#[test]
fn catalogue_ids_are_unique_and_each_belongs_to_one_scenario() {
    let scenarios = scenarios::all::<Canned>();
    for (i, spec) in CHECKS.iter().enumerate() {
        assert!(
            CHECKS[..i].iter().all(|c| c.id != spec.id),
            "{} twice",
            spec.id
        );
        let owners = scenarios
            .iter()
            .filter(|s| s.checks.contains(&spec.id))
            .count();
        let decided_by_run = spec.id == "auth.target-authenticates";
        assert_eq!(
            owners,
            usize::from(!decided_by_run),
            "{} belongs to {owners} scenarios",
            spec.id
        );
        assert!(spec.section.starts_with("wire.md §"), "{}", spec.id);
    }
    for s in &scenarios {
        for id in s.checks {
            assert!(
                spec_of(id).is_some(),
                "scenario check {id} not in the catalogue"
            );
        }
    }
}

#[test]
fn conformance_md_lists_every_check_with_its_section() {
    let doc = std::fs::read_to_string(
        FsPath::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/spec/conformance.md"),
    )
    .unwrap();
    for spec in CHECKS {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", spec.id)))
            .unwrap_or_else(|| panic!("docs/spec/conformance.md has no row for {}", spec.id));
        assert!(
            row.contains(spec.section),
            "the row of {} does not cite {}",
            spec.id,
            spec.section
        );
    }
    let rows = doc.lines().filter(|l| l.starts_with("| `")).count();
    assert_eq!(rows, CHECKS.len(), "conformance.md rows vs checks");
}

// ------------------------------------------------------------ whole runs

/// What a canned target answers to one datagram.
type Script = Box<dyn FnMut(&[u8]) -> Vec<Vec<u8>>>;

/// A link that answers from a script: a function of each datagram sent.
struct Canned {
    answer: Script,
    inbox: VecDeque<Vec<u8>>,
    sent: Rc<RefCell<Vec<Vec<u8>>>>,
}

impl Canned {
    fn new(answer: impl FnMut(&[u8]) -> Vec<Vec<u8>> + 'static) -> Self {
        Self {
            answer: Box::new(answer),
            inbox: VecDeque::new(),
            sent: Rc::default(),
        }
    }
}

impl Link for Canned {
    fn send(&mut self, datagram: &[u8]) -> std::io::Result<()> {
        self.sent.borrow_mut().push(datagram.to_vec());
        let replies = (self.answer)(datagram);
        self.inbox.extend(replies);
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8], _timeout: Duration) -> std::io::Result<Option<usize>> {
        Ok(self.inbox.pop_front().map(|d| {
            buf[..d.len()].copy_from_slice(&d);
            d.len()
        }))
    }
}

fn target() -> TargetInfo {
    TargetInfo {
        addr: "127.0.0.1:4793".parse().unwrap(),
        qpns: vec![1, 2, 3, 4, 5],
        rkey: 0x42,
        region_addr: 0x1000,
        region_len: 1 << 16,
        session_id: 1,
        initial_psn: InitialPsn::Fixed(0),
        first_msg_seq: 0,
    }
}

fn fast_config() -> Config {
    let mut c = Config::new(
        "127.0.0.1:4893".parse().unwrap(),
        vec![11, 12, 13, 14, 15],
        2,
    );
    c.answer_timeout = Duration::from_millis(5);
    c.quiet_period = Duration::from_millis(1);
    c
}

#[test]
fn a_silent_target_fails_every_check_and_says_why() {
    let link = Canned::new(|_| Vec::new());
    let report = run_with_link(link, &target(), &fast_config()).unwrap();
    assert_eq!(report.results.len(), CHECKS.len());
    for r in &report.results {
        match &r.outcome {
            Outcome::Fail(why) => assert!(why.contains("set-up WRITE"), "{why}"),
            Outcome::Skipped(why) => assert!(why.contains("authentication"), "{why}"),
            Outcome::Pass => panic!("{} passed against a silent target", r.spec.id),
        }
    }
    let text = report.to_string();
    assert!(
        text.ends_with("conformance: 0 passed, 46 failed, 5 skipped"),
        "{text}"
    );
}

/// A broken target: to every data packet it parses, the path ACK of a
/// receiver that got everything, and an op-ack saying the message ran.
fn acks_everything(datagram: &[u8]) -> Vec<Vec<u8>> {
    let Ok(metaroce_wire::Packet::Data { repr, .. }) = metaroce_wire::parse(datagram) else {
        return Vec::new();
    };
    let mut a = AckRepr::new(BaseRepr {
        flags: Flags::empty(),
        path_slot: repr.base.path_slot,
        path_gen: repr.base.path_gen,
        src_device_port: 4793,
    });
    a.ack_psn = repr.psn.wrapping_add(1);
    a.push_op_ack(OpAck {
        qpn: 11,
        msn: repr.msg_seq.wrapping_add(1),
        syndrome: Syndrome::Ack,
        nak_msg_seq: 0,
    });
    let mut out = vec![0u8; a.buffer_len()];
    emit_ack(&a, &mut out);
    vec![out]
}

#[test]
fn a_target_that_acknowledges_garbage_fails_the_drop_checks() {
    let link = Canned::new(acks_everything);
    let mut config = fast_config();
    config.only = vec!["drop.".into()];
    let report = run_with_link(link, &target(), &config).unwrap();
    for r in &report.results {
        if r.spec.id.starts_with("drop.") {
            // It acknowledges every PSN it can parse as if none were
            // missing and returns no READ data: every drop check fails.
            match &r.outcome {
                Outcome::Fail(why) => assert!(!why.is_empty()),
                other => panic!("{}: {other:?}", r.spec.id),
            }
        } else {
            assert!(matches!(r.outcome, Outcome::Skipped(_)), "{}", r.spec.id);
        }
    }
}

#[test]
fn the_requester_acknowledges_responses_per_target_path() {
    let link = Canned::new(|_| Vec::new());
    let sent = Rc::clone(&link.sent);
    let mut peer = Peer::new(link, target(), fast_config());
    // Three READ_RESPONSE packets on the target's path 2/1: PSNs 0, 2, 1.
    for psn in [0u32, 2, 1] {
        let mut r = response(11, 0, 12, psn * 4, 4);
        r.psn = psn;
        // The target still waits for PSN 0: its floor stays there.
        r.psn_floor_delta = psn as u16;
        r.base.path_slot = 2;
        let mut bytes = vec![0u8; r.buffer_len()];
        metaroce_wire::emit_data(&r, b"abcd", &mut bytes);
        peer.inject(&bytes);
    }
    let acks: Vec<AckRepr> = sent
        .borrow()
        .iter()
        .map(|d| match metaroce_wire::parse(d).unwrap() {
            metaroce_wire::Packet::Ack(a) => a,
            other => panic!("sent {other:?}"),
        })
        .collect();
    assert_eq!(acks.len(), 3);
    assert_eq!((acks[0].base.path_slot, acks[0].ack_psn), (2, 1));
    assert_eq!(expect::ack_state(&acks[1], 1, &[0]), Ok(()));
    assert_eq!(expect::ack_state(&acks[2], 3, &[]), Ok(()));
    assert_eq!(acks[2].rx_packets, 3);
    assert_eq!(peer.events.len(), 3);
    assert!(matches!(&peer.events[0], Event::Data { payload, .. } if payload == b"abcd"));
}
