//! MetaRoCE conformance suite: tests any implementation of the wire spec
//! (`docs/spec/wire.md`) over UDP.
//!
//! The suite plays the requester: it drives a *conformance responder*
//! (the target) with packets crafted by `metaroce-wire` — in order, out of
//! order, duplicated, resent under new PSNs, at the edges of the SACK
//! window and across the PSN wrap, and every kind of datagram a receiver
//! must reject — and judges the target's ACKs, SACK bitmaps, op-acks, NAK
//! syndromes and responses against what the spec says. Whether bytes were
//! placed is read back with READs. Every check cites the section it
//! tests; the list is [`CHECKS`] and `docs/spec/conformance.md`.
//!
//! The checks are written from the spec, not from MetaRoCE's core: the
//! suite does not depend on `metaroce-proto`, and its receive window,
//! packet authentication (which needs AES-GCM and HKDF, from `ring`) and
//! repair packets' recovery shards (the code wire.md §4.4 names, from
//! `reed-solomon-erasure`) are its own.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use metaroce_conformance::{Config, TargetInfo, run};
//!
//! // What the connection manager's Accept said about the target.
//! let target = TargetInfo {
//!     addr: "127.0.0.1:4793".parse::<SocketAddr>()?,
//!     qpns: vec![1, 2, 3, 4, 5],
//!     rkey: 0x1234,
//!     region_addr: 0,
//!     region_len: 1 << 16,
//!     session_id: 7,
//!     initial_psn: Default::default(),
//!     first_msg_seq: 0,
//! };
//! // The suite's own device, as announced in Hello.
//! let config = Config::new("127.0.0.1:4893".parse()?, vec![11, 12, 13, 14, 15], 8);
//! let report = run(&target, &config)?;
//! println!("{report}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod catalogue;
pub mod expect;
mod keys;
mod link;
mod peer;
mod report;
mod scenarios;
mod target;

#[cfg(test)]
mod tests;

pub use catalogue::{Applies, CHECKS, CheckSpec, Level, spec_of};
pub use keys::derive_key;
pub use link::{Link, UdpLink};
pub use report::{CheckResult, Outcome, Report};
pub use target::{
    AuthSetup, Config, InitialPsn, MIN_QPS, MIN_REGION_LEN, QpRole, SetupError, TargetInfo,
    validate,
};

use peer::Peer;
use report::Verdicts;

/// Run the suite against `target` over a UDP socket bound to `config.local`.
pub fn run(target: &TargetInfo, config: &Config) -> Result<Report, SetupError> {
    validate(target, config)?;
    let link = UdpLink::bind(config.local, target.addr)
        .map_err(|e| SetupError::Socket(format!("binding {}: {e}", config.local)))?;
    run_with_link(link, target, config)
}

/// Run the suite over any [`Link`] (tests use canned responders).
pub fn run_with_link<L: Link>(
    link: L,
    target: &TargetInfo,
    config: &Config,
) -> Result<Report, SetupError> {
    validate(target, config)?;
    let mut peer = Peer::new(link, target.clone(), config.clone());
    let mut verdicts = Verdicts::default();
    let applicable = |spec: &CheckSpec| -> Option<&'static str> {
        match (spec.applies, config.auth.is_some()) {
            (Applies::Plain, true) => Some("the target authenticates packets"),
            (Applies::Authenticated, false) => Some("the target runs without authentication"),
            _ if !config.selects(spec.id) => Some("not selected"),
            _ => None,
        }
    };
    for spec in CHECKS {
        if let Some(why) = applicable(spec) {
            verdicts.record(spec.id, Outcome::Skipped(why.into()));
        }
    }

    // Set-up: the one-packet WRITE that scenarios resend as a filler.
    // Without it nothing can be judged.
    if let Err(why) = peer.write(QpRole::Main, 0, &scenarios::pattern(0, 8)) {
        for spec in CHECKS {
            verdicts.record(
                spec.id,
                Outcome::Fail(format!("set-up WRITE on the main QP failed: {why}")),
            );
        }
        return Ok(verdicts.into_report());
    }

    for scenario in scenarios::all::<L>() {
        let wanted = scenario
            .checks
            .iter()
            .any(|id| spec_of(id).is_some_and(|s| applicable(s).is_none()));
        if !wanted {
            continue;
        }
        if let Err(why) = (scenario.run)(&mut peer, &mut verdicts) {
            for id in scenario.checks {
                verdicts.record(id, Outcome::Fail(format!("could not run: {why}")));
            }
        }
    }

    if config.auth.is_some() && config.selects("auth.target-authenticates") {
        // Let late answers in, then judge every datagram the target sent.
        peer.drain(config.quiet_period);
        verdicts.check(
            "auth.target-authenticates",
            if peer.auth_problems.is_empty() {
                Ok(())
            } else {
                Err(peer.auth_problems.join("; "))
            },
        );
    }
    Ok(verdicts.into_report())
}
