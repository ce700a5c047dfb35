//! Bounded shutdown with paused time: it returns within its bound whatever the teardown does,
//! and the report says what happened.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use runtime_glue::TeardownOutcome;
use runtime_glue::shutdown::{ShutdownPlan, Step, run};

const GRACE: Duration = Duration::from_secs(2);
const TEARDOWN: Duration = Duration::from_secs(10);

struct Probe {
    stopped: Arc<AtomicBool>,
    aborted: Arc<AtomicBool>,
}

fn plan(drained: Step, open: u64, teardown: Vec<(&'static str, Step)>) -> (ShutdownPlan, Probe) {
    let stopped = Arc::new(AtomicBool::new(false));
    let aborted = Arc::new(AtomicBool::new(false));
    let (s, a) = (stopped.clone(), aborted.clone());
    let plan = ShutdownPlan {
        stop_accepting: Box::new(move || s.store(true, Ordering::SeqCst)),
        drained,
        grace: GRACE,
        still_open: Box::new(move || open),
        teardown,
        teardown_timeout: TEARDOWN,
        abort: Box::new(move || a.store(true, Ordering::SeqCst)),
    };
    (plan, Probe { stopped, aborted })
}

fn ready() -> Step {
    Box::pin(async {})
}

fn never() -> Step {
    Box::pin(std::future::pending())
}

#[tokio::test(start_paused = true)]
async fn a_transport_whose_close_hangs_forever_is_abandoned_at_the_timeout() {
    let (p, probe) = plan(
        ready(),
        0,
        vec![
            ("frontend", ready()),
            ("worker", never()),
            ("tasks", ready()),
        ],
    );
    let report = run(p).await;
    assert!(
        probe.stopped.load(Ordering::SeqCst),
        "new streams were refused first"
    );
    assert_eq!(
        report.teardown,
        TeardownOutcome::TimedOut { step: "worker" }
    );
    assert!(report.drained);
    assert_eq!(report.outcome(), "teardown_timeout");
    assert!(
        probe.aborted.load(Ordering::SeqCst),
        "everything was stopped at once"
    );
    assert_eq!(
        report.elapsed, TEARDOWN,
        "returned exactly at the bound (virtual time)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_transport_whose_close_panics_is_caught_and_shutdown_proceeds() {
    let boom: Step = Box::pin(async { panic!("boom in close") });
    let (p, probe) = plan(ready(), 0, vec![("frontend", boom), ("tasks", never())]);
    let report = run(p).await;
    assert_eq!(
        report.teardown,
        TeardownOutcome::Panicked {
            step: "frontend",
            message: "boom in close".into()
        }
    );
    assert_eq!(report.outcome(), "teardown_panic");
    assert!(probe.aborted.load(Ordering::SeqCst));
    assert!(report.elapsed < TEARDOWN);
}

#[tokio::test(start_paused = true)]
async fn streams_still_open_after_the_grace_period_are_reported_cut_short() {
    let (p, _) = plan(never(), 3, vec![("frontend", ready())]);
    let report = run(p).await;
    assert!(!report.drained);
    assert_eq!(report.streams_cut, 3);
    assert_eq!(report.teardown, TeardownOutcome::Clean);
    assert_eq!(report.outcome(), "grace_expired");
    assert_eq!(report.elapsed, GRACE);
}

#[tokio::test(start_paused = true)]
async fn a_clean_shutdown_waits_only_for_the_streams_to_drain() {
    let drain: Step = Box::pin(tokio::time::sleep(Duration::from_millis(300)));
    let (p, probe) = plan(drain, 0, vec![("frontend", ready()), ("worker", ready())]);
    let report = run(p).await;
    assert_eq!(report.outcome(), "clean");
    assert_eq!(report.streams_cut, 0);
    assert_eq!(report.elapsed, Duration::from_millis(300));
    assert!(!probe.aborted.load(Ordering::SeqCst));
}
