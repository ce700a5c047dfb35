//! The frontend's plane: registering streams and waiting for their prologue.

use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::security::Security;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::classic::ClassicFrontend;
use crate::info::{self, StreamAddress, hex_token};
use crate::observe::{InFlight, PlaneObserver, Streams};
use crate::registry::{Arrival, Registry};
use crate::stats::{PlaneCounters, PlaneStats};
use crate::velo::{self, FrontendTransport, RegistryAcceptor};
use crate::{
    Codec, ConnectionInfo, Plane, ResponseError, ResponsePlaneConfig, ResponseStream, StartError,
    prologue,
};

/// How long a registration waits for its prologue unless told otherwise: 60 s.
///
/// A worker sends the prologue as soon as its engine accepts (or refuses) the request, long
/// before generation, so a healthy worker answers within its admission queue plus one
/// connection setup (the classic plane's connect timeout is 3 s). A minute covers a deep
/// queue many times over, while a request lost on its way, or a worker that vanished without
/// a trace before answering, no longer holds its pending handle (and the caller) for ever.
pub const DEFAULT_ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

/// Options of one registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterOptions {
    /// How the worker must encode items (the request's codec).
    pub codec: Codec,
    /// Fail with `ResponseTimeout` if no prologue arrives within this time;
    /// [`DEFAULT_ESTABLISH_TIMEOUT`] by default. `None` waits as long as it takes (a worker
    /// that dropped the request still ends the wait, with `Disconnected`; one that vanished
    /// without a trace does not).
    pub establish_timeout: Option<Duration>,
}

impl Default for RegisterOptions {
    fn default() -> Self {
        Self {
            codec: Codec::default(),
            establish_timeout: Some(DEFAULT_ESTABLISH_TIMEOUT),
        }
    }
}

/// A frontend's response plane: hands out stream addresses and receives the streams.
#[derive(Clone)]
pub struct FrontendPlane {
    inner: Arc<Inner>,
}

struct Inner {
    config: ResponsePlaneConfig,
    registry: Arc<Registry>,
    transport: Transport,
    advertise: SocketAddr,
    instance: velo_wire::InstanceId,
    security: Security,
    /// The TLS file watch (stopped with the plane).
    watch: crate::watch::Watch,
    counters: Arc<PlaneCounters>,
    streams: Arc<Streams>,
}

enum Transport {
    Classic(ClassicFrontend),
    Velo(Box<dyn FrontendTransport>),
}

impl FrontendPlane {
    /// Starts listening as `config` says. Lane and connection tasks run on `tracker`.
    ///
    /// # Errors
    ///
    /// [`StartError`]: a transport not compiled in, or the listener could not bind.
    pub async fn bind(
        config: ResponsePlaneConfig,
        tracker: TaskTracker,
    ) -> Result<Self, StartError> {
        Self::bind_observed(config, tracker, None).await
    }

