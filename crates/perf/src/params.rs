//! What a run is asked to do: the parameters the client sends and the
//! server adopts ([`Params`]), with their limits, and each side's own
//! options that never travel ([`LocalOpts`]).

use crate::{RateLimit, Test};
use metaroce_udp::Impair;
use serde::{Deserialize, Serialize};

/// Parameters the client sends; the server adopts them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Params {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations (ignored when `duration_s > 0`).
    pub iters: u64,
    /// Run for this many seconds instead (0: by iterations).
    pub duration_s: u64,
    /// QPs.
    pub qps: u32,
    /// Outstanding work requests per QP.
    pub tx_depth: u32,
    /// Verify data.
    pub verify: bool,
    /// Payload bytes per packet; 0: each side sizes it from its path to
    /// the other (the largest that leaves unfragmented, at most
    /// [`AUTO_MTU_CAP`](crate::AUTO_MTU_CAP), or
    /// [`LOCAL_MTU_CAP`](crate::LOCAL_MTU_CAP) toward a peer on this host),
    /// and the smaller one is used.
    pub mtu: u32,
    /// Paths per connection.
    pub paths: u32,
    /// Seed of the verification pattern.
    pub pattern_seed: u64,
    /// Run until the client stops (perftest's `--run_infinitely`),
    /// reporting every `duration_s` seconds; the server then takes the
    /// side channel's close as the end of the run. Absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run_infinitely: bool,
    /// Bytes of buffer per side that successive messages cycle through
    /// (`--buffer-bytes`). Absent: perftest's cycle buffer, one page or
    /// one message if larger, so that a bandwidth test rewrites the same
    /// cache-warm bytes as `ib_write_bw` does (and as iperf3 and the raw
    /// UDP tests do). A larger buffer measures with cold caches; one
    /// smaller than a message holds one message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_bytes: Option<u64>,
}

/// Largest message size.
pub const MAX_SIZE: u64 = 64 << 20;
/// Most bytes of buffer per side (`--buffer-bytes`).
pub const MAX_BUFFER_BYTES: u64 = 64 << 20;
/// perftest's cycle buffer: messages smaller than a page share one page,
/// a larger message is rewritten in place (perftest sizes each QP's buffer
/// as the larger of the message and the page size).
pub const CYCLE_BUFFER_BYTES: u64 = 4096;
/// Most slots per buffer.
const MAX_SLOTS: u64 = 1024;
/// perftest's default CQ moderation: one signaled work request in 100.
pub const CQ_MOD: u32 = 100;
/// Above this message size perftest signals every work request unless
/// `-Q` asks otherwise (moderation is not needed there and skews the
/// figures).
pub const CQ_MOD_SIZE_LIMIT: u64 = 8192;
/// Most work requests per completion (`-Q`), perftest's limit.
pub const MAX_CQ_MOD: u32 = 1024;
/// Most bytes a work request may carry inline (`-I`), perftest's limit.
pub const MAX_INLINE: u32 = 1024;
/// Default work requests per `post_send` call (`-l`).
pub const POST_LIST: u32 = 32;
/// Seconds between reports with `--run_infinitely` and no `-D`
/// (perftest's default duration).
pub const INFINITE_REPORT_S: u64 = 5;

impl Params {
    /// Check ranges; the error is one line naming the option.
    pub fn validate(&self, test: Test) -> Result<(), String> {
        if test.is_atomic() && self.size != 8 {
            return Err(format!(
                "-s {}: atomic tests use 8-byte operands",
                self.size
            ));
        }
        if self.size == 0 || self.size > MAX_SIZE {
            return Err(format!("-s {} must be 1 ..= {MAX_SIZE}", self.size));
        }
        if self.duration_s == 0 && self.iters < 5 {
            return Err(format!("-n {} must be at least 5", self.iters));
        }
        if self.duration_s > 3600 {
            return Err(format!("-D {} must be at most 3600 s", self.duration_s));
        }
        if !(1..=64).contains(&self.qps) {
            return Err(format!("-q {} must be 1..=64", self.qps));
        }
        if !(1..=2048).contains(&self.tx_depth) {
            return Err(format!("-t {} must be 1..=2048", self.tx_depth));
        }
        if self.mtu != 0 && !(64..=65_000).contains(&self.mtu) {
            return Err(format!(
                "--mtu {} must be 64..=65000 (or left out: sized from the path)",
                self.mtu
            ));
        }
        if !(1..=128).contains(&self.paths) {
            return Err(format!("--paths {} must be 1..=128", self.paths));
        }
        if let Some(b) = self.buffer_bytes
            && !(1..=MAX_BUFFER_BYTES).contains(&b)
        {
            return Err(format!(
                "--buffer-bytes {b} must be 1 ..= {MAX_BUFFER_BYTES}"
            ));
        }
        if self.run_infinitely && (test.is_lat() || self.duration_s == 0) {
            return Err(
                "--run_infinitely runs bandwidth tests only, reporting every -D seconds".into(),
            );
        }
        Ok(())
    }

