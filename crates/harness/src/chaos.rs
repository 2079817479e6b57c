//! Randomized fault simulation: one seed, one reproducible run of random
//! devices, random operations and random faults, with every invariant
//! checked (FoundationDB / TigerBeetle style).
//!
//! A seed picks the number of devices, paths per connection, MTU, link rate
//! and delay, loss, burst loss, duplication, corruption, reordering, jitter
//! and route flaps (blackholes switched on and off), link flaps (a device
//! cut off from the fabric for up to half a millisecond), whether packets
//! are authenticated (and encrypted), the PSN base (so paths wrap), whether
//! and when a device crashes and restarts (a new incarnation: no QPs, no
//! memory, a new session id), and for each QP a list of operations of
//! every kind. The run must then satisfy:
//! - every posted work request completes exactly once, in posting order,
//!   successfully (the network faults are all survivable); toward a device
//!   that restarted, successes first, then retry-exceeded / flushed errors,
//!   never a hang, and after closing its QPs the application reconnects to
//!   the new incarnation and a verified WRITE goes through;
//! - every receive completes exactly once, in order, with the right length
//!   and immediate;
//! - the bytes at every target equal the bytes sent (WRITE, SEND, READ);
//! - atomics applied exactly once: sorted by the original value each
//!   returned, fetch-adds form one unbroken chain from the initial value to
//!   the final counter, and every compare-and-swap succeeded once;
//! - no panic, no livelock (bounded virtual time and event count);
//! - state returns to zero: no message is left on any connection, and once
//!   every QP is destroyed no endpoint holds any connection.
//!
//! To study a failing seed: `metaroce chaos --start <seed> --seeds 1 --log
//! metaroce_harness=debug` logs each stream's plan, its completions, the
//! network config and every device's counters as `tracing` events (target
//! `metaroce_harness`; add `metaroce_proto=debug` for the core's own), to
//! stderr; any program running [`run_seed`] sees them through its own
//! subscriber.

use crate::rdma::{QpEnd, RdmaNode, connect_qps, devices, node_ip, poll_all};
use crate::{Action, FaultConfig, LinkConfig, NetConfig, Network, RunOutcome};
use metaroce_verbs::{
    AccessFlags, AuthConfig, EndpointConfig, MemoryRegion, RecvWr, SendWr, WcOpcode, WcStatus,
    WorkCompletion, WrOp,
};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// What one seed ran and measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ChaosReport {
    /// The seed.
    pub seed: u64,
    /// Devices.
    pub nodes: usize,
    /// Paths per connection.
    pub paths: usize,
    /// Work requests posted (sends, not receives).
    pub ops: usize,
    /// Payload bytes moved by the operations.
    pub bytes: u64,
    /// Simulated time to finish, ns.
    pub sim_ns: u64,
    /// Uniform loss probability used.
    pub loss: f64,
    /// Datagrams the network dropped, duplicated, corrupted.
    pub dropped: u64,
    /// Datagrams duplicated by the network.
    pub duplicated: u64,
    /// Datagrams corrupted by the network.
    pub corrupted: u64,
    /// Data packets resent by all devices.
    pub retransmitted: u64,
    /// Malformed datagrams dropped by all devices (corruption caught by the ICRC).
    pub malformed: u64,
    /// Whether packets were authenticated (and, if so, whether encrypted).
    pub auth: Option<bool>,
    /// Datagrams dropped by the authentication checks of all devices (bad
    /// tag: corruption; replayed: the network's duplicates).
    pub auth_rejected: u64,
    /// Link flaps: times a device was cut off from the fabric and came back.
    pub link_flaps: usize,
    /// The device that crashed and came back (a new incarnation), and when.
    pub restart: Option<(usize, u64)>,
}

/// An invariant broke; the message names it. Rerun with the same seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChaosFailure {
    /// The seed that fails.
    pub seed: u64,
    /// What broke.
    pub what: String,
}

impl core::fmt::Display for ChaosFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "seed {} failed: {} (rerun: METAROCE_SEED={})",
            self.seed, self.what, self.seed
        )
    }
}

