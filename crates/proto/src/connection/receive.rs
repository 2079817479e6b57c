//! The receive side of a connection: data packets into the receiving view
//! of the peer's paths (SACK window, ECN and timestamp for the ACK) and on
//! to the responder or requester; ACKs into the sending paths' in-flight
//! lists, RTT estimates and the congestion controller.

use super::timers::Verdict;
use super::{
    AckCopy, Connection, PACKET_OVERHEAD_BYTES, RxPath, give_up, requester, responder, transmit,
};

/// Losses in a row (no packet acknowledged between) that prove a route dead
/// while the connection's other routes deliver: at 1 % random loss four in
/// a row happen once in 10^8 packets, after a link failure at once.
const FAILED_PATH_LOSSES: u32 = 4;
/// How long the smallest one-way delay seen stands before a new one is
/// taken: two hosts' clocks drift apart by microseconds a second.
const RX_DELAY_MIN_RENEW_NS: u64 = 1_000_000_000;
use crate::cc::AckSample;
use crate::device_state::DeviceState;
use crate::ecn::Ecn;
use crate::maybe_ns::MaybeNs;
use crate::message::{MsgKind, SegRef};
use crate::path::{ProbeHold, SentState};
use crate::reorder::GapVerdict;
use crate::sack::{RxOutcome, gave_up_arrived, sack_contains, sack_highest};
use crate::trace::trace_event;
use metaroce_wire::{AckRepr, DataRepr, Flags, OpHeader, SACK_BITS, seq};
use rand_core::Rng;

impl Connection {
    /// The receive state of the peer's path that a data packet names:
    /// created on first use, renewed for a newer generation. `None`
    /// (counted) for a slot over the limit or a stale generation.
    fn rx_path_of(&mut self, now_ns: u64, dev: &mut DeviceState, repr: &DataRepr) -> Option<usize> {
        let slot = repr.base.path_slot;
        let generation = repr.base.path_gen;
        if slot as usize >= dev.config.max_peer_paths {
            // Receive state is per slot: a peer may not make us keep more.
            dev.stats.rx_over_limit += 1;
            return None;
        }
        if self.rx_paths.len() <= slot as usize {
            self.rx_paths.resize_with(slot as usize + 1, || None);
        }
        let psn_base = dev.config.psn_base;
        let rx = self.rx_paths[slot as usize]
            .get_or_insert_with(|| RxPath::new(psn_base, slot, generation));
        if rx.generation != generation {
            if (generation.wrapping_sub(rx.generation) as i16) < 0 {
                dev.stats.rx_stale_path += 1;
                return None;
            }
            // The peer renewed the path: its route or our ACKs' way back
            // proved dead (it cannot tell which). The new generation moves
            // the ACKs (to a port other paths' ACKs are heard from, see
            // `pick_ack_port`); keep them off the old port a while.
            let old_ack_port = rx.ack_port;
            *rx = RxPath::new(psn_base, slot, generation);
            self.note_bad_ack_port(old_ack_port, now_ns, dev);
        }
        Some(slot as usize)
    }

    /// A data packet that a trimming switch cut to its header on the way:
    /// its payload is gone, but the header says which packet it was. The
    /// next ACK of its path, sent at once, names it (`trim_count`), so the
    /// sender resends it now rather than a round of loss detection later;
    /// for the last packet on a path (a cold start, a small window spread
    /// over many paths) that round is a probe timeout. Nothing is placed,
    /// and the packet does not count as received. The sender still counts
    /// toward the receiver's admission: it has data for us.
    pub(crate) fn on_trimmed(&mut self, now_ns: u64, dev: &mut DeviceState, repr: &DataRepr) {
        let Some(slot) = self.rx_path_of(now_ns, dev, repr) else {
            return;
        };
        let rx = self.rx_paths[slot].as_mut().expect("created above");
        rx.window.advance_to(repr.psn_floor());
        let offset = seq::seq_diff(repr.psn, rx.window.ack_psn());
        if offset < 0 || offset as usize > SACK_BITS || rx.window.contains(repr.psn) {
            // Already here whole (a trimmed duplicate), or beyond what an
            // ACK can name: the sender's own loss detection covers it.
            dev.stats.rx_out_of_window += 1;
            return;
        }
        dev.stats.rx_trimmed += 1;
        rx.note_trimmed(repr.psn);
        rx.last_ts = repr.timestamp_ns;
        rx.last_rx_ns = now_ns;
        if !rx.ack_queued {
            rx.ack_queued = true;
            self.ack_now.push_back(slot as u8);
        }
        dev.admission.on_data(
            &mut self.admission,
            self.index,
            now_ns,
            repr.timestamp_ns,
            false,
            repr.base.flags.contains(Flags::SENDER_DRAINED),
        );
    }

