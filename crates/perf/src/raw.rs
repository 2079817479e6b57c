//! Raw-UDP baselines (`metaroce perf udp-bw` / `udp-lat`): the same sockets,
//! batching (sendmmsg / recvmmsg, GSO / GRO) and datagram sizes as the
//! device, with no protocol. `--loopback` runs both roles in one process over
//! 127.0.0.1; otherwise, as the MetaRoCE tests, a server (no host) and a
//! client (the server's host) agree on the run over the TCP side channel
//! (`docs/spec/connection-manager.md` frames, bodies below) and the data goes
//! over UDP between the two hosts.

use crate::{BwFigures, LatFigures, PerfError};
use metaroce_cm::{self as cm, MsgType};
use metaroce_udp::batch::{self, OutMsg, RxBatch, Socket};
use metaroce_udp::now_ns;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Which baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawTest {
    /// Blast datagrams one way; the receiver counts.
    UdpBw,
    /// Ping-pong one datagram.
    UdpLat,
}

impl RawTest {
    /// The test's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::UdpBw => "udp-bw",
            Self::UdpLat => "udp-lat",
        }
    }
}

/// What a run does.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RawParams {
    /// The baseline.
    pub test: RawTest,
    /// Message size (udp-bw: bytes per send call, cut into datagrams of
    /// `seg`; udp-lat: the datagram).
    pub size: u64,
    /// Datagram size for udp-bw.
    pub seg: usize,
    /// Seconds to run (udp-lat: 0 = `iters` round trips).
    pub secs: f64,
    /// udp-lat round trips when `secs` is 0.
    pub iters: u64,
    /// GSO / GRO where the kernel has them.
    pub offload: bool,
}

/// Server → client: where to send.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RawAccept {
    udp_port: u16,
}

/// Client → server: the run is over.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RawDone {}

/// Server → client: what the receiver saw (udp-bw).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RawReport {
    bytes: u64,
    elapsed_ns: u64,
}

fn bind(ip: IpAddr, offload: bool) -> Result<(Socket, SocketAddr), PerfError> {
    let s = batch::bind(SocketAddr::new(ip, 0))
        .map_err(|e| PerfError::Other(format!("bind UDP on {ip}: {e}")))?;
    if offload {
        batch::enable_gro(&s);
    }
    let a = s
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| PerfError::Other("no local address".into()))?;
    Ok((s, a))
}

/// Count what arrives on `rx` until `stop` is set and the socket has been
/// quiet for 50 ms: (bytes, first arrival, last arrival).
fn receive_all(rx: &Socket, stop: &AtomicBool) -> (u64, u64, u64) {
    let mut b = RxBatch::new(32);
    let (mut bytes, mut first, mut last) = (0u64, 0u64, 0u64);
    loop {
        let n = b.recv(rx).unwrap_or(0);
        if n == 0 {
            if stop.load(Ordering::Relaxed) && now_ns() > last + 50_000_000 {
                break;
            }
            batch::wait_readable(rx, Some(10_000_000));
            continue;
        }
        let t = now_ns();
        if first == 0 {
            first = t;
        }
        last = t;
        for i in 0..n {
            bytes += b.meta()[i].len as u64;
        }
    }
    (bytes, first, last)
}

/// Blast to `dst` for `p.secs` seconds.
fn blast(tx: &Socket, dst: SocketAddr, p: &RawParams) {
    let seg = p.seg.min(p.size as usize).max(1);
    let payload = vec![0xa5u8; seg];
    let per_msg = (batch::GSO_MAX_BYTES / seg).clamp(1, batch::GSO_MAX_SEGMENTS);
    let gso = p.offload && batch::probe_gso(tx);
    let parts_v: Vec<&[u8]> = vec![&payload[..]; if gso { per_msg } else { 1 }];
    let end = now_ns() + (p.secs * 1e9) as u64;
    while now_ns() < end {
        let msgs: Vec<OutMsg<'_>> = (0..16)
            .map(|_| {
                if parts_v.len() > 1 {
                    OutMsg::segmented(dst, &parts_v, seg as u16)
                } else {
                    OutMsg::datagram(dst, &parts_v)
                }
            })
            .collect();
        if batch::send_batch(tx, &msgs).unwrap_or(0) == 0 {
            batch::wait_writable(tx, 1_000_000);
        }
    }
}

