//! The response-plane service: one per process, shared by every runtime and endpoint in it.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use response_plane::{
    ConnectionInfo, FrontendPlane, PendingResponse, RegisterOptions, ResponseError, ResponseSender,
    ResponseStream, StreamContext, TypedError, WorkerPlane,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::metrics::{Active, Metrics};
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
    active: Arc<Active>,
    accepting: AtomicBool,
    metrics_addr: Option<SocketAddr>,
    metrics_stop: CancellationToken,
    metrics_tracker: TaskTracker,
}

impl ResponseService {
    /// Starts the planes `config` asks for and, if configured, the metrics endpoint.
    ///
    /// # Errors
    ///
    /// [`StartupError`] naming the cause.
    pub async fn start(config: ServiceConfig) -> Result<Self, StartupError> {
        let tracker = TaskTracker::new();
        let span = tracing::info_span!("response_plane.start", plane = config.plane.plane().name());
        let (frontend, worker) = async {
            let frontend = match config.roles.frontend {
                true => Some(FrontendPlane::bind(config.plane.clone(), tracker.clone()).await?),
                false => None,
            };
            let worker = match config.roles.worker {
                true => Some(WorkerPlane::new(config.plane.clone(), tracker.clone())?),
                false => None,
            };
            Ok::<_, StartupError>((frontend, worker))
        }
        .instrument(span)
        .await?;
        let active = Arc::new(Active::default());
        let metrics = Arc::new(Metrics::new(
            frontend.clone(),
            worker.clone(),
            active.clone(),
        )?);
        let (metrics_stop, metrics_tracker) = (CancellationToken::new(), TaskTracker::new());
        let metrics_addr = match config.metrics_addr {
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
            plane = config.plane.plane().name(),
            frontend = config.roles.frontend,
            worker = config.roles.worker,
            metrics = ?metrics_addr,
            "response plane started"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                frontend,
                worker,
                tracker,
                metrics,
                active,
                accepting: AtomicBool::new(true),
                metrics_addr,
                metrics_stop,
                metrics_tracker,
            }),
        })
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

    /// Frontend: registers a response stream (see [`FrontendPlane::register`]).
    ///
    /// # Errors
    ///
    /// `Closed` once shutdown began or when this process is no frontend; the plane's errors.
    pub fn register<T: DeserializeOwned>(
        &self,
        opts: RegisterOptions,
    ) -> Result<(ConnectionInfo, ServicePending<T>), ResponseError> {
        let frontend = self
            .inner
            .frontend
            .as_ref()
            .filter(|_| self.accepting())
            .ok_or(ResponseError::Closed)?;
        let (info, pending) = frontend.register(opts)?;
        Ok((
            info,
            ServicePending {
                pending,
                service: self.inner.clone(),
                started: Instant::now(),
            },
        ))
    }

    /// Frontend: ends every pending stream of a worker instance that left discovery.
    pub fn cancel_instance_streams(&self, worker_instance: u64) -> usize {
        self.inner
            .frontend
            .as_ref()
            .map_or(0, |f| f.cancel_instance_streams(worker_instance))
    }

    /// Worker: prepares the response stream addressed by `info` (see [`WorkerPlane::connect`]).
    /// A failure here counts as a `response_stream` error.
    ///
    /// # Errors
    ///
    /// `Closed` once shutdown began or when this process is no worker; the plane's errors.
    pub async fn connect<T: Serialize>(
        &self,
        info: &ConnectionInfo,
    ) -> Result<ServiceSender<T>, ResponseError> {
        let worker = self
            .inner
            .worker
            .as_ref()
            .filter(|_| self.accepting())
            .ok_or(ResponseError::Closed)?;
        let started = Instant::now();
        let span = tracing::debug_span!("response_stream.setup", side = "worker", transport = %info.transport);
        match worker.connect::<T>(info).instrument(span).await {
            Ok(sender) => {
                self.inner
                    .metrics
                    .setup_time("worker", started.elapsed().as_secs_f64());
                let guard = ActiveGuard::new(&self.inner.active, Side::Worker);
                Ok(ServiceSender {
                    sender: Some(sender),
                    service: self.inner.clone(),
                    _guard: guard,
                })
            }
            Err(e) => {
                self.inner.metrics.stream_error();
                tracing::debug!(error = %e, "response stream setup failed");
                Err(e)
            }
        }
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
            let active = inner.active.clone();
            Box::pin(async move { active.wait_zero().await })
        };
        let still_open = {
            let active = inner.active.clone();
            Box::new(move || active.total())
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
            grace: inner.config.grace,
            still_open,
            teardown,
            teardown_timeout: inner.config.teardown_timeout,
            abort,
        };
        let report = shutdown::run(plan).await;
        inner.metrics.shutdown(report.outcome());
        tracing::info!(outcome = report.outcome(), elapsed = ?report.elapsed, streams_cut = report.streams_cut, "response plane shut down");
        inner.metrics_stop.cancel();
        inner.metrics_tracker.close();
        report
    }

    fn accepting(&self) -> bool {
        self.inner.accepting.load(Ordering::Acquire)
    }
}

impl std::fmt::Debug for ResponseService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseService")
            .field("plane", &self.inner.config.plane.plane())
            .field("roles", &self.inner.config.roles)
            .field("metrics", &self.inner.metrics_addr)
            .finish()
    }
}

#[derive(Debug, Clone, Copy)]
enum Side {
    Frontend,
    Worker,
}

/// Counts a stream in flight for as long as its handle lives.
struct ActiveGuard {
    active: Arc<Active>,
    side: Side,
}

