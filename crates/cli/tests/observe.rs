//! Seeing packets and paths end to end: a lossy `metaroce perf` transfer
//! captured with `--pcap` and opened by tshark with the Wireshark
//! dissector (every field named, nothing malformed, resends visible), its
//! counters as `--stats` lines and in the JSON, and printed when a run
//! fails too; the simulator's capture of chosen hosts and of chosen links,
//! and its `counters.csv`; the core's `tracing` spans and events on stderr
//! with `--log` / `METAROCE_LOG` / `RUST_LOG`, and none without.
//!
//! The tshark parts need Debian's `tshark`: without it they print SKIPPED
//! and pass, unless `METAROCE_REQUIRE_TSHARK=1` (as CI sets), which makes a
//! missing tshark a failure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn metaroce(args: &[&str]) -> (String, String, Option<i32>) {
    metaroce_env(args, &[])
}

/// Run with no `METAROCE_STATS` or log filter of the caller's, and `env`.
fn metaroce_env(args: &[&str], env: &[(&str, &str)]) -> (String, String, Option<i32>) {
    let out = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args(args)
        .env_remove("METAROCE_STATS")
        .env_remove("METAROCE_LOG")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .expect("run metaroce");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("metaroce-observe-{}-{name}", std::process::id()))
}

/// A 3:1 incast of 64 KB on a 4-host star, written to a temporary `name`.
fn incast_scenario(name: &str) -> PathBuf {
    let path = temp(name);
    std::fs::write(
        &path,
        "name = \"incast 3:1\"\nseed = 3\nend_us = 10000\n\
         [topology]\nkind = \"star\"\nhosts = 4\nlink_gbps = 100\nlatency_ns = 1000\n\
         [[workload]]\nkind = \"incast\"\nbytes = 65536\nreceiver = 0\n",
    )
    .unwrap();
    path
}

fn dissector() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/wireshark/metaroce.lua")
}

fn tshark_available() -> bool {
    let found = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("METAROCE_REQUIRE_TSHARK").as_deref() != Ok("1"),
            "tshark is not installed but METAROCE_REQUIRE_TSHARK=1 (apt-get install tshark)"
        );
        println!("SKIPPED: tshark is not installed (apt-get install tshark); capture not decoded");
    }
    found
}

