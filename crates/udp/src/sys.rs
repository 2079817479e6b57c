//! Batched UDP I/O: `sendmmsg` with optional UDP GSO and a per-message
//! `IP_TOS` cmsg, `recvmmsg` with optional UDP GRO and the received TOS byte.
//!
//! This is the only module with `unsafe`: every block is a syscall on
//! buffers this module owns and sized, with a `// SAFETY:` note.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

/// `SOL_UDP` level socket options (linux/udp.h).
const SOL_UDP: libc::c_int = 17;
/// Send: segment size for UDP GSO.
const UDP_SEGMENT: libc::c_int = 103;
/// Receive: coalesce datagrams (GRO), cmsg carries the segment size.
const UDP_GRO: libc::c_int = 104;

/// Most segments the kernel accepts in one GSO send.
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes in one GSO send (UDP payload limit, minus headroom for headers).
pub const GSO_MAX_BYTES: usize = 65_000;
/// Receive buffer size: room for a GRO super-datagram.
pub(crate) const RX_BUF_LEN: usize = 65_536;

/// ECN codepoint in the low two bits of the TOS / traffic-class byte.
pub(crate) fn ecn_bits(ecn: metaroce_verbs::Ecn) -> u8 {
    match ecn {
        metaroce_verbs::Ecn::NotEct => 0,
        metaroce_verbs::Ecn::Ect0 => 2,
        metaroce_verbs::Ecn::Ce => 3,
    }
}

/// The core's ECN value of a received TOS byte (ECT(1) counts as ECT).
pub(crate) fn ecn_of_tos(tos: u8) -> metaroce_verbs::Ecn {
    match tos & 3 {
        0 => metaroce_verbs::Ecn::NotEct,
        3 => metaroce_verbs::Ecn::Ce,
        _ => metaroce_verbs::Ecn::Ect0,
    }
}

/// Bind a non-blocking UDP socket at `addr` with large buffers and TOS
/// reception on.
pub(crate) fn bind_udp(addr: SocketAddr) -> io::Result<Socket> {
    let domain = Domain::for_address(addr);
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_nonblocking(true)?;
    // Large buffers; the FORCE variants need CAP_NET_ADMIN, plain ones are capped.
    if s.set_recv_buffer_size(16 << 20).is_ok() {
        let _ = force_buf(&s, libc::SO_RCVBUFFORCE, 16 << 20);
    }
    if s.set_send_buffer_size(4 << 20).is_ok() {
        let _ = force_buf(&s, libc::SO_SNDBUFFORCE, 4 << 20);
    }
    if addr.is_ipv4() {
        setsockopt_int(&s, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
    } else {
        setsockopt_int(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
    }
    set_dont_fragment(&s, addr.is_ipv4())?;
    s.bind(&SockAddr::from(addr))?;
    Ok(s)
}

/// Path MTU discovery on, local fragmentation off: every datagram leaves
/// with the don't-fragment bit set (IPv4; IPv6 routers never fragment), a
/// router whose next link is too small drops it and answers with an ICMP
/// "fragmentation needed" / "packet too big" that lowers the kernel's path
/// MTU for that destination, and a send larger than the path MTU the kernel
/// knows fails with `EMSGSIZE` instead of being cut into IP fragments.
/// Fragments carry no UDP ports, so ECMP would hash every one of them onto
/// the same link whatever the source port, and one lost fragment loses the
/// whole datagram.
fn set_dont_fragment(s: &Socket, v4: bool) -> io::Result<()> {
    if v4 {
        setsockopt_int(
            s,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    } else {
        setsockopt_int(
            s,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    }
}

/// The kernel's current path MTU (IP packet bytes) from `local` to `peer`:
/// a UDP socket bound at `local`, connected to `peer` (no packet is sent),
/// asked for `IP_MTU`. That is the route's MTU (the egress interface's,
/// or a route's `mtu` attribute) lowered by any path MTU the kernel has
/// learned from ICMP for that destination.
pub(crate) fn route_mtu(local: std::net::IpAddr, peer: std::net::IpAddr) -> io::Result<u32> {
    let domain = if peer.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    set_dont_fragment(&s, peer.is_ipv4())?;
    s.bind(&SockAddr::from(SocketAddr::new(local, 0)))?;
    // The port is irrelevant: connect only looks the route up.
    s.connect(&SockAddr::from(SocketAddr::new(peer, 9)))?;
    let (level, opt) = if peer.is_ipv4() {
        (libc::IPPROTO_IP, libc::IP_MTU)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    };
    let mtu = getsockopt_int(&s, level, opt)?;
    u32::try_from(mtu).map_err(|_| io::Error::other(format!("IP_MTU returned {mtu}")))
}

/// The interface that holds `ip` and its MTU (`SIOCGIFMTU`), in the
/// network namespace of the calling thread. None if no interface has it.
pub(crate) fn interface_of(ip: std::net::IpAddr) -> Option<(String, u32)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we own and free below.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive
        // until freeifaddrs; its address pointer is null or points at a
        // sockaddr of the family it names, sized for that family.
        let (name, addr) = unsafe {
            let ifa = &*cur;
            cur = ifa.ifa_next;
            if ifa.ifa_addr.is_null() {
                continue;
            }
            let fam = libc::c_int::from((*ifa.ifa_addr).sa_family);
            let len = match fam {
                libc::AF_INET => size_of::<libc::sockaddr_in>(),
                libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
                _ => continue,
            };
            let mut st: libc::sockaddr_storage = zeroed();
            std::ptr::copy_nonoverlapping(
                ifa.ifa_addr.cast::<u8>(),
                (&raw mut st).cast::<u8>(),
                len,
            );
            let name = std::ffi::CStr::from_ptr(ifa.ifa_name)
                .to_string_lossy()
                .into_owned();
            (name, sockaddr_to_std(&st, len as libc::socklen_t))
        };
        if addr.is_some_and(|a| a.ip() == ip) {
            found = Some(name);
            break;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    let name = found?;
    let mtu = interface_mtu(&name).ok()?;
    Some((name, mtu))
}

/// An interface's MTU by name (`SIOCGIFMTU` on a throwaway socket).
fn interface_mtu(name: &str) -> io::Result<u32> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, None)?;
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "name too long"));
    }
    for (d, &b) in req.ifr_name.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU reads the NUL-terminated name from `req` and writes
    // the MTU into its union; `req` is a live ifreq of the right size.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFMTU, &raw mut req) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after a successful SIOCGIFMTU the union holds ifru_mtu.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| io::Error::other("negative MTU"))
}

