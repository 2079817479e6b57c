//! Baselines validated against known behaviour: DCQCN fairness, go-back-N
//! resending the whole window, PFC head-of-line blocking of a victim flow,
//! and PFC pauses spreading upstream.

use metaroce_sim::fabric::{EcnConfig, FabricConfig, PfcConfig};
use metaroce_sim::sim::Sim;
use metaroce_sim::topology::{LinkParams, NodeRef, Topology};
use metaroce_sim::transport::rc::{RcFactory, RcHost, RcPacket};
use metaroce_sim::transport::{ChannelPlan, HostInfo, Transport, TransportFactory, irn, rocev2};
use metaroce_sim::workload::{FlowSet, FlowSpec};
use metaroce_sim::{PS_PER_US, Ps, Scenario, run_scenario};

const G100: u64 = 100_000_000_000;

fn lp(host_gbps: u64, fabric_gbps: u64) -> LinkParams {
    LinkParams {
        host_bps: host_gbps * 1_000_000_000,
        fabric_bps: fabric_gbps * 1_000_000_000,
        delay_ps: PS_PER_US,
    }
}

fn pfc_fabric() -> FabricConfig {
    FabricConfig {
        pfc: Some(PfcConfig {
            xoff_bytes: 50_000,
            xon_bytes: 25_000,
            // Covers a pause's round trip on a 1 us, 400G link (100 KB).
            headroom_bytes: Some(120_000),
            max_frame_bytes: 4200,
        }),
        ..FabricConfig::default()
    }
}

#[test]
fn dcqcn_two_flows_converge_to_fair_rates() {
    // Two senders into one 100G receiver port; the second starts 100 us late
    // (at line rate, while the first has already settled).
    let topo = Topology::leaf_spine(3, 3, 0, 1, 1, lp(100, 100));
    let cfg = FabricConfig {
        ecn: Some(EcnConfig {
            kmin_bytes: 5_000,
            kmax_bytes: 200_000,
            pmax: 0.01,
        }),
        // PFC as the paper deploys it: a backstop well above Kmax, so ECN
        // and DCQCN, not pauses, share the bottleneck.
        pfc: Some(PfcConfig {
            xoff_bytes: 400_000,
            xon_bytes: 300_000,
            headroom_bytes: Some(120_000),
            max_frame_bytes: 4200,
        }),
        ..FabricConfig::default()
    };
    let mut w = FlowSet::default();
    w.flows.push(FlowSpec::at(0, 2, 2_000_000_000, 0));
    w.flows
        .push(FlowSpec::at(1, 2, 2_000_000_000, 100 * PS_PER_US));
    let f = rocev2::factory(4096, 1, true);
    // Sample both rates through the run; average over its last three quarters.
    let end = 60_000 * PS_PER_US;
    let (mut sa, mut sb, mut n) = (0.0, 0.0, 0.0);
    let mut sim = Sim::new(topo, cfg, &f, w, 1, end).unwrap();
    sim.run(|s| {
        if s.now() >= end / 4 {
            sa += s.host(0).qp_rates_bps()[0];
            sb += s.host(1).qp_rates_bps()[0];
            n += 1.0;
        }
    })
    .unwrap();
    assert!(n > 10.0, "{n} samples");
    assert!(sim.host(0).counters().cnps_received > 0);
    assert!(sim.host(1).counters().cnps_received > 0);
    let (ra, rb) = (sa / n, sb / n);
    let unfair = (ra - rb).abs() / ra.max(rb);
    assert!(
        unfair < 0.10,
        "mean rates {:.2} / {:.2} Gb/s differ by {:.1}%",
        ra / 1e9,
        rb / 1e9,
        unfair * 100.0
    );
    assert!(ra + rb < 1.2 * G100 as f64 && ra + rb > 0.5 * G100 as f64);
    // Bytes each sender put on its link agree too.
    let tx = |h: u32| {
        sim.ports()
            .iter()
            .find(|p| p.owner == NodeRef::Host(h))
            .unwrap()
            .c
            .tx_bytes as f64
    };
    let (ba, bb) = (tx(0), tx(1));
    assert!((ba - bb).abs() / ba.max(bb) < 0.10, "bytes {ba} / {bb}");
}

/// Drive two hosts back to back by hand: A sends a whole message (the
/// window in flight), the network drops PSN 10 once, then everything is
/// delivered and B's replies go back to A, until A is done.
fn one_forced_drop(f: &RcFactory, packets: u32) -> (RcHost, RcHost) {
    let info = |index| HostInfo {
        index,
        line_rate_bps: G100,
        base_rtt_ps: 10 * PS_PER_US,
        seed: 1,
    };
    let (mut a, mut b) = (f.host(&info(0)).unwrap(), f.host(&info(1)).unwrap());
    let ch = f
        .open_channel(
            0,
            &mut a,
            0,
            &mut b,
            1,
            ChannelPlan {
                messages: 1,
                senders_to_receiver: 1,
            },
        )
        .unwrap();
    a.post_message(0, ch, u64::from(packets) * 4096, 7).unwrap();
    let mut now: Ps = 0;
    let mut dropped = false;
    let mut done = false;
    for _round in 0..100 {
        now += PS_PER_US;
        let mut burst = Vec::new();
        while let Some(p) = a.poll_packet(now) {
            burst.push(p);
        }
        for (wire, pkt) in &burst {
            if let RcPacket::Data { psn: 10, .. } = pkt
                && !dropped
            {
                dropped = true;
                continue;
            }
            b.handle_packet(now, 0, wire, false, pkt);
        }
        while let Some((wire, pkt)) = b.poll_packet(now) {
            a.handle_packet(now, 1, &wire, false, &pkt);
        }
        while let Some(e) = a.poll_event() {
            done |= matches!(e, metaroce_sim::transport::MessageEvent::Sent { tag: 7 });
        }
        if done {
            break;
        }
    }
    assert!(done, "message completed");
    (a, b)
}

