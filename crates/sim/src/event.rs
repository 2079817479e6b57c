//! The event list: a binary heap keyed by (time, insertion sequence).
//!
//! Ties fire in insertion order, so a run is a pure function of its inputs
//! and seed. Components never hold pointers to each other: an event names
//! its target by a typed index into the simulator's arenas.

use crate::Ps;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// What happens when an event fires. Every variant is a few words: the
/// heap moves these around, so they stay small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A port finished serializing its head packet.
    TxDone(u32),
    /// The head packet of a port's pipe reaches the far end.
    PipeArrive(u32),
    /// A host's transport timer may be due.
    HostTimer(u32),
    /// A flow's start time has come.
    FlowStart(u32),
    /// A PFC frame reaches the upstream port: pause (true) or resume a priority.
    Pfc { port: u32, prio: u8, pause: bool },
    /// A link (both directions) goes down (false) or comes back (true).
    LinkState { port: u32, up: bool },
    /// Credit-based flow control: `bytes` of downstream buffer freed,
    /// returned to the upstream `port`.
    Credit { port: u32, bytes: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    time: Ps,
    seq: u64,
    kind: EventKind,
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap, we want the earliest first.
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A deterministic priority queue of events.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    seq: u64,
    now: Ps,
    executed: u64,
    max_pending: usize,
}

impl EventQueue {
    /// An empty queue at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Current simulated time (the time of the last event popped).
    pub fn now(&self) -> Ps {
        self.now
    }

    /// Schedule `kind` at `time`; a time in the past is moved to now.
    pub fn schedule(&mut self, time: Ps, kind: EventKind) {
        let time = time.max(self.now);
        self.seq += 1;
        self.heap.push(Entry {
            time,
            seq: self.seq,
            kind,
        });
        self.max_pending = self.max_pending.max(self.heap.len());
    }

    /// Pop the earliest event and advance the clock to it.
    pub fn pop(&mut self) -> Option<(Ps, EventKind)> {
        let e = self.heap.pop()?;
        debug_assert!(e.time >= self.now, "time went backwards");
        self.now = e.time;
        self.executed += 1;
        Some((e.time, e.kind))
    }

    /// Time of the earliest pending event.
    pub fn peek_time(&self) -> Option<Ps> {
        self.heap.peek().map(|e| e.time)
    }

    /// Events executed so far.
    pub fn executed(&self) -> u64 {
        self.executed
    }

    /// Most events ever pending at once.
    pub fn max_pending(&self) -> usize {
        self.max_pending
    }

    /// Events pending now.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_fire_in_insertion_order() {
        let mut q = EventQueue::new();
        q.schedule(10, EventKind::HostTimer(2));
        q.schedule(5, EventKind::HostTimer(1));
        q.schedule(10, EventKind::HostTimer(3));
        q.schedule(10, EventKind::HostTimer(4));
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![
                (5, EventKind::HostTimer(1)),
                (10, EventKind::HostTimer(2)),
                (10, EventKind::HostTimer(3)),
                (10, EventKind::HostTimer(4)),
            ]
        );
        assert_eq!(q.executed(), 4);
    }

    #[test]
    fn past_times_are_clamped_to_now() {
        let mut q = EventQueue::new();
        q.schedule(100, EventKind::FlowStart(0));
        q.pop();
        q.schedule(50, EventKind::FlowStart(1));
        assert_eq!(q.pop(), Some((100, EventKind::FlowStart(1))));
    }
}
