//! Dependencies derived from who touches which bytes.
//!
//! Algorithms are written as a sequential program per rank; each task
//! declares the user-buffer ranges it reads and writes, and this tracker
//! turns program order into the minimal dependencies that keep it correct:
//! a read waits for the last write of its bytes (read after write), a write
//! waits for the last write and every read since (write after write, write
//! after read). Everything else may run in any order, which is where the
//! pipelining comes from: chunk 5's step 0 never waits for chunk 4's step 3.
//!
//! A send counts as a read that lasts until its write completes locally, so
//! a later write of the same bytes (recursive doubling folding into the
//! buffer it just sent from, in-place all-to-all receiving into the block it
//! sends) waits until the NIC no longer needs them.

use std::collections::BTreeMap;

use super::Region;
use crate::action::Buf;

#[derive(Clone, Debug, Default)]
struct Segment {
    end: u64,
    writer: Option<u32>,
    readers: Vec<u32>,
}

/// Last writer and readers of every byte range touched so far, per buffer.
#[derive(Debug, Default)]
pub(crate) struct Hazards {
    send: BTreeMap<u64, Segment>,
    recv: BTreeMap<u64, Segment>,
}

impl Hazards {
    fn map(&mut self, buf: Buf) -> &mut BTreeMap<u64, Segment> {
        match buf {
            Buf::Send => &mut self.send,
            Buf::Recv => &mut self.recv,
            Buf::Staging => unreachable!("staging slots are ordered by the slot protocol"),
        }
    }

    /// Records that `task` reads (or writes) `region`, adding what it must
    /// wait for to `deps`.
    pub(crate) fn access(&mut self, task: u32, region: Region, write: bool, deps: &mut Vec<u32>) {
        if region.len == 0 {
            return;
        }
        let (start, end) = (region.offset, region.offset + region.len);
        let map = self.map(region.buf);
        split(map, start);
        split(map, end);
        // Fill holes so that every byte of the range has a segment.
        let mut cursor = start;
        let keys: Vec<(u64, u64)> = map
            .range(start..end)
            .map(|(&s, seg)| (s, seg.end))
            .collect();
        for (s, e) in keys {
            if s > cursor {
                map.insert(
                    cursor,
                    Segment {
                        end: s,
                        ..Segment::default()
                    },
                );
            }
            cursor = e;
        }
        if cursor < end {
            map.insert(
                cursor,
                Segment {
                    end,
                    ..Segment::default()
                },
            );
        }
        for (_, seg) in map.range_mut(start..end) {
            if let Some(w) = seg.writer {
                deps.push(w);
            }
            if write {
                deps.append(&mut seg.readers);
                seg.writer = Some(task);
            } else if seg.readers.last() != Some(&task) {
                seg.readers.push(task);
            }
        }
    }
}

/// Splits the segment that strictly contains `at`, if any.
fn split(map: &mut BTreeMap<u64, Segment>, at: u64) {
    let Some((&s, seg)) = map.range_mut(..at).next_back() else {
        return;
    };
    if seg.end <= at {
        return;
    }
    let tail = Segment {
        end: seg.end,
        writer: seg.writer,
        readers: seg.readers.clone(),
    };
    seg.end = at;
    debug_assert!(s < at);
    map.insert(at, tail);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(buf: Buf, offset: u64, len: u64) -> Region {
        Region { buf, offset, len }
    }

    fn deps_of(h: &mut Hazards, task: u32, reads: &[Region], writes: &[Region]) -> Vec<u32> {
        let mut d = Vec::new();
        for &x in reads {
            h.access(task, x, false, &mut d);
        }
        for &x in writes {
            h.access(task, x, true, &mut d);
        }
        d.sort_unstable();
        d.dedup();
        d.retain(|&t| t != task);
        d
    }

    #[test]
    fn raw_war_waw() {
        let mut h = Hazards::default();
        assert!(deps_of(&mut h, 0, &[], &[r(Buf::Recv, 0, 100)]).is_empty());
        // Reads of disjoint halves both wait for the write.
        assert_eq!(deps_of(&mut h, 1, &[r(Buf::Recv, 0, 50)], &[]), [0]);
        assert_eq!(deps_of(&mut h, 2, &[r(Buf::Recv, 50, 50)], &[]), [0]);
        // A write over the middle waits for the writer and both readers.
        assert_eq!(deps_of(&mut h, 3, &[], &[r(Buf::Recv, 40, 20)]), [0, 1, 2]);
        // A read of the left edge sees the old writer only.
        assert_eq!(deps_of(&mut h, 4, &[r(Buf::Recv, 0, 10)], &[]), [0]);
        // A read spanning into the middle also sees the new writer.
        assert_eq!(deps_of(&mut h, 5, &[r(Buf::Recv, 35, 10)], &[]), [0, 3]);
        // Other buffers are independent; untouched bytes have no history.
        assert!(deps_of(&mut h, 6, &[r(Buf::Send, 0, 100)], &[r(Buf::Recv, 200, 10)]).is_empty());
        // Read-modify-write of the same bytes does not depend on itself.
        assert_eq!(
            deps_of(
                &mut h,
                7,
                &[r(Buf::Recv, 200, 10)],
                &[r(Buf::Recv, 200, 10)]
            ),
            [6]
        );
    }
}
