//! Unit tests: round trips for every opcode and every error path.

use crate::*;

fn base() -> BaseRepr {
    BaseRepr {
        flags: Flags::ACK_REQUEST,
        path_slot: 3,
        path_gen: 1,
        src_device_port: 4791,
    }
}

fn data(op: OpHeader, msg_len: u32, offset: u32, payload_len: u32) -> DataRepr {
    DataRepr {
        base: base(),
        psn: 17,
        timestamp_ns: 0xdead_beef,
        dst_qpn: 5,
        msg_seq: 2,
        solicited: false,
        psn_floor_delta: 0,
        floor_acked: false,
        msg_len,
        offset,
        op,
        payload_len,
    }
}

/// One valid repr per opcode, with payload where the opcode allows it.
fn every_opcode() -> Vec<DataRepr> {
    let rkey = 0x0102_0304_0506_0708;
    let remote_addr = 0x7f00_0000_1000;
    vec![
        data(OpHeader::Write { rkey, remote_addr }, 65536, 4096, 100),
        data(
            OpHeader::WriteImm {
                rkey,
                remote_addr,
                recv_index: 9,
                imm: 0xabcd,
            },
            100,
            0,
            100,
        ),
        data(OpHeader::Send { recv_index: 4 }, 10, 3, 7),
        data(
            OpHeader::SendImm {
                recv_index: 4,
                imm: 77,
            },
            0,
            0,
            0,
        ),
        data(OpHeader::ReadRequest { rkey, remote_addr }, 1 << 20, 0, 0),
        data(OpHeader::ReadResponse, 300, 256, 44),
        data(
            OpHeader::FetchAdd {
                rkey,
                remote_addr,
                add: 5,
            },
            8,
            0,
            0,
        ),
        data(
            OpHeader::CmpSwap {
                rkey,
                remote_addr,
                compare: 1,
                swap: 2,
            },
            8,
            0,
            0,
        ),
        data(OpHeader::AtomicResponse { original: u64::MAX }, 8, 0, 0),
    ]
}

fn payload_for(repr: &DataRepr) -> Vec<u8> {
    (0..repr.payload_len).map(|i| i as u8 ^ 0x5a).collect()
}

fn emit(repr: &DataRepr) -> Vec<u8> {
    let payload = payload_for(repr);
    let mut buf = vec![0u8; repr.buffer_len()];
    assert_eq!(emit_data(repr, &payload, &mut buf), buf.len());
    buf
}

fn ack() -> AckRepr {
    let mut repr = AckRepr::new(base());
    repr.ack_psn = 1000;
    repr.ts_echo = 42;
    repr.ack_delay_ns = 800;
    repr.rx_packets = 999;
    repr.ce_packets = 3;
    repr.rate_hint_mbps = 25_000;
    repr.sack.set(0);
    repr.sack.set(255);
    assert!(repr.push_op_ack(OpAck {
        qpn: 5,
        msn: 10,
        syndrome: Syndrome::Ack,
        nak_msg_seq: 0,
    }));
    assert!(repr.push_op_ack(OpAck {
        qpn: 6,
        msn: 3,
        syndrome: Syndrome::RnrNak,
        nak_msg_seq: 3,
    }));
    repr
}

fn emit_ack_vec(repr: &AckRepr) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    assert_eq!(emit_ack(repr, &mut buf), buf.len());
    buf
}

/// Apply `edit` to a datagram and reseal it, so only the edit is wrong.
fn edited(mut datagram: Vec<u8>, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    edit(&mut datagram);
    seal(&mut datagram);
    datagram
}

#[test]
fn every_opcode_round_trips() {
    for repr in every_opcode() {
        repr.validate().unwrap();
        let buf = emit(&repr);
        assert_eq!(
            buf.len(),
            DATA_HEADER_LEN + repr.op.len() + repr.payload_len as usize + 4
        );
        match parse(&buf).unwrap() {
            Packet::Data {
                repr: parsed,
                payload,
            } => {
                assert_eq!(parsed, repr);
                assert_eq!(payload, payload_for(&repr).as_slice());
            }
            other => panic!("parsed as {other:?}"),
        }
        fuzz_check(&buf);
    }
}

