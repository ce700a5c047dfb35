//! HELLO: the first frame each side sends on a lane.

use bytes::{Buf, BufMut};

use crate::{InstanceId, MAGIC, PROTOCOL_VERSION, Role, WireError};

/// Length of a version-3 HELLO body, in bytes.
pub const HELLO_BODY_LEN: u32 = 58;

/// Most lanes one connection between two peers may have.
///
/// Each lane is a socket and a reader; past a few per core they only add contention.
pub const MAX_LANES: u16 = 64;

/// The lane handshake.
///
/// The worker sends one on every lane it dials; the frontend answers with its own, or with a
/// CLOSE frame saying why it refuses. See `docs/protocol.md` for the byte layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Which end sent this.
    pub role: Role,
    /// This lane's index, `< lane_count`.
    pub lane_index: u16,
    /// How many lanes the connection has, `1..=MAX_LANES`.
    pub lane_count: u16,
    /// The sender's instance id (never zero).
    pub instance_id: InstanceId,
    /// The instance the sender expects at the other end, or [`InstanceId::ANY`].
    pub peer_instance_id: InstanceId,
    /// Largest frame body the sender accepts, in bytes.
    pub max_frame_len: u32,
    /// Records each stream opened by the peer may send before its first credit grant, not
    /// counting the one credit always reserved for the terminal record. At least 1.
    pub initial_window: u32,
    /// The sender closes the lane after this many milliseconds of silence; the peer keeps it
    /// alive by sending something (a heartbeat if nothing else) at least three times as often.
    pub idle_timeout_ms: u32,
    /// Capability bits. Version 3 defines none; receivers ignore bits they do not know.
    pub capabilities: u32,
}

impl Hello {
    /// Encodes the body (without the frame header).
    pub fn encode_body(&self, dst: &mut impl BufMut) {
        dst.put_slice(&MAGIC);
        dst.put_u8(PROTOCOL_VERSION);
        dst.put_u8(self.role.to_byte());
        dst.put_u16_le(self.lane_index);
        dst.put_u16_le(self.lane_count);
        dst.put_u128_le(self.instance_id.as_u128());
        dst.put_u128_le(self.peer_instance_id.as_u128());
        dst.put_u32_le(self.max_frame_len);
        dst.put_u32_le(self.initial_window);
        dst.put_u32_le(self.idle_timeout_ms);
        dst.put_u32_le(self.capabilities);
    }

    /// Decodes a body, checking magic and version before anything else so that a peer of
    /// another version gets [`WireError::UnsupportedVersion`] whatever the rest looks like.
    pub fn decode_body(mut body: &[u8]) -> Result<Self, WireError> {
        let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
        let Some(magic) = body.first_chunk::<4>().copied() else {
            return Err(WireError::BadFrameLength {
                frame: "hello",
                len,
                expected: HELLO_BODY_LEN,
            });
        };
        if magic != MAGIC {
            return Err(WireError::BadMagic { got: magic });
        }
        let Some(&version) = body.get(4) else {
            return Err(WireError::BadFrameLength {
                frame: "hello",
                len,
                expected: HELLO_BODY_LEN,
            });
        };
        if version != PROTOCOL_VERSION {
            return Err(WireError::UnsupportedVersion {
                got: version,
                supported: PROTOCOL_VERSION,
            });
        }
        if len != HELLO_BODY_LEN {
            return Err(WireError::BadFrameLength {
                frame: "hello",
                len,
                expected: HELLO_BODY_LEN,
            });
        }
        body.advance(5);
        let role = Role::from_byte(body.get_u8()).ok_or(WireError::InvalidField {
            field: "hello role",
            reason: "must be 1 (worker) or 2 (frontend)",
        })?;
        let hello = Self {
            role,
            lane_index: body.get_u16_le(),
            lane_count: body.get_u16_le(),
            instance_id: InstanceId::from_u128(body.get_u128_le()),
            peer_instance_id: InstanceId::from_u128(body.get_u128_le()),
            max_frame_len: body.get_u32_le(),
            initial_window: body.get_u32_le(),
            idle_timeout_ms: body.get_u32_le(),
            capabilities: body.get_u32_le(),
        };
        hello.check()?;
        Ok(hello)
    }

    fn check(&self) -> Result<(), WireError> {
        let invalid = |field, reason| Err(WireError::InvalidField { field, reason });
        if self.lane_count == 0 || self.lane_count > MAX_LANES {
            return invalid("hello lane_count", "must be 1..=64");
        }
        if self.lane_index >= self.lane_count {
            return invalid("hello lane_index", "must be less than lane_count");
        }
        if self.instance_id.is_any() {
            return invalid("hello instance_id", "must not be zero");
        }
        if self.initial_window == 0 {
            return invalid("hello initial_window", "must be at least 1");
        }
        if self.max_frame_len < crate::MIN_MAX_FRAME_LEN {
            return invalid("hello max_frame_len", "must be at least 4096");
        }
        if self.idle_timeout_ms == 0 {
            return invalid("hello idle_timeout_ms", "must be at least 1");
        }
        Ok(())
    }
}
