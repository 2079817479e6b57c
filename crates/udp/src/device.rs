//! A MetaRoCE device on real UDP sockets, and its progress engine.
//!
//! One receive socket on `device_port` (data and ACKs both arrive there),
//! one send socket per port of `device_port + 1 ..= device_port + span`
//! (every path's datagrams leave from its own source port: the ECMP
//! entropy). All sockets are non-blocking.
//!
//! Progress is made by whoever holds the device lock: the application
//! thread when it polls a CQ ([`Device::poll_cq`]) or posts work
//! ([`Device::with`]), and otherwise the device's engine thread. One thread
//! spins per device, never two: while an application polls, the engine only
//! covers its pauses with blocking passes (a second spinner on a small
//! machine steals the CPU the first one and the peer need, and turns
//! scheduler time slices into millisecond stalls and false timeouts); with
//! no polling application the engine busy-polls for `busy_poll_ns` after
//! the last pass in which it answered the peer on its own (READ and atomic
//! responses), then sleeps in `ppoll` on the receive socket and a wake-up
//! eventfd with the core's next deadline as timeout.
//!
//! A thread that would rather block than poll arms a CQ
//! ([`Device::req_notify_cq`]) and waits in [`Device::get_cq_event`]: it
//! sleeps on a condition variable of the device lock, the engine drives
//! progress meanwhile, and whichever thread makes a completion land in the
//! armed CQ wakes it.
//!
//! Sending gathers: a data packet's payload goes from its memory region to
//! the kernel as an iovec between the header and the ICRC trailer, so the
//! only copy of the payload on the send side is the kernel's. The receive
//! socket's queue is treated as a queue on the path: while it is long,
//! ECN-capable datagrams taken from it count as CE marked.

use crate::capture::{CaptureHook, CapturedDatagram};
use crate::impair::{Impair, ImpairState, Verdict};
use crate::pmtu::{self, PathMtu};
use crate::sys::{self, EventFd, OutMsg, RxBatch};
use metaroce_verbs::{
    CompletionQueue, Context, Counters, DirectTarget, Ecn, EndpointConfig, EndpointStats, Layout,
    PacketKind, Transmit, VerbsError, WorkCompletion,
};
use socket2::Socket;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Monotonic nanoseconds from a process-wide origin (never 0 after the
/// first call: the origin is one nanosecond before it).
///
/// Read straight from `CLOCK_MONOTONIC`: a ping-pong reads the clock a few
/// times per hop and each empty poll once, and `Instant::elapsed` (its
/// `Duration` and `u128` arithmetic) cost ~100 instructions a read.
pub fn now_ns() -> u64 {
    static ORIGIN: OnceLock<u64> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(|| sys::monotonic_ns().saturating_sub(1));
    sys::monotonic_ns().saturating_sub(origin)
}

/// A seed from the OS (`/dev/urandom`, or time and pid if that fails).
pub fn os_seed() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

/// The datapath failed.
#[derive(Debug, thiserror::Error)]
pub enum UdpError {
    /// A socket call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// The verbs layer refused.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> UdpError {
    let what = what.into();
    move |source| UdpError::Io { what, source }
}

/// How to start a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The core's configuration. `device_port == 0` picks a free port range.
    pub endpoint: EndpointConfig,
    /// When `endpoint.device_port`'s range is already taken, pick a free
    /// range (as for port 0) instead of failing. Tools set it for their
    /// default port, so that several devices on one host (`--loopback`'s
    /// two sides, the ranks of a job) all start; a port the user asked for
    /// is bound as given or fails.
    pub port_fallback: bool,
    /// The local IP to bind (the address peers use for this device).
    pub bind_ip: IpAddr,
    /// Receive-side fault injection.
    pub impair: Option<Impair>,
    /// Use UDP GSO when the kernel has it.
    pub gso: bool,
    /// Use UDP GRO when the kernel has it.
    pub gro: bool,
    /// The engine spins this long after its last activity before sleeping.
    pub busy_poll_ns: u64,
    /// Receive-queue ECN: while more than this many bytes wait in the
    /// receive socket, ECN-capable datagrams taken from it count as CE
    /// marked. The host's socket queue is a queue on the path like a
    /// switch's; marking it keeps the senders' windows from parking
    /// milliseconds of data there (which would pass for RTT and make
    /// timers fire on healthy paths). 0 turns it off.
    pub rx_queue_mark_bytes: u32,
    /// Send payloads from memory regions by scatter/gather I/O (headers and
    /// trailer from a buffer, payload in place) instead of copying them
    /// into a datagram buffer first.
    pub gather: bool,
    /// Receive the payload of a large WRITE packet or READ response
    /// straight into its memory region (peek at the headers, ask the core
    /// where the payload goes, then read headers, payload and trailer into
    /// their places: no copy from a receive buffer; see the core's
    /// `direct.rs`). Taken only where the core allows it (no
    /// authentication, ICRC left to the UDP checksum). `capture` and
    /// `impair` see such datagrams as they see others.
    pub direct_placement: bool,
    /// Sees every datagram sent and received (a packet capture, e.g.
    /// [`PcapCapture`](crate::PcapCapture)); `None` costs nothing.
    pub capture: Option<Arc<dyn CaptureHook>>,
    /// Scheduling niceness of the engine thread (`setpriority`; below 0
    /// needs CAP_SYS_NICE, and is silently not applied without it). The
    /// engine is the device's stand-in for the kernel's softirq: when the
    /// host's CPUs are contended, a favoured engine keeps ACKs and timers
    /// moving while the application thread waits for its turn. `None`
    /// leaves the thread as created.
    pub engine_nice: Option<i32>,
    /// Send an ACK in front of a data datagram to the same peer, in one
    /// datagram, when a flush has both (wire.md 5.3): a reply and the ACK
    /// for the request it answers cost one pass through both network stacks
    /// instead of two. Every device of this version takes such datagrams;
    /// turn it off toward older ones.
    pub coalesce: bool,
    /// An application thread in [`Device::poll_cq_wait`] that was taken
    /// off its CPU while it spun (any involuntary context switch) stops
    /// spinning for `CONTENDED_HOLD_NS`, as the engine does when it loses
    /// real time to another thread: its empty polls block at once, leaving
    /// the CPU to the peer and the engine (a stream under a CPU hog keeps
    /// far more of its bandwidth). Off by default: a ping-pong's two spinning
    /// threads on a 2-vCPU machine are preempted now and then even with
    /// nothing else running, and blocking them costs a wake-up per
    /// message (8-byte loopback write-lat 6.5 -> 58 us typical on the
    /// VM); off, they spin their busy-poll window whatever the load.
    pub app_block_when_contended: bool,
}

impl DeviceConfig {
    /// Defaults: GSO and GRO on, 2 ms busy-poll window, no impairment.
    pub fn new(endpoint: EndpointConfig, bind_ip: IpAddr) -> Self {
        Self {
            endpoint,
            port_fallback: false,
            bind_ip,
            impair: None,
            gso: true,
            gro: true,
            busy_poll_ns: 2_000_000,
            rx_queue_mark_bytes: 512 << 10,
            gather: true,
            direct_placement: true,
            capture: None,
            engine_nice: None,
            coalesce: true,
            app_block_when_contended: false,
        }
    }
}

/// Driver counters (the core's own are in [`EndpointStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// `recvmmsg` calls that returned data.
    pub rx_batches: u64,
    /// Datagrams received (GRO segments counted one by one).
    pub rx_datagrams: u64,
    /// Received super-datagrams that GRO coalesced.
    pub rx_gro_msgs: u64,
    /// Datagrams whose payload was received straight into its memory
    /// region (direct placement; counted in `rx_datagrams` too).
    pub rx_direct: u64,
    /// Of `rx_direct`: datagrams read straight into the place the next
    /// packet of the WRITE being placed would go, without a peek at their
    /// headers first (the guess was right).
    pub rx_direct_guessed: u64,
    /// Datagrams read into a guessed place that turned out to be another
    /// packet: copied out and handled as the batch read would.
    pub rx_direct_misguessed: u64,
    /// ACKs coalesced in front of a small data packet that were handled
    /// after the next flush rather than before the data
    /// (`DEFER_ACK_MAX_DATAGRAM`).
    pub rx_acks_deferred: u64,
    /// Datagrams dropped by `--impair`.
    pub impair_dropped: u64,
    /// Datagrams duplicated by `--impair`.
    pub impair_duplicated: u64,
    /// Datagrams delayed by `--impair`.
    pub impair_reordered: u64,
    /// Datagrams handed to the kernel.
    pub tx_datagrams: u64,
    /// Messages (send calls' entries) handed to the kernel.
    pub tx_msgs: u64,
    /// GSO messages sent.
    pub tx_gso_msgs: u64,
    /// ACKs sent in front of a data datagram, in the same datagram.
    pub tx_coalesced: u64,
    /// Datagrams the kernel refused (full buffer, error) and that were dropped.
    pub tx_dropped: u64,
    /// Datagrams whose source port had no socket.
    pub tx_no_socket: u64,
    /// Times a send found the socket buffer full and waited for room.
    pub tx_full_waits: u64,
    /// Datagrams delivered as CE because the receive queue was long.
    pub rx_queue_ce_marks: u64,
    /// Datagrams the kernel dropped at the receive socket (full buffer).
    pub rx_kernel_drops: u64,
    /// Longest time between two progress passes (receive + timers) while
    /// the core had a deadline pending (work in flight), ns.
    pub progress_gap_ns_max: u64,
    /// Progress passes that came more than 200 us after the previous one
    /// while the core had a deadline pending.
    pub progress_gaps_over_200us: u64,
    /// Datagrams the kernel refused as larger than the path MTU
    /// (`EMSGSIZE`; sockets send with don't-fragment, so nothing is ever
    /// fragmented instead). Each one makes the engine ask for the path MTU
    /// again.
    pub tx_too_big: u64,
    /// Times a known peer's path MTU changed (a recheck found another value).
    pub path_mtu_changes: u64,
    /// Progress passes that held a due timer back because datagrams were
    /// still waiting in the receive socket.
    pub timers_deferred: u64,
    /// Longest time a due deadline of the core waited for a progress pass,
    /// ns: how long the host kept the device off a CPU when it had a timer
    /// to serve (what makes healthy paths time out).
    pub timer_late_ns_max: u64,
    /// Progress passes that served a deadline more than 200 us late.
    pub timers_late_over_200us: u64,
}

/// A snapshot of a device's counters.
#[derive(Debug, Clone, Copy)]
pub struct DeviceStats {
    /// The core's counters.
    pub endpoint: EndpointStats,
    /// The driver's counters.
    pub io: IoStats,
    /// Whether GSO is in use.
    pub gso: bool,
    /// Whether GRO is in use.
    pub gro: bool,
}

impl IoStats {
    /// Every counter as `(name, value)`, in declaration order.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("rx_batches", self.rx_batches),
            ("rx_datagrams", self.rx_datagrams),
            ("rx_gro_msgs", self.rx_gro_msgs),
            ("rx_direct", self.rx_direct),
            ("rx_direct_guessed", self.rx_direct_guessed),
            ("rx_direct_misguessed", self.rx_direct_misguessed),
            ("rx_acks_deferred", self.rx_acks_deferred),
            ("impair_dropped", self.impair_dropped),
            ("impair_duplicated", self.impair_duplicated),
            ("impair_reordered", self.impair_reordered),
            ("tx_datagrams", self.tx_datagrams),
            ("tx_msgs", self.tx_msgs),
            ("tx_gso_msgs", self.tx_gso_msgs),
            ("tx_coalesced", self.tx_coalesced),
            ("tx_dropped", self.tx_dropped),
            ("tx_no_socket", self.tx_no_socket),
            ("tx_full_waits", self.tx_full_waits),
            ("rx_queue_ce_marks", self.rx_queue_ce_marks),
            ("rx_kernel_drops", self.rx_kernel_drops),
            ("progress_gap_ns_max", self.progress_gap_ns_max),
            ("progress_gaps_over_200us", self.progress_gaps_over_200us),
        ]
    }
}

/// Every counter of a device at one moment: the core's (device,
/// connections, paths) and the driver's.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceCounters {
    /// The device's address (IP and device port).
    pub addr: SocketAddr,
    /// The core's counters.
    pub core: Counters,
    /// The driver's counters.
    pub io: IoStats,
}

impl DeviceCounters {
    /// Labelled `name value` lines: the core's device counters, the
    /// driver's as `io.<name>`, then per connection `conn.<peer>.<name>`,
    /// per sending path `path.<peer>.<slot>.<name>` and per receive path
    /// `rxpath.<peer>.<slot>.<name>` ([`Counters::lines`]).
    pub fn lines(&self) -> Vec<(String, u64)> {
        let mut lines = self.core.lines();
        let device = self.core.device.fields().len();
        let io = self
            .io
            .fields()
            .into_iter()
            .map(|(n, v)| (format!("io.{n}"), v));
        lines.splice(device..device, io);
        lines
    }
}

