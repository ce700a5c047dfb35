//! The frontend's accept loop: takes raw lanes from a transport's [`LaneListener`] and runs
//! each handshake in a task of its own, phase by phase, each under its own deadline: the
//! transport's handshake (TLS), then the HELLO exchange with the cluster secret's proof.
//! Connections still in their handshake count against a budget of their own (per source
//! address and in total); only a worker that completed its handshake takes one of the
//! `max_connections` lane places, so a flood of silent or slow handshakes cannot lock real
//! workers out.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_wire::{CloseCode, Frame, Hello, Role, WireError};

use crate::FrontendEndpoint;
use crate::budget::{Exhausted, HandshakeBudget, HandshakeTicket};
use crate::handshake::{ReadError, read_frame, refuse, write_frames};
use crate::io::{EstablishError, LaneListener, RawLane, establish, handshaken};
use crate::stats::{HandshakeCounters, HandshakeStats};

/// Connections the accept loop takes before it yields its thread to other tasks once.
const ACCEPT_BURST: usize = 16;

/// Default time a new connection has to complete its HELLO exchange (after its transport's
/// handshake): 5 s. A peer that connects and says nothing holds a handshake place for at most
/// the transport's deadline plus this.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time a new connection has to complete its transport's own handshake (TLS): 3 s,
/// Dynamo's `DYN_TCP_TLS_HANDSHAKE_TIMEOUT_SECS` default.
pub const DEFAULT_ESTABLISH_TIMEOUT: Duration = Duration::from_secs(3);
/// Default cap on lanes a frontend holds (authenticated connections, each with its handshake
/// done, plus those between their answer and their proof).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default cap on connections in their handshake at once: 256. Workers dial each lane once
/// per frontend, so even a fleet starting at once needs few; a flood past it is refused at
/// once (CLOSE `limit`) and costs no lane place.
pub const DEFAULT_MAX_HANDSHAKES: usize = 256;
/// Default cap on connections in their handshake from one source address: 64 (a host
/// running 16 worker processes of 4 lanes each can start them all at once).
pub const DEFAULT_MAX_HANDSHAKES_PER_SOURCE: usize = 64;
/// Pause after a failed accept (out of file descriptors and the like), so the loop does not
/// spin on an error that persists.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// Bounds of a frontend's accept loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptSettings {
    /// Time a new connection has to complete its transport's handshake (TLS); a lane
    /// without one completes it at once.
    pub establish_timeout: Duration,
    /// Time a connection has, after its transport's handshake, to complete the HELLO
    /// exchange (and the cluster secret's proof).
    pub handshake_timeout: Duration,
    /// Lanes held at most; a worker past it is refused with CLOSE `limit`.
    pub max_connections: usize,
    /// Connections in their handshake at once; more are refused with CLOSE `limit`.
    pub max_handshakes: usize,
    /// Connections in their handshake at once from one source address.
    pub max_handshakes_per_source: usize,
}

impl Default for AcceptSettings {
    fn default() -> Self {
        Self {
            establish_timeout: DEFAULT_ESTABLISH_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_source: DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
        }
    }
}

/// A running accept loop. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Accepting {
    stop: CancellationToken,
    done: CancellationToken,
    counters: Arc<HandshakeCounters>,
}

impl Accepting {
    /// Stops accepting (handshakes in progress are dropped) and waits for the loop to end.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.done.cancelled().await;
    }

    /// Stops accepting at once, without waiting.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// The handshake counters of every lane this loop took.
    pub fn stats(&self) -> HandshakeStats {
        self.counters.snapshot()
    }
}

impl FrontendEndpoint {
    /// Accepts lanes from `listener` until [`Accepting::shutdown`], on this endpoint's
    /// tracker: each new lane gets [`AcceptSettings::handshake_timeout`] to send a HELLO this
    /// endpoint [answers](Self::answer), then joins its worker's connection.
    pub fn accept(&self, listener: impl LaneListener, settings: AcceptSettings) -> Accepting {
        let accepting = Accepting {
            stop: self.closed_token().child_token(),
            done: CancellationToken::new(),
            counters: Arc::new(HandshakeCounters::default()),
        };
        let run = AcceptLoop {
            endpoint: self.clone(),
            settings,
            accepting: accepting.clone(),
            tracker: self.tracker().clone(),
        };
        self.tracker().spawn(run.run(listener));
        accepting
    }
}

struct AcceptLoop {
    endpoint: FrontendEndpoint,
    settings: AcceptSettings,
    accepting: Accepting,
    tracker: TaskTracker,
}