#[test]
fn go_back_n_resends_the_whole_window_after_one_loss() {
    let n = 100;
    let (a, b) = one_forced_drop(&rocev2::factory(4096, 1, false), n);
    let s = a.stats();
    // PSN 10 lost: the receiver drops 11..99 as out of order and NAKs 10
    // once; the sender rewinds and resends 10..99.
    assert_eq!(s.data_packets, u64::from(n));
    assert_eq!(s.retransmissions, u64::from(n - 10), "{s:?}");
    assert_eq!(b.stats().nacks, 1);
    assert_eq!(b.counters().ooo_dropped, u64::from(n - 11));
    // IRN on the same loss resends only the hole.
    let (a, _) = one_forced_drop(&irn::factory(4096, 1, false), n);
    assert_eq!(a.stats().retransmissions, 1, "{:?}", a.stats());
}

/// Victim-flow scenario on a 2-leaf, 1-spine fabric with 400G fabric links:
/// hosts 0,1,2 (leaf 0) and 7 (leaf 1) incast into host 5 (leaf 1); the
/// victim 3 -> 6 shares only the leaf0 -> spine -> leaf1 links, never the
/// congested port leaf1 -> host 5.
fn victim_fct(with_incast: bool) -> (Ps, u64) {
    let topo = Topology::leaf_spine(8, 4, 1, 1, 1, lp(100, 400));
    let mut w = FlowSet::default();
    w.flows.push(FlowSpec::at(3, 6, 4_000_000, 0));
    if with_incast {
        for s in [0, 1, 2, 7] {
            w.flows.push(FlowSpec::at(s, 5, 4_000_000, 0));
        }
    }
    let f = rocev2::factory(4096, 1, false);
    let mut sim = Sim::new(topo, pfc_fabric(), &f, w, 1, 100_000 * PS_PER_US).unwrap();
    sim.run(|_| {}).unwrap();
    let r = sim.measurements().flows[0];
    let pauses = sim.ports().iter().map(|p| p.c.pauses).sum();
    (r.received.unwrap() - r.started.unwrap(), pauses)
}

#[test]
fn pfc_head_of_line_blocking_slows_a_victim_flow() {
    let (alone, p0) = victim_fct(false);
    let (shared, p1) = victim_fct(true);
    assert_eq!(p0, 0);
    assert!(p1 > 0);
    // Alone: 4 MB at 100G = 320 us. With the incast it crosses no congested
    // port and has 300G spare on the fabric links, yet pauses hold it.
    assert!(
        shared > 2 * alone,
        "victim FCT alone {} us, next to the incast {} us",
        alone / PS_PER_US,
        shared / PS_PER_US
    );
}

#[test]
fn pfc_pauses_spread_upstream_from_a_slow_receiver() {
    // Hosts 0..3 on leaf 0 send to host 4 on leaf 1, whose 100G link drains
    // a quarter of what arrives: leaf 1 pauses the spine (hop 1), the spine
    // pauses leaf 0 (hop 2), leaf 0 pauses the senders' NICs (hop 3).
    let topo = Topology::leaf_spine(8, 4, 1, 1, 1, lp(100, 400));
    let mut w = FlowSet::default();
    for s in 0..4 {
        w.flows.push(FlowSpec::at(s, 4, 2_000_000, 0));
    }
    let f = rocev2::factory(4096, 1, false);
    let mut sim = Sim::new(topo, pfc_fabric(), &f, w, 1, 100_000 * PS_PER_US).unwrap();
    sim.run(|_| {}).unwrap();
    assert_eq!(sim.waiting(), 0);
    let topo = sim.topology();
    let mut spine_paused = 0;
    let mut leaf_up_paused = 0;
    let mut nic_paused = 0;
    for p in sim.ports() {
        match (p.owner, p.peer) {
            (NodeRef::Switch(s), NodeRef::Switch(_)) if topo.switches[s as usize].tier == 1 => {
                spine_paused += p.c.pauses;
            }
            (NodeRef::Switch(_), NodeRef::Switch(_)) => leaf_up_paused += p.c.pauses,
            (NodeRef::Host(_), _) => nic_paused += p.c.pauses,
            _ => {}
        }
    }
    assert!(spine_paused > 0, "hop 1 (spine -> leaf 1) paused");
    assert!(leaf_up_paused > 0, "hop 2 (leaf 0 -> spine) paused");
    assert!(nic_paused > 0, "hop 3 (sender NICs) paused");
    // Lossless: nothing dropped, nothing resent.
    assert_eq!(sim.transport_stats().retransmissions, 0);
    assert!(sim.ports().iter().all(|p| p.c.drops == 0));
}

#[test]
fn every_transport_runs_the_committed_scenario_f() {
    let s = Scenario::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scenarios/F-perm-128-ft-roce-pfc.toml"
    )))
    .unwrap();
    for t in ["rocev2", "irn", "ib"] {
        let mut s = s.clone();
        s.transport.kind = t.into();
        s.workload[0].bytes = 200_000;
        let o = run_scenario(&s, None, &mut |_, _, _, _| {}).unwrap();
        assert!(o.results.finished, "{t}");
        assert_eq!(o.results.transport, t);
        assert_eq!(o.results.fct.completed, 128, "{t}");
        if t == "ib" {
            assert_eq!(o.results.fabric.drops, 0);
            assert_eq!(o.results.fabric.pfc_pauses, 0);
        }
    }
}
