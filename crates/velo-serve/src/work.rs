//! The request plane between a frontend and a worker: one TCP connection per worker, each
//! request a length-delimited JSON [`WorkRequest`] carrying the response stream's address.
//! Every connection starts with TLS, when configured (see "TLS"), then a handshake
//! ([`auth`]) that, with a cluster secret, proves each side to the other; then only requests
//! flow, frontend to worker (answers take the response plane). The frontend reads the
//! connection only to learn that the worker is gone (end of stream or an error), which it
//! treats as the worker's removal.
//!
//! ```text
//! TCP connect (frontend -> worker)
//! [TLS handshake: frontend = TLS server, worker = TLS client]   when TLS is on
//! greetings, proofs (below)                                       inside TLS when on
//! request frames, frontend -> worker: u32 big-endian length, JSON  inside TLS when on
//! ```
//!
//! # TLS
//!
//! The request plane reuses the response plane's TLS material ([`RequestAuth::from_config`]
//! reads `DYN_TCP_TLS_*`), with the TLS roles inverted relative to the TCP roles, so that no
//! new certificate is needed: the frontend, which connects, is the TLS server with its
//! response-plane identity (`DYN_TCP_TLS_CERT_PATH`/`KEY`; it requires workers' client
//! certificates when `DYN_TCP_TLS_CLIENT_CA_CERT_PATH` is set); the worker, which accepts, is
//! the TLS client with its response-plane trust (`DYN_TCP_TLS_CA_CERT_PATH` or
//! `DYN_TCP_TLS_INSECURE`), naming the frontend by `DYN_TCP_TLS_SERVER_NAME`, else the
//! connection's source IP address, and presenting `DYN_TCP_TLS_CLIENT_CERT_PATH`/`KEY` when
//! set. Unlike the response plane's worker, which names the address it dialed, the source IP
//! is whatever the frontend's route and any NAT make it: for a multi-homed or NATed frontend
//! it need not be in the frontend's certificate, so set `DYN_TCP_TLS_SERVER_NAME` (a name the
//! certificate holds) there. TLS is on for a
//! frontend with a server identity, for a worker with trust. The secret's handshake then runs
//! inside the session unchanged: it still authenticates both sides without mutual TLS, and
//! no proof crosses in clear.
//!
//! TLS on one side only is an error on both, each naming the side without TLS, told at the
//! first byte read rather than waited out: a TLS frontend peeks the worker's first byte (a
//! TLS record starts with [`velo_tls::TLS_HANDSHAKE_RECORD`], a greeting with `v`) and
//! answers a plaintext worker with a greeting whose mode says TLS is required (2), then
//! closes; a plaintext frontend finds a TLS record where the worker's greeting should be; a
//! TLS worker finds a greeting where the frontend's TLS record should be. A certificate the
//! other side does not accept fails the TLS handshake ([`HandshakeError::Tls`]). The TLS
//! handshake is bounded by `DYN_TCP_TLS_HANDSHAKE_TIMEOUT_SECS` and, with the rest of the
//! handshake, by [`auth::HANDSHAKE_TIMEOUT`].
//!
//! A certificate rotation needs no restart, as on the response plane: a running frontend or
//! worker checks its request plane's TLS files every
//! [`TLS_WATCH_INTERVAL`](response_plane::TLS_WATCH_INTERVAL) (2 s) and rereads them when
//! any changed (size or modification time). Connections made after that use the new files;
//! each connection already up keeps its session for its life. A changed file that does not
//! load is logged with its error and the TLS in use stays (it is tried again when it next
//! changes). The watch is a task on the frontend's or worker's tracker, ended by its stop
//! token. The response plane watches the same files with its own copy of them, so the two
//! planes switch within an interval of each other, not at one instant.
//!
//! # Handshake
//!
//! The secret is the response plane's (`DYN_VELO_CLUSTER_SECRET_PATH`, read by
//! [`RequestAuth::from_config`]). Both sides write a greeting at once, then read the peer's:
//!
//! ```text
//! greeting (GREETING_LEN = 50 bytes, each side)
//!   0..8    MAGIC "velo-rq2"        the protocol and its version
//!   8       role                    1 frontend, 2 worker
//!   9       mode                    0 no secret (nothing follows), 1 the sender proves the secret,
//!                                   2 (frontend only, in plaintext) TLS is required; it closes next
//!   10..18  instance                u64 big-endian, the worker's discovery instance id: the
//!                                   frontend's is the worker it means, the worker's its own;
//!                                   0 names none
//!   18..50  nonce                   32 fresh random bytes (ring's SystemRandom)
//! then, when both modes are 1:
//!   frontend -> worker   proof_F (32 bytes)
//!   worker -> frontend   0x01 then proof_W (32 bytes)   or   0x00 (refused) and close
//! proof_X = HMAC-SHA256(secret, "velo-serve request plane v2" || role_X
//!                               || frontend greeting || worker greeting)
//! ```
//!
//! Each proof covers both sides' fresh nonces, so it is good for one connection only (no
//! replay), and its prover's role, so a frontend's proof is never a worker's (no reflection);
//! the label keeps it apart from the velo lanes' HELLO proofs. Each also covers the instance
//! both greetings name: a frontend names the worker it found in discovery
//! ([`RequestAuth::with_instance`]), a worker its own id, and when both name one a mismatch is
//! refused by both sides ([`HandshakeError::WrongInstance`]), secret or not, before any proof.
//! So a stale or forged discovery entry whose address reaches another live worker (someone
//! who took a dead worker's port and relays to another worker) gets nothing run there: the
//! relay cannot change the instance the frontend named without breaking its proof. A side
//! naming none (a worker or frontend built without discovery, as in tests) checks nothing;
//! every frontend that follows discovery names one. Proofs are checked in constant
//! time. The worker proves itself only once the frontend has: a peer without the secret gets
//! no MAC out of a worker. Both modes 0 is an unauthenticated connection (a worker without a
//! secret warns at start that its request plane accepts anyone, a frontend that it sends
//! requests to anyone). A mode that differs from this side's (a secret on one side only) is an
//! error on both sides, each naming the side that lacks the secret. Mode 2 is unauthenticated
//! and in clear, so a worker takes it only from a frontend's greeting and reports it as the
//! peer's claim ([`HandshakeError::ClaimsTlsRequired`]). A greeting in the wrong
//! role (a side's own greeting sent back to it) is refused; a frame written without a greeting
//! is told apart at its first byte (a length prefix starts with zero, [`auth::MAGIC`] with
//! `v`). [`auth::HANDSHAKE_TIMEOUT`] bounds the whole exchange on both sides, and no peer can
//! make either side allocate by what it sends: without TLS each side reads a fixed number of
//! bytes (a greeting and a proof, plus a verdict for the frontend), except that a plaintext
//! frontend finding a TLS record drains it (at most about 18 KiB) before it closes; with TLS,
//! rustls bounds each handshake message it reads, and the secret's handshake inside reads the
//! same fixed amounts.
//!
//! The worker reads no request frame before the frontend's proof verified; the frontend sends
//! none before TLS is up (when on) and the worker's proof verified ([`WorkChannel::connect`]
//! returns only then). A worker closes
//! a connection whose handshake fails, counts it ([`IntakeStats::handshakes_refused`]) and
//! frees its slot; a frontend treats such a worker as unreachable (not routed to, tried again
//! after a growing pause, see [`crate::frontend::pool`]).
//!
//! What the handshake does not do: without TLS, requests cross in plaintext, and it
//! authenticates the connection's start, not the frames after it (someone on the path to the
//! worker the frontend meant can relay a genuine handshake, then read or write frames). Without
//! TLS, run this plane on a trusted network (`docs/security.md`). With
//! `DYN_TCP_TLS_INSECURE` the worker trusts any certificate, so TLS authenticates no one (a
//! man in the middle can terminate both sessions); only the secret then authenticates, as
//! without TLS.
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
//! - [`MAX_HANDSHAKES`]: connections in their handshake (each for at most
//!   [`auth::HANDSHAKE_TIMEOUT`]), or past it and waiting for a connection slot; more wait in
//!   the kernel's accept queue. Strangers who connect and say nothing hold these places only.
//! - [`MAX_HANDSHAKES_PER_SOURCE`]: connections in their handshake from one source address
//!   (an IPv4 address, an IPv6 /64), the response plane's rule. One more from that source is
//!   closed at once, unread and ungreeted, without a handshake place, and counted
//!   ([`IntakeStats::handshakes_refused_per_source`], and in `handshakes_refused`): a
//!   stranger needs `MAX_HANDSHAKES / MAX_HANDSHAKES_PER_SOURCE` (8) addresses to hold every
//!   place and keep a new or reconnecting frontend's handshake waiting behind its silent
//!   connections (up to [`auth::HANDSHAKE_TIMEOUT`] each). The per-source table has at most
//!   [`MAX_HANDSHAKES`] entries: a source is in it only while it has a handshake in progress.
//! - [`WorkLimits::max_connections`] (`--max-request-connections`, default
//!   [`DEFAULT_MAX_CONNECTIONS`]): connections served at once past their handshake. One whose
//!   handshake succeeds takes a slot when one is free, reading nothing until then.
//! - [`REFUSAL_WARN_INTERVAL`]: a refused handshake (failed, or refused for its source) is
//!   logged at debug; a warning, with the count since the last one, goes out at most once per
//!   interval.
//!
//! So a worker holds at most `max_requests` requests (each at most [`MAX_FRAME_BYTES`]) and
//! `max_connections` + [`MAX_HANDSHAKES`] connections, each with at most one frame read and
//! waiting for a place.
//! The frontend's side is bounded by [`QUEUE_REQUESTS`] per worker.

