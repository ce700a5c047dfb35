//! The worker's plane: opening response streams from their addresses. The sender's state
//! machine is in `sender.rs`, the engine's view of cancellation in `context.rs`.

mod context;
mod sender;

use std::sync::{Arc, OnceLock};

use serde::Serialize;
use tokio_util::task::TaskTracker;
use velo_session::Peer;

pub use context::StreamContext;
pub use sender::ResponseSender;

use crate::classic::ClassicDialer;
use crate::info::{self, StreamAddress};
use crate::observe::{InFlight, PlaneObserver, Streams};
use crate::security::Security;
use crate::stats::{PlaneCounters, PlaneStats};
use crate::velo::{self, WorkerTransport};
use crate::{
    Cause, ConnectionInfo, InvalidInfo, Plane, ResponseError, ResponsePlaneConfig, StartError,
    TypedError, VeloTransport,
};
use sender::{Kind, VeloTarget};

/// A worker's response plane: opens the response stream of each request it serves.
#[derive(Clone)]
pub struct WorkerPlane {
    inner: Arc<Inner>,
}

struct Inner {
    config: ResponsePlaneConfig,
    security: Security,
    /// The TLS file watch (stopped with the plane).
    watch: crate::watch::Watch,
    tracker: TaskTracker,
    /// Created on first use, per velo transport: the configured one, or another one only to
    /// send a frontend on another plane its mismatch error.
    velo: [OnceLock<Result<Arc<dyn WorkerTransport>, StartError>>; 2],
    classic: ClassicDialer,
    counters: Arc<PlaneCounters>,
    streams: Arc<Streams>,
}

impl WorkerPlane {
    /// A worker plane as `config` says; connections are made on first use.
    ///
    /// # Errors
    ///
    /// [`StartError`] when the configured transport cannot be set up in this build.
    pub fn new(config: ResponsePlaneConfig, tracker: TaskTracker) -> Result<Self, StartError> {
        Self::new_observed(config, tracker, None)
    }

