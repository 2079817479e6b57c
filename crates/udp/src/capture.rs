//! Packet capture at the device's sockets: an optional hook that sees every
//! datagram the device hands to the kernel and every one the kernel hands
//! back, and [`PcapCapture`], the hook that writes them to a pcap file.
//!
//! The hook sits where a tap on the host's interface would: sends as they
//! go to the socket (a GSO message split back into its datagrams),
//! receives as they come off it, before the receive-side impairment (so a
//! datagram `--impair` drops is in the capture, as tcpdump would show a
//! packet the application then discards). With no hook configured the
//! device pays one `Option` test per batch.

use metaroce_capture::{CaptureError, PcapWriter};
use metaroce_verbs::Ecn;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// One datagram the device sent or received.
#[derive(Debug, Clone, Copy)]
pub struct CapturedDatagram<'a> {
    /// Sent by this device (else received).
    pub sent: bool,
    /// UDP source (IP and port).
    pub src: SocketAddr,
    /// UDP destination.
    pub dst: SocketAddr,
    /// ECN codepoint of the IP header.
    pub ecn: Ecn,
    /// The UDP payload, in pieces (header, payload, trailer when the
    /// payload was sent from its memory region in place).
    pub parts: &'a [&'a [u8]],
}

/// Sees every datagram of a device ([`DeviceConfig::capture`](crate::DeviceConfig::capture)).
/// Called under the device lock, on the thread driving progress: keep it
/// short.
pub trait CaptureHook: Send + Sync + std::fmt::Debug {
    /// One datagram.
    fn datagram(&self, d: &CapturedDatagram<'_>);
}

/// A [`CaptureHook`] writing a pcap file (Ethernet/IPv4/UDP frames,
/// nanosecond wall-clock timestamps; see `metaroce-capture`). IPv6
/// datagrams are counted as skipped: the frame writer is IPv4 only. The
/// first write error stops the capture; [`finish`](Self::finish) reports
/// it.
#[derive(Debug)]
pub struct PcapCapture {
    state: Mutex<PcapState>,
}

#[derive(Debug)]
struct PcapState {
    writer: Option<PcapWriter>,
    scratch: Vec<u8>,
    skipped_ipv6: u64,
    error: Option<CaptureError>,
}

impl PcapCapture {
    /// Create (or truncate) `path`, keeping at most `snaplen` bytes of
    /// each frame.
    pub fn create(path: &std::path::Path, snaplen: u32) -> Result<Self, CaptureError> {
        Ok(Self {
            state: Mutex::new(PcapState {
                writer: Some(PcapWriter::create(path, snaplen)?),
                scratch: Vec::new(),
                skipped_ipv6: 0,
                error: None,
            }),
        })
    }

    /// Flush and close the file; returns the packets written, or the first
    /// error. Later datagrams are not recorded.
    pub fn finish(&self) -> Result<u64, CaptureError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = st.error.take() {
            st.writer = None;
            return Err(e);
        }
        match st.writer.take() {
            Some(w) => {
                let n = w.packets();
                w.into_inner()?;
                Ok(n)
            }
            None => Ok(0),
        }
    }

    /// IPv6 datagrams left out of the file.
    pub fn skipped_ipv6(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .skipped_ipv6
    }
}

fn v4(a: SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(a) => a
            .ip()
            .to_ipv4_mapped()
            .map(|ip| SocketAddrV4::new(ip, a.port())),
    }
}

fn capture_ecn(e: Ecn) -> metaroce_capture::Ecn {
    match e {
        Ecn::NotEct => metaroce_capture::Ecn::NotEct,
        Ecn::Ect0 => metaroce_capture::Ecn::Ect0,
        Ecn::Ce => metaroce_capture::Ecn::Ce,
    }
}

/// Wall-clock nanoseconds since the Unix epoch.
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl CaptureHook for PcapCapture {
    fn datagram(&self, d: &CapturedDatagram<'_>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *st;
        let (Some(src), Some(dst)) = (v4(d.src), v4(d.dst)) else {
            st.skipped_ipv6 += 1;
            return;
        };
        if st.error.is_some() {
            return;
        }
        let Some(w) = st.writer.as_mut() else { return };
        st.scratch.clear();
        for p in d.parts {
            st.scratch.extend_from_slice(p);
        }
        if let Err(e) = w.write_udp(wall_ns(), src, dst, capture_ecn(d.ecn), &st.scratch) {
            st.error = Some(e);
        }
    }
}
