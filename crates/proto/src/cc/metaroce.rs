//! The MetaRoCE controller: per-path DCTCP-style ECN AIMD, a connection-level
//! AIMD window, and the receiver rate hint as an immediate cap.
//!
//! # State
//!
//! Per path:
//! * `window` — bytes, in `[mss, max_path_window]`.
//! * `alpha` — DCTCP estimate of the fraction of CE-marked packets, an EWMA
//!   with gain `g` updated once per observation window (one path RTT of ACKs).
//! * `last_ecn_cut_ns` / `last_loss_cut_ns` — a path is cut at most once per
//!   path RTT for ECN and at most once per path RTT for loss: the marks/losses
//!   reported during the RTT after a cut were caused by the window before the
//!   cut, so cutting again would over-react.
//! * `probation` — a fresh path (after `on_path_replaced`) or a suspect path
//!   (after an RTO) doubles its window per RTT of clean ACKs, up to its fair
//!   share of the connection window, instead of growing by one MSS per RTT.
//!
//! Per connection:
//! * `conn_window` — bytes, in `[mss, min(max_conn_window, rate_cap)]`.
//!   Starts at the BDP (`line_rate * base_rtt / 8`): MetaRoCE starts at line
//!   rate. A path cut is subtracted from it (ECN, for a sender its receiver
//!   capped: `alpha / 2` of the bytes the path had in flight, which is the
//!   path's own cut when the path is window-limited; loss: half the path
//!   window; RTO: what the path gave up), so one marked path costs the
//!   connection only that path's share while many marked paths shrink it
//!   proportionally. A sender its receiver did not cap loses to an ECN
//!   mark only what the marked path could not give up itself (at its
//!   one-MSS floor): its path windows bound it, and a marked path's bytes
//!   move to the others. The ECN and loss cuts
//!   are nominal, i.e. they still apply when the one-MSS floor keeps a path
//!   from shrinking: with 256 paths the floors alone exceed the BDP of a
//!   400 Gb/s fabric, and the connection window must still be able to
//!   drain a queue. While ACKs are clean it grows by the sum of the per-path
//!   additive increases (`ai * mss` per RTT per path, at most
//!   `max_conn_ai_mss_per_rtt` MSS per RTT), but never beyond the sum of the
//!   path windows (it could not be used) nor beyond its caps.
//! * `min_rtt` — the smallest RTT sample of any path (the configured base RTT
//!   until the first sample); the rate cap is sized with it.
//! * `rate_cap` — from the receiver hint:
//!   `rate * min(srtt, min_rtt) / 8 + headroom`. The connection window is
//!   clamped to it immediately (one call), which is what settles an incast
//!   within a round trip. The propagation RTT is used rather than the
//!   smoothed RTT because with `rate * srtt` any standing queue at the
//!   receiver would be a fixed point and the incast queue would never drain.
//!   The bytes the clamp took away are remembered and handed back when the
//!   hint rises again, unless the fabric pushed back (ECN/loss/RTO cut) in
//!   the meantime. A hint of 0 removes the cap.
//!
//! Note for the connection owner: the "one packet on an idle path" exemption
//! should not bypass the connection window when the connection already has
//! data in flight, otherwise `path_count * mss` (1 MB with 256 paths of 4 KB)
//! is an uncontrollable floor on the bytes in flight.
//!
//! # Events
//!
//! * Clean ACK: path grows (additively, or by the acked bytes on probation)
//!   if it was window-limited; connection grows additively.
//! * ACK with CE marks: no growth; if the path was not cut in the last RTT,
//!   `window -= window * alpha / 2` and a capped connection loses
//!   `alpha / 2` of the path's in-flight bytes; an uncapped one loses only
//!   what of that the path's floor kept it from giving up.
//! * Loss (SACK gap): path halved (once per RTT), connection loses the same
//!   bytes. `lost_bytes` only gates the call (0 = no-op): one cut per RTT
//!   whatever the batch size, as for ECN.
//! * RTO: path to one MSS and on probation; connection loses the same bytes.
//! * Path replaced: fresh state, two-MSS window, on probation; the connection
//!   window is unchanged (the other paths absorb the retired path's share).

use super::{AckSample, CcConfig, CcMetrics, CongestionController, PathSlot};
use crate::maybe_ns::MaybeNs;

/// Tunables of [`MetaRoceCc`]. Out-of-range values are sanitized by
/// [`MetaRoceCc::new`] (see each field).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetaRoceParams {
    /// EWMA gain `g` of the per-path ECN fraction estimator `alpha`.
    ///
    /// Default `1/16`, DCTCP's recommended value: it averages over ~16
    /// RTTs, enough to smooth the very coarse per-RTT fraction of a path
    /// that only carries a few packets per RTT. Clamped to `(0, 1]`.
    pub ecn_gain: f64,
    /// `alpha` of a new or replaced path.
    ///
    /// Default `1.0` (like Linux DCTCP): a path with no history reacts to its
    /// first marks by halving, i.e. as conservatively as classic ECN, until
    /// its estimator has learned how heavily the path is actually marked.
    /// Clamped to `[0, 1]`.
    pub initial_alpha: f64,
    /// Additive increase of a clean, window-limited path, in MSS per path RTT.
    ///
    /// Default `1.0`, the classic AIMD increase; the connection window grows by
    /// the sum over paths. Clamped to `[0, 1024]`.
    pub ai_mss_per_rtt: f64,
    /// Upper bound of the connection window's additive increase, in MSS per
    /// RTT per NIC plane.
    ///
    /// The connection grows by the sum of the per-path increases,
    /// `ai_mss_per_rtt * path_count` MSS per RTT, but at most this much.
    /// Default `16.0`, i.e. no limit at the default 16 paths; with 256 paths
    /// the unbounded sum would be 256 MSS (~1 MB) per RTT, about two BDPs of
    /// a 400 Gb/s, 10 us fabric, which no ECN loop can follow. Each plane is
    /// a fabric with its own ECN loop, so the cap is per plane: a NIC of 8
    /// planes of 100 Gb/s has 8 times the BDP, and one cap of 16 MSS per
    /// RTT for all of them regrew its window after each ECN cut 8 times as
    /// slowly in BDPs (steady state 82 % of the line against 94 % at one
    /// plane). Clamped to `[0, 65536]`.
    pub max_conn_ai_mss_per_rtt: f64,
    /// Upper bound of the connection window as a multiple of the BDP.
    ///
    /// Default `4`: room for RTT inflation under load and a misconfigured
    /// `base_rtt`, while bounding the damage of a connection that grows its
    /// window while application-limited. At least `1`.
    pub max_conn_window_bdp_multiple: u64,
    /// Headroom added to the receiver rate cap, in MSS.
    ///
    /// Default `2`: one packet of rounding plus one packet of slack so a
    /// sender at its exact share keeps its ACK clock running and can notice
    /// when the share grows.
    pub rate_cap_headroom_mss: u64,
    /// Window of a path on probation after `on_path_replaced`, in MSS.
    ///
    /// Default `2`: enough to get an RTT sample and keep ACKs flowing on a
    /// route about which nothing is known yet. At least `1`.
    pub probation_window_mss: u64,
    /// Minimum initial window of each path, in MSS.
    ///
    /// Default `2`: with many paths the even split of the BDP can be below one
    /// packet; two packets per path keep every path's ACK clock and ECN
    /// feedback alive. At least `1`.
    pub min_initial_path_window_mss: u64,
    /// Window of a connection that has heard nothing from its receiver yet
    /// (new, or idle long enough that what it heard is stale), in MSS.
    ///
    /// Default `1`: a sender cannot know whether others are starting toward
    /// the same receiver at the same moment; only the receiver's first ACK
    /// can say. One packet each keeps a 64-sender incast's first round trip
    /// within about one and a half BDPs of a 100 Gb/s fabric; the ACK then
    /// lifts a lone sender straight to a full BDP (no slow start), so
    /// starting cold costs one round trip. `0`: start at a full BDP.
    pub initial_window_mss: u64,
    /// A loss cuts a path's window only if the path saw ECN marks within
    /// this many of its RTTs: on a fabric that marks before it drops,
    /// a loss without marks is corruption or a random drop, not congestion.
    ///
    /// Default `4`. `0`: every loss is congestion (as TCP assumes).
    pub loss_needs_ecn_rtts: f64,
}

impl Default for MetaRoceParams {
    fn default() -> Self {
        Self {
            ecn_gain: 1.0 / 16.0,
            initial_alpha: 1.0,
            ai_mss_per_rtt: 1.0,
            max_conn_ai_mss_per_rtt: 16.0,
            max_conn_window_bdp_multiple: 4,
            rate_cap_headroom_mss: 0,
            probation_window_mss: 2,
            min_initial_path_window_mss: 2,
            initial_window_mss: 1,
            loss_needs_ecn_rtts: 4.0,
        }
    }
}

