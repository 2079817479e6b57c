//! Drive one [`Endpoint`] with a fuzzer-chosen sequence of steps and check
//! invariants that must hold whatever the peer sends.
//!
//! # The fixture
//!
//! One endpoint (device port 4791) with one QP connected to the peer device
//! `127.0.0.2:4791`. The QP's remote QPN is its *own* QPN, so the datagrams
//! the endpoint sends are also valid input for it: the `Echo` step feeds a
//! recent transmit back, and the endpoint then plays both requester and
//! responder of a real exchange. Two regions in the same PD:
//!
//! * `main` (16 KiB, every right), the target of every legitimate access;
//! * `canary` (4 KiB, no remote right), filled with a pattern that nothing
//!   may ever change. It is registered right after `main`, so its IOVA range
//!   is just above `main`'s and an access that overruns `main` lands near it.
//!
//! At start two receives, a two-segment WRITE and a two-segment READ are
//! posted (the MTU is small so messages span several packets).
//!
//! # Input format
//!
//! A hand-rolled byte format (not `arbitrary`) so that seeds can be encoded
//! exactly by [`encode`] and stay valid whatever crate versions change: a
//! sequence of steps, each a tag byte (`tag % 9`) and its fields as
//! little-endian integers. A truncated input reads as zeros.
//!
//! # Invariants (checked after every step)
//!
//! * nothing panics (`handle_datagram` promises that for remote input, and
//!   so do `direct_target` and `handle_direct`, which every datagram tries
//!   first);
//! * the canary region's bytes never change;
//! * every completion names a work request that was posted on that queue,
//!   and none completes twice;
//! * every datagram the endpoint emits fits `max_datagram_len`, goes to the
//!   peer, and parses;
//! * at the end, once every timer has run out, every posted send work
//!   request has completed (the peer went silent, so they fail with
//!   `RetryExcErr` or are flushed), and if the QP is in error, every receive
//!   too.

use std::collections::{HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use metaroce_proto::{
    AccessFlags, Ecn, Endpoint, EndpointConfig, MrInfo, QpCaps, QpHandle, QpRunState, RecvWr,
    SendWr, Sge, WorkQueue, WrOp,
};
use metaroce_wire::{
    self as wire, AckRepr, BaseRepr, DataRepr, Flags, OpAck, OpHeader, SackBits, Syndrome,
};

/// The device port of the endpoint and of its peer.
pub const DEVICE_PORT: u16 = 4791;
/// The peer device's IP.
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// An IP with no connection.
pub const STRANGER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// Payload bytes per packet in the fixture.
pub const MTU: u32 = 256;
/// Paths per connection in the fixture.
pub const PATHS: usize = 4;
/// Size of the region every legitimate access targets.
pub const MAIN_LEN: u64 = 16 * 1024;
/// Size of the region nothing may touch.
pub const CANARY_LEN: u64 = 4096;
/// Steps run per input at most (keeps each execution short).
pub const MAX_STEPS: usize = 128;
/// Work requests the harness posts per input at most (initial ones included).
pub const MAX_POSTS: usize = 64;
/// Datagrams drained per step at most; more is not an error (a large window
/// can release many packets), the rest goes out with the next drain.
pub const MAX_DRAIN: usize = 512;
/// Recent transmits kept for the `Echo` step.
pub const ECHO_RING: usize = 32;

// ------------------------------------------------------------------ format

/// Reads little-endian integers; past the end everything reads as zero.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// Whether every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.data.split_at(n.min(self.data.len()));
        self.data = tail;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let got = self.bytes(N);
        out[..got.len()].copy_from_slice(got);
        out
    }

    /// One byte.
    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}

/// Where a fuzzed datagram comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Origin {
    /// ECN codepoint (`% 3`: not-ECT, ECT(0), CE).
    pub ecn: u8,
    /// UDP source port (any: the peer's path port).
    pub src_port: u16,
    /// `src_device_port` in the base header; `None` is the peer's (4791).
    pub device_port: Option<u16>,
    /// Send from an IP with no connection instead of the peer's.
    pub stranger: bool,
}

/// Which QPN a structured packet names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qpn {
    /// The fixture's QP.
    Ours,
    /// Any other number.
    Other(u32),
}

/// Which rkey a structured request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// The main region's rkey (every right).
    Main,
    /// The canary region's rkey (no remote right).
    Canary,
    /// The main region's lkey (must not work remotely).
    MainLkey,
    /// Any other key.
    Other(u64),
}

/// Which remote address a structured request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addr {
    /// Main region base plus a signed offset (may be out of bounds).
    Main(i32),
    /// Canary region base plus an offset.
    Canary(u16),
    /// Any address.
    Other(u64),
}

