//! The request plane between a frontend and a worker: one TCP connection per worker, each
//! request a length-delimited JSON [`WorkRequest`] carrying the response stream's address.
//! Nothing flows back on it (answers take the response plane); the frontend reads it only to
//! learn that the worker is gone (end of stream or an error), which it treats as the worker's
//! removal.
//!
//! # Bounds
//!
//! Anyone who reaches a worker's request port can write to it, so the worker's side
//! ([`serve`], in [`intake`]) bounds what a peer can make it hold, whatever the peer sends:
//!
//! - [`MAX_FRAME_BYTES`]: the largest request frame; a longer length prefix closes the
//!   connection before anything is allocated for it.
//! - [`WorkLimits::max_requests`] (`--max-requests`, default [`DEFAULT_MAX_REQUESTS`]):
//!   requests read and not yet finished. At the limit a connection stops reading, so TCP flow
//!   control pushes back on its sender; each request gives its place back when its engine is
//!   done with it (its stream ended or failed) or it is refused.
//! - [`WorkLimits::max_connections`] (`--max-request-connections`, default
//!   [`DEFAULT_MAX_CONNECTIONS`]): connections served at once; more wait in the kernel's
//!   accept queue until one ends.
//!
//! So a worker holds at most `max_requests` requests (each at most [`MAX_FRAME_BYTES`]) and
//! `max_connections` connections, each with at most one frame read and waiting for a place.
//! The frontend's side is bounded by [`QUEUE_REQUESTS`] per worker.

pub mod intake;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use response_plane::ConnectionInfo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::openai::Ending;

pub use intake::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUESTS, WorkLimitError, WorkLimits, serve,
};

/// Largest request frame, in bytes, on both sides: a request is about 400 (its stream
/// address is most of it), so this leaves room for long addresses while keeping what a
/// worker may hold per request small (see the module's bounds).
pub const MAX_FRAME_BYTES: usize = 64 * 1024;
/// Requests queued per worker connection before senders wait.
pub const QUEUE_REQUESTS: usize = 4096;
/// How long connecting to a worker may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// One request, as the worker's engine needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkRequest {
    /// The request's number (for the engine's token ids).
    pub id: u64,
    /// Prompt tokens (the prefill cost).
    pub prompt_tokens: u32,
    /// Tokens to generate.
    pub output_tokens: u32,
    /// How the generation ends.
    pub ending: WireEnding,
    /// Where the answer goes.
    pub info: ConnectionInfo,
}

/// [`Ending`] on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireEnding {
    /// End-of-sequence.
    Eos,
    /// Token limit.
    Length,
}

impl From<Ending> for WireEnding {
    fn from(e: Ending) -> Self {
        match e {
            Ending::Eos => Self::Eos,
            Ending::Length => Self::Length,
        }
    }
}

impl WorkRequest {
    /// The JSON frame.
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// Parses a frame.
    ///
    /// # Errors
    ///
    /// The JSON error.
    pub fn decode(frame: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(frame)
    }
}

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

/// Why a request could not be handed to a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the connection to the worker is closed")]
pub struct ChannelClosed;

/// The frontend's connection to one worker.
#[derive(Debug, Clone)]
pub struct WorkChannel {
    tx: mpsc::Sender<Bytes>,
    lost: CancellationToken,
}

impl WorkChannel {
    /// Connects to the worker at `addr`; its tasks run on `tracker`.
    ///
    /// # Errors
    ///
    /// The connection's I/O error (or a timeout after [`CONNECT_TIMEOUT`]).
    pub async fn connect(addr: SocketAddr, tracker: &TaskTracker) -> std::io::Result<Self> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        let (tx, rx) = mpsc::channel(QUEUE_REQUESTS);
        let lost = CancellationToken::new();
        tracker.spawn(write_requests(
            FramedWrite::new(write, codec()),
            rx,
            lost.clone(),
        ));
        tracker.spawn(watch_end(FramedRead::new(read, codec()), lost.clone()));
        Ok(Self { tx, lost })
    }

    /// Queues a request.
    ///
    /// # Errors
    ///
    /// [`ChannelClosed`] when the worker is gone.
    pub async fn send(&self, request: &WorkRequest) -> Result<(), ChannelClosed> {
        if self.lost.is_cancelled() {
            return Err(ChannelClosed);
        }
        self.tx
            .send(request.encode())
            .await
            .map_err(|_| ChannelClosed)
    }

    /// Resolves when the connection is lost (the worker went away) or closed.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Closes the connection.
    pub fn close(&self) {
        self.lost.cancel();
    }
}

async fn write_requests(
    mut out: FramedWrite<tokio::net::tcp::OwnedWriteHalf, LengthDelimitedCodec>,
    mut rx: mpsc::Receiver<Bytes>,
    lost: CancellationToken,
) {
    loop {
        // Cancel safety: `recv` loses nothing when the other branch wins.
        let first = tokio::select! {
            r = rx.recv() => r,
            () = lost.cancelled() => None,
        };
        let Some(first) = first else { break };
        // Everything queued goes out in one write; a worker that stops reading blocks it, so
        // the write also ends when the worker is removed (`close`): leaving drops `rx`, which
        // ends every send waiting for room in the queue.
        let write = async {
            let mut ok = out.feed(first).await.is_ok();
            while ok && let Ok(more) = rx.try_recv() {
                ok = out.feed(more).await.is_ok();
            }
            ok && SinkExt::<Bytes>::flush(&mut out).await.is_ok()
        };
        // Cancel safety: the write is abandoned only when the connection is done anyway.
        let written = tokio::select! {
            ok = write => ok,
            () = lost.cancelled() => false,
        };
        if !written {
            break;
        }
    }
    lost.cancel();
}

async fn watch_end(
    mut input: FramedRead<tokio::net::tcp::OwnedReadHalf, LengthDelimitedCodec>,
    lost: CancellationToken,
) {
    // The worker sends nothing: any frame, the end or an error means it is gone or broken.
    tokio::select! {
        _ = input.next() => {}
        () = lost.cancelled() => {}
    }
    lost.cancel();
}
