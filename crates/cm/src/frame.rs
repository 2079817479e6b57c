//! The connection manager's frame and message types.
//!
//! Frame: `"MRCM"` (4 bytes), version (1 byte, = 1), type (1 byte),
//! body length (u32, big-endian, at most [`MAX_BODY`]), then a UTF-8 JSON
//! body. Unknown JSON fields are ignored, so later versions can add fields.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io::{self, Read, Write};

/// Frame magic.
pub const MAGIC: [u8; 4] = *b"MRCM";
/// Protocol version this code speaks.
pub const VERSION: u8 = 1;
/// Largest body accepted.
pub const MAX_BODY: u32 = 64 * 1024;

/// Message types. Which body each carries is the tool's (see
/// [`crate::Hello`] for the usual opening); the connection manager checks
/// only that the type is the one expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MsgType {
    /// Client → server: what the client asks for, and its device.
    Hello = 1,
    /// Server → client: the server's device (or where to send).
    Accept = 2,
    /// Client → server: the run is over (with what the client counted).
    Done = 3,
    /// Server → client: the server's verdict on the run.
    Report = 4,
    /// Either way: refusal, with a reason; the connection closes after it.
    Error = 5,
    /// Client → server, after `Accept`, when packets are authenticated:
    /// the client's key confirmation ([`crate::Confirm`]).
    Confirm = 6,
}

impl MsgType {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Accept,
            3 => Self::Done,
            4 => Self::Report,
            5 => Self::Error,
            6 => Self::Confirm,
            _ => return None,
        })
    }
}

/// A connection-manager failure.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// The TCP stream failed.
    #[error("side channel: {0}")]
    Io(#[from] io::Error),
    /// The peer sent something that is not a valid frame.
    #[error("side channel: bad frame: {0}")]
    Protocol(String),
    /// The peer refused.
    #[error("peer refused: {0}")]
    Refused(String),
    /// The peer's key confirmation does not match this side's: the two
    /// sides run with different job secrets.
    #[error(
        "key confirmation failed: the peer's job secret differs from this side's (METAROCE_JOB_SECRET must be the same on both hosts)"
    )]
    SecretMismatch,
    /// The peer runs packet authentication but sent no key confirmation.
    #[error("key confirmation missing: the peer sent none (an older MetaRoCE?)")]
    NoKeyConfirmation,
    /// The job secret is all zeros.
    #[error("the job secret is all zeros: give the job a random one (e.g. `openssl rand -hex 32`)")]
    ZeroSecret,
}

/// Write one frame.
pub fn send<T: Serialize>(w: &mut impl Write, ty: MsgType, body: &T) -> Result<(), CmError> {
    let json = serde_json::to_vec(body).map_err(|e| CmError::Protocol(e.to_string()))?;
    if json.len() > MAX_BODY as usize {
        return Err(CmError::Protocol("body too large".into()));
    }
    let mut frame = Vec::with_capacity(10 + json.len());
    frame.extend_from_slice(&MAGIC);
    frame.push(VERSION);
    frame.push(ty as u8);
    frame.extend_from_slice(&(json.len() as u32).to_be_bytes());
    frame.extend_from_slice(&json);
    w.write_all(&frame)?;
    w.flush()?;
    Ok(())
}

/// Read one frame of type `want`. An `Error` frame becomes
/// [`CmError::Refused`]; anything else unexpected is a protocol error.
pub fn recv<T: DeserializeOwned>(r: &mut impl Read, want: MsgType) -> Result<T, CmError> {
    let mut head = [0u8; 10];
    r.read_exact(&mut head)?;
    if head[..4] != MAGIC {
        return Err(CmError::Protocol(
            "not a MetaRoCE connection manager (bad magic)".into(),
        ));
    }
    if head[4] != VERSION {
        return Err(CmError::Protocol(format!(
            "version {} not supported (this side speaks {VERSION})",
            head[4]
        )));
    }
    let ty = MsgType::from_u8(head[5])
        .ok_or_else(|| CmError::Protocol(format!("unknown message type {}", head[5])))?;
    let len = u32::from_be_bytes([head[6], head[7], head[8], head[9]]);
    if len > MAX_BODY {
        return Err(CmError::Protocol(format!("body of {len} bytes too large")));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    if ty == MsgType::Error && want != MsgType::Error {
        let msg: String = serde_json::from_slice(&body).unwrap_or_else(|_| "unreadable".into());
        return Err(CmError::Refused(msg));
    }
    if ty != want {
        return Err(CmError::Protocol(format!("expected {want:?}, got {ty:?}")));
    }
    serde_json::from_slice(&body).map_err(|e| CmError::Protocol(format!("{ty:?} body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of the shape the perf tools' `Done` has.
    #[derive(Debug, Serialize, serde::Deserialize)]
    struct Done {
        completed: u64,
    }

    #[test]
    fn frame_round_trip_and_rejects() {
        let mut buf = Vec::new();
        send(&mut buf, MsgType::Done, &Done { completed: 42 }).unwrap();
        assert_eq!(&buf[..4], b"MRCM");
        assert_eq!(buf[4], VERSION);
        let d: Done = recv(&mut buf.as_slice(), MsgType::Done).unwrap();
        assert_eq!(d.completed, 42);
        // Wrong type.
        assert!(recv::<Done>(&mut buf.as_slice(), MsgType::Hello).is_err());
        // Bad magic, bad version, huge length, truncated.
        let mut bad = buf.clone();
        bad[0] = b'X';
        assert!(recv::<Done>(&mut bad.as_slice(), MsgType::Done).is_err());
        let mut bad = buf.clone();
        bad[4] = 9;
        assert!(recv::<Done>(&mut bad.as_slice(), MsgType::Done).is_err());
        let mut bad = buf.clone();
        bad[6] = 0xff;
        assert!(recv::<Done>(&mut bad.as_slice(), MsgType::Done).is_err());
        assert!(recv::<Done>(&mut &buf[..buf.len() - 1], MsgType::Done).is_err());
        // Error frames surface as refusals.
        let mut e = Vec::new();
        send(&mut e, MsgType::Error, &"nope".to_string()).unwrap();
        match recv::<Done>(&mut e.as_slice(), MsgType::Done) {
            Err(CmError::Refused(m)) => assert_eq!(m, "nope"),
            other => panic!("{other:?}"),
        }
    }
}
