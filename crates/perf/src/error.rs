//! Why a perf run failed.

use metaroce_cm::CmError;
use metaroce_udp::{DeviceCounters, UdpError};
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
    /// A failure after the device started, with the device's counters as
    /// they were when it was seen.
    #[error("{error}")]
    WithCounters {
        /// What failed.
        error: Box<Self>,
        /// The device's counters then.
        counters: Box<DeviceCounters>,
    },
}

impl PerfError {
    /// Attach a device's counters (kept from an earlier attachment if any:
    /// the innermost device is the one that failed).
    pub fn with_counters(self, counters: DeviceCounters) -> Self {
        match self {
            Self::WithCounters { .. } => self,
            error => Self::WithCounters {
                error: Box::new(error),
                counters: Box::new(counters),
            },
        }
    }

    /// The counters of the device that was running when the run failed.
    pub fn counters(&self) -> Option<&DeviceCounters> {
        match self {
            Self::WithCounters { counters, .. } => Some(counters),
            _ => None,
        }
    }
}

impl From<std::io::Error> for PerfError {
    fn from(e: std::io::Error) -> Self {
        Self::Cm(CmError::Io(e))
    }
}
