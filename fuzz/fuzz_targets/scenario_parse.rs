//! Parse arbitrary text as a simulator scenario (TOML): errors are values
//! that name the line, never panics (see `src/scenario.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metaroce_fuzz::scenario::run(data);
});
