//! Results: the deterministic summary (JSON, table), per-flow CSV, the
//! time series, and the per-group completion times the figures draw
//! (`plot` draws them).

use crate::sim::{Measurements, Port, base_rtt};
use crate::stats::sorted_quantile;
use crate::time::{Ps, ps_to_us};
use crate::topology::Topology;
use crate::transport::TransportStats;
use crate::workload::{CollKind, FlowSet};
use serde::Serialize;
use std::fmt::Write as _;

/// FCT distribution, µs.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FctStats {
    /// Flows awaited (not background).
    pub flows: usize,
    /// Flows completed (data received and sender completed).
    pub completed: usize,
    /// Flows failed.
    pub failed: usize,
    /// Minimum.
    pub min_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Maximum.
    pub max_us: f64,
}

/// One collective (or flow group) as nccl-tests reports it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CollectiveResult {
    /// Name.
    pub name: String,
    /// Formula used.
    pub kind: CollKind,
    /// Ranks.
    pub ranks: u32,
    /// nccl-tests S, bytes.
    pub bytes: u64,
    /// First start to last data received, µs.
    pub time_us: f64,
    /// S / time, GB/s (1e9 B/s).
    pub algbw_gbs: f64,
    /// algbw x the collective's factor, GB/s.
    pub busbw_gbs: f64,
    /// Whether every flow completed.
    pub complete: bool,
    /// Its flows' completion times, µs (post to data received).
    pub fct_p50_us: f64,
    /// 99th percentile.
    pub fct_p99_us: f64,
    /// Slowest.
    pub fct_max_us: f64,
    /// Jain's fairness index of its flows' throughputs (bytes / FCT):
    /// 1 when all are equal, 1/n when one flow has everything.
    pub jain: f64,
    /// Data packets its senders resent.
    pub retransmissions: u64,
    /// Retransmission timeouts its senders took.
    pub timeouts: u64,
    /// Data packets its receivers got twice (resends that were not needed).
    pub duplicates: u64,
    /// An incast's settling time: from its start until the queue into its
    /// receiver falls below 2 x BDP for good (µs; `None`: it never did
    /// before the incast ended). Other groups: `None`.
    pub settle_us: Option<f64>,
    /// The same in base RTTs.
    pub settle_rtts: Option<f64>,
}

/// One failure and how long traffic kept running into it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailureResult {
    /// What failed (`link tor0-agg1`, `switch core3`, `plane 2`).
    pub part: String,
    /// When, µs.
    pub at_us: f64,
    /// When it came back, µs.
    pub up_at_us: Option<f64>,
    /// Data packets lost into it.
    pub data_lost: u64,
    /// ACKs (control packets) lost into it.
    pub acks_lost: u64,
    /// Time from the failure to the last data packet lost into it, µs
    /// (0 if none was).
    pub data_quiet_after_us: f64,
    /// The same for ACKs and other control packets.
    pub acks_quiet_after_us: f64,
    /// Goodput delivered to hosts in the window `D` before the failure
    /// (`D` = the failure time, at most 100 µs), Gb/s.
    pub goodput_before_gbps: f64,
    /// ... from `D/2` after it for `D` (or until it recovers), Gb/s.
    pub goodput_during_gbps: f64,
    /// ... from `D/2` after its recovery for `D` (0 if it never recovers).
    pub goodput_after_gbps: f64,
}

/// Per-transport counts the report cannot read from the fabric.
#[derive(Debug, Clone, Default)]
pub struct RunExtras {
    /// Per group: what its senders and receivers counted about each other.
    pub group_pairs: Vec<crate::transport::PairStats>,
}

/// Utilisation and queues of one class of link direction.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TierResult {
    /// Label ("tor_up", ...).
    pub tier: String,
    /// Link directions in the class.
    pub ports: usize,
    /// Mean utilisation over the run (0..1).
    pub util_mean: f64,
    /// Busiest port's utilisation.
    pub util_max: f64,
    /// Queue seen by arriving packets, median, bytes.
    pub queue_p50_bytes: u64,
    /// 99th percentile.
    pub queue_p99_bytes: u64,
    /// Maximum.
    pub queue_max_bytes: u64,
    /// Packets dropped at enqueue.
    pub drops: u64,
    /// Packets trimmed.
    pub trims: u64,
    /// ECN marks.
    pub ecn_marks: u64,
    /// PAUSE frames received by these ports.
    pub pauses: u64,
    /// Time these ports spent paused, µs (summed).
    pub paused_us: f64,
}

