//! A domain's objects as the provider keeps them: completion queues,
//! counters, address vectors, memory registrations and endpoints, all
//! under one lock per domain (`FI_THREAD_SAFE`: any thread may call
//! anything). The C handles in `ffi` hold only the domain and an index.

use crate::addr::EpAddr;
use crate::endpoint::EpState;
use crate::ffi::mem::UserRegion;
use crate::flags;
use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Slots addressed by index; a closed object's slot is reused.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self { items: Vec::new() }
    }
}

impl<T> Slab<T> {
    pub(crate) fn insert(&mut self, v: T) -> usize {
        if let Some(i) = self.items.iter().position(Option::is_none) {
            self.items[i] = Some(v);
            i
        } else {
            self.items.push(Some(v));
            self.items.len() - 1
        }
    }
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.items.get(i)?.as_ref()
    }
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.items.get_mut(i)?.as_mut()
    }
    pub(crate) fn remove(&mut self, i: usize) -> Option<T> {
        self.items.get_mut(i)?.take()
    }
    /// Every slot's index, free ones too (`get` gives `None` for those):
    /// a range, so the caller can change the slab while it walks it, and
    /// nothing is allocated on the polling path.
    pub(crate) fn slots(&self) -> std::ops::Range<usize> {
        0..self.items.len()
    }
}

/// One completion, in the widest (tagged + source) form; the CQ's format
/// decides what is written out.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CqEntry {
    pub(crate) op_context: usize,
    pub(crate) flags: u64,
    pub(crate) len: usize,
    pub(crate) buf: usize,
    pub(crate) data: u64,
    pub(crate) tag: u64,
    /// Source `fi_addr_t` (receives), else `FI_ADDR_NOTAVAIL`.
    pub(crate) src: u64,
}

/// A completion in error.
#[derive(Debug, Clone)]
pub(crate) struct CqError {
    pub(crate) entry: CqEntry,
    /// Bytes that did not fit (truncation).
    pub(crate) olen: usize,
    /// Positive `FI_E*` error.
    pub(crate) err: i32,
    /// What went wrong, naming the peer.
    pub(crate) text: String,
}

/// Error texts kept for `fi_cq_strerror`, by provider errno.
const ERR_TEXTS: usize = 256;

/// A completion queue.
#[derive(Debug)]
pub(crate) struct CqState {
    pub(crate) format: u32,
    pub(crate) entries: VecDeque<CqEntry>,
    pub(crate) errors: VecDeque<CqError>,
    /// Texts of recent errors; `prov_errno` is the index + 1.
    texts: Vec<CString>,
    next_text: usize,
    /// The last error handed out by readerr (its `err_data` points here).
    pub(crate) last_err: Option<CString>,
    /// The last read handed out completions. The read after it, finding
    /// the queue empty, returns without a progress pass: an application
    /// reads its queue until it is empty before it acts on what it read
    /// (Open MPI's progress loop does), and a second pass moments after
    /// the one that found those completions costs a receive system call
    /// on the way to the reply and finds nothing.
    pub(crate) last_read_hit: bool,
}

impl CqState {
    pub(crate) fn new(format: u32) -> Self {
        Self {
            format,
            entries: VecDeque::new(),
            errors: VecDeque::new(),
            texts: Vec::new(),
            next_text: 0,
            last_err: None,
            last_read_hit: false,
        }
    }

    pub(crate) fn push(&mut self, e: CqEntry) {
        self.entries.push_back(e);
    }

    pub(crate) fn push_err(&mut self, e: CqError) {
        self.errors.push_back(e);
    }

    /// Remember `text` for `fi_cq_strerror`; returns its provider errno.
    pub(crate) fn keep_text(&mut self, text: &str) -> i32 {
        let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
        let i = self.next_text % ERR_TEXTS;
        if i < self.texts.len() {
            self.texts[i] = c;
        } else {
            self.texts.push(c);
        }
        self.next_text += 1;
        i as i32 + 1
    }

    /// The text of provider errno `n`, if still kept.
    pub(crate) fn text(&self, n: i32) -> Option<&CString> {
        usize::try_from(n - 1).ok().and_then(|i| self.texts.get(i))
    }
}

/// A counter.
#[derive(Debug, Default)]
pub(crate) struct CntrState {
    pub(crate) value: u64,
    pub(crate) err: u64,
}

/// An address vector (both types hand out indexes as `fi_addr_t`).
#[derive(Debug, Default)]
pub(crate) struct AvState {
    pub(crate) entries: Vec<Option<EpAddr>>,
    pub(crate) reverse: HashMap<EpAddr, u64>,
    /// Asynchronous inserts report on this EQ (`FI_EVENT`).
    pub(crate) eq: Option<Arc<EqShared>>,
    pub(crate) event_flag: bool,
}