#[test]
fn ext_lengths_match_spec() {
    let lens: Vec<usize> = Opcode::ALL.iter().map(|op| op.ext_len()).collect();
    assert_eq!(lens, [16, 24, 4, 8, 16, 0, 24, 32, 8]);
    for (value, op) in Opcode::ALL.iter().enumerate() {
        assert_eq!(*op as u8 as usize, value);
        assert_eq!(Opcode::try_from(value as u8), Ok(*op));
    }
    for repr in every_opcode() {
        assert_eq!(repr.op.opcode().ext_len(), repr.op.len());
    }
}

#[test]
fn data_layout_is_big_endian_at_spec_offsets() {
    let repr = data(
        OpHeader::Send {
            recv_index: 0x0a0b_0c0d,
        },
        0x1000,
        0x20,
        2,
    );
    let buf = emit(&repr);
    assert_eq!(&buf[..8], &[1, 1, 0x01, 3, 0, 1, 0x12, 0xb7]);
    assert_eq!(&buf[8..12], &17u32.to_be_bytes());
    assert_eq!(&buf[12..16], &0xdead_beefu32.to_be_bytes());
    assert_eq!(&buf[16..20], &5u32.to_be_bytes());
    assert_eq!(&buf[20..24], &2u32.to_be_bytes());
    assert_eq!(&buf[24..28], &[2, 0, 0, 0]);
    assert_eq!(&buf[28..32], &0x1000u32.to_be_bytes());
    assert_eq!(&buf[32..36], &0x20u32.to_be_bytes());
    assert_eq!(&buf[36..40], &[0x0a, 0x0b, 0x0c, 0x0d]);
    let crc = crc32c::crc32c(&buf[..buf.len() - 4]);
    assert_eq!(&buf[buf.len() - 4..], &crc.to_be_bytes());
}

#[test]
fn ack_round_trips() {
    let repr = ack();
    let buf = emit_ack_vec(&repr);
    assert_eq!(buf.len(), ACK_FIXED_LEN + 2 * OP_ACK_LEN + ICRC_LEN);
    assert_eq!(parse(&buf).unwrap(), Packet::Ack(repr.clone()));
    fuzz_check(&buf);

    // Nothing to SACK: the bitmap is left out (40 bytes, not 72).
    let empty = AckRepr::new(base());
    let buf = emit_ack_vec(&empty);
    assert_eq!(buf.len(), 40);
    assert_eq!(buf[2], 0x01 | Flags::SACK_ABSENT.bits());
    assert_eq!(parse(&buf).unwrap(), Packet::Ack(empty));
    fuzz_check(&buf);
}

#[test]
fn an_ack_without_sack_bits_leaves_the_bitmap_out_and_moves_the_rest_up() {
    let mut repr = ack();
    repr.sack = SackBits::EMPTY;
    repr.trim_count = 3;
    repr.trim_offset = 0x0102;
    let buf = emit_ack_vec(&repr);
    assert_eq!(buf.len(), ACK_COMPACT_FIXED_LEN + 2 * OP_ACK_LEN + ICRC_LEN);
    assert_eq!(&buf[28..32], &25_000u32.to_be_bytes());
    assert_eq!(&buf[32..36], &[2, 3, 0x01, 0x02]);
    assert_eq!(&buf[52..56], &[0, 0, 0, 6]); // second entry's qpn
    let Packet::Ack(parsed) = parse(&buf).unwrap() else {
        panic!("an ACK")
    };
    // The layout bit is the ACK view's: the repr's flags are as given.
    assert_eq!(parsed, repr);
    assert!(!parsed.base.flags.contains(Flags::SACK_ABSENT));
    fuzz_check(&buf);
    // The first packet of a coalesced datagram ends where its length says.
    let mut two = buf.clone();
    two.extend_from_slice(&buf);
    assert_eq!(first_packet_len(&two), buf.len());
}

#[test]
fn an_empty_bitmap_sent_present_is_malformed() {
    // One encoding per ACK: the full layout with every SACK bit zero.
    let mut full = emit_ack_vec(&ack());
    full[32..64].fill(0);
    seal(&mut full);
    assert_eq!(parse(&full), Err(Error::Malformed("sack")));
    // And a compact ACK cut short of its fixed part is truncated.
    let compact = emit_ack_vec(&AckRepr::new(base()));
    assert_eq!(
        parse(&compact[..ACK_COMPACT_FIXED_LEN]),
        Err(Error::Truncated)
    );
}

