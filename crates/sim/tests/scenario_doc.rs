//! docs/scenario.md documents every scenario key: each key a `Scenario`
//! serializes (with one workload and one failure, and every optional key
//! set) has a row in its table's section. A key added to `scenario.rs`
//! without a row fails here, naming the key and the section.

use metaroce_sim::Scenario;
use serde_json::Value;

const DOC: &str = include_str!("../../../docs/scenario.md");

/// The text of the section whose heading contains `title`.
fn section(title: &str) -> &'static str {
    DOC.split("\n## ")
        .find(|s| s.lines().next().is_some_and(|h| h.contains(title)))
        .unwrap_or_else(|| panic!("docs/scenario.md has no section '{title}'"))
}

fn keys(v: &Value) -> Vec<String> {
    match v {
        Value::Object(m) => m.keys().cloned().collect(),
        Value::Array(a) => a.first().map(keys).unwrap_or_default(),
        _ => Vec::new(),
    }
}

#[test]
fn every_scenario_key_has_a_row() {
    let text = r#"
name = "every key"
[topology]
kind = "star"
hosts = 4
link_gbps = 100
[switch]
reconverge_us = 1.0
[[workload]]
kind = "permutation"
bytes = 1000
[[failure]]
at_us = 1.0
up_at_us = 2.0
switch = "switch0"
[[monitor]]
link = ["h0", "switch0"]
"#;
    let scn = Scenario::parse(text, "every-key.toml").unwrap();
    let doc = serde_json::to_value(&scn).unwrap();
    let Value::Object(top) = &doc else {
        panic!("a scenario serializes as a table")
    };
    let mut missing = Vec::new();
    for (key, value) in top {
        let (title, inner) = match value {
            Value::Object(_) => (format!("`[{key}]`"), keys(value)),
            Value::Array(_) => (format!("`[[{key}]]`"), keys(value)),
            _ => ("Top level".to_string(), vec![key.clone()]),
        };
        if inner.is_empty() && matches!(value, Value::Array(_)) {
            missing.push(format!("{key} (no element to read keys from)"));
        }
        let body = section(&title);
        for k in inner {
            if !body.contains(&format!("| `{k}` |")) {
                missing.push(format!("{k} in section {title}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/scenario.md lacks rows for: {}",
        missing.join(", ")
    );
}

/// Every transport tunable settable under `[transport]` has a row.
#[test]
fn every_transport_knob_has_a_row() {
    use metaroce_sim::transport::knobs::{DCQCN_KNOBS, IB_KNOBS, RC_KNOBS};
    let names = metaroce_proto::EndpointConfig::KNOBS
        .iter()
        .map(|k| k.name)
        .chain(
            metaroce_proto::cc::MetaRoceParams::KNOBS
                .iter()
                .map(|k| k.name),
        )
        .chain(DCQCN_KNOBS.iter().map(|k| k.name))
        .chain(RC_KNOBS.iter().map(|k| k.name))
        .chain(IB_KNOBS.iter().map(|k| k.name));
    let body = section("`[transport]`");
    let missing: Vec<&str> = names
        .filter(|n| !body.contains(&format!("| `{n}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/scenario.md [transport] lacks rows for {missing:?}"
    );
}

/// Every scenario file the repository ships (RESULTS.md and the docs give
/// commands that run them) parses: a key renamed or a range narrowed in
/// `scenario.rs` fails here, naming the file.
#[test]
fn every_scenario_file_in_the_repository_parses() {
    fn walk(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("scenarios/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "toml") {
                found.push(path);
            }
        }
    }
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios"));
    let mut files = Vec::new();
    walk(root, &mut files);
    let mut parsed = 0;
    for path in &files {
        let text = std::fs::read_to_string(path).expect("readable");
        // Suites and sweep plans have formats of their own.
        if text.contains("[[experiment]]") || text.contains("[grid]") {
            continue;
        }
        if let Err(e) = Scenario::load(path) {
            panic!("{}: {e}", path.display());
        }
        parsed += 1;
    }
    assert!(
        parsed >= 40,
        "only {parsed} scenario files found under scenarios/"
    );
}
