//! The baselines are as strong as the systems they stand for: InfiniBand's
//! link layer recovers credit lost with packets and sizes it to the credit
//! loop at every speed, and a lossless RoCEv2 fabric with default PFC
//! headroom never drops. Each of these failed on the build before the fix.

use metaroce_sim::sim::credit_loop_bytes;
use metaroce_sim::{Scenario, run_scenario};

fn run_text(text: &str, transport: &str) -> metaroce_sim::Outcome {
    let mut s = Scenario::parse(text, "test.toml").expect("valid scenario");
    s.transport.kind = transport.into();
    run_scenario(&s, None, &mut |_, _, _, _| {}).expect("runs")
}

#[test]
fn credit_loop_covers_rate_times_round_trip_plus_frames() {
    // 1 us of cable at 400 Gb/s: 50 000 B each way, plus three frames.
    assert_eq!(
        credit_loop_bytes(400_000_000_000, 1_000_000, 4160),
        100_000 + 3 * 4160
    );
    // Linear in rate and delay: the loop never falls behind a faster link.
    for gbps in [100u64, 200, 400, 800] {
        let c = credit_loop_bytes(gbps * 1_000_000_000, 1_000_000, 4160);
        assert_eq!(c, gbps * 250 + 3 * 4160, "{gbps} G");
    }
}

/// A 16-host fat tree with 3 % random loss on every link: every credit
/// spent on a lost packet used to leak, links stalled for good and no flow
/// finished; with the link layer's resynchronisation every flow does.
#[test]
fn ib_finishes_a_lossy_permutation() {
    let o = run_text(
        "name = \"ib lossy\"\nend_us = 20000\n[topology]\nkind = \"fat_tree\"\nhosts = 16\nk = 4\nlink_gbps = 100\n\
         [switch]\nloss = 0.03\n[[workload]]\nkind = \"permutation\"\nbytes = 1000000\n",
        "ib",
    );
    assert!(o.results.finished, "IB did not finish: {:?}", o.results.fct);
    assert!(o.results.transport_stats.retransmissions > 0);
}

/// 400 Gb/s leaf-spine with 150 KB port buffers: credits of an eighth of the
/// buffer (18.75 KB) were a fifth of the 1 us link's loop, and IB ran at
/// 27 % of line rate; sized from the loop it runs near line rate.
#[test]
fn ib_at_400g_runs_a_full_bisection_permutation_near_line_rate() {
    let bytes = 4_000_000u64;
    let o = run_text(
        &format!(
            "name = \"ib 400g\"\n[topology]\nkind = \"leaf_spine\"\nhosts = 32\nhosts_per_leaf = 8\nlink_gbps = 400\nlatency_ns = 500\n\
             [switch]\nbuffer_bytes = 150000\n[[workload]]\nkind = \"permutation\"\nbytes = {bytes}\n"
        ),
        "ib",
    );
    assert!(o.results.finished);
    let p50_us = o.results.fct.p50_us;
    let line_us = bytes as f64 * 8.0 / 400e3;
    assert!(
        line_us / p50_us > 0.85,
        "median flow at {:.0} % of line rate",
        100.0 * line_us / p50_us
    );
}

/// RoCEv2 with PFC on and no DCQCN, an incast and a permutation at once on a
/// 1 us-per-hop fat tree: with the default (computed) headroom the lossless
/// class drops nothing at any speed; 64 KB of fixed headroom dropped
/// thousands of packets at 400 and 800 Gb/s.
#[test]
fn pfc_default_headroom_never_drops() {
    for gbps in [100, 200, 400, 800] {
        let o = run_text(
            &format!(
                "name = \"pfc {gbps}\"\nend_us = 20000\n[topology]\nkind = \"fat_tree\"\nhosts = 16\nk = 4\nlink_gbps = {gbps}\nlatency_ns = 1000\n\
                 [switch]\npfc = true\n[transport]\ndcqcn = false\n\
                 [[workload]]\nkind = \"incast\"\nbytes = 1000000\nreceiver = 0\n\
                 [[workload]]\nkind = \"permutation\"\nbytes = 1000000\n"
            ),
            "rocev2",
        );
        let f = &o.results.fabric;
        assert!(f.pfc_pauses > 0, "{gbps} G: PFC never engaged");
        assert_eq!((f.drops, f.headroom_drops), (0, 0), "{gbps} G dropped");
        assert!(o.results.finished, "{gbps} G did not finish");
    }
}
