//! Checking a peer's HELLO; shared by every transport so they all refuse the same things.

use std::time::Duration;

use velo_wire::{CloseCode, Hello, InstanceId, Role};

/// Shortest idle timeout a peer may announce: it makes this side heartbeat every third of
/// it, so a peer asking for 1 ms would have this side send a record every millisecond on
/// every lane. 100 ms means at most 30 heartbeats a second per lane.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_millis(100);
/// Longest idle timeout a peer may announce (and this side may be configured with): 1 hour.
pub const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// What this side expects of the peer's HELLO on one lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// The role the peer must have.
    pub role: Role,
    /// This side's instance id: the peer's `peer_instance_id` must be it (or any).
    pub local_instance: InstanceId,
    /// The peer's instance id, if known (a worker knows its frontend's from the address).
    pub peer_instance: Option<InstanceId>,
    /// The lane index and count, if known (a worker dialed them).
    pub lane: Option<(u16, u16)>,
}

/// Why a HELLO is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer has the wrong role (two workers or two frontends).
    #[error("peer announced role {got:?}, expected {expected:?}")]
    Role {
        /// The role expected.
        expected: Role,
        /// The role announced.
        got: Role,
    },
    /// The peer is another instance than expected: typically a frontend that restarted
    /// under a new instance id while the worker still held its old address.
    #[error("peer is instance {got}, expected {expected}")]
    PeerIdentity {
        /// The instance expected.
        expected: InstanceId,
        /// The instance that answered.
        got: InstanceId,
    },
    /// The peer expects another instance than this one.
    #[error("peer expects instance {expected}, but this is {local}")]
    LocalIdentity {
        /// The instance the peer asked for.
        expected: InstanceId,
        /// This side's instance.
        local: InstanceId,
    },
    /// The peer's lane numbering differs from what was dialed.
    #[error("peer answered for lane {got_index}/{got_count}, dialed {index}/{count}")]
    Lane {
        /// Lane index dialed.
        index: u16,
        /// Lane count dialed.
        count: u16,
        /// Lane index in the answer.
        got_index: u16,
        /// Lane count in the answer.
        got_count: u16,
    },
    /// The peer announced an idle timeout outside the range this side accepts.
    #[error(
        "peer announced idle_timeout_ms {got_ms}, allowed {}..={} ms",
        MIN_IDLE_TIMEOUT.as_millis(),
        MAX_IDLE_TIMEOUT.as_millis()
    )]
    IdleTimeout {
        /// The announced value.
        got_ms: u32,
    },
}

impl HandshakeError {
    /// The close code that tells the peer about this error.
    pub fn close_code(&self) -> CloseCode {
        match self {
            Self::PeerIdentity { .. } | Self::LocalIdentity { .. } => CloseCode::IDENTITY_MISMATCH,
            Self::Role { .. } | Self::Lane { .. } | Self::IdleTimeout { .. } => {
                CloseCode::BAD_HANDSHAKE
            }
        }
    }
}

impl Expect {
    /// Checks `hello` (already decoded, so its version and field ranges are valid).
    ///
    /// # Errors
    ///
    /// The first [`HandshakeError`] found.
    pub fn check(&self, hello: &Hello) -> Result<(), HandshakeError> {
        if hello.role != self.role {
            return Err(HandshakeError::Role {
                expected: self.role,
                got: hello.role,
            });
        }
        if let Some(expected) = self.peer_instance
            && hello.instance_id != expected
        {
            return Err(HandshakeError::PeerIdentity {
                expected,
                got: hello.instance_id,
            });
        }
        if !hello.peer_instance_id.is_any() && hello.peer_instance_id != self.local_instance {
            return Err(HandshakeError::LocalIdentity {
                expected: hello.peer_instance_id,
                local: self.local_instance,
            });
        }
        let idle = Duration::from_millis(u64::from(hello.idle_timeout_ms));
        if !(MIN_IDLE_TIMEOUT..=MAX_IDLE_TIMEOUT).contains(&idle) {
            return Err(HandshakeError::IdleTimeout {
                got_ms: hello.idle_timeout_ms,
            });
        }
        if let Some((index, count)) = self.lane
            && (hello.lane_index != index || hello.lane_count != count)
        {
            return Err(HandshakeError::Lane {
                index,
                count,
                got_index: hello.lane_index,
                got_count: hello.lane_count,
            });
        }
        Ok(())
    }
}
