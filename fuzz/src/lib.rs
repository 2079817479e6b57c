//! Support code for the MetaRoCE fuzz targets.
//!
//! The harnesses (`endpoint_packets`, `auth_packets`, `scenario_parse`) live
//! here rather than in their `fuzz_targets/` files so that ordinary stable
//! tests (`tests/`) can replay their committed corpora and regenerate their
//! seeds without libFuzzer.

pub mod auth;
pub mod endpoint;
pub mod scenario;
