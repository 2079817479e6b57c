//! Test vectors for packet authentication, `docs/spec/vectors/auth/`.
//!
//! Each file is a datagram in the format of `docs/spec/vectors/README.md`
//! plus the inputs that protect it:
//!
//! ```text
//! # key: secret=HEX sender=IP:PORT sender_session=N receiver=IP:PORT receiver_session=N encrypt=BOOL
//! # derived_key: HEX          (HKDF-SHA256 output, see metaroce_proto::auth)
//! # plaintext: HEX            (encrypted vectors: the payload before encryption)
//! # verify: accept | reject   (whether the tag verifies under that key)
//! ```
//!
//! `auth_vectors_verify` derives the key, checks it against `derived_key`,
//! and checks the tag (and the decryption) as `verify` says. The wire crate's
//! vector test checks the same files' structure and fields.
//! `regenerate_auth_vectors` (ignored) rewrites them:
//!
//! ```text
//! cargo test -p metaroce-proto --test auth_vectors -- --ignored regenerate_auth_vectors
//! ```

use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use metaroce_proto::auth::{derive_key, open_with_key, seal_with_key};
use metaroce_wire::{
    AckRepr, BaseRepr, DataRepr, Flags, OpAck, OpHeader, Syndrome, emit_ack, emit_data,
};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/spec/vectors/auth")
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/parse_packet")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn number(text: &str) -> u64 {
    match text.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => text.parse().unwrap(),
    }
}

struct KeyInputs {
    secret: [u8; 32],
    sender: SocketAddr,
    sender_session: u64,
    receiver: SocketAddr,
    receiver_session: u64,
    encrypt: bool,
}

impl KeyInputs {
    fn key(&self) -> [u8; 32] {
        derive_key(
            &self.secret,
            (self.sender, self.sender_session),
            (self.receiver, self.receiver_session),
        )
    }

    fn line(&self) -> String {
        format!(
            "secret={} sender={} sender_session={:#x} receiver={} receiver_session={:#x} encrypt={}",
            hex(&self.secret),
            self.sender,
            self.sender_session,
            self.receiver,
            self.receiver_session,
            self.encrypt
        )
    }

    fn parse(line: &str) -> Self {
        let mut k = Self {
            secret: [0; 32],
            sender: "0.0.0.0:0".parse().unwrap(),
            sender_session: 0,
            receiver: "0.0.0.0:0".parse().unwrap(),
            receiver_session: 0,
            encrypt: false,
        };
        for pair in line.split_whitespace() {
            let (key, value) = pair.split_once('=').expect("key=value");
            match key {
                "secret" => k.secret.copy_from_slice(&unhex(value)),
                "sender" => k.sender = value.parse().unwrap(),
                "sender_session" => k.sender_session = number(value),
                "receiver" => k.receiver = value.parse().unwrap(),
                "receiver_session" => k.receiver_session = number(value),
                "encrypt" => k.encrypt = value.parse().unwrap(),
                other => panic!("unknown key input {other}"),
            }
        }
        k
    }
}

struct Case {
    name: &'static str,
    about: Vec<&'static str>,
    expect: &'static str,
    fields: String,
    inputs: KeyInputs,
    plaintext: Option<Vec<u8>>,
    accept: bool,
    bytes: Vec<u8>,
}

fn inputs(encrypt: bool) -> KeyInputs {
    KeyInputs {
        secret: core::array::from_fn(|i| i as u8),
        sender: "10.0.0.1:4791".parse().unwrap(),
        sender_session: 0x1111_2222_3333_4444,
        receiver: "10.0.0.2:4791".parse().unwrap(),
        receiver_session: 0x5555_6666_7777_8888,
        encrypt,
    }
}

fn write_repr() -> DataRepr {
    DataRepr {
        base: BaseRepr {
            flags: Flags::AUTHENTICATED,
            path_slot: 3,
            path_gen: 1,
            src_device_port: 4791,
        },
        psn: 7,
        timestamp_ns: 0x0102_0304,
        dst_qpn: 0x11,
        msg_seq: 3,
        solicited: false,
        psn_floor_delta: 0,
        floor_acked: false,
        msg_len: 48,
        offset: 0,
        op: OpHeader::Write {
            rkey: 0x0000_1234_5678_9abc,
            remote_addr: 0x0000_7f00_dead_0000,
        },
        payload_len: 16,
    }
}