#[test]
fn trimmed_run_round_trips_at_its_offsets() {
    let mut repr = ack();
    repr.trim_count = 3;
    repr.trim_offset = 0x0102;
    let buf = emit_ack_vec(&repr);
    assert_eq!(&buf[64..68], &[2, 3, 0x01, 0x02]);
    let Packet::Ack(parsed) = parse(&buf).unwrap() else {
        panic!("an ACK")
    };
    assert_eq!(parsed, repr);
    assert_eq!(parsed.trimmed(), Some((1000 + 0x0102, 3)));
    assert_eq!(ack().trimmed(), None);
    assert!(parsed.to_string().contains("trimmed=1258+3"), "{parsed}");
}

#[test]
fn ack_layout_is_at_spec_offsets() {
    let buf = emit_ack_vec(&ack());
    assert_eq!(buf[1], 2);
    assert_eq!(&buf[8..12], &1000u32.to_be_bytes());
    assert_eq!(&buf[28..32], &25_000u32.to_be_bytes());
    assert_eq!(buf[32], 0x01); // sack bit 0
    assert_eq!(buf[63], 0x80); // sack bit 255
    assert_eq!(&buf[64..68], &[2, 0, 0, 0]);
    // second entry: qpn 6, msn 3, RnrNak, nak_msg_seq 3
    assert_eq!(
        &buf[84..100],
        &[0, 0, 0, 6, 0, 0, 0, 3, 1, 0, 0, 0, 0, 0, 0, 3]
    );
}

#[test]
fn full_ack_round_trips_and_push_stops() {
    let mut repr = AckRepr::new(base());
    for i in 0..MAX_OP_ACKS as u32 {
        assert!(repr.push_op_ack(OpAck {
            qpn: i,
            msn: i * 2,
            syndrome: Syndrome::RemOpErr,
            nak_msg_seq: i * 2,
        }));
    }
    assert!(!repr.push_op_ack(OpAck::ZERO));
    assert_eq!(repr.op_acks().len(), MAX_OP_ACKS);
    repr.sack.set(0);
    let buf = emit_ack_vec(&repr);
    assert_eq!(
        buf.len(),
        ACK_FIXED_LEN + MAX_OP_ACKS * OP_ACK_LEN + ICRC_LEN
    );
    assert_eq!(parse(&buf).unwrap(), Packet::Ack(repr));
}

#[test]
fn truncated_at_every_length() {
    let mut datagrams: Vec<Vec<u8>> = every_opcode().iter().map(emit).collect();
    datagrams.push(emit_ack_vec(&ack()));
    for full in &datagrams {
        let header_len = match parse(full).unwrap() {
            Packet::Data { repr, .. } => repr.header_len(),
            Packet::Ack(repr) => repr.buffer_len() - ICRC_LEN,
        };
        for len in 0..full.len() {
            let result = parse(&full[..len]);
            if len < header_len + ICRC_LEN {
                assert_eq!(result, Err(Error::Truncated), "len {len} of {}", full.len());
            } else {
                // A shorter payload is a shorter message segment: only the
                // ICRC can tell that bytes went missing.
                assert_eq!(result, Err(Error::BadChecksum), "len {len}");
            }
            // Resealed, a cut inside the headers is still reported as truncated.
            if len > ICRC_LEN && len < header_len + ICRC_LEN {
                let resealed = edited(full[..len].to_vec(), |_| {});
                assert_eq!(
                    parse(&resealed),
                    Err(Error::Truncated),
                    "resealed len {len}"
                );
            }
        }
    }
}

#[test]
fn bad_version() {
    for version in [0u8, 2, 255] {
        let buf = edited(emit(&every_opcode()[0]), |b| b[0] = version);
        assert_eq!(parse(&buf), Err(Error::BadVersion(version)));
    }
    // The version is judged before any length.
    assert_eq!(parse(&[2]), Err(Error::BadVersion(2)));
    assert_eq!(parse(&[]), Err(Error::Truncated));
    assert_eq!(parse(&[1]), Err(Error::Truncated));
}

#[test]
fn bad_type() {
    for packet_type in [0u8, 3, 0xff] {
        let buf = edited(emit(&every_opcode()[0]), |b| b[1] = packet_type);
        assert_eq!(parse(&buf), Err(Error::BadType(packet_type)));
    }
}