    /// Bytes of each side's buffer: [`slots`](Self::slots) messages (or
    /// atomic operands).
    pub fn buffer_len(&self, test: Test) -> u64 {
        let slots = self.slots(test);
        if test.is_atomic() {
            slots * 8
        } else {
            slots * self.size
        }
    }

    pub(crate) fn slots(&self, test: Test) -> u64 {
        let buffer = self
            .buffer_bytes
            .unwrap_or(CYCLE_BUFFER_BYTES.max(self.size))
            .min(MAX_BUFFER_BYTES);
        let by_cap = (buffer / self.size).clamp(1, MAX_SLOTS);
        let mut s = if self.duration_s == 0 {
            by_cap.min(self.iters)
        } else {
            by_cap
        };
        if test.is_atomic() {
            s = 64;
        }
        s.max(1)
    }
}

/// How a side posts and measures (perftest's `-Q`, `-l`, `-I`, `-N`):
/// its own choice, never sent to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measure {
    /// Signal one work request in this many (`-Q`); `None`: perftest's
    /// rule ([`CQ_MOD`], or every one above [`CQ_MOD_SIZE_LIMIT`] bytes).
    pub cq_mod: Option<u32>,
    /// At most this many work requests per `post_send` call (`-l`).
    pub post_list: u32,
    /// WRITE and SEND payloads up to this many bytes are copied into the
    /// work request at post time (`-I`); 0: never.
    pub inline_bytes: u32,
    /// Measure the peak bandwidth (off: `-N`).
    pub peak: bool,
}

impl Default for Measure {
    fn default() -> Self {
        Self {
            cq_mod: None,
            post_list: POST_LIST,
            inline_bytes: 0,
            peak: true,
        }
    }
}

impl Measure {
    /// The CQ moderation a run of `p` uses: as asked, or perftest's rule;
    /// never more than the TX depth (a QP could not reach its signaled
    /// request).
    pub fn cq_mod_for(&self, p: &Params) -> u32 {
        let asked = self.cq_mod.unwrap_or(if p.size > CQ_MOD_SIZE_LIMIT {
            1
        } else {
            CQ_MOD
        });
        asked.clamp(1, p.tx_depth.max(1))
    }

    /// Whether a `test` message of `size` bytes goes inline.
    pub fn inline(&self, test: Test, size: u64) -> bool {
        !matches!(
            test,
            Test::ReadBw | Test::ReadLat | Test::AtomicBw | Test::AtomicLat
        ) && size <= u64::from(self.inline_bytes)
    }

    /// Check ranges; the error is one line naming the option.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(q) = self.cq_mod
            && !(1..=MAX_CQ_MOD).contains(&q)
        {
            return Err(format!("-Q {q} must be 1..={MAX_CQ_MOD}"));
        }
        if !(1..=2048).contains(&self.post_list) {
            return Err(format!("-l {} must be 1..=2048", self.post_list));
        }
        if self.inline_bytes > MAX_INLINE {
            return Err(format!("-I {} must be 0..={MAX_INLINE}", self.inline_bytes));
        }
        Ok(())
    }
}

/// Local options of either side (not sent to the peer).
#[derive(Debug, Clone)]
pub struct LocalOpts {
    /// How this side posts and measures.
    pub measure: Measure,
    /// Receive-side impairment.
    pub impair: Option<Impair>,
    /// Seed of the core (keys, PSNs, ports).
    pub seed: u64,
    /// Device port (0: pick a free range; default
    /// [`DEFAULT_DEVICE_PORT`](metaroce_verbs::DEFAULT_DEVICE_PORT), 4793).
    pub dev_port: u16,
    /// If `dev_port`'s range is taken (another device on this host, such
    /// as `--loopback`'s other side), pick a free range instead of failing:
    /// on for the default port, off for a port the user named.
    pub dev_port_fallback: bool,
    /// Sees every datagram the device sends and receives (`--pcap`).
    pub capture: Option<std::sync::Arc<dyn metaroce_udp::CaptureHook>>,
    /// GSO / GRO allowed.
    pub offload: bool,
    /// Large WRITE payloads received straight into the memory region
    /// (off: `--no-direct`; see `DeviceConfig::direct_placement`).
    pub direct_placement: bool,
    /// Packet authentication (and optionally encryption) with this job
    /// secret; both sides must run the same.
    pub auth: Option<AuthOpts>,
    /// Offer to take, and send, data packets without the ICRC where the
    /// peer offers the same and packets are not authenticated (the UDP
    /// checksum protects them; wire.md 7.2). `--icrc` turns it off.
    pub icrc_omission: bool,
    /// Lower bound of every retransmission timeout, ns (0: the tools'
    /// default, [`RTO_MIN_NS`](crate::RTO_MIN_NS)).
    pub rto_min_ns: u64,
    /// Bytes of data packets sent on one path before the next path's turn
    /// (`None`: [`metaroce_udp::PATH_BURST_BYTES`]).
    pub path_burst_bytes: Option<u32>,
    /// Niceness of the device's engine thread
    /// ([`metaroce_udp::DeviceConfig::engine_nice`]).
    pub engine_nice: Option<i32>,
    /// Application polls stop spinning on a contended CPU
    /// ([`metaroce_udp::DeviceConfig::app_block_when_contended`]); `None`:
    /// bandwidth tests do (a stream loses nothing to a wake-up), latency
    /// tests spin (a ping-pong would pay one per message).
    pub block_when_contended: Option<bool>,
    /// The requester's software rate limiter of a bandwidth test
    /// (`--rate_limit`); `None`: post as fast as the QPs take work
    /// requests. A client's own choice: the server neither needs nor
    /// gets it.
    pub rate_limit: Option<RateLimit>,
}

