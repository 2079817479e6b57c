//! The client (requester) side: connect over the side channel, run one
//! session of a test, and measure it.

use crate::figures::{PEAK_MARK_OPS, peak_bps};
use crate::messages::{Done, Hello, Report};
use crate::params::auth_mode;
use crate::rate::Pacer;
use crate::rig::{
    PP_RECVS, Rig, STALL_NS, connect, empty_wcs, finish_rig, local_endpoint, post_recvs, rig,
    set_inline, wc_error,
};
use crate::verify::{first_diff, pattern};
use crate::{
    AddrLine, AuthOpts, BwFigures, Figures, LatFigures, LocalOpts, Measure, Params, PerfError,
    Progress, Session, Test,
};
use metaroce_cm::{self as cm, Confirm, Endpoint, KeyConfirmation, MsgType, RemoteBuf, Role};
use metaroce_udp::now_ns;
use metaroce_verbs::{MemoryRegion, SendWr, Sge, WcOpcode, WcStatus, WrOp};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Longest a client poll sleeps when nothing comes: it looks at the
/// clock for the end of a timed run and for stalls at least this often.
const CLIENT_WAIT_MAX: Duration = Duration::from_millis(100);

// ------------------------------------------------------------ client

/// What a bandwidth run reports at each interval of `--run_infinitely`:
/// the figures of the last `duration_s` seconds (no peak).
pub type IntervalFn<'a> = &'a mut dyn FnMut(&BwFigures);

/// Connect to a server at `server`, run one session of `test`, and return
/// what it measured. `last` tells the server no session follows.
pub fn run_client(
    test: Test,
    server: SocketAddr,
    p: &Params,
    local: &LocalOpts,
    last: bool,
) -> Result<Session, PerfError> {
    run_client_with(test, server, p, local, last, &mut |_| {})
}

/// [`run_client`], with `on_interval` seeing each interval's figures of a
/// `run_infinitely` run (which returns only on an error).
pub fn run_client_with(
    test: Test,
    server: SocketAddr,
    p: &Params,
    local: &LocalOpts,
    last: bool,
    on_interval: IntervalFn<'_>,
) -> Result<Session, PerfError> {
    local.measure.validate().map_err(PerfError::Other)?;
    p.validate(test).map_err(PerfError::Other)?;
    if let Some(r) = &local.rate_limit {
        if test.is_lat() {
            return Err(PerfError::Other(format!(
                "--rate_limit applies to bandwidth tests only ({} is a latency test)",
                test.name()
            )));
        }
        r.validate(p).map_err(PerfError::Other)?;
    }
    if let Some(a) = &local.auth {
        cm::check_job_secret(&a.job_secret)?;
    }
    let mut tcp = TcpStream::connect_timeout(&server, Duration::from_secs(5))
        .map_err(|e| PerfError::Other(format!("cannot reach server {server}: {e}")))?;
    tcp.set_nodelay(true)?;
    let my_ip = tcp.local_addr()?.ip();
    let peer_ip = tcp.peer_addr()?.ip();
    let slots = p.slots(test);
    let buf_len = p.buffer_len(test);
    let fill = matches!(
        test,
        Test::WriteBw | Test::SendBw | Test::WriteLat | Test::SendLat
    )
    .then_some(p.pattern_seed);
    let rig = rig(test, my_ip, peer_ip, p, local, buf_len, fill)?;
    let result = client_on_rig(test, p, local, last, on_interval, &mut tcp, &rig, slots);
    finish_rig(rig, result)
}

