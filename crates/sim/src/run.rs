//! Running a scenario end to end: build, simulate, report.

use crate::capture::CaptureSpec;
use crate::error::SimError;
use crate::plot;
use crate::report::{self, Results, TimeSeries};
use crate::scenario::{FailureTarget, Scenario};
use crate::sim::Sim;
use crate::sim::TapRecorder;
use crate::time::{Ps, ps_to_us};
use crate::topology::NodeRef;
use crate::transport::knobs;
use crate::transport::metaroce::MetaRoceFactory;
use crate::transport::{Transport, TransportFactory};
use metaroce_proto::EndpointConfig;
use metaroce_proto::cc::MetaRoceParams;
use std::time::{Duration, Instant};

/// Wall-clock figures of a run (not deterministic; never in `results.json`).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Perf {
    /// Seconds building topology, hosts and flows.
    pub setup_s: f64,
    /// Seconds simulating.
    pub run_s: f64,
    /// Events executed.
    pub events: u64,
    /// Events per wall second (simulation only).
    pub events_per_s: f64,
    /// Packets put on host links per wall second.
    pub packets_per_s: f64,
    /// Data packets sent (new + retransmitted).
    pub data_packets: u64,
    /// Most events pending at once.
    pub max_pending: usize,
    /// Packet slab high-water mark.
    pub packet_slots: usize,
    /// Peak resident memory of the process (VmHWM), bytes; 0 if unknown.
    pub peak_rss_bytes: u64,
    /// Wall seconds per simulated millisecond.
    pub wall_s_per_sim_ms: f64,
}

/// Everything a run produces.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Deterministic results.
    pub results: Results,
    /// Time series.
    pub series: TimeSeries,
    /// Per-flow CSV.
    pub flows_csv: String,
    /// Completion times per workload group (for the figures).
    pub fcts: Vec<report::GroupFcts>,
    /// One row of counters per host (`counters.csv`).
    pub counters_csv: String,
    /// Wall-clock figures.
    pub perf: Perf,
}

/// Peak resident set size of this process (Linux `VmHWM`), bytes.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Progress reports during a run: (simulated µs, flows left, flows total, events).
pub type ProgressFn<'a> = &'a mut dyn FnMut(f64, usize, usize, u64);

/// What a run does besides simulating its scenario.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Record the packets of these hosts and links into a capture file.
    /// MetaRoCE runs only.
    pub capture: Option<CaptureSpec>,
}

/// Run `scn` with `seed` (the scenario's own if `None`).
pub fn run_scenario(
    scn: &Scenario,
    seed: Option<u64>,
    progress: ProgressFn<'_>,
) -> Result<Outcome, SimError> {
    run_scenario_with(scn, seed, &RunOptions::default(), progress)
}