#[test]
fn bad_opcode() {
    for opcode in [9u8, 0x80, 0xff] {
        let buf = edited(emit(&every_opcode()[0]), |b| b[24] = opcode);
        assert_eq!(parse(&buf), Err(Error::BadOpcode(opcode)));
    }
}

#[test]
fn every_flipped_bit_is_caught() {
    let mut datagrams: Vec<Vec<u8>> = every_opcode().iter().map(emit).collect();
    datagrams.push(emit_ack_vec(&ack()));
    for buf in datagrams {
        for bit in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // A flip may also break the version, type, opcode or length
            // fields, which are checked before the ICRC; it must never pass.
            assert!(parse(&bad).is_err(), "bit {bit} flip accepted");
        }
        // A flip in the payload or trailer is a checksum error specifically.
        let mut bad = buf.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x10;
        assert_eq!(parse(&bad), Err(Error::BadChecksum));
        let mut bad = buf.clone();
        bad[8] ^= 0x01;
        assert_eq!(parse(&bad), Err(Error::BadChecksum));
    }
}

#[test]
fn payload_on_payloadless_opcodes_is_malformed() {
    for repr in every_opcode() {
        if repr.opcode().allows_payload() {
            continue;
        }
        let mut with_payload = repr;
        with_payload.payload_len = 1;
        with_payload.msg_len = repr.msg_len.max(1);
        assert_eq!(
            with_payload.validate(),
            Err(Error::Malformed("payload_len"))
        );
        let buf = emit(&with_payload);
        assert_eq!(parse(&buf), Err(Error::Malformed("payload_len")), "{repr}");
    }
}

#[test]
fn payload_beyond_message_is_malformed() {
    let write = every_opcode()[0];
    // offset + len = msg_len + 1
    let mut repr = write;
    repr.msg_len = 100;
    repr.offset = 1;
    repr.payload_len = 100;
    assert_eq!(parse(&emit(&repr)), Err(Error::Malformed("offset")));
    // offset + len overflows u32: must not wrap around to a small number
    repr.msg_len = u32::MAX;
    repr.offset = u32::MAX;
    repr.payload_len = 2;
    assert_eq!(parse(&emit(&repr)), Err(Error::Malformed("offset")));
    // exactly at the end is fine
    repr.msg_len = 100;
    repr.offset = 0;
    repr.payload_len = 100;
    assert!(parse(&emit(&repr)).is_ok());
    // ReadRequest: offset beyond the bytes to read
    let mut read = every_opcode()[4];
    read.msg_len = 10;
    read.offset = 11;
    assert_eq!(parse(&emit(&read)), Err(Error::Malformed("offset")));
}

#[test]
fn atomics_must_cover_one_word() {
    for repr in every_opcode() {
        let opcode = repr.opcode();
        if !(opcode.is_atomic_request() || opcode == Opcode::AtomicResponse) {
            continue;
        }
        let mut bad = repr;
        bad.msg_len = 16;
        assert_eq!(parse(&emit(&bad)), Err(Error::Malformed("msg_len")));
        let mut bad = repr;
        bad.offset = 8;
        assert_eq!(parse(&emit(&bad)), Err(Error::Malformed("offset")));
    }
}

#[test]
fn too_many_op_acks() {
    let buf = emit_ack_vec(&ack());
    let compact = emit_ack_vec(&AckRepr::new(base()));
    for count in [17u8, 200, 255] {
        for (buf, fixed) in [(&buf, ACK_FIXED_LEN), (&compact, ACK_COMPACT_FIXED_LEN)] {
            let mut bad = buf.clone();
            bad[fixed - 4] = count;
            bad.resize(fixed + usize::from(count) * OP_ACK_LEN + ICRC_LEN, 0);
            seal(&mut bad);
            assert_eq!(parse(&bad), Err(Error::Malformed("op_ack_count")));
        }
    }
}

#[test]
fn wrong_ack_length() {
    let buf = emit_ack_vec(&ack());
    // One entry too few: truncated.
    let short = edited(buf.clone(), |b| b[64] = 3);
    assert_eq!(parse(&short), Err(Error::Truncated));
    // One entry too many, or a stray byte: malformed.
    let long = edited(buf.clone(), |b| b[64] = 1);
    assert_eq!(parse(&long), Err(Error::Malformed("ack length")));
    let stray = edited(buf, |b| b.push(0));
    assert_eq!(parse(&stray), Err(Error::Malformed("ack length")));
}

