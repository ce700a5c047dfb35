//! Errors of the session layer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use velo_mux::handshake::HandshakeError;
use velo_mux::{OpenError, SendError, StreamEnd};
use velo_wire::{CloseCode, WireError};

/// Why a worker could not prepare its connection to a frontend. Not cached: the next request
/// tries again (after a backoff, see [`ConnectError::BackingOff`]).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// I/O: the frontend could not be reached, or the lane failed during the handshake (the
    /// transport's error, for example a refused TCP connection or a UCX endpoint error).
    #[error("cannot reach frontend at {addr}: {source}")]
    Io {
        /// Where.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The frontend did not complete the handshake in time.
    #[error("handshake with {addr} timed out after {timeout:?}")]
    Timeout {
        /// Where.
        addr: SocketAddr,
        /// The bound.
        timeout: Duration,
    },
    /// The frontend refused the lane with a CLOSE frame (version or identity mismatch, limit,
    /// shutting down).
    #[error("frontend at {addr} refused the connection ({code}): {reason}")]
    Refused {
        /// Where.
        addr: SocketAddr,
        /// The frontend's close code.
        code: CloseCode,
        /// The frontend's reason.
        reason: String,
    },
    /// The frontend's HELLO is valid but not acceptable (for example another instance: the
    /// frontend restarted).
    #[error("handshake with {addr} failed: {source}")]
    Handshake {
        /// Where.
        addr: SocketAddr,
        /// What was wrong.
        #[source]
        source: HandshakeError,
    },
    /// The frontend sent bytes that are not a valid handshake.
    #[error("frontend at {addr} sent an invalid handshake: {source}")]
    Wire {
        /// Where.
        addr: SocketAddr,
        /// What was wrong.
        #[source]
        source: WireError,
    },
    /// The cluster secret's exchange failed on this side: the frontend holds no secret, or
    /// another one (this side told it with CLOSE `unauthenticated`).
    #[error("frontend at {addr} not authenticated: {reason}")]
    Unauthenticated {
        /// Where.
        addr: SocketAddr,
        /// What was wrong.
        reason: &'static str,
    },
    /// The connection to the frontend ended soon after it was set up, after an earlier
    /// failure: the next preparation waits for a backoff (see [`Self::BackingOff`]).
    #[error("connection to {addr} ended {lived:?} after it was set up")]
    Ended {
        /// Where.
        addr: SocketAddr,
        /// How long it had been up when it was found ended.
        lived: Duration,
    },
    /// A recent preparation failed; this request fails fast instead of dialing again.
    #[error("connection to {addr} failed {ago:?} ago, next attempt in {retry_in:?}: {last}")]
    BackingOff {
        /// Where.
        addr: SocketAddr,
        /// Time since the failure.
        ago: Duration,
        /// Time until the next attempt is allowed.
        retry_in: Duration,
        /// The failure.
        last: Box<Self>,
    },
    /// The endpoint is shutting down.
    #[error("the endpoint is shutting down")]
    ShuttingDown,
}

/// Why a stream operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The stream has ended (finished, cancelled by the peer, lane lost, ...).
    #[error("stream closed: {0}")]
    Closed(StreamEnd),
    /// The stream's end may never have reached the frontend: the frontend had not accepted
    /// the stream when its lane failed (`Lost`) or it refused the stream (`Cancelled`).
    #[error("the stream's end was not delivered: {0}")]
    Undelivered(StreamEnd),
    /// The stream could not be opened.
    #[error("cannot open stream: {0}")]
    Open(#[from] OpenError),
    /// Caller's fault: the item is larger than the peer accepts.
    #[error("item of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Item length.
        len: usize,
        /// Largest allowed.
        max: u32,
    },
    /// Caller's fault: the call does not fit the stream (it was released, or belongs to the
    /// other side). A bug in the code using this crate, never the peer's doing.
    #[error("stream misused: {0}")]
    Misuse(#[source] SendError),
}
