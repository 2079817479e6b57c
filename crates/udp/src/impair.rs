//! Receive-side fault injection: `loss=0.01,reorder=0.05,dup=0.01,seed=7`.
//!
//! Applied by the driver to every received datagram (after GRO splitting)
//! before the core sees it, so loss tolerance can be measured on real
//! sockets without netem.

use std::fmt;
use std::str::FromStr;

/// Probabilities per received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Impair {
    /// Drop the datagram.
    pub loss: f64,
    /// Hold the datagram back and deliver it after the next one.
    pub reorder: f64,
    /// Deliver the datagram twice.
    pub dup: f64,
    /// Seed of the impairment's random choices.
    pub seed: u64,
}

impl Impair {
    /// Whether any impairment is on.
    pub fn is_active(&self) -> bool {
        self.loss > 0.0 || self.reorder > 0.0 || self.dup > 0.0
    }
}

impl fmt::Display for Impair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss={},reorder={},dup={},seed={}",
            self.loss, self.reorder, self.dup, self.seed
        )
    }
}

impl FromStr for Impair {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = Self {
            seed: 1,
            ..Self::default()
        };
        for item in s.split(',').filter(|i| !i.trim().is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("--impair item '{item}' is not key=value"))?;
            let (k, v) = (k.trim(), v.trim());
            if k == "seed" {
                out.seed = v
                    .parse()
                    .map_err(|_| format!("--impair seed '{v}' is not an integer"))?;
                continue;
            }
            let p: f64 = v
                .parse()
                .map_err(|_| format!("--impair {k} '{v}' is not a number"))?;
            if !(0.0..1.0).contains(&p) {
                return Err(format!("--impair {k}={v} must be a probability in [0, 1)"));
            }
            match k {
                "loss" => out.loss = p,
                "reorder" => out.reorder = p,
                "dup" => out.dup = p,
                _ => {
                    return Err(format!(
                        "--impair key '{k}' unknown (loss, reorder, dup, seed)"
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// What to do with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Deliver,
    Drop,
    Duplicate,
    Hold,
}

/// The impairment's random state (xorshift64*; not cryptographic).
#[derive(Debug, Clone)]
pub(crate) struct ImpairState {
    cfg: Impair,
    x: u64,
}

impl ImpairState {
    pub(crate) fn new(cfg: Impair) -> Self {
        Self {
            cfg,
            x: cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    fn uniform(&mut self) -> f64 {
        self.x ^= self.x >> 12;
        self.x ^= self.x << 25;
        self.x ^= self.x >> 27;
        let r = self.x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(crate) fn verdict(&mut self) -> Verdict {
        if self.uniform() < self.cfg.loss {
            Verdict::Drop
        } else if self.uniform() < self.cfg.dup {
            Verdict::Duplicate
        } else if self.uniform() < self.cfg.reorder {
            Verdict::Hold
        } else {
            Verdict::Deliver
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let i: Impair = "loss=0.01,reorder=0.05,dup=0.01,seed=7".parse().unwrap();
        assert_eq!(i.loss, 0.01);
        assert_eq!(i.reorder, 0.05);
        assert_eq!(i.dup, 0.01);
        assert_eq!(i.seed, 7);
        assert!("loss=2".parse::<Impair>().is_err());
        assert!("lost=0.1".parse::<Impair>().is_err());
        assert!("loss".parse::<Impair>().is_err());
        assert!("loss=x".parse::<Impair>().is_err());
    }

    #[test]
    fn loss_rate_is_close() {
        let mut s = ImpairState::new("loss=0.1,seed=3".parse().unwrap());
        let drops = (0..100_000)
            .filter(|_| s.verdict() == Verdict::Drop)
            .count();
        assert!((9_000..11_000).contains(&drops), "{drops}");
    }
}