impl MetaRoceParams {
    /// The tunables by name (see [`crate::knob`]); the ranges are those
    /// [`MetaRoceCc::new`] would otherwise clamp to.
    pub const KNOBS: &'static [crate::knob::Knob<Self>] = &[
        crate::real_knob!(
            Self,
            ecn_gain,
            1e-6,
            1.0,
            "EWMA gain of each path's marked-fraction estimate alpha"
        ),
        crate::real_knob!(
            Self,
            initial_alpha,
            0.0,
            1.0,
            "alpha of a new or replaced path"
        ),
        crate::real_knob!(
            Self,
            ai_mss_per_rtt,
            0.0,
            1024.0,
            "additive increase of a clean path, MSS per path RTT"
        ),
        crate::real_knob!(
            Self,
            max_conn_ai_mss_per_rtt,
            0.0,
            65536.0,
            "cap of the connection window's additive increase, MSS per RTT per NIC plane"
        ),
        crate::int_knob!(Self, max_conn_window_bdp_multiple: u64, 1, 1024, "connection window cap, in BDPs"),
        crate::int_knob!(Self, rate_cap_headroom_mss: u64, 0, 1024, "headroom added to the receiver's rate cap, MSS"),
        crate::int_knob!(Self, probation_window_mss: u64, 1, 256, "window of a replaced path, MSS"),
        crate::int_knob!(Self, min_initial_path_window_mss: u64, 1, 256, "smallest initial window of each path, MSS"),
        crate::int_knob!(Self, initial_window_mss: u64, 0, 65536, "window of a connection that has heard nothing from its receiver yet, MSS (0: a full BDP)"),
        crate::real_knob!(
            Self,
            loss_needs_ecn_rtts,
            0.0,
            1e6,
            "a loss cuts a path only if it saw ECN marks within this many RTTs (0: every loss)"
        ),
    ];

    fn sanitized(self) -> Self {
        fn clamp(v: f64, lo: f64, hi: f64, fallback: f64) -> f64 {
            if v.is_nan() {
                fallback
            } else {
                v.clamp(lo, hi)
            }
        }
        let d = Self::default();
        let mut ecn_gain = clamp(self.ecn_gain, 0.0, 1.0, d.ecn_gain);
        if ecn_gain <= 0.0 {
            ecn_gain = d.ecn_gain;
        }
        Self {
            ecn_gain,
            initial_alpha: clamp(self.initial_alpha, 0.0, 1.0, d.initial_alpha),
            ai_mss_per_rtt: clamp(self.ai_mss_per_rtt, 0.0, 1024.0, d.ai_mss_per_rtt),
            max_conn_ai_mss_per_rtt: clamp(
                self.max_conn_ai_mss_per_rtt,
                0.0,
                65536.0,
                d.max_conn_ai_mss_per_rtt,
            ),
            max_conn_window_bdp_multiple: self.max_conn_window_bdp_multiple.max(1),
            rate_cap_headroom_mss: self.rate_cap_headroom_mss,
            probation_window_mss: self.probation_window_mss.max(1),
            min_initial_path_window_mss: self.min_initial_path_window_mss.max(1),
            initial_window_mss: self.initial_window_mss,
            loss_needs_ecn_rtts: clamp(self.loss_needs_ecn_rtts, 0.0, 1e6, d.loss_needs_ecn_rtts),
        }
    }
}

/// Per-path controller state.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PathState {
    /// Window in bytes, in `[mss, max_path]`.
    window: u64,
    /// DCTCP marked-fraction estimate in `[0, 1]`.
    alpha: f64,
    /// Start of the current alpha observation window (None until the first ACK).
    obs_start_ns: MaybeNs,
    /// Packets acknowledged in the current observation window.
    obs_acked: u32,
    /// CE-marked packets reported in the current observation window.
    obs_ce: u32,
    /// Time of the last ECN cut.
    last_ecn_cut_ns: MaybeNs,
    /// Time of the last loss (or RTO) cut.
    last_loss_cut_ns: MaybeNs,
    /// Latest smoothed RTT of the path (base RTT until the first sample).
    /// 32 bits, like the path's `RttEstimator` it comes from, whose values
    /// (and the endpoint's base RTT) always fit: that saves 8 bytes per
    /// path. Only a direct caller could pass 4.29 s or more; it is then
    /// saturated, so a cut may follow the last one after 4.29 s rather than
    /// after one RTT.
    srtt_ns: u32,
    /// Doubling per RTT up to the fair share instead of additive increase.
    probation: bool,
    /// When the path last reported CE marks.
    last_ce_ns: MaybeNs,
    /// Its window before the last RTO, and what the connection gave up
    /// with it: what undoing a spurious RTO restores.
    pre_rto_window: u64,
    rto_given_up: u64,
}

/// The MetaRoCE congestion controller. See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaRoceCc {
    params: MetaRoceParams,
    mss: u64,
    base_rtt_ns: u64,
    /// Effective per-path cap: `max(max_path_window_bytes, mss)`.
    max_path: u64,
    /// Connection window cap: `max(bdp * multiple, mss)`.
    max_conn: u64,
    /// Paths of the connection (`CcConfig::path_count`).
    path_count: usize,
    /// Window every path starts with.
    initial_path_window: u64,
    /// The paths that have had an event, always the first slots: a path
    /// is built on its first event, as the connection builds its paths on
    /// first use; until then it is a fresh path with the initial window
    /// (see `path_mut`).
    paths: Vec<PathState>,
    /// Sum of all path windows, also of paths not built yet (kept
    /// incrementally; u128 so it cannot saturate).
    sum_path_windows: u128,
    conn_window: u64,
    /// Receiver rate cap in bytes of window (None = no cap).
    rate_cap_bytes: Option<u64>,
    rate_cap_bps: u64,
    /// Smallest RTT sample seen on any path (None until the first sample).
    min_rtt_ns: Option<u64>,
    /// Connection window removed by the rate cap, restorable when the hint rises.
    capped_excess: u64,
    ecn_reductions: u64,
    loss_reductions: u64,
    rto_reductions: u64,
    /// One BDP at line rate over the base RTT.
    bdp: u64,
    /// `max_conn_ai_mss_per_rtt` for all the connection's planes.
    conn_ai_cap_mss_per_rtt: f64,
    /// Nothing heard from the receiver yet: the next ACK's grant sets the
    /// window outright.
    cold: bool,
    /// The receiver's longest ACK hold (`CcConfig::ack_delay_ns`).
    ack_delay_ns: u64,
    /// Losses not taken as congestion (no recent ECN on their path).
    random_losses: u64,
    /// When the connection window was last cut (ECN, loss, RTO).
    last_cut_ns: MaybeNs,
}

/// `a * b / c` without intermediate overflow, saturating at `u64::MAX`.
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    let r = u128::from(a) * u128::from(b) / u128::from(c.max(1));
    u64::try_from(r).unwrap_or(u64::MAX)
}

/// `ns`, saturated to 32 bits (see `PathState::srtt_ns`).
fn ns_u32(ns: u64) -> u32 {
    u32::try_from(ns).unwrap_or(u32::MAX)
}

/// What an ECN mark on one path takes from the connection window of a
/// sender its receiver did not cap: the part of the nominal cut
/// (`conn_cut`) that the path's own window could not give up (it was at
/// its one-MSS floor), nothing more. Such a sender is alone at its
/// receiver, and its marks come from routes it shares with other flows;
/// the marked path's smaller window already moves its bytes to the
/// other paths (the round robin skips a path without room), and the path
/// windows bound the connection's bytes in flight. Taking each marked
/// path's cut from the connection as well shrank it for every route
/// collision any of its paths met, though most of its routes were
/// clear: in the 1,024-host permutation at 400 Gb/s a slow flow kept
/// 480-620 KB in flight, under the 630 KB of a propagation BDP, while
/// queues on the way stretched its round trip from 12.6 to 15-17 µs,
/// and ran at 67 % of its line (64 paths: 210.2 µs before, 199.7 now).
/// What the floor kept still comes off, so that a connection of many
/// paths, whose floors alone exceed the BDP, can drain a queue. A capped
/// sender loses the whole cut: its marks are mostly its receiver's
/// queue, which the admission's headroom waits to see empty (transport
/// spec §1 and §2).
fn uncapped_cut(conn_cut: u64, path_given_up: u64) -> u64 {
    conn_cut.saturating_sub(path_given_up)
}

/// Converts a non-negative finite-or-not f64 byte count to u64 (saturating; NaN -> 0).
fn f64_bytes(v: f64) -> u64 {
    // `as` from f64 to u64 saturates and maps NaN to 0, which is what we want.
    v as u64
}

impl MetaRoceCc {
    /// Creates a controller. Degenerate configuration values are tolerated:
    /// an MSS of 0 is treated as 1 byte, a zero base RTT or line rate gives a
    /// one-MSS initial BDP, and a path cap below one MSS is raised to one MSS.
    pub fn new(config: CcConfig, params: MetaRoceParams) -> Self {
        let params = params.sanitized();
        let mss = config.mss_bytes.max(1);
        let bdp = mul_div(config.line_rate_bps, config.base_rtt_ns, 8_000_000_000).max(mss);
        let max_path = config.max_path_window_bytes.max(mss);
        let max_conn = bdp
            .saturating_mul(params.max_conn_window_bdp_multiple)
            .max(mss);
        let n = u64::try_from(config.path_count.max(1)).unwrap_or(u64::MAX);
        // Whole packets per path, rounded up: a path sends a packet only
        // if all of it fits, so a share of 2.6 packets carries 2, and 16
        // paths sharing one BDP at 100 Gb/s over 14 µs (42 packets of
        // 4,160 bytes) carried 32 of them; a connection started at line
        // rate, or by its first grant, then went silent for 4 µs in its
        // first round trip. The connection window still caps the sum.
        let initial_path = (bdp / n)
            .div_ceil(mss)
            .saturating_mul(mss)
            .max(mss.saturating_mul(params.min_initial_path_window_mss))
            .min(max_path);
        let base_rtt_ns = config.base_rtt_ns;
        let sum_path_windows = u128::from(initial_path) * config.path_count as u128;
        Self {
            params,
            mss,
            base_rtt_ns,
            max_path,
            max_conn,
            path_count: config.path_count,
            initial_path_window: initial_path,
            paths: Vec::new(),
            sum_path_windows,
            conn_window: if params.initial_window_mss == 0 {
                bdp
            } else {
                mss.saturating_mul(params.initial_window_mss).min(bdp)
            },
            rate_cap_bytes: None,
            rate_cap_bps: 0,
            min_rtt_ns: None,
            capped_excess: 0,
            ecn_reductions: 0,
            loss_reductions: 0,
            rto_reductions: 0,
            bdp,
            conn_ai_cap_mss_per_rtt: params.max_conn_ai_mss_per_rtt
                * f64::from(config.planes.max(1)),
            cold: params.initial_window_mss != 0,
            ack_delay_ns: config.ack_delay_ns,
            random_losses: 0,
            last_cut_ns: MaybeNs::NONE,
        }
    }