impl AvState {
    pub(crate) fn insert(&mut self, a: EpAddr) -> u64 {
        let i = self.entries.len() as u64;
        self.entries.push(Some(a));
        self.reverse.entry(a).or_insert(i);
        i
    }

    pub(crate) fn lookup(&self, fi_addr: u64) -> Option<EpAddr> {
        *self.entries.get(usize::try_from(fi_addr).ok()?)?
    }

    pub(crate) fn remove(&mut self, fi_addr: u64) -> bool {
        let Some(slot) = usize::try_from(fi_addr)
            .ok()
            .and_then(|i| self.entries.get_mut(i))
        else {
            return false;
        };
        let Some(a) = slot.take() else {
            return false;
        };
        if self.reverse.get(&a) == Some(&fi_addr) {
            self.reverse.remove(&a);
            if let Some(j) = self.entries.iter().position(|e| *e == Some(a)) {
                self.reverse.insert(a, j as u64);
            }
        }
        true
    }

    /// The `fi_addr_t` of a peer, or `FI_ADDR_NOTAVAIL`.
    pub(crate) fn source_of(&self, a: &EpAddr) -> u64 {
        self.reverse.get(a).copied().unwrap_or(flags::ADDR_NOTAVAIL)
    }
}

/// A registered region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MrEntry {
    pub(crate) region: UserRegion,
    pub(crate) access: u64,
    /// `fi_mr_reg`'s offset: the remote address of the first byte when
    /// addresses are offsets (no `FI_MR_VIRT_ADDR`).
    pub(crate) offset: u64,
}

/// Why a remote access was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AccessError {
    #[error("no memory region has key {0:#x}")]
    NoKey(u64),
    #[error("memory region {key:#x} does not allow remote {what}")]
    Denied { key: u64, what: &'static str },
    #[error("{len} bytes at {addr:#x} fall outside memory region {key:#x}")]
    OutOfBounds { key: u64, addr: u64, len: u64 },
}

/// The domain's memory registrations, by key.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    pub(crate) by_key: HashMap<u64, MrEntry>,
    pub(crate) virt_addr: bool,
}

impl MrTable {
    /// The region and the offset into it that a remote access of `len`
    /// bytes at `addr` under `key` touches, if allowed.
    pub(crate) fn resolve(
        &self,
        key: u64,
        addr: u64,
        len: u64,
        need: u64,
    ) -> Result<(UserRegion, u64), AccessError> {
        let e = self.by_key.get(&key).ok_or(AccessError::NoKey(key))?;
        let missing = need & !e.access;
        if missing != 0 {
            let what = match (
                missing & flags::REMOTE_READ != 0,
                missing & flags::REMOTE_WRITE != 0,
            ) {
                (true, true) => "read and write",
                (true, false) => "read",
                _ => "write",
            };
            return Err(AccessError::Denied { key, what });
        }
        let start = if self.virt_addr {
            e.region.base() as u64
        } else {
            e.offset
        };
        let oob = AccessError::OutOfBounds { key, addr, len };
        let off = addr.checked_sub(start).ok_or(oob.clone())?;
        let end = off.checked_add(len).ok_or(oob.clone())?;
        if end > e.region.len() as u64 {
            return Err(oob);
        }
        Ok((e.region, off))
    }
}

/// An event queue entry.
#[derive(Debug, Clone)]
pub(crate) struct EqEvent {
    pub(crate) event: u32,
    /// The `fi_eq_entry` / user bytes.
    pub(crate) bytes: Vec<u8>,
}

/// An event queue (shared by the fabric's objects).
#[derive(Debug, Default)]
pub(crate) struct EqShared {
    pub(crate) q: Mutex<EqQueues>,
    pub(crate) cv: Condvar,
}

#[derive(Debug, Default)]
pub(crate) struct EqQueues {
    pub(crate) events: VecDeque<EqEvent>,
    pub(crate) errors: VecDeque<(usize, usize, i32, String)>,
    pub(crate) last_err: Option<CString>,
}

impl EqShared {
    pub(crate) fn push(&self, ev: EqEvent) {
        let mut q = self
            .q
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        q.events.push_back(ev);
        self.cv.notify_all();
    }
}

/// Everything a domain holds.
#[derive(Debug)]
pub(crate) struct DomainState {
    pub(crate) eps: Slab<EpState>,
    pub(crate) cqs: Slab<CqState>,
    pub(crate) cntrs: Slab<CntrState>,
    pub(crate) avs: Slab<AvState>,
    pub(crate) mrs: MrTable,
    pub(crate) next_key: u64,
    /// Requested-key registrations (no `FI_MR_PROV_KEY`).
    pub(crate) prov_keys: bool,
}

