//! What an `fi_cq_read` that finds nothing does with the CPU.
//!
//! MPI and most libfabric applications poll their completion queue in a
//! tight loop. On a host with a CPU to spare, the loop should spin: a
//! `sched_yield` there costs a system call and, when anything else is
//! runnable, a scheduler slice on the latency path. When two ranks (or a
//! rank and another busy thread) share one CPU, spinning starves the
//! thread the poller is waiting for, and giving the CPU away often is what
//! lets the peer answer.
//!
//! The polling thread tells the two apart by its own involuntary context
//! switches (`getrusage(RUSAGE_THREAD)`, `ru_nivcsw`), sampled once every
//! [`SAMPLE_EVERY`] polls: while the count rose since the previous sample,
//! something else wanted this thread's CPU, and every [`YIELD_EVERY`]th
//! empty poll in a row yields. A quiet sample switches yielding off again.
//! (A yield that hands the CPU over counts as an involuntary switch, so a
//! thread whose yields keep helping a peer keeps yielding; one whose
//! yields find nobody waiting stops.)
//!
//! A yield that took [`SLOW_YIELD`] or more gave the CPU to something that
//! kept it for a scheduler slice (a CPU hog, not a peer that answers in
//! microseconds): for the next [`BACKOFF_POLLS`] polls the thread yields
//! only every [`BACKOFF_YIELD_EVERY`]th empty poll in a row.
//!
//! The state is per thread, as the switch count is.

use std::cell::RefCell;
use std::time::{Duration, Instant};

/// A count of context switches, as `getrusage` gives it.
type Switches = libc::c_long;

/// Polls between two samples of the involuntary switch count.
pub(crate) const SAMPLE_EVERY: u64 = 128;
/// While contended, yield on every this-many-th empty poll in a row.
pub(crate) const YIELD_EVERY: u32 = 4;
/// A yield at least this long sends the thread into back-off.
pub(crate) const SLOW_YIELD: Duration = Duration::from_micros(500);
/// How many polls a back-off lasts.
pub(crate) const BACKOFF_POLLS: u64 = 16_384;
/// While backing off (and contended), yield on every this-many-th empty
/// poll in a row.
pub(crate) const BACKOFF_YIELD_EVERY: u32 = 64;

/// One thread's polling history.
#[derive(Debug)]
pub(crate) struct IdlePolicy {
    /// Polls so far (with or without completions).
    polls: u64,
    /// Empty polls in a row.
    empty_run: u32,
    /// Poll count at which the next sample is due.
    next_sample: u64,
    /// Involuntary switch count at the previous sample.
    last_nivcsw: Option<Switches>,
    /// The last sample saw the count rise.
    contended: bool,
    /// No frequent yields before this poll count.
    backoff_until: u64,
}

impl IdlePolicy {
    pub(crate) const fn new() -> Self {
        Self {
            polls: 0,
            empty_run: 0,
            next_sample: 0,
            last_nivcsw: None,
            contended: false,
            backoff_until: 0,
        }
    }

    /// A poll that handed out completions (or an error).
    pub(crate) fn on_work(&mut self) {
        self.polls = self.polls.wrapping_add(1);
        self.empty_run = 0;
    }

    /// A poll that found nothing; `sample` reads the thread's involuntary
    /// switch count (called only when a sample is due). Returns whether
    /// the thread should yield now.
    pub(crate) fn on_empty(&mut self, sample: impl FnOnce() -> Option<Switches>) -> bool {
        self.polls = self.polls.wrapping_add(1);
        self.empty_run = self.empty_run.wrapping_add(1);
        if self.polls >= self.next_sample {
            self.next_sample = self.polls.saturating_add(SAMPLE_EVERY);
            if let Some(now) = sample() {
                self.contended = self.last_nivcsw.is_some_and(|before| now > before);
                self.last_nivcsw = Some(now);
            }
        }
        if !self.contended {
            return false;
        }
        let every = if self.polls < self.backoff_until {
            BACKOFF_YIELD_EVERY
        } else {
            YIELD_EVERY
        };
        self.empty_run.is_multiple_of(every)
    }

    /// A yield took `took`.
    pub(crate) fn yielded(&mut self, took: Duration) {
        if took >= SLOW_YIELD {
            self.backoff_until = self.polls.saturating_add(BACKOFF_POLLS);
        }
    }

    /// Whether the thread is backing off from frequent yields.
    #[cfg(test)]
    fn backing_off(&self) -> bool {
        self.polls < self.backoff_until
    }
}