#[test]
fn psn_floor_delta_round_trips_at_its_offset() {
    let mut repr = every_opcode()[2];
    repr.psn_floor_delta = 0x1234;
    let buf = emit(&repr);
    assert_eq!(&buf[26..28], &[0x12, 0x34]);
    let Packet::Data { repr: parsed, .. } = parse(&buf).unwrap() else {
        panic!("not data");
    };
    assert_eq!(parsed.psn_floor_delta, 0x1234);
}

#[test]
fn unknown_syndrome_is_malformed() {
    let buf = edited(emit_ack_vec(&ack()), |b| b[68 + 8] = 5);
    assert_eq!(parse(&buf), Err(Error::Malformed("syndrome")));
}

#[test]
fn reserved_bits_are_ignored_on_parse_and_zero_on_emit() {
    let repr = every_opcode()[2];
    let buf = edited(emit(&repr), |b| {
        b[2] |= 0x80; // the reserved flag (bit 7)
        b[25] |= 0xfc; // reserved op_flags (bits 2..7)
    });
    let Packet::Data { repr: parsed, .. } = parse(&buf).unwrap() else {
        panic!("not data");
    };
    assert_eq!(parsed, repr);
    assert_eq!(emit(&parsed), emit(&repr));
    // Bit 1 is FLOOR_ACKED, no longer reserved: parsed, and emitted back.
    let buf = edited(emit(&repr), |b| b[25] |= 0x02);
    let Packet::Data { repr: parsed, .. } = parse(&buf).unwrap() else {
        panic!("not data");
    };
    assert!(parsed.floor_acked && !repr.floor_acked);
    assert_eq!(emit(&parsed), buf);

    let mut noisy = repr;
    noisy.base.flags = Flags(0xff);
    let out = emit(&noisy);
    assert_eq!(out[2], Flags::KNOWN.0);

    // Bytes 65..68 were reserved before the trimmed run took them.
    let ack_buf = edited(emit_ack_vec(&ack()), |b| {
        b[68 + 9] = 0xee; // entry reserved
    });
    assert_eq!(parse(&ack_buf).unwrap(), Packet::Ack(ack()));
}

#[test]
fn solicited_and_flags() {
    let mut repr = every_opcode()[3];
    repr.solicited = true;
    repr.base.flags = Flags::ACK_REQUEST | Flags::RETRANSMIT;
    let buf = emit(&repr);
    assert_eq!(buf[25], 1);
    assert_eq!(buf[2], 3);
    assert_eq!(parse(&buf).unwrap(), Packet::Data { repr, payload: &[] });
    let mut flags = Flags::empty();
    assert!(!flags.contains(Flags::RETRANSMIT));
    flags |= Flags::RETRANSMIT;
    assert!(flags.contains(Flags::RETRANSMIT) && !flags.contains(Flags::ACK_REQUEST));
    flags.remove(Flags::RETRANSMIT);
    assert_eq!(flags, Flags::default());
}

#[test]
fn sack_bits() {
    let mut sack = SackBits::new();
    assert!(sack.is_empty());
    for i in [0, 7, 8, 100, 255] {
        sack.set(i);
    }
    sack.set(256); // ignored
    assert!(!sack.get(256));
    assert!(sack.get(100) && !sack.get(101));
    assert_eq!(sack.count(), 5);
    assert_eq!(sack.iter_set().collect::<Vec<_>>(), [0, 7, 8, 100, 255]);
    assert_eq!(sack.0[0], 0x81);
    assert_eq!(sack.0[1], 0x01);
    sack.clear(7);
    assert_eq!(sack.iter_set().collect::<Vec<_>>(), [0, 8, 100, 255]);
    sack.clear_all();
    assert!(sack.is_empty());
    assert_eq!(sack.iter_set().next(), None);
}

#[test]
fn views_do_not_panic_after_new_checked() {
    let buf = emit(&every_opcode()[1]);
    let packet = DataPacket::new_checked(&buf[..]).unwrap();
    assert_eq!(packet.opcode(), Ok(Opcode::WriteImm));
    assert_eq!(packet.ext().len(), 24);
    assert_eq!(packet.payload().len(), 100);
    assert!(packet.verify_icrc());
    assert_eq!(packet.base().path_slot(), 3);

    let ack_buf = emit_ack_vec(&ack());
    let packet = AckPacket::new_checked(&ack_buf[..]).unwrap();
    assert_eq!(
        packet.op_ack(1).unwrap().unwrap().syndrome,
        Syndrome::RnrNak
    );
    assert!(packet.op_ack(2).is_none());
    assert!(packet.op_ack(usize::MAX / 2).is_none());
    assert!(packet.verify_icrc());
}

