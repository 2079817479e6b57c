//! Packet capture for MetaRoCE: pcap files that Wireshark and tshark open.
//!
//! MetaRoCE's datapath and simulator hand datagrams around as UDP payloads;
//! a capture needs whole frames. This crate wraps each datagram in a real
//! Ethernet II / IPv4 / UDP frame ([`frame`]) and writes it to a classic
//! pcap file with nanosecond timestamps ([`PcapWriter`]), so the capture
//! looks like what a tap on the wire would have seen.
//!
//! ```no_run
//! use std::net::{Ipv4Addr, SocketAddrV4};
//! use metaroce_capture::{Ecn, PcapWriter};
//!
//! let mut pcap = PcapWriter::create("run.pcap", 256)?;
//! let a = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 4794);
//! let b = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 4793);
//! pcap.write_udp(1_000, a, b, Ecn::Ect0, b"a MetaRoCE datagram")?;
//! pcap.flush()?;
//! # Ok::<(), metaroce_capture::CaptureError>(())
//! ```
//!
//! The file format is written by hand rather than with a pcap crate: it is
//! a 24-byte file header and a 16-byte record header per packet, and the
//! well-known crate for it (`pcap-file`) has had no stable release since
//! 2.0.0, whose dependency tree (a second `syn` and `thiserror` major) costs
//! more to build than this whole crate; its 3.0 line is release candidates
//! only, needing a newer Rust than this workspace's minimum.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod frame;
mod pcap;

pub use frame::Ecn;
pub use pcap::{
    DEFAULT_SNAPLEN, FILE_HEADER_LEN, LINKTYPE_ETHERNET, PCAP_MAGIC_NANOS, PcapWriter,
    RECORD_HEADER_LEN,
};

/// Why a packet could not be captured.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Writing the file failed.
    #[error("capture file: {0}")]
    Io(#[from] std::io::Error),
    /// The datagram does not fit in one IPv4 packet (65,507 payload bytes at most).
    #[error("datagram of {0} bytes does not fit in one IPv4/UDP packet")]
    TooLong(usize),
    /// The timestamp is past what a pcap record holds (year 2106).
    #[error("timestamp {0} ns is past the pcap format's 32-bit seconds")]
    TimestampOutOfRange(u64),
    /// A snap length of 0 captures nothing and readers refuse the file.
    #[error("snap length must be at least 1 byte")]
    ZeroSnaplen,
}
