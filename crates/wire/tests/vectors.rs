//! Hex test vectors in `docs/spec/vectors/` (see the README there).
//!
//! `all_vectors_decode_as_expected` checks every committed vector: it decodes
//! the datagram, compares the outcome and fields with the `# expect:` and
//! `# fields:` lines, and re-encodes valid ones byte for byte.
//!
//! `regenerate_vectors` (ignored) rewrites the vectors and the fuzz seed
//! corpus from the case table below:
//!
//! ```text
//! cargo test -p metaroce-wire --test vectors -- --ignored regenerate_vectors
//! ```
//!
//! The expectation lines in the table are written by hand, not derived from
//! the decoder, so the committed files check the decoder rather than echo it.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use metaroce_wire::{
    AckRepr, AuthTrailer, BaseRepr, DataRepr, Error, Flags, OpAck, OpHeader, Packet, Syndrome,
    emit_ack, emit_data, parse, parse_authenticated, seal,
};

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/spec/vectors")
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/parse_packet")
}

// ---------------------------------------------------------------- checking

struct Vector {
    name: String,
    expect: String,
    fields: Vec<(String, String)>,
    bytes: Vec<u8>,
}

fn read_vector(path: &Path) -> Vector {
    let text = fs::read_to_string(path).unwrap();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let mut expect = None;
    let mut fields = Vec::new();
    let mut hex = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim();
            let pairs = if let Some(rest) = comment.strip_prefix("expect:") {
                assert!(expect.is_none(), "{name}: two expect lines");
                let rest = rest.trim();
                let (outcome, pairs) = rest.split_once(' ').unwrap_or((rest, ""));
                if matches!(outcome, "Data" | "Ack") {
                    expect = Some(outcome.to_owned());
                    pairs.split_whitespace().collect()
                } else {
                    // An error, written as its Debug form (may contain spaces).
                    expect = Some(rest.to_owned());
                    Vec::new()
                }
            } else if let Some(rest) = comment.strip_prefix("fields:") {
                rest.split_whitespace().collect()
            } else {
                Vec::new()
            };
            for pair in pairs {
                let (key, value) = pair
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{name}: `{pair}` is not key=value"));
                fields.push((key.to_owned(), value.to_owned()));
            }
        } else {
            hex.extend(line.chars().filter(|c| !c.is_whitespace()));
        }
    }
    assert!(
        hex.len().is_multiple_of(2),
        "{name}: odd number of hex digits"
    );
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&hex[i..i + 2], 16)
                .unwrap_or_else(|_| panic!("{name}: bad hex at digit {i}"))
        })
        .collect();
    Vector {
        name,
        expect: expect.unwrap_or_else(|| panic!("{path:?}: no `# expect:` line")),
        fields,
        bytes,
    }
}

fn number(text: &str) -> u64 {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    }
    .unwrap_or_else(|_| panic!("`{text}` is not a number"))
}

