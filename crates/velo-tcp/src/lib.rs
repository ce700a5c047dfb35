//! The velo response plane over TCP: N lanes (TCP connections, 4 by default) per worker
//! process and frontend instance, each with its own reader task, carrying velo-mux batches.
//!
//! # Layer contract
//!
//! This crate owns sockets and nothing else: socket options (buffers sized before connect or
//! listen, `TCP_NODELAY`, the liveness bound) and the listener and dialer velo-session drives.
//! A lane is velo-session's byte-stream lane (`StreamLane`: vectored zero-copy writes) over a
//! `TcpStream`, and a frontend is velo-session's `ListeningFrontend` over this crate's
//! listener. The handshake, the accept loop with its limits, streams, credits, batching and
//! timers are `velo-session` and `velo-mux`. It never spawns a task: velo-session runs
//! everything on the caller's `TaskTracker`.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo(acceptor: std::sync::Arc<dyn velo_session::Acceptor>) -> std::io::Result<()> {
//! use tokio_util::task::TaskTracker;
//! use velo_mux::{MuxConfig, Side};
//! use velo_tcp::{TcpConfig, TcpWorker};
//!
//! let tracker = TaskTracker::new();
//! let frontend_mux = MuxConfig::builder(Side::Frontend).build().unwrap();
//! let parts = velo_session::FrontendParts::new(frontend_mux, acceptor, tracker.clone());
//! let frontend = velo_tcp::bind_frontend("127.0.0.1:0".parse().unwrap(), TcpConfig::default(), parts).await?;
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
mod lane;
mod listener;
mod socket;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::task::TaskTracker;
use velo_mux::MuxConfig;
use velo_session::{FrontendParts, HandshakeStats, ListeningFrontend, WorkerEndpoint};

pub use config::{
    DEFAULT_BACKLOG, DEFAULT_CONNECT_TIMEOUT, DEFAULT_LIVENESS, DEFAULT_SOCKET_BUFFER, TcpConfig,
    TcpConfigBuilder,
};
pub use velo_session::ConfigError;

/// A frontend listening for worker lanes over TCP: velo-session's frontend over this crate's
/// listener, with nothing running beside it.
pub type TcpFrontend = ListeningFrontend;

/// Binds `addr` (socket buffers are sized before `listen`) and starts accepting as `frontend`
/// says.
///
/// # Errors
///
/// The I/O error of creating, configuring, binding or listening on the socket.
pub async fn bind_frontend(
    addr: SocketAddr,
    cfg: TcpConfig,
    frontend: FrontendParts,
) -> std::io::Result<TcpFrontend> {
    let sock = socket::socket(addr, &cfg)?;
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    let listener = sock.listen(cfg.backlog())?;
    let local_addr = listener.local_addr()?;
    let listener = listener::TcpLaneListener {
        listener,
        liveness: cfg.liveness(),
        tls: cfg.tls_server().cloned(),
    };
    Ok(ListeningFrontend::new(
        frontend,
        cfg.session(),
        listener,
        local_addr,
        (),
    ))
}

/// A worker dialing frontends over TCP.
#[derive(Clone)]
pub struct TcpWorker {
    endpoint: WorkerEndpoint,
}

impl TcpWorker {
    /// A worker whose connections have `mux.lanes()` lanes each; lane tasks run on `tracker`.
    pub fn new(mux: MuxConfig, cfg: TcpConfig, tracker: TaskTracker) -> Self {
        let settings = cfg.session().worker(mux);
        let dialer = move |addr| dialer::dial(cfg.clone(), addr);
        Self {
            endpoint: WorkerEndpoint::new(settings, Arc::new(dialer), tracker),
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