/// The session on a started device; a failure is returned as it is and
/// [`finish_rig`] attaches the device's counters.
#[allow(clippy::too_many_arguments)]
fn client_on_rig(
    test: Test,
    p: &Params,
    local: &LocalOpts,
    last: bool,
    on_interval: IntervalFn<'_>,
    tcp: &mut TcpStream,
    rig: &Rig,
    slots: u64,
) -> Result<Session, PerfError> {
    let peer_ip = tcp.peer_addr()?.ip();
    let hello = Hello {
        test: test.name().into(),
        params: p.clone(),
        endpoint: local_endpoint(rig, p),
        last,
    };
    cm::send(tcp, MsgType::Hello, &hello)?;
    let peer: Endpoint = cm::recv(tcp, MsgType::Accept)?;
    if let Some(a) = &local.auth {
        confirm_keys(tcp, a, hello.endpoint.session_id, &peer)?;
    }
    connect(rig, peer_ip, &peer)?;
    let remote = peer.buf;
    let (figures, completed, progress) = if test.is_lat() {
        let (f, c) = client_lat(test, rig, p, &local.measure, remote)?;
        (f, c, Progress::default())
    } else {
        client_bw(test, rig, p, local, remote, slots, on_interval)?
    };
    // Client-side verification (READ data lands here).
    let (mut verified, mut detail) = (None, String::new());
    if p.verify && matches!(test, Test::ReadBw | Test::ReadLat) {
        let n = if test == Test::ReadLat {
            1
        } else {
            completed.min(slots)
        };
        let len = (n * p.size) as usize;
        let expect = pattern(p.pattern_seed, len);
        let bad = rig
            .dev
            .with(|ctx, _| first_diff(&ctx.mr_bytes(&rig.mr)[..len], &expect));
        verified = Some(bad.is_none());
        detail = match bad {
            None => format!("{len} bytes read back intact"),
            Some(at) => format!("read data differs at byte {at}"),
        };
    }
    cm::send(tcp, MsgType::Done, &Done { completed })?;
    let report: Report = cm::recv(tcp, MsgType::Report)?;
    if let Some(v) = report.verified {
        verified = Some(v && verified.unwrap_or(true));
        if detail.is_empty() {
            detail = report.detail.clone();
        } else {
            detail = format!("{detail}; {}", report.detail);
        }
    }
    let local_line = AddrLine {
        dev: rig.dev.addr(),
        qpn: rig.qps[0].qp_num(),
        rkey: rig.mr.rkey,
        vaddr: rig.mr.addr,
    };
    let remote_line = AddrLine {
        dev: SocketAddr::new(peer_ip, peer.device_port),
        qpn: peer.qpns[0],
        rkey: remote.rkey,
        vaddr: remote.addr,
    };
    let stats = rig.dev.stats();
    let counters = rig.dev.counters();
    let mtu = rig.mtu.min(peer.mtu);
    let icrc_omitted = crate::rig::icrc_omitted(rig, &peer);
    let path = rig
        .dev
        .path(remote_line.dev)
        .unwrap_or_else(|| rig.path.clone());
    Ok(Session {
        figures,
        verified,
        detail,
        local: local_line,
        remote: remote_line,
        stats,
        counters,
        server_rx_malformed: report.rx_malformed,
        mtu,
        path,
        progress,
        icrc_omitted,
    })
}

/// Check the server's key confirmation and send the client's
/// (`docs/spec/connection-manager.md`): different job secrets are refused
/// here, on both sides, before a packet flows.
fn confirm_keys(
    tcp: &mut TcpStream,
    auth: &AuthOpts,
    client_session: u64,
    server: &Endpoint,
) -> Result<(), PerfError> {
    let mode = auth_mode(Some(auth));
    let at = |role| {
        KeyConfirmation::new(
            &auth.job_secret,
            role,
            client_session,
            server.session_id,
            mode,
        )
    };
    if let Err(e) = at(Role::Server).verify(server.key_confirm.as_deref()) {
        let why = "key confirmation failed: the client's job secret differs from the server's (METAROCE_JOB_SECRET must be the same on both hosts)";
        let _ = cm::send(tcp, MsgType::Error, &why.to_string());
        return Err(e.into());
    }
    let confirm = Confirm {
        key_confirm: at(Role::Client).to_hex(),
    };
    cm::send(tcp, MsgType::Confirm, &confirm)?;
    Ok(())
}

fn bw_wr(
    test: Test,
    k: u64,
    p: &Params,
    slots: u64,
    mr: &MemoryRegion,
    remote: RemoteBuf,
) -> SendWr {
    let slot = k % slots;
    match test {
        Test::AtomicBw | Test::AtomicLat => SendWr::new(
            k,
            WrOp::FetchAdd {
                remote_addr: remote.addr + slot * 8,
                rkey: remote.rkey,
                add: 1,
            },
            vec![mr.sge(slot * 8, 8)],
        ),
        _ => {
            let off = slot * p.size;
            let op = match test {
                Test::ReadBw | Test::ReadLat => WrOp::Read {
                    remote_addr: remote.addr + off,
                    rkey: remote.rkey,
                },
                Test::SendBw | Test::SendLat => WrOp::Send,
                _ => WrOp::Write {
                    remote_addr: remote.addr + off,
                    rkey: remote.rkey,
                },
            };
            SendWr::new(k, op, vec![mr.sge(off, p.size as u32)])
        }
    }
}

