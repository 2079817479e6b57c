//! IRN (Mittal et al., "Revisiting Network Support for RDMA", SIGCOMM 2018):
//! selective retransmission driven by per-packet NACKs carrying the
//! cumulative and the received PSN (§3.1), in-flight packets capped at one
//! BDP (BDP-FC, §3.2), RTO_low / RTO_high timeouts (§3.1), no PFC, one path
//! per QP. Rate control stays DCQCN, as in the paper's main comparison.

use super::dcqcn::DcqcnParams;
use super::rc::{RcConfig, RcFactory, Recovery};
use crate::PS_PER_US;

/// IRN hosts: selective repeat, BDP cap (computed per host from line rate
/// and base RTT), RTO_high 320 µs, RTO_low 100 µs while at most N = 3
/// packets are outstanding, DCQCN on.
pub fn factory(mtu: u32, qps: u32, dcqcn: bool) -> RcFactory {
    let mut cfg = RcConfig::new("irn", Recovery::Selective);
    cfg.mtu = mtu;
    cfg.qps_per_flow = qps.max(1);
    cfg.dcqcn = dcqcn.then(DcqcnParams::default);
    cfg.window_packets = Some(0);
    cfg.rto_ps = 320 * PS_PER_US;
    cfg.rto_low = Some((100 * PS_PER_US, 3));
    RcFactory { cfg }
}
