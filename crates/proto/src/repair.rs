//! Repair packets: redundancy sent ahead for short messages on a lossy
//! fabric.
//!
//! A lost packet is known lost at the earliest one round trip after it was
//! sent (its ACK is missing while later packets' ACKs arrive), and its
//! resend takes another one-way trip. A message that someone waits on (a
//! collective's step: the next step cannot start before it lands) pays
//! that round trip in full for every loss, whatever detects it: at 1 %
//! loss per link a 16-packet message crossing six links loses a packet 62 %
//! of the time, and a ring all-reduce of 254 such steps runs at a third of
//! its loss-free speed. Only redundancy sent with the message avoids it.
//!
//! So, while the device is seeing losses, a message of at most
//! `repair_max_message_packets` data packets is followed by `k` repair
//! packets ([`metaroce_wire::Flags::REPAIR`]): Reed-Solomon recovery shards
//! over its data packets, one shard per packet (the last one zero-padded).
//! Any `n` of the `n + k` packets rebuild the message at the receiver, which
//! completes it at once; the sender learns of it from the op-ack and drops
//! whatever resends it had queued. `k` is the smallest count for which more
//! than `k` losses among the `n + k` packets is rarer than
//! [`RESIDUAL_LOSS`], at the per-packet loss rate the device measures
//! ([`LossRate`]), and at most `repair_max_packets`.
//!
//! Repair packets are paths' packets like any other (PSN, ACK, window,
//! pacing), but never resent: a lost one is simply lost, and one whose
//! message is gone is acknowledged and forgotten. Long messages get none
//! (their packets' losses are revealed by the packets behind them and
//! resent while the rest flows; the tail copies cover their end), nor does
//! a sender whose receiver caps its rate (an incast: its losses are
//! congestion, and more packets would only deepen the queue).

use crate::memory::{RegionTable, Span};
use reed_solomon_erasure::galois_8::ReedSolomon;

/// The chance of a message still missing a packet after its repair packets
/// that the repair count aims below. A ring all-reduce waits on each of its
/// 254 steps in turn (128 ranks), so one step in a hundred still paying a
/// round trip costs it more than its repair packets do: 128-host ring
/// all-reduce, 8 MiB, at 1 %/link and 1 % / 10 % end to end, seed 1, kept
/// 90.9 / 91.8 / 87.0 % of its loss-free speed aiming at 1 %, 93.4 / 95.2 /
/// 89.2 % at 0.1 %, and 93.6 / 95.5 / 89.3 % at 0.01 % (each without the
/// one-per-four cap and the receive side's loss evidence).
pub(crate) const RESIDUAL_LOSS: f64 = 0.001;

/// Data packets per repair packet at most: repair costs at most a quarter
/// more bytes, and a message of fewer than four packets gets none (a
/// stream of two-packet messages would otherwise send half again as many
/// bytes; its losses are revealed by the next message's packets).
pub(crate) const DATA_PACKETS_PER_REPAIR_PACKET: u32 = 4;

/// The largest repair count a receiver accepts for one message: each
/// recovery shard is held (up to an MTU of memory) until the message
/// completes.
pub(crate) const MAX_REPAIR_COUNT: u16 = 16;

/// The most data packets one repair code covers (a receiver refuses codes
/// over more): with [`MAX_REPAIR_COUNT`] recovery shards, the 256 a code
/// over GF(2^8) can have.
pub(crate) const MAX_CODE_DATA_PACKETS: u32 = 240;

/// Codes a device keeps built, by (data packets, recovery shards): building
/// one inverts a matrix (20 µs for 16 + 4), using one costs about a
/// microsecond per 16 KiB.
const CODES_KEPT: usize = 8;

/// Recovery shard bytes a QP may hold for messages not yet rebuilt: what a
/// peer can make the receiver keep by sending repair packets for messages
/// it never completes.
pub(crate) const MAX_REPAIR_BYTES_PER_QP: u64 = 4 << 20;

