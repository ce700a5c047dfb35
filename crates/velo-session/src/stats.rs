//! The handshake counters, kept by velo-session for every transport (the mux counts
//! records, batches and streams; a transport may count its own extras).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the lanes a frontend accepted or a worker dialed, since the endpoint started.
#[non_exhaustive]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeStats {
    /// Connections accepted (frontend).
    pub connections_accepted: u64,
    /// Connections refused at the connection limit (frontend).
    pub connections_refused: u64,
    /// Accepts that failed (frontend; out of file descriptors and the like).
    pub accept_errors: u64,
    /// Connections closed because their handshake was invalid, refused or cut short
    /// (garbage bytes, version or identity mismatch) (frontend).
    pub handshake_failures: u64,
    /// Connections closed because they sent no handshake in time (frontend).
    pub handshake_timeouts: u64,
    /// Lanes that completed their handshake (frontend).
    pub lanes_accepted: u64,
    /// Lanes dialed and handshaken (worker).
    pub lanes_dialed: u64,
    /// Lane dials or handshakes that failed (worker).
    pub dial_failures: u64,
}

impl std::ops::AddAssign for HandshakeStats {
    fn add_assign(&mut self, b: Self) {
        self.connections_accepted += b.connections_accepted;
        self.connections_refused += b.connections_refused;
        self.accept_errors += b.accept_errors;
        self.handshake_failures += b.handshake_failures;
        self.handshake_timeouts += b.handshake_timeouts;
        self.lanes_accepted += b.lanes_accepted;
        self.lanes_dialed += b.lanes_dialed;
        self.dial_failures += b.dial_failures;
    }
}

/// One counter.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The live counters behind [`HandshakeStats`], shared by an endpoint's tasks.
#[derive(Debug, Default)]
pub(crate) struct HandshakeCounters {
    pub(crate) connections_accepted: Counter,
    pub(crate) connections_refused: Counter,
    pub(crate) accept_errors: Counter,
    pub(crate) handshake_failures: Counter,
    pub(crate) handshake_timeouts: Counter,
    pub(crate) lanes_accepted: Counter,
    pub(crate) lanes_dialed: Counter,
    pub(crate) dial_failures: Counter,
}

impl HandshakeCounters {
    pub(crate) fn snapshot(&self) -> HandshakeStats {
        HandshakeStats {
            connections_accepted: self.connections_accepted.get(),
            connections_refused: self.connections_refused.get(),
            accept_errors: self.accept_errors.get(),
            handshake_failures: self.handshake_failures.get(),
            handshake_timeouts: self.handshake_timeouts.get(),
            lanes_accepted: self.lanes_accepted.get(),
            lanes_dialed: self.lanes_dialed.get(),
            dial_failures: self.dial_failures.get(),
        }
    }
}
