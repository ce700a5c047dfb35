//! The response-plane service: one per process, shared by every runtime and endpoint in it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use response_plane::{
    ConnectionInfo, FrontendPlane, PendingResponse, RegisterOptions, ResponseError, ResponseSender,
    WorkerPlane,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::metrics::{Metrics, Telemetry};
use crate::shutdown::{self, ShutdownPlan, ShutdownReport};
use crate::{ServiceConfig, StartupError};

/// The process's response plane, created once at startup before any endpoint registers, and
/// shared by cheap clones.
///
/// Every setup failure surfaces from [`start`](Self::start): a bad setting, a listener that
/// cannot bind, a transport missing from this build or failing to initialise. A worker whose
/// transport is broken therefore never registers endpoints and then stalls requests.
#[derive(Clone)]
pub struct ResponseService {
    inner: Arc<Inner>,
}

struct Inner {
    config: ServiceConfig,
    frontend: Option<FrontendPlane>,
    worker: Option<WorkerPlane>,
    tracker: TaskTracker,
    metrics: Arc<Metrics>,
    accepting: AtomicBool,
    metrics_addr: Option<SocketAddr>,
    metrics_stop: CancellationToken,
    metrics_tracker: TaskTracker,
    /// Stops the SIGHUP reload task (cancelled by shutdown, or when the service is dropped).
    _reload_stop: tokio_util::sync::DropGuard,
    reload_stop: CancellationToken,
}

