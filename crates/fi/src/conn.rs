//! Connection set-up over MetaRoCE's connection manager (`metaroce-cm`,
//! `docs/spec/connection-manager.md`): a TCP listener per endpoint, and a
//! short-lived thread per outgoing connection.
//!
//! The first request toward a peer creates a QP in INIT with its receive
//! slots posted and hands this module a [`ConnectJob`]; a thread connects
//! to the peer's listener (the port in its address), sends `Hello` with
//! this side's device, QP and address, and waits for `Accept` with the
//! peer's. The peer's listener moves its own QP to RTS before answering,
//! so by the time this side's QP reaches RTS and its queued requests go
//! out, the other end is ready for them. No thread holds the domain lock
//! while it waits on the network, so two endpoints connecting to each other
//! at once cannot deadlock.

use crate::domain::DomainShared;
use crate::endpoint::{ConnParams, ConnectJob};
use crate::ffi::log;
use metaroce_cm::{CmError, Endpoint, Hello, MsgType, recv, send};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a connection attempt keeps retrying a peer whose listener
/// refuses (it may not be up yet).
const CONNECT_PATIENCE: Duration = Duration::from_secs(20);
/// Time limit on each step of the handshake.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// An endpoint's listener thread.
#[derive(Debug)]
pub(crate) struct Listener {
    pub(crate) port: u16,
    stop: Arc<AtomicBool>,
    ip: Ipv4Addr,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Bind a listener on `ip` (any free port) that answers for endpoint
    /// `ep` (instance `instance`) of `domain`.
    pub(crate) fn start(
        ip: Ipv4Addr,
        port: u16,
        domain: Weak<DomainShared>,
        ep: usize,
        instance: u64,
    ) -> io::Result<Self> {
        let l = TcpListener::bind((ip, port))?;
        let port = l.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("mr-fi-cm-{port}"))
            .spawn(move || {
                for stream in l.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let domain = domain.clone();
                    let _ = std::thread::Builder::new()
                        .name("mr-fi-accept".into())
                        .spawn(move || answer(stream, &domain, ep, instance));
                }
            })?;
        Ok(Self {
            port,
            stop,
            ip,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from((self.ip, self.port)),
            Duration::from_secs(1),
        );
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(mut stream: TcpStream, domain: &Weak<DomainShared>, ep: usize, instance: u64) {
    let _ = stream.set_read_timeout(Some(STEP_TIMEOUT));
    let _ = stream.set_write_timeout(Some(STEP_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let hello: Hello<ConnParams> = match recv(&mut stream, MsgType::Hello) {
        Ok(h) => h,
        // Our own wake-up at close, or a peer that went away.
        Err(CmError::Io(_)) => return,
        Err(e) => {
            log::warn(&format!(
                "connection manager: refused a malformed request: {e}"
            ));
            let _ = send(&mut stream, MsgType::Error, &e.to_string());
            return;
        }
    };
    let result = match domain.upgrade() {
        None => Err("the endpoint is closed".to_string()),
        Some(d) => {
            let mut st = d.lock_background();
            match st.ep_and_sinks(ep) {
                Some((e, mut s)) if e.instance == instance => e.accept(&mut s, &hello),
                _ => Err("the endpoint is closed".to_string()),
            }
        }
    };
    match result {
        Ok(ours) => {
            let _ = send(&mut stream, MsgType::Accept, &ours);
        }
        Err(why) => {
            log::warn(&format!(
                "connection manager: refused {} ({}): {why}",
                hello.params.src,
                stream
                    .peer_addr()
                    .map_or_else(|_| "?".into(), |a| a.to_string())
            ));
            let _ = send(&mut stream, MsgType::Error, &why);
        }
    }
}

/// Run `job` on a thread of its own; the result goes back to the endpoint.
pub(crate) fn spawn_connect(domain: Weak<DomainShared>, ep: usize, instance: u64, job: ConnectJob) {
    let spawned = std::thread::Builder::new()
        .name("mr-fi-connect".into())
        .spawn(move || {
            let answer =
                handshake(&job).map_err(|e| format!("connection manager at {}: {e}", job.target));
            let Some(d) = domain.upgrade() else { return };
            let mut st = d.lock_background();
            if let Some((e, mut s)) = st.ep_and_sinks(ep)
                && e.instance == instance
            {
                e.finish_connect(&mut s, job.peer, answer);
            }
        });
    if let Err(e) = spawned {
        log::warn(&format!("could not start a connection thread: {e}"));
    }
}

fn handshake(job: &ConnectJob) -> Result<Endpoint, String> {
    let target = SocketAddr::from(job.target.socket());
    let start = Instant::now();
    let mut delay = Duration::from_millis(10);
    let mut stream = loop {
        match TcpStream::connect_timeout(&target, STEP_TIMEOUT) {
            Ok(s) => break s,
            Err(e)
                if start.elapsed() < CONNECT_PATIENCE
                    && e.kind() == io::ErrorKind::ConnectionRefused =>
            {
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                return Err(format!(
                    "connect: {e} (after {:.1} s)",
                    start.elapsed().as_secs_f64()
                ));
            }
        }
    };
    stream
        .set_read_timeout(Some(STEP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(STEP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    send(&mut stream, MsgType::Hello, &job.hello).map_err(|e| e.to_string())?;
    recv::<Endpoint>(&mut stream, MsgType::Accept).map_err(|e| e.to_string())
}
