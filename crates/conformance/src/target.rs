//! What the suite knows about the target, and how it runs.
//!
//! The target is a *conformance responder* (contract in
//! `docs/spec/conformance.md`): a MetaRoCE device with at least
//! [`MIN_QPS`] RC QPs connected to the suite's QPs, one registered region
//! of at least [`MIN_REGION_LEN`] bytes open to remote READ, WRITE and
//! atomics under one rkey, and no receives posted. How the two sides learn
//! each other's device port, QPNs and session ids is not the suite's
//! business: the connection manager's Hello/Accept exchange
//! (`docs/spec/connection-manager.md`) carries exactly these fields, and
//! the caller fills in [`TargetInfo`] and [`Config`] from it.

use std::net::SocketAddr;
use std::time::Duration;

/// QPs the target must provide, by role (index into [`TargetInfo::qpns`]).
pub const MIN_QPS: usize = 5;
/// Smallest region the suite can lay its checks out in.
pub const MIN_REGION_LEN: u64 = 64 * 1024;

/// Which of the target's QPs a check uses. Checks that end in a fatal NAK
/// (which moves the QP to the error state) get a QP of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpRole {
    /// Every check that leaves its QP working, and the READ-backs.
    Main = 0,
    /// `access.bad-rkey` and `access.fatal`.
    BadRkey = 1,
    /// `access.out-of-bounds-write`.
    OutOfBoundsWrite = 2,
    /// `access.out-of-bounds-read`.
    OutOfBoundsRead = 3,
    /// `op.rnr-nak` (a SEND with no receive posted stalls its QP).
    Rnr = 4,
}

/// The target as the connection manager described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    /// The target device's IP and device port: where data goes.
    pub addr: SocketAddr,
    /// The target's QPNs, paired by index with [`Config::local_qpns`]
    /// (roles in [`QpRole`]); at least [`MIN_QPS`].
    pub qpns: Vec<u32>,
    /// The rkey of the target's region.
    pub rkey: u64,
    /// The address of the region's first byte, as WRITEs and READs name it.
    pub region_addr: u64,
    /// The region's length in bytes; at least [`MIN_REGION_LEN`].
    pub region_len: u64,
    /// The target device's session id (enters the packet keys, wire.md §7.1).
    pub session_id: u64,
    /// Where the target expects each path generation's PSNs to start.
    pub initial_psn: InitialPsn,
    /// The msg_seq the target expects first on each QP (0 for MetaRoCE).
    pub first_msg_seq: u32,
}

/// The first PSN of a path generation, which both ends must agree on.
///
/// wire.md does not define it (a gap this suite documents in
/// `docs/spec/conformance.md`): a receiver's window for a path it has not
/// seen starts somewhere, and a sender's first packet slides it only if
/// that packet's floor lies ahead of it (wire.md §4.1). MetaRoCE derives
/// it from a base both sides configure, the slot and the generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialPsn {
    /// MetaRoCE v1: `base + slot * 2^20 + generation * 0x9E3779B9` (mod 2^32).
    MetaRoce {
        /// Both sides' `psn_base` (0 unless configured otherwise).
        base: u32,
    },
    /// Every path generation starts at the same PSN.
    Fixed(u32),
}

impl InitialPsn {
    /// The first PSN of generation `generation` of path slot `slot`.
    pub fn of(self, slot: u8, generation: u16) -> u32 {
        match self {
            Self::MetaRoce { base } => base
                .wrapping_add(u32::from(slot) << 20)
                .wrapping_add(u32::from(generation).wrapping_mul(0x9E37_79B9)),
            Self::Fixed(psn) => psn,
        }
    }
}

impl Default for InitialPsn {
    fn default() -> Self {
        Self::MetaRoce { base: 0 }
    }
}

/// Packet authentication shared with the target (wire.md §7.1).
#[derive(Clone, PartialEq, Eq)]
pub struct AuthSetup {
    /// The job secret both sides were configured with (a test secret).
    pub job_secret: [u8; 32],
    /// Whether payloads are encrypted as well as authenticated.
    pub encrypt: bool,
}

impl std::fmt::Debug for AuthSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("AuthSetup")
            .field("encrypt", &self.encrypt)
            .finish_non_exhaustive()
    }
}

/// How the suite runs, and who it is to the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The suite's device address: the socket binds here, and its port is
    /// the device port announced to the target. The IP must be the one the
    /// target connected its QPs to.
    pub local: SocketAddr,
    /// The suite's QPNs, one per target QP (the requester side of each pair).
    pub local_qpns: Vec<u32>,
    /// The suite's session id, as announced to the target.
    pub session_id: u64,
    /// Set when the target authenticates packets; runs the `auth.*` checks.
    pub auth: Option<AuthSetup>,
    /// How long to wait for an answer the spec requires.
    pub answer_timeout: Duration,
    /// How long silence must last to count as "no answer".
    pub quiet_period: Duration,
    /// Run only the checks whose id starts with one of these (all if empty).
    pub only: Vec<String>,
}

impl Config {
    /// A configuration with the default timeouts (500 ms for answers, 100
    /// ms of silence), no authentication, and every check.
    pub fn new(local: SocketAddr, local_qpns: Vec<u32>, session_id: u64) -> Self {
        Self {
            local,
            local_qpns,
            session_id,
            auth: None,
            answer_timeout: Duration::from_millis(500),
            quiet_period: Duration::from_millis(100),
            only: Vec::new(),
        }
    }

    /// Whether the check `id` is selected by [`Config::only`].
    pub fn selects(&self, id: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| id.starts_with(p.as_str()))
    }
}

/// Why the suite cannot run against a target at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupError {
    /// Fewer QPs than the suite needs, or the two QPN lists differ in length.
    Qps(String),
    /// The region is too small.
    Region(String),
    /// The socket could not be set up.
    Socket(String),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Qps(s) => write!(f, "queue pairs: {s}"),
            Self::Region(s) => write!(f, "region: {s}"),
            Self::Socket(s) => write!(f, "socket: {s}"),
        }
    }
}

impl std::error::Error for SetupError {}

/// Check that the target and configuration can carry the suite.
pub fn validate(target: &TargetInfo, config: &Config) -> Result<(), SetupError> {
    if target.qpns.len() < MIN_QPS {
        return Err(SetupError::Qps(format!(
            "the target has {} QPs, the suite needs {MIN_QPS}",
            target.qpns.len()
        )));
    }
    if config.local_qpns.len() != target.qpns.len() {
        return Err(SetupError::Qps(format!(
            "{} local QPNs for {} target QPs",
            config.local_qpns.len(),
            target.qpns.len()
        )));
    }
    if target.region_len < MIN_REGION_LEN {
        return Err(SetupError::Region(format!(
            "{} bytes, the suite needs {MIN_REGION_LEN}",
            target.region_len
        )));
    }
    if target.region_addr.checked_add(target.region_len).is_none() {
        return Err(SetupError::Region("address + length overflows".into()));
    }
    Ok(())
}
