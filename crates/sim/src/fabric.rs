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
    /// beyond it packets are dropped and counted.
    pub headroom_bytes: u64,
}

impl PfcConfig {
    /// Whether a packet of `packet_bytes` arriving at an ingress port
    /// holding `ingress_bytes` overflows the headroom: the pause came too
    /// late for it, and it is dropped.
    #[inline]
    pub fn beyond_headroom(&self, ingress_bytes: u64, packet_bytes: u64) -> bool {
        ingress_bytes + packet_bytes > self.xoff_bytes + self.headroom_bytes
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
            headroom_bytes: 20,
        };
        assert!(!pfc.must_pause(99) && pfc.must_pause(100));
        assert!(pfc.may_resume(50) && !pfc.may_resume(51));
        assert!(!pfc.beyond_headroom(100, 20) && pfc.beyond_headroom(101, 20));
    }
}
