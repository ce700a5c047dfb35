//! The worker's side of the request plane: accepts frontend connections and hands every
//! request frame to the worker, within [`WorkLimits`] (see the parent module's bounds).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Requests a worker holds at once by default (read and not yet finished). It is the
/// frontend's default `max_in_flight`, so one frontend at its own limit is not held back, and
/// four times what the default four engines run at once (256 each): the rest wait their turn.
pub const DEFAULT_MAX_REQUESTS: usize = 4096;
/// Request-plane connections a worker serves at once by default. A frontend opens one per
/// worker, so this is room for a thousand frontends; a connection costs a task, a socket and
/// a read buffer of at most one frame.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// How long the accept loop pauses after an accept error (out of file descriptors: retrying
/// at once would spin).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// What a worker's request plane may hold, whatever its peers send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkLimits {
    /// Requests held at once: read off a connection and not yet finished (their response
    /// stream still open, or still being set up). At the limit, connections stop reading.
    pub max_requests: usize,
    /// Connections served at once; more wait in the kernel's accept queue.
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

/// The worker's side: accepts frontend connections on `listener` and hands every request
/// frame to `deliver`, until `stop`, within `limits`. Connections run on `tracker`.
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
    tracker: TaskTracker,
    stop: CancellationToken,
    deliver: impl Fn(Bytes) + Clone + Send + 'static,
) -> Result<(), WorkLimitError> {
    limits.validate()?;
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let requests = Arc::new(Semaphore::new(limits.max_requests));
    loop {
        // Cancel safety: a permit or a connection not yet taken is simply not taken.
        let slot = tokio::select! {
            slot = connections.clone().acquire_owned() => slot,
            () = stop.cancelled() => return Ok(()),
        };
        let Ok(slot) = slot else { return Ok(()) };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => return Ok(()),
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a request-plane connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = read_requests(stream, requests.clone(), stop.clone(), deliver.clone());
        tracker.spawn(async move {
            connection.await;
            drop(slot);
        });
    }
}

/// One connection: reads a frame, waits for its place, delivers it; until the connection
/// ends, sends a bad frame, or `stop`.
async fn read_requests(
    stream: TcpStream,
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
