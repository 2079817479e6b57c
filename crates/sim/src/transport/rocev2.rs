//! RoCEv2 reliable connection as deployed: one path per QP (the UDP source
//! port is fixed per QP, so ECMP pins it), go-back-N on a sequence error,
//! a retransmission timeout, and DCQCN rate control. PFC is a property of
//! the fabric (the scenario's `switch.pfc`), not of the NIC.
//!
//! Sources: IBTA RoCEv2 annex (go-back-N RC semantics, NAK sequence error);
//! Zhu et al., SIGCOMM 2015 (DCQCN); IEEE 802.1Qbb (PFC). See
//! `docs/baselines.md` for every parameter.

use super::dcqcn::DcqcnParams;
use super::rc::{RcConfig, RcFactory, Recovery};

/// RoCEv2 hosts: go-back-N, DCQCN (paper defaults), RTO 1.048 ms
/// (ConnectX `local_ack_timeout` 4.096 µs × 2^8), `qps` QPs per flow.
pub fn factory(mtu: u32, qps: u32, dcqcn: bool) -> RcFactory {
    let mut cfg = RcConfig::new("rocev2", Recovery::GoBackN);
    cfg.mtu = mtu;
    cfg.qps_per_flow = qps.max(1);
    cfg.dcqcn = dcqcn.then(DcqcnParams::default);
    RcFactory { cfg }
}
