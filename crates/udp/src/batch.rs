//! Batched UDP I/O for tools beside the device: the same sockets (large
//! buffers, TOS reception, non-blocking), `sendmmsg` with optional UDP GSO
//! and `recvmmsg` with optional UDP GRO that the device runs on, with no
//! protocol on top. The raw-UDP baselines of `metaroce perf` measure the
//! kernel path the device rides with it.
//!
//! A safe face on the syscalls in `sys` (the only place with `unsafe`):
//! every buffer handed to the kernel is owned and sized there.
//!
//! ```no_run
//! use metaroce_udp::batch::{self, OutMsg, RxBatch};
//! let rx = batch::bind("127.0.0.1:0".parse().unwrap()).unwrap();
//! let tx = batch::bind("127.0.0.1:0".parse().unwrap()).unwrap();
//! let dst = rx.local_addr().unwrap().as_socket().unwrap();
//! let payload = [0u8; 1000];
//! let parts = [&payload[..]];
//! batch::send_batch(&tx, &[OutMsg::datagram(dst, &parts)]).unwrap();
//! let mut b = RxBatch::new(8);
//! batch::wait_readable(&rx, Some(1_000_000_000));
//! let n = b.recv(&rx).unwrap();
//! for i in 0..n {
//!     println!("{} bytes from {:?}", b.meta()[i].len, b.meta()[i].src);
//! }
//! ```

use crate::sys;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

pub use crate::sys::{GSO_MAX_BYTES, GSO_MAX_SEGMENTS, InMeta, OutMsg, RxBatch};
/// The socket type of this module (socket2's).
pub use socket2::Socket;

/// A non-blocking UDP socket bound at `addr` (port 0: any free port), with
/// large kernel buffers (forced where the process may) and reception of
/// the TOS byte on.
pub fn bind(addr: SocketAddr) -> io::Result<Socket> {
    sys::bind_udp(addr)
}

/// Turn UDP GRO on for `sock`: the kernel may then hand [`RxBatch::recv`]
/// several datagrams from one sender as one message
/// ([`InMeta::segment`]). False where the kernel lacks it.
pub fn enable_gro(sock: &Socket) -> bool {
    sys::enable_gro(sock)
}

/// Whether the kernel accepts UDP GSO on `sock`, i.e. whether
/// [`OutMsg::segmented`] messages can be sent on it.
pub fn probe_gso(sock: &Socket) -> bool {
    sys::probe_gso(sock)
}

/// Send `msgs` on `sock` with `sendmmsg` (32 messages per call, looping).
/// Returns how many messages the kernel took: fewer than `msgs.len()` when
/// the socket buffer filled (the rest are the caller's to retry or drop).
/// A message with no parts, or with more than the kernel's iovec budget,
/// is an `InvalidInput` error.
pub fn send_batch(sock: &Socket, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
    sys::send_batch(sock, msgs)
}

/// Wait until `sock` has something to read, or `timeout_ns` passes (None:
/// no limit).
pub fn wait_readable(sock: &Socket, timeout_ns: Option<u64>) {
    sys::wait_readable(&[sock.as_raw_fd()], timeout_ns);
}

/// Wait until `sock` has room to send, or `timeout_ns` passes.
pub fn wait_writable(sock: &Socket, timeout_ns: u64) {
    sys::wait_writable(sock.as_raw_fd(), timeout_ns);
}

impl<'a> OutMsg<'a> {
    /// One datagram to `dst`: `parts` back to back (TOS byte 0).
    pub fn datagram(dst: SocketAddr, parts: &'a [&'a [u8]]) -> Self {
        Self {
            dst,
            tos: 0,
            segment: None,
            parts,
            datagrams: 1,
        }
    }

    /// `parts` back to back, cut by the kernel (UDP GSO) into datagrams of
    /// `segment` bytes (the last may be shorter), to `dst` (TOS byte 0).
    /// At most [`GSO_MAX_SEGMENTS`] datagrams and [`GSO_MAX_BYTES`] bytes;
    /// the kernel refuses more. Only on a socket where [`probe_gso`] holds.
    pub fn segmented(dst: SocketAddr, parts: &'a [&'a [u8]], segment: u16) -> Self {
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        Self {
            dst,
            tos: 0,
            segment: Some(segment),
            parts,
            datagrams: bytes.div_ceil(usize::from(segment.max(1))).max(1),
        }
    }

    /// The same message with the TOS / traffic-class byte `tos` (ECN in
    /// its low two bits).
    pub fn with_tos(self, tos: u8) -> Self {
        Self { tos, ..self }
    }

    /// Datagrams this message becomes on the wire.
    pub fn datagrams(&self) -> usize {
        self.datagrams
    }
}

impl RxBatch {
    /// What the last [`RxBatch::recv`] received, one entry per message.
    pub fn meta(&self) -> &[InMeta] {
        &self.meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Through the public face only: a plain datagram and (where the kernel
    /// has GSO) a segmented message arrive whole, with their TOS byte.
    #[test]
    fn datagram_and_segmented_round_trip() {
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let rx = bind(lo).unwrap();
        let tx = bind(lo).unwrap();
        let dst = rx.local_addr().unwrap().as_socket().unwrap();
        let a = [1u8; 1000];
        let parts = [&a[..], &a[..500]];
        let mut msgs = vec![OutMsg::datagram(dst, &parts[..1]).with_tos(2)];
        let gso = probe_gso(&tx);
        if gso {
            msgs.push(OutMsg::segmented(dst, &parts, 1000));
            assert_eq!(msgs[1].datagrams(), 2);
        }
        assert_eq!(send_batch(&tx, &msgs).unwrap(), msgs.len());
        // Without GRO on `rx`, every datagram arrives as its own message.
        let want = if gso {
            vec![1000, 1000, 500]
        } else {
            vec![1000]
        };
        let mut got = Vec::new();
        let mut b = RxBatch::new(4);
        let t0 = crate::now_ns();
        while got.len() < want.len() {
            wait_readable(&rx, Some(100_000_000));
            let n = b.recv(&rx).unwrap();
            for i in 0..n {
                assert_eq!(b.data(i), &a[..b.meta()[i].len]);
                got.push((b.meta()[i].len, b.meta()[i].tos));
            }
            assert!(crate::now_ns() - t0 < 2_000_000_000, "got {got:?}");
        }
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), want);
        assert_eq!(got[0].1, 2);
    }

    #[test]
    fn empty_message_is_an_error() {
        let tx = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let m = OutMsg::datagram("127.0.0.1:9".parse().unwrap(), &[]);
        let e = send_batch(&tx, &[m]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
