//! The one public error of the response plane.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use velo_session::StreamError;
pub use velo_wire::{CancelCode, ErrorCode};

use crate::Plane;
pub use crate::cause::{Cause, Disconnect, InvalidInfo, ProtocolViolation, TlsMismatch};

/// A worker's typed reason for refusing a request, carried in its error prologue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct TypedError {
    /// A short machine-readable kind, such as `EngineRefused` or `ResponsePlaneMismatch`.
    pub kind: String,
    /// A human-readable message.
    pub message: String,
    /// Whether the request may be retried on another worker.
    #[serde(default)]
    pub retryable: bool,
}

impl TypedError {
    /// A typed error of `kind` with `message`.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
            retryable: false,
        }
    }
}

/// What went wrong with a response stream, on either side.
///
/// Use [`is_cancelled`](Self::is_cancelled), [`is_remote`](Self::is_remote),
/// [`is_caller`](Self::is_caller) and [`is_retryable`](Self::is_retryable) rather than
/// matching when deciding what to do. Every lower layer's error is kept as the
/// [`source`](std::error::Error::source).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// The worker refused the request with an error prologue.
    #[error("worker refused the request: {cause}")]
    Refused {
        /// The worker's reason.
        cause: TypedError,
    },
    /// The stream was lost: the worker or the connection went away before the stream ended
    /// (before the prologue: the request may be retried on another worker).
    #[error("stream ended before generation completed ({0})")]
    Disconnected(#[source] Disconnect),
    /// No prologue arrived within the establish timeout.
    #[error("no response from the worker within {after:?}")]
    ResponseTimeout {
        /// The timeout.
        after: Duration,
    },
    /// The stream was cancelled: by this side (frontend), or by the frontend (worker).
    #[error("stream cancelled{}", if *.graceful { " (stop requested)" } else { "" })]
    Cancelled {
        /// `true` for a graceful stop, `false` for a kill.
        graceful: bool,
    },
    /// The worker ended the stream with an error code.
    #[error("worker ended the stream with error {code}: {message}")]
    Worker {
        /// The worker's code.
        code: ErrorCode,
        /// The worker's message.
        message: String,
    },
    /// Worker: the frontend ended the stream for a reason other than a cancellation: it did
    /// not take it (`refused`: an unknown or expired ticket, a bad token, a stream tied to
    /// another worker), was at its limit of streams (`too_many_streams`), is draining
    /// (`going_away`), or could not read what this worker sent (`protocol_error`).
    #[error("the frontend dropped the stream ({})", .code.name())]
    DroppedByFrontend {
        /// The frontend's reason.
        code: CancelCode,
    },
    /// An item could not be decoded with the stream's codec (the peer's fault).
    #[error("cannot decode an item: {0}")]
    Decode(#[source] Cause),
    /// An item could not be encoded (the caller's fault).
    #[error("cannot encode an item: {0}")]
    Encode(#[source] Cause),
    /// The peer broke the response protocol (for example items after the final one).
    #[error("protocol violation: {0}")]
    Protocol(#[source] ProtocolViolation),
    /// Worker: the frontend could not be reached (connection setup failed).
    #[error("cannot reach the frontend at {addr}: {cause}")]
    Unreachable {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        cause: Cause,
    },
    /// Worker: the frontend uses another response plane than this worker. The frontend was
    /// sent an error prologue saying so.
    #[error(
        "response plane mismatch: frontend requested {}, worker configured {}",
        .requested.name(),
        .configured.name()
    )]
    PlaneMismatch {
        /// The frontend's plane.
        requested: Plane,
        /// This worker's plane.
        configured: Plane,
    },
    /// The stream address could not be used (the frontend's, or its carrier's, fault).
    #[error("invalid connection info: {0}")]
    InvalidConnectionInfo(#[source] InvalidInfo),
    /// Caller's fault: the prologue must be sent exactly once, before any item.
    #[error("{0}")]
    Prologue(&'static str),
    /// Caller's fault: an item is larger than the plane accepts.
    #[error("item of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// The item's encoded length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// The frontend has too many streams waiting for their worker.
    #[error("too many pending streams (limit {limit})")]
    Overloaded {
        /// The limit.
        limit: usize,
    },
    /// The plane is shutting down and takes no new streams.
    #[error("the response plane is shut down")]
    Closed,
}

impl ResponseError {
    /// Whether the stream ended because it was cancelled (stop or kill).
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Cancelled { .. })
    }

    /// Whether the other side caused the error (refusal, worker error, bad data, a bad
    /// address).
    pub fn is_remote(&self) -> bool {
        matches!(
            self,
            Self::Refused { .. }
                | Self::DroppedByFrontend { .. }
                | Self::Worker { .. }
                | Self::Decode(_)
                | Self::Protocol(_)
                | Self::InvalidConnectionInfo(_)
                | Self::PlaneMismatch { .. }
        )
    }

    /// Whether this side's caller misused the API (an item too large or not encodable, the
    /// prologue out of order).
    pub fn is_caller(&self) -> bool {
        matches!(
            self,
            Self::Encode(_) | Self::Prologue(_) | Self::TooLarge { .. }
        )
    }

    /// Whether retrying the request (on another worker) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Disconnected(_) | Self::ResponseTimeout { .. } | Self::Unreachable { .. } => true,
            Self::Refused { cause } => cause.retryable,
            _ => false,
        }
    }

    /// The stream was lost for `cause`.
    pub(crate) fn lost(cause: Cause) -> Self {
        Self::Disconnected(Disconnect::Lost(cause))
    }
}

/// What a velo stream operation's failure means to the response plane (the one place where
/// session errors become `ResponseError`s).
pub(crate) fn stream_error(e: StreamError) -> ResponseError {
    use velo_mux::{OpenError, StreamEnd};
    match e {
        StreamError::Closed(StreamEnd::Cancelled(CancelCode::CANCELLED))
        | StreamError::Undelivered(StreamEnd::Cancelled(CancelCode::CANCELLED)) => {
            ResponseError::Cancelled { graceful: false }
        }
        // Refused, at a limit, draining, or unreadable: not a cancellation of work.
        StreamError::Closed(StreamEnd::Cancelled(code))
        | StreamError::Undelivered(StreamEnd::Cancelled(code)) => {
            ResponseError::DroppedByFrontend { code }
        }
        StreamError::Closed(StreamEnd::Lost(lane))
        | StreamError::Undelivered(StreamEnd::Lost(lane)) => ResponseError::lost(Cause::lane(lane)),
        // The frontend ended the stream for breaking its rules: this side's stream is over.
        StreamError::Closed(StreamEnd::Violation(reason)) => {
            ResponseError::Protocol(ProtocolViolation::Stream(reason))
        }
        // Finished or reset by this side: using it again is the caller's mistake.
        StreamError::Closed(_) => ResponseError::Prologue("the stream has ended"),
        StreamError::TooLarge { len, max } => ResponseError::TooLarge { len, max },
        StreamError::Open(OpenError::PrologueTooLarge { len, max }) => {
            ResponseError::TooLarge { len, max }
        }
        other => ResponseError::lost(Cause::open(other)),
    }
}
