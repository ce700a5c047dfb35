//! The velo response plane over UCX active messages: the same lanes, mux and v3 handshake as
//! `velo-tcp`, carried by UCX (tcp, or RDMA transports where the fabric has them), so
//! `DYN_VELO_RESPONSE_TRANSPORT=ucx` changes the wire and nothing else.
//!
//! # Feature `ucx`
//!
//! Everything that touches UCX is behind the `ucx` cargo feature, which needs the system UCX
//! (Debian `libucx-dev`, bound through `ucx1-sys`, whose bindgen needs `libclang-dev`).
//! Without it this crate builds no native code and exports only its settings, error and
//! counter types, so the default workspace build needs no native library.
//!
//! # Layer contract
//!
//! This crate owns the UCX context, worker, listener and endpoints, and the one driver that
//! progresses them; everything above the bytes (streams, credits, batching, timers) is
//! `velo-session` and `velo-mux`. All FFI is in one private module (`sys`), the only one
//! allowed `unsafe`. It spawns nothing untracked: the driver runs on the caller's
//! `TaskTracker` (or a thread the tracker waits for).
//!
//! # How a lane maps to UCX
//!
//! - One UCX endpoint per lane, created through a UCX listener (sockaddr connection
//!   establishment, whose port `ucp_listener_query` reports) with peer-failure handling on
//!   (`UCP_ERR_HANDLING_MODE_PEER`) on both sides.
//! - Each lane write becomes active messages of at most [`MAX_MESSAGE_BYTES`], each headed by
//!   a per-lane sequence number. The receiver checks the number in its handler and restores
//!   send order before the bytes reach the mux: UCX completes a rendezvous message after later
//!   eager ones. The mux decodes the byte stream exactly as over TCP.
//! - The handshake is the v3 HELLO exchange with its version and identity checks; a worker
//!   prepares one connection per frontend instance and shares it (`velo-session`).
//! - A failed endpoint (peer killed, reset, unreachable) fails its lane: the mux ends every
//!   stream on it exactly once, as lost. An orderly close sends a fin after the data.
//!
//! # Progress engine
//!
//! One driver per `UcxFrontend` or `UcxWorker` owns the UCX worker and makes every UCX
//! call. It progresses until idle, arms the worker and sleeps on its event fd, so an idle
//! transport costs no CPU (under 1 ms per 1.5 s idle with a connection up, either engine).
//! [`ProgressEngine::Task`] (the default) runs it as a task on the caller's runtime;
//! [`ProgressEngine::Thread`] on a thread of its own. Measured with `benches/ucx.rs` on the
//! 2-vCPU development VM (README): the task engine is the cheaper one, with no thread hop
//! between the application and UCX: one stream, 1.22 M records/s at 806 ns of CPU per record
//! against 0.65 M at 1,402 ns, and 9 µs against 39 µs median time-to-deliver; at 1,024 streams
//! the two are even (2.65 M and 2.74 M records/s, 370 ns per record each).
//!
//! # Settings
//!
//! UCX reads its `UCX_*` environment as usual; [`UcxConfigBuilder::tls`] and
//! [`UcxConfigBuilder::net_devices`] override `UCX_TLS` and `UCX_NET_DEVICES` for this
//! transport's context only (`ucp_config_modify`). A transport list without a network
//! transport (such as `sm,self`, which UCX would accept and then fail every connection with)
//! is refused when the configuration is built, or at start-up when it comes from the
//! environment's `UCX_TLS`; so is a UCX library older than the headers the bindings were
//! generated from (at start-up).
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(feature = "ucx")]
//! # async fn demo(acceptor: std::sync::Arc<dyn velo_session::Acceptor>) -> Result<(), velo_ucx::UcxError> {
//! use tokio_util::task::TaskTracker;
//! use velo_mux::{MuxConfig, Side};
//! use velo_ucx::{UcxConfig, UcxWorker};
//!
//! let tracker = TaskTracker::new();
//! let frontend_mux = MuxConfig::builder(Side::Frontend).build().unwrap();
//! let parts = velo_session::FrontendParts::new(frontend_mux, acceptor, tracker.clone());
//! let frontend = velo_ucx::bind_frontend("127.0.0.1:0".parse().unwrap(), UcxConfig::default(), parts).await?;
//!
//! let worker = UcxWorker::new(MuxConfig::builder(Side::Worker).build().unwrap(), UcxConfig::default(), tracker.clone())?;
//! let mut stream = worker
//!     .endpoint()
//!     .open(frontend.local_addr(), frontend.instance(), 42, &velo_wire::Token([0; 16]), br#"{"error":null}"#)
//!     .await
//!     .unwrap();
//! stream.send(b"token").await.unwrap();
//! stream.finish(bytes::Bytes::new()).await.unwrap();
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]
// Without the `ucx` feature only the settings types are used.
#![cfg_attr(not(feature = "ucx"), allow(dead_code))]

mod config;
mod error;
mod message;
mod reorder;
mod stats;

#[cfg(feature = "__fuzz")]
#[doc(hidden)]
pub mod fuzzing;

#[cfg(feature = "ucx")]
mod connector;
#[cfg(feature = "ucx")]
mod driver;
#[cfg(feature = "ucx")]
mod lane;
#[cfg(feature = "ucx")]
mod listener;
#[cfg(feature = "ucx")]
#[allow(unsafe_code)]
mod sys;
#[cfg(all(feature = "ucx", feature = "__testing"))]
#[doc(hidden)]
pub mod testing;

