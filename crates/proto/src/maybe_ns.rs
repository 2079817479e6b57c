//! An optional instant in nanoseconds, in 8 bytes.
//!
//! `Option<u64>` takes 16 bytes (a tag and padding). Per-path state keeps
//! several optional times, and a simulated fabric keeps that state for
//! hundreds of thousands of paths, so the unreachable `u64::MAX` stands for
//! "none" instead.

/// A time in ns, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MaybeNs(u64);

impl MaybeNs {
    /// No time.
    pub(crate) const NONE: Self = Self(u64::MAX);

    /// The time `ns` (`u64::MAX` ns, 584 years, is taken one ns early).
    pub(crate) fn some(ns: u64) -> Self {
        Self(ns.min(u64::MAX - 1))
    }

    /// As an `Option`.
    pub(crate) fn get(self) -> Option<u64> {
        (self.0 != u64::MAX).then_some(self.0)
    }

    /// Whether a time is set.
    pub(crate) fn is_some(self) -> bool {
        self.0 != u64::MAX
    }
}

impl From<Option<u64>> for MaybeNs {
    fn from(t: Option<u64>) -> Self {
        t.map_or(Self::NONE, Self::some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_time_but_the_sentinel() {
        for t in [0, 1, 1_000_000, u64::MAX - 1] {
            assert_eq!(MaybeNs::some(t).get(), Some(t));
            assert!(MaybeNs::some(t).is_some());
        }
        assert_eq!(MaybeNs::some(u64::MAX).get(), Some(u64::MAX - 1));
        assert_eq!(MaybeNs::NONE.get(), None);
        assert_eq!(MaybeNs::from(None::<u64>), MaybeNs::NONE);
        assert_eq!(size_of::<MaybeNs>(), 8);
    }
}
