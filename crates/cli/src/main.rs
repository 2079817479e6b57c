//! `metaroce`: run MetaRoCE scenarios and tools.
//!
//! - `metaroce` / `metaroce harness`: the embedded default: a verified 64 MiB
//!   RDMA WRITE between two devices over the deterministic fault harness,
//!   at 0 %, 1 %, 5 % and 10 % packet loss, with goodput as a fraction of the
//!   loss-free run.
//! - `metaroce chaos`: randomized fault simulation over many seeds; prints
//!   any failing seed with the command that reproduces it.
//! - `metaroce memory`: bytes held per idle connection and per idle QP.
//! - `metaroce perf`: perftest-style tools over the real UDP datapath.
//! - `metaroce sim`: the packet-level fabric simulator.
//! - `metaroce coll-perf`: nccl-tests' collective benchmarks over the real
//!   UDP datapath, ranks as processes on one machine or across hosts.
//! - `metaroce conformance --target HOST` / `metaroce
//!   conformance-responder`: the wire-spec conformance suite and a
//!   MetaRoCE target for it (`docs/spec/conformance.md`).
//!
//! Exit codes: 0 success; 1 `chaos` found a failing seed, or a conformance
//! check failed; 2 bad input or
//! a failed run (including data that did not verify), with one line on
//! stderr; 3 a simulation reached its end time with flows unfinished
//! (unless `--allow-unfinished`). Output into a closed pipe (`| head`) ends the
//! process quietly, as it does for coreutils.
// One `unsafe` block (SIGPIPE's disposition, in `main`), allowed there.
#![deny(unsafe_code)]

mod coll_perf;
mod compare;
mod conformance;
mod perf;
mod sim;

use clap::{Parser, Subcommand};
use metaroce_harness::chaos;
use metaroce_harness::rdma::{connect_qps, devices};
use metaroce_harness::scenario::{WriteScenario, one_write};
use metaroce_harness::{NetConfig, Network};
use metaroce_proto::EndpointConfig;
use metaroce_verbs::AccessFlags;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "metaroce",
    version,
    about = "MetaRoCE: RDMA over lossy, multipath Ethernet"
)]
struct Cli {
    /// Log the protocol core's spans and events to stderr, through this
    /// `tracing` filter: `info` (connections, path retirements, QP
    /// errors), `debug` (losses, probes, failovers, RTOs), `trace` (every
    /// resend), or
    /// e.g. `[conn{peer=10.0.0.2:4793}]=debug`. Takes precedence over
    /// METAROCE_LOG, which takes precedence over RUST_LOG; off by default.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The default: MetaRoCE beside RoCEv2, IRN and IB-style on an embedded
    /// 128-host AI fabric with collisions, loss, an incast and a link
    /// failure, and a verdict per target (about 5 s).
    Compare(compare::CompareArgs),
    /// One verified WRITE over the deterministic fault harness, swept over loss rates.
    Harness(HarnessArgs),
    /// Randomized fault simulation: N seeds of random devices, operations and faults.
    Chaos(ChaosArgs),
    /// Memory held by an idle connection and an idle QP.
    Memory,
    /// perftest-style tools over the real UDP datapath (write-bw, write-lat, ...).
    Perf(perf::PerfArgs),
    /// The packet-level fabric simulator.
    Sim(sim::SimArgs),
    /// nccl-tests over MetaRoCE: all_reduce, all_gather, reduce_scatter,
    /// alltoall, broadcast, reduce, sendrecv (`-h` after the collective
    /// for the options).
    CollPerf(coll_perf::CollPerfArgs),
    /// The conformance suite against a wire-spec responder (docs/spec/conformance.md):
    /// one PASS/FAIL/SKIP line per check; exit 1 on a failure.
    Conformance(conformance::ConformanceArgs),
    /// A MetaRoCE device set up as the conformance suite's target.
    ConformanceResponder(conformance::ResponderArgs),
}

