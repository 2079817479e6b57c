//! Why a perf run failed.

use metaroce_cm::CmError;
use metaroce_udp::UdpError;
use metaroce_verbs::VerbsError;

/// A perf run failed.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Side channel.
    #[error(transparent)]
    Cm(#[from] CmError),
    /// Datapath.
    #[error(transparent)]
    Udp(#[from] UdpError),
    /// Verbs.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Anything else, with its message.
    #[error("{0}")]
    Other(String),
}

impl From<std::io::Error> for PerfError {
    fn from(e: std::io::Error) -> Self {
        Self::Cm(CmError::Io(e))
    }
}
