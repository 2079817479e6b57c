//! `metaroce sim`: the packet-level fabric simulator.
//!
//! - `metaroce sim` runs the embedded default scenario;
//! - `metaroce sim SCENARIO.toml [--seed N] [--out DIR]` runs a file;
//! - `metaroce sim sweep PLAN.toml [--out DIR] [--shard i/n] [--threads N]`
//!   runs a grid of scenario points in parallel;
//! - `metaroce sim suite DIR [--only ID] [--out FILE] [--plots PLOTDIR]`
//!   runs the experiment suite of `DIR/suite.toml` with every transport and
//!   judges its targets;
//! - `metaroce sim suite-plot FILE.json --out PLOTDIR` draws the figures of
//!   a suite run again from its JSON, running nothing.
//!
//! Every option is checked, and the output directory created, before the
//! first event is simulated. A run that reaches its end time with flows
//! unfinished exits with [`EXIT_UNFINISHED`] unless `--allow-unfinished`.

use metaroce_sim::capture::{CaptureSpec, SimCapture, parse_links};
use metaroce_sim::hostset::HostSetConf;
use metaroce_sim::sweep::{Plan, Shard, run_plan};
use metaroce_sim::transport::baseline_notes;
use metaroce_sim::{Outcome, RunOptions, Scenario, run_scenario_with};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Exit code of a simulation that ended with flows unfinished.
pub(crate) const EXIT_UNFINISHED: u8 = 3;

/// Arguments of `metaroce sim`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, allow_negative_numbers = true)]
pub(crate) struct SimArgs {
    #[command(subcommand)]
    command: Option<SimCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
enum SimCommand {
    /// Run a sweep plan: a grid of scenario points x seeds, in parallel.
    Sweep(SweepArgs),
    /// Run an experiment suite (DIR/suite.toml) with every transport and
    /// judge each target: the tables of RESULTS.md.
    Suite(SuiteArgs),
    /// Draw one SVG per experiment of a suite run from its JSON (the
    /// FILE.json of `sim suite --out FILE`), without running anything.
    SuitePlot(SuitePlotArgs),
}

/// `metaroce sim suite-plot FILE.json --out PLOTDIR`.
#[derive(clap::Args, Debug)]
struct SuitePlotArgs {
    /// A suite run's JSON (written beside `sim suite --out FILE` as FILE.json).
    json: PathBuf,
    /// Write PLOTDIR/ID.svg for each experiment here (created if missing).
    #[arg(long, value_name = "PLOTDIR")]
    out: PathBuf,
}

/// `metaroce sim suite DIR`.
#[derive(clap::Args, Debug)]
struct SuiteArgs {
    /// The suite's directory (holding suite.toml), e.g. scenarios/claims.
    dir: PathBuf,
    /// Run only the experiments whose id contains this (a comma-separated
    /// list: any of them).
    #[arg(long, default_value = "")]
    only: String,
    /// Also write the tables to this Markdown file (and FILE.json).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also draw one SVG per experiment, PLOTDIR/ID.svg (created if
    /// missing; checked before anything runs).
    #[arg(long, value_name = "PLOTDIR")]
    plots: Option<PathBuf>,
    /// Worker threads, 1..=1024 [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    /// No progress line.
    #[arg(long, short = 'q')]
    quiet: bool,
}

/// `metaroce sim [SCENARIO]`.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Scenario TOML file [default: the embedded default scenario].
    scenario: Option<PathBuf>,
    /// Seed [default: the scenario's `seed`].
    #[arg(long)]
    seed: Option<u64>,
    /// Write results.json, perf.json, timeseries.json, flows.csv and the
    /// figures fct_cdf.svg, throughput.svg, queues.svg here (created if
    /// missing; checked before the run starts).
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Run the scenario once per transport (e.g. `rocev2,irn,ib,metaroce`)
    /// and print the results side by side; with --out, each run's files go
    /// to DIR/TRANSPORT/ and DIR/compare.svg overlays the transports.
    #[arg(long, value_delimiter = ',')]
    transports: Vec<String>,
    /// Exit 0 even if flows are unfinished at the scenario's end time
    /// (otherwise exit 3).
    #[arg(long)]
    allow_unfinished: bool,
    /// Record the packets the hosts of --pcap-hosts send and receive, and
    /// those the links of --pcap-links carry, to FILE (pcap:
    /// Ethernet/IPv4/UDP frames around MetaRoCE headers, the payload
    /// zero-filled, simulated nanoseconds as timestamps; open with
    /// tools/wireshark/metaroce.lua). MetaRoCE runs only.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// The captured hosts, as a workload's `hosts` (e.g. `0,5`, `0-7`)
    /// [default: 0, unless --pcap-links is given].
    #[arg(long = "pcap-hosts", value_name = "SET")]
    pcap_hosts: Option<String>,
    /// The captured links, both directions each, by their ends' node names
    /// joined by `-` (e.g. `tor0-agg1,h0-tor0`; names as in `[[failure]]`
    /// and `[[monitor]]`): what each link's ports put on the wire, before
    /// the wire's loss.
    #[arg(long = "pcap-links", value_name = "LINKS")]
    pcap_links: Option<String>,
    /// Bytes kept of each captured frame [default: 262144, whole frames].
    #[arg(long = "pcap-snaplen", value_name = "N")]
    pcap_snaplen: Option<u32>,
}

