//! Path MTU: what the kernel knows of the largest IP packet the path to a
//! peer carries, and the UDP payload that leaves.
//!
//! Every device socket sends with the don't-fragment bit (`sys::bind_udp`):
//! a datagram the path cannot carry is refused by the local kernel
//! (`EMSGSIZE`) or dropped by the router in front of the small link, which
//! answers with ICMP "fragmentation needed" and so lowers the kernel's path
//! MTU for that destination. It is never cut into IP fragments: those carry
//! no UDP ports, so ECMP routers hash all of them onto one link whatever
//! the path's source port, and losing one fragment loses the datagram.
//!
//! The driver asks the kernel for the path MTU before connecting
//! ([`probe_path`]), sizes the payload per packet from it, and asks again
//! when a send is refused as too big or, every [`RECHECK_NS`], for every
//! peer it knows, to follow changes.

use crate::sys;
use std::io;
use std::net::IpAddr;

/// IPv4 header without options, bytes.
pub const IPV4_HEADER_LEN: usize = 20;
/// IPv6 header without extension headers, bytes.
pub const IPV6_HEADER_LEN: usize = 40;
/// UDP header, bytes.
pub const UDP_HEADER_LEN: usize = 8;

/// How often the engine asks the kernel again for the path MTU of every
/// peer it knows, to follow changes no send has run into yet.
pub const RECHECK_NS: u64 = 1_000_000_000;

/// The largest payload per packet a path-sized MTU takes toward a peer on
/// another host: larger packets gain little on a real network (fewer
/// headers and protocol passes per byte) and lose more to one drop.
pub const AUTO_PAYLOAD_CAP: u32 = 8192;

/// The same cap toward a peer on this host (a loopback address, or this
/// device's own address), whose datagrams never leave the kernel: nothing
/// is lost on a wire, and every packet costs a protocol pass, an ACK share
/// and a slice of a system call on the CPUs both ends share.
pub const LOCAL_PAYLOAD_CAP: u32 = 60 << 10;

/// Whether `peer` is on this host as seen from a device bound to `own`.
pub fn is_local_peer(own: IpAddr, peer: IpAddr) -> bool {
    peer.is_loopback() || peer == own
}

/// What the kernel knows of the path from a local address to a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathMtu {
    /// The path MTU, IP packet bytes (`IP_MTU` of a socket connected to the
    /// peer: the route's MTU, lowered by what ICMP taught the kernel).
    pub path_mtu: u32,
    /// The local interface holding the bound address and its MTU, when it
    /// can be found (for messages: on a router in between, the path may be
    /// smaller than this interface).
    pub interface: Option<(String, u32)>,
    /// The largest UDP payload that leaves unfragmented: the path MTU less
    /// the IP and UDP headers.
    pub max_datagram: usize,
}

impl PathMtu {
    /// A one-line description: `path MTU 1500 (interface veth0, MTU 1500)`.
    pub fn describe(&self) -> String {
        match &self.interface {
            Some((name, mtu)) => {
                format!("path MTU {} (interface {name}, MTU {mtu})", self.path_mtu)
            }
            None => format!("path MTU {}", self.path_mtu),
        }
    }
}

/// IP and UDP header bytes in front of a datagram to `peer`.
pub fn ip_udp_overhead(peer: IpAddr) -> usize {
    UDP_HEADER_LEN
        + if peer.is_ipv4() {
            IPV4_HEADER_LEN
        } else {
            IPV6_HEADER_LEN
        }
}

/// Ask the kernel for the path MTU from `local` to `peer` (no packet is
/// sent): see [`PathMtu`].
pub fn probe_path(local: IpAddr, peer: IpAddr) -> io::Result<PathMtu> {
    let path_mtu = sys::route_mtu(local, peer)?;
    let max_datagram = (path_mtu as usize).saturating_sub(ip_udp_overhead(peer));
    Ok(PathMtu {
        path_mtu,
        interface: sys::interface_of(local),
        max_datagram,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path to 127.0.0.1 is loopback's: `lo` holds the address, and
    /// the path MTU is its MTU.
    #[test]
    fn loopback_path() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let p = probe_path(lo, lo).unwrap();
        assert!(p.path_mtu >= 1280, "{p:?}");
        assert_eq!(p.max_datagram, p.path_mtu as usize - 28);
        let (name, mtu) = p.interface.clone().expect("lo has 127.0.0.1");
        assert_eq!(name, "lo");
        // The route's MTU is the interface's, capped at the largest IP
        // packet (65535 on a 65536-byte loopback).
        assert_eq!(p.path_mtu, mtu.min(65_535), "{p:?}");
        assert!(p.describe().contains("interface lo"));
    }
}