fn getsockopt_int(s: &Socket, level: libc::c_int, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` is a live c_int and `len` its size; the kernel writes at
    // most `len` bytes; the fd is open for the lifetime of `s`.
    let r =
        unsafe { libc::getsockopt(s.as_raw_fd(), level, opt, (&raw mut v).cast(), &raw mut len) };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn force_buf(s: &Socket, opt: libc::c_int, bytes: libc::c_int) -> io::Result<()> {
    setsockopt_int(s, libc::SOL_SOCKET, opt, bytes)
}

/// A socket's receive-queue occupancy in bytes (kernel truesize, so a
/// little above the payload) and the datagrams the kernel dropped on it
/// for lack of room, from `SO_MEMINFO`. `None` where the kernel lacks it.
pub(crate) fn rx_queue(s: &Socket) -> Option<(u32, u32)> {
    const N: usize = libc::SK_MEMINFO_DROPS as usize + 1;
    let mut info = [0u32; N];
    let mut len = size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is a live, writable buffer of `len` bytes and the
    // kernel writes at most `len` bytes into it (and updates `len`); the fd
    // is open for the lifetime of `s`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    if r != 0 || (len as usize) < size_of_val(&info) {
        return None;
    }
    Some((
        info[libc::SK_MEMINFO_RMEM_ALLOC as usize],
        info[libc::SK_MEMINFO_DROPS as usize],
    ))
}

fn setsockopt_int(
    s: &Socket,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `v` is a live c_int and we pass its exact size; the fd is open
    // for the lifetime of `s`.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            opt,
            (&raw const v).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the kernel accepts UDP GSO on this socket (probe with a
/// harmless segment size; 0 turns it off again for plain sends).
pub(crate) fn probe_gso(s: &Socket) -> bool {
    setsockopt_int(s, SOL_UDP, UDP_SEGMENT, 1400).is_ok()
        && setsockopt_int(s, SOL_UDP, UDP_SEGMENT, 0).is_ok()
}

/// Turn UDP GRO on; false where the kernel lacks it.
pub(crate) fn enable_gro(s: &Socket) -> bool {
    setsockopt_int(s, SOL_UDP, UDP_GRO, 1).is_ok()
}

/// One message to send: byte slices sent back to back as one datagram, or
/// (when `segment` is `Some`) cut by the kernel into GSO segments of
/// `segment` bytes, to `dst` with the TOS byte `tos`. A datagram may be
/// several slices (headers in a buffer, payload in a memory region):
/// segments are cut by length, not by slice.
#[derive(Clone, Copy)]
pub struct OutMsg<'a> {
    pub(crate) dst: SocketAddr,
    pub(crate) tos: u8,
    pub(crate) segment: Option<u16>,
    pub(crate) parts: &'a [&'a [u8]],
    /// Datagrams this message becomes on the wire.
    pub(crate) datagrams: usize,
}

/// Control-message space for one outgoing message: a TOS (int) and a GSO
/// segment size (u16), each in its own aligned cmsg.
const TX_CMSG_SPACE: usize = 64;
/// Control-message space for one received message: TOS / TCLASS and GRO size.
const RX_CMSG_SPACE: usize = 64;

#[repr(C, align(8))]
struct CmsgBuf<const N: usize>([u8; N]);

/// Most iovecs per outgoing message: up to three slices (headers, payload
/// in place, trailer) per GSO segment; well under the kernel's UIO_MAXIOV.
pub(crate) const MAX_IOV: usize = 3 * GSO_MAX_SEGMENTS;

/// Send `msgs` on `sock` with one `sendmmsg` call (looping on partial
/// sends). Returns how many messages the kernel took; stops early on
/// `WouldBlock` (the rest are the caller's to retry or drop).
pub(crate) fn send_batch(sock: &Socket, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
    const CHUNK: usize = 32;
    let mut sent = 0;
    while sent < msgs.len() {
        let chunk = &msgs[sent..msgs.len().min(sent + CHUNK)];
        let n = send_chunk(sock, chunk)?;
        if n == 0 {
            break;
        }
        sent += n;
        if n < chunk.len() {
            break;
        }
    }
    Ok(sent)
}

/// The arrays one `sendmmsg` call describes its messages with, kept per
/// thread and reused: building them afresh cost several allocations and
/// kilobytes of zeroing per send, on the latency path.
#[derive(Default)]
struct TxScratch {
    addrs: Vec<SockAddr>,
    iovs: Vec<libc::iovec>,
    cmsgs: Vec<CmsgBuf<TX_CMSG_SPACE>>,
    hdrs: Vec<libc::mmsghdr>,
}

thread_local! {
    static TX_SCRATCH: std::cell::RefCell<TxScratch> = std::cell::RefCell::default();
}

fn send_chunk(sock: &Socket, chunk: &[OutMsg<'_>]) -> io::Result<usize> {
    TX_SCRATCH.with_borrow_mut(|scratch| send_chunk_with(sock, chunk, scratch))
}

fn send_chunk_with(
    sock: &Socket,
    chunk: &[OutMsg<'_>],
    scratch: &mut TxScratch,
) -> io::Result<usize> {
    let n = chunk.len();
    let TxScratch {
        addrs,
        iovs,
        cmsgs,
        hdrs,
    } = scratch;
    addrs.clear();
    iovs.clear();
    cmsgs.clear();
    // SAFETY: mmsghdr is plain old data for which all-zero is a valid value.
    // Entries kept from an earlier call have every field this call reads
    // set again below.
    hdrs.resize_with(n, || unsafe { zeroed() });
    for m in chunk {
        if m.parts.is_empty() || m.parts.len() > MAX_IOV {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad part count",
            ));
        }
        addrs.push(SockAddr::from(m.dst));
        iovs.extend(m.parts.iter().map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        }));
        cmsgs.push(CmsgBuf([0; TX_CMSG_SPACE]));
    }
    // `iovs` is complete and no longer grows: pointers into it stay valid.
    let mut iov_at = 0;
    for i in 0..n {
        let m = &chunk[i];
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = addrs[i].as_ptr() as *mut libc::c_void;
        h.msg_namelen = addrs[i].len();
        h.msg_iov = iovs[iov_at..].as_mut_ptr();
        h.msg_iovlen = m.parts.len();
        iov_at += m.parts.len();
        h.msg_control = cmsgs[i].0.as_mut_ptr().cast();
        h.msg_controllen = TX_CMSG_SPACE;
        let v6 = m.dst.is_ipv6();
        // SAFETY: msg_control points at TX_CMSG_SPACE aligned bytes owned by
        // `cmsgs[i]`, large enough for two int-sized cmsgs (checked by the
        // CMSG_SPACE sum below); CMSG_FIRSTHDR/NXTHDR stay inside it.
        unsafe {
            let need = libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize
                + libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
            debug_assert!(need <= TX_CMSG_SPACE);
            let mut used = 0usize;
            let c = libc::CMSG_FIRSTHDR(h);
            (*c).cmsg_level = if v6 {
                libc::IPPROTO_IPV6
            } else {
                libc::IPPROTO_IP
            };
            (*c).cmsg_type = if v6 { libc::IPV6_TCLASS } else { libc::IP_TOS };
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
            let tos = libc::c_int::from(m.tos);
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), tos);
            used += libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize;
            if let Some(seg) = m.segment {
                h.msg_controllen = used + libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
                let c2 = libc::CMSG_NXTHDR(h, c);
                (*c2).cmsg_level = SOL_UDP;
                (*c2).cmsg_type = UDP_SEGMENT;
                (*c2).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c2).cast::<u16>(), seg);
                used = h.msg_controllen;
            }
            h.msg_controllen = used;
        }
    }
    // SAFETY: `hdrs` holds `n` initialised mmsghdrs whose pointers (names,
    // iovecs, control buffers, payload slices) all outlive this call.
    let r = unsafe {
        libc::sendmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

/// A received message: `len` bytes in its buffer, from `src`, with the TOS
/// byte and (under GRO) the segment size the bytes are split at.
#[derive(Debug, Clone, Copy)]
pub struct InMeta {
    /// The sender (None: an address family this code does not read).
    pub src: Option<SocketAddr>,
    /// Bytes received (under GRO, several datagrams back to back).
    pub len: usize,
    /// The TOS / traffic-class byte (ECN in its low two bits).
    pub tos: u8,
    /// Under GRO, the size of each coalesced datagram but the last.
    pub segment: Option<usize>,
}

/// Receive buffers for `recvmmsg`.
pub struct RxBatch {
    bufs: Vec<Vec<u8>>,
    pub(crate) meta: Vec<InMeta>,
    // The `recvmmsg` descriptors, allocated once: an idle busy-poll calls
    // `recv` millions of times a second.
    names: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<CmsgBuf<RX_CMSG_SPACE>>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Messages the last `recv` filled (whose lengths the kernel rewrote).
    filled: usize,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point only into this
// batch's own heap buffers (`bufs`, `names`, `cmsgs`, `iovs`), which are
// allocated in `new` and never resized, so the pointers stay valid for the
// batch's life; only the kernel (during `recv`, which takes `&mut self`)
// writes through them. Moving the batch to another thread moves those
// buffers' owners with it.
unsafe impl Send for RxBatch {}

impl RxBatch {
    /// Room for `n` messages per [`RxBatch::recv`], each up to 64 KiB (a
    /// GRO super-datagram).
    pub fn new(n: usize) -> Self {
        let mut b = Self {
            bufs: (0..n).map(|_| vec![0; RX_BUF_LEN]).collect(),
            meta: Vec::with_capacity(n),
            // SAFETY: all-zero is a valid value for these plain C structs.
            names: (0..n).map(|_| unsafe { zeroed() }).collect(),
            cmsgs: (0..n).map(|_| CmsgBuf([0; RX_CMSG_SPACE])).collect(),
            iovs: Vec::with_capacity(n),
            // SAFETY: as above.
            hdrs: (0..n).map(|_| unsafe { zeroed() }).collect(),
            filled: 0,
        };
        // Wire every descriptor once. The pointers go into the heap
        // buffers of these vectors, which are never resized, so they stay
        // valid when the batch itself moves.
        let Self {
            bufs,
            names,
            cmsgs,
            iovs,
            hdrs,
            ..
        } = &mut b;
        iovs.extend(bufs.iter_mut().map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        }));
        for i in 0..n {
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&raw mut names[i]).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &raw mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = cmsgs[i].0.as_mut_ptr().cast();
            h.msg_controllen = RX_CMSG_SPACE;
        }
        b
    }

    /// The bytes of received message `i` (panics unless `i` is below what
    /// the last [`RxBatch::recv`] returned).
    pub fn data(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.meta[i].len]
    }

    /// One non-blocking `recvmmsg`; fills `meta`. Returns how many messages
    /// (0 when none is waiting).
    pub fn recv(&mut self, sock: &Socket) -> io::Result<usize> {
        self.recv_up_to(sock, usize::MAX)
    }

    /// [`recv`](Self::recv), at most `max` datagrams (at least one). With
    /// room for more, `recvmmsg` goes on to the next descriptor after a
    /// datagram (its header copied in, the socket asked again) and finds
    /// nothing when the datagram was alone, as a ping-pong's is.
    pub fn recv_up_to(&mut self, sock: &Socket, max: usize) -> io::Result<usize> {
        self.meta.clear();
        let n = self.bufs.len().min(max.max(1));
        let hdrs = &mut self.hdrs;
        // The kernel rewrote the in/out lengths of the messages it filled
        // last time; every other descriptor is as `new` wired it (an idle
        // poll, the common case, resets nothing).
        for h in &mut hdrs[..self.filled] {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = RX_CMSG_SPACE;
        }
        self.filled = 0;
        // SAFETY: `hdrs` holds `n` mmsghdrs pointing at buffers, names and
        // control areas owned by `self` (wired in `new`, never reallocated),
        // with their true sizes; the kernel writes at most those sizes.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            // Compared by number: an empty poll (most polls of a waiting
            // loop) need not map the error to its kind.
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(0);
            }
            return Err(e);
        }
        let got = r as usize;
        self.filled = got;
        let hdrs = &self.hdrs;
        let names = &self.names;
        for i in 0..got {
            let h = &hdrs[i].msg_hdr;
            let len = (hdrs[i].msg_len as usize).min(RX_BUF_LEN);
            let (tos, segment) = read_cmsgs(h);
            let src = sockaddr_to_std(&names[i], h.msg_namelen);
            self.meta.push(InMeta {
                src,
                len,
                tos,
                segment,
            });
        }
        Ok(got)
    }
}

/// The TOS byte and the GRO segment size from the control messages the
/// kernel filled into `h` (by `recvmsg` or `recvmmsg`).
fn read_cmsgs(h: &libc::msghdr) -> (u8, Option<usize>) {
    let mut tos = 0u8;
    let mut segment = None;
    // SAFETY: the kernel filled msg_control up to msg_controllen (within
    // the control buffer the caller gave it); CMSG_FIRSTHDR/NXTHDR only
    // return headers inside that length, and each data read is bounded by
    // cmsg_len.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let data_len = (*c).cmsg_len.saturating_sub(libc::CMSG_LEN(0) as usize);
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_TOS) if data_len >= 1 => tos = *data,
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) if data_len >= 4 => {
                    tos = std::ptr::read_unaligned(data.cast::<libc::c_int>()) as u8;
                }
                (SOL_UDP, UDP_GRO) if data_len >= 2 => {
                    let seg = if data_len >= 4 {
                        std::ptr::read_unaligned(data.cast::<libc::c_int>()) as usize
                    } else {
                        usize::from(std::ptr::read_unaligned(data.cast::<u16>()))
                    };
                    if seg > 0 {
                        segment = Some(seg);
                    }
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    (tos, segment)
}

/// One non-blocking `recvmsg` of the next datagram into `parts`, in
/// order. With `peek`, the datagram stays queued (`MSG_PEEK`) and the
/// length returned is its whole length even where `parts` hold less
/// (`MSG_TRUNC`); without, a datagram longer than `parts` is cut (its
/// length says so). None when nothing is waiting.
pub(crate) fn recv_one(
    sock: &Socket,
    parts: &mut [&mut [u8]],
    peek: bool,
) -> io::Result<Option<InMeta>> {
    let mut iovs: [libc::iovec; 4] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 4];
    let n = parts.len().min(iovs.len());
    for (iov, part) in iovs.iter_mut().zip(parts.iter_mut()) {
        iov.iov_base = part.as_mut_ptr().cast();
        iov.iov_len = part.len();
    }
    // SAFETY: all-zero is a valid value for these plain C structs.
    let mut name: libc::sockaddr_storage = unsafe { zeroed() };
    let mut cmsg = CmsgBuf([0; RX_CMSG_SPACE]);
    // SAFETY: as above.
    let mut h: libc::msghdr = unsafe { zeroed() };
    h.msg_name = (&raw mut name).cast();
    h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    h.msg_iov = iovs.as_mut_ptr();
    h.msg_iovlen = n;
    h.msg_control = cmsg.0.as_mut_ptr().cast();
    h.msg_controllen = RX_CMSG_SPACE;
    let flags = libc::MSG_DONTWAIT
        | if peek {
            libc::MSG_PEEK | libc::MSG_TRUNC
        } else {
            0
        };
    // SAFETY: `h` points at `n` iovecs, each covering one of `parts` (live
    // mutable slices for the whole call, at their true lengths), and at a
    // name and a control buffer of the sizes given; the kernel writes
    // within those sizes only.
    let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &raw mut h, flags) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(e);
    }
    let (tos, segment) = read_cmsgs(&h);
    Ok(Some(InMeta {
        src: sockaddr_to_std(&name, h.msg_namelen),
        len: r as usize,
        tos,
        segment,
    }))
}

fn sockaddr_to_std(s: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    let len = len as usize;
    match libc::c_int::from(s.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, the
            // kernel wrote at least its size, and sockaddr_storage is
            // aligned for every sockaddr type.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Wait until `fds` are readable or `timeout_ns` passes (None: forever).
pub(crate) fn wait_readable(fds: &[std::os::fd::RawFd], timeout_ns: Option<u64>) {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` is a live array of `len` pollfds; `tsp` is null or
    // points at a live timespec; a null sigmask leaves the mask unchanged.
    unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        );
    }
}

