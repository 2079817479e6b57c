//! The suite's side of the conversation: a minimal MetaRoCE requester
//! written from the spec, with every knob a check needs exposed.
//!
//! It sends crafted data packets on paths it allocates, receives the
//! target's ACKs and responses into an event log, and acknowledges the
//! target's response packets (per path, wire.md §5) so the target never has
//! to retransmit them. It keeps no congestion or loss state: each check
//! decides exactly which PSNs go out.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use metaroce_wire::{
    AUTH_TRAILER_LEN, AckRepr, AuthRepr, AuthTrailer, BaseRepr, DATA_HEADER_LEN, DataRepr, Flags,
    OpAck, OpHeader, Opcode, Packet, RepairId, SACK_BITS, SackBits, emit_ack, emit_data, parse,
    parse_authenticated, seal, seq,
};
use reed_solomon_erasure::galois_8::ReedSolomon;

use crate::expect;
use crate::keys::{DirectionKey, derive_key};
use crate::link::Link;
use crate::target::{Config, QpRole, TargetInfo};

/// Payload bytes per data packet: small enough for any MTU.
pub(crate) const SEGMENT_BYTES: usize = 256;

/// One of the suite's paths: a (slot, generation) and its next PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Path {
    pub(crate) slot: u8,
    pub(crate) generation: u16,
    pub(crate) next_psn: u32,
}

/// What the target sent, decoded (and, with authentication, verified).
#[derive(Debug, Clone, PartialEq, Eq)]
// ACKs hold their op-acks inline (as the wire crate's repr does); the log
// is short-lived and small, boxing would buy nothing.
#[expect(clippy::large_enum_variant)]
pub(crate) enum Event {
    /// An ACK (for one of the suite's paths).
    Ack(AckRepr),
    /// A data packet (a READ or atomic response), payload in the clear.
    Data { repr: DataRepr, payload: Vec<u8> },
}

/// One data packet to craft; the path, PSN and floor come separately.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub(crate) dst_qpn: u32,
    pub(crate) msg_seq: u32,
    pub(crate) op: OpHeader,
    pub(crate) msg_len: u32,
    pub(crate) offset: u32,
    pub(crate) payload: Vec<u8>,
    pub(crate) flags: Flags,
}

/// The suite's receive state for one of the target's paths.
#[derive(Debug)]
struct RxWindow {
    slot: u8,
    generation: u16,
    ack_psn: u32,
    /// PSNs received at or after `ack_psn`.
    ahead: BTreeSet<u32>,
    rx_packets: u32,
    last_ts: u32,
}

impl RxWindow {
    fn record(&mut self, psn: u32, floor: u32) {
        if seq::seq_gt(floor, self.ack_psn) {
            self.ack_psn = floor;
            let ack_psn = self.ack_psn;
            self.ahead.retain(|&p| seq::seq_ge(p, ack_psn));
        }
        if seq::seq_lt(psn, self.ack_psn) || !self.ahead.insert(psn) {
            return;
        }
        self.rx_packets = self.rx_packets.wrapping_add(1);
        while self.ahead.remove(&self.ack_psn) {
            self.ack_psn = self.ack_psn.wrapping_add(1);
        }
    }

    fn sack(&self) -> SackBits {
        let mut bits = SackBits::new();
        for &p in &self.ahead {
            let i = p.wrapping_sub(self.ack_psn).wrapping_sub(1) as usize;
            if i < SACK_BITS {
                bits.set(i);
            }
        }
        bits
    }
}

/// The requester the checks drive.
pub(crate) struct Peer<L: Link> {
    link: L,
    pub(crate) target: TargetInfo,
    pub(crate) config: Config,
    tx_key: Option<DirectionKey>,
    rx_key: Option<DirectionKey>,
    tx_packet_number: u64,
    next_msg_seq: Vec<u32>,
    next_slot: u16,
    /// The path of set-up traffic: fills, READ-backs.
    pub(crate) control: Path,
    start: Instant,
    /// Everything the target sent, in arrival order.
    pub(crate) events: Vec<Event>,
    rx_paths: Vec<RxWindow>,
    rx_packet_numbers: HashSet<u64>,
    /// Authentication failures of the target's own datagrams.
    pub(crate) auth_problems: Vec<String>,
    /// The target's datagrams that did not parse.
    pub(crate) rx_malformed: Vec<String>,
    /// The datagram of the last control-path WRITE, to resend as a filler.
    filler: Option<Segment>,
    rx_buf: Vec<u8>,
}