#[test]
fn op_ack_count_beyond_max_is_capped_in_repr() {
    let mut repr = ack();
    repr.op_ack_count = 200;
    assert_eq!(repr.op_acks().len(), MAX_OP_ACKS);
    let buf = emit_ack_vec(&repr);
    assert_eq!(buf[64], MAX_OP_ACKS as u8);
    assert!(parse(&buf).is_ok());
}

#[test]
fn display_is_one_tcpdump_like_line() {
    let mut repr = every_opcode()[0];
    repr.payload_len = 4096;
    repr.base.flags = Flags::empty();
    let buf = emit(&repr);
    let line = parse(&buf).unwrap().to_string();
    assert!(
        line.starts_with("DATA slot=3 gen=1 psn=17 qpn=5 msg=2 WRITE off=4096/65536 len=4096"),
        "{line}"
    );
    assert!(!line.contains('\n'));
    let line = parse(&emit_ack_vec(&ack())).unwrap().to_string();
    assert!(
        line.starts_with("ACK slot=3 gen=1 ack_psn=1000 sack=2"),
        "{line}"
    );
    assert!(line.contains("qpn=6 msn=3 RNR_NAK(3)"), "{line}");
    assert!(line.contains("flags=AR"), "{line}");
}

#[test]
fn error_messages_are_lowercase() {
    let errors = [
        Error::Truncated,
        Error::BadVersion(2),
        Error::BadType(9),
        Error::BadOpcode(9),
        Error::BadChecksum,
        Error::Malformed("msg_len"),
        Error::NeedsKey,
    ];
    for error in errors {
        let text = error.to_string();
        assert_eq!(text, text.to_lowercase());
    }
    assert_eq!(Error::Malformed("msg_len").to_string(), "malformed msg_len");
}

#[test]
fn icrc_is_standard_crc32c() {
    // The CRC-32C (Castagnoli) check value from the CRC catalogue; pins the
    // exact variant (reflected, init and final xor 0xffffffff).
    assert_eq!(icrc(b"123456789"), 0xe306_9283);
    let mut datagram = *b"123456789\0\0\0\0";
    seal(&mut datagram);
    assert_eq!(&datagram[9..], &[0xe3, 0x06, 0x92, 0x83]);
}

// ------------------------------------------------------ authentication trailer

fn authenticated(mut repr: DataRepr) -> DataRepr {
    repr.base.flags.insert(Flags::AUTHENTICATED);
    repr
}

/// Emit an authenticated packet and fill its trailer as a key holder would
/// (here with made-up values: nothing in this crate checks a tag).
fn emit_sealed(repr: &DataRepr, auth: AuthRepr) -> Vec<u8> {
    let mut buf = emit(repr);
    auth.emit(&mut AuthTrailer::new_unchecked(&mut buf[..]));
    buf
}

const AUTH: AuthRepr = AuthRepr {
    packet_number: 0x0102_0304_0506_0708,
    tag: [0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xaf],
};

#[test]
fn authenticated_data_round_trips_for_every_opcode() {
    for repr in every_opcode().into_iter().map(authenticated) {
        let buf = emit_sealed(&repr, AUTH);
        assert_eq!(
            buf.len(),
            repr.header_len() + repr.payload_len as usize + AUTH_TRAILER_LEN
        );
        let (packet, auth) = parse_authenticated(&buf).unwrap();
        let payload = payload_for(&repr);
        assert_eq!(
            packet,
            Packet::Data {
                repr,
                payload: &payload
            }
        );
        assert_eq!(auth, AUTH);
        fuzz_check(&buf);
    }
}

