//! perftest's software rate limiter (`--rate_limit`, `--rate_units`,
//! `--burst_size`, `--rate_limit_type SW`): the requester of a bandwidth
//! test posts its work requests in bursts, and a burst waits until the
//! messages before it have had their time at the rate. There is no NIC
//! here to pace packets (perftest's `HW` and `PP` limiters), so pacing
//! the posts is the only limiter; it is the client's own choice and never
//! travels to the server.

use crate::{Measure, Params};

/// What `--rate_limit` counts (perftest's `--rate_units`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateUnits {
    /// `M`: MiB/s, 2^20 bytes per second (perftest's "MiBps", computed
    /// with 1048576 as perftest does; the unit the table reports without
    /// `--report_gbits`).
    MiBps,
    /// `g`: Gb/s, 10^9 bits per second (perftest's default).
    #[default]
    Gbps,
    /// `p`: messages (work requests) per second. perftest calls it "pps"
    /// and its limiter counts work requests, not wire packets (a message
    /// larger than the MTU is one of them).
    MsgPerS,
}

impl RateUnits {
    /// The unit named by perftest's letter (`M`, `g` or `p`).
    pub fn from_flag(s: &str) -> Option<Self> {
        match s {
            "M" => Some(Self::MiBps),
            "g" => Some(Self::Gbps),
            "p" => Some(Self::MsgPerS),
            _ => None,
        }
    }

    /// perftest's letter for the unit.
    pub fn flag(self) -> &'static str {
        match self {
            Self::MiBps => "M",
            Self::Gbps => "g",
            Self::MsgPerS => "p",
        }
    }

    /// The unit as a reader spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::MiBps => "MiB/s",
            Self::Gbps => "Gb/s",
            Self::MsgPerS => "messages/s",
        }
    }
}

/// The requester's software rate limiter: at most `rate` (in `units`),
/// posted in bursts of `burst` messages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// The most the requester sends, in `units`: finite, above 0.
    pub rate: f64,
    /// What `rate` counts.
    pub units: RateUnits,
    /// Messages posted back to back before the limiter waits
    /// (`--burst_size`); `None`: the post list (`-l`), at most
    /// [`max_burst`](Self::max_burst).
    pub burst: Option<u32>,
}

impl RateLimit {
    /// The largest burst a run of `p` takes: every work request it can
    /// have outstanding at once (`-t` on each of `-q` QPs); a larger one
    /// could not go back to back.
    pub fn max_burst(p: &Params) -> u64 {
        u64::from(p.tx_depth) * u64::from(p.qps)
    }

    /// The burst in force for a run of `p` posting as `m` does.
    pub fn burst_for(&self, p: &Params, m: &Measure) -> u64 {
        u64::from(self.burst.unwrap_or(m.post_list)).clamp(1, Self::max_burst(p).max(1))
    }

    /// Messages per second the limit allows for messages of `size` bytes.
    pub fn msgs_per_s(&self, size: u64) -> f64 {
        let size = size.max(1) as f64;
        match self.units {
            RateUnits::MiBps => self.rate * (1u64 << 20) as f64 / size,
            RateUnits::Gbps => self.rate * 1e9 / 8.0 / size,
            RateUnits::MsgPerS => self.rate,
        }
    }

    /// Check the values against a run of `p`; the error is one line
    /// naming the option.
    pub fn validate(&self, p: &Params) -> Result<(), String> {
        if !self.rate.is_finite() || self.rate <= 0.0 {
            return Err(format!(
                "--rate_limit {} must be a finite number above 0 (in --rate_units, {} here)",
                self.rate,
                self.units.name()
            ));
        }
        let max = Self::max_burst(p);
        if let Some(b) = self.burst
            && !(1..=max).contains(&u64::from(b))
        {
            return Err(format!(
                "--burst_size {b} must be 1..={max} (-t {} x -q {}: the work requests that can be outstanding at once)",
                p.tx_depth, p.qps
            ));
        }
        // A rate so low that one message would wait past any run (or so
        // high that a message takes under a nanosecond) is a typo, not a
        // measurement.
        let msg_ns = 1e9 / self.msgs_per_s(p.size);
        if !(msg_ns.is_finite() && msg_ns <= MAX_MSG_NS) {
            let message = match self.units {
                RateUnits::MsgPerS => "message".to_string(),
                _ => format!("{}-byte message", p.size),
            };
            return Err(format!(
                "--rate_limit {} {}: one {message} every {:.0} s; the limiter waits at most {} s between messages",
                self.rate,
                self.units.name(),
                msg_ns / 1e9,
                MAX_MSG_NS / 1e9
            ));
        }
        Ok(())
    }
}

