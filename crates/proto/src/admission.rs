//! Receiver-driven admission: how a device shares its own link among the
//! peers sending to it, told to each sender in every ACK (`rate_hint_mbps`,
//! a grant in Mbit/s; 0 = no cap).
//!
//! Senders cannot know about each other; only the receiver sees an incast
//! form, as packets of new senders arrive. Four rules keep the queue into
//! it short from the second round trip on, whatever the number of senders:
//!
//! 1. **Fair share of a utilisation target.** Every active sender is granted
//!    `line x utilisation / n` (rounded up), the utilisation (the whole
//!    line by default) less the device's loss rate (the senders' resends
//!    go past their grants and need that room), less up to 2.5 % while
//!    arriving packets carry CE marks, and less 5 % from a newcomer's
//!    arrival until the link into the device is seen idle (a datagram
//!    that comes a full packet's time after the one before it, or a base
//!    RTT in which the link carried a packet's time less than its line
//!    could). The last
//!    two drain a queue that stood before the senders' first packets,
//!    which rule 3 cannot see: with the whole line granted it would
//!    never drain (240 senders of 20 KB and 16 of 400 KB into one host
//!    kept 230-280 KB queued to the end).
//!    When most arriving packets are CE-marked while the link into the
//!    device is not full, the queue that marks them stands before the
//!    device, in a fabric over-committed as a whole (an all-to-all over
//!    2:1 uplinks): the grants shrink round by round until the marks
//!    thin out, and grow back after (the fabric term). Where an operator
//!    knows the fabric to be over-committed (`fabric_mark_bar_permille`),
//!    the term works per sender instead: a sender whose own packets
//!    arrive marked is cut, one whose packets cross no full link (its
//!    receiver's leaf) keeps its share.
//!    A lone sender gets no cap (0): ECN and the
//!    sender's own windows steer it. A sender is active from its first
//!    packet until it says it has nothing more to send (the data flag
//!    `SENDER_DRAINED`) or falls silent for a whole epoch.
//! 2. **No over-commitment.** A grant is a promise the receiver cannot take
//!    back for a round trip: a sender granted the whole link keeps sending
//!    at that rate until the smaller grant reaches it. So the receiver keeps
//!    the sum of its grants (`committed`), counts a reduction as released
//!    only one base RTT after it made it, and raises a grant only out of
//!    what is not committed, and one fair share more (so a late newcomer
//!    is raised before the others' cuts reach them). A sender arriving
//!    while the link is promised to others gets what is left, but at least
//!    a quarter of its fair share, so it is never shut out. Without this
//!    rule the first senders of an incast, granted the link before the
//!    others were seen, would send the harmonic sum of their shares (4.7
//!    BDPs for 64 senders) in the second round trip.
//! 3. **Queue feedback.** The receiver estimates the queueing delay of the
//!    packets reaching it from their one-way delays (the sender's timestamp
//!    against its own clock, less the smallest seen per sender, so the
//!    clocks need not agree), and with several senders scales every grant
//!    down while that delay exceeds half a base RTT. A queue left by the
//!    first round trip thus drains in a few RTTs instead of at the
//!    utilisation slack. (A lone sender's delay is the fabric's, which its
//!    ECN marks steer; it is not capped for it.)
//! 4. **Raised grants are pushed.** A grant reaches a sender in the ACK
//!    of its data, so a sender granted a thousandth of the link (one packet
//!    per 340 µs) would learn that the others finished, or that its held
//!    first grant may now rise, only one packet gap later: the receiver's
//!    link ran at 60 % through the last half millisecond of a 1023:1
//!    incast. So when released grants leave room (a sender drained or
//!    went silent, a reduction took effect), the receiver gives it at once
//!    to the senders below their fair share, each in an ACK of its own,
//!    out of what is not committed: the pushes never promise more than
//!    the link. A sender is pushed at most once per half base RTT.
//! 5. **State per active sender only**, in a slab the epoch sweep empties
//!    of senders that fell silent: the receiver of a 1023-sender incast
//!    holds 1023 small entries, an idle one none.
//!
//! A sender turns its grant into a window (grant x its propagation RTT)
//! and paces at it, so a grant below one packet per RTT still works.

use std::collections::VecDeque;

/// A device's share of its line for each of the `senders` peers that
/// connected to it, promised at connection setup (bits/s; 0 = no cap for
/// a lone sender). Rule 2 in advance: the promises add up to the line,
/// so senders that take them at once fill the link and no more; the
/// first ACKs then say what rule 1 makes of the senders that came.
pub(crate) fn setup_share_bps(line_rate_bps: u64, senders: u32) -> u64 {
    if senders <= 1 {
        0
    } else {
        (line_rate_bps / u64::from(senders)).max(1)
    }
}

/// The headroom, per mille of the line, the grants leave while every data
/// packet arrives CE-marked: a queue standing above the marking threshold
/// drains, and one just above it (a few marks) costs the senders little.
const CE_HEADROOM_PERMILLE: u64 = 25;

/// The fabric term (rule 1). A paced sender's window is under a packet,
/// so its own ECN cuts cannot slow it: where the fabric before the
/// receiver is over-committed as a whole (an all-to-all over 2:1 uplinks),
/// only its grant can. Once per base RTT, while the smoothed share of
/// CE-marked arrivals is past this bar (per mille), the grants in all are
/// cut by half the excess, to `FABRIC_KEPT_MIN_PERMILLE` at the least;
/// otherwise they regain `FABRIC_REGAIN_PERMILLE` of the line. Below the
/// bar, marks come from hot spots (a few hashed routes; this device's own
/// link, which the CE headroom drains), and grants cut for them only idle
/// the receivers. A cut in proportion to the share (not a running one)
/// held a 256 KB all-to-all at 2:1 at about 70 % of the line, where only
/// some of each receiver's arrivals crossed the full uplinks: the share
/// stalled at two in three, the queues stayed full and it collapsed into
/// 51,625 RTOs.
const FABRIC_CE_THRESHOLD_PERMILLE: u64 = 500;
const FABRIC_KEPT_MIN_PERMILLE: u64 = 250;
/// 3 % of the line per base RTT: back from the floor in 25 RTTs. Half as
/// fast, the 256 KB all-to-all at 2:1 collapsed all the same (21,818
/// RTOs); twice as fast, 6,665 µs against 6,545.
const FABRIC_REGAIN_PERMILLE: u64 = 30;

/// The per-sender fabric term (rule 1, `fabric_mark_bar_permille` below
/// 1000): each active sender's share of CE-marked arrivals is smoothed
/// with gain 1/this per packet, a few packets' memory. A sender granted
/// a 63rd of the line sends a packet every 20-40 µs, so a slower share
/// followed an uplink's queue too late: with gain 1/16 the 2:1 leaf-spine
/// all-to-all of 256 KB (`scenarios/unseen/ls128-2to1-alltoall-256k.toml`,
/// seeds 1-3) took 3,348 µs and 157 RTOs against 2,994 µs and 47.
const SENDER_CE_GAIN_DIV: i64 = 4;

/// The fabric term needs this many active senders: a fabric over-committed
/// as a whole marks the packets of many. A share past half among a handful
/// may be one hot route's, and at the tail of a lossy all-to-all (11 senders
/// left, slow resends, the link half idle) cutting their grants only slowed
/// the last flows.
const FABRIC_TERM_MIN_SENDERS: u64 = 16;

