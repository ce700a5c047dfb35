//! The one place the session layer reads the clock.
//!
//! Through tokio's clock, so tests that pause time (`tokio::time::pause`) drive the mux's
//! timers deterministically.

use std::time::Instant;

/// Now, as the mux wants it.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
