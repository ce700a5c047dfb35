//! The worker's side of the request plane: accepts frontend connections, admits those whose
//! handshake succeeds (TLS when on, then [`super::auth`]) and hands every request frame they send to the
//! worker, within [`WorkLimits`] (see the parent module's bounds).
//!
//! Connections in their handshake are bounded twice, as on the response plane's accept loop
//! (velo-session's `HandshakeBudget`, whose rule this reuses): [`MAX_HANDSHAKES`] in all, and
//! [`MAX_HANDSHAKES_PER_SOURCE`] from one source address. The accept loop takes a handshake
//! place before it accepts, so past the first bound connections wait in the kernel's accept
//! queue; it then closes at once, unread and ungreeted, a connection whose source is at the
//! second (the place goes to the next connection), so one stranger's silent connections
//! cannot hold every place and keep a frontend's handshake waiting behind them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_session::{Exhausted, HandshakeBudget, HandshakeTicket};

use super::auth::RequestAuth;
use super::tls::Link;
pub use refusals::REFUSAL_WARN_INTERVAL;
use refusals::RefusalLog;

mod refusals;

/// Requests a worker holds at once by default (read and not yet finished). It is the
/// frontend's default `max_in_flight`, so one frontend at its own limit is not held back, and
/// four times what the default four engines run at once (256 each): the rest wait their turn.
pub const DEFAULT_MAX_REQUESTS: usize = 4096;
/// Request-plane connections a worker serves at once by default. A frontend opens one per
/// worker, so this is room for a thousand frontends; a connection costs a task, a socket and
/// a read buffer of at most one frame.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Connections a worker runs the handshake of at once (TLS and the secret's, each for at most
/// [`HANDSHAKE_TIMEOUT`](super::auth::HANDSHAKE_TIMEOUT)); more wait in the kernel's accept
/// queue. Apart from [`WorkLimits::max_connections`], which only connections past their
/// handshake take: strangers who connect and say nothing hold these places, never a
/// frontend's. A connection past its handshake keeps its place until it has a connection
/// slot, so at most this many wait for one.
pub const MAX_HANDSHAKES: usize = 64;
/// Connections from one source address (an IPv4 address; an IPv6 /64, which one host fills
/// with addresses at will) a worker runs the handshake of at once. A frontend process opens
/// one connection per worker, so even a host of several frontends reconnecting together needs
/// few; past it a connection is closed at once, unread and without a place among the
/// [`MAX_HANDSHAKES`], and its frontend tries again after a pause. So a stranger needs
/// `MAX_HANDSHAKES / MAX_HANDSHAKES_PER_SOURCE` (8) addresses to hold every place.
pub const MAX_HANDSHAKES_PER_SOURCE: usize = 8;
/// How long the accept loop pauses after an accept error (out of file descriptors: retrying
/// at once would spin).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// What a worker's request plane may hold, whatever its peers send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkLimits {
    /// Requests held at once: read off a connection and not yet finished (their response
    /// stream still open, or still being set up). At the limit, connections stop reading.
    pub max_requests: usize,
    /// Connections served at once past their handshake (those in it count against
    /// [`MAX_HANDSHAKES`] instead); one whose handshake succeeds waits for a slot, reading
    /// nothing, while every slot is taken.
    pub max_connections: usize,
}