/// Longest time one message may be owed at the limit: an hour, the
/// longest run (`-D 3600`).
const MAX_MSG_NS: f64 = 3600e9;

/// How long before a burst is due the posting loop stops sleeping and
/// polls instead: a sleep in `ppoll` ends up to the kernel's timer slack
/// (50 us by default) late, and time lost to a late wake-up is not made up
/// (see [`Pacer::posted`]), so a late wake-up on every burst would lower
/// the rate below the limit.
pub(crate) const WAKE_EARLY_NS: u64 = 100_000;

/// The schedule of a rate-limited posting loop: a burst of messages may
/// start once the clock has reached `next_post_ns`, the time by which the
/// messages posted so far have had their share of the rate; each posted
/// message moves it on by one message's time at the rate.
///
/// Time not used is not banked: a message posted after `next_post_ns`
/// (the loop was late, or waited for completions) moves the schedule on
/// from its own post time. So over any window of `T` ns the loop posts at
/// most `T / msg_ns + burst` messages: the rate, plus one burst.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    /// One message's time at the rate, ns (fractional: a small message at
    /// a high rate takes a fraction of a nanosecond's rounding each, which
    /// would add up over millions).
    msg_ns: f64,
    /// Messages per burst.
    burst_msgs: u64,
    /// When the next burst may start, ns on [`metaroce_udp::now_ns`]'s
    /// clock.
    next_post_ns: f64,
    /// Messages the burst under way may still post (0: none under way).
    left_in_burst: u64,
}

impl Pacer {
    /// A schedule for `limit` on a run of `p` posting as `m` does, whose
    /// first burst may go at `start_ns`.
    pub(crate) fn new(limit: &RateLimit, p: &Params, m: &Measure, start_ns: u64) -> Self {
        Self {
            msg_ns: 1e9 / limit.msgs_per_s(p.size),
            burst_msgs: limit.burst_for(p, m),
            next_post_ns: start_ns as f64,
            left_in_burst: 0,
        }
    }

    /// Messages that may be posted at `now_ns`: what is left of the burst
    /// under way, a whole new burst if one is due, else 0.
    pub(crate) fn allowed(&mut self, now_ns: u64) -> u64 {
        if self.left_in_burst == 0 && now_ns as f64 >= self.next_post_ns {
            self.left_in_burst = self.burst_msgs;
        }
        self.left_in_burst
    }

    /// `n` messages (at most [`allowed`](Self::allowed)) were posted by a
    /// pass of the posting loop that began at `now_ns` (when it asked
    /// `allowed`).
    pub(crate) fn posted(&mut self, n: u64, now_ns: u64) {
        if n == 0 {
            return;
        }
        debug_assert!(
            n <= self.left_in_burst,
            "{n} posted, {} allowed",
            self.left_in_burst
        );
        self.left_in_burst = self.left_in_burst.saturating_sub(n);
        // From the later of the schedule and the post: a late post does not
        // earn the time it missed (that would let a burst follow the last
        // one closer than the rate allows).
        self.next_post_ns = self.next_post_ns.max(now_ns as f64) + n as f64 * self.msg_ns;
    }