fn bw_figures(size: u64, bytes: u64, elapsed_ns: u64) -> BwFigures {
    let el = elapsed_ns.max(1) as f64 / 1e9;
    let msgs = bytes / size.max(1);
    BwFigures {
        size,
        iters: msgs,
        peak_bps: bytes as f64 / el,
        avg_bps: bytes as f64 / el,
        msg_rate_mpps: msgs as f64 / el / 1e6,
    }
}

/// Echo every datagram on `sock` back to its sender until `stop`.
fn echo(sock: &Socket, stop: &AtomicBool) {
    let mut rb = RxBatch::new(1);
    while !stop.load(Ordering::Relaxed) {
        if rb.recv(sock).unwrap_or(0) == 1 {
            let Some(from) = rb.meta()[0].src else {
                continue;
            };
            let data = rb.data(0).to_vec();
            let parts = [&data[..]];
            let m = OutMsg::datagram(from, &parts);
            let _ = batch::send_batch(sock, std::slice::from_ref(&m));
        }
    }
}

/// Busy-polled ping-pong against an echoing `dst`; RTT/2 per sample.
fn ping(sock: &Socket, dst: SocketAddr, p: &RawParams) -> LatFigures {
    let size = (p.size as usize).clamp(1, 65_000);
    let buf = vec![0x5au8; size];
    let parts = [&buf[..]];
    let mut rb = RxBatch::new(1);
    let start = now_ns();
    let end = (p.secs > 0.0).then(|| start + (p.secs * 1e9) as u64);
    let target = if end.is_some() {
        u64::MAX
    } else {
        p.iters.max(5)
    };
    let mut samples = Vec::new();
    while (samples.len() as u64) < target && end.is_none_or(|e| now_ns() < e) {
        let t0 = now_ns();
        let m = OutMsg::datagram(dst, &parts);
        let _ = batch::send_batch(sock, std::slice::from_ref(&m));
        loop {
            if rb.recv(sock).unwrap_or(0) == 1 {
                break;
            }
            if now_ns() - t0 > 1_000_000_000 {
                break; // lost; count the timeout as a sample
            }
        }
        samples.push((now_ns() - t0) / 2);
    }
    LatFigures::from_samples(size as u64, samples, now_ns() - start)
}

/// Blast `size`-byte messages, cut into datagrams of at most `seg` bytes,
/// for `secs` seconds over 127.0.0.1; the figure is what the receiver got.
pub fn udp_bw(size: u64, seg: usize, secs: f64, offload: bool) -> Result<BwFigures, PerfError> {
    let p = RawParams {
        test: RawTest::UdpBw,
        size,
        seg,
        secs,
        iters: 0,
        offload,
    };
    let lo = IpAddr::from([127, 0, 0, 1]);
    let (rx, dst) = bind(lo, offload)?;
    let (tx, _) = bind(lo, false)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_rx = Arc::clone(&stop);
    let recv = std::thread::spawn(move || receive_all(&rx, &stop_rx));
    blast(&tx, dst, &p);
    stop.store(true, Ordering::Relaxed);
    let (bytes, first, last) = recv
        .join()
        .map_err(|_| PerfError::Other("receiver panicked".into()))?;
    Ok(bw_figures(size, bytes, last.saturating_sub(first)))
}

/// Busy-polled ping-pong of one `size`-byte datagram over 127.0.0.1.
pub fn udp_lat(size: usize, iters: u64, secs: f64) -> Result<LatFigures, PerfError> {
    let p = RawParams {
        test: RawTest::UdpLat,
        size: size as u64,
        seg: size,
        secs,
        iters,
        offload: false,
    };
    let lo = IpAddr::from([127, 0, 0, 1]);
    let (a, _) = bind(lo, false)?;
    let (b, ba) = bind(lo, false)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let echoer = std::thread::spawn(move || echo(&b, &stop2));
    let fig = ping(&a, ba, &p);
    stop.store(true, Ordering::Relaxed);
    let _ = echoer.join();
    Ok(fig)
}

