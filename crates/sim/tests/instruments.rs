//! The instruments the AI-scale claims are measured with: placement,
//! tunables, per-link series, losses split by kind, end-to-end loss,
//! failure quiesce times, incast settling, fairness and per-workload
//! transport counters.

use metaroce_sim::{Scenario, run_scenario};

const FT16: &str = "name = \"t\"\nend_us = 20000\n[topology]\nkind = \"fat_tree\"\nhosts = 16\nk = 4\nlink_gbps = 100\n";

fn run(text: &str) -> metaroce_sim::Outcome {
    let s = Scenario::parse(text, "t.toml").expect("valid scenario");
    run_scenario(&s, None, &mut |_, _, _, _| {}).expect("runs")
}

fn parse_err(text: &str) -> String {
    Scenario::parse(text, "t.toml").unwrap_err().to_string()
}

#[test]
fn workloads_run_on_the_hosts_they_name() {
    let o = run(&format!(
        "{FT16}[[workload]]\nkind = \"permutation\"\nbytes = 100000\nhosts = \"8-15\"\nname = \"upper half\"\n"
    ));
    let csv = o.flows_csv;
    let mut rows = 0;
    for line in csv.lines().skip(1) {
        let cols: Vec<&str> = line.split(',').collect();
        let (src, dst): (u32, u32) = (cols[1].parse().unwrap(), cols[2].parse().unwrap());
        assert!((8..16).contains(&src) && (8..16).contains(&dst), "{line}");
        assert!(line.contains("upper half"), "group column: {line}");
        rows += 1;
    }
    assert_eq!(rows, 8);
    assert_eq!(o.results.collectives[0].name, "upper half");
}

#[test]
fn impossible_placements_name_key_and_line() {
    let e = parse_err(&format!(
        "{FT16}[[workload]]\nkind = \"all_to_all\"\nbytes = 1\n\n[[workload]]\nkind = \"ring_allreduce\"\nbytes = 1000\nranks = 17\n"
    ));
    assert_eq!(
        e,
        "t.toml:15: workload.ranks: 17 ranks, but the workload has 16 hosts"
    );
    let e = parse_err(&format!(
        "{FT16}[[workload]]\nkind = \"incast\"\nbytes = 1\nreceiver = 3\nhosts = \"0-7\"\nsenders = 8\n"
    ));
    assert_eq!(
        e,
        "t.toml:13: workload.senders: 8 senders, but only 7 hosts besides the receiver"
    );
    let e = parse_err(&format!(
        "{FT16}[[workload]]\nkind = \"permutation\"\nbytes = 1\nhosts = [1, \"20-30\"]\n"
    ));
    assert!(
        e.starts_with("t.toml:11: workload.hosts: '20-30': host 30 is beyond"),
        "{e}"
    );
}

#[test]
fn ring_order_and_step_trigger_follow_the_scenario() {
    let text = |extra: &str| {
        format!("{FT16}[[workload]]\nkind = \"ring_allreduce\"\nbytes = 1600000\n{extra}")
    };
    let rank = run(&text(""));
    let random = run(&text("order = \"random\"\n"));
    // Flows go rank by rank, 2(n-1) = 30 each: the first of each rank is
    // its step 0, to its ring successor.
    let first_pairs = |o: &metaroce_sim::Outcome| -> Vec<String> {
        o.flows_csv
            .lines()
            .skip(1)
            .step_by(30)
            .take(3)
            .map(|l| l.split(',').skip(1).take(2).collect::<Vec<_>>().join(">"))
            .collect()
    };
    assert_eq!(first_pairs(&rank), ["0>1", "1>2", "2>3"]);
    assert_ne!(first_pairs(&random), first_pairs(&rank));
    // Chaining on acknowledged sends waits longer per step than on data.
    let sent = run(&text("step_trigger = \"sent\"\n"));
    assert!(sent.results.collectives[0].time_us > rank.results.collectives[0].time_us);
}

#[test]
fn library_collectives_run_with_their_algorithms_and_chunks() {
    let text = |extra: &str| format!("{FT16}[[workload]]\nkind = \"collective\"\n{extra}");
    // A tree all-reduce of 256 KiB in 64 KiB chunks: 4 rounds, each rank
    // sending each chunk up once and down once per child.
    let tree = run(&text(
        "collective = \"all_reduce\"\nalgorithm = \"tree\"\nbytes = 262144\nchunk_bytes = 65536\n",
    ));
    let c = &tree.results.collectives[0];
    assert_eq!(c.name, "all_reduce tree 16");
    assert!(c.complete);
    // 15 edges of the tree, both ways, 4 chunks.
    assert_eq!(tree.results.fct.flows, 15 * 2 * 4);
    // All-gather: busbw is algbw × (n-1)/n.
    let gather = run(&text("collective = \"all_gather\"\nbytes = 1048576\n"));
    let c = &gather.results.collectives[0];
    assert!(c.complete);
    let factor = c.busbw_gbs / c.algbw_gbs;
    assert!((factor - 15.0 / 16.0).abs() < 0.01, "{factor}");
    // Broadcast from a root given as a rank.
    let bcast = run(&text(
        "collective = \"broadcast\"\nbytes = 1048576\nroot = 5\nhosts = \"8-15\"\n",
    ));
    // Rank 5 is host 13: the chain starts there, nothing flows into it.
    for line in bcast.flows_csv.lines().skip(1) {
        let cols: Vec<&str> = line.split(',').collect();
        assert_ne!(cols[2], "13", "{line}");
        if cols[1] == "13" {
            assert_eq!(cols[2], "14", "{line}");
        }
    }
    // What the library refuses is refused with the key and its line.
    assert_eq!(
        parse_err(&text(
            "collective = \"all_gather\"\nbytes = 4096\nalgorithm = \"tree\"\n"
        )),
        "t.toml:12: workload.algorithm: all_gather has no tree algorithm"
    );
    assert_eq!(
        parse_err(&text("collective = \"gather\"\nbytes = 4096\n")),
        "t.toml:10: workload.collective: unknown collective 'gather' (all_reduce, all_gather, reduce_scatter, alltoall, broadcast, reduce or sendrecv)"
    );
    assert_eq!(
        parse_err(&text("collective = \"reduce\"\nbytes = 4096\nroot = 16\n")),
        "t.toml:12: workload.root: invalid operation: root 16 is not among 16 ranks"
    );
    assert_eq!(
        parse_err(&text(
            "collective = \"all_reduce\"\nbytes = 4096\nslots = 1\n"
        )),
        "t.toml:12: workload.slots: invalid communicator configuration: slots per peer must be 2..=256, got 1"
    );
    assert!(
        parse_err(&format!(
            "{FT16}[[workload]]\nkind = \"ring_allreduce\"\nbytes = 4096\nalgorithm = \"tree\"\n"
        ))
        .contains("workload.kind: ring_allreduce is the ring all-reduce")
    );
}

