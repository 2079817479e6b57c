//! `metaroce perf`: perftest-style tools over the real UDP datapath.

use std::process::ExitCode;

/// Arguments of `metaroce perf`.
#[derive(clap::Args, Debug)]
pub(crate) struct PerfArgs {}

pub(crate) fn run(_args: PerfArgs) -> Result<ExitCode, String> {
    Err("perf: not implemented yet".into())
}
