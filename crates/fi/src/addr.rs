//! An endpoint's address: what `fi_getname` returns and `fi_av_insert`
//! takes.
//!
//! It is a plain `struct sockaddr_in` (address format `FI_SOCKADDR_IN`,
//! 16 bytes): the IPv4 address the endpoint bound and the TCP port of its
//! connection-manager listener. That is all a peer needs: the first time
//! it sends here it connects to that port, and the listener's answer
//! carries the MetaRoCE device port and QP number (see `conn`). The
//! `sin_zero` bytes are left zero.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

/// Bytes of an encoded address.
pub const ADDR_BYTES: usize = 16;
/// `AF_INET` on Linux.
const AF_INET: u16 = 2;

/// A peer endpoint: its IP and connection-manager port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EpAddr {
    /// The endpoint's IPv4 address.
    pub ip: Ipv4Addr,
    /// Its connection manager's TCP port.
    pub cm_port: u16,
}

/// Why bytes are not an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// Fewer than 16 bytes.
    #[error("address of {0} bytes; a metaroce address is a 16-byte sockaddr_in")]
    Short(usize),
    /// Not `AF_INET`.
    #[error("address family {0} is not AF_INET")]
    Family(u16),
    /// Port 0 names no listener.
    #[error("address {0} has port 0")]
    NoPort(Ipv4Addr),
}

impl EpAddr {
    /// The `sockaddr_in` bytes (family in host order, port and address in
    /// network order).
    pub fn to_bytes(self) -> [u8; ADDR_BYTES] {
        let mut b = [0u8; ADDR_BYTES];
        b[0..2].copy_from_slice(&AF_INET.to_ne_bytes());
        b[2..4].copy_from_slice(&self.cm_port.to_be_bytes());
        b[4..8].copy_from_slice(&self.ip.octets());
        b
    }

    /// Parse `sockaddr_in` bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Self, AddrError> {
        if b.len() < ADDR_BYTES {
            return Err(AddrError::Short(b.len()));
        }
        let family = u16::from_ne_bytes([b[0], b[1]]);
        if family != AF_INET {
            return Err(AddrError::Family(family));
        }
        let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
        let cm_port = u16::from_be_bytes([b[2], b[3]]);
        if cm_port == 0 {
            return Err(AddrError::NoPort(ip));
        }
        Ok(Self { ip, cm_port })
    }

    /// As a socket address.
    pub fn socket(self) -> SocketAddrV4 {
        SocketAddrV4::new(self.ip, self.cm_port)
    }
}

impl fmt::Display for EpAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ip, self.cm_port)
    }
}

impl std::str::FromStr for EpAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.strip_prefix("fi_sockaddr_in://").unwrap_or(s);
        let sa: SocketAddrV4 = s
            .parse()
            .map_err(|e| format!("'{s}' is not ip:port: {e}"))?;
        if sa.port() == 0 {
            return Err(format!("'{s}' has port 0"));
        }
        Ok(Self {
            ip: *sa.ip(),
            cm_port: sa.port(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let a = EpAddr {
            ip: Ipv4Addr::new(10, 1, 2, 3),
            cm_port: 4242,
        };
        assert_eq!(EpAddr::from_bytes(&a.to_bytes()), Ok(a));
        assert_eq!(a.to_string().parse::<EpAddr>(), Ok(a));
        assert_eq!(EpAddr::from_bytes(&[0; 4]), Err(AddrError::Short(4)));
        let mut b = a.to_bytes();
        b[0] = 10;
        b[1] = 0;
        assert!(matches!(EpAddr::from_bytes(&b), Err(AddrError::Family(_))));
        assert!("1.2.3.4:0".parse::<EpAddr>().is_err());
    }
}
