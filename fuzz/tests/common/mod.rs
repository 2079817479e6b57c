//! What the corpus-replay tests share: where a target's corpus lives, and
//! replaying every file in it.

use std::fs;
use std::path::{Path, PathBuf};

/// `corpus/<target>` in this crate.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// The files of `dir`, sorted so replays run in a stable order.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("{dir:?}: {err}"))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    entries.sort();
    entries
}

/// Run `target`'s harness on every file of its corpus, which must hold at
/// least `min_files` (the committed seeds), printing each before it runs so
/// a panic names its input.
pub fn replay_corpus(target: &str, min_files: usize, run: impl Fn(&[u8])) {
    let entries = files(&corpus_dir(target));
    assert!(
        entries.len() >= min_files,
        "{target} corpus has {} files",
        entries.len()
    );
    for path in entries {
        eprintln!("replaying {}", path.display());
        run(&fs::read(&path).unwrap());
    }
}