impl Default for WorkLimits {
    fn default() -> Self {
        Self {
            max_requests: DEFAULT_MAX_REQUESTS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// A [`WorkLimits`] bound out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} is {value}: it must be between 1 and {max}")]
pub struct WorkLimitError {
    /// The bound, as the configuration and the command line name it.
    pub name: &'static str,
    /// The value given.
    pub value: usize,
    /// The largest value allowed.
    pub max: usize,
}

impl WorkLimits {
    /// Checks every bound is at least 1 and at most what a semaphore can count.
    ///
    /// # Errors
    ///
    /// [`WorkLimitError`] naming the first bound out of range.
    pub fn validate(&self) -> Result<(), WorkLimitError> {
        let check = |name, value| {
            if (1..=Semaphore::MAX_PERMITS).contains(&value) {
                Ok(())
            } else {
                Err(WorkLimitError {
                    name,
                    value,
                    max: Semaphore::MAX_PERMITS,
                })
            }
        };
        check("max_requests (--max-requests)", self.max_requests)?;
        check(
            "max_connections (--max-request-connections)",
            self.max_connections,
        )
    }
}

/// What a worker's request plane counted, as it happens.
#[derive(Debug, Default)]
pub struct IntakeStats {
    /// Connections closed because their handshake failed (a peer without the secret or with
    /// another one, one that did not greet, a secret or TLS on one side only, or a frontend
    /// meaning another worker instance), or was never begun: their source address had
    /// [`MAX_HANDSHAKES_PER_SOURCE`] in progress (those are also counted in
    /// [`handshakes_refused_per_source`](Self::handshakes_refused_per_source)). None of their
    /// bytes past the handshake was read. Each is logged at debug; a warning goes out at most
    /// once per [`REFUSAL_WARN_INTERVAL`], with how many were refused since the last one.
    pub handshakes_refused: AtomicU64,
    /// Connections closed at once, unread and ungreeted, because their source address had
    /// [`MAX_HANDSHAKES_PER_SOURCE`] handshakes in progress (part of `handshakes_refused`).
    pub handshakes_refused_per_source: AtomicU64,
}

/// The worker's side: accepts frontend connections on `listener`, runs the handshake under
/// `auth` on each (TLS as the client when `auth` has it, then the secret's; one that fails is
/// closed unread and counted in `stats`), and hands every
/// request frame of the admitted ones to `deliver`, until `stop`, within `limits`: at most
/// [`MAX_HANDSHAKES`] connections in their handshake ([`MAX_HANDSHAKES_PER_SOURCE`] from one
/// source address: one past it is closed at once and counted), and `limits.max_connections`
/// past it. Connections run on `tracker`. Without a secret in `auth`, warns once that anyone who
/// reaches the port is served.
///
/// Every frame handed to `deliver` holds one of `limits.max_requests` places for as long as
/// it (or any clone of it) lives: whoever keeps the request keeps its place, and dropping it
/// gives the place back. A connection whose next frame finds no place waits, reading nothing
/// more, so its sender's writes block on TCP flow control.
///
/// # Errors
///
/// [`WorkLimitError`] at once, serving nothing, when a bound is out of range.
pub async fn serve(
    listener: TcpListener,
    limits: WorkLimits,
    auth: RequestAuth,
    stats: Arc<IntakeStats>,
    tracker: TaskTracker,
    stop: CancellationToken,
    deliver: impl Fn(Bytes) + Clone + Send + 'static,
) -> Result<(), WorkLimitError> {
    limits.validate()?;
    if !auth.has_secret() {
        tracing::warn!(
            addr = ?listener.local_addr().ok(),
            "the request plane accepts anyone who reaches its port: no cluster secret \
             (DYN_VELO_CLUSTER_SECRET_PATH) authenticates its frontends"
        );
    }
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let requests = Arc::new(Semaphore::new(limits.max_requests));
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    // Each of its tickets is taken while holding one of `handshakes`' places and given back
    // no later than that place, so it holds at most MAX_HANDSHAKES tickets (and sources: a
    // source is forgotten with its last ticket) and its total is never what refuses.
    let sources = HandshakeBudget::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE);
    let refusals = Arc::new(RefusalLog::default());
    loop {
        // Cancel safety: a permit or a connection not yet taken is simply not taken.
        let place = tokio::select! {
            place = handshakes.clone().acquire_owned() => place,
            () = stop.cancelled() => return Ok(()),
        };
        let Ok(place) = place else { return Ok(()) };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => return Ok(()),
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a request-plane connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let source = match sources.enter(Some(peer.ip())) {
            Ok(source) => source,
            Err(exhausted) => {
                // Closed unread (dropping `stream`) before any byte is written: no task, and
                // `place` goes to the next connection.
                stats
                    .handshakes_refused_per_source
                    .fetch_add(1, Ordering::Relaxed);
                refusals.record(&stats, peer, &exhausted_reason(exhausted));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            peer,
            auth: auth.clone(),
            stats: stats.clone(),
            refusals: refusals.clone(),
            connections: connections.clone(),
            requests: requests.clone(),
            stop: stop.clone(),
        };
        tracker.spawn(connection.serve(stream, place, source, deliver.clone()));
    }
}

/// Why the source budget refused a connection, for the log.
fn exhausted_reason(exhausted: Exhausted) -> &'static str {
    match exhausted {
        Exhausted::Source => "too many handshakes in progress from this address",
        // Not met: the total is bounded by the handshake places first (see `serve`).
        Exhausted::Total => "too many handshakes in progress",
    }
}

/// What one connection's task shares with [`serve`].
struct Connection {
    peer: SocketAddr,
    auth: RequestAuth,
    stats: Arc<IntakeStats>,
    refusals: Arc<RefusalLog>,
    connections: Arc<Semaphore>,
    requests: Arc<Semaphore>,
    stop: CancellationToken,
}

impl Connection {
    /// The handshake, holding `place` among the [`MAX_HANDSHAKES`] and `source`, its
    /// source's share of them; then a connection slot, and the requests; until either fails,
    /// the connection ends, or `stop`.
    async fn serve(
        self,
        stream: TcpStream,
        place: OwnedSemaphorePermit,
        source: HandshakeTicket,
        deliver: impl Fn(Bytes),
    ) {
        // Cancel safety: a handshake cut short by `stop` only closes its connection.
        let admitted = tokio::select! {
            r = super::tls::worker_open(stream, self.peer.ip(), &self.auth) => r,
            () = self.stop.cancelled() => return,
        };
        // The handshake is over: its source may begin another.
        drop(source);
        let link = match admitted {
            Ok(link) => link,
            Err(e) => {
                self.refusals.record(&self.stats, self.peer, &e);
                return;
            }
        };
        // Authenticated: the handshake's place is traded for a slot, once one is free.
        // Cancel safety: a slot not yet taken is simply not taken.
        let slot = tokio::select! {
            slot = self.connections.acquire_owned() => slot,
            () = self.stop.cancelled() => return,
        };
        let Ok(_slot) = slot else { return };
        drop(place);
        read_requests(link, self.requests, self.stop, deliver).await;
    }
}

/// One connection: reads a frame, waits for its place, delivers it; until the connection
/// ends, sends a bad frame, or `stop`.
async fn read_requests(
    stream: Link,
    requests: Arc<Semaphore>,
    stop: CancellationToken,
    deliver: impl Fn(Bytes),
) {
    let mut frames = FramedRead::new(stream, super::codec());
    loop {
        // Cancel safety: `next` loses no frame when the other branch wins (the connection
        // ends anyway).
        let frame = tokio::select! {
            f = frames.next() => f,
            () = stop.cancelled() => return,
        };
        let frame = match frame {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "bad request frame: closing the connection");
                return;
            }
            None => return,
        };
        // Backpressure: until a place frees up, nothing more is read off this connection.
        let place = tokio::select! {
            p = requests.clone().acquire_owned() => p,
            () = stop.cancelled() => return,
        };
        let Ok(place) = place else { return };
        deliver(Bytes::from_owner(Held {
            frame: frame.as_ref().into(),
            _place: place,
        }));
    }
}

/// A request frame holding its place among the worker's `max_requests`, given back when the
/// last [`Bytes`] made of it is dropped. The frame is copied out of the connection's read
/// buffer, so holding a request holds its own bytes only, not that buffer.
struct Held {
    frame: Box<[u8]>,
    _place: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.frame
    }
}
