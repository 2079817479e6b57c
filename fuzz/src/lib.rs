//! Support code for the MetaRoCE fuzz targets.
//!
//! The `endpoint_packets` harness lives here rather than in its
//! `fuzz_targets/` file so that ordinary stable tests (`tests/`) can replay
//! its committed corpus and regenerate its seeds without libFuzzer.

pub mod endpoint;
