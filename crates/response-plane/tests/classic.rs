//! The classic plane's own bounds: its watcher tasks end when the worker plane closes or
//! aborts, and a finished stream's watcher never waits for ever on a frontend that does not
//! close. Every wait is bounded.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use response_plane::{
    ConnectionInfo, FrontendPlane, RegisterOptions, ResponseError, ResponsePlaneConfig, WorkerPlane,
};
use tokio_util::task::TaskTracker;

const BOUND: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {BOUND:?}"))
}

/// The classic plane on loopback, with `idle` as its liveness bound.
fn config(idle: Duration) -> ResponsePlaneConfig {
    ResponsePlaneConfig::builder()
        .plane(response_plane::Plane::Classic)
        .host(Some("127.0.0.1".parse().unwrap()))
        .idle_timeout(idle)
        .build()
        .unwrap()
}

/// An established stream whose frontend holds it open and reads nothing; then `stop` on the
/// worker plane must end every task on the worker's tracker, and the stream with them.
async fn stopping_the_worker_plane_ends_its_classic_watchers(stop: fn(&WorkerPlane)) {
    let idle = Duration::from_secs(10);
    let frontend = FrontendPlane::bind(config(idle), TaskTracker::new())
        .await
        .unwrap();
    let tracker = TaskTracker::new();
    let worker = WorkerPlane::new(config(idle), tracker.clone()).unwrap();
    let (info, pending) = frontend
        .register::<u32>(RegisterOptions::default())
        .unwrap();
    let mut tx = within("connect", worker.connect::<u32>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    let ctx = tx.context();
    let mut rx = within("established", pending.established()).await.unwrap();
    stop(&worker);
    tracker.close();
    within("the watcher tasks end", tracker.wait()).await;
    within("the engine sees a kill", ctx.killed()).await;
    assert!(tx.send(&1).await.is_err(), "the stream is over");
    let end = within("the frontend sees the end", rx.next()).await;
    assert!(
        matches!(end, Some(Err(ResponseError::Disconnected { .. }))),
        "{end:?}"
    );
    let err = within("connect after", worker.connect::<u32>(&info))
        .await
        .unwrap_err();
    assert_eq!(err, ResponseError::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_ends_the_classic_watchers_while_a_frontend_holds_its_stream_open() {
    stopping_the_worker_plane_ends_its_classic_watchers(WorkerPlane::abort).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_the_classic_watchers_while_a_frontend_holds_its_stream_open() {
    stopping_the_worker_plane_ends_its_classic_watchers(WorkerPlane::close).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_streams_watcher_ends_though_the_frontend_never_closes() {
    // A real frontend only mints a valid address; the worker dials a fake one, which takes
    // the connection and then neither reads nor closes it (a wedged frontend).
    let frontend = FrontendPlane::bind(config(Duration::from_secs(10)), TaskTracker::new())
        .await
        .unwrap();
    let (info, _pending) = frontend
        .register::<u32>(RegisterOptions::default())
        .unwrap();
    let fake = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut address: serde_json::Value = serde_json::from_str(&info.info).unwrap();
    address["addr"] = fake.local_addr().unwrap().to_string().into();
    let info = ConnectionInfo {
        transport: info.transport,
        info: address.to_string(),
    };
    let tracker = TaskTracker::new();
    let worker = WorkerPlane::new(config(Duration::from_secs(1)), tracker.clone()).unwrap();
    let (tx, accepted) = within("connect", async {
        tokio::join!(worker.connect::<u32>(&info), fake.accept())
    })
    .await;
    let (mut tx, _wedged) = (tx.unwrap(), accepted.unwrap());
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    within("send", tx.send(&1)).await.unwrap();
    within("finish", tx.finish()).await.unwrap();
    tracker.close();
    within("the watcher ends", tracker.wait()).await;
}