impl<L: Link> Peer<L> {
    pub(crate) fn new(link: L, target: TargetInfo, config: Config) -> Self {
        let (tx_key, rx_key) = match &config.auth {
            Some(auth) => {
                let tx = derive_key(
                    &auth.job_secret,
                    config.local,
                    config.session_id,
                    target.addr,
                    target.session_id,
                );
                let rx = derive_key(
                    &auth.job_secret,
                    target.addr,
                    target.session_id,
                    config.local,
                    config.session_id,
                );
                (
                    Some(DirectionKey::new(&tx, auth.encrypt)),
                    Some(DirectionKey::new(&rx, auth.encrypt)),
                )
            }
            None => (None, None),
        };
        let next_msg_seq = vec![target.first_msg_seq; target.qpns.len()];
        let control = Path {
            slot: 0,
            generation: 1,
            next_psn: target.initial_psn.of(0, 1),
        };
        Self {
            link,
            target,
            config,
            tx_key,
            rx_key,
            tx_packet_number: 0,
            next_msg_seq,
            next_slot: 1,
            control,
            start: Instant::now(),
            events: Vec::new(),
            rx_paths: Vec::new(),
            rx_packet_numbers: HashSet::new(),
            auth_problems: Vec::new(),
            rx_malformed: Vec::new(),
            filler: None,
            rx_buf: Vec::new(),
        }
    }

    pub(crate) fn authenticated(&self) -> bool {
        self.tx_key.is_some()
    }

    // ------------------------------------------------------------ naming

    /// The target's QPN of `role`.
    pub(crate) fn qpn(&self, role: QpRole) -> u32 {
        self.target.qpns[role as usize]
    }

    /// The suite's QPN paired with `role`.
    pub(crate) fn local_qpn(&self, role: QpRole) -> u32 {
        self.config.local_qpns[role as usize]
    }

    /// The msg_seq the next request on `role` will carry.
    pub(crate) fn peek_msg_seq(&self, role: QpRole) -> u32 {
        self.next_msg_seq[role as usize]
    }

    /// Take the next msg_seq of `role`.
    pub(crate) fn take_msg_seq(&mut self, role: QpRole) -> u32 {
        let m = self.next_msg_seq[role as usize];
        self.next_msg_seq[role as usize] = m.wrapping_add(1);
        m
    }

    /// Generation `generation` of `path`'s slot, starting at its initial PSN.
    pub(crate) fn generation_of(&self, path: &Path, generation: u16) -> Path {
        Path {
            slot: path.slot,
            generation,
            next_psn: self.target.initial_psn.of(path.slot, generation),
        }
    }

    /// A path the target has not seen (slot 1, 2, ... with generation 1).
    pub(crate) fn fresh_path(&mut self) -> Result<Path, String> {
        let slot = u8::try_from(self.next_slot)
            .map_err(|_| "the suite ran out of path slots".to_string())?;
        self.next_slot += 1;
        Ok(Path {
            slot,
            generation: 1,
            next_psn: self.target.initial_psn.of(slot, 1),
        })
    }

    /// The target address of byte `offset` of its region.
    pub(crate) fn addr(&self, offset: u64) -> u64 {
        self.target.region_addr + offset
    }

    fn timestamp_ns(&self) -> u32 {
        // Truncated to 32 bits on the wire (wire.md §4.1).
        self.start.elapsed().as_nanos() as u32
    }

    // ------------------------------------------------------------ sending

    /// The datagram of `segment` at `psn` on `path`, sealed (ICRC, or tag
    /// under the next packet number). Does not send it.
    pub(crate) fn craft(
        &mut self,
        path: &Path,
        psn: u32,
        floor_delta: u16,
        segment: &Segment,
    ) -> Vec<u8> {
        let ts = self.timestamp_ns();
        self.craft_tweaked(path, psn, floor_delta, segment, ts, |_| {})
    }

    pub(crate) fn craft_at(
        &mut self,
        path: &Path,
        psn: u32,
        floor_delta: u16,
        segment: &Segment,
        timestamp_ns: u32,
    ) -> Vec<u8> {
        self.craft_tweaked(path, psn, floor_delta, segment, timestamp_ns, |_| {})
    }