/// The fabric term waits while the link into the device carried at least
/// this share of its line (per mille) over the last base RTT: marks that
/// come with a full link may be its own queue's.
const FULL_LINK_PERMILLE: u64 = 900;

/// An EWMA of a share (per 65,536) with gain `1/div`, each step rounded
/// away from zero so the share reaches both ends.
fn smooth_share(share: u32, marked: bool, div: i64) -> u32 {
    let target: i64 = if marked { 65_536 } else { 0 };
    let gap = target - i64::from(share);
    let step = (gap + (div - 1) * gap.signum()) / div;
    u32::try_from(i64::from(share) + step).unwrap_or(0)
}

/// The headroom, per mille of the line, the grants leave from a newcomer's
/// arrival until the link into the device is seen idle. While a queue
/// stands the link is busy whatever the grants, so the headroom costs
/// nothing until the queue is gone; then the link's first idle moment
/// hands it back (pushed to the senders, rule 4).
const DRAIN_HEADROOM_PERMILLE: u64 = 50;

/// What a datagram takes of the link beside its own bytes: its frame
/// (Ethernet, IPv4 and UDP headers and the FCS) and the Ethernet preamble
/// and inter-frame gap (20 bytes). Counted generously, so a link carrying
/// back to back never looks idle to the per-round-trip test of
/// `note_arrival` (0.5 % of a 100 µs span would be more than a packet).
const LINK_FRAME_BYTES: u64 = metaroce_wire::FRAME_OVERHEAD_LEN as u64 + 20;

/// A pushed raise is at least this fraction of the sender's grant
/// (1/20, the drain headroom handed back): an ACK for less is not worth
/// its bytes. With a third, a 1,023:1 incast's senders, one packet every
/// 340 µs each, learnt of most raises only at their next packets, and
/// the receiver's link ran below its grants through the start and the
/// tail (1.052 × the ideal drain against 1.045).
const PUSH_MIN_RAISE_DIV: u64 = 20;

/// What the receiver keeps per sending peer (inside its connection).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SenderState {
    /// Its entry in the active-sender slab, plus one (0: not active).
    slot: u32,
    /// That entry's tag (an entry freed by the epoch sweep may be reused).
    tag: u32,
    /// Smallest one-way delay seen from this peer (its clock against ours,
    /// mod 2^32 ns); `None` until its first packet.
    owd_base: Option<u32>,
}

/// An active sender.
#[derive(Debug, Clone, Copy)]
struct Active {
    /// Its grant, Mbit/s (the line while uncapped).
    grant_mbps: u64,
    /// The epoch it last sent data in.
    seen_epoch: u64,
    /// Its generation, so a stale `SenderState` slot is told apart.
    tag: u32,
    /// Smoothed queueing delay of its packets, ns.
    qdelay_ns: u64,
    /// It said it is drained: not counted, its grant not committed, but
    /// remembered for the epoch, so a sender of short messages (a ring's
    /// steps) resumes at its share instead of starting over as a newcomer.
    dormant: bool,
    /// Its connection (the endpoint's index): whom a pushed grant goes to.
    conn: u32,
    /// When it was last told its grant (an ACK), ns.
    told_ns: u64,
    /// The send time (the sender's clock) of the packet that said so.
    /// Packets sprayed over many paths arrive out of order: one sent
    /// before that packet but arriving after it is the drained message's
    /// own tail, not new data, and must not count the sender again (it
    /// would hold everyone else's grants at a share for an epoch after
    /// the sender has gone).
    drained_at_ts: u32,
    /// Its first grant was held below its fair share (the budget was
    /// spent when it came): pushed its share within one share of
    /// overdraft (`take_regrants`).
    held: bool,
    /// Smoothed share of its data packets that arrive CE-marked (per
    /// 65,536; the per-sender fabric term only).
    ce_share: u32,
    /// What the per-sender fabric term leaves of its fair share, per mille.
    kept_permille: u16,
}

/// A reduction of the committed sum that takes effect at `at_ns`.
#[derive(Debug, Clone, Copy)]
struct Release {
    at_ns: u64,
    mbps: u64,
}

/// The device-wide admission state.
#[derive(Debug)]
pub(crate) struct Admission {
    /// A full packet's bits (the configured MTU plus headers).
    packet_bits: u64,
    /// Its time on the line, ns.
    packet_ns: u64,

    epoch_ns: u64,
    line_mbps: u64,
    /// Share of the line granted in all (per mille) on a loss-free fabric.
    utilisation_permille: u64,
    /// The device's loss rate (per mille, at most half): the share of the
    /// line its senders' resends take, kept out of the grants.
    loss_permille: u64,
    /// Smoothed share of the data packets reaching the device that carry a
    /// CE mark (per 65,536, gain 1/16): a queue standing somewhere on
    /// their way, the receiver's own downlink most of all.
    ce_share: u32,
    /// The same share smoothed over more packets (gain 1/64): the signal
    /// of the fabric term, steady enough that a passing hot spot does not
    /// move the grants.
    ce_share_slow: u32,
    /// When the last datagram reached the device, ns.
    last_arrival_ns: u64,
    /// Bytes that reached the device since `load_window_ns`.
    load_bytes: u64,
    /// Datagrams among them (each adds its frame to the link's busy time).
    load_datagrams: u64,
    load_window_ns: u64,
    /// The link into the device, per mille of its line, over the last
    /// base RTT that ended.
    load_permille: u64,
    /// What the fabric term leaves of the grants, per mille (1000: all).
    fabric_kept_permille: u64,
    /// The per-sender fabric term's bar: a sender whose smoothed share of
    /// marked arrivals is past it (per mille) is cut; 1000: the term is
    /// off and the device-wide one acts.
    sender_mark_bar_permille: u64,
    /// When the device's link was last seen idle: a datagram that came
    /// more than a full packet's time after the one before it found the
    /// queue into this device empty.
    idle_seen_ns: u64,
    /// When the last newcomer (a sender not yet active) arrived, ns.
    newcomer_ns: u64,
    base_rtt_ns: u64,
    epoch: u64,
    /// Active senders; `None` entries are free.
    active: Vec<Option<Active>>,
    free: Vec<u32>,
    live: u64,
    next_tag: u32,
    /// Sum of the active senders' grants, Mbit/s.
    committed_mbps: u64,
    /// Reductions not yet released.
    releases: VecDeque<Release>,
    /// Their sum.
    pending_mbps: u64,
    /// The queueing delay every active sender's packets meet: the
    /// smallest of their smoothed delays (the queue into this receiver is
    /// on all their routes; a queue in the fabric is on some), ns.
    qdelay_ns: u64,
    /// When that minimum was last taken.
    qdelay_at_ns: u64,
    /// Not before this time, look for senders to push a raised grant to
    /// (rule 5); `u64::MAX`: no room was released since the last look.
    regrant_ns: u64,
    /// When the last look was.
    regranted_ns: u64,
}

/// Reductions held at once, at most (older ones are released early: a
/// bounded queue, even with a million senders).
const MAX_RELEASES: usize = 4096;

