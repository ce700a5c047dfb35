//! The frontend's accept loop: takes raw lanes from a transport's [`LaneListener`], runs each
//! handshake in a task of its own under a deadline, holds at most `max_connections`, and
//! attaches every handshaken lane to its worker's connection.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_wire::{CloseCode, Frame};

use crate::FrontendEndpoint;
use crate::handshake::{ReadError, read_frame, refuse, write_frame};
use crate::io::{LaneListener, RawLane, handshaken};
use crate::stats::{HandshakeCounters, HandshakeStats};

/// Default time a new connection has to complete its handshake: 5 s. A peer that connects and
/// says nothing holds one connection slot for at most this long.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default cap on connections a frontend holds (lanes plus handshakes in progress).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Pause after a failed accept (out of file descriptors and the like), so the loop does not
/// spin on an error that persists.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// Bounds of a frontend's accept loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptSettings {
    /// Time a new connection has to complete its handshake.
    pub handshake_timeout: Duration,
    /// Connections held at most (lanes plus handshakes in progress); more are refused with
    /// CLOSE `limit`.
    pub max_connections: usize,
}

impl Default for AcceptSettings {
    fn default() -> Self {
        Self {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
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
        let slots = Arc::new(Semaphore::new(self.settings.max_connections));
        let counters = &self.accepting.counters;
        loop {
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
            self.take(lane, &slots);
        }
        self.accepting.done.cancel();
    }

    /// Starts `lane`'s handshake in a task of its own, or refuses it at the limit.
    fn take(&self, mut lane: Box<dyn RawLane>, slots: &Arc<Semaphore>) {
        let counters = self.accepting.counters.clone();
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            counters.connections_refused.inc();
            self.tracker.spawn(async move {
                refuse(
                    &mut *lane,
                    CloseCode::LIMIT,
                    "frontend is at its connection limit",
                )
                .await;
            });
            return;
        };
        let (endpoint, timeout) = (self.endpoint.clone(), self.settings.handshake_timeout);
        let stop = self.accepting.stop.clone();
        self.tracker.spawn(async move {
            // Cancel safety: dropping a handshake drops its lane, which the peer sees end.
            tokio::select! {
                () = handshake(lane, slot, endpoint, timeout, &counters) => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

/// One lane's handshake: HELLO in, answer out, attach; or a refusal naming what was wrong.
async fn handshake(
    mut lane: Box<dyn RawLane>,
    slot: OwnedSemaphorePermit,
    endpoint: FrontendEndpoint,
    timeout: Duration,
    counters: &HandshakeCounters,
) {
    let mut buf = BytesMut::new();
    let hello = match tokio::time::timeout(timeout, read_frame(&mut *lane, &mut buf)).await {
        Err(_) => {
            counters.handshake_timeouts.inc();
            tracing::debug!("handshake timed out");
            let reason = "no handshake within the timeout";
            return refuse(&mut *lane, CloseCode::BAD_HANDSHAKE, reason).await;
        }
        Ok(Err(ReadError::Wire(e))) => {
            counters.handshake_failures.inc();
            tracing::debug!(error = %e, "invalid handshake");
            return refuse(&mut *lane, e.close_code(), &e.to_string()).await;
        }
        Ok(Err(ReadError::Io(_) | ReadError::Eof)) => {
            counters.handshake_failures.inc();
            return;
        }
        Ok(Ok(Frame::Hello(hello))) => hello,
        Ok(Ok(_)) => {
            counters.handshake_failures.inc();
            let reason = "expected HELLO as the first frame";
            return refuse(&mut *lane, CloseCode::BAD_HANDSHAKE, reason).await;
        }
    };
    let answer = match endpoint.answer(&hello) {
        Ok(answer) => answer,
        Err(e) => {
            counters.handshake_failures.inc();
            tracing::debug!(error = %e, "handshake refused");
            return refuse(&mut *lane, e.close_code(), &e.to_string()).await;
        }
    };
    if let Err(e) = write_frame(&mut *lane, Frame::Hello(answer)).await {
        tracing::debug!(error = %e, "writing the handshake failed");
        counters.handshake_failures.inc();
        return;
    }
    // Nothing is sent on a lane before its handshake completes, so there is no race between
    // the answer above and the lane's tasks starting below.
    match endpoint.attach_lane(&hello, handshaken(lane, buf, Some(slot))) {
        Ok(()) => counters.lanes_accepted.inc(),
        Err(e) => {
            // Only a race with another lane or with shutdown gets here (`answer` checked the
            // rest); the dropped lane ends, and the worker sees it.
            counters.handshake_failures.inc();
            tracing::debug!(error = %e, "lane not attached");
        }
    }
}
