//! Parse arbitrary datagrams; whatever parses must re-emit and re-parse to
//! the same packet. Under `cfg(fuzzing)` the ICRC check is skipped so the
//! fuzzer reaches the field validation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metaroce_wire::fuzz_check(data);
});