/// Serve one raw baseline run: the client says what over TCP, the data goes
/// over UDP to a port bound on the address the client reached us at.
pub fn serve_raw(listener: &TcpListener, test: RawTest, offload: bool) -> Result<(), PerfError> {
    let (mut tcp, _) = listener.accept()?;
    tcp.set_nodelay(true)?;
    let p: RawParams = cm::recv(&mut tcp, MsgType::Hello)?;
    if p.test != test {
        let msg = format!(
            "server runs {}, client asked for {}",
            test.name(),
            p.test.name()
        );
        let _ = cm::send(&mut tcp, MsgType::Error, &msg);
        return Err(PerfError::Other(msg));
    }
    let (sock, local) = bind(tcp.local_addr()?.ip(), offload && test == RawTest::UdpBw)?;
    cm::send(
        &mut tcp,
        MsgType::Accept,
        &RawAccept {
            udp_port: local.port(),
        },
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || match test {
            RawTest::UdpBw => Some(receive_all(&sock, &stop)),
            RawTest::UdpLat => {
                echo(&sock, &stop);
                None
            }
        })
    };
    let done = cm::recv::<RawDone>(&mut tcp, MsgType::Done);
    stop.store(true, Ordering::Relaxed);
    let got = worker
        .join()
        .map_err(|_| PerfError::Other("receiver panicked".into()))?;
    done?;
    if let Some((bytes, first, last)) = got {
        cm::send(
            &mut tcp,
            MsgType::Report,
            &RawReport {
                bytes,
                elapsed_ns: last.saturating_sub(first),
            },
        )?;
    }
    Ok(())
}

/// Run a raw baseline against a server (`serve_raw`) at `server`.
pub fn run_raw_client(
    server: SocketAddr,
    p: &RawParams,
) -> Result<(Option<BwFigures>, Option<LatFigures>), PerfError> {
    let mut tcp = TcpStream::connect(server)
        .map_err(|e| PerfError::Other(format!("cannot reach the server at {server}: {e}")))?;
    tcp.set_nodelay(true)?;
    cm::send(&mut tcp, MsgType::Hello, p)?;
    let accept: RawAccept = cm::recv(&mut tcp, MsgType::Accept)?;
    let (sock, _) = bind(tcp.local_addr()?.ip(), false)?;
    let dst = SocketAddr::new(server.ip(), accept.udp_port);
    match p.test {
        RawTest::UdpBw => {
            blast(&sock, dst, p);
            cm::send(&mut tcp, MsgType::Done, &RawDone {})?;
            let r: RawReport = cm::recv(&mut tcp, MsgType::Report)?;
            Ok((Some(bw_figures(p.size, r.bytes, r.elapsed_ns)), None))
        }
        RawTest::UdpLat => {
            let fig = ping(&sock, dst, p);
            cm::send(&mut tcp, MsgType::Done, &RawDone {})?;
            Ok((None, Some(fig)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Server and client over the side channel, on 127.0.0.1: the same
    /// path as two hosts, in one process.
    #[test]
    fn raw_baselines_run_between_server_and_client() {
        for test in [RawTest::UdpBw, RawTest::UdpLat] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let server = listener.local_addr().unwrap();
            let srv = std::thread::spawn(move || serve_raw(&listener, test, true));
            let p = RawParams {
                test,
                size: 65_536,
                seg: 4152,
                secs: if test == RawTest::UdpBw { 0.2 } else { 0.0 },
                iters: 200,
                offload: true,
            };
            let (bw, lat) = run_raw_client(server, &p).unwrap();
            srv.join().unwrap().unwrap();
            match test {
                RawTest::UdpBw => assert!(bw.unwrap().avg_bps > 0.0),
                RawTest::UdpLat => assert_eq!(lat.unwrap().iters, 200),
            }
        }
    }
}