impl ResponseService {
    /// Starts the planes `config` asks for and, if configured, the metrics endpoint.
    ///
    /// # Errors
    ///
    /// [`StartupError`] naming the cause.
    pub async fn start(config: ServiceConfig) -> Result<Self, StartupError> {
        let tracker = TaskTracker::new();
        let plane = config.response_plane();
        let telemetry = Telemetry::new()?;
        let span = tracing::info_span!("response_plane.start", plane = plane.plane().name());
        let (frontend, worker) = async {
            let role = config.role();
            let frontend = match role.frontend() {
                true => Some(
                    FrontendPlane::bind_observed(
                        plane.clone(),
                        tracker.clone(),
                        Some(telemetry.setup_observer(crate::metrics::FRONTEND)),
                    )
                    .await?,
                ),
                false => None,
            };
            let worker = match role.worker() {
                true => Some(WorkerPlane::new_observed(
                    plane.clone(),
                    tracker.clone(),
                    Some(telemetry.setup_observer(crate::metrics::WORKER)),
                )?),
                false => None,
            };
            Ok::<_, StartupError>((frontend, worker))
        }
        .instrument(span)
        .await?;
        let metrics = Arc::new(Metrics::new(telemetry, frontend.clone(), worker.clone()));
        let (metrics_stop, metrics_tracker) = (CancellationToken::new(), TaskTracker::new());
        let metrics_addr = match config.metrics_addr() {
            None => None,
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartupError::Metrics {
                        addr,
                        source: Arc::new(source),
                    })?;
                let bound = listener
                    .local_addr()
                    .map_err(|source| StartupError::Metrics {
                        addr,
                        source: Arc::new(source),
                    })?;
                metrics_tracker.spawn(crate::http::serve(
                    listener,
                    metrics.clone(),
                    metrics_tracker.clone(),
                    metrics_stop.clone(),
                ));
                Some(bound)
            }
        };
        tracing::info!(
            plane = config.response_plane().plane().name(),
            role = ?config.role(),
            metrics = ?metrics_addr,
            "response plane started"
        );
        let reload_stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            config,
            frontend,
            worker,
            tracker,
            metrics,
            accepting: AtomicBool::new(true),
            metrics_addr,
            metrics_stop,
            metrics_tracker,
            _reload_stop: reload_stop.clone().drop_guard(),
            reload_stop,
        });
        #[cfg(unix)]
        if inner.config.response_plane().tls().is_enabled() {
            let weak = Arc::downgrade(&inner);
            let reload = move || weak.upgrade().map(|inner| inner.reload_tls());
            crate::reload::on_sighup(reload, inner.reload_stop.clone(), &inner.tracker)
                .map_err(|e| StartupError::Signal(Arc::new(e)))?;
        }
        Ok(Self { inner })
    }

    /// The configuration the service runs with.
    pub fn config(&self) -> &ServiceConfig {
        &self.inner.config
    }

    /// The frontend plane, when this process is a frontend.
    pub fn frontend(&self) -> Option<&FrontendPlane> {
        self.inner.frontend.as_ref()
    }

    /// The worker plane, when this process is a worker.
    pub fn worker(&self) -> Option<&WorkerPlane> {
        self.inner.worker.as_ref()
    }

    /// Where the metrics endpoint listens.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.inner.metrics_addr
    }

    /// The metrics, in the Prometheus text format (what the endpoint serves).
    pub fn render_metrics(&self) -> String {
        self.inner.metrics.render()
    }

    /// Frontend: registers a response stream (see [`FrontendPlane::register`]). The plane
    /// counts its setup time, failures and time in flight for the metrics and the shutdown.
    ///
    /// # Errors
    ///
    /// `Closed` once shutdown began or when this process is no frontend; the plane's errors.
    pub fn register<T: DeserializeOwned>(
        &self,
        opts: RegisterOptions,
    ) -> Result<(ConnectionInfo, PendingResponse<T>), ResponseError> {
        self.inner
            .frontend
            .as_ref()
            .filter(|_| self.accepting())
            .ok_or(ResponseError::Closed)?
            .register(opts)
    }

    /// Frontend: ends every pending stream of a worker instance that left discovery.
    pub fn cancel_instance_streams(&self, worker_instance: u64) -> usize {
        self.inner
            .frontend
            .as_ref()
            .map_or(0, |f| f.cancel_instance_streams(worker_instance))
    }

    /// Worker: prepares the response stream addressed by `info` (see
    /// [`WorkerPlane::connect`]). A failure here counts as a `response_stream` error.
    ///
    /// # Errors
    ///
    /// `Closed` once shutdown began or when this process is no worker; the plane's errors.
    pub async fn connect<T: Serialize>(
        &self,
        info: &ConnectionInfo,
    ) -> Result<ResponseSender<T>, ResponseError> {
        let worker = self
            .inner
            .worker
            .as_ref()
            .filter(|_| self.accepting())
            .ok_or(ResponseError::Closed)?;
        let span = tracing::debug_span!("response_stream.setup", side = "worker", transport = %info.transport);
        let r = worker.connect::<T>(info).instrument(span).await;
        if let Err(e) = &r {
            tracing::debug!(error = %e, "response stream setup failed");
        }
        r
    }

    /// Rereads the TLS files (`DYN_TCP_TLS_*`) of every plane this service runs: connections
    /// already up keep their session, new ones use the new certificates. The planes also
    /// reread them on their own when the files change
    /// ([`TLS_WATCH_INTERVAL`](response_plane::TLS_WATCH_INTERVAL)), and a service with TLS
    /// rereads them on SIGHUP. Nothing to do without TLS.
    ///
    /// # Errors
    ///
    /// The [`ConfigError`](response_plane::ConfigError) naming the variable whose file does
    /// not load; the certificates in use stay.
    pub fn reload_tls(&self) -> Result<(), response_plane::ConfigError> {
        self.inner.reload_tls()
    }

    /// Worker: the once-per-forward-pass flush hint.
    pub fn flush(&self) {
        if let Some(w) = &self.inner.worker {
            w.flush();
        }
    }

    /// Shuts down, bounded: stop accepting, let open streams finish within the grace period,
    /// tear the transports down in their own task under the hard timeout, report what was
    /// cut short. Never hangs.
    pub async fn shutdown(&self) -> ShutdownReport {
        let inner = self.inner.clone();
        inner.reload_stop.cancel();
        let stop = {
            let inner = inner.clone();
            Box::new(move || {
                inner.accepting.store(false, Ordering::Release);
                if let Some(f) = &inner.frontend {
                    f.go_away();
                }
            })
        };
        let drained = {
            let (frontend, worker) = (inner.frontend.clone(), inner.worker.clone());
            Box::pin(async move {
                if let Some(f) = &frontend {
                    f.drained().await;
                }
                if let Some(w) = &worker {
                    w.drained().await;
                }
            })
        };
        let still_open = {
            let inner = inner.clone();
            Box::new(move || inner.streams_in_flight())
        };
        let mut teardown: Vec<(&'static str, shutdown::Step)> = Vec::new();
        if let Some(f) = inner.frontend.clone() {
            teardown.push(("frontend", Box::pin(async move { f.shutdown().await })));
        }
        if let Some(w) = inner.worker.clone() {
            teardown.push(("worker", Box::pin(async move { w.close() })));
        }
        let tracker = inner.tracker.clone();
        teardown.push((
            "transport tasks",
            Box::pin(async move {
                tracker.close();
                tracker.wait().await;
            }),
        ));
        let abort = {
            let inner = inner.clone();
            Box::new(move || {
                if let Some(f) = &inner.frontend {
                    f.abort();
                }
                if let Some(w) = &inner.worker {
                    w.abort();
                }
            })
        };
        let plan = ShutdownPlan {
            stop_accepting: stop,
            drained,
            grace: inner.config.grace(),
            still_open,
            teardown,
            teardown_timeout: inner.config.teardown_timeout(),
            abort,
        };
        let report = shutdown::run(plan).await;
        inner.metrics.shutdown(report.outcome());
        tracing::info!(outcome = report.outcome(), elapsed = ?report.elapsed, streams_cut = report.streams_cut, "response plane shut down");
        inner.metrics_stop.cancel();
        inner.metrics_tracker.close();
        report
    }

    /// Streams handed out on either side and not yet ended or dropped.
    pub fn streams_in_flight(&self) -> u64 {
        self.inner.streams_in_flight()
    }

    fn accepting(&self) -> bool {
        self.inner.accepting.load(Ordering::Acquire)
    }
}

impl std::fmt::Debug for ResponseService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseService")
            .field("plane", &self.inner.config.response_plane().plane())
            .field("role", &self.inner.config.role())
            .field("metrics", &self.inner.metrics_addr)
            .finish()
    }
}

impl Inner {
    fn reload_tls(&self) -> Result<(), response_plane::ConfigError> {
        if let Some(f) = &self.frontend {
            f.reload_tls()?;
        }
        if let Some(w) = &self.worker {
            w.reload_tls()?;
        }
        Ok(())
    }

    fn streams_in_flight(&self) -> u64 {
        let f = self
            .frontend
            .as_ref()
            .map_or(0, |f| f.stats().streams_in_flight);
        let w = self
            .worker
            .as_ref()
            .map_or(0, |w| w.stats().streams_in_flight);
        f + w
    }
}
