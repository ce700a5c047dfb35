//! The codes records and frames carry: why a lane closed, why a stream was cancelled, how an
//! opener ended a stream abnormally, why a peer goes away. Each is a newtype, so a code of
//! one kind can never be passed where another is meant.

use std::fmt;

/// Why a lane was closed, sent in a CLOSE frame.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// An orderly close.
    pub const NORMAL: Self = Self(0);
    /// The peer sent bytes that are not valid protocol v3, or broke its rules.
    pub const PROTOCOL_ERROR: Self = Self(1);
    /// The peer's handshake names a version this side does not speak.
    pub const UNSUPPORTED_VERSION: Self = Self(2);
    /// The peer is not the instance this side expected (for example, a restarted frontend).
    pub const IDENTITY_MISMATCH: Self = Self(3);
    /// The handshake is well formed but unacceptable (role, lane index or count).
    pub const BAD_HANDSHAKE: Self = Self(4);
    /// The peer sent a frame larger than this side accepts.
    pub const FRAME_TOO_LARGE: Self = Self(5);
    /// This side is shutting down.
    pub const SHUTTING_DOWN: Self = Self(6);
    /// This side is at a configured limit (connections, lanes or streams).
    pub const LIMIT: Self = Self(7);
    /// The peer said nothing for longer than the idle timeout.
    pub const IDLE_TIMEOUT: Self = Self(8);
    /// The peer did not prove the cluster secret (none offered, a wrong proof, or a secret
    /// on one side only).
    pub const UNAUTHENTICATED: Self = Self(9);
    /// The peer opened streams that were refused, or opened and reset them, faster than
    /// this side allows (the "rapid reset" pattern).
    pub const CHURN_LIMIT: Self = Self(10);

    /// A short lower-case name for logs and metrics labels.
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "normal",
            1 => "protocol_error",
            2 => "unsupported_version",
            3 => "identity_mismatch",
            4 => "bad_handshake",
            5 => "frame_too_large",
            6 => "shutting_down",
            7 => "limit",
            8 => "idle_timeout",
            9 => "unauthenticated",
            10 => "churn_limit",
            _ => "unknown",
        }
    }
}

impl fmt::Debug for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CloseCode({}:{})", self.0, self.name())
    }
}

impl fmt::Display for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an acceptor dropped a stream, carried by [`Record::Cancel`](crate::Record::Cancel).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CancelCode(pub u32);

impl CancelCode {
    /// The consumer cancelled (kill, or dropped its receiver).
    pub const CANCELLED: Self = Self(0);
    /// The acceptor does not know the stream's ticket, or the token is wrong.
    pub const REFUSED: Self = Self(1);
    /// The acceptor is at its limit of streams for this peer.
    pub const TOO_MANY_STREAMS: Self = Self(2);
    /// The acceptor is draining and takes no new streams.
    pub const GOING_AWAY: Self = Self(3);
    /// The opener broke the stream's rules (sequence, credit); the stream is dropped.
    pub const PROTOCOL_ERROR: Self = Self(4);

    /// A short lower-case name for logs and metrics labels.
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "cancelled",
            1 => "refused",
            2 => "too_many_streams",
            3 => "going_away",
            4 => "protocol_error",
            _ => "unknown",
        }
    }
}

impl fmt::Debug for CancelCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CancelCode({}:{})", self.0, self.name())
    }
}

impl fmt::Display for CancelCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an opener ended a stream abnormally, carried by [`Record::Error`](crate::Record::Error):
/// defined by the application (the mux reserves [`ErrorCode::DROPPED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// The opener released a stream it never finished (its sender was dropped).
    pub const DROPPED: Self = Self(u32::MAX);
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::DROPPED {
            f.write_str("dropped")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

/// Why a peer takes no new streams, carried by [`Record::GoAway`](crate::Record::GoAway).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GoAwayCode(pub u32);

impl GoAwayCode {
    /// An orderly drain: open streams finish, new ones go elsewhere.
    pub const DRAIN: Self = Self(0);
}

impl fmt::Display for GoAwayCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::DRAIN {
            f.write_str("drain")
        } else {
            write!(f, "{}", self.0)
        }
    }
}