/// [`run_scenario`] with [`RunOptions`].
pub fn run_scenario_with(
    scn: &Scenario,
    seed: Option<u64>,
    opts: &RunOptions,
    progress: ProgressFn<'_>,
) -> Result<Outcome, SimError> {
    let seed = seed.unwrap_or(scn.seed);
    let t0 = Instant::now();
    let mut built = scn.build(seed)?;
    let capture = match &opts.capture {
        None => None,
        Some(_) if scn.transport.kind != "metaroce" => {
            return Err(SimError::Scenario(format!(
                "--pcap records MetaRoCE hosts only (this run's transport is {})",
                scn.transport.kind
            )));
        }
        Some(spec) => {
            let set = match &spec.hosts {
                Some(hosts) => hosts
                    .resolve(built.topo.hosts, seed)
                    .map_err(|e| SimError::Scenario(format!("--pcap-hosts: {e}")))?,
                None => Vec::new(),
            };
            spec.file.set_hosts(&set);
            let find = |name: &str| {
                built.topo.find_node(name).ok_or_else(|| {
                    SimError::Scenario(format!("--pcap-links: no node named '{name}'"))
                })
            };
            let links = spec
                .links
                .iter()
                .map(|(a, b)| Ok((find(a)?, find(b)?)))
                .collect::<Result<Vec<_>, SimError>>()?;
            Some((spec.file.clone(), links))
        }
    };
    let tc = &scn.transport;
    let knobs = tc.knob_values();
    let rc_knobs = |f: &mut crate::transport::rc::RcFactory| {
        knobs::apply_all(knobs::RC_KNOBS, &mut f.cfg, &knobs);
        if let Some(d) = f.cfg.dcqcn.as_mut() {
            knobs::apply_all(knobs::DCQCN_KNOBS, d, &knobs);
        }
    };
    match tc.kind.as_str() {
        "rocev2" => {
            let mut f = crate::transport::rocev2::factory(tc.mtu_bytes, tc.qps, tc.dcqcn);
            rc_knobs(&mut f);
            run_with(scn, built, &f, None, None, seed, t0, progress)
        }
        "irn" => {
            // IRN runs without PFC (its point): the fabric drops on overflow.
            built.fabric.pfc = None;
            let mut f = crate::transport::irn::factory(tc.mtu_bytes, tc.qps, tc.dcqcn);
            rc_knobs(&mut f);
            run_with(scn, built, &f, None, None, seed, t0, progress)
        }
        "ib" => {
            // InfiniBand's own link layer: credits instead of PFC, per-packet
            // adaptive routing, no ECN marking.
            built.fabric.pfc = None;
            built.fabric.ecn = None;
            built.fabric.routing = crate::fabric::Routing::Adaptive;
            // Credit per link sized from the link's own credit loop (rate x
            // round trip + frames), recovered by periodic resynchronisation
            // when packets die on the wire (see `sim/credit.rs`).
            let mut credit = crate::sim::CreditConfig {
                bytes: None,
                resync_ps: crate::time::us_to_ps(1.0),
                max_frame_bytes: tc.mtu_bytes + crate::transport::MAX_HEADER_BYTES,
            };
            knobs::apply_all(knobs::IB_KNOBS, &mut credit, &knobs);
            let mut f = crate::transport::ib::factory(tc.mtu_bytes, tc.qps);
            rc_knobs(&mut f);
            run_with(scn, built, &f, Some(credit), None, seed, t0, progress)
        }
        _ => {
            let mut factory = MetaRoceFactory {
                paths: scn.paths_per_connection(),
                mtu_payload_bytes: scn.transport.mtu_bytes,
                capture: capture.as_ref().map(|(file, _)| file.clone()),
                ..MetaRoceFactory::default()
            };
            if let Some(port) = scn.transport.device_port {
                factory.base.device_port = port;
            }
            // The NIC picks a packet's plane from its source port.
            factory.base.port_planes = scn.topology.planes.max(1) as u16;
            if scn.transport.rto_min_us > 0.0 {
                factory.base.rto_min_ns = (scn.transport.rto_min_us * 1e3) as u64;
            }
            // The endpoint's and the controller's knobs; the three the
            // factory sets per host itself are taken over explicitly.
            knobs::apply_all(EndpointConfig::KNOBS, &mut factory.base, &knobs);
            knobs::apply_all(MetaRoceParams::KNOBS, &mut factory.base.cc_params, &knobs);
            for (name, v) in &knobs {
                match name.as_str() {
                    "paths_per_connection" => factory.paths = *v as usize,
                    "mtu_payload_bytes" => factory.mtu_payload_bytes = *v as u32,
                    "base_rtt_ns" => factory.base_rtt_override_ns = Some(*v as u64),
                    _ => {}
                }
            }
            let tap = capture
                .filter(|(_, links)| !links.is_empty())
                .map(|(file, links)| (links, file.link_recorder()));
            run_with(scn, built, &factory, None, tap, seed, t0, progress)
        }
    }
}