fn sealed_data(repr: &DataRepr, payload: &[u8], inputs: &KeyInputs, pn: u64) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    emit_data(repr, payload, &mut buf);
    seal_with_key(&inputs.key(), inputs.encrypt, &mut buf, pn).unwrap();
    buf
}

fn tag_field(bytes: &[u8]) -> String {
    format!("tag=0x{}", hex(&bytes[bytes.len() - 16..]))
}

fn cases() -> Vec<Case> {
    let payload: Vec<u8> = (0u8..16).collect();
    let write = sealed_data(&write_repr(), &payload, &inputs(false), 5);
    let encrypted = sealed_data(&write_repr(), &payload, &inputs(true), 6);
    let mut ack = AckRepr::new(BaseRepr {
        flags: Flags::AUTHENTICATED,
        path_slot: 3,
        path_gen: 1,
        src_device_port: 4791,
    });
    ack.ack_psn = 100;
    ack.ts_echo = 0x0102_0304;
    ack.ack_delay_ns = 2500;
    ack.rx_packets = 103;
    ack.sack.set(0);
    ack.push_op_ack(OpAck {
        qpn: 0x11,
        msn: 4,
        syndrome: Syndrome::Ack,
        nak_msg_seq: 0,
    });
    let mut ack_bytes = vec![0u8; ack.buffer_len()];
    emit_ack(&ack, &mut ack_bytes);
    // The ACK goes the other way: the WRITE's receiver sends it.
    let ack_inputs = KeyInputs {
        sender: inputs(false).receiver,
        sender_session: inputs(false).receiver_session,
        receiver: inputs(false).sender,
        receiver_session: inputs(false).sender_session,
        ..inputs(false)
    };
    seal_with_key(&ack_inputs.key(), false, &mut ack_bytes, 9).unwrap();
    let mut tampered = write.clone();
    tampered[52] ^= 1; // first payload byte
    let reflected = write.clone();
    // Headers (52 bytes) and 20 more: too short for the 24-byte trailer.
    let truncated = write[..72].to_vec();
    let write_fields = |bytes: &[u8], pn| {
        format!(
            "slot=3 gen=1 port=4791 flags=8 rkey=0x123456789abc remote_addr=0x7f00dead0000 pn={pn} {}",
            tag_field(bytes)
        )
    };
    vec![
        Case {
            name: "write-authenticated",
            about: vec![
                "The write-first-segment WRITE with AUTHENTICATED set: payload in the clear,",
                "tag = the AES-256-GCM tag of encrypting the payload with the headers as AAD.",
                "Packet number 5; the trailer replaces the ICRC.",
            ],
            expect: "Data opcode=Write psn=7 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=48 payload_len=16",
            fields: write_fields(&write, 5),
            inputs: inputs(false),
            plaintext: None,
            accept: true,
            bytes: write.clone(),
        },
        Case {
            name: "write-encrypted",
            about: vec![
                "The same WRITE with payload encryption: the 16 payload bytes are AES-GCM",
                "ciphertext, the headers associated data. Packet number 6.",
            ],
            expect: "Data opcode=Write psn=7 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=48 payload_len=16",
            fields: write_fields(&encrypted, 6),
            inputs: inputs(true),
            plaintext: Some(payload.clone()),
            accept: true,
            bytes: encrypted,
        },
        Case {
            name: "ack-authenticated",
            about: vec![
                "An authenticated ACK from the WRITE's receiver back to its sender (the key",
                "of that direction: sender and receiver swapped). Packet number 9.",
            ],
            expect: "Ack ack_psn=100 op_ack_count=1",
            fields: format!(
                "slot=3 gen=1 flags=8 sack=0 op0=0x11:4:Ack:0 pn=9 {}",
                tag_field(&ack_bytes)
            ),
            inputs: ack_inputs,
            plaintext: None,
            accept: true,
            bytes: ack_bytes,
        },
        Case {
            name: "write-tampered",
            about: vec![
                "write-authenticated with bit 0 of the first payload byte flipped: well formed,",
                "but the tag does not verify.",
            ],
            expect: "Data opcode=Write psn=7 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=48 payload_len=16",
            fields: write_fields(&tampered, 5),
            inputs: inputs(false),
            plaintext: None,
            accept: false,
            bytes: tampered,
        },
        Case {
            name: "write-reflected",
            about: vec![
                "write-authenticated checked with the key of the other direction (as if sent",
                "back to its sender): the tag does not verify.",
            ],
            expect: "Data opcode=Write psn=7 dst_qpn=0x11 msg_seq=3 offset=0 msg_len=48 payload_len=16",
            fields: write_fields(&reflected, 5),
            inputs: KeyInputs {
                sender: inputs(false).receiver,
                sender_session: inputs(false).receiver_session,
                receiver: inputs(false).sender,
                receiver_session: inputs(false).sender_session,
                ..inputs(false)
            },
            plaintext: None,
            accept: false,
            bytes: reflected,
        },
        Case {
            name: "invalid-truncated",
            about: vec![
                "write-authenticated cut to 72 bytes: the headers (52) leave 20 bytes, less",
                "than the 24-byte authentication trailer.",
            ],
            expect: "Truncated",
            fields: String::new(),
            inputs: inputs(false),
            plaintext: None,
            accept: false,
            bytes: truncated,
        },
    ]
}

