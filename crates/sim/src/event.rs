//! The event list: a radix heap keyed by (time, insertion sequence).
//!
//! Ties fire in insertion order, so a run is a pure function of its inputs
//! and seed. Components never hold pointers to each other: an event names
//! its target by a typed index into the simulator's arenas.

use crate::Ps;

/// What happens when an event fires. Every variant is a few words: the
/// heap moves these around, so they stay small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A port finished serializing its head packet.
    TxDone(u32),
    /// A packet leaving a port's pipe reaches the far end.
    PipeArrive { port: u32, pkt: u32 },
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

/// An event's place in the order: time in the high 64 bits, insertion
/// sequence in the low 64, so keys are unique and compare in one step.
type Key = u128;

fn key(time: Ps, seq: u64) -> Key {
    (Key::from(time) << 64) | Key::from(seq)
}

/// Emptied buckets keep their allocation up to this many entries.
const KEEP_BUCKET_CAPACITY: usize = 4096;

/// A radix heap: a monotone priority queue (nothing is ever scheduled
/// before the last key popped, which a simulation clock guarantees).
/// Bucket `b` holds keys whose highest bit differing from the last popped
/// key is bit `b - 1` (bucket 0: equal to it). Popping empties the lowest
/// non-empty bucket into lower ones around its minimum, so each event moves
/// down at most a few times and push / pop are amortised O(1), against a
/// binary heap's O(log n) of 32-byte moves per operation.
#[derive(Debug)]
struct RadixHeap {
    last: Key,
    buckets: Vec<Vec<(Key, EventKind)>>,
    len: usize,
}

impl Default for RadixHeap {
    fn default() -> Self {
        Self {
            last: 0,
            buckets: (0..=Key::BITS).map(|_| Vec::new()).collect(),
            len: 0,
        }
    }
}

impl RadixHeap {
    fn bucket(last: Key, key: Key) -> usize {
        (Key::BITS - (key ^ last).leading_zeros()) as usize
    }

    fn push(&mut self, key: Key, kind: EventKind) {
        debug_assert!(key >= self.last, "radix heap keys must not go back");
        self.buckets[Self::bucket(self.last, key)].push((key, kind));
        self.len += 1;
    }

    /// Bring the minimum into bucket 0 (the only key equal to `last`).
    fn settle(&mut self) {
        if !self.buckets[0].is_empty() {
            return;
        }
        let Some(b) = self.buckets.iter().position(|v| !v.is_empty()) else {
            return;
        };
        let mut moved = std::mem::take(&mut self.buckets[b]);
        self.last = moved.iter().map(|e| e.0).min().expect("non-empty bucket");
        for &(k, kind) in &moved {
            // Every key lands strictly below bucket `b`.
            self.buckets[Self::bucket(self.last, k)].push((k, kind));
        }
        // Give the bucket its allocation back for the next fill, unless it
        // is a large one: high buckets fill once per clock epoch, and a
        // hundred buckets each holding on to their largest fill would cost
        // more memory than the events themselves.
        if moved.capacity() <= KEEP_BUCKET_CAPACITY {
            moved.clear();
            self.buckets[b] = moved;
        }
    }

    fn pop(&mut self) -> Option<(Key, EventKind)> {
        self.settle();
        let e = self.buckets[0].pop()?;
        self.len -= 1;
        Some(e)
    }

    fn peek_key(&mut self) -> Option<Key> {
        self.settle();
        self.buckets[0].last().map(|e| e.0)
    }
}

/// A deterministic priority queue of events.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: RadixHeap,
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
        self.heap.push(key(time, self.seq), kind);
        self.max_pending = self.max_pending.max(self.heap.len);
    }

    /// Pop the earliest event and advance the clock to it.
    pub fn pop(&mut self) -> Option<(Ps, EventKind)> {
        let (k, kind) = self.heap.pop()?;
        let time = (k >> 64) as Ps;
        debug_assert!(time >= self.now, "time went backwards");
        self.now = time;
        self.executed += 1;
        Some((time, kind))
    }

    /// Time of the earliest pending event.
    pub fn peek_time(&mut self) -> Option<Ps> {
        self.heap.peek_key().map(|k| (k >> 64) as Ps)
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
        self.heap.len
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.len == 0
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

    #[test]
    fn pops_in_key_order_under_random_interleaving() {
        // Against a sorted reference: random schedules interleaved with pops,
        // times never before the clock (as in a run), many ties.
        let mut q = EventQueue::new();
        let mut reference: Vec<(Ps, u32)> = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut id = 0u32;
        let mut popped = Vec::new();
        let mut expected = Vec::new();
        for _ in 0..20_000 {
            if next() % 3 != 0 {
                let t = q.now() + next() % 50 * 1000;
                q.schedule(t, EventKind::HostTimer(id));
                reference.push((t, id));
                id += 1;
            } else if let Some((t, EventKind::HostTimer(i))) = q.pop() {
                popped.push((t, i));
                // The reference's minimum: earliest time, then lowest id
                // (ids grow with insertion order).
                let (at, _) = reference
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, e)| (e.0, e.1))
                    .expect("queue and reference agree on emptiness");
                expected.push(reference.swap_remove(at));
            }
        }
        assert_eq!(popped, expected);
        assert_eq!(q.len(), reference.len());
    }
}
