//! Ethernet II / IPv4 / UDP framing around a datagram.
//!
//! The frame is what would be on the wire between two hosts, with every
//! length and checksum right, so that dissectors accept it without
//! complaint: the IPv4 header checksum (RFC 791) and the UDP checksum over
//! the pseudo-header (RFC 768) are both computed. MAC addresses are made up
//! from the IPv4 address (`02:00:a:b:c:d`, locally administered), which
//! keeps one host's frames recognisable in a capture of many.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::CaptureError;

/// Length of the Ethernet II header (two MACs and the EtherType).
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Bytes of framing in front of the datagram.
pub const FRAME_OVERHEAD: usize = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN;
/// Largest UDP payload one IPv4 packet carries (total length is 16 bits).
pub const MAX_UDP_PAYLOAD: usize = u16::MAX as usize - IPV4_HEADER_LEN - UDP_HEADER_LEN;

const ETHERTYPE_IPV4: u16 = 0x0800;
const IP_PROTOCOL_UDP: u8 = 17;
const IPV4_DONT_FRAGMENT: u16 = 0x4000;
const IPV4_TTL: u8 = 64;

/// The ECN codepoint of the IPv4 header (RFC 3168), the two low bits of
/// the traffic class byte. MetaRoCE sends ECT(0) and reads CE marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ecn {
    /// Not ECN-capable transport (`00`).
    #[default]
    NotEct,
    /// ECN-capable transport, codepoint 1 (`01`).
    Ect1,
    /// ECN-capable transport, codepoint 0 (`10`).
    Ect0,
    /// Congestion experienced (`11`), set by a switch instead of dropping.
    Ce,
}

impl Ecn {
    /// The two-bit codepoint.
    pub const fn codepoint(self) -> u8 {
        match self {
            Self::NotEct => 0b00,
            Self::Ect1 => 0b01,
            Self::Ect0 => 0b10,
            Self::Ce => 0b11,
        }
    }

    /// The ECN of a codepoint; only the two low bits are looked at.
    pub const fn from_codepoint(bits: u8) -> Self {
        match bits & 0b11 {
            0b00 => Self::NotEct,
            0b01 => Self::Ect1,
            0b10 => Self::Ect0,
            _ => Self::Ce,
        }
    }
}

/// The made-up MAC address of a host: `02:00` (locally administered,
/// unicast) followed by its IPv4 address.
pub fn mac_of(ip: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = ip.octets();
    [0x02, 0x00, a, b, c, d]
}

/// Write the Ethernet, IPv4 and UDP headers for `payload` into `out`
/// (cleared first), followed by the payload: the whole frame.
///
/// `ip_id` is the IPv4 identification field; the writer counts it up per
/// packet, as a host does.
pub fn build_udp_frame(
    out: &mut Vec<u8>,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ecn: Ecn,
    ip_id: u16,
    payload: &[u8],
) -> Result<(), CaptureError> {
    if payload.len() > MAX_UDP_PAYLOAD {
        return Err(CaptureError::TooLong(payload.len()));
    }
    // Both fit in 16 bits by the check above.
    let udp_len = (UDP_HEADER_LEN + payload.len()) as u16;
    let ip_total_len = IPV4_HEADER_LEN as u16 + udp_len;

    out.clear();
    out.reserve(FRAME_OVERHEAD + payload.len());

    // Ethernet II.
    out.extend_from_slice(&mac_of(*dst.ip()));
    out.extend_from_slice(&mac_of(*src.ip()));
    out.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());

    // IPv4, no options; DSCP 0 and the ECN codepoint in the low bits.
    let ip_start = out.len();
    out.push(0x45); // version 4, header length 5 words
    out.push(ecn.codepoint());
    out.extend_from_slice(&ip_total_len.to_be_bytes());
    out.extend_from_slice(&ip_id.to_be_bytes());
    out.extend_from_slice(&IPV4_DONT_FRAGMENT.to_be_bytes());
    out.push(IPV4_TTL);
    out.push(IP_PROTOCOL_UDP);
    out.extend_from_slice(&[0, 0]); // checksum, filled below
    out.extend_from_slice(&src.ip().octets());
    out.extend_from_slice(&dst.ip().octets());
    let ip_checksum = internet_checksum(&[&out[ip_start..]]);
    out[ip_start + 10..ip_start + 12].copy_from_slice(&ip_checksum.to_be_bytes());

    // UDP.
    let udp_start = out.len();
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&dst.port().to_be_bytes());
    out.extend_from_slice(&udp_len.to_be_bytes());
    out.extend_from_slice(&[0, 0]); // checksum, filled below
    out.extend_from_slice(payload);
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src.ip().octets());
    pseudo[4..8].copy_from_slice(&dst.ip().octets());
    pseudo[9] = IP_PROTOCOL_UDP;
    pseudo[10..12].copy_from_slice(&udp_len.to_be_bytes());
    let udp_checksum = match internet_checksum(&[&pseudo, &out[udp_start..]]) {
        // A computed zero is sent as all ones: zero means "no checksum".
        0 => 0xffff,
        sum => sum,
    };
    out[udp_start + 6..udp_start + 8].copy_from_slice(&udp_checksum.to_be_bytes());
    Ok(())
}

