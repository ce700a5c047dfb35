//! The frontend role: an OpenAI-compatible HTTP server (axum) in front of the response plane,
//! routing to the workers discovery reports.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (SSE streaming or not),
//! `GET /v1/models`, `GET /health`, `GET /metrics`. A request is parsed and checked
//! ([`crate::openai`]; 400 or 404 with an OpenAI error object), admitted ([`admission`]; 503
//! with `Retry-After` past the bounded queue), dispatched to a worker ([`dispatch`]; retried on
//! another worker when its worker left before answering), and answered ([`respond`]).
//!
//! Why axum: it is hyper underneath (HTTP/1.1, chunked streaming bodies without buffering)
//! with routing, extractors and graceful shutdown already written and maintained by the tokio
//! project; this crate would otherwise re-implement exactly those on hyper.

pub mod admission;
pub mod dispatch;
pub mod http;
pub mod metrics;
pub mod pool;
pub mod respond;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use response_plane::FrontendPlane;
use runtime_glue::{ResponseService, ServiceConfig, StartupError};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use admission::{Admission, AdmissionLimits};
use http::HttpLimits;
use metrics::{FrontendMetrics, Outcome};
use pool::Pool;
use respond::Accounting;

use crate::discovery::DiscoveryConfig;
use crate::openai::{ApiError, Endpoint, Limits};

/// Largest request body accepted by default, in bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;
/// How long a request waits for its worker's prologue by default.
pub const DEFAULT_ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// Workers tried per request by default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// How a frontend runs.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// Where HTTP listens.
    pub http: SocketAddr,
    /// The model name served (and listed by `/v1/models`).
    pub model: String,
    /// Token limits per request.
    pub limits: Limits,
    /// Admission limits.
    pub admission: AdmissionLimits,
    /// How long a request waits for a worker's prologue, in all: every attempt (sending the
    /// request included) shares it.
    pub establish_timeout: Duration,
    /// Workers tried per request.
    pub max_attempts: u32,
    /// How long a removed worker's open streams may keep generating.
    pub removal_grace: Duration,
    /// How long a request's stream may go without an item (the first included) before the
    /// request fails with 504: an engine stalled on a worker that is still alive and listed.
    pub item_timeout: Duration,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// The HTTP server's bounds: connections, header and body read timeouts.
    pub http_limits: HttpLimits,
    /// The response-plane service (plane settings, grace, teardown bound).
    pub service: ServiceConfig,
    /// Run the response plane's tasks on a thread of their own (`velo-plane`), so its CPU time
    /// can be told apart from the HTTP side's.
    pub plane_thread: bool,
    /// Where workers are found.
    pub discovery: DiscoveryConfig,
}

