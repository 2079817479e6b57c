//! The device-wide state every connection works on: the configuration,
//! registered memory, the QP table, the completion queue the driver
//! drains, counters, the seeded random stream and the receiver's admission (the
//! grants its ACKs carry).
//!
//! The endpoint owns it and lends it to one connection at a time, with each
//! packet, timer or post that connection handles; connections own
//! everything that is theirs alone (paths, messages, timers).

use crate::admission::Admission;
use crate::config::EndpointConfig;
use crate::memory::RegionTable;
use crate::path_skew::PathSkew;
use crate::probe_budget::ProbeBudget;
use crate::qp::{Qp, QpTable};
use crate::reorder::ReorderWindow;
use crate::seeded_rng::SeededRng;
use crate::stats::EndpointStats;
use crate::work::Completion;
use std::collections::VecDeque;

/// State one device's connections share.
#[derive(Debug)]
pub(crate) struct DeviceState {
    pub(crate) config: EndpointConfig,
    pub(crate) regions: RegionTable,
    pub(crate) qps: QpTable,
    /// Completions in the order they happened, until the driver polls them.
    pub(crate) completions: VecDeque<Completion>,
    pub(crate) stats: EndpointStats,
    /// Keys, initial PSNs and replacement ports come from here.
    pub(crate) rng: SeededRng,
    /// How this device shares its link among the peers sending to it.
    pub(crate) admission: Admission,
    /// What this device may spend on speculative packets.
    pub(crate) probe_budget: ProbeBudget,
    /// How long a SACK gap waits before it is a loss (reordering fabrics).
    pub(crate) reorder: ReorderWindow,
    /// How much later than other paths' a live path's packets may come
    /// before cross-path RACK suspects it (routes with unequal queues).
    pub(crate) path_skew: PathSkew,
    /// The data packets' loss rate, which sizes repair packets.
    pub(crate) loss_rate: crate::repair::LossRate,
    /// The repair codes built lately.
    pub(crate) repair_codes: crate::repair::Codes,
    /// The longest round trip measured lately: the least RTO of a path
    /// that has measured none.
    pub(crate) rtt_ceiling: crate::rtt_ceiling::RttCeiling,
}

/// Past this loss rate (one packet in a thousand, as the device measures
/// it), a fresh path's RTO is the floor again: see
/// [`DeviceState::unsampled_rto_ns`].
const CEILING_LOSS_RATE_MAX: f64 = 0.001;

impl DeviceState {
    /// Fresh state for a (validated) configuration.
    pub(crate) fn new(config: EndpointConfig) -> Self {
        Self {
            regions: RegionTable::new(config.max_memory_regions)
                .with_max_bytes(config.max_registered_bytes),
            qps: QpTable::default(),
            completions: VecDeque::new(),
            stats: EndpointStats::default(),
            rng: SeededRng::new(config.seed),
            admission: Admission::new(
                config.rate_hint_epoch_ns,
                config.line_rate_bps,
                config.grant_utilisation,
                config.base_rtt_ns,
                u64::from(config.mtu_payload_bytes) + 64,
            )
            .with_sender_mark_bar(config.fabric_mark_bar_permille),
            probe_budget: ProbeBudget::new(
                config.probe_share_permille,
                config.line_rate_bps,
                u64::from(config.mtu_payload_bytes) + 64,
                config.base_rtt_ns,
            ),
            reorder: ReorderWindow::default(),
            path_skew: PathSkew::default(),
            loss_rate: crate::repair::LossRate::default(),
            repair_codes: crate::repair::Codes::default(),
            rtt_ceiling: Default::default(),
            config,
        }
    }

    /// Fates of this device's packets (`delivered`, `lost`): they move the
    /// loss rate, which admission's grants leave room for (the resends).
    pub(crate) fn on_fates(&mut self, now_ns: u64, delivered: u32, lost: u64) {
        self.loss_rate.on_fates(now_ns, delivered, lost);
        self.admission.set_loss_rate(self.loss_rate.rate());
    }

    /// Whether a silence is evidence of a failure: the fabric loses less
    /// than `RANDOM_LOSS_FOR_BURSTS` at random. Above it a probe or its
    /// answer goes missing on a live route often enough that an
    /// unanswered one proves little, and the rules that act on one
    /// (`replacement_ports` bursts, retiring a path on a settled probe or
    /// on cross-path RACK while unproven, keeping heard paths on a
    /// condemned ACK port) stand back.
    pub(crate) fn silence_is_evidence(&self) -> bool {
        self.loss_rate.rate() < crate::replacement_ports::RANDOM_LOSS_FOR_BURSTS
    }

    /// Whether the device loses packets often enough that a silence is
    /// more likely a loss than a queue, so that guesses (`probe_budget`)
    /// may go unmetered while losses are seen: at least
    /// `GUESS_LOSS_RATE` of its packets.
    pub(crate) fn guesses_pay(&self) -> bool {
        self.loss_rate.rate() >= crate::probe_budget::GUESS_LOSS_RATE
    }

    /// The least RTO of a path that has no RTT sample of its own: the
    /// longest round trip measured lately, and a quarter (`rtt_ceiling`),
    /// while the fabric loses fewer than `CEILING_LOSS_RATE_MAX` of the
    /// packets; none where it loses more. A queue longer than the RTO
    /// floor times out a fresh path's first packet for nothing; but where
    /// packets are being lost, a fresh path's lost packet would wait the
    /// longer RTO (the 128-host all-to-all at 0.1 %/link: 2-5 % longer
    /// makespans on seeds 1-3 with the ceiling always on).
    pub(crate) fn unsampled_rto_ns(&self) -> u64 {
        if self.loss_rate.rate() < CEILING_LOSS_RATE_MAX {
            self.rtt_ceiling.unsampled_rto_ns()
        } else {
            0
        }
    }

    /// The QP a packet naming local `qpn` on connection `conn` is for; a
    /// miss (not ours, or not bound to that peer) is counted, and the
    /// caller drops the packet.
    pub(crate) fn qp_for_packet(&mut self, qpn: u32, conn: u32) -> Option<&mut Qp> {
        let qp = self.qps.for_packet(qpn, conn);
        if qp.is_none() {
            self.stats.rx_unknown_qp += 1;
        }
        qp
    }

    /// Move a QP to the error state and flush both its queues with
    /// `WrFlushErr` completions (its messages, if any, are the caller's).
    pub(crate) fn flush_qp(&mut self, qp_index: usize) {
        self.qps
            .at_mut(qp_index)
            .expect("live QP")
            .flush(&mut self.completions);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh path borrows the device's RTT ceiling only while the fabric
    /// is not losing packets.
    #[test]
    fn the_ceiling_counts_only_on_a_fabric_that_is_not_losing_packets() {
        let mut dev = DeviceState::new(EndpointConfig::default());
        assert_eq!(dev.unsampled_rto_ns(), 0);
        dev.rtt_ceiling.record(1_000, 120_000);
        dev.on_fates(1_000, 10_000, 0);
        assert_eq!(dev.unsampled_rto_ns(), 150_000);
        // One packet in a hundred lost: the floor again.
        dev.on_fates(2_000, 0, 100);
        assert!(dev.loss_rate.rate() > CEILING_LOSS_RATE_MAX);
        assert_eq!(dev.unsampled_rto_ns(), 0);
    }
}
