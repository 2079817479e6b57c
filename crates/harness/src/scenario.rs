//! Ready-made scenarios the `metaroce` command and the benchmarks run.

use crate::rdma::{connect_qps, devices, poll_all};
use crate::{Fate, FaultConfig, LinkConfig, NetConfig, Network, RunOutcome, TapEvent};
use metaroce_verbs::EndpointConfig;
use metaroce_verbs::{AccessFlags, SendWr, WcStatus, WrOp};
use std::cell::Cell;
use std::rc::Rc;

/// Parameters of [`one_write`].
#[derive(Debug, Clone, PartialEq)]
pub struct WriteScenario {
    /// Message size in bytes.
    pub size_bytes: u64,
    /// Uniform loss probability on every datagram (data and ACKs).
    pub loss: f64,
    /// Paths per connection.
    pub paths: usize,
    /// Link rate, bits/s.
    pub rate_bps: u64,
    /// One-way propagation delay.
    pub delay_ns: u64,
    /// Per-route jitter (routes reorder against each other, never within).
    pub jitter_ns: u64,
    /// Seed of every random choice.
    pub seed: u64,
}

impl Default for WriteScenario {
    fn default() -> Self {
        Self {
            size_bytes: 64 << 20,
            loss: 0.0,
            paths: 16,
            rate_bps: 100_000_000_000,
            delay_ns: 2_000,
            jitter_ns: 3_000,
            seed: 1,
        }
    }
}

/// What one WRITE measured.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteReport {
    /// Simulated time from post to completion.
    pub sim_ns: u64,
    /// Payload bits per second of simulated time.
    pub goodput_bps: f64,
    /// Data packets the network dropped.
    pub data_lost: u64,
    /// Data packets the sender resent.
    pub resent: u64,
    /// Data packets sent in all.
    pub data_sent: u64,
    /// Whether the target's bytes equal the source's.
    pub verified: bool,
}

/// Post one WRITE of `size_bytes` between two devices over the harness
/// network and run it to completion; the target bytes are verified.
pub fn one_write(s: &WriteScenario) -> Result<WriteReport, String> {
    let cfg = EndpointConfig {
        paths_per_connection: s.paths,
        line_rate_bps: s.rate_bps,
        ..EndpointConfig::default()
    };
    cfg.validate().map_err(|e| e.to_string())?;
    let link = LinkConfig {
        rate_bps: s.rate_bps,
        delay_ns: s.delay_ns,
        jitter_ns: s.jitter_ns,
        ..LinkConfig::default()
    };
    let faults = FaultConfig {
        loss: s.loss,
        ..FaultConfig::default()
    };
    let mut net = Network::new(
        NetConfig::seeded(s.seed)
            .with_link(link)
            .with_faults(faults),
        devices(2, &cfg, s.seed),
    );
    let access = AccessFlags(0xf);
    let (a, b) = connect_qps(&mut net, 0, 1, access);
    let src = net.nodes[0]
        .ctx
        .reg_mr(a.pd, s.size_bytes, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let dst = net.nodes[1]
        .ctx
        .reg_mr(b.pd, s.size_bytes, access)
        .map_err(|e| e.to_string())?;
    let mut x = s.seed | 1;
    for byte in net.nodes[0].ctx.mr_bytes_mut(&src) {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *byte = (x >> 56) as u8;
    }
    let lost = Rc::new(Cell::new(0u64));
    let l = lost.clone();
    net.set_tap(Box::new(move |e: &TapEvent<'_>| {
        if matches!(e.fate, Fate::Dropped(_)) && e.payload.get(1) == Some(&1) {
            l.set(l.get() + 1);
        }
    }));
    let len = u32::try_from(s.size_bytes).map_err(|_| "size must be below 4 GiB".to_string())?;
    let wr = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        },
        vec![src.sge(0, len)],
    );
    net.nodes[0]
        .ctx
        .post_send_at(0, a.qp, &[wr])
        .map_err(|(_, e)| e.to_string())?;
    let mut status = None;
    let out = net.run_until(u64::MAX / 2, |n| {
        if let Some(wc) = poll_all(&mut n[0].ctx, a.cq).first() {
            status = Some(wc.status);
        }
        status.is_some()
    });
    let RunOutcome::Done { now_ns } = out else {
        return Err(format!("run ended {out:?} (seed {})", s.seed));
    };
    if status != Some(WcStatus::Success) {
        return Err(format!("write completed with {status:?} (seed {})", s.seed));
    }
    let stats = net.nodes[0].ctx.stats();
    Ok(WriteReport {
        sim_ns: now_ns,
        goodput_bps: s.size_bytes as f64 * 8.0 / (now_ns as f64 / 1e9),
        data_lost: lost.get(),
        resent: stats.data_packets_retransmitted,
        data_sent: stats.data_packets_sent,
        verified: net.nodes[0].ctx.mr_bytes(&src) == net.nodes[1].ctx.mr_bytes(&dst),
    })
}
