//! CLOSE: the last frame on a lane, saying why it ends.

use bytes::{Buf, BufMut};

use crate::{CloseCode, WireError};

/// Longest CLOSE reason, in bytes. Reasons are for humans; longer ones are cut by the encoder.
pub const MAX_CLOSE_REASON_LEN: usize = 1024;

/// A lane close with a code and a human-readable reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    /// Why the lane closes.
    pub code: CloseCode,
    /// A human-readable explanation, at most [`MAX_CLOSE_REASON_LEN`] bytes of UTF-8.
    pub reason: String,
}

impl Close {
    /// A close with `reason` cut to [`MAX_CLOSE_REASON_LEN`] bytes at a character boundary.
    pub fn new(code: CloseCode, reason: impl Into<String>) -> Self {
        let mut reason = reason.into();
        if reason.len() > MAX_CLOSE_REASON_LEN {
            let mut end = MAX_CLOSE_REASON_LEN;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            reason.truncate(end);
        }
        Self { code, reason }
    }

    /// Body length in bytes.
    pub fn body_len(&self) -> usize {
        2 + self.reason.len()
    }

    /// Encodes the body (without the frame header).
    pub fn encode_body(&self, dst: &mut impl BufMut) {
        dst.put_u16_le(self.code.0);
        dst.put_slice(self.reason.as_bytes());
    }

    /// Decodes a body.
    pub fn decode_body(mut body: &[u8]) -> Result<Self, WireError> {
        if body.len() < 2 {
            return Err(WireError::Truncated {
                record: "close",
                field: "code",
            });
        }
        let code = CloseCode(body.get_u16_le());
        if body.len() > MAX_CLOSE_REASON_LEN {
            return Err(WireError::InvalidField {
                field: "close reason",
                reason: "must be at most 1024 bytes",
            });
        }
        let reason = std::str::from_utf8(body)
            .map_err(|_| WireError::InvalidUtf8 {
                field: "close reason",
            })?
            .to_owned();
        Ok(Self { code, reason })
    }
}