/// Bandwidth: keep `tx_depth` work requests outstanding on every QP
/// (message `k` on QP `k % qps`), signal one in `cq_mod` (perftest's CQ
/// moderation; a QP's last request is always signaled), post at most
/// `post_list` per call, and time the first post to the last completion.
/// With a rate limit, post no more than its [`Pacer`] allows, and poll
/// for completions meanwhile.
fn client_bw(
    test: Test,
    rig: &Rig,
    p: &Params,
    local: &LocalOpts,
    remote: RemoteBuf,
    slots: u64,
    on_interval: IntervalFn<'_>,
) -> Result<(Figures, u64, Progress), PerfError> {
    let m = &local.measure;
    let nq = rig.qps.len() as u64;
    let depth = u64::from(p.tx_depth);
    let cq_mod = u64::from(m.cq_mod_for(p));
    let post_list = m.post_list.max(1) as usize;
    let inline = m.inline(test, p.size);
    let by_iters = p.duration_s == 0;
    // Requests QP q carries (by iterations): the k < iters with k % nq == q.
    let quota = |q: u64| {
        if by_iters {
            p.iters.saturating_sub(q).div_ceil(nq)
        } else {
            u64::MAX
        }
    };
    let mut posted_q = vec![0u64; nq as usize];
    // Whether a QP's last posted request is signaled (nothing posted:
    // nothing to see complete).
    let mut last_signaled_q = vec![true; nq as usize];
    let mut done_q = vec![0u64; nq as usize];
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut wcs = empty_wcs();
    let start = now_ns();
    let report_every = p.duration_s * 1_000_000_000;
    let end_at = (!by_iters && !p.run_infinitely).then(|| start + report_every);
    let mut interval = (start, 0u64);
    let mut marks = vec![(start, 0u64)];
    let mut next_mark = PEAK_MARK_OPS;
    let mut last_done = start;
    let mut last_progress = start;
    let mut batch: Vec<Vec<SendWr>> = vec![Vec::new(); nq as usize];
    let mut pacer = local
        .rate_limit
        .as_ref()
        .map(|r| Pacer::new(r, p, m, start));
    // The QP a pass starts at. Without a limit always the first; with one,
    // the QP after the last one posted to: a burst smaller than the QPs
    // can take would otherwise always go to the first QPs.
    let mut first_q = 0usize;
    loop {
        let pass_ns = now_ns();
        let time_up = end_at.is_some_and(|e| pass_ns >= e);
        // Messages the limiter lets go in this pass (no limit: any number).
        let mut allowed = pacer.as_mut().map_or(u64::MAX, |pc| pc.allowed(pass_ns));
        let posted_before = posted;
        let mut any = false;
        let pass_first_q = first_q;
        for i in 0..nq as usize {
            let q = (pass_first_q + i) % nq as usize;
            let b = &mut batch[q];
            b.clear();
            let qu = q as u64;
            // After the time is up a QP still posts up to its next
            // signaled request, so its last request completes visibly.
            while posted_q[q] - done_q[q] < depth
                && posted_q[q] < quota(qu)
                && (!time_up || !last_signaled_q[q])
                && b.len() < post_list
                && allowed > 0
            {
                let k = posted_q[q] * nq + qu;
                let mut wr = bw_wr(test, k, p, slots, &rig.mr, remote);
                posted_q[q] += 1;
                wr.signaled = posted_q[q].is_multiple_of(cq_mod) || posted_q[q] == quota(qu);
                last_signaled_q[q] = wr.signaled;
                b.push(wr);
                posted += 1;
                allowed -= 1;
                any = true;
                if pacer.is_some() {
                    first_q = (q + 1) % nq as usize;
                }
            }
        }
        if pacer.is_some() && allowed == 0 {
            // The burst ends in this pass: its last request on each QP is
            // signaled, so that its completion is seen when it comes rather
            // than a CQ-moderation interval later (bursts apart, at a low
            // rate), and a timed run that ends now owes no further
            // requests (at the limited rate) to reach a signaled one.
            for (q, b) in batch.iter_mut().enumerate() {
                if let Some(wr) = b.last_mut() {
                    wr.signaled = true;
                    last_signaled_q[q] = true;
                }
            }
        }
        if any {
            rig.dev.with(|ctx, now| -> Result<(), PerfError> {
                for (q, b) in batch.iter_mut().enumerate() {
                    if b.is_empty() {
                        continue;
                    }
                    if inline {
                        // Copy each payload now, as an inline post does.
                        for wr in b.iter_mut() {
                            let sge = wr.sg_list.pop().expect("one SGE");
                            let at = (sge.addr - rig.mr.addr) as usize;
                            let bytes =
                                ctx.mr_bytes(&rig.mr)[at..at + sge.length as usize].to_vec();
                            wr.inline_data = Some(bytes);
                        }
                    }
                    ctx.post_send_at(now, rig.qps[q], b)
                        .map_err(|(i, e)| PerfError::Other(format!("post_send #{i}: {e}")))?;
                }
                Ok(())
            })?;
        }
        // How long to wait for a completion: with a limit, no longer than
        // until the next burst is due.
        let max_wait = match &mut pacer {
            Some(pc) => {
                // Posted when the pass began: the time a post call takes
                // (it may send) is part of the burst, and measuring the
                // schedule from its end would space bursts wider than the
                // rate asks.
                pc.posted(posted - posted_before, pass_ns);
                let cap_ns = CLIENT_WAIT_MAX.as_nanos() as u64;
                Duration::from_nanos(pc.max_wait_ns(now_ns(), cap_ns))
            }
            None => CLIENT_WAIT_MAX,
        };
        // Block for a completion only when nothing more may be posted (as
        // perftest, whose loop never blocks): a wait ends on input or a
        // completion, and input that completes nothing (the ACKs of
        // unsignaled requests, which free the window, not the queue) may be
        // taken by the device's engine. Waiting with room to post left 4 KiB
        // write-bw on loopback idle for the wait's 100 ms, or a probe
        // timer's 2, several times a second.
        let room = allowed > 0
            && (0..nq as usize).any(|q| {
                posted_q[q] - done_q[q] < depth
                    && posted_q[q] < quota(q as u64)
                    && (!time_up || !last_signaled_q[q])
            });
        let n = if room {
            rig.dev.poll_cq(rig.cq, &mut wcs)?
        } else {
            rig.dev.poll_cq_wait(rig.cq, &mut wcs, max_wait)?
        };
        let now = now_ns();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(wc_error(wc));
            }
            // A signaled completion completes its QP's requests up to it.
            let q = (wc.wr_id % nq) as usize;
            let done = wc.wr_id / nq + 1;
            completed += done.saturating_sub(done_q[q]);
            done_q[q] = done_q[q].max(done);
            if completed >= next_mark {
                marks.push((now, completed));
                next_mark = completed + PEAK_MARK_OPS;
            }
            last_done = now;
            last_progress = now;
        }
        if p.run_infinitely && now >= interval.0 + report_every {
            let ops = completed - interval.1;
            let secs = (now - interval.0) as f64 / 1e9;
            on_interval(&BwFigures {
                size: p.size,
                iters: ops,
                peak_bps: 0.0,
                avg_bps: (ops * p.size) as f64 / secs,
                msg_rate_mpps: ops as f64 / secs / 1e6,
            });
            interval = (now, completed);
        }
        let all_done = posted_q.iter().zip(&done_q).all(|(p, d)| p == d);
        if (by_iters && completed >= p.iters) || (time_up && all_done) {
            break;
        }
        if all_done {
            // Nothing outstanding: the loop waits for its limiter, not the
            // peer, and no completion is missing.
            last_progress = now;
        }
        if now.saturating_sub(last_progress) > STALL_NS {
            return Err(PerfError::Other(format!(
                "no completion for {} s ({completed} of {posted} done)",
                STALL_NS / 1_000_000_000
            )));
        }
    }
    let elapsed = last_done.saturating_sub(start).max(1) as f64 / 1e9;
    let bytes = (completed * p.size) as f64;
    let avg = bytes / elapsed;
    let peak = if m.peak {
        // A run shorter than the window, or one whose only full window
        // caught a slow stretch, still reports a peak no lower than its
        // average (as perftest does).
        peak_bps(&marks, p.size).max(avg)
    } else {
        0.0
    };
    // The progress record ends at the last completion, even between marks.
    if marks.last().is_some_and(|&(_, done)| done < completed) {
        marks.push((last_done, completed));
    }
    Ok((
        Figures::Bw(BwFigures {
            size: p.size,
            iters: completed,
            peak_bps: peak,
            avg_bps: avg,
            msg_rate_mpps: completed as f64 / elapsed / 1e6,
        }),
        completed,
        Progress {
            marks,
            bytes_per_op: p.size,
        },
    ))
}

