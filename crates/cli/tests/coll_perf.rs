//! `metaroce coll-perf` end to end: ranks spawned as processes
//! (`--ranks`), nccl-tests' output read back the way its parsers read it,
//! and the JSON.

use std::process::Command;

fn coll_perf(args: &[&str]) -> (String, String, Option<i32>) {
    let out = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .arg("coll-perf")
        .args(args)
        .env_remove("RANK")
        .output()
        .expect("run metaroce");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

/// The data rows: lines that do not start with `#`.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[test]
fn three_rank_processes_verified_with_nccl_tests_output() {
    let json = std::env::temp_dir().join(format!("coll-perf-{}.json", std::process::id()));
    let (out, err, code) = coll_perf(&[
        "all_reduce_perf",
        "--ranks",
        "3",
        "-b",
        "4K",
        "-e",
        "1M",
        "-f",
        "16",
        "-n",
        "3",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.starts_with("# nccl-tests version"), "{out}");
    assert_eq!(out.matches("#  Rank ").count(), 3, "{out}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 3, "{out}");
    for r in &rows {
        assert_eq!(r.len(), 13, "{r:?}");
        assert_eq!(
            (r[2].as_str(), r[3].as_str(), r[4].as_str()),
            ("float", "sum", "-1")
        );
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "#wrong: {r:?}");
    }
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains("# Avg bus bandwidth    : "), "{out}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(doc["world"], 3);
    assert_eq!(doc["results"].as_array().unwrap().len(), 3);
    assert_eq!(doc["results"][2]["size"], 1 << 20);
    assert_eq!(doc["results"][0]["in_place"]["wrong"], 0);
}

#[test]
fn one_rank_alone_and_lossy_broadcast() {
    let (out, err, code) = coll_perf(&["reduce_scatter", "-b", "64K", "-e", "64K", "-n", "2"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(rows(&out).len(), 1, "{out}");
    let (out, err, code) = coll_perf(&[
        "broadcast",
        "--ranks",
        "4",
        "-b",
        "1M",
        "-e",
        "1M",
        "-n",
        "2",
        "-r",
        "3",
        "--impair",
        "loss=0.01",
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let rows = rows(&out);
    assert_eq!(
        (rows[0][4].as_str(), rows[0][8].as_str()),
        ("3", "0"),
        "{out}"
    );
}

#[test]
fn every_rank_captures_its_own_device() {
    let dir = std::env::temp_dir().join(format!("coll-perf-pcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("ring.pcap");
    let (out, err, code) = coll_perf(&[
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "64K",
        "-e",
        "64K",
        "-n",
        "2",
        "--pcap",
        pcap.to_str().unwrap(),
        "--pcap-snaplen",
        "128",
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    for rank in 0..2 {
        let file = dir.join(format!("ring.rank{rank}.pcap"));
        let line = format!("pcap: rank {rank} wrote ");
        let written: u64 = err
            .lines()
            .find_map(|l| {
                l.strip_prefix(&line)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no capture line for rank {rank}: {err}"));
        assert!(written > 16, "rank {rank}: {written} packets");
        let bytes = std::fs::read(&file).unwrap();
        // pcap (nanosecond magic), snap length 128, Ethernet.
        assert_eq!(&bytes[..4], &0xa1b2_3c4d_u32.to_le_bytes(), "{file:?}");
        assert_eq!(u32::from_le_bytes(bytes[16..20].try_into().unwrap()), 128);
        assert_eq!(u32::from_le_bytes(bytes[20..24].try_into().unwrap()), 1);
    }
    assert!(
        !pcap.exists(),
        "a job of two ranks writes per-rank files only"
    );
    let (_, err, code) = coll_perf(&["all_reduce", "--pcap-snaplen", "64"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--pcap-snaplen needs --pcap FILE"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
