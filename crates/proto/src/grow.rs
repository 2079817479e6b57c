//! Growth from one element, for containers that usually hold one or two.
//!
//! `Vec` and `VecDeque` jump from empty to four elements (for elements up
//! to 1 KiB). An endpoint's per-QP and per-connection queues mostly hold
//! one entry at a time, and a simulated 8192-host fabric has tens of
//! thousands of them, so the first allocation is sized for one and each
//! later one doubles, as `Vec` would from there.

use std::collections::VecDeque;

/// Push onto `v`, growing 1, 2, 4, … instead of 4, 8, ….
pub(crate) fn push<T>(v: &mut Vec<T>, value: T) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.capacity().max(1));
    }
    v.push(value);
}

/// Push onto the back of `q`, growing 1, 2, 4, … instead of 4, 8, ….
pub(crate) fn push_back<T>(q: &mut VecDeque<T>, value: T) {
    if q.len() == q.capacity() {
        q.reserve_exact(q.capacity().max(1));
    }
    q.push_back(value);
}

/// Make `v` at least `len` long, filling with `fill`, growing to the
/// larger of `len` and twice the capacity.
pub(crate) fn resize_with<T>(v: &mut VecDeque<T>, len: usize, fill: impl FnMut() -> T) {
    if len > v.capacity() {
        let target = len.max(2 * v.capacity());
        v.reserve_exact(target - v.len());
    }
    if len > v.len() {
        v.resize_with(len, fill);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_from_one_and_doubles() {
        let mut v = Vec::new();
        let mut caps = Vec::new();
        for i in 0..9u64 {
            push(&mut v, i);
            caps.push(v.capacity());
        }
        assert_eq!(v, (0..9).collect::<Vec<_>>());
        assert_eq!(caps[0], 1);
        assert!(caps.windows(2).all(|w| w[1] == w[0] || w[1] >= 2 * w[0]));
        let mut q = VecDeque::new();
        push_back(&mut q, 1u64);
        assert_eq!(q.capacity(), 1);
        push_back(&mut q, 2);
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), vec![1, 2]);
        let mut r: VecDeque<Option<u64>> = VecDeque::new();
        resize_with(&mut r, 1, || None);
        assert_eq!((r.len(), r.capacity()), (1, 1));
        resize_with(&mut r, 3, || Some(7));
        assert_eq!(r, [None, Some(7), Some(7)]);
        resize_with(&mut r, 2, || None);
        assert_eq!(r.len(), 3, "never shrinks");
    }
}