    /// An ACK for the generation that path `p` retired: if it covers a
    /// packet the retirement gave up on, that packet had arrived and the
    /// route was alive; the silence that condemned it was a stall (of the
    /// peer, or of a queue on the way), not a failure. Remember how long it
    /// was: the stall allowance holds later verdicts on silence (probe
    /// timeouts, unanswered replacements) until a silence outlasts it.
    fn on_retired_path_ack(&mut self, now_ns: u64, dev: &mut DeviceState, p: usize, ack: &AckRepr) {
        let path = &mut self.paths[p];
        let Some((first_psn, oldest_sent_ns)) = path.retired else {
            return;
        };
        if ack.base.path_gen != path.generation.wrapping_sub(1) {
            return;
        }
        // The very packet whose silence condemned the path: later ones
        // arriving prove nothing (the first may have been lost at random).
        let covered = !seq::seq_lt(ack.ack_psn, first_psn)
            || sack_contains(ack.ack_psn, &ack.sack, first_psn);
        if covered {
            path.retired = None;
            self.stats.spurious_failovers += 1;
            dev.stats.spurious_failovers += 1;
            trace_event!(
                in: self.trace.enter_path(p),
                DEBUG,
                now_ns,
                late_ns = now_ns.saturating_sub(oldest_sent_ns),
                "retired path heard from: its failure was a stall"
            );
            self.note_stall(now_ns, oldest_sent_ns);
        }
    }

