//! Certificate rotation without a restart: a running plane checks its TLS files every
//! [`TLS_WATCH_INTERVAL`] and reloads them when any changed (size or modification time).
//! Connections already up keep their session; new ones use the new files. A bad new file
//! is logged and the certificate in use stays.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::security::Security;

/// How often a plane checks its TLS files for a change: 2 s. A `stat` per file, so it costs
/// nothing measurable; a rotation takes effect within this much time (or at once with
/// `reload_tls`).
pub const TLS_WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// The watch of one plane: cancel it to stop, or drop it (with its plane).
pub(crate) struct Watch {
    stop: CancellationToken,
    _guard: DropGuard,
}

impl Watch {
    /// Stops watching.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }
}

/// Watches `security`'s files on `tracker` (nothing to do without TLS).
pub(crate) fn spawn(security: &Security, tracker: &TaskTracker) -> Watch {
    let stop = CancellationToken::new();
    let watch = Watch {
        stop: stop.clone(),
        _guard: stop.clone().drop_guard(),
    };
    let files = security.files();
    if files.is_empty() {
        return watch;
    }
    let security = security.clone();
    // Stamped now, not when the task first runs: a rotation between the two would be taken
    // for the files already loaded and never reloaded.
    let mut seen = stamps(&files);
    tracker.spawn(async move {
        let mut tick = tokio::time::interval(TLS_WATCH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            let now = stamps(&files);
            if now == seen {
                continue;
            }
            match security.reload() {
                Ok(()) => tracing::info!("TLS files changed: reloaded"),
                Err(e) => tracing::warn!(error = %e, "TLS files changed but do not load; the old ones stay in use"),
            }
            seen = now;
        }
    });
    watch
}

/// Each file's size and modification time (`None` while it cannot be read: mid-rotation).
fn stamps(files: &[PathBuf]) -> Vec<Option<(u64, SystemTime)>> {
    files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).ok()?;
            Some((m.len(), m.modified().ok()?))
        })
        .collect()
}