#[test]
fn transport_knobs_take_effect_and_bad_ones_are_refused() {
    let base = format!("{FT16}[[workload]]\nkind = \"permutation\"\nbytes = 200000\n");
    let every = run(&base.replace(
        "[[workload]]",
        "[transport]\npaths_per_connection = 1\nack_every_packets = 1\n[[workload]]",
    ));
    let few = run(&base.replace(
        "[[workload]]",
        "[transport]\npaths_per_connection = 1\nack_every_packets = 64\n[[workload]]",
    ));
    assert!(every.results.transport_stats.acks > few.results.transport_stats.acks);
    let e = parse_err(&base.replace(
        "[[workload]]",
        "[transport]\nack_every_packets = 0\n[[workload]]",
    ));
    assert_eq!(
        e,
        "t.toml:9: transport.ack_every_packets: must be in 1..=255, not 0"
    );
    let e = parse_err(&base.replace(
        "[[workload]]",
        "[transport]\ndcqcn_g = \"fast\"\n[[workload]]",
    ));
    assert_eq!(e, "t.toml:9: transport.dcqcn_g: must be a number");
}

#[test]
fn monitored_links_have_series_that_add_up() {
    let o = run(&format!(
        "{FT16}[[monitor]]\nlink = [\"tor0\", \"agg0\"]\n[[workload]]\nkind = \"permutation\"\nbytes = 500000\n"
    ));
    let names: Vec<&str> = o.series.links.iter().map(|l| l.name.as_str()).collect();
    assert!(
        names.contains(&"tor0->agg0") && names.contains(&"agg0->tor0"),
        "{names:?}"
    );
    let up = o
        .series
        .links
        .iter()
        .find(|l| l.name == "tor0->agg0")
        .unwrap();
    assert!(
        up.util.iter().all(|&u| (0.0..=1.0001).contains(&u)),
        "utilisation within the link"
    );
    assert!(up.util.iter().any(|&u| u > 0.1), "the link carried traffic");
}

#[test]
fn end_to_end_loss_is_per_packet_whatever_the_route_and_split_by_kind() {
    let o = run(&format!(
        "{FT16}[switch]\nloss_e2e = 0.05\n[[workload]]\nkind = \"permutation\"\nbytes = 2000000\n"
    ));
    let f = &o.results.fabric;
    let sent = f.nic_packets as f64;
    let lost = (f.data_lost + f.acks_lost) as f64;
    assert!(
        (lost / sent - 0.05).abs() < 0.01,
        "lost {:.3} of packets",
        lost / sent
    );
    assert!(f.data_lost > 0 && f.acks_lost > 0);
    assert_eq!(f.e2e_losses, f.data_lost + f.acks_lost);
    assert_eq!(f.wire_losses, 0);
}

#[test]
fn failures_report_how_long_traffic_kept_running_into_them() {
    let text = |reconverge: &str| {
        format!(
            "{FT16}[switch]\n{reconverge}\n[[failure]]\nat_us = 20\nlink = [\"core0\", \"agg2\"]\n[[workload]]\nkind = \"permutation\"\nbytes = 2000000\n"
        )
    };
    let slow = run(&text(""));
    let fast = run(&text("reconverge_us = 5"));
    for o in [&slow, &fast] {
        let f = &o.results.failures;
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].part, "link core0-agg2");
        assert!(f[0].data_lost > 0);
    }
    assert!(fast.results.failures[0].data_lost < slow.results.failures[0].data_lost);
}

