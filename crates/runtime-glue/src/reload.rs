//! Certificate reload on SIGHUP, the signal daemons reread their configuration on.
//!
//! Installed only when the service runs with TLS (`DYN_TCP_TLS_*`): a service without TLS
//! leaves SIGHUP's default alone (it ends the process). Once installed, SIGHUP no longer ends
//! the process for as long as it lives (tokio never uninstalls a handler); each one rereads
//! every plane's TLS files, as [`ResponseService::reload_tls`](crate::ResponseService) does.
//! Connections already up keep their session; new ones use the new files. Files that do not
//! load are logged and the ones in use stay.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Reloads on every SIGHUP until `stop` is cancelled or `reload` says the service is gone
/// (`None`), in a task on `tracker`.
///
/// # Errors
///
/// The handler could not be installed.
pub(crate) fn on_sighup<F>(
    reload: F,
    stop: CancellationToken,
    tracker: &TaskTracker,
) -> std::io::Result<()>
where
    F: Fn() -> Option<Result<(), response_plane::ConfigError>> + Send + 'static,
{
    let mut hangups = signal(SignalKind::hangup())?;
    tracker.spawn(async move {
        loop {
            // Cancel safety: a signal that arrives while neither branch polls is kept by the
            // stream for its next `recv`.
            tokio::select! {
                got = hangups.recv() => {
                    if got.is_none() {
                        return;
                    }
                }
                () = stop.cancelled() => return,
            }
            match reload() {
                None => return,
                Some(Ok(())) => tracing::info!("SIGHUP: TLS files reloaded"),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "SIGHUP: TLS files do not load; the ones in use stay");
                }
            }
        }
    });
    Ok(())
}
