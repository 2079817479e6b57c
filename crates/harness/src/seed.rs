//! Seed plumbing for reproducible test failures.

/// Environment variable that overrides test seeds.
pub const SEED_ENV: &str = "METAROCE_SEED";

/// The seed from `METAROCE_SEED` (decimal, or hex with a `0x` prefix), or
/// `default` if the variable is unset or empty.
///
/// # Panics
/// If the variable is set but does not parse: a typo must not silently run a
/// different seed than the one being reproduced.
pub fn seed_from_env_or(default: u64) -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(s) if !s.trim().is_empty() => parse_seed(&s)
            .unwrap_or_else(|| panic!("{SEED_ENV}={s:?} is not a decimal or 0x-hex u64")),
        _ => default,
    }
}

fn parse_seed(s: &str) -> Option<u64> {
    let s = s.trim().replace('_', "");
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Prints `METAROCE_SEED=<seed>` to stderr if dropped while the current
/// thread is panicking, so a failing test prints how to reproduce it.
///
/// ```
/// # use metaroce_harness::{SeedGuard, seed_from_env_or};
/// let guard = SeedGuard::new(seed_from_env_or(42));
/// let seed = guard.seed();
/// // ... build a NetConfig with `seed`, run, assert ...
/// # let _ = seed;
/// ```
#[derive(Debug)]
#[must_use = "the guard only reports the seed while it is alive"]
pub struct SeedGuard {
    seed: u64,
}

impl SeedGuard {
    /// Guard an explicit seed.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// `SeedGuard::new(seed_from_env_or(default))`.
    pub fn from_env_or(default: u64) -> Self {
        Self::new(seed_from_env_or(default))
    }

    /// The guarded seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Test support, not library logging: the test harness captures
            // this line and shows it with the failing test's output. A
            // `tracing` event would need a subscriber no test installs.
            eprintln!(
                "{SEED_ENV}={} (set this environment variable to reproduce the failure)",
                self.seed
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_seed;

    #[test]
    fn parses_decimal_and_hex() {
        assert_eq!(parse_seed("123"), Some(123));
        assert_eq!(parse_seed(" 0xff "), Some(255));
        assert_eq!(parse_seed("1_000"), Some(1000));
        assert_eq!(parse_seed("nope"), None);
    }
}