    /// Like [`craft_at`](Self::craft_at), with `tweak` applied to the
    /// emitted bytes (headers and clear payload) before they are sealed:
    /// for header values no repr can hold.
    pub(crate) fn craft_tweaked(
        &mut self,
        path: &Path,
        psn: u32,
        floor_delta: u16,
        segment: &Segment,
        timestamp_ns: u32,
        tweak: impl FnOnce(&mut [u8]),
    ) -> Vec<u8> {
        let mut flags = segment.flags;
        if self.authenticated() {
            flags.insert(Flags::AUTHENTICATED);
        }
        let repr = DataRepr {
            base: BaseRepr {
                flags,
                path_slot: path.slot,
                path_gen: path.generation,
                src_device_port: self.config.local.port(),
            },
            psn,
            timestamp_ns,
            dst_qpn: segment.dst_qpn,
            msg_seq: segment.msg_seq,
            solicited: false,
            psn_floor_delta: floor_delta,
            floor_acked: false,
            msg_len: segment.msg_len,
            offset: segment.offset,
            op: segment.op,
            payload_len: segment.payload.len() as u32,
        };
        let mut bytes = vec![0u8; repr.buffer_len()];
        emit_data(&repr, &segment.payload, &mut bytes);
        tweak(&mut bytes);
        self.seal_datagram(&mut bytes, repr.header_len());
        bytes
    }

    /// The datagram of `segment` with its payload in the clear and its
    /// trailer not yet computed, and where its headers end: for faults
    /// that [`seal_datagram`](Self::seal_datagram) then protects.
    pub(crate) fn craft_clear(
        &mut self,
        path: &Path,
        psn: u32,
        floor_delta: u16,
        segment: &Segment,
    ) -> (Vec<u8>, usize) {
        let header_len = DATA_HEADER_LEN + segment.op.len();
        let mut clear = Vec::new();
        let ts = self.timestamp_ns();
        self.craft_tweaked(path, psn, floor_delta, segment, ts, |b| clear = b.to_vec());
        // craft_tweaked consumed a packet number for a datagram never sent;
        // harmless (numbers must not repeat, gaps are fine).
        (clear, header_len)
    }

    /// Protect a datagram whose headers end at `header_len` and whose
    /// payload is in the clear: the ICRC, or the tag (encrypting the
    /// payload if so configured). A datagram too short for its trailer is
    /// left as it is.
    pub(crate) fn seal_datagram(&mut self, bytes: &mut [u8], header_len: usize) {
        if self.authenticated() {
            if bytes.len() >= header_len + AUTH_TRAILER_LEN {
                self.authenticate(bytes, header_len);
            }
        } else if bytes.len() >= 4 {
            seal(bytes);
        }
    }

    /// Fill in the authentication trailer of `bytes` (its headers end at
    /// `header_len`) under the next packet number.
    pub(crate) fn authenticate(&mut self, bytes: &mut [u8], header_len: usize) {
        let key = self.tx_key.as_ref().expect("authenticate needs a key");
        let packet_number = self.tx_packet_number;
        self.tx_packet_number += 1;
        let covered_end = bytes.len() - AUTH_TRAILER_LEN;
        let (headers, rest) = bytes.split_at_mut(header_len);
        let tag = key.seal(
            packet_number,
            headers,
            &mut rest[..covered_end - header_len],
        );
        AuthRepr { packet_number, tag }.emit(&mut AuthTrailer::new_unchecked(&mut bytes[..]));
    }

    pub(crate) fn send(&mut self, datagram: &[u8]) -> Result<(), String> {
        self.link
            .send(datagram)
            .map_err(|e| format!("sending to the target failed: {e}"))
    }

    /// Craft and send one segment.
    pub(crate) fn send_segment(
        &mut self,
        path: &Path,
        psn: u32,
        floor_delta: u16,
        segment: &Segment,
    ) -> Result<Vec<u8>, String> {
        let bytes = self.craft(path, psn, floor_delta, segment);
        self.send(&bytes)?;
        Ok(bytes)
    }