/// The opcode extension of a structured data packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpStep {
    /// WRITE.
    Write { key: Key, addr: Addr },
    /// WRITE_WITH_IMM; `recv` is the receive index (relative to 0).
    WriteImm {
        key: Key,
        addr: Addr,
        recv: i8,
        imm: u32,
    },
    /// SEND.
    Send { recv: i8 },
    /// SEND_WITH_IMM.
    SendImm { recv: i8, imm: u32 },
    /// READ request.
    ReadRequest { key: Key, addr: Addr },
    /// READ response.
    ReadResponse,
    /// FETCH_ADD.
    FetchAdd { key: Key, addr: Addr, add: u64 },
    /// CMP_SWAP.
    CmpSwap {
        key: Key,
        addr: Addr,
        compare: u64,
        swap: u64,
    },
    /// Atomic response.
    AtomicResponse { original: u64 },
}

/// A well-formed data packet built from fuzzed fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataStep {
    /// Source of the datagram.
    pub origin: Origin,
    /// Base header flags (unknown bits are masked by the wire crate).
    pub flags: u8,
    /// Path slot (the sender's; the receiver keeps a window per slot).
    pub slot: u8,
    /// Path generation.
    pub generation: u8,
    /// PSN relative to the path's initial PSN.
    pub psn_delta: i16,
    /// PSN floor delta.
    pub floor_delta: u16,
    /// Sender timestamp.
    pub timestamp: u32,
    /// Destination QP.
    pub qpn: Qpn,
    /// Message sequence number (signed: negative ones wrap to "long ago").
    pub msg_seq: i8,
    /// SOLICITED bit.
    pub solicited: bool,
    /// FLOOR_ACKED bit (bit 1 of the same input byte as SOLICITED).
    pub floor_acked: bool,
    /// Message length (fixed up so the packet validates).
    pub msg_len: u16,
    /// Offset of the payload in the message.
    pub offset: u16,
    /// Payload length (fixed up so the packet validates).
    pub payload_len: u16,
    /// First payload byte; the payload counts up from it.
    pub fill: u8,
    /// Opcode and extension.
    pub op: OpStep,
}

/// One op-ack entry of a structured ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpAckStep {
    /// The requester QP it is about.
    pub qpn: Qpn,
    /// Cumulative MSN (signed, relative to 0).
    pub msn: i8,
    /// Syndrome (`% 5`).
    pub syndrome: u8,
    /// The message a NAK is about.
    pub nak_msg_seq: i8,
}

/// A well-formed ACK built from fuzzed fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckStep {
    /// Source of the datagram.
    pub origin: Origin,
    /// Base header flags.
    pub flags: u8,
    /// Path slot being acknowledged (ours).
    pub slot: u8,
    /// Path generation.
    pub generation: u8,
    /// Cumulative ACK PSN relative to the path's initial PSN.
    pub ack_psn_delta: i16,
    /// The first bytes of the SACK bitmap (at most 32).
    pub sack: Vec<u8>,
    /// Echoed timestamp.
    pub ts_echo: u32,
    /// Receiver-side delay.
    pub ack_delay_ns: u32,
    /// Cumulative packets received on the path.
    pub rx_packets: u32,
    /// Cumulative CE-marked packets.
    pub ce_packets: u32,
    /// Receiver rate hint.
    pub rate_hint_mbps: u32,
    /// Op-ack entries (at most 16).
    pub op_acks: Vec<OpAckStep>,
}

/// What to post in a `PostSend` step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendStep {
    /// Operation (`% 7`: Write, WriteImm, Send, SendImm, Read, FetchAdd, CmpSwap).
    pub kind: u8,
    /// Offset of the local buffer in the main region.
    pub local_offset: u16,
    /// Length of the local buffer (atomics use 8 whatever this says).
    pub len: u16,
    /// Remote key.
    pub key: Key,
    /// Remote address.
    pub addr: Addr,
    /// Copy the data at post time instead of naming the main region.
    pub inline: bool,
    /// Operand of immediates and atomics.
    pub operand: u64,
}

/// One step of a fuzz input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The bytes as given, from the peer's IP and `src_port`.
    Raw { src_port: u16, bytes: Vec<u8> },
    /// A structured data packet.
    Data(DataStep),
    /// A structured ACK.
    Ack(AckStep),
    /// Feed back one of the recent transmits, optionally with a byte xored.
    Echo { index: u8, flip: Option<(u16, u8)> },
    /// Advance the clock by `ns` and run due timers.
    Advance { ns: u32 },
    /// Jump to the next deadline and run it.
    FireTimer,
    /// Post a receive into the main region.
    PostRecv { offset: u16, len: u16 },
    /// Post a send work request.
    PostSend(SendStep),
    /// Move the QP to the error state.
    QpError,
}

fn read_origin(r: &mut Reader<'_>) -> Origin {
    let bits = r.u8();
    let src_port = r.u16();
    let device_port = (bits & 0x04 != 0).then(|| r.u16());
    Origin {
        ecn: bits & 0x03,
        src_port,
        device_port,
        stranger: bits & 0x08 != 0,
    }
}

fn write_origin(o: &Origin, out: &mut Vec<u8>) {
    let bits = (o.ecn % 3)
        | if o.device_port.is_some() { 0x04 } else { 0 }
        | if o.stranger { 0x08 } else { 0 };
    out.push(bits);
    out.extend_from_slice(&o.src_port.to_le_bytes());
    if let Some(p) = o.device_port {
        out.extend_from_slice(&p.to_le_bytes());
    }
}

