//! Closed-form checks of the fabric model.

use metaroce_sim::address::host_ipv4_bits;
use metaroce_sim::fabric::{FabricConfig, ecmp_hash};
use metaroce_sim::sim::Sim;
use metaroce_sim::topology::{LinkParams, Topology};
use metaroce_sim::transport::metaroce::MetaRoceFactory;
use metaroce_sim::workload::{FlowSet, FlowSpec};
use metaroce_sim::{PS_PER_US, Ps, Scenario, run_scenario};

fn run_text(text: &str) -> metaroce_sim::Outcome {
    let s = Scenario::parse(text, "test.toml").expect("valid scenario");
    run_scenario(&s, None, &mut |_, _, _, _| {}).expect("runs")
}

#[test]
fn one_flow_over_one_link_takes_size_over_rate_plus_delay() {
    for (gbps, bytes) in [(100u64, 1_000_000u64), (400, 4_000_000), (800, 300_000)] {
        let rate = gbps * 1_000_000_000;
        let delay: Ps = 1_500 * 1_000;
        let lp = LinkParams {
            host_bps: rate,
            fabric_bps: rate,
            delay_ps: delay,
        };
        let mut w = FlowSet::default();
        w.flows.push(FlowSpec::at(0, 1, bytes, 0));
        // ACK every packet at once, so the sender's window (one BDP) is never
        // waiting on a delayed ACK: this test is about the link, not the core.
        let mut factory = MetaRoceFactory::default();
        factory.base.ack_every_packets = 1;
        factory.base.ack_delay_ns = 1;
        factory.base_rtt_override_ns = Some(20_000);
        // And a full window from the first packet: no cold start.
        factory.base.cc_params.initial_window_mss = 0;
        // And no tail copies: the bytes on the wire are the transfer's own.
        factory.base.tail_copy_packets = 0;
        let mut sim = Sim::new(
            Topology::back_to_back(lp),
            FabricConfig::default(),
            &factory,
            w,
            1,
            1 << 50,
        )
        .unwrap();
        sim.run(|_| {}).unwrap();
        let run = sim.measurements().flows[0];
        let fct = run.received.unwrap() - run.started.unwrap();
        // Bytes the sender put on the wire: payload plus per-packet headers.
        let wire = sim.ports()[0].c.tx_bytes;
        let packets = sim.ports()[0].c.tx_packets;
        assert!(
            wire >= bytes && wire < bytes + bytes / 20,
            "header overhead {wire} for {bytes}"
        );
        let ideal = (u128::from(wire) * 8_000_000_000_000 / u128::from(rate)) as Ps + delay;
        let packet_time = (u128::from(wire / packets) * 8_000_000_000_000 / u128::from(rate)) as Ps;
        assert!(
            fct.abs_diff(ideal) <= packet_time,
            "{gbps}G {bytes} B: fct {fct} ps, ideal {ideal} ps, packet time {packet_time} ps"
        );
    }
}

// These checks are about the fabric's queues, so the hosts run a
// sender-driven transport that fills them (RoCEv2's DCQCN): MetaRoCE's
// receiver grants keep an incast's queue below any of these thresholds.
const STAR: &str = r#"
name = "star"
[topology]
kind = "star"
hosts = 5
link_gbps = 100
latency_ns = 1000
[transport]
kind = "rocev2"
"#;

#[test]
fn ecn_marks_only_above_kmin_and_always_above_kmax() {
    // No marking when Kmin is above any queue the incast can build.
    let never = run_text(&format!(
        "{STAR}[switch]\nbuffer_bytes = 400000\necn_kmin_bytes = 500000\necn_kmax_bytes = 600000\n[[workload]]\nkind = \"incast\"\nbytes = 300000\nreceiver = 4\n"
    ));
    assert_eq!(never.results.fabric.ecn_marks, 0);
    // Step marking at 20 KB: marks happen and the transport reacts.
    let step = run_text(&format!(
        "{STAR}[switch]\nbuffer_bytes = 400000\necn_kmin_bytes = 20000\necn_kmax_bytes = 20000\n[[workload]]\nkind = \"incast\"\nbytes = 300000\nreceiver = 4\n"
    ));
    assert!(step.results.fabric.ecn_marks > 0);
    // Every marked packet found a queue above Kmin: the downlink's queue seen
    // by arrivals must have exceeded 20 KB at least as often as marks were made.
    let down = step
        .results
        .tiers
        .iter()
        .find(|t| t.tier == "switch_down")
        .unwrap();
    assert!(down.queue_max_bytes > 20_000);
    assert_eq!(step.results.fct.completed, 4);
}

#[test]
fn pfc_pauses_the_upstream_port_and_resumes_it() {
    // 4:1 incast into a lossless switch with a small XOFF and a buffer that
    // would otherwise overflow: senders are paused, nothing is dropped, and
    // every flow completes (so every pause was followed by a resume).
    let o = run_text(&format!(
        "{STAR}[switch]\nbuffer_bytes = 60000\npfc = true\npfc_xoff_bytes = 20000\npfc_xon_bytes = 10000\npfc_headroom_bytes = 30000\n[[workload]]\nkind = \"incast\"\nbytes = 500000\nreceiver = 4\n"
    ));
    let up = o
        .results
        .tiers
        .iter()
        .find(|t| t.tier == "host_up")
        .unwrap();
    assert!(up.pauses > 0, "senders were never paused");
    assert!(up.paused_us > 0.0);
    assert_eq!(o.results.fabric.drops, 0);
    assert_eq!(o.results.fabric.headroom_drops, 0);
    assert_eq!(o.results.fct.completed, 4);
    // The receiver's link is the bottleneck and stays busy: 2 MB at 100 Gb/s.
    assert!(
        o.results.makespan_us > 160.0 && o.results.makespan_us < 260.0,
        "{}",
        o.results.makespan_us
    );
    // Without PFC the same buffer overflows.
    let lossy = run_text(&format!(
        "{STAR}[switch]\nbuffer_bytes = 60000\n[[workload]]\nkind = \"incast\"\nbytes = 500000\nreceiver = 4\n"
    ));
    assert!(lossy.results.fabric.drops > 0);
}

#[test]
fn ecmp_spreads_source_ports_evenly() {
    let uplinks = 8u64;
    let mut counts = [0u32; 8];
    for sport in 0..4096u16 {
        let h = ecmp_hash(
            host_ipv4_bits(0),
            host_ipv4_bits(1),
            49152 + sport,
            4791,
            17,
            0x1234,
        );
        counts[(h % uplinks) as usize] += 1;
    }
    for c in counts {
        assert!((448..=576).contains(&c), "{counts:?}");
    }
    // In the fabric: a permutation with 16 paths per connection loads every
    // leaf up-link to within 2x of the mean.
    let o = run_text(
        "name = \"ls\"\n[topology]\nkind = \"leaf_spine\"\nhosts = 32\nhosts_per_leaf = 8\nspines = 8\nlink_gbps = 100\n[[workload]]\nkind = \"permutation\"\nbytes = 2000000\n",
    );
    let up = o
        .results
        .tiers
        .iter()
        .find(|t| t.tier == "leaf_up")
        .unwrap();
    assert!(
        up.util_max < 2.0 * up.util_mean,
        "max {} mean {}",
        up.util_max,
        up.util_mean
    );
    let _ = PS_PER_US;
}
