//! Every transport's tunables as scenario keys under `[transport]`.
//!
//! MetaRoCE's come from the protocol core itself (the endpoint's
//! [`EndpointConfig::KNOBS`] and the controller's [`MetaRoceParams::KNOBS`],
//! under their field names); the baselines' are here, prefixed with what
//! they belong to (`dcqcn_`, `rc_`, `irn_`, `ib_`). A scenario may set any
//! of them; each transport takes its own and ignores the rest, so one file
//! can run every transport side by side.

use super::dcqcn::DcqcnParams;
use super::rc::RcConfig;
use crate::sim::CreditConfig;
use crate::time::PS_PER_US;
use metaroce_proto::EndpointConfig;
use metaroce_proto::cc::MetaRoceParams;
use metaroce_proto::knob::Knob;

/// Microseconds as picoseconds (a knob's value is always finite here: it
/// passed its range).
fn us(v: f64) -> u64 {
    (v * PS_PER_US as f64).round() as u64
}
fn to_us(ps: u64) -> f64 {
    ps as f64 / PS_PER_US as f64
}

/// DCQCN's reaction and notification points (RoCEv2 and IRN).
pub const DCQCN_KNOBS: &[Knob<DcqcnParams>] = &[
    Knob {
        name: "dcqcn_g",
        doc: "EWMA gain of alpha (paper: 1/256)",
        min: 1e-6,
        max: 1.0,
        integer: false,
        get: |p| p.g,
        set: |p, v| p.g = v,
    },
    Knob {
        name: "dcqcn_alpha_period_us",
        doc: "alpha decay period without CNPs, K",
        min: 0.01,
        max: 1e6,
        integer: false,
        get: |p| to_us(p.alpha_period_ps),
        set: |p, v| p.alpha_period_ps = us(v),
    },
    Knob {
        name: "dcqcn_timer_us",
        doc: "rate-increase timer, T",
        min: 0.01,
        max: 1e6,
        integer: false,
        get: |p| to_us(p.timer_ps),
        set: |p, v| p.timer_ps = us(v),
    },
    Knob {
        name: "dcqcn_byte_counter_bytes",
        doc: "rate-increase byte counter, B",
        min: 1.0,
        max: 1e12,
        integer: true,
        get: |p| p.byte_counter as f64,
        set: |p, v| p.byte_counter = v as u64,
    },
    Knob {
        name: "dcqcn_stages",
        doc: "fast-recovery stages, F",
        min: 1.0,
        max: 64.0,
        integer: true,
        get: |p| f64::from(p.stages),
        set: |p, v| p.stages = v as u32,
    },
    Knob {
        name: "dcqcn_rai_mbps",
        doc: "additive increase step R_AI, Mb/s",
        min: 0.0,
        max: 1e6,
        integer: false,
        get: |p| p.rai_bps / 1e6,
        set: |p, v| p.rai_bps = v * 1e6,
    },
    Knob {
        name: "dcqcn_rhai_mbps",
        doc: "hyper increase step R_HAI, Mb/s",
        min: 0.0,
        max: 1e6,
        integer: false,
        get: |p| p.rhai_bps / 1e6,
        set: |p, v| p.rhai_bps = v * 1e6,
    },
    Knob {
        name: "dcqcn_cnp_interval_us",
        doc: "at most one CNP per flow per this interval",
        min: 0.0,
        max: 1e6,
        integer: false,
        get: |p| to_us(p.cnp_interval_ps),
        set: |p, v| p.cnp_interval_ps = us(v),
    },
    Knob {
        name: "dcqcn_min_rate_fraction",
        doc: "lowest rate, as a fraction of line rate",
        min: 1e-9,
        max: 1.0,
        integer: false,
        get: |p| p.min_rate_fraction,
        set: |p, v| p.min_rate_fraction = v,
    },
];

/// The reliable-connection engine of the RoCEv2, IRN and IB baselines.
pub const RC_KNOBS: &[Knob<RcConfig>] = &[
    Knob {
        name: "rc_rto_us",
        doc: "retransmission timeout (IRN: RTO_high)",
        min: 0.01,
        max: 1e8,
        integer: false,
        get: |c| to_us(c.rto_ps),
        set: |c, v| c.rto_ps = us(v),
    },
    Knob {
        name: "irn_rto_low_us",
        doc: "IRN's RTO_low, used while few packets are outstanding",
        min: 0.01,
        max: 1e8,
        integer: false,
        get: |c| c.rto_low.map_or(0.0, |(t, _)| to_us(t)),
        set: |c, v| c.rto_low = Some((us(v), c.rto_low.map_or(3, |(_, n)| n))),
    },
    Knob {
        name: "irn_rto_low_packets",
        doc: "IRN's N: RTO_low applies while at most N packets are outstanding",
        min: 0.0,
        max: 1e6,
        integer: true,
        get: |c| c.rto_low.map_or(0.0, |(_, n)| f64::from(n)),
        set: |c, v| c.rto_low = Some((c.rto_low.map_or(100 * PS_PER_US, |(t, _)| t), v as u32)),
    },
    Knob {
        name: "irn_window_packets",
        doc: "IRN's BDP-FC cap on packets in flight (0: one BDP)",
        min: 0.0,
        max: 1e9,
        integer: true,
        get: |c| c.window_packets.map_or(0.0, f64::from),
        set: |c, v| c.window_packets = Some(v as u32),
    },
];

