//! Runs the committed cargo-fuzz seed corpus through the fuzz oracle, so the
//! corpus is exercised on stable in every ordinary `cargo test`.

use std::fs;
use std::path::Path;

use metaroce_wire::{fuzz_check, parse};

#[test]
fn corpus_passes_fuzz_check() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/parse_packet");
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{dir:?}: {err}"))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    entries.sort();
    assert!(
        entries.len() >= 10,
        "seed corpus has {} files",
        entries.len()
    );
    let mut parsed = 0;
    for path in &entries {
        let data = fs::read(path).unwrap();
        // Report which file failed; fuzz_check panics with the reason.
        eprintln!("checking {}", path.display());
        fuzz_check(&data);
        parsed += usize::from(parse(&data).is_ok());
    }
    // The seeds are valid packets: if none parses, the corpus is useless.
    assert!(parsed > 0, "no seed in the corpus parses");
}