    /// A data packet from the peer.
    pub(crate) fn on_data(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        ecn: Ecn,
        repr: &DataRepr,
        payload: &[u8],
    ) {
        let Some(slot) = self.rx_path_of(now_ns, dev, repr) else {
            return;
        };
        let slot = slot as u8;
        let rx = self.rx_paths[slot as usize]
            .as_mut()
            .expect("created above");
        let floor = repr.psn_floor();
        rx.window.advance_to(floor);
        if rx.ack_port != 0 && repr.floor_acked && seq::seq_lt(rx.ack_port_floor, floor) {
            rx.ack_port_heard_ns = now_ns.max(1);
            rx.ack_port_floor = rx.window.highest_received().wrapping_add(1);
        }
        // Only a packet past the cumulative point can skip PSNs: the scan
        // for the highest one received is off the in-order path.
        let highest =
            seq::seq_lt(rx.window.ack_psn(), repr.psn).then(|| rx.window.highest_received());
        let outcome = rx.window.record(repr.psn);
        // The fabric's loss rate as this device sees it receiving: the PSNs
        // a path skipped are lost (or, rarely, overtaken), for sizing
        // repair packets (`repair.rs`).
        let skipped = match outcome {
            RxOutcome::AfterGap => highest
                .filter(|&h| seq::seq_lt(h, repr.psn))
                .map_or(0, |h| u64::from(repr.psn.wrapping_sub(h).wrapping_sub(1))),
            _ => 0,
        };
        dev.on_fates(now_ns, 1, skipped);
        if outcome == RxOutcome::OutOfWindow {
            dev.stats.rx_out_of_window += 1;
            return;
        }
        if outcome != RxOutcome::InOrder || repr.base.flags.contains(Flags::RETRANSMIT) {
            // A hole (packets lost on the way), a resend of what we had
            // (an ACK of ours lost on the way back), or a resend of what
            // we never had (its original was lost: a cold start's first
            // packet, a tail): the route is lossy.
            self.rx_loss_seen_ns = now_ns.max(1);
        }
        // How late this packet was read, against the fastest the peer's
        // packets have come (its clock's offset cancels out).
        let late_after_ns = dev
            .config
            .probe_timeout_min_ns
            .max(4 * dev.config.base_rtt_ns);
        let delay = (now_ns as u32).wrapping_sub(repr.timestamp_ns);
        if self.rx_delay_min_at_ns == 0
            || now_ns.saturating_sub(self.rx_delay_min_at_ns) >= RX_DELAY_MIN_RENEW_NS
            || (delay.wrapping_sub(self.rx_delay_min) as i32) < 0
        {
            self.rx_delay_min = delay;
            self.rx_delay_min_at_ns = now_ns.max(1);
        } else if dev.config.hosts_share_cpus()
            && u64::from(delay.wrapping_sub(self.rx_delay_min)) > late_after_ns
        {
            self.rx_late_ns = now_ns.max(1);
        }
        if matches!(outcome, RxOutcome::InOrder | RxOutcome::Duplicate)
            && (self.rx_late_ns == 0 || now_ns.saturating_sub(self.rx_late_ns) >= late_after_ns)
            && repr.base.flags.contains(Flags::ACK_REQUEST)
            && repr.base.flags.contains(Flags::RETRANSMIT)
            && rx.rx_packets > 0
            && now_ns.saturating_sub(rx.ack_route_moved_ns) >= dev.config.base_rtt_ns
            && rx.unacked == 0
            && !rx.ack_queued
            && now_ns.saturating_sub(rx.ack_sent_ns) >= dev.config.base_rtt_ns / 2
        {
            // A probe (a resend asking for an ACK) although nothing before
            // it on this path is missing: the sender has not heard our
            // ACKs for this path. Its reverse route
            // may be dead (a failed link the data does not cross): move
            // this path's ACKs to another route now, rather than wait for
            // the sender to give up on the path (two probe timeouts and
            // more, all the while acking into the failure). At most once
            // per base RTT; on a lossy route it costs nothing (another
            // route is as good). Only if our ACKs for the path are stale:
            // none owed, the last one sent half a base RTT ago or more. A
            // probe that finds an ACK owed or just sent was sent before our
            // ACK could reach its sender (we were stalled, the probe waited
            // in our socket with the data it asks about), and moving then
            // would trade a live route for a coin toss. Nor for a while
            // after we read packets far later than the peer's fastest: we
            // were stalled (or a queue held them), our ACKs went late, and
            // the sender's probes sent before they reached it (hundreds of
            // microseconds after a stall of milliseconds, past the check
            // above) say nothing of their route. On the namespace fabric
            // with a link dead, such probes moved a run of routes at once
            // onto coin tosses, and the paths whose ACKs fell into the dead
            // link were retired.
            rx.ack_route = rx.ack_route.wrapping_add(1);
            rx.ack_route_moved_ns = now_ns;
            rx.ack_port_heard_ns = 0;
            let dead = std::mem::take(&mut rx.ack_port);
            trace_event!(
                in: self.trace.enter(),
                DEBUG,
                now_ns,
                slot,
                dead_port = dead,
                "probe on a path with nothing missing: its ACKs move off their port"
            );
            self.note_bad_ack_port(dead, now_ns, dev);
        }
        let rx = self.rx_paths[slot as usize]
            .as_mut()
            .expect("created above");
        let mut marked = None;
        if outcome == RxOutcome::Duplicate {
            dev.stats.rx_duplicates += 1;
            self.stats.duplicates_received += 1;
            rx.duplicates += 1;
        } else {
            rx.rx_packets = rx.rx_packets.wrapping_add(1);
            rx.payload_bytes += u64::from(repr.payload_len);
            self.stats.data_packets_received += 1;
            self.stats.payload_bytes_received += u64::from(repr.payload_len);
            if ecn == Ecn::Ce {
                self.stats.ce_marked_received += 1;
                rx.ce_packets = rx.ce_packets.wrapping_add(1);
            }
            marked = Some(ecn == Ecn::Ce);
        }
        rx.last_ts = repr.timestamp_ns;
        // A packet that finds its path quiet for an ACK delay: waiting the
        // delay would most likely gather no other packet of the path (a
        // connection sprayed over 16 paths at half a 100 Gb/s link puts one
        // on each path every ~11 µs), only add the delay to the sender's
        // round trip and feed its tail-loss probes.
        let sparse = now_ns.saturating_sub(rx.last_rx_ns) >= dev.config.ack_delay_ns;
        rx.last_rx_ns = now_ns;
        rx.unacked += 1;
        // The answer to a resend (a probe, a packet given up on elsewhere)
        // or to a duplicate (our ACK was lost) is the one the sender's
        // recovery waits for: on a lossy route it goes twice. So is the
        // answer to a connection's first packet, which a cold sender's
        // whole window waits on, unless that packet was all its sender had
        // (`SENDER_DRAINED`): then nothing waits behind it, and in an
        // all-to-all of one-packet messages every ACK would go twice.
        if self.stats.data_packets_received == 1
            && outcome != RxOutcome::Duplicate
            && !repr.base.flags.contains(Flags::SENDER_DRAINED)
        {
            rx.copy_ack = AckCopy::Always;
        } else if (repr.base.flags.contains(Flags::RETRANSMIT) || outcome == RxOutcome::Duplicate)
            && rx.copy_ack == AckCopy::No
        {
            rx.copy_ack = AckCopy::IfLossy;
        }
        dev.admission.on_data(
            &mut self.admission,
            self.index,
            now_ns,
            repr.timestamp_ns,
            true,
            repr.base.flags.contains(Flags::SENDER_DRAINED),
        );
        if let Some(marked) = marked {
            dev.admission.note_ce(&self.admission, marked);
        }

        // Operation level: runs for duplicates too, so a probe makes the
        // responder repeat its op-ack; placement itself is idempotent.
        let op_event = match repr.op {
            OpHeader::ReadResponse | OpHeader::AtomicResponse { .. } => {
                requester::on_response(self, dev, now_ns, repr, payload)
            }
            _ => responder::on_request(self, dev, now_ns, repr, payload),
        };

        let rx = self.rx_paths[slot as usize]
            .as_mut()
            .expect("created above");
        // The packet completing a request nobody waits on (its sender
        // asked for no ACK, and not a resend) may have its ACK held for
        // data going back to the requester: `deferred_ack_ns`.
        let deferred = op_event
            && dev.config.deferred_ack_ns > 0
            && !repr.base.flags.contains(Flags::ACK_REQUEST)
            && !repr.base.flags.contains(Flags::RETRANSMIT);
        let immediate = outcome != RxOutcome::InOrder
            || repr.base.flags.contains(Flags::ACK_REQUEST)
            || (op_event && !deferred)
            || rx.unacked >= dev.config.ack_every_packets
            || (sparse && !deferred);
        if immediate {
            if !rx.ack_queued {
                rx.ack_queued = true;
                self.ack_now.push_back(slot);
            }
        } else {
            let wait_ns = if deferred {
                dev.config.deferred_ack_ns
            } else {
                dev.config.ack_delay_ns
            };
            let deadline = now_ns + wait_ns;
            if rx.ack_deadline.get().is_none_or(|d| deadline < d) {
                rx.ack_deadline = MaybeNs::some(deadline);
                if !self.ack_pending.contains(&slot) {
                    self.ack_pending.push(slot);
                }
                self.ack_deadline = Some(self.ack_deadline.map_or(deadline, |d| d.min(deadline)));
            }
        }
    }

