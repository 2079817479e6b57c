//! The controller of a connection that has sent nothing yet.
//!
//! Most connections of a large collective only ever receive (a ring rank
//! hears from one neighbour and sends to the other), and every connection
//! starts that way. Until its first message a connection has no paths and
//! nothing for a controller to steer, so it holds this one: no state, no
//! allocation (a boxed zero-sized type allocates nothing), instead of the
//! full controller's few hundred bytes per peer. The connection swaps in
//! the real controller with its send side (`ensure_send_side`).

use super::{AckSample, CcMetrics, CongestionController, PathSlot};

/// No paths, no window: nothing is sent under it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ReceiveOnly;

impl CongestionController for ReceiveOnly {
    fn name(&self) -> &'static str {
        "receive-only"
    }
    fn on_ack(&mut self, _path: PathSlot, _sample: &AckSample) {}
    fn on_loss(&mut self, _path: PathSlot, _lost_bytes: u64, _now_ns: u64) {}
    fn on_rto(&mut self, _path: PathSlot, _now_ns: u64) {}
    fn on_rate_hint(&mut self, _rate_bps: u64, _srtt_ns: u64, _now_ns: u64) {}
    fn on_path_replaced(&mut self, _path: PathSlot, _now_ns: u64) {}
    fn path_window(&self, _path: PathSlot) -> u64 {
        debug_assert!(false, "a receive-only connection has no paths");
        0
    }
    fn connection_window(&self) -> u64 {
        0
    }
    fn metrics(&self) -> CcMetrics {
        CcMetrics::default()
    }
    fn memory_bytes(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_nothing() {
        let cc: Box<dyn CongestionController> = Box::new(ReceiveOnly);
        assert_eq!(size_of::<ReceiveOnly>(), 0);
        assert_eq!(cc.memory_bytes(), 0);
        assert_eq!(cc.connection_window(), 0);
        assert_eq!(cc.metrics(), CcMetrics::default());
    }
}