/// Losses and pauses over the whole fabric.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FabricCounters {
    /// Buffer drops.
    pub drops: u64,
    /// Trims.
    pub trims: u64,
    /// ECN marks.
    pub ecn_marks: u64,
    /// Random wire losses.
    pub wire_losses: u64,
    /// Losses on failed links.
    pub down_losses: u64,
    /// Packets with no live route.
    pub no_route: u64,
    /// Drops beyond PFC headroom.
    pub headroom_drops: u64,
    /// PAUSE frames.
    pub pfc_pauses: u64,
    /// Packets put on the wire by NICs.
    pub nic_packets: u64,
    /// Data packets delivered to hosts.
    pub delivered_data_packets: u64,
    /// Data packets lost, every cause (buffer, headroom, wire, down,
    /// no route, end to end).
    pub data_lost: u64,
    /// ACKs and other control packets lost, every cause.
    pub acks_lost: u64,
    /// Buffer drops of data packets.
    pub data_drops: u64,
    /// Buffer drops of control packets.
    pub ack_drops: u64,
    /// Packets lost to the end-to-end loss knob (data and control).
    pub e2e_losses: u64,
}

/// The deterministic results of one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Results {
    /// Scenario name.
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// Transport.
    pub transport: String,
    /// Topology description.
    pub topology: String,
    /// Hosts.
    pub hosts: u32,
    /// Switches.
    pub switches: usize,
    /// Links (bidirectional).
    pub links: usize,
    /// Unloaded RTT used to configure hosts, µs.
    pub base_rtt_us: f64,
    /// One host's line rate over all its planes, Gb/s.
    pub line_rate_gbps: f64,
    /// Simulated time until the last awaited flow finished, µs.
    pub makespan_us: f64,
    /// Whether the run ended before the end time with every flow done.
    pub finished: bool,
    /// FCT (post to data received).
    pub fct: FctStats,
    /// Collectives and groups.
    pub collectives: Vec<CollectiveResult>,
    /// Application bytes of completed flows / makespan, Gb/s.
    pub goodput_gbps: f64,
    /// Per link class.
    pub tiers: Vec<TierResult>,
    /// Fabric totals.
    pub fabric: FabricCounters,
    /// Transport totals.
    pub transport_stats: TransportStats,
    /// Every failure and what still ran into it.
    pub failures: Vec<FailureResult>,
    /// Events executed.
    pub events: u64,
}

/// Time series for plots and `timeseries.json`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimeSeries {
    /// Bin width, µs.
    pub bin_us: f64,
    /// Delivered goodput per bin, Gb/s.
    pub goodput_gbps: Vec<f64>,
    /// Largest queue per tier per bin, bytes.
    pub queue_max_bytes: Vec<(String, Vec<u64>)>,
    /// Watched link directions ([[monitor]] and every incast's way into
    /// its receiver), by name.
    pub links: Vec<LinkSeries>,
}

/// One watched link direction, bin by bin.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LinkSeries {
    /// `a->b`.
    pub name: String,
    /// Utilisation per bin (0..1).
    pub util: Vec<f64>,
    /// Largest queue per bin, bytes.
    pub queue_max_bytes: Vec<u64>,
    /// Packets lost at or on it per bin.
    pub drops: Vec<u64>,
}

