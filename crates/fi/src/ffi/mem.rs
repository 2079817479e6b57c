//! Application memory the provider reads and writes: send and receive
//! buffers (an iovec list) and registered regions that peers address.
//!
//! Both are built only here, from pointers an application handed to a
//! libfabric call, under libfabric's contract that the memory stays valid
//! (and, for receives and registered regions, writable) until the
//! operation completes or the region is closed. Everything after
//! construction is safe: every access is clamped or bounds-checked, so
//! lengths and offsets that come from a peer can never reach outside what
//! the application gave.

/// A scatter/gather list of application memory.
#[derive(Debug, Clone, Default)]
pub(crate) struct UserIov {
    /// (address, length) pairs; addresses as integers so the list can move
    /// between threads with the operation it belongs to.
    segs: Vec<(usize, usize)>,
    total: usize,
}

impl UserIov {
    /// An iovec list from an application call.
    ///
    /// # Safety
    /// Every `(ptr, len)` must be valid for reads (send side) or for reads
    /// and writes (receive side) of `len` bytes until the operation this
    /// list belongs to completes, and must not be accessed by the
    /// application meanwhile (libfabric's buffer-ownership rule).
    pub(crate) unsafe fn new(segs: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let segs: Vec<(usize, usize)> = segs.into_iter().filter(|&(_, l)| l > 0).collect();
        let total = segs.iter().map(|&(_, l)| l).sum();
        Self { segs, total }
    }

    /// Total bytes.
    pub(crate) fn len(&self) -> usize {
        self.total
    }

    /// First segment's address (the `buf` of a completion), or 0.
    pub(crate) fn first_addr(&self) -> usize {
        self.segs.first().map_or(0, |&(p, _)| p)
    }

    /// Append all bytes to `out`.
    pub(crate) fn gather_into(&self, out: &mut Vec<u8>) {
        for &(p, l) in &self.segs {
            // SAFETY: `new`'s contract: each segment is readable for its
            // length while the operation lives, which it does while we hold
            // the list.
            let s = unsafe { std::slice::from_raw_parts(p as *const u8, l) };
            out.extend_from_slice(s);
        }
    }

    /// Copy the first `dst.len()` bytes (at most `len()`) into `dst`;
    /// returns how many were copied.
    pub(crate) fn gather_to_slice(&self, dst: &mut [u8]) -> usize {
        let mut done = 0;
        for &(p, l) in &self.segs {
            if done == dst.len() {
                break;
            }
            let n = l.min(dst.len() - done);
            // SAFETY: as in `gather_into`; `n <= l`.
            let s = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
            dst[done..done + n].copy_from_slice(s);
            done += n;
        }
        done
    }

    /// Copy `src` into the list starting `offset` bytes in, clamped to the
    /// list's end; returns how many bytes were written.
    pub(crate) fn scatter_from(&self, offset: usize, src: &[u8]) -> usize {
        let mut skip = offset;
        let mut done = 0;
        for &(p, l) in &self.segs {
            if done == src.len() {
                break;
            }
            if skip >= l {
                skip -= l;
                continue;
            }
            let n = (l - skip).min(src.len() - done);
            // SAFETY: `new`'s contract: the segment is writable for `l`
            // bytes while the receive lives; `skip + n <= l`.
            let d = unsafe { std::slice::from_raw_parts_mut((p + skip) as *mut u8, n) };
            d.copy_from_slice(&src[done..done + n]);
            done += n;
            skip = 0;
        }
        done
    }
}

impl UserIov {
    /// The list's memory lent to MetaRoCE as one region, when it is a
    /// single segment: a rendezvous then moves the bytes straight between
    /// the application's buffers (the peer READs the send buffer; the READ
    /// lands in the receive buffer) instead of through staging copies.
    /// `writable` for a receive buffer.
    ///
    /// The caller deregisters the region before the operation this list
    /// belongs to completes or is dropped (at the latest when the endpoint
    /// closes), which keeps it inside `new`'s contract.
    pub(crate) fn lend(&self, writable: bool) -> Option<LentMemory> {
        match self.segs[..] {
            [(addr, len)] => Some(LentMemory {
                addr,
                len,
                writable,
            }),
            _ => None,
        }
    }
}