    /// How long the loop may sleep waiting for completions at `now_ns`,
    /// at most `cap_ns`: until shortly before the next burst is due, or
    /// `cap_ns` while a burst is under way (what it waits for then is
    /// room in a QP, which a completion brings).
    pub(crate) fn max_wait_ns(&self, now_ns: u64, cap_ns: u64) -> u64 {
        if self.left_in_burst > 0 {
            return cap_ns;
        }
        let due_in_ns = (self.next_post_ns - now_ns as f64).max(0.0) as u64;
        due_in_ns.saturating_sub(WAKE_EARLY_NS).min(cap_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(size: u64) -> Params {
        Params {
            size,
            iters: 5000,
            duration_s: 0,
            qps: 2,
            tx_depth: 64,
            verify: true,
            mtu: 0,
            paths: 16,
            pattern_seed: 1,
            run_infinitely: false,
            buffer_bytes: None,
        }
    }

    fn limit(rate: f64, units: RateUnits) -> RateLimit {
        RateLimit {
            rate,
            units,
            burst: None,
        }
    }

    #[test]
    fn units_are_perftests() {
        assert_eq!(RateUnits::default(), RateUnits::Gbps);
        for u in [RateUnits::MiBps, RateUnits::Gbps, RateUnits::MsgPerS] {
            assert_eq!(RateUnits::from_flag(u.flag()), Some(u));
        }
        assert_eq!(RateUnits::from_flag("G"), None);
        // 1 Gb/s of 1000-byte messages: 125,000 a second.
        assert_eq!(limit(1.0, RateUnits::Gbps).msgs_per_s(1000), 125_000.0);
        // 1 MiB/s of 1 KiB messages: 1024 a second.
        assert_eq!(limit(1.0, RateUnits::MiBps).msgs_per_s(1024), 1024.0);
        // p counts messages whatever their size.
        assert_eq!(limit(500.0, RateUnits::MsgPerS).msgs_per_s(1 << 20), 500.0);
    }

    #[test]
    fn the_burst_defaults_to_the_post_list_within_what_can_be_outstanding() {
        let p = params(4096);
        let m = Measure::default();
        assert_eq!(limit(1.0, RateUnits::Gbps).burst_for(&p, &m), 32);
        let m1 = Measure {
            post_list: 1000,
            ..m
        };
        assert_eq!(limit(1.0, RateUnits::Gbps).burst_for(&p, &m1), 128);
        let b = RateLimit {
            burst: Some(5),
            ..limit(1.0, RateUnits::Gbps)
        };
        assert_eq!(b.burst_for(&p, &m), 5);
    }

    #[test]
    fn bad_values_are_refused_naming_the_option() {
        let p = params(65_536);
        for r in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = limit(r, RateUnits::Gbps).validate(&p).unwrap_err();
            assert!(err.starts_with("--rate_limit"), "{err}");
        }
        for b in [0, 129] {
            let err = RateLimit {
                burst: Some(b),
                ..limit(1.0, RateUnits::Gbps)
            }
            .validate(&p)
            .unwrap_err();
            assert!(err.starts_with(&format!("--burst_size {b}")), "{err}");
        }
        let err = limit(1e-9, RateUnits::MsgPerS).validate(&p).unwrap_err();
        assert!(err.starts_with("--rate_limit"), "{err}");
        assert!(limit(0.5, RateUnits::MsgPerS).validate(&p).is_ok());
        assert!(
            RateLimit {
                burst: Some(128),
                ..limit(25.0, RateUnits::Gbps)
            }
            .validate(&p)
            .is_ok()
        );
    }

    /// A loop that polls at the times `ticks` gives it and posts all it may
    /// (at most `room` a poll): over every window, at most the rate plus
    /// one burst.
    fn run(pacer: &mut Pacer, ticks: impl Iterator<Item = u64>, room: u64) -> Vec<(u64, u64)> {
        let mut posts = Vec::new();
        for now in ticks {
            let n = pacer.allowed(now).min(room);
            pacer.posted(n, now);
            if n > 0 {
                posts.push((now, n));
            }
        }
        posts
    }

    /// The most messages posted in any window of `window_ns` starting at
    /// a post.
    fn most_in_any_window(posts: &[(u64, u64)], window_ns: u64) -> u64 {
        let (mut best, mut sum, mut end) = (0, 0, 0);
        for (i, &(t0, _)) in posts.iter().enumerate() {
            while end < posts.len() && posts[end].0 < t0 + window_ns {
                sum += posts[end].1;
                end += 1;
            }
            best = best.max(sum);
            sum -= posts[i].1;
        }
        best
    }

    #[test]
    fn bursts_go_back_to_back_then_wait_their_time() {
        // 1000 messages/s in bursts of 4: 4 ms a burst.
        let l = RateLimit {
            burst: Some(4),
            ..limit(1000.0, RateUnits::MsgPerS)
        };
        let mut pacer = Pacer::new(&l, &params(64), &Measure::default(), 0);
        assert_eq!(pacer.allowed(0), 4);
        pacer.posted(4, 0);
        assert_eq!(pacer.allowed(1), 0);
        assert_eq!(pacer.max_wait_ns(0, u64::MAX), 4_000_000 - WAKE_EARLY_NS);
        assert_eq!(pacer.allowed(3_999_999), 0);
        assert_eq!(pacer.allowed(4_000_000), 4);
        // Part of a burst (a full QP): the rest stays allowed, and the
        // loop sleeps only as long as a completion takes.
        pacer.posted(1, 4_000_000);
        assert_eq!(pacer.allowed(4_000_001), 3);
        assert_eq!(pacer.max_wait_ns(4_000_001, 777), 777);
    }

    #[test]
    fn a_late_loop_does_not_make_up_the_time() {
        let l = RateLimit {
            burst: Some(2),
            ..limit(1000.0, RateUnits::MsgPerS)
        };
        let mut pacer = Pacer::new(&l, &params(64), &Measure::default(), 0);
        let first = pacer.allowed(0);
        pacer.posted(first, 0);
        // Due at 2 ms, polled at 10 ms: one burst now, the next 2 ms later.
        assert_eq!(pacer.allowed(10_000_000), 2);
        pacer.posted(2, 10_000_000);
        assert_eq!(pacer.allowed(10_000_001), 0);
        assert_eq!(pacer.allowed(11_999_999), 0);
        assert_eq!(pacer.allowed(12_000_000), 2);
    }

    #[test]
    fn no_window_gets_more_than_the_rate_and_one_burst() {
        // 2 Gb/s of 64 KiB messages in bursts of 8 (one every ~2.1 ms),
        // polled at irregular times (a noisy host), with room for at most
        // 3 messages a poll at times (full QPs).
        let l = RateLimit {
            burst: Some(8),
            ..limit(2.0, RateUnits::Gbps)
        };
        let p = params(65_536);
        let msg_ns = 1e9 / l.msgs_per_s(p.size);
        let mut pacer = Pacer::new(&l, &p, &Measure::default(), 1_000);
        let mut x = 12_345u64;
        let ticks = (0..200_000u64).scan(1_000u64, |t, i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *t += 1 + x % 20_000 + if i % 9973 == 0 { 5_000_000 } else { 0 };
            Some(*t)
        });
        let room = 3;
        let posts = run(&mut pacer, ticks, room);
        let total: u64 = posts.iter().map(|&(_, n)| n).sum();
        let span = posts.last().unwrap().0 - posts[0].0;
        assert!(total > 1000, "{total}");
        for window_ns in [100_000, 2_000_000, 10_000_000, 100_000_000, span] {
            let most = most_in_any_window(&posts, window_ns);
            let bound = (window_ns as f64 / msg_ns).ceil() as u64 + 8;
            assert!(most <= bound, "{most} in {window_ns} ns, bound {bound}");
        }
        // Nor does it fall far below the rate when polled often enough.
        let rate = total as f64 / (span as f64 / 1e9) * p.size as f64 * 8.0;
        assert!(rate > 1.5e9 && rate <= 2.0e9 * 1.01, "{rate}");
    }
}