/// Why a frontend could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrontendError {
    /// The response-plane service could not start.
    #[error(transparent)]
    Service(#[from] StartupError),
    /// The plane's own thread could not start.
    #[error("cannot start the response plane's thread: {0}")]
    PlaneThread(#[source] std::io::Error),
    /// The HTTP listener could not bind.
    #[error("cannot listen for HTTP on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The budget for request bodies in flight is below the largest body: such a body could
    /// never be read.
    #[error(
        "http_limits.body_budget_bytes ({budget}) must be at least max_body_bytes ({max_body}): \
         a body of the largest size allowed could never be read"
    )]
    BodyBudget {
        /// `http_limits.body_budget_bytes`.
        budget: usize,
        /// `max_body_bytes`.
        max_body: usize,
    },
    /// The service was configured without the frontend role.
    #[error("the response-plane service does not run the frontend role")]
    NotAFrontend,
    /// The cluster secret for the request plane could not be read.
    #[error(transparent)]
    Secret(#[from] crate::work::SecretError),
    /// Discovery could not be watched.
    #[error("cannot watch discovery under {dir}: {source}")]
    Discovery {
        /// The bucket directory.
        dir: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What every handler shares.
#[derive(Clone)]
pub struct State(Arc<Shared>);

/// See [`State`].
pub struct Shared {
    /// The configuration.
    pub config: FrontendConfig,
    /// The response-plane service (metrics, shutdown).
    pub service: ResponseService,
    /// Its frontend plane.
    pub plane: FrontendPlane,
    /// The routable workers.
    pub pool: Arc<Pool>,
    /// The admission gate.
    pub admission: Admission,
    /// HTTP metrics.
    pub metrics: FrontendMetrics,
    /// Where request tasks run.
    pub tracker: TaskTracker,
    /// The memory reserved for request bodies being read.
    pub bodies: http::BodyBudget,
    next_id: AtomicU64,
}

impl std::ops::Deref for State {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// A running frontend.
pub struct Frontend {
    addr: SocketAddr,
    state: State,
    stop: CancellationToken,
    tracker: TaskTracker,
    plane_thread: Option<PlaneThread>,
}

impl Frontend {
    /// Starts the response-plane service and HTTP, follows discovery and serves.
    ///
    /// # Errors
    ///
    /// [`FrontendError`] naming what could not start.
    pub async fn start(config: FrontendConfig) -> Result<Self, FrontendError> {
        if config.http_limits.body_budget_bytes < config.max_body_bytes {
            return Err(FrontendError::BodyBudget {
                budget: config.http_limits.body_budget_bytes,
                max_body: config.max_body_bytes,
            });
        }
        // The response plane's secret and TLS guard the request plane too.
        let auth = crate::work::RequestAuth::from_config(
            config.service.response_plane(),
            crate::work::auth::Side::Frontend,
        )?;
        let (service, plane_thread) = if config.plane_thread {
            let t = PlaneThread::start(config.service.clone())?;
            (t.service.clone(), Some(t))
        } else {
            (ResponseService::start(config.service.clone()).await?, None)
        };
        let plane = service
            .frontend()
            .cloned()
            .ok_or(FrontendError::NotAFrontend)?;
        let tracker = TaskTracker::new();
        let stop = CancellationToken::new();
        let bind = |source| FrontendError::Bind {
            addr: config.http,
            source,
        };
        let listener = TcpListener::bind(config.http).await.map_err(bind)?;
        let addr = listener.local_addr().map_err(bind)?;
        let pool = Pool::new(config.removal_grace);
        let (changes, forget, _watching) =
            crate::discovery::watch::start(config.discovery.clone(), &tracker, stop.clone())
                .map_err(|source| FrontendError::Discovery {
                    dir: config.discovery.dir(),
                    source,
                })?;
        // A rotated certificate reaches new request-plane connections, as the plane's lanes.
        crate::work::watch_tls(&auth, &tracker, stop.clone());
        let follow = pool::follow(
            pool.clone(),
            plane.clone(),
            auth,
            changes,
            forget,
            tracker.clone(),
            stop.clone(),
        );
        tracker.spawn(follow);
        let bodies = http::BodyBudget::new(&config.http_limits);
        let state = State(Arc::new(Shared {
            admission: Admission::new(config.admission),
            metrics: FrontendMetrics::new(&config.model),
            config,
            service,
            plane,
            pool,
            tracker: tracker.clone(),
            bodies,
            next_id: AtomicU64::new(1),
        }));
        let app = router(state.clone());
        let limits = state.config.http_limits;
        tracker.spawn(http::serve(
            listener,
            app,
            limits,
            tracker.clone(),
            stop.clone(),
        ));
        tracing::info!(%addr, plane = state.plane.plane().name(), "frontend serving");
        Ok(Self {
            addr,
            state,
            stop,
            tracker,
            plane_thread,
        })
    }

    /// Where HTTP listens.
    pub fn address(&self) -> SocketAddr {
        self.addr
    }

    /// The shared state (plane, pool, metrics).
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Stops serving: no new HTTP connections, then the service's bounded shutdown (open
    /// streams get its grace period, the teardown its hard timeout).
    pub async fn shutdown(self) -> runtime_glue::ShutdownReport {
        self.stop.cancel();
        self.tracker.close();
        let report = self.state.service.shutdown().await;
        let bound = self.state.config.service.grace();
        let _ = tokio::time::timeout(bound, self.tracker.wait()).await;
        if let Some(t) = self.plane_thread {
            t.stop();
        }
        report
    }
}

/// The response plane's service on a thread of its own (a single-threaded runtime named
/// `velo-plane`): its lane tasks run there, while the HTTP side reads the streams on its own
/// threads.
struct PlaneThread {
    service: ResponseService,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PlaneThread {
    fn start(config: ServiceConfig) -> Result<Self, FrontendError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let run = move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let runtime = match runtime {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err(FrontendError::PlaneThread(e)));
                    return;
                }
            };
            runtime.block_on(async move {
                let started = ResponseService::start(config).await;
                let ok = started.is_ok();
                let _ = tx.send(started.map_err(FrontendError::from));
                if ok {
                    stopped.cancelled().await;
                }
            });
        };
        let thread = std::thread::Builder::new()
            .name("velo-plane".into())
            .spawn(run)
            .map_err(FrontendError::PlaneThread)?;
        let ended = || FrontendError::PlaneThread(std::io::Error::other("the plane thread ended"));
        let service = rx.recv().map_err(|_| ended())??;
        Ok(Self {
            service,
            stop,
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
fn router(state: State) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(state)
}

/// 404 for a path this server does not serve, as an OpenAI error object.
async fn no_route(uri: axum::http::Uri) -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "not_found_error",
        ..ApiError::invalid(format!("no route for {}", uri.path()), None)
    }
    .into_response()
}

/// 405 for a served path asked with another method, as an OpenAI error object.
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::invalid(
            format!("{} does not take {method} requests", uri.path()),
            None,
        )
    }
    .into_response()
}

