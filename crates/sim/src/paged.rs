//! A vector stored in fixed-size pages.
//!
//! The packet slab grows to the most packets ever in flight. A `Vec`
//! doubles, so at its peak it holds on average a third more room than
//! used, and while it reallocates, twice its size; pages grow one page at a
//! time and never move, so the slack is at most one page.

use std::ops::{Index, IndexMut};

/// Entries per page (a power of two, so an index splits with a shift).
const PAGE_ENTRIES: usize = 1 << 12;

/// A growable array in pages of [`PAGE_ENTRIES`].
#[derive(Debug)]
pub struct PagedVec<T> {
    pages: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for PagedVec<T> {
    fn default() -> Self {
        Self {
            pages: Vec::new(),
            len: 0,
        }
    }
}

impl<T> PagedVec<T> {
    /// An empty vector (allocates nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append `value`.
    pub fn push(&mut self, value: T) {
        let page = self.len / PAGE_ENTRIES;
        if page == self.pages.len() {
            self.pages.push(Vec::with_capacity(PAGE_ENTRIES));
        }
        self.pages[page].push(value);
        self.len += 1;
    }

    /// Remove and return the last entry. Emptied pages stay allocated (the
    /// vector is used as a stack that refills to its high-water mark).
    pub fn pop(&mut self) -> Option<T> {
        let last = self.len.checked_sub(1)?;
        self.len = last;
        self.pages[last / PAGE_ENTRIES].pop()
    }
}

impl<T> Index<usize> for PagedVec<T> {
    type Output = T;

    fn index(&self, i: usize) -> &T {
        &self.pages[i / PAGE_ENTRIES][i % PAGE_ENTRIES]
    }
}

impl<T> IndexMut<usize> for PagedVec<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.pages[i / PAGE_ENTRIES][i % PAGE_ENTRIES]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_across_pages() {
        let mut v = PagedVec::new();
        assert!(v.is_empty());
        let n = 3 * PAGE_ENTRIES + 5;
        for i in 0..n {
            v.push(i as u64 * 3);
        }
        assert_eq!(v.len(), n);
        for i in [
            0,
            1,
            PAGE_ENTRIES - 1,
            PAGE_ENTRIES,
            2 * PAGE_ENTRIES + 7,
            n - 1,
        ] {
            assert_eq!(v[i], i as u64 * 3);
        }
        v[PAGE_ENTRIES] = 7;
        assert_eq!(v[PAGE_ENTRIES], 7);
        assert_eq!(v.pages.len(), 4);
    }

    #[test]
    fn pops_as_a_stack_across_pages_and_refills() {
        let mut v = PagedVec::new();
        assert_eq!(v.pop(), None::<u32>);
        let n = PAGE_ENTRIES as u32 + 3;
        for i in 0..n {
            v.push(i);
        }
        for i in (PAGE_ENTRIES as u32 - 2..n).rev() {
            assert_eq!(v.pop(), Some(i));
        }
        assert_eq!(v.len(), PAGE_ENTRIES - 2);
        v.push(99);
        v.push(100);
        v.push(101);
        assert_eq!(v[PAGE_ENTRIES - 2], 99);
        assert_eq!(v[PAGE_ENTRIES], 101);
        assert_eq!(v.pages.len(), 2, "the emptied page was reused");
        while v.pop().is_some() {}
        assert!(v.is_empty());
    }

    #[test]
    #[should_panic(expected = "index out of bounds")]
    fn indexing_past_the_end_panics() {
        let mut v = PagedVec::new();
        v.push(1u8);
        let _ = v[1];
    }
}