/// One planned operation and what it must leave behind.
#[derive(Debug, Clone)]
enum Planned {
    Write {
        src_off: u64,
        dst_off: u64,
        len: u32,
        imm: Option<u32>,
    },
    Send {
        src_off: u64,
        recv_off: u64,
        len: u32,
        imm: Option<u32>,
    },
    Read {
        remote_off: u64,
        local_off: u64,
        len: u32,
    },
    FetchAdd {
        add: u64,
        sink_off: u64,
    },
    CmpSwap {
        word_off: u64,
        swap: u64,
        sink_off: u64,
    },
}

/// Per directed QP: the requester end, the responder end and their memory.
struct Stream {
    req: QpEnd,
    resp: QpEnd,
    src: MemoryRegion,  // requester: data to send; also READ/atomic sinks
    dst: MemoryRegion,  // responder: WRITE targets, receive buffers, READ source, atomic words
    plan: Vec<Planned>, // in posting order
    done_send: Vec<WorkCompletion>,
    done_recv: Vec<WorkCompletion>,
    recvs: usize,
}

const SRC_BYTES: u64 = 1 << 20;
const COUNTER_OFF: u64 = 0;
const CAS_BASE: u64 = 64;
const DATA_BASE: u64 = 4096;

fn pick(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    rng.next_u64() % n.max(1)
}

fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
}

fn uniform(rng: &mut ChaCha8Rng, max: f64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * max
}

