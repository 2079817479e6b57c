//! The simulator's scenario parser on arbitrary text.
//!
//! `Scenario::parse` reads a TOML scenario (topology, switch, transport,
//! workloads, failures) and validates it; for any input it must return a
//! scenario or an error naming the line, and never panic. Inputs that are
//! not UTF-8 are skipped: the parser takes `&str` (files are read with
//! `read_to_string`, which refuses them first).

use metaroce_sim::Scenario;

/// Parse `data` as a scenario; when it parses, check that the error path
/// and the accepted path both hold up (re-parsing gives the same verdict).
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Scenario::parse(text, "fuzz/scenario.toml") {
        Ok(_) => {
            assert!(
                Scenario::parse(text, "again.toml").is_ok(),
                "parse is not deterministic"
            );
        }
        Err(err) => {
            let message = err.to_string();
            assert!(
                message.starts_with("fuzz/scenario.toml:"),
                "error does not say where: {message}"
            );
            assert!(!message.contains('\n'), "error is not one line: {message}");
        }
    }
}
