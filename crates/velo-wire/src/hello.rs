//! HELLO: the first frame each side sends on a lane.

use bytes::{Buf, BufMut};

use crate::{InstanceId, MAGIC, PROTOCOL_VERSION, Role, WireError};

/// Length of a version-3 HELLO body without optional sections, in bytes.
pub const HELLO_BODY_LEN: u32 = 58;

/// Length of the challenge nonce a HELLO carries when its sender proves a shared secret.
pub const AUTH_NONCE_LEN: usize = 32;

/// Capability bit: the HELLO carries a [`AUTH_NONCE_LEN`]-byte challenge nonce, and its
/// sender proves the cluster secret with an AUTH frame (`docs/protocol.md`, section 3.4).
pub const CAP_AUTH: u32 = 1 << 0;
/// Capability bit: the HELLO carries the worker's discovery instance id (a `u64`), the
/// instance a frontend ties a stream to when it routes the stream's request.
pub const CAP_WORKER_INSTANCE: u32 = 1 << 1;
/// Capability bit: the sender accepts PACKED frames (BATCH bodies compressed with LZ4,
/// `docs/protocol.md` section 3.5); a peer may send them to it once the handshake is done.
pub const CAP_PACKED: u32 = 1 << 2;
/// Capability bits that announce a section after the fixed 58 bytes.
const SECTION_CAPS: u32 = CAP_AUTH | CAP_WORKER_INSTANCE;

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
    /// Capability bits other than those of the sections below ([`CAP_AUTH`],
    /// [`CAP_WORKER_INSTANCE`], set on the wire from the fields). Receivers ignore bits they
    /// do not know.
    pub capabilities: u32,
    /// The sender's challenge nonce, when it proves the cluster secret ([`CAP_AUTH`]).
    pub auth_nonce: Option<[u8; AUTH_NONCE_LEN]>,
    /// A worker's discovery instance id ([`CAP_WORKER_INSTANCE`]): streams a frontend tied to
    /// that instance may only be opened by connections that announced it.
    pub worker_instance: Option<u64>,
}

impl Hello {
    /// Length of the body, optional sections included, in bytes.
    pub fn body_len(&self) -> usize {
        let nonce = if self.auth_nonce.is_some() {
            AUTH_NONCE_LEN
        } else {
            0
        };
        let instance = if self.worker_instance.is_some() { 8 } else { 0 };
        HELLO_BODY_LEN as usize + nonce + instance
    }

    /// The capability bits as sent: [`capabilities`](Self::capabilities) plus those of the
    /// sections present.
    pub fn wire_capabilities(&self) -> u32 {
        let mut caps = self.capabilities & !SECTION_CAPS;
        if self.auth_nonce.is_some() {
            caps |= CAP_AUTH;
        }
        if self.worker_instance.is_some() {
            caps |= CAP_WORKER_INSTANCE;
        }
        caps
    }

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
        dst.put_u32_le(self.wire_capabilities());
        if let Some(nonce) = &self.auth_nonce {
            dst.put_slice(nonce);
        }
        if let Some(instance) = self.worker_instance {
            dst.put_u64_le(instance);
        }
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
        let expected = expected_len(body);
        if len != expected {
            return Err(WireError::BadFrameLength {
                frame: "hello",
                len,
                expected,
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
            capabilities: 0,
            auth_nonce: None,
            worker_instance: None,
        };
        let caps = body.get_u32_le();
        let hello = Self {
            capabilities: caps & !SECTION_CAPS,
            auth_nonce: (caps & CAP_AUTH != 0).then(|| {
                let mut nonce = [0; AUTH_NONCE_LEN];
                body.copy_to_slice(&mut nonce);
                nonce
            }),
            worker_instance: (caps & CAP_WORKER_INSTANCE != 0).then(|| body.get_u64_le()),
            ..hello
        };
        hello.check()?;
        Ok(hello)
    }

    fn check(&self) -> Result<(), WireError> {
        if self.auth_nonce.is_some_and(|n| n == [0; AUTH_NONCE_LEN]) {
            return Err(WireError::InvalidField {
                field: "hello auth_nonce",
                reason: "must not be all zeros",
            });
        }
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

/// The body length a HELLO must have, from its capability bits (the fixed part must be
/// there to read them; a shorter body is judged against the fixed length).
fn expected_len(body: &[u8]) -> u32 {
    let Some(caps) = body
        .get(54..58)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
    else {
        return HELLO_BODY_LEN;
    };
    let mut len = HELLO_BODY_LEN;
    if caps & CAP_AUTH != 0 {
        len += NONCE_SECTION_LEN;
    }
    if caps & CAP_WORKER_INSTANCE != 0 {
        len += INSTANCE_SECTION_LEN;
    }
    len
}

/// [`AUTH_NONCE_LEN`] as a body length.
const NONCE_SECTION_LEN: u32 = 32;
const _: () = assert!(NONCE_SECTION_LEN as usize == AUTH_NONCE_LEN);
/// Length of the worker instance section: a `u64`.
const INSTANCE_SECTION_LEN: u32 = 8;