impl LocalOpts {
    /// Whether the application thread of `test` blocks on a contended CPU.
    pub fn blocks_when_contended(&self, test: Test) -> bool {
        self.block_when_contended.unwrap_or(!test.is_lat())
    }
}

/// Packet protection for a perf run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AuthOpts {
    /// The job's 32-byte secret.
    pub job_secret: [u8; 32],
    /// Encrypt payloads too.
    pub encrypt: bool,
}

impl std::fmt::Debug for AuthOpts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthOpts")
            .field("job_secret", &"<hidden>")
            .field("encrypt", &self.encrypt)
            .finish()
    }
}

/// The name a side's protection goes by in the connection manager.
pub(crate) fn auth_mode(auth: Option<&AuthOpts>) -> &'static str {
    match auth {
        None => "none",
        Some(a) if a.encrypt => "encrypted",
        Some(_) => "authenticated",
    }
}

impl Default for LocalOpts {
    fn default() -> Self {
        Self {
            measure: Measure::default(),
            impair: None,
            seed: metaroce_udp::os_seed(),
            dev_port: metaroce_verbs::DEFAULT_DEVICE_PORT,
            dev_port_fallback: true,
            capture: None,
            offload: true,
            direct_placement: true,
            auth: None,
            icrc_omission: true,
            rto_min_ns: 0,
            path_burst_bytes: None,
            engine_nice: None,
            block_when_contended: None,
            rate_limit: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(size: u64, buffer_bytes: Option<u64>) -> Params {
        Params {
            size,
            iters: 5000,
            duration_s: 3,
            qps: 1,
            tx_depth: 128,
            verify: true,
            mtu: 0,
            paths: 16,
            pattern_seed: 1,
            run_infinitely: false,
            buffer_bytes,
        }
    }

    /// perftest's cycle buffer: one page shared by small messages, one
    /// message rewritten in place above a page.
    #[test]
    fn the_default_buffer_is_perftests() {
        assert_eq!(params(8, None).buffer_len(Test::WriteBw), 4096);
        assert_eq!(params(65_536, None).buffer_len(Test::WriteBw), 65_536);
        assert_eq!(params(65_536, None).slots(Test::ReadBw), 1);
        assert_eq!(params(1 << 20, None).buffer_len(Test::SendBw), 1 << 20);
    }

    #[test]
    fn a_larger_buffer_cycles_messages_through_it() {
        let p = params(65_536, Some(MAX_BUFFER_BYTES));
        assert_eq!(p.slots(Test::WriteBw), 1024);
        assert_eq!(p.buffer_len(Test::WriteBw), MAX_BUFFER_BYTES);
        // Smaller than a message: one message.
        assert_eq!(params(65_536, Some(100)).buffer_len(Test::WriteBw), 65_536);
        // By iterations, no more slots than messages.
        let mut q = params(4096, Some(1 << 20));
        q.duration_s = 0;
        q.iters = 10;
        assert_eq!(q.slots(Test::WriteBw), 10);
    }

    /// Streams stop spinning on a contended CPU, ping-pongs do not, and
    /// either flag overrides that.
    #[test]
    fn bandwidth_tests_block_when_contended_latency_tests_spin() {
        let mut l = LocalOpts::default();
        assert!(l.blocks_when_contended(Test::WriteBw));
        assert!(!l.blocks_when_contended(Test::WriteLat));
        l.block_when_contended = Some(true);
        assert!(l.blocks_when_contended(Test::WriteLat));
        l.block_when_contended = Some(false);
        assert!(!l.blocks_when_contended(Test::ReadBw));
    }

    #[test]
    fn a_buffer_out_of_range_is_refused_naming_the_option() {
        for b in [0, MAX_BUFFER_BYTES + 1] {
            let err = params(65_536, Some(b)).validate(Test::WriteBw).unwrap_err();
            assert!(err.starts_with("--buffer-bytes"), "{err}");
        }
    }
}