impl AcceptLoop {
    async fn run(self, mut listener: impl LaneListener) {
        let lanes = Arc::new(Semaphore::new(self.settings.max_connections));
        let budget = HandshakeBudget::new(
            self.settings.max_handshakes,
            self.settings.max_handshakes_per_source,
        );
        // Refusals in flight are bounded too: past the bound a connection is dropped without
        // its CLOSE (a flood learns nothing it needs).
        let refusals = Arc::new(Semaphore::new(self.settings.max_handshakes));
        let counters = &self.accepting.counters;
        let mut burst = 0usize;
        loop {
            // A flood is accepted in short bursts: the loop gives its thread back to the lanes'
            // tasks every `ACCEPT_BURST` connections (tokio's own budget allows 128, some
            // milliseconds of accepting and refusing on a thread that lanes share).
            burst += 1;
            if burst == ACCEPT_BURST {
                burst = 0;
                tokio::task::yield_now().await;
            }
            // Cancel safety: `poll_accept` loses no lane when not polled again.
            let accepted = tokio::select! {
                a = std::future::poll_fn(|cx| listener.poll_accept(cx)) => a,
                () = self.accepting.stop.cancelled() => break,
            };
            let lane = match accepted {
                None => break,
                Some(Ok(lane)) => lane,
                Some(Err(e)) => {
                    counters.accept_errors.inc();
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            counters.connections_accepted.inc();
            match budget.enter(lane.peer_addr().map(|a| a.ip())) {
                Ok(ticket) => self.start(lane, ticket, &lanes),
                Err(exhausted) => {
                    counters.handshakes_refused.inc();
                    let reason = match exhausted {
                        Exhausted::Source => "too many handshakes in progress from this address",
                        Exhausted::Total => "too many handshakes in progress",
                    };
                    self.refuse(lane, &refusals, CloseCode::LIMIT, reason);
                }
            }
        }
        self.accepting.done.cancel();
    }

    /// Sends `lane` a refusal, if a refusal place is free: written at once when the socket
    /// takes it (a fresh connection's buffer always does), so a flood costs no task per
    /// connection; otherwise finished in a task of its own, bounded by [`REFUSE_TIMEOUT`].
    ///
    /// [`REFUSE_TIMEOUT`]: crate::handshake::REFUSE_TIMEOUT
    fn refuse(
        &self,
        mut lane: Box<dyn RawLane>,
        refusals: &Arc<Semaphore>,
        code: CloseCode,
        reason: &'static str,
    ) {
        let Ok(permit) = refusals.clone().try_acquire_owned() else {
            return;
        };
        let mut refusal = Box::pin(async move {
            refuse(&mut *lane, code, reason).await;
            drop(permit);
        });
        // A poll that is not ready registers the no-op waker with the socket; the task below
        // polls again at once, which registers its own.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if refusal.as_mut().poll(&mut cx).is_pending() {
            self.tracker.spawn(refusal);
        }
    }

    /// Starts `lane`'s handshake in a task of its own.
    fn start(&self, lane: Box<dyn RawLane>, ticket: HandshakeTicket, lanes: &Arc<Semaphore>) {
        let run = Handshake {
            endpoint: self.endpoint.clone(),
            settings: self.settings,
            counters: self.accepting.counters.clone(),
            lanes: lanes.clone(),
        };
        let stop = self.accepting.stop.clone();
        let (evicted, counters) = (ticket.eviction(), self.accepting.counters.clone());
        self.tracker.spawn(async move {
            // Cancel safety: dropping a handshake drops its lane, which the peer sees end.
            // Eviction only happens before the handshake completes (the ticket is given
            // back then, and nothing cancels its token after).
            tokio::select! {
                () = run.run(lane, ticket) => {}
                () = stop.cancelled() => {}
                () = evicted.cancelled() => {
                    counters.handshakes_evicted.inc();
                    tracing::debug!("handshake dropped: its place went to a lighter source");
                }
            }
        });
    }
}

/// One lane's handshake, phase by phase.
struct Handshake {
    endpoint: FrontendEndpoint,
    settings: AcceptSettings,
    counters: Arc<HandshakeCounters>,
    lanes: Arc<Semaphore>,
}

/// A lane past its handshake: the worker's HELLO, the bytes read past it, its lane place.
type Handshaken = (Hello, BytesMut, OwnedSemaphorePermit);

impl Handshake {
    async fn run(self, mut lane: Box<dyn RawLane>, ticket: HandshakeTicket) {
        if !self.establish(&mut *lane).await {
            return;
        }
        let deadline = self.settings.handshake_timeout;
        let exchanged = tokio::time::timeout(deadline, self.exchange(&mut *lane)).await;
        let (hello, buf, slot) = match exchanged {
            Ok(Some(done)) => done,
            Ok(None) => return, // refused and counted
            Err(_) => {
                self.counters.handshake_timeouts.inc();
                tracing::debug!("handshake timed out");
                let reason = "no handshake within the timeout";
                return refuse(&mut *lane, CloseCode::BAD_HANDSHAKE, reason).await;
            }
        };
        // Authenticated: the handshake place goes back to the budget.
        drop(ticket);
        // Nothing is sent on a lane before its handshake completes, so there is no race
        // between the answer and the lane's tasks starting below.
        match self
            .endpoint
            .attach_lane(&hello, handshaken(lane, buf, Some(slot)))
        {
            Ok(()) => self.counters.lanes_accepted.inc(),
            Err(e) => {
                // Only a race with another lane or with shutdown gets here (`answer` checked
                // the rest); the dropped lane ends, and the worker sees it.
                self.counters.handshake_failures.inc();
                tracing::debug!(error = %e, "lane not attached");
            }
        }
    }

