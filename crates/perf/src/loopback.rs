//! `--loopback`: both ends in one process.

use crate::{IntervalFn, LocalOpts, Params, PerfError, Session, Test, run_client_with, serve};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// Run the server on a thread and the client here: both ends in one
/// process over 127.0.0.1 (`--loopback`). `sizes` are run as sessions in
/// order; `on_session` sees each client session as it finishes, and
/// `on_interval` each interval of a `run_infinitely` run.
pub fn run_loopback(
    test: Test,
    listener: TcpListener,
    sizes: &[u64],
    p: &Params,
    local: &LocalOpts,
    on_session: &mut dyn FnMut(&Session),
    on_interval: IntervalFn<'_>,
) -> Result<(), PerfError> {
    let server_addr = listener.local_addr()?;
    let mut server_local = local.clone();
    server_local.seed = local.seed ^ 0x5151_5151;
    // The client's capture has every datagram of the run, sent and
    // received: the server recording them again would list each twice.
    server_local.capture = None;
    // Both devices live on 127.0.0.1: with a fixed device port the server
    // takes it and the client the range right above the server's.
    let mut client_local = local.clone();
    if local.dev_port != 0 {
        let span = u32::from(crate::rig::port_span(p)) + 1;
        client_local.dev_port = u16::try_from(u32::from(local.dev_port) + span)
            .ok()
            .filter(|&b| u32::from(b) + span <= 65_535)
            .ok_or_else(|| {
                PerfError::Other(format!(
                    "--dev-port {}: with --loopback the client needs the {span} ports above the server's, past 65535",
                    local.dev_port
                ))
            })?;
    }
    let local = &client_local;
    let server = std::thread::Builder::new()
        .name("mr-perf-server".into())
        .spawn(move || serve(&listener, test, &server_local, &mut |_| {}))
        .map_err(|e| PerfError::Other(format!("spawn server: {e}")))?;
    let mut result = Ok(());
    for (i, &size) in sizes.iter().enumerate() {
        let mut pp = p.clone();
        pp.size = size;
        let last = i + 1 == sizes.len();
        match run_client_with(test, server_addr, &pp, local, last, on_interval) {
            Ok(s) => on_session(&s),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_err() {
        // Unblock a server waiting in accept.
        let _ = TcpStream::connect_timeout(&server_addr, Duration::from_millis(200));
        drop(server);
        return result;
    }
    match server.join() {
        Ok(r) => r,
        Err(_) => Err(PerfError::Other("server thread panicked".into())),
    }
}