    /// [`bind`](Self::bind), with an observer told of every stream's setup time.
    ///
    /// # Errors
    ///
    /// As [`bind`](Self::bind).
    pub async fn bind_observed(
        config: ResponsePlaneConfig,
        tracker: TaskTracker,
        observer: Option<Arc<dyn PlaneObserver>>,
    ) -> Result<Self, StartError> {
        let registry = Arc::new(Registry::new());
        let counters = Arc::new(PlaneCounters::default());
        let security = Security::frontend(&config)?;
        // Dynamo's rule: this host's routable address unless told otherwise, never every
        // interface (an unspecified host is refused when the configuration is built).
        let ip = config.host().unwrap_or_else(routable_ip);
        let bind = SocketAddr::new(ip, config.port());
        let (transport, local, instance) = match config.plane() {
            Plane::Classic => {
                let (max, liveness) = (config.max_message_size(), config.idle_timeout());
                let accept = crate::classic::Accept {
                    registry: registry.clone(),
                    max,
                    liveness,
                    tls: security.server.clone(),
                    counters: counters.clone(),
                    handshakes: velo_session::HandshakeBudget::new(
                        crate::classic::CLASSIC_HANDSHAKES,
                        crate::classic::CLASSIC_HANDSHAKES_PER_SOURCE,
                    ),
                    stop: tokio_util::sync::CancellationToken::new(),
                    tracker: tracker.clone(),
                };
                let f = ClassicFrontend::bind(bind, accept, tracker.clone())
                    .await
                    .map_err(|source| StartError::Bind {
                        addr: bind,
                        source: Arc::new(source),
                    })?;
                let local = f.local_addr;
                let instance = velo_session::new_instance_id();
                (Transport::Classic(f), local, instance)
            }
            Plane::Velo => {
                let acceptor = Arc::new(RegistryAcceptor {
                    registry: registry.clone(),
                    counters: counters.clone(),
                });
                let f = velo::bind_frontend(&config, bind, acceptor, tracker.clone(), &security)
                    .await?;
                let (local, instance) = (f.local_addr(), f.endpoint().instance());
                (Transport::Velo(f), local, instance)
            }
        };
        let advertise = SocketAddr::new(ip, local.port());
        let watch = crate::watch::spawn(&security, &tracker);
        tracing::info!(plane = config.plane().name(), %advertise, "response plane listening");
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                registry,
                transport,
                advertise,
                instance,
                security,
                watch,
                streams: Streams::new(counters.clone(), observer),
                counters,
            }),
        })
    }

    /// Registers a stream: its address (to put in the request) and the handle that resolves
    /// on its prologue. Dropping the handle before then removes every trace of it.
    ///
    /// # Errors
    ///
    /// [`ResponseError::Closed`] after shutdown, [`ResponseError::Overloaded`] at the limit
    /// of pending streams.
    pub fn register<T: DeserializeOwned>(
        &self,
        opts: RegisterOptions,
    ) -> Result<(ConnectionInfo, PendingResponse<T>), ResponseError> {
        let (ticket, token, rx) = self.inner.registry.register()?;
        self.inner.counters.streams_registered.inc();
        let address = StreamAddress {
            v: info::ADDRESS_VERSION,
            addr: self.inner.advertise,
            instance: self.inner.instance.to_string(),
            ticket,
            token: hex_token(&token),
            codec: opts.codec,
        };
        let transport = match &self.inner.transport {
            Transport::Classic(_) => info::CLASSIC,
            Transport::Velo(_) => match self.inner.config.transport() {
                crate::VeloTransport::Tcp => info::VELO_TCP,
                crate::VeloTransport::Ucx => info::VELO_UCX,
            },
        };
        let pending = PendingResponse {
            plane: self.inner.clone(),
            registered_at: tokio::time::Instant::now(),
            ticket,
            rx: Some(rx),
            opts,
            _item: PhantomData,
        };
        Ok((address.to_info(transport), pending))
    }

    /// Ends every pending stream tied to `worker_instance` with `Disconnected` (the worker
    /// left discovery) and tombstones the instance for 5 s, so a racing
    /// [`PendingResponse::associate`] fails at once. Returns how many streams ended.
    pub fn cancel_instance_streams(&self, worker_instance: u64) -> usize {
        self.inner.registry.cancel_worker(worker_instance)
    }

    /// The plane this frontend runs.
    pub fn plane(&self) -> Plane {
        self.inner.config.plane()
    }

    /// The address workers connect to.
    pub fn address(&self) -> SocketAddr {
        self.inner.advertise
    }

    /// Streams registered and still waiting for their prologue.
    pub fn pending(&self) -> usize {
        self.inner.registry.pending()
    }

    /// Counters of the plane and its transport.
    pub fn stats(&self) -> PlaneStats {
        let mut s = self.inner.counters.snapshot();
        s.streams_in_flight = self.inner.streams.in_flight();
        if let Transport::Velo(f) = &self.inner.transport {
            s.mux = f.endpoint().stats();
            s.handshake = f.handshake_stats();
        }
        s
    }

    /// Stops taking streams: new registrations fail with `Closed`, pending ones end with
    /// `Closed`, the listener stops, and every connection is told (CLOSE) and closed. Lane
    /// tasks end on their own; the caller bounds the wait on its tracker.
    pub async fn shutdown(&self) {
        self.inner.watch.stop();
        self.inner.registry.close();
        match &self.inner.transport {
            Transport::Classic(f) => f.shutdown().await,
            Transport::Velo(f) => f.shutdown().await,
        }
    }

    /// Stops every connection at once (the grace period ran out).
    pub fn abort(&self) {
        self.inner.watch.stop();
        self.inner.registry.close();
        match &self.inner.transport {
            Transport::Classic(f) => f.abort(),
            Transport::Velo(f) => f.abort(),
        }
    }

    /// Resolves once every stream this plane handed out has ended or been dropped.
    pub async fn drained(&self) {
        self.inner.streams.drained().await;
    }

    /// Rereads the TLS certificate, key and client CA files: connections already up keep
    /// their session, new ones get the new certificate. A running plane also rereads them on
    /// its own when they change (checked every few seconds). Nothing to do without TLS.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Tls`](crate::ConfigError::Tls) naming the variable whose file is bad;
    /// the certificate in use stays.
    pub fn reload_tls(&self) -> Result<(), crate::ConfigError> {
        self.inner.security.reload()
    }

    /// Tells every worker this frontend takes no new streams; open ones finish.
    pub fn go_away(&self) {
        if let Transport::Velo(f) = &self.inner.transport {
            f.endpoint().go_away();
        }
    }
}

