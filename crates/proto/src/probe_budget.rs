//! The device's budget for speculative packets: tail-loss probes, and the
//! resend elsewhere of a silent connection's lone packet.
//!
//! A tail-loss probe fires when a path's packets go unanswered for a probe
//! timeout, with no evidence of loss. Usually that silence is a lost tail;
//! but when a device opens many connections at once (an all-to-all posts a
//! message to every peer), the first packets meet ECMP collisions and
//! queues deeper than any timeout computed from a base RTT, and many
//! connections probe together, each probe a full copy queued at the links
//! that are the bottleneck. In a 4 KB all-to-all over 1024 hosts (ACKs
//! already sent first, transport.md section 3) 83,421 packets went twice
//! and the makespan was 438 µs. One connection cannot tell a queue from a
//! loss before its first answer, but the device can bound what it spends
//! on guesses: with the budget, 1,635 resends and 407.5 µs.
//!
//! So speculative packets draw on one budget per device, a share of its
//! line rate (`probe_share_permille`): a few may go at once (a burst of
//! [`BURST_PACKETS`]), later ones are scheduled at the budget's rate, and a
//! guess that could not go within [`HORIZON_BASE_RTTS`] base RTTs is
//! refused (the path asks again a probe timeout later; its RTO remains the
//! backstop).
//!
//! The share is a quarter of the line (`probe_share_permille` = 250), and
//! it binds unless the device has seen a loss within
//! [`LOSS_MEMORY_BASE_RTTS`] base RTTs *and* losses are common there (the
//! caller says so: the device loses at least [`GUESS_LOSS_RATE`] of its
//! packets, `DeviceState::guesses_pay`). Where SACK gaps prove
//! packets are being lost that often, a silence is likely a lost tail and
//! the probe pays for itself: a 128-host all-to-all of 64 KB per pair at
//! 5 %/link reached 2.38 GB/s bus bandwidth with the budget always on and
//! 3.48 GB/s with it open on loss (3.66 before the budget); at 1 %/link a
//! share of 1/16 always on had turned 27 RTOs into 2,639. Where nothing is
//! lost, silences are queues; and where little is (the same all-to-all at
//! 0.1 %/link, a loss every few µs across the device but one packet in 170),
//! most silences are still queues: opened by every loss, the budget let
//! guesses into queues already 30 µs deep (22,447 resends for 1,205
//! losses), they filled the core's 1 MB buffers (3,638 drops), and the run
//! took 1.45 times the loss-free one (seed 1). Kept metered: 846 µs, 1.09
//! times, with 3,009 resends and no drop (but 985 RTOs, where a refused
//! guess left a lost tail to the RTO).

/// The share of its packets a device must be losing for its guesses to go
/// unmetered (while it sees losses): 5 %. Below it, in an all-to-all,
/// most silences are queues: the fabric's busiest uplinks (hashing loads
/// some more than the rest) hold queues deeper than a probe timeout, and
/// unmetered guesses into them added to them until they overflowed. The
/// 128-host all-to-all of 64 KB per pair (`metaroce sim FILE -q --seed
/// N`, FILE `scenarios/claims/ft128-alltoall.toml` with the loss under
/// `[switch]`; seeds 1-4, mean makespan) with the bar at 2 % (that of
/// `replacement_ports::RANDOM_LOSS_FOR_BURSTS`, 3 % of packets lost at
/// 0.5 %/link) against 5 %: 0.3 %/link 912.4 against 872.1 µs, 0.5 %
/// 1,073.2 against 942.8, 0.7 % 953.4 against 888.5, 1 % (seeds 1-8)
/// 934.2 against 918.5, 3 % end to end 1,163.4 against 1,011.8; 2 %/link
/// (11 % of packets lost) 1,064.6 against 1,077.9, its spread. Refused
/// guesses leave more lost tails to RTOs (1 %/link: 127 per run against
/// 1; the RTO is the backstop the budget always had). The permutations,
/// whose silences are rarer, did not move (0.3 % and 0.5 %/link, 3 % end
/// to end).
pub(crate) const GUESS_LOSS_RATE: f64 = 0.05;

