//! Serial-number arithmetic on 32-bit sequence numbers (RFC 1982 style).
//!
//! Packet sequence numbers (psn) and message sequence numbers (msg_seq, msn)
//! wrap around at 2^32. They are compared by their signed distance rather
//! than by value: `a` comes before `b` when `b - a`, computed modulo 2^32, is
//! in `1..2^31`. This is RFC 1982 serial number arithmetic with
//! `SERIAL_BITS = 32`, as used for TCP sequence numbers.
//!
//! The comparison is only meaningful while the numbers being compared are
//! less than 2^31 apart; protocol windows are far smaller than that. At a
//! distance of exactly 2^31 RFC 1982 leaves the order undefined; here both
//! `seq_lt(a, b)` and `seq_lt(b, a)` are then true, so callers must keep
//! their windows below 2^31.

/// `a - b` as a signed distance: positive when `a` is after `b`.
///
/// Exact while the true distance is in `-2^31..2^31`.
pub const fn seq_diff(a: u32, b: u32) -> i32 {
    a.wrapping_sub(b) as i32
}

/// Whether `a` comes strictly before `b`.
pub const fn seq_lt(a: u32, b: u32) -> bool {
    seq_diff(a, b) < 0
}

/// Whether `a` comes before `b` or equals it.
pub const fn seq_le(a: u32, b: u32) -> bool {
    a == b || seq_lt(a, b)
}

/// Whether `a` comes strictly after `b`.
pub const fn seq_gt(a: u32, b: u32) -> bool {
    seq_lt(b, a)
}

/// Whether `a` comes after `b` or equals it.
pub const fn seq_ge(a: u32, b: u32) -> bool {
    seq_le(b, a)
}

/// The later of `a` and `b`.
pub const fn seq_max(a: u32, b: u32) -> u32 {
    if seq_lt(a, b) { b } else { a }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_around_zero() {
        assert!(seq_lt(u32::MAX, 0));
        assert!(seq_lt(u32::MAX - 5, 3));
        assert!(!seq_lt(3, u32::MAX - 5));
        assert_eq!(seq_diff(3, u32::MAX - 5), 9);
        assert_eq!(seq_diff(u32::MAX - 5, 3), -9);
        assert_eq!(seq_max(u32::MAX, 1), 1);
        assert!(seq_le(7, 7) && !seq_lt(7, 7) && seq_ge(7, 7) && !seq_gt(7, 7));
    }

    #[test]
    fn half_range_is_ambiguous() {
        // Documented: at exactly 2^31 apart both directions compare "less".
        let a = 12345u32;
        let b = a.wrapping_add(1 << 31);
        assert!(seq_lt(a, b) && seq_lt(b, a));
    }

    proptest! {
        #[test]
        fn forward_is_later(a in any::<u32>(), d in 1u32..(1 << 31)) {
            let b = a.wrapping_add(d);
            prop_assert!(seq_lt(a, b));
            prop_assert!(!seq_lt(b, a));
            prop_assert!(seq_le(a, b) && !seq_le(b, a));
            prop_assert!(seq_gt(b, a) && seq_ge(b, a));
            prop_assert_eq!(seq_diff(b, a), d as i32);
            prop_assert_eq!(seq_diff(a, b), -(d as i32));
            prop_assert_eq!(seq_max(a, b), b);
            prop_assert_eq!(seq_max(b, a), b);
        }

        #[test]
        fn equal_is_le_not_lt(a in any::<u32>()) {
            prop_assert!(seq_le(a, a));
            prop_assert!(!seq_lt(a, a));
            prop_assert_eq!(seq_diff(a, a), 0);
        }

        #[test]
        fn diff_inverts_add(a in any::<u32>(), d in any::<i32>()) {
            prop_assert_eq!(seq_diff(a.wrapping_add_signed(d), a), d);
        }
    }
}