    /// The receiver's admission raised this peer's grant (rule 5 in
    /// `admission.rs`): tell it now, in an ACK of the path it last sent on,
    /// not one packet gap later in the ACK of its next packet. An ACK
    /// repeats what the path's last one said, so the peer takes it as no
    /// news but the grant. False if the peer never sent us data.
    pub(crate) fn push_grant(&mut self) -> bool {
        let Some(slot) = self
            .rx_paths
            .iter()
            .enumerate()
            .filter_map(|(i, rx)| rx.as_ref().map(|rx| (i, rx.last_rx_ns)))
            .max_by_key(|&(_, t)| t)
            .map(|(i, _)| i)
        else {
            return false;
        };
        let rx = self.rx_paths[slot].as_mut().expect("found above");
        if !rx.ack_queued {
            rx.ack_queued = true;
            self.ack_now.push_back(slot as u8);
        }
        true
    }

    /// An ACK from the peer.
    pub(crate) fn on_ack(&mut self, now_ns: u64, dev: &mut DeviceState, ack: &AckRepr) {
        self.stats.acks_received += 1;
        self.decay_stall_allowance(now_ns);
        for op_ack in ack.op_acks() {
            requester::on_op_ack(self, dev, now_ns, op_ack);
        }
        let p = ack.base.path_slot as usize;
        if p < self.path_count && p >= self.paths.len() {
            // An ACK for a slot we never sent on: as the unused path, which
            // is what it meets (its generation 0, nothing in flight).
            self.create_paths_through(p, dev);
        }
        if p >= self.paths.len() || self.paths[p].generation != ack.base.path_gen {
            dev.stats.rx_stale_path += 1;
            if p < self.paths.len() {
                self.on_retired_path_ack(now_ns, dev, p, ack);
            }
            return;
        }
        let highest = sack_highest(ack.ack_psn, &ack.sack);
        let limit = highest.map_or(ack.ack_psn, |h| h.wrapping_add(1));
        self.check_gap_loss_undone(now_ns, dev, p, ack, limit);
        // On a fabric that reorders (crate::reorder), a gap is a loss only
        // once a packet sent the reordering window after it was delivered,
        // or once it is a round trip and that window old (RFC 8985's rule
        // within a path).
        let reorder_ns = dev.reorder.window_ns(now_ns, self.conn_rtt.srtt_ns());
        let gap_cutoff_ns = if reorder_ns == 0 {
            u64::MAX
        } else {
            // A path's packets are sent in PSN order, so the newest one
            // delivered is the highest PSN the ACK reports (when there is a
            // gap below it, it is in the list).
            let path = &self.paths[p];
            let highest_sent_ns = highest
                .and_then(|h| usize::try_from(seq::seq_diff(h, path.first_inflight_psn())).ok())
                .and_then(|i| path.inflight.get(i))
                .map_or(0, |x| x.sent_ns);
            highest_sent_ns
                .max(path.last_acked_sent_ns)
                .saturating_sub(reorder_ns)
                .max(now_ns.saturating_sub(path.rtt.srtt_ns() + reorder_ns))
        };
        let mut acked_bytes = 0u64;
        let mut acked_packets = 0u32;
        let mut lost_bytes = 0u64;
        let mut lost_packets = 0u64;
        let mut trimmed_bytes = 0u64;
        let mut trimmed_packets = 0u64;
        // Reused across ACKs: no allocation per packet.
        let mut newly_acked_segs = std::mem::take(&mut self.scratch_segs);
        let mut latest_acked_sent_ns = 0u64;
        {
            let path = &mut self.paths[p];
            let first_psn = path.first_inflight_psn();
            for (i, sent) in path.inflight.iter_mut().enumerate() {
                let psn = first_psn.wrapping_add(i as u32);
                if !seq::seq_lt(psn, limit) {
                    break;
                }
                if sent.state() != SentState::Outstanding {
                    continue;
                }
                if sack_contains(ack.ack_psn, &ack.sack, psn) {
                    sent.set_state(SentState::Acked);
                    acked_bytes += u64::from(sent.wire_bytes);
                    acked_packets += 1;
                    newly_acked_segs.push(sent.seg());
                    path.consecutive_losses = 0;
                    path.last_acked_sent_ns = path.last_acked_sent_ns.max(sent.sent_ns);
                    latest_acked_sent_ns = latest_acked_sent_ns.max(sent.sent_ns);
                } else if sent.sent_ns <= gap_cutoff_ns {
                    path.consecutive_losses += 1;
                    // Below the highest PSN received on an in-order route:
                    // this one is lost. Resend it at once on another path.
                    lost_bytes += give_up(sent, p, &mut path.stats, &mut self.retransmit_queue);
                    lost_packets += 1;
                    self.gap_lost = Some(GapVerdict {
                        psn,
                        generation: path.generation,
                        slot: p as u8,
                        // Fewer than the 256-PSN window (`psn_span`).
                        sent_after: u8::try_from(path.next_psn.wrapping_sub(psn) - 1)
                            .unwrap_or(u8::MAX),
                    });
                }
            }
            // A trim NACK: these packets reached the receiver as headers
            // only. Resend them now (the SACK above already took any of
            // the run that arrived whole).
            if let Some((first, count)) = ack.trimmed() {
                for k in 0..u32::from(count) {
                    let psn = first.wrapping_add(k);
                    let Ok(i) = usize::try_from(seq::seq_diff(psn, first_psn)) else {
                        continue;
                    };
                    let Some(sent) = path.inflight.get_mut(i) else {
                        break;
                    };
                    if sent.state() == SentState::Outstanding {
                        trimmed_bytes +=
                            give_up(sent, p, &mut path.stats, &mut self.retransmit_queue);
                        trimmed_packets += 1;
                    }
                }
            }
            path.inflight_bytes -= acked_bytes + lost_bytes + trimmed_bytes;
            if seq::seq_lt(path.ack_reported_end, limit) && !seq::seq_lt(path.next_psn, limit) {
                path.ack_reported_end = limit;
            }
            path.trim_front();
            path.stats.packets_acked += u64::from(acked_packets);
            if acked_packets > 0 {
                path.last_acked_ns = now_ns;
            }
            // An RTO undone: one of the packets it gave up on arrived after
            // all (the receiver reports it), so the path was only late.
            if let Some(gave_up) = path.gave_up {
                let fate = gave_up.arrived(ack.ack_psn, &ack.sack, limit);
                if fate == Some(true) {
                    path.gave_up = None;
                    path.consecutive_rtos = 0;
                    self.stats.spurious_rtos += u64::from(gave_up.rtos);
                    dev.stats.spurious_rtos += u64::from(gave_up.rtos);
                    self.stats.spurious_give_ups += u64::from(gave_up.others);
                    dev.stats.spurious_give_ups += u64::from(gave_up.others);
                    if gave_up.rtos > 0 {
                        trace_event!(
                            in: self.trace.enter_path(p),
                            DEBUG,
                            now_ns,
                            "RTO undone: a packet it gave up on arrived (late, not lost)"
                        );
                    } else {
                        // Given up by a connection timer (a retry round, an
                        // unanswered probe of a silent connection), which
                        // logged itself as the connection's: no path RTO.
                        trace_event!(
                            in: self.trace.enter_path(p),
                            DEBUG,
                            now_ns,
                            "give-up undone: a packet a connection timer gave up on arrived (late, not lost)"
                        );
                    }
                    self.cc.on_spurious_rto(p, now_ns);
                    let sent = path.rto_oldest_sent_ns;
                    self.note_stall(now_ns, sent);
                } else if fate == Some(false) || !seq::seq_lt(ack.ack_psn, gave_up.end) {
                    if fate == Some(false) && gave_up.floor_held {
                        // A later packet of the path arrived and the first
                        // given up on had not, on an in-order route with
                        // no floor above it: really lost.
                        self.stats.rtos_proved_lost += u64::from(gave_up.rtos);
                        dev.stats.rtos_proved_lost += u64::from(gave_up.rtos);
                    }
                    path.gave_up = None;
                }
            }
        }
        self.inflight_bytes -= acked_bytes + lost_bytes + trimmed_bytes;
        self.stats.data_packets_lost += lost_packets + trimmed_packets;
        dev.stats.trim_nacks += trimmed_packets;
        #[cfg(feature = "trace")]
        if lost_packets > 0 {
            trace_event!(
                in: self.trace.enter_path(p),
                DEBUG,
                now_ns,
                lost_packets,
                lost_bytes,
                in_a_row = self.paths[p].consecutive_losses,
                "packets lost: a SACK gap below a later arrival; resent elsewhere"
            );
        }
        if self.paths[p].consecutive_losses >= FAILED_PATH_LOSSES
            && self.others_delivering(p, now_ns)
        {
            // Losses in a row on one route while the others deliver: a dead
            // or gray link, not congestion (which would hit every route).
            self.paths[p].consecutive_losses = 0;
            self.path_failed(now_ns, dev, p, Verdict::Lossy);
        }
        dev.stats.data_packets_lost += lost_packets + trimmed_packets;
        // Random losses size the repair packets; trims are congestion.
        dev.on_fates(now_ns, acked_packets, lost_packets);
        if lost_packets > 0 {
            dev.probe_budget.loss_seen(now_ns);
        }
        // A short cold packet (`cold_packet_bytes`) crosses each hop in a
        // fraction of a full packet's time: its round trip is no sample of
        // the path's (on six store-and-forward hops at 100 Gb/s, 1.8 us
        // under a full packet's, an eighth of the RTT).
        let short_head_only = acked_packets == 1
            && newly_acked_segs
                .iter()
                .any(|s| s.seg == 0 && self.msgs.get(s.msg).is_some_and(|m| m.head_bytes > 0));
        for seg in newly_acked_segs.drain(..) {
            self.on_segment_acked(seg);
        }
        self.scratch_segs = newly_acked_segs;

        // RTT from the echoed timestamp, less the time the receiver held it.
        let path = &mut self.paths[p];
        let echo_age = (now_ns as u32).wrapping_sub(ack.ts_echo);
        let rtt_sample = (echo_age < (1 << 31) && !short_head_only)
            .then(|| u64::from(echo_age.saturating_sub(ack.ack_delay_ns)).max(1));
        if let Some(rtt) = rtt_sample
            && acked_packets > 0
        {
            path.rtt.update_with(rtt, &self.conn_rtt);
            self.conn_rtt.update(rtt);
            dev.rtt_ceiling.record(now_ns, rtt);
            self.rtt_histogram.record(rtt);
            self.stats.rtt_samples += 1;
        }
        // ECN: the receiver's counters are cumulative; only a newer ACK counts.
        let mut ce_delta = 0;
        if seq::seq_diff(ack.rx_packets, path.echoed_rx_packets) > 0 {
            ce_delta = ack.ce_packets.wrapping_sub(path.echoed_ce_packets);
            path.echoed_rx_packets = ack.rx_packets;
            path.echoed_ce_packets = ack.ce_packets;
            path.last_echo_marked = ce_delta > 0;
            path.stats.ce_marks += u64::from(ce_delta);
            self.stats.ce_marks_echoed += u64::from(ce_delta);
        }
        // A suspect path (cross-path RACK, or silent past its probe timeout
        // while later packets were acknowledged elsewhere) whose packet
        // from before the probe is acknowledged only now was late, not
        // lost: the fabric's routes differ by more than the window, which
        // widens by this lateness (`path_skew.rs`). The probe's own answer
        // echoes the probe, and proves nothing.
        if let Some(probe_ns) = path.probe_sent_ns.get()
            && path.silent_rounds > 0
            && acked_bytes > 0
            && echo_age < (1 << 31)
            && now_ns.saturating_sub(u64::from(echo_age)) < probe_ns
        {
            let late_ns = now_ns.saturating_sub(probe_ns);
            let rtt_min_ns = self
                .conn_rtt
                .measured_min_ns()
                .unwrap_or(dev.config.base_rtt_ns);
            dev.path_skew
                .on_late_answer(now_ns, late_ns, rtt_min_ns, self.conn_rtt.srtt_ns());
            dev.stats.late_suspects += 1;
            trace_event!(
                in: self.trace.enter_path(p),
                DEBUG,
                now_ns,
                late_ns,
                skew_ns = dev.path_skew.skew_ns(now_ns, self.conn_rtt.srtt_ns()),
                "suspect path answered late, not lost: the device's path skew widens"
            );
        }
        let path = &mut self.paths[p];
        path.probe_sent_ns = MaybeNs::NONE;
        // An answer: the probe put off is moot (a new one is timed from it).
        path.probe_hold = ProbeHold::None;
        let fresh_port_answered = acked_bytes > 0 && path.drawn_fresh;
        if acked_bytes > 0 {
            path.probe_backoff = 0;
            path.silent_rounds = 0;
            path.unproven = false;
            path.drawn_fresh = false;
        }
        if acked_bytes > 0 {
            path.consecutive_rtos = 0;
            self.last_progress_ns = now_ns;
            self.timeouts = 0;
            self.blind_retired = false;
        }
        let srtt_ns = path.rtt.srtt_ns();
        let sample = AckSample {
            now_ns,
            acked_bytes,
            acked_packets,
            ce_packets: ce_delta,
            rtt_ns: rtt_sample.filter(|_| acked_packets > 0),
            srtt_ns,
            path_inflight_bytes: path.inflight_bytes,
        };
        if acked_packets > 0 || ce_delta > 0 {
            self.cc.on_ack(p, &sample);
        }
        if fresh_port_answered && let Some(memory) = self.replacement_ports.as_deref_mut() {
            memory.fresh_outcome(now_ns, false);
        }
        if lost_bytes > 0 {
            self.cc.on_loss(p, lost_bytes, now_ns);
        }
        if trimmed_bytes > 0 {
            self.cc.on_trim(p, trimmed_bytes, now_ns);
        }
        // Every ACK carries the receiver's grant, 0 meaning no cap: a cap
        // set while the receiver briefly had two senders must also be lifted.
        let was_cold = self.cc.awaiting_grant();
        let rate_before = self.cc.pacing_rate_bps();
        self.cc.on_rate_hint(
            u64::from(ack.rate_hint_mbps) * 1_000_000,
            self.conn_rtt.srtt_ns(),
            now_ns,
        );
        if let Some(restart) = self.pace_restart_ns.get()
            && restart > now_ns
            && let Some(before) = rate_before
        {
            // A raised grant while waiting for the random start point the
            // first grant gave: the same point within the new, shorter
            // gap (a newcomer first held to a quarter of its share would
            // otherwise wait up to four of its fair gaps).
            match self.cc.pacing_rate_bps() {
                None => self.pace_restart_ns = MaybeNs::NONE,
                Some(after) if after > before => {
                    let wait =
                        u128::from(restart - now_ns) * u128::from(before) / u128::from(after);
                    self.pace_restart_ns = MaybeNs::some(now_ns + wait as u64);
                }
                Some(_) => {}
            }
        }
        if trimmed_packets > 0
            && let Some(rate_bps) = self.cc.pacing_rate_bps()
        {
            // Trimmed in a burst: paced senders that started together (an
            // incast) keep meeting in step, one gap apart, and the next
            // slot of each would meet the same burst and be trimmed again.
            // A random point within one gap spreads them over it, and
            // their arrivals add up to the grants' sum, not a burst.
            self.pace_out_of_step(now_ns, dev, self.last_paced_bytes, rate_bps);
        } else if was_cold {
            self.pace_first_grant_out_of_step(now_ns, dev);
        }
        self.refresh_path_deadline(p, dev);
        self.rack_advance(latest_acked_sent_ns, now_ns, dev);
    }