/// A path whose ACKs die in a failed link, while its data still gets
/// through, is retired within a few round trips: its probe went
/// unanswered while later packets were acknowledged on other paths. The
/// ring's next message used to settle the probe (through op-acks on the
/// other paths) before its timeout and excuse the path, message after
/// message: the last ACK went into the link 98.4 µs after it failed (seed
/// 1). And a path is judged by its newest packet as well as its oldest,
/// from when an answer could first come: judged by the oldest alone, an
/// old packet sent before an ACK that did come excused the packets sent
/// since (seed 2: 91.5 µs). Now 36.9 / 30.7 / 31.9 µs on seeds 1-3.
#[test]
fn acks_stop_going_into_a_failed_link_when_the_data_still_gets_through() {
    for seed in 1..=3 {
        let o = run(&format!(
            "seed = {seed}
{FT16}latency_ns = 1000
[[failure]]
at_us = 100
link = [\"core1\", \"agg2\"]
\
             [[workload]]
kind = \"ring_allreduce\"
bytes = 2097152
order = \"random\"
"
        ));
        let f = &o.results.failures[0];
        assert!(f.acks_lost > 0, "seed {seed}: {f:?}");
        assert!(f.acks_quiet_after_us <= 50.0, "seed {seed}: {f:?}");
        assert_eq!(o.results.fct.failed, 0, "seed {seed}");
    }
}

#[test]
fn incasts_report_settling_fairness_and_their_own_counters() {
    let o = run(&format!(
        "{FT16}[switch]\nbuffer_bytes = 200000\necn_kmin_bytes = 20000\necn_kmax_bytes = 80000\n\
         [[workload]]\nkind = \"incast\"\nbytes = 500000\nreceiver = 0\nsenders = 8\n\
         [[workload]]\nkind = \"permutation\"\nbytes = 100000\nhosts = \"9-15\"\n"
    ));
    let inc = &o.results.collectives[0];
    let settle = inc.settle_us.expect("the incast settles");
    assert!(settle >= 0.0 && settle < inc.time_us);
    assert!(inc.jain > 0.8 && inc.jain <= 1.0, "jain {}", inc.jain);
    assert!(
        o.series
            .links
            .iter()
            .any(|l| l.name.starts_with("incast-0-into-host0"))
    );
    let perm = &o.results.collectives[1];
    assert_eq!(perm.settle_us, None);
    // Counters are per workload: the permutation's hosts only talk to each other.
    let total = o.results.transport_stats.retransmissions;
    assert_eq!(inc.retransmissions + perm.retransmissions, total);
}

/// Small-scale locks on the targets experiments (RESULTS.md): a 64:1 incast
/// on a 128-host fat tree settles at once, fairly, with no RTO, and runs
/// within 15 % of the receiver link's drain time (measured 1.106; 1.078
/// before cold packets were short: the first round trip now brings the
/// receiver 64 short packets, 20 KB, where it brought 266 KB); an 8:1 incast whose
/// senders are paced at their grants runs within 1.5x of it (measured
/// 1.42x: a cold start and eight grants to settle in 320 us; a NIC pull
/// that never armed the pacing deadline made it 7x); and a 16:1 incast of
/// 1 MB each, its senders paced at grants that leave the newcomers' drain
/// headroom only until the link is seen idle, runs within 5 % of it
/// (measured 1.042; 1.092 while the headroom stayed to the end because
/// no single gap between the evenly paced packets was a packet long).
#[test]
fn incasts_settle_at_once_and_drain_at_line_rate() {
    let text = |senders: u32, bytes: u64| {
        format!(
            "name = \"i\"\nend_us = 50000\n[topology]\nkind = \"fat_tree\"\nhosts = 128\nk = 8\nlink_gbps = 100\n\
             [switch]\necn_kmin_bytes = 30000\necn_kmax_bytes = 120000\n\
             [[workload]]\nkind = \"incast\"\nbytes = {bytes}\nreceiver = 0\nsenders = {senders}\n"
        )
    };
    for (senders, bytes, slack) in [
        (64u32, 200_000u64, 1.15),
        (8, 500_000, 1.5),
        (16, 1_000_000, 1.05),
    ] {
        let o = run(&text(senders, bytes));
        let inc = &o.results.collectives[0];
        let ideal_us = (u64::from(senders) * bytes * 8) as f64 / 100e3;
        assert!(
            inc.settle_rtts.expect("settles") <= 2.0,
            "{senders}: {inc:?}"
        );
        assert!(inc.jain >= 0.95, "{senders}: jain {}", inc.jain);
        assert_eq!(o.results.transport_stats.timeouts, 0, "{senders}");
        assert!(
            inc.time_us <= slack * ideal_us,
            "{senders}: {} us against an ideal {ideal_us} us",
            inc.time_us
        );
    }
}

/// Small-scale lock on the 256:1 incast's opening (RESULTS.md,
/// `incast-256`): 127 newcomers at once into a receiver whose buffer holds
/// fewer than 127 full packets. Each sends one short cold packet
/// (`cold_packet_bytes`), so the opening fits: nothing dropped, nothing
/// resent, the queue under two BDPs from the start. With full cold packets
/// (`cold_packet_bytes = 0`) the same opening overflows the buffer.
#[test]
fn many_newcomers_at_once_open_with_short_packets() {
    let text = |cold: &str| {
        format!(
            "name = \"n\"\nend_us = 50000\n[topology]\nkind = \"fat_tree\"\nhosts = 128\nk = 8\n\
             link_gbps = 100\nlatency_ns = 1000\n[switch]\nbuffer_bytes = 400000\n\
             ecn_kmin_bytes = 30000\necn_kmax_bytes = 120000\n\
             [[workload]]\nkind = \"incast\"\nbytes = 200000\nreceiver = 0\n{cold}"
        )
    };
    let o = run(&text(""));
    let inc = &o.results.collectives[0];
    let t = &o.results.transport_stats;
    assert_eq!(o.results.fabric.drops, 0, "{t:?}");
    assert_eq!(t.retransmissions, 0, "{t:?}");
    assert!(inc.settle_rtts.expect("settles") <= 2.0, "{inc:?}");
    let full = run(&text("[transport]\ncold_packet_bytes = 0\n"));
    assert!(full.results.fabric.drops > 0, "{:?}", full.results.fabric);
}

/// The claims' 128-host fat tree (k = 8, 1 µs per hop, ECN from 30 KB to
/// 120 KB) at `link_gbps`, seed 1, running the `[[workload]]` body given.
/// The 128-host fat tree at 100 Gb/s with an all-to-all of 64 KB per pair.
fn ft128_alltoall(end_us: u32) -> String {
    ft128(100, end_us, "kind = \"all_to_all\"\nbytes = 65536\n")
}

fn ft128(link_gbps: u32, end_us: u32, workload: &str) -> String {
    format!(
        "name = \"t\"\nseed = 1\nend_us = {end_us}\n[topology]\nkind = \"fat_tree\"\nhosts = 128\nk = 8\n\
         link_gbps = {link_gbps}\nlatency_ns = 1000\n[switch]\necn_kmin_bytes = 30000\necn_kmax_bytes = 120000\n\
         [[workload]]\n{workload}"
    )
}

/// A lone flow starts at line rate and does not fall silent in its first
/// round trip. Its receiver has no other sender, so the share it promised
/// at setup is its whole line: a full BDP at once, no cold round trip
/// (189.0 µs for 2 MB across the 128-host fat tree with one, 177.2 without;
/// IB-style 172.6). The window is split over 16 paths, and a path sends a
/// packet only if all of it fits: split into equal shares of 2.6 packets,
/// the paths carried 2 each, 32 of the BDP's 42, and the flow stopped for
/// 4 µs in its first round trip (192.4 µs when it started cold). The bound
/// is the line rate, a round trip (the last packet's way there and the
/// window's first turn), and 3.5 % of slack.
#[test]
fn a_lone_flow_sends_its_whole_first_window() {
    let o = run(&ft128(
        100,
        10_000,
        "kind = \"permutation\"\nbytes = 2000000\nhosts = [0, 64]\n",
    ));
    let r = &o.results;
    assert!(r.finished);
    // 489 packets of 4,160 bytes on the wire at 100 Gb/s and a round trip.
    let wire_us = (2_000_000f64 / 4096.0).ceil() * 4160.0 * 8.0 / 100e3;
    let bound_us = wire_us + r.base_rtt_us;
    assert!(
        r.fct.max_us <= 1.035 * bound_us,
        "{} us against {bound_us} us",
        r.fct.max_us
    );
}

/// A rare loss does not let guesses loose into standing queues. A 128-host
/// all-to-all keeps its core queued loss-free (30 µs deep); at 0.1 %/link
/// the device still sees a loss every few µs while losing one packet in
/// 170, and the guess budget, opened by every loss, let tail-loss probes
/// into those queues (22,447 resends for 1,205 losses): they filled the
/// core's 1 MB buffers, and 64 KB per pair took 1,127 µs, 1.69 x the ideal
/// drain of 666 µs (loss-free 780, and 917 at 1 %/link; 1,193 µs with only
/// the budget's rule undone). The budget now opens only where the device
/// loses 2 % or more: 846 µs, 1.27 x.
#[test]
fn a_rare_loss_keeps_the_guess_budget_metered() {
    let text = ft128_alltoall(10_000).replace("[switch]\n", "[switch]\nloss = 0.001\n");
    let r = run(&text).results;
    assert!(r.finished);
    // Each host receives 127 x 64 KB of payload through its 100 Gb/s link.
    let ideal_us = 127.0 * 65536.0 * 8.0 / 100e3;
    assert!(
        r.makespan_us <= 1.4 * ideal_us,
        "{} us at 0.1 %/link against an ideal drain of {ideal_us} us",
        r.makespan_us
    );
}

/// An all-to-all over 2:1 uplinks: the fabric before the receivers, not
/// their links, is the bottleneck, and a sender paced at its grant (a
/// 127th of a receiver's link, a window under one packet) cannot be slowed
/// by its own ECN cuts. The receivers' grants ignored the marks, the ToR
/// uplinks' 1 MB buffers overflowed and stayed full: 2,314 µs, 48,341
/// drops and 35,130 RTOs (IB-style 1,579 µs). Grants cut round by round
/// while most arrivals are marked on a link that is not full: 1,824 µs,
/// 4 drops, 20 RTOs. The uplinks' drain: each ToR's 4 hosts send 124 of
/// their 127 pairs of 64 KB through two 100 Gb/s uplinks, 1,300 µs.
#[test]
fn an_over_committed_fabric_shrinks_the_grants() {
    let text = ft128_alltoall(20_000).replace("k = 8\n", "k = 8\noversubscription = 2\n");
    let r = run(&text).results;
    assert!(r.finished);
    let drain_us = 4.0 * 124.0 * 65536.0 * 8.0 / 200e3;
    assert!(
        r.makespan_us <= 1.5 * drain_us && r.fabric.drops < 500,
        "{} us against a drain of {drain_us} us, {} drops",
        r.makespan_us,
        r.fabric.drops
    );
}

/// An all-to-all over 2:1 leaf uplinks, among 64 hosts of a 128-host
/// leaf-spine: a quarter of each receiver's senders share its leaf and
/// are never marked, so the device-wide fabric term (past half of all
/// arrivals marked) never acts, single uplinks fill their 1 MB buffers
/// and the run falls into RTOs (seeds 1-2: 975 µs, 1,228 RTOs; IB-style
/// 597 µs). With the per-sender term (`fabric_mark_bar_permille`, for a
/// fabric known to be over-committed) only the senders whose packets are
/// marked are cut: 881 µs, 12 RTOs. Since paced senders keep to proven
/// routes (transport spec §5) the default run no longer collapses (seed
/// 1: 768 µs, 172 RTOs; seeds 1-3 757-768 µs), and the per-sender term
/// trades some of that for its RTOs: 872 µs, none. It is judged on what
/// it is for, the RTOs, and on what it costs.
#[test]
fn the_per_sender_fabric_term_keeps_an_all_to_all_over_oversubscribed_leaves_out_of_rtos() {
    let text = include_str!("../../../scenarios/unseen/ls128-2to1-alltoall-256k.toml")
        .replace("bytes = 262144", "bytes = 65536");
    let device_wide = run(&text).results;
    let per_sender = run(&text.replace(
        "[switch]",
        "[transport]\nfabric_mark_bar_permille = 100\n[switch]",
    ))
    .results;
    assert!(device_wide.finished && per_sender.finished);
    let (before, after) = (
        device_wide.transport_stats.timeouts,
        per_sender.transport_stats.timeouts,
    );
    assert!(
        after * 10 <= before
            && after < 100
            && per_sender.makespan_us < 1.2 * device_wide.makespan_us,
        "RTOs {before} -> {after}, {} -> {} us",
        device_wide.makespan_us,
        per_sender.makespan_us
    );
}

/// Guesses (probes without loss evidence) go unmetered only where the
/// device loses 5 % of its packets or more (`probe_budget`): below it,
/// in an all-to-all, most silences are queues at the fabric's busiest
/// uplinks, deeper than a probe timeout. At 0.5 % loss per link (3 % of
/// packets) the 128-host all-to-all with the bar at 2 % took 1,101 us on
/// seed 1, longer than at 1 %/link (916 us), against 780 us loss-free;
/// now 883 us.
#[test]
fn guesses_stay_metered_where_a_silence_is_more_likely_a_queue() {
    let text = ft128_alltoall(20_000);
    let clean = run(&text).results;
    let lossy = run(&text.replace("[switch]\n", "[switch]\nloss = 0.005\n")).results;
    assert!(clean.finished && lossy.finished);
    assert!(
        lossy.makespan_us <= 1.2 * clean.makespan_us,
        "{} us at 0.5 %/link against {} us loss-free",
        lossy.makespan_us,
        clean.makespan_us
    );
}

/// Senders a few microseconds from their receiver (its own ToR and pod)
/// run at their grants: the window a grant gives covers the round trip and
/// the receiver's ACK delay. With a round trip's worth alone (6.7 packets
/// at 47.5 Gb/s over 4.7 µs) and ACKs every four packets or 4 µs, they
/// ran at about 35 Gb/s: 2 and 3 senders of 1 MB took 1.41 and 1.46 x the
/// receiver link's drain time, now 1.20 and 1.17 x.
#[test]
fn near_senders_run_at_their_grants() {
    for senders in [2u32, 3] {
        let o = run(&format!(
            "{FT16}latency_ns = 1000\n[switch]\necn_kmin_bytes = 30000\necn_kmax_bytes = 120000\n\
             [[workload]]\nkind = \"incast\"\nbytes = 1000000\nreceiver = 0\nsenders = {senders}\n"
        ));
        let inc = &o.results.collectives[0];
        let ideal_us = f64::from(senders) * 1e6 * 8.0 / 100e3;
        assert!(
            inc.time_us <= 1.25 * ideal_us,
            "{senders}: {} us against an ideal {ideal_us} us",
            inc.time_us
        );
    }
}

/// A sender paced at its grant keeps that rate beside an uncapped
/// connection on its own NIC. Host 0 sends 1 MB to host 1, which also
/// receives from host 2 (so each is granted about half of host 1's link),
/// and 2 MB to host 3, which has no other sender (so that flow is not
/// capped). The NIC serves the two connections in turn, so the paced one
/// often goes a packet late. When the pacing gap ran from the send time,
/// it kept that lateness and ran at about 26 of its 47.5 Gb/s.
#[test]
fn a_paced_sender_keeps_its_grant_beside_an_uncapped_one() {
    let o = run(&format!(
        "{FT16}latency_ns = 1000\n\
         [[workload]]\nkind = \"incast\"\nbytes = 1000000\nreceiver = 1\nhosts = \"0,2\"\n\
         [[workload]]\nkind = \"incast\"\nbytes = 2000000\nreceiver = 3\nhosts = \"0\"\n"
    ));
    let two = &o.results.collectives[0];
    // Two senders of 1 MB at 47.5 Gb/s each (95 % of the line shared).
    let granted_us = 1e6 * 8.0 / 47.5e3;
    assert!(
        two.time_us <= 1.2 * granted_us,
        "{} us against {granted_us:.1} us at the grant",
        two.time_us
    );
}

/// When most senders of an incast finish, the rest take their room at
/// once: the receiver pushes the raised grants (admission's rule 5) rather
/// than telling each sender at its next packet, one gap at its small
/// grant later. 240 senders of 20 KB and 16 of 400 KB into one host: the
/// 16 long flows end 1,031 µs in when they learn at their next packets,
/// 1,003 µs with the push (an ideal drain of all the bytes: 896 µs).
#[test]
fn the_senders_left_in_an_incast_take_the_room_of_those_that_finished() {
    let o = run(
        "name = \"t\"\nend_us = 50000\n[topology]\nkind = \"star\"\nhosts = 257\n\
         link_gbps = 100\nlatency_ns = 1000\n\
         [[workload]]\nkind = \"incast\"\nbytes = 20000\nreceiver = 0\nhosts = \"0-240\"\n\
         [[workload]]\nkind = \"incast\"\nbytes = 400000\nreceiver = 0\nhosts = \"0,241-256\"\n",
    );
    let long = &o.results.collectives[1];
    let ideal_us = (240 * 20_000 + 16 * 400_000) as f64 * 8.0 / 100e3;
    assert!(
        long.time_us <= 1.13 * ideal_us,
        "{} us against an ideal {ideal_us} us",
        long.time_us
    );
}

/// Small-scale lock on the all-to-all at 10 % loss per link (RESULTS.md,
/// `loss-link-alltoall`): 32 hosts, 64 KB per pair. About half of all
/// packets are lost end to end, so some sender's data all arrives while
/// every answer carrying its completion is lost, several times over. It
/// asks again whenever the time since its last progress has doubled, and
/// the last sender learns of its completion within a few round trips of
/// the last delivery. When it asked once per progress and then left it to
/// retry rounds (an RTO, doubling), seed 1 took 2,572 µs for data all
/// delivered at 1,274 (and 64 hosts, 104 ms for 1.9 ms).
#[test]
fn a_sender_missing_only_its_completion_asks_again_soon_at_heavy_loss() {
    let o = run(
        "name = \"t\"\nseed = 1\nend_us = 200000\n[topology]\nkind = \"fat_tree\"\nhosts = 32\nk = 8\n\
         link_gbps = 100\nlatency_ns = 1000\n[switch]\nloss = 0.1\n\
         [[workload]]\nkind = \"all_to_all\"\nbytes = 65536\n",
    );
    let r = &o.results;
    assert!(r.finished);
    assert!(
        r.makespan_us < 1.25 * r.fct.max_us,
        "the last sender learnt of its completion at {} us, the last data landed at {} us",
        r.makespan_us,
        r.fct.max_us
    );
}

/// A capped sender copies its tail too (transport spec §4, "Tail copies"):
/// in an all-to-all every sender is paced at a small share of each
/// receiver's line, a packet per path, so nearly every lost packet is its
/// path's last and would wait a probe timeout and then a pace slot. 32
/// hosts, 64 KB per pair, 2 % loss per link: seeds 1-3 took 356.1 us on
/// average with the copies and 381.3 us without (the build before them:
/// capped senders never copied).
#[test]
fn a_paced_senders_tail_goes_twice_on_a_lossy_fabric() {
    let makespan = |copies: u32| -> f64 {
        (1..=3)
            .map(|seed| {
                run(&format!(
                    "name = \"t\"\nseed = {seed}\nend_us = 200000\n[topology]\nkind = \"fat_tree\"\n\
                     hosts = 32\nk = 8\nlink_gbps = 100\nlatency_ns = 1000\n[switch]\nloss = 0.02\n\
                     [transport]\ntail_copy_packets = {copies}\n\
                     [[workload]]\nkind = \"all_to_all\"\nbytes = 65536\n"
                ))
                .results
                .makespan_us
            })
            .sum::<f64>()
            / 3.0
    };
    let (with, without) = (makespan(8), makespan(0));
    assert!(
        with < 0.97 * without,
        "mean makespan {with:.1} us with tail copies, {without:.1} us without"
    );
}

/// On seeds 1 and 2 of the scenario `text(seed)` gives, MetaRoCE's
/// makespan is under `bound` times IB-style's; `check` sees the scenario
/// first.
fn beats_ib_style_by(bound: f64, text: impl Fn(u64) -> String, check: impl Fn(&Scenario)) {
    for seed in 1..=2 {
        let mut s = Scenario::parse(&text(seed), "t.toml").expect("valid scenario");
        check(&s);
        let ours = run_scenario(&s, None, &mut |_, _, _, _| {}).expect("runs");
        s.transport.kind = "ib".into();
        let ib = run_scenario(&s, None, &mut |_, _, _, _| {}).expect("runs");
        let (m, i) = (ours.results.makespan_us, ib.results.makespan_us);
        assert!(
            m < bound * i,
            "seed {seed}: {m:.1} us against IB-style's {i:.1}"
        );
    }
}

/// A capped pair whose grant is more than a packet per round trip runs at
/// its grant: its window is whole packets (transport spec §2, "A grant's
/// window"). A 32-host all-to-all of 64 KB per pair grants each pair a
/// 31st of the line, 5.6 KB over its 14 us round trip; with a window of
/// those bytes the second packet waited for the first's ACK and the hosts
/// sent at 80 % of their line, 1.21 x IB-style's makespan (seeds 1-2:
/// 244.4 and 242.7 us against 202.5 and 195.5). Now 1.07-1.09 x.
#[test]
fn a_small_all_to_all_runs_at_its_grants() {
    let text = |seed| {
        format!(
            "name = \"t\"\nseed = {seed}\nend_us = 100000\n[topology]\nkind = \"fat_tree\"\n\
             hosts = 32\nk = 8\nlink_gbps = 100\nlatency_ns = 1000\n\
             [[workload]]\nkind = \"all_to_all\"\nbytes = 65536\n"
        )
    };
    beats_ib_style_by(1.15, text, |_| {});
}

/// A fast line sprays over more paths, and a lone sender keeps its window
/// when one of its paths is marked. A permutation of 2 MB over the
/// 128-host fat tree at 400 Gb/s (ECN from 120 KB to 480 KB): with 16
/// paths each carried a quarter of the BDP, and every route collision
/// that marked one of them cut the whole connection by the path's share;
/// the flows ran with less than a propagation BDP in flight while queues
/// on the way stretched their round trips, and took 0.90-0.97 x
/// IB-style's makespan (74.8 and 69.1 µs against 77.5 and 77.1, seeds
/// 1-2). Now 64 paths (16 per 100 Gb/s of line), the connection cut only
/// by what a marked path's floor kept: 61.9 and 62.2 µs, 0.80 x and
/// 0.81 x. Here the paths do it: 16 paths with the new rule take 73.2
/// and 68.4 µs, 64 with the old one 62.1 and 62.2. The connection's rule
/// shows at 1,024 hosts (`scenarios/claims/ft1024-perm-400g.toml`, seed
/// 1: 64 paths 210.2 µs with the old rule, 199.7 with the new) and on a
/// 64-host leaf-spine at 400 Gb/s (386.1 against 355.5 µs, seeds 1-6).
#[test]
fn a_fast_lines_permutation_spreads_over_more_paths_and_keeps_its_window() {
    let text = |seed| {
        format!(
            "name = \"t\"\nseed = {seed}\nend_us = 100000\n[topology]\nkind = \"fat_tree\"\n\
             hosts = 128\nk = 8\nlink_gbps = 400\nlatency_ns = 1000\n\
             [switch]\necn_kmin_bytes = 120000\necn_kmax_bytes = 480000\n\
             [[workload]]\nkind = \"permutation\"\nbytes = 2000000\n"
        )
    };
    beats_ib_style_by(0.87, text, |s| assert_eq!(s.paths_per_connection(), 64));
}

/// A sender that sprays 64 paths at 100 Gb/s puts under one packet on a
/// path per round trip, and collisions give routes queues that differ by
/// more than cross-path RACK's window: live paths looked suspect, and the
/// probes' late answers retired them. Their late answers now widen the
/// device's path skew (`path_skew.rs`). 128-host permutation of 2 MB,
/// nothing lost, seeds 1-3: 3,915-5,387 resends and 1,169-1,631 paths
/// replaced before, 906-1,441 and 70-132 now (225.0-231.9 µs, now
/// 209.8-219.7).
#[test]
fn a_thin_spray_learns_how_much_later_live_paths_come_and_leaves_them_alone() {
    let text = ft128(100, 100_000, "kind = \"permutation\"\nbytes = 2000000\n")
        .replace("[switch]", "[transport]\npaths = 64\n[switch]");
    let r = run(&text).results;
    assert!(r.finished);
    assert_eq!(r.fabric.drops, 0, "nothing is lost on this fabric");
    let t = &r.transport_stats;
    assert!(
        t.retransmissions * 25 < t.data_packets && t.paths_replaced < 300,
        "{} resends of {} data packets, {} paths replaced",
        t.retransmissions,
        t.data_packets,
        t.paths_replaced
    );
}

/// A failed core switch takes one of four uplinks from an aggregation
/// switch in every pod, whose hashing still sends it a quarter of the
/// pod's traffic: a third past its three links' line. A paced sender
/// knows nothing of its round robin's next path, and each kept sending a
/// quarter of its packets into those queues; now it stays on a path whose
/// last answer was quick and clean (transport spec §5, "A paced sender
/// keeps to a proven route").
/// `scenarios/unseen/ft64-alltoall-32k-core-failure.toml` (a 64-host
/// all-to-all of 32 KB, `core2` failed at 50 µs), seeds 1-2: 1.74 and 1.71 x the healthy run's makespan
/// before (393.2 and 390.7 µs, 41 RTOs on seed 1), 0.97 and 1.04 x now.
#[test]
fn a_paced_all_to_all_keeps_off_the_routes_a_failed_core_overloads() {
    let failed = include_str!("../../../scenarios/unseen/ft64-alltoall-32k-core-failure.toml");
    let healthy = &failed[..failed.find("[[failure]]").expect("the file fails core2")];
    for seed in 1..=2 {
        let healthy = run(&format!("seed = {seed}\n{healthy}")).results;
        let failed = run(&format!("seed = {seed}\n{failed}")).results;
        assert!(healthy.finished && failed.finished);
        assert!(
            failed.makespan_us < 1.15 * healthy.makespan_us,
            "seed {seed}: {:.1} us with core2 failed against {:.1} healthy ({} RTOs)",
            failed.makespan_us,
            healthy.makespan_us,
            failed.transport_stats.timeouts
        );
    }
}

/// A sender paced at a small grant probes a silent path with its next new
/// packet: where only the ACK was lost, nothing is sent twice. 32 senders
/// of 200 KB into one host through one switch at 1 % loss per link, each
/// granted 1/32 of the link (a packet every 10 µs, slower than the round
/// trip). When every probe resent the path's last packet, resends were
/// about the data lost plus the ACKs lost (57 for 28 and 35, seed 1); now
/// they are about the data lost (228 for 190 over seeds 1-6, with 224
/// ACKs lost). Judged over six seeds, with the slack of one: a seed's
/// resends swing with which packets its losses hit (seed 3: 51 for 39,
/// then 59 for 43 after a change to the grant's window that left the
/// six seeds' ratio at 1.20, 1.22 before).
#[test]
fn a_paced_sender_probes_with_new_data_and_resends_only_what_was_lost() {
    let (mut resends, mut data_lost, mut acks_lost) = (0, 0, 0);
    for seed in 1..=6 {
        let o = run(&format!(
            "name = \"t\"\nseed = {seed}\nend_us = 50000\n[topology]\nkind = \"star\"\nhosts = 33\n\
             link_gbps = 100\nlatency_ns = 1000\n[switch]\nloss = 0.01\n\
             [[workload]]\nkind = \"incast\"\nbytes = 200000\nreceiver = 0\n"
        ));
        let t = &o.results.transport_stats;
        let f = &o.results.fabric;
        assert!(
            f.acks_lost > 10,
            "seed {seed}: the test needs lost ACKs: {f:?}"
        );
        resends += t.retransmissions;
        data_lost += f.data_lost;
        acks_lost += f.acks_lost;
    }
    assert!(
        resends * 4 <= data_lost * 5 + 20,
        "{resends} resends for {data_lost} data packets and {acks_lost} ACKs lost (seeds 1-6)"
    );
}

/// 127 senders of 100 KB into host 0 of the 128-host fat tree through
/// switches that trim, with htsim's scenario-C buffers and ECN, and the
/// `[transport]` line given.
fn trimming_incast(transport: &str) -> String {
    format!(
        "name = \"c\"\nend_us = 100000\n[topology]\nkind = \"fat_tree\"\nhosts = 128\nk = 8\n\
         link_gbps = 100\nlatency_ns = 1000\n[switch]\nbuffer_bytes = 178450\n\
         ecn_kmin_bytes = 37350\necn_kmax_bytes = 145250\ntrimming = true\n\
         [transport]\n{transport}\n\
         [[workload]]\nkind = \"incast\"\nbytes = 100000\nreceiver = 0\n"
    )
}

/// Small-scale lock on the trimming incast (RESULTS.md, `incast-1023`):
/// 127 senders of 100 KB into one host through switches that trim, with
/// htsim's scenario-C buffers. Trimmed headers come back as NACKs (no RTO,
/// nothing dropped as useless), resends stay under a tenth of the data,
/// and the drain is within 15 % of the receiver link's (measured 1.13x).
/// The senders open with full cold packets (`cold_packet_bytes = 0`): with
/// short ones 127 senders fit the buffer and nothing is trimmed.
#[test]
fn a_trimming_incast_recovers_by_nack_without_timeouts() {
    let o = run(&trimming_incast("cold_packet_bytes = 0"));
    let inc = &o.results.collectives[0];
    let t = &o.results.transport_stats;
    assert!(
        t.nacks > 0,
        "the switches trimmed and the receiver NACKed: {t:?}"
    );
    assert_eq!(t.trimmed_dropped, 0, "{t:?}");
    assert_eq!(t.timeouts, 0, "{t:?}");
    assert!(t.retransmissions * 10 <= t.data_packets, "{t:?}");
    let ideal_us = (127 * 100_000 * 8) as f64 / 100e3;
    assert!(
        inc.time_us <= 1.15 * ideal_us,
        "{} us against an ideal {ideal_us} us",
        inc.time_us
    );
}

/// The baselines know no trimming: their NICs drop a trimmed header (it
/// fails the length and ICRC checks of a real NIC) and recover the loss as
/// any other. The same trimming incast as above under IRN: headers were
/// trimmed and dropped, and no transport drains faster than the receiver's
/// link can carry its bytes (taken as whole, the trimmed packets let IRN
/// finish a 1,023:1 incast in 0.14 x that time).
#[test]
fn baselines_drop_trimmed_packets_and_never_beat_the_line() {
    let o = run(&trimming_incast("kind = \"irn\""));
    let inc = &o.results.collectives[0];
    let t = &o.results.transport_stats;
    assert!(t.trimmed_dropped > 0, "{t:?}");
    assert!(t.retransmissions >= t.trimmed_dropped, "{t:?}");
    let line_us = (127 * 100_000 * 8) as f64 / 100e3;
    assert!(
        inc.time_us >= line_us,
        "{} us, under the {line_us} us the line needs",
        inc.time_us
    );
}

#[test]
fn a_link_tap_records_what_its_ports_send_lost_or_not_and_changes_nothing() {
    use metaroce_sim::sim::Sim;
    use metaroce_sim::transport::metaroce::MetaRoceFactory;
    use std::cell::Cell;
    use std::rc::Rc;

    let text = format!(
        "{FT16}[switch]\nloss = 0.02\n[[workload]]\nkind = \"permutation\"\nbytes = 200000\n"
    );
    let scn = Scenario::parse(&text, "t.toml").expect("valid scenario");
    // One run tapped, one not, from the same scenario and seed.
    let run_once = |tap: bool| {
        let built = scn.build(scn.seed).expect("builds");
        let (tor0, agg0) = (
            built.topo.find_node("tor0").expect("tor0"),
            built.topo.find_node("agg0").expect("agg0"),
        );
        let factory = MetaRoceFactory::default();
        let mut sim = Sim::new(
            built.topo,
            built.fabric,
            &factory,
            built.flows,
            scn.seed,
            built.end_ps,
        )
        .expect("sim");
        let seen = Rc::new(Cell::new(0u64));
        let ce_or_ect = Rc::new(Cell::new(0u64));
        if tap {
            let (seen, ce_or_ect) = (Rc::clone(&seen), Rc::clone(&ce_or_ect));
            sim.tap_links(
                &[(agg0, tor0)],
                Box::new(move |p, body| {
                    seen.set(seen.get() + 1);
                    ce_or_ect.set(ce_or_ect.get() + u64::from(p.wire.ect));
                    // Every body turns into a packet the wire crate can emit.
                    assert!(body.to_repr().wire_len() > 0);
                }),
            )
            .expect("tor0 and agg0 are linked");
        }
        sim.run(|_| {}).expect("runs");
        let link: Vec<_> = sim
            .ports()
            .iter()
            .filter(|p| (p.owner, p.peer) == (tor0, agg0) || (p.owner, p.peer) == (agg0, tor0))
            .map(|p| p.c)
            .collect();
        assert_eq!(link.len(), 2, "both directions");
        let sent: u64 = link.iter().map(|c| c.tx_packets).sum();
        let lost: u64 = link.iter().map(|c| c.wire_losses).sum();
        (
            seen.get(),
            ce_or_ect.get(),
            sent,
            lost,
            sim.transport_stats(),
            sim.now(),
        )
    };
    let (seen, ect, sent, lost, stats, end) = run_once(true);
    // The tap sits before the wire's loss: it saw every packet the link's
    // two ports sent, those the wire then lost among them.
    assert!(lost > 0, "the lossy link lost nothing ({sent} sent)");
    assert_eq!(seen, sent);
    assert!(ect > 0, "data packets are ECN-capable");
    // Tapping draws no random number: the untapped run is the same run.
    let (none, _, sent_untapped, lost_untapped, stats_untapped, end_untapped) = run_once(false);
    assert_eq!(none, 0);
    assert_eq!(
        (sent_untapped, lost_untapped, stats_untapped, end_untapped),
        (sent, lost, stats, end)
    );
}

#[test]
fn the_device_port_is_the_scenarios_to_choose() {
    use metaroce_sim::capture::{CaptureSpec, SimCapture};
    use metaroce_sim::hostset::HostSetConf;
    use metaroce_sim::{RunOptions, run_scenario_with};

    let text = format!(
        "{FT16}[transport]\ndevice_port = 5000\n[[workload]]\nkind = \"permutation\"\nbytes = 20000\n"
    );
    let scn = Scenario::parse(&text, "t.toml").expect("valid scenario");
    let pcap = std::env::temp_dir().join(format!("metaroce-port-{}.pcap", std::process::id()));
    let file = SimCapture::create(&pcap, 64).expect("capture file");
    let opts = RunOptions {
        capture: Some(CaptureSpec {
            file: file.clone(),
            hosts: Some(HostSetConf::Spec("0".into())),
            links: Vec::new(),
        }),
    };
    let o = run_scenario_with(&scn, None, &opts, &mut |_, _, _, _| {}).expect("runs");
    assert!(o.results.finished);
    let frames = file.finish().expect("written");
    let bytes = std::fs::read(&pcap).unwrap();
    let _ = std::fs::remove_file(&pcap);
    // Each record: 16 bytes of header, then the frame (snapped to 64 B);
    // UDP ports at 34..38 (Ethernet 14, IPv4 20). Host 0 talks with its
    // peers' devices: one end of every datagram is port 5000, the other
    // one of the path ports just above it.
    let (mut at, mut seen) = (24, 0);
    while at < bytes.len() {
        let caplen = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &bytes[at + 16..at + 16 + caplen];
        let src = u16::from_be_bytes([frame[34], frame[35]]);
        let dst = u16::from_be_bytes([frame[36], frame[37]]);
        assert!(src == 5000 || dst == 5000, "ports {src} -> {dst}");
        let other = if src == 5000 { dst } else { src };
        assert!((5001..5000 + 64).contains(&other), "path port {other}");
        at += 16 + caplen;
        seen += 1;
    }
    assert_eq!(seen, frames);
    assert!(seen > 0);

    let e = parse_err(&text.replace("device_port = 5000", "device_port = 65500"));
    assert_eq!(
        e,
        "t.toml:9: transport.device_port: must be 1..=65471: the 64 path ports above it must fit in a UDP port"
    );
}

/// Small-scale lock on the 1,024-host all-to-all's "no spurious RTO"
/// (RESULTS.md, `collisions-alltoall`, stop 43): 128 hosts at 10 Gb/s, 4 KB
/// per pair, nothing lost. One-packet flows cannot answer ECN, and their
/// routes are a hash draw, so some queues grow past the 100 µs RTO floor;
/// a fresh path's first packet then timed out before its ACK came. With
/// the device's RTT ceiling (transport spec §4) seed 1 fires 177 RTOs and
/// resends 46 packets (makespan 587.8 µs); before, 5,772 RTOs and 2,682
/// resends (614.7 µs).
#[test]
fn one_packet_flows_behind_long_queues_wait_for_the_device_ceiling() {
    let o = run(&ft128(10, 100_000, "kind = \"all_to_all\"\nbytes = 4096\n"));
    let r = &o.results;
    assert!(r.finished);
    let flows = 128 * 127;
    let t = &r.transport_stats;
    assert!(
        t.timeouts * 50 <= flows,
        "{} RTOs for {flows} one-packet flows",
        t.timeouts
    );
    assert!(
        t.retransmissions * 100 <= flows,
        "{} resends for {flows} packets",
        t.retransmissions
    );
}