/// An eventfd used to wake the progress engine.
pub(crate) struct EventFd(std::os::fd::OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; a non-negative result is a new fd we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(Self(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }))
    }

    pub(crate) fn raw(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }

    pub(crate) fn signal(&self) {
        let v: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(self.raw(), (&raw const v).cast(), 8);
        }
    }

    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 (non-blocking fd).
        unsafe {
            libc::read(self.raw(), (&raw mut v).cast(), 8);
        }
    }
}

/// Wait up to `timeout_ns` for `fd` to accept more data.
pub(crate) fn wait_writable(fd: std::os::fd::RawFd, timeout_ns: u64) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: one live pollfd and a live timespec; null sigmask.
    unsafe {
        libc::ppoll(&raw mut pfd, 1, &raw const ts, std::ptr::null());
    }
}

/// Set the calling thread's niceness (best effort: refused without
/// CAP_SYS_NICE for values below the current one).
pub(crate) fn set_thread_nice(nice: i32) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority on this thread's id only changes its niceness.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice);
    }
}

/// The calling thread's scheduler statistics (`/proc/thread-self/
/// schedstat`: time on a CPU, time runnable but waiting for one, count of
/// slices), kept open: a spinning thread reads it every few tens of µs to
/// learn how long it waited for its CPU (~250 ns a read).
///
/// Open it on the thread it is to measure: `thread-self` is resolved when
/// the file is opened.
#[derive(Debug)]
pub(crate) struct ThreadSchedStat {
    file: std::fs::File,
}