/// The pieces of a domain an endpoint reports into while it works.
pub(crate) struct Sinks<'a> {
    pub(crate) cqs: &'a mut Slab<CqState>,
    pub(crate) cntrs: &'a mut Slab<CntrState>,
    pub(crate) avs: &'a Slab<AvState>,
    pub(crate) mrs: &'a MrTable,
}

impl DomainState {
    /// Split into one endpoint and the sinks it reports into.
    pub(crate) fn ep_and_sinks(&mut self, ep: usize) -> Option<(&mut EpState, Sinks<'_>)> {
        let e = self.eps.get_mut(ep)?;
        Some((
            e,
            Sinks {
                cqs: &mut self.cqs,
                cntrs: &mut self.cntrs,
                avs: &self.avs,
                mrs: &self.mrs,
            },
        ))
    }

    /// Drive every endpoint once; returns whether anything happened.
    pub(crate) fn progress_all(&mut self) -> bool {
        let mut did = false;
        for id in self.eps.slots() {
            if let Some((ep, mut s)) = self.ep_and_sinks(id) {
                did |= ep.progress(&mut s);
            }
        }
        did
    }
}

/// A domain: its state behind the lock every call takes.
#[derive(Debug)]
pub(crate) struct DomainShared {
    state: Mutex<DomainState>,
    /// Connection-manager threads waiting for the lock. An application
    /// thread that polls in a tight loop would otherwise take the lock back
    /// every time before a woken waiter runs (a mutex is not fair), and
    /// starve connection set-up.
    background_waiters: AtomicUsize,
}

impl DomainShared {
    pub(crate) fn new(virt_addr: bool, prov_keys: bool) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(DomainState {
                eps: Slab::default(),
                cqs: Slab::default(),
                cntrs: Slab::default(),
                avs: Slab::default(),
                mrs: MrTable {
                    by_key: HashMap::new(),
                    virt_addr,
                },
                next_key: 1,
                prov_keys,
            }),
            background_waiters: AtomicUsize::new(0),
        })
    }

    /// The lock, for application calls: they stand back while a
    /// connection-manager thread waits for it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, DomainState> {
        let mut spins = 0u32;
        while self.background_waiters.load(Ordering::Acquire) > 0 && spins < 10_000 {
            std::thread::yield_now();
            spins += 1;
        }
        self.lock_inner()
    }

    /// The lock, for connection-manager threads.
    pub(crate) fn lock_background(&self) -> MutexGuard<'_, DomainState> {
        self.background_waiters.fetch_add(1, Ordering::AcqRel);
        let g = self.lock_inner();
        self.background_waiters.fetch_sub(1, Ordering::AcqRel);
        g
    }

    fn lock_inner(&self) -> MutexGuard<'_, DomainState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn av_reverse_survives_duplicates_and_removal() {
        let a = EpAddr {
            ip: Ipv4Addr::LOCALHOST,
            cm_port: 1,
        };
        let mut av = AvState::default();
        assert_eq!(av.insert(a), 0);
        assert_eq!(av.insert(a), 1);
        assert_eq!(av.source_of(&a), 0);
        assert!(av.remove(0));
        assert_eq!(av.source_of(&a), 1);
        assert!(!av.remove(0));
        assert!(!av.remove(99));
        assert_eq!(av.lookup(1), Some(a));
        assert_eq!(av.lookup(0), None);
    }

    #[test]
    fn remote_access_is_checked() {
        let mut m = [0u8; 16];
        let mut t = MrTable::default();
        // SAFETY: `m` outlives the table in this test.
        let region = unsafe { UserRegion::new(m.as_mut_ptr() as usize, 16) };
        t.by_key.insert(
            7,
            MrEntry {
                region,
                access: flags::REMOTE_WRITE,
                offset: 100,
            },
        );
        assert!(t.resolve(7, 100, 16, flags::REMOTE_WRITE).is_ok());
        assert_eq!(t.resolve(7, 104, 4, flags::REMOTE_WRITE).unwrap().1, 4);
        assert!(matches!(
            t.resolve(7, 101, 16, flags::REMOTE_WRITE),
            Err(AccessError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.resolve(7, 99, 1, flags::REMOTE_WRITE),
            Err(AccessError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.resolve(7, 100, u64::MAX, flags::REMOTE_WRITE),
            Err(AccessError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.resolve(7, 100, 1, flags::REMOTE_READ),
            Err(AccessError::Denied { .. })
        ));
        // An atomic that fetches needs both rights and names the missing one.
        assert_eq!(
            t.resolve(7, 100, 8, flags::REMOTE_READ | flags::REMOTE_WRITE)
                .unwrap_err()
                .to_string(),
            "memory region 0x7 does not allow remote read"
        );
        assert_eq!(
            t.resolve(8, 0, 1, flags::REMOTE_READ).unwrap_err(),
            AccessError::NoKey(8)
        );
    }
}
