//! `metaroce` with no arguments (or `metaroce compare`): MetaRoCE beside
//! RoCEv2, IRN and IB-style on the embedded AI-fabric suite
//! (`scenarios/main`, built into the binary), a figure per transport and a
//! verdict per target. The full suite behind RESULTS.md is
//! `metaroce sim suite scenarios/claims`.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use metaroce_sim::suite::Suite;

const SUITE: &str = include_str!("../../../scenarios/main/suite.toml");
const FABRIC: &str = include_str!("../../../scenarios/main/ai-fabric.toml");

/// Options of `metaroce compare`.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct CompareArgs {
    /// Worker threads, 1..=1024 [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Run only the experiments whose id contains this (collisions, loss,
    /// incast, failure; a comma-separated list: any of them).
    #[arg(long, default_value = "")]
    only: String,
}

pub(crate) fn run(args: &CompareArgs) -> Result<ExitCode, String> {
    let threads = match args.threads {
        Some(n) if !(1..=1024).contains(&n) => {
            return Err(format!("--threads {n} must be 1..=1024"));
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let suite = Suite::embedded(
        Path::new("scenarios/main"),
        SUITE,
        &[("ai-fabric.toml", FABRIC)],
    )
    .map_err(|e| e.to_string())?;
    crate::sim::check_only(&suite, &args.only)?;
    let scenario = suite.scenario(0, &[]).map_err(|e| e.to_string())?;
    println!("MetaRoCE beside RoCEv2 (PFC, DCQCN), IRN (no PFC) and IB-style credits");
    println!(
        "fabric: {}  (seed {}; scenarios/main in the repository)",
        scenario.name, scenario.seed
    );
    let show = std::io::stderr().is_terminal();
    let wall = Instant::now();
    let results = crate::sim::run_suite(&suite, &args.only, threads, show);
    let width = 12;
    print!("\n{:<12} {:<26}", "experiment", "figure");
    for t in &suite.transports {
        print!(" {t:>width$}");
    }
    println!();
    for r in &results {
        for row in &r.rows {
            let label = if row.variant.is_empty() {
                r.id.clone()
            } else {
                format!("{} {}", r.id, row.variant)
            };
            print!("{label:<12} {:<26}", r.shown);
            for t in &suite.transports {
                match row.shown.get(t).copied().flatten() {
                    Some(v) => print!(" {:>width$}", figure(v)),
                    None => print!(" {:>width$}", "failed"),
                }
            }
            println!();
        }
    }
    println!("\nverdicts (MetaRoCE):");
    let (mut met, mut all) = (0, 0);
    for r in &results {
        for row in &r.rows {
            for (label, value, ok) in &row.targets {
                all += 1;
                met += usize::from(*ok);
                let v = value.map_or("-".to_string(), figure);
                let verdict = if *ok { "met    " } else { "NOT MET" };
                println!("  {verdict}  {}: {label}  ({v})", r.id);
            }
            for e in &row.errors {
                println!("  error    {}: {e}", r.id);
            }
        }
    }
    println!(
        "\n{met} of {all} targets met in {:.1} s on {threads} threads. Tables and rerun commands: \
         metaroce sim suite scenarios/main; the full suite: metaroce sim suite scenarios/claims.",
        wall.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// Three significant figures, no exponent.
fn figure(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}