fn client_lat(
    test: Test,
    rig: &Rig,
    p: &Params,
    m: &Measure,
    remote: RemoteBuf,
) -> Result<(Figures, u64), PerfError> {
    let inline = m.inline(test, p.size);
    let qp = rig.qps[0];
    let pingpong = matches!(test, Test::WriteLat | Test::SendLat);
    let recv_sge = |_: u64| -> Vec<Sge> {
        if test == Test::SendLat {
            vec![rig.mr.sge(0, p.size as u32)]
        } else {
            Vec::new()
        }
    };
    if pingpong {
        post_recvs(rig, qp, (0..PP_RECVS).map(|i| (i, recv_sge(i))))?;
    }
    let target = if p.duration_s == 0 { p.iters } else { u64::MAX };
    let start = now_ns();
    let end_at = (p.duration_s > 0).then(|| start + p.duration_s * 1_000_000_000);
    let mut samples = Vec::with_capacity(target.min(1 << 20) as usize);
    let mut wcs = empty_wcs();
    let mut k = 0u64;
    // The receive the last answer consumed is reposted right after the
    // next request has left: reposting is not on the round trip's critical
    // path, the request is (the other receives posted cover the answer
    // meanwhile). The ACK for the answer still leaves in front of the
    // request: the completion that handed the answer out held it.
    let mut repost: Option<u64> = None;
    // A ping-pong's request is the same every time but for its id (and
    // immediate): built once, so that no allocation sits between an answer
    // and the next request.
    let mut pp_wr = match test {
        Test::WriteLat => Some(SendWr::new(
            0,
            WrOp::WriteImm {
                remote_addr: remote.addr,
                rkey: remote.rkey,
                imm: 0,
            },
            vec![rig.mr.sge(0, p.size as u32)],
        )),
        Test::SendLat => Some(SendWr::new(
            0,
            WrOp::Send,
            vec![rig.mr.sge(0, p.size as u32)],
        )),
        _ => None,
    };
    if let Some(w) = &mut pp_wr {
        w.signaled = false;
        if inline {
            set_inline(rig, w, p.size);
        }
    }
    let mut other_wr;
    while k < target && end_at.is_none_or(|e| now_ns() < e) {
        let wr = match &mut pp_wr {
            Some(w) => {
                w.wr_id = k;
                if let WrOp::WriteImm { imm, .. } = &mut w.op {
                    *imm = k as u32;
                }
                w
            }
            None => {
                other_wr = bw_wr(test, k, p, 1, &rig.mr, remote);
                &mut other_wr
            }
        };
        let t0 = now_ns();
        rig.dev.with(|ctx, now| {
            ctx.post_send_at(now, qp, std::slice::from_ref(wr))
                .map_err(|(_, e)| PerfError::Other(format!("post_send: {e}")))
        })?;
        if let Some(j) = repost.take() {
            post_recvs(rig, qp, std::iter::once((j, recv_sge(j))))?;
        }
        // Wait for the answer: a receive (ping-pong) or the completion.
        let t1 = loop {
            let n = rig.dev.poll_cq_wait(rig.cq, &mut wcs, CLIENT_WAIT_MAX)?;
            let mut got = None;
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    return Err(wc_error(wc));
                }
                let is_recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
                if pingpong == is_recv {
                    got = Some(now_ns());
                }
            }
            if let Some(t) = got {
                break t;
            }
            if now_ns().saturating_sub(t0) > STALL_NS {
                return Err(PerfError::Other("no answer for 30 s".into()));
            }
        };
        if pingpong {
            repost = Some(k + PP_RECVS);
        }
        let rtt = t1 - t0;
        samples.push(if pingpong { rtt / 2 } else { rtt });
        k += 1;
    }
    let elapsed = now_ns() - start;
    Ok((
        Figures::Lat(LatFigures::from_samples(p.size, samples, elapsed)),
        k,
    ))
}
