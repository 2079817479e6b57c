//! InfiniBand-style transport: the link layer is lossless by credit-based
//! flow control (a port transmits a data packet only when it holds credits
//! for the downstream receive buffer; see `Sim::set_credit_flow_control`),
//! switches route each packet adaptively, and the receiver places packets
//! by PSN whatever their order, so reordering is not mistaken for loss.
//! No ECN-based congestion control (IB CC is usually off in deployments).
//! The timeout (go-back to the first unacknowledged PSN) is the only repair,
//! and with credits it should never fire.

use super::rc::{RcConfig, RcFactory, Recovery};

/// IB-style hosts.
pub fn factory(mtu: u32, qps: u32) -> RcFactory {
    let mut cfg = RcConfig::new("ib", Recovery::OutOfOrder);
    cfg.mtu = mtu;
    cfg.qps_per_flow = qps.max(1);
    RcFactory { cfg }
}