/// This host's routable address: the one the OS would use to reach the outside world (a
/// route lookup only; nothing is sent). Loopback when there is no route.
fn routable_ip() -> IpAddr {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| {
        s.connect("192.0.2.1:9")?; // TEST-NET-1: never routed anywhere real
        s.local_addr()
    });
    match probe {
        Ok(a) if !a.ip().is_unspecified() => a.ip(),
        _ => IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

/// A registered stream waiting for its worker's prologue.
pub struct PendingResponse<T> {
    plane: Arc<Inner>,
    registered_at: tokio::time::Instant,
    ticket: u64,
    rx: Option<oneshot::Receiver<Arrival>>,
    opts: RegisterOptions,
    _item: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> PendingResponse<T> {
    /// Ties the stream to the worker instance its request went to, so
    /// [`FrontendPlane::cancel_instance_streams`] can end it. Calling it again (the request
    /// was retried on another worker) moves the tie: only the latest instance's removal
    /// ends the stream.
    ///
    /// # Errors
    ///
    /// `Disconnected` at once if that instance was removed in the last 5 s.
    pub fn associate(&self, worker_instance: u64) -> Result<(), ResponseError> {
        self.plane.registry.associate(self.ticket, worker_instance)
    }

    /// Waits for the prologue.
    ///
    /// # Errors
    ///
    /// `Refused` (error prologue, with the worker's typed cause), `Disconnected`
    /// (worker gone first, its sender dropped before the prologue, or its instance removed),
    /// `ResponseTimeout`, `Closed`.
    pub async fn established(mut self) -> Result<ResponseStream<T>, ResponseError> {
        let r = self.wait().await;
        if r.is_ok() {
            self.plane.counters.streams_established.inc();
            self.plane.streams.set_up(self.registered_at.elapsed());
        } else if r.as_ref().err() != Some(&ResponseError::Closed) {
            // Shutdown is not the stream's failure.
            self.plane.counters.stream_setup_failures.inc();
            if let Err(ResponseError::ResponseTimeout { .. }) = r {
                self.plane.counters.prologue_timeouts.inc();
            }
        }
        r
    }

    async fn wait(&mut self) -> Result<ResponseStream<T>, ResponseError> {
        let rx = self.rx.take().ok_or(ResponseError::Closed)?;
        let codec = self.opts.codec;
        let streams = self.plane.streams.clone();
        let establish = async move {
            let arrival = rx.await.map_err(|_| ResponseError::Closed)?;
            match arrival {
                Arrival::Failed(e) => Err(e),
                Arrival::Velo(incoming) => {
                    let outcome = prologue::decode(incoming.prologue());
                    // Take the stream either way: after an error prologue the worker ends it.
                    let stream = incoming.accept();
                    outcome.map(|()| ResponseStream::velo(stream, codec, InFlight::new(&streams)))
                }
                Arrival::Classic(incoming) => incoming
                    .prologue()
                    .await
                    .map(|r| ResponseStream::classic(r, codec, InFlight::new(&streams))),
            }
        };
        match self.opts.establish_timeout {
            None => establish.await,
            Some(after) => tokio::time::timeout(after, establish)
                .await
                .map_err(|_| ResponseError::ResponseTimeout { after })?,
        }
    }
}

impl<T> Drop for PendingResponse<T> {
    fn drop(&mut self) {
        // No-op once the stream arrived (its slot is already gone).
        self.plane.registry.remove(self.ticket);
    }
}

impl<T> std::fmt::Debug for PendingResponse<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingResponse")
            .field("ticket", &self.ticket)
            .finish()
    }
}

impl std::fmt::Debug for FrontendPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontendPlane")
            .field("plane", &self.inner.config.plane())
            .field("address", &self.inner.advertise)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_waits_a_bounded_time_by_default() {
        let opts = RegisterOptions::default();
        assert!(opts.establish_timeout.is_some(), "{opts:?}");
        assert_eq!(opts.establish_timeout, Some(DEFAULT_ESTABLISH_TIMEOUT));
    }
}