impl ThreadSchedStat {
    /// The calling thread's statistics, or `None` where the kernel keeps
    /// none (built without scheduler statistics, or no procfs).
    pub(crate) fn open() -> Option<Self> {
        let file = std::fs::File::open("/proc/thread-self/schedstat").ok()?;
        let s = Self { file };
        s.run_delay_ns().map(|_| s)
    }

    /// Nanoseconds this thread has spent runnable but waiting for a CPU,
    /// since it started (the second field).
    pub(crate) fn run_delay_ns(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(&buf[..n])
            .ok()?
            .split_ascii_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }
}

/// Times the calling thread has been taken off its CPU while it could
/// still run (preempted, or yielding to another runnable thread): the
/// scheduler's sign that some other thread wants this CPU.
pub(crate) fn thread_involuntary_switches() -> u64 {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { zeroed() };
    // SAFETY: getrusage writes one rusage into the live, writable `ru`.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut ru) };
    if r != 0 {
        return 0;
    }
    u64::try_from(ru.ru_nivcsw).unwrap_or(0)
}

/// `CLOCK_MONOTONIC` in nanoseconds (the clock `Instant` reads), as one
/// `u64` without the `Duration` and `u128` arithmetic of
/// `Instant::elapsed`: a busy-polling thread reads it on every poll.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the live, writable
    // `ts`; CLOCK_MONOTONIC always exists on Linux.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts);
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}
