//! `metaroce sim`: the packet-level fabric simulator.
//!
//! - `metaroce sim` runs the embedded default scenario;
//! - `metaroce sim SCENARIO.toml [--seed N] [--out DIR]` runs a file;
//! - `metaroce sim sweep PLAN.toml [--out DIR] [--shard i/n] [--threads N]`
//!   runs a grid of scenario points in parallel.

use metaroce_sim::sweep::{Plan, Shard, run_plan};
use metaroce_sim::{Outcome, Scenario, run_scenario};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `metaroce sim`.
#[derive(clap::Args, Debug)]
pub(crate) struct SimArgs {
    /// Scenario TOML file (default: the embedded default scenario), or
    /// `sweep` followed by a sweep plan.
    scenario: Option<PathBuf>,
    /// Sweep plan (after `sweep`).
    plan: Option<PathBuf>,
    /// Seed (overrides the scenario's).
    #[arg(long)]
    seed: Option<u64>,
    /// Write results.json, perf.json, timeseries.json, flows.csv and SVG plots here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Sweep: run only slice i of n (0-based), e.g. `--shard 3/16`.
    #[arg(long)]
    shard: Option<String>,
    /// Sweep: worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// No progress bar.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Run the scenario once per transport (e.g. `rocev2,irn,ib,metaroce`)
    /// and print the results side by side.
    #[arg(long, value_delimiter = ',')]
    transports: Vec<String>,
    /// Suite: run only the experiments whose id contains this.
    #[arg(long, default_value = "")]
    only: String,
}

pub(crate) fn run(args: SimArgs) -> Result<ExitCode, String> {
    if args.scenario.as_deref() == Some(std::path::Path::new("sweep")) {
        return sweep(&args);
    }
    if args.scenario.as_deref() == Some(std::path::Path::new("suite")) {
        return suite(&args);
    }
    if args.plan.is_some() {
        return Err(
            "sim: unexpected second argument (did you mean `metaroce sim sweep PLAN.toml`?)".into(),
        );
    }
    let scn = match &args.scenario {
        Some(p) => Scenario::load(p).map_err(|e| e.to_string())?,
        None => Scenario::default_scenario(),
    };
    if !args.transports.is_empty() {
        return compare(&scn, &args);
    }
    let out = run_one(&scn, args.seed, args.quiet)?;
    print!("{}", metaroce_sim::report::summary_table(&out.results));
    println!("perf       {}", out.perf_line());
    if let Some(dir) = &args.out {
        out.write_to(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        println!(
            "wrote      {}/{{results.json,perf.json,timeseries.json,flows.csv,fct_cdf.svg,throughput.svg,queues.svg}}",
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn compare(scn: &Scenario, args: &SimArgs) -> Result<ExitCode, String> {
    let mut rows = Vec::new();
    for t in &args.transports {
        if !metaroce_sim::scenario::TRANSPORTS.contains(&t.as_str()) {
            return Err(format!(
                "--transports: unknown transport '{t}' (metaroce, rocev2, irn, ib)"
            ));
        }
        let mut s = scn.clone();
        s.transport.kind.clone_from(t);
        let out = run_one(&s, args.seed, args.quiet)?;
        if let Some(dir) = &args.out {
            let d = dir.join(t);
            out.write_to(&d)
                .map_err(|e| format!("{}: {e}", d.display()))?;
        }
        rows.push((t.clone(), out));
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
    for (t, o) in &rows {
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
    }
    Ok(ExitCode::SUCCESS)
}

fn run_one(scn: &Scenario, seed: Option<u64>, quiet: bool) -> Result<Outcome, String> {
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
    let out = run_scenario(scn, seed, &mut progress).map_err(|e| e.to_string());
    if drawn {
        eprintln!();
    }
    out
}

/// `metaroce sim suite DIR`: every experiment of DIR/suite.toml with every
/// transport, judged against its targets; Markdown tables on stdout (and
/// in `--out FILE`), one JSON record per experiment beside it.
fn suite(args: &SimArgs) -> Result<ExitCode, String> {
    let dir = args
        .plan
        .as_ref()
        .ok_or("sim suite: give the suite's directory: metaroce sim suite scenarios/claims")?;
    let suite = metaroce_sim::suite::Suite::load(dir).map_err(|e| e.to_string())?;
    if let Some(out) = &args.out
        && out.is_dir()
    {
        return Err(format!(
            "--out {}: is a directory (give a file for the tables)",
            out.display()
        ));
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let show = !args.quiet && std::io::stderr().is_terminal();
    let wall = Instant::now();
    let results = suite.run(&args.only, threads.max(1), &mut |done, total, what| {
        if show {
            eprint!(
                "\r\x1b[K{done}/{total} runs  {:.0} s  {what}",
                wall.elapsed().as_secs_f64()
            );
        }
    });
    if show {
        eprintln!();
    }
    let md = metaroce_sim::suite::markdown(&suite.transports, &results);
    print!("{md}");
    if let Some(out) = &args.out {
        std::fs::write(out, &md).map_err(|e| format!("{}: {e}", out.display()))?;
        let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())? + "\n";
        let jpath = out.with_extension("json");
        std::fs::write(&jpath, json).map_err(|e| format!("{}: {e}", jpath.display()))?;
    }
    println!(
        "suite: {} experiments in {:.0} s on {threads} threads",
        results.len(),
        wall.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

fn sweep(args: &SimArgs) -> Result<ExitCode, String> {
    let path = args
        .plan
        .as_ref()
        .ok_or("sim sweep: give a plan file: metaroce sim sweep PLAN.toml")?;
    let plan = Plan::load(path).map_err(|e| e.to_string())?;
    let shard = match &args.shard {
        Some(s) => Shard::parse(s).map_err(|e| format!("--shard {s}: {e}"))?,
        None => Shard { index: 0, count: 1 },
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let show = !args.quiet && std::io::stderr().is_terminal();
    let wall = Instant::now();
    let result = run_plan(&plan, shard, threads.max(1), &mut |done, total| {
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
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("sweep-out"));
    result
        .write_to(&dir, shard)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    println!(
        "{} points in {:.1} s on {threads} threads; wrote {}",
        result.rows.len(),
        wall.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