impl Admission {
    /// Admission for a link of `line_rate_bps`, forgetting senders silent
    /// for an epoch of `epoch_ns` and granting `utilisation` (0..=1) of the
    /// line in all.
    pub(crate) fn new(
        epoch_ns: u64,
        line_rate_bps: u64,
        utilisation: f64,
        base_rtt_ns: u64,
        packet_bytes: u64,
    ) -> Self {
        Self {
            packet_bits: packet_bytes.max(1) * 8,
            packet_ns: packet_bytes.max(1) * 8 * 1000 / (line_rate_bps / 1_000_000).max(1),

            epoch_ns: epoch_ns.max(1),
            line_mbps: (line_rate_bps / 1_000_000).max(1),
            utilisation_permille: (utilisation.clamp(0.01, 1.0) * 1000.0) as u64,
            loss_permille: 0,
            ce_share: 0,
            ce_share_slow: 0,
            last_arrival_ns: 0,
            load_bytes: 0,
            load_datagrams: 0,
            load_window_ns: 0,
            load_permille: 0,
            fabric_kept_permille: 1000,
            sender_mark_bar_permille: 1000,
            idle_seen_ns: 0,
            newcomer_ns: 0,
            base_rtt_ns: base_rtt_ns.max(1),
            epoch: 0,
            active: Vec::new(),
            free: Vec::new(),
            live: 0,
            next_tag: 0,
            committed_mbps: 0,
            releases: VecDeque::new(),
            pending_mbps: 0,
            qdelay_ns: 0,
            qdelay_at_ns: 0,
            regrant_ns: u64::MAX,
            regranted_ns: 0,
        }
    }

    /// The fabric term per sender, with a bar of `permille` (1000: off;
    /// the device-wide term then acts).
    pub(crate) fn with_sender_mark_bar(mut self, permille: u32) -> Self {
        self.sender_mark_bar_permille = u64::from(permille.min(1000));
        self
    }

    fn per_sender_term(&self) -> bool {
        self.sender_mark_bar_permille < 1000
    }

    /// The device's loss rate now (0..=1). A lost packet is sent again, past
    /// any grant's count of new data: at a loss rate `r` the senders' resends
    /// take about `r` of the receiver's link, so the grants leave that much
    /// of the utilisation target free (at most half of it).
    pub(crate) fn set_loss_rate(&mut self, rate: f64) {
        self.loss_permille = (rate.clamp(0.0, 0.5) * 1000.0) as u64;
    }

    /// A data packet of sender `s` reached the device, CE-marked or not
    /// (after [`on_data`](Self::on_data) counted it): the device's share
    /// of marks, and with the per-sender fabric term the sender's own.
    pub(crate) fn note_ce(&mut self, s: &SenderState, marked: bool) {
        self.ce_share = smooth_share(self.ce_share, marked, 16);
        self.ce_share_slow = smooth_share(self.ce_share_slow, marked, 64);
        if !self.per_sender_term() {
            return;
        }
        if let Some(i) = self.entry(s)
            && let Some(a) = self.active[i as usize].as_mut()
        {
            a.ce_share = smooth_share(a.ce_share, marked, SENDER_CE_GAIN_DIV);
        }
    }

    /// A datagram of `bytes` reached the device. The link into the device
    /// was idle, so no queue stood in front of it, if this datagram came
    /// more than a full packet's time after the one before it, or if the
    /// link carried at least a packet's time less than its line over a
    /// base RTT that began after the last newcomer arrived. The second
    /// test sees what the first misses: senders paced at grants of 95 %
    /// of the line spread the slack evenly, a twentieth of a packet
    /// between two packets, and no single gap ever showed it (a 16:1
    /// incast of 1 MB ran at 94-95 % of the line to its end).
    pub(crate) fn note_arrival(&mut self, now_ns: u64, bytes: u64) {
        let quiet_ns = bytes * 8 * 1000 / self.line_mbps + self.packet_ns;
        if now_ns.saturating_sub(self.last_arrival_ns) >= quiet_ns {
            self.saw_idle(now_ns);
        }
        self.last_arrival_ns = now_ns;
        self.load_bytes += bytes;
        self.load_datagrams += 1;
        let span_ns = now_ns.saturating_sub(self.load_window_ns);
        if span_ns >= self.base_rtt_ns {
            let capacity_bits = u128::from(self.line_mbps) * u128::from(span_ns) / 1000;
            self.load_permille =
                u64::try_from(u128::from(self.load_bytes) * 8000 / capacity_bits.max(1))
                    .unwrap_or(u64::MAX);
            // The bytes of this span took the link this long; the rest of
            // it the link was idle, at moments the first test may not see.
            // A span that began before the last newcomer's arrival may have
            // been idle only before it.
            let wire_bytes = self.load_bytes + self.load_datagrams * LINK_FRAME_BYTES;
            let busy_ns = u64::try_from(u128::from(wire_bytes) * 8000 / u128::from(self.line_mbps))
                .unwrap_or(u64::MAX);
            if self.newcomer_ns < self.load_window_ns
                && span_ns.saturating_sub(busy_ns) >= self.packet_ns
            {
                self.saw_idle(now_ns);
            }
            self.load_bytes = 0;
            self.load_datagrams = 0;
            self.load_window_ns = now_ns;
            self.fabric_round();
        }
    }

    /// The link into the device was idle just now: whatever queue the
    /// newcomers built is gone.
    fn saw_idle(&mut self, now_ns: u64) {
        if self.draining() {
            // The grants may rise by the drain headroom: tell the senders
            // now, not at their next packets.
            self.regrant_ns = self.regrant_ns.min(now_ns);
        }
        self.idle_seen_ns = now_ns;
    }

    /// The fabric term's round, once per base RTT: a cut while most
    /// arrivals of many senders are marked on a link that is not full,
    /// else a step back toward the whole line.
    fn fabric_round(&mut self) {
        if self.per_sender_term() {
            self.sender_fabric_round();
            return;
        }
        let marked_permille = u64::from(self.ce_share_slow) * 1000 / 65_536;
        let over_committed =
            self.fabric_term_applies() && marked_permille > FABRIC_CE_THRESHOLD_PERMILLE;
        self.fabric_kept_permille = if over_committed {
            let cut_permille = (marked_permille - FABRIC_CE_THRESHOLD_PERMILLE) / 2;
            (self.fabric_kept_permille * (1000 - cut_permille) / 1000).max(FABRIC_KEPT_MIN_PERMILLE)
        } else {
            (self.fabric_kept_permille + FABRIC_REGAIN_PERMILLE).min(1000)
        };
    }

    /// The per-sender fabric term's round, once per base RTT: while the
    /// term may act, each sender whose marked share is past the bar is cut
    /// by half that share (DCTCP's cut, with the share for its alpha), to
    /// a quarter of its fair share at the least; every other sender
    /// regains 3 % of its share. A sender paced at a grant under a packet
    /// per round trip cannot be slowed by its own ECN cuts, and the
    /// device-wide term never saw the over-committed uplinks of a 2:1
    /// leaf-spine all-to-all: a quarter of each receiver's senders share
    /// its leaf, are never marked, and held the device's share of marks
    /// at 20-45 %. The grants ignored the marks, single uplinks sat at 100
    /// % with full 1 MB queues while their siblings carried 60 %, and the
    /// all-to-all of 256 KB collapsed into 4,374 RTOs (seed 1).
    fn sender_fabric_round(&mut self) {
        let applies = self.fabric_term_applies();
        let bar = self.sender_mark_bar_permille;
        for a in self.active.iter_mut().flatten() {
            let share_permille = u64::from(a.ce_share) * 1000 / 65_536;
            let kept = u64::from(a.kept_permille);
            let kept = if applies && share_permille > bar {
                (kept * (1000 - share_permille / 2) / 1000).max(FABRIC_KEPT_MIN_PERMILLE)
            } else {
                (kept + FABRIC_REGAIN_PERMILLE).min(1000)
            };
            a.kept_permille = u16::try_from(kept).unwrap_or(1000);
        }
    }

