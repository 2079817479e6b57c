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
    /// Routing has re-converged on the links' current state.
    Reconverge,
}

impl EventKind {
    /// Port indices fit this many bits in a packed event.
    const INDEX_BITS: u32 = 29;

    /// Eight bytes: a 3-bit variant, a 29-bit port index and a 32-bit
    /// argument. The heap moves every event a few times, and 8 bytes
    /// instead of 12 make an entry 24 bytes instead of 32.
    fn pack(self) -> u64 {
        let (tag, index, arg) = match self {
            Self::TxDone(port) => (0, port, 0),
            Self::PipeArrive { port, pkt } => (1, port, pkt),
            Self::HostTimer(host) => (2, 0, host),
            Self::FlowStart(flow) => (3, 0, flow),
            Self::Pfc { port, prio, pause } => (4, port, u32::from(prio) | u32::from(pause) << 8),
            Self::LinkState { port, up } => (5, port, u32::from(up)),
            Self::Credit { port, bytes } => (6, port, bytes),
            Self::Reconverge => (7, 0, 0),
        };
        assert!(
            index < 1 << Self::INDEX_BITS,
            "port index {index} beyond the event list's {} bits",
            Self::INDEX_BITS
        );
        (tag << 61) | u64::from(index) << 32 | u64::from(arg)
    }

    fn unpack(packed: u64) -> Self {
        let index = ((packed >> 32) & ((1 << Self::INDEX_BITS) - 1)) as u32;
        let arg = packed as u32;
        match packed >> 61 {
            0 => Self::TxDone(index),
            1 => Self::PipeArrive {
                port: index,
                pkt: arg,
            },
            2 => Self::HostTimer(arg),
            3 => Self::FlowStart(arg),
            4 => Self::Pfc {
                port: index,
                prio: arg as u8,
                pause: arg >> 8 & 1 == 1,
            },
            5 => Self::LinkState {
                port: index,
                up: arg == 1,
            },
            6 => Self::Credit {
                port: index,
                bytes: arg,
            },
            _ => Self::Reconverge,
        }
    }
}

/// An event's place in the order: time, then insertion sequence, so keys
/// are unique. Two `u64`s rather than one `u128`, whose 16-byte alignment
/// would pad every entry to 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
struct Key {
    time: Ps,
    seq: u64,
}

impl Key {
    /// Time in the high half: compares as the key does.
    fn as_u128(self) -> u128 {
        u128::from(self.time) << 64 | u128::from(self.seq)
    }

    fn from_u128(k: u128) -> Self {
        Self {
            time: (k >> 64) as Ps,
            seq: k as u64,
        }
    }
}

/// Entries per chunk: 2 KiB. A bucket fills a chunk, then stacks it and
/// takes another from a shared pool, so memory follows the events pending
/// (plus one chunk per bucket), not the sum of every bucket's largest fill.
const CHUNK_ENTRIES: usize = 64;

/// A key and its packed [`EventKind`]: 24 bytes.
type Entry = (Key, u64);
type Chunk = [Entry; CHUNK_ENTRIES];

fn new_chunk() -> Box<Chunk> {
    Box::new([(Key::default(), 0); CHUNK_ENTRIES])
}

/// One bucket: the chunk being filled and the full ones before it.
#[derive(Debug)]
struct Bucket {
    tail: Box<Chunk>,
    tail_len: usize,
    // Boxed: chunks move between buckets and the pool as pointers, not as
    // 2 KiB copies.
    #[allow(clippy::vec_box)]
    full: Vec<Box<Chunk>>,
}

/// A radix heap: a monotone priority queue (nothing is ever scheduled
/// before the last key popped, which a simulation clock guarantees).
/// Bucket `b` holds keys whose highest bit differing from the last popped
/// key is bit `b - 1`. Popping empties the lowest non-empty bucket into
/// lower ones around its minimum, so each event moves down at most a few
/// times and push / pop are amortised O(1), against a binary heap's
/// O(log n) of 32-byte moves per operation.
///
/// Emptying a bucket hands its full chunks back to the pool as soon as
/// their entries have moved down, where the lower buckets pick them up: a
/// growing `Vec` per bucket instead held the moved bucket and its copy at
/// once, and kept up to twice each fill.
#[derive(Debug)]
struct RadixHeap {
    last: Key,
    /// The entry whose key is `last`, once settled and until popped.
    min: Option<Entry>,
    /// Index `b` is bucket `b` (index 0 unused: that is `min`).
    buckets: Vec<Bucket>,
    /// Bit `b - 1` is set while bucket `b` holds entries.
    nonempty: u128,
    #[allow(clippy::vec_box)]
    pool: Vec<Box<Chunk>>,
    /// Stands in for a bucket's tail while that tail is being emptied.
    spare: Option<Box<Chunk>>,
    len: usize,
}

