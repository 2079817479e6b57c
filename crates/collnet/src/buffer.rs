//! Registered user buffers and the registration cache.
//!
//! A MetaRoCE memory region owns its bytes (the context holds them; there
//! are no raw pointers), so a buffer a collective reads or writes is a
//! region allocated through the communicator ([`DevBuf`], like a device
//! buffer of NCCL's, filled and read through the communicator), and
//! registering "user memory" means copying into a registered region.
//! [`BufferCache`] keeps such regions for reuse by size, so that an
//! application passing plain slices ([`crate::NetComm::run_slices`]) pays a
//! registration only when it needs a larger buffer than any before.

use metaroce_verbs::MemoryRegion;

/// A buffer registered with a communicator's device: the send or receive
/// buffer of operations. Zero-length buffers have no region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevBuf {
    pub(crate) mr: Option<MemoryRegion>,
    pub(crate) len: u64,
    /// Its place among the communicator's symmetric buffers
    /// ([`crate::NetComm::alloc_symmetric`]), if it is one.
    pub(crate) symmetric: Option<usize>,
}

impl DevBuf {
    /// A zero-length buffer (no region).
    pub const fn empty() -> Self {
        Self {
            mr: None,
            len: 0,
            symmetric: None,
        }
    }

    /// Whether peers may write into it (see
    /// [`crate::NetComm::alloc_symmetric`]).
    pub fn is_symmetric(&self) -> bool {
        self.symmetric.is_some()
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `len` bytes of this buffer (`len` at most its length), as
    /// an operation's buffer of exactly that size.
    pub fn prefix(&self, len: u64) -> Option<Self> {
        (len <= self.len).then_some(Self {
            mr: if len == 0 { None } else { self.mr },
            len,
            symmetric: self.symmetric,
        })
    }
}

/// Registered buffers kept for reuse: one per role (send, receive), grown
/// to the largest size asked for so far.
#[derive(Debug, Default)]
pub(crate) struct BufferCache {
    pub(crate) send: Option<DevBuf>,
    pub(crate) recv: Option<DevBuf>,
    /// Registrations made (a cache miss each).
    pub(crate) registrations: u64,
}
