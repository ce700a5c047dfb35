//! The engine's view of a stream's cancellation: the frontend's stop and kill.

use std::sync::{Arc, OnceLock};

use tokio::sync::Notify;
use velo_session::StreamWatch;

use crate::classic::ClassicControl;

/// The frontend's stop and kill, for the engine serving one stream. Cheap to clone.
///
/// On the velo plane the signals exist from the prologue on; waiting before it simply waits.
/// A kill that raced the stream's setup arrives right after the prologue. A stream that never
/// opens (its sender dropped before the prologue, or the prologue failed) counts as killed.
#[derive(Clone)]
pub struct StreamContext {
    shared: Arc<ContextShared>,
}

#[derive(Default)]
struct ContextShared {
    watch: OnceLock<Watch>,
    ready: Notify,
}

/// Where a stream's signals come from.
pub(super) enum Watch {
    Velo(StreamWatch),
    Classic(Arc<ClassicControl>),
    /// The stream never opened (its sender was dropped before the prologue, or the prologue
    /// failed): there is nothing to serve, as after a kill.
    Never,
}

impl StreamContext {
    /// A context whose signals are not known yet (velo: until the prologue opens the stream).
    pub(super) fn new() -> Self {
        Self {
            shared: Arc::new(ContextShared::default()),
        }
    }

    /// The stream's signals are now known: wake whoever waits for them.
    pub(super) fn set(&self, watch: Watch) {
        if self.shared.watch.set(watch).is_err() {
            tracing::debug!("a stream's context was set twice; the first one stays");
        }
        self.shared.ready.notify_waiters();
    }

    async fn watch(&self) -> &Watch {
        loop {
            let ready = self.shared.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            if let Some(w) = self.shared.watch.get() {
                return w;
            }
            ready.await;
        }
    }

    /// Resolves when the frontend asks to stop (graceful) or kills the stream.
    pub async fn stopped(&self) {
        match self.watch().await {
            Watch::Velo(w) => w.stopped().await,
            Watch::Classic(c) => c.stopped().await,
            Watch::Never => {}
        }
    }

    /// Resolves when the frontend kills the stream (or the connection to it is lost).
    pub async fn killed(&self) {
        match self.watch().await {
            Watch::Velo(w) => {
                w.closed().await;
            }
            Watch::Classic(c) => c.killed().await,
            Watch::Never => {}
        }
    }

    /// Whether the frontend asked to stop (or killed the stream).
    pub fn is_stopped(&self) -> bool {
        match self.shared.watch.get() {
            Some(Watch::Velo(w)) => w.is_stop_requested() || w.remote_end().is_some(),
            Some(Watch::Classic(c)) => c.is_stopped(),
            Some(Watch::Never) => true,
            None => false,
        }
    }

    /// Whether the frontend killed the stream (or the connection was lost).
    pub fn is_killed(&self) -> bool {
        match self.shared.watch.get() {
            Some(Watch::Velo(w)) => w.remote_end().is_some(),
            Some(Watch::Classic(c)) => c.is_killed(),
            Some(Watch::Never) => true,
            None => false,
        }
    }
}

impl std::fmt::Debug for StreamContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamContext")
            .field("stopped", &self.is_stopped())
            .field("killed", &self.is_killed())
            .finish()
    }
}