    /// A WRITE of `data` at region offset `offset` as segments of at most
    /// [`SEGMENT_BYTES`], msg_seq `msg_seq` on `role`.
    pub(crate) fn write_segments(
        &self,
        role: QpRole,
        msg_seq: u32,
        offset: u64,
        data: &[u8],
    ) -> Vec<Segment> {
        let op = OpHeader::Write {
            rkey: self.target.rkey,
            remote_addr: self.addr(offset),
        };
        let mut segments: Vec<Segment> = data
            .chunks(SEGMENT_BYTES)
            .enumerate()
            .map(|(i, chunk)| Segment {
                dst_qpn: self.qpn(role),
                msg_seq,
                op,
                msg_len: data.len() as u32,
                offset: (i * SEGMENT_BYTES) as u32,
                payload: chunk.to_vec(),
                flags: Flags::empty(),
            })
            .collect();
        if let Some(last) = segments.last_mut() {
            last.flags = Flags::ACK_REQUEST;
        }
        segments
    }

    /// Send `segments` in order on the control path, floors kept at the
    /// current PSN (the control path never loses a packet on purpose).
    fn send_on_control(&mut self, segments: &[Segment]) -> Result<(), String> {
        for segment in segments {
            let mut path = self.control;
            let psn = path.next_psn;
            path.next_psn = psn.wrapping_add(1);
            self.control = path;
            self.send_segment(&path, psn, 0, segment)?;
        }
        Ok(())
    }

    /// WRITE `data` at region offset `offset` on `role` over the control
    /// path and wait until the target reports it executed.
    pub(crate) fn write(&mut self, role: QpRole, offset: u64, data: &[u8]) -> Result<u32, String> {
        let msg_seq = self.take_msg_seq(role);
        let segments = self.write_segments(role, msg_seq, offset, data);
        let mark = self.mark();
        self.send_on_control(&segments)?;
        self.wait_executed(mark, role, msg_seq)?;
        if role == QpRole::Main && segments.len() == 1 {
            self.filler = Some(segments[0].clone());
        }
        Ok(msg_seq)
    }

    /// Send the filler on `path`: the last single-packet WRITE executed on
    /// the main QP, again (a resend of an executed message, which the
    /// target counts at the path level and does not execute again).
    pub(crate) fn send_filler(
        &mut self,
        path: &Path,
        psn: u32,
        floor_delta: u16,
        flags: Flags,
    ) -> Result<Vec<u8>, String> {
        let mut segment = self
            .filler
            .clone()
            .ok_or("no filler WRITE was executed yet")?;
        segment.flags = flags;
        self.send_segment(path, psn, floor_delta, &segment)
    }

    /// Send an ACK for one of the target's paths.
    fn send_ack(&mut self, index: usize) {
        let w = &self.rx_paths[index];
        let mut flags = Flags::empty();
        if self.authenticated() {
            flags.insert(Flags::AUTHENTICATED);
        }
        let mut ack = AckRepr::new(BaseRepr {
            flags,
            path_slot: w.slot,
            path_gen: w.generation,
            src_device_port: self.config.local.port(),
        });
        ack.ack_psn = w.ack_psn;
        ack.ts_echo = w.last_ts;
        ack.rx_packets = w.rx_packets;
        ack.sack = w.sack();
        let mut bytes = vec![0u8; ack.buffer_len()];
        emit_ack(&ack, &mut bytes);
        if self.authenticated() {
            let covered = ack.covered_len();
            self.authenticate(&mut bytes, covered);
        }
        // An ACK that fails to go out is repeated by the next one.
        let _ = self.link.send(&bytes);
    }

    // ------------------------------------------------------------ receiving

    /// Position in the event log; waits look only at events after a mark.
    pub(crate) fn mark(&self) -> usize {
        self.events.len()
    }

    /// Receive for at most until `deadline`; returns whether a datagram came.
    fn poll(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let mut buf = std::mem::take(&mut self.rx_buf);
        buf.resize(65536, 0);
        let got = match self.link.recv(&mut buf, deadline - now) {
            Ok(Some(n)) => {
                self.on_datagram(&buf[..n]);
                true
            }
            Ok(None) => false,
            Err(e) => {
                self.rx_malformed.push(format!("receive error: {e}"));
                // Do not spin on a broken socket.
                std::thread::sleep(Duration::from_millis(1));
                false
            }
        };
        self.rx_buf = buf;
        got
    }