/// Most datagrams drained from the core per send round.
const TX_BATCH: usize = 256;
/// Receive messages per `recvmmsg`.
const RX_BATCH: usize = 32;
/// Receive batches per progress pass (bounded for fairness with timers and sends).
const RX_ROUNDS: usize = 8;
/// Smallest datagram worth direct placement: below it, the peek costs
/// more than the copy it saves.
const DIRECT_MIN_BYTES: usize = 16 << 10;
/// Most datagrams one pass reads this way before the batch read.
const DIRECT_MAX_PER_PASS: usize = 32;
/// Large datagrams in a row the core has no target for (traffic that is
/// never placed: SENDs, packets with an ICRC to check) that end direct
/// reading until the next large datagram a batch read finds.
const DIRECT_MAX_MISSES: usize = 8;
/// Small datagrams in a row the receive path still reads by peeking after
/// a large one. A two-way exchange interleaves each side's data with the
/// ACKs of its own; handing the queue to the batch read at the first run
/// of ACKs copied every data packet the batch took behind them (in a
/// two-rank all-reduce, half the payload bytes went through the bounce
/// buffer; under CPU contention, two thirds). Counted in datagrams, not
/// time: a host that was off its CPU finds the same mix in its queue.
const DIRECT_SMALL_ALLOWANCE: u32 = 64;
/// Largest datagram whose coalesced ACK is handled after the reply: a
/// ping-pong's request or answer carries the ACK of the last one in front
/// of it, and nothing the reply needs depends on that ACK, so the core
/// handles the data (and hands out its completion) first and the ACK once
/// the reply has left, off the round trip (about 0.5 µs of a ~3 µs hop of
/// user time on the VM of BENCHMARKS.md's UDP round 15). Room for a 4 KiB
/// message, its headers and the ACK. Larger datagrams (a stream's data,
/// whose ACKs open the window its next sends need) are handled in order;
/// a held ACK waits at most until the end of the pass or the next one.
const DEFER_ACK_MAX_DATAGRAM: usize = 4608;
/// Most ACKs held that way at once; more are handled at once.
const DEFER_ACK_MAX: usize = 16;
/// Room for a data packet's headers and trailer (the largest extension
/// and the ICRC are well inside it), behind the largest ACK its sender may
/// coalesce in front of it (wire.md 5.3).
const DIRECT_HEAD_LEN: usize = 512;
/// Longest a due timer waits for the receive socket to be drained. While
/// datagrams wait unread, a due retransmission timer is held back: after
/// this host was off its CPU, the ACKs that answer the timer are usually
/// among them, and firing first would take the host's own stall for loss
/// (a false RTO, a retransmission, a path retired). Bounded, so a flood of
/// datagrams cannot hold timers off for ever.
const TIMER_DEFER_MAX_NS: u64 = 20_000_000;
/// Longest the device holds what is due to be sent (ACKs, mostly) for the
/// application's reply to carry: a reply comes within a few µs of the
/// completion it answers, and past this the holding only delays a
/// stream's sender, which waits on these ACKs.
const HOLD_MAX_NS: u64 = 10_000;
/// The engine stands aside this long after the application drove progress
/// (and a post after a quieter spell wakes it at once).
const APP_HOLD_NS: u64 = 1_000_000;
/// While the application keeps polling, each time the engine wakes to
/// look and finds it still at it, the engine's next look is twice as far
/// off, up to this. A wake-up is a timer interrupt and two context switches
/// on a CPU a polling thread needs (on a VM, exits to the hypervisor too):
/// two ranks ping-ponging over the libfabric provider woke their engines
/// ~1,200 times a second each at a fixed 1 ms, ~300 with the doubling.
/// The price: an application that stops polling without posting anything
/// leaves the device to itself for up to this long, about one RTO floor of
/// the real datapath.
const APP_HOLD_MAX_NS: u64 = 4_000_000;
/// An engine that was taken off its CPU while it spun (another runnable
/// thread wanted that CPU: a hog, the peer, its own device's application)
/// does not spin for this long: an empty pass blocks until input or a
/// deadline instead. The kernel's own busy-poll stops the same way, on
/// `need_resched()`: a spinner that keeps going turns the scheduler's fair
/// share into time slices spent waiting for the thread it keeps off the
/// CPU. Application threads in `poll_cq_wait` stop the same way when
/// `DeviceConfig::app_block_when_contended` is on (`WaitClock` says how
/// each kind of thread tells it is contended). Short, because contention
/// is often brief: the peer setting up its buffers beside a READ
/// responder's engine stopped it, and with a first stop of 50 ms the
/// 8-byte READs measured right after waited for wake-ups (`perf read-lat
/// --loopback -a`: 20 µs at a few sizes against 5.5 at the others; 7.5 to
/// 12.8 µs t_avg against 5.7-6.0 with 2 ms). A thread that keeps being
/// contended stops for longer each time (`SpinGuard::hold_ns`).
const CONTENDED_HOLD_NS: u64 = 2_000_000;
/// Longest a thread that keeps being contended stops spinning for (see
/// `SpinGuard::hold_ns`). Under a hog on one of two vCPUs, a 64 KiB
/// write-bw at TCP's rate moved 2 % less when each stop lasted a fixed
/// 50 ms (the engine's rule found the hog one slice after each stop, 20.5
/// against 20.9 Gb/s in five interleaved runs).
const CONTENDED_HOLD_MAX_NS: u64 = 800_000_000;
/// How often a spinning thread asks whether it was taken off its CPU.
const PREEMPT_CHECK_NS: u64 = 50_000;
/// A spinning engine is contended when, over a window of at least this
/// long, it waited for its CPU more than `1 / CONTENDED_WAIT_SHARE_INV` of
/// the time (and at once when a shorter window already holds that share
/// of a whole window's wait). A CPU hog sharing its core takes whole
/// scheduler slices (milliseconds): a spinner beside one waited 65-97 % of
/// one window in ten. Two spinners on two vCPUs lose a few µs now and then
/// to kernel threads and interrupts (the READ responder's engine of an
/// 8-byte loopback read-lat: 2 % of a window at the 99th percentile),
/// which is not a reason to stop spinning. Counting those preemptions
/// instead of their length stopped that engine at the first one, and a
/// blocking engine's own wake-ups preempt threads and are preempted, so
/// it never spun again: each READ waited for a wake-up, 20 µs a round
/// trip instead of 6.
const CONTENTION_WINDOW_NS: u64 = 1_000_000;
/// See `CONTENTION_WINDOW_NS`: one eighth.
const CONTENDED_WAIT_SHARE_INV: u64 = 8;
/// Longest the engine sleeps while an application blocks in
/// [`Device::poll_cq_wait`] (it wakes when that wait ends anyway).
const APP_WAIT_MAX_NS: u64 = 1_000_000_000;
/// An application that polled within this window is a polling application:
/// the engine then never spins, it only covers the application's pauses
/// with blocking passes.
const APP_POLLING_NS: u64 = 50_000_000;

/// How a spinning thread tells that it is losing its CPU.
#[derive(Debug)]
enum WaitClock {
    /// By the time it waited for its CPU, read from the scheduler's
    /// statistics, which are not opened yet (they must be opened on the
    /// thread they measure). The engine's rule: it is the one thread that
    /// answers the peer (READ responses, ACKs) while the application does
    /// not poll, so it stops spinning only on evidence that spinning costs
    /// another thread its CPU.
    Unopened,
    /// The thread's scheduler statistics.
    SchedStat(sys::ThreadSchedStat),
    /// By its count of involuntary context switches: any is contention.
    /// The rule of an application thread that asked to block when
    /// contended (a stream's, for which a wake-up costs little), and the
    /// fallback where the kernel keeps no scheduler statistics. Under a
    /// hog on one of two vCPUs, a 64 KiB write-bw whose polling
    /// application followed the engine's rule instead moved 7 % less
    /// (38.4 against 41.6 Gb/s, five interleaved 3 s runs): the
    /// application then kept spinning on the free vCPU, and each wake-up
    /// of the engine found only the hog's.
    SwitchCount,
}

/// Whether a spinning thread (the engine, an application) is losing its
/// CPU to other runnable threads (`WaitClock` says how it tells).
#[derive(Debug)]
struct SpinGuard {
    clock: WaitClock,
    /// When the clock was last read, ns.
    checked_ns: u64,
    /// Start of the current window, ns (0: none open).
    window_start_ns: u64,
    /// The thread's total wait for a CPU at the window's start, ns.
    window_wait_ns: u64,
    /// The involuntary switch count at the last read (`SwitchCount` only).
    involuntary: u64,
    /// Spinning stays off until then, ns.
    contended_until_ns: u64,
    /// How long the next stop lasts: `CONTENDED_HOLD_NS`, doubled each
    /// time the thread is contended again within that long after a stop
    /// ends (up to `CONTENDED_HOLD_MAX_NS`), back to the start after a
    /// stop-free spell as long.
    hold_ns: u64,
}

impl SpinGuard {
    /// A guard that goes by the time the thread waited for its CPU.
    const fn by_wait() -> Self {
        Self::with_clock(WaitClock::Unopened)
    }

    /// A guard that goes by the count of involuntary context switches.
    const fn by_switches() -> Self {
        Self::with_clock(WaitClock::SwitchCount)
    }

    const fn with_clock(clock: WaitClock) -> Self {
        Self {
            clock,
            checked_ns: 0,
            window_start_ns: 0,
            window_wait_ns: 0,
            involuntary: 0,
            contended_until_ns: 0,
            hold_ns: CONTENDED_HOLD_NS,
        }
    }

    /// Called while spinning (after an empty poll): whether this thread
    /// should block instead, because it was kept off its CPU lately.
    fn contended(&mut self, now: u64) -> bool {
        if now < self.contended_until_ns {
            return true;
        }
        if now.saturating_sub(self.checked_ns) < PREEMPT_CHECK_NS {
            return false;
        }
        if matches!(self.clock, WaitClock::Unopened) {
            self.clock =
                sys::ThreadSchedStat::open().map_or(WaitClock::SwitchCount, WaitClock::SchedStat);
        }
        let first = self.checked_ns == 0;
        self.checked_ns = now;
        let tripped = match &self.clock {
            WaitClock::SchedStat(stat) => stat
                .run_delay_ns()
                .is_some_and(|waited_total| self.waited_too_long(now, waited_total)),
            WaitClock::SwitchCount | WaitClock::Unopened => {
                let count = sys::thread_involuntary_switches();
                let tripped = !first && count > self.involuntary;
                self.involuntary = count;
                tripped
            }
        };
        if tripped {
            self.stop(now);
        }
        tripped
    }

    /// One reading of the thread's total wait for a CPU, `waited_total`
    /// ns: whether the current window holds too much of it
    /// (`CONTENTION_WINDOW_NS`).
    fn waited_too_long(&mut self, now: u64, waited_total: u64) -> bool {
        if self.window_start_ns == 0 {
            self.window_start_ns = now;
            self.window_wait_ns = waited_total;
            return false;
        }
        let span = now.saturating_sub(self.window_start_ns);
        let waited = waited_total.saturating_sub(self.window_wait_ns);
        let too_long =
            waited.saturating_mul(CONTENDED_WAIT_SHARE_INV) > span.max(CONTENTION_WINDOW_NS);
        if too_long {
            // The next window opens when spinning resumes.
            self.window_start_ns = 0;
        } else if span >= CONTENTION_WINDOW_NS {
            self.window_start_ns = now;
            self.window_wait_ns = waited_total;
        }
        too_long
    }

    /// Stop spinning from `now` on.
    fn stop(&mut self, now: u64) {
        // Contended again soon after the last stop: the other thread is
        // still there (a hog), and each return to spinning costs the
        // stream one scheduler slice before it is noticed.
        let since_stop = now.saturating_sub(self.contended_until_ns);
        self.hold_ns = if self.contended_until_ns != 0 && since_stop < self.hold_ns {
            (self.hold_ns * 2).min(CONTENDED_HOLD_MAX_NS)
        } else {
            CONTENDED_HOLD_NS
        };
        self.contended_until_ns = now + self.hold_ns;
    }

    /// How long after its last work this thread spins before it blocks:
    /// `busy_poll_ns`, or not at all while it loses its CPU.
    fn spin_ns(&mut self, now: u64, busy_poll_ns: u64) -> u64 {
        if self.contended(now) { 0 } else { busy_poll_ns }
    }
}

/// The calling thread did work on a device (a post, a completion, input).
fn note_app_active(now: u64) {
    APP_ACTIVE_NS.with(|t| t.set(now));
}

