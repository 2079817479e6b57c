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
    // A port nothing listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
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

#[test]
fn coll_perf_bad_input_is_exit_2() {
    assert_one_line_error(&["coll-perf", "allreduce"], "unknown collective");
    assert_one_line_error(&["coll-perf", "all_reduce", "-t", "2"], "-t");
    assert_one_line_error(&["coll-perf", "all_reduce", "-d", "float8"], "float8");
    assert_one_line_error(&["coll-perf", "all_reduce", "--impair", "loss=2"], "loss");
    assert_one_line_error(&["coll-perf", "broadcast", "-r", "3"], "-r 3");
}
