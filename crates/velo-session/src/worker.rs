//! The worker's endpoint: connections to frontends, prepared once per frontend instance.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_mux::handshake::Expect;
use velo_mux::{LaneId, Mux, MuxConfig, Side};
use velo_wire::{Hello, InstanceId, Role, Token};

use crate::{ConnectError, LaneIo, Peer, SendStream, StreamError, clock, new_instance_id};

/// Dials and handshakes one lane; a transport implements it.
pub trait Connector: Send + Sync + 'static {
    /// Connects to `addr`, sends `hello`, reads the frontend's answer and checks it with
    /// `expect`. Returns the frontend's HELLO and the lane's I/O.
    fn connect_lane(
        &self,
        addr: SocketAddr,
        hello: Hello,
        expect: Expect,
    ) -> BoxFuture<'static, Result<(Hello, LaneIo), ConnectError>>;
}

/// Backoff after a failed preparation: the first retry is allowed after `min`, doubling per
/// consecutive failure up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Wait after the first failure.
    pub min: Duration,
    /// Longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            min: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

/// Settings of a [`WorkerEndpoint`].
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// The mux configuration (worker side); its lane count is the lanes per frontend.
    pub mux: MuxConfig,
    /// Backoff between failed preparations of one frontend.
    pub backoff: Backoff,
    /// Receive buffer of each lane's reader, in bytes.
    pub read_buffer: usize,
}

/// Default reader buffer: 64 KiB, the batch cap, so one read usually takes a whole batch.
pub const DEFAULT_READ_BUFFER: usize = 64 * 1024;

type Preparation = Shared<BoxFuture<'static, Result<Peer, ConnectError>>>;

enum Entry {
    Ready(Peer),
    /// A preparation in progress, and how many failed in a row before it.
    Preparing(Preparation, u32),
    Failed {
        at: tokio::time::Instant,
        retry_at: tokio::time::Instant,
        failures: u32,
        error: ConnectError,
    },
}

/// A worker's side of the response plane: opens response streams to frontends.
///
/// Connections are prepared once per frontend instance and shared by all streams to it.
/// Concurrent first requests share one preparation; a failed one is not cached (a later
/// request retries, after a backoff during which requests fail fast); a frontend that
/// restarts (a new instance id) gets a new connection. The per-request fast path takes a read
/// lock and does no I/O.
#[derive(Clone)]
pub struct WorkerEndpoint {
    inner: Arc<WorkerInner>,
}

struct WorkerInner {
    settings: WorkerSettings,
    connector: Arc<dyn Connector>,
    peers: RwLock<HashMap<InstanceId, Entry>>,
    tracker: TaskTracker,
    /// Cancelled by `close`: no new connections.
    token: CancellationToken,
    /// Cancelled by `abort`: every lane stops at once.
    abort: CancellationToken,
}

impl WorkerEndpoint {
    /// A worker endpoint dialing through `connector`. Lane tasks are spawned on `tracker`.
    ///
    /// # Panics
    ///
    /// If `settings.mux` is not a worker-side configuration.
    pub fn new(
        settings: WorkerSettings,
        connector: Arc<dyn Connector>,
        tracker: TaskTracker,
    ) -> Self {
        assert_eq!(
            settings.mux.side(),
            Side::Worker,
            "a worker endpoint needs a worker mux config"
        );
        Self {
            inner: Arc::new(WorkerInner {
                settings,
                connector,
                peers: RwLock::new(HashMap::new()),
                tracker,
                token: CancellationToken::new(),
                abort: CancellationToken::new(),
            }),
        }
    }

    /// The connection to frontend `instance` at `addr`, prepared now if needed.
    ///
    /// # Errors
    ///
    /// The preparation's [`ConnectError`], or [`ConnectError::BackingOff`] right after one.
    pub async fn peer(&self, addr: SocketAddr, instance: InstanceId) -> Result<Peer, ConnectError> {
        if self.inner.token.is_cancelled() {
            return Err(ConnectError::ShuttingDown);
        }
        {
            let peers = self
                .inner
                .peers
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(Entry::Ready(p)) = peers.get(&instance)
                && p.is_alive()
            {
                return Ok(p.clone());
            }
        }
        let preparation = {
            let mut peers = self
                .inner
                .peers
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let now = tokio::time::Instant::now();
            // Forget dead connections and expired failures while we hold the lock anyway.
            peers.retain(|_, e| match e {
                Entry::Ready(p) => p.is_alive(),
                Entry::Failed { retry_at, .. } => *retry_at + self.inner.settings.backoff.max > now,
                Entry::Preparing(..) => true,
            });
            match peers.get(&instance) {
                Some(Entry::Ready(p)) => return Ok(p.clone()),
                Some(Entry::Preparing(f, _)) => f.clone(),
                Some(Entry::Failed {
                    at,
                    retry_at,
                    error,
                    ..
                }) if now < *retry_at => {
                    return Err(ConnectError::BackingOff {
                        addr: addr.to_string(),
                        ago: now - *at,
                        retry_in: *retry_at - now,
                        last: Box::new(error.clone()),
                    });
                }
                _ => {
                    let failures = match peers.get(&instance) {
                        Some(Entry::Failed { failures, .. }) => *failures,
                        _ => 0,
                    };
                    let f = prepare(self.inner.clone(), addr, instance).boxed().shared();
                    peers.insert(instance, Entry::Preparing(f.clone(), failures));
                    f
                }
            }
        };
        let result = preparation.await;
        self.record(instance, &result);
        result
    }