/// A send or receive buffer registered with MetaRoCE for the length of one
/// rendezvous (see [`UserIov::lend`]).
#[derive(Debug)]
pub(crate) struct LentMemory {
    addr: usize,
    len: usize,
    writable: bool,
}

impl metaroce_verbs::RegionMemory for LentMemory {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `UserIov::new`'s contract keeps the buffer readable
        // while its operation lives, and `lend`'s caller deregisters the
        // region (dropping this) before the operation ends.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        if !self.writable {
            return None;
        }
        // SAFETY: as in `bytes`; a receive buffer is also writable and the
        // application leaves it alone until the receive completes.
        Some(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) })
    }
}

/// A registered memory region (`fi_mr_reg`) that peers read and write
/// with RMA.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UserRegion {
    base: usize,
    len: usize,
}

impl UserRegion {
    /// A region from `fi_mr_reg`.
    ///
    /// # Safety
    /// `base..base + len` must stay valid for reads and writes until the
    /// region is closed (libfabric's registration contract), and the
    /// provider drops the region at `fi_close` of the MR.
    pub(crate) unsafe fn new(base: usize, len: usize) -> Self {
        Self { base, len }
    }

    /// First address.
    pub(crate) fn base(&self) -> usize {
        self.base
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn range(&self, offset: u64, n: usize) -> Option<usize> {
        let off = usize::try_from(offset).ok()?;
        let end = off.checked_add(n)?;
        (end <= self.len).then_some(off)
    }

    /// Write `src` at `offset`; `None` (nothing written) if any byte would
    /// fall outside the region.
    pub(crate) fn write_at(&self, offset: u64, src: &[u8]) -> Option<()> {
        let off = self.range(offset, src.len())?;
        // SAFETY: `new`'s contract makes the region writable while it is
        // registered (we are called with the MR table locked, so it is);
        // `range` checked `off + src.len() <= len`.
        let d = unsafe { std::slice::from_raw_parts_mut((self.base + off) as *mut u8, src.len()) };
        d.copy_from_slice(src);
        Some(())
    }

    /// Read `n` bytes at `offset` into `out`; `None` if outside.
    pub(crate) fn read_at(&self, offset: u64, n: usize, out: &mut Vec<u8>) -> Option<()> {
        let off = self.range(offset, n)?;
        // SAFETY: as in `write_at`, for reads.
        let s = unsafe { std::slice::from_raw_parts((self.base + off) as *const u8, n) };
        out.extend_from_slice(s);
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_gather_clamp() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 4];
        // SAFETY: both arrays outlive the list and are not touched meanwhile.
        let iov = unsafe {
            UserIov::new([
                (a.as_mut_ptr() as usize, a.len()),
                (b.as_mut_ptr() as usize, b.len()),
            ])
        };
        assert_eq!(iov.len(), 7);
        assert_eq!(iov.scatter_from(2, b"wxyz_over"), 5);
        let mut out = Vec::new();
        iov.gather_into(&mut out);
        assert_eq!(out, b"\0\0wxyz_");
        drop(iov);
        assert_eq!(&a, b"\0\0w");
        assert_eq!(&b, b"xyz_");
    }

    #[test]
    fn region_bounds() {
        let mut m = [0u8; 8];
        // SAFETY: `m` outlives the region.
        let r = unsafe { UserRegion::new(m.as_mut_ptr() as usize, m.len()) };
        assert!(r.write_at(6, b"ab").is_some());
        assert!(r.write_at(7, b"ab").is_none());
        assert!(r.write_at(u64::MAX, b"a").is_none());
        let mut out = Vec::new();
        assert!(r.read_at(6, 3, &mut out).is_none());
        assert!(r.read_at(6, 2, &mut out).is_some());
        assert_eq!(out, b"ab");
        assert_eq!(&m[6..], b"ab");
    }
}
