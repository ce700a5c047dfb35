//! The transport's own counters (the mux counts records, batches and streams).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn inc(&self) {
        self.add(1);
    }
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) connections_accepted: Counter,
    pub(crate) connections_refused: Counter,
    pub(crate) endpoint_errors: Counter,
    pub(crate) messages_sent: Counter,
    pub(crate) messages_received: Counter,
    pub(crate) rendezvous_received: Counter,
    pub(crate) reordered: Counter,
    pub(crate) wakeups: Counter,
}

/// Counters of a UCX frontend's or worker's driver since it started (the handshake counters
/// are velo-session's, the same for every transport).
#[non_exhaustive]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UcxStats {
    /// UCX connection requests the listener accepted into the accept queue (frontend).
    pub requests_accepted: u64,
    /// Connection requests rejected because the accept queue was full or the listener was
    /// stopping (frontend).
    pub requests_rejected: u64,
    /// UCX endpoint errors (peer gone, connection reset, unreachable): each fails its lane.
    pub endpoint_errors: u64,
    /// Active messages sent.
    pub messages_sent: u64,
    /// Active messages received.
    pub messages_received: u64,
    /// Received messages that came by rendezvous (payload fetched after the handler).
    pub rendezvous_received: u64,
    /// Received messages whose bytes had to wait for an earlier rendezvous payload.
    pub reordered: u64,
    /// Times the progress engine slept on the UCX event fd and was woken.
    pub wakeups: u64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> UcxStats {
        UcxStats {
            requests_accepted: self.connections_accepted.get(),
            requests_rejected: self.connections_refused.get(),
            endpoint_errors: self.endpoint_errors.get(),
            messages_sent: self.messages_sent.get(),
            messages_received: self.messages_received.get(),
            rendezvous_received: self.rendezvous_received.get(),
            reordered: self.reordered.get(),
            wakeups: self.wakeups.get(),
        }
    }
}