/// The decoded value of `key`, rendered so it compares equal to the text of
/// a vector's expectation (numbers are compared by value).
fn actual(packet: &Packet<'_>, key: &str) -> Option<String> {
    let base = packet.base();
    let value = match key {
        "slot" => base.path_slot.to_string(),
        "gen" => base.path_gen.to_string(),
        "port" => base.src_device_port.to_string(),
        "flags" => base.flags.bits().to_string(),
        _ => match packet {
            Packet::Data { repr, payload } => {
                let ext = ext_field(&repr.op, key);
                match key {
                    "opcode" => format!("{:?}", repr.opcode()),
                    "psn" => repr.psn.to_string(),
                    "timestamp_ns" => repr.timestamp_ns.to_string(),
                    "dst_qpn" => repr.dst_qpn.to_string(),
                    "msg_seq" => repr.msg_seq.to_string(),
                    "solicited" => repr.solicited.to_string(),
                    "msg_len" => repr.msg_len.to_string(),
                    "offset" => repr.offset.to_string(),
                    "payload_len" => {
                        assert_eq!(payload.len(), repr.payload_len as usize);
                        repr.payload_len.to_string()
                    }
                    _ => ext?.to_string(),
                }
            }
            Packet::Ack(repr) => match key {
                "ack_psn" => repr.ack_psn.to_string(),
                "ts_echo" => repr.ts_echo.to_string(),
                "ack_delay_ns" => repr.ack_delay_ns.to_string(),
                "rx_packets" => repr.rx_packets.to_string(),
                "ce_packets" => repr.ce_packets.to_string(),
                "rate_hint_mbps" => repr.rate_hint_mbps.to_string(),
                "op_ack_count" => repr.op_ack_count.to_string(),
                "sack" => {
                    let bits: Vec<String> = repr.sack.iter_set().map(|i| i.to_string()).collect();
                    bits.join(",")
                }
                _ => {
                    // op0, op1, ...: qpn:msn:Syndrome:nak_msg_seq
                    let index: usize = key.strip_prefix("op")?.parse().ok()?;
                    let op = repr.op_acks().get(index)?;
                    format!("{}:{}:{:?}:{}", op.qpn, op.msn, op.syndrome, op.nak_msg_seq)
                }
            },
        },
    };
    Some(value)
}

fn ext_field(op: &OpHeader, key: &str) -> Option<u64> {
    let (rkey, remote_addr) = match *op {
        OpHeader::Write { rkey, remote_addr }
        | OpHeader::ReadRequest { rkey, remote_addr }
        | OpHeader::WriteImm {
            rkey, remote_addr, ..
        }
        | OpHeader::FetchAdd {
            rkey, remote_addr, ..
        }
        | OpHeader::CmpSwap {
            rkey, remote_addr, ..
        } => (Some(rkey), Some(remote_addr)),
        _ => (None, None),
    };
    match (key, *op) {
        ("rkey", _) => rkey,
        ("remote_addr", _) => remote_addr,
        ("recv_index", OpHeader::WriteImm { recv_index, .. })
        | ("recv_index", OpHeader::Send { recv_index })
        | ("recv_index", OpHeader::SendImm { recv_index, .. }) => Some(recv_index.into()),
        ("imm", OpHeader::WriteImm { imm, .. }) | ("imm", OpHeader::SendImm { imm, .. }) => {
            Some(imm.into())
        }
        ("add", OpHeader::FetchAdd { add, .. }) => Some(add),
        ("compare", OpHeader::CmpSwap { compare, .. }) => Some(compare),
        ("swap", OpHeader::CmpSwap { swap, .. }) => Some(swap),
        ("original", OpHeader::AtomicResponse { original }) => Some(original),
        _ => None,
    }
}

fn same_value(expected: &str, actual: &str) -> bool {
    let numeric = |s: &str| s.chars().next().is_some_and(|c| c.is_ascii_digit());
    if numeric(expected) && numeric(actual) && !expected.contains([':', ',']) {
        number(expected) == number(actual)
    } else if expected.contains(':') {
        // op-ack entries: compare numbers by value, names as written
        let e: Vec<&str> = expected.split(':').collect();
        let a: Vec<&str> = actual.split(':').collect();
        e.len() == a.len() && e.iter().zip(&a).all(|(e, a)| same_value(e, a))
    } else {
        expected == actual
    }
}

