//! Stable-toolchain companions of the `endpoint_packets` fuzz target:
//! replay its committed corpus (and any kept crash reproducers, which must
//! pass once their bug is fixed), check the input format round-trips, and
//! (ignored) regenerate the seed corpus.
//!
//! `cd fuzz && cargo test` runs them; `cargo test -- --ignored
//! write_seed_corpus` rewrites `corpus/endpoint_packets/seed-*`.

mod common;

use std::fs;
use std::path::Path;

use common::{files, replay_corpus};
use metaroce_fuzz::endpoint::{
    AckStep, Addr, DataStep, Key, OpAckStep, OpStep, Origin, Qpn, SendStep, Step, decode, encode,
    run,
};

fn corpus_dir() -> std::path::PathBuf {
    common::corpus_dir("endpoint_packets")
}

fn data(
    origin: Origin,
    msg_seq: i8,
    psn_delta: i16,
    msg_len: u16,
    offset: u16,
    payload_len: u16,
    op: OpStep,
) -> Step {
    Step::Data(DataStep {
        origin,
        flags: 0x01,
        slot: 0,
        generation: 0,
        psn_delta,
        floor_delta: 0,
        timestamp: 1234,
        qpn: Qpn::Ours,
        msg_seq,
        solicited: false,
        floor_acked: false,
        msg_len,
        offset,
        payload_len,
        fill: 7,
        op,
    })
}

fn ack(op_acks: Vec<OpAckStep>, ack_psn_delta: i16, sack: Vec<u8>) -> Step {
    Step::Ack(AckStep {
        origin: Origin::default(),
        flags: 0,
        slot: 0,
        generation: 0,
        ack_psn_delta,
        sack,
        ts_echo: 0,
        ack_delay_ns: 100,
        rx_packets: 2,
        ce_packets: 0,
        rate_hint_mbps: 0,
        op_acks,
    })
}

fn op_ack(msn: i8, syndrome: u8, nak_msg_seq: i8) -> OpAckStep {
    OpAckStep {
        qpn: Qpn::Ours,
        msn,
        syndrome,
        nak_msg_seq,
    }
}

fn post(kind: u8, len: u16, key: Key, addr: Addr) -> Step {
    Step::PostSend(SendStep {
        kind,
        local_offset: 512,
        len,
        key,
        addr,
        inline: false,
        operand: 3,
    })
}

/// Echo every recent transmit back `rounds` times, with timers in between:
/// the self-looped QP then runs whole exchanges against itself.
fn loopback(rounds: u8) -> Vec<Step> {
    let mut steps = Vec::new();
    for round in 0..rounds {
        for index in 0..8 {
            steps.push(Step::Echo {
                index: index + round,
                flip: None,
            });
        }
        steps.push(Step::Advance { ns: 5_000 });
    }
    steps
}