/// What each group's hosts counted about each other: a flow's sender about
/// its receiver (resends, timeouts), the receiver about the sender
/// (duplicates). A host pair carrying several groups' flows is counted
/// under the first of them.
fn extras<F: TransportFactory>(sim: &Sim<F>) -> report::RunExtras {
    use crate::transport::PairStats;
    let work = sim.workload();
    let mut seen = std::collections::HashSet::new();
    let mut group_pairs = vec![PairStats::default(); work.groups.len()];
    for f in &work.flows {
        let Some(g) = f.group else { continue };
        if !seen.insert((f.src, f.dst)) {
            continue;
        }
        let tx = sim.host(f.src).pair_stats(f.dst);
        let rx = sim.host(f.dst).pair_stats(f.src);
        let p = &mut group_pairs[g as usize];
        p.retransmissions += tx.retransmissions;
        p.timeouts += tx.timeouts;
        p.duplicates_received += rx.duplicates_received;
    }
    report::RunExtras { group_pairs }
}

/// The links a run taps and what their packets are handed to.
type LinkTapConf<F> = (
    Vec<(NodeRef, NodeRef)>,
    TapRecorder<<<F as TransportFactory>::Host as Transport>::Packet>,
);

#[allow(clippy::too_many_arguments)]
fn run_with<F: TransportFactory>(
    scn: &Scenario,
    built: crate::scenario::Built,
    factory: &F,
    credit: Option<crate::sim::CreditConfig>,
    tap: Option<LinkTapConf<F>>,
    seed: u64,
    t0: Instant,
    progress: ProgressFn<'_>,
) -> Result<Outcome, SimError> {
    let total = built.flows.flows.iter().filter(|f| !f.background).count();
    let bin_ps = built.fabric.sample_ps.max(1);
    let mut sim = Sim::new(
        built.topo,
        built.fabric,
        factory,
        built.flows,
        seed,
        built.end_ps,
    )?;
    if let Some(c) = credit {
        sim.set_credit_flow_control(c);
    }
    for f in &built.failures {
        match f.target {
            FailureTarget::Link(a, b) => sim.schedule_link_failure(a, b, f.at, f.up_at)?,
            FailureTarget::Switch(s) => sim.schedule_switch_failure(s, f.at, f.up_at)?,
            FailureTarget::Plane(p) => sim.schedule_plane_failure(p, f.at, f.up_at)?,
        }
    }
    for &(a, b) in &built.monitors {
        sim.monitor_link(a, b)?;
    }
    if let Some((links, record)) = tap {
        sim.tap_links(&links, record)
            .map_err(|e| SimError::Scenario(format!("--pcap-links: {e}")))?;
    }
    // Every incast's bottleneck: the link(s) into its receiver.
    let receivers: Vec<(usize, u32)> = sim
        .workload()
        .groups
        .iter()
        .enumerate()
        .filter_map(|(g, spec)| spec.receiver.map(|r| (g, r)))
        .collect();
    for (g, r) in receivers {
        for p in sim.ports_into_host(r) {
            sim.monitor_port(p, format!("incast-{g}-into-host{r}"));
        }
    }
    let setup = t0.elapsed();
    let t1 = Instant::now();
    sim.run(|s| progress(ps_to_us(s.now()), s.waiting(), total, s.perf().events))?;
    let run = t1.elapsed().max(Duration::from_nanos(1));
    let finished = sim.waiting() == 0;
    let makespan: Ps = if finished { sim.last_done() } else { sim.now() };
    let perf = sim.perf();
    let ts = sim.transport_stats();
    let mut results = report::results(
        &scn.name,
        seed,
        sim.topology(),
        sim.ports(),
        sim.workload(),
        sim.measurements(),
        ts,
        makespan,
        finished,
        perf.events,
        &extras(&sim),
    );
    results.transport.clone_from(&scn.transport.kind);
    let series = report::time_series(sim.topology(), sim.measurements(), bin_ps);
    let flows_csv = report::flows_csv(sim.workload(), sim.measurements());
    let fcts = report::group_fcts(sim.workload(), sim.measurements());
    let counters_csv = counters_csv(&sim);
    let rs = run.as_secs_f64();
    let perf = Perf {
        setup_s: setup.as_secs_f64(),
        run_s: rs,
        events: perf.events,
        events_per_s: perf.events as f64 / rs,
        packets_per_s: sim.measurements().nic_packets as f64 / rs,
        data_packets: ts.data_packets + ts.retransmissions,
        max_pending: perf.max_pending,
        packet_slots: perf.packet_slots,
        peak_rss_bytes: peak_rss_bytes(),
        wall_s_per_sim_ms: if makespan == 0 {
            0.0
        } else {
            rs / (makespan as f64 / 1e9)
        },
    };
    Ok(Outcome {
        results,
        series,
        flows_csv,
        fcts,
        counters_csv,
        perf,
    })
}