impl Default for RadixHeap {
    fn default() -> Self {
        Self {
            last: Key::default(),
            min: None,
            buckets: (0..=128)
                .map(|_| Bucket {
                    tail: new_chunk(),
                    tail_len: 0,
                    full: Vec::new(),
                })
                .collect(),
            nonempty: 0,
            pool: Vec::new(),
            spare: Some(new_chunk()),
            len: 0,
        }
    }
}

impl RadixHeap {
    /// One more than the highest bit in which `key` differs from `last`,
    /// reading (time, seq) as one 128-bit number.
    fn bucket(last: Key, key: Key) -> usize {
        let time = key.time ^ last.time;
        if time != 0 {
            128 - time.leading_zeros() as usize
        } else {
            64 - (key.seq ^ last.seq).leading_zeros() as usize
        }
    }

    fn push(&mut self, key: Key, kind: EventKind) {
        debug_assert!(key > self.last, "radix heap keys must not go back");
        let b = Self::bucket(self.last, key);
        self.push_into(b, (key, kind.pack()));
        self.len += 1;
    }

    #[inline(always)]
    fn push_into(&mut self, b: usize, e: Entry) {
        self.nonempty |= 1 << (b - 1);
        let bucket = &mut self.buckets[b];
        if bucket.tail_len == CHUNK_ENTRIES {
            let fresh = self.pool.pop().unwrap_or_else(new_chunk);
            bucket.full.push(std::mem::replace(&mut bucket.tail, fresh));
            bucket.tail_len = 0;
        }
        bucket.tail[bucket.tail_len] = e;
        bucket.tail_len += 1;
    }

    /// Move the minimum into `min`.
    fn settle(&mut self) {
        if self.min.is_some() || self.nonempty == 0 {
            return;
        }
        let b = self.nonempty.trailing_zeros() as usize + 1;
        self.nonempty &= !(1 << (b - 1));
        let bucket = &mut self.buckets[b];
        let tail_len = std::mem::take(&mut bucket.tail_len);
        let mut full = std::mem::take(&mut bucket.full);
        let spare = self
            .spare
            .take()
            .expect("the spare chunk is back after each settle");
        let tail = std::mem::replace(&mut bucket.tail, spare);
        // The minimum, as one 128-bit comparison per entry.
        let mut last = u128::MAX;
        for chunk in &full {
            for e in chunk.iter() {
                last = last.min(e.0.as_u128());
            }
        }
        for e in &tail[..tail_len] {
            last = last.min(e.0.as_u128());
        }
        let last = Key::from_u128(last);
        self.last = last;
        // Every key but the minimum lands strictly below bucket `b`.
        for &e in &tail[..tail_len] {
            if e.0 == last {
                self.min = Some(e);
            } else {
                self.push_into(Self::bucket(last, e.0), e);
            }
        }
        for chunk in full.drain(..) {
            for &e in chunk.iter() {
                if e.0 == last {
                    self.min = Some(e);
                } else {
                    self.push_into(Self::bucket(last, e.0), e);
                }
            }
            self.pool.push(chunk);
        }
        let bucket = &mut self.buckets[b];
        self.spare = Some(std::mem::replace(&mut bucket.tail, tail));
        bucket.full = full;
    }

    fn pop(&mut self) -> Option<(Key, EventKind)> {
        self.settle();
        let (key, packed) = self.min.take()?;
        self.len -= 1;
        Some((key, EventKind::unpack(packed)))
    }

    fn peek_key(&mut self) -> Option<Key> {
        self.settle();
        self.min.map(|e| e.0)
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
        self.heap.push(
            Key {
                time,
                seq: self.seq,
            },
            kind,
        );
        self.max_pending = self.max_pending.max(self.heap.len);
    }

    /// Pop the earliest event and advance the clock to it.
    pub fn pop(&mut self) -> Option<(Ps, EventKind)> {
        let (k, kind) = self.heap.pop()?;
        let time = k.time;
        debug_assert!(time >= self.now, "time went backwards");
        self.now = time;
        self.executed += 1;
        Some((time, kind))
    }

    /// Time of the earliest pending event.
    pub fn peek_time(&mut self) -> Option<Ps> {
        self.heap.peek_key().map(|k| k.time)
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
    fn packed_events_round_trip() {
        let max = (1 << EventKind::INDEX_BITS) - 1;
        for kind in [
            EventKind::TxDone(0),
            EventKind::TxDone(max),
            EventKind::PipeArrive {
                port: max,
                pkt: u32::MAX,
            },
            EventKind::HostTimer(u32::MAX),
            EventKind::FlowStart(7),
            EventKind::Pfc {
                port: 3,
                prio: 255,
                pause: true,
            },
            EventKind::Pfc {
                port: max,
                prio: 1,
                pause: false,
            },
            EventKind::LinkState { port: 9, up: true },
            EventKind::LinkState { port: 9, up: false },
            EventKind::Credit {
                port: max,
                bytes: u32::MAX,
            },
        ] {
            assert_eq!(EventKind::unpack(kind.pack()), kind);
        }
        assert_eq!(size_of::<Entry>(), 24);
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
