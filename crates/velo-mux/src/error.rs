//! Errors of the mux layer, each saying who is at fault.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use velo_wire::{CloseCode, WireError};

use crate::StreamEnd;

/// Why a lane failed. Fatal for the lane: every live stream on it ends with
/// [`StreamEnd::Lost`] (frontend) or [`CloseReason::Lost`] (worker), exactly once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LaneError {
    /// Peer's fault: bytes that are not valid protocol v3.
    #[error("peer sent malformed bytes: {0}")]
    Malformed(#[from] WireError),
    /// Peer's fault: valid bytes that break a lane rule.
    #[error("peer broke the protocol: {0}")]
    Protocol(&'static str),
    /// The peer closed the lane with a CLOSE frame.
    #[error("peer closed the lane ({code}): {reason}")]
    PeerClosed {
        /// The peer's close code.
        code: CloseCode,
        /// The peer's reason.
        reason: String,
    },
    /// Peer's fault (or the network's): nothing arrived for the idle timeout.
    #[error("peer silent for {0:?}: lane timed out")]
    IdleTimeout(Duration),
    /// Peer's fault (or the network's): a write to the lane made no progress for the idle
    /// timeout; the peer stopped reading.
    #[error("no write progress for {0:?}: peer stopped reading")]
    WriteStalled(Duration),
    /// Peer's fault: its streams were refused, or reset before their first item, faster than
    /// the connection's churn limit allows (the "rapid reset" pattern).
    #[error("peer refused or reset streams past the churn limit ({burst} at once, {per_second}/s)")]
    ChurnLimit {
        /// The limit's burst.
        burst: u32,
        /// The limit's rate.
        per_second: u32,
    },
    /// Peer's fault: its input made this side queue more control records (ACCEPT, CANCEL,
    /// CREDIT, ...) than `max_control_bytes` while it did not read them.
    #[error("peer's input queued over {max} bytes of control records it does not read")]
    ControlQueueFull {
        /// The cap, `max_control_bytes`.
        max: usize,
    },
    /// Peer's fault: it answered an OPEN neither with ACCEPT nor with CANCEL for the idle
    /// timeout while the lane stayed alive. The stream, and a worker finishing it (which
    /// waits for the answer), would wait for ever.
    #[error("peer left an OPEN unanswered for {0:?}")]
    Unanswered(Duration),
    /// I/O: the transport under the lane failed or ended.
    #[error("transport lost: {0}")]
    Transport(TransportEnd),
    /// Local: this side closed the lane (shutdown).
    #[error("lane closed by this side ({code}): {reason}")]
    Local {
        /// The close code sent.
        code: CloseCode,
        /// Why.
        reason: String,
    },
}

impl LaneError {
    /// The close code to send the peer for this error, if one should be sent.
    pub fn close_code(&self) -> Option<CloseCode> {
        match self {
            Self::Malformed(e) => Some(e.close_code()),
            Self::Protocol(_) | Self::Unanswered(_) => Some(CloseCode::PROTOCOL_ERROR),
            Self::IdleTimeout(_) => Some(CloseCode::IDLE_TIMEOUT),
            Self::ChurnLimit { .. } => Some(CloseCode::CHURN_LIMIT),
            Self::ControlQueueFull { .. } => Some(CloseCode::LIMIT),
            Self::Local { code, .. } => Some(*code),
            // A stalled lane cannot carry a CLOSE frame either.
            Self::PeerClosed { .. } | Self::Transport(_) | Self::WriteStalled(_) => None,
        }
    }
}

/// How a lane's transport ended, as its driver reports it with
/// [`Mux::handle_lane_lost`](crate::Mux::handle_lane_lost).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TransportEnd {
    /// The peer ended the connection (end of stream, a FIN).
    #[error("the peer closed the connection")]
    Closed,
    /// Reading failed (reset, unreachable, the transport's own error).
    #[error("read failed: {0}")]
    Read(#[source] Arc<io::Error>),
    /// Writing failed.
    #[error("write failed: {0}")]
    Write(#[source] Arc<io::Error>),
    /// This side stopped the lane at once (an endpoint's abort, a test's kill).
    #[error("aborted by this side")]
    Aborted,
    /// A new connection took the lane's place.
    #[error("replaced by a new connection")]
    Replaced,
}

impl TransportEnd {
    /// A read failure.
    pub fn read(e: io::Error) -> Self {
        Self::Read(Arc::new(e))
    }

    /// A write failure.
    pub fn write(e: io::Error) -> Self {
        Self::Write(Arc::new(e))
    }
}

/// Equal when of the same kind (and, for I/O failures, of the same `io::ErrorKind`).
impl PartialEq for TransportEnd {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Read(a), Self::Read(b)) | (Self::Write(a), Self::Write(b)) => {
                a.kind() == b.kind()
            }
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

impl Eq for TransportEnd {}

/// How a worker's stream was ended by something other than its own finish or reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// The frontend cancelled the stream (or refused it).
    #[error("cancelled by the frontend ({0})")]
    Cancelled(velo_wire::CancelCode),
    /// The stream's lane failed.
    #[error("lane lost: {0}")]
    Lost(LaneError),
}

/// Why [`Mux::open`](crate::Mux::open) failed. Nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Local: no lane of the connection is up.
    #[error("no lane to the peer is up")]
    NoLane,
    /// Local: the connection is at its stream limit.
    #[error("connection is at its limit of {0} streams")]
    TooManyStreams(u32),
    /// The peer sent GOAWAY: it takes no new streams on this connection.
    #[error("peer is going away ({0}) and takes no new streams")]
    GoingAway(velo_wire::GoAwayCode),
    /// Caller's fault: the prologue does not fit a frame.
    #[error("prologue of {len} bytes exceeds the limit of {max} bytes")]
    PrologueTooLarge {
        /// Prologue length.
        len: usize,
        /// Largest allowed.
        max: u32,
    },
    /// Backpressure: the prologue is large and every lane's buffer is full; retry after
    /// [`MuxEvent::LaneWritable`](crate::MuxEvent::LaneWritable). (Prologues under
    /// [`CHAIN_THRESHOLD`](crate::CHAIN_THRESHOLD) bytes are always taken.)
    #[error("every lane's buffer is full")]
    LaneFull,
    /// Caller's fault: only a worker opens streams.
    #[error("only the worker side opens streams")]
    WrongSide,
}

/// What a send is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Blocked {
    /// The stream has no credit: wait for [`MuxEvent::Writable`](crate::MuxEvent::Writable).
    Credit,
    /// The lane's buffer is full: wait for
    /// [`MuxEvent::LaneWritable`](crate::MuxEvent::LaneWritable).
    Lane,
}

/// Why a send, finish or reset did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// Backpressure, not failure: try again after the event [`Blocked`] names.
    #[error("send would block on {0:?}")]
    WouldBlock(Blocked),
    /// The stream has ended and takes no more records.
    #[error("stream is closed: {0}")]
    Closed(StreamEnd),
    /// Caller's fault: the key does not name a stream of this mux (released or never opened).
    #[error("unknown stream")]
    UnknownStream,
    /// Caller's fault: the payload is larger than a frame the peer accepts.
    #[error("item of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Payload length.
        len: usize,
        /// Largest allowed.
        max: u32,
    },
    /// Caller's fault: the call belongs to the other side (a frontend cannot send items).
    #[error("wrong side for this call")]
    WrongSide,
}
