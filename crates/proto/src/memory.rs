//! Registered memory: regions, keys, access flags, and every bounds check.
//!
//! Every remote access names a region by its 64-bit `rkey` and an address in
//! that region's I/O virtual address (IOVA) range. A key is `index << 44 |
//! random 44 bits`: the index finds the region in O(1), the random part must
//! then match exactly, so a peer that was not given the key has a 2^-44
//! chance per guess. Checks happen before any byte moves, and all offsets are
//! computed with checked arithmetic: a bad access is an error value, never a
//! memory access outside the region.

use rand_core::Rng;

/// Bits of a key that hold the region index.
const KEY_INDEX_SHIFT: u32 = 44;
const KEY_RANDOM_MASK: u64 = (1 << KEY_INDEX_SHIFT) - 1;
/// IOVAs start here and regions are spaced by a guard gap, so an address that
/// is valid in one region is never valid in a neighbour.
const IOVA_BASE: u64 = 0x7f00_0000_0000;
const IOVA_ALIGN: u64 = 4096;
/// Bytes of the largest region (1 TiB).
pub const MAX_REGION_BYTES: u64 = 1 << 40;

/// Access rights of a memory region (ibverbs `IBV_ACCESS_*`). Local read is
/// always allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct AccessFlags(pub u32);

impl AccessFlags {
    /// The local side may write (receive buffers, READ and atomic results).
    pub const LOCAL_WRITE: Self = Self(1);
    /// Peers may RDMA WRITE into it.
    pub const REMOTE_WRITE: Self = Self(2);
    /// Peers may RDMA READ from it.
    pub const REMOTE_READ: Self = Self(4);
    /// Peers may run atomics on it.
    pub const REMOTE_ATOMIC: Self = Self(8);
    /// No rights beyond local read.
    pub const NONE: Self = Self(0);
    const ALL: u32 = 0xf;

    /// Whether every right in `other` is present.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The ibverbs rule: remote write and remote atomic need local write.
    pub fn validate(self) -> Result<(), MemoryError> {
        if self.0 & !Self::ALL != 0 {
            return Err(MemoryError::UnknownAccessFlags(self.0));
        }
        let remote_mutation =
            self.contains(Self::REMOTE_WRITE) || self.contains(Self::REMOTE_ATOMIC);
        if remote_mutation && !self.contains(Self::LOCAL_WRITE) {
            return Err(MemoryError::RemoteWriteNeedsLocalWrite);
        }
        Ok(())
    }
}

impl core::ops::BitOr for AccessFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// Why a registration or an access failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// Access flags outside the known set.
    #[error("unknown access flag bits {0:#x}")]
    UnknownAccessFlags(u32),
    /// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE.
    #[error("remote write or atomic access requires local write")]
    RemoteWriteNeedsLocalWrite,
    /// The region table is full.
    #[error("too many memory regions (limit {0})")]
    TooManyRegions(u32),
    /// The registration would take the endpoint past its registered-bytes limit.
    #[error("registering {length} bytes would exceed the registered-memory limit of {limit} bytes")]
    TooManyBytes {
        /// Length of the refused region.
        length: u64,
        /// The endpoint's `max_registered_bytes`.
        limit: u64,
    },
    /// A zero-length or oversized region.
    #[error("bad region length {0}")]
    BadLength(u64),
    /// No region has this key (or it was deregistered).
    #[error("unknown key {0:#x}")]
    UnknownKey(u64),
    /// The region belongs to another protection domain.
    #[error("key belongs to another protection domain")]
    WrongDomain,
    /// The access needs a right the region lacks.
    #[error("region lacks the access right")]
    NoPermission,
    /// The range falls outside the region.
    #[error("range {addr:#x}+{len} outside the region")]
    OutOfBounds {
        /// Start address of the attempted access.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// Atomics need an 8-byte aligned address.
    #[error("atomic address {0:#x} is not 8-byte aligned")]
    Misaligned(u64),
}

/// Handle of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrHandle {
    pub(crate) index: u32,
    pub(crate) lkey: u64,
}

