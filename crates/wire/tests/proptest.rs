//! Property tests: arbitrary valid reprs round-trip; arbitrary bytes never panic.

use metaroce_wire::{
    AckRepr, AuthRepr, AuthTrailer, BaseRepr, DataRepr, Error, Flags, MAX_OP_ACKS, OpAck, OpHeader,
    Packet, SackBits, Syndrome, emit_ack, emit_data, fuzz_check, parse, parse_authenticated, seal,
};
use proptest::collection::vec;
use proptest::prelude::*;

fn base() -> impl Strategy<Value = BaseRepr> {
    (0u8..=3, any::<u8>(), any::<u16>(), any::<u16>()).prop_map(
        |(flags, path_slot, path_gen, src_device_port)| BaseRepr {
            flags: Flags(flags),
            path_slot,
            path_gen,
            src_device_port,
        },
    )
}

fn op_header() -> impl Strategy<Value = OpHeader> {
    let k = any::<u64>;
    let w = any::<u32>;
    prop_oneof![
        (k(), k()).prop_map(|(rkey, remote_addr)| OpHeader::Write { rkey, remote_addr }),
        (k(), k(), w(), w()).prop_map(|(rkey, remote_addr, recv_index, imm)| {
            OpHeader::WriteImm {
                rkey,
                remote_addr,
                recv_index,
                imm,
            }
        }),
        w().prop_map(|recv_index| OpHeader::Send { recv_index }),
        (w(), w()).prop_map(|(recv_index, imm)| OpHeader::SendImm { recv_index, imm }),
        (k(), k()).prop_map(|(rkey, remote_addr)| OpHeader::ReadRequest { rkey, remote_addr }),
        Just(OpHeader::ReadResponse),
        (k(), k(), k()).prop_map(|(rkey, remote_addr, add)| OpHeader::FetchAdd {
            rkey,
            remote_addr,
            add
        }),
        (k(), k(), k(), k()).prop_map(|(rkey, remote_addr, compare, swap)| {
            OpHeader::CmpSwap {
                rkey,
                remote_addr,
                compare,
                swap,
            }
        }),
        k().prop_map(|original| OpHeader::AtomicResponse { original }),
    ]
}

/// A valid DataRepr: the payload lies inside the message, atomics cover one word.
fn data_repr() -> impl Strategy<Value = DataRepr> {
    (
        base(),
        any::<[u32; 4]>(),
        any::<bool>(),
        op_header(),
        any::<u32>(),
        0u32..=96,
        any::<u32>(),
    )
        .prop_map(
            |(base, [psn, timestamp_ns, dst_qpn, msg_seq], solicited, op, msg_len, len, pick)| {
                let opcode = op.opcode();
                let (msg_len, offset, payload_len) = if matches!(
                    op,
                    OpHeader::FetchAdd { .. }
                        | OpHeader::CmpSwap { .. }
                        | OpHeader::AtomicResponse { .. }
                ) {
                    (8, 0, 0)
                } else {
                    let payload_len = if opcode.allows_payload() {
                        len.min(msg_len)
                    } else {
                        0
                    };
                    let room = u64::from(msg_len - payload_len) + 1;
                    (msg_len, (u64::from(pick) % room) as u32, payload_len)
                };
                DataRepr {
                    base,
                    psn,
                    timestamp_ns,
                    dst_qpn,
                    msg_seq,
                    solicited,
                    psn_floor_delta: (pick >> 16) as u16,
                    floor_acked: pick & 0x8000_0000 != 0,
                    msg_len,
                    offset,
                    op,
                    payload_len,
                }
            },
        )
}

fn syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        Just(Syndrome::Ack),
        Just(Syndrome::RnrNak),
        Just(Syndrome::RemAccessErr),
        Just(Syndrome::RemInvReqErr),
        Just(Syndrome::RemOpErr),
    ]
}

fn ack_repr() -> impl Strategy<Value = AckRepr> {
    let op_ack = (any::<u32>(), any::<u32>(), syndrome(), any::<u32>()).prop_map(
        |(qpn, msn, syndrome, nak_msg_seq)| OpAck {
            qpn,
            msn,
            syndrome,
            nak_msg_seq,
        },
    );
    (
        base(),
        any::<[u32; 6]>(),
        any::<[u8; 32]>(),
        vec(op_ack, 0..=MAX_OP_ACKS),
    )
        .prop_map(|(base, words, sack, op_acks)| {
            let mut repr = AckRepr::new(base);
            repr.ack_psn = words[0];
            repr.ts_echo = words[1];
            repr.ack_delay_ns = words[2];
            repr.rx_packets = words[3];
            repr.ce_packets = words[4];
            repr.rate_hint_mbps = words[5];
            repr.sack = SackBits(sack);
            for op_ack in op_acks {
                assert!(repr.push_op_ack(op_ack));
            }
            repr
        })
}

