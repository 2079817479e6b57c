//! The classic pcap file format, nanosecond variant.
//!
//! A file is one 24-byte header followed by records, each a 16-byte header
//! and the captured bytes. All fields are in the writer's byte order; the
//! magic number tells readers which order and which timestamp resolution:
//! `0xa1b23c4d` means nanoseconds (`0xa1b2c3d4` would mean microseconds).
//! This writer uses little-endian, as libpcap does on the hosts MetaRoCE
//! runs on; readers handle either.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::SocketAddrV4;
use std::path::Path;

use crate::CaptureError;
use crate::frame::{Ecn, build_udp_frame};

/// Magic number of a pcap file with nanosecond timestamps.
pub const PCAP_MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// Link type of Ethernet II frames (`LINKTYPE_ETHERNET`).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Length of the file header.
pub const FILE_HEADER_LEN: usize = 24;
/// Length of each record's header.
pub const RECORD_HEADER_LEN: usize = 16;
/// A snap length that keeps every frame whole (the largest IPv4 packet plus
/// its Ethernet header), as tcpdump's default does.
pub const DEFAULT_SNAPLEN: u32 = 262_144;

const VERSION_MAJOR: u16 = 2;
const VERSION_MINOR: u16 = 4;
const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Writes a pcap capture of MetaRoCE datagrams framed as Ethernet/IPv4/UDP.
///
/// Frames longer than the snap length are cut to it; the record still
/// states the frame's original length, so readers show them as truncated
/// captures ("packet size limited during capture"), not as short packets.
/// The writer buffers; call [`flush`](Self::flush) before reading the file
/// while it is still open (dropping the writer flushes too, ignoring errors).
#[derive(Debug)]
pub struct PcapWriter<W: Write = BufWriter<File>> {
    out: W,
    snaplen: u32,
    next_ip_id: u16,
    frame: Vec<u8>,
    packets: u64,
}

impl PcapWriter<BufWriter<File>> {
    /// Create (or truncate) the file at `path` and write the file header.
    /// `snaplen` is the most bytes kept of each frame, at least 1
    /// ([`DEFAULT_SNAPLEN`] keeps them whole).
    pub fn create(path: impl AsRef<Path>, snaplen: u32) -> Result<Self, CaptureError> {
        if snaplen == 0 {
            return Err(CaptureError::ZeroSnaplen);
        }
        Self::new(BufWriter::new(File::create(path)?), snaplen)
    }
}

impl<W: Write> PcapWriter<W> {
    /// Write the file header to `out` and return a writer of records into it.
    pub fn new(mut out: W, snaplen: u32) -> Result<Self, CaptureError> {
        if snaplen == 0 {
            return Err(CaptureError::ZeroSnaplen);
        }
        let mut header = [0u8; FILE_HEADER_LEN];
        header[0..4].copy_from_slice(&PCAP_MAGIC_NANOS.to_le_bytes());
        header[4..6].copy_from_slice(&VERSION_MAJOR.to_le_bytes());
        header[6..8].copy_from_slice(&VERSION_MINOR.to_le_bytes());
        // Bytes 8..16: time zone offset and timestamp accuracy, both 0 (UTC).
        header[16..20].copy_from_slice(&snaplen.to_le_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&header)?;
        Ok(Self {
            out,
            snaplen,
            next_ip_id: 0,
            frame: Vec::new(),
            packets: 0,
        })
    }

    /// Record one UDP datagram sent from `src` to `dst` with ECN codepoint
    /// `ecn`, at `ts_ns` nanoseconds (since the Unix epoch, or since the
    /// start of a simulation: readers show either as a date).
    pub fn write_udp(
        &mut self,
        ts_ns: u64,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        ecn: Ecn,
        payload: &[u8],
    ) -> Result<(), CaptureError> {
        let seconds = u32::try_from(ts_ns / NANOS_PER_SECOND)
            .map_err(|_| CaptureError::TimestampOutOfRange(ts_ns))?;
        let nanos = (ts_ns % NANOS_PER_SECOND) as u32;
        build_udp_frame(&mut self.frame, src, dst, ecn, self.next_ip_id, payload)?;
        self.next_ip_id = self.next_ip_id.wrapping_add(1);
        self.write_record(seconds, nanos)
    }