/// Hand-written seeds: one per feature the fuzzer should start from.
fn seeds() -> Vec<(&'static str, Vec<Step>)> {
    let o = Origin::default();
    let main = |off| Addr::Main(off);
    let mut out = vec![
        ("timeouts-only", vec![Step::FireTimer; 12]),
        ("loopback-write-read", loopback(4)),
        (
            "send-into-receive",
            vec![
                data(o, 0, 0, 100, 0, 100, OpStep::Send { recv: 0 }),
                Step::FireTimer,
            ],
        ),
        (
            // A WRITE of four segments, the third withheld, then a repair
            // packet (flag 0x40; the harness turns the offset into shard
            // 0 of 1): the receiver holds the shard and tries a rebuild.
            "write-with-repair",
            {
                let write = || OpStep::Write {
                    key: Key::Main,
                    addr: main(300),
                };
                let mut repair = data(o, 0, 4, 1024, 0, 256, write());
                if let Step::Data(d) = &mut repair {
                    d.flags = 0x40;
                }
                vec![
                    repair,
                    data(o, 0, 0, 1024, 0, 256, write()),
                    data(o, 0, 1, 1024, 256, 256, write()),
                    data(o, 0, 3, 1024, 768, 256, write()),
                ]
            },
        ),
        (
            "send-two-segments",
            vec![
                data(o, 0, 0, 400, 256, 144, OpStep::SendImm { recv: 0, imm: 9 }),
                data(o, 0, 1, 400, 0, 256, OpStep::SendImm { recv: 0, imm: 9 }),
            ],
        ),
        (
            "remote-write-then-read",
            vec![
                data(
                    o,
                    0,
                    0,
                    64,
                    0,
                    64,
                    OpStep::Write {
                        key: Key::Main,
                        addr: main(100),
                    },
                ),
                data(
                    o,
                    1,
                    1,
                    64,
                    0,
                    0,
                    OpStep::ReadRequest {
                        key: Key::Main,
                        addr: main(100),
                    },
                ),
            ],
        ),
        (
            "write-canary-key",
            vec![data(
                o,
                0,
                0,
                32,
                0,
                32,
                OpStep::Write {
                    key: Key::Canary,
                    addr: Addr::Canary(0),
                },
            )],
        ),
        (
            // ICRC left to the UDP checksum: the payloads are placed
            // directly; the repeated segment (its bytes arrived) and the
            // canary (no remote right) are not.
            "direct-write-segments",
            [
                (0, 0, 256, Key::Main, main(0)),
                (1, 0, 0, Key::Main, main(0)),
                (1, 0, 0, Key::Main, main(0)),
                (2, 1, 0, Key::Canary, Addr::Canary(0)),
            ]
            .into_iter()
            .map(|(psn, seq, off, key, addr)| {
                let mut step = data(o, seq, psn, 512, off, 256, OpStep::Write { key, addr });
                if let Step::Data(d) = &mut step {
                    d.flags |= 0x10;
                }
                step
            })
            .collect(),
        ),
        (
            "write-past-end",
            vec![data(
                o,
                0,
                0,
                64,
                0,
                64,
                OpStep::Write {
                    key: Key::Main,
                    addr: main(16 * 1024 - 32),
                },
            )],
        ),
        (
            "atomics",
            vec![
                data(
                    o,
                    0,
                    0,
                    8,
                    0,
                    0,
                    OpStep::FetchAdd {
                        key: Key::Main,
                        addr: main(64),
                        add: 5,
                    },
                ),
                data(
                    o,
                    1,
                    1,
                    8,
                    0,
                    0,
                    OpStep::CmpSwap {
                        key: Key::Main,
                        addr: main(64),
                        compare: 0,
                        swap: 1,
                    },
                ),
                data(
                    o,
                    2,
                    2,
                    8,
                    0,
                    0,
                    OpStep::FetchAdd {
                        key: Key::Main,
                        addr: main(65),
                        add: 5,
                    },
                ),
            ],
        ),
        (
            "write-imm-consumes-receive",
            vec![data(
                o,
                0,
                0,
                16,
                0,
                16,
                OpStep::WriteImm {
                    key: Key::Main,
                    addr: main(0),
                    recv: 0,
                    imm: 1,
                },
            )],
        ),
        (
            "rnr-send-beyond-receives",
            vec![
                data(o, 0, 0, 16, 0, 16, OpStep::Send { recv: 9 }),
                Step::FireTimer,
                Step::FireTimer,
            ],
        ),
        (
            "ack-completes-write",
            vec![ack(vec![op_ack(1, 0, 0)], 2, vec![])],
        ),
        (
            "read-response",
            vec![
                data(o, 1, 0, 300, 0, 256, OpStep::ReadResponse),
                data(o, 1, 1, 300, 256, 44, OpStep::ReadResponse),
                ack(vec![op_ack(2, 0, 0)], 4, vec![0b101]),
            ],
        ),
        (
            "nak-remote-access",
            vec![ack(vec![op_ack(0, 2, 0)], 0, vec![])],
        ),
        (
            "rnr-nak",
            vec![
                ack(vec![op_ack(0, 1, 0)], 0, vec![]),
                Step::FireTimer,
                Step::FireTimer,
            ],
        ),
        (
            "post-every-kind-loopback",
            [
                vec![
                    Step::PostRecv {
                        offset: 10_000,
                        len: 600,
                    },
                    post(1, 40, Key::Main, main(3000)),
                    post(2, 40, Key::Main, main(0)),
                    post(3, 40, Key::Main, main(0)),
                    post(5, 8, Key::Main, main(128)),
                    post(6, 8, Key::Main, main(136)),
                ],
                loopback(6),
            ]
            .concat(),
        ),
        (
            "qp-error",
            vec![
                Step::QpError,
                Step::PostRecv { offset: 0, len: 8 },
                Step::FireTimer,
            ],
        ),
    ];
    // A few corrupted echoes, and raw seeds from the wire corpus.
    out.push((
        "echo-flipped",
        (0..16)
            .map(|i| Step::Echo {
                index: i,
                flip: Some((u16::from(i) * 5, 0x40)),
            })
            .collect(),
    ));
    let wire_corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/parse_packet");
    let raw: Vec<Step> = files(&wire_corpus)
        .iter()
        .map(|p| Step::Raw {
            src_port: 4800,
            bytes: fs::read(p).unwrap(),
        })
        .collect();
    out.push(("raw-wire-corpus", raw));
    out
}

#[test]
fn format_round_trips() {
    for (name, steps) in seeds() {
        assert_eq!(decode(&encode(&steps)), steps, "{name}");
    }
}

#[test]
fn seeds_run_clean() {
    for (name, steps) in seeds() {
        eprintln!("seed {name}");
        run(&encode(&steps));
    }
}

#[test]
fn corpus_passes() {
    replay_corpus("endpoint_packets", 10, |input| {
        run(input);
    });
}

/// Three SENDs that all name receive index 0, arriving last-first while two
/// receives are posted: each passes the "receive posted" check on its own,
/// then the responder completes all three in order and pops three receives
/// from a queue of two (`ops.rs`, `advance_msn`: "matched at first packet").
fn duplicate_recv_index() -> Vec<Step> {
    let o = Origin::default();
    (0..3)
        .map(|i| data(o, 2 - i, i as i16, 8, 0, 8, OpStep::Send { recv: 0 }))
        .collect()
}

#[test]
fn duplicate_recv_index_does_not_panic() {
    run(&encode(&duplicate_recv_index()));
}

/// Every reproducer kept in `artifacts-kept/endpoint_packets-*` must run
/// clean once its bug is fixed.
#[test]
fn kept_reproducers_pass() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts-kept");
    for path in files(&dir) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("endpoint_packets-") {
            eprintln!("replaying {name}");
            run(&fs::read(&path).unwrap());
        }
    }
}

#[test]
#[ignore = "writes artifacts-kept/endpoint_packets-duplicate-recv-index; run by hand"]
fn write_known_reproducer() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts-kept");
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("endpoint_packets-duplicate-recv-index"),
        encode(&duplicate_recv_index()),
    )
    .unwrap();
}

#[test]
#[ignore = "rewrites corpus/endpoint_packets/seed-*; run by hand"]
fn write_seed_corpus() {
    let dir = corpus_dir();
    fs::create_dir_all(&dir).unwrap();
    for (name, steps) in seeds() {
        fs::write(dir.join(format!("seed-{name}")), encode(&steps)).unwrap();
    }
}
