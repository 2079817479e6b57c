//! Stable-toolchain companions of the `auth_packets` and `scenario_parse`
//! fuzz targets: replay their committed corpora, run the hand-written seeds,
//! and (ignored) regenerate the seed files.
//!
//! `cd fuzz && cargo test` runs them; `cargo test -- --ignored write_`
//! rewrites `corpus/auth_packets/seed-*` and `corpus/scenario_parse/seed-*`.

mod common;

use std::fs;
use std::path::Path;

use common::{corpus_dir as dir, files, replay_corpus};
use metaroce_fuzz::auth::{self, Step, encode};
use metaroce_fuzz::scenario;

/// One seed per kind of step, in both payload modes.
fn auth_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for encrypt in [false, true] {
        let mode = if encrypt {
            "encrypted"
        } else {
            "authenticated"
        };
        let genuine = auth::captured(encrypt);
        let first = &genuine[0];
        let seeds: Vec<(&str, Vec<Step>)> = vec![
            (
                "deliver-all-then-replay",
                (0..8).chain(0..8).map(Step::Deliver).collect(),
            ),
            (
                "mutate-each-region",
                vec![
                    Step::Mutate(0, vec![(2, 0x08)]),        // clear AUTHENTICATED
                    Step::Mutate(0, vec![(20, 0x01)]),       // msg_seq
                    Step::Mutate(1, vec![(60, 0x80)]),       // payload
                    Step::Mutate(2, vec![(u16::MAX, 0x01)]), // wraps to some byte
                    Step::Mutate(3, vec![(first.len() as u16 - 20, 0x01)]), // packet number
                    Step::Mutate(4, vec![(first.len() as u16 - 1, 0xff)]), // tag
                    Step::Deliver(0),
                    Step::Deliver(1),
                ],
            ),
            (
                "resize",
                vec![
                    Step::Resize(0, 8),
                    Step::Resize(0, first.len() as u16 - 1),
                    Step::Resize(0, first.len() as u16 + 4),
                    Step::Resize(5, 92),
                    Step::Deliver(0),
                ],
            ),
            (
                "stranger",
                vec![Step::Stranger(0), Step::Stranger(5), Step::Deliver(0)],
            ),
            (
                "raw",
                vec![
                    Step::Raw(first.clone()),
                    Step::Raw(first[..first.len() - 1].to_vec()),
                    Step::Raw(vec![1, 1, 0x08, 0, 0, 0, 0x12, 0xb7]),
                    Step::Raw(vec![]),
                ],
            ),
            (
                "deliver-and-time",
                vec![
                    Step::Deliver(0),
                    Step::Advance(10),
                    Step::Deliver(1),
                    Step::Deliver(2),
                    Step::Deliver(3),
                    Step::Advance(500),
                    Step::Deliver(4),
                    Step::Advance(60_000),
                    Step::Deliver(0),
                ],
            ),
        ];
        for (name, steps) in seeds {
            out.push((format!("seed-{mode}-{name}"), encode(encrypt, &steps)));
        }
    }
    out
}

#[test]
fn auth_seeds_run_clean() {
    for (name, input) in auth_seeds() {
        eprintln!("seed {name}");
        auth::run(&input);
    }
}

#[test]
fn auth_corpus_passes() {
    replay_corpus("auth_packets", 10, auth::run);
}

#[test]
fn scenario_corpus_passes() {
    replay_corpus("scenario_parse", 10, scenario::run);
}

/// Broken scenarios next to the committed ones: each must be an error.
fn scenario_seeds() -> Vec<(&'static str, String)> {
    vec![
        ("empty", String::new()),
        ("not-toml", "[topology\nkind = ".into()),
        ("unknown-kind", "[topology]\nkind = \"ring\"\n".into()),
        (
            "huge-numbers",
            "[topology]\nhosts = 99999999999999999999\n".into(),
        ),
        ("negative", "end_us = -1.0\n".into()),
        (
            "unicode",
            "[topology]\nkind = \"fat_tree\" # é ü 😀\nhosts = 1\n".into(),
        ),
        ("workload-kind", "[[workload]]\nkind = \"nope\"\n".into()),
        ("nan", "[switch]\nloss = nan\n".into()),
    ]
}

#[test]
fn scenario_seeds_are_errors() {
    for (name, text) in scenario_seeds() {
        scenario::run(text.as_bytes());
        assert!(
            metaroce_sim::Scenario::parse(&text, "seed.toml").is_err(),
            "{name} parsed"
        );
    }
}

#[test]
#[ignore = "rewrites corpus/auth_packets/seed-* and corpus/scenario_parse/seed-*; run by hand"]
fn write_seed_corpora() {
    let auth_dir = dir("auth_packets");
    fs::create_dir_all(&auth_dir).unwrap();
    for (name, input) in auth_seeds() {
        fs::write(auth_dir.join(name), input).unwrap();
    }
    let scenario_dir = dir("scenario_parse");
    fs::create_dir_all(&scenario_dir).unwrap();
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    for path in files(&committed) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        fs::copy(&path, scenario_dir.join(format!("seed-{name}"))).unwrap();
    }
    for (name, text) in scenario_seeds() {
        fs::write(scenario_dir.join(format!("seed-broken-{name}.toml")), text).unwrap();
    }
}