/// `counters.csv`: a header `host,<counter names>` and one row per host.
/// Built once at the end, a few hundred bytes a host.
fn counters_csv<F: TransportFactory>(sim: &Sim<F>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for h in 0..sim.topology().hosts {
        let row = sim.host(h).counters();
        if h == 0 {
            out.push_str("host");
            for (name, _) in &row {
                out.push(',');
                out.push_str(name);
            }
            out.push('\n');
        }
        let _ = write!(out, "{h}");
        for (_, v) in &row {
            let _ = write!(out, ",{v}");
        }
        out.push('\n');
    }
    out
}

impl Outcome {
    /// `results.json`: deterministic, byte-identical for the same scenario and seed.
    pub fn results_json(&self) -> String {
        serde_json::to_string_pretty(&self.results).expect("results serialize") + "\n"
    }

    /// What the figures draw from this run.
    pub fn view(&self) -> plot::RunView<'_> {
        plot::RunView {
            scenario: &self.results.scenario,
            seed: self.results.seed,
            transport: &self.results.transport,
            fcts: &self.fcts,
            series: &self.series,
        }
    }

    /// Write results.json, perf.json, timeseries.json, flows.csv,
    /// counters.csv and the three figures (fct_cdf.svg, throughput.svg,
    /// queues.svg) into `dir`.
    pub fn write_to(&self, dir: &std::path::Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("results.json"), self.results_json())?;
        std::fs::write(
            dir.join("perf.json"),
            serde_json::to_string_pretty(&self.perf).expect("perf") + "\n",
        )?;
        std::fs::write(
            dir.join("timeseries.json"),
            serde_json::to_string(&self.series).expect("series") + "\n",
        )?;
        std::fs::write(dir.join("flows.csv"), &self.flows_csv)?;
        std::fs::write(dir.join("counters.csv"), &self.counters_csv)?;
        let view = self.view();
        std::fs::write(dir.join("fct_cdf.svg"), plot::fct_cdf_svg(&view)?)?;
        std::fs::write(dir.join("throughput.svg"), plot::throughput_svg(&view)?)?;
        std::fs::write(dir.join("queues.svg"), plot::queues_svg(&view)?)?;
        Ok(())
    }

    /// Write `compare.svg`, the figure of one scenario under several
    /// transports (`runs`, one each), into `dir`.
    pub fn write_comparison(dir: &std::path::Path, runs: &[&Self]) -> std::io::Result<()> {
        let views: Vec<plot::RunView<'_>> = runs.iter().map(|o| o.view()).collect();
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("compare.svg"), plot::comparison_svg(&views)?)?;
        Ok(())
    }

    /// One line of speed figures.
    pub fn perf_line(&self) -> String {
        let p = &self.perf;
        format!(
            "wall {:.3} s (setup {:.3} s)  events {} ({:.2} M/s)  packets {:.0} k/s  data pkts {}  peak RSS {:.1} MiB  {:.2} wall s per simulated ms",
            p.setup_s + p.run_s,
            p.setup_s,
            p.events,
            p.events_per_s / 1e6,
            p.packets_per_s / 1e3,
            p.data_packets,
            p.peak_rss_bytes as f64 / (1 << 20) as f64,
            p.wall_s_per_sim_ms
        )
    }
}
