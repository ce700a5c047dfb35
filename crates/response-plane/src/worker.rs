//! The worker's plane: opening response streams from their addresses.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;
use velo_session::{Peer, SendStream, StreamError, StreamWatch};

use crate::classic::{ClassicControl, ClassicDialer, ClassicWriter};
use crate::info::{self, StreamAddress};
use crate::stats::PlaneStats;
use crate::{
    Codec, ConnectionInfo, Plane, ResponseError, ResponsePlaneConfig, StartError, TypedError,
    prologue,
};

/// A worker's response plane: opens the response stream of each request it serves.
#[derive(Clone)]
pub struct WorkerPlane {
    inner: Arc<Inner>,
}

struct Inner {
    config: ResponsePlaneConfig,
    tracker: TaskTracker,
    /// Created on first use: the configured plane, or another one only to send a frontend
    /// on another plane its mismatch error.
    #[cfg(feature = "tcp")]
    velo_tcp: OnceLock<Result<velo_tcp::TcpWorker, StartError>>,
    #[cfg(feature = "ucx")]
    velo_ucx: OnceLock<Result<velo_ucx::UcxWorker, StartError>>,
    classic: ClassicDialer,
    setup_failures: AtomicU64,
    opened: AtomicU64,
}

impl WorkerPlane {
    /// A worker plane as `config` says; connections are made on first use.
    ///
    /// # Errors
    ///
    /// [`StartError`] when the configured transport cannot be set up in this build.
    pub fn new(config: ResponsePlaneConfig, tracker: TaskTracker) -> Result<Self, StartError> {
        let classic = ClassicDialer::new(
            config.max_message_size,
            config.idle_timeout,
            tracker.clone(),
        );
        let plane = Self {
            inner: Arc::new(Inner {
                config,
                tracker,
                #[cfg(feature = "tcp")]
                velo_tcp: OnceLock::new(),
                #[cfg(feature = "ucx")]
                velo_ucx: OnceLock::new(),
                classic,
                setup_failures: AtomicU64::new(0),
                opened: AtomicU64::new(0),
            }),
        };
        // Set the configured transport up now, so a broken one fails at startup.
        if plane.inner.config.plane == Plane::Velo {
            plane.velo_worker(plane.inner.config.transport)?;
        }
        Ok(plane)
    }