/// Packets the budget lets go back to back after it was idle.
pub(crate) const BURST_PACKETS: u64 = 4;
/// How far ahead, in base RTTs, the budget takes reservations: beyond
/// that, the answer to the first packets will have come first.
pub(crate) const HORIZON_BASE_RTTS: u64 = 4;

/// How long, in base RTTs, a loss seen keeps the budget open.
pub(crate) const LOSS_MEMORY_BASE_RTTS: u64 = 32;

/// What the budget says to a speculative packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeGrant {
    /// Send it now.
    Now,
    /// Send it at this time (its share is reserved).
    At(u64),
    /// Not now: ask again later.
    Refused,
}

/// A token bucket, kept as the time from which its share is free.
#[derive(Debug, Clone)]
pub(crate) struct ProbeBudget {
    /// Rate of the share, bit/s; 0: no limit.
    rate_bps: u64,
    burst_ns: u64,
    horizon_ns: u64,
    /// Until when the share is spent.
    busy_until_ns: u64,
    loss_memory_ns: u64,
    /// Until when a loss seen keeps the budget open.
    open_until_ns: u64,
}

impl ProbeBudget {
    /// A budget of `share_permille` of `line_rate_bps` for packets of
    /// `packet_bytes` (0 per mille: unlimited).
    pub(crate) fn new(
        share_permille: u32,
        line_rate_bps: u64,
        packet_bytes: u64,
        base_rtt_ns: u64,
    ) -> Self {
        let rate_bps = (u128::from(line_rate_bps) * u128::from(share_permille) / 1000) as u64;
        let mut budget = Self {
            rate_bps,
            burst_ns: 0,
            horizon_ns: base_rtt_ns.saturating_mul(HORIZON_BASE_RTTS),
            busy_until_ns: 0,
            loss_memory_ns: base_rtt_ns.saturating_mul(LOSS_MEMORY_BASE_RTTS),
            open_until_ns: 0,
        };
        // The budget is idle back to `now - burst_ns`: that many packets'
        // shares are spent before `now`, and one more starts at `now`.
        budget.burst_ns = budget.duration_ns(packet_bytes.saturating_mul(BURST_PACKETS - 1));
        budget
    }