fn render(case: &Case) -> String {
    let mut text = String::new();
    for line in &case.about {
        writeln!(text, "# {line}").unwrap();
    }
    writeln!(text, "# key: {}", case.inputs.line()).unwrap();
    writeln!(text, "# derived_key: {}", hex(&case.inputs.key())).unwrap();
    if let Some(p) = &case.plaintext {
        writeln!(text, "# plaintext: {}", hex(p)).unwrap();
    }
    writeln!(
        text,
        "# verify: {}",
        if case.accept { "accept" } else { "reject" }
    )
    .unwrap();
    writeln!(text, "# expect: {}", case.expect).unwrap();
    if !case.fields.is_empty() {
        writeln!(text, "# fields: {}", case.fields).unwrap();
    }
    for word in case.bytes.chunks(4) {
        let h: Vec<String> = word.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(text, "{}", h.join(" ")).unwrap();
    }
    text
}

fn verify_file(path: &Path) {
    let text = fs::read_to_string(path).unwrap();
    let name = path.display();
    let mut inputs = None;
    let mut derived = None;
    let mut plaintext = None;
    let mut accept = None;
    let mut bytes = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(c) = line.strip_prefix('#') {
            let c = c.trim();
            if let Some(v) = c.strip_prefix("key:") {
                inputs = Some(KeyInputs::parse(v));
            } else if let Some(v) = c.strip_prefix("derived_key:") {
                derived = Some(unhex(v.trim()));
            } else if let Some(v) = c.strip_prefix("plaintext:") {
                plaintext = Some(unhex(v.trim()));
            } else if let Some(v) = c.strip_prefix("verify:") {
                accept = Some(v.trim() == "accept");
            }
        } else {
            bytes.extend(line.chars().filter(|c| !c.is_whitespace()));
        }
    }
    let inputs = inputs.unwrap_or_else(|| panic!("{name}: no key line"));
    let datagram = unhex(&bytes);
    assert_eq!(
        derived.as_deref(),
        Some(&inputs.key()[..]),
        "{name}: derived key"
    );
    let opened = open_with_key(&inputs.key(), inputs.encrypt, &datagram);
    assert_eq!(opened.is_some(), accept.unwrap(), "{name}: tag verdict");
    if let (Some(opened), Some(plaintext)) = (opened, plaintext) {
        assert_eq!(opened, plaintext, "{name}: decrypted payload");
    }
}

#[test]
fn auth_vectors_verify() {
    let mut paths: Vec<_> = fs::read_dir(dir())
        .expect("docs/spec/vectors/auth exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "hex"))
        .collect();
    paths.sort();
    let cases = cases();
    assert_eq!(paths.len(), cases.len(), "run regenerate_auth_vectors");
    for case in &cases {
        let path = dir().join(format!("{}.hex", case.name));
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            render(case),
            "{}: run regenerate_auth_vectors",
            case.name
        );
    }
    for path in paths {
        verify_file(&path);
    }
}

#[test]
#[ignore = "rewrites docs/spec/vectors/auth and fuzz/corpus/parse_packet/auth-*; run by hand"]
fn regenerate_auth_vectors() {
    fs::create_dir_all(dir()).unwrap();
    for case in cases() {
        let path = dir().join(format!("{}.hex", case.name));
        fs::write(&path, render(&case)).unwrap();
        verify_file(&path);
        if case.accept {
            fs::write(
                corpus_dir().join(format!("auth-{}", case.name)),
                &case.bytes,
            )
            .unwrap();
        }
    }
}