    /// A newcomer's first grant, from its first ACK or from setup, that
    /// caps it (others send beside it): newcomers that started together
    /// hear their first grants together, and paced from that moment they
    /// would keep sending in step, a packet each at once every gap (256
    /// senders of 1 MB: a megabyte burst into the receiver every 84 us,
    /// its queue swinging from empty to 790 KB for ever). Each starts at a
    /// random point within one full packet's gap.
    fn pace_first_grant_out_of_step(&mut self, now_ns: u64, dev: &mut DeviceState) {
        if let Some(rate_bps) = self.cc.pacing_rate_bps() {
            let packet = u64::from(dev.config.mtu_payload_bytes + PACKET_OVERHEAD_BYTES);
            self.pace_out_of_step(now_ns, dev, packet, rate_bps);
        }
    }

    /// The receiver's grant from connection setup (bits/s, 0 = no cap),
    /// before this connection sent anything: taken as its first ACK's
    /// grant would be, a round trip sooner. Later grants come in ACKs.
    pub(crate) fn take_setup_grant(&mut self, rate_bps: u64, now_ns: u64, dev: &mut DeviceState) {
        if self.stats.data_packets_sent > 0 {
            return;
        }
        // The controller that will send is built with the first message:
        // build it now, to hold the grant.
        self.ensure_send_side(dev);
        if !self.cc.awaiting_grant() {
            return;
        }
        self.cc.on_setup_grant(rate_bps, now_ns);
        if self.cc.awaiting_grant() {
            return;
        }
        trace_event!(
            in: self.trace.enter(),
            DEBUG,
            now_ns,
            rate_bps,
            "setup grant taken: no cold round trip (rate 0: the receiver's only sender, no cap)"
        );
        self.pace_first_grant_out_of_step(now_ns, dev);
    }