    /// Process `bytes` as if the target had sent them.
    #[cfg(test)]
    pub(crate) fn inject(&mut self, bytes: &[u8]) {
        self.on_datagram(bytes);
    }

    /// A datagram from the target: its packets one by one (an ACK may come
    /// in front of another packet, wire.md 5.3).
    fn on_datagram(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = metaroce_wire::first_packet_len(rest);
            self.on_packet(&rest[..n]);
            rest = &rest[n..];
        }
    }

    fn on_packet(&mut self, bytes: &[u8]) {
        let (packet, payload) = if let Some(key) = &self.rx_key {
            let Ok((packet, auth)) = parse_authenticated(bytes) else {
                self.auth_problems.push(format!(
                    "a {}-byte datagram without a well-formed authentication trailer",
                    bytes.len()
                ));
                return;
            };
            let header_len = match &packet {
                Packet::Data { repr, .. } => repr.header_len(),
                Packet::Ack(ack) => ack.covered_len(),
            };
            let covered_end = bytes.len() - AUTH_TRAILER_LEN;
            let Some(clear) = key.open(
                auth.packet_number,
                &bytes[..header_len],
                &bytes[header_len..covered_end],
                &auth.tag,
            ) else {
                self.auth_problems.push(format!(
                    "packet number {}: the tag does not verify under the target-to-suite key",
                    auth.packet_number
                ));
                return;
            };
            if !self.rx_packet_numbers.insert(auth.packet_number) {
                self.auth_problems
                    .push(format!("packet number {} used twice", auth.packet_number));
            }
            (packet, clear)
        } else {
            match parse(bytes) {
                Ok(Packet::Data { repr, payload }) => {
                    let payload = payload.to_vec();
                    (Packet::Data { repr, payload: &[] }, payload)
                }
                Ok(packet) => (packet, Vec::new()),
                Err(e) => {
                    self.rx_malformed
                        .push(format!("a {}-byte datagram: {e}", bytes.len()));
                    return;
                }
            }
        };
        match packet {
            Packet::Ack(ack) => self.events.push(Event::Ack(ack)),
            Packet::Data { repr, .. } => {
                self.acknowledge(&repr);
                self.events.push(Event::Data { repr, payload });
            }
        }
    }

    fn acknowledge(&mut self, repr: &DataRepr) {
        let (slot, generation) = (repr.base.path_slot, repr.base.path_gen);
        let index = match self
            .rx_paths
            .iter()
            .position(|w| w.slot == slot && w.generation == generation)
        {
            Some(i) => i,
            None => {
                self.rx_paths.push(RxWindow {
                    slot,
                    generation,
                    ack_psn: self.target.initial_psn.of(slot, generation),
                    ahead: BTreeSet::new(),
                    rx_packets: 0,
                    last_ts: 0,
                });
                self.rx_paths.len() - 1
            }
        };
        let w = &mut self.rx_paths[index];
        w.record(repr.psn, repr.psn_floor());
        w.last_ts = repr.timestamp_ns;
        self.send_ack(index);
    }

    /// Wait until `f` picks something from the events after `from`, for at
    /// most `timeout`.
    pub(crate) fn wait_for<T>(
        &mut self,
        from: usize,
        timeout: Duration,
        mut f: impl FnMut(&Event) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut scanned = from;
        loop {
            while scanned < self.events.len() {
                if let Some(t) = f(&self.events[scanned]) {
                    return Some(t);
                }
                scanned += 1;
            }
            if Instant::now() >= deadline {
                return None;
            }
            self.poll(deadline);
        }
    }

    /// Receive for `period`, keeping the events.
    pub(crate) fn drain(&mut self, period: Duration) {
        let deadline = Instant::now() + period;
        while Instant::now() < deadline {
            self.poll(deadline);
        }
    }

    /// The ACKs for `path` after `from`.
    pub(crate) fn acks_for(&self, from: usize, path: &Path) -> Vec<AckRepr> {
        self.events[from..]
            .iter()
            .filter_map(|e| match e {
                Event::Ack(a)
                    if a.base.path_slot == path.slot && a.base.path_gen == path.generation =>
                {
                    Some(a.clone())
                }
                _ => None,
            })
            .collect()
    }

    /// Wait for an ACK of `path` with exactly this state; on timeout, say
    /// what the last ACK of the path said.
    pub(crate) fn wait_ack_state(
        &mut self,
        from: usize,
        path: &Path,
        ack_psn: u32,
        sack_bits: &[usize],
    ) -> Result<AckRepr, String> {
        let (slot, generation) = (path.slot, path.generation);
        let timeout = self.config.answer_timeout;
        let found = self.wait_for(from, timeout, |e| match e {
            Event::Ack(a)
                if a.base.path_slot == slot
                    && a.base.path_gen == generation
                    && expect::ack_state(a, ack_psn, sack_bits).is_ok() =>
            {
                Some(a.clone())
            }
            _ => None,
        });
        found.ok_or_else(|| match self.acks_for(from, path).last() {
            Some(last) => format!(
                "the last ACK for path {slot}/{generation} {}",
                expect::ack_state(last, ack_psn, sack_bits).unwrap_err()
            ),
            None => format!("no ACK for path {slot}/{generation} within {timeout:?}"),
        })
    }

    /// The first op-ack for the suite's QP of `role` after `from` that
    /// `f` accepts.
    pub(crate) fn wait_op_ack(
        &mut self,
        from: usize,
        role: QpRole,
        timeout: Duration,
        mut f: impl FnMut(&OpAck) -> bool,
    ) -> Option<OpAck> {
        let qpn = self.local_qpn(role);
        self.wait_for(from, timeout, |e| match e {
            Event::Ack(a) => a.op_acks().iter().find(|o| o.qpn == qpn && f(o)).copied(),
            _ => None,
        })
    }

    /// Wait until the target reports `msg_seq` of `role` executed; a NAK
    /// naming it, or silence, is an error.
    pub(crate) fn wait_executed(
        &mut self,
        from: usize,
        role: QpRole,
        msg_seq: u32,
    ) -> Result<(), String> {
        let timeout = self.config.answer_timeout;
        let seen = self.wait_op_ack(from, role, timeout, |o| {
            expect::executed(o, msg_seq) || (o.syndrome.is_nak() && o.nak_msg_seq == msg_seq)
        });
        match seen {
            Some(o) if o.syndrome.is_nak() => Err(format!(
                "the target answered msg_seq {msg_seq} with {} (msn {})",
                o.syndrome.name(),
                o.msn
            )),
            Some(_) => Ok(()),
            None => Err(format!(
                "no op-ack reported msg_seq {msg_seq} on QP {} executed within {timeout:?}",
                self.qpn(role)
            )),
        }
    }

    /// READ `len` bytes at region offset `offset` on `role` (over the
    /// control path). Returns the bytes and any problem with the response
    /// packets' fields (`op.read-response`).
    pub(crate) fn read(
        &mut self,
        role: QpRole,
        offset: u64,
        len: u32,
    ) -> Result<(Vec<u8>, Vec<String>), String> {
        let msg_seq = self.take_msg_seq(role);
        let request = Segment {
            dst_qpn: self.qpn(role),
            msg_seq,
            op: OpHeader::ReadRequest {
                rkey: self.target.rkey,
                remote_addr: self.addr(offset),
            },
            msg_len: len,
            offset: 0,
            payload: Vec::new(),
            flags: Flags::ACK_REQUEST,
        };
        let mark = self.mark();
        self.send_on_control(std::slice::from_ref(&request))?;
        let local_qpn = self.local_qpn(role);
        let mut assembly = expect::ReadAssembly::new(local_qpn, msg_seq, len);
        let timeout = self.config.answer_timeout;
        let done = self.wait_for(mark, timeout, |e| match e {
            Event::Data { repr, payload } => {
                assembly.add(repr, payload);
                assembly.complete().then_some(Ok(()))
            }
            Event::Ack(a) => a
                .op_acks()
                .iter()
                .find(|o| o.qpn == local_qpn && o.syndrome.is_nak() && o.nak_msg_seq == msg_seq)
                .map(|o| Err(format!("the READ was answered with {}", o.syndrome.name()))),
        });
        match done {
            Some(Ok(())) => Ok(assembly.finish()),
            Some(Err(e)) => Err(e),
            None => Err(format!(
                "READ of {len} bytes at offset {offset}: {} of them arrived within {timeout:?}",
                assembly.received()
            )),
        }
    }

    /// READ on the main QP, only the bytes.
    pub(crate) fn read_back(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        self.read(QpRole::Main, offset, len).map(|(bytes, _)| bytes)
    }

    /// The data events after `from` that answer `msg_seq` on the suite's QP of `role`.
    pub(crate) fn responses_to(&self, from: usize, role: QpRole, msg_seq: u32) -> Vec<DataRepr> {
        let qpn = self.local_qpn(role);
        self.events[from..]
            .iter()
            .filter_map(|e| match e {
                Event::Data { repr, .. } if repr.dst_qpn == qpn && repr.msg_seq == msg_seq => {
                    Some(*repr)
                }
                _ => None,
            })
            .collect()
    }

    /// An atomic on the main QP over the control path; returns the
    /// ATOMIC_RESPONSE (or an error) and the request's segment for resending.
    pub(crate) fn atomic(&mut self, op: OpHeader) -> Result<(DataRepr, Segment), String> {
        let msg_seq = self.take_msg_seq(QpRole::Main);
        let segment = Segment {
            dst_qpn: self.qpn(QpRole::Main),
            msg_seq,
            op,
            msg_len: 8,
            offset: 0,
            payload: Vec::new(),
            flags: Flags::ACK_REQUEST,
        };
        let mark = self.mark();
        self.send_on_control(std::slice::from_ref(&segment))?;
        let local_qpn = self.local_qpn(QpRole::Main);
        let timeout = self.config.answer_timeout;
        let answer = self.wait_for(mark, timeout, |e| match e {
            Event::Data { repr, .. } if repr.dst_qpn == local_qpn && repr.msg_seq == msg_seq => {
                Some(Ok(*repr))
            }
            Event::Ack(a) => a
                .op_acks()
                .iter()
                .find(|o| o.qpn == local_qpn && o.syndrome.is_nak() && o.nak_msg_seq == msg_seq)
                .map(|o| {
                    Err(format!(
                        "the atomic was answered with {}",
                        o.syndrome.name()
                    ))
                }),
            _ => None,
        });
        match answer {
            Some(Ok(repr)) if repr.opcode() == Opcode::AtomicResponse => Ok((repr, segment)),
            Some(Ok(repr)) => Err(format!("the atomic was answered with {}", repr.opcode())),
            Some(Err(e)) => Err(e),
            None => Err(format!("no ATOMIC_RESPONSE within {timeout:?}")),
        }
    }
}