pub use config::{
    DEFAULT_CLOSE_TIMEOUT, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_LANE_QUEUE_BYTES, ProgressEngine,
    UcxConfig, UcxConfigBuilder,
};
pub use error::{ThreadFailure, UcxError};
pub use message::MAX_MESSAGE_BYTES;
pub use stats::UcxStats;
pub use velo_session::ConfigError;

/// Whether this build has the UCX transport (the `ucx` feature).
pub const ENABLED: bool = cfg!(feature = "ucx");

#[cfg(feature = "ucx")]
pub use transport::{UcxControl, UcxFrontend, UcxWorker, bind_frontend};

#[cfg(feature = "ucx")]
mod transport {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use tokio_util::task::TaskTracker;
    use velo_mux::MuxConfig;
    use velo_session::{
        FrontendParts, HandshakeStats, ListeningFrontend, TransportControl, WorkerEndpoint,
    };

    use crate::driver::{self, Command, Handle};
    use crate::{UcxConfig, UcxError, UcxStats, connector, listener, stats};

    /// A frontend listening for worker lanes over UCX: velo-session's frontend over this
    /// crate's listener, with the UCX driver beside it ([`UcxControl`]).
    pub type UcxFrontend = ListeningFrontend<UcxControl>;

    /// Creates a UCX context and worker, listens on `addr` (port 0: any; the bound port comes
    /// from `ucp_listener_query`) and starts accepting as `frontend` says. Must be called
    /// inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`UcxError`]: UCX failed to initialise, or the listener could not be created.
    pub async fn bind_frontend(
        addr: SocketAddr,
        cfg: UcxConfig,
        frontend: FrontendParts,
    ) -> Result<UcxFrontend, UcxError> {
        let counters = Arc::new(stats::Counters::default());
        let running = driver::start(&cfg, Some(addr), counters.clone(), &frontend.tracker)?;
        let (Some(port), Some(lanes)) = (running.port, running.accepted) else {
            unreachable!("a driver started with an address listens");
        };
        let control = UcxControl {
            counters,
            handle: running.handle,
        };
        let local_addr = SocketAddr::new(addr.ip(), port);
        let listener = listener::UcxLaneListener(lanes);
        Ok(ListeningFrontend::new(
            frontend,
            cfg.session(),
            listener,
            local_addr,
            control,
        ))
    }

    /// The UCX driver beside a frontend's lanes: its counters, and how the frontend stops it.
    pub struct UcxControl {
        counters: Arc<stats::Counters>,
        handle: Handle,
    }

    impl UcxControl {
        /// The UCX driver's counters.
        pub fn stats(&self) -> UcxStats {
            self.counters.snapshot()
        }
    }

    impl TransportControl for UcxControl {
        /// The listener goes (connection requests are rejected from now on).
        async fn stop_listening(&self) {
            let (done, stopped) = tokio::sync::oneshot::channel();
            if self.handle.send(Command::StopListening { done }) {
                // A dropped reply means the driver stopped, which stops listening too.
                let _ = stopped.await;
            }
        }

        /// The driver stops once the last lane has closed.
        fn close(&self) {
            self.handle.send(Command::Shutdown);
        }

        /// Every UCX endpoint is force-closed and the driver stops.
        fn abort(&self) {
            self.handle.send(Command::Abort);
        }
    }

    /// A worker dialing frontends over UCX.
    #[derive(Clone)]
    pub struct UcxWorker {
        endpoint: WorkerEndpoint,
        counters: Arc<stats::Counters>,
        handle: Handle,
    }

    impl UcxWorker {
        /// Creates a UCX context and worker; connections get `mux.lanes()` lanes each; the
        /// driver and lane tasks run on `tracker`. Must be called inside a tokio runtime.
        ///
        /// # Errors
        ///
        /// [`UcxError`] when UCX fails to initialise.
        pub fn new(mux: MuxConfig, cfg: UcxConfig, tracker: TaskTracker) -> Result<Self, UcxError> {
            let counters = Arc::new(stats::Counters::default());
            let running = driver::start(&cfg, None, counters.clone(), &tracker)?;
            let settings = cfg.session().worker(mux);
            let handle = running.handle.clone();
            let dialer = move |addr| connector::dial(handle.clone(), addr);
            Ok(Self {
                endpoint: WorkerEndpoint::new(settings, Arc::new(dialer), tracker),
                counters,
                handle: running.handle,
            })
        }

        /// The endpoint (open streams, flush).
        pub fn endpoint(&self) -> &WorkerEndpoint {
            &self.endpoint
        }

        /// The handshake counters of every lane dialed.
        pub fn handshake_stats(&self) -> HandshakeStats {
            self.endpoint.handshake_stats()
        }

        /// The UCX driver's counters.
        pub fn stats(&self) -> UcxStats {
            self.counters.snapshot()
        }

        /// Closes every connection (each lane sends CLOSE first) and lets the driver stop once
        /// the last lane has closed; no new connections are made.
        pub fn close(&self) {
            self.endpoint.close();
            self.handle.send(Command::Shutdown);
        }

        /// Stops every connection at once and stops the driver.
        pub fn abort(&self) {
            self.endpoint.abort();
            self.handle.send(Command::Abort);
        }
    }
}