impl ActiveGuard {
    fn new(active: &Arc<Active>, side: Side) -> Self {
        Self::counter(active, side).fetch_add(1, Ordering::AcqRel);
        Self {
            active: active.clone(),
            side,
        }
    }

    fn counter(active: &Active, side: Side) -> &AtomicU64 {
        match side {
            Side::Frontend => &active.frontend,
            Side::Worker => &active.worker,
        }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        Self::counter(&self.active, self.side).fetch_sub(1, Ordering::AcqRel);
        if self.active.total() == 0 {
            self.active.zero.notify_waiters();
        }
    }
}

/// A registered stream waiting for its prologue; see [`PendingResponse`].
pub struct ServicePending<T> {
    pending: PendingResponse<T>,
    service: Arc<Inner>,
    started: Instant,
}

impl<T: DeserializeOwned> ServicePending<T> {
    /// See [`PendingResponse::associate`].
    ///
    /// # Errors
    ///
    /// `Disconnected` if the instance was removed in the last 5 s.
    pub fn associate(&self, worker_instance: u64) -> Result<(), ResponseError> {
        self.pending.associate(worker_instance)
    }

    /// Waits for the prologue; a failure counts as a `response_stream` error.
    ///
    /// # Errors
    ///
    /// See [`PendingResponse::established`].
    pub async fn established(self) -> Result<ServiceStream<T>, ResponseError> {
        let Self {
            pending,
            service,
            started,
        } = self;
        let span = tracing::debug_span!("response_stream.setup", side = "frontend");
        match pending.established().instrument(span).await {
            Ok(stream) => {
                service
                    .metrics
                    .setup_time("frontend", started.elapsed().as_secs_f64());
                let guard = ActiveGuard::new(&service.active, Side::Frontend);
                Ok(ServiceStream {
                    stream,
                    service,
                    guard: Some(guard),
                })
            }
            Err(e) => {
                if e != ResponseError::Closed {
                    service.metrics.stream_error();
                }
                Err(e)
            }
        }
    }
}

/// A response stream read through the service; failures are counted. Dereferences to the
/// [`ResponseStream`] for `stop` and `kill`.
pub struct ServiceStream<T> {
    stream: ResponseStream<T>,
    service: Arc<Inner>,
    /// Counts the stream as open until it has ended (or is dropped): a finished stream the
    /// application still holds does not keep shutdown's drain waiting.
    guard: Option<ActiveGuard>,
}

impl<T> std::ops::Deref for ServiceStream<T> {
    type Target = ResponseStream<T>;
    fn deref(&self) -> &Self::Target {
        &self.stream
    }
}

impl<T> std::ops::DerefMut for ServiceStream<T> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.stream
    }
}

impl<T: DeserializeOwned> Stream for ServiceStream<T> {
    type Item = Result<T, ResponseError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Every field is `Unpin`.
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_next(cx);
        match &r {
            Poll::Ready(Some(Err(e))) => {
                if !e.is_cancelled() {
                    this.service.metrics.stream_error();
                }
                this.guard = None;
            }
            Poll::Ready(None) => this.guard = None,
            Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
        }
        r
    }
}

/// A response stream written through the service; failures other than cancellation are
/// counted. Dropping it without [`finish`](Self::finish) ends the stream abnormally.
pub struct ServiceSender<T> {
    sender: Option<ResponseSender<T>>,
    service: Arc<Inner>,
    _guard: ActiveGuard,
}

impl<T: Serialize> ServiceSender<T> {
    /// See [`ResponseSender::send_prologue`].
    ///
    /// # Errors
    ///
    /// As there.
    pub async fn send_prologue(
        &mut self,
        result: Result<(), TypedError>,
    ) -> Result<(), ResponseError> {
        let r = self.inner()?.send_prologue(result).await;
        self.count(r)
    }

    /// See [`ResponseSender::send`].
    ///
    /// # Errors
    ///
    /// As there.
    pub async fn send(&mut self, item: &T) -> Result<(), ResponseError> {
        let r = self.inner()?.send(item).await;
        self.count(r)
    }

    /// See [`ResponseSender::finish`].
    ///
    /// # Errors
    ///
    /// As there.
    pub async fn finish(mut self) -> Result<(), ResponseError> {
        let sender = self
            .sender
            .take()
            .ok_or(ResponseError::Prologue("the stream has ended"))?;
        let r = sender.finish().await;
        self.count(r)
    }

    /// The stream's stop and kill signals.
    ///
    /// # Panics
    ///
    /// Never: the sender is only taken by `finish`, which consumes `self`.
    pub fn context(&self) -> StreamContext {
        self.sender
            .as_ref()
            .expect("present until finish")
            .context()
    }

    fn inner(&mut self) -> Result<&mut ResponseSender<T>, ResponseError> {
        self.sender
            .as_mut()
            .ok_or(ResponseError::Prologue("the stream has ended"))
    }

    fn count(&self, r: Result<(), ResponseError>) -> Result<(), ResponseError> {
        if let Err(e) = &r
            && !e.is_cancelled()
        {
            self.service.metrics.stream_error();
        }
        r
    }
}

impl<T> std::fmt::Debug for ServicePending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServicePending")
            .field("pending", &self.pending)
            .finish()
    }
}

impl<T> std::fmt::Debug for ServiceStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceStream")
            .field("stream", &self.stream)
            .finish()
    }
}

impl<T> std::fmt::Debug for ServiceSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSender")
            .field("sender", &self.sender)
            .finish()
    }
}
