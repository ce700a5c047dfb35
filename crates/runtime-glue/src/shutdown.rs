//! Bounded shutdown: stop accepting, let open streams drain for a grace period, tear the
//! transports down in their own task under a hard timeout, and report what was cut short.
//! It always returns: a teardown step that hangs is abandoned at the timeout, one that panics
//! is caught, and both are logged.
//!
//! (mini-redis's teaching version waits forever for its tasks; this one never does.)

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

/// A boxed teardown step.
pub type Step = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// What to do, in order, to shut down.
pub struct ShutdownPlan {
    /// Phase 1: refuse new streams (called once, synchronously).
    pub stop_accepting: Box<dyn FnOnce() + Send>,
    /// Phase 2: resolves once every open stream has finished.
    pub drained: Step,
    /// How long phase 2 may take.
    pub grace: Duration,
    /// How many streams are still open (asked when the grace period ends).
    pub still_open: Box<dyn Fn() -> u64 + Send>,
    /// Phase 3: named teardown steps, run in order in their own task.
    pub teardown: Vec<(&'static str, Step)>,
    /// Hard bound on phase 3.
    pub teardown_timeout: Duration,
    /// Called when phase 3 times out or panics: stop everything at once.
    pub abort: Box<dyn FnOnce() + Send>,
}

/// How the teardown phase ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TeardownOutcome {
    /// Every step completed.
    Clean,
    /// The hard timeout passed while this step was running; it was abandoned.
    TimedOut {
        /// The step that did not finish.
        step: &'static str,
    },
    /// A step panicked; the rest were skipped.
    Panicked {
        /// The step.
        step: &'static str,
        /// The panic's message.
        message: String,
    },
}

/// What shutdown did and what it cut short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Every open stream finished within the grace period.
    pub drained: bool,
    /// Streams still open when the grace period ended (cut short by the teardown).
    pub streams_cut: u64,
    /// How the teardown ended.
    pub teardown: TeardownOutcome,
    /// Total time taken.
    pub elapsed: Duration,
}

impl ShutdownReport {
    /// A short label for metrics: `clean`, `grace_expired`, `teardown_timeout` or
    /// `teardown_panic`.
    pub fn outcome(&self) -> &'static str {
        match (&self.teardown, self.drained) {
            (TeardownOutcome::TimedOut { .. }, _) => "teardown_timeout",
            (TeardownOutcome::Panicked { .. }, _) => "teardown_panic",
            (TeardownOutcome::Clean, false) => "grace_expired",
            (TeardownOutcome::Clean, true) => "clean",
        }
    }
}

/// Runs `plan`. Returns within `grace + teardown_timeout` (plus scheduling), whatever the
/// steps do.
pub async fn run(plan: ShutdownPlan) -> ShutdownReport {
    let start = Instant::now();
    (plan.stop_accepting)();
    let drained = tokio::time::timeout(plan.grace, plan.drained).await.is_ok();
    let streams_cut = if drained { 0 } else { (plan.still_open)() };
    if !drained {
        tracing::warn!(streams_cut, grace = ?plan.grace, "shutdown grace period ended with streams open");
    }
    // The teardown runs in its own task so that a panic is caught and a hang can be abandoned.
    let (step_tx, step_rx) = std::sync::mpsc::channel::<&'static str>();
    let steps = plan.teardown;
    let task = tokio::spawn(async move {
        for (name, step) in steps {
            let _ = step_tx.send(name);
            tracing::debug!(step = name, "teardown");
            step.await;
        }
    });
    let abort_task = task.abort_handle();
    let current = |rx: &std::sync::mpsc::Receiver<&'static str>| rx.try_iter().last();
    let mut last_step = "";
    let teardown = match tokio::time::timeout(plan.teardown_timeout, task).await {
        Ok(Ok(())) => TeardownOutcome::Clean,
        Ok(Err(e)) => {
            last_step = current(&step_rx).unwrap_or(last_step);
            let message = panic_message(e);
            tracing::error!(step = last_step, %message, "a teardown step panicked; shutdown proceeds");
            (plan.abort)();
            TeardownOutcome::Panicked {
                step: last_step,
                message,
            }
        }
        Err(_) => {
            abort_task.abort();
            last_step = current(&step_rx).unwrap_or(last_step);
            tracing::error!(step = last_step, timeout = ?plan.teardown_timeout, "teardown timed out; shutdown proceeds");
            (plan.abort)();
            TeardownOutcome::TimedOut { step: last_step }
        }
    };
    ShutdownReport {
        drained,
        streams_cut,
        teardown,
        elapsed: start.elapsed(),
    }
}

fn panic_message(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return "teardown task cancelled".to_owned();
    }
    let payload = e.into_panic();
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
