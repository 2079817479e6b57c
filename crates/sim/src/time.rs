//! Simulated time and the unit conversions the simulator makes.
//!
//! Everything inside the simulator is `u64` picoseconds ([`Ps`]): a
//! 64-byte frame at 1.6 Tb/s is 320 ps, so nanoseconds would round
//! serialization away. The protocol core counts nanoseconds; scenario
//! files and reports speak microseconds. Each crossing goes through one of
//! the functions here, so the rounding at each boundary is written once.

/// Simulated time in picoseconds.
pub type Ps = u64;
/// Picoseconds per nanosecond.
pub const PS_PER_NS: Ps = 1_000;
/// Picoseconds per microsecond.
pub const PS_PER_US: Ps = 1_000_000;
/// Bits per byte times picoseconds per second: a byte count times this,
/// divided by a rate in bit/s, is the time to send it.
const BIT_PS_PER_BYTE_S: u128 = 8 * 1_000_000_000_000;

/// Time to serialize `bytes` at `rate_bps`, rounded down to a picosecond.
/// Exact integer arithmetic (128-bit, so no product overflows), so a run
/// does not depend on floating-point rounding.
#[inline]
pub fn serialization_ps(bytes: u64, rate_bps: u64) -> Ps {
    (u128::from(bytes) * BIT_PS_PER_BYTE_S / u128::from(rate_bps)) as Ps
}

/// Microseconds (a scenario file's unit) to picoseconds, truncated.
pub fn us_to_ps(us: f64) -> Ps {
    (us * PS_PER_US as f64) as Ps
}

/// Picoseconds to microseconds (a report's unit).
pub fn ps_to_us(ps: Ps) -> f64 {
    ps as f64 / PS_PER_US as f64
}

/// Picoseconds to the protocol core's nanoseconds, truncated.
#[inline]
pub fn ps_to_ns(ps: Ps) -> u64 {
    ps / PS_PER_NS
}

/// The protocol core's nanoseconds to picoseconds; a deadline beyond the
/// picosecond range (the core's "never") saturates to the end of time.
#[inline]
pub fn ns_to_ps(ns: u64) -> Ps {
    ns.saturating_mul(PS_PER_NS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialization_is_exact() {
        // 4196 B at 100 Gb/s: 335.68 ns, truncated to the picosecond.
        assert_eq!(serialization_ps(4196, 100_000_000_000), 335_680);
        // 1 B at 3 bit/s: 8/3 s, no overflow on the way.
        assert_eq!(serialization_ps(1, 3), 2_666_666_666_666);
        assert_eq!(serialization_ps(9_000, 400_000_000_000), 180_000);
    }

    #[test]
    fn conversions_round_as_documented() {
        assert_eq!(us_to_ps(1.5), 1_500_000);
        assert_eq!(ps_to_us(2_500_000), 2.5);
        assert_eq!(ps_to_ns(1_999), 1);
        assert_eq!(ns_to_ps(u64::MAX), u64::MAX);
    }
}
