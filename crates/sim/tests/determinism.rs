//! Same scenario and seed: byte-identical results; snapshots of small runs.

use metaroce_sim::{Scenario, report, run_scenario};
use std::path::PathBuf;

fn scenario(name: &str) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(name);
    Scenario::load(&p).expect("valid scenario")
}

#[test]
fn same_seed_gives_byte_identical_json() {
    let s = scenario("small-mix.toml");
    let a = run_scenario(&s, None, &mut |_, _, _, _| {}).unwrap();
    let b = run_scenario(&s, None, &mut |_, _, _, _| {}).unwrap();
    assert_eq!(a.results_json(), b.results_json());
    assert_eq!(a.flows_csv, b.flows_csv);
    let c = run_scenario(&s, Some(s.seed + 1), &mut |_, _, _, _| {}).unwrap();
    assert_ne!(a.results_json(), c.results_json(), "the seed must matter");
}

/// Compare a run's summary table with the committed snapshot;
/// `UPDATE_SNAPSHOTS=1` rewrites it.
fn snapshot(scn: &str) {
    let s = scenario(scn);
    let o = run_scenario(&s, None, &mut |_, _, _, _| {}).unwrap();
    let got = report::summary_table(&o.results);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(scn.replace(".toml", ".txt"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        got == want,
        "snapshot {} differs (UPDATE_SNAPSHOTS=1 to accept):\n--- want\n{want}\n--- got\n{got}",
        path.display()
    );
}

#[test]
fn snapshot_small_mix() {
    snapshot("small-mix.toml");
}

#[test]
fn snapshot_incast_pfc() {
    snapshot("incast-16-pfc.toml");
}

#[test]
fn snapshot_failover_multiplane() {
    snapshot("multiplane-failure.toml");
}
