//! Classic messages: `u32` LE length (kind byte plus payload), a kind byte, the payload.

use bytes::{Buf, BytesMut};

use crate::{ProtocolViolation, ResponseError};

pub(crate) const HEADER: usize = 5;

/// Worker to frontend: `{"stream":ticket,"token":"hex"}`, first on the connection.
pub(crate) const HANDSHAKE: u8 = 0x01;
/// Worker to frontend: the prologue JSON.
pub(crate) const PROLOGUE: u8 = 0x02;
/// Worker to frontend: one item.
pub(crate) const DATA: u8 = 0x03;
/// Worker to frontend: the end (the final item was the last DATA).
pub(crate) const SENTINEL: u8 = 0x04;
/// Worker to frontend: proof of life, sent when the worker has written nothing for a third
/// of the liveness bound; the frontend skips it.
pub(crate) const HEARTBEAT: u8 = 0x05;
/// Frontend to worker: the frontend matched the connection to its registration and took the
/// stream: from now on it reports the stream's end to its reader. A worker's finish counts
/// as delivered only after this.
pub(crate) const ACCEPTED: u8 = 0x12;
/// Frontend to worker, in plaintext on a TLS listener instead of its TLS handshake: this
/// frontend requires TLS (the worker's first byte began no TLS record).
pub(crate) const REQUIRES_TLS: u8 = 0x13;
/// Frontend to worker, in plaintext in answer to a TLS ClientHello: this frontend has no TLS.
/// Its first byte (the length's, 1) is no TLS record type, so the worker's TLS handshake
/// fails on it at once.
pub(crate) const NO_TLS: u8 = 0x14;
/// Frontend to worker: stop soon.
pub(crate) const STOP: u8 = 0x10;
/// Frontend to worker: stop now.
pub(crate) const KILL: u8 = 0x11;

/// Appends a message header for a payload of `len` bytes.
pub(crate) fn header(kind: u8, len: usize) -> [u8; HEADER] {
    let l = u32::try_from(len + 1)
        .expect("messages are capped far below 4 GiB")
        .to_le_bytes();
    [l[0], l[1], l[2], l[3], kind]
}

/// Takes one complete message from the front of `buf`: `Ok(None)` when incomplete. The length
/// is checked against `max` before anything is reserved.
pub(crate) fn decode(
    buf: &mut BytesMut,
    max: u32,
) -> Result<Option<(u8, BytesMut)>, ResponseError> {
    let Some(h) = buf.first_chunk::<HEADER>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    if len == 0 || len > max.saturating_add(1) {
        return Err(ResponseError::Protocol(ProtocolViolation::MessageLength {
            len,
            max: u64::from(max) + 1,
        }));
    }
    let total = HEADER - 1 + len as usize;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let kind = h[4];
    buf.advance(HEADER);
    Ok(Some((kind, buf.split_to(total - HEADER))))
}
