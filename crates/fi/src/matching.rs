//! Software tag matching: the posted-receive queue and the
//! unexpected-message queue of one receive side (untagged or tagged).
//!
//! libfabric's rules: a message matches the first posted receive, in post
//! order, whose source filter admits the message's source and whose tag,
//! outside the receive's ignore bits, equals the message's; a message that
//! matches none waits in the unexpected queue, in arrival order, for the
//! first receive (or probe) that matches it. Untagged receives match on
//! the source only. Messages from one peer arrive in send order, so this
//! also gives `FI_ORDER_SAS`.

use std::collections::VecDeque;

/// `FI_ADDR_UNSPEC`: any source.
pub const ANY_SOURCE: u64 = u64::MAX;

/// What a receive accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvFilter {
    /// Source `fi_addr_t`, or [`ANY_SOURCE`].
    pub src: u64,
    /// Tag to match (tagged receives).
    pub tag: u64,
    /// Tag bits that do not take part in matching.
    pub ignore: u64,
}

impl RecvFilter {
    /// Whether a message from `src` with `tag` matches (`tagged` selects
    /// the tag check).
    pub fn admits(&self, src: u64, tag: u64, tagged: bool) -> bool {
        let src_ok = self.src == ANY_SOURCE || self.src == src;
        let tag_ok = !tagged || (self.tag | self.ignore) == (tag | self.ignore);
        src_ok && tag_ok
    }
}

/// Posted receives and unexpected messages of one queue pair of queues.
#[derive(Debug)]
pub struct MatchQueues<R, M> {
    tagged: bool,
    posted: VecDeque<(RecvFilter, R)>,
    unexpected: VecDeque<(u64, u64, M)>,
}

impl<R, M> MatchQueues<R, M> {
    /// Empty queues; `tagged` decides whether tags take part.
    pub fn new(tagged: bool) -> Self {
        Self {
            tagged,
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
        }
    }

    /// A message from `src` with `tag` arrived: the first posted receive
    /// it matches, taken off the queue.
    pub fn match_posted(&mut self, src: u64, tag: u64) -> Option<R> {
        let tagged = self.tagged;
        let i = self
            .posted
            .iter()
            .position(|(f, _)| f.admits(src, tag, tagged))?;
        self.posted.remove(i).map(|(_, r)| r)
    }

    /// Queue a message no receive wanted.
    pub fn push_unexpected(&mut self, src: u64, tag: u64, msg: M) {
        self.unexpected.push_back((src, tag, msg));
    }

    /// A receive was posted: the first unexpected message it matches,
    /// taken off the queue.
    pub fn take_unexpected(&mut self, filter: &RecvFilter) -> Option<(u64, u64, M)> {
        let tagged = self.tagged;
        let i = self
            .unexpected
            .iter()
            .position(|(s, t, _)| filter.admits(*s, *t, tagged))?;
        self.unexpected.remove(i)
    }

    /// The first unexpected message `filter` matches, left in place.
    pub fn peek_unexpected(&self, filter: &RecvFilter) -> Option<&(u64, u64, M)> {
        let tagged = self.tagged;
        self.unexpected
            .iter()
            .find(|(s, t, _)| filter.admits(*s, *t, tagged))
    }

    /// Queue a receive that matched nothing yet.
    pub fn post(&mut self, filter: RecvFilter, recv: R) {
        self.posted.push_back((filter, recv));
    }

    /// Remove the first posted receive for which `pred` holds
    /// (`fi_cancel`).
    pub fn cancel(&mut self, pred: impl Fn(&R) -> bool) -> Option<R> {
        let i = self.posted.iter().position(|(_, r)| pred(r))?;
        self.posted.remove(i).map(|(_, r)| r)
    }

    /// Posted receives waiting.
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }

    /// Unexpected messages waiting.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }

    /// Take every posted receive (endpoint close).
    pub fn drain_posted(&mut self) -> Vec<R> {
        self.posted.drain(..).map(|(_, r)| r).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(src: u64, tag: u64, ignore: u64) -> RecvFilter {
        RecvFilter { src, tag, ignore }
    }

    #[test]
    fn first_posted_match_in_order() {
        let mut q = MatchQueues::<u32, ()>::new(true);
        q.post(f(ANY_SOURCE, 5, 0), 1);
        q.post(f(2, 0, u64::MAX), 2);
        q.post(f(ANY_SOURCE, 5, 0), 3);
        assert_eq!(q.match_posted(1, 6), None);
        assert_eq!(q.match_posted(2, 5), Some(1));
        assert_eq!(q.match_posted(2, 5), Some(2));
        assert_eq!(q.match_posted(2, 5), Some(3));
    }

    #[test]
    fn unexpected_in_arrival_order_with_ignore_bits() {
        let mut q = MatchQueues::<(), &str>::new(true);
        q.push_unexpected(1, 0x10, "a");
        q.push_unexpected(1, 0x11, "b");
        q.push_unexpected(2, 0x11, "c");
        assert_eq!(q.peek_unexpected(&f(2, 0x11, 0)).unwrap().2, "c");
        assert_eq!(q.take_unexpected(&f(ANY_SOURCE, 0x11, 0)).unwrap().2, "b");
        assert_eq!(
            q.take_unexpected(&f(ANY_SOURCE, 0x00, 0xff)).unwrap().2,
            "a"
        );
        assert_eq!(q.unexpected_len(), 1);
    }

    #[test]
    fn untagged_ignores_tags_and_cancel() {
        let mut q = MatchQueues::<u32, ()>::new(false);
        q.post(f(ANY_SOURCE, 0, 0), 7);
        q.post(f(ANY_SOURCE, 0, 0), 8);
        assert_eq!(q.cancel(|&r| r == 8), Some(8));
        assert_eq!(q.match_posted(3, 99), Some(7));
        assert_eq!(q.posted_len(), 0);
    }
}
