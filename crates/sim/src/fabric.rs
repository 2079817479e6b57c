//! Switch and link policies and their knobs: buffer admission, ECN
//! marking, PFC thresholds, trimming, up-port choice, the ECMP hash.
//!
//! Each policy is a pure function of its configuration and the counts it
//! reads; the switch element (`sim/switch.rs`, `sim/pfc.rs`) applies them
//! to its ports and buffers.

use crate::Ps;

/// How a switch's packet buffer is shared among its ports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BufferModel {
    /// Each egress port has its own buffer of this many bytes.
    PerPort {
        /// Bytes per port.
        bytes: u64,
    },
    /// One buffer per switch; a port may queue up to `alpha` times the free
    /// space (the dynamic threshold of Choudhury and Hahne).
    Shared {
        /// Bytes per switch.
        bytes: u64,
        /// Dynamic-threshold factor.
        alpha: f64,
    },
}

impl BufferModel {
    /// Admission: whether a packet of `packet_bytes` may join an egress
    /// queue holding `queue_bytes`, at a switch whose buffer holds
    /// `switch_bytes` over all its ports.
    #[inline]
    pub fn admits(&self, switch_bytes: u64, queue_bytes: u64, packet_bytes: u64) -> bool {
        match *self {
            Self::PerPort { bytes: cap } => queue_bytes + packet_bytes <= cap,
            // The free space is read only once the packet fits at all.
            Self::Shared { bytes: cap, alpha } => {
                switch_bytes + packet_bytes <= cap
                    && (queue_bytes + packet_bytes) as f64 <= alpha * (cap - switch_bytes) as f64
            }
        }
    }
}

/// RED-style ECN marking on the egress queue length at enqueue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EcnConfig {
    /// No marking at or below this queue length.
    pub kmin_bytes: u64,
    /// Always mark at or above this queue length.
    pub kmax_bytes: u64,
    /// Marking probability just below `kmax_bytes` (linear from `kmin`).
    pub pmax: f64,
}

impl EcnConfig {
    /// Probability of marking a packet that finds `queue_bytes` queued.
    pub fn mark_probability(&self, queue_bytes: u64) -> f64 {
        if queue_bytes <= self.kmin_bytes {
            0.0
        } else if queue_bytes >= self.kmax_bytes {
            1.0
        } else {
            self.pmax * (queue_bytes - self.kmin_bytes) as f64
                / (self.kmax_bytes - self.kmin_bytes) as f64
        }
    }
}

/// Priority flow control on the data priority, per ingress port.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PfcConfig {
    /// Send PAUSE upstream when an ingress port holds this many bytes.
    pub xoff_bytes: u64,
    /// Send RESUME when it falls to this many.
    pub xon_bytes: u64,
    /// Bytes above `xoff` still accepted (in flight when the pause lands);
    /// beyond it packets are dropped and counted. `None`: each ingress gets
    /// the headroom its own link needs ([`pfc_headroom_bytes`]).
    pub headroom_bytes: Option<u64>,
    /// The largest data frame on the lossless class, bytes (for the
    /// computed headroom).
    pub max_frame_bytes: u32,
}

impl PfcConfig {
    /// The headroom of an ingress fed by a link of `rate_bps` and one-way
    /// `delay_ps`: the configured figure, or the one that link needs.
    pub fn headroom_for(&self, rate_bps: u64, delay_ps: Ps) -> u64 {
        self.headroom_bytes
            .unwrap_or_else(|| pfc_headroom_bytes(rate_bps, delay_ps, self.max_frame_bytes))
    }

    /// Whether a packet of `packet_bytes` arriving at an ingress port
    /// holding `ingress_bytes`, with `headroom_bytes` above XOFF, overflows
    /// the headroom: the pause came too late for it, and it is dropped.
    #[inline]
    pub fn beyond_headroom(
        &self,
        ingress_bytes: u64,
        packet_bytes: u64,
        headroom_bytes: u64,
    ) -> bool {
        ingress_bytes + packet_bytes > self.xoff_bytes + headroom_bytes
    }

    /// Whether an ingress port holding `ingress_bytes` must pause its upstream.
    #[inline]
    pub fn must_pause(&self, ingress_bytes: u64) -> bool {
        ingress_bytes >= self.xoff_bytes
    }

    /// Whether a paused ingress port holding `ingress_bytes` may resume its upstream.
    #[inline]
    pub fn may_resume(&self, ingress_bytes: u64) -> bool {
        ingress_bytes <= self.xon_bytes
    }
}