    /// The transport's handshake (TLS) under its deadline. Whether the lane goes on.
    async fn establish(&self, lane: &mut dyn RawLane) -> bool {
        let timeout = self.settings.establish_timeout;
        match tokio::time::timeout(timeout, establish(lane)).await {
            Ok(Ok(())) => true,
            Err(_) => {
                self.counters.establish_timeouts.inc();
                tracing::debug!("transport handshake timed out");
                false
            }
            Ok(Err(EstablishError::WrongProtocol(reason))) => {
                self.counters.establish_failures.inc();
                tracing::debug!(reason, "transport handshake refused");
                refuse(lane, CloseCode::BAD_HANDSHAKE, reason).await;
                false
            }
            Ok(Err(EstablishError::Io(e))) => {
                self.counters.establish_failures.inc();
                tracing::debug!(error = %e, "transport handshake failed");
                false
            }
        }
    }

    /// HELLO in, answer (and this side's proof) out, the worker's proof in; or a refusal
    /// naming what was wrong (`None`, counted).
    async fn exchange(&self, lane: &mut dyn RawLane) -> Option<Handshaken> {
        let mut buf = BytesMut::new();
        let hello = self.read_hello(lane, &mut buf).await?;
        let answer = match self.endpoint.answer(&hello) {
            Ok(answer) => answer,
            Err(e) => {
                self.fail(e.close_code());
                tracing::debug!(error = %e, "handshake refused");
                refuse(lane, e.close_code(), &e.to_string()).await;
                return None;
            }
        };
        let Ok(slot) = self.lanes.clone().try_acquire_owned() else {
            self.counters.connections_refused.inc();
            let reason = "frontend is at its connection limit";
            refuse(lane, CloseCode::LIMIT, reason).await;
            return None;
        };
        let secret = self.endpoint.secret();
        let mut frames = vec![Frame::Hello(answer)];
        frames.extend(secret.map(|s| Frame::Auth(s.proof(Role::Frontend, &hello, &answer))));
        if let Err(e) = write_frames(lane, &frames).await {
            tracing::debug!(error = %e, "writing the handshake failed");
            self.counters.handshake_failures.inc();
            return None;
        }
        if let Some(secret) = secret {
            let proof = self.read_frame(lane, &mut buf).await?;
            let ok = match &proof {
                Frame::Auth(auth) => secret.verify(Role::Worker, &hello, &answer, auth),
                _ => false,
            };
            if !ok {
                self.fail(CloseCode::UNAUTHENTICATED);
                let reason = match proof {
                    Frame::Auth(_) => "wrong proof of the cluster secret",
                    _ => "expected the worker's proof of the cluster secret (AUTH)",
                };
                refuse(lane, CloseCode::UNAUTHENTICATED, reason).await;
                return None;
            }
        }
        Some((hello, buf, slot))
    }

    async fn read_hello(&self, lane: &mut dyn RawLane, buf: &mut BytesMut) -> Option<Hello> {
        match self.read_frame(lane, buf).await? {
            Frame::Hello(hello) => Some(hello),
            _ => {
                self.counters.handshake_failures.inc();
                let reason = "expected HELLO as the first frame";
                refuse(lane, CloseCode::BAD_HANDSHAKE, reason).await;
                None
            }
        }
    }

    /// One handshake frame, or `None` after refusing what is not a frame (counted).
    async fn read_frame(&self, lane: &mut dyn RawLane, buf: &mut BytesMut) -> Option<Frame> {
        match read_frame(lane, buf).await {
            Ok(frame) => Some(frame),
            Err(ReadError::Wire(WireError::UnknownFrame { kind })) if kind == TLS_RECORD => {
                self.counters.handshake_failures.inc();
                let reason = "the peer began a TLS handshake, but this listener does not use TLS";
                refuse(lane, CloseCode::BAD_HANDSHAKE, reason).await;
                None
            }
            Err(ReadError::Wire(e)) => {
                self.counters.handshake_failures.inc();
                tracing::debug!(error = %e, "invalid handshake");
                refuse(lane, e.close_code(), &e.to_string()).await;
                None
            }
            Err(ReadError::Io(_) | ReadError::Eof) => {
                self.counters.handshake_failures.inc();
                None
            }
        }
    }

    /// Counts a refused handshake by its code.
    fn fail(&self, code: CloseCode) {
        if code == CloseCode::UNAUTHENTICATED {
            self.counters.auth_failures.inc();
        } else {
            self.counters.handshake_failures.inc();
        }
    }
}

/// The first byte of a TLS handshake record: what a TLS client sends a plaintext listener.
const TLS_RECORD: u8 = 0x16;
