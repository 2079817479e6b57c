//! `metaroce sim suite-plot FILE.json --out PLOTDIR` and `sim suite
//! --plots PLOTDIR`: figures of a suite run from its JSON, and bad input
//! refused with one line and exit 2 before anything runs. Nothing here
//! simulates.

use std::path::PathBuf;
use std::process::{Command, Output};

fn metaroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args(args)
        .output()
        .expect("run metaroce")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("metaroce-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Exit 2 with one line on stderr naming every one of `needles`.
fn assert_one_line_error(args: &[&str], needles: &[&str]) {
    let out = metaroce(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "{args:?}: {stderr}"
    );
    for needle in needles {
        assert!(stderr.contains(needle), "{args:?}: no '{needle}': {stderr}");
    }
}

/// A suite run's JSON as `sim suite --out F.md` writes it: a loss sweep
/// and a single-row experiment.
const SMALL_SUITE_JSON: &str = r#"[
  {
    "id": "loss-link-perm",
    "title": "Random loss per link",
    "shown": "goodput_gbps",
    "rows": [
      {"variant": "switch.loss=0.001",
       "shown": {"ib": 922.4, "irn": 1618.9, "metaroce": 8731.1, "rocev2": 1111.6},
       "targets": [], "errors": []},
      {"variant": "switch.loss=0.01",
       "shown": {"ib": 616.1, "irn": 851.7, "metaroce": 8132.9, "rocev2": 180.9},
       "targets": [["goodput >= 85 % of loss-free at 1 %/link", 0.9228, true]],
       "errors": []},
      {"variant": "switch.loss=0.1",
       "shown": {"ib": 128.9, "irn": 106.8, "metaroce": 3445.2, "rocev2": null},
       "targets": [], "errors": ["rocev2: flows unfinished"]}
    ],
    "command": "metaroce sim suite scenarios/claims --only loss-link-perm"
  },
  {
    "id": "default",
    "title": "The embedded default",
    "shown": "makespan_us",
    "rows": [
      {"variant": "",
       "shown": {"ib": 974.1, "irn": 2433.1, "metaroce": 965.8, "rocev2": 2381.8},
       "targets": [["makespan <= IB-style's", 0.9914, true]],
       "errors": []}
    ],
    "command": "metaroce sim suite scenarios/claims --only default"
  }
]
"#;

#[test]
fn suite_plot_draws_one_svg_per_experiment() {
    let dir = temp_dir("suite-plot");
    let json = dir.join("suite.json");
    std::fs::write(&json, SMALL_SUITE_JSON).unwrap();
    let plots = dir.join("plots");
    let out = metaroce(&[
        "sim",
        "suite-plot",
        json.to_str().unwrap(),
        "--out",
        plots.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("wrote      2 figures"),
        "{out:?}"
    );
    for id in ["loss-link-perm", "default"] {
        let svg = std::fs::read_to_string(plots.join(format!("{id}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for transport in ["metaroce", "rocev2", "irn", "ib"] {
            assert!(svg.contains(&format!(">\n{transport}\n</text>")), "{id}");
        }
    }
    let sweep = std::fs::read_to_string(plots.join("loss-link-perm.svg")).unwrap();
    assert!(
        sweep.contains("goodput ≥ 85 % of loss-free at 1 %/link: 0.923 at loss=0.01 (met)"),
        "no target line"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn suite_plot_bad_json_is_exit_2_naming_the_file() {
    let dir = temp_dir("suite-plot-bad");
    let plots = dir.join("plots");
    let plots = plots.to_str().unwrap();
    let missing = dir.join("missing.json");
    assert_one_line_error(
        &[
            "sim",
            "suite-plot",
            missing.to_str().unwrap(),
            "--out",
            plots,
        ],
        &["missing.json"],
    );
    let cases = [
        ("truncated.json", "[{\"id\": \"x\",", "line 1"),
        ("object.json", "{\"rows\": []}", "expected a sequence"),
        (
            "missing-field.json",
            "[{\"id\": \"x\", \"title\": \"t\"}]",
            "missing field",
        ),
        ("empty.json", "[]", "no experiments"),
        (
            "escaping-id.json",
            "[{\"id\": \"../up\", \"title\": \"t\", \"shown\": \"m\", \"rows\": [], \"command\": \"c\"}]",
            "../up",
        ),
    ];
    for (name, text, what) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        assert_one_line_error(
            &["sim", "suite-plot", path.to_str().unwrap(), "--out", plots],
            &[name, what],
        );
    }
    // Nothing was drawn for any of them.
    assert!(!dir.join("up.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn suite_plots_dir_is_checked_before_anything_runs() {
    let dir = temp_dir("suite-plots-dir");
    let file = dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let claims = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/claims");
    assert_one_line_error(
        &[
            "sim",
            "suite",
            claims,
            "--only",
            "plane-scaling",
            "--plots",
            file.to_str().unwrap(),
        ],
        &["--plots", "a-file", "not a directory"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