thread_local! {
    /// When this application thread last did work on a device (a post, a
    /// completion, input), ns: `poll_cq_wait` spins for the busy-poll
    /// window after it.
    static APP_ACTIVE_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Whether this application thread is losing its CPU (the count it
    /// reads is per thread, so is the state).
    static APP_GUARD: std::cell::RefCell<SpinGuard> = const {
        std::cell::RefCell::new(SpinGuard::by_switches())
    };
}

struct Io {
    rx: Socket,
    tx: Vec<Socket>,
    base_port: u16,
    gso: bool,
    gro: bool,
    rxb: RxBatch,
    slots: Vec<Vec<u8>>,
    /// This flush's transmits and where each one's bytes are.
    meta: Vec<(Transmit, Layout)>,
    order: Vec<usize>,
    /// The sort keys of this flush's datagrams (see `send_all`).
    sort_keys: Vec<u64>,
    /// This flush's distinct destinations.
    dsts: Vec<SocketAddr>,
    /// The rest of a flush's working lists, kept between flushes: a
    /// ping-pong flushes once per message, and building them afresh cost
    /// seven allocations and frees per flush on its critical path.
    scratch: SendScratch,
    impair: Option<ImpairState>,
    held: Option<(SocketAddr, Ecn, Vec<u8>)>,
    stats: IoStats,
    last_progress_ns: u64,
    rx_queue_mark_bytes: u32,
    gather: bool,
    /// Direct placement is allowed (`DeviceConfig::direct_placement`).
    direct: bool,
    /// Small datagrams still to read by peeking at each one's headers
    /// first, for direct placement: `DIRECT_SMALL_ALLOWANCE` after each
    /// large datagram, 0 once that many small ones came in a row. Small
    /// traffic (a latency test) never pays the peek.
    direct_small_left: u32,
    /// Headers (and the trailer) of a directly placed datagram.
    direct_head: Vec<u8>,
    /// ACKs that came coalesced in front of a small data packet, handled
    /// after the next flush.
    deferred_acks: DeferredAcks,
    /// A datagram read on the way that was not for direct placement.
    direct_scratch: Vec<u8>,
    /// The next packet of the WRITE (or READ response) whose packet was
    /// placed last, as its headers would read (`guess_next`): sender, header
    /// length (in `direct_guess_head`) and datagram length.
    direct_guess: Option<(SocketAddr, usize, usize)>,
    /// The headers of `direct_guess`.
    direct_guess_head: Vec<u8>,
    /// What `direct_guess` names: QP, message and offset.
    direct_guess_key: (u32, u32, u32),
    /// Whether guessing pays: +1 for each datagram that was the guessed
    /// packet, -3 for each that was not (a miss costs a copy more than the
    /// peek it saves would, about three times a hit's gain), kept in
    /// -8..=8; below 0 the driver peeks instead and goes on keeping score
    /// of the guesses it would have made. On loopback a sender's flush goes
    /// out sorted by source port, so a message's packets can arrive in
    /// another order than their offsets.
    direct_guess_credit: i32,
    capture: Option<Arc<dyn CaptureHook>>,
    /// Peers whose path MTU this device follows, with what it last learned.
    paths: Vec<(SocketAddr, PathMtu)>,
    /// When to ask the kernel for every peer's path MTU again.
    pmtu_recheck_at_ns: u64,
    /// A send was refused as too big since the last recheck.
    pmtu_refused: bool,
    /// The core had a deadline pending after the last progress pass.
    busy_at_last_pass: bool,
    /// The last receive pass found the socket empty at once (see
    /// `take_input`: the next datagram is likely alone).
    rx_was_idle: bool,
    /// When a due timer was first held back for an undrained socket (see
    /// `TIMER_DEFER_MAX_NS`); None while none is.
    timer_deferred_since: Option<u64>,
    /// The core's earliest deadline after the last progress pass.
    deadline_at_last_pass: Option<u64>,
    /// The local IP, the source of captured sends.
    bind_ip: IpAddr,
    /// ACKs may ride in front of data datagrams (`DeviceConfig::coalesce`).
    coalesce: bool,
    /// Since when sends (ACKs) have been held back for the application's
    /// reply to go first (`poll_cq` handing out completions, `with_deferred`);
    /// 0: nothing held.
    held_since_ns: u64,
}

struct State {
    ctx: Context,
    io: Io,
}

struct Inner {
    state: Mutex<State>,
    /// Signalled when the context's completion channel has an event.
    cq_event: Condvar,
    /// Threads blocked in [`Device::get_cq_event`]; changed under the
    /// state lock only, so a notifier holding it sees every waiter.
    cq_waiters: AtomicUsize,
    shutdown: AtomicBool,
    sleeping: AtomicBool,
    /// When the application last drove progress, ns; while it blocks in
    /// [`Device::poll_cq_wait`], the end of that wait (in the future), so
    /// that the engine stands aside meanwhile.
    app_active: AtomicU64,
    wake: EventFd,
    /// Wakes an application thread blocked in [`Device::poll_cq_wait`]
    /// when another thread posts (new work, new deadlines).
    app_wake: EventFd,
    app_waiting: AtomicBool,
    app_block_when_contended: bool,
    rx_fd: std::os::fd::RawFd,
    addr: SocketAddr,
    busy_poll_ns: u64,
    engine_nice: Option<i32>,
}

/// A running device: sockets, the core, and its progress engine thread.
///
/// Verbs calls go through [`Device::with`], which runs them on the
/// device's [`Context`] under its lock and sends what they produced;
/// [`Device::poll_cq`] busy-polls a completion queue. The engine thread
/// receives, runs timers and sends while the application does not.
///
/// Two devices on 127.0.0.1, one RC QP each, one WRITE (the complete
/// programs, including one across two processes, are in
/// `crates/udp/examples`):
///
/// ```
/// use metaroce_verbs::{EndpointConfig, QpCaps};
/// use metaroce_udp::{Device, DeviceConfig};
/// use metaroce_verbs::{
///     AccessFlags, QpAttr, QpInitAttr, QpState, QpType, SendWr, WcOpcode, WcStatus,
///     WorkCompletion, WrOp,
/// };
///
/// let access = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);
/// let start = |seed| {
///     // Port 0: the device binds a free range (device port + path ports).
///     let cfg = EndpointConfig { device_port: 0, seed, ..EndpointConfig::default() };
///     let dev = Device::start(DeviceConfig::new(cfg, "127.0.0.1".parse().unwrap())).unwrap();
///     let (mr, cq, qp) = dev.with(|ctx, _now| {
///         let pd = ctx.alloc_pd();
///         let mr = ctx.reg_mr(pd, 4096, access).unwrap();
///         let cq = ctx.create_cq(16).unwrap();
///         let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4 };
///         let init =
///             QpInitAttr { send_cq: cq, recv_cq: cq, cap, qp_type: QpType::Rc, sq_sig_all: false };
///         let qp = ctx.create_qp(pd, &init).unwrap();
///         let to_init = QpAttr {
///             qp_state: Some(QpState::Init),
///             qp_access_flags: Some(access),
///             port_num: Some(1),
///             ..QpAttr::default()
///         };
///         ctx.modify_qp(qp, &to_init).unwrap();
///         (mr, cq, qp)
///     });
///     (dev, mr, cq, qp)
/// };
/// let (a, b) = (start(1), start(2));
/// for (me, peer) in [(&a, &b), (&b, &a)] {
///     me.0.with(|ctx, _| {
///         let rtr = QpAttr {
///             qp_state: Some(QpState::Rtr),
///             dest_addr: Some(peer.0.addr()),
///             dest_qp_num: Some(peer.3.qp_num()),
///             path_mtu: Some(4096),
///             ..QpAttr::default()
///         };
///         let rts = QpAttr {
///             qp_state: Some(QpState::Rts),
///             timeout: Some(14),
///             retry_cnt: Some(7),
///             rnr_retry: Some(7),
///             ..QpAttr::default()
///         };
///         ctx.modify_qp(me.3, &rtr).unwrap();
///         ctx.modify_qp(me.3, &rts).unwrap();
///     });
/// }
/// let (dev_a, mr_a, cq_a, qp_a) = &a;
/// let (dev_b, mr_b, _, _) = &b;
/// dev_a.with(|ctx, now| {
///     ctx.mr_bytes_mut(mr_a)[..5].copy_from_slice(b"hello");
///     let op = WrOp::Write { remote_addr: mr_b.addr, rkey: mr_b.rkey };
///     ctx.post_send(*qp_a, &[SendWr::new(1, op, vec![mr_a.sge(0, 5)])]).unwrap();
/// });
/// let mut wc = [WorkCompletion {
///     wr_id: 0, status: WcStatus::Success, opcode: WcOpcode::Send,
///     byte_len: 0, imm_data: None, qp_num: 0, src_qp: 0,
/// }];
/// let t0 = std::time::Instant::now();
/// while dev_a.poll_cq(*cq_a, &mut wc).unwrap() == 0 {
///     assert!(t0.elapsed().as_secs() < 10, "no completion");
/// }
/// assert_eq!(wc[0].status, WcStatus::Success);
/// assert_eq!(dev_b.with(|ctx, _| ctx.mr_bytes(mr_b)[..5].to_vec()), b"hello");
/// ```
pub struct Device {
    inner: Arc<Inner>,
    engine: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("addr", &self.inner.addr)
            .finish()
    }
}

fn bind_range(ip: IpAddr, base: u16, span: u16) -> io::Result<(Socket, Vec<Socket>)> {
    let rx = sys::bind_udp(SocketAddr::new(ip, base))?;
    let mut tx = Vec::with_capacity(usize::from(span));
    for i in 1..=span {
        tx.push(sys::bind_udp(SocketAddr::new(ip, base + i))?);
    }
    Ok((rx, tx))
}