/// What a registration gives back: the keys and the IOVA range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    /// Handle for local calls.
    pub handle: MrHandle,
    /// Key for local scatter/gather entries.
    pub lkey: u64,
    /// Key to hand to peers for remote access.
    pub rkey: u64,
    /// First address of the region.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// Its rights.
    pub access: AccessFlags,
}

/// Memory a region can live in that the endpoint does not own: bytes its
/// driver was lent by the application for as long as the region stays
/// registered (a libfabric provider registers a message's own buffer
/// for a rendezvous, so that the peer reads it, or writes into it, in
/// place instead of through a copy). The driver guarantees the memory
/// outlives the registration; the endpoint only ever touches it through
/// these slices, under the same bounds checks as its own bytes.
pub trait RegionMemory: Send + std::fmt::Debug {
    /// The bytes, for reads (sends, remote READs, local gathers).
    fn bytes(&self) -> &[u8];
    /// The bytes for writes, or `None` for memory lent read-only (a send
    /// buffer): writes into such a region are refused like writes into a
    /// deregistered one.
    fn bytes_mut(&mut self) -> Option<&mut [u8]>;
}

/// Where a region's bytes live.
#[derive(Debug)]
enum Backing {
    /// Real bytes owned by the region.
    Bytes(Vec<u8>),
    /// Only a length: writes are discarded and reads return zeros. The fabric
    /// simulator uses this so a thousand-NIC run copies no payload.
    Virtual,
    /// Bytes lent by the driver (see [`RegionMemory`]).
    External(Box<dyn RegionMemory>),
}

impl Backing {
    fn get(&self) -> Option<&[u8]> {
        match self {
            Self::Bytes(b) => Some(b),
            Self::Virtual => None,
            Self::External(m) => Some(m.bytes()),
        }
    }

    fn get_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Self::Bytes(b) => Some(b),
            Self::Virtual => None,
            Self::External(m) => m.bytes_mut(),
        }
    }
}

#[derive(Debug)]
struct Region {
    pd: u32,
    iova: u64,
    len: u64,
    access: AccessFlags,
    lkey: u64,
    rkey: u64,
    backing: Backing,
}

/// A checked, resolved range inside one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) region: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// All registered regions of an endpoint.
#[derive(Debug, Default)]
pub(crate) struct RegionTable {
    regions: Vec<Option<Region>>,
    free: Vec<u32>,
    next_iova: u64,
    limit: u32,
    live: u32,
    bytes_registered: u64,
    max_bytes: u64,
}

/// Which key kind a lookup uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Local,
    Remote,
}

impl RegionTable {
    pub(crate) fn new(limit: u32) -> Self {
        Self {
            next_iova: IOVA_BASE,
            limit,
            max_bytes: u64::MAX,
            ..Self::default()
        }
    }

    /// Cap the bytes registered over all regions (virtual ones included).
    pub(crate) fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// Bytes registered over all live regions.
    pub(crate) fn bytes_registered(&self) -> u64 {
        self.bytes_registered
    }

    pub(crate) fn register(
        &mut self,
        pd: u32,
        length: u64,
        access: AccessFlags,
        virtual_backing: bool,
        rng: &mut impl Rng,
    ) -> Result<MrInfo, MemoryError> {
        access.validate()?;
        let backing = if virtual_backing {
            Backing::Virtual
        } else {
            // Checked before the allocation, which the length sizes.
            Self::check_length(length)?;
            Backing::Bytes(vec![0; length as usize])
        };
        self.insert(pd, length, access, backing, rng)
    }

    /// Register memory lent by the driver; the region is as long as it.
    pub(crate) fn register_external(
        &mut self,
        pd: u32,
        memory: Box<dyn RegionMemory>,
        access: AccessFlags,
        rng: &mut impl Rng,
    ) -> Result<MrInfo, MemoryError> {
        access.validate()?;
        let length = memory.bytes().len() as u64;
        self.insert(pd, length, access, Backing::External(memory), rng)
    }

