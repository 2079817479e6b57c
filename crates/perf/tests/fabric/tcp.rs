//! The contrast: one TCP stream across the fabric. TCP is single-path:
//! its 4-tuple hashes onto one link, and when that link silently drops
//! everything the stream stalls (retransmissions take the same link)
//! until the link heals, whatever the other links could carry.

use crate::topology::{Fabric, enter};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// What the stream did.
#[derive(Debug)]
pub(crate) struct TcpContrast {
    /// The link the stream hashed onto (the one blackholed).
    pub(crate) link: usize,
    /// Goodput before the blackhole, bits/s.
    pub(crate) healthy_bps: f64,
    /// Goodput in the second after the blackhole (from 0.2 s to 1.2 s
    /// after it), bits/s.
    pub(crate) after_bps: f64,
}

/// Stream from the client to the server for ~0.8 s, blackhole the link
/// that carried it, measure the next second, heal.
pub(crate) fn blackholed_stream(f: &Fabric) -> TcpContrast {
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (server_ns, server_ip, rx_count, rx_stop) = (
        f.server.clone(),
        f.server_ip,
        received.clone(),
        stop.clone(),
    );
    let server = std::thread::spawn(move || {
        enter(&server_ns).expect("setns server");
        let l = TcpListener::bind(SocketAddr::new(server_ip, 0)).expect("listen");
        addr_tx.send(l.local_addr().unwrap()).unwrap();
        let (mut c, _) = l.accept().expect("accept");
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        while !rx_stop.load(Ordering::Relaxed) {
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    rx_count.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(_) => {}
            }
        }
    });
    let addr = addr_rx.recv().unwrap();
    let (client_ns, tx_stop) = (f.client.clone(), stop.clone());
    let client = std::thread::spawn(move || {
        enter(&client_ns).expect("setns client");
        let mut c = TcpStream::connect(addr).expect("connect");
        c.set_write_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let buf = vec![0x5au8; 1 << 16];
        while !tx_stop.load(Ordering::Relaxed) {
            let _ = c.write(&buf);
        }
    });
    let sleep = |ms| std::thread::sleep(Duration::from_millis(ms));
    sleep(300);
    let (l0, r0, t0) = (
        f.link_tx_bytes(),
        received.load(Ordering::Relaxed),
        metaroce_udp::now_ns(),
    );
    sleep(500);
    let (l1, r1, t1) = (
        f.link_tx_bytes(),
        received.load(Ordering::Relaxed),
        metaroce_udp::now_ns(),
    );
    let link = (0..f.links)
        .max_by_key(|&k| l1[k] - l0[k])
        .expect("at least one link");
    f.blackhole(link).expect("blackhole the stream's link");
    sleep(200);
    let (r2, t2) = (received.load(Ordering::Relaxed), metaroce_udp::now_ns());
    sleep(1000);
    let (r3, t3) = (received.load(Ordering::Relaxed), metaroce_udp::now_ns());
    f.heal();
    stop.store(true, Ordering::Relaxed);
    let _ = client.join();
    let _ = server.join();
    let bps = |b: u64, ns: u64| b as f64 * 8.0 / (ns as f64 / 1e9);
    TcpContrast {
        link,
        healthy_bps: bps(r1 - r0, t1 - t0),
        after_bps: bps(r3 - r2, t3 - t2),
    }
}