    /// The plane this worker is configured for.
    pub fn plane(&self) -> Plane {
        self.inner.config.plane
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
        let r = self.connect_inner(info).await;
        match &r {
            Ok(_) => self.inner.opened.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.inner.setup_failures.fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    async fn connect_inner<T: Serialize>(
        &self,
        info: &ConnectionInfo,
    ) -> Result<ResponseSender<T>, ResponseError> {
        let (requested, transport) = match info.transport.as_str() {
            info::CLASSIC => (Plane::Tcp, None),
            info::VELO_TCP => (Plane::Velo, Some(crate::VeloTransport::Tcp)),
            info::VELO_UCX => (Plane::Velo, Some(crate::VeloTransport::Ucx)),
            other => {
                return Err(ResponseError::InvalidConnectionInfo {
                    reason: format!("unknown transport {other:?}"),
                });
            }
        };
        let address = StreamAddress::parse(info)?;
        let mut sender = match transport {
            None => {
                let w = self.inner.classic.connect(&address).await?;
                ResponseSender::new(Kind::Classic(w), address.codec)
            }
            Some(t) => {
                let peer = self.velo_peer(t, &address).await?;
                ResponseSender::new(
                    Kind::VeloReady {
                        peer,
                        ticket: address.ticket,
                        token: address.token()?,
                    },
                    address.codec,
                )
            }
        };
        if requested != self.inner.config.plane {
            let (requested, configured) = (
                requested.name().to_owned(),
                self.inner.config.plane.name().to_owned(),
            );
            let err = ResponseError::PlaneMismatch {
                requested,
                configured,
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
        transport: crate::VeloTransport,
        address: &StreamAddress,
    ) -> Result<Peer, ResponseError> {
        let instance = address.instance_id()?;
        match self
            .velo_worker(transport)
            .map_err(|e| ResponseError::Unreachable {
                reason: e.to_string(),
            })? {
            #[cfg(feature = "tcp")]
            VeloWorker::Tcp(w) => w
                .endpoint()
                .peer(address.addr, instance)
                .await
                .map_err(|e| ResponseError::Unreachable {
                    reason: e.to_string(),
                }),
            #[cfg(feature = "ucx")]
            VeloWorker::Ucx(w) => w
                .endpoint()
                .peer(address.addr, instance)
                .await
                .map_err(|e| ResponseError::Unreachable {
                    reason: e.to_string(),
                }),
            #[cfg(not(any(feature = "tcp", feature = "ucx")))]
            VeloWorker::Never(never, _) => {
                let _ = (instance, address);
                match never {}
            }
        }
    }

    fn velo_worker(&self, transport: crate::VeloTransport) -> Result<VeloWorker<'_>, StartError> {
        match transport {
            #[cfg(feature = "tcp")]
            crate::VeloTransport::Tcp => {
                let w = self.inner.velo_tcp.get_or_init(|| {
                    let mux = crate::mux_config(&self.inner.config, velo_mux::Side::Worker)?;
                    Ok(velo_tcp::TcpWorker::new(
                        mux,
                        crate::frontend::tcp_config(&self.inner.config),
                        self.inner.tracker.clone(),
                    ))
                });
                match w {
                    Ok(w) => Ok(VeloWorker::Tcp(w)),
                    Err(e) => Err(e.clone()),
                }
            }
            #[cfg(not(feature = "tcp"))]
            crate::VeloTransport::Tcp => Err(StartError::NotCompiled(
                "velo over tcp needs the `tcp` feature",
            )),
            #[cfg(feature = "ucx")]
            crate::VeloTransport::Ucx => {
                let w = self.inner.velo_ucx.get_or_init(|| {
                    let mux = crate::mux_config(&self.inner.config, velo_mux::Side::Worker)?;
                    velo_ucx::UcxWorker::new(
                        mux,
                        crate::frontend::ucx_config(&self.inner.config),
                        self.inner.tracker.clone(),
                    )
                    .map_err(|e| StartError::Transport(e.to_string()))
                });
                match w {
                    Ok(w) => Ok(VeloWorker::Ucx(w)),
                    Err(e) => Err(e.clone()),
                }
            }
            #[cfg(not(feature = "ucx"))]
            crate::VeloTransport::Ucx => Err(StartError::NotCompiled(
                "velo over ucx needs the `ucx` feature",
            )),
        }
    }

    /// Flushes every connection's open batches now: call it once per engine forward pass so
    /// batching adds no delay.
    pub fn flush(&self) {
        #[cfg(feature = "tcp")]
        if let Some(Ok(w)) = self.inner.velo_tcp.get() {
            w.endpoint().flush();
        }
        #[cfg(feature = "ucx")]
        if let Some(Ok(w)) = self.inner.velo_ucx.get() {
            w.endpoint().flush();
        }
    }

    /// Counters of the plane and its transport.
    pub fn stats(&self) -> PlaneStats {
        let mut s = PlaneStats {
            streams_established: self.inner.opened.load(Ordering::Relaxed),
            stream_setup_failures: self.inner.setup_failures.load(Ordering::Relaxed),
            cancellations: self.inner.classic.cancellations.load(Ordering::Relaxed),
            ..PlaneStats::default()
        };
        self.add_transport_stats(&mut s);
        s
    }

    fn add_transport_stats(&self, s: &mut PlaneStats) {
        #[cfg(feature = "tcp")]
        if let Some(Ok(w)) = self.inner.velo_tcp.get() {
            let mut mux = velo_mux::MuxStats::default();
            for p in w.endpoint().peers() {
                velo_session::add_stats(&mut mux, &p.stats());
            }
            s.add_velo(&mux, &w.stats());
        }
        #[cfg(feature = "ucx")]
        if let Some(Ok(w)) = self.inner.velo_ucx.get() {
            let mut mux = velo_mux::MuxStats::default();
            for p in w.endpoint().peers() {
                velo_session::add_stats(&mut mux, &p.stats());
            }
            s.add_velo_ucx(&mux, &w.handshake_stats());
        }
        let _ = s;
    }

    /// Closes every connection (each lane sends CLOSE first); lane tasks end on their own.
    /// Classic streams end at once: their engines see a kill, their connections close, and
    /// their watcher tasks end. New streams fail afterwards.
    pub fn close(&self) {
        self.inner.classic.stop();
        #[cfg(feature = "tcp")]
        if let Some(Ok(w)) = self.inner.velo_tcp.get() {
            w.endpoint().close();
        }
        #[cfg(feature = "ucx")]
        if let Some(Ok(w)) = self.inner.velo_ucx.get() {
            w.close();
        }
    }

    /// Stops every connection at once, classic streams' included (as in
    /// [`close`](Self::close)), so every task on the tracker ends.
    pub fn abort(&self) {
        self.inner.classic.stop();
        #[cfg(feature = "tcp")]
        if let Some(Ok(w)) = self.inner.velo_tcp.get() {
            w.endpoint().abort();
        }
        #[cfg(feature = "ucx")]
        if let Some(Ok(w)) = self.inner.velo_ucx.get() {
            w.abort();
        }
    }
}

enum VeloWorker<'a> {
    #[cfg(feature = "tcp")]
    Tcp(&'a velo_tcp::TcpWorker),
    #[cfg(feature = "ucx")]
    Ucx(&'a velo_ucx::UcxWorker),
    /// No velo transport is compiled in: this variant cannot be built.
    #[cfg(not(any(feature = "tcp", feature = "ucx")))]
    Never(std::convert::Infallible, PhantomData<&'a ()>),
}

/// The sending side of one response stream.
///
/// Call [`send_prologue`](Self::send_prologue) exactly once, first; then
/// [`send`](Self::send) items and [`finish`](Self::finish). Dropping it without finishing
/// ends the stream abnormally for the frontend ("stream ended before generation completed").
/// Dropping it before the prologue ends the frontend's pending handle with `Disconnected`
/// (retryable: the request never got an answer), on either plane.
pub struct ResponseSender<T> {
    kind: Kind,
    codec: Codec,
    buf: Vec<u8>,
    context: StreamContext,
    _item: PhantomData<fn(&T)>,
}

enum Kind {
    /// Velo, connection ready, prologue not sent.
    VeloReady {
        peer: Peer,
        ticket: u64,
        token: [u8; 16],
    },
    Velo(SendStream),
    Classic(ClassicWriter),
    /// Classic, prologue sent.
    ClassicOpen(ClassicWriter),
    Done,
}

impl<T: Serialize> ResponseSender<T> {
    fn new(kind: Kind, codec: Codec) -> Self {
        let context = StreamContext {
            shared: Arc::new(ContextShared::default()),
        };
        if let Kind::Classic(w) = &kind {
            let _ = context.shared.watch.set(Watch::Classic(w.control()));
        }
        Self {
            kind,
            codec,
            buf: Vec::with_capacity(256),
            context,
            _item: PhantomData,
        }
    }

    /// Sends the prologue: `Ok(())` once the engine accepted the request, or its typed
    /// refusal (which ends the stream).
    ///
    /// # Errors
    ///
    /// `Prologue` if one was sent already; transport errors.
    pub async fn send_prologue(
        &mut self,
        result: Result<(), TypedError>,
    ) -> Result<(), ResponseError> {
        let json = prologue::encode(&result);
        match std::mem::replace(&mut self.kind, Kind::Done) {
            Kind::VeloReady {
                peer,
                ticket,
                token,
            } => {
                let stream = velo_session::open_on(&peer, ticket, &velo_wire::Token(token), &json)
                    .map_err(stream_error)?;
                let _ = self.context.shared.watch.set(Watch::Velo(stream.watch()));
                self.context.shared.ready.notify_waiters();
                if result.is_err() {
                    stream.finish(Bytes::new()).await.map_err(stream_error)?;
                } else {
                    self.kind = Kind::Velo(stream);
                }
                Ok(())
            }
            Kind::Classic(mut w) => {
                w.prologue(&json).await?;
                if result.is_err() {
                    w.finish().await?;
                } else {
                    self.kind = Kind::ClassicOpen(w);
                }
                Ok(())
            }
            other => {
                self.kind = other;
                Err(ResponseError::Prologue("the prologue was already sent"))
            }
        }
    }

    /// Sends one item, waiting while the frontend's credit for this stream is used up.
    ///
    /// # Errors
    ///
    /// `Cancelled` after the frontend killed the stream, `Disconnected` when the connection
    /// is lost, `Prologue` before the prologue, `Encode`, `TooLarge`.
    pub async fn send(&mut self, item: &T) -> Result<(), ResponseError> {
        self.codec.encode(item, &mut self.buf)?;
        match &mut self.kind {
            Kind::Velo(s) => {
                let r = if self.buf.len() >= velo_mux::CHAIN_THRESHOLD {
                    // Large items are handed over whole (zero-copy); the buffer starts anew.
                    let big = std::mem::replace(&mut self.buf, Vec::with_capacity(256));
                    s.send_bytes(Bytes::from(big)).await
                } else {
                    s.send(&self.buf).await
                };
                r.map_err(stream_error)
            }
            Kind::ClassicOpen(w) => w.item(&self.buf).await,
            Kind::VeloReady { .. } | Kind::Classic(_) => {
                Err(ResponseError::Prologue("send the prologue before any item"))
            }
            Kind::Done => Err(ResponseError::Prologue("the stream has ended")),
        }
    }

    /// Ends the stream cleanly (the `complete_final` end).
    ///
    /// # Errors
    ///
    /// `Cancelled` or `Disconnected` if the stream had already ended.
    pub async fn finish(mut self) -> Result<(), ResponseError> {
        match std::mem::replace(&mut self.kind, Kind::Done) {
            Kind::Velo(s) => s.finish(Bytes::new()).await.map_err(stream_error),
            Kind::ClassicOpen(mut w) => w.finish().await,
            Kind::Done => Err(ResponseError::Prologue("the stream has ended")),
            _ => Err(ResponseError::Prologue(
                "send the prologue before finishing",
            )),
        }
    }

    /// Flushes this stream's connection now (velo; the classic plane writes every item at
    /// once anyway). Prefer [`WorkerPlane::flush`] once per forward pass.
    pub fn flush(&self) {
        if let Kind::Velo(s) = &self.kind {
            s.flush();
        }
    }

    /// The stream's cancellation signals, for the engine.
    pub fn context(&self) -> StreamContext {
        self.context.clone()
    }
}

impl<T> Drop for ResponseSender<T> {
    fn drop(&mut self) {
        // Velo, before the prologue: nothing reached the frontend yet, so say the stream is
        // abandoned (an OPEN with an empty prologue) and reset it at once (dropping the
        // stream sends ERROR `RESET_DROPPED`). The classic plane needs nothing: dropping
        // the connection ends the frontend's wait.
        if let Kind::VeloReady {
            peer,
            ticket,
            token,
        } = &self.kind
        {
            let token = velo_wire::Token(*token);
            match velo_session::open_on(peer, *ticket, &token, prologue::ABANDONED) {
                Ok(stream) => drop(stream),
                // The connection is gone or going away: the establish timeout ends the wait.
                Err(e) => tracing::debug!(error = %e, "cannot report an abandoned stream"),
            }
        }
    }
}

impl<T> std::fmt::Debug for ResponseSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseSender")
            .field("codec", &self.codec)
            .finish()
    }
}

fn stream_error(e: StreamError) -> ResponseError {
    use velo_mux::StreamEnd;
    match e {
        StreamError::Closed(StreamEnd::Cancelled(_)) => {
            ResponseError::Cancelled { graceful: false }
        }
        StreamError::Closed(end) => ResponseError::ended_early(end),
        StreamError::TooLarge { len, max } => ResponseError::TooLarge { len, max },
        StreamError::Open(e) => ResponseError::Unreachable {
            reason: e.to_string(),
        },
        other => ResponseError::ended_early(other),
    }
}

/// The frontend's stop and kill, for the engine serving one stream. Cheap to clone.
///
/// On the velo plane the signals exist from the prologue on; waiting before it simply waits.
/// A kill that raced the stream's setup arrives right after the prologue.
#[derive(Clone)]
pub struct StreamContext {
    shared: Arc<ContextShared>,
}

#[derive(Default)]
struct ContextShared {
    watch: OnceLock<Watch>,
    ready: Notify,
}

enum Watch {
    Velo(StreamWatch),
    Classic(Arc<ClassicControl>),
}

impl StreamContext {
    async fn watch(&self) -> &Watch {
        loop {
            let ready = self.shared.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            if let Some(w) = self.shared.watch.get() {
                return w;
            }
            ready.await;
        }
    }

    /// Resolves when the frontend asks to stop (graceful) or kills the stream.
    pub async fn stopped(&self) {
        match self.watch().await {
            Watch::Velo(w) => w.stopped().await,
            Watch::Classic(c) => c.stopped().await,
        }
    }

    /// Resolves when the frontend kills the stream (or the connection to it is lost).
    pub async fn killed(&self) {
        match self.watch().await {
            Watch::Velo(w) => {
                w.closed().await;
            }
            Watch::Classic(c) => c.killed().await,
        }
    }

    /// Whether the frontend asked to stop (or killed the stream).
    pub fn is_stopped(&self) -> bool {
        match self.shared.watch.get() {
            Some(Watch::Velo(w)) => w.is_stop_requested() || w.remote_end().is_some(),
            Some(Watch::Classic(c)) => c.is_stopped(),
            None => false,
        }
    }

    /// Whether the frontend killed the stream (or the connection was lost).
    pub fn is_killed(&self) -> bool {
        match self.shared.watch.get() {
            Some(Watch::Velo(w)) => w.remote_end().is_some(),
            Some(Watch::Classic(c)) => c.is_killed(),
            None => false,
        }
    }
}

impl std::fmt::Debug for StreamContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamContext")
            .field("stopped", &self.is_stopped())
            .field("killed", &self.is_killed())
            .finish()
    }
}

impl std::fmt::Debug for WorkerPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPlane")
            .field("plane", &self.inner.config.plane)
            .finish()
    }
}