    /// What the per-sender fabric term leaves of `a`'s fair share, per
    /// mille: its cut holds only while the term may act.
    fn sender_kept_permille(&self, a: &Active) -> u64 {
        if self.per_sender_term() && self.fabric_term_applies() {
            u64::from(a.kept_permille)
        } else {
            1000
        }
    }

    /// Whether the fabric term may act: many senders (a fabric
    /// over-committed as a whole marks the packets of many), and the link
    /// into the device not full (marks with a full link may be its own
    /// queue's). Its cut holds only while this does.
    fn fabric_term_applies(&self) -> bool {
        self.live >= FABRIC_TERM_MIN_SENDERS && self.load_permille < FULL_LINK_PERMILLE
    }

    /// Whether newcomers arrived since the link was last seen idle.
    fn draining(&self) -> bool {
        self.newcomer_ns >= self.idle_seen_ns
    }

    /// The share of the line granted in all now, per mille.
    fn utilisation_now_permille(&self) -> u64 {
        let queue_permille = u64::from(self.ce_share) * CE_HEADROOM_PERMILLE / 65_536;
        // Newcomers arrived since the link was last seen idle: their
        // first packets may have built a queue that one-way delays cannot
        // show (it stood before each sender's first packet), so leave
        // room to drain it until the link is seen idle again.
        let drain_permille = if self.draining() {
            DRAIN_HEADROOM_PERMILLE
        } else {
            0
        };
        let own = self
            .utilisation_permille
            .saturating_sub(self.loss_permille + queue_permille + drain_permille)
            .max(self.utilisation_permille / 2);
        if !self.fabric_term_applies() || self.per_sender_term() {
            return own;
        }
        own * self.fabric_kept_permille / 1000
    }