    /// Opens a response stream to frontend `instance` at `addr`: prepares the connection if
    /// needed, then queues the OPEN record carrying `prologue`. No round trip.
    ///
    /// # Errors
    ///
    /// [`StreamError::Open`] or a preparation failure mapped to
    /// [`StreamError::Disconnected`]; use [`peer`](Self::peer) to see the cause.
    pub async fn open(
        &self,
        addr: SocketAddr,
        instance: InstanceId,
        ticket: u64,
        token: &Token,
        prologue: &[u8],
    ) -> Result<SendStream, OpenStreamError> {
        let peer = self
            .peer(addr, instance)
            .await
            .map_err(OpenStreamError::Connect)?;
        open_on(&peer, ticket, token, prologue).map_err(OpenStreamError::Stream)
    }

    /// Flushes every connection's open batches now.
    pub fn flush(&self) {
        let peers = self
            .inner
            .peers
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        for e in peers.values() {
            if let Entry::Ready(p) = e {
                p.flush();
            }
        }
    }

    /// Live connections.
    pub fn peers(&self) -> Vec<Peer> {
        let peers = self
            .inner
            .peers
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        peers
            .values()
            .filter_map(|e| match e {
                Entry::Ready(p) if p.is_alive() => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    /// Stops every lane at once, abandoning writes in progress (for a bounded shutdown whose
    /// grace period ran out).
    pub fn abort(&self) {
        self.close();
        self.inner.abort.cancel();
    }

    /// Stops preparing connections and closes every lane (streams on them end as lost; each
    /// lane sends a CLOSE frame first). The lane tasks end on their own; wait for them on the
    /// tracker.
    pub fn close(&self) {
        self.inner.token.cancel();
        let peers = std::mem::take(
            &mut *self
                .inner
                .peers
                .write()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for e in peers.into_values() {
            if let Entry::Ready(p) = e {
                p.close(velo_wire::CloseCode::SHUTTING_DOWN, "worker shutting down");
            }
        }
    }

    fn record(&self, instance: InstanceId, result: &Result<Peer, ConnectError>) {
        let mut peers = self
            .inner
            .peers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(&Entry::Preparing(_, failures_before)) = peers.get(&instance) else {
            return; // another waiter recorded it already
        };
        match result {
            Ok(p) => {
                peers.insert(instance, Entry::Ready(p.clone()));
            }
            Err(error) => {
                let failures = failures_before + 1;
                let b = self.inner.settings.backoff;
                let wait = b.min.saturating_mul(1 << (failures - 1).min(16)).min(b.max);
                let at = tokio::time::Instant::now();
                tracing::debug!(%instance, %error, ?wait, "connection preparation failed");
                peers.insert(
                    instance,
                    Entry::Failed {
                        at,
                        retry_at: at + wait,
                        failures,
                        error: error.clone(),
                    },
                );
            }
        }
    }
}

/// Why [`WorkerEndpoint::open`] failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OpenStreamError {
    /// The connection to the frontend could not be prepared.
    #[error(transparent)]
    Connect(ConnectError),
    /// The connection exists but the stream could not be opened.
    #[error(transparent)]
    Stream(StreamError),
}

/// Opens a stream on an existing connection (no I/O, no round trip).
///
/// # Errors
///
/// [`StreamError::Open`] when the mux refuses (no lane up, stream limit, peer going away,
/// prologue too large).
pub fn open_on(
    peer: &Peer,
    ticket: u64,
    token: &Token,
    prologue: &[u8],
) -> Result<SendStream, StreamError> {
    let key = peer.with(|st, now| st.mux.open(now, ticket, token, prologue))?;
    Ok(SendStream::new(peer.clone(), key))
}

async fn prepare(
    inner: Arc<WorkerInner>,
    addr: SocketAddr,
    instance: InstanceId,
) -> Result<Peer, ConnectError> {
    let mux_config = inner.settings.mux.clone();
    let lanes = mux_config.lanes();
    // A fresh id per connection: see docs/protocol.md, HELLO instance_id.
    let me = new_instance_id();
    let dials = (0..lanes).map(|i| {
        let hello = mux_config.hello(i, me, instance);
        let expect = Expect {
            role: Role::Frontend,
            local_instance: me,
            peer_instance: Some(instance),
            lane: Some((i, lanes)),
        };
        inner.connector.connect_lane(addr, hello, expect)
    });
    let dialed = tokio::select! {
        r = futures::future::join_all(dials) => r,
        () = inner.token.cancelled() => return Err(ConnectError::ShuttingDown),
    };
    let mut lanes_io = Vec::with_capacity(dialed.len());
    for r in dialed {
        lanes_io.push(r?);
    }
    let peer = Peer::new(
        Mux::new(mux_config, clock::now()),
        instance,
        None,
        &inner.abort,
    );
    for (i, (hello, io)) in lanes_io.into_iter().enumerate() {
        let lane = LaneId(u16::try_from(i).expect("at most 64 lanes"));
        peer.start_lane(lane, &hello, io, &inner.tracker, inner.settings.read_buffer);
    }
    tracing::debug!(%instance, %addr, lanes, "connection to frontend prepared");
    Ok(peer)
}