/// Packets between halvings of the loss rate's memory: the rate is an
/// average over about this many packets' fates.
const LOSS_RATE_PACKETS: f64 = 512.0;

/// The device's per-packet loss rate: of the packet fates it has seen, the
/// share lost, every fate weighing less as newer ones come (half as much
/// some 350 packets later). Two kinds of fates: its own data packets (each
/// acknowledged one delivered, each given up on after a SACK gap lost), and
/// its peers' data packets as they arrive (each one delivered, the PSNs a
/// path skips lost): the second come half a round trip sooner, and double
/// what a device that sends as much as it receives (a ring's rank) learns
/// in its first steps. A ratio of two decayed counts rather than an average
/// started at zero: after its first hundred packets and one loss a device
/// knows its loss rate is about 1 %, not 0.2 %.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LossRate {
    lost: f64,
    fates: f64,
    /// When a loss was last seen (0: never).
    last_loss_ns: u64,
}

impl LossRate {
    /// `delivered` packets arrived and `lost` were lost, seen at `now_ns`.
    pub(crate) fn on_fates(&mut self, now_ns: u64, delivered: u32, lost: u64) {
        let n = u64::from(delivered) + lost;
        if n == 0 {
            return;
        }
        // Once per received packet (n = 1) and per ACK: no `powf` there.
        let keep = (1.0 - 1.0 / LOSS_RATE_PACKETS).powi(i32::try_from(n).unwrap_or(i32::MAX));
        let n = n as f64;
        self.lost = self.lost * keep + lost as f64;
        self.fates = self.fates * keep + n;
        if lost > 0 {
            self.last_loss_ns = now_ns.max(1);
        }
    }

    /// The estimate, 0..=1.
    pub(crate) fn rate(&self) -> f64 {
        if self.fates > 0.0 {
            self.lost / self.fates
        } else {
            0.0
        }
    }

    /// The share by which the windows admit more bytes than the controller
    /// gives them, on a fabric losing packets (transport spec §2, "Loss
    /// allowance"): twice the loss rate, the rate taken at most 25 %.
    ///
    /// A window counts bytes in flight, and at a loss rate `r` a share `r`
    /// of them will never arrive, yet hold their room for a round trip
    /// more, until a later packet's ACK shows the gap; their resends then
    /// take the same room again. So of a window `W` only about
    /// `W (1 - 2r)` carries new data that arrives: at 1 % loss per link
    /// (some 6 % of packets on a 3-tier fat tree) a flow ran 10-12 %
    /// below its loss-free rate, against 6 % for the lost bytes alone.
    /// The room a loss takes is given back ahead. Where losses are drops
    /// in a full queue, ECN marks at far shallower queues cut the windows
    /// first.
    pub(crate) fn window_allowance(&self) -> f64 {
        2.0 * self.rate().min(0.25)
    }

    /// Whether a loss was seen within `memory_ns` of `now_ns`: the fabric
    /// is losing packets now.
    pub(crate) fn seen_within(&self, now_ns: u64, memory_ns: u64) -> bool {
        self.last_loss_ns != 0 && now_ns.saturating_sub(self.last_loss_ns) < memory_ns
    }
}

/// How many repair packets `data_packets` need at a per-packet loss rate of
/// `loss`: the fewest `k` for which more than `k` of the `data_packets + k`
/// packets are lost less often than [`RESIDUAL_LOSS`] (none where the
/// message alone loses a packet that rarely), capped at `max`.
pub(crate) fn repair_count(data_packets: u32, loss: f64, max: u32) -> u32 {
    if max == 0 || loss.is_nan() || loss <= 0.0 {
        return 0;
    }
    let loss = loss.min(0.5);
    for k in 0..=max {
        if binomial_tail(data_packets + k, loss, k + 1) < RESIDUAL_LOSS {
            return k;
        }
    }
    max
}

