//! The Wireshark dissector (`tools/wireshark/metaroce.lua`) against captures
//! written by this crate: tshark must decode every field of packets built
//! with the wire crate to the values they were built with, and flag broken
//! packets.
//!
//! Needs Debian's `tshark`. Without it the tests print why and pass, so the
//! README's `cargo test --workspace` works with Rust alone; CI sets
//! `METAROCE_REQUIRE_TSHARK=1` (and installs tshark), which turns a missing
//! tshark into a failure.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;

use metaroce_capture::{DEFAULT_SNAPLEN, Ecn, PcapWriter};
use metaroce_wire::{
    AckRepr, AuthRepr, AuthTrailer, BaseRepr, DataRepr, Flags, OpAck, OpHeader, RepairId, SackBits,
    Syndrome, emit_ack, emit_data,
};

/// MetaRoCE's default device port, where the dissector registers.
const PORT: u16 = 4793;
/// IANA's RoCEv2 port, which Wireshark gives to InfiniBand: only the
/// heuristic (tried first) decodes MetaRoCE there.
const ROCEV2_PORT: u16 = 4791;
/// Wireshark's expert severities, as tshark prints them.
const EXPERT_WARN: u32 = 0x0060_0000;
const EXPERT_ERROR: u32 = 0x0080_0000;

// ----------------------------------------------------------------- tshark

fn dissector() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/wireshark/metaroce.lua")
}

/// Whether tshark can run; if not, says so (or fails, when CI requires it).
fn tshark_available() -> bool {
    let found = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        if std::env::var("METAROCE_REQUIRE_TSHARK").is_ok_and(|v| v == "1") {
            panic!(
                "tshark is not installed but METAROCE_REQUIRE_TSHARK=1 (apt-get install tshark)"
            );
        }
        println!("SKIPPED: tshark is not installed (apt-get install tshark); dissector not tested");
    }
    found
}

