//! Packet capture of chosen simulated hosts (`metaroce sim --pcap FILE
//! --pcap-hosts 0,5`).
//!
//! The simulator carries packets as parsed headers, not bytes. A captured
//! host's packets are emitted with the wire crate into the datagram they
//! stand for (headers as sent, the payload zero-filled to its length, the
//! ICRC over that; an authenticated packet's trailer left zero, as the
//! simulator holds no keys) and written as Ethernet/IPv4/UDP frames with
//! the simulated time in nanoseconds as timestamp. A host records what its
//! NIC puts on the wire and what reaches it; a packet between two captured
//! hosts appears twice, once as each saw it, as in two merged taps.
//! Packets a switch trimmed (MetaRoCE drops them) are not recorded.
//!
//! Writing costs a frame build per recorded packet; hosts not chosen pay
//! one `Option` test per packet.

use metaroce_capture::{CaptureError, PcapWriter};
use metaroce_proto::{Ecn, PacketRepr};
use std::net::{SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A capture file shared by the captured hosts of one run.
#[derive(Clone)]
pub struct SimCapture {
    state: Arc<Mutex<State>>,
}

struct State {
    writer: Option<PcapWriter>,
    /// The captured hosts, sorted.
    hosts: Vec<u32>,
    datagram: Vec<u8>,
    error: Option<CaptureError>,
}

impl std::fmt::Debug for SimCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("SimCapture")
            .field("hosts", &st.hosts)
            .finish_non_exhaustive()
    }
}

fn ecn_of(e: Ecn) -> metaroce_capture::Ecn {
    match e {
        Ecn::NotEct => metaroce_capture::Ecn::NotEct,
        Ecn::Ect0 => metaroce_capture::Ecn::Ect0,
        Ecn::Ce => metaroce_capture::Ecn::Ce,
    }
}

fn v4(a: SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(_) => None,
    }
}

impl SimCapture {
    /// Create (or truncate) the file at `path`, keeping at most `snaplen`
    /// bytes of each frame. No host is captured until [`set_hosts`](Self::set_hosts).
    pub fn create(path: &Path, snaplen: u32) -> Result<Self, CaptureError> {
        Ok(Self {
            state: Arc::new(Mutex::new(State {
                writer: Some(PcapWriter::create(path, snaplen)?),
                hosts: Vec::new(),
                datagram: Vec::new(),
                error: None,
            })),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Capture these hosts' packets.
    pub fn set_hosts(&self, hosts: &[u32]) {
        let mut h = hosts.to_vec();
        h.sort_unstable();
        h.dedup();
        self.lock().hosts = h;
    }

    /// Whether host `index` is captured.
    pub fn captures(&self, index: u32) -> bool {
        self.lock().hosts.binary_search(&index).is_ok()
    }

    /// Record one packet at simulated time `ts_ns`.
    pub fn record(&self, ts_ns: u64, src: SocketAddr, dst: SocketAddr, ecn: Ecn, p: &PacketRepr) {
        let mut st = self.lock();
        let st = &mut *st;
        if st.error.is_some() {
            return;
        }
        let (Some(src), Some(dst), Some(w)) = (v4(src), v4(dst), st.writer.as_mut()) else {
            return;
        };
        let len = p.wire_len();
        st.datagram.clear();
        st.datagram.resize(len, 0);
        match p {
            PacketRepr::Data(d) => {
                // The payload is zeros of its length (the buffer is zeroed).
                d.emit_header(&mut st.datagram[..d.header_len()]);
                let covered = d.header_len() + d.payload_len as usize;
                if len - covered == metaroce_wire::ICRC_LEN {
                    metaroce_wire::seal(&mut st.datagram);
                }
            }
            PacketRepr::Ack(a) => {
                metaroce_wire::emit_ack(a, &mut st.datagram);
            }
        }
        if let Err(e) = w.write_udp(ts_ns, src, dst, ecn_of(ecn), &st.datagram) {
            st.error = Some(e);
        }
    }

    /// Flush and close the file; returns the packets written or the first
    /// error.
    pub fn finish(&self) -> Result<u64, CaptureError> {
        let mut st = self.lock();
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
}
