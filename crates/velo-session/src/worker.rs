//! The worker's endpoint: connections to frontends, prepared once per frontend instance.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_mux::handshake::Expect;
use velo_mux::{LaneId, Mux, MuxConfig, MuxStats, Side};
use velo_wire::{InstanceId, Role, Token};

use crate::auth::ClusterSecret;
use crate::dial::Connector;
use crate::peer::Retired;
use crate::stats::{HandshakeCounters, HandshakeStats};
use crate::{ConnectError, Dialer, Peer, SendStream, StreamError, clock, new_instance_id};

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
    /// Bound on dialing and handshaking one lane.
    pub handshake_timeout: Duration,
    /// Bound on preparing one connection (dialing and handshaking every lane), whatever the
    /// transport's own timeouts.
    pub prepare_timeout: Duration,
    /// The cluster secret this worker proves in every handshake (and requires frontends to
    /// prove); `None` for none.
    pub secret: Option<ClusterSecret>,
    /// This worker's discovery instance id, announced in every HELLO: a frontend opens the
    /// streams it tied to this instance only to connections that announce it.
    pub worker_instance: Option<u64>,
}

impl WorkerSettings {
    /// The defaults, with `mux` (a worker-side configuration).
    pub fn new(mux: MuxConfig) -> Self {
        Self {
            mux,
            backoff: Backoff::default(),
            read_buffer: DEFAULT_READ_BUFFER,
            handshake_timeout: crate::DEFAULT_HANDSHAKE_TIMEOUT,
            prepare_timeout: DEFAULT_PREPARE_TIMEOUT,
            secret: None,
            worker_instance: None,
        }
    }
}

/// Default reader buffer: 64 KiB, the batch cap, so one read usually takes a whole batch.
pub const DEFAULT_READ_BUFFER: usize = 64 * 1024;

/// Default bound on preparing one connection: 10 s.
pub const DEFAULT_PREPARE_TIMEOUT: Duration = Duration::from_secs(10);

/// A frontend as a worker addresses it: its instance id at an address.
type FrontendKey = (InstanceId, SocketAddr);

/// A preparation's outcome, awaited by every request that wants it.
type Preparation = Shared<BoxFuture<'static, Result<Peer, ConnectError>>>;

enum Entry {
    Ready(Peer, Young),
    /// A preparation running as a task of its own (it completes and is recorded even if
    /// every request waiting for it gives up), its id, and how many failed in a row before.
    Preparing {
        id: u64,
        done: Preparation,
        failures: u32,
    },
    Failed {
        at: tokio::time::Instant,
        retry_at: tokio::time::Instant,
        failures: u32,
        error: ConnectError,
    },
}

/// When a connection was set up, and how many preparations of its frontend had failed in a
/// row before it: if it dies before [`Backoff::max`], that counts as one more.
#[derive(Debug, Clone, Copy)]
struct Young {
    since: tokio::time::Instant,
    failures: u32,
}

/// A worker's side of the response plane: opens response streams to frontends.
///
/// Connections are prepared once per frontend (instance id and address) and shared by all
/// streams to it. Concurrent first requests share one preparation, which runs as a task of
/// its own under [`WorkerSettings::prepare_timeout`]; a failed one is not cached (a later
/// request retries, after a backoff during which requests fail fast), and a connection that
/// dies within [`Backoff::max`] of its setup counts as a failure too (the first such death is
/// replaced at once, the next waits: a frontend or proxy that drops every new connection is
/// not redialled at the request rate); a frontend that
/// restarts (a new instance id) gets a new connection, and so does one that said it is
/// going away (the old connection serves its open streams to their end). The per-request
/// fast path takes a read lock and does no I/O.
#[derive(Clone)]
pub struct WorkerEndpoint {
    inner: Arc<WorkerInner>,
}