pub mod auth;
pub mod intake;
mod tls;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use response_plane::ConnectionInfo;
use serde::{Deserialize, Serialize};
use tokio::io::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::openai::Ending;
use tls::Link;

pub use auth::{HandshakeError, RequestAuth, SecretError};
pub use intake::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUESTS, IntakeStats, MAX_HANDSHAKES,
    MAX_HANDSHAKES_PER_SOURCE, REFUSAL_WARN_INTERVAL, WorkLimitError, WorkLimits, serve,
};
pub(crate) use tls::watch::spawn as watch_tls;

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

/// Why a connection to a worker could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The worker could not be reached (network, or nothing listening).
    #[error("cannot connect to the worker: {0}")]
    Io(#[source] std::io::Error),
    /// The connection was not made within [`CONNECT_TIMEOUT`].
    #[error("no connection to the worker within {CONNECT_TIMEOUT:?}")]
    Timeout,
    /// The worker failed the handshake: it is not to be sent requests.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
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
    /// Connects to the worker at `addr` and runs the handshake under `auth`: TLS when `auth`
    /// has it, then the secret's (see the module docs); its tasks run on `tracker`. Returns
    /// once the worker proved itself (or neither side has a secret): nothing is sent before.
    ///
    /// # Errors
    ///
    /// [`ConnectError`]: the connection's I/O error, a timeout after [`CONNECT_TIMEOUT`], or
    /// the handshake's error (after at most [`auth::HANDSHAKE_TIMEOUT`]).
    pub async fn connect(
        addr: SocketAddr,
        auth: &RequestAuth,
        tracker: &TaskTracker,
    ) -> Result<Self, ConnectError> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| ConnectError::Timeout)?
            .map_err(ConnectError::Io)?;
        stream.set_nodelay(true).map_err(ConnectError::Io)?;
        let link = tls::frontend_open(stream, auth).await?;
        let (read, write) = tokio::io::split(link);
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
    mut out: FramedWrite<WriteHalf<Link>, LengthDelimitedCodec>,
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
    mut input: FramedRead<ReadHalf<Link>, LengthDelimitedCodec>,
    lost: CancellationToken,
) {
    // The worker sends nothing: any frame, the end or an error means it is gone or broken.
    tokio::select! {
        _ = input.next() => {}
        () = lost.cancelled() => {}
    }
    lost.cancel();
}