    /// The tunables in force (after sanitizing).
    pub fn params(&self) -> &MetaRoceParams {
        &self.params
    }

    fn fresh_path(
        params: &MetaRoceParams,
        window: u64,
        srtt_ns: u64,
        probation: bool,
    ) -> PathState {
        PathState {
            window,
            alpha: params.initial_alpha,
            obs_start_ns: MaybeNs::NONE,
            obs_acked: 0,
            obs_ce: 0,
            last_ecn_cut_ns: MaybeNs::NONE,
            last_loss_cut_ns: MaybeNs::NONE,
            srtt_ns: ns_u32(srtt_ns),
            probation,
            last_ce_ns: MaybeNs::NONE,
            pre_rto_window: 0,
            rto_given_up: 0,
        }
    }

    /// Upper bound of the connection window right now.
    fn conn_upper(&self) -> u64 {
        let cap = self.rate_cap_bytes.unwrap_or(u64::MAX);
        self.max_conn.min(cap).max(self.mss)
    }

    fn path_count_u64(&self) -> u64 {
        u64::try_from(self.path_count.max(1)).unwrap_or(u64::MAX)
    }

    /// A path as it starts (the connection's first window share).
    fn initial_path(&self) -> PathState {
        Self::fresh_path(
            &self.params,
            self.initial_path_window,
            self.base_rtt_ns,
            false,
        )
    }

    /// Path `path`'s state, built (with the paths before it) on its first
    /// event; `None` past the connection's paths.
    fn path_mut(&mut self, path: PathSlot) -> Option<&mut PathState> {
        if path >= self.path_count {
            return None;
        }
        while self.paths.len() <= path {
            let fresh = self.initial_path();
            crate::grow::push(&mut self.paths, fresh);
        }
        Some(&mut self.paths[path])
    }

    /// Path `path`'s state as it reads now (a path not built yet reads
    /// as it starts); `None` past the connection's paths.
    fn path(&self, path: PathSlot) -> Option<PathState> {
        match self.paths.get(path) {
            Some(p) => Some(*p),
            None => (path < self.path_count).then(|| self.initial_path()),
        }
    }

    /// Sets a path window (clamped to `[mss, max_path]`), keeping the sum
    /// current; returns the bytes the path gave up (0 if it grew). The path
    /// exists (callers built it).
    fn set_path_window(&mut self, path: PathSlot, window: u64) -> u64 {
        let window = window.clamp(self.mss, self.max_path);
        let p = &mut self.paths[path];
        let old = p.window;
        p.window = window;
        self.sum_path_windows = self.sum_path_windows - u128::from(old) + u128::from(window);
        old.saturating_sub(window)
    }

    /// A path gave up `bytes`: the connection gives up the same bytes, and
    /// the rate-cap memory is dropped (the fabric pushed back).
    fn shrink_connection(&mut self, bytes: u64) {
        self.conn_window = self.conn_window.saturating_sub(bytes).max(self.mss);
        self.capped_excess = 0;
    }

    /// Whether a cut stamped at `last` may be repeated at `now` (one per RTT).
    fn may_cut(last: MaybeNs, now_ns: u64, srtt_ns: u64) -> bool {
        last.get()
            .is_none_or(|t| now_ns.saturating_sub(t) >= srtt_ns)
    }

    /// The window a grant of `rate_bps` needs over a round trip of
    /// `rtt_ns`: the grant's bytes in one round trip and in the longest
    /// the receiver may hold its ACK. Without the second part a sender
    /// near its receiver stalls below its grant: two senders into one host
    /// of their own ToR (4.7 µs apart, 47.5 Gb/s each) got windows of 6.7
    /// packets, and with ACKs every four packets or 4 µs they ran at
    /// 35 Gb/s. The sender is paced at the grant, so the larger window
    /// cannot raise its rate, and at many senders it adds little (a
    /// 256-sender incast: 185 bytes each).
    fn grant_window(&self, rate_bps: u64, rtt_ns: u64) -> u64 {
        mul_div(
            rate_bps,
            rtt_ns.saturating_add(self.ack_delay_ns),
            8_000_000_000,
        )
        .max(self.mss)
    }

    fn fair_share(&self) -> u64 {
        (self.conn_window / self.path_count_u64())
            .max(self.mss.saturating_mul(self.params.probation_window_mss))
            .min(self.max_path)
    }

    /// Current ECN estimate of a path (for tests and tracing).
    pub fn path_alpha(&self, path: PathSlot) -> Option<f64> {
        self.path(path).map(|p| p.alpha)
    }

    /// Whether a path is on probation (for tests and tracing).
    pub fn path_on_probation(&self, path: PathSlot) -> bool {
        self.path(path).is_some_and(|p| p.probation)
    }

    fn grow_on_clean_ack(&mut self, path: PathSlot, s: &AckSample) {
        let mss = self.mss;
        let fair = self.fair_share();
        let ai = self.params.ai_mss_per_rtt;
        let p = &self.paths[path];
        let w = p.window;
        // Grow only a path that used its window: before this ACK it had at
        // least `window - mss` in flight (it could not send one more packet).
        let inflight_before = s.path_inflight_bytes.saturating_add(s.acked_bytes);
        if inflight_before.saturating_add(mss) > w {
            if p.probation {
                // Slow-start-like doubling: each acked byte adds one byte,
                // i.e. the window doubles per RTT of clean ACKs.
                let target = fair.max(w);
                let new = w.saturating_add(s.acked_bytes).min(target);
                self.set_path_window(path, new);
                if new >= target || self.paths[path].window >= self.max_path {
                    self.paths[path].probation = false;
                }
            } else {
                // ai*mss per window's worth of acked bytes = ai*mss per RTT.
                let inc = f64_bytes(ai * mss as f64 * s.acked_bytes as f64 / w as f64);
                self.set_path_window(path, w.saturating_add(inc));
            }
        }
        // Connection: the sum of the per-path increases, i.e. ai*mss per RTT
        // per path, computed from the connection's own acked bytes so that it
        // still grows while the connection window (not the paths) binds.
        let n = self.path_count_u64() as f64;
        let per_rtt = (ai * n).min(self.conn_ai_cap_mss_per_rtt);
        let inc = f64_bytes(per_rtt * mss as f64 * s.acked_bytes as f64 / self.conn_window as f64);
        // Never grow past what the paths could carry, nor past the caps.
        let limit = u64::try_from(self.sum_path_windows)
            .unwrap_or(u64::MAX)
            .min(self.conn_upper());
        if self.conn_window < limit {
            self.conn_window = self.conn_window.saturating_add(inc).min(limit);
        }
    }
}

