//! Feed the protocol core (one `Endpoint` with a connected, self-looped QP)
//! arbitrary sequences of raw datagrams, structured data packets and ACKs
//! aimed at its real QPN and keys, echoed transmits, clock advances and new
//! posts; check that nothing panics, that a region without remote rights is
//! never touched, and that every posted work request completes at most once
//! (see `src/endpoint.rs` for the input format and the invariants).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metaroce_fuzz::endpoint::run(data);
});
