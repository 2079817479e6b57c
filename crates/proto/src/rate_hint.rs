//! The receiver's rate hint: this device's line rate shared among the peers
//! that sent it data recently.
//!
//! Every ACK carries the share (Mbit/s) the receiver can give each active
//! sender. Senders are counted per epoch (`rate_hint_epoch_ns`); the hint
//! uses the larger of this epoch's count and the last one's, so the count
//! does not collapse at the start of every epoch. With one sender or none
//! the hint is 0 (none): that sender has the whole link, and ECN alone
//! steers it.

/// Active-sender counts over the current and the previous epoch.
#[derive(Debug)]
pub(crate) struct RateHint {
    epoch_ns: u64,
    line_rate_bps: u64,
    epoch: u64,
    senders_this_epoch: u32,
    senders_last_epoch: u32,
}

impl RateHint {
    /// Counts over epochs of `epoch_ns` for a link of `line_rate_bps`.
    pub(crate) fn new(epoch_ns: u64, line_rate_bps: u64) -> Self {
        Self {
            epoch_ns,
            line_rate_bps,
            epoch: 0,
            senders_this_epoch: 0,
            senders_last_epoch: 0,
        }
    }

    /// Count a connection that sent us data at `now_ns`, once per epoch;
    /// `conn_epoch` is where the connection remembers the last epoch it
    /// was counted in.
    pub(crate) fn note_sender(&mut self, conn_epoch: &mut u64, now_ns: u64) {
        let epoch = now_ns / self.epoch_ns.max(1);
        if epoch != self.epoch {
            self.senders_last_epoch = if epoch == self.epoch + 1 {
                self.senders_this_epoch
            } else {
                0
            };
            self.senders_this_epoch = 0;
            self.epoch = epoch;
        }
        if *conn_epoch != epoch {
            *conn_epoch = epoch;
            self.senders_this_epoch += 1;
        }
    }

    /// This receiver's share for each active sender, Mbit/s; 0 (no hint)
    /// while a single sender has the whole link.
    pub(crate) fn share_mbps(&self) -> u32 {
        let active = self.senders_this_epoch.max(self.senders_last_epoch);
        if active <= 1 {
            return 0;
        }
        (self.line_rate_bps / u64::from(active) / 1_000_000).min(u64::from(u32::MAX)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sender_gets_no_hint_and_two_share_the_link() {
        let mut hint = RateHint::new(1_000, 100_000_000_000);
        let (mut a, mut b) = (u64::MAX, u64::MAX);
        hint.note_sender(&mut a, 10);
        hint.note_sender(&mut a, 20);
        assert_eq!(hint.share_mbps(), 0, "one sender, counted once");
        hint.note_sender(&mut b, 30);
        assert_eq!(hint.share_mbps(), 50_000);
        // The next epoch still remembers both; two epochs later, neither.
        hint.note_sender(&mut a, 1_500);
        assert_eq!(hint.share_mbps(), 50_000);
        hint.note_sender(&mut a, 3_500);
        assert_eq!(hint.share_mbps(), 0);
    }
}