    fn check_length(length: u64) -> Result<(), MemoryError> {
        if length == 0 || length > MAX_REGION_BYTES {
            return Err(MemoryError::BadLength(length));
        }
        Ok(())
    }

    fn insert(
        &mut self,
        pd: u32,
        length: u64,
        access: AccessFlags,
        backing: Backing,
        rng: &mut impl Rng,
    ) -> Result<MrInfo, MemoryError> {
        Self::check_length(length)?;
        if self.live >= self.limit {
            return Err(MemoryError::TooManyRegions(self.limit));
        }
        if self
            .bytes_registered
            .checked_add(length)
            .is_none_or(|total| total > self.max_bytes)
        {
            return Err(MemoryError::TooManyBytes {
                length,
                limit: self.max_bytes,
            });
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.regions.push(None);
                (self.regions.len() - 1) as u32
            }
        };
        let key = |rng: &mut dyn FnMut() -> u64| {
            (u64::from(index) << KEY_INDEX_SHIFT) | (rng() & KEY_RANDOM_MASK)
        };
        // Both keys from one draw: the endpoint's generator is rebuilt for
        // every draw (`seeded_rng`), and the libfabric provider registers a
        // region per rendezvous on each side. The bytes are those two
        // `next_u64` calls would give.
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        let mut words = bytes
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
        let mut next = || words.next().unwrap_or_default();
        let lkey = key(&mut next);
        let mut rkey = key(&mut next);
        if rkey == lkey {
            rkey ^= 1;
        }
        let iova = self.next_iova;
        self.next_iova = iova + length.div_ceil(IOVA_ALIGN) * IOVA_ALIGN + IOVA_ALIGN;
        self.regions[index as usize] = Some(Region {
            pd,
            iova,
            len: length,
            access,
            lkey,
            rkey,
            backing,
        });
        self.live += 1;
        self.bytes_registered += length;
        Ok(MrInfo {
            handle: MrHandle { index, lkey },
            lkey,
            rkey,
            addr: iova,
            length,
            access,
        })
    }

    pub(crate) fn deregister(&mut self, handle: MrHandle) -> Result<(), MemoryError> {
        let slot = self
            .regions
            .get_mut(handle.index as usize)
            .ok_or(MemoryError::UnknownKey(handle.lkey))?;
        match slot {
            Some(r) if r.lkey == handle.lkey => {
                self.bytes_registered -= r.len;
                *slot = None;
                self.free.push(handle.index);
                self.live -= 1;
                Ok(())
            }
            _ => Err(MemoryError::UnknownKey(handle.lkey)),
        }
    }

    /// Whether any live region belongs to protection domain `pd`.
    pub(crate) fn any_in_domain(&self, pd: u32) -> bool {
        self.regions.iter().flatten().any(|r| r.pd == pd)
    }

    fn region(&self, handle: MrHandle) -> Option<&Region> {
        self.regions
            .get(handle.index as usize)?
            .as_ref()
            .filter(|r| r.lkey == handle.lkey)
    }

    pub(crate) fn bytes(&self, handle: MrHandle) -> Option<&[u8]> {
        self.region(handle)?.backing.get()
    }

    pub(crate) fn bytes_mut(&mut self, handle: MrHandle) -> Option<&mut [u8]> {
        let r = self
            .regions
            .get_mut(handle.index as usize)?
            .as_mut()
            .filter(|r| r.lkey == handle.lkey)?;
        r.backing.get_mut()
    }

    /// The bytes of several distinct regions at once, all writable: `None`
    /// when a handle is stale or virtual, or two handles name one region.
    pub(crate) fn bytes_disjoint_mut<const N: usize>(
        &mut self,
        handles: [MrHandle; N],
    ) -> Option<[&mut [u8]; N]> {
        let indices = handles.map(|h| h.index as usize);
        let regions = self.regions.get_disjoint_mut(indices).ok()?;
        let mut out: [Option<&mut [u8]>; N] = [const { None }; N];
        for ((slot, region), handle) in out.iter_mut().zip(regions).zip(handles) {
            match region {
                Some(Region { lkey, backing, .. }) if *lkey == handle.lkey => {
                    *slot = Some(backing.get_mut()?);
                }
                _ => return None,
            }
        }
        Some(out.map(|b| b.expect("every slot filled above")))
    }

    /// Resolve `addr..addr+len` under `key`, checking domain, rights and bounds.
    pub(crate) fn check(
        &self,
        kind: KeyKind,
        key: u64,
        pd: u32,
        addr: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<Span, MemoryError> {
        let index = (key >> KEY_INDEX_SHIFT) as usize;
        let region = self
            .regions
            .get(index)
            .and_then(Option::as_ref)
            .ok_or(MemoryError::UnknownKey(key))?;
        let expected = match kind {
            KeyKind::Local => region.lkey,
            KeyKind::Remote => region.rkey,
        };
        if expected != key {
            return Err(MemoryError::UnknownKey(key));
        }
        if region.pd != pd {
            return Err(MemoryError::WrongDomain);
        }
        if !region.access.contains(needed) {
            return Err(MemoryError::NoPermission);
        }
        let offset = addr
            .checked_sub(region.iova)
            .ok_or(MemoryError::OutOfBounds { addr, len })?;
        let end = offset
            .checked_add(len)
            .ok_or(MemoryError::OutOfBounds { addr, len })?;
        if end > region.len {
            return Err(MemoryError::OutOfBounds { addr, len });
        }
        Ok(Span {
            region: index as u32,
            offset,
            len,
        })
    }

    /// The `len` bytes at `span.offset + at`, mutably: where a driver may
    /// receive a payload straight from its socket (see
    /// `Endpoint::direct_target`). None for virtual regions, memory lent
    /// read-only, or a range outside the span.
    pub(crate) fn span_bytes_mut(&mut self, span: Span, at: u64, len: u64) -> Option<&mut [u8]> {
        let region = self.regions.get_mut(span.region as usize)?.as_mut()?;
        let end = at.checked_add(len).filter(|&e| e <= span.len)?;
        let start = span.offset.checked_add(at)?;
        if span.offset + end > region.len {
            return None;
        }
        let bytes = region.backing.get_mut()?;
        bytes.get_mut(start as usize..(start + len) as usize)
    }

    /// Copy `data` into the region at `span.offset + at`. The span was checked
    /// when it was resolved; a region deregistered since then (a caller bug
    /// ibverbs leaves undefined) makes this a no-op returning false.
    pub(crate) fn write(&mut self, span: Span, at: u64, data: &[u8]) -> bool {
        let Some(Some(region)) = self.regions.get_mut(span.region as usize) else {
            return false;
        };
        let Some(end) = at.checked_add(data.len() as u64).filter(|&e| e <= span.len) else {
            return false;
        };
        let start = span.offset + at;
        if start + (end - at) > region.len {
            return false;
        }
        match &mut region.backing {
            Backing::Virtual => true,
            backing => match backing.get_mut() {
                Some(b) => {
                    b[start as usize..(start as usize + data.len())].copy_from_slice(data);
                    true
                }
                // Lent read-only.
                None => false,
            },
        }
    }

    /// Copy from the region at `span.offset + at` into `out` (zeros for virtual
    /// regions or a region gone since the check).
    pub(crate) fn read(&self, span: Span, at: u64, out: &mut [u8]) {
        let ok = at
            .checked_add(out.len() as u64)
            .is_some_and(|e| e <= span.len);
        let bytes = match self.regions.get(span.region as usize) {
            Some(Some(Region { backing, len, .. }))
                if ok && span.offset + at + out.len() as u64 <= *len =>
            {
                backing.get()
            }
            _ => None,
        };
        match bytes {
            Some(b) => {
                let start = (span.offset + at) as usize;
                out.copy_from_slice(&b[start..start + out.len()]);
            }
            None => out.fill(0),
        }
    }

    /// Message bytes `offset..offset+len` of `spans` as one slice of region
    /// memory, when they lie inside a single span of a region with real
    /// bytes: what a driver can hand to the kernel in place (gather) instead
    /// of copying. `None` otherwise (the caller copies with [`Self::gather`]).
    pub(crate) fn contiguous(&self, spans: &[Span], offset: u64, len: u64) -> Option<Span> {
        let (span, skip) = spans_from(spans, offset).next()?;
        if skip.checked_add(len)? > span.len {
            return None;
        }
        let sub = Span {
            region: span.region,
            offset: span.offset + skip,
            len,
        };
        self.slice(sub).map(|_| sub)
    }

    /// The bytes of a span, when its region has real bytes and the span
    /// lies inside it.
    pub(crate) fn slice(&self, span: Span) -> Option<&[u8]> {
        match self.regions.get(span.region as usize) {
            Some(Some(Region { backing, len, .. }))
                if span.offset.checked_add(span.len).is_some_and(|e| e <= *len) =>
            {
                let start = span.offset as usize;
                backing.get()?.get(start..start + span.len as usize)
            }
            _ => None,
        }
    }

    /// Copy message bytes `offset..offset+out.len()` gathered from `spans`
    /// (concatenated in order) into `out`; bytes past the spans read as zero.
    pub(crate) fn gather(&self, spans: &[Span], offset: u64, out: &mut [u8]) {
        let mut done = 0usize;
        for (span, skip) in spans_from(spans, offset) {
            if done == out.len() {
                break;
            }
            let take = ((span.len - skip) as usize).min(out.len() - done);
            self.read(*span, skip, &mut out[done..done + take]);
            done += take;
        }
        out[done..].fill(0);
    }

    /// Scatter `data` into `spans` (concatenated in order) starting at message
    /// offset `offset`. Returns false if it does not fit.
    pub(crate) fn scatter(&mut self, spans: &[Span], offset: u64, data: &[u8]) -> bool {
        let mut done = 0usize;
        for (span, skip) in spans_from(spans, offset) {
            if done == data.len() {
                break;
            }
            let take = ((span.len - skip) as usize).min(data.len() - done);
            if !self.write(*span, skip, &data[done..done + take]) {
                return false;
            }
            done += take;
        }
        done == data.len()
    }

    /// Run an 8-byte atomic at `span` (already checked: 8 bytes, aligned,
    /// REMOTE_ATOMIC). Values are little-endian in memory. Returns the
    /// original value.
    pub(crate) fn atomic(&mut self, span: Span, op: AtomicOp) -> u64 {
        let mut word = [0u8; 8];
        self.read(span, 0, &mut word);
        let original = u64::from_le_bytes(word);
        let new = match op {
            AtomicOp::FetchAdd { add } => Some(original.wrapping_add(add)),
            AtomicOp::CmpSwap { compare, swap } => (original == compare).then_some(swap),
        };
        if let Some(v) = new {
            self.write(span, 0, &v.to_le_bytes());
        }
        original
    }
}