/// Run one seed.
pub fn run_seed(seed: u64) -> Result<ChaosReport, ChaosFailure> {
    let fail = |what: String| ChaosFailure { seed, what };
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d65_7461_726f_6365);
    let nodes = 2 + pick(&mut rng, 3) as usize;
    let paths = [1, 2, 4, 8, 16][pick(&mut rng, 5) as usize];
    let mtu = [256u32, 1024, 4096][pick(&mut rng, 3) as usize];
    let mut cfg = EndpointConfig {
        paths_per_connection: paths,
        mtu_payload_bytes: mtu,
        psn_base: rng.next_u64() as u32,
        ..EndpointConfig::default()
    };
    // Choices added later draw from their own stream, so that every seed
    // keeps the devices, operations and faults it had before them.
    let mut extra = ChaCha8Rng::seed_from_u64(seed ^ 0x6c69_6e6b_2d66_6c61);
    let auth = chance(&mut extra, 0.25).then(|| chance(&mut extra, 0.5));
    if let Some(encrypt) = auth {
        let mut job_secret = [0u8; 32];
        extra.fill_bytes(&mut job_secret);
        cfg.auth = Some(AuthConfig {
            job_secret,
            encrypt,
            // Each node gets its own address (`RdmaNode::new`).
            local_ip: node_ip(0),
        });
    }
    let link = LinkConfig {
        rate_bps: [10_000_000_000, 100_000_000_000, 400_000_000_000][pick(&mut rng, 3) as usize],
        delay_ns: 500 + pick(&mut rng, 4_500),
        jitter_ns: pick(&mut rng, 5_000),
        jitter_period_ns: 5_000 + pick(&mut rng, 50_000),
        ..LinkConfig::default()
    };
    let faults = FaultConfig {
        loss: uniform(&mut rng, 0.08),
        burst_enter: if chance(&mut rng, 0.3) {
            uniform(&mut rng, 0.01)
        } else {
            0.0
        },
        duplicate: uniform(&mut rng, 0.05),
        corrupt: uniform(&mut rng, 0.02),
        reorder: uniform(&mut rng, 0.02),
        ..FaultConfig::default()
    };
    let loss = faults.loss;
    let net_cfg = NetConfig::seeded(seed)
        .with_link(link)
        .with_faults(faults)
        .with_max_events(20_000_000);
    let mut net = Network::new(net_cfg, devices(nodes, &cfg, seed));
    // Route flaps: a few routes go dark for a while and come back.
    for _ in 0..pick(&mut rng, 3) {
        let route = pick(&mut rng, 16) as usize;
        let start = pick(&mut rng, 2_000_000);
        net.at(start, Action::Blackhole { route, on: true });
        net.at(
            start + 50_000 + pick(&mut rng, 1_000_000),
            Action::Blackhole { route, on: false },
        );
    }

    // Link flaps: a device loses its link (every path to and from it at
    // once) and gets it back within the retry budget, so the work survives.
    let link_flaps = pick(&mut extra, 3) as usize;
    for _ in 0..link_flaps {
        let node = pick(&mut extra, nodes as u64) as usize;
        let start = pick(&mut extra, 2_000_000);
        net.at(start, Action::LinkDown { node, on: true });
        net.at(
            start + 10_000 + pick(&mut extra, 500_000),
            Action::LinkDown { node, on: false },
        );
    }

    // Streams: random directed pairs, each its own QP pair.
    let access = AccessFlags(0xf);
    let mut streams = Vec::new();
    for _ in 0..(1 + pick(&mut rng, 4)) {
        let a = pick(&mut rng, nodes as u64) as usize;
        let b = (a + 1 + pick(&mut rng, nodes as u64 - 1) as usize) % nodes;
        let (req, resp) = connect_qps(&mut net, a, b, access);
        let src = net.nodes[a]
            .ctx
            .reg_mr(req.pd, SRC_BYTES, AccessFlags::LOCAL_WRITE)
            .map_err(|e| fail(e.to_string()))?;
        let dst = net.nodes[b]
            .ctx
            .reg_mr(resp.pd, 4 * SRC_BYTES, access)
            .map_err(|e| fail(e.to_string()))?;
        let mut x = rng.next_u64() | 1;
        for byte in net.nodes[a].ctx.mr_bytes_mut(&src) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *byte = x as u8;
        }
        // The READ source half of dst gets its own pattern.
        for (i, byte) in net.nodes[b].ctx.mr_bytes_mut(&dst)[(2 * SRC_BYTES) as usize..]
            .iter_mut()
            .enumerate()
        {
            *byte = (i as u64).wrapping_mul(x | 1).rotate_left(17) as u8;
        }
        streams.push(Stream {
            req,
            resp,
            src,
            dst,
            plan: Vec::new(),
            done_send: Vec::new(),
            done_recv: Vec::new(),
            recvs: 0,
        });
    }

    // Plan and post.
    let mut total_ops = 0;
    let mut total_bytes = 0u64;
    for s in &mut streams {
        let n = 1 + pick(&mut rng, 24) as usize;
        let mut dst_cursor = DATA_BASE;
        let mut sink_cursor = SRC_BYTES / 2;
        let mut cas_words = 0u64;
        let mut wrs = Vec::new();
        let mut recvs = Vec::new();
        for i in 0..n {
            let big = chance(&mut rng, 0.1);
            let len = if big {
                pick(&mut rng, 256 << 10)
            } else {
                pick(&mut rng, 16 << 10)
            } as u32;
            let src_off = pick(&mut rng, SRC_BYTES / 2 - u64::from(len));
            let imm = chance(&mut rng, 0.5).then(|| rng.next_u64() as u32);
            let kind = pick(&mut rng, 6);
            let planned = match kind {
                0 | 1 if dst_cursor + u64::from(len) < 2 * SRC_BYTES => {
                    let p = Planned::Write {
                        src_off,
                        dst_off: dst_cursor,
                        len,
                        imm: imm.filter(|_| kind == 1),
                    };
                    dst_cursor += u64::from(len);
                    p
                }
                2 if dst_cursor + u64::from(len) < 2 * SRC_BYTES => {
                    let p = Planned::Send {
                        src_off,
                        recv_off: dst_cursor,
                        len,
                        imm,
                    };
                    dst_cursor += u64::from(len);
                    p
                }
                3 if sink_cursor + u64::from(len) < SRC_BYTES => {
                    let p = Planned::Read {
                        remote_off: 2 * SRC_BYTES + pick(&mut rng, SRC_BYTES - u64::from(len)),
                        local_off: sink_cursor,
                        len,
                    };
                    sink_cursor += u64::from(len);
                    p
                }
                4 if sink_cursor + 8 < SRC_BYTES => {
                    let p = Planned::FetchAdd {
                        add: 1 + pick(&mut rng, 1000),
                        sink_off: sink_cursor,
                    };
                    sink_cursor += 8;
                    p
                }
                5 if sink_cursor + 8 < SRC_BYTES && cas_words < 500 => {
                    let p = Planned::CmpSwap {
                        word_off: CAS_BASE + 8 * cas_words,
                        swap: rng.next_u64() | 1,
                        sink_off: sink_cursor,
                    };
                    cas_words += 1;
                    sink_cursor += 8;
                    p
                }
                // Out of room for the chosen kind: a zero-length WRITE (an edge case too).
                _ => Planned::Write {
                    src_off: 0,
                    dst_off: DATA_BASE,
                    len: 0,
                    imm: None,
                },
            };
            let (src, dst) = (&s.src, &s.dst);
            let wr = match &planned {
                Planned::Write {
                    src_off,
                    dst_off,
                    len,
                    imm,
                } => {
                    let remote_addr = dst.addr + dst_off;
                    let op = match imm {
                        Some(imm) => WrOp::WriteImm {
                            remote_addr,
                            rkey: dst.rkey,
                            imm: *imm,
                        },
                        None => WrOp::Write {
                            remote_addr,
                            rkey: dst.rkey,
                        },
                    };
                    if imm.is_some() {
                        recvs.push(RecvWr {
                            wr_id: i as u64,
                            sg_list: vec![],
                        });
                    }
                    SendWr::new(i as u64, op, vec![src.sge(*src_off, *len)])
                }
                Planned::Send {
                    src_off,
                    recv_off,
                    len,
                    imm,
                } => {
                    recvs.push(RecvWr {
                        wr_id: i as u64,
                        sg_list: vec![dst.sge(*recv_off, *len)],
                    });
                    let op = imm.map_or(WrOp::Send, |imm| WrOp::SendImm { imm });
                    SendWr::new(i as u64, op, vec![src.sge(*src_off, *len)])
                }
                Planned::Read {
                    remote_off,
                    local_off,
                    len,
                } => SendWr::new(
                    i as u64,
                    WrOp::Read {
                        remote_addr: dst.addr + remote_off,
                        rkey: dst.rkey,
                    },
                    vec![src.sge(*local_off, *len)],
                ),
                Planned::FetchAdd { add, sink_off } => SendWr::new(
                    i as u64,
                    WrOp::FetchAdd {
                        remote_addr: dst.addr + COUNTER_OFF,
                        rkey: dst.rkey,
                        add: *add,
                    },
                    vec![src.sge(*sink_off, 8)],
                ),
                Planned::CmpSwap {
                    word_off,
                    swap,
                    sink_off,
                } => SendWr::new(
                    i as u64,
                    WrOp::CmpSwap {
                        remote_addr: dst.addr + word_off,
                        rkey: dst.rkey,
                        compare: 0,
                        swap: *swap,
                    },
                    vec![src.sge(*sink_off, 8)],
                ),
            };
            total_bytes += u64::from(wr.sg_list.iter().map(|g| g.length).sum::<u32>());
            s.plan.push(planned);
            wrs.push(wr);
        }
        // Post receives late for some streams, so RNR happens too.
        let late_recvs = chance(&mut rng, 0.3);
        if !late_recvs {
            net.nodes[s.resp.node]
                .ctx
                .post_recv(s.resp.qp, &recvs)
                .map_err(|e| fail(format!("post_recv: {e:?}")))?;
        }
        s.recvs = recvs.len();
        // Stamped 0 whatever the clock says, as every stream always was:
        // the outcome of each seed depends on it (the stamp is where the
        // connection's retry timer starts when it was idle).
        net.nodes[s.req.node]
            .ctx
            .post_send_at(0, s.req.qp, &wrs)
            .map_err(|e| fail(format!("post_send: {e:?}")))?;
        if late_recvs {
            net.run_for(20_000 + pick(&mut rng, 100_000));
            net.nodes[s.resp.node]
                .ctx
                .post_recv(s.resp.qp, &recvs)
                .map_err(|e| fail(format!("post_recv: {e:?}")))?;
        }
        total_ops += n;
    }

    // Peer restart: a device crashes at a random moment and comes back as
    // a new incarnation (no QPs, no memory, a new session id). Work toward
    // it must end, each request exactly once and in order, in success or an
    // error completion, never hang; what it had posted itself died with it.
    // Drawn from its own stream: seeds without a restart are unchanged.
    let mut restart_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7265_7374_6172_7473);
    let restart = chance(&mut restart_rng, 0.15).then(|| {
        (
            pick(&mut restart_rng, nodes as u64) as usize,
            pick(&mut restart_rng, 1_000_000),
        )
    });
    if let Some((r, at_ns)) = restart {
        net.run_for(at_ns);
        let mut reborn = cfg.clone();
        reborn.seed = restart_rng.next_u64();
        net.nodes[r].restart(reborn);
    }
    let dead = |node: usize| restart.is_some_and(|(r, _)| r == node);

    // Run until every completion is in.
    let deadline = 20_000_000_000;
    let outcome = net.run_until(deadline, |nodes| {
        let mut all = true;
        for s in streams.iter_mut() {
            if dead(s.req.node) {
                continue; // its requester's state died with it
            }
            s.done_send
                .extend(poll_all(&mut nodes[s.req.node].ctx, s.req.cq));
            if !dead(s.resp.node) {
                s.done_recv
                    .extend(poll_all(&mut nodes[s.resp.node].ctx, s.resp.cq));
            }
            all &= s.done_send.len() >= s.plan.len()
                && (dead(s.resp.node) || s.done_recv.len() >= s.recvs);
        }
        all
    });
    // What a failing seed did, for `--log metaroce_harness=debug`: each
    // stream's plan and completions, the network, every device's counters.
    // Nothing is formatted unless a subscriber wants it.
    for (k, s) in streams.iter().enumerate() {
        tracing::debug!(
            target: "metaroce_harness",
            stream = k,
            from = s.req.node,
            to = s.resp.node,
            plan = ?s.plan,
            sends = ?s.done_send.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            recvs = ?s.done_recv.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect::<Vec<_>>(),
            "chaos stream",
        );
    }
    tracing::debug!(
        target: "metaroce_harness",
        nodes,
        paths,
        mtu,
        net = ?net.config(),
        "chaos network",
    );
    for (i, n) in net.nodes.iter().enumerate() {
        tracing::debug!(target: "metaroce_harness", node = i, stats = ?n.ctx.stats(), "chaos node counters");
    }
    if !matches!(outcome, RunOutcome::Done { .. }) {
        let got: Vec<_> = streams
            .iter()
            .map(|s| (s.done_send.len(), s.plan.len(), s.done_recv.len(), s.recvs))
            .collect();
        return Err(fail(format!(
            "run ended {outcome:?} before all completions (done/posted per stream {got:?})"
        )));
    }
    let sim_ns = net.now_ns();
    // Let trailing ACKs land, then everything must be back to zero.
    net.run_for(5_000_000);

    for (k, s) in streams.iter().enumerate() {
        if dead(s.req.node) {
            continue;
        }
        if dead(s.resp.node) {
            check_cut_stream(k, s).map_err(fail)?;
        } else {
            check_stream(&net, k, s).map_err(fail)?;
        }
    }
    for (i, node) in net.nodes.iter().enumerate() {
        for (j, peer) in net.nodes.iter().enumerate() {
            // Toward a crashed peer, responses may still be retrying (their
            // requester is gone); closing the QPs below cancels them.
            if dead(j) {
                continue;
            }
            if let Some(n) = node.ctx.endpoint().outstanding_messages(peer.addr())
                && n != 0
            {
                return Err(fail(format!(
                    "node {i} still holds {n} messages toward node {j}"
                )));
            }
        }
    }
    // Closing: every QP destroyed, every endpoint must hold no connection.
    for s in &streams {
        for end in [&s.req, &s.resp] {
            if !dead(end.node) {
                net.nodes[end.node]
                    .ctx
                    .destroy_qp(end.qp)
                    .map_err(|e| fail(format!("destroy_qp: {e}")))?;
            }
        }
    }
    for (i, node) in net.nodes.iter().enumerate() {
        let left = node.ctx.endpoint().connection_count();
        if left != 0 {
            return Err(fail(format!(
                "node {i} keeps {left} connections after every QP closed"
            )));
        }
    }
    // After a restart the application reconnects: a fresh QP pair to the new
    // incarnation carries a verified WRITE.
    if let Some((r, _)) = restart {
        recover_after_restart(&mut net, (r + 1) % nodes, r, &mut restart_rng).map_err(fail)?;
    }
    let stats = net.stats();
    Ok(ChaosReport {
        seed,
        nodes,
        paths,
        ops: total_ops,
        bytes: total_bytes,
        sim_ns,
        loss,
        dropped: stats.dropped_total(),
        duplicated: stats.duplicated,
        corrupted: stats.corrupted,
        retransmitted: net
            .nodes
            .iter()
            .map(|n| n.ctx.stats().data_packets_retransmitted)
            .sum(),
        malformed: net.nodes.iter().map(|n| n.ctx.stats().rx_malformed).sum(),
        auth,
        auth_rejected: net
            .nodes
            .iter()
            .map(|n| n.ctx.stats().rx_auth_failed + n.ctx.stats().rx_replayed)
            .sum(),
        link_flaps,
        restart,
    })
}