/// Build the results.
#[allow(clippy::too_many_arguments)]
pub fn results(
    scenario: &str,
    seed: u64,
    topo: &Topology,
    ports: &[Port],
    work: &FlowSet,
    m: &Measurements,
    transport: TransportStats,
    makespan: Ps,
    finished: bool,
    events: u64,
    extras: &RunExtras,
) -> Results {
    let mut fcts: Vec<f64> = Vec::new();
    let (mut flows, mut failed, mut bytes_done) = (0, 0, 0u64);
    for (f, r) in work.flows.iter().zip(&m.flows) {
        if f.background {
            continue;
        }
        flows += 1;
        failed += usize::from(r.failed);
        if let (Some(s), Some(rx), Some(_)) = (r.started, r.received, r.sent) {
            fcts.push(ps_to_us(rx - s));
            bytes_done += f.bytes;
        }
    }
    fcts.sort_by(f64::total_cmp);
    let fct = FctStats {
        flows,
        completed: fcts.len(),
        failed,
        min_us: fcts.first().copied().unwrap_or(0.0),
        mean_us: if fcts.is_empty() {
            0.0
        } else {
            fcts.iter().sum::<f64>() / fcts.len() as f64
        },
        p50_us: sorted_quantile(&fcts, 0.5),
        p90_us: sorted_quantile(&fcts, 0.9),
        p99_us: sorted_quantile(&fcts, 0.99),
        p999_us: sorted_quantile(&fcts, 0.999),
        max_us: fcts.last().copied().unwrap_or(0.0),
    };
    let bdp_bytes = topo.host_rate_bps as f64 * ps_to_us(base_rtt(topo)) / 8e6;
    let base_rtt_us = ps_to_us(base_rtt(topo));
    let mut collectives = Vec::new();
    for (g, spec) in work.groups.iter().enumerate() {
        let (mut first, mut last, mut complete) = (Ps::MAX, 0, true);
        let mut fcts = Vec::new();
        let mut rates = Vec::new();
        for (f, r) in work.flows.iter().zip(&m.flows) {
            if f.group != Some(g as u32) {
                continue;
            }
            if let Some(s) = r.started {
                first = first.min(s);
            }
            match r.received {
                Some(rx) => last = last.max(rx),
                None => complete = false,
            }
            if let (Some(s), Some(rx)) = (r.started, r.received) {
                let fct = ps_to_us(rx - s);
                fcts.push(fct);
                rates.push(f.bytes as f64 / fct.max(1e-9));
            }
        }
        fcts.sort_by(f64::total_cmp);
        let t = if first == Ps::MAX {
            0.0
        } else {
            ps_to_us(last.saturating_sub(first))
        };
        let algbw = if t > 0.0 {
            spec.bytes as f64 / (t * 1e3)
        } else {
            0.0
        };
        let n = f64::from(spec.ranks.max(1));
        let factor = match spec.kind {
            CollKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollKind::AllToAll | CollKind::ReduceScatter | CollKind::AllGather => (n - 1.0) / n,
            CollKind::Flows | CollKind::Broadcast | CollKind::Reduce => 1.0,
        };
        let jain = {
            let sum: f64 = rates.iter().sum();
            let sq: f64 = rates.iter().map(|x| x * x).sum();
            if rates.is_empty() || sq == 0.0 {
                0.0
            } else {
                sum * sum / (rates.len() as f64 * sq)
            }
        };
        let pairs = extras.group_pairs.get(g).copied().unwrap_or_default();
        let settle_us = spec.receiver.and_then(|r| {
            (first != Ps::MAX)
                .then(|| incast_settle_us(ports, m, r, first, last, 2.0 * bdp_bytes))?
        });
        collectives.push(CollectiveResult {
            name: spec.name.clone(),
            kind: spec.kind,
            ranks: spec.ranks,
            bytes: spec.bytes,
            time_us: round3(t),
            algbw_gbs: round3(algbw),
            busbw_gbs: round3(algbw * factor),
            complete,
            fct_p50_us: round3(sorted_quantile(&fcts, 0.5)),
            fct_p99_us: round3(sorted_quantile(&fcts, 0.99)),
            fct_max_us: round3(fcts.last().copied().unwrap_or(0.0)),
            jain: round3(jain),
            retransmissions: pairs.retransmissions,
            timeouts: pairs.timeouts,
            duplicates: pairs.duplicates_received,
            settle_us: settle_us.map(round3),
            settle_rtts: settle_us.map(|s| round3(s / base_rtt_us.max(1e-9))),
        });
    }
    let mut tiers = Vec::new();
    let mut fab = FabricCounters::default();
    for (li, &label) in topo.labels.iter().enumerate() {
        let mine: Vec<&Port> = ports.iter().filter(|p| p.label as usize == li).collect();
        if mine.is_empty() {
            continue;
        }
        let util = |p: &Port| {
            if makespan == 0 {
                0.0
            } else {
                p.c.tx_bytes as f64 * 8.0 / (p.rate_bps as f64 * makespan as f64 / 1e12)
            }
        };
        let sum = |f: fn(&Port) -> u64| mine.iter().map(|p| f(p)).sum::<u64>();
        let h = &m.queue_hist[li];
        tiers.push(TierResult {
            tier: label.to_string(),
            ports: mine.len(),
            util_mean: round3(mine.iter().map(|p| util(p)).sum::<f64>() / mine.len() as f64),
            util_max: round3(mine.iter().map(|p| util(p)).fold(0.0, f64::max)),
            queue_p50_bytes: h.quantile(0.5),
            queue_p99_bytes: h.quantile(0.99),
            queue_max_bytes: h.max(),
            drops: sum(|p| p.c.drops),
            trims: sum(|p| p.c.trims),
            ecn_marks: sum(|p| p.c.ecn_marks),
            pauses: sum(|p| p.c.pauses),
            paused_us: round3(ps_to_us(sum(|p| p.c.paused_ps))),
        });
    }
    for p in ports {
        fab.drops += p.c.drops;
        fab.trims += p.c.trims;
        fab.ecn_marks += p.c.ecn_marks;
        fab.wire_losses += p.c.wire_losses;
        fab.down_losses += p.c.down_losses;
        fab.pfc_pauses += p.c.pauses;
    }
    fab.no_route = m.no_route;
    {
        use crate::sim::LossCause;
        let l = &m.losses;
        fab.data_lost = l.data_total();
        fab.acks_lost = l.control_total();
        fab.data_drops = l.data(LossCause::Buffer) + l.data(LossCause::Headroom);
        fab.ack_drops = l.control(LossCause::Buffer) + l.control(LossCause::Headroom);
        fab.e2e_losses = l.data(LossCause::EndToEnd) + l.control(LossCause::EndToEnd);
    }
    let failures = m
        .failures
        .iter()
        .map(|f| {
            let d = f.at.min(100 * crate::time::PS_PER_US);
            let (during_end, after) = match f.up_at {
                Some(u) => ((f.at + d / 2 + d).min(u), Some(u + d / 2)),
                None => (f.at + d / 2 + d, None),
            };
            FailureResult {
                part: f.part.to_string(),
                at_us: round3(ps_to_us(f.at)),
                up_at_us: f.up_at.map(|u| round3(ps_to_us(u))),
                data_lost: f.data_lost,
                acks_lost: f.control_lost,
                data_quiet_after_us: round3(ps_to_us(
                    f.last_data.map_or(0, |t| t.saturating_sub(f.at)),
                )),
                acks_quiet_after_us: round3(ps_to_us(
                    f.last_control.map_or(0, |t| t.saturating_sub(f.at)),
                )),
                goodput_before_gbps: round3(window_goodput_gbps(m, f.at - d, f.at)),
                goodput_during_gbps: round3(window_goodput_gbps(m, f.at + d / 2, during_end)),
                goodput_after_gbps: round3(after.map_or(0.0, |a| window_goodput_gbps(m, a, a + d))),
            }
        })
        .collect();
    fab.headroom_drops = m.headroom_drops;
    fab.nic_packets = m.nic_packets;
    fab.delivered_data_packets = m.delivered_packets;
    Results {
        scenario: scenario.to_string(),
        seed,
        transport: "metaroce".into(),
        topology: topo.name.clone(),
        hosts: topo.hosts,
        switches: topo.switches.len(),
        links: topo.links.len(),
        base_rtt_us: round3(ps_to_us(base_rtt(topo))),
        line_rate_gbps: (topo.host_rate_bps * u64::from(topo.planes)) as f64 / 1e9,
        makespan_us: round3(ps_to_us(makespan)),
        finished,
        fct: FctStats {
            min_us: round3(fct.min_us),
            mean_us: round3(fct.mean_us),
            p50_us: round3(fct.p50_us),
            p90_us: round3(fct.p90_us),
            p99_us: round3(fct.p99_us),
            p999_us: round3(fct.p999_us),
            max_us: round3(fct.max_us),
            ..fct
        },
        collectives,
        goodput_gbps: if makespan == 0 {
            0.0
        } else {
            round3(bytes_done as f64 * 8.0 / ps_to_us(makespan) / 1e3)
        },
        tiers,
        fabric: fab,
        transport_stats: transport,
        failures,
        events,
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Goodput delivered to hosts over `[from, to)`, Gb/s (whole bins).
fn window_goodput_gbps(m: &Measurements, from: Ps, to: Ps) -> f64 {
    let bin = m.bin_ps.max(1);
    let (b0, b1) = (from / bin, to / bin);
    if b1 <= b0 {
        return 0.0;
    }
    let bytes: u64 = (b0..b1)
        .map(|b| m.delivered.bins.get(b as usize).copied().unwrap_or(0))
        .sum();
    bytes as f64 * 8.0 / (ps_to_us((b1 - b0) * bin) * 1e3)
}

/// How long after an incast toward `receiver` started at `start` the
/// queue into the receiver stayed below `limit_bytes` for good (until the
/// incast's last data arrived at `end`), µs; `None` if it never did.
fn incast_settle_us(
    ports: &[Port],
    m: &Measurements,
    receiver: u32,
    start: Ps,
    end: Ps,
    limit_bytes: f64,
) -> Option<f64> {
    let into: Vec<&crate::sim::LinkMonitor> = m
        .monitors
        .iter()
        .filter(|mon| ports[mon.port as usize].peer == crate::topology::NodeRef::Host(receiver))
        .collect();
    if into.is_empty() {
        return None;
    }
    let bin_ps = m.bin_ps.max(1);
    let (b0, b1) = (start / bin_ps, end / bin_ps);
    let q = |b: u64| {
        into.iter()
            .map(|mon| mon.queue_max.bins.get(b as usize).copied().unwrap_or(0))
            .max()
            .unwrap_or(0)
    };
    // The last bin at or above the limit; settled from the bin after it.
    let last_high = (b0..=b1).rev().find(|&b| q(b) as f64 >= limit_bytes);
    match last_high {
        None => Some(0.0),
        Some(b) if b == b1 => None,
        Some(b) => Some(ps_to_us((b + 1) * bin_ps - start).max(0.0)),
    }
}

/// The time series of a run.
pub fn time_series(topo: &Topology, m: &Measurements, bin_ps: Ps) -> TimeSeries {
    let bin_us = ps_to_us(bin_ps);
    TimeSeries {
        bin_us,
        goodput_gbps: m
            .delivered
            .bins
            .iter()
            .map(|&b| round3(b as f64 * 8.0 / (bin_us * 1e3)))
            .collect(),
        queue_max_bytes: topo
            .labels
            .iter()
            .zip(&m.queue_max)
            .filter(|(_, s)| !s.bins.is_empty())
            .map(|(l, s)| (l.to_string(), s.bins.clone()))
            .collect(),
        links: m
            .monitors
            .iter()
            .map(|mon| {
                let n = mon
                    .tx_bytes
                    .bins
                    .len()
                    .max(mon.queue_max.bins.len())
                    .max(mon.drops.bins.len());
                let get = |s: &crate::stats::Series, i: usize| s.bins.get(i).copied().unwrap_or(0);
                let rate = m
                    .port_rates_bps
                    .get(mon.port as usize)
                    .copied()
                    .unwrap_or(1)
                    .max(1);
                LinkSeries {
                    name: mon.name.clone(),
                    util: (0..n)
                        .map(|i| {
                            round3(
                                get(&mon.tx_bytes, i) as f64 * 8.0 / (rate as f64 * bin_us * 1e-6),
                            )
                        })
                        .collect(),
                    queue_max_bytes: (0..n).map(|i| get(&mon.queue_max, i)).collect(),
                    drops: (0..n).map(|i| get(&mon.drops, i)).collect(),
                }
            })
            .collect(),
    }
}

/// The terminal summary table.
pub fn summary_table(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario   {}  (seed {}, {})",
        r.scenario, r.seed, r.transport
    );
    let _ = writeln!(
        s,
        "topology   {}  ({} hosts, {} switches, {} links, base RTT {:.2} us)",
        r.topology, r.hosts, r.switches, r.links, r.base_rtt_us
    );
    let _ = writeln!(
        s,
        "makespan   {:.3} us{}   goodput {:.1} Gb/s",
        r.makespan_us,
        if r.finished {
            ""
        } else {
            " (NOT FINISHED: end time reached)"
        },
        r.goodput_gbps
    );
    let f = &r.fct;
    let _ = writeln!(
        s,
        "flows      {} awaited, {} completed, {} failed",
        f.flows, f.completed, f.failed
    );
    let _ = writeln!(
        s,
        "FCT us     min {:.1}  mean {:.1}  p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        f.min_us, f.mean_us, f.p50_us, f.p90_us, f.p99_us, f.p999_us, f.max_us
    );
    if !r.collectives.is_empty() {
        // nccl-tests' columns (size is per rank), with a units row; the
        // times are simulated.
        let _ = writeln!(
            s,
            "{:<28} {:>6} {:>14} {:>12} {:>10} {:>10}",
            "# collective", "ranks", "size", "time", "algbw", "busbw"
        );
        let _ = writeln!(
            s,
            "{:<28} {:>6} {:>14} {:>12} {:>10} {:>10}",
            "#", "", "(B)", "(us)", "(GB/s)", "(GB/s)"
        );
        for c in &r.collectives {
            let _ = writeln!(
                s,
                "{:<28} {:>6} {:>14} {:>12.2} {:>10.3} {:>10.3}{}",
                c.name,
                c.ranks,
                c.bytes,
                c.time_us,
                c.algbw_gbs,
                c.busbw_gbs,
                if c.complete { "" } else { "  incomplete" }
            );
        }
        let _ = writeln!(
            s,
            "{:<28} {:>10} {:>10} {:>10} {:>6} {:>8} {:>6} {:>6} {:>10}",
            "# workload", "fct p50", "fct p99", "fct max", "jain", "rtx", "rto", "dup", "settle"
        );
        let _ = writeln!(
            s,
            "{:<28} {:>10} {:>10} {:>10} {:>6} {:>8} {:>6} {:>6} {:>10}",
            "#", "(us)", "(us)", "(us)", "", "(pkts)", "", "(pkts)", "(RTTs)"
        );
        for c in &r.collectives {
            let settle = match (c.settle_rtts, c.kind, c.name.starts_with("incast")) {
                (Some(x), _, _) => format!("{x:.1}"),
                (None, _, true) => "never".into(),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "{:<28} {:>10.1} {:>10.1} {:>10.1} {:>6.3} {:>8} {:>6} {:>6} {:>10}",
                c.name,
                c.fct_p50_us,
                c.fct_p99_us,
                c.fct_max_us,
                c.jain,
                c.retransmissions,
                c.timeouts,
                c.duplicates,
                settle
            );
        }
    }
    let _ = writeln!(
        s,
        "{:<12} {:>6} {:>7} {:>7} {:>10} {:>10} {:>10} {:>8} {:>7} {:>9} {:>7} {:>10}",
        "# tier",
        "ports",
        "util",
        "max",
        "q50(B)",
        "q99(B)",
        "qmax(B)",
        "drops",
        "trims",
        "ecn",
        "pauses",
        "paused(us)"
    );
    for t in &r.tiers {
        let _ = writeln!(
            s,
            "{:<12} {:>6} {:>7.3} {:>7.3} {:>10} {:>10} {:>10} {:>8} {:>7} {:>9} {:>7} {:>10.1}",
            t.tier,
            t.ports,
            t.util_mean,
            t.util_max,
            t.queue_p50_bytes,
            t.queue_p99_bytes,
            t.queue_max_bytes,
            t.drops,
            t.trims,
            t.ecn_marks,
            t.pauses,
            t.paused_us
        );
    }
    let x = &r.fabric;
    let _ = writeln!(
        s,
        "fabric     drops {}  trims {}  ecn {}  wire-loss {}  down-loss {}  no-route {}  headroom-drops {}  pauses {}",
        x.drops,
        x.trims,
        x.ecn_marks,
        x.wire_losses,
        x.down_losses,
        x.no_route,
        x.headroom_drops,
        x.pfc_pauses
    );
    let _ = writeln!(
        s,
        "losses     data {}  acks {}  (buffer drops data {} acks {}, end-to-end {})",
        x.data_lost, x.acks_lost, x.data_drops, x.ack_drops, x.e2e_losses
    );
    for f in &r.failures {
        let _ = writeln!(
            s,
            "failure    {} at {:.1} us{}: {} data and {} ACKs lost into it, the last {:.1} / {:.1} us after it failed",
            f.part,
            f.at_us,
            f.up_at_us
                .map_or_else(String::new, |u| format!(" (back at {u:.1} us)")),
            f.data_lost,
            f.acks_lost,
            f.data_quiet_after_us,
            f.acks_quiet_after_us
        );
    }
    let t = &r.transport_stats;
    let _ = writeln!(
        s,
        "transport  data {}  rtx {}  acks {}  nacks {}  rto {}  paths-replaced {}  trimmed-dropped {}",
        t.data_packets,
        t.retransmissions,
        t.acks,
        t.nacks,
        t.timeouts,
        t.paths_replaced,
        t.trimmed_dropped
    );
    s
}

/// Per-flow CSV: `flow,src,dst,bytes,start_us,fct_us,sender_done_us,failed`.
pub fn flows_csv(work: &FlowSet, m: &Measurements) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    let us = |t: Option<Ps>| t.map_or(String::new(), |t| format!("{:.3}", ps_to_us(t)));
    let since = |a: Option<Ps>, b: Option<Ps>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.3}", ps_to_us(b - a)),
        _ => String::new(),
    };
    // Writing into a Vec cannot fail.
    let _ = w.write_record([
        "flow",
        "src",
        "dst",
        "bytes",
        "start_us",
        "fct_us",
        "sender_done_us",
        "failed",
        "group",
    ]);
    for (i, (f, r)) in work.flows.iter().zip(&m.flows).enumerate() {
        let group = f
            .group
            .and_then(|g| work.groups.get(g as usize))
            .map_or(if f.background { "background" } else { "" }, |g| {
                g.name.as_str()
            });
        let _ = w.write_record([
            i.to_string(),
            f.src.to_string(),
            f.dst.to_string(),
            f.bytes.to_string(),
            us(r.started),
            since(r.started, r.received),
            since(r.started, r.sent),
            r.failed.to_string(),
            group.to_string(),
        ]);
    }
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