/// The spans at or after message offset `offset`, each with the number of
/// its leading bytes to skip.
pub(crate) fn spans_from(spans: &[Span], offset: u64) -> impl Iterator<Item = (&Span, u64)> {
    let mut skip = offset;
    spans.iter().filter_map(move |span| {
        if skip >= span.len {
            skip -= span.len;
            return None;
        }
        let s = skip;
        skip = 0;
        Some((span, s))
    })
}

/// An atomic operation on a 64-bit word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    FetchAdd { add: u64 },
    CmpSwap { compare: u64, swap: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn table() -> (RegionTable, ChaCha20Rng) {
        (RegionTable::new(16), ChaCha20Rng::seed_from_u64(1))
    }

    #[test]
    fn remote_write_needs_local_write() {
        let (mut t, mut rng) = table();
        let err = t
            .register(0, 64, AccessFlags::REMOTE_WRITE, false, &mut rng)
            .unwrap_err();
        assert_eq!(err, MemoryError::RemoteWriteNeedsLocalWrite);
        let err = t
            .register(0, 64, AccessFlags::REMOTE_ATOMIC, false, &mut rng)
            .unwrap_err();
        assert_eq!(err, MemoryError::RemoteWriteNeedsLocalWrite);
        t.register(0, 64, AccessFlags::REMOTE_READ, false, &mut rng)
            .unwrap();
    }

    #[test]
    fn checks_key_domain_rights_and_bounds() {
        let (mut t, mut rng) = table();
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = t.register(7, 100, rw, false, &mut rng).unwrap();
        let ok = t
            .check(
                KeyKind::Remote,
                mr.rkey,
                7,
                mr.addr + 10,
                90,
                AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        assert_eq!((ok.offset, ok.len), (10, 90));
        let e = |addr, len, key, pd, need| {
            t.check(KeyKind::Remote, key, pd, addr, len, need)
                .unwrap_err()
        };
        assert!(matches!(
            e(mr.addr + 10, 91, mr.rkey, 7, AccessFlags::REMOTE_WRITE),
            MemoryError::OutOfBounds { .. }
        ));
        assert!(matches!(
            e(mr.addr - 1, 1, mr.rkey, 7, AccessFlags::REMOTE_WRITE),
            MemoryError::OutOfBounds { .. }
        ));
        assert!(matches!(
            e(u64::MAX, 2, mr.rkey, 7, AccessFlags::REMOTE_WRITE),
            MemoryError::OutOfBounds { .. }
        ));
        assert_eq!(
            e(mr.addr, 8, mr.rkey, 7, AccessFlags::REMOTE_READ),
            MemoryError::NoPermission
        );
        assert_eq!(
            e(mr.addr, 8, mr.rkey, 8, AccessFlags::REMOTE_WRITE),
            MemoryError::WrongDomain
        );
        assert!(matches!(
            e(mr.addr, 8, mr.rkey ^ 0x10, 7, AccessFlags::REMOTE_WRITE),
            MemoryError::UnknownKey(_)
        ));
        // the lkey is not an rkey
        assert!(matches!(
            e(mr.addr, 8, mr.lkey, 7, AccessFlags::REMOTE_WRITE),
            MemoryError::UnknownKey(_)
        ));
    }

    /// Memory lent by a test, writable or not.
    #[derive(Debug)]
    struct Lent {
        bytes: Vec<u8>,
        writable: bool,
    }

    impl RegionMemory for Lent {
        fn bytes(&self) -> &[u8] {
            &self.bytes
        }
        fn bytes_mut(&mut self) -> Option<&mut [u8]> {
            self.writable.then_some(self.bytes.as_mut_slice())
        }
    }

    #[test]
    fn lent_memory_is_read_in_place_and_written_only_when_writable() {
        let (mut t, mut rng) = table();
        let lent = |bytes: &[u8], writable| {
            Box::new(Lent {
                bytes: bytes.to_vec(),
                writable,
            })
        };
        let ro = t
            .register_external(
                0,
                lent(b"abcdef", false),
                AccessFlags::REMOTE_READ,
                &mut rng,
            )
            .unwrap();
        assert_eq!(ro.length, 6);
        let span = t
            .check(
                KeyKind::Remote,
                ro.rkey,
                0,
                ro.addr + 1,
                4,
                AccessFlags::REMOTE_READ,
            )
            .unwrap();
        // In place: the slice a driver hands the kernel is the lent bytes.
        assert_eq!(t.slice(span), Some(&b"bcde"[..]));
        let mut out = [0u8; 4];
        t.read(span, 0, &mut out);
        assert_eq!(&out, b"bcde");
        // Lent read-only: a write is refused and changes nothing.
        assert!(!t.write(span, 0, b"XY"));
        assert_eq!(t.bytes(ro.handle), Some(&b"abcdef"[..]));
        assert!(t.bytes_mut(ro.handle).is_none());
        // The same bounds checks as owned bytes.
        assert!(matches!(
            t.check(
                KeyKind::Remote,
                ro.rkey,
                0,
                ro.addr + 3,
                4,
                AccessFlags::REMOTE_READ
            ),
            Err(MemoryError::OutOfBounds { .. })
        ));
        let rw = t
            .register_external(0, lent(&[0; 8], true), AccessFlags::LOCAL_WRITE, &mut rng)
            .unwrap();
        let span = t
            .check(
                KeyKind::Local,
                rw.lkey,
                0,
                rw.addr + 2,
                3,
                AccessFlags::LOCAL_WRITE,
            )
            .unwrap();
        assert!(t.scatter(&[span], 0, b"xyz"));
        assert_eq!(t.bytes(rw.handle), Some(&b"\0\0xyz\0\0\0"[..]));
        // Empty memory is no region; deregistering gives the memory back.
        assert_eq!(
            t.register_external(0, lent(&[], true), AccessFlags::LOCAL_WRITE, &mut rng)
                .unwrap_err(),
            MemoryError::BadLength(0)
        );
        assert_eq!(t.live(), 2);
        t.deregister(ro.handle).unwrap();
        t.deregister(rw.handle).unwrap();
        assert_eq!((t.live(), t.bytes_registered()), (0, 0));
    }

    #[test]
    fn deregistered_keys_stop_working_and_iovas_do_not_overlap() {
        let (mut t, mut rng) = table();
        let a = t
            .register(0, 5000, AccessFlags::REMOTE_READ, false, &mut rng)
            .unwrap();
        let b = t
            .register(0, 10, AccessFlags::REMOTE_READ, false, &mut rng)
            .unwrap();
        assert!(b.addr >= a.addr + a.length + IOVA_ALIGN);
        t.deregister(a.handle).unwrap();
        assert!(
            t.check(
                KeyKind::Remote,
                a.rkey,
                0,
                a.addr,
                1,
                AccessFlags::REMOTE_READ
            )
            .is_err()
        );
        assert!(t.deregister(a.handle).is_err());
        // the reused slot gets new keys
        let c = t
            .register(0, 10, AccessFlags::REMOTE_READ, false, &mut rng)
            .unwrap();
        assert_ne!(c.rkey, a.rkey);
    }

    #[test]
    fn atomics_apply_once_with_le_words() {
        let (mut t, mut rng) = table();
        let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
        let mr = t.register(0, 16, acc, false, &mut rng).unwrap();
        let span = t
            .check(
                KeyKind::Remote,
                mr.rkey,
                0,
                mr.addr + 8,
                8,
                AccessFlags::REMOTE_ATOMIC,
            )
            .unwrap();
        assert_eq!(t.atomic(span, AtomicOp::FetchAdd { add: 5 }), 0);
        assert_eq!(
            t.atomic(
                span,
                AtomicOp::CmpSwap {
                    compare: 4,
                    swap: 9
                }
            ),
            5
        );
        assert_eq!(
            t.atomic(
                span,
                AtomicOp::CmpSwap {
                    compare: 5,
                    swap: 9
                }
            ),
            5
        );
        assert_eq!(&t.bytes(mr.handle).unwrap()[8..], &9u64.to_le_bytes());
    }

    #[test]
    fn table_limit_is_enforced() {
        let mut t = RegionTable::new(2);
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        t.register(0, 1, AccessFlags::NONE, true, &mut rng).unwrap();
        t.register(0, 1, AccessFlags::NONE, true, &mut rng).unwrap();
        assert_eq!(
            t.register(0, 1, AccessFlags::NONE, true, &mut rng)
                .unwrap_err(),
            MemoryError::TooManyRegions(2)
        );
    }

    #[test]
    fn byte_limit_is_enforced_and_freed_by_deregistration() {
        let mut t = RegionTable::new(16).with_max_bytes(10_000);
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let a = t
            .register(0, 6_000, AccessFlags::NONE, false, &mut rng)
            .unwrap();
        assert_eq!(
            t.register(0, 4_001, AccessFlags::NONE, false, &mut rng)
                .unwrap_err(),
            MemoryError::TooManyBytes {
                length: 4_001,
                limit: 10_000
            }
        );
        t.register(0, 4_000, AccessFlags::NONE, true, &mut rng)
            .unwrap();
        assert_eq!(t.bytes_registered(), 10_000);
        t.deregister(a.handle).unwrap();
        t.register(0, 6_000, AccessFlags::NONE, false, &mut rng)
            .unwrap();
    }
}
