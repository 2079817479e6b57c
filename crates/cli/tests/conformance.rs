//! The conformance suite against MetaRoCE itself, as CI runs it:
//! `metaroce conformance-responder` and `metaroce conformance --target` on
//! loopback, without packet protection, authenticated and encrypted. Every
//! check that applies must pass (docs/spec/conformance.md).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A test job secret (never a production one).
const TEST_SECRET: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

/// Start a responder on a free port; returns it and the port it listens on.
fn responder(protection: &[&str]) -> (Child, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args([
            "conformance-responder",
            "--bind",
            "127.0.0.1",
            "-p",
            "0",
            "--once",
        ])
        .args(protection)
        .env("METAROCE_JOB_SECRET", TEST_SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the responder");
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().expect("piped"))
        .read_line(&mut first)
        .expect("the responder says where it listens");
    let port = first
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {first:?}"));
    (child, port)
}

fn suite(port: u16, protection: &[&str], extra: &[&str]) -> (String, Option<i32>) {
    let out = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args([
            "conformance",
            "--target",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .args(protection)
        .args(extra)
        .env("METAROCE_JOB_SECRET", TEST_SECRET)
        .output()
        .expect("run the suite");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (text, out.status.code())
}

/// Run the whole suite in one mode; returns (passed, skipped).
fn run_mode(protection: &[&str]) -> (usize, usize) {
    let (mut child, port) = responder(protection);
    let (out, code) = suite(port, protection, &[]);
    let status = child.wait().expect("responder exits after one run");
    assert_eq!(code, Some(0), "{protection:?}:\n{out}");
    assert!(status.success(), "responder {protection:?}: {status}");
    assert!(!out.contains("\nFAIL "), "{out}");
    let last = out
        .lines()
        .find(|l| l.starts_with("conformance: ") && l.contains(" passed, "))
        .unwrap_or_else(|| panic!("no closing line:\n{out}"));
    let n = |word: &str| -> usize {
        last.split(", ")
            .find(|p| p.ends_with(word))
            .and_then(|p| p.trim_start_matches("conformance: ").split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{word} in {last:?}"))
    };
    assert_eq!(n("failed"), 0, "{out}");
    println!("{protection:?}: {last}");
    (n("passed"), n("skipped"))
}

#[test]
fn metaroce_passes_its_conformance_suite_in_every_protection_mode() {
    // 51 checks: 5 apply to authenticated targets only, 1 to plain ones.
    assert_eq!(run_mode(&[]), (46, 5));
    assert_eq!(run_mode(&["--auth"]), (50, 1));
    assert_eq!(run_mode(&["--encrypt"]), (50, 1));
}

#[test]
fn only_runs_the_selected_checks_and_a_protection_mismatch_is_refused() {
    let (mut child, port) = responder(&[]);
    let (out, code) = suite(port, &[], &["--only", "sack.,drop.bad-icrc"]);
    let _ = child.wait();
    assert_eq!(code, Some(0), "{out}");
    let passed: Vec<&str> = out.lines().filter(|l| l.starts_with("PASS ")).collect();
    assert!(!passed.is_empty(), "{out}");
    assert!(
        passed
            .iter()
            .all(|l| l.starts_with("PASS sack.") || l.starts_with("PASS drop.bad-icrc")),
        "{out}"
    );

    let (mut child, port) = responder(&["--auth"]);
    let (out, code) = suite(port, &[], &[]);
    let _ = child.wait();
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("packet protection differs"), "{out}");
}
