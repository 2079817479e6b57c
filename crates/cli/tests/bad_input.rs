//! Bad input on the command line: a one-line error naming what was wrong,
//! exit code 2, never a panic or a hang.

use std::process::{Command, Output};

fn metaroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args(args)
        .output()
        .expect("run metaroce")
}

/// Exit 2 with exactly one line on stderr that contains `needle`.
fn assert_one_line_error(args: &[&str], needle: &str) {
    let out = metaroce(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.len() == 1 || lines[0].starts_with("error:"),
        "{args:?}: more than one line: {stderr}"
    );
    assert!(
        stderr.contains(needle),
        "{args:?}: error does not name '{needle}': {stderr}"
    );
}

#[test]
fn perf_bad_size_is_exit_2() {
    assert_one_line_error(&["perf", "write-bw", "--loopback", "-s", "12Q"], "12Q");
    assert_one_line_error(&["perf", "write-bw", "--loopback", "-s", "0"], "size");
    assert_one_line_error(
        &["perf", "write-bw", "--loopback", "--buffer-bytes", "0"],
        "--buffer-bytes",
    );
}

#[test]
fn perf_bad_address_is_exit_2() {
    assert_one_line_error(
        &["perf", "write-bw", "no-such-host.invalid"],
        "no-such-host.invalid",
    );
}

#[test]
fn perf_unreachable_server_is_exit_2() {
    // A port nothing listens on.
    let port = free_tcp_port();
    assert_one_line_error(
        &["perf", "write-bw", "127.0.0.1", "-p", &port.to_string()],
        &port.to_string(),
    );
}

#[test]
fn perf_unknown_test_is_exit_2() {
    assert_one_line_error(&["perf", "write-bww", "--loopback"], "write-bww");
}

#[test]
fn sim_missing_scenario_is_exit_2() {
    assert_one_line_error(&["sim", "/nonexistent/scenario.toml"], "scenario.toml");
}

