//! Packet capture of chosen simulated hosts and links (`metaroce sim
//! --pcap FILE --pcap-hosts 0,5 --pcap-links tor0-agg1`).
//!
//! The simulator carries packets as parsed headers, not bytes. A captured
//! packet is emitted with the wire crate into the datagram it stands for
//! (headers as sent, the payload zero-filled to its length, the ICRC over
//! that; an authenticated packet's trailer left zero, as the simulator
//! holds no keys) and written as an Ethernet/IPv4/UDP frame with the
//! simulated time in nanoseconds as timestamp.
//!
//! A captured host records what its NIC puts on the wire and what reaches
//! it; a captured link records, in both directions, what its ports put on
//! the wire (after the switch's ECN mark, before the wire's loss:
//! `sim/tap.rs`). A packet seen at several capture points appears once per
//! point, as in merged taps: between two captured hosts twice, and once
//! more for every captured link on its route. Packets a switch trimmed
//! (MetaRoCE drops them) are not recorded.
//!
//! Writing costs a frame build per recorded packet; hosts and links not
//! chosen pay one `Option` test per packet.

use crate::address::host_ip;
use crate::hostset::HostSetConf;
use crate::sim::{TapRecorder, TappedPacket};
use crate::time::ps_to_ns;
use crate::transport::metaroce::MetaRocePacket;
use metaroce_capture::{CaptureError, PcapWriter};
use metaroce_proto::{Ecn, PacketRepr};
use std::net::{SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What a run captures, and into which file.
#[derive(Debug, Clone)]
pub struct CaptureSpec {
    /// The capture file.
    pub file: SimCapture,
    /// The captured hosts (a host-set spec as in a workload's `hosts`,
    /// resolved against the built topology); `None`: no host.
    pub hosts: Option<HostSetConf>,
    /// The captured links, each by the names of its two ends (`tor0`,
    /// `agg1`, `h3`; see `Topology::node_name`), both directions each.
    pub links: Vec<(String, String)>,
}

/// Parse `--pcap-links`: comma-separated links, each its two ends' node
/// names joined by `-` (`tor0-agg1,h0-tor0`; node names hold no `-`).
/// Names are checked against the topology when the run is built.
pub fn parse_links(spec: &str) -> Result<Vec<(String, String)>, String> {
    let mut links = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        let ends = part
            .split_once('-')
            .map(|(a, b)| (a.trim(), b.trim()))
            .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains('-'));
        let Some((a, b)) = ends else {
            return Err(format!(
                "'{part}' is not a link: give its two ends' names joined by '-', e.g. tor0-agg1 or h0-tor0"
            ));
        };
        links.push((a.to_owned(), b.to_owned()));
    }
    Ok(links)
}

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

    /// A recorder for [`Sim::tap_links`](crate::sim::Sim::tap_links) that
    /// writes every tapped MetaRoCE packet into this capture.
    pub fn link_recorder(&self) -> TapRecorder<MetaRocePacket> {
        let file = self.clone();
        Box::new(move |t: TappedPacket<'_>, body: &MetaRocePacket| {
            let src = SocketAddr::new(host_ip(t.src_host), t.wire.src_port);
            let dst = SocketAddr::new(host_ip(t.wire.dst), t.wire.dst_port);
            let ecn = if t.wire.ce {
                Ecn::Ce
            } else if t.wire.ect {
                Ecn::Ect0
            } else {
                Ecn::NotEct
            };
            file.record(ps_to_ns(t.at), src, dst, ecn, &body.to_repr());
        })
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

#[cfg(test)]
mod tests {
    use super::parse_links;

    #[test]
    fn links_are_two_names_joined_by_a_dash() {
        let own = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(
            parse_links("tor0-agg1, h3-p1.tor0").unwrap(),
            vec![own("tor0", "agg1"), own("h3", "p1.tor0")]
        );
        for bad in ["tor0", "tor0-", "-agg1", "a-b-c", "tor0-agg1,"] {
            let e = parse_links(bad).unwrap_err();
            assert!(e.contains("is not a link"), "{bad}: {e}");
        }
    }
}