#[derive(clap::Args, Debug, Clone)]
#[command(allow_negative_numbers = true)]
struct HarnessArgs {
    /// Message size in bytes (K, M, G suffixes are binary).
    #[arg(short = 's', long = "size", default_value = "64M", value_parser = parse_size)]
    size: u64,
    /// Loss rates to run, comma separated (probability per datagram, 0..1).
    #[arg(long, value_delimiter = ',', default_value = "0,0.01,0.05,0.1")]
    loss: Vec<f64>,
    /// Paths (UDP source ports) per connection.
    #[arg(long, default_value_t = 16)]
    paths: usize,
    /// Link rate in Gbit/s.
    #[arg(long, default_value_t = 100)]
    gbps: u64,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl Default for HarnessArgs {
    fn default() -> Self {
        Self {
            size: 64 << 20,
            loss: vec![0.0, 0.01, 0.05, 0.1],
            paths: 16,
            gbps: 100,
            seed: 1,
        }
    }
}

#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
struct ChaosArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 4096, 64K, 1M)"))?;
    let bytes = n
        .checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' is too large"))?;
    if bytes == 0 || bytes > (1 << 31) {
        return Err(format!("size '{s}' must be 1 B ..= 2 GiB"));
    }
    Ok(bytes)
}

/// Let a write into a closed pipe end the process, as it ends `cat` or
/// `seq`: `metaroce sim | head -3` then stops quietly instead of panicking
/// in `println!` (Rust starts programs with SIGPIPE ignored, so a write
/// into a closed pipe returns EPIPE and `println!` panics with exit 101).
///
/// Chosen over handling every write's error because output is written in
/// many places (tables, progress, the perf tools' rows) and one missed
/// `println!` would panic again. Sockets are unaffected: the TCP side
/// channel writes through std, which sends with `MSG_NOSIGNAL`, and UDP
/// sockets never raise SIGPIPE.
#[allow(unsafe_code)]
fn exit_quietly_on_closed_pipe() {
    // SAFETY: `signal` with `SIG_DFL` only changes this process's
    // disposition for SIGPIPE; it runs first in `main`, before any thread
    // starts, so no other thread can race on signal state, and no handler
    // (Rust code) ever runs in signal context.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Logging of the core's spans and events (see `metaroce_proto`'s
/// `trace` module: connections and paths as spans; setup, teardown,
/// losses, resends, RTOs, path retirements, retry timeouts and QP errors
/// as events) to stderr, filtered by `--log`, else `METAROCE_LOG`, else
/// `RUST_LOG` (`tracing`'s filter syntax). Off when none is set: no
/// subscriber is installed, and each event costs one check of a global
/// level.
fn init_logging(flag: Option<&str>) -> Result<(), String> {
    let from_env = || {
        ["METAROCE_LOG", "RUST_LOG"].into_iter().find_map(|v| {
            std::env::var(v)
                .ok()
                .filter(|s| !s.trim().is_empty())
                .map(|s| (v, s))
        })
    };
    let Some((source, spec)) = flag.map(|s| ("--log", s.to_owned())).or_else(from_env) else {
        return Ok(());
    };
    let filter = tracing_subscriber::EnvFilter::builder()
        .parse(&spec)
        .map_err(|e| {
            format!("{source} {spec:?} is not a log filter (e.g. info, debug, metaroce_proto=trace): {e}")
        })?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    Ok(())
}

fn main() -> ExitCode {
    exit_quietly_on_closed_pipe();
    let cli = Cli::parse();
    if let Err(msg) = init_logging(cli.log.as_deref()) {
        eprintln!("metaroce: {msg}");
        return ExitCode::from(2);
    }
    let result = match cli
        .command
        .unwrap_or(Command::Compare(compare::CompareArgs::default()))
    {
        Command::Compare(args) => compare::run(&args),
        Command::Harness(args) => harness(&args),
        Command::Chaos(args) => chaos_run(&args),
        Command::Memory => memory(),
        Command::Perf(args) => perf::run(args),
        Command::Sim(args) => sim::run(args),
        Command::CollPerf(args) => coll_perf::run(args),
        Command::Conformance(args) => conformance::run_suite(&args),
        Command::ConformanceResponder(args) => conformance::run_responder(&args),
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("metaroce: {msg}");
            ExitCode::from(2)
        }
    }
}