#[test]
fn sim_bad_key_names_key_and_line() {
    let dir = std::env::temp_dir().join(format!("metaroce-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "name = \"x\"\n\n[topology]\nkind = \"leaf-spine\"\nhostz = 4\n",
    )
    .unwrap();
    let out = metaroce(&["sim", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("hostz"), "{stderr}");
    assert!(stderr.contains('5'), "line number missing: {stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A fresh directory for one test's files.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("metaroce-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A 4-host star with one permutation of `bytes` per host.
fn small_scenario(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("small.toml");
    std::fs::write(
        &path,
        format!(
            "name = \"small\"\n{extra}\n[topology]\nkind = \"star\"\nhosts = 4\nlink_gbps = 100\n\n[[workload]]\nkind = \"permutation\"\nbytes = 100000\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn sim_huge_topology_is_refused_before_allocating() {
    let dir = temp_dir("huge");
    let star = dir.join("star.toml");
    std::fs::write(
        &star,
        "name = \"x\"\n[topology]\nkind = \"star\"\nhosts = 4000000000\nlink_gbps = 100\n",
    )
    .unwrap();
    assert_one_line_error(&["sim", star.to_str().unwrap()], "limit of 2^20");
    let wide = dir.join("wide.toml");
    std::fs::write(
        &wide,
        "name = \"x\"\n[topology]\nkind = \"leaf_spine\"\nhosts = 100000\nhosts_per_leaf = 1\nspines = 1000\nlink_gbps = 100\n",
    )
    .unwrap();
    assert_one_line_error(&["sim", wide.to_str().unwrap()], "would need about");
    std::fs::remove_dir_all(&dir).ok();
}

/// Output into a pipe whose reader is gone ends the process quietly (by
/// SIGPIPE, as `seq | head` ends `seq`), never with a panic (exit 101).
#[test]
fn closed_stdout_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    for args in [
        &["sim", "-q"][..],
        &["sim"][..],
        &["harness", "-s", "64K", "--loss", "0"][..],
    ] {
        // A child another test forks at the same moment may hold the read
        // end open until it execs, and then the write succeeds: try again
        // until the pipe is seen closed.
        let mut killed_by_sigpipe = false;
        for _ in 0..10 {
            let mut child = Command::new(env!("CARGO_BIN_EXE_metaroce"))
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run metaroce");
            // Close the read end before the child writes its first line.
            drop(child.stdout.take());
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
            killed_by_sigpipe = out.status.signal() == Some(libc::SIGPIPE);
            assert!(
                killed_by_sigpipe || out.status.success(),
                "{args:?}: {:?} {stderr}",
                out.status
            );
            if killed_by_sigpipe {
                break;
            }
        }
        assert!(killed_by_sigpipe, "{args:?}: never saw the closed pipe");
    }
}

#[test]
fn bad_out_dir_is_refused_before_the_run() {
    let out = metaroce(&["sim", "--out", "/etc/passwd"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "the run started");
    assert_one_line_error(&["sim", "--out", "/etc/passwd"], "not a directory");
    assert_one_line_error(&["sim", "--out", "/etc/passwd/x"], "cannot create");
    assert_one_line_error(
        &["sim", "sweep", "no-such-plan.toml", "--out", "/etc/passwd"],
        "no-such-plan.toml",
    );
}

#[test]
fn sweep_options_outside_a_sweep_are_refused() {
    assert_one_line_error(&["sim", "--shard", "0/2"], "--shard");
    assert_one_line_error(&["sim", "--threads", "2"], "--threads");
    assert_one_line_error(&["sim", "-q", "sweep", "plan.toml"], "cannot be used with");
}

#[test]
fn sweep_is_a_subcommand_with_checked_options() {
    let dir = temp_dir("sweep");
    small_scenario(&dir, "");
    let plan = dir.join("plan.toml");
    std::fs::write(
        &plan,
        "scenario = \"small.toml\"\nseeds = [1]\n[grid]\n\"transport.paths\" = [1, 4]\n",
    )
    .unwrap();
    let plan = plan.to_str().unwrap();
    let out_dir = dir.join("out");
    let out = metaroce(&[
        "sim",
        "sweep",
        plan,
        "-q",
        "--shard",
        "1/2",
        "--threads",
        "1",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out_dir.join("sweep-1-of-2.json").exists());
    assert_one_line_error(&["sim", "sweep", plan, "--threads", "0"], "--threads 0");
    assert_one_line_error(&["sim", "sweep", plan, "--shard", "2/2"], "--shard 2/2");
    assert_one_line_error(&["sim", "sweep", plan, "--threads", "-1"], "-1");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn chaos_zero_seeds_is_exit_2() {
    assert_one_line_error(&["chaos", "--seeds", "0"], "--seeds 0");
    assert_one_line_error(
        &["chaos", "--start", "18446744073709551615", "--seeds", "2"],
        "2^64",
    );
}

/// Negative numbers reach the range checks (instead of being taken for
/// flags: "unexpected argument '-0'").
#[test]
fn negative_numbers_are_range_errors() {
    assert_one_line_error(&["harness", "--loss", "-0.01"], "--loss -0.01");
    assert_one_line_error(&["harness", "--seed", "-1"], "'-1'");
    assert_one_line_error(&["sim", "--seed", "-3"], "'-3'");
    assert_one_line_error(&["chaos", "--seeds", "-5"], "'-5'");
}

#[test]
fn unfinished_simulation_exits_3_unless_allowed() {
    let dir = temp_dir("unfinished");
    let scn = small_scenario(&dir, "end_us = 2.0");
    let scn = scn.to_str().unwrap();
    let out = metaroce(&["sim", scn, "-q"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOT FINISHED"));
    assert!(stderr.contains("--allow-unfinished"), "{stderr}");
    let out = metaroce(&["sim", scn, "-q", "--allow-unfinished"]);
    assert_eq!(out.status.code(), Some(0));
    let out = metaroce(&["sim", scn, "-q", "--transports", "metaroce,ib"]);
    assert_eq!(out.status.code(), Some(3));
    std::fs::remove_dir_all(&dir).ok();
}

/// Random loss under InfiniBand's lossless model is simulated, with a
/// note beside the row saying the baseline assumes otherwise.
#[test]
fn baseline_assumptions_broken_get_a_note() {
    let dir = temp_dir("notes");
    let scn = small_scenario(&dir, "[switch]\nloss = 0.001\n");
    let out = metaroce(&[
        "sim",
        scn.to_str().unwrap(),
        "-q",
        "--allow-unfinished",
        "--transports",
        "metaroce,ib",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let notes: Vec<&str> = stdout.lines().filter(|l| l.contains("note:")).collect();
    assert_eq!(notes.len(), 1, "{stdout}");
    assert!(notes[0].contains("ib") && notes[0].contains("switch.loss = 0.001"));
    std::fs::remove_dir_all(&dir).ok();
}

/// perftest flags users type by habit: honoured, ignored with a note, or
/// refused with "not supported by MetaRoCE".
#[test]
fn perftest_flags_are_honoured_ignored_or_refused() {
    for (flag, needle) in [
        (&["-b"][..], "-b"),
        (&["--report-both"][..], "--report-both"),
        (&["-V"][..], "-V"),
        (&["-c", "UD"][..], "-c UD"),
    ] {
        let mut args = vec!["perf", "write-bw", "--loopback"];
        args.extend_from_slice(flag);
        assert_one_line_error(&args, "not supported by MetaRoCE");
        assert_one_line_error(&args, needle);
    }
    // Harmless ones: accepted, one note each, the run goes ahead.
    let out = metaroce(&[
        "perf",
        "write-bw",
        "--loopback",
        "-s",
        "4K",
        "-n",
        "50",
        "-F",
        "-d",
        "mlx5_0",
        "-x",
        "3",
        "-c",
        "RC",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("note:")).count(),
        3,
        "{stderr}"
    );
    // Honoured ones.
    let out = metaroce(&[
        "perf",
        "write-bw",
        "--loopback",
        "-s",
        "4K",
        "-n",
        "60",
        "-m",
        "1024",
        "-Q",
        "10",
        "-l",
        "4",
        "-I",
        "64",
        "-N",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "CQ Moderation   : 10",
        "Post List       : 4",
        "Mtu             : 1024[B]",
        "Max inline data : 64[B]",
    ] {
        assert!(stdout.contains(line), "{line}: {stdout}");
    }
    // -N: the peak column reads 0.00, as in perftest.
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("4096"))
        .unwrap();
    assert_eq!(row.split_whitespace().nth(2), Some("0.00"), "{row}");
    let out = metaroce(&["perf", "write-lat", "--loopback", "-n", "50", "-I", "64"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn perf_bad_option_values_are_exit_2() {
    let base = ["perf", "write-bw", "--loopback"];
    for (extra, needle) in [
        (&["-Q", "0"][..], "-Q 0"),
        (&["-Q", "5000"][..], "-Q 5000"),
        (&["-l", "0"][..], "-l 0"),
        (&["-I", "5000"][..], "-I 5000"),
        (&["-m", "10"][..], "--mtu 10"),
        (&["-q", "-1"][..], "'-1'"),
        (&["-D", "0"][..], "-D 0"),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        assert_one_line_error(&args, needle);
    }
    assert_one_line_error(
        &["perf", "write-lat", "--loopback", "-q", "2"],
        "-q applies",
    );
    assert_one_line_error(&["perf", "read-bw", "--loopback", "-I", "64"], "-I");
    assert_one_line_error(
        &["perf", "write-lat", "--loopback", "--run_infinitely"],
        "--run_infinitely",
    );
    assert_one_line_error(
        &["perf", "udp-bw", "--loopback", "--auth"],
        "--auth does not apply",
    );
}

/// perftest's software rate limiter: bad values, HW and PP limiters, the
/// limiter's options alone or on a latency test are one-line errors
/// before the run; a limited run prints what an unlimited one does.
#[test]
fn perf_rate_limit_options_are_checked() {
    let base = ["perf", "write-bw", "--loopback"];
    for (extra, needle) in [
        (&["--rate_limit", "0"][..], "--rate_limit 0"),
        (&["--rate_limit", "-2"][..], "--rate_limit -2"),
        (&["--rate_limit", "nan"][..], "--rate_limit NaN"),
        (&["--rate_limit", "inf"][..], "--rate_limit inf"),
        (&["--rate_limit", "fast"][..], "--rate_limit"),
        (
            &["--rate_limit", "1", "--rate_units", "G"][..],
            "--rate_units",
        ),
        (&["--rate_limit", "1", "--rate_units", "Kpps"][..], "'Kpps'"),
        (
            &["--rate_limit", "1", "--rate_limit_type", "HW"][..],
            "--rate_limit_type HW",
        ),
        (
            &["--rate_limit", "1", "--rate_limit_type", "PP"][..],
            "only SW",
        ),
        (
            &["--rate_limit", "1", "--rate_limit_type", "XX"][..],
            "--rate_limit_type XX",
        ),
        (
            &["--rate_limit", "1", "--burst_size", "0"][..],
            "--burst_size 0",
        ),
        (
            &["--rate_limit", "1", "-t", "16", "--burst_size", "17"][..],
            "--burst_size 17",
        ),
        (
            &["--burst_size", "4"][..],
            "--burst_size needs --rate_limit",
        ),
        (
            &["--rate_units", "M"][..],
            "--rate_units needs --rate_limit",
        ),
        (
            &["--rate_limit_type", "SW"][..],
            "--rate_limit_type needs --rate_limit",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        assert_one_line_error(&args, needle);
    }
    for test in ["write-lat", "read-lat", "send-lat", "atomic-lat"] {
        assert_one_line_error(
            &["perf", test, "--loopback", "--rate_limit", "1"],
            "--rate_limit applies to bandwidth tests only",
        );
    }
    assert_one_line_error(
        &["perf", "udp-bw", "--loopback", "--rate_limit", "1"],
        "--rate_limit does not apply",
    );
    // Limited: the same report, a lower figure, nothing more said. (On a
    // port of its own: other tests run loopbacks on the default one.)
    let port = free_tcp_port().to_string();
    let out = metaroce(&[
        "perf",
        "read-bw",
        "--loopback",
        "-p",
        &port,
        "-s",
        "64K",
        "-n",
        "100",
        "--report_gbits",
        "--rate_limit=100",
        "--rate_units=M",
        "--rate_limit_type=SW",
        "--burst_size=4",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.trim().is_empty(), "{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("65536"))
        .unwrap_or_else(|| panic!("no row: {stdout}"));
    let avg: f64 = row.split_whitespace().nth(3).unwrap().parse().unwrap();
    // 100 MiB/s is 0.84 Gb/s.
    assert!(avg > 0.0 && avg <= 0.84 * 1.1, "{row}");
}

/// A JSON path that cannot be written fails before the run, not after.
#[test]
fn perf_json_path_is_checked_before_the_run() {
    let out = metaroce(&["perf", "write-bw", "--loopback", "--json", "/tmp"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "the run started");
    assert_one_line_error(
        &["perf", "write-bw", "--loopback", "--json", "/tmp"],
        "is a directory",
    );
    assert_one_line_error(
        &[
            "perf",
            "write-bw",
            "--loopback",
            "--out_json_file",
            "/nonexistent/x.json",
        ],
        "cannot write",
    );
}

/// `--out_json_file` writes perftest's layout: `{"test_info": ..,
/// "results": ..}` with its key names, plus a schema version and the
/// parameters that reproduce the run.
#[test]
fn perf_json_has_perftests_layout_and_the_parameters() {
    let dir = temp_dir("json");
    let path = dir.join("lat.json");
    let out = metaroce(&[
        "perf",
        "send-lat",
        "--loopback",
        "-n",
        "50",
        "--seed",
        "77",
        "--out_json_file",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        text.find("\"test_info\"") < text.find("\"results\""),
        "{text}"
    );
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["test_info"]["test"], "Send_Latency_Test");
    // No -I: perftest's inline default for a send latency test.
    assert_eq!(doc["test_info"]["Max_inline_data"], 236, "{text}");
    assert!(doc["results"]["percentile_99.9"].is_number(), "{text}");
    assert_eq!(doc["results"]["n_iterations"], 50);
    for key in [
        "size",
        "qps",
        "tx_depth",
        "mtu",
        "mtu_from_path",
        "paths",
        "seed",
        "icrc",
        "icrc_omitted",
        "rto_min_us",
    ] {
        assert!(doc["parameters"].get(key).is_some(), "{key}: {text}");
    }
    assert_eq!(doc["parameters"]["seed"], 77);
    // No -m: the MTU the path gave, recorded as used, not as 0.
    assert_eq!(doc["parameters"]["mtu_from_path"], true, "{text}");
    assert!(
        doc["test_info"]["Mtu"].as_u64().unwrap_or(0) >= 64,
        "{text}"
    );
    assert_eq!(doc["test_info"]["Mtu"], doc["parameters"]["mtu"], "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Two hosts with different job secrets: refused at connect time, on both
/// sides, with a message that says the secrets differ.
#[test]
fn different_job_secrets_are_refused_on_both_sides() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let port = free_tcp_port().to_string();
    let mut server = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args(["perf", "write-bw", "--auth", "-p", &port])
        .env("METAROCE_JOB_SECRET", "11".repeat(32))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it listens.
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("Waiting for client"))),
        "the server did not start"
    );
    let client = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args([
            "perf",
            "write-bw",
            "127.0.0.1",
            "--auth",
            "-n",
            "50",
            "-p",
            &port,
        ])
        .env("METAROCE_JOB_SECRET", "22".repeat(32))
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    for (side, out) in [("client", &client), ("server", &server)] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{side}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{side}: {stderr}");
        assert!(
            stderr.contains("key confirmation failed") && stderr.contains("job secret"),
            "{side}: {stderr}"
        );
    }
    // An all-zero secret is refused before anything starts.
    let out = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args(["perf", "write-bw", "127.0.0.1", "--auth", "-p", &port])
        .env("METAROCE_JOB_SECRET", "0".repeat(64))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("all zeros"), "{stderr}");
}

/// Scenario values that used to panic (a baseline dividing by a zero MTU)
/// or to grow without bound (a nanosecond time-series bin) are one-line
/// errors naming the key.
#[test]
fn sim_values_that_panicked_or_exploded_are_exit_2() {
    let dir = temp_dir("values");
    let scn = small_scenario(&dir, "");
    let text = std::fs::read_to_string(&scn).unwrap();
    std::fs::write(
        &scn,
        format!("{text}\n[transport]\nkind = \"irn\"\nmtu_bytes = 0\n"),
    )
    .unwrap();
    assert_one_line_error(&["sim", scn.to_str().unwrap()], "transport.mtu_bytes");
    let scn = small_scenario(&dir, "sample_us = 0.000001");
    assert_one_line_error(&["sim", scn.to_str().unwrap()], "sample_us");
    let scn = small_scenario(&dir, "end_us = nan");
    assert_one_line_error(&["sim", scn.to_str().unwrap()], "finite");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn coll_perf_bad_input_is_exit_2() {
    assert_one_line_error(&["coll-perf", "allreduce"], "unknown collective");
    assert_one_line_error(&["coll-perf", "all_reduce", "--algo", "fastest"], "fastest");
    assert_one_line_error(
        &["coll-perf", "all_gather", "--algo", "hd", "--ranks", "2"],
        "hd",
    );
    assert_one_line_error(&["coll-perf", "all_reduce", "-t", "2"], "-t");
    assert_one_line_error(&["coll-perf", "all_reduce", "-d", "float8"], "float8");
    assert_one_line_error(&["coll-perf", "all_reduce", "--impair", "loss=2"], "loss");
    assert_one_line_error(&["coll-perf", "broadcast", "-r", "3"], "-r 3");
    assert_one_line_error(
        &["coll-perf", "all_reduce", "--offload", "maybe"],
        "--offload",
    );
}

#[test]
fn compare_bad_options_are_exit_2() {
    assert_one_line_error(&["compare", "--threads", "0"], "--threads");
    assert_one_line_error(&["compare", "--only", "no-such"], "no-such");
}

/// The main job (no arguments) is the side-by-side comparison; one of its
/// experiments, run alone, prints every transport's figure and a verdict
/// per target.
#[test]
fn compare_prints_figures_and_verdicts() {
    let out = metaroce(&["compare", "--only", "incast"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("incast "))
        .expect("an incast row");
    assert_eq!(row.split_whitespace().count(), 2 + 4, "{row}");
    assert_eq!(
        text.matches("  met      incast:").count() + text.matches("  NOT MET  incast:").count(),
        3,
        "{text}"
    );
    assert!(text.contains("targets met in"), "{text}");
}

#[test]
fn suite_only_that_selects_nothing_is_exit_2() {
    let claims = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/claims");
    // A comma-separated list selects any of its fragments; one that
    // matches no id is named before anything runs.
    assert_one_line_error(
        &["sim", "suite", claims, "--only", "plane-scaling,no-such-id"],
        "no experiment id contains no-such-id",
    );
    assert_one_line_error(
        &["compare", "--only", "nothing"],
        "no experiment id contains nothing",
    );
}

/// A TCP port on 127.0.0.1 no one listens on, below the kernel's
/// ephemeral range (32768-60999 by default), where no connection's local
/// port can be: a UDP-probed port can be held by another test's TCP
/// connection, and a TCP listener bound and closed to find one would be
/// copied into any child another test forks at that moment (and accept,
/// then reset, connections until the child's `exec`). Each call takes the
/// next of this process's 100 ports; the block depends on the process id.
fn free_tcp_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let block = 20_000 + (std::process::id() % 120) as u16 * 100;
    block + NEXT.fetch_add(1, Ordering::Relaxed) % 100
}
