//! Feed an endpoint that authenticates packets raw datagrams and genuine
//! authenticated packets replayed, mutated and resized: nothing but a fresh
//! genuine packet may be accepted, and memory only ever holds what the
//! genuine peer wrote (see `src/auth.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metaroce_fuzz::auth::run(data);
});