/// The Internet checksum (RFC 1071) of the concatenation of `parts`: the
/// ones' complement of the ones' complement sum of 16-bit big-endian words,
/// an odd final byte padded with zero. Every part but the last must have an
/// even length, which holds for the headers this module sums.
pub fn internet_checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    for part in parts {
        let mut words = part.chunks_exact(2);
        for word in &mut words {
            sum += u64::from(u16::from_be_bytes([word[0], word[1]]));
        }
        if let [last] = words.remainder() {
            sum += u64::from(*last) << 8;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(a: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, a), port)
    }

    #[test]
    fn rfc1071_example_sums_as_published() {
        // RFC 1071 section 3: words 0001 f203 f4f5 f6f7 sum to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(internet_checksum(&[&data]), !0xddf2);
    }

    #[test]
    fn headers_carry_lengths_and_verifying_checksums() {
        let mut frame = Vec::new();
        let payload = b"odd-length payload!";
        build_udp_frame(
            &mut frame,
            addr(1, 4794),
            addr(2, 4793),
            Ecn::Ce,
            7,
            payload,
        )
        .unwrap();
        assert_eq!(frame.len(), FRAME_OVERHEAD + payload.len());
        assert_eq!(&frame[0..6], &[2, 0, 10, 0, 0, 2]);
        assert_eq!(&frame[6..12], &[2, 0, 10, 0, 0, 1]);
        let ip = &frame[ETHERNET_HEADER_LEN..ETHERNET_HEADER_LEN + IPV4_HEADER_LEN];
        assert_eq!(ip[1] & 0b11, Ecn::Ce.codepoint());
        assert_eq!(
            usize::from(u16::from_be_bytes([ip[2], ip[3]])),
            IPV4_HEADER_LEN + UDP_HEADER_LEN + payload.len()
        );
        // A header with its checksum in place sums to zero.
        assert_eq!(internet_checksum(&[ip]), 0);
        let udp = &frame[ETHERNET_HEADER_LEN + IPV4_HEADER_LEN..];
        assert_eq!(u16::from_be_bytes([udp[0], udp[1]]), 4794);
        assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 4793);
        assert_eq!(usize::from(u16::from_be_bytes([udp[4], udp[5]])), udp.len());
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&[10, 0, 0, 1]);
        pseudo[4..8].copy_from_slice(&[10, 0, 0, 2]);
        pseudo[9] = 17;
        pseudo[10..12].copy_from_slice(&udp[4..6]);
        assert_eq!(internet_checksum(&[&pseudo, udp]), 0);
    }

    #[test]
    fn oversized_datagram_is_an_error_not_a_panic() {
        let mut frame = Vec::new();
        let big = vec![0u8; MAX_UDP_PAYLOAD + 1];
        let err = build_udp_frame(&mut frame, addr(1, 1), addr(2, 2), Ecn::NotEct, 0, &big);
        assert!(matches!(err, Err(CaptureError::TooLong(n)) if n == big.len()));
        build_udp_frame(
            &mut frame,
            addr(1, 1),
            addr(2, 2),
            Ecn::NotEct,
            0,
            &big[1..],
        )
        .unwrap();
    }

    #[test]
    fn ecn_codepoints_round_trip() {
        for ecn in [Ecn::NotEct, Ecn::Ect1, Ecn::Ect0, Ecn::Ce] {
            assert_eq!(Ecn::from_codepoint(ecn.codepoint()), ecn);
        }
    }
}