    /// Restart pacing at a random point within the gap of a `packet_bytes`
    /// packet at `rate_bps`: senders that would keep meeting in step (an
    /// incast's) spread over the gap.
    fn pace_out_of_step(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        packet_bytes: u64,
        rate_bps: u64,
    ) {
        let gap_ns = transmit::pace_gap_ns(packet_bytes.max(1), rate_bps).max(1);
        self.pace_restart_ns = MaybeNs::some(now_ns + dev.rng.next_u64() % gap_ns);
    }

    /// Whether the latest packet given up on for a SACK gap of path `p`
    /// arrived after all: then the fabric reorders (a switch that routes
    /// each packet on its own), and gaps must wait before they are losses
    /// (`crate::reorder`).
    ///
    /// Read as an RTO's given-up PSNs are (`gave_up_arrived`).
    fn check_gap_loss_undone(
        &mut self,
        now_ns: u64,
        dev: &mut DeviceState,
        p: usize,
        ack: &AckRepr,
        limit: u32,
    ) {
        let Some(verdict) = self.gap_lost else {
            return;
        };
        if usize::from(verdict.slot) != p {
            return;
        }
        if self.paths[p].generation != verdict.generation {
            self.gap_lost = None;
            return;
        }
        let range = (verdict.psn, verdict.psn.wrapping_add(1));
        let fate = gave_up_arrived(ack.ack_psn, &ack.sack, limit, range, verdict.next_psn());
        if fate == Some(true) {
            self.gap_lost = None;
            self.stats.spurious_gap_losses += 1;
            dev.stats.spurious_gap_losses += 1;
            if let Some(rtt_min_ns) = self.conn_rtt.measured_min_ns() {
                dev.reorder.on_proof(now_ns, rtt_min_ns);
            }
        } else if fate == Some(false) {
            self.gap_lost = None;
        }
    }

    /// Whether some path other than `p` had packets acknowledged within the
    /// last two smoothed RTTs.
    fn others_delivering(&self, p: usize, now_ns: u64) -> bool {
        let window = 2 * self.conn_rtt.srtt_ns();
        self.paths
            .iter()
            .enumerate()
            .any(|(i, x)| i != p && x.last_acked_ns + window >= now_ns && x.last_acked_ns > 0)
    }

    fn on_segment_acked(&mut self, seg: SegRef) {
        let Some(msg) = self.msgs.get_mut(seg.msg) else {
            return;
        };
        if msg.attempt != seg.attempt || !msg.ack(seg.seg) {
            return;
        }
        // A response is done once the requester has every segment; a request
        // waits for the responder's op-ack or response.
        if msg.kind == MsgKind::Response && msg.fully_acked() {
            self.msgs.remove(seg.msg);
        }
    }
}
