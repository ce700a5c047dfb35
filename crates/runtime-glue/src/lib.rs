//! What a serving runtime embeds: one response-plane service per process, configured from the
//! environment (with command-line overrides), with OpenTelemetry metrics on a Prometheus
//! endpoint and a bounded shutdown.
//!
//! # Layer contract
//!
//! The top library layer: it is the only crate that picks transport features (`tcp`, `ucx`)
//! and the only one that touches a metrics crate. Its tasks (the metrics endpoint, the
//! teardown) are tracked and bounded; shutdown never hangs.
//!
//! # Metrics endpoint
//!
//! `GET /metrics` serves at most 64 connections at once; past that it stops accepting, and
//! clients wait in the listen backlog until a connection ends. A connection that has not sent
//! a whole request head within 5 s (counting idle time between kept-alive requests) is
//! closed, and any connection after 30 s: clients that connect and say nothing cannot grow
//! the process, and a scrape queued behind them is served once they time out.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), runtime_glue::StartupError> {
//! use runtime_glue::{ResponseService, Role, ServiceConfig};
//!
//! // At startup, before any endpoint registers: a bad setting or a broken transport fails here.
//! let service = ResponseService::start(ServiceConfig::from_env(Role::Worker)?).await?;
//! // ... serve requests with service.connect(&info) ...
//! let report = service.shutdown().await;
//! println!("shutdown: {}", report.outcome());
//! # Ok(()) }
//! ```

mod config;
mod http;
mod metrics;
#[cfg(unix)]
mod reload;
mod service;
pub mod shutdown;

use std::net::SocketAddr;
use std::sync::Arc;

pub use config::{
    DEFAULT_GRACE, DEFAULT_TEARDOWN_TIMEOUT, ENV_GRACE_MS, ENV_METRICS_ADDR, ENV_TEARDOWN_MS,
    MAX_SHUTDOWN_WAIT, Role, ServiceArgs, ServiceConfig, ServiceConfigBuilder,
};
pub use metrics::SETUP_SECONDS_BOUNDARIES;
pub use service::ResponseService;
pub use shutdown::{ShutdownReport, TeardownOutcome};

/// Why the service could not start. Each variant names its cause.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    /// A setting is invalid, the plane's or the runtime's own (including `ucx` in a build
    /// without it).
    #[error(transparent)]
    Config(#[from] response_plane::ConfigError),
    /// The plane could not start: listener bind failure, transport missing from this build,
    /// transport initialisation failure.
    #[error(transparent)]
    Plane(#[from] response_plane::StartError),
    /// The metrics endpoint could not listen.
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The SIGHUP handler that reloads the TLS files could not be installed.
    #[error("cannot install the SIGHUP handler that reloads TLS files: {0}")]
    Signal(#[source] Arc<std::io::Error>),
    /// The telemetry pipeline could not be built.
    #[error("cannot set up metrics")]
    Telemetry(#[source] Arc<opentelemetry_sdk::error::OTelSdkError>),
}