fn tshark(pcap: &Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("-X")
        .arg(format!("lua_script:{}", dissector().display()))
        .arg("-r")
        .arg(pcap)
        .args(args)
        .output()
        .expect("tshark runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tshark failed: {stderr}");
    for line in stderr.lines() {
        assert!(
            !line.contains("Lua") && !line.contains("lua_script"),
            "tshark reported a dissector problem: {line}"
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fields read of every frame.
const FIELDS: [&str; 14] = [
    "frame.protocols",
    "_ws.malformed",
    "_ws.expert.severity",
    "metaroce.packet_type",
    "metaroce.psn",
    "metaroce.dst_qpn",
    "metaroce.msg_seq",
    "metaroce.offset",
    "metaroce.opcode",
    "metaroce.flags.retransmit",
    "metaroce.ack_psn",
    "metaroce.op_ack_count",
    "metaroce.icrc.status",
    "metaroce.src_device_port",
];

/// Every frame is MetaRoCE with its fields decoded, nothing is malformed
/// or flagged above a note, every ICRC checks; returns (data frames,
/// ACK frames, resent data frames).
fn check_frames(pcap: &Path) -> (usize, usize, usize) {
    let mut args = vec!["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"];
    for f in FIELDS {
        args.extend(["-e", f]);
    }
    let text = tshark(pcap, &args);
    let (mut data, mut acks, mut resent) = (0, 0, 0);
    for (i, line) in text.lines().enumerate() {
        let v: Vec<&str> = line
            .split('\t')
            .chain(std::iter::repeat(""))
            .take(FIELDS.len())
            .collect();
        let ctx = format!("frame {}: {line}", i + 1);
        assert!(v[0].ends_with(":udp:metaroce"), "{ctx}");
        assert!(v[1].is_empty(), "malformed: {ctx}");
        if !v[2].is_empty() {
            // Wireshark's severities (decimal, or hex with 0x): chat
            // 0x200000, note 0x400000, warning 0x600000, error 0x800000.
            let sev = match v[2].strip_prefix("0x") {
                Some(hex) => u32::from_str_radix(hex, 16),
                None => v[2].parse(),
            }
            .unwrap_or(u32::MAX);
            assert!(sev < 0x0060_0000, "expert warning or error: {ctx}");
        }
        assert_eq!(v[12], "1", "ICRC not good: {ctx}");
        match v[3] {
            "1" => {
                data += 1;
                for (k, name) in FIELDS.iter().enumerate().take(9).skip(4) {
                    assert!(!v[k].is_empty(), "{name} missing: {ctx}");
                }
                if v[9] == "1" {
                    resent += 1;
                }
            }
            "2" => {
                acks += 1;
                assert!(
                    !v[10].is_empty() && !v[11].is_empty(),
                    "ACK fields missing: {ctx}"
                );
            }
            other => panic!("packet type {other:?}: {ctx}"),
        }
    }
    (data, acks, resent)
}

/// Every field the dissector shows under MetaRoCE has a `metaroce.` name
/// and a label (PDML of the first frames; an unnamed field would have an
/// empty name or a text-only entry).
fn check_fields_named(pcap: &Path, frames: usize) -> BTreeSet<String> {
    let pdml = tshark(pcap, &["-T", "pdml", "-c", &frames.to_string()]);
    let mut names = BTreeSet::new();
    let mut inside = false;
    for line in pdml.lines() {
        let l = line.trim_start();
        if l.starts_with("<proto name=\"metaroce\"") {
            inside = true;
            continue;
        }
        if inside && l.starts_with("</proto>") && line.starts_with("  </proto>") {
            inside = false;
            continue;
        }
        if inside && l.starts_with("<field ") {
            let attr = |key: &str| {
                l.split(&format!("{key}=\""))
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .unwrap_or("")
                    .to_owned()
            };
            let name = attr("name");
            if name.starts_with("_ws.expert") {
                // The dissector's expert notes (e.g. "Retransmitted segment").
                continue;
            }
            assert!(name.starts_with("metaroce."), "unnamed field: {l}");
            assert!(!attr("showname").is_empty(), "field without a label: {l}");
            names.insert(name);
        }
    }
    names
}

#[test]
fn lossy_perf_transfer_captured_counted_and_decoded() {
    let pcap = temp("perf.pcap");
    let json = temp("perf.json");
    let (out, err, code) = metaroce(&[
        "perf",
        "write-bw",
        "--loopback",
        "-p",
        "0",
        "-n",
        "300",
        "--paths",
        "4",
        "--impair",
        "loss=0.02,seed=5",
        // Keep the ICRC (perf offers to omit it on loopback): the capture's
        // ICRCs are what tshark checks. And 4 KiB packets, 16 per 64 KiB
        // WRITE, rather than the loopback path's much larger MTU.
        "--icrc",
        "-m",
        "4096",
        "--seed",
        "11",
        "--stats",
        "--pcap",
        pcap.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(err.contains("packets written to"), "{err}");
    // --stats: name value lines, device then connection then paths.
    let counters = counter_lines(&out);
    let get = |name: &str| counter(&counters, name);
    assert!(get("tx_datagrams").is_some_and(|n| n > 300), "{out}");
    assert!(get("io.impair_dropped").is_some_and(|n| n > 0), "{out}");
    assert!(
        counters
            .iter()
            .any(|(n, _)| n.starts_with("conn.") && n.ends_with(".rtt_p99_ns")),
        "{out}"
    );
    for slot in 0..4 {
        assert!(
            counters
                .iter()
                .any(|(n, _)| n.starts_with("path.")
                    && n.ends_with(&format!(".{slot}.packets_sent"))),
            "path {slot}: {out}"
        );
    }
    // Resends are counted per path, in packets and bytes.
    let per_path = |suffix: &str| -> u64 {
        counters
            .iter()
            .filter(|(n, _)| n.starts_with("path.") && n.ends_with(suffix))
            .map(|c| c.1)
            .sum()
    };
    assert!(per_path(".packets_retransmitted") > 0, "{out}");
    // (A cold connection's first packet is short: 256 bytes, the rest 4 KiB.)
    assert!(
        per_path(".bytes_retransmitted") >= 256 * per_path(".packets_retransmitted"),
        "{out}"
    );
    // The JSON carries the same counters.
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let c = &doc["counters"];
    assert_eq!(c["tx_datagrams"].as_u64(), get("tx_datagrams"), "{doc}");
    assert!(
        c.as_object()
            .is_some_and(|m| m.keys().any(|k| k.starts_with("path.")))
    );
    let _ = std::fs::remove_file(&json);

    if tshark_available() {
        let (data, acks, resent) = check_frames(&pcap);
        // The client's capture has its data and the server's ACKs; loss
        // on the receive side makes resends.
        assert!(data >= 300 * 16, "{data} data frames");
        assert!(acks > 0, "no ACK frames");
        assert!(resent > 0, "no resent frame in a lossy run");
        let names = check_fields_named(&pcap, 400);
        for needed in [
            "metaroce.psn",
            "metaroce.dst_qpn",
            "metaroce.msg_seq",
            "metaroce.offset",
            "metaroce.opcode",
            "metaroce.rkey",
            "metaroce.ack_psn",
            "metaroce.op_ack_count",
            "metaroce.icrc",
        ] {
            assert!(names.contains(needed), "{needed} not shown in {names:?}");
        }
        println!("tshark: {data} data, {acks} ACK frames ({resent} resent), fields {names:?}");
    }
    let _ = std::fs::remove_file(&pcap);
}

#[test]
fn simulator_captures_chosen_hosts_and_writes_counters_per_host() {
    let dir = temp("sim");
    let pcap = temp("sim.pcap");
    let scenario = incast_scenario("incast.toml");
    let (out, err, code) = metaroce(&[
        "sim",
        scenario.to_str().unwrap(),
        "-q",
        "--out",
        dir.to_str().unwrap(),
        "--pcap",
        pcap.to_str().unwrap(),
        "--pcap-hosts",
        "0,2",
        "--pcap-snaplen",
        "200",
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("packets written to"), "{out}");
    let csv = std::fs::read_to_string(dir.join("counters.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "{csv}");
    assert!(lines[0].starts_with("host,rx_datagrams,"), "{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    for (h, row) in lines[1..].iter().enumerate() {
        let v: Vec<&str> = row.split(',').collect();
        assert_eq!(v.len(), header.len(), "{row}");
        assert_eq!(v[0], h.to_string());
    }
    if tshark_available() {
        let text = tshark(
            &pcap,
            &[
                "-T",
                "fields",
                "-e",
                "ip.src",
                "-e",
                "ip.dst",
                "-e",
                "frame.time_epoch",
                "-e",
                "metaroce.packet_type",
                "-e",
                "_ws.malformed",
                "-e",
                "metaroce.src_device_port",
            ],
        );
        let mut n = 0;
        let mut last_ts = 0.0f64;
        for line in text.lines() {
            let v: Vec<&str> = line.split('\t').collect();
            // Host i is 10.0.0.(i+1): every frame has host 0 or 2 at one end.
            let ends = [v[0], v[1]];
            assert!(
                ends.contains(&"10.0.0.1") || ends.contains(&"10.0.0.3"),
                "{line}"
            );
            assert!(v[3] == "1" || v[3] == "2", "{line}");
            assert!(v.get(4).is_none_or(|m| m.is_empty()), "malformed: {line}");
            assert_eq!(v.get(5).copied(), Some("4793"), "{line}");
            // Simulated time: from 0, never backwards per host pair order
            // is not promised, but all within the run (10 ms).
            let ts: f64 = v[2].parse().unwrap();
            assert!((0.0..0.010).contains(&ts), "{line}");
            last_ts = last_ts.max(ts);
            n += 1;
        }
        assert!(n > 16, "{n} frames");
        assert!(last_ts > 0.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&pcap);
    let _ = std::fs::remove_file(&scenario);
}

#[test]
fn a_failed_perf_run_prints_its_counters() {
    // Nearly every datagram dropped on receive: the client's WRITE runs out
    // of retries (short RTOs keep it brief) and the run fails.
    let (out, err, code) = metaroce(&[
        "perf",
        "write-bw",
        "--loopback",
        "-p",
        "0",
        "-n",
        "10",
        "--impair",
        "loss=0.999,seed=1",
        "--rto-min-us",
        "100",
        "--stats",
    ]);
    assert_ne!(code, Some(0), "{out}\n{err}");
    assert!(err.contains("RetryExcErr"), "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("# counters of the failed device ")),
        "{out}"
    );
    let counters = counter_lines(&out);
    let value = |name: &str| counter(&counters, name);
    assert!(value("rtos").is_some_and(|n| n > 0), "{out}");
    assert!(value("tx_datagrams").is_some_and(|n| n > 0), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("path.") && l.contains(".rtos ")),
        "{out}"
    );
}

#[test]
fn receive_paths_are_counted_where_data_arrives() {
    // READ: the client's device receives the data, on the server's paths.
    let (out, err, code) = metaroce(&[
        "perf",
        "read-bw",
        "--loopback",
        "-p",
        "0",
        "-n",
        "50",
        "--paths",
        "4",
        "--stats",
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let counters = counter_lines(&out);
    let value = |name: &str| counter(&counters, name);
    let sum = |suffix: &str| -> u64 {
        counters
            .iter()
            .filter(|(n, _)| n.starts_with("rxpath.") && n.ends_with(suffix))
            .map(|c| c.1)
            .sum()
    };
    let packets = sum(".packets_received");
    assert!(packets > 0, "{out}");
    // The receive paths' packets are the connection's: all of them unless
    // the peer renewed a path (a spurious failover on a busy host), since
    // each counts its current generation only.
    let conn_counter = |suffix: &str| {
        let name = out
            .lines()
            .find_map(|l| {
                let name = l.split_whitespace().next()?;
                (name.starts_with("conn.") && name.ends_with(suffix)).then_some(name)
            })
            .expect("a connection");
        value(name).expect("a value")
    };
    let conn_packets = conn_counter(".data_packets_received");
    let conn_bytes = conn_counter(".payload_bytes_received");
    assert!(conn_packets >= 50, "{out}");
    assert!(conn_bytes >= 50 * 65_536, "{out}");
    assert!(conn_packets >= packets, "{out}");
    assert!(conn_bytes >= sum(".payload_bytes_received"), "{out}");
}

/// The `name value` counter lines of a `--stats` output.
fn counter_lines(out: &str) -> Vec<(&str, u64)> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (n, v) = (w.next()?, w.next()?);
            (w.next().is_none() && !n.starts_with('#'))
                .then(|| v.parse().ok().map(|v| (n, v)))
                .flatten()
        })
        .collect()
}

/// Counter `name` of [`counter_lines`].
fn counter(counters: &[(&str, u64)], name: &str) -> Option<u64> {
    counters.iter().find(|(n, _)| *n == name).map(|c| c.1)
}

/// Packets written, from the `pcap N packets written to FILE` line.
fn packets_written(out: &str) -> usize {
    out.lines()
        .find_map(|l| {
            l.strip_prefix("pcap ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no pcap line: {out}"))
}

#[test]
fn simulator_captures_chosen_links() {
    let scenario = incast_scenario("links.toml");
    let capture = |pcap: &Path, points: &[&str]| {
        let args = [
            &["sim", scenario.to_str().unwrap(), "-q", "--pcap"][..],
            &[pcap.to_str().unwrap()][..],
            points,
        ]
        .concat();
        let (out, err, code) = metaroce(&args);
        assert_eq!(code, Some(0), "{out}\n{err}");
        packets_written(&out)
    };
    // Host 1's own link carries exactly what host 1 sends and receives (no
    // loss, no trimming here): the link's capture and the host's have the
    // same packets, and both together twice as many.
    let on_link = temp("link.pcap");
    let at_host = temp("host.pcap");
    let both = temp("both.pcap");
    let link = capture(&on_link, &["--pcap-links", "h1-switch0"]);
    let host = capture(&at_host, &["--pcap-hosts", "1"]);
    let together = capture(&both, &["--pcap-hosts", "1", "--pcap-links", "switch0-h1"]);
    assert!(link > 16, "{link} packets");
    assert_eq!(link, host);
    assert_eq!(together, 2 * link);
    // Two links: what each carries, in one file.
    let two = temp("two.pcap");
    let n = capture(&two, &["--pcap-links", "h1-switch0,h2-switch0"]);
    let other = capture(&two, &["--pcap-links", "h2-switch0"]);
    assert_eq!(n, link + other);
    let n = capture(&two, &["--pcap-links", "h1-switch0,h2-switch0"]);

    if tshark_available() {
        let text = tshark(
            &two,
            &[
                "-T",
                "fields",
                "-e",
                "ip.src",
                "-e",
                "ip.dst",
                "-e",
                "metaroce.packet_type",
                "-e",
                "_ws.malformed",
                "-e",
                "metaroce.icrc.status",
            ],
        );
        let mut frames = 0;
        for line in text.lines() {
            let v: Vec<&str> = line.split('\t').collect();
            // Host i is 10.0.0.(i+1): host 1 or 2 at one end, host 0 (the
            // incast's receiver) at the other.
            let ends = [v[0], v[1]];
            assert!(ends.contains(&"10.0.0.1"), "{line}");
            assert!(
                ends.contains(&"10.0.0.2") || ends.contains(&"10.0.0.3"),
                "{line}"
            );
            assert!(v[2] == "1" || v[2] == "2", "{line}");
            assert!(v[3].is_empty(), "malformed: {line}");
            assert_eq!(v.get(4).copied(), Some("1"), "ICRC not good: {line}");
            frames += 1;
        }
        assert_eq!(frames, n);
    }

    // Bad links are bad input: exit 2 and one line saying which.
    for (links, says) in [
        ("h1-h2", "--pcap-links: no link h1 - h2"),
        ("h1-tor9", "--pcap-links: no node named 'tor9'"),
        ("h1", "--pcap-links: 'h1' is not a link"),
    ] {
        let (out, err, code) = metaroce(&[
            "sim",
            scenario.to_str().unwrap(),
            "-q",
            "--pcap",
            two.to_str().unwrap(),
            "--pcap-links",
            links,
        ]);
        assert_eq!(code, Some(2), "{links}: {out}\n{err}");
        assert!(err.contains(says), "{links}: {err}");
    }
    let (_, err, code) = metaroce(&["sim", "--pcap-links", "h1-switch0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("need --pcap FILE"), "{err}");
    for f in [&on_link, &at_host, &both, &two, &scenario] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn log_filters_show_the_cores_spans_and_events_on_stderr() {
    // A lossy WRITE over the harness: losses, resends and probes happen.
    let run = ["harness", "-s", "1M", "--loss", "0.05", "--paths", "4"];
    let (quiet_out, quiet_err, code) = metaroce(&run);
    assert_eq!(code, Some(0), "{quiet_err}");
    assert!(
        !quiet_err.contains("metaroce_proto"),
        "logs without a filter: {quiet_err}"
    );
    let lines = |err: &str| -> Vec<String> {
        err.lines()
            .filter(|l| l.contains(" metaroce_proto: "))
            .map(str::to_owned)
            .collect()
    };

    // debug: connections and paths as spans around their events; the
    // results on stdout are the same as without logging.
    let debug = [&["--log", "debug"][..], &run[..]].concat();
    let (out, err, code) = metaroce(&debug);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, quiet_out, "logging changed the run");
    let logged = lines(&err);
    let has = |needle: &str| logged.iter().any(|l| l.contains(needle));
    assert!(
        has(" INFO conn{peer=127.0.0.2:4793 conn=0}: metaroce_proto: connection set up"),
        "{err}"
    );
    assert!(
        has(
            "conn{peer=127.0.0.2:4793 conn=0}:path{slot=0 gen=0 src_port=4794}: metaroce_proto: path opened"
        ),
        "{err}"
    );
    assert!(
        has(":path{slot=") && has("packets lost: a SACK gap"),
        "{err}"
    );
    assert!(!has(" TRACE "), "TRACE at debug: {err}");

    // METAROCE_LOG before RUST_LOG, --log before both.
    let (_, err, _) = metaroce_env(&run, &[("METAROCE_LOG", "info"), ("RUST_LOG", "trace")]);
    let logged = lines(&err);
    assert!(
        !logged.is_empty() && logged.iter().all(|l| l.contains(" INFO ")),
        "{err}"
    );
    let (_, err, _) = metaroce_env(&run, &[("RUST_LOG", "trace")]);
    assert!(
        lines(&err)
            .iter()
            .any(|l| l.contains(" TRACE ") && l.contains(" metaroce_proto: retransmit ")),
        "RUST_LOG=trace shows every resend: {err}"
    );
    let warn = [&["--log", "warn"][..], &run[..]].concat();
    let (_, err, _) = metaroce_env(&warn, &[("METAROCE_LOG", "trace")]);
    assert!(lines(&err).is_empty(), "--log warn still logged: {err}");

    // A filter on a span field: one connection (A's, toward B) and its
    // paths, not B's toward A.
    let one = [
        &["--log", "[conn{peer=127.0.0.2:4793}]=debug"][..],
        &run[..],
    ]
    .concat();
    let (_, err, _) = metaroce(&one);
    let logged = lines(&err);
    assert!(logged.iter().any(|l| l.contains(":path{slot=")), "{err}");
    assert!(
        logged
            .iter()
            .all(|l| l.contains("conn{peer=127.0.0.2:4793 conn=0}")),
        "{err}"
    );

    // A bad filter is bad input: exit 2, one line naming where it came from.
    let bad = [&["--log", "metaroce_proto=loud"][..], &run[..]].concat();
    let (_, err, code) = metaroce(&bad);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--log \"metaroce_proto=loud\" is not a log filter"),
        "{err}"
    );
    let (_, err, code) = metaroce_env(&run, &[("METAROCE_LOG", "[conn{")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("METAROCE_LOG"), "{err}");
}
