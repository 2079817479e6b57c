//! Randomized fault simulation over many seeds. Each failing seed is printed
//! with the command that reproduces it.

use metaroce_harness::chaos::{ChaosReport, run_seed};
use metaroce_harness::seed_from_env_or;

fn run_range(seeds: std::ops::Range<u64>) -> Vec<ChaosReport> {
    let mut failures = Vec::new();
    let mut ops = 0;
    let mut reports = Vec::new();
    for seed in seeds.clone() {
        match std::panic::catch_unwind(|| run_seed(seed)) {
            Ok(Ok(report)) => {
                ops += report.ops;
                reports.push(report);
            }
            Ok(Err(f)) => failures.push(f.to_string()),
            Err(_) => failures.push(format!(
                "seed {seed} panicked (rerun: METAROCE_SEED={seed})"
            )),
        }
    }
    let authenticated = reports.iter().filter(|r| r.auth.is_some()).count();
    let flaps: usize = reports.iter().map(|r| r.link_flaps).sum();
    let restarts = reports.iter().filter(|r| r.restart.is_some()).count();
    eprintln!(
        "seeds {seeds:?}: {ops} operations, {authenticated} seeds authenticated, {flaps} link flaps, {restarts} peer restarts, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    reports
}

#[test]
fn chaos_seeds_0_to_250() {
    let reports = run_range(0..250);
    // The seeds cover the fault kinds added after the first ones.
    let authenticated: Vec<_> = reports.iter().filter(|r| r.auth.is_some()).collect();
    assert!(
        authenticated.iter().any(|r| r.auth == Some(true)),
        "some encrypted"
    );
    assert!(
        authenticated.iter().any(|r| r.auth == Some(false)),
        "some authenticated only"
    );
    assert!(
        authenticated.iter().any(|r| r.auth_rejected > 0),
        "corruption and duplicates caught by the tag and the replay window"
    );
    assert!(reports.iter().filter(|r| r.link_flaps > 0).count() > 50);
    assert!(reports.iter().filter(|r| r.restart.is_some()).count() > 20);
}

#[test]
fn chaos_seeds_250_to_500() {
    run_range(250..500);
}

/// One seed from METAROCE_SEED (default 0), for reproducing a failure.
#[test]
fn chaos_one_seed_from_env() {
    let seed = seed_from_env_or(0);
    if let Err(f) = run_seed(seed) {
        panic!("{f}");
    }
}

/// The long run: `cargo test --release -p metaroce-harness --test chaos -- --ignored`.
#[test]
#[ignore = "long: 20,000 seeds"]
fn chaos_many_seeds() {
    run_range(500..20_500);
}