    /// Bytes held (for the per-device memory figure).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.active.capacity() * size_of::<Option<Active>>()
            + self.free.capacity() * 4
            + self.releases.capacity() * size_of::<Release>()
    }

    /// A new epoch: senders silent through the whole last one are gone.
    fn roll_epoch(&mut self, now_ns: u64) {
        let epoch = now_ns / self.epoch_ns;
        if epoch == self.epoch {
            return;
        }
        self.epoch = epoch;
        for i in 0..self.active.len() {
            if let Some(a) = self.active[i] {
                // Silent for a whole epoch, or for four of the gaps its
                // grant spaces its packets by, whichever is longer: a
                // sender granted a packet per 90 µs (256 senders on one
                // 100 Gb/s link) is not gone after one 50 µs epoch; counted
                // out, it would inflate everyone else's share and keep the
                // queue standing.
                let gap_ns = self.packet_bits * 1000 / a.grant_mbps.max(1);
                let grace = (4 * gap_ns).div_ceil(self.epoch_ns);
                if a.seen_epoch + 1 + grace < epoch {
                    if !a.dormant {
                        // Its grant is free at once: it sent nothing for
                        // an epoch.
                        self.regrant_ns = self.regrant_ns.min(now_ns);
                    }
                    self.remove(i as u32);
                }
            }
        }
    }

    fn remove(&mut self, i: u32) {
        if let Some(a) = self.active[i as usize].take() {
            if !a.dormant {
                self.committed_mbps -= a.grant_mbps;
                self.live -= 1;
            }
            self.free.push(i);
        }
    }

    /// The active entry of `s`, if it has one that is still its own.
    fn entry(&self, s: &SenderState) -> Option<u32> {
        let i = s.slot.checked_sub(1)?;
        self.active
            .get(i as usize)
            .copied()
            .flatten()
            .filter(|a| a.tag == s.tag)
            .map(|_| i)
    }

    /// A data packet from a peer, sent at its clock's `timestamp_ns`,
    /// arrived at `now_ns`: count the peer as active and, if `queue_sample`,
    /// fold its queueing delay into the estimate (a trimmed header overtook
    /// the queue the data waits in: its delay says nothing of that queue).
    /// `drained`: the sender says it has nothing more queued for us (wire
    /// flag `SENDER_DRAINED`): it stops counting at once and its grant is
    /// released an RTT later; data it sends later counts it afresh.
    pub(crate) fn on_data(
        &mut self,
        s: &mut SenderState,
        conn: u32,
        now_ns: u64,
        timestamp_ns: u32,
        queue_sample: bool,
        drained: bool,
    ) {
        self.roll_epoch(now_ns);
        match (self.entry(s), drained) {
            (Some(i), false) => {
                let epoch = self.epoch;
                let a = self.active[i as usize].as_mut().expect("entry() checked");
                a.seen_epoch = epoch;
                // Sent after the drained packet (mod 2^32 ns; a dormant
                // entry lives an epoch or so, far less than 2 s): new data.
                let sent_later = (timestamp_ns.wrapping_sub(a.drained_at_ts) as i32) > 0;
                if a.dormant && sent_later {
                    a.dormant = false;
                    self.committed_mbps += a.grant_mbps;
                    self.live += 1;
                }
            }
            (Some(i), true) => {
                let epoch = self.epoch;
                let a = self.active[i as usize].as_mut().expect("entry() checked");
                a.seen_epoch = epoch;
                if !a.dormant {
                    a.dormant = true;
                    a.drained_at_ts = timestamp_ns;
                    let g = a.grant_mbps;
                    self.committed_mbps -= g;
                    self.live -= 1;
                    self.defer_release(now_ns, g);
                }
            }
            (None, false) => {
                let a = Active {
                    grant_mbps: 0,
                    seen_epoch: self.epoch,
                    conn,
                    told_ns: now_ns,
                    tag: self.next_tag,
                    dormant: false,
                    drained_at_ts: 0,
                    held: false,
                    qdelay_ns: 0,
                    ce_share: 0,
                    kept_permille: 1000,
                };
                self.next_tag = self.next_tag.wrapping_add(1);
                let i = match self.free.pop() {
                    Some(i) => {
                        self.active[i as usize] = Some(a);
                        i
                    }
                    None => {
                        self.active.push(Some(a));
                        self.active.len() as u32 - 1
                    }
                };
                self.live += 1;
                s.slot = i + 1;
                s.tag = a.tag;
                self.newcomer_ns = now_ns;
            }
            (None, true) => {}
        }
        if !queue_sample {
            return;
        }
        let owd = (now_ns as u32).wrapping_sub(timestamp_ns);
        let base = match s.owd_base {
            // A smaller delay (mod 2^32, within half the range) is the new base.
            Some(b) if (owd.wrapping_sub(b) as i32) >= 0 => b,
            _ => owd,
        };
        s.owd_base = Some(base);
        let q = u64::from(owd.wrapping_sub(base)).min(1 << 30);
        if let Some(i) = self.entry(s)
            && let Some(a) = self.active[i as usize].as_mut()
        {
            // EWMA with gain 1/4: a few packets' worth of memory.
            a.qdelay_ns = (3 * a.qdelay_ns + q) / 4;
        }
        // The common part of the senders' delays, refreshed every half
        // base RTT (a scan of the active senders).
        if now_ns.saturating_sub(self.qdelay_at_ns) >= self.base_rtt_ns / 2 {
            self.qdelay_at_ns = now_ns;
            self.qdelay_ns = self
                .active
                .iter()
                .flatten()
                .filter(|a| !a.dormant)
                .map(|a| a.qdelay_ns)
                .min()
                .unwrap_or(0);
        }
    }

    fn defer_release(&mut self, now_ns: u64, mbps: u64) {
        if mbps == 0 {
            return;
        }
        self.pending_mbps += mbps;
        let at_ns = now_ns + self.base_rtt_ns;
        self.releases.push_back(Release { at_ns, mbps });
        self.regrant_ns = self.regrant_ns.min(at_ns);
    }

    fn release_due(&mut self, now_ns: u64) {
        while let Some(r) = self.releases.front() {
            if r.at_ns > now_ns && self.releases.len() <= MAX_RELEASES {
                break;
            }
            self.pending_mbps -= r.mbps;
            self.releases.pop_front();
        }
    }

    /// Grant scale from the queueing delay: 1 up to half a base RTT, then
    /// down linearly to a quarter at two and a half base RTTs.
    fn queue_factor_permille(&self) -> u64 {
        let target = self.base_rtt_ns / 2;
        if self.qdelay_ns <= target {
            return 1000;
        }
        let over = (self.qdelay_ns - target) * 1000 / (2 * self.base_rtt_ns);
        1000u64.saturating_sub(over).max(250)
    }

    /// What `n` active senders are granted in all, Mbit/s: the
    /// utilisation target, scaled down by a standing queue when there are
    /// several (a lone sender's delay is the fabric's).
    fn granted_total_mbps(&self, n: u64) -> u64 {
        let qf = if n > 1 {
            self.queue_factor_permille()
        } else {
            1000
        };
        self.line_mbps * self.utilisation_now_permille() / 1000 * qf / 1000
    }

    /// When [`take_regrants`](Self::take_regrants) next has work: room was
    /// released (or will be, at that time).
    pub(crate) fn regrant_deadline(&self) -> Option<u64> {
        (self.regrant_ns != u64::MAX).then(|| {
            self.regrant_ns
                .max(self.regranted_ns + self.base_rtt_ns / 2)
        })
    }

    /// Rule 5: the connections of the senders to push a raised grant to
    /// now, into `out` (each then sends an ACK, whose grant is computed as
    /// any other's). Only what no one is promised, and one fair share
    /// more, is handed out, in slab order, each raise at least a twentieth
    /// of the sender's grant (an ACK for less is not worth its bytes).
    pub(crate) fn take_regrants(&mut self, now_ns: u64, out: &mut Vec<u32>) {
        if self.regrant_deadline().is_none_or(|d| d > now_ns) {
            return;
        }
        self.regranted_ns = now_ns;
        self.release_due(now_ns);
        // Look again when the next held reduction is released.
        self.regrant_ns = self.releases.front().map_or(u64::MAX, |r| r.at_ns);
        self.roll_epoch(now_ns);
        let n = self.live;
        if n == 0 {
            return;
        }
        let total = self.granted_total_mbps(n);
        let (fair, mut room) = if n == 1 {
            // Alone: the whole link (`grant_mbps`), whatever is committed.
            (self.line_mbps, self.line_mbps)
        } else {
            // What no one is promised, and one fair share more. A sender
            // below its share (a newcomer that came after the budget was
            // spent, most often) is raised as soon as it may be told
            // again, not when the others' cuts add up to its raise: those
            // reach each other sender only with its next ACK, a paced
            // packet later (44 us in a 128-host all-to-all), and are
            // released a base RTT after that, while the newcomer, paced at
            // a quarter of its share, falls four of its packet gaps
            // behind. The link is over-promised by one share at most,
            // until the cuts are released.
            let fair = total.div_ceil(n);
            let promised = self.committed_mbps + self.pending_mbps;
            (fair, (total + fair).saturating_sub(promised))
        };
        if room * 3 < fair {
            return;
        }
        let told_before = now_ns.saturating_sub(self.base_rtt_ns / 2);
        // A held newcomer told too lately to be told again is looked at
        // again when it may be.
        let mut again_ns = u64::MAX;
        for a in self.active.iter().flatten() {
            if a.dormant || a.grant_mbps == 0 {
                continue;
            }
            let target = fair * self.sender_kept_permille(a) / 1000;
            let raise = target.saturating_sub(a.grant_mbps);
            if raise * PUSH_MIN_RAISE_DIV < a.grant_mbps {
                continue;
            }
            if a.told_ns > told_before {
                if a.held {
                    again_ns = again_ns.min(a.told_ns + self.base_rtt_ns / 2);
                }
                continue;
            }
            if raise > room {
                continue;
            }
            room -= raise;
            out.push(a.conn);
        }
        self.regrant_ns = self.regrant_ns.min(again_ns);
    }

    /// The grant for the ACK now going to a sender, Mbit/s (0: no cap).
    pub(crate) fn grant_mbps(&mut self, s: &mut SenderState, now_ns: u64) -> u32 {
        self.roll_epoch(now_ns);
        self.release_due(now_ns);
        let Some(i) = self
            .entry(s)
            .filter(|&i| self.active[i as usize].is_some_and(|a| !a.dormant))
        else {
            // Not sending to us any more (drained): a share as if it were,
            // which only matters if it starts again before its next ACK.
            let n = self.live + 1;
            let total = self.line_mbps * self.utilisation_now_permille() / 1000;
            return if n == 1 {
                0
            } else {
                u32::try_from(total.div_ceil(n).max(1)).unwrap_or(u32::MAX)
            };
        };
        let n = self.live.max(1);
        let total = self.granted_total_mbps(n);
        let current = self.active[i as usize].map_or(0, |a| a.grant_mbps);
        let fair = total.div_ceil(n).max(1);
        let grant = if n == 1 {
            // Alone: the whole link (what others still have in flight is
            // at most the tail of their last window).
            self.line_mbps
        } else if current > 0 {
            // A sender we granted before: its fair share (less what the
            // per-sender fabric term keeps back), at once. Only a
            // newcomer's first grant is held to the budget.
            let kept = self.active[i as usize].map_or(1000, |a| self.sender_kept_permille(&a));
            (fair * kept / 1000).max(1)
        } else {
            // A newcomer: only what is not promised to anyone, but at least
            // a quarter of its fair share (it is never shut out, and paced
            // at its grant it still gets its next ACK soon).
            let free = total.saturating_sub(self.committed_mbps + self.pending_mbps);
            free.min(fair).max(fair / 4).max(1)
        };
        self.committed_mbps = self.committed_mbps - current + grant;
        if grant < current {
            self.defer_release(now_ns, current - grant);
        }
        if let Some(a) = self.active[i as usize].as_mut() {
            a.grant_mbps = grant;
            a.told_ns = now_ns;
            a.held = grant < fair;
            if a.held {
                // Pushed its share as soon as it may be told again.
                self.regrant_ns = self.regrant_ns.min(now_ns + self.base_rtt_ns / 2);
            }
        }
        if grant >= self.line_mbps {
            0
        } else {
            u32::try_from(grant).unwrap_or(u32::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: u64 = 100_000_000_000;
    const RTT: u64 = 10_000;

    fn adm() -> Admission {
        Admission::new(50_000, LINE, 1.0, RTT, 4160)
    }

    /// A datagram at `t` after a silence: the link into the device is seen
    /// idle, so no queue of the newcomers before `t` is left to drain.
    fn seen_idle(a: &mut Admission, t: u64) {
        a.note_arrival(t, 64);
    }

    /// Two newcomers at 100 ns, then the link seen idle at 1 µs: whatever
    /// queue their first packets built is gone.
    fn two_senders(a: &mut Admission) -> (SenderState, SenderState) {
        let (mut x, mut y) = (SenderState::default(), SenderState::default());
        a.on_data(&mut x, 0, 100, 100, true, false);
        a.on_data(&mut y, 1, 100, 100, true, false);
        seen_idle(a, 1_000);
        (x, y)
    }

    #[test]
    fn a_lone_sender_is_uncapped_and_two_share_the_link() {
        let mut a = adm();
        let (mut x, mut y) = (SenderState::default(), SenderState::default());
        a.on_data(&mut x, 0, 1_100, 1_100, true, false);
        assert_eq!(a.grant_mbps(&mut x, 1_110), 0);
        a.on_data(&mut y, 0, 1_200, 1_200, true, false);
        seen_idle(&mut a, 1_201);
        // y arrives while x holds the whole link: a quarter of its share.
        assert_eq!(a.grant_mbps(&mut y, 1_210), 50_000 / 4);
        // x is cut to its share, y gets its own from its next ACK on.
        assert_eq!(a.grant_mbps(&mut x, 1_300), 50_000);
        assert_eq!(a.grant_mbps(&mut y, 1_400), 50_000);
        // x says it is drained (its last packet): y alone gets the whole
        // link back at once, not after x falls silent for an epoch.
        a.on_data(&mut x, 0, 20_000, 20_000, true, true);
        assert_eq!(a.grant_mbps(&mut y, 20_001), 0);
    }

    #[test]
    fn the_grants_leave_room_for_the_resends_of_a_lossy_fabric() {
        let shares = |loss: f64| {
            let mut a = adm();
            a.set_loss_rate(loss);
            let (mut x, mut y) = two_senders(&mut a);
            // Two rounds: each holds its fair share from the second on.
            for t in [2 * RTT, 4 * RTT] {
                a.grant_mbps(&mut x, t);
                a.grant_mbps(&mut y, t);
            }
            (a.grant_mbps(&mut x, 6 * RTT), a.grant_mbps(&mut y, 6 * RTT))
        };
        // Loss-free: the whole line between them.
        assert_eq!(shares(0.0), (50_000, 50_000));
        // Losing 4 %: their resends take about 4 % of the line.
        assert_eq!(shares(0.04), (48_000, 48_000));
        // Never below half the line, however lossy.
        assert_eq!(shares(0.9), (25_000, 25_000));
    }

    /// `n` newcomers at 100 ns, then the link seen idle at 1 µs.
    fn senders(a: &mut Admission, n: usize) -> Vec<SenderState> {
        let mut s = vec![SenderState::default(); n];
        for (i, x) in s.iter_mut().enumerate() {
            a.on_data(x, i as u32, 100, 100, true, false);
        }
        seen_idle(a, 1_000);
        s
    }

    /// Full packets reach the device from `from_ns` to `to_ns`, filling
    /// `load_permille` of its link (a 4,160-byte packet takes 332.8 ns of
    /// a 100 Gb/s line).
    fn load_link(a: &mut Admission, from_ns: u64, to_ns: u64, load_permille: u64) {
        let gap_ns = 332_800 / load_permille.max(1);
        let mut t = from_ns;
        while t < to_ns {
            a.note_arrival(t, 4160);
            t += gap_ns;
        }
    }

    #[test]
    fn ce_marks_leave_room_to_drain_a_queue_the_delays_do_not_show() {
        let mut a = adm();
        let (mut x, mut y) = two_senders(&mut a);
        // The marks come with the link into the device full: its own
        // queue's, which the fabric term leaves to this headroom.
        load_link(&mut a, 1_000, 3 * RTT, 1000);
        for _ in 0..200 {
            a.note_ce(&x, true);
        }
        for t in [2 * RTT, 4 * RTT] {
            a.grant_mbps(&mut x, t);
            a.grant_mbps(&mut y, t);
        }
        // Every packet marked: 2.5 % of the line left free.
        assert_eq!(a.grant_mbps(&mut x, 6 * RTT), 48_750);
        // The marks stop: the whole line again.
        for _ in 0..200 {
            a.note_ce(&x, false);
        }
        assert_eq!(a.grant_mbps(&mut x, 8 * RTT), 50_000);
    }

    #[test]
    fn most_packets_marked_on_a_link_not_full_shrink_the_grants() {
        // `marked` of every 64 packets CE-marked from `n` senders,
        // then `rtts` base RTTs of the link into the device carrying
        // `load_permille` of its line: the grants in all, Mbit/s.
        let granted = |marked: usize, load_permille: u64, n: usize, rtts: u64| {
            let mut a = adm();
            let mut s = senders(&mut a, n);
            for i in 0..400 {
                a.note_ce(&s[i % n], i % 64 < marked);
            }
            load_link(&mut a, 1_000, 1_000 + rtts * RTT, load_permille);
            let t = 2_000 + rtts * RTT;
            for x in s.iter_mut() {
                a.grant_mbps(x, t);
            }
            u64::from(a.grant_mbps(&mut s[0], t + 2 * RTT)) * n as u64
        };
        // Every packet of 16 senders marked, half the link idle: the queue
        // that marks them stands before this device, in a fabric
        // over-committed as a whole. Each round cuts the grants by a
        // quarter (half the excess over half), to a quarter of the line.
        let one = granted(64, 500, 16, 2);
        let few = granted(64, 500, 16, 4);
        let many = granted(64, 500, 16, 12);
        assert!(
            one < 97_500 && few < one && many < few,
            "{one} {few} {many}"
        );
        assert!((24_000..=25_000).contains(&many), "{many}");
        // A third marked: hot spots, not the fabric; the CE headroom only.
        assert!(granted(21, 500, 16, 12) >= 98_000);
        // Every packet marked with the link full: the queue may be its own,
        // and the CE headroom alone drains it.
        assert_eq!(granted(64, 1000, 16, 12), 97_504);
        // Two senders: a handful's marks may be one hot route's.
        assert_eq!(granted(64, 500, 2, 12), 97_500);
    }

    #[test]
    fn the_fabric_term_gives_the_line_back_when_the_marks_stop() {
        let mut a = adm();
        let s = senders(&mut a, 16);
        for i in 0..400 {
            a.note_ce(&s[i % 16], true);
        }
        load_link(&mut a, 1_000, 13 * RTT, 500);
        assert_eq!(a.fabric_kept_permille, FABRIC_KEPT_MIN_PERMILLE);
        for i in 0..400 {
            a.note_ce(&s[i % 16], false);
        }
        // 3 % of the line back per base RTT: in ten RTTs nine or ten
        // rounds (a round ends at the first packet a full RTT after the
        // last), 27-30 % more.
        load_link(&mut a, 13 * RTT, 23 * RTT, 500);
        let kept = a.fabric_kept_permille;
        assert!((520..=550).contains(&kept), "{kept}");
        load_link(&mut a, 23 * RTT, 60 * RTT, 500);
        assert_eq!(a.fabric_kept_permille, 1000);
    }

    #[test]
    fn the_per_sender_fabric_term_cuts_only_the_senders_whose_packets_are_marked() {
        // 20 senders; the first 15 cross an over-committed uplink (every
        // packet marked), the last 5 share the receiver's leaf (none).
        // `bar`: the per-sender term's bar (1000: off); `rtts` base RTTs
        // of the link carrying `load_permille` of its line. The grants of
        // a marked sender and of an unmarked one, Mbit/s.
        let grants = |bar: u32, load_permille: u64, rtts: u64| {
            let mut a = adm().with_sender_mark_bar(bar);
            let mut s = senders(&mut a, 20);
            for _ in 0..8 {
                for (i, x) in s.iter().enumerate() {
                    a.note_ce(x, i < 15);
                }
            }
            load_link(&mut a, 1_000, 1_000 + rtts * RTT, load_permille);
            let t = 2_000 + rtts * RTT;
            for x in s.iter_mut() {
                a.grant_mbps(x, t);
            }
            (
                a.grant_mbps(&mut s[0], t + 2 * RTT),
                a.grant_mbps(&mut s[19], t + 2 * RTT),
            )
        };
        // Three quarters of the arrivals marked: the device-wide share
        // is past half, so with the term off every grant is cut alike.
        let (marked, unmarked) = grants(1000, 500, 4);
        assert_eq!(marked, unmarked);
        assert!(marked < 4_875, "{marked}");
        // Per sender: each round cuts what a marked sender keeps by half
        // its share of marks (nine in ten after eight marked packets), to
        // a quarter of its fair share; the unmarked keep theirs whole (the
        // line over 20, less the CE headroom).
        let fair = grants(100, 500, 0).1;
        assert!((4_800..=5_000).contains(&fair), "{fair}");
        let (marked, unmarked) = grants(100, 500, 1);
        assert!(
            marked * 10 <= fair * 6 && unmarked == fair,
            "{marked} {unmarked}"
        );
        let (marked, unmarked) = grants(100, 500, 6);
        assert_eq!((marked, unmarked), (fair / 4, fair));
        // The link full: the marks may be its own queue's; no cut.
        assert_eq!(grants(100, 1000, 6), (fair, fair));
    }

    #[test]
    fn a_sender_cut_by_the_per_sender_term_regains_its_share_when_its_marks_stop() {
        let mut a = adm().with_sender_mark_bar(100);
        let mut s = senders(&mut a, 16);
        // Base RTTs `from..to` of a half-full link, each bringing a
        // packet of every sender, marked or not.
        let rounds =
            |a: &mut Admission, s: &mut [SenderState], from: u64, to: u64, marked: bool| {
                for r in from..to {
                    let t = r * RTT;
                    load_link(a, t, t + RTT, 500);
                    for (c, x) in s.iter_mut().enumerate() {
                        a.on_data(x, c as u32, t + RTT, (t + RTT) as u32, true, false);
                        a.note_ce(x, marked);
                        a.grant_mbps(x, t + RTT);
                    }
                }
            };
        rounds(&mut a, &mut s, 1, 13, true);
        // A quarter of its fair share: the line over 16, less the 2.5 %
        // the grants leave while every packet arrives marked (6,094).
        let cut = a.grant_mbps(&mut s[0], 14 * RTT);
        assert_eq!(cut, 6_094 / 4);
        // Once the marks stop and its share of them falls under the bar
        // (eight unmarked packets), 3 % of the share back per base RTT:
        // half of it back within 20 RTTs, all within 36.
        rounds(&mut a, &mut s, 14, 34, false);
        let half = a.grant_mbps(&mut s[0], 34 * RTT);
        assert!((3_125..6_250).contains(&half), "{half}");
        rounds(&mut a, &mut s, 34, 50, false);
        assert_eq!(a.grant_mbps(&mut s[0], 50 * RTT), 6_250);
    }

    /// Sixteen newcomers from 1 µs, their first packets back to back on
    /// the link into the device (a 4 KB packet every 330 ns at 100 Gb/s):
    /// a queue may stand behind them. Returns them and the last arrival.
    /// (The endpoint tells admission of each datagram before its data.)
    fn sixteen_newcomers_back_to_back(a: &mut Admission) -> ([SenderState; 16], u64) {
        let mut s = [SenderState::default(); 16];
        let mut t = 1_000;
        for (c, st) in s.iter_mut().enumerate() {
            t += 330;
            a.note_arrival(t, 4096);
            a.on_data(st, c as u32, t, t as u32, true, false);
        }
        (s, t)
    }

    #[test]
    fn newcomers_leave_room_until_the_link_into_the_device_is_seen_idle() {
        let mut a = adm();
        // Packets keep coming back to back after them.
        let (mut s, mut t) = sixteen_newcomers_back_to_back(&mut a);
        for _ in 0..3 {
            for (c, st) in s.iter_mut().enumerate() {
                a.on_data(st, c as u32, t, t as u32, true, false);
                a.grant_mbps(st, t);
            }
            for _ in 0..60 {
                t += 330;
                a.note_arrival(t, 4096);
            }
        }
        let g = a.grant_mbps(&mut s[0], t);
        assert_eq!(u64::from(g), 95_000u64.div_ceil(16), "draining");
        // A datagram after a silence: the queue is gone. The headroom
        // comes back to every sender at once, pushed, not at its next
        // packet's ACK.
        let d = t + 10_000;
        seen_idle(&mut a, d);
        assert!(a.regrant_deadline().is_some_and(|at| at <= d));
        let mut out = Vec::new();
        a.take_regrants(d, &mut out);
        assert_eq!(out.len(), 16, "{out:?}");
        assert_eq!(
            u64::from(a.grant_mbps(&mut s[0], d)),
            100_000u64.div_ceil(16)
        );
        // A newcomer: room again until the link is next seen idle.
        let mut late = SenderState::default();
        a.on_data(&mut late, 16, d + RTT, (d + RTT) as u32, true, false);
        assert!(a.draining());
        seen_idle(&mut a, d + 2 * RTT);
        assert!(!a.draining());
    }

    #[test]
    fn slack_spread_evenly_over_a_round_trip_shows_the_link_idle() {
        // Sixteen newcomers, then their paced packets at `load_permille`
        // of the line, evenly: no gap between two packets is ever as long
        // as a packet, so only the load over a round trip can show that
        // the link idled.
        let draining_after = |load_permille: u64| {
            let mut a = adm();
            let (_, t) = sixteen_newcomers_back_to_back(&mut a);
            load_link(&mut a, t + 330, t + 3 * RTT, load_permille);
            a.draining()
        };
        // 10 % of the line free: idle for three packets' time a round trip.
        assert!(!draining_after(900));
        // The line full (a queue may stand): the drain headroom stays.
        assert!(draining_after(1000));
    }

    /// Eight senders (connections 0-7), each granted its share by three
    /// rounds of ACKs; returns them and the time of the last round.
    fn eight_settled_senders(a: &mut Admission) -> ([SenderState; 8], u64) {
        let mut s = [SenderState::default(); 8];
        let mut t = 0;
        for _ in 0..3 {
            t += 2 * RTT;
            for (c, st) in s.iter_mut().enumerate() {
                a.on_data(st, c as u32, t, t as u32, true, false);
            }
            seen_idle(a, t + 1);
            for st in s.iter_mut() {
                assert!(a.grant_mbps(st, t + 1) > 0);
            }
        }
        (s, t)
    }

    #[test]
    fn room_released_by_finished_senders_is_pushed_to_the_rest() {
        let mut a = adm();
        let (mut s, t) = eight_settled_senders(&mut a);
        assert_eq!(a.grant_mbps(&mut s[7], t), 100_000 / 8);
        // Six finish.
        for (c, st) in s.iter_mut().enumerate().take(6) {
            a.on_data(st, c as u32, t + 100, (t + 100) as u32, true, true);
        }
        // Their grants are still promised for a base RTT: nothing to push.
        let mut out = Vec::new();
        a.take_regrants(t + 200, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // Once released, the two left are told at once, not at their next
        // packet's ACK, and their ACKs grant half the link each.
        let d = a.regrant_deadline().expect("room is coming");
        assert_eq!(d, t + 100 + RTT);
        a.take_regrants(d, &mut out);
        assert_eq!(out, vec![6, 7]);
        assert_eq!(a.grant_mbps(&mut s[6], d), 50_000);
        assert_eq!(a.grant_mbps(&mut s[7], d), 50_000);
        // Nothing more to give.
        out.clear();
        a.take_regrants(d + RTT, &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    /// Every push due by `until_ns`, each at its deadline, as a device's
    /// timer would run them.
    fn regrants_until(a: &mut Admission, until_ns: u64, out: &mut Vec<u32>) {
        while let Some(d) = a.regrant_deadline().filter(|&d| d <= until_ns) {
            a.take_regrants(d, out);
        }
    }

    #[test]
    fn a_newcomer_held_below_its_share_is_raised_within_a_base_rtt() {
        let mut a = adm();
        let (mut s, mut t) = eight_settled_senders(&mut a);
        // A late newcomer (its first packet lost on the way, say) finds
        // the budget spent: a quarter of a ninth of the link, at first.
        let mut out = Vec::new();
        a.take_regrants(t + 1, &mut out);
        assert!(out.is_empty(), "{out:?}");
        let fair_of_nine = 100_000u32.div_ceil(9);
        let mut x = SenderState::default();
        t += 1_000;
        a.on_data(&mut x, 8, t, t as u32, true, false);
        seen_idle(&mut a, t + 1);
        assert_eq!(a.grant_mbps(&mut x, t + 1), fair_of_nine / 4);
        // Within a base RTT it is pushed its whole share, although none of
        // the eight has been told of its cut yet.
        let d = t + 1 + RTT;
        regrants_until(&mut a, d, &mut out);
        assert_eq!(out, vec![8]);
        assert_eq!(a.grant_mbps(&mut x, d), fair_of_nine);
        // The link is now over-promised by a share until the cuts are
        // released: a second late newcomer waits for them.
        let fair_of_ten = 100_000u32.div_ceil(10);
        let mut y = SenderState::default();
        a.on_data(&mut y, 9, d + 10, (d + 10) as u32, true, false);
        seen_idle(&mut a, d + 11);
        assert_eq!(a.grant_mbps(&mut y, d + 11), fair_of_ten / 4);
        out.clear();
        regrants_until(&mut a, d + 10 + 2 * RTT, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // The others are cut at their next ACKs; a base RTT later the cuts
        // are released and y is raised too.
        let cut_ns = d + 10 + 2 * RTT;
        for st in s.iter_mut() {
            assert_eq!(a.grant_mbps(st, cut_ns), fair_of_ten);
        }
        assert_eq!(a.grant_mbps(&mut x, cut_ns), fair_of_ten);
        regrants_until(&mut a, cut_ns + RTT, &mut out);
        assert_eq!(out, vec![9]);
        assert_eq!(a.grant_mbps(&mut y, cut_ns + RTT), fair_of_ten);
    }

    #[test]
    fn a_drained_senders_late_tail_does_not_count_it_again() {
        let mut a = adm();
        let (mut x, mut y) = (SenderState::default(), SenderState::default());
        a.on_data(&mut x, 0, 100, 100, true, false);
        a.on_data(&mut y, 0, 100, 100, true, false);
        a.grant_mbps(&mut y, 110);
        seen_idle(&mut a, 1_000);
        // x's last packet (sent at 5,000) overtakes two of its packets sent
        // just before it on slower paths.
        a.on_data(&mut x, 0, 6_000, 5_000, true, true);
        a.on_data(&mut x, 0, 6_300, 4_900, true, false);
        a.on_data(&mut x, 0, 6_400, 4_950, false, false);
        assert_eq!(a.grant_mbps(&mut y, 6_500), 0, "y is alone");
        // x's next message, sent after it said it was drained, counts.
        a.on_data(&mut x, 0, 9_000, 8_000, true, false);
        assert_eq!(a.grant_mbps(&mut y, 9_100), 50_000);
    }

    #[test]
    fn an_incast_never_commits_much_more_than_the_link() {
        let mut a = adm();
        let mut s: Vec<SenderState> = vec![SenderState::default(); 64];
        let mut t = 0;
        // Senders appear one by one, each getting a grant at once (its first
        // packet's ACK).
        let mut total_first_round = 0u64;
        for st in s.iter_mut() {
            t += 300;
            a.on_data(st, 0, t, t as u32, true, false);
            let g = a.grant_mbps(st, t);
            total_first_round += if g == 0 {
                LINE / 1_000_000
            } else {
                u64::from(g)
            };
        }
        // The harmonic sum would be 4.7 lines; the budget keeps it near 1.
        assert!(
            total_first_round < 2 * LINE / 1_000_000,
            "{total_first_round}"
        );
        seen_idle(&mut a, t + 1);
        // The next round of ACKs cuts the first sender to its share; an RTT
        // after that, every sender has its fair share.
        for _ in 0..2 {
            t += 2 * RTT;
            for st in s.iter_mut() {
                a.on_data(st, 0, t, t as u32, true, false);
            }
            for st in s.iter_mut() {
                a.grant_mbps(st, t);
            }
        }
        let grants: Vec<u32> = s.iter_mut().map(|st| a.grant_mbps(st, t)).collect();
        assert!(
            grants.iter().all(|&g| g == 100_000u32.div_ceil(64)),
            "{grants:?}"
        );
        // Silent senders are forgotten after an epoch.
        let mut last = SenderState::default();
        a.on_data(&mut last, 0, t + 200_000, (t + 200_000) as u32, true, false);
        assert_eq!(a.live, 1);
        assert_eq!(a.grant_mbps(&mut last, t + 200_000 + RTT), 0);
    }

    #[test]
    fn a_standing_queue_scales_grants_down() {
        let mut a = adm();
        let (mut x, mut y) = (SenderState::default(), SenderState::default());
        a.on_data(&mut x, 0, 1_000, 1_000, true, false);
        a.on_data(&mut y, 0, 1_000, 1_000, true, false);
        a.grant_mbps(&mut x, 1_000);
        a.grant_mbps(&mut y, 1_000);
        let clear = a.grant_mbps(&mut y, 1_000 + 2 * RTT);
        // Packets now arrive 2 RTTs later than their base one-way delay.
        for k in 0..64 {
            let t = 40_000 + k * 100;
            a.on_data(&mut x, 0, t + 2 * RTT, t as u32, true, false);
            a.on_data(&mut y, 0, t + 2 * RTT, t as u32, true, false);
        }
        let queued = a.grant_mbps(&mut y, 40_000 + 10_000 + 2 * RTT);
        assert!(queued < clear, "{queued} !< {clear}");
    }

    #[test]
    fn one_way_delays_use_each_senders_own_clock() {
        let mut a = adm();
        let mut x = SenderState::default();
        // The sender's clock is far ahead of ours and wraps: no queue seen.
        for k in 0..32u64 {
            let now = 1_000_000 + k * 1_000;
            a.on_data(
                &mut x,
                0,
                now,
                (now as u32).wrapping_add(0xffff_0000),
                true,
                false,
            );
        }
        assert_eq!(a.qdelay_ns, 0);
    }
}
