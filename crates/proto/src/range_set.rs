//! A set of byte ranges: which parts of a message have arrived.
//!
//! Sprayed packets arrive in any order, and a retransmission may deliver a
//! segment a second time; counting each byte once needs the exact set of
//! ranges seen. Arrivals are nearly in order, so the set stays a handful of
//! ranges (about one per path in flight) and a sorted `Vec` beats a tree.

/// Disjoint, non-adjacent, sorted half-open ranges of `u64`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<(u64, u64)>,
    covered: u64,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes covered.
    pub fn covered(&self) -> u64 {
        self.covered
    }

    /// Number of disjoint ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether nothing is covered.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Add `start..end`; returns how many bytes were new.
    pub fn insert(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        // Fast path: arrivals are nearly in order, so most inserts extend the
        // last range or start a new one after it.
        if let Some(last) = self.ranges.last_mut()
            && start >= last.0
        {
            if start <= last.1 {
                let added = end.saturating_sub(last.1);
                last.1 = last.1.max(end);
                self.covered += added;
                return added;
            }
            self.ranges.push((start, end));
            self.covered += end - start;
            return end - start;
        }
        // First range whose end reaches `start` (it may merge with us).
        let i = self.ranges.partition_point(|&(_, e)| e < start);
        let mut new_start = start;
        let mut new_end = end;
        let mut j = i;
        let mut overlap = 0;
        while j < self.ranges.len() && self.ranges[j].0 <= end {
            let (s, e) = self.ranges[j];
            overlap += e.min(end).saturating_sub(s.max(start));
            new_start = new_start.min(s);
            new_end = new_end.max(e);
            j += 1;
        }
        self.ranges
            .splice(i..j, std::iter::once((new_start, new_end)));
        let added = (end - start) - overlap;
        self.covered += added;
        added
    }

    /// Whether any byte of `start..end` is covered.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, e)| e <= start);
        self.ranges.get(i).is_some_and(|&(s, _)| s < end)
    }

    /// Whether `start..end` is entirely covered.
    pub fn contains(&self, start: u64, end: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, e)| e < end);
        self.ranges
            .get(i)
            .is_some_and(|&(s, e)| s <= start && end <= e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn merges_and_counts() {
        let mut r = RangeSet::new();
        assert_eq!(r.insert(10, 20), 10);
        assert_eq!(r.insert(30, 40), 10);
        assert_eq!(r.insert(15, 35), 10);
        assert_eq!(r.len(), 1);
        assert_eq!(r.insert(0, 10), 10);
        assert_eq!(r.len(), 1);
        assert_eq!(r.covered(), 40);
        assert!(r.contains(0, 40));
        assert!(!r.contains(0, 41));
    }

    proptest! {
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((0u64..200, 0u64..40), 0..60)) {
            let mut r = RangeSet::new();
            let mut bits = [false; 240];
            for (s, l) in ops {
                let fresh = (s..s + l).filter(|&b| !bits[b as usize]).count() as u64;
                prop_assert_eq!(r.insert(s, s + l), fresh);
                for b in s..s + l { bits[b as usize] = true; }
                prop_assert_eq!(r.covered(), bits.iter().filter(|&&b| b).count() as u64);
                for w in r.ranges.windows(2) { prop_assert!(w[0].1 < w[1].0); }
            }
        }
    }
}