    /// [`new`](Self::new), with an observer told of every stream's setup time.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn new_observed(
        config: ResponsePlaneConfig,
        tracker: TaskTracker,
        observer: Option<Arc<dyn PlaneObserver>>,
    ) -> Result<Self, StartError> {
        let security = Security::worker(&config)?;
        let counters = Arc::new(PlaneCounters::default());
        let classic = ClassicDialer::new(
            config.max_message_size(),
            config.idle_timeout(),
            config.worker_instance(),
            security.client.clone(),
            counters.clone(),
            tracker.clone(),
        );
        let watch = crate::watch::spawn(&security, &tracker);
        let plane = Self {
            inner: Arc::new(Inner {
                config,
                security,
                watch,
                tracker,
                velo: [OnceLock::new(), OnceLock::new()],
                classic,
                streams: Streams::new(counters.clone(), observer),
                counters,
            }),
        };
        // Set the configured transport up now, so a broken one fails at startup.
        if plane.inner.config.plane() == Plane::Velo {
            plane.velo_worker(plane.inner.config.transport())?;
        }
        Ok(plane)
    }

    /// Rereads the TLS files (the CA frontends are verified against, this worker's own
    /// certificate): lanes already up keep their session, new ones use the new files. A
    /// running plane also rereads them on its own when they change.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Tls`](crate::ConfigError::Tls) naming the variable whose file is bad;
    /// the files in use stay.
    pub fn reload_tls(&self) -> Result<(), crate::ConfigError> {
        self.inner.security.reload()
    }

    /// The plane this worker is configured for.
    pub fn plane(&self) -> Plane {
        self.inner.config.plane()
    }

    /// Prepares the response stream addressed by `info` (connecting to its frontend once per
    /// frontend instance on the velo plane, dialing a connection on the classic one). Send
    /// the prologue next.
    ///
    /// # Errors
    ///
    /// `PlaneMismatch` when the frontend uses another plane (it is sent an error prologue
    /// saying so, and the request should not be served); `Unreachable` when the frontend
    /// cannot be reached; `InvalidConnectionInfo`. Each counts as a setup failure.
    pub async fn connect<T: Serialize>(
        &self,
        info: &ConnectionInfo,
    ) -> Result<ResponseSender<T>, ResponseError> {
        let started = tokio::time::Instant::now();
        let r = self.connect_inner(info).await;
        match &r {
            Ok(_) => {
                self.inner.counters.streams_established.inc();
                self.inner.streams.set_up(started.elapsed());
            }
            Err(_) => {
                self.inner.counters.stream_setup_failures.inc();
            }
        }
        r
    }

    async fn connect_inner<T: Serialize>(
        &self,
        info: &ConnectionInfo,
    ) -> Result<ResponseSender<T>, ResponseError> {
        let (requested, transport) = match info.transport.as_str() {
            info::CLASSIC => (Plane::Classic, None),
            info::VELO_TCP => (Plane::Velo, Some(VeloTransport::Tcp)),
            info::VELO_UCX => (Plane::Velo, Some(VeloTransport::Ucx)),
            other => {
                return Err(ResponseError::InvalidConnectionInfo(
                    InvalidInfo::UnknownTransport(other.to_owned()),
                ));
            }
        };
        let address = StreamAddress::parse(info)?;
        let mut sender = match transport {
            None => {
                let w = self.inner.classic.connect(&address).await?;
                ResponseSender::new(Kind::Classic(w), address.codec, self.in_flight())
            }
            Some(t) => {
                let (peer, target) = self.velo_peer(t, &address).await?;
                let (ticket, token) = (address.ticket, address.token()?);
                ResponseSender::new(
                    Kind::velo(peer, target, ticket, token),
                    address.codec,
                    self.in_flight(),
                )
            }
        };
        if requested != self.inner.config.plane() {
            let err = ResponseError::PlaneMismatch {
                requested,
                configured: self.inner.config.plane(),
            };
            let cause = TypedError::new("ResponsePlaneMismatch", err.to_string());
            // Best effort: the frontend learns why; this request is not served either way.
            if sender.send_prologue(Err(cause)).await.is_err() {
                tracing::debug!("could not deliver the plane-mismatch prologue");
            }
            return Err(err);
        }
        Ok(sender)
    }

    async fn velo_peer(
        &self,
        transport: VeloTransport,
        address: &StreamAddress,
    ) -> Result<(Peer, VeloTarget), ResponseError> {
        let instance = address.instance_id()?;
        let addr = address.addr;
        let worker = self
            .velo_worker(transport)
            .map_err(|e| ResponseError::Unreachable {
                addr,
                cause: Cause::start(e),
            })?;
        let endpoint = worker.endpoint();
        let peer = endpoint
            .peer(addr, instance)
            .await
            .map_err(|e| ResponseError::Unreachable {
                addr,
                cause: Cause::connect(e),
            })?;
        let target = VeloTarget {
            endpoint: endpoint.clone(),
            addr,
            instance,
            tracker: self.inner.tracker.clone(),
        };
        Ok((peer, target))
    }

    /// Counts a new stream in flight.
    fn in_flight(&self) -> InFlight {
        InFlight::new(&self.inner.streams)
    }

    /// Resolves once every stream this plane handed out has ended or been dropped.
    pub async fn drained(&self) {
        self.inner.streams.drained().await;
    }

    /// The velo worker over `transport`, started on first use.
    fn velo_worker(
        &self,
        transport: VeloTransport,
    ) -> Result<&Arc<dyn WorkerTransport>, StartError> {
        let slot = &self.inner.velo[transport as usize];
        let w = slot.get_or_init(|| {
            let tracker = self.inner.tracker.clone();
            velo::start_worker(&self.inner.config, transport, tracker, &self.inner.security)
        });
        w.as_ref().map_err(Clone::clone)
    }

    /// The velo workers started so far.
    fn velo_workers(&self) -> impl Iterator<Item = &Arc<dyn WorkerTransport>> {
        self.inner
            .velo
            .iter()
            .filter_map(|slot| slot.get().and_then(|w| w.as_ref().ok()))
    }

    /// Flushes every connection's open batches now: call it once per engine forward pass so
    /// batching adds no delay.
    pub fn flush(&self) {
        for w in self.velo_workers() {
            w.endpoint().flush();
        }
    }

    /// Counters of the plane and its transport.
    pub fn stats(&self) -> PlaneStats {
        let mut s = self.inner.counters.snapshot();
        s.streams_in_flight = self.inner.streams.in_flight();
        for w in self.velo_workers() {
            s.mux += w.endpoint().stats();
            s.handshake += w.handshake_stats();
        }
        s
    }

    /// Closes every connection (each lane sends CLOSE first); lane tasks end on their own.
    /// Classic streams end at once: their engines see a kill, their connections close, and
    /// their watcher tasks end. New streams fail afterwards.
    pub fn close(&self) {
        self.inner.watch.stop();
        self.inner.classic.stop();
        for w in self.velo_workers() {
            w.close();
        }
    }

    /// Stops every connection at once, classic streams' included (as in
    /// [`close`](Self::close)), so every task on the tracker ends.
    pub fn abort(&self) {
        self.inner.watch.stop();
        self.inner.classic.stop();
        for w in self.velo_workers() {
            w.abort();
        }
    }
}

impl std::fmt::Debug for WorkerPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPlane")
            .field("plane", &self.inner.config.plane())
            .finish()
    }
}