fn emit_data_vec(repr: &DataRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    assert_eq!(emit_data(repr, payload, &mut buf), buf.len());
    buf
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn data_round_trips(repr in data_repr(), fill in any::<u8>()) {
        prop_assert_eq!(repr.validate(), Ok(()));
        let payload = vec![fill; repr.payload_len as usize];
        let buf = emit_data_vec(&repr, &payload);
        let parsed = parse(&buf);
        prop_assert_eq!(parsed, Ok(Packet::Data { repr, payload: &payload }));
        fuzz_check(&buf);
    }

    #[test]
    fn ack_round_trips(repr in ack_repr()) {
        let mut buf = vec![0u8; repr.buffer_len()];
        prop_assert_eq!(emit_ack(&repr, &mut buf), buf.len());
        prop_assert_eq!(parse(&buf), Ok(Packet::Ack(repr)));
        fuzz_check(&buf);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in vec(any::<u8>(), 0..200)) {
        let _ = parse(&data);
        fuzz_check(&data);
    }

    /// Random bytes rarely get past the version byte and the ICRC, so also
    /// mutate valid packets and reseal them: that reaches the field checks.
    #[test]
    fn mutated_resealed_packets_never_panic(
        repr in data_repr(),
        ack in ack_repr(),
        use_ack in any::<bool>(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut buf = if use_ack {
            let mut buf = vec![0u8; ack.buffer_len()];
            emit_ack(&ack, &mut buf);
            buf
        } else {
            emit_data_vec(&repr, &vec![0xa5; repr.payload_len as usize])
        };
        for (index, value) in edits {
            // Keep the version valid most of the time so parsing goes deep.
            let at = index.index(buf.len());
            if at != 0 {
                buf[at] = value;
            }
        }
        if do_cut {
            buf.truncate(cut.index(buf.len()).max(4));
        }
        seal(&mut buf);
        let _ = parse(&buf);
        fuzz_check(&buf);
    }

    /// Authenticated packets of both kinds round-trip through
    /// `parse_authenticated` with their trailer, and `parse` refuses them.
    #[test]
    fn authenticated_round_trips(
        repr in data_repr(),
        ack in ack_repr(),
        packet_number in any::<u64>(),
        tag in any::<[u8; 16]>(),
    ) {
        let auth = AuthRepr { packet_number, tag };
        let mut repr = repr;
        repr.base.flags.insert(Flags::AUTHENTICATED);
        let payload = vec![0x3c; repr.payload_len as usize];
        let mut buf = emit_data_vec(&repr, &payload);
        auth.emit(&mut AuthTrailer::new_unchecked(&mut buf[..]));
        prop_assert_eq!(parse(&buf), Err(Error::NeedsKey));
        prop_assert_eq!(
            parse_authenticated(&buf),
            Ok((Packet::Data { repr, payload: &payload }, auth))
        );
        fuzz_check(&buf);
        let mut ack = ack;
        ack.base.flags.insert(Flags::AUTHENTICATED);
        let mut buf = vec![0u8; ack.buffer_len()];
        emit_ack(&ack, &mut buf);
        auth.emit(&mut AuthTrailer::new_unchecked(&mut buf[..]));
        prop_assert_eq!(parse_authenticated(&buf), Ok((Packet::Ack(ack), auth)));
        fuzz_check(&buf);
    }

    /// Mutated and cut authenticated packets never panic either parser.
    #[test]
    fn mutated_authenticated_packets_never_panic(
        repr in data_repr(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut repr = repr;
        repr.base.flags.insert(Flags::AUTHENTICATED);
        let mut buf = emit_data_vec(&repr, &vec![0xa5; repr.payload_len as usize]);
        for (index, value) in edits {
            let at = index.index(buf.len());
            if at != 0 {
                buf[at] = value;
            }
        }
        buf.truncate(cut.index(buf.len() + 1).max(1));
        let _ = parse(&buf);
        let _ = parse_authenticated(&buf);
        fuzz_check(&buf);
    }
}
