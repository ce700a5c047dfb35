//! How a worker reports refused handshakes: each at debug, and a warning at most once per
//! [`REFUSAL_WARN_INTERVAL`] with how many were refused since the last one, so a stranger
//! hammering the port cannot flood the log.

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::IntakeStats;

/// The least time between two warnings of refused request-plane handshakes.
pub const REFUSAL_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// When the last warning went out, and the refusal count (`handshakes_refused`) it covered.
#[derive(Debug, Default)]
pub(super) struct RefusalLog {
    last: Mutex<Option<(Instant, u64)>>,
}

impl RefusalLog {
    /// Counts a connection from `peer` closed without a completed handshake, for `why`, in
    /// `stats.handshakes_refused`; logs it at debug, and warns when one is due.
    pub(super) fn record(&self, stats: &IntakeStats, peer: SocketAddr, why: &dyn Display) {
        let before = stats.handshakes_refused.fetch_add(1, Ordering::Relaxed);
        let total = before.saturating_add(1);
        tracing::debug!(%peer, error = %why, "request-plane handshake refused: closing the connection");
        // Anyone can fail a handshake as often as they like: one warning per interval.
        if let Some(refused) = self.due(Instant::now(), total) {
            tracing::warn!(
                %peer, error = %why, refused,
                "request-plane handshakes refused, their connections closed: {refused} since \
                 the last warning (at most one per {REFUSAL_WARN_INTERVAL:?}; each is logged \
                 at debug); the latest is this one"
            );
        }
    }

    /// Whether to warn at `now` of a refusal that brought the count to `total`: `Some` with the
    /// refusals since the last warning (this one included) when one is due, else `None`.
    pub(super) fn due(&self, now: Instant, total: u64) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let since = match *last {
            Some((at, _)) if now.saturating_duration_since(at) < REFUSAL_WARN_INTERVAL => {
                return None;
            }
            Some((_, covered)) => total.saturating_sub(covered),
            None => total,
        };
        *last = Some((now, total));
        Some(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_at_the_first_refusal_then_once_per_interval_with_the_count_since() {
        let log = RefusalLog::default();
        let t0 = Instant::now();
        assert_eq!(log.due(t0, 1), Some(1));
        for total in 2..=500 {
            assert_eq!(log.due(t0 + Duration::from_millis(total), total), None);
        }
        let later = t0 + REFUSAL_WARN_INTERVAL;
        assert_eq!(log.due(later, 501), Some(500));
        assert_eq!(log.due(later + Duration::from_secs(1), 502), None);
        assert_eq!(log.due(later + REFUSAL_WARN_INTERVAL * 3, 503), Some(2));
    }
}