/// Completion times of one workload group, for the FCT figures.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupFcts {
    /// The group's name (`permutation 16`, `incast 64:1`).
    pub name: String,
    /// Completed flows' FCTs (post to data received), µs, ascending.
    pub fcts_us: Vec<f64>,
}

/// Every workload group's completion times, in workload order; awaited
/// flows in no group (none of the built-in workloads leaves any) come
/// last as `other flows`. Background flows are not awaited and left out.
pub fn group_fcts(work: &FlowSet, m: &Measurements) -> Vec<GroupFcts> {
    let mut groups: Vec<GroupFcts> = work
        .groups
        .iter()
        .map(|g| GroupFcts {
            name: g.name.clone(),
            fcts_us: Vec::new(),
        })
        .chain([GroupFcts {
            name: "other flows".into(),
            fcts_us: Vec::new(),
        }])
        .collect();
    let other = groups.len() - 1;
    for (f, r) in work.flows.iter().zip(&m.flows) {
        if f.background {
            continue;
        }
        let (Some(s), Some(rx)) = (r.started, r.received) else {
            continue;
        };
        let g = f.group.map_or(other, |g| (g as usize).min(other));
        groups[g].fcts_us.push(ps_to_us(rx - s));
    }
    if groups[other].fcts_us.is_empty() {
        groups.pop();
    }
    for g in &mut groups {
        g.fcts_us.sort_by(f64::total_cmp);
    }
    groups
}
