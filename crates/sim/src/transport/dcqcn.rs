//! DCQCN reaction point (sender rate control), modelled from Zhu et al.,
//! "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015,
//! §3.1 (CP/NP/RP algorithms) and the parameter table of §5.
//!
//! - On a CNP: `Rt = Rc`, `Rc = Rc (1 - alpha/2)`, `alpha = (1-g) alpha + g`,
//!   and the timer, byte counter and their stage counts restart.
//! - Every `K` without a CNP: `alpha = (1-g) alpha`.
//! - Rate increase events come from a timer (every `T`) and a byte counter
//!   (every `B` bytes sent). With `t`, `bc` the counts since the last cut:
//!   fast recovery while `max(t, bc) < F` (`Rc = (Rt + Rc)/2`), additive
//!   increase when one count reached `F` (`Rt += R_AI`), hyper increase when
//!   both did (`Rt += i R_HAI`, `i = min(t, bc) - F + 1`), then
//!   `Rc = (Rt + Rc)/2`.
//!
//! Timers are evaluated lazily (whenever the sender consults the rate or a
//! CNP arrives, every elapsed tick is applied in order), so an idle or
//! line-rate QP costs no events.

use crate::{PS_PER_US, Ps};

/// DCQCN parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcqcnParams {
    /// EWMA gain of alpha (paper: 1/256).
    pub g: f64,
    /// Alpha decay period without CNPs, K (paper: 55 µs).
    pub alpha_period_ps: Ps,
    /// Rate-increase timer, T (paper: 55 µs).
    pub timer_ps: Ps,
    /// Byte counter, B (paper: 10 MB).
    pub byte_counter: u64,
    /// Fast-recovery stages, F (paper: 5).
    pub stages: u32,
    /// Additive increase step R_AI, bit/s (paper: 40 Mb/s).
    pub rai_bps: f64,
    /// Hyper increase step R_HAI, bit/s.
    pub rhai_bps: f64,
    /// NP: at most one CNP per flow per this interval (paper: 50 µs).
    pub cnp_interval_ps: Ps,
    /// Lowest rate, as a fraction of line rate.
    pub min_rate_fraction: f64,
}

impl Default for DcqcnParams {
    fn default() -> Self {
        Self {
            g: 1.0 / 256.0,
            alpha_period_ps: 55 * PS_PER_US,
            timer_ps: 55 * PS_PER_US,
            byte_counter: 10_000_000,
            stages: 5,
            rai_bps: 40e6,
            rhai_bps: 400e6,
            cnp_interval_ps: 50 * PS_PER_US,
            min_rate_fraction: 0.001,
        }
    }
}

/// One QP's DCQCN rate state.
#[derive(Debug, Clone)]
pub struct Dcqcn {
    p: DcqcnParams,
    line_bps: f64,
    /// Current rate Rc, bit/s.
    rc: f64,
    /// Target rate Rt, bit/s.
    rt: f64,
    alpha: f64,
    t_count: u32,
    bc_count: u32,
    bytes: u64,
    last_timer: Ps,
    last_alpha: Ps,
    cnps: u64,
}

impl Dcqcn {
    /// A QP starting at line rate (DCQCN has no slow start).
    pub fn new(p: DcqcnParams, line_bps: u64) -> Self {
        let line = line_bps as f64;
        Self {
            p,
            line_bps: line,
            rc: line,
            rt: line,
            alpha: 1.0,
            t_count: 0,
            bc_count: 0,
            bytes: 0,
            last_timer: 0,
            last_alpha: 0,
            cnps: 0,
        }
    }

    /// Current rate, bit/s.
    pub fn rate_bps(&self) -> f64 {
        self.rc
    }

    /// Current alpha.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// CNPs received.
    pub fn cnps(&self) -> u64 {
        self.cnps
    }

    /// Whether the QP runs below line rate (pacing needed).
    pub fn limited(&self) -> bool {
        self.rc < self.line_bps
    }

    /// Apply every timer tick up to `now`.
    pub fn advance(&mut self, now: Ps) {
        if self.cnps == 0 {
            return; // never cut: line rate, nothing to recover
        }
        let k = self.p.alpha_period_ps.max(1);
        if now >= self.last_alpha + k {
            let n = (now - self.last_alpha) / k;
            self.alpha *= (1.0 - self.p.g).powi(n.min(1 << 20) as i32);
            self.last_alpha += n * k;
        }
        let t = self.p.timer_ps.max(1);
        while now >= self.last_timer + t {
            self.last_timer += t;
            if self.rc >= self.line_bps && self.rt >= self.line_bps {
                // Fully recovered: later ticks change nothing.
                let n = (now - self.last_timer) / t;
                self.last_timer += n * t;
                break;
            }
            self.t_count = self.t_count.saturating_add(1);
            self.increase();
        }
    }

    /// A CNP arrived at `now`.
    pub fn on_cnp(&mut self, now: Ps) {
        self.advance(now);
        self.cnps += 1;
        self.rt = self.rc;
        let floor = self.line_bps * self.p.min_rate_fraction;
        self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(floor);
        self.alpha = (1.0 - self.p.g) * self.alpha + self.p.g;
        self.t_count = 0;
        self.bc_count = 0;
        self.bytes = 0;
        self.last_timer = now;
        self.last_alpha = now;
    }

    /// `bytes` were sent (drives the byte counter).
    pub fn on_sent(&mut self, bytes: u64) {
        if self.cnps == 0 {
            return;
        }
        self.bytes += bytes;
        while self.bytes >= self.p.byte_counter {
            self.bytes -= self.p.byte_counter;
            self.bc_count = self.bc_count.saturating_add(1);
            self.increase();
        }
    }

    fn increase(&mut self) {
        let f = self.p.stages;
        let (hi, lo) = (
            self.t_count.max(self.bc_count),
            self.t_count.min(self.bc_count),
        );
        if hi < f {
            // fast recovery: Rt unchanged
        } else if lo >= f {
            self.rt += f64::from(lo - f + 1) * self.p.rhai_bps;
        } else {
            self.rt += self.p.rai_bps;
        }
        self.rt = self.rt.min(self.line_bps);
        self.rc = ((self.rt + self.rc) / 2.0).min(self.line_bps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_then_fast_recovery_then_increase() {
        let mut d = Dcqcn::new(DcqcnParams::default(), 100_000_000_000);
        d.on_cnp(0);
        assert!(
            (d.rate_bps() - 50e9).abs() < 1.0,
            "first cut halves (alpha = 1)"
        );
        // Five timer periods of fast recovery: Rc halves the gap to Rt each time.
        d.advance(5 * 55 * PS_PER_US);
        let gap = 100e9 - d.rate_bps();
        assert!((gap - 50e9 / 32.0).abs() < 1.0, "gap {gap}");
        // Alpha decays without CNPs.
        assert!(d.alpha() < 1.0);
        // Eventually back to line rate.
        d.advance(100_000 * PS_PER_US);
        assert!((d.rate_bps() - 100e9).abs() < 1.0);
    }
}
