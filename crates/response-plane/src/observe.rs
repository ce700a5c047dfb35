//! What a plane tells about its streams as they come and go: in-flight counts (and a drain
//! notice), stream errors, and an optional observer for setup times. This is what a runtime
//! needs for metrics and bounded shutdown, so it can hand out the plane's own handles.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::stats::PlaneCounters;

/// Hooks a plane calls as streams are set up. Called on the caller's task: keep it cheap.
pub trait PlaneObserver: Send + Sync + 'static {
    /// A stream was set up after `elapsed`: frontend, from registration to its prologue;
    /// worker, the connect.
    fn stream_set_up(&self, elapsed: Duration);
}

/// A plane's live stream accounting, shared with its handles.
pub(crate) struct Streams {
    in_flight: AtomicU64,
    /// The plane's counters (stream errors are counted here).
    counters: Arc<PlaneCounters>,
    idle: Notify,
    observer: Option<Arc<dyn PlaneObserver>>,
}

impl Streams {
    pub(crate) fn new(
        counters: Arc<PlaneCounters>,
        observer: Option<Arc<dyn PlaneObserver>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            in_flight: AtomicU64::new(0),
            counters,
            idle: Notify::new(),
            observer,
        })
    }

    /// Streams handed out and not yet ended or dropped.
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    pub(crate) fn error(&self) {
        self.counters.stream_errors.inc();
    }

    pub(crate) fn set_up(&self, elapsed: Duration) {
        if let Some(o) = &self.observer {
            o.stream_set_up(elapsed);
        }
    }

    /// Resolves once no stream is in flight.
    pub(crate) async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Registered before the check, so an end in between is not missed.
            idle.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// Counts one stream in flight until it ends or is dropped.
pub(crate) struct InFlight(Option<Arc<Streams>>);

impl InFlight {
    pub(crate) fn new(streams: &Arc<Streams>) -> Self {
        streams.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(Some(streams.clone()))
    }

    /// Counts an error that did not end the stream (the caller's mistake).
    pub(crate) fn count_error(&self) {
        if let Some(streams) = &self.0 {
            streams.error();
        }
    }

    /// The stream ended, with `error` if it failed (cancellations are not errors). Counts
    /// once; later calls and the drop do nothing.
    pub(crate) fn end(&mut self, error: Option<&crate::ResponseError>) {
        if let Some(streams) = self.0.take() {
            if error.is_some_and(|e| !e.is_cancelled()) {
                streams.error();
            }
            if streams.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
                streams.idle.notify_waiters();
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.end(None);
    }
}