    /// Time `bytes` take at the budget's rate.
    fn duration_ns(&self, bytes: u64) -> u64 {
        if self.rate_bps == 0 {
            return 0;
        }
        let ns = u128::from(bytes) * 8_000_000_000 / u128::from(self.rate_bps);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// Where the next packet's share starts, from `now_ns`.
    fn start_ns(&self, now_ns: u64) -> u64 {
        self.busy_until_ns.max(now_ns.saturating_sub(self.burst_ns))
    }

    /// A packet was proved lost (a SACK gap) at `now_ns`.
    pub(crate) fn loss_seen(&mut self, now_ns: u64) {
        self.open_until_ns = now_ns.saturating_add(self.loss_memory_ns);
    }

    /// Whether the device proved a packet lost within the memory (32 base
    /// RTTs): the fabric is losing packets now.
    pub(crate) fn loss_seen_lately(&self, now_ns: u64) -> bool {
        now_ns < self.open_until_ns
    }

    /// Whether guesses go unmetered now: no limit, or losses seen lately
    /// where they are `common` enough for a silence to be one.
    fn open(&self, now_ns: u64, common: bool) -> bool {
        self.rate_bps == 0 || (common && self.loss_seen_lately(now_ns))
    }

    /// Ask to send a speculative packet of `bytes`.
    /// `losses_common`: the device loses packets often enough that a
    /// silence is likely a loss.
    pub(crate) fn reserve(&mut self, now_ns: u64, bytes: u64, losses_common: bool) -> ProbeGrant {
        if self.open(now_ns, losses_common) {
            return ProbeGrant::Now;
        }
        let start = self.start_ns(now_ns);
        if start > now_ns.saturating_add(self.horizon_ns) {
            return ProbeGrant::Refused;
        }
        self.busy_until_ns = start.saturating_add(self.duration_ns(bytes));
        if start <= now_ns {
            ProbeGrant::Now
        } else {
            ProbeGrant::At(start)
        }
    }

    /// Send `bytes` now if the share has room now; nothing is reserved
    /// otherwise.
    pub(crate) fn take_now(&mut self, now_ns: u64, bytes: u64, losses_common: bool) -> bool {
        if self.open(now_ns, losses_common) {
            return true;
        }
        let start = self.start_ns(now_ns);
        if start > now_ns {
            return false;
        }
        self.busy_until_ns = start.saturating_add(self.duration_ns(bytes));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device loses packets often enough for a silence to be one.
    const COMMON: bool = true;

    /// 1/16 of 100 Gb/s for 4 KB packets: one packet per 5.2 us.
    fn budget() -> ProbeBudget {
        ProbeBudget::new(62, 100_000_000_000, 4160, 10_000)
    }

    #[test]
    fn a_burst_goes_at_once_then_packets_are_spaced_at_the_share() {
        let mut b = budget();
        let t = 1_000_000;
        for _ in 0..BURST_PACKETS {
            assert_eq!(b.reserve(t, 4160, COMMON), ProbeGrant::Now);
        }
        let ProbeGrant::At(first) = b.reserve(t, 4160, COMMON) else {
            panic!("past the burst, a reservation");
        };
        let ProbeGrant::At(second) = b.reserve(t, 4160, COMMON) else {
            panic!("and another");
        };
        let gap = second - first;
        assert!((5_300..=5_400).contains(&gap), "gap {gap} ns");
        // The burst is spent: the next share starts one gap on (to the ns
        // the rounding of a burst's duration allows).
        assert!((first - t).abs_diff(gap) <= 2, "first at +{} ns", first - t);
    }

    #[test]
    fn nothing_is_reserved_past_the_horizon() {
        let mut b = budget();
        let t = 1_000_000;
        let mut at = 0;
        while let ProbeGrant::Now | ProbeGrant::At(_) = b.reserve(t, 4160, COMMON) {
            at += 1;
            assert!(at < 100, "the horizon bounds reservations");
        }
        // 4 base RTTs (40 us) of 5.4 us shares, after the burst.
        assert!((10..=14).contains(&at), "{at} granted");
        assert!(!b.take_now(t, 4160, COMMON));
        // The share refills with time.
        assert!(b.take_now(t + 200_000, 4160, COMMON));
    }

    #[test]
    fn a_loss_opens_the_budget_for_a_while_where_losses_are_common() {
        let mut b = budget();
        let t = 1_000_000;
        while b.take_now(t, 4160, COMMON) {}
        // Losses seen, but rare: silences are still mostly queues.
        b.loss_seen(t);
        assert!(b.loss_seen_lately(t));
        assert!(!b.take_now(t, 4160, !COMMON));
        assert_ne!(b.reserve(t, 4160, !COMMON), ProbeGrant::Now);
        // Common.
        for _ in 0..100 {
            assert_eq!(b.reserve(t, 4160, COMMON), ProbeGrant::Now);
        }
        // Metered again once the loss is old: a burst, then no more.
        let closed = t + 10_000 * LOSS_MEMORY_BASE_RTTS;
        let granted = (0..100)
            .filter(|_| b.take_now(closed, 4160, COMMON))
            .count();
        assert_eq!(granted as u64, BURST_PACKETS);
    }

    #[test]
    fn zero_share_is_unlimited() {
        let mut b = ProbeBudget::new(0, 100_000_000_000, 4160, 10_000);
        for _ in 0..1000 {
            assert_eq!(b.reserve(5, 4160, COMMON), ProbeGrant::Now);
            assert!(b.take_now(5, 4160, COMMON));
        }
    }
}