/// P(X >= at_least) for X ~ Binomial(n, p).
fn binomial_tail(n: u32, p: f64, at_least: u32) -> f64 {
    // Sum the complement's terms, each from the one before.
    let mut term = (1.0 - p).powi(n as i32);
    let mut below = 0.0;
    for i in 0..at_least.min(n + 1) {
        below += term;
        term *= f64::from(n - i) / f64::from(i + 1) * p / (1.0 - p);
    }
    (1.0 - below).max(0.0)
}

/// The Reed-Solomon codes a device has built, the most recently used
/// first.
#[derive(Default)]
pub(crate) struct Codes {
    kept: Vec<((usize, usize), ReedSolomon)>,
}

impl std::fmt::Debug for Codes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.kept.iter().map(|(k, _)| k))
            .finish()
    }
}

impl Codes {
    /// The code of `data` data shards and `recovery` recovery shards.
    fn get(&mut self, data: usize, recovery: usize) -> Option<&ReedSolomon> {
        let key = (data, recovery);
        match self.kept.iter().position(|(k, _)| *k == key) {
            Some(0) => {}
            Some(i) => {
                let hit = self.kept.remove(i);
                self.kept.insert(0, hit);
            }
            None => {
                let code = ReedSolomon::new(data, recovery).ok()?;
                self.kept.truncate(CODES_KEPT - 1);
                self.kept.insert(0, (key, code));
            }
        }
        self.kept.first().map(|(_, c)| c)
    }
}

/// Compute a message's `count` recovery shards of `shard_bytes` each from
/// its payload (`payload_len` bytes gathered by `gather(offset, out)`),
/// concatenated.
pub(crate) fn encode(
    codes: &mut Codes,
    payload_len: u32,
    shard_bytes: u32,
    count: u32,
    gather: impl Fn(u64, &mut [u8]),
) -> Option<Box<[u8]>> {
    let shard = shard_bytes as usize;
    let data_packets = payload_len.div_ceil(shard_bytes) as usize;
    let mut data = vec![0u8; data_packets * shard];
    for (i, chunk) in data.chunks_mut(shard).enumerate() {
        let at = i * shard;
        let len = (payload_len as usize - at).min(shard);
        gather(at as u64, &mut chunk[..len]);
    }
    let mut recovery = vec![0u8; count as usize * shard];
    let mut parts: Vec<&mut [u8]> = recovery.chunks_mut(shard).collect();
    let originals: Vec<&[u8]> = data.chunks(shard).collect();
    codes
        .get(data_packets, count as usize)?
        .encode_sep(&originals, &mut parts)
        .ok()?;
    Some(recovery.into_boxed_slice())
}

/// A receiver's repair state for one message: the recovery shards that
/// came (their bytes; empty in the simulator, which carries lengths only).
#[derive(Debug)]
pub(crate) struct RepairRx {
    /// Recovery shards the sender computed.
    pub(crate) count: u16,
    /// Bytes per shard (the data packets' payload size).
    pub(crate) shard_bytes: u32,
    /// By index: `None` until it arrives.
    pub(crate) shards: Vec<Option<Box<[u8]>>>,
    pub(crate) received: u16,
}

impl RepairRx {
    pub(crate) fn new(count: u16, shard_bytes: u32) -> Self {
        Self {
            count,
            shard_bytes,
            shards: vec![None; usize::from(count)],
            received: 0,
        }
    }

    /// Bytes held.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.shards.iter().flatten().map(|s| s.len() as u64).sum()
    }
}

/// Where a message's bytes are at the receiver: one span of a region
/// (WRITE) or a receive's spans (SEND).
pub(crate) enum Placement<'a> {
    Span(Span),
    Spans(&'a [Span]),
}

impl Placement<'_> {
    fn read(&self, regions: &RegionTable, at: u64, out: &mut [u8]) {
        match self {
            Self::Span(span) => regions.read(*span, at, out),
            Self::Spans(spans) => regions.gather(spans, at, out),
        }
    }

    fn write(&self, regions: &mut RegionTable, at: u64, data: &[u8]) {
        match self {
            Self::Span(span) => {
                regions.write(*span, at, data);
            }
            Self::Spans(spans) => {
                regions.scatter(spans, at, data);
            }
        }
    }
}