async fn chat(axum::extract::State(s): axum::extract::State<State>, req: Request) -> Response {
    generate(s, Endpoint::Chat, req).await
}

async fn completions(
    axum::extract::State(s): axum::extract::State<State>,
    req: Request,
) -> Response {
    generate(s, Endpoint::Completion, req).await
}

async fn generate(state: State, endpoint: Endpoint, req: Request) -> Response {
    let started = Instant::now();
    let refuse = |e: ApiError, streaming: bool| {
        state
            .metrics
            .request(endpoint, streaming, Outcome::of_status(e.status.as_u16()));
        e.into_response()
    };
    let (max, limits) = (state.config.max_body_bytes, state.config.http_limits);
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let budget = (limits, &state.bodies);
    let body = match http::read_body(req.into_body(), declared, max, budget).await {
        Ok(b) => b,
        Err(e) => return refuse(e, false),
    };
    let parsed =
        crate::openai::request::parse(endpoint, &body, &state.config.model, state.config.limits);
    // Not kept while the request waits for its turn and generates.
    drop(body);
    let job = match parsed {
        Ok(j) => j,
        Err(e) => return refuse(e, false),
    };
    let turn = match state.admission.enter().await {
        Ok(t) => t,
        Err(e) => return refuse(e, job.stream),
    };
    let mut account = Accounting::new(&state, &job, started);
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let dispatched = match dispatch::dispatch(&state, &job, id).await {
        Ok(d) => d,
        Err(e) => {
            account.outcome = Some(Outcome::of_status(e.status.as_u16()));
            return e.into_response();
        }
    };
    account.dispatched();
    let response_id = format!("{:032x}", rand::random::<u128>());
    if job.stream {
        respond::stream(&state, job, &response_id, dispatched, turn, account)
    } else {
        respond::unary(&state, job, &response_id, dispatched, account).await
    }
}

async fn models(axum::extract::State(s): axum::extract::State<State>) -> Response {
    let body = serde_json::json!({
        "object": "list",
        "data": [{"id": s.config.model, "object": "model", "created": 0, "owned_by": "velo-serve"}],
    });
    json(StatusCode::OK, body.to_string())
}

async fn health(axum::extract::State(s): axum::extract::State<State>) -> Response {
    let instances: Vec<String> = s.pool.ids().iter().map(|id| format!("{id:x}")).collect();
    let healthy = !instances.is_empty();
    let body = serde_json::json!({
        "status": if healthy { "healthy" } else { "unhealthy" },
        "instances": instances,
        "plane": s.plane.plane().name(),
    });
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, body.to_string())
}

async fn metrics_text(axum::extract::State(s): axum::extract::State<State>) -> Response {
    let mut text = s.metrics.render(s.admission.queued());
    text.push_str(&s.service.render_metrics());
    let mut r = (StatusCode::OK, text).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

fn json(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
