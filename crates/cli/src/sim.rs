//! `metaroce sim`: the packet-level fabric simulator.

use std::process::ExitCode;

/// Arguments of `metaroce sim`.
#[derive(clap::Args, Debug)]
pub(crate) struct SimArgs {}

pub(crate) fn run(_args: SimArgs) -> Result<ExitCode, String> {
    Err("sim: not implemented yet".into())
}
