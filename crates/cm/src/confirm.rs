//! Key confirmation: before any packet flows, each side proves it holds
//! the job secret, so two hosts given different `METAROCE_JOB_SECRET`s are
//! told so at connect time instead of seeing each other's packets fail
//! authentication in silence (which looks like a dead peer).
//!
//! ```text
//! confirm(role) = HKDF-SHA256(ikm  = job_secret,
//!                             salt = "metaroce v1 cm key confirmation",
//!                             info = role || session(client) || session(server) || auth)
//! role          = "server" or "client" (a side's value cannot be reflected as the other's)
//! session(X)    = X's device session id (8 bytes, big-endian)
//! auth          = the packet protection both run ("authenticated" or "encrypted")
//! ```
//!
//! The server sends its value in `Accept` (`endpoint.key_confirm`), the
//! client checks it and answers with its own in a `Confirm` frame. Only
//! these 32-byte values travel, never the secret; HKDF is a PRF, so they
//! say nothing about the secret or about the packet keys (which come from
//! another salt). Both session ids are fresh for every device start (unless
//! a fixed `--seed` pins them), so a recorded value does not confirm a
//! later session.

use crate::CmError;
use hkdf::Hkdf;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

const CONFIRM_SALT: &[u8] = b"metaroce v1 cm key confirmation";

/// Which side a confirmation value speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that connected (sends `Hello`).
    Client,
    /// The side that listened (sends `Accept`).
    Server,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Self::Client => b"client",
            Self::Server => b"server",
        }
    }
}

/// Body of a [`MsgType::Confirm`](crate::MsgType::Confirm) frame: the
/// client's confirmation value, after it checked the server's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Confirm {
    /// The client's value, 64 hex digits.
    pub key_confirm: String,
}

/// One side's confirmation value for a session.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyConfirmation([u8; 32]);

impl std::fmt::Debug for KeyConfirmation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyConfirmation({})", self.to_hex())
    }
}

impl KeyConfirmation {
    /// The value `role` sends for the session between the client's device
    /// (`client_session`) and the server's (`server_session`), both
    /// running packet protection `auth`.
    pub fn new(
        job_secret: &[u8; 32],
        role: Role,
        client_session: u64,
        server_session: u64,
        auth: &str,
    ) -> Self {
        let mut info = Vec::with_capacity(6 + 16 + auth.len());
        info.extend_from_slice(role.label());
        info.extend_from_slice(&client_session.to_be_bytes());
        info.extend_from_slice(&server_session.to_be_bytes());
        info.extend_from_slice(auth.as_bytes());
        let mut out = [0u8; 32];
        Hkdf::<Sha256>::new(Some(CONFIRM_SALT), job_secret)
            .expand(&info, &mut out)
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        Self(out)
    }

    /// As it travels: 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Check the value the peer sent (`None`: it sent none) against this
    /// one, in constant time. A mismatch means the secrets differ.
    pub fn verify(&self, peer_sent: Option<&str>) -> Result<(), CmError> {
        let sent = peer_sent.ok_or(CmError::NoKeyConfirmation)?;
        let ours = self.to_hex();
        if sent.len() != ours.len() {
            return Err(CmError::SecretMismatch);
        }
        let diff = sent
            .bytes()
            .zip(ours.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff == 0 {
            Ok(())
        } else {
            Err(CmError::SecretMismatch)
        }
    }
}

/// Refuse a job secret no one should run with: all zeros (an unset buffer,
/// or a placeholder copied from an example).
pub fn check_job_secret(job_secret: &[u8; 32]) -> Result<(), CmError> {
    if job_secret.iter().all(|&b| b == 0) {
        return Err(CmError::ZeroSecret);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_secret_confirms_and_another_does_not() {
        let a = [7u8; 32];
        let mut b = a;
        b[31] ^= 1;
        let server = KeyConfirmation::new(&a, Role::Server, 1, 2, "authenticated");
        let hex = server.to_hex();
        assert_eq!(hex.len(), 64);
        KeyConfirmation::new(&a, Role::Server, 1, 2, "authenticated")
            .verify(Some(&hex))
            .unwrap();
        let other = KeyConfirmation::new(&b, Role::Server, 1, 2, "authenticated");
        assert!(matches!(
            other.verify(Some(&hex)),
            Err(CmError::SecretMismatch)
        ));
        assert!(matches!(
            server.verify(None),
            Err(CmError::NoKeyConfirmation)
        ));
        assert!(matches!(
            server.verify(Some("00")),
            Err(CmError::SecretMismatch)
        ));
    }

    /// Role, both session ids and the protection mode all enter the value.
    #[test]
    fn every_input_changes_the_value() {
        let s = [9u8; 32];
        let base = KeyConfirmation::new(&s, Role::Server, 1, 2, "encrypted");
        for other in [
            KeyConfirmation::new(&s, Role::Client, 1, 2, "encrypted"),
            KeyConfirmation::new(&s, Role::Server, 3, 2, "encrypted"),
            KeyConfirmation::new(&s, Role::Server, 1, 3, "encrypted"),
            KeyConfirmation::new(&s, Role::Server, 1, 2, "authenticated"),
        ] {
            assert_ne!(base, other);
        }
        // The value is not the secret.
        assert!(!base.to_hex().contains("0909090909"));
    }

    #[test]
    fn zero_secret_is_refused() {
        assert!(matches!(
            check_job_secret(&[0; 32]),
            Err(CmError::ZeroSecret)
        ));
        check_job_secret(&[1; 32]).unwrap();
    }
}