/// Check one vector; returns the number of fields compared.
fn check(vector: &Vector) -> usize {
    let name = &vector.name;
    let result = parse(&vector.bytes);
    let valid = !name.starts_with("invalid-");
    match (&result, vector.expect.as_str()) {
        (Ok(Packet::Data { .. }), "Data") | (Ok(Packet::Ack(_)), "Ack") => {
            assert!(valid, "{name}: invalid- vector decoded: {result:?}");
        }
        (Err(err), expect) => {
            assert!(!valid, "{name}: valid vector failed: {err:?}");
            let debug = format!("{err:?}");
            let variant = debug.split('(').next().unwrap();
            assert!(
                expect == debug || expect == variant,
                "{name}: expected {expect}, got {debug}"
            );
            assert!(
                vector.fields.is_empty(),
                "{name}: fields on an invalid vector"
            );
            return 0;
        }
        (other, expect) => panic!("{name}: expected {expect}, got {other:?}"),
    }
    let packet = result.unwrap();
    for (key, expected) in &vector.fields {
        let actual = actual(&packet, key)
            .unwrap_or_else(|| panic!("{name}: field `{key}` does not apply to {packet:?}"));
        assert!(
            same_value(expected, &actual),
            "{name}: {key} expected {expected}, decoded {actual}"
        );
    }
    let required: &[&str] = match packet {
        Packet::Data { .. } => &[
            "opcode",
            "psn",
            "dst_qpn",
            "msg_seq",
            "offset",
            "msg_len",
            "payload_len",
        ],
        Packet::Ack(_) => &["ack_psn", "op_ack_count"],
    };
    for key in required {
        assert!(
            vector.fields.iter().any(|(k, _)| k == key),
            "{name}: expectation lacks `{key}`"
        );
    }
    // Valid vectors are canonical: re-encoding gives the same bytes.
    let mut buf = vec![0u8; packet.buffer_len()];
    packet.emit(&mut buf);
    assert_eq!(buf, vector.bytes, "{name}: re-encoding differs");
    vector.fields.len()
}

fn vector_paths() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = fs::read_dir(vectors_dir())
        .expect("docs/spec/vectors exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "hex"))
        .collect();
    paths.sort();
    paths
}

#[test]
fn all_vectors_decode_as_expected() {
    let paths = vector_paths();
    let (mut valid, mut invalid) = (0, 0);
    for path in &paths {
        let vector = read_vector(path);
        if check(&vector) > 0 {
            valid += 1;
        } else {
            invalid += 1;
        }
    }
    assert!(valid >= 10, "only {valid} valid vectors");
    assert!(invalid >= 3, "only {invalid} invalid vectors");
}

#[test]
fn committed_vectors_match_the_case_table() {
    // Guards against editing one without the other.
    let cases = cases();
    let paths = vector_paths();
    assert_eq!(paths.len(), cases.len(), "run regenerate_vectors");
    for case in cases {
        let vector = read_vector(&vectors_dir().join(format!("{}.hex", case.name)));
        assert_eq!(
            vector.bytes, case.bytes,
            "{}: run regenerate_vectors",
            case.name
        );
    }
}

#[test]
fn corpus_holds_the_valid_vectors() {
    for case in cases().iter().filter(|c| !c.name.starts_with("invalid-")) {
        let seed = fs::read(corpus_dir().join(&case.name))
            .unwrap_or_else(|_| panic!("{}: missing seed, run regenerate_vectors", case.name));
        assert_eq!(seed, case.bytes, "{}", case.name);
    }
}

// ---------------------------------------------------------------- generating

struct Case {
    name: String,
    /// Description lines (without the leading `# `).
    about: Vec<&'static str>,
    /// The `# expect:` line and optional `# fields:` line, written by hand.
    expect: &'static str,
    fields: Option<&'static str>,
    bytes: Vec<u8>,
}

const RKEY: u64 = 0x0000_1234_5678_9abc;
const ADDR: u64 = 0x0000_7f00_dead_0000;

fn base(flags: Flags) -> BaseRepr {
    BaseRepr {
        flags,
        path_slot: 3,
        path_gen: 1,
        src_device_port: 4791,
    }
}

fn data(op: OpHeader, psn: u32, msg_len: u32, offset: u32, payload: &[u8]) -> (DataRepr, Vec<u8>) {
    let repr = DataRepr {
        base: base(Flags::empty()),
        psn,
        timestamp_ns: 0x0102_0304,
        dst_qpn: 0x11,
        msg_seq: 3,
        solicited: false,
        psn_floor_delta: 0,
        floor_acked: false,
        msg_len,
        offset,
        op,
        payload_len: payload.len() as u32,
    };
    (repr, payload.to_vec())
}

fn emit_d((repr, payload): &(DataRepr, Vec<u8>)) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    emit_data(repr, payload, &mut buf);
    buf
}