fn read_qpn(r: &mut Reader<'_>) -> Qpn {
    // Mostly ours, so that the fuzzer gets past the QP lookup.
    if r.u8() < 224 {
        Qpn::Ours
    } else {
        Qpn::Other(r.u32())
    }
}

fn write_qpn(q: &Qpn, out: &mut Vec<u8>) {
    match q {
        Qpn::Ours => out.push(0),
        Qpn::Other(n) => {
            out.push(255);
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
}

fn read_key(r: &mut Reader<'_>) -> Key {
    match r.u8() % 8 {
        0..=4 => Key::Main,
        5 => Key::Canary,
        6 => Key::MainLkey,
        _ => Key::Other(r.u64()),
    }
}

fn write_key(k: &Key, out: &mut Vec<u8>) {
    match k {
        Key::Main => out.push(0),
        Key::Canary => out.push(5),
        Key::MainLkey => out.push(6),
        Key::Other(v) => {
            out.push(7);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn read_addr(r: &mut Reader<'_>) -> Addr {
    match r.u8() % 8 {
        0..=5 => Addr::Main(r.u32() as i32),
        6 => Addr::Canary(r.u16()),
        _ => Addr::Other(r.u64()),
    }
}

fn write_addr(a: &Addr, out: &mut Vec<u8>) {
    match a {
        Addr::Main(off) => {
            out.push(0);
            out.extend_from_slice(&off.to_le_bytes());
        }
        Addr::Canary(off) => {
            out.push(6);
            out.extend_from_slice(&off.to_le_bytes());
        }
        Addr::Other(v) => {
            out.push(7);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn read_op(r: &mut Reader<'_>) -> OpStep {
    match r.u8() % 9 {
        0 => OpStep::Write {
            key: read_key(r),
            addr: read_addr(r),
        },
        1 => OpStep::WriteImm {
            key: read_key(r),
            addr: read_addr(r),
            recv: r.u8() as i8,
            imm: r.u32(),
        },
        2 => OpStep::Send { recv: r.u8() as i8 },
        3 => OpStep::SendImm {
            recv: r.u8() as i8,
            imm: r.u32(),
        },
        4 => OpStep::ReadRequest {
            key: read_key(r),
            addr: read_addr(r),
        },
        5 => OpStep::ReadResponse,
        6 => OpStep::FetchAdd {
            key: read_key(r),
            addr: read_addr(r),
            add: r.u64(),
        },
        7 => OpStep::CmpSwap {
            key: read_key(r),
            addr: read_addr(r),
            compare: r.u64(),
            swap: r.u64(),
        },
        _ => OpStep::AtomicResponse { original: r.u64() },
    }
}

fn write_op(op: &OpStep, out: &mut Vec<u8>) {
    match op {
        OpStep::Write { key, addr } => {
            out.push(0);
            write_key(key, out);
            write_addr(addr, out);
        }
        OpStep::WriteImm {
            key,
            addr,
            recv,
            imm,
        } => {
            out.push(1);
            write_key(key, out);
            write_addr(addr, out);
            out.push(*recv as u8);
            out.extend_from_slice(&imm.to_le_bytes());
        }
        OpStep::Send { recv } => {
            out.push(2);
            out.push(*recv as u8);
        }
        OpStep::SendImm { recv, imm } => {
            out.push(3);
            out.push(*recv as u8);
            out.extend_from_slice(&imm.to_le_bytes());
        }
        OpStep::ReadRequest { key, addr } => {
            out.push(4);
            write_key(key, out);
            write_addr(addr, out);
        }
        OpStep::ReadResponse => out.push(5),
        OpStep::FetchAdd { key, addr, add } => {
            out.push(6);
            write_key(key, out);
            write_addr(addr, out);
            out.extend_from_slice(&add.to_le_bytes());
        }
        OpStep::CmpSwap {
            key,
            addr,
            compare,
            swap,
        } => {
            out.push(7);
            write_key(key, out);
            write_addr(addr, out);
            out.extend_from_slice(&compare.to_le_bytes());
            out.extend_from_slice(&swap.to_le_bytes());
        }
        OpStep::AtomicResponse { original } => {
            out.push(8);
            out.extend_from_slice(&original.to_le_bytes());
        }
    }
}

impl Step {
    /// Decode one step.
    pub fn read(r: &mut Reader<'_>) -> Self {
        match r.u8() % 9 {
            0 => {
                let src_port = r.u16();
                let len = usize::from(r.u16() % 2048);
                Self::Raw {
                    src_port,
                    bytes: r.bytes(len).to_vec(),
                }
            }
            1 => {
                // SOLICITED and FLOOR_ACKED come from one input byte (bits 0
                // and 1), as in `op_flags`.
                let op_bits;
                Self::Data(DataStep {
                    origin: read_origin(r),
                    flags: r.u8(),
                    slot: r.u8(),
                    generation: r.u8(),
                    psn_delta: r.u16() as i16,
                    floor_delta: r.u16(),
                    timestamp: r.u32(),
                    qpn: read_qpn(r),
                    msg_seq: r.u8() as i8,
                    solicited: {
                        op_bits = r.u8();
                        op_bits & 1 != 0
                    },
                    floor_acked: op_bits & 2 != 0,
                    msg_len: r.u16(),
                    offset: r.u16(),
                    payload_len: r.u16(),
                    fill: r.u8(),
                    op: read_op(r),
                })
            }
            2 => {
                let origin = read_origin(r);
                let flags = r.u8();
                let slot = r.u8();
                let generation = r.u8();
                let ack_psn_delta = r.u16() as i16;
                let sack_len = usize::from(r.u8() % 33);
                let sack = r.bytes(sack_len).to_vec();
                let (ts_echo, ack_delay_ns, rx_packets, ce_packets, rate_hint_mbps) =
                    (r.u32(), r.u32(), r.u32(), r.u32(), r.u32());
                let count = r.u8() % 17;
                let op_acks = (0..count)
                    .map(|_| OpAckStep {
                        qpn: read_qpn(r),
                        msn: r.u8() as i8,
                        syndrome: r.u8(),
                        nak_msg_seq: r.u8() as i8,
                    })
                    .collect();
                Self::Ack(AckStep {
                    origin,
                    flags,
                    slot,
                    generation,
                    ack_psn_delta,
                    sack,
                    ts_echo,
                    ack_delay_ns,
                    rx_packets,
                    ce_packets,
                    rate_hint_mbps,
                    op_acks,
                })
            }
            3 => {
                let index = r.u8();
                let flip = (r.u8() & 1 != 0).then(|| (r.u16(), r.u8()));
                Self::Echo { index, flip }
            }
            4 => Self::Advance { ns: r.u32() },
            5 => Self::FireTimer,
            6 => Self::PostRecv {
                offset: r.u16(),
                len: r.u16(),
            },
            7 => Self::PostSend(SendStep {
                kind: r.u8(),
                local_offset: r.u16(),
                len: r.u16(),
                key: read_key(r),
                addr: read_addr(r),
                inline: r.u8() & 1 != 0,
                operand: r.u64(),
            }),
            _ => Self::QpError,
        }
    }

    /// Encode the step so that [`Step::read`] decodes it back.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Self::Raw { src_port, bytes } => {
                assert!(bytes.len() < 2048, "raw datagrams are at most 2047 bytes");
                out.push(0);
                out.extend_from_slice(&src_port.to_le_bytes());
                out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
                out.extend_from_slice(bytes);
            }
            Self::Data(d) => {
                out.push(1);
                write_origin(&d.origin, out);
                out.extend_from_slice(&[d.flags, d.slot, d.generation]);
                out.extend_from_slice(&d.psn_delta.to_le_bytes());
                out.extend_from_slice(&d.floor_delta.to_le_bytes());
                out.extend_from_slice(&d.timestamp.to_le_bytes());
                write_qpn(&d.qpn, out);
                out.push(d.msg_seq as u8);
                out.push(u8::from(d.solicited) | u8::from(d.floor_acked) << 1);
                out.extend_from_slice(&d.msg_len.to_le_bytes());
                out.extend_from_slice(&d.offset.to_le_bytes());
                out.extend_from_slice(&d.payload_len.to_le_bytes());
                out.push(d.fill);
                write_op(&d.op, out);
            }
            Self::Ack(a) => {
                assert!(a.sack.len() <= 32 && a.op_acks.len() <= 16);
                out.push(2);
                write_origin(&a.origin, out);
                out.extend_from_slice(&[a.flags, a.slot, a.generation]);
                out.extend_from_slice(&a.ack_psn_delta.to_le_bytes());
                out.push(a.sack.len() as u8);
                out.extend_from_slice(&a.sack);
                for v in [
                    a.ts_echo,
                    a.ack_delay_ns,
                    a.rx_packets,
                    a.ce_packets,
                    a.rate_hint_mbps,
                ] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.push(a.op_acks.len() as u8);
                for e in &a.op_acks {
                    write_qpn(&e.qpn, out);
                    out.extend_from_slice(&[e.msn as u8, e.syndrome, e.nak_msg_seq as u8]);
                }
            }
            Self::Echo { index, flip } => {
                out.extend_from_slice(&[3, *index]);
                match flip {
                    None => out.push(0),
                    Some((at, xor)) => {
                        out.push(1);
                        out.extend_from_slice(&at.to_le_bytes());
                        out.push(*xor);
                    }
                }
            }
            Self::Advance { ns } => {
                out.push(4);
                out.extend_from_slice(&ns.to_le_bytes());
            }
            Self::FireTimer => out.push(5),
            Self::PostRecv { offset, len } => {
                out.push(6);
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
            Self::PostSend(s) => {
                out.push(7);
                out.push(s.kind);
                out.extend_from_slice(&s.local_offset.to_le_bytes());
                out.extend_from_slice(&s.len.to_le_bytes());
                write_key(&s.key, out);
                write_addr(&s.addr, out);
                out.push(u8::from(s.inline));
                out.extend_from_slice(&s.operand.to_le_bytes());
            }
            Self::QpError => out.push(8),
        }
    }
}

/// Decode a whole input (at most [`MAX_STEPS`] steps).
pub fn decode(data: &[u8]) -> Vec<Step> {
    let mut r = Reader::new(data);
    let mut steps = Vec::new();
    while !r.is_empty() && steps.len() < MAX_STEPS {
        steps.push(Step::read(&mut r));
    }
    steps
}

/// Encode steps into an input that [`decode`]s back to them.
pub fn encode(steps: &[Step]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in steps {
        s.write(&mut out);
    }
    out
}

// ----------------------------------------------------------------- harness

/// The first PSN of a path, as `metaroce_proto::path::initial_psn` computes
/// it with `psn_base` 0 (that function is crate-private; the formula is a
/// protocol parameter both sides share). If the two ever diverge the
/// fuzzer only gets shallower, not wrong.
pub fn initial_psn(slot: u8, generation: u16) -> u32 {
    (u32::from(slot) << 20).wrapping_add(u32::from(generation).wrapping_mul(0x9E37_79B9))
}

/// What happened during a run, for seed selection and statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Datagrams the endpoint emitted.
    pub transmits: u64,
    /// Completions seen.
    pub completions: u64,
    /// Successful completions seen.
    pub successes: u64,
    /// Whether the QP ended in the error state.
    pub qp_error: bool,
}

/// The fixture and the bookkeeping that the invariants need.
pub struct Harness {
    ep: Endpoint,
    qp: QpHandle,
    main: MrInfo,
    canary: MrInfo,
    canary_bytes: Vec<u8>,
    peer: SocketAddr,
    now: u64,
    buf: Vec<u8>,
    echo: VecDeque<(u16, Vec<u8>)>,
    posted_send: HashSet<u64>,
    posted_recv: HashSet<u64>,
    done_send: HashSet<u64>,
    done_recv: HashSet<u64>,
    next_wr_id: u64,
    posts: usize,
    outcome: Outcome,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// Build the fixture described in the module docs.
    pub fn new() -> Self {
        let config = EndpointConfig {
            device_port: DEVICE_PORT,
            path_port_span: 8,
            paths_per_connection: PATHS,
            mtu_payload_bytes: MTU,
            // Packets flagged ICRC-omitted are taken on the UDP checksum's
            // word, which also opens the direct-placement path (`datagram`).
            accept_icrc_omitted: true,
            max_send_wr: 64,
            max_recv_wr: 64,
            max_memory_regions: 8,
            max_queue_pairs: 4,
            max_connections: 2,
            // Finite RNR retries: with 7 (infinite) a SEND to a silent peer
            // could wait forever and the end-of-run liveness check would not
            // hold by design.
            rnr_retry: 3,
            retry_cnt: 3,
            seed: 1,
            ..EndpointConfig::default()
        };
        let mut ep = Endpoint::new(config).expect("valid config");
        let pd = ep.alloc_pd();
        let all = AccessFlags(
            AccessFlags::LOCAL_WRITE.0
                | AccessFlags::REMOTE_WRITE.0
                | AccessFlags::REMOTE_READ.0
                | AccessFlags::REMOTE_ATOMIC.0,
        );
        let main = ep.register_memory(pd, MAIN_LEN, all).expect("main region");
        let canary = ep
            .register_memory(pd, CANARY_LEN, AccessFlags::NONE)
            .expect("canary region");
        for (i, b) in ep
            .memory_mut(main.handle)
            .expect("real bytes")
            .iter_mut()
            .enumerate()
        {
            *b = (i % 251) as u8;
        }
        let canary_bytes: Vec<u8> = (0..CANARY_LEN).map(|i| 0xA5 ^ (i % 7) as u8).collect();
        ep.memory_mut(canary.handle)
            .expect("real bytes")
            .copy_from_slice(&canary_bytes);
        let qp = ep
            .create_qp(
                pd,
                QpCaps {
                    max_send_wr: 32,
                    max_recv_wr: 32,
                },
                all,
            )
            .expect("qp");
        let peer = SocketAddr::new(IpAddr::V4(PEER_IP), DEVICE_PORT);
        // Loopback: the remote QPN is our own, so our transmits are valid input.
        ep.connect_qp(qp, peer, qp.qpn()).expect("connect");
        ep.set_qp_remote_access(qp, all).expect("access");
        let buf = vec![0u8; ep.max_datagram_len()];
        let mut h = Self {
            ep,
            qp,
            main,
            canary,
            canary_bytes,
            peer,
            now: 1_000_000,
            buf,
            echo: VecDeque::new(),
            posted_send: HashSet::new(),
            posted_recv: HashSet::new(),
            done_send: HashSet::new(),
            done_recv: HashSet::new(),
            next_wr_id: 1,
            posts: 0,
            outcome: Outcome::default(),
        };
        for i in 0..2u16 {
            h.post_recv(8192 + i * 512, 512);
        }
        // Two-segment WRITE of main[0..300] to main[1024..], and a
        // two-segment READ of main[2048..2348] into main[4096..].
        h.post_send(SendStep {
            kind: 0,
            local_offset: 0,
            len: 300,
            key: Key::Main,
            addr: Addr::Main(1024),
            inline: false,
            operand: 0,
        });
        h.post_send(SendStep {
            kind: 4,
            local_offset: 4096,
            len: 300,
            key: Key::Main,
            addr: Addr::Main(2048),
            inline: false,
            operand: 0,
        });
        h.drain();
        h
    }

    fn rkey(&self, key: Key) -> u64 {
        match key {
            Key::Main => self.main.rkey,
            Key::Canary => self.canary.rkey,
            Key::MainLkey => self.main.lkey,
            Key::Other(v) => v,
        }
    }

    fn addr(&self, addr: Addr) -> u64 {
        match addr {
            Addr::Main(off) => self.main.addr.wrapping_add(off as i64 as u64),
            Addr::Canary(off) => self.canary.addr.wrapping_add(u64::from(off)),
            Addr::Other(v) => v,
        }
    }

    fn qpn(&self, q: Qpn) -> u32 {
        match q {
            Qpn::Ours => self.qp.qpn(),
            Qpn::Other(n) => n,
        }
    }

    fn src(&self, origin: &Origin) -> (SocketAddr, Ecn) {
        let ip = if origin.stranger {
            STRANGER_IP
        } else {
            PEER_IP
        };
        let ecn = match origin.ecn % 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect0,
            _ => Ecn::Ce,
        };
        (SocketAddr::new(IpAddr::V4(ip), origin.src_port), ecn)
    }

    fn wr_id(&mut self) -> u64 {
        self.next_wr_id += 1;
        self.next_wr_id - 1
    }

    fn post_recv(&mut self, offset: u16, len: u16) {
        if self.posts >= MAX_POSTS {
            return;
        }
        self.posts += 1;
        let wr_id = self.wr_id();
        let sge = Sge {
            addr: self.main.addr + u64::from(offset) % MAIN_LEN,
            length: u32::from(len),
            lkey: self.main.lkey,
        };
        if self
            .ep
            .post_recv(
                self.qp,
                RecvWr {
                    wr_id,
                    sg_list: vec![sge],
                },
            )
            .is_ok()
        {
            self.posted_recv.insert(wr_id);
        }
    }

    fn post_send(&mut self, s: SendStep) {
        if self.posts >= MAX_POSTS {
            return;
        }
        self.posts += 1;
        let wr_id = self.wr_id();
        let (rkey, remote_addr) = (self.rkey(s.key), self.addr(s.addr));
        let op = match s.kind % 7 {
            0 => WrOp::Write { remote_addr, rkey },
            1 => WrOp::WriteImm {
                remote_addr,
                rkey,
                imm: s.operand as u32,
            },
            2 => WrOp::Send,
            3 => WrOp::SendImm {
                imm: s.operand as u32,
            },
            4 => WrOp::Read { remote_addr, rkey },
            5 => WrOp::FetchAdd {
                remote_addr,
                rkey,
                add: s.operand,
            },
            _ => WrOp::CmpSwap {
                remote_addr,
                rkey,
                compare: s.operand,
                swap: !s.operand,
            },
        };
        let len = if op.is_atomic() {
            8
        } else {
            u32::from(s.len) % 4096
        };
        let local = u64::from(s.local_offset) % MAIN_LEN;
        let wr = if s.inline && !op.is_atomic() && !matches!(op, WrOp::Read { .. }) {
            SendWr::inline(wr_id, op, vec![s.operand as u8; len as usize])
        } else {
            let sge = Sge {
                addr: self.main.addr + local,
                length: len,
                lkey: self.main.lkey,
            };
            SendWr::new(wr_id, op, vec![sge])
        };
        if self.ep.post_send_at(self.now, self.qp, wr).is_ok() {
            self.posted_send.insert(wr_id);
        }
    }

    /// A datagram, taken as the UDP driver takes it: where the endpoint
    /// names a direct-placement target (a WRITE or READ response without
    /// ICRC, into bytes still to come), the payload is copied there and the
    /// headers handed over; otherwise the whole datagram.
    fn datagram(&mut self, src: SocketAddr, ecn: Ecn, bytes: &[u8]) {
        let head = &bytes[..bytes.len().min(512)];
        if let Some(target) = self.ep.direct_target(src, head, bytes.len()) {
            let hl = target.header_len();
            if let Some(buf) = self.ep.direct_buffer(&target) {
                buf.copy_from_slice(&bytes[hl..hl + target.payload_len()]);
            }
            self.ep
                .handle_direct(self.now, src, ecn, &bytes[..hl], &target);
            return;
        }
        self.ep.handle_datagram(self.now, src, ecn, bytes);
    }

    fn data_step(&mut self, d: &DataStep) {
        let op = match d.op {
            OpStep::Write { key, addr } => OpHeader::Write {
                rkey: self.rkey(key),
                remote_addr: self.addr(addr),
            },
            OpStep::WriteImm {
                key,
                addr,
                recv,
                imm,
            } => OpHeader::WriteImm {
                rkey: self.rkey(key),
                remote_addr: self.addr(addr),
                recv_index: recv as i32 as u32,
                imm,
            },
            OpStep::Send { recv } => OpHeader::Send {
                recv_index: recv as i32 as u32,
            },
            OpStep::SendImm { recv, imm } => OpHeader::SendImm {
                recv_index: recv as i32 as u32,
                imm,
            },
            OpStep::ReadRequest { key, addr } => OpHeader::ReadRequest {
                rkey: self.rkey(key),
                remote_addr: self.addr(addr),
            },
            OpStep::ReadResponse => OpHeader::ReadResponse,
            OpStep::FetchAdd { key, addr, add } => OpHeader::FetchAdd {
                rkey: self.rkey(key),
                remote_addr: self.addr(addr),
                add,
            },
            OpStep::CmpSwap {
                key,
                addr,
                compare,
                swap,
            } => OpHeader::CmpSwap {
                rkey: self.rkey(key),
                remote_addr: self.addr(addr),
                compare,
                swap,
            },
            OpStep::AtomicResponse { original } => OpHeader::AtomicResponse { original },
        };
        // Fix the lengths up so that the packet is one the wire crate accepts:
        // malformed packets are the raw step's business.
        let opcode = op.opcode();
        let (mut msg_len, mut offset, mut payload_len) = (
            u32::from(d.msg_len),
            u32::from(d.offset),
            u32::from(d.payload_len) % (2 * MTU + 1),
        );
        if !opcode.allows_payload() {
            payload_len = 0;
        }
        if opcode.is_atomic_request() || opcode == wire::Opcode::AtomicResponse {
            msg_len = 8;
            offset = 0;
        }
        let mut flags = Flags(d.flags);
        let request_with_payload = matches!(
            opcode,
            wire::Opcode::Write
                | wire::Opcode::WriteImm
                | wire::Opcode::Send
                | wire::Opcode::SendImm
        );
        if flags.contains(Flags::REPAIR) && !request_with_payload {
            flags.remove(Flags::REPAIR);
        }
        if flags.contains(Flags::REPAIR) {
            // A repair packet (wire.md 4.4): the offset names a shard of up
            // to 16, the shard is even, non-empty and at most the message
            // rounded up to even.
            let count = 1 + (offset >> 8) as u16 % 16;
            let index = (offset & 0xff) as u16 % count;
            offset = wire::RepairId { index, count }.to_offset();
            payload_len = (payload_len & !1).max(2);
            if payload_len > msg_len + 1 {
                msg_len = payload_len;
            }
        } else if offset + payload_len > msg_len {
            msg_len = offset + payload_len;
        }
        let generation = u16::from(d.generation);
        let repr = DataRepr {
            base: BaseRepr {
                flags,
                path_slot: d.slot,
                path_gen: generation,
                src_device_port: d.origin.device_port.unwrap_or(DEVICE_PORT),
            },
            psn: initial_psn(d.slot, generation).wrapping_add(d.psn_delta as i32 as u32),
            timestamp_ns: d.timestamp,
            dst_qpn: self.qpn(d.qpn),
            msg_seq: d.msg_seq as i32 as u32,
            solicited: d.solicited,
            psn_floor_delta: d.floor_delta,
            floor_acked: d.floor_acked,
            msg_len,
            offset,
            op,
            payload_len,
        };
        debug_assert!(repr.validate().is_ok(), "{repr:?}");
        let payload: Vec<u8> = (0..payload_len)
            .map(|i| d.fill.wrapping_add(i as u8))
            .collect();
        let mut bytes = vec![0u8; repr.buffer_len()];
        wire::emit_data(&repr, &payload, &mut bytes);
        let (src, ecn) = self.src(&d.origin);
        self.datagram(src, ecn, &bytes);
    }

    fn ack_step(&mut self, a: &AckStep) {
        let generation = u16::from(a.generation);
        let mut repr = AckRepr::new(BaseRepr {
            flags: Flags(a.flags),
            path_slot: a.slot,
            path_gen: generation,
            src_device_port: a.origin.device_port.unwrap_or(DEVICE_PORT),
        });
        repr.ack_psn = initial_psn(a.slot, generation).wrapping_add(a.ack_psn_delta as i32 as u32);
        let mut sack = SackBits::EMPTY;
        sack.0[..a.sack.len()].copy_from_slice(&a.sack);
        repr.sack = sack;
        repr.ts_echo = a.ts_echo;
        repr.ack_delay_ns = a.ack_delay_ns;
        repr.rx_packets = a.rx_packets;
        repr.ce_packets = a.ce_packets;
        repr.rate_hint_mbps = a.rate_hint_mbps;
        for e in &a.op_acks {
            let syndrome = match e.syndrome % 5 {
                0 => Syndrome::Ack,
                1 => Syndrome::RnrNak,
                2 => Syndrome::RemAccessErr,
                3 => Syndrome::RemInvReqErr,
                _ => Syndrome::RemOpErr,
            };
            repr.push_op_ack(OpAck {
                qpn: self.qpn(e.qpn),
                msn: e.msn as i32 as u32,
                syndrome,
                nak_msg_seq: e.nak_msg_seq as i32 as u32,
            });
        }
        let mut bytes = vec![0u8; repr.buffer_len()];
        wire::emit_ack(&repr, &mut bytes);
        let (src, ecn) = self.src(&a.origin);
        self.datagram(src, ecn, &bytes);
    }

    /// Run one step, drain the outputs, check the invariants.
    pub fn step(&mut self, step: &Step) {
        match step {
            Step::Raw { src_port, bytes } => {
                let src = SocketAddr::new(IpAddr::V4(PEER_IP), *src_port);
                self.datagram(src, Ecn::NotEct, bytes);
            }
            Step::Data(d) => self.data_step(d),
            Step::Ack(a) => self.ack_step(a),
            Step::Echo { index, flip } => {
                if !self.echo.is_empty() {
                    let i = usize::from(*index) % self.echo.len();
                    let (port, mut bytes) = self.echo[i].clone();
                    if let Some((at, xor)) = flip
                        && !bytes.is_empty()
                    {
                        let at = usize::from(*at) % bytes.len();
                        bytes[at] ^= xor;
                    }
                    let src = SocketAddr::new(IpAddr::V4(PEER_IP), port);
                    self.datagram(src, Ecn::Ect0, &bytes);
                }
            }
            Step::Advance { ns } => {
                self.now += u64::from(*ns);
                self.ep.handle_timeout(self.now);
            }
            Step::FireTimer => {
                if let Some(t) = self.ep.poll_timeout() {
                    self.now = self.now.max(t);
                }
                self.ep.handle_timeout(self.now);
            }
            Step::PostRecv { offset, len } => self.post_recv(*offset, *len % 2048),
            Step::PostSend(s) => self.post_send(*s),
            Step::QpError => {
                self.ep.set_qp_error(self.qp).expect("live qp");
            }
        }
        self.drain();
    }

    /// Drain transmits and completions, checking both.
    fn drain(&mut self) {
        let max = self.ep.max_datagram_len();
        for _ in 0..MAX_DRAIN {
            let Some(t) = self.ep.poll_transmit(self.now, &mut self.buf) else {
                break;
            };
            self.outcome.transmits += 1;
            assert!(
                t.len <= max,
                "transmit of {} bytes exceeds max_datagram_len {max}",
                t.len
            );
            assert_eq!(t.dst, self.peer, "transmit to an unknown destination");
            let bytes = &self.buf[..t.len];
            match wire::parse(bytes) {
                Ok(p) => assert_eq!(
                    p.base().src_device_port,
                    DEVICE_PORT,
                    "wrong src_device_port"
                ),
                Err(e) => {
                    panic!("endpoint emitted a datagram that does not parse: {e}: {bytes:02x?}")
                }
            }
            if self.echo.len() == ECHO_RING {
                self.echo.pop_front();
            }
            self.echo.push_back((t.src_port, bytes.to_vec()));
        }
        while let Some(c) = self.ep.poll_completion() {
            self.outcome.completions += 1;
            if c.wc.status == metaroce_proto::WcStatus::Success {
                self.outcome.successes += 1;
            }
            assert_eq!(c.qp, self.qp, "completion for an unknown QP");
            assert_eq!(c.wc.qp_num, self.qp.qpn(), "completion with a wrong qp_num");
            let (posted, done) = match c.queue {
                WorkQueue::Send => (&self.posted_send, &mut self.done_send),
                WorkQueue::Recv => (&self.posted_recv, &mut self.done_recv),
            };
            assert!(
                posted.contains(&c.wc.wr_id),
                "completion for a wr_id never posted on that queue: {c:?}"
            );
            assert!(
                done.insert(c.wc.wr_id),
                "work request completed twice: {c:?}"
            );
        }
        assert!(
            self.ep.memory(self.canary.handle) == Some(&self.canary_bytes[..]),
            "canary region changed"
        );
    }

    /// Let every timer run out with a silent peer, then check that no work
    /// request is left hanging.
    pub fn finish(&mut self) -> Outcome {
        for _ in 0..256 {
            let Some(t) = self.ep.poll_timeout() else {
                break;
            };
            self.now = self.now.max(t);
            self.ep.handle_timeout(self.now);
            self.drain();
        }
        if self.ep.poll_timeout().is_none() {
            let missing: Vec<_> = self.posted_send.difference(&self.done_send).collect();
            assert!(
                missing.is_empty(),
                "idle endpoint, send work requests never completed: {missing:?}"
            );
            if self.ep.qp_state(self.qp) == Some(QpRunState::Error) {
                let missing: Vec<_> = self.posted_recv.difference(&self.done_recv).collect();
                assert!(
                    missing.is_empty(),
                    "QP in error, receives never flushed: {missing:?}"
                );
            }
        }
        self.outcome.qp_error = self.ep.qp_state(self.qp) == Some(QpRunState::Error);
        self.outcome
    }
}

/// The fuzz target body: decode `data`, run every step, then the end checks.
pub fn run(data: &[u8]) -> Outcome {
    let mut h = Harness::new();
    for step in decode(data) {
        h.step(&step);
    }
    h.finish()
}