#[test]
fn authenticated_trailer_layout() {
    let repr = authenticated(every_opcode()[0]);
    let buf = emit_sealed(&repr, AUTH);
    let end = buf.len();
    assert_eq!(buf[2], (Flags::ACK_REQUEST | Flags::AUTHENTICATED).bits());
    assert_eq!(&buf[end - 24..end - 16], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&buf[end - 16..], &AUTH.tag);
    let trailer = AuthTrailer::new_checked(&buf[..]).unwrap();
    assert_eq!(trailer.covered(), &buf[..end - 24]);
    assert_eq!(AuthRepr::parse(&trailer), Ok(AUTH));
    // emit_data leaves the trailer to the key holder: zeros, never an ICRC.
    let bare = emit(&repr);
    assert!(bare[end - 24..].iter().all(|&b| b == 0));
    let view = DataPacket::new_checked(&bare[..]).unwrap();
    assert_eq!(view.trailer_len(), AUTH_TRAILER_LEN);
    assert_eq!(view.payload().len(), 100);
    assert!(!view.verify_icrc());
}

#[test]
fn authenticated_ack_round_trips_with_exact_length() {
    let mut repr = ack();
    repr.base.flags.insert(Flags::AUTHENTICATED);
    let mut buf = emit_ack_vec(&repr);
    assert_eq!(buf.len(), ACK_FIXED_LEN + 2 * OP_ACK_LEN + AUTH_TRAILER_LEN);
    assert_eq!(repr.covered_len() + AUTH_TRAILER_LEN, buf.len());
    AUTH.emit(&mut AuthTrailer::new_unchecked(&mut buf[..]));
    assert_eq!(
        parse_authenticated(&buf),
        Ok((Packet::Ack(repr.clone()), AUTH))
    );
    fuzz_check(&buf);
    let mut longer = buf.clone();
    longer.push(0);
    assert_eq!(
        parse_authenticated(&longer),
        Err(Error::Malformed("ack length"))
    );
    assert_eq!(
        parse_authenticated(&buf[..buf.len() - 1]),
        Err(Error::Truncated)
    );
}

#[test]
fn parse_refuses_authenticated_and_parse_authenticated_refuses_plain() {
    let repr = authenticated(every_opcode()[0]);
    let buf = emit_sealed(&repr, AUTH);
    assert_eq!(parse(&buf), Err(Error::NeedsKey));
    let plain = emit(&every_opcode()[0]);
    assert_eq!(parse_authenticated(&plain), Err(Error::Malformed("flags")));
    // Version and length still come first.
    assert_eq!(
        parse_authenticated(&edited(buf.clone(), |b| b[0] = 2)),
        Err(Error::BadVersion(2))
    );
    assert_eq!(parse(&buf[..4]), Err(Error::Truncated));
}

#[test]
fn authenticated_truncated_at_every_length() {
    let mut datagrams: Vec<Vec<u8>> = every_opcode()
        .into_iter()
        .map(|r| emit_sealed(&authenticated(r), AUTH))
        .collect();
    let mut ack = ack();
    ack.base.flags.insert(Flags::AUTHENTICATED);
    datagrams.push(emit_ack_vec(&ack));
    for full in &datagrams {
        let header_len = match parse_authenticated(full).unwrap().0 {
            Packet::Data { repr, .. } => repr.header_len(),
            Packet::Ack(repr) => repr.covered_len(),
        };
        for len in 0..full.len() {
            let result = parse_authenticated(&full[..len]);
            if len < header_len + AUTH_TRAILER_LEN {
                assert_eq!(result, Err(Error::Truncated), "len {len} of {}", full.len());
            } else {
                // A shorter payload is structurally fine: only the tag can
                // tell that bytes went missing.
                assert!(result.is_ok(), "len {len}: {result:?}");
            }
            fuzz_check(&full[..len]);
        }
    }
}

#[test]
fn trailer_len_follows_the_flag() {
    assert_eq!(trailer_len(Flags::empty()), ICRC_LEN);
    assert_eq!(trailer_len(Flags::RETRANSMIT), ICRC_LEN);
    assert_eq!(trailer_len(Flags::AUTHENTICATED), AUTH_TRAILER_LEN);
    let repr = authenticated(every_opcode()[2]);
    assert_eq!(repr.buffer_len(), every_opcode()[2].buffer_len() + 20);
    assert!(Flags::KNOWN.contains(Flags::AUTHENTICATED));
    assert_eq!(Flags::AUTHENTICATED.to_string(), "AU");
}

