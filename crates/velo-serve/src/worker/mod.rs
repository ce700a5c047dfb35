//! The worker role: mock engines (velo-bench's, Dynamo's mocker timing model) behind the
//! request plane ([`crate::work`]), answering on the response plane, registered in discovery.
//!
//! Start-up order: the response plane (a broken transport fails here), the engines, the
//! request listener, then the discovery record, so a frontend never finds a worker that cannot
//! serve. Shutdown is the reverse: leave discovery first (frontends stop routing here), let the
//! open streams finish within a grace period, then close the plane.

pub mod engine;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use runtime_glue::{ResponseService, ServiceConfig, ShutdownReport, StartupError};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_bench::worker::{Engines, WorkerOpts};

use engine::ServeEngine;
pub use engine::WorkerStats;

use crate::discovery::lease::Lease;
use crate::discovery::{DiscoveryConfig, Instance, Transport};
use crate::work::{IntakeStats, RequestAuth, SecretError, WorkLimitError, WorkLimits};

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The response-plane service (plane settings, metrics endpoint, grace, teardown bound).
    pub service: ServiceConfig,
    /// Where to register.
    pub discovery: DiscoveryConfig,
    /// Mock engines in this process.
    pub engines: u32,
    /// The mocker's speedup ratio (passes take `1/speedup` of the model's time).
    pub speedup: f64,
    /// The address the request plane listens on (port chosen by the OS) and advertises.
    pub host: IpAddr,
    /// Flush the plane once per engine forward pass.
    pub flush_per_pass: bool,
    /// What the request plane may hold: requests and connections at once.
    pub work_limits: WorkLimits,
}

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The response-plane service could not start.
    #[error(transparent)]
    Service(#[from] StartupError),
    /// The service's configuration could not take this worker's instance id.
    #[error(transparent)]
    Config(#[from] response_plane::ConfigError),
    /// A request-plane bound is out of range.
    #[error(transparent)]
    Limits(#[from] WorkLimitError),
    /// The cluster secret for the request plane could not be read.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The service was configured without the worker role.
    #[error("the response-plane service does not run the worker role")]
    NotAWorker,
    /// The request listener could not bind.
    #[error("cannot listen for requests on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The discovery record could not be written.
    #[error("cannot register in discovery under {dir}: {source}")]
    Discovery {
        /// The bucket directory.
        dir: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A running worker.
#[derive(Debug)]
pub struct Worker {
    instance: Instance,
    addr: SocketAddr,
    lease: Option<Lease>,
    stats: Arc<WorkerStats>,
    intake: Arc<IntakeStats>,
    service: ResponseService,
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl Worker {
    /// Starts serving and registers in discovery.
    ///
    /// # Errors
    ///
    /// [`WorkerError`] naming what could not start.
    pub async fn start(config: WorkerConfig) -> Result<Self, WorkerError> {
        config.work_limits.validate()?;
        // The response plane's secret and TLS guard the request plane too.
        let auth = RequestAuth::from_config(
            config.service.response_plane(),
            crate::work::auth::Side::Worker,
        )?;
        let tracker = TaskTracker::new();
        let instance_id = new_instance_id();
        // Frontends name the instance they mean: one meant for another is refused.
        let auth = auth.with_instance(instance_id);
        let service = ResponseService::start(announcing(&config.service, instance_id)?).await?;
        let plane = service.worker().cloned().ok_or(WorkerError::NotAWorker)?;
        let stats = Arc::new(WorkerStats::default());
        let opts = WorkerOpts {
            engines: config.engines.max(1),
            speedup: config.speedup,
            flush_per_pass: config.flush_per_pass,
        };
        let engines = Engines::start(
            Arc::new(ServeEngine::new(plane.clone(), stats.clone())),
            opts,
        );
        let bind = SocketAddr::new(config.host, 0);
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|source| WorkerError::Bind { addr: bind, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| WorkerError::Bind { addr: bind, source })?;
        let instance = Instance {
            namespace: config.discovery.namespace.clone(),
            component: config.discovery.component.clone(),
            endpoint: config.discovery.endpoint.clone(),
            instance_id,
            transport: Transport::Tcp(addr.to_string()),
        };
        // Published before any task is spawned, so a failure leaves nothing running (the
        // listener is bound: a frontend that connects at once waits in its backlog).
        let lease = Lease::publish(&config.discovery, &instance).map_err(|source| {
            WorkerError::Discovery {
                dir: config.discovery.dir(),
                source,
            }
        })?;
        let stop = CancellationToken::new();
        let spawner = tracker.clone();
        // One task per request read: at most `work_limits.max_requests` of them, since the
        // frame (kept by the request's sink until its stream ends) holds the request's place.
        let deliver = move |frame| {
            let engines = engines.clone();
            spawner.spawn(async move { engines.serve(frame).await });
        };
        // A rotated trust or identity reaches new request-plane connections, as the plane's.
        crate::work::watch_tls(&auth, &tracker, stop.clone());
        let intake = Arc::new(IntakeStats::default());
        tracker.spawn(crate::work::serve(
            listener,
            config.work_limits,
            auth,
            intake.clone(),
            tracker.clone(),
            stop.clone(),
            deliver,
        ));
        tracing::info!(instance = format!("{:x}", instance.instance_id), %addr, plane = plane.plane().name(), "worker serving");
        Ok(Self {
            instance,
            addr,
            lease: Some(lease),
            stats,
            intake,
            service,
            stop,
            tracker,
        })
    }

    /// The discovery instance id.
    pub fn instance_id(&self) -> u64 {
        self.instance.instance_id
    }

    /// Where the request plane listens.
    pub fn address(&self) -> SocketAddr {
        self.addr
    }

    /// The engines' counters.
    pub fn stats(&self) -> &Arc<WorkerStats> {
        &self.stats
    }

    /// The request plane's counters.
    pub fn intake_stats(&self) -> &Arc<IntakeStats> {
        &self.intake
    }

    /// Deletes the discovery record (frontends stop sending requests here).
    pub fn leave_discovery(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.close();
        }
    }

    /// The response-plane service (its metrics, its worker plane).
    pub fn service(&self) -> &ResponseService {
        &self.service
    }

    /// Shuts down: leaves discovery, stops taking requests, then the service's bounded
    /// shutdown (open streams get its grace period to finish, the teardown its hard timeout).
    pub async fn shutdown(mut self) -> ShutdownReport {
        self.leave_discovery();
        self.stop.cancel();
        let report = self.service.shutdown().await;
        self.tracker.close();
        let bound = self.service.config().grace();
        let _ = tokio::time::timeout(bound, self.tracker.wait()).await;
        report
    }

    /// Stops at once, as a crash would, but in-process: the discovery record stays behind
    /// (it expires), every connection is cut.
    pub fn abort(mut self) {
        if let Some(lease) = self.lease.take() {
            lease.abandon();
        }
        self.stop.cancel();
        if let Some(w) = self.service.worker() {
            w.abort();
        }
        self.tracker.close();
    }
}

/// `service` with its plane announcing `instance_id`: the frontend ties each request's stream
/// to the instance it sent the request to, and opens it only to the connection that announced
/// that instance.
fn announcing(service: &ServiceConfig, instance_id: u64) -> Result<ServiceConfig, WorkerError> {
    let plane = service
        .response_plane()
        .to_builder()
        .worker_instance(Some(instance_id))
        .build()?;
    Ok(service.to_builder().response_plane(plane).build()?)
}

/// A random, non-zero instance id.
fn new_instance_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}
