//! The client's opening message.

use crate::Endpoint;
use serde::{Deserialize, Serialize};

/// Client → server, the first frame ([`crate::MsgType::Hello`]): what the
/// client asks the server to run, with what parameters, and the client's
/// endpoint. The server answers with its own [`Endpoint`]
/// ([`crate::MsgType::Accept`]) or refuses ([`crate::MsgType::Error`]).
///
/// `P` is the tool's request, carried as the `params` JSON object and never
/// read by the connection manager (the perf tools send their test
/// parameters).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Hello<P> {
    /// What the client asks the server to run, in the tool's own names
    /// (`write-bw`, ...); a server refuses a name it does not run.
    pub test: String,
    /// The tool's parameters for the session.
    pub params: P,
    /// The client's device.
    pub endpoint: Endpoint,
    /// No further session follows this one (the server may exit).
    pub last: bool,
}