/// `metaroce sim sweep PLAN`.
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
struct SweepArgs {
    /// Sweep plan TOML file (see docs/scenario.md).
    plan: PathBuf,
    /// Write sweep.json, sweep.csv and sweep.svg here (created if missing).
    #[arg(long, default_value = "sweep-out")]
    out: PathBuf,
    /// Run only slice i of n (0-based), e.g. `--shard 3/16`.
    #[arg(long, default_value = "0/1")]
    shard: String,
    /// Worker threads, 1..=1024 [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    /// No progress line.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Exit 0 even if some point's flows are unfinished (otherwise exit 3).
    #[arg(long)]
    allow_unfinished: bool,
}

pub(crate) fn run(args: SimArgs) -> Result<ExitCode, String> {
    if let Some(SimCommand::Suite(s)) = &args.command {
        return suite(s);
    }
    if let Some(SimCommand::Sweep(s)) = &args.command {
        return sweep(s);
    }
    if let Some(SimCommand::SuitePlot(s)) = &args.command {
        return suite_plot(s);
    }
    let args = args.run;
    // Everything is checked before the first run starts.
    for t in &args.transports {
        if !metaroce_sim::scenario::TRANSPORTS.contains(&t.as_str()) {
            return Err(format!(
                "--transports: unknown transport '{t}' (metaroce, rocev2, irn, ib)"
            ));
        }
    }
    let scn = match &args.scenario {
        Some(p) => Scenario::load(p).map_err(|e| e.to_string())?,
        None => Scenario::default_scenario(),
    };
    if let Some(dir) = &args.out {
        prepare_out_dir(dir, "--out")?;
    }
    if args.pcap.is_none()
        && (args.pcap_hosts.is_some() || args.pcap_links.is_some() || args.pcap_snaplen.is_some())
    {
        return Err("--pcap-hosts, --pcap-links and --pcap-snaplen need --pcap FILE".into());
    }
    if args.pcap.is_some() && !args.transports.is_empty() {
        return Err("--pcap records one MetaRoCE run: leave out --transports".into());
    }
    if !args.transports.is_empty() {
        return compare(&scn, &args);
    }
    let opts = run_options(&args)?;
    let out = run_one(&scn, args.seed, args.quiet, &opts);
    let captured = opts.capture.as_ref().map(|c| c.file.finish());
    let out = out?;
    if let (Some(done), Some(path)) = (captured, &args.pcap) {
        let n = done.map_err(|e| format!("--pcap {}: {e}", path.display()))?;
        println!("pcap       {n} packets written to {}", path.display());
    }
    print!("{}", metaroce_sim::report::summary_table(&out.results));
    for note in baseline_notes(&scn) {
        println!("note       {note}");
    }
    println!("perf       {}", out.perf_line());
    if let Some(dir) = &args.out {
        out.write_to(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        println!(
            "wrote      {}/{{results.json,perf.json,timeseries.json,flows.csv,counters.csv,fct_cdf.svg,throughput.svg,queues.svg}}",
            dir.display()
        );
    }
    Ok(unfinished_exit(
        !out.results.finished,
        args.allow_unfinished,
        &scn.name,
    ))
}

/// Check `dir` (given as option `flag`) can hold a run's output, creating
/// it: a clear one-line error now instead of a failed write after a long
/// run.
fn prepare_out_dir(dir: &Path, flag: &str) -> Result<(), String> {
    let shown = dir.display();
    if dir.exists() && !dir.is_dir() {
        return Err(format!("{flag} {shown}: exists and is not a directory"));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("{flag} {shown}: cannot create the directory: {e}"))?;
    let probe = dir.join(format!(".metaroce-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .map_err(|e| format!("{flag} {shown}: cannot write into the directory: {e}"))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The exit code of a finished simulation: [`EXIT_UNFINISHED`] (with a
/// line saying why) when flows are unfinished and that is not allowed.
fn unfinished_exit(unfinished: bool, allowed: bool, what: &str) -> ExitCode {
    if unfinished && !allowed {
        eprintln!(
            "metaroce: {what}: flows unfinished at the end time (exit {EXIT_UNFINISHED}; raise end_us, or pass --allow-unfinished)"
        );
        ExitCode::from(EXIT_UNFINISHED)
    } else {
        ExitCode::SUCCESS
    }
}

fn compare(scn: &Scenario, args: &RunArgs) -> Result<ExitCode, String> {
    let mut rows = Vec::new();
    for t in &args.transports {
        let mut s = scn.clone();
        s.transport.kind.clone_from(t);
        let out = run_one(&s, args.seed, args.quiet, &RunOptions::default())?;
        if let Some(dir) = &args.out {
            let d = dir.join(t);
            out.write_to(&d)
                .map_err(|e| format!("{}: {e}", d.display()))?;
        }
        rows.push((t.clone(), baseline_notes(&s), out));
    }
    if let Some(dir) = &args.out
        && rows.len() > 1
    {
        let runs: Vec<&Outcome> = rows.iter().map(|(_, _, o)| o).collect();
        Outcome::write_comparison(dir, &runs).map_err(|e| format!("{}: {e}", dir.display()))?;
        println!(
            "wrote      {}/{{{}}}/ (one run each) and {}/compare.svg",
            dir.display(),
            args.transports.join(","),
            dir.display()
        );
    }
    println!("scenario   {}", scn.name);
    println!(
        "{:<10} {:>11} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>6} {:>8}",
        "transport",
        "makespan_us",
        "fct_p50",
        "fct_p99",
        "fct_max",
        "done",
        "rtx",
        "drops",
        "pauses",
        "rto",
        "wall_s"
    );
    for (t, notes, o) in &rows {
        let r = &o.results;
        let f = &r.fct;
        println!(
            "{:<10} {:>11.1} {:>9.1} {:>9.1} {:>9.1} {:>9} {:>8} {:>8} {:>8} {:>6} {:>8.3}",
            t,
            r.makespan_us,
            f.p50_us,
            f.p99_us,
            f.max_us,
            format!("{}/{}", f.completed, f.flows),
            r.transport_stats.retransmissions,
            r.fabric.drops,
            r.fabric.pfc_pauses,
            r.transport_stats.timeouts,
            o.perf.setup_s + o.perf.run_s
        );
        for note in notes {
            println!("  note: {note}");
        }
    }
    let unfinished: Vec<&str> = rows
        .iter()
        .filter(|(_, _, o)| !o.results.finished)
        .map(|(t, _, _)| t.as_str())
        .collect();
    Ok(unfinished_exit(
        !unfinished.is_empty(),
        args.allow_unfinished,
        &format!("{} ({})", scn.name, unfinished.join(", ")),
    ))
}

/// `--pcap`: the file created now, so a path that cannot be written fails
/// before the run.
fn run_options(args: &RunArgs) -> Result<RunOptions, String> {
    let Some(path) = &args.pcap else {
        return Ok(RunOptions::default());
    };
    let snaplen = args
        .pcap_snaplen
        .unwrap_or(metaroce_capture::DEFAULT_SNAPLEN);
    if snaplen == 0 {
        return Err("--pcap-snaplen 0: keep at least 1 byte of each frame".into());
    }
    let links = match &args.pcap_links {
        Some(spec) => parse_links(spec).map_err(|e| format!("--pcap-links: {e}"))?,
        None => Vec::new(),
    };
    // Host 0 when nothing is named, so `--pcap FILE` alone records something.
    let hosts = match (&args.pcap_hosts, links.is_empty()) {
        (Some(set), _) => Some(HostSetConf::Spec(set.clone())),
        (None, true) => Some(HostSetConf::Spec("0".into())),
        (None, false) => None,
    };
    let file =
        SimCapture::create(path, snaplen).map_err(|e| format!("--pcap {}: {e}", path.display()))?;
    Ok(RunOptions {
        capture: Some(CaptureSpec { file, hosts, links }),
    })
}

fn run_one(
    scn: &Scenario,
    seed: Option<u64>,
    quiet: bool,
    opts: &RunOptions,
) -> Result<Outcome, String> {
    let show = !quiet && std::io::stderr().is_terminal();
    let wall = Instant::now();
    let mut last = 0.0f64;
    let mut drawn = false;
    let mut progress = |sim_us: f64, left: usize, total: usize, events: u64| {
        let t = wall.elapsed().as_secs_f64();
        // A progress bar only for runs longer than a couple of seconds.
        if show && t > 2.0 && t - last >= 0.25 {
            last = t;
            drawn = true;
            let done = total - left;
            let frac = if total == 0 {
                0.0
            } else {
                done as f64 / total as f64
            };
            let w = 30;
            let fill = (frac * w as f64) as usize;
            eprint!(
                "\r[{}{}] {done}/{total} flows  {sim_us:.1} us simulated  {:.1} M events  {t:.0} s ",
                "#".repeat(fill),
                "-".repeat(w - fill),
                events as f64 / 1e6
            );
        }
    };
    let out = run_scenario_with(scn, seed, opts, &mut progress).map_err(|e| e.to_string());
    if drawn {
        eprintln!();
    }
    out
}

/// Most worker threads a sweep accepts.
const MAX_THREADS: usize = 1024;

/// `metaroce sim suite DIR`: every experiment of DIR/suite.toml with every
/// transport, judged against its targets; Markdown tables on stdout (and
/// in `--out FILE`, with FILE.json beside it), and with `--plots PLOTDIR`
/// a figure per experiment.
fn suite(args: &SuiteArgs) -> Result<ExitCode, String> {
    if let Some(t) = args.threads
        && !(1..=1024).contains(&t)
    {
        return Err(format!("--threads {t}: must be 1..=1024"));
    }
    if let Some(out) = &args.out
        && out.is_dir()
    {
        return Err(format!(
            "--out {}: is a directory (give a file for the tables)",
            out.display()
        ));
    }
    let suite = metaroce_sim::suite::Suite::load(&args.dir).map_err(|e| e.to_string())?;
    check_only(&suite, &args.only)?;
    if let Some(dir) = &args.plots {
        // Each figure is named by its experiment's id: one that cannot
        // be a file name is refused now, not after the runs.
        for e in &suite.experiments {
            if metaroce_sim::suite::Suite::selects(&args.only, &e.id) {
                metaroce_sim::plot::plot_file_name(&e.id)
                    .map_err(|why| format!("--plots {}: experiment {why}", dir.display()))?;
            }
        }
        prepare_out_dir(dir, "--plots")?;
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let show = !args.quiet && std::io::stderr().is_terminal();
    let wall = Instant::now();
    let results = run_suite(&suite, &args.only, threads, show);
    let md = metaroce_sim::suite::markdown(&suite.transports, &results);
    print!("{md}");
    if let Some(out) = &args.out {
        std::fs::write(out, &md).map_err(|e| format!("{}: {e}", out.display()))?;
        let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())? + "\n";
        let jpath = out.with_extension("json");
        std::fs::write(&jpath, json).map_err(|e| format!("{}: {e}", jpath.display()))?;
    }
    if let Some(dir) = &args.plots {
        write_plots(dir, &results)?;
    }
    println!(
        "suite: {} experiments in {:.0} s on {threads} threads",
        results.len(),
        wall.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// `metaroce sim suite-plot FILE.json --out PLOTDIR`: a suite run's
/// figures from its JSON.
fn suite_plot(args: &SuitePlotArgs) -> Result<ExitCode, String> {
    let results = metaroce_sim::suite::read_results(&args.json).map_err(|e| e.to_string())?;
    prepare_out_dir(&args.out, "--out")?;
    write_plots(&args.out, &results)?;
    Ok(ExitCode::SUCCESS)
}

/// One SVG per experiment into `dir`, and a line saying where.
fn write_plots(
    dir: &Path,
    results: &[metaroce_sim::suite::ExperimentResult],
) -> Result<(), String> {
    let paths =
        metaroce_sim::plot::write_experiment_svgs(dir, results).map_err(|e| e.to_string())?;
    println!(
        "wrote      {} figures to {}/ (one ID.svg per experiment)",
        paths.len(),
        dir.display()
    );
    Ok(())
}

fn sweep(args: &SweepArgs) -> Result<ExitCode, String> {
    let shard = Shard::parse(&args.shard).map_err(|e| format!("--shard {}: {e}", args.shard))?;
    let threads = match args.threads {
        Some(n) if !(1..=MAX_THREADS).contains(&n) => {
            return Err(format!("--threads {n} must be 1..={MAX_THREADS}"));
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let plan = Plan::load(&args.plan).map_err(|e| e.to_string())?;
    prepare_out_dir(&args.out, "--out")?;
    let show = !args.quiet && std::io::stderr().is_terminal();
    let wall = Instant::now();
    let result = run_plan(&plan, shard, threads, &mut |done, total| {
        if show {
            eprint!(
                "\r{done}/{total} points  {:.0} s ",
                wall.elapsed().as_secs_f64()
            );
        }
    })
    .map_err(|e| e.to_string())?;
    if show {
        eprintln!();
    }
    print!("{}", result.table());
    result
        .write_to(&plan, &args.out, shard)
        .map_err(|e| format!("{}: {e}", args.out.display()))?;
    println!(
        "{} points in {:.1} s on {threads} threads; wrote {}",
        result.rows.len(),
        wall.elapsed().as_secs_f64(),
        args.out.display()
    );
    let unfinished: Vec<String> = result
        .rows
        .iter()
        .filter(|r| r.error.is_none() && !r.finished)
        .map(|r| format!("{}/seed {}", r.point, r.seed))
        .collect();
    if result.rows.iter().any(|r| r.error.is_some()) {
        return Err(format!(
            "{}: some points failed (ERROR rows above)",
            args.plan.display()
        ));
    }
    Ok(unfinished_exit(
        !unfinished.is_empty(),
        args.allow_unfinished,
        &format!("{} (points {})", args.plan.display(), unfinished.join(", ")),
    ))
}

/// Run `suite`'s experiments matching `only`, with a progress line on
/// stderr when `show` (cleared at the end).
pub(crate) fn run_suite(
    suite: &metaroce_sim::suite::Suite,
    only: &str,
    threads: usize,
    show: bool,
) -> Vec<metaroce_sim::suite::ExperimentResult> {
    let wall = Instant::now();
    let results = suite.run(only, threads, &mut |done, total, what| {
        if show {
            eprint!(
                "\r\x1b[K{done}/{total} runs  {:.0} s  {what}",
                wall.elapsed().as_secs_f64()
            );
        }
    });
    if show {
        eprint!("\r\x1b[K");
    }
    results
}

/// `--only A,B`: every fragment must select an experiment of the suite.
pub(crate) fn check_only(suite: &metaroce_sim::suite::Suite, only: &str) -> Result<(), String> {
    let unmatched = suite.unmatched(only);
    if unmatched.is_empty() {
        Ok(())
    } else {
        let ids: Vec<&str> = suite.experiments.iter().map(|e| e.id.as_str()).collect();
        Err(format!(
            "--only {only}: no experiment id contains {} (ids: {})",
            unmatched.join(", "),
            ids.join(", ")
        ))
    }
}