/// The requests of a stream whose responder crashed: each completed exactly
/// once, in posting order; successes first, and once one failed every later
/// one failed too (retry exceeded, then flushed).
fn check_cut_stream(k: usize, s: &Stream) -> Result<(), String> {
    if s.done_send.len() != s.plan.len() {
        return Err(format!(
            "stream {k} (responder restarted): {} send completions for {} requests",
            s.done_send.len(),
            s.plan.len()
        ));
    }
    let mut failed = false;
    for (i, wc) in s.done_send.iter().enumerate() {
        let ok = wc.status == WcStatus::Success;
        let allowed_failure = matches!(wc.status, WcStatus::RetryExcErr | WcStatus::WrFlushErr);
        if wc.wr_id != i as u64 || (failed && ok) || !(ok || allowed_failure) {
            return Err(format!(
                "stream {k} (responder restarted): send completion {i} is {wc:?}"
            ));
        }
        failed |= !ok;
    }
    Ok(())
}

/// Connect node `a` to the restarted node `r` afresh and move a verified
/// 64 KiB WRITE; then close both ends, back to zero connections.
fn recover_after_restart(
    net: &mut Network<RdmaNode>,
    a: usize,
    r: usize,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    const LEN: u64 = 64 << 10;
    let access = AccessFlags(0xf);
    let (req, resp) = connect_qps(net, a, r, access);
    let src = net.nodes[a]
        .ctx
        .reg_mr(req.pd, LEN, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let dst = net.nodes[r]
        .ctx
        .reg_mr(resp.pd, LEN, access)
        .map_err(|e| e.to_string())?;
    rng.fill_bytes(net.nodes[a].ctx.mr_bytes_mut(&src));
    let wr = SendWr::new(
        7,
        WrOp::Write {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        },
        vec![src.sge(0, LEN as u32)],
    );
    let now = net.now_ns();
    net.nodes[a]
        .ctx
        .post_send_at(now, req.qp, &[wr])
        .map_err(|e| format!("post_send after restart: {e:?}"))?;
    let mut done = Vec::new();
    let until = net.now_ns() + 5_000_000_000;
    let outcome = net.run_until(until, |nodes| {
        done.extend(poll_all(&mut nodes[a].ctx, req.cq));
        !done.is_empty()
    });
    if done.len() != 1 || done[0].status != WcStatus::Success {
        return Err(format!(
            "WRITE to the restarted node {r} from node {a}: {outcome:?}, {done:?}"
        ));
    }
    if net.nodes[a].ctx.mr_bytes(&src) != net.nodes[r].ctx.mr_bytes(&dst) {
        return Err(format!("WRITE to the restarted node {r}: bytes differ"));
    }
    for end in [req, resp] {
        net.nodes[end.node]
            .ctx
            .destroy_qp(end.qp)
            .map_err(|e| e.to_string())?;
        let left = net.nodes[end.node].ctx.endpoint().connection_count();
        if left != 0 {
            return Err(format!(
                "node {} keeps {left} connections after the reconnection closed",
                end.node
            ));
        }
    }
    Ok(())
}

fn check_stream(net: &Network<RdmaNode>, k: usize, s: &Stream) -> Result<(), String> {
    let req = &net.nodes[s.req.node].ctx;
    let resp = &net.nodes[s.resp.node].ctx;
    if s.done_send.len() != s.plan.len() {
        return Err(format!(
            "stream {k}: {} send completions for {} requests",
            s.done_send.len(),
            s.plan.len()
        ));
    }
    for (i, wc) in s.done_send.iter().enumerate() {
        if wc.wr_id != i as u64 || wc.status != WcStatus::Success {
            return Err(format!("stream {k}: send completion {i} is {wc:?}"));
        }
    }
    if s.done_recv.len() != s.recvs {
        return Err(format!(
            "stream {k}: {} receive completions for {} receives",
            s.done_recv.len(),
            s.recvs
        ));
    }
    let src = req.mr_bytes(&s.src);
    let dst = resp.mr_bytes(&s.dst);
    let mut recvs = s.done_recv.iter();
    let mut chain: Vec<(u64, u64)> = Vec::new();
    // The `len` bytes at `a` in one region equal those at `b` in the other.
    let same = |x: &[u8], a: u64, y: &[u8], b: u64, len: u32| {
        x[a as usize..(a + u64::from(len)) as usize] == y[b as usize..(b + u64::from(len)) as usize]
    };
    for (i, op) in s.plan.iter().enumerate() {
        let bad = |what: &str| format!("stream {k} op {i} {op:?}: {what}");
        // The next receive completion must be this message's, with these fields.
        let mut next_recv = |opcode: WcOpcode, len: u32, imm: Option<u32>| -> Result<(), String> {
            let r = recvs.next().ok_or_else(|| bad("no receive completion"))?;
            let want = (i as u64, WcStatus::Success, opcode, len, imm);
            if (r.wr_id, r.status, r.opcode, r.byte_len, r.imm_data) != want {
                return Err(bad(&format!("receive completion {r:?}")));
            }
            Ok(())
        };
        match *op {
            Planned::Write {
                src_off,
                dst_off,
                len,
                imm,
            } => {
                if !same(src, src_off, dst, dst_off, len) {
                    return Err(bad("target bytes differ"));
                }
                if let Some(imm) = imm {
                    next_recv(WcOpcode::RecvRdmaWithImm, len, Some(imm))?;
                }
            }
            Planned::Send {
                src_off,
                recv_off,
                len,
                imm,
            } => {
                if !same(src, src_off, dst, recv_off, len) {
                    return Err(bad("received bytes differ"));
                }
                next_recv(WcOpcode::Recv, len, imm)?;
            }
            Planned::Read {
                remote_off,
                local_off,
                len,
            } => {
                if !same(src, local_off, dst, remote_off, len) {
                    return Err(bad("read bytes differ"));
                }
            }
            Planned::FetchAdd { add, sink_off } => {
                let orig = u64::from_le_bytes(
                    src[sink_off as usize..sink_off as usize + 8]
                        .try_into()
                        .expect("8 bytes"),
                );
                chain.push((orig, add));
            }
            Planned::CmpSwap {
                word_off,
                swap,
                sink_off,
            } => {
                let orig = u64::from_le_bytes(
                    src[sink_off as usize..sink_off as usize + 8]
                        .try_into()
                        .expect("8 bytes"),
                );
                let now = u64::from_le_bytes(
                    dst[word_off as usize..word_off as usize + 8]
                        .try_into()
                        .expect("8 bytes"),
                );
                if orig != 0 || now != swap {
                    return Err(bad(&format!(
                        "compare-and-swap returned {orig}, word now {now}"
                    )));
                }
            }
        }
    }
    // Exactly-once fetch-adds: sorted by original, each continues the last.
    chain.sort_unstable();
    let mut expect = 0u64;
    for (orig, add) in &chain {
        if *orig != expect {
            return Err(format!(
                "stream {k}: fetch-add chain broken: expected original {expect}, got {orig}"
            ));
        }
        expect += add;
    }
    let counter = u64::from_le_bytes(dst[..8].try_into().expect("8 bytes"));
    if counter != expect {
        return Err(format!("stream {k}: counter {counter}, expected {expect}"));
    }
    Ok(())
}