impl CongestionController for MetaRoceCc {
    fn name(&self) -> &'static str {
        "metaroce"
    }

    fn on_ack(&mut self, path: PathSlot, s: &AckSample) {
        if self.path_mut(path).is_none() {
            return;
        }
        if let Some(rtt) = s.rtt_ns.filter(|&r| r > 0) {
            self.min_rtt_ns = Some(self.min_rtt_ns.map_or(rtt, |m| m.min(rtt)));
        }
        let g = self.params.ecn_gain;
        let base_rtt = self.base_rtt_ns;
        let p = &mut self.paths[path];
        if s.srtt_ns > 0 {
            p.srtt_ns = ns_u32(s.srtt_ns);
        } else if p.srtt_ns == 0 {
            p.srtt_ns = ns_u32(base_rtt);
        }
        let srtt = u64::from(p.srtt_ns);

        // DCTCP estimator: fold one RTT of ACKs into alpha.
        let start = p.obs_start_ns.get().unwrap_or(s.now_ns);
        p.obs_start_ns = MaybeNs::some(start);
        p.obs_acked = p.obs_acked.saturating_add(s.acked_packets);
        p.obs_ce = p.obs_ce.saturating_add(s.ce_packets);
        if s.now_ns.saturating_sub(start) >= srtt && p.obs_acked > 0 {
            let frac = (p.obs_ce as f64 / p.obs_acked as f64).min(1.0);
            p.alpha = ((1.0 - g) * p.alpha + g * frac).clamp(0.0, 1.0);
            p.obs_start_ns = MaybeNs::some(s.now_ns);
            p.obs_acked = 0;
            p.obs_ce = 0;
        }

        if s.ce_packets > 0 {
            p.probation = false;
            p.last_ce_ns = MaybeNs::some(s.now_ns);
            if Self::may_cut(p.last_ecn_cut_ns, s.now_ns, srtt) {
                p.last_ecn_cut_ns = MaybeNs::some(s.now_ns);
                let w = p.window;
                let alpha = p.alpha;
                let cut = f64_bytes(w as f64 * alpha / 2.0);
                let given_up = self.set_path_window(path, w.saturating_sub(cut));
                // The connection loses what this path contributes: the same
                // alpha/2 of the bytes the path actually had in flight,
                // which is the path's own cut when the path is
                // window-limited, and keeps working when the path is
                // floored at one MSS (with many paths the floors alone can
                // exceed the BDP) or when its window is larger than its
                // traffic. A sender its receiver did not cap loses only
                // what the path could not give up itself (`uncapped_cut`).
                let contribution = s
                    .path_inflight_bytes
                    .saturating_add(s.acked_bytes)
                    .max(self.mss)
                    .min(w);
                let conn_cut = f64_bytes(contribution as f64 * alpha / 2.0);
                debug_assert!(contribution < w || conn_cut >= given_up);
                if self.rate_cap_bps != 0 {
                    self.shrink_connection(conn_cut);
                    self.last_cut_ns = MaybeNs::some(s.now_ns);
                } else {
                    let kept = uncapped_cut(conn_cut, given_up);
                    if kept > 0 {
                        self.shrink_connection(kept);
                        self.last_cut_ns = MaybeNs::some(s.now_ns);
                    }
                }
                self.ecn_reductions = self.ecn_reductions.saturating_add(1);
            }
            return;
        }
        if s.acked_bytes > 0 {
            self.grow_on_clean_ack(path, s);
        }
    }

    fn on_loss(&mut self, path: PathSlot, lost_bytes: u64, now_ns: u64) {
        if lost_bytes == 0 || self.path_mut(path).is_none() {
            return;
        }
        let p = &mut self.paths[path];
        p.probation = false;
        let recent_ce = p.last_ce_ns.get().is_some_and(|t| {
            (now_ns.saturating_sub(t) as f64)
                < self.params.loss_needs_ecn_rtts * f64::from(p.srtt_ns.max(1))
        });
        if self.params.loss_needs_ecn_rtts > 0.0 && !recent_ce {
            // No congestion seen on this path lately: a random loss. The
            // segment is resent; the windows stay.
            self.random_losses = self.random_losses.saturating_add(1);
            return;
        }
        if !Self::may_cut(p.last_loss_cut_ns, now_ns, u64::from(p.srtt_ns)) {
            return;
        }
        p.last_loss_cut_ns = MaybeNs::some(now_ns);
        let w = p.window;
        self.set_path_window(path, w / 2);
        // The nominal cut, also when the one-MSS floor keeps the path window
        // from giving it up (see the ECN case).
        self.shrink_connection(w - w / 2);
        self.last_cut_ns = MaybeNs::some(now_ns);
        self.loss_reductions = self.loss_reductions.saturating_add(1);
    }

    fn on_trim(&mut self, path: PathSlot, lost_bytes: u64, now_ns: u64) {
        // A trim is a full queue on the path's route: as good as a CE mark,
        // so the loss is taken as congestion (not as a random loss).
        if let Some(p) = self.path_mut(path) {
            p.last_ce_ns = MaybeNs::some(now_ns);
        }
        self.on_loss(path, lost_bytes, now_ns);
    }

    fn on_rto(&mut self, path: PathSlot, now_ns: u64) {
        if self.path_mut(path).is_none() {
            return;
        }
        let p = &mut self.paths[path];
        // The path is suspect: one packet at a time until clean ACKs prove it,
        // then regrow quickly (probation) to the fair share.
        p.probation = true;
        p.last_loss_cut_ns = MaybeNs::some(now_ns);
        p.obs_start_ns = MaybeNs::NONE;
        p.obs_acked = 0;
        p.obs_ce = 0;
        let before = self.paths[path].window;
        let given_up = self.set_path_window(path, self.mss);
        self.shrink_connection(given_up);
        self.paths[path].pre_rto_window = before;
        self.paths[path].rto_given_up = given_up;
        self.rto_reductions = self.rto_reductions.saturating_add(1);
        self.last_cut_ns = MaybeNs::some(now_ns);
    }

    fn on_rate_hint(&mut self, rate_bps: u64, srtt_ns: u64, now_ns: u64) {
        // The receiver's first word (a cold start: an idle receiver, no cap,
        // lets us go to a full BDP at once; a busy one names our share), or
        // more of its link than before (a sender beside us finished, or our
        // first grant was held to what was not yet promised): a grant is
        // room the receiver has set aside, taken now rather than grown into
        // one packet per path per round trip (which left a receiver of two
        // senders at half its line for 50 µs), unless the fabric pushed
        // back lately. The path windows still bound the sum (a congested
        // route).
        let raised = self.rate_cap_bps != 0 && (rate_bps == 0 || rate_bps > self.rate_cap_bps);
        let rtt = self
            .min_rtt_ns
            .unwrap_or(self.base_rtt_ns)
            .min(self.base_rtt_ns.max(1));
        let quiet = || {
            self.last_cut_ns
                .get()
                .is_none_or(|t| now_ns.saturating_sub(t) >= srtt_ns.max(rtt).saturating_mul(2))
        };
        if self.cold || (raised && quiet()) {
            self.cold = false;
            let target = if rate_bps == 0 {
                self.bdp
            } else {
                self.grant_window(rate_bps, rtt)
            };
            let paths = u64::try_from(self.sum_path_windows).unwrap_or(u64::MAX);
            let before = self.conn_window;
            self.conn_window = before.max(target.min(paths)).min(self.max_conn);
            // What the cap once took away is part of what came back.
            self.capped_excess = self
                .capped_excess
                .saturating_sub(self.conn_window.saturating_sub(before));
        }
        if rate_bps == 0 {
            self.rate_cap_bytes = None;
            self.rate_cap_bps = 0;
        } else {
            // Size the cap with the propagation RTT, not the (possibly
            // queue-inflated) smoothed RTT: with `rate * srtt`, any standing
            // queue at the receiver would be a fixed point and an incast
            // would never drain.
            let rtt = match (srtt_ns, self.min_rtt_ns) {
                (0, Some(m)) => m,
                (0, None) => self.base_rtt_ns,
                (s, Some(m)) => s.min(m),
                (s, None) => s,
            };
            let headroom = self.mss.saturating_mul(self.params.rate_cap_headroom_mss);
            // In whole packets, rounded up: a window a fraction of a packet
            // over one holds the second packet until the first is
            // acknowledged, and where the grant's gap is shorter than the
            // round trip the sender then runs at a packet per round trip,
            // below its grant.
            let cap = self
                .grant_window(rate_bps, rtt)
                .div_ceil(self.mss)
                .saturating_mul(self.mss)
                .saturating_add(headroom);
            self.rate_cap_bytes = Some(cap);
            self.rate_cap_bps = rate_bps;
        }
        let upper = self.conn_upper();
        if self.conn_window > upper {
            let excess = self.conn_window - upper;
            self.capped_excess = self.capped_excess.saturating_add(excess).min(self.max_conn);
            self.conn_window = upper;
        } else if self.capped_excess > 0 {
            let restore = self.capped_excess.min(upper - self.conn_window);
            self.conn_window += restore;
            self.capped_excess -= restore;
        }
    }

    fn on_path_replaced(&mut self, path: PathSlot, _now_ns: u64) {
        if self.path_mut(path).is_none() {
            return;
        }
        let start = self.mss.saturating_mul(self.params.probation_window_mss);
        self.paths[path] = Self::fresh_path(
            &self.params,
            self.paths[path].window,
            self.base_rtt_ns,
            true,
        );
        // Not a congestion signal: the connection window is unchanged and the
        // other paths absorb the retired path's share while this one ramps.
        self.set_path_window(path, start);
    }

    fn path_window(&self, path: PathSlot) -> u64 {
        // On every packet sent: read the window, do not build a path.
        match self.paths.get(path) {
            Some(p) => p.window,
            None if path < self.path_count => self.initial_path_window,
            None => self.mss,
        }
    }

    fn on_spurious_rto(&mut self, path: PathSlot, _now_ns: u64) {
        if self.path_mut(path).is_none() {
            return;
        }
        let (window, given_up) = (
            self.paths[path].pre_rto_window,
            self.paths[path].rto_given_up,
        );
        if window == 0 {
            return;
        }
        // Half back, not all: nothing was lost, but a delay past the RTO
        // is itself a queue far too deep (a congestion signal as strong as
        // a loss). Restoring the whole window would rebuild that queue and
        // fire the next spurious RTO, and so on for ever (the harness found
        // a 10 Gb/s single path with a megabyte of buffer doing just that).
        self.paths[path].probation = false;
        self.paths[path].pre_rto_window = 0;
        self.paths[path].rto_given_up = 0;
        self.set_path_window(path, (window / 2).max(self.mss));
        self.conn_window = self
            .conn_window
            .saturating_add(given_up / 2)
            .min(self.conn_upper());
    }

    fn pacing_rate_bps(&self) -> Option<u64> {
        // A receiver's grant is a rate: sent at that rate, a grant below a
        // packet per RTT still flows evenly instead of in bursts.
        (self.rate_cap_bps > 0).then_some(self.rate_cap_bps)
    }

    fn on_idle_restart(&mut self, _now_ns: u64) {
        if self.params.initial_window_mss == 0 {
            return;
        }
        // What the receiver told us is stale: start as a new connection.
        self.cold = true;
        let cold = self
            .mss
            .saturating_mul(self.params.initial_window_mss)
            .min(self.bdp);
        self.conn_window = self.conn_window.min(cold).max(self.mss);
    }

    fn on_setup_grant(&mut self, rate_bps: u64, now_ns: u64) {
        // The receiver's share for us, promised at setup out of its line
        // split over every peer that connected to it: what its first ACK
        // would have said, known a round trip sooner. A share under a
        // packet per round trip is left to the cold start, whose one short
        // packet puts less into an incast's queue than a whole packet from
        // each sender would (256 senders: 93 KB against 1.06 MB).
        if !self.cold {
            return;
        }
        if rate_bps != 0 && self.grant_window(rate_bps, self.base_rtt_ns) <= self.mss {
            return;
        }
        self.on_rate_hint(rate_bps, 0, now_ns);
    }

    fn awaiting_grant(&self) -> bool {
        self.cold
    }

    fn connection_window(&self) -> u64 {
        self.conn_window
    }

    fn metrics(&self) -> CcMetrics {
        CcMetrics {
            connection_window: self.conn_window,
            rate_cap_bps: self.rate_cap_bps,
            ecn_reductions: self.ecn_reductions,
            loss_reductions: self.loss_reductions,
            rto_reductions: self.rto_reductions,
            random_losses: self.random_losses,
        }
    }

    fn memory_bytes(&self) -> usize {
        size_of::<Self>() + self.paths.capacity() * size_of::<PathState>()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{CcAlgorithm, new_controller};
    use super::*;

    const MSS: u64 = 4096;
    const RTT: u64 = 10_000;
    /// A path's first window at 400 Gb/s: 500 000 B over 16 paths is 7.6
    /// packets, rounded up to 8.
    const PATH0: u64 = 8 * MSS;

    fn cfg(line_rate_bps: u64, path_count: usize) -> CcConfig {
        CcConfig {
            mss_bytes: MSS,
            line_rate_bps,
            base_rtt_ns: RTT,
            path_count,
            max_path_window_bytes: 256 * MSS,
            planes: 1,
            ack_delay_ns: 0,
        }
    }

    /// The defaults, but starting at a full BDP (no cold start): most tests
    /// here are about the window's dynamics once the receiver has spoken.
    fn warm() -> MetaRoceParams {
        MetaRoceParams {
            initial_window_mss: 0,
            ..MetaRoceParams::default()
        }
    }

    /// 400 Gb/s x 10 us = 500 000 B BDP; 16 paths of `PATH0`.
    fn cc400() -> MetaRoceCc {
        MetaRoceCc::new(cfg(400_000_000_000, 16), warm())
    }

    /// `cc400`, capped by its receiver (at the whole line, so the cap
    /// leaves its window as it was).
    fn capped400() -> MetaRoceCc {
        let mut cc = cc400();
        cc.on_rate_hint(400_000_000_000, RTT, 0);
        assert_eq!(cc.metrics().rate_cap_bps, 400_000_000_000);
        cc
    }

    fn ack(now_ns: u64, packets: u32, ce: u32, inflight: u64) -> AckSample {
        AckSample {
            now_ns,
            acked_bytes: u64::from(packets) * MSS,
            acked_packets: packets,
            ce_packets: ce,
            rtt_ns: Some(RTT),
            srtt_ns: RTT,
            path_inflight_bytes: inflight,
        }
    }

    /// One RTT of clean, window-limited ACKs on every path, starting at `now`.
    fn clean_rtt(cc: &mut MetaRoceCc, now: u64) {
        for p in 0..cc.path_count {
            let w = cc.path_window(p);
            let pkts = w.div_ceil(MSS).max(1);
            for k in 0..pkts {
                let w = cc.path_window(p);
                cc.on_ack(p, &ack(now + k * (RTT / pkts), 1, 0, w.saturating_sub(MSS)));
            }
        }
    }

    fn check_invariants(cc: &MetaRoceCc) {
        assert!(cc.paths.len() <= cc.path_count);
        for p in 0..cc.path_count {
            let w = cc.path_window(p);
            assert!(w >= cc.mss && w <= cc.max_path, "path {p} window {w}");
        }
        let sum: u128 = (0..cc.path_count)
            .map(|p| u128::from(cc.path_window(p)))
            .sum();
        assert_eq!(sum, cc.sum_path_windows);
        let c = cc.connection_window();
        assert!(c >= cc.mss && c <= cc.max_conn, "conn window {c}");
        if let Some(cap) = cc.rate_cap_bytes {
            assert!(c <= cap.max(cc.mss), "conn {c} above rate cap {cap}");
        }
        assert_eq!(cc.metrics().connection_window, c);
    }

    #[test]
    fn starts_at_line_rate_split_evenly() {
        let cc = cc400();
        assert_eq!(cc.connection_window(), 500_000);
        for p in 0..16 {
            assert_eq!(cc.path_window(p), PATH0);
        }
        // 100 Gb/s: BDP/16 = 7 812 B < 2 MSS, so each path gets the 2-MSS floor.
        let cc = MetaRoceCc::new(cfg(100_000_000_000, 16), warm());
        assert_eq!(cc.connection_window(), 125_000);
        for p in 0..16 {
            assert_eq!(cc.path_window(p), 2 * MSS);
        }
        // Per-path cap applies.
        let mut c = cfg(400_000_000_000, 1);
        c.max_path_window_bytes = 64 * MSS;
        let cc = MetaRoceCc::new(c, warm());
        assert_eq!(cc.connection_window(), 500_000);
        assert_eq!(cc.path_window(0), 64 * MSS);
        check_invariants(&cc);
    }

    #[test]
    fn factory_builds_metaroce() {
        let cc = new_controller(CcAlgorithm::default(), &cfg(400_000_000_000, 16), &warm());
        assert_eq!(cc.name(), "metaroce");
        assert_eq!(cc.connection_window(), 500_000);
        assert_eq!(cc.path_window(3), PATH0);
        assert_eq!(cc.path_window(999), MSS);
        assert_eq!(
            cc.metrics(),
            CcMetrics {
                connection_window: 500_000,
                ..CcMetrics::default()
            }
        );
    }

    #[test]
    fn ecn_on_one_path_of_a_capped_sender_shrinks_it_and_the_connection() {
        let mut cc = capped400();
        let conn0 = cc.connection_window();
        let w0 = cc.path_window(0);
        cc.on_ack(0, &ack(1_000, 1, 1, w0));
        let w1 = cc.path_window(0);
        // Fresh path: alpha = 1, so the first cut halves.
        assert_eq!(w1, w0 - w0 / 2);
        assert_eq!(cc.connection_window(), conn0 - (w0 - w1));
        for p in 1..16 {
            assert_eq!(cc.path_window(p), PATH0);
        }
        assert_eq!(cc.metrics().ecn_reductions, 1);

        // More marks within the same RTT: no further cut.
        for t in [2_000, 5_000, 10_999] {
            cc.on_ack(0, &ack(t, 1, 1, w1));
        }
        assert_eq!(cc.path_window(0), w1);
        assert_eq!(cc.metrics().ecn_reductions, 1);

        // Marks every RTT keep shrinking it, but never below one MSS.
        let mut prev = w1;
        for i in 1..40u64 {
            cc.on_ack(0, &ack(1_000 + i * RTT, 1, 1, MSS));
            let w = cc.path_window(0);
            assert!(w <= prev && w >= MSS);
            prev = w;
            check_invariants(&cc);
        }
        assert_eq!(cc.path_window(0), MSS);
        // The connection kept losing alpha/2 of what the path had in flight.
        assert!(cc.connection_window() <= conn0 - (w0 - MSS));
        assert!(cc.connection_window() >= conn0 - 40 * MSS);
        for p in 1..16 {
            assert_eq!(cc.path_window(p), PATH0);
        }
    }

    #[test]
    fn alpha_tracks_marked_fraction() {
        let mut cc = MetaRoceCc::new(
            cfg(400_000_000_000, 1),
            MetaRoceParams {
                initial_alpha: 0.0,
                ..warm()
            },
        );
        // Half of the packets marked, many RTTs: alpha -> 0.5.
        for i in 0..400u64 {
            for k in 0..10u64 {
                let ce = u32::from(k.is_multiple_of(2));
                cc.on_ack(0, &ack(i * RTT + k * 1_000, 1, ce, MSS));
            }
        }
        let a = cc.path_alpha(0).unwrap();
        assert!((a - 0.5).abs() < 0.05, "alpha {a}");
        // With a small alpha the cut is gentle (DCTCP): window * alpha / 2.
        let mut cc = MetaRoceCc::new(
            cfg(400_000_000_000, 1),
            MetaRoceParams {
                initial_alpha: 0.25,
                ..warm()
            },
        );
        let w = cc.path_window(0);
        cc.on_ack(0, &ack(1, 1, 1, w));
        assert_eq!(cc.path_window(0), w - (w as f64 * 0.125) as u64);
    }

    #[test]
    fn many_marked_paths_shrink_a_capped_connection_proportionally() {
        let mut cc = capped400();
        let conn0 = cc.connection_window();
        for p in 0..16 {
            cc.on_ack(p, &ack(1_000, 1, 1, PATH0));
        }
        // Every path halved: the connection lost what each had in flight.
        assert_eq!(cc.connection_window(), conn0 - 16 * (PATH0 - PATH0 / 2));
        assert_eq!(cc.metrics().ecn_reductions, 16);
    }

    #[test]
    fn a_marked_path_of_an_uncapped_sender_moves_its_share_to_the_others() {
        let mut cc = cc400();
        let conn0 = cc.connection_window();
        let w0 = cc.path_window(0);
        cc.on_ack(0, &ack(1_000, 1, 1, w0));
        // The path halves (its alpha starts at 1) and gives up the cut
        // itself; the connection keeps its window for the other paths.
        assert_eq!(cc.path_window(0), w0 - w0 / 2);
        assert_eq!(cc.connection_window(), conn0);
        for p in 1..16 {
            assert_eq!(cc.path_window(p), PATH0);
        }
        assert_eq!(cc.metrics().ecn_reductions, 1);
        check_invariants(&cc);
    }

    #[test]
    fn an_uncapped_connection_loses_only_what_a_floored_path_keeps() {
        let mut cc = cc400();
        let conn0 = cc.connection_window();
        // Marks on path 0 every round trip, its window full: the path
        // halves each time (its alpha stays 1) and the connection keeps
        // its window while the path can give up its own cuts.
        let mut now = 1_000;
        while cc.path_window(0) > MSS {
            let w = cc.path_window(0);
            cc.on_ack(0, &ack(now, 1, 1, w - MSS));
            now += RTT;
            assert_eq!(cc.connection_window(), conn0);
            check_invariants(&cc);
        }
        // At its one-MSS floor the path gives up nothing: the connection
        // loses the cut instead (half a packet per round trip here), so a
        // connection whose floors exceed its BDP can still drain a queue.
        for i in 1..=6u64 {
            cc.on_ack(0, &ack(now, 1, 1, 0));
            now += RTT;
            assert_eq!(cc.path_window(0), MSS);
            assert_eq!(cc.connection_window(), conn0 - i * MSS / 2);
            check_invariants(&cc);
        }
    }

    #[test]
    fn recovery_is_additive_and_reaches_caps() {
        let mut cc = cc400();
        let w0 = cc.path_window(0);
        let conn0 = cc.connection_window();
        for i in 0..5u64 {
            cc.on_ack(0, &ack(i * RTT, 1, 1, MSS));
        }
        let low = cc.path_window(0);
        assert!(low < w0);
        // Marks stop: path 0 grows by about one MSS per RTT.
        let mut now = 10 * RTT;
        let mut prev = low;
        let mut rtts = 0;
        while cc.path_window(0) < w0 {
            let w = cc.path_window(0);
            let pkts = w.div_ceil(MSS);
            for k in 0..pkts {
                let w = cc.path_window(0);
                cc.on_ack(0, &ack(now + k * 100, 1, 0, w - MSS));
            }
            let grown = cc.path_window(0) - prev;
            assert!(
                grown > MSS / 2 && grown <= 2 * MSS,
                "grew {grown} in one RTT"
            );
            prev = cc.path_window(0);
            now += RTT;
            rtts += 1;
            assert!(rtts < 100);
            check_invariants(&cc);
        }
        // The connection window is back where it was as the other paths
        // ACK too (uncapped, it lost only what the path's floor kept).
        let mut rtts = 0;
        while cc.connection_window() < conn0 {
            clean_rtt(&mut cc, now);
            now += RTT;
            rtts += 1;
            assert!(rtts <= 4, "connection window {}", cc.connection_window());
        }
        // Keep going on all paths: the connection reaches its max and stays there.
        for _ in 0..2_000 {
            clean_rtt(&mut cc, now);
            now += RTT;
            check_invariants(&cc);
        }
        assert_eq!(cc.connection_window(), 4 * 500_000);
        for p in 0..16 {
            assert_eq!(cc.path_window(p), 256 * MSS);
        }
    }

    #[test]
    fn the_connection_regrows_per_plane() {
        // 8 planes of 100 Gb/s, 16 paths each: the BDP of 800 Gb/s. After a
        // cut, a clean ACK regrows the connection by the per-plane cap on
        // each plane, as 8 single-plane NICs would, not by one cap.
        let grow = |planes: u16| {
            let mut cc = MetaRoceCc::new(
                CcConfig {
                    planes,
                    ..cfg(800_000_000_000, 128)
                },
                warm(),
            );
            cc.conn_window = cc.bdp / 2;
            let before = cc.connection_window();
            let w = cc.path_window(0);
            cc.on_ack(0, &ack(0, 1, 0, w - MSS));
            check_invariants(&cc);
            cc.connection_window() - before
        };
        let (one, eight) = (grow(1), grow(8));
        // 16 MSS per RTT: per MSS acked of a 500 kB window, 16 * 4096^2 / 5e5.
        assert!(
            one > 0 && one <= 16 * MSS * MSS / 500_000 + 1,
            "one cap: {one}"
        );
        assert!(
            eight >= 8 * one - 8 && eight <= 8 * one + 8,
            "{eight} against {one}"
        );
    }

    #[test]
    fn paths_that_do_not_use_their_window_do_not_grow() {
        let mut cc = cc400();
        let w0 = cc.path_window(0);
        for i in 0..100u64 {
            cc.on_ack(0, &ack(i * RTT, 1, 0, 0));
        }
        assert_eq!(cc.path_window(0), w0);
    }

    /// `bytes` rounded up to whole packets.
    fn whole_packets(bytes: u64) -> u64 {
        bytes.div_ceil(MSS) * MSS
    }

    #[test]
    fn a_grants_window_is_whole_packets() {
        // A grant of 4.4 Gb/s over a 10 us round trip: 5,500 bytes in
        // flight, a packet and a third. With a cap of those bytes the
        // second packet waited for the first one's ACK, and a paced
        // sender whose gap is shorter than its round trip ran at a packet
        // per round trip, below its grant (a 32-host all-to-all of 1 MB
        // per pair, where each pair is granted a 31st of 100 Gb/s over
        // 14 us: 3,390 us, now 2,775; IB-style's 2,877).
        let mut cc = MetaRoceCc::new(cfg(100_000_000_000, 16), warm());
        cc.on_ack(0, &ack(0, 1, 0, 0));
        let grant = 4_400_000_000;
        let in_flight = grant * RTT / 8_000_000_000;
        assert!(in_flight > MSS && in_flight < 2 * MSS, "{in_flight}");
        cc.on_rate_hint(grant, RTT, 0);
        for i in 1..20 {
            clean_rtt(&mut cc, i * RTT);
        }
        let headroom = cc.params.rate_cap_headroom_mss * MSS;
        assert_eq!(cc.connection_window(), 2 * MSS + headroom);
        assert_eq!(cc.pacing_rate_bps(), Some(grant));
        check_invariants(&cc);
    }

    #[test]
    fn a_grant_covers_the_round_trip_and_the_receivers_ack_delay() {
        // Two senders into a host 4.7 µs away, 47.5 Gb/s each, ACKs held
        // up to 4 µs: the grant's bytes over 8.7 µs, not over 4.7 µs (6.7
        // packets, which the receiver's ACK batching stalled at 35 Gb/s).
        let mut cc = MetaRoceCc::new(
            CcConfig {
                ack_delay_ns: 4_000,
                ..cfg(100_000_000_000, 16)
            },
            warm(),
        );
        cc.on_ack(0, &ack(0, 1, 0, 0));
        cc.on_rate_hint(47_500_000_000, 4_700, 0);
        let headroom = cc.params.rate_cap_headroom_mss * MSS;
        assert_eq!(
            cc.connection_window(),
            whole_packets(47_500_000_000 * 8_700 / 8_000_000_000) + headroom
        );
        // It paces at the grant: the window cannot raise its rate.
        assert_eq!(cc.pacing_rate_bps(), Some(47_500_000_000));
        check_invariants(&cc);
    }

    #[test]
    fn rate_hint_caps_within_one_call_and_lifts() {
        let mut cc = cc400();
        let headroom = cc.params.rate_cap_headroom_mss * MSS;
        // Incast: the receiver gives this sender 1/20 of 400 Gb/s.
        cc.on_rate_hint(20_000_000_000, RTT, 0);
        let cap = whole_packets(20_000_000_000 * RTT / 8_000_000_000) + headroom;
        assert_eq!(cc.connection_window(), cap);
        assert_eq!(cc.metrics().rate_cap_bps, 20_000_000_000);
        check_invariants(&cc);
        // Clean ACKs cannot push it above the cap.
        for i in 0..50 {
            clean_rtt(&mut cc, i * RTT);
            assert!(cc.connection_window() <= cap);
        }
        // Queue-inflated srtt does not inflate the cap (propagation RTT used).
        cc.on_rate_hint(20_000_000_000, 10 * RTT, 0);
        assert_eq!(cc.connection_window(), cap);
        // Hint rises: cap lifted and the clamped bytes are handed back.
        cc.on_rate_hint(200_000_000_000, RTT, 0);
        let cap2 = whole_packets(200_000_000_000 * RTT / 8_000_000_000) + headroom;
        assert_eq!(cc.connection_window(), cap2);
        // Hint of 0: no cap at all.
        cc.on_rate_hint(0, RTT, 0);
        assert_eq!(cc.metrics().rate_cap_bps, 0);
        assert_eq!(cc.connection_window(), 500_000);
        check_invariants(&cc);
        // After a fabric cut the clamped bytes are not restored.
        cc.on_rate_hint(8_000_000_000, RTT, 0);
        cc.on_ack(1, &ack(1, 1, 1, MSS));
        cc.on_rate_hint(0, RTT, 0);
        assert!(cc.connection_window() < 100_000);
    }

    #[test]
    fn a_cold_connection_starts_small_and_the_first_grant_sets_its_window() {
        let cold = || MetaRoceCc::new(cfg(400_000_000_000, 16), MetaRoceParams::default());
        let mut cc = cold();
        let initial = MetaRoceParams::default().initial_window_mss * cc.mss;
        assert_eq!(cc.connection_window(), initial);
        // An idle receiver (no cap): a full BDP at once, no slow start.
        cc.on_rate_hint(0, RTT, 0);
        assert_eq!(cc.connection_window(), 500_000);
        check_invariants(&cc);
        // A busy one names our share: a quarter of the line, a quarter BDP.
        let mut cc = cold();
        cc.on_rate_hint(100_000_000_000, RTT, 0);
        assert_eq!(cc.connection_window(), 125_000);
        check_invariants(&cc);
        // Idle long enough that the grant is stale: cold again.
        cc.on_idle_restart(100 * RTT);
        assert_eq!(cc.connection_window(), initial);
    }

    #[test]
    fn a_setup_grant_replaces_the_cold_round_trip_unless_it_is_under_a_packet() {
        let cold = || MetaRoceCc::new(cfg(400_000_000_000, 16), MetaRoceParams::default());
        let initial = MetaRoceParams::default().initial_window_mss * MSS;
        // The receiver's only sender: the whole BDP before any ACK.
        let mut cc = cold();
        cc.on_setup_grant(0, 0);
        assert!(!cc.awaiting_grant());
        assert_eq!(cc.connection_window(), 500_000);
        check_invariants(&cc);
        // One of four: a quarter BDP, paced at the share.
        let mut cc = cold();
        cc.on_setup_grant(100_000_000_000, 0);
        assert!(!cc.awaiting_grant());
        assert_eq!(cc.connection_window(), 125_000);
        assert_eq!(cc.pacing_rate_bps(), Some(100_000_000_000));
        // One of a thousand: under a packet per round trip, so the short
        // cold packet asks instead (less into an incast's queue).
        let mut cc = cold();
        cc.on_setup_grant(400_000_000, 0);
        assert!(cc.awaiting_grant());
        assert_eq!(cc.connection_window(), initial);
        // Once the receiver has spoken, a setup grant says nothing new.
        let mut cc = cold();
        cc.on_rate_hint(100_000_000_000, RTT, 0);
        cc.on_setup_grant(0, RTT);
        assert_eq!(cc.connection_window(), 125_000);
    }

    #[test]
    fn a_raised_grant_is_taken_at_once_unless_the_fabric_pushed_back() {
        let cold = || MetaRoceCc::new(cfg(400_000_000_000, 16), MetaRoceParams::default());
        // First granted a quarter of a fair half (the link was promised to
        // others), then the half itself: the window is the half's at once.
        let mut cc = cold();
        cc.on_rate_hint(25_000_000_000, RTT, 0);
        assert_eq!(cc.connection_window(), 31_250);
        cc.on_rate_hint(200_000_000_000, RTT, RTT);
        assert!(
            cc.connection_window() >= 250_000,
            "{}",
            cc.connection_window()
        );
        check_invariants(&cc);
        // The other sender goes: no cap, a full BDP.
        cc.on_rate_hint(0, RTT, 2 * RTT);
        assert_eq!(cc.connection_window(), 500_000);
        check_invariants(&cc);
        // After an ECN cut the window grows into a raised grant instead.
        let mut cc = cold();
        cc.on_rate_hint(25_000_000_000, RTT, 0);
        cc.on_ack(1, &ack(RTT, 1, 1, MSS));
        let cut = cc.connection_window();
        cc.on_rate_hint(200_000_000_000, RTT, 2 * RTT);
        assert_eq!(cc.connection_window(), cut);
        check_invariants(&cc);
    }

    #[test]
    fn a_loss_without_recent_ecn_is_not_congestion() {
        // By default a loss cuts only a path that saw ECN marks lately: on a
        // lossy fabric most losses are corruption or a failed link, and
        // halving for each would starve a lossy connection for nothing.
        let mut cc = cc400();
        cc.on_loss(2, 4096, 1_000);
        assert_eq!(cc.path_window(2), PATH0);
        assert_eq!(cc.metrics().loss_reductions, 0);
        // With a mark just before, the same loss halves the (already cut)
        // path once more.
        cc.on_ack(2, &ack(2_000, 1, 1, PATH0));
        let w = cc.path_window(2);
        cc.on_loss(2, 4096, 2_000 + RTT);
        assert_eq!(cc.path_window(2), w / 2);
        assert_eq!(cc.metrics().loss_reductions, 1);
    }

    #[test]
    fn loss_halves_once_per_rtt_and_rto_sets_one_mss() {
        let mut cc = MetaRoceCc::new(
            cfg(400_000_000_000, 16),
            MetaRoceParams {
                loss_needs_ecn_rtts: 0.0,
                ..warm()
            },
        );
        let conn0 = cc.connection_window();
        cc.on_loss(2, 4096, 1_000);
        assert_eq!(cc.path_window(2), PATH0 / 2);
        assert_eq!(cc.connection_window(), conn0 - PATH0 / 2);
        cc.on_loss(2, 4096, 5_000); // same RTT
        assert_eq!(cc.path_window(2), PATH0 / 2);
        cc.on_loss(2, 4096, 1_000 + RTT);
        assert_eq!(cc.path_window(2), PATH0 / 4);
        assert_eq!(cc.metrics().loss_reductions, 2);
        cc.on_loss(2, 0, 10 * RTT); // nothing lost: no-op
        assert_eq!(cc.path_window(2), PATH0 / 4);

        cc.on_rto(3, 2_000);
        assert_eq!(cc.path_window(3), MSS);
        assert_eq!(
            cc.connection_window(),
            conn0 - PATH0 / 2 - PATH0 / 4 - (PATH0 - MSS)
        );
        assert_eq!(cc.metrics().rto_reductions, 1);
        cc.on_rto(3, 3_000);
        assert_eq!(cc.path_window(3), MSS);
        assert_eq!(cc.metrics().rto_reductions, 2);
        // After the RTO clean ACKs regrow the suspect path quickly.
        assert!(cc.path_on_probation(3));
        let mut now = 10 * RTT;
        for _ in 0..8 {
            clean_rtt(&mut cc, now);
            now += RTT;
        }
        // Back to its pre-RTO window (`PATH0`) within a few RTTs.
        assert!(cc.path_window(3) >= PATH0, "{}", cc.path_window(3));
        check_invariants(&cc);
    }

    #[test]
    fn replaced_path_starts_on_probation_and_grows_back() {
        let mut cc = cc400();
        let conn0 = cc.connection_window();
        cc.on_ack(5, &ack(0, 1, 1, MSS)); // history: a cut, alpha state
        cc.on_path_replaced(5, 100);
        assert_eq!(cc.path_window(5), 2 * MSS);
        assert!(cc.path_on_probation(5));
        assert_eq!(cc.path_alpha(5), Some(1.0));
        // Uncapped: the mark cut the path, the connection kept its window.
        let conn1 = cc.connection_window();
        assert_eq!(conn1, conn0);
        // Doubling per RTT of clean ACKs.
        let mut now = RTT;
        let mut prev = cc.path_window(5);
        let fair = conn1 / 16;
        while cc.path_on_probation(5) {
            let pkts = prev.div_ceil(MSS);
            for k in 0..pkts {
                let w = cc.path_window(5);
                cc.on_ack(5, &ack(now + k, 1, 0, w - MSS));
            }
            let w = cc.path_window(5);
            assert!(
                w == (2 * prev).min(fair.max(w)) || w >= fair,
                "w {w} prev {prev}"
            );
            prev = w;
            now += RTT;
            assert!(now < 10 * RTT);
        }
        assert!(cc.path_window(5) >= fair);
        // Then additive increase.
        let before = cc.path_window(5);
        let pkts = before.div_ceil(MSS);
        for k in 0..pkts {
            let w = cc.path_window(5);
            cc.on_ack(5, &ack(now + k, 1, 0, w - MSS));
        }
        assert!(cc.path_window(5) - before <= 2 * MSS);
        // A mark during probation ends it.
        cc.on_path_replaced(6, now);
        cc.on_ack(6, &ack(now + 1, 1, 1, MSS));
        assert!(!cc.path_on_probation(6));
        assert_eq!(cc.path_window(6), MSS);
        check_invariants(&cc);
    }

    #[test]
    fn degenerate_configs_do_not_panic() {
        let weird = [
            CcConfig {
                mss_bytes: 0,
                line_rate_bps: 0,
                base_rtt_ns: 0,
                path_count: 0,
                max_path_window_bytes: 0,
                planes: 1,
                ack_delay_ns: 0,
            },
            CcConfig {
                mss_bytes: 9000,
                line_rate_bps: u64::MAX,
                base_rtt_ns: u64::MAX,
                path_count: 256,
                max_path_window_bytes: u64::MAX,
                planes: 1,
                ack_delay_ns: u64::MAX,
            },
            CcConfig {
                mss_bytes: 4096,
                line_rate_bps: 1,
                base_rtt_ns: 1,
                path_count: 3,
                max_path_window_bytes: 100,
                planes: 1,
                ack_delay_ns: 4_000,
            },
        ];
        let params = MetaRoceParams {
            ecn_gain: f64::NAN,
            initial_alpha: 7.0,
            ai_mss_per_rtt: f64::INFINITY,
            max_conn_ai_mss_per_rtt: f64::NAN,
            max_conn_window_bdp_multiple: 0,
            rate_cap_headroom_mss: u64::MAX,
            probation_window_mss: 0,
            min_initial_path_window_mss: 0,
            initial_window_mss: u64::MAX,
            loss_needs_ecn_rtts: f64::NAN,
        };
        for c in weird {
            for p in [warm(), params] {
                let mut cc = MetaRoceCc::new(c, p);
                check_invariants(&cc);
                random_events(&mut cc, 0x5eed, 2_000);
            }
        }
    }

    /// Deterministic LCG (Knuth MMIX constants).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 11
        }
        fn pick(&mut self, vals: &[u64]) -> u64 {
            vals[(self.next() % vals.len() as u64) as usize]
        }
    }

    fn random_events(cc: &mut MetaRoceCc, seed: u64, steps: usize) {
        let mut rng = Lcg(seed);
        let n = cc.path_count as u64 + 2; // include out-of-range slots
        let mut now = 0u64;
        let big = [0, 1, 7, 4096, 1 << 20, 1 << 40, u64::MAX / 2, u64::MAX];
        for _ in 0..steps {
            // Mostly advancing time, sometimes huge jumps or going backwards.
            now = match rng.next() % 20 {
                0 => rng.pick(&big),
                1 => now.saturating_sub(rng.next() % 50_000),
                _ => now.saturating_add(rng.next() % 20_000),
            };
            let path = (rng.next() % n) as usize;
            match rng.next() % 8 {
                0..=3 => {
                    let pkts = (rng.next() % 300) as u32;
                    let s = AckSample {
                        now_ns: now,
                        acked_bytes: if rng.next().is_multiple_of(10) {
                            rng.pick(&big)
                        } else {
                            u64::from(pkts) * 4096
                        },
                        acked_packets: if rng.next().is_multiple_of(20) {
                            u32::MAX
                        } else {
                            pkts
                        },
                        ce_packets: match rng.next() % 4 {
                            0 => pkts,
                            1 => (rng.next() % 1000) as u32,
                            _ => 0,
                        },
                        rtt_ns: match rng.next() % 3 {
                            0 => None,
                            1 => Some(rng.pick(&big)),
                            _ => Some(rng.next() % 100_000),
                        },
                        srtt_ns: if rng.next().is_multiple_of(5) {
                            rng.pick(&big)
                        } else {
                            rng.next() % 100_000
                        },
                        path_inflight_bytes: if rng.next().is_multiple_of(5) {
                            rng.pick(&big)
                        } else {
                            rng.next() % (1 << 21)
                        },
                    };
                    cc.on_ack(path, &s);
                }
                4 => cc.on_loss(path, rng.pick(&big), now),
                5 => cc.on_rto(path, now),
                6 => {
                    let rate = if rng.next().is_multiple_of(2) {
                        rng.pick(&big)
                    } else {
                        rng.next() % 400_000_000_000
                    };
                    let srtt = if rng.next().is_multiple_of(4) {
                        rng.pick(&big)
                    } else {
                        rng.next() % 100_000
                    };
                    cc.on_rate_hint(rate, srtt, now);
                }
                _ => cc.on_path_replaced(path, now),
            }
            check_invariants(cc);
        }
    }

    #[test]
    fn never_stalls_under_random_events() {
        for seed in 0..64u64 {
            let paths = [1usize, 2, 16, 256][(seed % 4) as usize];
            let mut cc = MetaRoceCc::new(cfg(400_000_000_000, paths), warm());
            random_events(
                &mut cc,
                seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xdead_beef,
                3_000,
            );
        }
    }

    /// Result of [`fluid_sim`] over its measurement interval.
    #[derive(Debug)]
    struct SimStats {
        utilization: f64,
        mean_queue: f64,
        max_queue: f64,
        min_total_window: u64,
        max_total_window: u64,
    }

    /// A tiny closed-loop fluid model: one sender spraying over `n` paths
    /// into one bottleneck of capacity `line_rate` (e.g. the receiver's
    /// downlink), which CE-marks every packet leaving while its queue is
    /// above `k` bytes. In-flight bytes beyond the BDP sit in the queue; the
    /// RTT is the base RTT plus the queueing delay; marks reach the sender
    /// one base RTT after the queue state that caused them. Packets are sent
    /// round-robin over the paths within both windows, as the owner does.
    fn fluid_sim(line: u64, n: usize, k: f64, rtts: u64) -> SimStats {
        let mut cc = MetaRoceCc::new(cfg(line, n), warm());
        let c = line as f64 / 8e9; // bytes per ns
        let bdp = c * RTT as f64;
        let steps_per_rtt = 20u64;
        let dt = RTT / steps_per_rtt;
        let mut inflight = vec![0u64; n];
        let mut credit = vec![0f64; n];
        let mut queue_hist = vec![0f64; steps_per_rtt as usize];
        let (mut sent_bytes, mut qsum, mut qmax, mut samples) = (0f64, 0f64, 0f64, 0u64);
        let (mut wmin, mut wmax) = (u64::MAX, 0u64);
        let measure_from = rtts / 2 * steps_per_rtt;
        let mut next_path = 0usize;
        for step in 0..rtts * steps_per_rtt {
            let now = step * dt;
            let total: u64 = inflight.iter().sum();
            let q = (total as f64 - bdp).max(0.0);
            let rtt = RTT as f64 + q / c;
            let slot = (step % steps_per_rtt) as usize;
            let marking = queue_hist[slot] > k; // queue one base RTT ago
            queue_hist[slot] = q;
            for p in 0..n {
                credit[p] += inflight[p] as f64 * dt as f64 / rtt;
                let pkts = ((credit[p] / MSS as f64) as u64).min(inflight[p] / MSS);
                if pkts == 0 {
                    continue;
                }
                credit[p] -= (pkts * MSS) as f64;
                inflight[p] -= pkts * MSS;
                let pkts32 = u32::try_from(pkts).unwrap();
                cc.on_ack(
                    p,
                    &AckSample {
                        now_ns: now,
                        acked_bytes: pkts * MSS,
                        acked_packets: pkts32,
                        ce_packets: if marking { pkts32 } else { 0 },
                        rtt_ns: Some(rtt as u64),
                        srtt_ns: rtt as u64,
                        path_inflight_bytes: inflight[p],
                    },
                );
                if step >= measure_from {
                    sent_bytes += (pkts * MSS) as f64;
                }
            }
            // Refill round-robin within the path and connection windows.
            let mut total: u64 = inflight.iter().sum();
            let mut idle_rounds = 0;
            while idle_rounds < n {
                let p = next_path;
                next_path = (next_path + 1) % n;
                if inflight[p] + MSS <= cc.path_window(p) && total + MSS <= cc.connection_window() {
                    inflight[p] += MSS;
                    total += MSS;
                    idle_rounds = 0;
                } else {
                    idle_rounds += 1;
                }
            }
            if step >= measure_from {
                qsum += q;
                qmax = qmax.max(q);
                samples += 1;
                wmin = wmin.min(total);
                wmax = wmax.max(total);
            }
            check_invariants(&cc);
        }
        let secs_ns = (samples * dt) as f64;
        SimStats {
            utilization: sent_bytes / (c * secs_ns),
            mean_queue: qsum / samples as f64,
            max_queue: qmax,
            min_total_window: wmin,
            max_total_window: wmax,
        }
    }

    #[test]
    fn fluid_model_converges_near_bdp() {
        // (line rate, paths, marking threshold K, min utilization, min window / BDP)
        let cases = [
            (400_000_000_000u64, 16usize, 80_000f64, 0.95, 0.6), // default shape, BDP 500 KB
            (400_000_000_000, 256, 80_000.0, 0.85, 0.5),         // max paths: N*MSS > BDP
            (100_000_000_000, 16, 40_000.0, 0.85, 0.4),          // BDP 125 KB ~ 2 x 16 MSS
            (100_000_000_000, 1, 20_000.0, 0.95, 0.8),           // single path = DCTCP
        ];
        for (line, n, k, min_util, min_w) in cases {
            let st = fluid_sim(line, n, k, 400);
            let bdp = line as f64 / 8e9 * RTT as f64;
            // Every assertion carries the case and its figures.
            let ctx = format!("line={line} n={n} k={k} {st:?}");
            assert!(st.utilization > min_util, "{ctx}");
            assert!(st.max_queue < 3.0 * k, "{ctx}");
            assert!(st.mean_queue < 1.5 * k, "{ctx}");
            assert!(st.min_total_window as f64 >= min_w * bdp, "{ctx}");
            assert!((st.max_total_window as f64) < bdp + 3.0 * k, "{ctx}");
        }
    }
}