/// The first `count` repair packets of the message cut into `segments`
/// (wire.md §4.4): recovery shard `i` of `count` of the spec's code
/// (systematic Reed-Solomon over GF(2^8), as `reed-solomon-erasure` 6
/// builds it) over the message's payload cut into shards of the first
/// segment's payload size (a one-packet message's length rounded up to
/// even), the last shard zero-padded. Every other field is the message's
/// own; `offset` names the shard. Each asks for an ACK: repair packets
/// trail their message's burst.
pub(crate) fn repair_segments(segments: &[Segment], count: u16) -> Result<Vec<Segment>, String> {
    let first = segments
        .first()
        .ok_or("a message has at least one packet")?;
    let shard = first.payload.len().next_multiple_of(2);
    // The message as the receiver will hold it, wherever its segments go.
    let mut message = vec![0u8; first.msg_len as usize];
    for s in segments {
        message[s.offset as usize..][..s.payload.len()].copy_from_slice(&s.payload);
    }
    let originals: Vec<Vec<u8>> = message
        .chunks(shard)
        .map(|chunk| {
            let mut padded = chunk.to_vec();
            padded.resize(shard, 0);
            padded
        })
        .collect();
    let mut recovery = vec![vec![0u8; shard]; usize::from(count)];
    ReedSolomon::new(originals.len(), usize::from(count))
        .and_then(|code| code.encode_sep(&originals, &mut recovery))
        .map_err(|e| {
            format!(
                "computing {count} repair shards over {} data shards: {e}",
                originals.len()
            )
        })?;
    Ok(recovery
        .into_iter()
        .enumerate()
        .map(|(index, payload)| Segment {
            offset: RepairId {
                index: index as u16,
                count,
            }
            .to_offset(),
            payload,
            flags: Flags::REPAIR | Flags::ACK_REQUEST,
            ..first.clone()
        })
        .collect())
}
