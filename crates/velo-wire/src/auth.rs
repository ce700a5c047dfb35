//! AUTH: a proof of the cluster secret, sent during the handshake by each side whose HELLO
//! carried a challenge nonce.

use bytes::BufMut;

use crate::WireError;

/// Length of an AUTH body: one HMAC-SHA256 tag, in bytes.
pub const AUTH_MAC_LEN: usize = 32;

/// A proof that the sender holds the cluster secret: HMAC-SHA256 keyed with the secret over
/// a label naming the sender's role and both HELLO bodies (`docs/protocol.md`, section 3.4).
/// This crate only carries it; computing and checking it is the session's.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Auth {
    /// The tag.
    pub mac: [u8; AUTH_MAC_LEN],
}

impl Auth {
    /// Encodes the body (without the frame header).
    pub fn encode_body(&self, dst: &mut impl BufMut) {
        dst.put_slice(&self.mac);
    }

    /// Decodes a body, which must be exactly [`AUTH_MAC_LEN`] bytes.
    ///
    /// # Errors
    ///
    /// [`WireError::BadFrameLength`] for any other length.
    pub fn decode_body(body: &[u8]) -> Result<Self, WireError> {
        let mac = <[u8; AUTH_MAC_LEN]>::try_from(body).map_err(|_| WireError::BadFrameLength {
            frame: "auth",
            len: u32::try_from(body.len()).unwrap_or(u32::MAX),
            expected: 32,
        })?;
        Ok(Self { mac })
    }
}

/// Tags are secrets' fingerprints: debug output shows their length only.
impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth { mac: [32 bytes] }")
    }
}