    fn write_record(&mut self, seconds: u32, nanos: u32) -> Result<(), CaptureError> {
        // A frame is at most 65,549 bytes (checked by the framing), so both
        // lengths fit in 32 bits.
        let original_len = self.frame.len() as u32;
        let captured_len = original_len.min(self.snaplen);
        let mut header = [0u8; RECORD_HEADER_LEN];
        header[0..4].copy_from_slice(&seconds.to_le_bytes());
        header[4..8].copy_from_slice(&nanos.to_le_bytes());
        header[8..12].copy_from_slice(&captured_len.to_le_bytes());
        header[12..16].copy_from_slice(&original_len.to_le_bytes());
        self.out.write_all(&header)?;
        self.out.write_all(&self.frame[..captured_len as usize])?;
        self.packets += 1;
        Ok(())
    }

    /// The snap length in the file header.
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// How many packets were recorded.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Push buffered records to the file.
    pub fn flush(&mut self) -> Result<(), CaptureError> {
        self.out.flush()?;
        Ok(())
    }

    /// Flush and return the underlying writer.
    pub fn into_inner(mut self) -> Result<W, CaptureError> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::frame::FRAME_OVERHEAD;

    fn addr(a: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, a), port)
    }

    fn le32(bytes: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn file_header_says_nanoseconds_ethernet_and_snaplen() {
        let bytes = PcapWriter::new(Vec::new(), 128)
            .unwrap()
            .into_inner()
            .unwrap();
        assert_eq!(bytes.len(), FILE_HEADER_LEN);
        assert_eq!(&bytes[0..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
        assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), 2);
        assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), 4);
        assert_eq!(le32(&bytes, 16), 128);
        assert_eq!(le32(&bytes, 20), LINKTYPE_ETHERNET);
    }

    #[test]
    fn records_split_timestamp_and_honour_snaplen() {
        let mut pcap = PcapWriter::new(Vec::new(), 50).unwrap();
        let ts_ns = 3 * NANOS_PER_SECOND + 123_456_789;
        pcap.write_udp(ts_ns, addr(1, 10), addr(2, 20), Ecn::Ect0, &[7; 100])
            .unwrap();
        pcap.write_udp(5, addr(1, 10), addr(2, 20), Ecn::Ect0, b"hi")
            .unwrap();
        assert_eq!(pcap.packets(), 2);
        let bytes = pcap.into_inner().unwrap();
        let r = &bytes[FILE_HEADER_LEN..];
        assert_eq!(le32(r, 0), 3);
        assert_eq!(le32(r, 4), 123_456_789);
        assert_eq!(le32(r, 8), 50, "cut to the snap length");
        assert_eq!(le32(r, 12) as usize, FRAME_OVERHEAD + 100);
        let r = &r[RECORD_HEADER_LEN + 50..];
        assert_eq!(le32(r, 0), 0);
        assert_eq!(le32(r, 4), 5);
        assert_eq!(le32(r, 8) as usize, FRAME_OVERHEAD + 2);
        assert_eq!(r.len(), RECORD_HEADER_LEN + FRAME_OVERHEAD + 2);
        assert_eq!(&r[r.len() - 2..], b"hi");
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(matches!(
            PcapWriter::new(Vec::new(), 0),
            Err(CaptureError::ZeroSnaplen)
        ));
        let mut pcap = PcapWriter::new(Vec::new(), 64).unwrap();
        let late = (u64::from(u32::MAX) + 1) * NANOS_PER_SECOND;
        assert!(matches!(
            pcap.write_udp(late, addr(1, 1), addr(2, 2), Ecn::NotEct, b""),
            Err(CaptureError::TimestampOutOfRange(t)) if t == late
        ));
        assert_eq!(pcap.packets(), 0);
    }
}