/// The defined flag bits are distinct and pinned (wire.md section 3):
/// `ICRC_OMITTED` is bit 4, `SENDER_DRAINED` bit 5 and `REPAIR` bit 6;
/// bit 7 is reserved.
#[test]
fn flag_bits_are_pinned() {
    let all = [
        (Flags::ACK_REQUEST, 0x01, "AR"),
        (Flags::RETRANSMIT, 0x02, "RT"),
        (Flags::COMPLETION_PROBE, 0x04, "CP"),
        (Flags::AUTHENTICATED, 0x08, "AU"),
        (Flags::ICRC_OMITTED, 0x10, "IO"),
        (Flags::SENDER_DRAINED, 0x20, "SD"),
        (Flags::REPAIR, 0x40, "RP"),
    ];
    let mut union = 0u8;
    for (flag, bits, name) in all {
        assert_eq!(flag.bits(), bits, "{name}");
        assert_eq!(union & bits, 0, "{name} overlaps another flag");
        assert_eq!(flag.to_string(), name);
        union |= bits;
    }
    assert_eq!(Flags::KNOWN.bits(), union);
    assert_eq!(
        (Flags::ICRC_OMITTED | Flags::SENDER_DRAINED).to_string(),
        "IO|SD"
    );
}

/// `ICRC_OMITTED` (section 7.2): a receiver that requires the ICRC checks
/// it anyway (a zero trailer fails), one that accepts the omission skips it
/// only for packets that carry the flag.
#[test]
fn icrc_omission_is_the_receivers_choice() {
    let mut repr = every_opcode()[0];
    repr.base.flags = Flags::ICRC_OMITTED;
    let zero_trailer = |mut b: Vec<u8>| {
        let n = b.len();
        b[n - ICRC_LEN..].fill(0);
        b
    };
    let omitted = zero_trailer(emit(&repr));
    assert_eq!(parse(&omitted), Err(Error::BadChecksum));
    assert_eq!(
        parse_with(&omitted, IcrcPolicy::Required),
        Err(Error::BadChecksum)
    );
    let Ok(Packet::Data { repr: back, .. }) = parse_with(&omitted, IcrcPolicy::OmittedAccepted)
    else {
        panic!("an accepted omission parses");
    };
    assert_eq!(back, repr);
    // Without the flag a bad trailer fails even where omission is accepted.
    repr.base.flags = Flags::default();
    let bad = zero_trailer(emit(&repr));
    assert_eq!(
        parse_with(&bad, IcrcPolicy::OmittedAccepted),
        Err(Error::BadChecksum)
    );
}

/// The headers read alone, with the datagram's length, decode as the whole
/// datagram does; a head cut inside the headers, or a datagram too short
/// for its headers and trailer, is refused.
#[test]
fn parse_head_matches_parse() {
    for repr in every_opcode() {
        let datagram = emit(&repr);
        let hl = repr.header_len();
        let head = DataRepr::parse_head(&datagram[..hl], datagram.len()).unwrap();
        assert_eq!(head, repr);
        // More of the datagram than the headers changes nothing.
        let more = (hl + 16).min(datagram.len());
        assert_eq!(
            DataRepr::parse_head(&datagram[..more], datagram.len()).unwrap(),
            repr
        );
        assert!(DataRepr::parse_head(&datagram[..hl - 1], datagram.len()).is_err());
        assert!(DataRepr::parse_head(&datagram[..hl], hl + ICRC_LEN - 1).is_err());
    }
}

/// A repair packet's `offset` names its shard and how many there are
/// (wire.md section 4.4); the two halves survive a round trip, and the top
/// bit keeps the offset past any message (rule 1 drops it at a receiver
/// that ignores the flag).
#[test]
fn repair_ids_round_trip_through_the_offset_field() {
    for (index, count) in [
        (0, 1),
        (3, 4),
        (15, 16),
        (RepairId::MAX_COUNT - 1, RepairId::MAX_COUNT),
    ] {
        let id = RepairId { index, count };
        assert!(id.to_offset() >= 1 << 31);
        assert_eq!(RepairId::from_offset(id.to_offset()), Some(id));
    }
    // An index that is not below the count names no shard; nor does an
    // offset without the top bit.
    assert_eq!(RepairId::from_offset(1 << 31 | 4 << 16 | 4), None);
    assert_eq!(RepairId::from_offset(4 << 16 | 1), None);
    assert_eq!(RepairId::from_offset(0), None);
}