/// The PFC headroom a lossless ingress needs above XOFF so that nothing
/// sent before the PAUSE takes effect is dropped, for a link of `rate_bps`
/// and one-way propagation `delay_ps` carrying frames of up to
/// `max_frame_bytes`.
///
/// This is the standard worst case (IEEE 802.1Qbb with the delay budget of
/// IEEE 802.3 Annex 31B, as laid out in Cisco's "Priority Flow Control:
/// Build Reliable Layer 2 Infrastructure" white paper and NVIDIA's
/// buffer-tuning notes), the sum of what can still arrive after the
/// ingress crosses XOFF:
/// - the frame the receiver is taking in when it crosses XOFF, and the one
///   the sender has just started when the PAUSE lands (2 x max frame);
/// - the PAUSE frame itself (64 B plus preamble and gap);
/// - the cable both ways: bytes on the wire toward the receiver, and those
///   the sender emits while the PAUSE travels back (2 x rate x delay);
/// - the interface delay of both PHYs and the sender's response time to a
///   PAUSE, the 802.3 upper bounds in bit times ([`pfc_response_bits`]).
pub fn pfc_headroom_bytes(rate_bps: u64, delay_ps: Ps, max_frame_bytes: u32) -> u64 {
    let wire_bits = u128::from(rate_bps) * u128::from(2 * delay_ps) / 1_000_000_000_000;
    let pause_frame_bits = (64 + 20) * 8;
    let bits = wire_bits
        + u128::from(pfc_response_bits(rate_bps))
        + pause_frame_bits
        + 2 * 8 * u128::from(max_frame_bytes);
    u64::try_from(bits.div_ceil(8)).unwrap_or(u64::MAX / 4)
}

/// The 802.3 upper bounds of the PFC response time plus the interface
/// delay, in bit times at `rate_bps`. The standard gives them per rate:
/// response 30 720 / 40 960 / 60 416 / 201 728 / 463 360 bit times at
/// 10 / 25 / 40 / 100 / 400 Gb/s, interface 8 192 / 6 144 / 24 576 /
/// 122 880 bit times at 10-100 Gb/s (400 Gb/s: the 100 Gb/s interface
/// time). Between two listed rates the longer of the two *times* applies,
/// above 400 Gb/s 400 Gb/s's time, below 10 Gb/s 10 Gb/s's: never less
/// than a neighbouring rate would need.
pub fn pfc_response_bits(rate_bps: u64) -> u64 {
    const G: u64 = 1_000_000_000;
    // (rate, response + interface bit times at that rate)
    const TABLE: [(u64, u64); 5] = [
        (10 * G, 30_720 + 8_192),
        (25 * G, 40_960 + 6_144),
        (40 * G, 60_416 + 24_576),
        (100 * G, 201_728 + 122_880),
        (400 * G, 463_360 + 491_520),
    ];
    // Picoseconds a row's bit times take.
    let ps = |(rate, bits): (u64, u64)| u128::from(bits) * 1_000_000_000_000 / u128::from(rate);
    let i = TABLE.iter().position(|&(r, _)| rate_bps <= r);
    let time_ps = match i {
        Some(0) => ps(TABLE[0]),
        Some(i) if TABLE[i].0 == rate_bps => ps(TABLE[i]),
        Some(i) => ps(TABLE[i]).max(ps(TABLE[i - 1])),
        None => ps(TABLE[TABLE.len() - 1]),
    };
    u64::try_from((time_ps * u128::from(rate_bps)).div_ceil(1_000_000_000_000)).unwrap_or(u64::MAX)
}

/// How a switch picks among its up-ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Hash of the 5-tuple (src/dst IP, src/dst port, protocol).
    Ecmp,
    /// Per packet, the least-loaded up-port (ties broken by the hash).
    Adaptive,
}

/// Fabric behaviour shared by every switch and link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FabricConfig {
    /// Buffer model.
    pub buffer: BufferModel,
    /// ECN marking, if any.
    pub ecn: Option<EcnConfig>,
    /// PFC, if any (data priority only).
    pub pfc: Option<PfcConfig>,
    /// Trim data packets instead of dropping them (header-only packets go
    /// on the control priority).
    pub trimming: bool,
    /// Up-port choice.
    pub routing: Routing,
    /// Independent loss probability per packet per link.
    pub loss: f64,
    /// Independent loss probability per packet end to end, whatever its
    /// route's length (drawn once, when it reaches its host).
    pub loss_e2e: f64,
    /// Width of the time-series bins in reports.
    pub sample_ps: Ps,
    /// Packets a multi-plane NIC pulls ahead into its plane queues.
    pub nic_queue_packets: u32,
    /// Routing re-convergence delay. `None`: a switch avoids only its own
    /// dead ports, so packets hashed toward a failure further on are lost
    /// (`no_route`) for as long as it lasts. `Some(d)`: `d` after a link
    /// changes state (a routing protocol withdrawing or restoring routes),
    /// every switch learns which of its up-ports still lead to each leaf and
    /// hashes only over those.
    pub reconverge_ps: Option<Ps>,
}

