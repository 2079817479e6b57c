//! Raw-UDP baselines (`metaroce perf udp-bw` / `udp-lat`): the same sockets,
//! batching (sendmmsg / recvmmsg, GSO / GRO) and datagram sizes as the
//! device, with no protocol, over 127.0.0.1.

use crate::now_ns;
use crate::perf::{BwFigures, LatFigures, PerfError};
use crate::sys::{self, OutMsg, RxBatch};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

fn bind(offload: bool) -> Result<(socket2::Socket, SocketAddr), PerfError> {
    let s = sys::bind_udp("127.0.0.1:0".parse().expect("literal"))
        .map_err(|e| PerfError::Other(format!("bind UDP: {e}")))?;
    if offload {
        sys::enable_gro(&s);
    }
    let a = s
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| PerfError::Other("no local address".into()))?;
    Ok((s, a))
}

/// Blast `size`-byte messages, cut into datagrams of at most `seg` bytes,
/// for `secs` seconds; the figure is what the receiver got.
pub fn udp_bw(size: u64, seg: usize, secs: f64, offload: bool) -> Result<BwFigures, PerfError> {
    let (rx, _) = bind(offload)?;
    let (tx, _) = bind(false)?;
    let dst = rx
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| PerfError::Other("no local address".into()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_rx = Arc::clone(&stop);
    let recv = std::thread::spawn(move || {
        let mut b = RxBatch::new(32);
        let (mut bytes, mut first, mut last) = (0u64, 0u64, 0u64);
        loop {
            let n = b.recv(&rx).unwrap_or(0);
            if n == 0 {
                if stop_rx.load(Ordering::Relaxed) && now_ns() > last + 50_000_000 {
                    break;
                }
                sys::wait_readable(&[std::os::fd::AsRawFd::as_raw_fd(&rx)], Some(10_000_000));
                continue;
            }
            let t = now_ns();
            if first == 0 {
                first = t;
            }
            last = t;
            for i in 0..n {
                bytes += b.meta[i].len as u64;
            }
        }
        (bytes, first, last)
    });
    let seg = seg.min(size as usize).max(1);
    let payload = vec![0xa5u8; seg];
    let per_msg = (sys::GSO_MAX_BYTES / seg).clamp(1, sys::GSO_MAX_SEGMENTS);
    let gso = offload && sys::probe_gso(&tx);
    let parts_v: Vec<&[u8]> = vec![&payload[..]; if gso { per_msg } else { 1 }];
    let end = now_ns() + (secs * 1e9) as u64;
    while now_ns() < end {
        let msgs: Vec<OutMsg<'_>> = (0..16)
            .map(|_| OutMsg {
                dst,
                tos: 0,
                segment: (parts_v.len() > 1).then_some(seg as u16),
                parts: &parts_v,
                datagrams: parts_v.len(),
            })
            .collect();
        if sys::send_batch(&tx, &msgs).unwrap_or(0) == 0 {
            sys::wait_writable(std::os::fd::AsRawFd::as_raw_fd(&tx), 1_000_000);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (bytes, first, last) = recv
        .join()
        .map_err(|_| PerfError::Other("receiver panicked".into()))?;
    let el = (last.saturating_sub(first)).max(1) as f64 / 1e9;
    let msgs = bytes / size.max(1);
    Ok(BwFigures {
        size,
        iters: msgs,
        peak_bps: bytes as f64 / el,
        avg_bps: bytes as f64 / el,
        msg_rate_mpps: msgs as f64 / el / 1e6,
    })
}

/// Busy-polled ping-pong of one `size`-byte datagram; RTT/2 per sample.
pub fn udp_lat(size: usize, iters: u64, secs: f64) -> Result<LatFigures, PerfError> {
    let (a, aa) = bind(false)?;
    let (b, ba) = bind(false)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let size = size.clamp(1, 65_000);
    let echo = std::thread::spawn(move || {
        let mut rb = RxBatch::new(1);
        while !stop2.load(Ordering::Relaxed) {
            if rb.recv(&b).unwrap_or(0) == 1 {
                let data = rb.data(0).to_vec();
                let parts = [&data[..]];
                let m = OutMsg {
                    dst: aa,
                    tos: 0,
                    segment: None,
                    parts: &parts,
                    datagrams: 1,
                };
                let _ = sys::send_batch(&b, std::slice::from_ref(&m));
            }
        }
    });
    let buf = vec![0x5au8; size];
    let parts = [&buf[..]];
    let mut rb = RxBatch::new(1);
    let start = now_ns();
    let end = (secs > 0.0).then(|| start + (secs * 1e9) as u64);
    let target = if end.is_some() { u64::MAX } else { iters };
    let mut samples = Vec::new();
    while (samples.len() as u64) < target && end.is_none_or(|e| now_ns() < e) {
        let t0 = now_ns();
        let m = OutMsg {
            dst: ba,
            tos: 0,
            segment: None,
            parts: &parts,
            datagrams: 1,
        };
        let _ = sys::send_batch(&a, std::slice::from_ref(&m));
        loop {
            if rb.recv(&a).unwrap_or(0) == 1 {
                break;
            }
            if now_ns() - t0 > 1_000_000_000 {
                break; // lost; count the timeout as a sample
            }
        }
        samples.push((now_ns() - t0) / 2);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = echo.join();
    Ok(LatFigures::from_samples(
        size as u64,
        samples,
        now_ns() - start,
    ))
}
