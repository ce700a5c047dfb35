//! Typed response streams for LLM serving: the crate applications program against.
//!
//! A frontend [`FrontendPlane::register`]s a stream before sending a request to a worker and
//! puts the returned [`ConnectionInfo`] in the request; the worker
//! [`WorkerPlane::connect`]s to it, sends the prologue (its engine accepted or refused the
//! request), then items, then finishes. The frontend's [`PendingResponse`] resolves on the
//! prologue into a [`ResponseStream`] of typed items, with [`ResponseStream::stop`]
//! (graceful) and [`ResponseStream::kill`]; the worker's [`StreamContext`] sees them.
//!
//! Every pending handle ends: on the prologue, on the worker's loss (a sender dropped before
//! its prologue ends it `Disconnected`, retryable, on both planes: the classic plane's
//! connection closes, the velo plane sends an OPEN with an empty prologue and resets it), on
//! the worker instance's removal, or after [`RegisterOptions::establish_timeout`]
//! ([`DEFAULT_ESTABLISH_TIMEOUT`] unless set).
//!
//! Two planes implement the same contract, chosen once per process by
//! [`ResponsePlaneConfig::from_env`] (`DYN_RESPONSE_PLANE`):
//!
//! - `tcp`, the classic plane Dynamo ships by default: one TCP connection per stream.
//! - `velo`: every stream between a worker process and a frontend multiplexed over a few
//!   lanes, batched, under per-stream credit (velo-mux over velo-tcp, or velo-ucx).
//!
//! # Liveness
//!
//! Nothing waits for ever on a peer that vanished. [`ResponsePlaneConfig::idle_timeout`]
//! (10 s by default; `DYN_VELO_IDLE_TIMEOUT_MS`, 100 to 3,600,000) bounds every connection of
//! both planes: velo lanes by heartbeats, and
//! every TCP socket (velo lanes and classic connections alike) by `TCP_USER_TIMEOUT` and
//! keepalive probes. [`WorkerPlane::close`] and [`WorkerPlane::abort`] end every stream and
//! every task the plane spawned, classic ones included.
//!
//! # Layer contract
//!
//! No wire, mux or session type appears in this crate's public signatures; its one error is
//! [`ResponseError`]. It spawns tasks only on the `TaskTracker` it is given.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use futures::StreamExt;
//! use response_plane::{FrontendPlane, RegisterOptions, ResponsePlaneConfig, WorkerPlane};
//!
//! let tracker = tokio_util::task::TaskTracker::new();
//! let config = ResponsePlaneConfig::from_env()?;
//! let frontend = FrontendPlane::bind(config.clone(), tracker.clone()).await?;
//! let worker = WorkerPlane::new(config, tracker.clone())?;
//!
//! let (info, pending) = frontend.register::<String>(RegisterOptions::default())?;
//! // ... the request carries `info` to a worker, which does:
//! let mut sender = worker.connect::<String>(&info).await?;
//! sender.send_prologue(Ok(())).await?;
//! sender.send(&"hello".to_string()).await?;
//! sender.finish().await?;
//!
//! let mut stream = pending.established().await?;
//! while let Some(item) = stream.next().await {
//!     println!("{}", item?);
//! }
//! # Ok(()) }
//! ```

// Built with no velo transport, only the classic plane runs and the velo adapters sit unused.
#![cfg_attr(
    not(any(feature = "tcp", feature = "ucx")),
    allow(dead_code, unused_imports)
)]

mod cause;
mod classic;
mod codec;
mod config;
pub mod env;
mod error;
mod frontend;
#[cfg(feature = "__fuzz")]
#[doc(hidden)]
pub mod fuzzing;
mod info;
mod msgpack;
mod observe;
mod prologue;
mod registry;
mod security;
mod stats;
mod stream;
mod velo;
mod watch;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;

pub use codec::Codec;
pub use config::{
    Batching, ConfigError, DEFAULT_BATCH_DELAY, DEFAULT_MAX_MESSAGE_SIZE, ENV_BATCH_MS,
    ENV_COMPRESSION, ENV_HOST, ENV_IDLE_TIMEOUT_MS, ENV_MAX_MESSAGE_SIZE, ENV_PLANE, ENV_PORT,
    ENV_TRANSPORT, MAX_BATCH_MS, Plane, ResponsePlaneConfig, ResponsePlaneConfigBuilder,
    VeloTransport,
};
pub use error::{
    CancelCode, Cause, Disconnect, ErrorCode, InvalidInfo, ProtocolViolation, ResponseError,
    TlsMismatch, TypedError,
};
pub use frontend::{DEFAULT_ESTABLISH_TIMEOUT, FrontendPlane, PendingResponse, RegisterOptions};
pub use info::ConnectionInfo;
pub use observe::PlaneObserver;
pub use registry::{MAX_PENDING, MAX_TOMBSTONES, TOMBSTONE_TTL};
pub use security::{
    ENV_CLUSTER_SECRET_PATH, ENV_TLS_CA_CERT_PATH, ENV_TLS_CERT_PATH, ENV_TLS_CLIENT_CA_CERT_PATH,
    ENV_TLS_CLIENT_CERT_PATH, ENV_TLS_CLIENT_KEY_PATH, ENV_TLS_HANDSHAKE_TIMEOUT_SECS,
    ENV_TLS_INSECURE, ENV_TLS_KEY_PATH, ENV_TLS_SERVER_NAME, MAX_TLS_HANDSHAKE_SECS, TlsConfig,
};
pub use stats::{
    BATCH_RECORDS_BUCKETS, Counter, FlushReason, HandshakeStats, MuxStats, PlaneStats,
};
pub use stream::ResponseStream;
/// Whether the velo plane packs its batches ([`ResponsePlaneConfigBuilder::compression`]).
pub use velo_mux::Compression;
pub use watch::TLS_WATCH_INTERVAL;
pub use worker::{ResponseSender, StreamContext, WorkerPlane};

/// Why a plane could not start. Every setup failure surfaces here, at startup.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The configured transport is not compiled into this build.
    #[error("{what} is not compiled in: rebuild with the `{feature}` cargo feature")]
    NotCompiled {
        /// The plane and transport asked for.
        what: &'static str,
        /// The cargo feature that provides it.
        feature: &'static str,
    },
    /// The UCX transport failed to initialise (its installation, configuration or address).
    #[cfg(feature = "ucx")]
    #[error("cannot start the UCX transport: {0}")]
    Ucx(#[source] velo_ucx::UcxError),
}
