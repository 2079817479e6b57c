//! The host address plan: host index ↔ IPv4 address.
//!
//! Host `i` is `10.0.0.0 + i + 1` (host 0 is 10.0.0.1; 2^24 - 1 hosts fit
//! in 10/8). The fabric never routes on addresses, only on host indices,
//! but the ECMP hash reads the 5-tuple and the protocol core names peers by
//! socket address, so both must see the same address for a host: this
//! module is the one place that says what it is.

use std::net::{IpAddr, Ipv4Addr};

/// The network every host lives in: 10.0.0.0/8.
const NETWORK: u32 = 0x0a00_0000;
/// Host bits of an address.
const HOST_MASK: u32 = 0x00ff_ffff;

/// Host `index`'s IPv4 address as the 32-bit number the ECMP hash reads.
#[inline]
pub fn host_ipv4_bits(index: u32) -> u32 {
    NETWORK | (index + 1)
}

/// Host `index`'s address (in memory only; never a socket).
pub fn host_ip(index: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(host_ipv4_bits(index)))
}

/// The host index of an address made by [`host_ip`]; `u32::MAX` (no host)
/// for an IPv6 address, which the plan never hands out.
pub fn host_index(ip: IpAddr) -> u32 {
    match ip {
        IpAddr::V4(v4) => (u32::from(v4) & HOST_MASK) - 1,
        IpAddr::V6(_) => u32::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ips_round_trip() {
        for i in [0, 1, 255, 256, 8191, 65_535, 1 << 20] {
            assert_eq!(host_index(host_ip(i)), i);
        }
        assert_eq!(host_ip(0), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(host_ipv4_bits(1), 0x0a00_0002);
    }
}
