//! Certificate rotation on the request plane, as on the response plane: a running frontend or
//! worker checks its request plane's TLS files every [`TLS_WATCH_INTERVAL`] and rereads them
//! when any changed (size or modification time). New connections then use the new files;
//! connections already up keep their session. A file that does not load is logged with its
//! error, and the certificate in use stays.
//!
//! The response plane runs a watch of its own over the same files, but its TLS objects are
//! its own (not in its public API), so the request plane's copy is watched here, with the
//! same rule and the same interval.

use std::path::PathBuf;
use std::time::SystemTime;

use response_plane::TLS_WATCH_INTERVAL;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::work::auth::RequestAuth;

/// Watches `auth`'s TLS files on `tracker` until `stop` is cancelled; nothing to do (and no
/// task) without TLS. One `stat` per file per [`TLS_WATCH_INTERVAL`], and a reload only on a
/// change: a file that keeps failing to load is tried again only when it changes again.
pub(crate) fn spawn(auth: &RequestAuth, tracker: &TaskTracker, stop: CancellationToken) {
    let files = auth.tls_files();
    if files.is_empty() {
        return;
    }
    let auth = auth.clone();
    // Stamped now, not when the task first runs: a rotation between the two would be taken
    // for the files already loaded and never reloaded.
    let mut seen = stamps(&files);
    tracker.spawn(async move {
        let start = Instant::now() + TLS_WATCH_INTERVAL;
        let mut tick = tokio::time::interval_at(start, TLS_WATCH_INTERVAL);
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            // Cancel safety: a lost tick only delays the next check; a cancel ends the watch.
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            let now = stamps(&files);
            if now == seen {
                continue;
            }
            match auth.reload_tls() {
                Ok(()) => tracing::info!("request plane: TLS files changed: reloaded"),
                Err(e) => tracing::warn!(
                    error = %e,
                    "request plane: TLS files changed but do not load; the old ones stay in use"
                ),
            }
            seen = now;
        }
    });
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

#[cfg(test)]
mod tests;
