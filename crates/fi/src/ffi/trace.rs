//! The `tracing` spans and events of the MetaRoCE core (and the provider's
//! own) under libfabric, where no Rust program is there to install a
//! subscriber: the provider installs one when it loads, if anything asks
//! for it, writing to stderr as the `metaroce` command does.
//!
//! Asked for by `METAROCE_LOG`, else `RUST_LOG` (`tracing`'s filter syntax,
//! e.g. `info` or `metaroce_proto=debug`: connections, paths, losses, RTOs,
//! path retirements, QP errors), and by `FI_METAROCE_STATS=1`, which adds
//! `metaroce_fi=info`: every endpoint's counters when it closes. With
//! neither, nothing is installed and every event costs one check of a
//! global level. The provider's other messages go through `fi_log`
//! ([`super::log`]) as libfabric's logging expects; a filter that does not
//! parse is a warning there, and no subscriber is installed.
//!
//! The subscriber is the library's own: the application's `tracing` (if it
//! is a Rust program with one) is a different copy and is not touched.

use tracing_subscriber::EnvFilter;

/// Target of the provider's own events.
pub(crate) const TARGET: &str = "metaroce_fi";

/// Install the stderr subscriber if a filter asks for one (see the module
/// docs); `stats` is `FI_METAROCE_STATS`.
pub(crate) fn init(stats: bool) {
    let from_env = ["METAROCE_LOG", "RUST_LOG"].into_iter().find_map(|v| {
        std::env::var(v)
            .ok()
            .filter(|s| !s.trim().is_empty())
            .map(|s| (v, s))
    });
    let stats_directive = format!("{TARGET}=info");
    let (source, spec) = match (from_env, stats) {
        (Some((source, spec)), false) => (source, spec),
        (Some((source, spec)), true) => (source, format!("{spec},{stats_directive}")),
        (None, true) => ("FI_METAROCE_STATS", stats_directive),
        (None, false) => return,
    };
    match EnvFilter::builder().parse(&spec) {
        Ok(filter) => {
            // Fails only if this library already installed one.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init();
        }
        Err(e) => super::log::warn(&format!(
            "{source} {spec:?} is not a log filter (e.g. info, debug, metaroce_proto=trace): {e}; logging stays off"
        )),
    }
}