/// Run tshark on `pcap` with the dissector, extracting `fields` of every
/// frame: one map per frame, repeated fields joined with ','.
fn tshark_fields(pcap: &Path, options: &[&str], fields: &[&str]) -> Vec<BTreeMap<String, String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-X")
        .arg(format!("lua_script:{}", dissector().display()))
        .arg("-r")
        .arg(pcap)
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=a"])
        .args(["-E", "aggregator=,"]);
    for option in options {
        cmd.args(["-o", option]);
    }
    for field in fields {
        cmd.args(["-e", field]);
    }
    let out = cmd.output().expect("tshark runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tshark failed: {stderr}");
    // A Lua error in the dissector is printed, not fatal: treat it as one.
    for line in stderr.lines() {
        assert!(
            !line.contains("Lua") && !line.contains("lua_script"),
            "tshark reported a dissector problem: {line}"
        );
    }
    String::from_utf8(out.stdout)
        .expect("tshark prints UTF-8")
        .lines()
        .map(|line| {
            fields
                .iter()
                .zip(line.split('\t').chain(std::iter::repeat("")))
                .map(|(f, v)| (f.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn temp_pcap(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("metaroce-{name}-{}.pcap", std::process::id()))
}

// ----------------------------------------------------------------- packets

fn host(n: u8, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, n), port)
}

/// One datagram of the capture and the fields tshark must decode from it.
struct Case {
    what: &'static str,
    dst_port: u16,
    bytes: Vec<u8>,
    expect: Vec<(&'static str, String)>,
}

fn base(flags: Flags, path_slot: u8) -> BaseRepr {
    BaseRepr {
        flags,
        path_slot,
        path_gen: 2,
        src_device_port: PORT,
    }
}

fn data_repr(psn: u32, op: OpHeader, msg_len: u32, offset: u32, payload_len: u32) -> DataRepr {
    DataRepr {
        base: base(Flags::empty(), 5),
        psn,
        timestamp_ns: 0x1234_5678,
        dst_qpn: 0x11,
        msg_seq: 42 + psn % 7,
        solicited: false,
        psn_floor_delta: 3,
        floor_acked: false,
        msg_len,
        offset,
        op,
        payload_len,
    }
}

fn hex64(value: u64) -> String {
    format!("0x{value:016x}")
}

/// The fields of a data packet as tshark prints them.
fn data_fields(repr: &DataRepr, payload: &[u8]) -> Vec<(&'static str, String)> {
    let mut f = vec![
        ("metaroce.version", "1".to_string()),
        ("metaroce.packet_type", "1".into()),
        (
            "metaroce.flags",
            format!("0x{:02x}", repr.base.flags.bits()),
        ),
        ("metaroce.path_slot", repr.base.path_slot.to_string()),
        ("metaroce.path_gen", repr.base.path_gen.to_string()),
        (
            "metaroce.src_device_port",
            repr.base.src_device_port.to_string(),
        ),
        ("metaroce.psn", repr.psn.to_string()),
        ("metaroce.timestamp_ns", repr.timestamp_ns.to_string()),
        ("metaroce.dst_qpn", repr.dst_qpn.to_string()),
        ("metaroce.msg_seq", repr.msg_seq.to_string()),
        ("metaroce.opcode", (repr.opcode() as u8).to_string()),
        ("metaroce.psn_floor_delta", repr.psn_floor_delta.to_string()),
        (
            "metaroce.psn_floor",
            repr.psn
                .wrapping_sub(u32::from(repr.psn_floor_delta))
                .to_string(),
        ),
        ("metaroce.msg_len", repr.msg_len.to_string()),
        ("metaroce.offset", repr.offset.to_string()),
        ("metaroce.payload_len", payload.len().to_string()),
        (
            "metaroce.op_flags.solicited",
            if repr.solicited { "1" } else { "0" }.into(),
        ),
        (
            "metaroce.op_flags.floor_acked",
            if repr.floor_acked { "1" } else { "0" }.into(),
        ),
    ];
    let (mut rkey, mut addr, mut recv, mut imm) = (None, None, None, None);
    let (mut add, mut compare, mut swap, mut original) = (None, None, None, None);
    match repr.op {
        OpHeader::Write {
            rkey: k,
            remote_addr: a,
        }
        | OpHeader::ReadRequest {
            rkey: k,
            remote_addr: a,
        } => (rkey, addr) = (Some(k), Some(a)),
        OpHeader::WriteImm {
            rkey: k,
            remote_addr: a,
            recv_index: r,
            imm: i,
        } => (rkey, addr, recv, imm) = (Some(k), Some(a), Some(r), Some(i)),
        OpHeader::Send { recv_index: r } => recv = Some(r),
        OpHeader::SendImm {
            recv_index: r,
            imm: i,
        } => (recv, imm) = (Some(r), Some(i)),
        OpHeader::ReadResponse => {}
        OpHeader::FetchAdd {
            rkey: k,
            remote_addr: a,
            add: x,
        } => (rkey, addr, add) = (Some(k), Some(a), Some(x)),
        OpHeader::CmpSwap {
            rkey: k,
            remote_addr: a,
            compare: c,
            swap: s,
        } => (rkey, addr, compare, swap) = (Some(k), Some(a), Some(c), Some(s)),
        OpHeader::AtomicResponse { original: o } => original = Some(o),
    }
    let show64 = |v: Option<u64>| v.map(hex64).unwrap_or_default();
    let show32 = |v: Option<u32>| v.map(|v| v.to_string()).unwrap_or_default();
    f.push(("metaroce.rkey", show64(rkey)));
    f.push(("metaroce.remote_addr", show64(addr)));
    f.push(("metaroce.recv_index", show32(recv)));
    f.push((
        "metaroce.imm",
        imm.map(|v| format!("0x{v:08x}")).unwrap_or_default(),
    ));
    f.push(("metaroce.add", show64(add)));
    f.push(("metaroce.compare", show64(compare)));
    f.push(("metaroce.swap", show64(swap)));
    f.push(("metaroce.original", show64(original)));
    f.push(("metaroce.payload", hex_bytes(payload)));
    // A repair packet's offset is its shard's id, 1 << 31 | count << 16 |
    // index; the dissector shows index and count for repair packets only.
    let repair = repr.base.flags.contains(Flags::REPAIR);
    let part = |v: u32| if repair { v.to_string() } else { String::new() };
    f.push(("metaroce.repair_index", part(repr.offset & 0xffff)));
    f.push(("metaroce.repair_count", part(repr.offset >> 16 & 0x7fff)));
    f
}

/// A repair packet ([`Flags::REPAIR`]): recovery shard `index` of `count`,
/// `shard_len` bytes, for a message of `msg_len` bytes.
fn repair_repr(psn: u32, op: OpHeader, msg_len: u32, id: RepairId, shard_len: u32) -> DataRepr {
    let mut repr = data_repr(psn, op, msg_len, id.to_offset(), shard_len);
    repr.base.flags = Flags::REPAIR;
    repr
}

fn hex_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn data_case(what: &'static str, repr: DataRepr) -> Case {
    let payload: Vec<u8> = (0..repr.payload_len).map(|i| (i * 7 + 1) as u8).collect();
    let mut bytes = vec![0u8; repr.buffer_len()];
    emit_data(&repr, &payload, &mut bytes);
    let mut expect = data_fields(&repr, &payload);
    expect.push(("metaroce.icrc.status", "1".into()));
    let icrc = u32::from_be_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
    expect.push(("metaroce.icrc", format!("0x{icrc:08x}")));
    Case {
        what,
        dst_port: PORT,
        bytes,
        expect,
    }
}

fn ack_fields(repr: &AckRepr) -> Vec<(&'static str, String)> {
    let join = |items: Vec<String>| items.join(",");
    let bits: Vec<usize> = repr.sack.iter_set().collect();
    let ops = repr.op_acks();
    // Nothing to SACK: the bitmap is left out (SACK_ABSENT), so tshark
    // shows none of its fields.
    let absent = repr.sack.is_empty();
    let sack_field = |value: String| if absent { String::new() } else { value };
    vec![
        ("metaroce.flags.sack_absent", u8::from(absent).to_string()),
        ("metaroce.version", "1".to_string()),
        ("metaroce.packet_type", "2".into()),
        ("metaroce.path_slot", repr.base.path_slot.to_string()),
        ("metaroce.path_gen", repr.base.path_gen.to_string()),
        ("metaroce.ack_psn", repr.ack_psn.to_string()),
        ("metaroce.ts_echo", repr.ts_echo.to_string()),
        ("metaroce.ack_delay_ns", repr.ack_delay_ns.to_string()),
        ("metaroce.rx_packets", repr.rx_packets.to_string()),
        ("metaroce.ce_packets", repr.ce_packets.to_string()),
        ("metaroce.rate_hint_mbps", repr.rate_hint_mbps.to_string()),
        ("metaroce.sack", sack_field(hex_bytes(&repr.sack.0))),
        (
            "metaroce.sack.base",
            sack_field(repr.ack_psn.wrapping_add(1).to_string()),
        ),
        ("metaroce.sack.count", sack_field(bits.len().to_string())),
        (
            "metaroce.sack.bit",
            join(bits.iter().map(|i| i.to_string()).collect()),
        ),
        (
            "metaroce.sack.psn",
            join(
                bits.iter()
                    .map(|&i| repr.ack_psn.wrapping_add(1 + i as u32).to_string())
                    .collect(),
            ),
        ),
        ("metaroce.op_ack_count", repr.op_ack_count.to_string()),
        ("metaroce.trim_count", repr.trim_count.to_string()),
        ("metaroce.trim_offset", repr.trim_offset.to_string()),
        (
            "metaroce.trim_psn",
            repr.trimmed()
                .map_or(String::new(), |(first, _)| first.to_string()),
        ),
        (
            "metaroce.op_ack.qpn",
            join(ops.iter().map(|o| o.qpn.to_string()).collect()),
        ),
        (
            "metaroce.op_ack.msn",
            join(ops.iter().map(|o| o.msn.to_string()).collect()),
        ),
        (
            "metaroce.op_ack.syndrome",
            join(ops.iter().map(|o| (o.syndrome as u8).to_string()).collect()),
        ),
        (
            "metaroce.op_ack.nak_msg_seq",
            join(ops.iter().map(|o| o.nak_msg_seq.to_string()).collect()),
        ),
    ]
}

fn ack_case(what: &'static str, repr: AckRepr) -> Case {
    let mut bytes = vec![0u8; repr.buffer_len()];
    emit_ack(&repr, &mut bytes);
    let mut expect = ack_fields(&repr);
    expect.push(("metaroce.icrc.status", "1".into()));
    Case {
        what,
        dst_port: PORT,
        bytes,
        expect,
    }
}

/// Fill in an authenticated packet's trailer (a made-up tag: the dissector
/// shows the tag, only the key holder can check it).
fn authenticate(case: &mut Case, packet_number: u64) {
    let mut tag = [0u8; 16];
    for (i, b) in tag.iter_mut().enumerate() {
        *b = 0xa0 + i as u8;
    }
    AuthRepr { packet_number, tag }.emit(&mut AuthTrailer::new_unchecked(&mut case.bytes[..]));
    case.expect.retain(|(f, _)| !f.starts_with("metaroce.icrc"));
    case.expect
        .push(("metaroce.packet_number", packet_number.to_string()));
    case.expect.push(("metaroce.tag", hex_bytes(&tag)));
    case.expect.push(("metaroce.icrc", String::new()));
    case.expect
        .push(("metaroce.flags.authenticated", "1".into()));
}

fn sample_ack(ack_psn: u32, sack_bits: &[usize], op_acks: &[OpAck]) -> AckRepr {
    let mut repr = AckRepr::new(base(Flags::empty(), 9));
    repr.ack_psn = ack_psn;
    repr.ts_echo = 0x0102_0304;
    repr.ack_delay_ns = 2500;
    repr.rx_packets = 103;
    repr.ce_packets = 1;
    repr.rate_hint_mbps = 40_000;
    let mut sack = SackBits::new();
    for &i in sack_bits {
        sack.set(i);
    }
    repr.sack = sack;
    for op in op_acks {
        assert!(repr.push_op_ack(*op));
    }
    repr
}

/// Every kind of packet the wire spec defines, with the fields to expect.
fn valid_cases() -> Vec<Case> {
    let (rkey, addr) = (0x0123_4567_89ab_cdef, 0x7f00_0000_1000);
    let mut cases = vec![
        data_case(
            "write",
            data_repr(
                100,
                OpHeader::Write {
                    rkey,
                    remote_addr: addr,
                },
                8192,
                4096,
                64,
            ),
        ),
        data_case("write_imm, solicited, FLOOR_ACKED, ACK_REQUEST", {
            let mut r = data_repr(
                101,
                OpHeader::WriteImm {
                    rkey,
                    remote_addr: addr,
                    recv_index: 9,
                    imm: 0xdead_beef,
                },
                48,
                32,
                16,
            );
            r.solicited = true;
            r.floor_acked = true;
            r.base.flags = Flags::ACK_REQUEST;
            r
        }),
        data_case(
            "send",
            data_repr(102, OpHeader::Send { recv_index: 3 }, 20, 0, 20),
        ),
        data_case(
            "send_imm",
            data_repr(
                103,
                OpHeader::SendImm {
                    recv_index: 4,
                    imm: 77,
                },
                5,
                0,
                5,
            ),
        ),
        data_case(
            "read request",
            data_repr(
                104,
                OpHeader::ReadRequest {
                    rkey,
                    remote_addr: addr,
                },
                4096,
                0,
                0,
            ),
        ),
        data_case("read response, retransmitted", {
            let mut r = data_repr(105, OpHeader::ReadResponse, 4096, 1024, 100);
            r.base.flags = Flags::RETRANSMIT;
            r
        }),
        data_case(
            "fetch_add",
            data_repr(
                106,
                OpHeader::FetchAdd {
                    rkey,
                    remote_addr: addr,
                    add: 5,
                },
                8,
                0,
                0,
            ),
        ),
        data_case(
            "cmp_swap",
            data_repr(
                107,
                OpHeader::CmpSwap {
                    rkey,
                    remote_addr: addr,
                    compare: 1,
                    swap: u64::MAX,
                },
                8,
                0,
                0,
            ),
        ),
        data_case(
            "atomic response",
            data_repr(108, OpHeader::AtomicResponse { original: 41 }, 8, 0, 0),
        ),
        data_case("write at the PSN wrap", {
            let mut r = data_repr(
                u32::MAX,
                OpHeader::Write {
                    rkey,
                    remote_addr: addr,
                },
                64,
                0,
                8,
            );
            r.psn_floor_delta = 10;
            r.base.flags = Flags::COMPLETION_PROBE;
            r
        }),
        ack_case(
            "ack with SACK bits and op-acks",
            sample_ack(
                100,
                &[0, 9, 255],
                &[
                    OpAck {
                        qpn: 0x11,
                        msn: 4,
                        syndrome: Syndrome::Ack,
                        nak_msg_seq: 0,
                    },
                    OpAck {
                        qpn: 0x12,
                        msn: 7,
                        syndrome: Syndrome::RnrNak,
                        nak_msg_seq: 7,
                    },
                    OpAck {
                        qpn: 0x13,
                        msn: 1,
                        syndrome: Syndrome::RemAccessErr,
                        nak_msg_seq: 1,
                    },
                ],
            ),
        ),
        ack_case(
            "ack whose SACK window wraps",
            sample_ack(u32::MAX - 5, &[0, 4, 5, 6, 200], &[]),
        ),
        ack_case("ack with a trim NACK", {
            let mut r = sample_ack(u32::MAX - 1, &[3], &[]);
            (r.trim_offset, r.trim_count) = (2, 3);
            r
        }),
    ];

    let mut auth_write = data_repr(
        200,
        OpHeader::Write {
            rkey,
            remote_addr: addr,
        },
        32,
        0,
        32,
    );
    auth_write.base.flags = Flags::AUTHENTICATED;
    let mut case = data_case("authenticated write", auth_write);
    authenticate(&mut case, 0x0102_0304_0506);
    cases.push(case);

    let mut auth_ack = sample_ack(201, &[1], &[]);
    auth_ack.base.flags = Flags::AUTHENTICATED;
    let mut case = ack_case("authenticated ack", auth_ack);
    authenticate(&mut case, 9);
    cases.push(case);

    let mut case = data_case(
        "send on the RoCEv2 port (heuristic)",
        data_repr(300, OpHeader::Send { recv_index: 1 }, 4, 0, 4),
    );
    case.dst_port = ROCEV2_PORT;
    cases.push(case);

    // Wire.md 7.2: ICRC_OMITTED (bit 4) with a zero trailer is shown as
    // omitted (unverified, not bad), and the heuristic still claims it.
    let mut omitted = data_repr(400, OpHeader::Send { recv_index: 2 }, 8, 0, 8);
    omitted.base.flags = Flags::ICRC_OMITTED;
    let mut case = data_case("send with the ICRC omitted (heuristic)", omitted);
    let trailer_at = case.bytes.len() - 4;
    case.bytes[trailer_at..].fill(0);
    case.expect.retain(|(f, _)| !f.starts_with("metaroce.icrc"));
    case.expect.push(("metaroce.icrc", "0x00000000".into()));
    case.expect.push(("metaroce.icrc.status", "0".into()));
    case.expect
        .push(("metaroce.flags.icrc_omitted", "1".into()));
    case.expect
        .push(("metaroce.flags.sender_drained", "0".into()));
    case.expect.push(("metaroce.flags.sack_absent", "0".into()));
    case.dst_port = ROCEV2_PORT;
    cases.push(case);

    // SENDER_DRAINED (bit 5) alone: a normal ICRC, the other flag clear.
    let mut drained = data_repr(401, OpHeader::Send { recv_index: 3 }, 8, 0, 8);
    drained.base.flags = Flags::SENDER_DRAINED | Flags::ACK_REQUEST;
    let mut case = data_case("last send of a drained sender", drained);
    case.expect
        .push(("metaroce.flags.sender_drained", "1".into()));
    case.expect
        .push(("metaroce.flags.icrc_omitted", "0".into()));
    case.expect.push(("metaroce.flags.sack_absent", "0".into()));
    case.expect.push(("metaroce.flags.repair", "0".into()));
    cases.push(case);

    // REPAIR (bit 6): the payload is a recovery shard and the offset names
    // it (1 << 31 | count << 16 | index), so it lies far beyond msg_len;
    // valid repair packets raise no field rule (the severity check of the
    // test).
    let id = RepairId { index: 1, count: 4 };
    let shard = repair_repr(
        402,
        OpHeader::SendImm {
            recv_index: 5,
            imm: 9,
        },
        2999,
        id,
        1000,
    );
    assert_eq!(shard.validate(), Ok(()));
    let info = format!(
        "DATA slot=5 gen=2 psn=402 qpn=17 msg={} SEND_IMM REPAIR 1/4 msg_len=2999 len=1000 \
         rq=5 imm=0x9 flags=RP",
        shard.msg_seq
    );
    let mut case = data_case("repair shard 1 of 4 of a send_imm", shard);
    case.expect.push(("metaroce.flags.repair", "1".into()));
    case.expect
        .push(("metaroce.flags.sender_drained", "0".into()));
    case.expect.push(("metaroce.flags.sack_absent", "0".into()));
    case.expect.push(("_ws.col.Info", info));
    cases.push(case);

    // The longest shard: msg_len rounded up to even, on the heuristic port.
    let shard = repair_repr(
        403,
        OpHeader::Write {
            rkey,
            remote_addr: addr,
        },
        7,
        RepairId { index: 0, count: 1 },
        8,
    );
    assert_eq!(shard.validate(), Ok(()));
    let mut case = data_case("repair shard of an odd-length write (heuristic)", shard);
    case.expect.push(("metaroce.flags.repair", "1".into()));
    case.expect.push(("metaroce.flags.sack_absent", "0".into()));
    case.dst_port = ROCEV2_PORT;
    cases.push(case);
    cases
}

fn write_capture(path: &Path, snaplen: u32, cases: &[Case]) {
    let mut pcap = PcapWriter::create(path, snaplen).unwrap();
    for (i, case) in cases.iter().enumerate() {
        let ts_ns = 1_700_000_000_000_000_000 + i as u64 * 1_500;
        let src = host(1, PORT + 1 + i as u16);
        pcap.write_udp(ts_ns, src, host(2, case.dst_port), Ecn::Ect0, &case.bytes)
            .unwrap();
    }
    pcap.flush().unwrap();
}

fn expert_fields() -> [&'static str; 4] {
    [
        "_ws.malformed",
        "_ws.expert.severity",
        "_ws.expert.message",
        "frame.protocols",
    ]
}

// ----------------------------------------------------------------- tests

#[test]
fn tshark_decodes_every_field_as_written() {
    if !tshark_available() {
        return;
    }
    let cases = valid_cases();
    let path = temp_pcap("valid");
    write_capture(&path, DEFAULT_SNAPLEN, &cases);

    let mut fields: Vec<&str> = cases
        .iter()
        .flat_map(|c| c.expect.iter().map(|(f, _)| *f))
        .collect();
    fields.sort_unstable();
    fields.dedup();
    fields.extend(expert_fields());
    // Port 4793 decodes through the port registration; 4791 stays
    // InfiniBand's unless heuristics go first, and then it is MetaRoCE.
    let by_port = tshark_fields(&path, &[], &fields);
    let heuristic_first = tshark_fields(&path, &["udp.try_heuristic_first:TRUE"], &fields);
    assert_eq!(by_port.len(), cases.len(), "one decoded row per packet");
    let rows: Vec<_> = cases
        .iter()
        .zip(by_port.into_iter().zip(heuristic_first))
        .map(|(case, (port, heuristic))| {
            if case.dst_port == ROCEV2_PORT {
                assert!(
                    !port["frame.protocols"].contains("metaroce"),
                    "{}: claimed on 4791 without heuristics first: {}",
                    case.what,
                    port["frame.protocols"]
                );
                heuristic
            } else {
                port
            }
        })
        .collect();

    let mut failures = Vec::new();
    for (case, row) in cases.iter().zip(&rows) {
        assert!(
            row["frame.protocols"].ends_with(":metaroce"),
            "{}: not decoded as MetaRoCE: {}",
            case.what,
            row["frame.protocols"]
        );
        for (field, want) in &case.expect {
            if &row[*field] != want {
                failures.push(format!(
                    "{}: {field} is {:?}, wrote {want:?}",
                    case.what, row[*field]
                ));
            }
        }
        if !row["_ws.malformed"].is_empty() {
            failures.push(format!("{}: decoded as malformed", case.what));
        }
        // Severities (printed in decimal): chat 0x200000, note 0x400000,
        // warn 0x600000, error 0x800000. Notes (a NAK) and chats (a
        // retransmission) are expected; warnings and errors are not.
        for severity in row["_ws.expert.severity"]
            .split(',')
            .filter(|s| !s.is_empty())
        {
            let level: u32 = severity.parse().unwrap_or(u32::MAX);
            if level >= EXPERT_WARN {
                failures.push(format!(
                    "{}: expert info {severity}: {}",
                    case.what, row["_ws.expert.message"]
                ));
            }
        }
    }
    std::fs::remove_file(&path).ok();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!(
        "tshark decoded {} packets with every field as written",
        cases.len()
    );
}

#[test]
fn tshark_flags_broken_packets() {
    if !tshark_available() {
        return;
    }
    let write = data_case(
        "w",
        data_repr(
            1,
            OpHeader::Write {
                rkey: 1,
                remote_addr: 2,
            },
            64,
            0,
            16,
        ),
    )
    .bytes;
    let ack = ack_case("a", sample_ack(1, &[], &[])).bytes;
    let mut bad_icrc = write.clone();
    bad_icrc[40] ^= 1;
    let mut bad_version = write.clone();
    bad_version[0] = 2;
    let mut bad_type = write.clone();
    bad_type[1] = 3;
    let mut bad_opcode = write.clone();
    bad_opcode[24] = 9;
    let mut long_ack = ack.clone();
    long_ack.push(1); // the version byte of a packet cut after it
    let mut field_rule = write.clone();
    field_rule[28..32].copy_from_slice(&8u32.to_be_bytes()); // msg_len < payload
    metaroce_wire::seal(&mut field_rule);
    // Repair packets that break the repair rules: patched from valid ones
    // (a DataRepr with such fields would not validate).
    let shard = data_case(
        "r",
        repair_repr(
            2,
            OpHeader::Send { recv_index: 1 },
            64,
            RepairId { index: 0, count: 3 },
            16,
        ),
    )
    .bytes;
    let mut repair_index = shard.clone();
    let index_eq_count = RepairId { index: 3, count: 3 }.to_offset();
    repair_index[32..36].copy_from_slice(&index_eq_count.to_be_bytes());
    metaroce_wire::seal(&mut repair_index);
    let mut repair_top_bit = shard.clone();
    repair_top_bit[32] &= 0x7f; // count << 16 | index, without the top bit
    metaroce_wire::seal(&mut repair_top_bit);
    let mut repair_odd = shard.clone();
    repair_odd.remove(repair_odd.len() - 5); // the shard's last byte: 15 left
    metaroce_wire::seal(&mut repair_odd);
    let mut repair_read = data_case(
        "rr",
        data_repr(
            3,
            OpHeader::ReadResponse,
            64,
            RepairId { index: 0, count: 1 }.to_offset(),
            16,
        ),
    )
    .bytes;
    repair_read[2] |= Flags::REPAIR.bits(); // READ_RESPONSE data has no shards
    metaroce_wire::seal(&mut repair_read);
    // An ACK with a bitmap present but no bit of it set: one encoding per
    // ACK, so receivers drop it (wire.md 5).
    let mut empty_sack = ack_case("s", sample_ack(1, &[3], &[])).bytes;
    empty_sack[32..64].fill(0);
    metaroce_wire::seal(&mut empty_sack);
    let broken: [(&str, Vec<u8>, &str); 13] = [
        ("bad ICRC", bad_icrc, "metaroce.icrc.bad"),
        ("bad version", bad_version, "metaroce.bad_version"),
        ("bad type", bad_type, "metaroce.bad_type"),
        ("bad opcode", bad_opcode, "metaroce.bad_opcode"),
        ("truncated data", write[..30].to_vec(), "metaroce.truncated"),
        (
            "truncated ack",
            ack[..ack.len() - 1].to_vec(),
            "metaroce.truncated",
        ),
        // Bytes after an ACK are the next packet of the datagram (wire.md
        // 5.3): one stray byte is a truncated packet.
        ("a stray byte after an ack", long_ack, "metaroce.truncated"),
        (
            "offset + payload > msg_len",
            field_rule,
            "metaroce.field_rule",
        ),
        ("repair index >= count", repair_index, "metaroce.field_rule"),
        (
            "repair id without its top bit",
            repair_top_bit,
            "metaroce.field_rule",
        ),
        (
            "repair shard of odd length",
            repair_odd,
            "metaroce.field_rule",
        ),
        (
            "repair on a read response",
            repair_read,
            "metaroce.field_rule",
        ),
        (
            "an empty SACK bitmap sent present",
            empty_sack,
            "metaroce.sack.empty_present",
        ),
    ];
    // What the expert text of each repair case names.
    let repair_rules = [
        (
            "repair index >= count",
            "repair index 3 is not below repair count 3",
        ),
        (
            "repair id without its top bit",
            "repair id without its top bit set",
        ),
        ("repair shard of odd length", "repair shard of 15 bytes"),
        (
            "repair on a read response",
            "repair packet on READ_RESPONSE",
        ),
    ];
    let cases: Vec<Case> = broken
        .iter()
        .map(|(what, bytes, _)| Case {
            what,
            dst_port: PORT,
            bytes: bytes.clone(),
            expect: Vec::new(),
        })
        .collect();
    let path = temp_pcap("broken");
    write_capture(&path, DEFAULT_SNAPLEN, &cases);
    let fields = [
        "frame.protocols",
        "_ws.expert.severity",
        "_ws.expert.message",
    ];
    let rows = tshark_fields(&path, &[], &fields);
    assert_eq!(rows.len(), broken.len());
    for ((what, _, expert), row) in broken.iter().zip(&rows) {
        assert!(row["frame.protocols"].ends_with(":metaroce"), "{what}");
        let worst = row["_ws.expert.severity"]
            .split(',')
            .filter_map(|s| s.parse::<u32>().ok())
            .max();
        assert_eq!(
            worst,
            Some(EXPERT_ERROR),
            "{what}: wanted an error ({expert})"
        );
        if let Some((_, rule)) = repair_rules.iter().find(|(w, _)| w == what) {
            let message = &row["_ws.expert.message"];
            assert!(
                message.contains(rule) && message.contains("wire.md 4.3"),
                "{what}: expert text {message:?} does not name the rule"
            );
            // Only the broken repair rule fires: not the offset rule.
            assert!(!message.contains("rule 1"), "{what}: {message:?}");
        }
    }
    // Each broken packet matches the display filter of its own expert item,
    // and no other packet does.
    for (i, (what, _, expert)) in broken.iter().enumerate() {
        let out = Command::new("tshark")
            .arg("-X")
            .arg(format!("lua_script:{}", dissector().display()))
            .arg("-r")
            .arg(&path)
            .args(["-Y", expert, "-T", "fields", "-e", "frame.number"])
            .output()
            .expect("tshark runs");
        let frames: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        // Packets broken the same way (truncated ones, field rules) share
        // the item.
        let want: Vec<String> = (1..=broken.len())
            .filter(|&n| broken[n - 1].2 == *expert)
            .map(|n| n.to_string())
            .collect();
        assert!(want.contains(&(i + 1).to_string()));
        assert_eq!(frames, want, "{what}: frames matching {expert}");
    }
    std::fs::remove_file(&path).ok();
}

/// An ACK and a data packet in one datagram (wire.md 5.3, coalescing):
/// both decode, each with its own fields, and nothing is flagged.
#[test]
fn tshark_decodes_an_ack_coalesced_with_data() {
    if !tshark_available() {
        return;
    }
    let write = data_case(
        "w",
        data_repr(
            9,
            OpHeader::Write {
                rkey: 5,
                remote_addr: 0x2000,
            },
            16,
            0,
            16,
        ),
    )
    .bytes;
    let ack = ack_case("a", sample_ack(77, &[], &[])).bytes;
    let mut both = ack.clone();
    both.extend_from_slice(&write);
    let cases = [Case {
        what: "ack + write",
        dst_port: PORT,
        bytes: both,
        expect: Vec::new(),
    }];
    let path = temp_pcap("coalesced");
    write_capture(&path, DEFAULT_SNAPLEN, &cases);
    let fields = [
        "frame.protocols",
        "metaroce.ack_psn",
        "metaroce.psn",
        "_ws.expert.severity",
        "_ws.malformed",
    ];
    let rows = tshark_fields(&path, &[], &fields);
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert!(row["frame.protocols"].ends_with(":metaroce"), "{row:?}");
    assert_eq!(row["metaroce.ack_psn"], "77", "{row:?}");
    assert_eq!(row["metaroce.psn"], "9", "{row:?}");
    assert!(row["_ws.malformed"].is_empty(), "{row:?}");
    let worst = row["_ws.expert.severity"]
        .split(',')
        .filter_map(|s| s.parse::<u32>().ok())
        .max();
    assert!(worst.is_none_or(|w| w < EXPERT_WARN), "{row:?}");
    std::fs::remove_file(&path).ok();
}

#[test]
fn tshark_decodes_headers_of_snapped_packets() {
    if !tshark_available() {
        return;
    }
    let (rkey, addr) = (7, 0x1000);
    let case = data_case(
        "big write",
        data_repr(
            55,
            OpHeader::Write {
                rkey,
                remote_addr: addr,
            },
            4096,
            0,
            4096,
        ),
    );
    let path = temp_pcap("snapped");
    // Ethernet + IPv4 + UDP (42) + MetaRoCE headers (52) + 6 payload bytes.
    write_capture(&path, 100, std::slice::from_ref(&case));
    let rows = tshark_fields(
        &path,
        &[],
        &[
            "metaroce.psn",
            "metaroce.rkey",
            "metaroce.payload_len",
            "_ws.malformed",
            "frame.cap_len",
            "frame.len",
        ],
    );
    std::fs::remove_file(&path).ok();
    let row = &rows[0];
    assert_eq!(row["frame.cap_len"], "100");
    assert_eq!(row["frame.len"], (42 + case.bytes.len()).to_string());
    assert_eq!(row["metaroce.psn"], "55");
    assert_eq!(row["metaroce.rkey"], hex64(rkey));
    assert_eq!(row["metaroce.payload_len"], "4096");
    assert_eq!(row["_ws.malformed"], "");
}

#[test]
fn heuristic_claims_only_valid_metaroce_on_other_ports() {
    if !tshark_available() {
        return;
    }
    let valid = data_case(
        "valid send",
        data_repr(9, OpHeader::Send { recv_index: 0 }, 3, 0, 3),
    );
    let mut bad_icrc = valid.bytes.clone();
    bad_icrc[36] ^= 0x80;
    let mut reserved_flag = valid.bytes.clone();
    reserved_flag[2] |= 0x80; // bit 7, SACK_ABSENT: an ACK's layout bit, not a data packet's
    metaroce_wire::seal(&mut reserved_flag);
    // Bit 6 is REPAIR, no longer reserved: a repair packet is claimed.
    let repair = data_case(
        "repair shard",
        repair_repr(
            10,
            OpHeader::Send { recv_index: 0 },
            3,
            RepairId { index: 0, count: 2 },
            4,
        ),
    );
    // Looks like a version-1 data packet for its first bytes, then noise.
    let noise: Vec<u8> = [1u8, 1, 0, 0]
        .into_iter()
        .chain((0..60u32).map(|i| (i * 37 + 11) as u8))
        .collect();
    let other_port = 5555;
    let cases: Vec<Case> = [
        ("valid", valid.bytes.clone()),
        ("bad icrc", bad_icrc),
        ("reserved flag bit", reserved_flag),
        ("noise", noise),
        ("repair shard", repair.bytes),
    ]
    .into_iter()
    .map(|(what, bytes)| Case {
        what,
        dst_port: other_port,
        bytes,
        expect: Vec::new(),
    })
    .collect();
    let path = temp_pcap("heuristic");
    write_capture(&path, DEFAULT_SNAPLEN, &cases);
    let claimed = |options: &[&str]| -> Vec<bool> {
        tshark_fields(&path, options, &["frame.protocols"])
            .iter()
            .map(|r| r["frame.protocols"].ends_with(":metaroce"))
            .collect()
    };
    assert_eq!(claimed(&[]), [true, false, false, false, true]);
    // The port preference claims the port for the dissector, broken
    // packets included (they then decode with expert info).
    assert_eq!(claimed(&["metaroce.udp_port:5555"]), [true; 5]);
    std::fs::remove_file(&path).ok();
}