fn emit_a(repr: &AckRepr) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    emit_ack(repr, &mut buf);
    buf
}

fn resealed(mut bytes: Vec<u8>, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    edit(&mut bytes);
    seal(&mut bytes);
    bytes
}

fn cases() -> Vec<Case> {
    let payload16: Vec<u8> = (0u8..16).collect();
    let write = data(
        OpHeader::Write {
            rkey: RKEY,
            remote_addr: ADDR,
        },
        7,
        48,
        0,
        &payload16,
    );
    let mut write_imm = data(
        OpHeader::WriteImm {
            rkey: RKEY,
            remote_addr: ADDR,
            recv_index: 5,
            imm: 0xcafe_f00d,
        },
        9,
        48,
        32,
        &[0xee; 16],
    );
    write_imm.0.base.flags = Flags::ACK_REQUEST;
    write_imm.0.solicited = true;
    let send = data(OpHeader::Send { recv_index: 2 }, 10, 5, 0, b"hello");
    let mut send_imm = data(
        OpHeader::SendImm {
            recv_index: 3,
            imm: 42,
        },
        11,
        8,
        0,
        b"metaroce",
    );
    send_imm.0.msg_seq = 4;
    let read_req = data(
        OpHeader::ReadRequest {
            rkey: RKEY,
            remote_addr: ADDR,
        },
        12,
        4096,
        0,
        &[],
    );
    let mut read_resp = data(OpHeader::ReadResponse, 100, 4096, 1024, &[0xab; 12]);
    read_resp.0.base.flags = Flags::RETRANSMIT;
    read_resp.0.base.path_slot = 0;
    let fetch_add = data(
        OpHeader::FetchAdd {
            rkey: RKEY,
            remote_addr: ADDR + 8,
            add: 1,
        },
        13,
        8,
        0,
        &[],
    );
    let cmp_swap = data(
        OpHeader::CmpSwap {
            rkey: RKEY,
            remote_addr: ADDR + 16,
            compare: 0,
            swap: 0xffff_ffff_0000_0001,
        },
        14,
        8,
        0,
        &[],
    );
    let atomic_resp = data(
        OpHeader::AtomicResponse {
            original: 0x0123_4567_89ab_cdef,
        },
        200,
        8,
        0,
        &[],
    );
    let mut ack = AckRepr::new(base(Flags::empty()));
    ack.ack_psn = 100;
    ack.ts_echo = 0x0102_0304;
    ack.ack_delay_ns = 2500;
    ack.rx_packets = 103;
    ack.ce_packets = 1;
    ack.rate_hint_mbps = 40_000;
    ack.sack.set(0); // psn 101
    ack.sack.set(9); // psn 110
    ack.push_op_ack(OpAck {
        qpn: 0x11,
        msn: 4,
        syndrome: Syndrome::Ack,
        nak_msg_seq: 0,
    });
    ack.push_op_ack(OpAck {
        qpn: 0x12,
        msn: 7,
        syndrome: Syndrome::RnrNak,
        nak_msg_seq: 7,
    });

    let mut ack_no_sack = AckRepr::new(base(Flags::empty()));
    ack_no_sack.ack_psn = 100;
    ack_no_sack.ts_echo = 0x0102_0304;
    ack_no_sack.ack_delay_ns = 2500;
    ack_no_sack.rx_packets = 100;
    ack_no_sack.push_op_ack(OpAck {
        qpn: 0x11,
        msn: 4,
        syndrome: Syndrome::Ack,
        nak_msg_seq: 0,
    });

    let write_bytes = emit_d(&write);
    let ack_bytes = emit_a(&ack);
    let mut read_req_payload = read_req.clone();
    read_req_payload.0.payload_len = 4;
    read_req_payload.1 = vec![1, 2, 3, 4];

    let case = |name: &str, about, expect, fields, bytes| Case {
        name: name.to_owned(),
        about,
        expect,
        fields,
        bytes,
    };
    vec![
        case(
            "write-first-segment",
            vec![
                "RDMA WRITE, first of three 16-byte segments of a 48-byte message.",
                "path slot 3 gen 1, device port 4791, no flags; ext: rkey, remote_addr.",
                "payload: bytes 00..0f.",
            ],
            "Data opcode=Write psn=7 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=48 payload_len=16",
            Some(
                "slot=3 gen=1 port=4791 flags=0 timestamp_ns=0x01020304 rkey=0x123456789abc remote_addr=0x7f00dead0000",
            ),
            write_bytes.clone(),
        ),
        case(
            "write-imm-last-segment",
            vec![
                "RDMA WRITE with immediate, last 16-byte segment of a 48-byte message.",
                "ACK_REQUEST flag set (end of burst); SOLICITED op flag set.",
                "ext: rkey, remote_addr, recv_index 5, imm 0xcafef00d.",
            ],
            "Data opcode=WriteImm psn=9 dst_qpn=0x11 msg_seq=3 offset=32 msg_len=48 payload_len=16",
            Some(
                "flags=1 solicited=true rkey=0x123456789abc remote_addr=0x7f00dead0000 recv_index=5 imm=0xcafef00d",
            ),
            emit_d(&write_imm),
        ),
        case(
            "send",
            vec!["SEND of the 5-byte message \"hello\" into receive index 2."],
            "Data opcode=Send psn=10 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=5 payload_len=5",
            Some("recv_index=2"),
            emit_d(&send),
        ),
        case(
            "send-imm",
            vec!["SEND with immediate 42 of the 8-byte message \"metaroce\" into receive index 3."],
            "Data opcode=SendImm psn=11 dst_qpn=0x11 msg_seq=4 offset=0 msg_len=8 payload_len=8",
            Some("recv_index=3 imm=42"),
            emit_d(&send_imm),
        ),
        case(
            "read-request",
            vec![
                "RDMA READ request for 4096 bytes; msg_len is the length to read.",
                "No payload: the request is header only.",
            ],
            "Data opcode=ReadRequest psn=12 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=4096 payload_len=0",
            Some("rkey=0x123456789abc remote_addr=0x7f00dead0000"),
            emit_d(&read_req),
        ),
        case(
            "read-response",
            vec![
                "RDMA READ response segment: 12 bytes at offset 1024 of 4096, on path slot 0.",
                "RETRANSMIT flag set: this segment was sent before. Empty extension.",
            ],
            "Data opcode=ReadResponse psn=100 dst_qpn=0x11 msg_seq=3 offset=1024 msg_len=4096 payload_len=12",
            Some("slot=0 flags=2"),
            emit_d(&read_resp),
        ),
        case(
            "fetch-add",
            vec!["Atomic fetch-and-add of 1 to the word at remote_addr; msg_len 8, offset 0."],
            "Data opcode=FetchAdd psn=13 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=8 payload_len=0",
            Some("rkey=0x123456789abc remote_addr=0x7f00dead0008 add=1"),
            emit_d(&fetch_add),
        ),
        case(
            "cmp-swap",
            vec!["Atomic compare-and-swap: if the word is 0, write 0xffffffff00000001."],
            "Data opcode=CmpSwap psn=14 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=8 payload_len=0",
            Some(
                "rkey=0x123456789abc remote_addr=0x7f00dead0010 compare=0 swap=0xffffffff00000001",
            ),
            emit_d(&cmp_swap),
        ),
        case(
            "atomic-response",
            vec!["Atomic response carrying the word's original value."],
            "Data opcode=AtomicResponse psn=200 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=8 payload_len=0",
            Some("original=0x0123456789abcdef"),
            emit_d(&atomic_resp),
        ),
        case(
            "ack-sack-op-acks",
            vec![
                "ACK for path slot 3 gen 1: psn < 100 received, 100 missing, 101 and 110 received",
                "(SACK bits 0 and 9). Two op acks: QP 0x11 executed msg_seq < 4;",
                "QP 0x12 executed msg_seq < 7 and got RNR NAK for msg_seq 7 (no receive posted).",
            ],
            "Ack ack_psn=100 op_ack_count=2",
            Some(
                "slot=3 gen=1 ts_echo=0x01020304 ack_delay_ns=2500 rx_packets=103 ce_packets=1 rate_hint_mbps=40000 sack=0,9 op0=0x11:4:Ack:0 op1=0x12:7:RnrNak:7",
            ),
            ack_bytes.clone(),
        ),
        case(
            "ack-no-sack",
            vec![
                "ACK for path slot 3 gen 1 with nothing to SACK: every psn < 100 received.",
                "SACK_ABSENT (flags bit 7) is set and the bitmap left out, so the op-ack",
                "count follows the rate hint at offset 32. One op ack: QP 0x11 executed",
                "msg_seq < 4.",
            ],
            "Ack ack_psn=100 op_ack_count=1",
            Some(
                "slot=3 gen=1 ts_echo=0x01020304 ack_delay_ns=2500 rx_packets=100 ce_packets=0 rate_hint_mbps=0 op0=0x11:4:Ack:0",
            ),
            emit_a(&ack_no_sack),
        ),
        case(
            "invalid-empty-sack-present",
            vec![
                "The ACK vector with every SACK bit cleared but the bitmap still present:",
                "an empty bitmap must be sent absent (one encoding per ACK).",
            ],
            "Malformed(\"sack\")",
            None,
            resealed(ack_bytes.clone(), |b| b[32..64].fill(0)),
        ),
        case(
            "invalid-bad-version",
            vec!["The write-first-segment vector with version 2 (ICRC recomputed)."],
            "BadVersion(2)",
            None,
            resealed(write_bytes.clone(), |b| b[0] = 2),
        ),
        case(
            "invalid-bad-type",
            vec!["The write-first-segment vector with packet type 3 (ICRC recomputed)."],
            "BadType(3)",
            None,
            resealed(write_bytes.clone(), |b| b[1] = 3),
        ),
        case(
            "invalid-bad-opcode",
            vec!["The write-first-segment vector with opcode 9 (ICRC recomputed)."],
            "BadOpcode(9)",
            None,
            resealed(write_bytes.clone(), |b| b[24] = 9),
        ),
        case(
            "invalid-bad-checksum",
            vec!["The write-first-segment vector with bit 0 of the first payload byte flipped."],
            "BadChecksum",
            None,
            {
                let mut b = write_bytes.clone();
                b[52] ^= 1;
                b
            },
        ),
        case(
            "invalid-truncated",
            vec![
                "The first 24 bytes of the write-first-segment vector (cut inside the data header).",
            ],
            "Truncated",
            None,
            write_bytes[..24].to_vec(),
        ),
        case(
            "invalid-truncated-ack",
            vec![
                "The ACK vector cut after its first op-ack entry (count still 2), ICRC recomputed.",
            ],
            "Truncated",
            None,
            resealed(ack_bytes[..68 + 16].to_vec(), |b| b.extend([0; 4])),
        ),
        case(
            "invalid-read-request-payload",
            vec!["A READ request carrying 4 payload bytes, which READ requests must not."],
            "Malformed(\"payload_len\")",
            None,
            emit_d(&read_req_payload),
        ),
        case(
            "invalid-offset-beyond-msg-len",
            vec!["The write-first-segment vector with offset 40: 40 + 16 > msg_len 48."],
            "Malformed(\"offset\")",
            None,
            resealed(write_bytes.clone(), |b| b[35] = 40),
        ),
        case(
            "invalid-too-many-op-acks",
            vec![
                "An ACK without SACK bitmap announcing 17 op acks (the maximum is 16),",
                "with 17 zero entries.",
            ],
            "Malformed(\"op_ack_count\")",
            None,
            resealed(emit_a(&AckRepr::new(base(Flags::empty()))), |b| {
                b[32] = 17;
                b.resize(36 + 17 * 16 + 4, 0);
            }),
        ),
        case(
            "invalid-ack-length",
            vec!["The ACK vector with one stray byte before the ICRC."],
            "Malformed(\"ack length\")",
            None,
            resealed(ack_bytes.clone(), |b| b.insert(b.len() - 4, 0)),
        ),
        case(
            "invalid-authenticated-needs-key",
            vec![
                "The write-first-segment vector with AUTHENTICATED set and a zero trailer:",
                "a packet whose integrity only the key holder can check is not parsed plain.",
            ],
            "NeedsKey",
            None,
            {
                let mut auth = write.clone();
                auth.0.base.flags = Flags::AUTHENTICATED;
                emit_d(&auth)
            },
        ),
        case(
            "invalid-unknown-syndrome",
            vec!["The ACK vector with syndrome 5 in its second op ack."],
            "Malformed(\"syndrome\")",
            None,
            resealed(ack_bytes, |b| b[68 + 16 + 8] = 5),
        ),
    ]
}

