//! The server (responder) side: answer a client's Hello, hold the buffer
//! the client's operations reach, take part in ping-pongs, and verify what
//! it holds when the client is done.

use crate::messages::{Done, Hello, Report};
use crate::params::auth_mode;
use crate::rig::{
    PP_RECVS, Rig, connect, empty_wcs, finish_rig, local_endpoint, post_recvs, rig, set_inline,
    wc_error,
};
use crate::verify::{first_diff, pattern};
use crate::{AddrLine, LocalOpts, PerfError, ServerSession, Test};
use metaroce_cm::{self as cm, Confirm, KeyConfirmation, MsgType, Role};
use metaroce_udp::now_ns;
use metaroce_verbs::{SendWr, Sge, WcOpcode, WcStatus, WrOp};
use std::io::{ErrorKind, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Longest a server poll sleeps when nothing comes: the client's `Done`
/// on the side channel is seen at most this late.
const SERVER_WAIT_MAX: Duration = Duration::from_millis(10);

/// Serve sessions of `test` on `listener` until a client marks its session
/// as the last one. `on_session` sees each finished session.
pub fn serve(
    listener: &TcpListener,
    test: Test,
    local: &LocalOpts,
    on_session: &mut dyn FnMut(&ServerSession),
) -> Result<(), PerfError> {
    if let Some(a) = &local.auth {
        cm::check_job_secret(&a.job_secret)?;
    }
    loop {
        let (mut tcp, _) = listener.accept()?;
        tcp.set_nodelay(true)?;
        let hello: Hello = cm::recv(&mut tcp, MsgType::Hello)?;
        let refuse = |tcp: &mut TcpStream, msg: String| -> PerfError {
            let _ = cm::send(tcp, MsgType::Error, &msg);
            PerfError::Other(msg)
        };
        if hello.test != test.name() {
            return Err(refuse(
                &mut tcp,
                format!(
                    "server runs {}, client asked for {}",
                    test.name(),
                    hello.test
                ),
            ));
        }
        if let Err(e) = hello.params.validate(test) {
            return Err(refuse(&mut tcp, e));
        }
        let mine = auth_mode(local.auth.as_ref());
        if hello.endpoint.auth != mine {
            return Err(refuse(
                &mut tcp,
                format!(
                    "packet protection differs: server runs {mine}, client {} (--auth / --encrypt and METAROCE_JOB_SECRET must match)",
                    hello.endpoint.auth
                ),
            ));
        }
        let s = server_session(&mut tcp, test, &hello, local)?;
        on_session(&s);
        if hello.last {
            return Ok(());
        }
    }
}

fn server_session(
    tcp: &mut TcpStream,
    test: Test,
    hello: &Hello,
    local: &LocalOpts,
) -> Result<ServerSession, PerfError> {
    let p = &hello.params;
    let my_ip = tcp.local_addr()?.ip();
    let peer_ip = tcp.peer_addr()?.ip();
    let slots = p.slots(test);
    let buf_len = p.buffer_len(test);
    let fill = matches!(test, Test::ReadBw | Test::ReadLat).then_some(p.pattern_seed);
    // A server that cannot set up (ports taken, a path too small for the
    // MTU asked) says why before closing, so the client reports the reason
    // rather than a side channel cut short.
    let rig = match rig(test, my_ip, peer_ip, p, local, buf_len, fill) {
        Ok(r) => r,
        Err(e) => {
            let _ = cm::send(tcp, MsgType::Error, &format!("server: {e}"));
            return Err(e);
        }
    };
    let result = serve_on_rig(tcp, test, hello, local, &rig, peer_ip, slots);
    finish_rig(rig, result)
}

/// The session on a started device; a failure is returned as it is and
/// [`finish_rig`] attaches the device's counters.
fn serve_on_rig(
    tcp: &mut TcpStream,
    test: Test,
    hello: &Hello,
    local: &LocalOpts,
    rig: &Rig,
    peer_ip: IpAddr,
    slots: u64,
) -> Result<ServerSession, PerfError> {
    let p = &hello.params;
    if let Err(e) = connect(rig, peer_ip, &hello.endpoint) {
        let _ = cm::send(tcp, MsgType::Error, &format!("server: {e}"));
        return Err(e);
    }
    let nq = rig.qps.len() as u64;
    let pingpong = matches!(test, Test::WriteLat | Test::SendLat);
    let reply_inline = local.measure.inline(test, p.size);
    let recv_sge = |j: u64, q: u64| -> Vec<Sge> {
        match test {
            Test::SendBw => {
                let slot = (j * nq + q) % slots;
                vec![rig.mr.sge(slot * p.size, p.size as u32)]
            }
            Test::SendLat => vec![rig.mr.sge(0, p.size as u32)],
            _ => Vec::new(),
        }
    };
    let mut posted_recv = vec![0u64; rig.qps.len()];
    let initial = if test == Test::SendBw {
        u64::from(p.tx_depth.max(64)) * 2
    } else {
        PP_RECVS
    };
    if test == Test::SendBw || pingpong {
        for (q, qp) in rig.qps.iter().enumerate() {
            post_recvs(rig, *qp, (0..initial).map(|j| (j, recv_sge(j, q as u64))))?;
            posted_recv[q] = initial;
        }
    }
    let mut accept = local_endpoint(rig, p);
    // With packet authentication, prove this side holds the job secret and
    // check the client does, before any packet flows.
    let confirmation = local.auth.map(|a| {
        let mode = auth_mode(Some(&a));
        let at = |role| {
            KeyConfirmation::new(
                &a.job_secret,
                role,
                hello.endpoint.session_id,
                accept.session_id,
                mode,
            )
        };
        (at(Role::Server), at(Role::Client))
    });
    if let Some((server, _)) = &confirmation {
        accept.key_confirm = Some(server.to_hex());
    }
    cm::send(tcp, MsgType::Accept, &accept)?;
    if let Some((_, client)) = &confirmation {
        let c: Confirm = cm::recv(tcp, MsgType::Confirm)?;
        if let Err(e) = client.verify(Some(&c.key_confirm)) {
            let why = "key confirmation failed: the server's job secret differs from the client's (METAROCE_JOB_SECRET must be the same on both hosts)";
            let _ = cm::send(tcp, MsgType::Error, &why.to_string());
            return Err(e.into());
        }
    }
    let mut bad = None;
    let mut received = 0u64;
    let done: Option<Done> = if test == Test::SendBw || pingpong {
        let expect = (test == Test::SendBw && p.verify)
            .then(|| pattern(p.pattern_seed, (slots * p.size) as usize));
        let mut wcs = empty_wcs();
        let mut spins = 0u32;
        let mut peeked_ns = now_ns();
        tcp.set_nonblocking(true)?;
        // The reply is the same every time but for its id: built once, and
        // the list of receives to repost kept, so that no allocation sits
        // between a request's completion and its reply.
        let mut reply = if test == Test::WriteLat {
            SendWr::new(
                0,
                WrOp::WriteImm {
                    remote_addr: hello.endpoint.buf.addr,
                    rkey: hello.endpoint.buf.rkey,
                    imm: 0,
                },
                vec![rig.mr.sge(0, p.size as u32)],
            )
        } else {
            SendWr::new(0, WrOp::Send, vec![rig.mr.sge(0, p.size as u32)])
        };
        reply.signaled = false;
        if reply_inline {
            set_inline(rig, &mut reply, p.size);
        }
        let mut repost: Vec<(usize, u64)> = Vec::new();
        loop {
            let n = rig.dev.poll_cq_wait(rig.cq, &mut wcs, SERVER_WAIT_MAX)?;
            repost.clear();
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    if wc.status == WcStatus::WrFlushErr {
                        continue;
                    }
                    return Err(wc_error(wc));
                }
                if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    continue;
                }
                received += 1;
                let q = rig
                    .qps
                    .iter()
                    .position(|qp| qp.qp_num() == wc.qp_num)
                    .unwrap_or(0);
                if let Some(exp) = &expect
                    && bad.is_none()
                {
                    let slot = (wc.wr_id * nq + q as u64) % slots;
                    let off = (slot * p.size) as usize;
                    let len = p.size as usize;
                    let diff = rig.dev.with(|ctx, _| {
                        first_diff(&ctx.mr_bytes(&rig.mr)[off..off + len], &exp[off..off + len])
                    });
                    if let Some(at) = diff {
                        bad = Some(format!("message {} differs at byte {at}", wc.wr_id));
                    } else if wc.byte_len as u64 != p.size {
                        bad = Some(format!("message {} has {} bytes", wc.wr_id, wc.byte_len));
                    }
                }
                repost.push((q, wc.wr_id));
                if pingpong {
                    let w = &mut reply;
                    w.wr_id = wc.wr_id;
                    let qp = rig.qps[q];
                    rig.dev.with(|ctx, now| {
                        ctx.post_send_at(now, qp, std::slice::from_ref(w))
                            .map_err(|(_, e)| PerfError::Other(format!("post_send: {e}")))
                    })?;
                }
            }
            for &(q, _) in &repost {
                let j = posted_recv[q];
                posted_recv[q] += 1;
                post_recvs(rig, rig.qps[q], std::iter::once((j, recv_sge(j, q as u64))))?;
            }
            spins += 1;
            // Every 64 polls, or every millisecond when polls block
            // (`poll_cq_wait` sleeps when nothing came for a while).
            if n == 0 && (spins >= 64 || now_ns().saturating_sub(peeked_ns) >= 1_000_000) {
                spins = 0;
                peeked_ns = now_ns();
                let mut b = [0u8; 1];
                match tcp.peek(&mut b) {
                    Ok(0) if p.run_infinitely => break None,
                    Ok(0) => return Err(PerfError::Other("client closed the side channel".into())),
                    Ok(_) => {
                        tcp.set_nonblocking(false)?;
                        break Some(cm::recv(tcp, MsgType::Done)?);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    } else {
        match cm::recv(tcp, MsgType::Done) {
            Ok(d) => Some(d),
            Err(cm::CmError::Io(e)) if p.run_infinitely && e.kind() == ErrorKind::UnexpectedEof => {
                None
            }
            Err(e) => return Err(e.into()),
        }
    };
    // An endless run ends when the client stops: nothing to verify or
    // report back.
    let Some(done) = done else {
        return Ok(ServerSession {
            test,
            params: p.clone(),
            report: Report {
                verified: None,
                detail: "run_infinitely: the client stopped the run".into(),
                rx_malformed: rig.dev.stats().endpoint.rx_malformed,
            },
            local: local_line(rig),
            remote: remote_line(peer_ip, hello),
            stats: rig.dev.stats(),
            counters: rig.dev.counters(),
        });
    };
    // Server-side verification.
    let (verified, detail) = if !p.verify && test != Test::AtomicLat && test != Test::AtomicBw {
        (None, String::new())
    } else {
        match test {
            Test::WriteBw => {
                let len = (done.completed.min(slots) * p.size) as usize;
                let expect = pattern(p.pattern_seed, len);
                let diff = rig
                    .dev
                    .with(|ctx, _| first_diff(&ctx.mr_bytes(&rig.mr)[..len], &expect));
                match diff {
                    None => (Some(true), format!("{len} bytes written intact")),
                    Some(at) => (Some(false), format!("written data differs at byte {at}")),
                }
            }
            Test::SendBw => {
                if let Some(b) = bad {
                    (Some(false), b)
                } else if received != done.completed {
                    (
                        Some(false),
                        format!("{received} messages received, {} sent", done.completed),
                    )
                } else {
                    (Some(true), format!("{received} messages received intact"))
                }
            }
            Test::AtomicBw | Test::AtomicLat => {
                let sum: u64 = rig.dev.with(|ctx, _| {
                    ctx.mr_bytes(&rig.mr)
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .sum()
                });
                (
                    Some(sum == done.completed),
                    format!("counters sum to {sum}, {} fetch-adds done", done.completed),
                )
            }
            _ => (None, String::new()),
        }
    };
    let stats = rig.dev.stats();
    let counters = rig.dev.counters();
    let report = Report {
        verified,
        detail,
        rx_malformed: stats.endpoint.rx_malformed,
    };
    cm::send(tcp, MsgType::Report, &report)?;
    // Wait for the client to close so its last ACKs are not lost to a
    // device shut down under them.
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = tcp.read(&mut [0u8; 1]);
    let session = ServerSession {
        test,
        params: p.clone(),
        report,
        local: local_line(rig),
        remote: remote_line(peer_ip, hello),
        stats,
        counters,
    };
    Ok(session)
}

/// The server's own address line.
fn local_line(rig: &Rig) -> AddrLine {
    AddrLine {
        dev: rig.dev.addr(),
        qpn: rig.qps[0].qp_num(),
        rkey: rig.mr.rkey,
        vaddr: rig.mr.addr,
    }
}

/// The client's address line, from its Hello.
fn remote_line(peer_ip: IpAddr, hello: &Hello) -> AddrLine {
    AddrLine {
        dev: SocketAddr::new(peer_ip, hello.endpoint.device_port),
        qpn: hello.endpoint.qpns[0],
        rkey: hello.endpoint.buf.rkey,
        vaddr: hello.endpoint.buf.addr,
    }
}
