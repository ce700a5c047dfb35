//! The velo response plane over TCP: N lanes (TCP connections, 4 by default) per worker
//! process and frontend instance, each with its own reader task, carrying velo-mux batches.
//!
//! # Layer contract
//!
//! This crate owns sockets and nothing else: socket options (buffers sized before connect or
//! listen, `TCP_NODELAY`, the liveness bound), the listener and dialer velo-session drives,
//! and vectored zero-copy writes. The handshake, the accept loop with its limits, streams,
//! credits, batching and timers are `velo-session` and `velo-mux`. It never spawns a task:
//! velo-session runs everything on the caller's `TaskTracker`.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo(acceptor: std::sync::Arc<dyn velo_session::Acceptor>) -> std::io::Result<()> {
//! use tokio_util::task::TaskTracker;
//! use velo_mux::{MuxConfig, Side};
//! use velo_tcp::{TcpConfig, TcpFrontend, TcpWorker};
//!
//! let tracker = TaskTracker::new();
//! let frontend_mux = MuxConfig::builder(Side::Frontend).build().unwrap();
//! let frontend = TcpFrontend::bind("127.0.0.1:0".parse().unwrap(), frontend_mux, TcpConfig::default(), acceptor, tracker.clone()).await?;
//!
//! let worker = TcpWorker::new(MuxConfig::builder(Side::Worker).build().unwrap(), TcpConfig::default(), tracker.clone());
//! let mut stream = worker
//!     .endpoint()
//!     .open(frontend.local_addr(), frontend.instance(), 42, &velo_wire::Token([0; 16]), br#"{"error":null}"#)
//!     .await
//!     .unwrap();
//! stream.send(b"token").await.unwrap();
//! stream.finish(bytes::Bytes::new()).await.unwrap();
//! # Ok(()) }
//! ```

mod config;
mod dialer;
mod io;
mod listener;
mod socket;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::task::TaskTracker;
use velo_mux::MuxConfig;
use velo_session::{
    AcceptSettings, Accepting, Acceptor, FrontendEndpoint, FrontendSettings, HandshakeStats,
    WorkerEndpoint, WorkerSettings,
};
use velo_wire::InstanceId;

pub use config::{
    DEFAULT_BACKLOG, DEFAULT_CONNECT_TIMEOUT, DEFAULT_LIVENESS, DEFAULT_SOCKET_BUFFER, TcpConfig,
};

/// A frontend listening for worker lanes over TCP.
pub struct TcpFrontend {
    endpoint: FrontendEndpoint,
    accepting: Accepting,
    local_addr: SocketAddr,
}

impl TcpFrontend {
    /// Binds `addr` (socket buffers are sized before `listen`) and starts accepting on
    /// `tracker`. A fresh instance id names this frontend in every stream address.
    ///
    /// # Errors
    ///
    /// The I/O error of creating, configuring, binding or listening on the socket.
    pub async fn bind(
        addr: SocketAddr,
        mux: MuxConfig,
        cfg: TcpConfig,
        acceptor: Arc<dyn Acceptor>,
        tracker: TaskTracker,
    ) -> std::io::Result<Self> {
        Self::bind_as(
            addr,
            velo_session::new_instance_id(),
            mux,
            cfg,
            acceptor,
            tracker,
        )
        .await
    }

    /// [`bind`](Self::bind) with a given instance id (tests restart a frontend under a new one).
    ///
    /// # Errors
    ///
    /// As [`bind`](Self::bind).
    pub async fn bind_as(
        addr: SocketAddr,
        instance: InstanceId,
        mux: MuxConfig,
        cfg: TcpConfig,
        acceptor: Arc<dyn Acceptor>,
        tracker: TaskTracker,
    ) -> std::io::Result<Self> {
        let sock = socket::socket(addr, &cfg)?;
        sock.set_reuseaddr(true)?;
        sock.bind(addr)?;
        let listener = sock.listen(cfg.backlog)?;
        let local_addr = listener.local_addr()?;
        let settings = FrontendSettings {
            mux,
            read_buffer: cfg.read_buffer,
        };
        let endpoint = FrontendEndpoint::new(settings, instance, acceptor, tracker);
        let accepting = endpoint.accept(
            listener::TcpLaneListener {
                listener,
                liveness: cfg.liveness,
            },
            AcceptSettings {
                handshake_timeout: cfg.handshake_timeout,
                max_connections: cfg.max_connections,
            },
        );
        tracing::debug!(%local_addr, %instance, "tcp frontend listening");
        Ok(Self {
            endpoint,
            accepting,
            local_addr,
        })
    }

    /// Where workers connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This frontend's instance id.
    pub fn instance(&self) -> InstanceId {
        self.endpoint.instance()
    }

    /// The endpoint (connections, stats, go-away).
    pub fn endpoint(&self) -> &FrontendEndpoint {
        &self.endpoint
    }

    /// The handshake counters of every connection accepted.
    pub fn stats(&self) -> HandshakeStats {
        self.accepting.stats()
    }

    /// Stops accepting (handshakes in progress are dropped), waits for the accept loop to
    /// exit, then closes every lane gracefully (a CLOSE frame each; their tasks end on their
    /// own, see [`abort`](Self::abort) for a hard stop).
    pub async fn shutdown(&self) {
        self.accepting.shutdown().await;
        self.endpoint.close();
    }

    /// Stops everything at once: no more accepts, every lane's tasks end now.
    pub fn abort(&self) {
        self.accepting.stop();
        self.endpoint.abort();
    }
}

/// A worker dialing frontends over TCP.
#[derive(Clone)]
pub struct TcpWorker {
    endpoint: WorkerEndpoint,
}

impl TcpWorker {
    /// A worker whose connections have `mux.lanes()` lanes each; lane tasks run on `tracker`.
    pub fn new(mux: MuxConfig, cfg: TcpConfig, tracker: TaskTracker) -> Self {
        let settings = WorkerSettings {
            backoff: cfg.backoff,
            read_buffer: cfg.read_buffer,
            handshake_timeout: cfg.handshake_timeout,
            ..WorkerSettings::new(mux)
        };
        let dialer = Arc::new(dialer::TcpDialer { cfg });
        Self {
            endpoint: WorkerEndpoint::new(settings, dialer, tracker),
        }
    }

    /// The endpoint (open streams, flush).
    pub fn endpoint(&self) -> &WorkerEndpoint {
        &self.endpoint
    }

    /// The handshake counters of every lane dialed.
    pub fn stats(&self) -> HandshakeStats {
        self.endpoint.handshake_stats()
    }

    /// Closes every connection (each lane sends CLOSE first); no new connections are made.
    /// Lane tasks end on their own; wait for them on the tracker.
    pub fn close(&self) {
        self.endpoint.close();
    }

    /// Stops every connection at once.
    pub fn abort(&self) {
        self.endpoint.abort();
    }
}