impl Default for FabricConfig {
    fn default() -> Self {
        Self {
            buffer: BufferModel::PerPort { bytes: 1 << 20 },
            ecn: None,
            pfc: None,
            trimming: false,
            routing: Routing::Ecmp,
            loss: 0.0,
            loss_e2e: 0.0,
            sample_ps: 1_000_000,
            nic_queue_packets: 2,
            reconverge_ps: None,
        }
    }
}

/// The ECMP hash of a 5-tuple, salted per switch so tiers do not
/// polarize. A fixed integer mixer: deterministic across runs and machines.
pub fn ecmp_hash(
    src_ip: u32,
    dst_ip: u32,
    src_port: u16,
    dst_port: u16,
    proto: u8,
    salt: u64,
) -> u64 {
    let mut x = (u64::from(src_ip) << 32 | u64::from(dst_ip)) ^ salt;
    x = mix(x);
    x ^= u64::from(src_port) << 24 | u64::from(dst_port) << 8 | u64::from(proto);
    mix(x)
}

fn mix(mut x: u64) -> u64 {
    // splitmix64 finalizer
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecn_probability_follows_thresholds() {
        let e = EcnConfig {
            kmin_bytes: 100,
            kmax_bytes: 300,
            pmax: 0.2,
        };
        assert_eq!(e.mark_probability(0), 0.0);
        assert_eq!(e.mark_probability(100), 0.0);
        assert!((e.mark_probability(200) - 0.1).abs() < 1e-12);
        assert!((e.mark_probability(250) - 0.15).abs() < 1e-12);
        assert_eq!(e.mark_probability(300), 1.0);
        assert_eq!(e.mark_probability(10_000), 1.0);
    }

    #[test]
    fn admission_per_port_and_shared() {
        let per_port = BufferModel::PerPort { bytes: 1000 };
        assert!(per_port.admits(u64::MAX / 2, 900, 100));
        assert!(!per_port.admits(0, 901, 100));
        // Shared: the switch must have room, and the queue may hold up to
        // alpha times the free space.
        let shared = BufferModel::Shared {
            bytes: 1000,
            alpha: 1.0,
        };
        assert!(shared.admits(400, 500, 100));
        assert!(!shared.admits(400, 600, 100));
        assert!(!shared.admits(950, 0, 100));
    }

    #[test]
    fn pfc_thresholds() {
        let pfc = PfcConfig {
            xoff_bytes: 100,
            xon_bytes: 50,
            headroom_bytes: Some(20),
            max_frame_bytes: 4200,
        };
        assert!(!pfc.must_pause(99) && pfc.must_pause(100));
        assert!(pfc.may_resume(50) && !pfc.may_resume(51));
        assert!(!pfc.beyond_headroom(100, 20, 20) && pfc.beyond_headroom(101, 20, 20));
        assert_eq!(pfc.headroom_for(400_000_000_000, 1_000_000), 20);
    }

    #[test]
    fn pfc_headroom_follows_rate_cable_and_mtu() {
        const G: u64 = 1_000_000_000;
        // The listed rates give the standard's bit times exactly.
        assert_eq!(pfc_response_bits(100 * G), 201_728 + 122_880);
        assert_eq!(pfc_response_bits(400 * G), 463_360 + 491_520);
        // 100 G, 1 us cable, 4200 B frames: 2 x 12 500 B on the wire, 40 576
        // B of response and interface time, the pause frame, two frames.
        let h = pfc_headroom_bytes(100 * G, 1_000_000, 4200);
        assert_eq!(h, 25_000 + 40_576 + 84 + 8_400);
        // Grows with rate, cable and frame size, at every step.
        let mut last = 0;
        for gbps in [10, 25, 40, 50, 100, 200, 400, 800, 1600] {
            let h = pfc_headroom_bytes(gbps * G, 1_000_000, 4200);
            assert!(h > last, "{gbps} G: {h} <= {last}");
            last = h;
        }
        assert!(
            pfc_headroom_bytes(400 * G, 2_000_000, 4200)
                > pfc_headroom_bytes(400 * G, 1_000_000, 4200)
        );
        assert!(
            pfc_headroom_bytes(400 * G, 1_000_000, 9200)
                > pfc_headroom_bytes(400 * G, 1_000_000, 4200)
        );
    }
}