impl Device {
    /// Bind the sockets, open the core and start the engine thread.
    pub fn start(cfg: DeviceConfig) -> Result<Self, UdpError> {
        let mut ep = cfg.endpoint.clone();
        let span = ep.path_port_span;
        let wanted = if ep.device_port != 0 {
            match bind_range(cfg.bind_ip, ep.device_port, span) {
                Ok(s) => Some(Ok(s)),
                Err(e) if cfg.port_fallback && e.kind() == io::ErrorKind::AddrInUse => None,
                Err(e) => Some(Err(e)),
            }
        } else {
            None
        };
        let (rx, tx) = if let Some(bound) = wanted {
            bound.map_err(io_err(format!(
                "bind UDP {}:{}..={}",
                cfg.bind_ip,
                ep.device_port,
                u32::from(ep.device_port) + u32::from(span)
            )))?
        } else {
            // Pick a free range: random bases until every port binds.
            let mut x = os_seed() | 1;
            let top = 60_000u32.saturating_sub(u32::from(span)).max(20_001);
            let mut last = None;
            let mut found = None;
            for _ in 0..64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let base = (20_000 + (x % u64::from(top - 20_000)) as u32) as u16;
                match bind_range(cfg.bind_ip, base, span) {
                    Ok(s) => {
                        ep.device_port = base;
                        found = Some(s);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            found.ok_or_else(|| UdpError::Io {
                what: format!("no free UDP port range of {} on {}", span + 1, cfg.bind_ip),
                source: last.unwrap_or_else(|| io::Error::other("no attempt")),
            })?
        };
        let gso = cfg.gso && tx.first().is_some_and(sys::probe_gso);
        let gro = cfg.gro && sys::enable_gro(&rx);
        let ctx = Context::open(ep.clone())?;
        let slot_len = ctx.max_datagram_len();
        let addr = SocketAddr::new(cfg.bind_ip, ep.device_port);
        let rx_fd = rx.as_raw_fd();
        let io = Io {
            rx,
            tx,
            base_port: ep.device_port,
            gso,
            gro,
            rxb: RxBatch::new(RX_BATCH),
            slots: (0..TX_BATCH).map(|_| vec![0; slot_len]).collect(),
            meta: Vec::with_capacity(TX_BATCH),
            order: Vec::with_capacity(TX_BATCH),
            sort_keys: Vec::with_capacity(TX_BATCH),
            dsts: Vec::new(),
            scratch: SendScratch::default(),
            impair: cfg.impair.filter(Impair::is_active).map(ImpairState::new),
            held: None,
            stats: IoStats::default(),
            last_progress_ns: 0,
            rx_queue_mark_bytes: cfg.rx_queue_mark_bytes,
            gather: cfg.gather,
            direct: cfg.direct_placement,
            direct_small_left: 0,
            direct_head: vec![0; DIRECT_HEAD_LEN],
            deferred_acks: DeferredAcks::default(),
            direct_guess: None,
            direct_guess_head: vec![0; DIRECT_HEAD_LEN],
            direct_guess_key: (0, 0, 0),
            direct_guess_credit: 0,
            direct_scratch: vec![
                0;
                if cfg.direct_placement {
                    sys::RX_BUF_LEN
                } else {
                    0
                }
            ],
            capture: cfg.capture.clone(),
            paths: Vec::new(),
            pmtu_recheck_at_ns: 0,
            pmtu_refused: false,
            busy_at_last_pass: false,
            rx_was_idle: false,
            timer_deferred_since: None,
            deadline_at_last_pass: None,
            bind_ip: cfg.bind_ip,
            coalesce: cfg.coalesce,
            held_since_ns: 0,
        };
        let inner = Arc::new(Inner {
            state: Mutex::new(State { ctx, io }),
            cq_event: Condvar::new(),
            cq_waiters: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            app_active: AtomicU64::new(0),
            wake: EventFd::new().map_err(io_err("eventfd"))?,
            app_wake: EventFd::new().map_err(io_err("eventfd"))?,
            app_waiting: AtomicBool::new(false),
            app_block_when_contended: cfg.app_block_when_contended,
            rx_fd,
            addr,
            busy_poll_ns: cfg.busy_poll_ns,
            engine_nice: cfg.engine_nice,
        });
        let engine_inner = Arc::clone(&inner);
        let engine = std::thread::Builder::new()
            .name(format!("mr-engine-{}", ep.device_port))
            .spawn(move || engine(&engine_inner))
            .map_err(io_err("spawn engine thread"))?;
        Ok(Self {
            inner,
            engine: Some(engine),
        })
    }

    /// The device's address as peers name it (IP and device port).
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Run `f` on the context under the device lock (post work, register
    /// memory, modify QPs, read MR bytes), then send what it produced and
    /// wake the engine so it sees new deadlines. The context has been told
    /// the time, so posts need no clock; `f` gets the same time too.
    pub fn with<R>(&self, f: impl FnOnce(&mut Context, u64) -> R) -> R {
        let now = now_ns();
        // A post is work: the answer to it is what this thread's next
        // polls wait for, and they spin for it from here.
        note_app_active(now);
        let r = {
            let mut st = self.lock();
            let st = &mut *st;
            st.ctx.set_time(now);
            let r = f(&mut st.ctx, now);
            flush(&mut st.ctx, &mut st.io, now);
            wake_cq_waiters(&self.inner, &st.ctx);
            r
        };
        // Wake a sleeping engine only when no application thread is driving
        // progress itself: while one polls, the engine stands aside anyway,
        // and every needless wake-up costs a context switch on a CPU the
        // polling threads need.
        let app_recent =
            now_ns().saturating_sub(self.inner.app_active.load(Ordering::Relaxed)) < APP_HOLD_NS;
        if !app_recent && self.inner.sleeping.load(Ordering::SeqCst) {
            self.inner.wake.signal();
        }
        // A thread blocked in `poll_cq_wait` timed its sleep by the
        // deadlines before this post.
        wake_app_waiter(&self.inner);
        r
    }

    /// Like [`with`](Self::with), but what `f` and the input before it
    /// made due stays queued for the next call that sends ([`with`],
    /// [`poll_cq`] finding nothing, [`progress`], or the engine once the
    /// application goes quiet). For the bookkeeping right after a
    /// completion (reposting the receive it consumed): the ACK for the
    /// message it received then leaves right behind the reply the
    /// application posts next, in one flush, instead of ahead of it, where
    /// its send sat on the peer's critical path (a few µs per message on a
    /// kernel UDP path).
    ///
    /// [`with`]: Self::with
    /// [`poll_cq`]: Self::poll_cq
    /// [`progress`]: Self::progress
    pub fn with_deferred<R>(&self, f: impl FnOnce(&mut Context, u64) -> R) -> R {
        let now = now_ns();
        self.inner.app_active.store(now, Ordering::Relaxed);
        let mut st = self.lock();
        let st = &mut *st;
        st.ctx.set_time(now);
        let r = f(&mut st.ctx, now);
        hold(&mut st.ctx, &mut st.io, now);
        wake_cq_waiters(&self.inner, &st.ctx);
        r
    }

    /// Send what is queued (after [`with_deferred`](Self::with_deferred)
    /// calls), as [`with`](Self::with) does after its closure.
    pub fn flush(&self) {
        self.with(|_, _| ());
    }

    /// Drive progress once from the calling thread (receive, timers, send).
    /// Returns whether anything happened.
    pub fn progress(&self) -> bool {
        self.inner.app_active.store(now_ns(), Ordering::Relaxed);
        let mut st = self.lock();
        let st = &mut *st;
        let did = progress(&mut st.ctx, &mut st.io, now_ns());
        wake_cq_waiters(&self.inner, &st.ctx);
        did
    }

    /// `ibv_poll_cq`, busy-polling style: drive progress, then take up to
    /// `wc.len()` completions.
    pub fn poll_cq(
        &self,
        cq: CompletionQueue,
        wc: &mut [WorkCompletion],
    ) -> Result<usize, VerbsError> {
        self.poll_cq_input(cq, wc).map(|(n, _, _)| n)
    }

    /// [`poll_cq`](Self::poll_cq) for a loop that has nothing else to do
    /// but wait for completions: it spins as `poll_cq` does for the
    /// device's busy-poll window after this thread's last work (a
    /// completion, a datagram taken in, a post), then sleeps in `ppoll` on
    /// the receive socket until a datagram, a post from another thread,
    /// the core's next deadline or `max_wait` (how often the caller wants
    /// control back, to look at its own clock or sockets), and polls once
    /// more; the engine stands aside meanwhile. A loop that waits this way
    /// costs next to no CPU while nothing comes, and as much latency as
    /// `poll_cq` while messages flow.
    ///
    /// Like the engine, a thread that was taken off its CPU while it spun
    /// (another runnable thread wanted it: the peer, the engine, a hog)
    /// then stops spinning for `CONTENDED_HOLD_NS` (longer while it keeps
    /// being taken off) and blocks on every empty poll, when
    /// [`DeviceConfig::app_block_when_contended`] is on (it is off by
    /// default: it costs a ping-pong its latency).
    pub fn poll_cq_wait(
        &self,
        cq: CompletionQueue,
        wc: &mut [WorkCompletion],
        max_wait: Duration,
    ) -> Result<usize, VerbsError> {
        let (n, took, now) = self.poll_cq_input(cq, wc)?;
        if n > 0 || took {
            note_app_active(now);
        }
        if n > 0 {
            return Ok(n);
        }
        let spin_ns = if self.inner.app_block_when_contended {
            APP_GUARD.with(|g| g.borrow_mut().spin_ns(now, self.inner.busy_poll_ns))
        } else {
            self.inner.busy_poll_ns
        };
        let spin = now.saturating_sub(APP_ACTIVE_NS.with(|t| t.get())) < spin_ns;
        let max_wait_ns = u64::try_from(max_wait.as_nanos())
            .unwrap_or(u64::MAX)
            .min(APP_WAIT_MAX_NS);
        if spin || !self.wait_input(cq, now, max_wait_ns) {
            return Ok(n);
        }
        self.poll_cq(cq, wc)
    }

    /// Block the calling application thread until a datagram, a post from
    /// another thread, input another thread took, the core's next deadline
    /// or `max_wait_ns`. Returns whether it waited (it does not while sends
    /// are held for a reply, a deadline is already due, or `cq` holds a
    /// completion).
    fn wait_input(&self, cq: CompletionQueue, now: u64, max_wait_ns: u64) -> bool {
        // Announced before the look at `cq`: input another thread takes
        // after the look wakes this one (`wake_app_waiter`), and input taken
        // before it shows in the look. Without it, the engine could take the
        // datagrams this thread was about to wait for between its empty poll
        // and its wait, and the completions they made sat in the CQ while
        // this thread slept on an empty socket for its whole timeout (a race
        // found while looking at 100 ms stalls of 4 KiB write-bw on
        // loopback, most of which had another cause: the perf client
        // waited with room to post).
        self.inner.app_waiting.store(true, Ordering::SeqCst);
        let timeout = {
            let mut st = self.lock();
            let ready = st.io.held_since_ns != 0 || st.ctx.cq_has_completions(cq);
            let timeout = st
                .ctx
                .poll_timeout()
                .map_or(max_wait_ns, |d| d.saturating_sub(now))
                .min(max_wait_ns);
            if ready { 0 } else { timeout }
        };
        if timeout == 0 {
            self.inner.app_waiting.store(false, Ordering::SeqCst);
            return false;
        }
        // This thread still drives the device: the engine stands aside
        // until the wait is over (rather than waking on the same datagram
        // and fighting for the lock).
        self.inner
            .app_active
            .store(now.saturating_add(timeout), Ordering::Relaxed);
        sys::wait_readable(
            &[self.inner.rx_fd, self.inner.app_wake.raw()],
            Some(timeout),
        );
        self.inner.app_waiting.store(false, Ordering::SeqCst);
        self.inner.app_wake.drain();
        self.inner.app_active.store(now_ns(), Ordering::Relaxed);
        true
    }

    /// `poll_cq`, whether its progress pass took input, and the time it
    /// started at.
    fn poll_cq_input(
        &self,
        cq: CompletionQueue,
        wc: &mut [WorkCompletion],
    ) -> Result<(usize, bool, u64), VerbsError> {
        let now = now_ns();
        self.inner.app_active.store(now, Ordering::Relaxed);
        let mut st = self.lock();
        let st = &mut *st;
        let n = st.ctx.poll_cq(cq, wc)?;
        if n > 0 {
            hold(&mut st.ctx, &mut st.io, now);
            return Ok((n, false, now));
        }
        // Take input, and when it completed work hand that to the caller
        // before sending what the input made due (ACKs): the caller's
        // reply, posted next, then leaves first and the ACKs right behind
        // it in the same flush (in front of it, in one datagram, wire.md
        // 5.3). Nothing waits long: the next post or idle poll flushes,
        // a poll flushes anyway once sends were held `HOLD_MAX_NS`, and the
        // engine covers a caller that goes quiet.
        let took = take_input(&mut st.ctx, &mut st.io, now);
        if took {
            // Another thread may wait on another CQ for what this input
            // completed.
            wake_app_waiter(&self.inner);
        }
        let n = st.ctx.poll_cq(cq, wc)?;
        // A completion handed out moments ago is likely still being
        // answered (MPI polls its queue empty before it replies): an idle
        // poll leaves the held sends for the reply until `HOLD_MAX_NS`.
        let awaiting_reply =
            st.io.held_since_ns != 0 && now.saturating_sub(st.io.held_since_ns) < HOLD_MAX_NS;
        if n == 0 && !awaiting_reply {
            // An idle poll reads the clock once: nothing it did took time.
            flush(&mut st.ctx, &mut st.io, if took { now_ns() } else { now });
        } else if n > 0 {
            hold(&mut st.ctx, &mut st.io, now);
        }
        wake_cq_waiters(&self.inner, &st.ctx);
        Ok((n, took, now))
    }

    /// `ibv_req_notify_cq`: arm `cq` so that its next completion (with
    /// `solicited_only`, its next solicited or failed one) raises an event
    /// for [`get_cq_event`](Self::get_cq_event).
    pub fn req_notify_cq(
        &self,
        cq: CompletionQueue,
        solicited_only: bool,
    ) -> Result<(), VerbsError> {
        self.with(|ctx, _| ctx.req_notify_cq(cq, solicited_only))
    }

    /// `ibv_get_cq_event`: block until an armed CQ raises its event, and
    /// return that CQ; `None` after `timeout`. While it waits, the calling
    /// thread leaves progress to the engine.
    pub fn get_cq_event(&self, timeout: Duration) -> Option<CompletionQueue> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        // The caller stops driving progress: let the engine take over now
        // rather than after its stand-aside window.
        self.inner.app_active.store(0, Ordering::Relaxed);
        if self.inner.sleeping.load(Ordering::SeqCst) {
            self.inner.wake.signal();
        }
        loop {
            if let Some(cq) = st.ctx.poll_cq_event() {
                return Some(cq);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.inner.cq_waiters.fetch_add(1, Ordering::SeqCst);
            st = self
                .inner
                .cq_event
                .wait_timeout(st, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            self.inner.cq_waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Learn the path MTU toward the peer device at `dest` and tell the
    /// context what the path carries
    /// ([`Context::set_path_max_datagram`]), so that `modify_qp` refuses a
    /// `path_mtu` whose datagrams would be fragmented; the engine then
    /// follows the path's MTU (rechecking after a send the kernel refused as
    /// too big, and every second). Returns what the kernel said. Call it
    /// before moving QPs toward `dest` to RTR.
    pub fn learn_path(&self, dest: SocketAddr) -> Result<PathMtu, UdpError> {
        let path = pmtu::probe_path(self.inner.addr.ip(), dest.ip()).map_err(io_err(format!(
            "path MTU from {} to {}",
            self.inner.addr.ip(),
            dest.ip()
        )))?;
        let mut st = self.lock();
        let st = &mut *st;
        st.ctx.set_path_max_datagram(dest, path.max_datagram);
        match st.io.paths.iter_mut().find(|(d, _)| *d == dest) {
            Some((_, known)) => *known = path.clone(),
            None => st.io.paths.push((dest, path.clone())),
        }
        Ok(path)
    }

    /// What the device last learned of the path to `dest`
    /// ([`learn_path`](Self::learn_path)).
    pub fn path(&self, dest: SocketAddr) -> Option<PathMtu> {
        let st = self.lock();
        st.io
            .paths
            .iter()
            .find(|(d, _)| *d == dest)
            .map(|(_, p)| p.clone())
    }

    /// Counters.
    pub fn stats(&self) -> DeviceStats {
        let st = self.lock();
        DeviceStats {
            endpoint: *st.ctx.stats(),
            io: st.io.stats,
            gso: st.io.gso,
            gro: st.io.gro,
        }
    }

    /// Every counter of the device, its connections and their paths.
    pub fn counters(&self) -> DeviceCounters {
        let st = self.lock();
        DeviceCounters {
            addr: self.inner.addr,
            core: st.ctx.counters(),
            io: st.io.stats,
        }
    }

    /// Stop the engine thread and close the sockets.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// Before closing: acknowledge at once everything received, then keep
    /// answering peers until the device has been quiet for `quiet` (nothing
    /// received, nothing in flight, no ACK owed) or `max` has passed. A
    /// peer whose last message's ACK was lost resends it after its probe
    /// timeout; a device that is already gone would leave it resending
    /// until its retry budget ends in an error completion (TCP's TIME_WAIT
    /// covers the same last-ACK loss). Returns whether it ended quiet.
    pub fn linger(&self, quiet: Duration, max: Duration) -> bool {
        let start = now_ns();
        let quiet_ns = u64::try_from(quiet.as_nanos()).unwrap_or(u64::MAX);
        let max_ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        let mut last_busy = start;
        loop {
            let now = now_ns();
            let quiescent = {
                let mut st = self.lock();
                let st = &mut *st;
                st.ctx.set_time(now);
                st.ctx.ack_owed_now();
                if progress(&mut st.ctx, &mut st.io, now) {
                    last_busy = now_ns();
                }
                wake_cq_waiters(&self.inner, &st.ctx);
                st.ctx.endpoint().is_quiescent()
            };
            let now = now_ns();
            if !quiescent {
                last_busy = now;
            }
            if now.saturating_sub(last_busy) >= quiet_ns {
                return true;
            }
            if now.saturating_sub(start) >= max_ns {
                return false;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn stop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        self.inner.wake.signal();
        if let Some(h) = self.engine.take() {
            let _ = h.join();
        }
        // What was received last is acknowledged before the sockets close:
        // a delayed ACK, or one held for a reply that will not come, would
        // otherwise leave the peer resending into nothing.
        let mut st = self.lock();
        let st = &mut *st;
        let now = now_ns();
        st.ctx.set_time(now);
        st.ctx.ack_owed_now();
        flush(&mut st.ctx, &mut st.io, now);
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.stop();
    }
}

fn engine(inner: &Inner) {
    if let Some(nice) = inner.engine_nice {
        sys::set_thread_nice(nice);
    }
    let mut last_active = now_ns();
    let mut deadline = None;
    let mut guard = SpinGuard::by_wait();
    // How long the application may be quiet before the engine takes over:
    // `APP_HOLD_NS`, doubling towards `APP_HOLD_MAX_NS` while it polls on.
    let mut hold_ns = APP_HOLD_NS;
    while !inner.shutdown.load(Ordering::SeqCst) {
        let now = now_ns();
        let app_polled = inner.app_active.load(Ordering::Relaxed);
        let app_recent = now.saturating_sub(app_polled) < hold_ns;
        if !app_recent {
            hold_ns = APP_HOLD_NS;
            // Block on the lock rather than try it: an application thread
            // preempted while holding it needs this CPU to finish its pass,
            // and retrying would burn the CPU it is waiting for.
            let mut st = inner
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let st = &mut *st;
            let data_sent = st.ctx.endpoint().stats().data_packets_sent;
            if progress(&mut st.ctx, &mut st.io, now) {
                // The spin window runs from the last pass that answered
                // the peer on the device's own (a READ or atomic
                // response, a resend): there the peer waits on this
                // thread, and a wake-up per request cost an 8-byte READ
                // 20 µs instead of 5.5. A pass that only took data and
                // acknowledged it leaves the window alone: a sender's
                // window covers the ACK's wake-up, and the CPU a spinning
                // receiver burns between datagrams is one the stream
                // needs (64 KiB write-bw on two vCPUs, six interleaved
                // runs: 63.9 Gb/s spinning, 69.4 blocking).
                if st.ctx.endpoint().stats().data_packets_sent != data_sent {
                    last_active = now;
                }
                wake_app_waiter(inner);
            }
            wake_cq_waiters(inner, &st.ctx);
            deadline = st.ctx.poll_timeout();
        }
        let now = now_ns();
        // Spin only when no application thread polls this device: with one
        // that does, it is the spinner, and a second spinning thread on a
        // small machine only steals its CPU (and the peer's), turning
        // scheduler time slices into millisecond stalls and false RTOs.
        let app_polls = app_polled != 0 && now.saturating_sub(app_polled) < APP_POLLING_NS;
        // Spin only while it pays: not when this thread was lately taken
        // off its CPU for another runnable thread (the application, the
        // peer, a hog), which needs the CPU the spin would burn. No
        // `sched_yield` in the spin: with another thread on the same CPU it
        // hands that thread a whole time slice (milliseconds: deadlines
        // missed, ACKs late), and with none it does nothing.
        if !app_polls && now.saturating_sub(last_active) < guard.spin_ns(now, inner.busy_poll_ns) {
            std::hint::spin_loop();
            continue;
        }
        inner.sleeping.store(true, Ordering::SeqCst);
        let (fds, timeout): (&[_], u64) = if app_recent {
            // The application drives (polls, or blocks in `poll_cq_wait`
            // until `app_polled`); wake when it goes quiet.
            let quiet_at = app_polled.saturating_add(hold_ns);
            let timeout = quiet_at
                .saturating_sub(now)
                .clamp(1, APP_WAIT_MAX_NS + hold_ns);
            hold_ns = (hold_ns * 2).min(APP_HOLD_MAX_NS);
            (&[inner.wake.raw()][..], timeout)
        } else {
            // Nobody drives: sleep until a datagram, a post or a deadline.
            let t = deadline.map_or(100_000_000, |d: u64| d.saturating_sub(now));
            (&[inner.rx_fd, inner.wake.raw()][..], t.min(100_000_000))
        };
        if timeout > 0 {
            sys::wait_readable(fds, Some(timeout));
        }
        inner.sleeping.store(false, Ordering::SeqCst);
        inner.wake.drain();
    }
}

/// Wake an application thread blocked in `poll_cq_wait` (called after a
/// post, or a pass that took input or sent: the deadlines it timed its
/// sleep by may have moved, the datagrams it waits for may be gone from
/// the socket, their completions in its CQ). Only when one waits: a load
/// otherwise.
fn wake_app_waiter(inner: &Inner) {
    if inner.app_waiting.load(Ordering::SeqCst) {
        inner.app_wake.signal();
    }
}

/// Wake threads blocked in `get_cq_event` if a completion raised an event
/// (called, under the device lock, after anything that may complete work).
///
/// Only when a thread waits: an event nobody consumed (a thread armed the
/// CQ, then found its completion by polling and never slept) stays pending,
/// and a notify is a system call even without waiters. That call on every
/// poll was one or two `futex` calls per operation of a small all-reduce.
fn wake_cq_waiters(inner: &Inner, ctx: &Context) {
    if inner.cq_waiters.load(Ordering::SeqCst) > 0 && ctx.has_cq_events() {
        inner.cq_event.notify_all();
    }
}

/// One progress pass: receive what is there, fire due timers, send.
fn progress(ctx: &mut Context, io: &mut Io, now: u64) -> bool {
    let did = take_input(ctx, io, now);
    did | (flush(ctx, io, now_ns()) > 0)
}

/// The input half of a progress pass: receive what is there and fire due
/// timers. What it makes the core want to send stays queued in the core
/// until the next [`flush`].
fn take_input(ctx: &mut Context, io: &mut Io, now: u64) -> bool {
    // A gap counts only when the core had a deadline pending at the last
    // pass (work in flight, a timer to keep): a device left alone while
    // the application registers memory or verifies data is not stalled.
    let gap = now.saturating_sub(io.last_progress_ns);
    if io.last_progress_ns != 0 && io.busy_at_last_pass {
        io.stats.progress_gap_ns_max = io.stats.progress_gap_ns_max.max(gap);
        if gap > 200_000 {
            io.stats.progress_gaps_over_200us += 1;
        }
    }
    // How late this pass serves the earliest deadline the last pass left:
    // the host's stall as the core's timers see it (a pass that waits for
    // a far deadline is not late).
    if let Some(due) = io.deadline_at_last_pass.filter(|&d| d < now) {
        let late = now.saturating_sub(due.max(io.last_progress_ns));
        io.stats.timer_late_ns_max = io.stats.timer_late_ns_max.max(late);
        if late > 200_000 {
            io.stats.timers_late_over_200us += 1;
        }
    }
    io.last_progress_ns = now;
    let mut did = false;
    let mut now = now;
    let mut drained = false;
    // ACKs kept from the last pass go before anything newer.
    did |= io.deferred_acks.drain(ctx, now);
    let mut rounds = RX_ROUNDS;
    if io.direct && io.direct_small_left > 0 {
        let pass = take_direct(ctx, io, now);
        if pass.took {
            did = true;
            now = now_ns();
        }
        drained = pass.empty;
        // A pass that ended on its quota stops here, and the next one
        // places the rest directly too; the batch read would copy them.
        if pass.full {
            rounds = 0;
        }
    }
    for round in 0..if drained { 0 } else { rounds } {
        // A pass can outlast a scheduler tick: stamp each batch with the
        // time it was really taken in, or RTT samples come out short.
        if round > 0 {
            now = now_ns();
        }
        // After a pass that found the socket empty, the datagram that came
        // since is most likely alone (a ping-pong's request or answer):
        // read it alone. A batch read would go on to ask the socket for a
        // second one (its header copied in, the queue locked), on the way
        // from the datagram to the reply; what else came is the next
        // pass's, moments later.
        let lone = round == 0 && io.rx_was_idle;
        // Transient socket errors (e.g. ICMP) are not fatal.
        let n = io
            .rxb
            .recv_up_to(&io.rx, if lone { 1 } else { RX_BATCH })
            .unwrap_or_default();
        if round == 0 {
            io.rx_was_idle = n == 0;
        }
        if n == 0 {
            drained = true;
            break;
        }
        // What is still queued behind this batch. Asked only when the batch
        // hints at a backlog (it filled up, or GRO coalesced a burst), so
        // neither an idle poll nor a lone datagram (the latency case) pays
        // a second syscall.
        let burst = n == RX_BATCH
            || io.rxb.meta[..n]
                .iter()
                .any(|m| m.segment.is_some_and(|seg| m.len > seg));
        let queue_long = burst
            && match sys::rx_queue(&io.rx) {
                Some((queued, drops)) => {
                    io.stats.rx_kernel_drops = u64::from(drops);
                    io.rx_queue_mark_bytes > 0 && queued > io.rx_queue_mark_bytes
                }
                None => false,
            };
        did = true;
        io.stats.rx_batches += 1;
        let mut large = false;
        for i in 0..n {
            let m = io.rxb.meta[i];
            let Some(src) = m.src else { continue };
            large |= m.segment.unwrap_or(m.len) >= DIRECT_MIN_BYTES;
            rx_sink!(io).message(ctx, now, src, m, io.rxb.data(i), queue_long);
        }
        // Large datagrams among small ones (a two-way exchange's data among
        // its ACKs): what follows them is read by direct placement, from
        // the next pass on, rather than copied by the next batch.
        if large && io.direct {
            io.direct_small_left = DIRECT_SMALL_ALLOWANCE;
            if n == RX_BATCH {
                break;
            }
        }
        // Read alone: the rest (if any) is the next pass's.
        if lone {
            break;
        }
        // A short batch emptied the socket: asking again would only cost
        // a system call that finds nothing (a datagram landing meanwhile
        // is the next pass's).
        if n < RX_BATCH {
            drained = true;
            break;
        }
    }
    let now = if did { now_ns() } else { now };
    // Asked once for a pass that fires nothing (every empty poll), and
    // again only after something that can move it.
    let mut deadline = ctx.poll_timeout();
    if deadline.is_some_and(|t| t <= now) {
        // Held back from when it was first held back, not from when it
        // came due: a timer that came due while this host was off its CPU
        // for 300 ms is already 300 ms late, and firing it after the first
        // batches (before the ACKs queued behind them) took the stall for
        // silence on every path whose ACKs were still unread (on the
        // namespace fabric: bursts of ~90 path retirements, once a second).
        let since = *io.timer_deferred_since.get_or_insert(now);
        if drained || now.saturating_sub(since) >= TIMER_DEFER_MAX_NS {
            io.timer_deferred_since = None;
            // ACKs kept for after the reply answer timers too: handed over
            // first, they stop the timers they satisfy from firing.
            io.deferred_acks.drain(ctx, now);
            if ctx.poll_timeout().is_some_and(|t| t <= now) {
                ctx.handle_timeout(now);
            }
            did = true;
        } else {
            // Come back soon: the rest of the queue, then the timer.
            io.stats.timers_deferred += 1;
            did = true;
        }
        deadline = ctx.poll_timeout();
    } else {
        io.timer_deferred_since = None;
    }
    if !io.paths.is_empty() && (io.pmtu_refused || now >= io.pmtu_recheck_at_ns) {
        recheck_paths(ctx, io, now);
        deadline = ctx.poll_timeout();
    }
    io.deadline_at_last_pass = deadline;
    io.busy_at_last_pass = deadline.is_some();
    did
}

/// Direct placement (the core's `direct.rs`): for each datagram at the
/// head of the receive socket, peek at its headers; if it is a large WRITE
/// packet or READ response (behind a coalesced ACK or not) the core has a
/// target for, read its headers and trailer into `direct_head` and its
/// payload straight into the region. A datagram that is not for direct
/// placement (small, coalesced by GRO, no target) is read and handled as
/// the batch read would. `DIRECT_MAX_PER_PASS` datagrams end the pass (the
/// next one goes on the same way); `DIRECT_MAX_MISSES` large ones in a row
/// without a target end direct reading until a batch read finds another
/// large datagram.
fn take_direct(ctx: &mut Context, io: &mut Io, now: u64) -> DirectPass {
    let mut taken = 0;
    let mut misses = 0;
    let mut queue_long = false;
    let mut empty = false;
    while taken < DIRECT_MAX_PER_PASS && misses < DIRECT_MAX_MISSES && io.direct_small_left > 0 {
        // The next packet of the message placed last is most likely the
        // next datagram: read it into its place without peeking first.
        let guess = io.direct_guess.take();
        if let Some(guess) = guess
            && io.direct_guess_credit >= 0
        {
            match take_guessed(ctx, io, now, guess, taken, &mut queue_long) {
                Guessed::NoTarget => {}
                Guessed::Took => {
                    taken += 1;
                    continue;
                }
                Guessed::Empty => {
                    // Still the best guess for the next pass.
                    io.direct_guess = Some(guess);
                    empty = true;
                    break;
                }
                Guessed::Failed => break,
            }
        }
        // A guess not taken: kept score of against what comes.
        let shadow = (guess.is_some() && io.direct_guess_credit < 0).then_some(io.direct_guess_key);
        let peeked = {
            let mut parts: [&mut [u8]; 1] = [&mut io.direct_head[..]];
            sys::recv_one(&io.rx, &mut parts, true)
        };
        let peek = match peeked {
            Ok(Some(peek)) => peek,
            Ok(None) => {
                // A guess kept score of (not taken) stays for the next
                // pass too: a reader that keeps up with its sender meets
                // each packet in a pass of its own, and a guess dropped
                // here would never be scored, so guessing, once stopped,
                // would never come back.
                if guess.is_some() && io.direct_guess.is_none() {
                    io.direct_guess = guess;
                }
                empty = true;
                break;
            }
            Err(_) => break,
        };
        let Some(src) = peek.src else { break };
        taken += 1;
        note_direct_read(io, peek.len, taken, &mut queue_long);
        let gro = peek.segment.is_some_and(|seg| seg < peek.len);
        let head_len = peek.len.min(io.direct_head.len());
        let target = (peek.len >= DIRECT_MIN_BYTES && !gro)
            .then(|| ctx.direct_target(src, &io.direct_head[..head_len], peek.len))
            .flatten()
            .filter(|t| t.header_len() + t.trailer_len() <= io.direct_head.len());
        let Some(target) = target else {
            if shadow.is_some() {
                score_guess(io, false);
            }
            misses += usize::from(peek.len >= DIRECT_MIN_BYTES);
            let got = {
                let mut parts: [&mut [u8]; 1] = [&mut io.direct_scratch[..]];
                sys::recv_one(&io.rx, &mut parts, false)
            };
            let Ok(Some(m)) = got else { break };
            let Some(src) = m.src else { continue };
            let data = &io.direct_scratch[..m.len.min(io.direct_scratch.len())];
            rx_sink!(io).message(ctx, now, src, m, data, queue_long);
            continue;
        };
        misses = 0;
        let hl = target.header_len();
        let tl = target.trailer_len();
        let got = {
            let (head, rest) = io.direct_head.split_at_mut(hl);
            let Some(payload) = ctx.direct_buffer(&target) else {
                break;
            };
            let mut parts: [&mut [u8]; 3] = [head, payload, &mut rest[..tl]];
            sys::recv_one(&io.rx, &mut parts, false)
        };
        // The datagram was consumed whatever happens next (or an error left
        // it queued for the batch read).
        let Ok(Some(m)) = got else { break };
        io.stats.rx_datagrams += 1;
        io.stats.rx_direct += 1;
        let (head, trailer) = io.direct_head.split_at(hl);
        let mut sink = rx_sink!(io);
        let ecn = sink.mark(sys::ecn_of_tos(m.tos), queue_long);
        if m.len != target.datagram_len() || m.src != Some(src) {
            // Another datagram than the peeked one: its bytes went into
            // the target's range of an unfinished message, which a
            // checked packet must still fill; this one is lost.
            ctx.handle_direct(now, src, ecn, &[], &target);
            continue;
        }
        let placed = Received::Placed {
            head,
            trailer: &trailer[..tl],
            target: &target,
        };
        sink.datagram(ctx, now, src, ecn, placed);
        let key = guess_next(io, src, hl, &target);
        if let Some(shadow) = shadow {
            score_guess(io, key == Some(shadow));
        }
    }
    if misses >= DIRECT_MAX_MISSES {
        io.direct_small_left = 0;
    }
    DirectPass {
        took: taken > 0,
        empty,
        full: taken >= DIRECT_MAX_PER_PASS,
    }
}

/// A datagram of `len` bytes was taken, the `taken`-th of this direct
/// pass: the receive-queue mark of the batch read is asked again every
/// eighth datagram, and small datagrams use up the allowance of reads by
/// peeking (`direct_small_left`) that a large one renews.
fn note_direct_read(io: &mut Io, len: usize, taken: usize, queue_long: &mut bool) {
    if taken % 8 == 1 {
        *queue_long = io.rx_queue_mark_bytes > 0
            && sys::rx_queue(&io.rx).is_some_and(|(q, _)| q > io.rx_queue_mark_bytes);
    }
    if len >= DIRECT_MIN_BYTES {
        io.direct_small_left = DIRECT_SMALL_ALLOWANCE;
    } else {
        io.direct_small_left = io.direct_small_left.saturating_sub(1);
    }
}

/// How a read at a guessed place went ([`take_guessed`]).
enum Guessed {
    /// The core gives the guess no target (now): peek as usual.
    NoTarget,
    /// A datagram was read and handled, placed or copied.
    Took,
    /// The socket is empty.
    Empty,
    /// The read failed (the datagram, if any, is still queued).
    Failed,
}

/// Read the next datagram as the packet `guess` names (sender, header
/// length, datagram length; headers in `io.direct_guess_head`): its
/// headers into `direct_head`, its payload straight into the region, its
/// trailer behind the headers, anything beyond into `direct_scratch`. One
/// `recvmsg` where a peek and a read took two.
///
/// The place is the core's answer for the guessed headers
/// (`Endpoint::direct_target`, asked now, under the lock the read happens
/// under): bytes of an unfinished message, not received yet, that the
/// message's rkey lets the peer write. Another datagram than the guessed
/// one (a miss) leaves its bytes there, which a checked packet of that
/// message must still bring before the message completes, exactly as a
/// datagram that changed between a peek and its read does; the datagram
/// itself is put back together from where its parts went and handled as
/// the batch read would.
fn take_guessed(
    ctx: &mut Context,
    io: &mut Io,
    now: u64,
    (src, head_len, datagram_len): (SocketAddr, usize, usize),
    taken: usize,
    queue_long: &mut bool,
) -> Guessed {
    let Some(target) = ctx
        .direct_target(src, &io.direct_guess_head[..head_len], datagram_len)
        .filter(|t| {
            t.header_len() == head_len && t.header_len() + t.trailer_len() <= io.direct_head.len()
        })
    else {
        return Guessed::NoTarget;
    };
    let (hl, pl, tl) = (
        target.header_len(),
        target.payload_len(),
        target.trailer_len(),
    );
    // Where the bytes beyond a guessed datagram's length go: behind the
    // room the whole guessed datagram takes in the scratch buffer, so a
    // miss can be put back together in place.
    let spare_from = hl + pl + tl;
    if spare_from >= io.direct_scratch.len() {
        return Guessed::NoTarget;
    }
    let (got, place) = {
        let (head, rest) = io.direct_head.split_at_mut(hl);
        let Some(payload) = ctx.direct_buffer(&target) else {
            return Guessed::NoTarget;
        };
        let place = (payload.as_ptr() as usize, payload.len());
        let mut parts: [&mut [u8]; 4] = [
            head,
            payload,
            &mut rest[..tl],
            &mut io.direct_scratch[spare_from..],
        ];
        (sys::recv_one(&io.rx, &mut parts, false), place)
    };
    let m = match got {
        Ok(Some(m)) => m,
        Ok(None) => return Guessed::Empty,
        Err(_) => return Guessed::Failed,
    };
    note_direct_read(io, m.len, taken + 1, queue_long);
    let Some(from) = m.src else {
        return Guessed::Took;
    };
    // A hit: the datagram read is a packet whose own headers put its
    // payload exactly where it went (same bytes of the same region), with
    // the headers and trailer where the guess put them.
    let gro = m.segment.is_some_and(|seg| seg < m.len);
    let actual = (!gro && m.len == spare_from)
        .then(|| ctx.direct_target(from, &io.direct_head[..hl], m.len))
        .flatten()
        .filter(|t| t.header_len() == hl && t.payload_len() == pl && t.trailer_len() == tl)
        .filter(|t| {
            ctx.direct_buffer(t)
                .is_some_and(|b| (b.as_ptr() as usize, b.len()) == place)
        });
    if let Some(actual) = actual {
        io.stats.rx_datagrams += 1;
        io.stats.rx_direct += 1;
        io.stats.rx_direct_guessed += 1;
        score_guess(io, true);
        let (head, trailer) = io.direct_head.split_at(hl);
        let mut sink = rx_sink!(io);
        let ecn = sink.mark(sys::ecn_of_tos(m.tos), *queue_long);
        let placed = Received::Placed {
            head,
            trailer: &trailer[..tl],
            target: &actual,
        };
        sink.datagram(ctx, now, from, ecn, placed);
        guess_next(io, from, hl, &actual);
        return Guessed::Took;
    }
    // A miss: the datagram back together in `direct_scratch` (its tail is
    // there already), then handled as a copied one.
    io.stats.rx_direct_misguessed += 1;
    score_guess(io, false);
    let len = m.len.min(io.direct_scratch.len());
    let in_head = len.min(hl);
    io.direct_scratch[..in_head].copy_from_slice(&io.direct_head[..in_head]);
    let in_payload = len.saturating_sub(hl).min(pl);
    if in_payload > 0 {
        let Some(payload) = ctx.direct_buffer(&target) else {
            return Guessed::Took;
        };
        io.direct_scratch[hl..hl + in_payload].copy_from_slice(&payload[..in_payload]);
    }
    let in_trailer = len.saturating_sub(hl + pl).min(tl);
    io.direct_scratch[hl + pl..hl + pl + in_trailer]
        .copy_from_slice(&io.direct_head[hl..hl + in_trailer]);
    let data = &io.direct_scratch[..len];
    rx_sink!(io).message(ctx, now, from, m, data, *queue_long);
    Guessed::Took
}

/// After a datagram was placed at `target` (its headers, `hl` bytes, in
/// `direct_head`): the headers the message's next packet would have, if
/// the message goes on (same length, or what is left of the message),
/// kept in `direct_guess_head` for `take_guessed`. Only the offset and
/// length change between two packets of a message that matter for where
/// its payload goes; the PSN, timestamp and path are the core's business
/// once the packet is read, and the core names the place anew from the
/// real headers before the payload counts as placed.
///
/// Returns what the placed packet was (QP, message, offset), to score the
/// guess made before it.
fn guess_next(
    io: &mut Io,
    src: SocketAddr,
    hl: usize,
    target: &DirectTarget,
) -> Option<(u32, u32, u32)> {
    io.direct_guess = None;
    let head = &io.direct_head[..hl];
    let lead = match metaroce_wire::first_packet_len(head) {
        n if n < head.len() => n,
        _ => 0,
    };
    let mut repr =
        metaroce_wire::DataRepr::parse_head(&head[lead..], target.datagram_len() - lead).ok()?;
    let placed = (repr.dst_qpn, repr.msg_seq, repr.offset);
    let next = repr.offset.checked_add(repr.payload_len)?;
    if next >= repr.msg_len || repr.payload_len == 0 {
        return Some(placed);
    }
    repr.offset = next;
    repr.payload_len = repr.payload_len.min(repr.msg_len - next);
    let header_len = repr.header_len();
    if header_len > io.direct_guess_head.len() {
        return Some(placed);
    }
    repr.emit_header(&mut io.direct_guess_head[..header_len]);
    let datagram_len = header_len + repr.payload_len as usize + target.trailer_len();
    io.direct_guess = Some((src, header_len, datagram_len));
    io.direct_guess_key = (repr.dst_qpn, repr.msg_seq, repr.offset);
    Some(placed)
}

/// Keep score of whether the datagram after a placed one was the packet
/// guessed for it (`Io::direct_guess_credit`).
fn score_guess(io: &mut Io, hit: bool) {
    let c = io.direct_guess_credit + if hit { 1 } else { -3 };
    io.direct_guess_credit = c.clamp(-8, 8);
}

/// How one pass of [`take_direct`] ended.
struct DirectPass {
    /// It read at least one datagram.
    took: bool,
    /// It found the socket empty (a batch read would only find nothing).
    empty: bool,
    /// It stopped on its quota with datagrams likely still queued.
    full: bool,
}

/// A datagram as the socket gave it: whole in a buffer, or placed directly
/// (headers and trailer in a buffer, the payload already in its region).
#[derive(Clone, Copy)]
enum Received<'a> {
    Whole(&'a [u8]),
    Placed {
        head: &'a [u8],
        trailer: &'a [u8],
        target: &'a DirectTarget,
    },
}

impl Received<'_> {
    fn handle(self, ctx: &mut Context, now: u64, src: SocketAddr, ecn: Ecn) {
        match self {
            Self::Whole(d) => ctx.handle_datagram(now, src, ecn, d),
            Self::Placed { head, target, .. } => ctx.handle_direct(now, src, ecn, head, target),
        }
    }

    /// The datagram in one piece (for a capture, or to hold it back); a
    /// placed one is put together from the region.
    fn to_vec(self, ctx: &mut Context) -> Vec<u8> {
        match self {
            Self::Whole(d) => d.to_vec(),
            Self::Placed {
                head,
                trailer,
                target,
            } => {
                let mut d = Vec::with_capacity(target.datagram_len());
                d.extend_from_slice(head);
                d.extend_from_slice(ctx.direct_buffer(target).unwrap_or_default());
                d.extend_from_slice(trailer);
                d
            }
        }
    }
}

/// Where received datagrams go: the capture hook, the impairment (with the
/// datagram it holds back) and the counters, borrowed from `Io` beside its
/// receive buffers (hence [`rx_sink!`], field by field).
struct RxSink<'a> {
    capture: Option<&'a dyn CaptureHook>,
    dst: SocketAddr,
    impair: &'a mut Option<ImpairState>,
    held: &'a mut Option<(SocketAddr, Ecn, Vec<u8>)>,
    stats: &'a mut IoStats,
    deferred_acks: &'a mut DeferredAcks,
}

/// The [`RxSink`] of an `Io`, leaving its receive buffers free to borrow.
macro_rules! rx_sink {
    ($io:expr) => {
        RxSink {
            capture: $io.capture.as_deref(),
            dst: SocketAddr::new($io.bind_ip, $io.base_port),
            impair: &mut $io.impair,
            held: &mut $io.held,
            stats: &mut $io.stats,
            deferred_acks: &mut $io.deferred_acks,
        }
    };
}
use rx_sink;

impl RxSink<'_> {
    /// An ECN-capable datagram taken from a long receive queue counts as
    /// CE marked (`DeviceConfig::rx_queue_mark_bytes`).
    fn mark(&mut self, ecn: Ecn, queue_long: bool) -> Ecn {
        if queue_long && ecn == Ecn::Ect0 {
            self.stats.rx_queue_ce_marks += 1;
            Ecn::Ce
        } else {
            ecn
        }
    }

    /// One message read into `data` (`m` its metadata): under GRO several
    /// datagrams back to back, each `m.segment` bytes but the last.
    fn message(
        &mut self,
        ctx: &mut Context,
        now: u64,
        src: SocketAddr,
        m: sys::InMeta,
        data: &[u8],
        queue_long: bool,
    ) {
        let seg = m.segment.unwrap_or(data.len()).max(1);
        if data.len() > seg {
            self.stats.rx_gro_msgs += 1;
        }
        let tos_ecn = sys::ecn_of_tos(m.tos);
        for d in data.chunks(seg) {
            self.stats.rx_datagrams += 1;
            let ecn = self.mark(tos_ecn, queue_long);
            self.datagram(ctx, now, src, ecn, Received::Whole(d));
        }
    }

    /// A datagram to the core. A small one led by a coalesced ACK has its
    /// data handled now and the ACK kept until after the next flush
    /// (`DEFER_ACK_MAX_DATAGRAM`); anything else goes after the ACKs kept
    /// before it, so the core still sees ACKs in the order they came.
    fn handle(&mut self, ctx: &mut Context, now: u64, src: SocketAddr, ecn: Ecn, rx: Received<'_>) {
        if let Received::Whole(d) = rx
            && d.len() <= DEFER_ACK_MAX_DATAGRAM
            && self.deferred_acks.acks.len() < DEFER_ACK_MAX
        {
            let n = metaroce_wire::first_packet_len(d);
            if n < d.len() {
                ctx.handle_datagram(now, src, ecn, &d[n..]);
                self.deferred_acks.push(src, ecn, &d[..n]);
                self.stats.rx_acks_deferred += 1;
                return;
            }
        }
        self.deferred_acks.drain(ctx, now);
        rx.handle(ctx, now, src, ecn);
    }

    /// One datagram to the capture hook, the impairment and the core. A
    /// placed one that is dropped leaves its payload in bytes still to
    /// come; one held back is put together whole and delivered later.
    fn datagram(
        &mut self,
        ctx: &mut Context,
        now: u64,
        src: SocketAddr,
        ecn: Ecn,
        rx: Received<'_>,
    ) {
        if let Some(hook) = self.capture {
            let whole;
            let parts: &[&[u8]] = match rx {
                Received::Whole(d) => &[d],
                Received::Placed { .. } => {
                    whole = rx.to_vec(ctx);
                    &[&whole]
                }
            };
            hook.datagram(&CapturedDatagram {
                sent: false,
                src,
                dst: self.dst,
                ecn,
                parts,
            });
        }
        let Some(imp) = self.impair.as_mut() else {
            self.handle(ctx, now, src, ecn, rx);
            return;
        };
        match imp.verdict() {
            Verdict::Drop => self.stats.impair_dropped += 1,
            Verdict::Hold if self.held.is_none() => {
                self.stats.impair_reordered += 1;
                *self.held = Some((src, ecn, rx.to_vec(ctx)));
                return;
            }
            Verdict::Duplicate => {
                self.stats.impair_duplicated += 1;
                rx.handle(ctx, now, src, ecn);
                rx.handle(ctx, now, src, ecn);
            }
            Verdict::Deliver | Verdict::Hold => rx.handle(ctx, now, src, ecn),
        }
        if let Some((s, e, h)) = self.held.take() {
            ctx.handle_datagram(now, s, e, &h);
        }
    }
}

/// Ask the kernel again for the path MTU of every peer the device follows
/// and tell the context of any change.
fn recheck_paths(ctx: &mut Context, io: &mut Io, now: u64) {
    io.pmtu_refused = false;
    io.pmtu_recheck_at_ns = now + pmtu::RECHECK_NS;
    for (dest, known) in &mut io.paths {
        let Ok(path) = pmtu::probe_path(io.bind_ip, dest.ip()) else {
            continue;
        };
        if path.path_mtu != known.path_mtu {
            io.stats.path_mtu_changes += 1;
            ctx.set_path_max_datagram(*dest, path.max_datagram);
            *known = path;
        }
    }
}

/// Drain the core's transmits and send them, grouped per source port into
/// GSO messages where possible. Returns datagrams drained.
/// Sends are held back for the application's reply: start the clock, or
/// send them now when they have waited `HOLD_MAX_NS` already. The clock
/// runs only while something is held: a completion with nothing to send
/// behind it (an ACK that completed a send) starting it would make the
/// ACK for the next message, moments later, look old and leave alone,
/// a system call ahead of the reply that would have carried it.
fn hold(ctx: &mut Context, io: &mut Io, now: u64) {
    if !ctx.wants_to_transmit() {
        io.held_since_ns = 0;
    } else if io.held_since_ns == 0 {
        io.held_since_ns = now.max(1);
    } else if now.saturating_sub(io.held_since_ns) >= HOLD_MAX_NS {
        flush(ctx, io, now);
    }
}

/// ACKs that came coalesced in front of a small data packet, kept by
/// `RxSink::handle` to be handled after the reply has left
/// (`DEFER_ACK_MAX_DATAGRAM`), in arrival order.
#[derive(Default)]
struct DeferredAcks {
    /// Source, ECN and length of each; their bytes back to back in `bytes`.
    acks: Vec<(SocketAddr, Ecn, usize)>,
    bytes: Vec<u8>,
}

impl DeferredAcks {
    fn push(&mut self, src: SocketAddr, ecn: Ecn, ack: &[u8]) {
        self.bytes.extend_from_slice(ack);
        self.acks.push((src, ecn, ack.len()));
    }

    /// Hands them to the core, in arrival order; whether there were any.
    fn drain(&mut self, ctx: &mut Context, now: u64) -> bool {
        let mut at = 0;
        for &(src, ecn, n) in &self.acks {
            ctx.handle_coalesced_ack(now, src, ecn, &self.bytes[at..at + n]);
            at += n;
        }
        let any = !self.acks.is_empty();
        self.acks.clear();
        self.bytes.clear();
        any
    }
}

fn flush(ctx: &mut Context, io: &mut Io, now: u64) -> usize {
    let total = send_due(ctx, io, now);
    // The answer has left: now the ACKs that came in front of what it
    // answers, and whatever they make due.
    if io.deferred_acks.drain(ctx, now) {
        return total + send_due(ctx, io, now);
    }
    total
}

fn send_due(ctx: &mut Context, io: &mut Io, now: u64) -> usize {
    io.held_since_ns = 0;
    // Nothing queued (an idle poll's flush): the core would only answer
    // `None` after stamping the time and checking both of its queues.
    if !ctx.wants_to_transmit() {
        return 0;
    }
    let mut total = 0;
    loop {
        io.meta.clear();
        while io.meta.len() < TX_BATCH {
            let k = io.meta.len();
            let t = if io.gather {
                ctx.poll_transmit_gather(now, &mut io.slots[k])
            } else {
                ctx.poll_transmit(now, &mut io.slots[k])
                    .map(|t| (t, Layout::Whole))
            };
            match t {
                Some(t) => io.meta.push(t),
                None => break,
            }
        }
        let k = io.meta.len();
        if k == 0 {
            break;
        }
        send_all(ctx, io);
        total += k;
        if k < TX_BATCH {
            break;
        }
    }
    total
}

/// Which ACK of this flush rides in front of which data datagram: by
/// datagram index, the ACK's index (see `send_all`); empty when none does.
/// `order` is the sending order, data first, grouped by source port, ECN
/// and destination.
///
/// Fills `lead` (by datagram index) and `riding` (whether a datagram is an
/// ACK that rides in front of another); both are left empty when no ACK
/// rides.
fn coalesce_acks(
    ctx: &Context,
    meta: &[(Transmit, Layout)],
    order: &[usize],
    paths: &[(SocketAddr, PathMtu)],
    lead: &mut Vec<Option<usize>>,
    riding: &mut Vec<bool>,
) {
    lead.clear();
    riding.clear();
    let n_data = order
        .iter()
        .take_while(|&&i| meta[i].0.kind != PacketKind::Ack)
        .count();
    if n_data == 0 || n_data == order.len() {
        return;
    }
    let group = |i: usize| {
        let t = &meta[i].0;
        (t.src_port, t.ecn, t.dst)
    };
    lead.resize(meta.len(), None);
    riding.resize(meta.len(), false);
    let mut any = false;
    for k in 0..n_data {
        let i = order[k];
        let alone = (k == 0 || group(order[k - 1]) != group(i))
            && (k + 1 == n_data || group(order[k + 1]) != group(i));
        if !alone {
            continue;
        }
        let t = &meta[i].0;
        let limit = paths
            .iter()
            .find(|(d, _)| *d == t.dst)
            .map_or(ctx.max_datagram_len(), |(_, p)| p.max_datagram);
        // The first ACK toward this destination not placed yet, if it fits.
        let found = order[n_data..]
            .iter()
            .find(|&&a| !riding[a] && meta[a].0.dst == t.dst);
        if let Some(&a) = found
            && t.len + meta[a].0.len <= limit
        {
            riding[a] = true;
            lead[i] = Some(a);
            any = true;
        }
    }
    if !any {
        lead.clear();
        riding.clear();
    }
}

/// `send_all`'s working lists, kept in `Io` so that a flush allocates
/// nothing once they have grown to the largest batch seen.
#[derive(Default)]
struct SendScratch {
    /// By datagram index: the ACK that rides in front of it.
    lead: Vec<Option<usize>>,
    /// By datagram index: an ACK riding in front of another datagram.
    riding: Vec<bool>,
    /// Per datagram in sending order: its range in the parts list.
    datagram_parts: Vec<(usize, usize)>,
    runs: Vec<MsgRun>,
    /// The parts list and the messages, empty between flushes. Their
    /// elements borrow the flush's slots and memory regions, so they are
    /// kept as `'static` (empty) lists and turned into the flush's lifetime
    /// and back by collecting in place, which keeps the allocation.
    parts: Vec<&'static [u8]>,
    msgs: Vec<OutMsg<'static>>,
}

/// A run of datagrams sent as one message: `parts[parts_from..parts_to]`.
struct MsgRun {
    parts_from: usize,
    parts_to: usize,
    datagrams: usize,
    first: usize,
}

/// Send the batch in `io.meta` / `io.slots`. Payloads left in place in
/// memory regions go to the kernel by gather (header, payload, trailer
/// iovecs): the payload bytes are copied once, by the kernel, into the
/// socket buffer.
fn send_all(ctx: &Context, io: &mut Io) {
    let Io {
        rx,
        tx,
        base_port,
        gso,
        slots,
        meta,
        order,
        stats,
        capture,
        bind_ip,
        pmtu_refused,
        sort_keys,
        dsts,
        coalesce,
        paths,
        scratch,
        ..
    } = io;
    let SendScratch {
        lead,
        riding,
        datagram_parts,
        runs,
        parts: parts_store,
        msgs: msgs_store,
    } = scratch;
    let meta = &*meta;
    order.clear();
    // Data before ACKs: a reply that is ready goes out ahead of the ACK
    // for the request it answers (the ACK is not on the peer's critical
    // path; the reply is), repair packets behind the rest of the data
    // (they answer losses among it); then grouped by source port, ECN and
    // destination, so runs can become GSO messages. Stable: per-path order
    // is kept, which is all the protocol needs. One integer per datagram
    // (its own index in the low bits makes an unstable sort stable; the
    // destination is an index into this flush's distinct destinations,
    // nearly always one): sorting tuples with socket addresses in them
    // cost ~650 instructions per datagram.
    sort_keys.clear();
    dsts.clear();
    for (i, (t, _)) in meta.iter().enumerate() {
        let d = match dsts.iter().position(|x| *x == t.dst) {
            Some(d) => d,
            None => {
                dsts.push(t.dst);
                dsts.len() - 1
            }
        };
        // Repair packets after the other data (see `Transmit::repair`).
        let rank = match t.kind {
            PacketKind::Data => u64::from(t.repair),
            PacketKind::Ack => 2,
        };
        sort_keys.push(
            (rank << 62)
                | (u64::from(t.src_port) << 40)
                | (u64::from(sys::ecn_bits(t.ecn)) << 38)
                | ((d as u64) << 16)
                | i as u64,
        );
    }
    sort_keys.sort_unstable();
    order.extend(sort_keys.iter().map(|k| (k & 0xffff) as usize));
    // Coalescing (wire.md 5.3): an ACK rides in front of a data datagram
    // to the same peer, one datagram through both network stacks instead
    // of two. Only in front of a data datagram that is a message of its own
    // (no other data of this flush shares its source port, destination and
    // ECN, so no GSO run is broken: the latency case, a reply and the ACK
    // for the request it answers), and only where both fit the path.
    if *coalesce {
        coalesce_acks(ctx, meta, order, paths, lead, riding);
    } else {
        lead.clear();
        riding.clear();
    }
    if !lead.is_empty() {
        stats.tx_coalesced += riding.iter().filter(|&&r| r).count() as u64;
        order.retain(|&i| !riding[i]);
    }
    let lead = &*lead;
    let lead_of = |i: usize| lead.get(i).copied().flatten();
    // Every datagram's slices, in sending order (the kept list, empty, now
    // borrowing this flush's slots: `Vec` is covariant).
    let mut parts: Vec<&[u8]> = std::mem::take(parts_store);
    datagram_parts.clear();
    for &i in order.iter() {
        let (t, layout) = &meta[i];
        let from = parts.len();
        if let Some(a) = lead_of(i) {
            parts.push(&slots[a][..meta[a].0.len]);
        }
        match layout {
            Layout::Whole => parts.push(&slots[i][..t.len]),
            Layout::Split {
                header_len,
                trailer_len,
                payload,
            } => {
                parts.push(&slots[i][..*header_len]);
                parts.push(ctx.payload(payload));
                parts.push(&slots[i][*header_len..*header_len + *trailer_len]);
            }
        }
        datagram_parts.push((from, parts.len()));
    }
    if let Some(hook) = capture {
        for (k, &i) in order.iter().enumerate() {
            let t = &meta[i].0;
            let (from, to) = datagram_parts[k];
            hook.datagram(&CapturedDatagram {
                sent: true,
                src: SocketAddr::new(*bind_ip, t.src_port),
                dst: t.dst,
                ecn: t.ecn,
                parts: &parts[from..to],
            });
        }
    }
    // Cut the sorted datagrams into messages: one GSO message per run of
    // equal-length datagrams (the last may be shorter) with the same source
    // port, destination and ECN.
    runs.clear();
    let mut s = 0;
    while s < order.len() {
        let first = order[s];
        let head = &meta[first].0;
        let seg = head.len;
        let mut e = s + 1;
        let mut bytes = seg;
        // A coalesced datagram is longer than its transmit says: it goes
        // as a message of its own.
        if *gso && lead_of(first).is_none() {
            while e < order.len() && e - s < sys::GSO_MAX_SEGMENTS {
                if lead_of(order[e]).is_some() {
                    break;
                }
                let t = &meta[order[e]].0;
                let same = t.src_port == head.src_port && t.dst == head.dst && t.ecn == head.ecn;
                if !same || t.len > seg || bytes + t.len > sys::GSO_MAX_BYTES {
                    break;
                }
                bytes += t.len;
                e += 1;
                if t.len < seg {
                    break; // a short segment must be the last
                }
            }
        }
        runs.push(MsgRun {
            parts_from: datagram_parts[s].0,
            parts_to: datagram_parts[e - 1].1,
            datagrams: e - s,
            first,
        });
        s = e;
    }
    let mut msgs: Vec<OutMsg<'_>> = std::mem::take(msgs_store);
    msgs.extend(runs.iter().map(|r| {
        let t = &meta[r.first].0;
        OutMsg {
            dst: t.dst,
            tos: sys::ecn_bits(t.ecn),
            segment: (r.datagrams > 1).then_some(t.len as u16),
            parts: &parts[r.parts_from..r.parts_to],
            datagrams: r.datagrams,
        }
    }));
    // Send per socket: consecutive messages share a source port.
    let mut a = 0;
    let mut disable_gso = false;
    while a < msgs.len() {
        let port = meta[runs[a].first].0.src_port;
        let mut b = a + 1;
        while b < msgs.len() && meta[runs[b].first].0.src_port == port {
            b += 1;
        }
        let sock = if port == *base_port {
            Some(&*rx)
        } else {
            port.checked_sub(*base_port + 1)
                .and_then(|i| tx.get(usize::from(i)))
        };
        match sock {
            Some(sock) => {
                *pmtu_refused |= send_msgs(sock, &msgs[a..b], &mut disable_gso, stats);
            }
            None => {
                stats.tx_no_socket += msgs[a..b].iter().map(|m| m.datagrams as u64).sum::<u64>()
            }
        }
        a = b;
    }
    if disable_gso {
        *gso = false;
    }
    // Back into the kept lists, emptied: collecting an empty list in place
    // keeps the allocation and drops the borrows of this flush (the maps
    // see no element; they only name the `'static` types).
    msgs.clear();
    *msgs_store = msgs
        .into_iter()
        .map(|m| OutMsg {
            dst: m.dst,
            tos: m.tos,
            segment: m.segment,
            parts: &[],
            datagrams: m.datagrams,
        })
        .collect();
    parts.clear();
    *parts_store = parts
        .into_iter()
        .map(|_| -> &'static [u8] { &[] })
        .collect();
}

/// Send messages on one socket, retrying briefly on a full buffer; a GSO
/// message the kernel refuses (EIO / EINVAL: no GSO on this route, or a
/// segment above the path MTU) is resent datagram by datagram, and GSO is
/// turned off if that works. A datagram above the path MTU (`EMSGSIZE`) is
/// dropped and counted. Returns whether any send was refused as too big.
fn send_msgs(sock: &Socket, msgs: &[OutMsg<'_>], disable_gso: &mut bool, st: &mut IoStats) -> bool {
    let mut too_big = false;
    let mut done = 0;
    let mut stalls = 0;
    while done < msgs.len() {
        match sys::send_batch(sock, &msgs[done..]) {
            Ok(0) => {
                stalls += 1;
                st.tx_full_waits += 1;
                if stalls > 20 {
                    break;
                }
                sys::wait_writable(sock.as_raw_fd(), 1_000_000);
            }
            Ok(n) => {
                for m in &msgs[done..done + n] {
                    st.tx_msgs += 1;
                    st.tx_datagrams += m.datagrams as u64;
                    if m.segment.is_some() {
                        st.tx_gso_msgs += 1;
                    }
                }
                done += n;
            }
            Err(e) => {
                let m = &msgs[done];
                match m.segment {
                    Some(seg) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                        for one in datagrams_of(m.parts, usize::from(seg)) {
                            let single = OutMsg {
                                segment: None,
                                parts: one,
                                datagrams: 1,
                                ..*m
                            };
                            match sys::send_batch(sock, std::slice::from_ref(&single)) {
                                Ok(1) => {
                                    // The datagram goes alone: GSO was what
                                    // the kernel refused.
                                    *disable_gso = true;
                                    st.tx_msgs += 1;
                                    st.tx_datagrams += 1;
                                }
                                Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                                    too_big = true;
                                    st.tx_too_big += 1;
                                }
                                _ => st.tx_dropped += 1,
                            }
                        }
                    }
                    _ if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                        too_big = true;
                        st.tx_too_big += m.datagrams as u64;
                    }
                    _ => st.tx_dropped += m.datagrams as u64,
                }
                done += 1;
            }
        }
    }
    for m in &msgs[done..] {
        st.tx_dropped += m.datagrams as u64;
    }
    too_big
}

/// Split a GSO message's slices back into its datagrams: each datagram is
/// whole slices adding up to `seg` bytes (the last may be shorter).
fn datagrams_of<'a>(parts: &'a [&'a [u8]], seg: usize) -> impl Iterator<Item = &'a [&'a [u8]]> {
    let mut rest = parts;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut k = 0;
        while k < rest.len() && bytes < seg {
            bytes += rest[k].len();
            k += 1;
        }
        let (one, tail) = rest.split_at(k.max(1));
        rest = tail;
        Some(one)
    })
}

#[cfg(test)]
mod spin_guard_tests {
    use super::*;

    /// Feeds `guard` a reading every `PREEMPT_CHECK_NS` for `len_ns`, the
    /// thread waiting `wait_per_check_ns` for its CPU between readings;
    /// returns the time of the first reading that stops spinning.
    fn spin(
        guard: &mut SpinGuard,
        from_ns: u64,
        len_ns: u64,
        waited_total: &mut u64,
        wait_per_check_ns: u64,
    ) -> Option<u64> {
        let mut now = from_ns;
        while now < from_ns + len_ns {
            now += PREEMPT_CHECK_NS;
            *waited_total += wait_per_check_ns;
            if guard.waited_too_long(now, *waited_total) {
                guard.stop(now);
                return Some(now);
            }
        }
        None
    }

    #[test]
    fn a_few_microseconds_lost_now_and_then_do_not_stop_spinning() {
        let mut guard = SpinGuard::by_wait();
        let mut waited = 0;
        // 2 % of the time, for a second: what two spinners on two vCPUs
        // lose to kernel threads, at the 99th percentile.
        assert_eq!(
            spin(&mut guard, 1_000, 1_000_000_000, &mut waited, 1_000),
            None
        );
    }

    #[test]
    fn a_scheduler_slice_lost_to_a_hog_stops_spinning_at_the_first_look() {
        let mut guard = SpinGuard::by_wait();
        let mut waited = 0;
        assert_eq!(spin(&mut guard, 1_000, 10_000_000, &mut waited, 0), None);
        // The next reading comes 3 ms later: the thread sat out a slice.
        let now = 10_001_000 + 3_000_000;
        waited += 2_950_000;
        assert!(guard.waited_too_long(now, waited));
    }

    #[test]
    fn a_steady_share_of_waiting_above_an_eighth_stops_spinning() {
        let mut guard = SpinGuard::by_wait();
        let mut waited = 0;
        // 10 µs of every 50 (a fifth): stopped within one window.
        let at = spin(&mut guard, 1_000, 10_000_000, &mut waited, 10_000).expect("stopped");
        assert!(
            at <= 1_000 + CONTENTION_WINDOW_NS + PREEMPT_CHECK_NS,
            "stopped at {at}"
        );
        // A tenth is not.
        let mut guard = SpinGuard::by_wait();
        assert_eq!(
            spin(&mut guard, 1_000, 100_000_000, &mut waited, 5_000),
            None
        );
    }

    #[test]
    fn a_thread_contended_again_right_after_its_stop_stops_for_longer() {
        let mut guard = SpinGuard::by_wait();
        guard.stop(1_000);
        assert_eq!(guard.hold_ns, CONTENDED_HOLD_NS);
        let mut holds = Vec::new();
        for _ in 0..11 {
            let resumed = guard.contended_until_ns;
            guard.stop(resumed + guard.hold_ns / 2);
            holds.push(guard.hold_ns / 1_000_000);
        }
        assert_eq!(holds, [4, 8, 16, 32, 64, 128, 256, 512, 800, 800, 800]);
        // A stop-free spell as long as the hold: back to the start.
        let resumed = guard.contended_until_ns;
        guard.stop(resumed + CONTENDED_HOLD_MAX_NS + 1);
        assert_eq!(guard.hold_ns, CONTENDED_HOLD_NS);
    }

    #[test]
    fn the_wait_for_a_cpu_reads_where_the_kernel_keeps_it() {
        let Some(stat) = sys::ThreadSchedStat::open() else {
            eprintln!("SKIP: no /proc/thread-self/schedstat on this kernel");
            return;
        };
        let a = stat.run_delay_ns().expect("readable");
        std::thread::yield_now();
        let b = stat.run_delay_ns().expect("readable");
        assert!(b >= a, "the total wait went back: {a} then {b}");
    }
}