thread_local! {
    static POLICY: RefCell<IdlePolicy> = const { RefCell::new(IdlePolicy::new()) };
}

/// The calling thread's involuntary context switches so far.
fn involuntary_switches() -> Option<Switches> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `getrusage` writes a whole `struct rusage` to the pointer,
    // which points to room for one; it is read only after success.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) } == 0;
    // SAFETY: on success the kernel filled in the structure.
    ok.then(|| unsafe { ru.assume_init() }.ru_nivcsw)
}

/// Note a poll that handed something out.
pub(crate) fn note_work() {
    POLICY.with_borrow_mut(IdlePolicy::on_work);
}

/// Note a poll that found nothing, and yield the CPU if the policy says so.
pub(crate) fn note_empty() {
    let yield_now = POLICY.with_borrow_mut(|p| p.on_empty(involuntary_switches));
    if yield_now {
        let t0 = Instant::now();
        std::thread::yield_now();
        let took = t0.elapsed();
        POLICY.with_borrow_mut(|p| p.yielded(took));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `n` empty polls with the switch count given by `count(poll)`;
    /// returns how many of them yielded (each yield taking `took`).
    fn run(p: &mut IdlePolicy, n: u64, count: impl Fn(u64) -> Switches, took: Duration) -> u64 {
        let mut yields = 0;
        for _ in 0..n {
            let at = p.polls;
            if p.on_empty(|| Some(count(at))) {
                yields += 1;
                p.yielded(took);
            }
        }
        yields
    }

    #[test]
    fn quiet_thread_never_yields() {
        let mut p = IdlePolicy::new();
        assert_eq!(run(&mut p, 100_000, |_| 7, Duration::ZERO), 0);
    }

    #[test]
    fn rising_switches_yield_every_fourth_empty_poll() {
        let mut p = IdlePolicy::new();
        // The first sample only sets the baseline.
        let fast = Duration::from_micros(5);
        let y = run(&mut p, SAMPLE_EVERY, |_| 0, fast);
        assert_eq!(y, 0);
        // Preempted between every sample: a quarter of the polls yield.
        let n = 10 * SAMPLE_EVERY;
        let y = run(&mut p, n, |at| at as Switches, fast);
        assert!(y >= n / u64::from(YIELD_EVERY) - 1, "{y}");
        // Quiet again: no more yields after the next sample.
        run(&mut p, SAMPLE_EVERY, |_| 1 << 40, fast);
        assert_eq!(run(&mut p, 1000, |_| 1 << 40, fast), 0);
    }

    #[test]
    fn completions_restart_the_empty_run() {
        let mut p = IdlePolicy::new();
        run(&mut p, SAMPLE_EVERY, |_| 0, Duration::ZERO);
        let mut yields = 0;
        for i in 0..SAMPLE_EVERY * 4 {
            // Three empty polls, then work: never the fourth in a row.
            if i % 4 == 3 {
                p.on_work();
            } else if p.on_empty(|| Some(i as Switches)) {
                yields += 1;
            }
        }
        assert_eq!(yields, 0);
    }

    #[test]
    fn slow_yield_backs_off_for_a_while() {
        let mut p = IdlePolicy::new();
        run(&mut p, SAMPLE_EVERY, |_| 0, Duration::ZERO);
        let slow = Duration::from_millis(2);
        let fast = Duration::from_micros(5);
        // The first yield is slow: back-off.
        let y = run(&mut p, u64::from(YIELD_EVERY), |at| at as Switches, slow);
        assert_eq!(y, 1);
        assert!(p.backing_off());
        let n = BACKOFF_POLLS;
        let y = run(&mut p, n, |at| at as Switches, fast);
        assert!(y <= n / u64::from(BACKOFF_YIELD_EVERY) + 1, "{y}");
        assert!(!p.backing_off());
        // Over: frequent yields again.
        let y = run(&mut p, 4 * SAMPLE_EVERY, |at| at as Switches, fast);
        assert!(y >= SAMPLE_EVERY - 1, "{y}");
    }

    #[test]
    fn the_switch_count_is_readable() {
        assert!(involuntary_switches().is_some_and(|n| n >= 0));
        // A thread of its own starts the policy afresh and never panics.
        std::thread::spawn(|| {
            for _ in 0..1000 {
                note_empty();
            }
            note_work();
        })
        .join()
        .unwrap();
    }
}