fn render(case: &Case) -> String {
    let mut text = String::new();
    for line in &case.about {
        writeln!(text, "# {line}").unwrap();
    }
    writeln!(text, "# expect: {}", case.expect).unwrap();
    if let Some(fields) = case.fields {
        writeln!(text, "# fields: {fields}").unwrap();
    }
    for word in case.bytes.chunks(4) {
        let hex: Vec<String> = word.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(text, "{}", hex.join(" ")).unwrap();
    }
    text
}

// ----------------------------------------------------- authenticated vectors

/// `docs/spec/vectors/auth/`: authenticated packets, generated (with real
/// tags) by the protocol crate's `auth_vectors` test, which also checks the
/// tags. Here: structure and fields through `parse_authenticated`, the
/// packet number and tag (`pn`, `tag`), refusal by the plain `parse`, and
/// re-encoding byte for byte.
#[test]
fn auth_vectors_parse() {
    let dir = vectors_dir().join("auth");
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("docs/spec/vectors/auth exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "hex"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 4, "only {} auth vectors", paths.len());
    for path in paths {
        let vector = read_vector(&path);
        let name = &vector.name;
        let result = parse_authenticated(&vector.bytes);
        if name.starts_with("invalid-") {
            let err = result.expect_err(name);
            assert_eq!(format!("{err:?}"), vector.expect, "{name}");
            continue;
        }
        assert_eq!(parse(&vector.bytes), Err(Error::NeedsKey), "{name}");
        let (packet, auth) = result.unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let kind = match packet {
            Packet::Data { .. } => "Data",
            Packet::Ack(_) => "Ack",
        };
        assert_eq!(kind, vector.expect, "{name}");
        assert!(packet.base().flags.contains(Flags::AUTHENTICATED), "{name}");
        for (key, expected) in &vector.fields {
            let actual = match key.as_str() {
                "pn" => auth.packet_number.to_string(),
                "tag" => format!(
                    "0x{}",
                    auth.tag
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                ),
                _ => actual(&packet, key)
                    .unwrap_or_else(|| panic!("{name}: field `{key}` does not apply")),
            };
            let same = if key == "tag" {
                *expected == actual
            } else {
                same_value(expected, &actual)
            };
            assert!(same, "{name}: {key} expected {expected}, decoded {actual}");
        }
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.emit(&mut buf);
        auth.emit(&mut AuthTrailer::new_unchecked(&mut buf[..]));
        assert_eq!(buf, vector.bytes, "{name}: re-encoding differs");
    }
}

#[test]
#[ignore = "rewrites docs/spec/vectors and fuzz/corpus; run by hand"]
fn regenerate_vectors() {
    let dir = vectors_dir();
    for path in vector_paths() {
        fs::remove_file(path).unwrap();
    }
    fs::create_dir_all(corpus_dir()).unwrap();
    for case in cases() {
        let path = dir.join(format!("{}.hex", case.name));
        fs::write(&path, render(&case)).unwrap();
        // Never commit a vector the decoder disagrees with.
        check(&read_vector(&path));
        if !case.name.starts_with("invalid-") {
            fs::write(corpus_dir().join(&case.name), &case.bytes).unwrap();
        }
    }
}