fn harness(args: &HarnessArgs) -> Result<ExitCode, String> {
    if args.loss.is_empty() {
        return Err("--loss: give at least one loss rate".into());
    }
    if let Some(bad) = args.loss.iter().find(|l| !(0.0..1.0).contains(*l)) {
        return Err(format!("--loss {bad} is not a probability in [0, 1)"));
    }
    if !(1..=256).contains(&args.paths) {
        return Err(format!("--paths {} must be 1..=256", args.paths));
    }
    if !(1..=1600).contains(&args.gbps) {
        return Err(format!("--gbps {} must be 1..=1600", args.gbps));
    }
    println!("MetaRoCE over the deterministic fault harness: one RDMA WRITE, verified");
    println!(
        "size {} B, {} paths, {} Gbit/s links, 2 us one-way delay, 3 us route jitter, seed {}",
        args.size, args.paths, args.gbps, args.seed
    );
    println!(
        "{:>6} {:>12} {:>14} {:>10} {:>10} {:>10} {:>9} {:>8}",
        "loss", "time[us]", "goodput[Gb/s]", "of 0%", "lost", "resent", "resent/l", "verified"
    );
    let mut base = None;
    for &loss in &args.loss {
        let wall = Instant::now();
        let s = WriteScenario {
            size_bytes: args.size,
            loss,
            paths: args.paths,
            rate_bps: args.gbps * 1_000_000_000,
            seed: args.seed,
            ..WriteScenario::default()
        };
        let r = one_write(&s)?;
        let gbps = r.goodput_bps / 1e9;
        let base_gbps = *base.get_or_insert(if loss == 0.0 { gbps } else { f64::NAN });
        let ratio = if r.data_lost > 0 {
            format!("{:.2}", r.resent as f64 / r.data_lost as f64)
        } else {
            "-".into()
        };
        println!(
            "{:>5.1}% {:>12.1} {:>14.2} {:>9.1}% {:>10} {:>10} {:>9} {:>8}",
            loss * 100.0,
            r.sim_ns as f64 / 1e3,
            gbps,
            100.0 * gbps / base_gbps,
            r.data_lost,
            r.resent,
            ratio,
            if r.verified { "yes" } else { "NO" }
        );
        eprintln!("  (wall {:.2} s)", wall.elapsed().as_secs_f64());
        if !r.verified {
            return Err(format!(
                "target bytes differ at loss {loss} (seed {})",
                args.seed
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn chaos_run(args: &ChaosArgs) -> Result<ExitCode, String> {
    if args.seeds == 0 {
        return Err("--seeds 0: run at least 1 seed".into());
    }
    if args.start.checked_add(args.seeds).is_none() {
        return Err(format!(
            "--start {} --seeds {}: the last seed is past 2^64 - 1",
            args.start, args.seeds
        ));
    }
    let wall = Instant::now();
    let mut failures = 0u64;
    let mut ops = 0usize;
    let mut bytes = 0u64;
    let (mut flaps, mut restarts, mut authenticated) = (0usize, 0usize, 0usize);
    for seed in args.start..args.start + args.seeds {
        match std::panic::catch_unwind(|| chaos::run_seed(seed)) {
            Ok(Ok(r)) => {
                ops += r.ops;
                bytes += r.bytes;
                flaps += r.link_flaps;
                restarts += usize::from(r.restart.is_some());
                authenticated += usize::from(r.auth.is_some());
            }
            Ok(Err(f)) => {
                failures += 1;
                println!("FAIL {f}");
            }
            Err(_) => {
                failures += 1;
                println!(
                    "FAIL seed {seed} panicked (rerun: metaroce chaos --start {seed} --seeds 1)"
                );
            }
        }
    }
    println!(
        "{} seeds from {}: {} operations, {} payload bytes, {} link flaps, {} peer restarts, {} seeds authenticated, {} failures, {:.1} s",
        args.seeds,
        args.start,
        ops,
        bytes,
        flaps,
        restarts,
        authenticated,
        failures,
        wall.elapsed().as_secs_f64()
    );
    Ok(if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn memory() -> Result<ExitCode, String> {
    let cfg = EndpointConfig::default();
    let mut net = Network::new(NetConfig::seeded(1), devices(2, &cfg, 1));
    let (a, _) = connect_qps(&mut net, 0, 1, AccessFlags(0xf));
    let peer = net.nodes[1].addr();
    let conn = net.nodes[0]
        .ctx
        .connection_memory_bytes(peer)
        .ok_or("no connection")?;
    let qp = net.nodes[0].ctx.qp_memory_bytes(a.qp).ok_or("no QP")?;
    println!(
        "idle connection ({} paths): {conn} bytes",
        cfg.paths_per_connection
    );
    println!("idle QP: {qp} bytes");
    Ok(ExitCode::SUCCESS)
}