struct WorkerInner {
    settings: WorkerSettings,
    connector: Connector,
    peers: RwLock<HashMap<FrontendKey, Entry>>,
    /// Connections whose frontend went away: no new streams, open ones finish.
    draining: Mutex<Vec<Peer>>,
    /// Frontends whose connection died young, pruned from `peers` by another frontend's
    /// preparation before their own next one: the failures in a row (that death counted),
    /// how long it lived, and when it was found dead. Kept for [`Backoff::max`].
    young_deaths: Mutex<HashMap<FrontendKey, (u32, Duration, tokio::time::Instant)>>,
    /// Counters of connections that are done.
    retired: Retired,
    next_preparation: AtomicU64,
    tracker: TaskTracker,
    /// Cancelled by `close`: no new connections.
    token: CancellationToken,
    /// Cancelled by `abort`: every lane stops at once.
    abort: CancellationToken,
}

impl WorkerEndpoint {
    /// A worker endpoint dialing lanes through `dialer` (it runs each lane's handshake).
    /// Lane tasks are spawned on `tracker`.
    ///
    /// # Panics
    ///
    /// If `settings.mux` is not a worker-side configuration.
    pub fn new(settings: WorkerSettings, dialer: Arc<dyn Dialer>, tracker: TaskTracker) -> Self {
        assert_eq!(
            settings.mux.side(),
            Side::Worker,
            "a worker endpoint needs a worker mux config"
        );
        Self {
            inner: Arc::new(WorkerInner {
                connector: Connector {
                    dialer,
                    secret: settings.secret.clone(),
                    handshake_timeout: settings.handshake_timeout,
                    counters: Arc::new(HandshakeCounters::default()),
                },
                settings,
                peers: RwLock::new(HashMap::new()),
                draining: Mutex::new(Vec::new()),
                young_deaths: Mutex::new(HashMap::new()),
                retired: Retired::default(),
                next_preparation: AtomicU64::new(0),
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
        let key = (instance, addr);
        {
            let peers = self.inner.read_peers();
            if let Some(Entry::Ready(p, _)) = peers.get(&key)
                && p.is_usable()
            {
                return Ok(p.clone());
            }
        }
        let preparation = self.inner.preparation(key)?;
        preparation.await
    }

    /// Opens a response stream to frontend `instance` at `addr`: prepares the connection if
    /// needed, then queues the OPEN record carrying `prologue`. No round trip.
    ///
    /// # Errors
    ///
    /// [`OpenStreamError::Connect`] when the connection cannot be prepared,
    /// [`OpenStreamError::Stream`] when the mux refuses the stream.
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
        open_when_room(&peer, ticket, token, prologue)
            .await
            .map_err(OpenStreamError::Stream)
    }

    /// Entries in the connection cache: live connections, preparations, failures within
    /// their backoff, and dead connections not pruned yet (the next preparation prunes them).
    pub fn cached_connections(&self) -> usize {
        self.inner.read_peers().len()
    }

    /// Flushes every connection's open batches now.
    pub fn flush(&self) {
        for p in self.peers() {
            p.flush();
        }
    }

    /// The sum of every connection's counters, those of connections already gone included
    /// (so each total only ever grows).
    pub fn stats(&self) -> MuxStats {
        let peers = self.inner.read_peers();
        let draining = self.inner.draining();
        let ready = peers.values().filter_map(|e| match e {
            Entry::Ready(p, _) => Some(p),
            _ => None,
        });
        self.inner.retired.total(ready.chain(draining.iter()))
    }

    /// The handshake counters of every lane this endpoint dialed.
    pub fn handshake_stats(&self) -> HandshakeStats {
        self.inner.connector.counters.snapshot()
    }

    /// Live connections, those still taking new streams and those draining.
    pub fn peers(&self) -> Vec<Peer> {
        let mut live: Vec<Peer> = self
            .inner
            .read_peers()
            .values()
            .filter_map(|e| match e {
                Entry::Ready(p, _) if p.is_alive() => Some(p.clone()),
                _ => None,
            })
            .collect();
        let mut draining = self.inner.draining();
        draining.retain(Peer::is_alive);
        live.extend(draining.iter().cloned());
        live
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
        let peers = std::mem::take(&mut *self.inner.write_peers());
        let draining = std::mem::take(&mut *self.inner.draining());
        let ready = peers.into_values().filter_map(|e| match e {
            Entry::Ready(p, _) => Some(p),
            _ => None,
        });
        for p in ready.chain(draining) {
            close_for_shutdown(&p);
        }
    }
}

impl WorkerInner {
    fn read_peers(&self) -> RwLockReadGuard<'_, HashMap<FrontendKey, Entry>> {
        self.peers.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_peers(&self) -> RwLockWriteGuard<'_, HashMap<FrontendKey, Entry>> {
        self.peers.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn draining(&self) -> MutexGuard<'_, Vec<Peer>> {
        self.draining.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The preparation of `key` to wait for: the one running, or a new one. A usable
    /// connection found meanwhile resolves at once.
    fn preparation(self: &Arc<Self>, key: FrontendKey) -> Result<Preparation, ConnectError> {
        let mut peers = self.write_peers();
        let now = tokio::time::Instant::now();
        // Forget expired failures and dead connections while we hold the lock anyway: a
        // frontend that restarts or moves leaves its old entry behind, and nothing else
        // would ever remove it.
        let keep_failure = self.settings.backoff.max;
        // Every frontend's connection that died (not: is going away, as the frontend asked)
        // before `keep_failure` is remembered as a failure more in a row when it is pruned,
        // this one's and the others', until their own next preparation.
        let mut deaths = self
            .young_deaths
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        deaths.retain(|_, (_, _, found)| now - *found < keep_failure);
        let died_young_now = |p: &Peer, young: &Young| {
            (!p.is_alive() && !p.is_going_away() && now - young.since < keep_failure)
                .then(|| (young.failures + 1, now - young.since, now))
        };
        let own = match peers.get(&key) {
            Some(Entry::Ready(p, young)) => died_young_now(p, young),
            _ => None,
        };
        peers.retain(|k, e| match e {
            Entry::Failed { retry_at, .. } => *retry_at + keep_failure > now,
            Entry::Ready(p, young) => {
                let done = p.inner.done.is_cancelled();
                if let (true, Some(death)) = (done, died_young_now(p, young)) {
                    deaths.insert(*k, death);
                }
                !done
            }
            Entry::Preparing { .. } => true,
        });
        let recorded = deaths.remove(&key);
        drop(deaths);
        let died_young = own
            .or(recorded)
            .map(|(failures, lived, _)| (failures, lived));
        let failures = match peers.get(&key) {
            Some(Entry::Ready(p, _)) if p.is_usable() => {
                let p = p.clone();
                return Ok(futures::future::ready(Ok(p)).boxed().shared());
            }
            Some(Entry::Ready(p, _)) => {
                if p.is_alive() {
                    // Going away: its open streams finish on it; new ones get a new one.
                    let mut draining = self.draining();
                    draining.retain(Peer::is_alive);
                    draining.push(p.clone());
                }
                died_young.map_or(0, |(failures, _)| failures)
            }
            // Pruned above: it died.
            None if died_young.is_some() => died_young.map_or(0, |(failures, _)| failures),
            Some(Entry::Preparing { done, .. }) => return Ok(done.clone()),
            Some(Entry::Failed {
                at,
                retry_at,
                error,
                ..
            }) if now < *retry_at => {
                return Err(ConnectError::BackingOff {
                    addr: key.1,
                    ago: now - *at,
                    retry_in: *retry_at - now,
                    last: Box::new(error.clone()),
                });
            }
            Some(Entry::Failed { failures, .. }) => *failures,
            None => 0,
        };
        // The first connection that dies young is replaced at once, as any dead one; one that
        // died young after another failure waits, as a failed preparation does.
        if let Some((_, lived)) = died_young
            && failures >= 2
        {
            let b = self.settings.backoff;
            let wait = b.min.saturating_mul(1 << (failures - 2).min(16)).min(b.max);
            let error = ConnectError::Ended { addr: key.1, lived };
            tracing::debug!(instance = %key.0, addr = %key.1, ?lived, ?wait, "connection to frontend ended young");
            peers.insert(
                key,
                Entry::Failed {
                    at: now,
                    retry_at: now + wait,
                    failures,
                    error: error.clone(),
                },
            );
            return Err(ConnectError::BackingOff {
                addr: key.1,
                ago: Duration::ZERO,
                retry_in: wait,
                last: Box::new(error),
            });
        }
        let id = self.next_preparation.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let inner = self.clone();
        self.tracker.spawn(async move {
            let timeout = inner.settings.prepare_timeout;
            let result = tokio::time::timeout(timeout, prepare(&inner, key))
                .await
                .unwrap_or_else(|_| {
                    Err(ConnectError::Timeout {
                        addr: key.1,
                        timeout,
                    })
                });
            let result = inner.record(key, id, result);
            // Nobody may be waiting any more: the outcome is recorded either way.
            drop(tx.send(result));
        });
        let done = async move { rx.await.unwrap_or(Err(ConnectError::ShuttingDown)) }
            .boxed()
            .shared();
        peers.insert(
            key,
            Entry::Preparing {
                id,
                done: done.clone(),
                failures,
            },
        );
        Ok(done)
    }

    /// Records the outcome of preparation `id` of `key`, unless the endpoint closed meanwhile
    /// (then a new connection is closed at once and the outcome is `ShuttingDown`).
    fn record(
        &self,
        key: FrontendKey,
        id: u64,
        result: Result<Peer, ConnectError>,
    ) -> Result<Peer, ConnectError> {
        let mut peers = self.write_peers();
        if self.token.is_cancelled() {
            if let Ok(p) = &result {
                close_for_shutdown(p);
            }
            return Err(ConnectError::ShuttingDown);
        }
        let failures_before = match peers.get(&key) {
            Some(Entry::Preparing {
                id: current,
                failures,
                ..
            }) if *current == id => *failures,
            // Not ours (cannot happen while it runs; kept for safety): leave the entry be.
            _ => return result,
        };
        match &result {
            Ok(p) => {
                let young = Young {
                    since: tokio::time::Instant::now(),
                    failures: failures_before,
                };
                peers.insert(key, Entry::Ready(p.clone(), young));
            }
            Err(error) => {
                let failures = failures_before + 1;
                let b = self.settings.backoff;
                let wait = b.min.saturating_mul(1 << (failures - 1).min(16)).min(b.max);
                let at = tokio::time::Instant::now();
                tracing::debug!(instance = %key.0, addr = %key.1, %error, ?wait, "connection preparation failed");
                peers.insert(
                    key,
                    Entry::Failed {
                        at,
                        retry_at: at + wait,
                        failures,
                        error: error.clone(),
                    },
                );
            }
        }
        result
    }
}

fn close_for_shutdown(p: &Peer) {
    p.close(velo_wire::CloseCode::SHUTTING_DOWN, "worker shutting down");
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
/// prologue too large, or a large prologue while every lane is full: see
/// [`open_when_room`]).
pub fn open_on(
    peer: &Peer,
    ticket: u64,
    token: &Token,
    prologue: &[u8],
) -> Result<SendStream, StreamError> {
    let key = peer.with(|st, now| st.mux.open(now, ticket, token, prologue))?;
    Ok(SendStream::new(peer.clone(), key))
}

/// Opens a stream on an existing connection like [`open_on`], waiting while a large
/// prologue finds every lane's buffer full (the peer is not reading) instead of failing.
///
/// # Errors
///
/// As [`open_on`], except [`OpenError::LaneFull`](velo_mux::OpenError::LaneFull).
pub async fn open_when_room(
    peer: &Peer,
    ticket: u64,
    token: &Token,
    prologue: &[u8],
) -> Result<SendStream, StreamError> {
    let key = std::future::poll_fn(|cx| {
        peer.with(|st, now| match st.mux.open(now, ticket, token, prologue) {
            Err(velo_mux::OpenError::LaneFull) => {
                for i in 0..st.mux.config().lanes() {
                    Peer::register_lane(st, LaneId(i), cx.waker());
                }
                std::task::Poll::Pending
            }
            r => std::task::Poll::Ready(r),
        })
    })
    .await?;
    Ok(SendStream::new(peer.clone(), key))
}

async fn prepare(
    inner: &Arc<WorkerInner>,
    (instance, addr): FrontendKey,
) -> Result<Peer, ConnectError> {
    let mux_config = inner.settings.mux.clone();
    let lanes = mux_config.lanes();
    // A fresh id per connection: see docs/protocol.md, HELLO instance_id.
    let me = new_instance_id();
    let dials = (0..lanes).map(|i| {
        let mut hello = mux_config.hello(i, me, instance);
        hello.worker_instance = inner.settings.worker_instance;
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
        None,
        Some(announcer(inner, (instance, addr))),
        &inner.abort,
        inner.retired.clone(),
    );
    // Held while the lanes start: one that dies at once must not leave the connection done
    // (and refusing the next lanes) before they are all up.
    peer.hold();
    for (i, (hello, io)) in lanes_io.into_iter().enumerate() {
        let lane = LaneId(u16::try_from(i).expect("at most 64 lanes"));
        let started = peer.start_lane(lane, &hello, io, &inner.tracker, inner.settings.read_buffer);
        debug_assert!(started.is_ok(), "a held connection is never done");
    }
    peer.pump_ended();
    tracing::debug!(%instance, %addr, lanes, "connection to frontend prepared");
    Ok(peer)
}

/// What a connection to `frontend` does with streams whose lane died before the frontend
/// accepted them: announces each loss again, so the frontend's request ends instead of
/// waiting for a stream that is gone. See [`announce_lost`].
fn announcer(inner: &Arc<WorkerInner>, frontend: FrontendKey) -> crate::peer::LostOpens {
    let weak = Arc::downgrade(inner);
    Arc::new(move |dying: &Peer, lost: Vec<crate::peer::LostOpen>| {
        let Some(inner) = weak.upgrade() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(
                streams = lost.len(),
                "no runtime to announce lost streams on"
            );
            return;
        };
        let endpoint = WorkerEndpoint {
            inner: inner.clone(),
        };
        let announce = announce_lost(endpoint, dying.clone(), frontend, lost);
        inner.tracker.spawn_on(announce, &runtime);
    })
}

/// Announces each lost stream: an OPEN with its registration and an empty prologue (the
/// worker abandoned it, see docs/protocol.md), then an ERROR. It goes on another usable
/// connection to that frontend instance if there is one (the address in the request may be
/// the very path that failed: a proxy, a port that moved), else on the dying connection's
/// remaining lanes, else on a new connection at the address. An announcement that is lost
/// too is announced again, at most [`velo_mux::ANNOUNCEMENTS`] times in all.
async fn announce_lost(
    endpoint: WorkerEndpoint,
    dying: Peer,
    (instance, addr): FrontendKey,
    lost: Vec<crate::peer::LostOpen>,
) {
    let other = endpoint.inner.read_peers().values().find_map(|e| match e {
        Entry::Ready(p, _)
            if p.instance() == instance
                && p.is_usable()
                && !Arc::ptr_eq(&p.inner, &dying.inner) =>
        {
            Some(p.clone())
        }
        _ => None,
    });
    let found = match other {
        Some(peer) => Ok(peer),
        None if dying.is_usable() => Ok(dying),
        None => endpoint.peer(addr, instance).await,
    };
    let peer = match found {
        Ok(peer) => peer,
        Err(e) => {
            tracing::debug!(%addr, error = %e, streams = lost.len(), "cannot announce lost streams");
            return;
        }
    };
    for (ticket, token, remaining) in lost {
        let sent = peer.with(|st, now| {
            let key = st.mux.open(now, ticket, &token, &[])?;
            st.mux.set_announcements(key, remaining);
            let reason = "the stream's lane was lost before the frontend took it";
            st.mux
                .reset(now, key, velo_mux::RESET_DROPPED, reason)
                .map_err(StreamError::Misuse)?;
            st.mux.release(now, key);
            Ok::<_, StreamError>(())
        });
        if let Err(e) = sent {
            tracing::debug!(%addr, ticket, error = %e, "cannot announce a lost stream");
        }
    }
}