/// InfiniBand's credited link layer.
pub const IB_KNOBS: &[Knob<CreditConfig>] = &[
    Knob {
        name: "ib_credit_bytes",
        doc: "credit per switch-facing port (0: each link's own credit loop)",
        min: 0.0,
        max: 1e12,
        integer: true,
        get: |c| c.bytes.map_or(0.0, |b| b as f64),
        set: |c, v| c.bytes = (v > 0.0).then_some(v as u64),
    },
    Knob {
        name: "ib_credit_resync_us",
        doc: "period of the flow-control packets that recover credit lost with packets",
        min: 0.001,
        max: 1e6,
        integer: false,
        get: |c| to_us(c.resync_ps),
        set: |c, v| c.resync_ps = us(v),
    },
];

/// Where a `[transport]` key belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnobOwner {
    /// MetaRoCE's endpoint.
    Endpoint,
    /// MetaRoCE's congestion controller.
    Controller,
    /// DCQCN (RoCEv2, IRN).
    Dcqcn,
    /// The RC engine (RoCEv2, IRN, IB).
    Rc,
    /// IB's link layer.
    Ib,
}

/// Check `value` for the knob `name` of whichever transport owns it, on a
/// default instance: `Ok(owner)`, or why not (an unknown name, a value out
/// of range).
pub fn check(name: &str, value: f64) -> Result<KnobOwner, String> {
    fn try_on<T>(
        table: &[Knob<T>],
        mut t: T,
        name: &str,
        value: f64,
    ) -> Option<Result<(), String>> {
        metaroce_proto::knob::find(table, name)
            .map(|k| k.apply(&mut t, value).map_err(|e| e.to_string()))
    }
    let rc = || RcConfig::new("rc", super::rc::Recovery::Selective);
    let credit = CreditConfig {
        bytes: None,
        resync_ps: PS_PER_US,
        max_frame_bytes: 4200,
    };
    let attempts = [
        (
            KnobOwner::Endpoint,
            try_on(
                EndpointConfig::KNOBS,
                EndpointConfig::default(),
                name,
                value,
            ),
        ),
        (
            KnobOwner::Controller,
            try_on(
                MetaRoceParams::KNOBS,
                MetaRoceParams::default(),
                name,
                value,
            ),
        ),
        (
            KnobOwner::Dcqcn,
            try_on(DCQCN_KNOBS, DcqcnParams::default(), name, value),
        ),
        (KnobOwner::Rc, try_on(RC_KNOBS, rc(), name, value)),
        (KnobOwner::Ib, try_on(IB_KNOBS, credit, name, value)),
    ];
    for (owner, r) in attempts {
        if let Some(r) = r {
            return r.map(|()| owner);
        }
    }
    Err("unknown key (the transport keys are listed in docs/scenario.md)".into())
}

/// Apply every knob of `table` found in `knobs` to `target` (values
/// already checked by [`check`]).
pub fn apply_all<T>(table: &[Knob<T>], target: &mut T, knobs: &[(String, f64)]) {
    for (name, v) in knobs {
        if let Some(k) = metaroce_proto::knob::find(table, name) {
            // Checked at parse time against the same range.
            let _ = k.apply(target, *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_one_owner_and_its_default_is_in_range() {
        let mut names = std::collections::HashSet::new();
        macro_rules! table {
            ($t:expr, $default:expr) => {
                for k in $t {
                    assert!(names.insert(k.name), "{} is owned twice", k.name);
                    let v = (k.get)(&$default);
                    assert!(
                        k.min <= v && v <= k.max,
                        "{} default {v} outside {}..={}",
                        k.name,
                        k.min,
                        k.max
                    );
                }
            };
        }
        table!(EndpointConfig::KNOBS, EndpointConfig::default());
        table!(MetaRoceParams::KNOBS, MetaRoceParams::default());
        table!(DCQCN_KNOBS, DcqcnParams::default());
        table!(
            IB_KNOBS,
            CreditConfig {
                bytes: None,
                resync_ps: PS_PER_US,
                max_frame_bytes: 4200
            }
        );
        for k in RC_KNOBS {
            assert!(names.insert(k.name), "{} is owned twice", k.name);
        }
        assert_eq!(check("ack_delay_ns", 2000.0), Ok(KnobOwner::Endpoint));
        assert_eq!(check("ecn_gain", 0.25), Ok(KnobOwner::Controller));
        assert_eq!(check("dcqcn_timer_us", 10.0), Ok(KnobOwner::Dcqcn));
        assert_eq!(check("ib_credit_bytes", 0.0), Ok(KnobOwner::Ib));
        assert!(
            check("ack_delay_ns", 0.0)
                .unwrap_err()
                .contains("must be in")
        );
        assert!(check("nope", 1.0).unwrap_err().contains("unknown key"));
    }
}
