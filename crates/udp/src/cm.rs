//! Connection manager: the out-of-band exchange over a TCP side channel
//! (perftest's model, default port 18515). Specified in
//! `docs/spec/connection-manager.md`.
//!
//! Frame: `"MRCM"` (4 bytes), version (1 byte, = 1), type (1 byte),
//! body length (u32, big-endian, at most [`MAX_BODY`]), then a UTF-8 JSON
//! body. Unknown JSON fields are ignored, so later versions can add fields.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Frame magic.
pub const MAGIC: [u8; 4] = *b"MRCM";
/// Protocol version this code speaks.
pub const VERSION: u8 = 1;
/// Largest body accepted.
pub const MAX_BODY: u32 = 64 * 1024;

/// Message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MsgType {
    /// Client → server: test parameters and the client's device.
    Hello = 1,
    /// Server → client: the server's device.
    Accept = 2,
    /// Client → server: the run is over (with its counts).
    Done = 3,
    /// Server → client: the server's verdict.
    Report = 4,
    /// Either way: refusal, with a reason; the connection closes after it.
    Error = 5,
}

impl MsgType {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Accept,
            3 => Self::Done,
            4 => Self::Report,
            5 => Self::Error,
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
}

/// One memory buffer the peer may access.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoteBuf {
    /// First address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One side's device and QPs. The device's IP is the IP of that side's
/// end of the TCP connection; only the port travels here.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Endpoint {
    /// MetaRoCE device port (data and ACKs arrive there).
    pub device_port: u16,
    /// Path source-port span (informational, for firewalls).
    pub path_port_span: u16,
    /// MTU payload bytes of the device.
    pub mtu: u32,
    /// QP numbers, in the order the QPs pair up.
    pub qpns: Vec<u32>,
    /// The buffer the peer may access.
    pub buf: RemoteBuf,
    /// The device's session id (changes every time the device starts):
    /// with packet authentication it enters the connection's keys, so a
    /// restarted device never reuses a key with old packet numbers.
    #[serde(default)]
    pub session_id: u64,
    /// Packet protection this side runs: "none", "authenticated" or
    /// "encrypted". Both sides must agree; the secret itself never travels.
    #[serde(default = "auth_none")]
    pub auth: String,
}

fn auth_none() -> String {
    "none".into()
}

/// Client → server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Hello {
    /// The test (`write-bw`, ...).
    pub test: String,
    /// Test parameters.
    pub params: crate::perf::Params,
    /// The client's device.
    pub endpoint: Endpoint,
    /// No further session follows this one (the server may exit).
    pub last: bool,
}

/// Client → server at the end.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Done {
    /// Operations the client completed.
    pub completed: u64,
}

/// Server → client at the end.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Report {
    /// The server checked the data it holds (None: nothing to check there).
    pub verified: Option<bool>,
    /// What was checked or what differs.
    pub detail: String,
    /// Datagrams the server's core counted as malformed.
    pub rx_malformed: u64,
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