/// The data packets (by index) of a `msg_len`-byte message in shards of
/// `shard_bytes` that have not arrived whole, according to `have`.
pub(crate) fn missing(msg_len: u32, shard_bytes: u32, have: impl Fn(u64, u64) -> bool) -> Vec<u32> {
    let n = msg_len.div_ceil(shard_bytes);
    (0..n)
        .filter(|&i| {
            let start = u64::from(i) * u64::from(shard_bytes);
            let end = (start + u64::from(shard_bytes)).min(u64::from(msg_len));
            !have(start, end)
        })
        .collect()
}

/// Rebuild the `missing` data packets of a message from the ones placed
/// (read back from `placement`) and the recovery shards in `state`, and
/// place them. `false` if the shards do not suffice or do not decode (the
/// caller then waits for resends as without repair). Shards without bytes
/// (the simulator's) rebuild lengths only: nothing to read or write.
pub(crate) fn rebuild(
    codes: &mut Codes,
    regions: &mut RegionTable,
    placement: &Placement<'_>,
    msg_len: u32,
    state: &RepairRx,
    missing: &[u32],
) -> bool {
    let n = msg_len.div_ceil(state.shard_bytes) as usize;
    if missing.len() > usize::from(state.received) || n == 0 {
        return false;
    }
    let shard = state.shard_bytes as usize;
    let with_bytes = state
        .shards
        .iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .count();
    if with_bytes == 0 {
        // The simulator's shards: lengths only, nothing to read or write.
        return true;
    }
    if with_bytes != usize::from(state.received)
        || state.shards.iter().flatten().any(|s| s.len() != shard)
    {
        // Shards with and without bytes for one message (only a peer that
        // mixes the two entry points could): rebuild nothing.
        return false;
    }
    // Every shard, data then recovery, with whether it is here.
    let mut shards: Vec<(Vec<u8>, bool)> = (0..n)
        .map(|i| {
            if missing.contains(&(i as u32)) {
                return (vec![0u8; shard], false);
            }
            let at = i * shard;
            let len = (msg_len as usize - at).min(shard);
            let mut buf = vec![0u8; shard];
            placement.read(regions, at as u64, &mut buf[..len]);
            (buf, true)
        })
        .chain(state.shards.iter().map(|s| match s {
            Some(bytes) => (bytes.to_vec(), true),
            None => (vec![0u8; shard], false),
        }))
        .collect();
    let Some(code) = codes.get(n, usize::from(state.count)) else {
        return false;
    };
    if code.reconstruct_data(&mut shards).is_err() {
        return false;
    }
    for &i in missing {
        let at = i as usize * shard;
        let len = (msg_len as usize - at).min(shard);
        placement.write(regions, at as u64, &shards[i as usize].0[..len]);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repair_count_grows_with_the_loss_rate_and_stops_at_the_cap() {
        assert_eq!(repair_count(16, 0.0, 8), 0);
        assert_eq!(repair_count(16, 0.001, 8), 1);
        // Rare enough that the message alone keeps below the target.
        assert_eq!(repair_count(16, 0.000_01, 8), 0);
        // 1 % per link over six links: 5.9 % per packet.
        let k = repair_count(16, 0.059, 8);
        assert!((4..=7).contains(&k), "{k}");
        assert!(binomial_tail(16 + k, 0.059, k + 1) < RESIDUAL_LOSS);
        assert!(binomial_tail(16 + k - 1, 0.059, k) >= RESIDUAL_LOSS);
        assert_eq!(repair_count(16, 0.4, 8), 8);
        assert_eq!(repair_count(16, 0.059, 0), 0);
    }

    #[test]
    fn binomial_tail_matches_a_direct_sum() {
        // P(X >= 2), X ~ B(3, 0.5) = 4/8.
        assert!((binomial_tail(3, 0.5, 2) - 0.5).abs() < 1e-12);
        assert!((binomial_tail(10, 0.1, 0) - 1.0).abs() < 1e-12);
        assert!(binomial_tail(10, 0.1, 11) < 1e-12);
    }

    #[test]
    fn the_window_allowance_is_twice_the_loss_rate_up_to_half_a_window() {
        let mut r = LossRate::default();
        assert_eq!(r.window_allowance(), 0.0);
        // 6 % of packets lost: the windows admit 12 % more.
        for _ in 0..50 {
            r.on_fates(1, 94, 6);
        }
        assert!((r.window_allowance() - 0.12).abs() < 0.005, "{r:?}");
        // Half the packets lost: no more than half a window more.
        for _ in 0..50 {
            r.on_fates(2, 50, 50);
        }
        assert_eq!(r.window_allowance(), 0.5);
    }

    #[test]
    fn the_loss_rate_converges_and_decays() {
        let mut r = LossRate::default();
        assert!(!r.seen_within(0, 1_000));
        // One loss in the first hundred packets: about 1 %, at once.
        r.on_fates(10, 99, 1);
        assert!((r.rate() - 0.01).abs() < 0.001, "{}", r.rate());
        assert!(r.seen_within(900, 1_000) && !r.seen_within(1_010, 1_000));
        for _ in 0..1_000 {
            r.on_fates(20, 19, 1);
        }
        assert!((r.rate() - 0.05).abs() < 0.01, "{}", r.rate());
        r.on_fates(30, 5_000, 0);
        assert!(r.rate() < 0.001, "{}", r.rate());
    }

    #[test]
    fn missing_names_the_packets_not_placed_whole() {
        let have = |s: u64, e: u64| !(s < 8192 && e > 4096) && e <= 10_000;
        assert_eq!(missing(10_000, 4096, have), vec![1]);
        assert_eq!(missing(10_000, 4096, |_, _| false), vec![0, 1, 2]);
    }

    #[test]
    fn shards_encode_and_rebuild_lost_packets() {
        let msg: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut codes = Codes::default();
        let shards = encode(&mut codes, 10_000, 4096, 2, |at, out| {
            out.copy_from_slice(&msg[at as usize..at as usize + out.len()]);
        })
        .expect("encodes");
        assert_eq!(shards.len(), 2 * 4096);
        let mut regions = RegionTable::new(4);
        let mr = regions
            .register(
                0,
                10_000,
                crate::AccessFlags::LOCAL_WRITE,
                false,
                &mut crate::seeded_rng::SeededRng::new(1),
            )
            .expect("registers");
        let span = regions
            .check(
                crate::memory::KeyKind::Local,
                mr.lkey,
                0,
                mr.addr,
                10_000,
                crate::AccessFlags(0),
            )
            .expect("own region");
        // Packets 0 and 2 lost: only packet 1 placed.
        regions.write(span, 4096, &msg[4096..8192]);
        let mut state = RepairRx::new(2, 4096);
        for (i, s) in shards.chunks(4096).enumerate() {
            state.shards[i] = Some(s.into());
            state.received += 1;
        }
        let whole = Placement::Span(span);
        assert!(rebuild(
            &mut codes,
            &mut regions,
            &whole,
            10_000,
            &state,
            &[0, 2]
        ));
        let mut back = vec![0u8; 10_000];
        regions.read(span, 0, &mut back);
        assert_eq!(back, msg);
        // One shard short of three losses: nothing rebuilt.
        assert!(!rebuild(
            &mut codes,
            &mut regions,
            &whole,
            10_000,
            &state,
            &[0, 1, 2]
        ));
        // Codes are kept, the most recent first, at most CODES_KEPT.
        for n in 1..=CODES_KEPT + 2 {
            assert!(codes.get(n, 1).is_some());
        }
        assert_eq!(codes.kept.len(), CODES_KEPT);
        assert_eq!(codes.kept[0].0, (CODES_KEPT + 2, 1));
    }
}
