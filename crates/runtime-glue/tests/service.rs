//! The service hands out the plane's own handles; its shutdown still waits for the streams
//! they carry, and reports the ones it had to cut.

use std::time::Duration;

use futures::StreamExt;
use response_plane::RegisterOptions;
use runtime_glue::{ResponseService, Role, ServiceConfig};

async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("bounded wait")
}

async fn service(plane: &'static str, grace: Duration) -> ResponseService {
    let lookup = |var: &str| match var {
        "DYN_RESPONSE_PLANE" => Some(plane.to_owned()),
        "DYN_TCP_RESPONSE_STREAM_HOST" => Some("127.0.0.1".to_owned()),
        _ => None,
    };
    let config = ServiceConfig::from_lookup(Role::Both, lookup).unwrap();
    let config = config.to_builder().grace(grace).build().unwrap();
    ResponseService::start(config).await.unwrap()
}

async fn a_stream_finishing_during_the_grace_period_drains_cleanly(plane: &'static str) {
    let service = service(plane, Duration::from_secs(30)).await;
    let (info, pending) = service.register::<u32>(RegisterOptions::default()).unwrap();
    let mut tx = service.connect::<u32>(&info).await.unwrap();
    tx.send_prologue(Ok(())).await.unwrap();
    let mut rx = within(pending.established()).await.unwrap();
    assert_eq!(service.streams_in_flight(), 2, "one per side");

    let shutdown = tokio::spawn({
        let service = service.clone();
        async move { service.shutdown().await }
    });
    // New streams are refused once shutdown began; the open one carries on.
    within(async {
        while service.register::<u32>(RegisterOptions::default()).is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    tx.send(&7).await.unwrap();
    tx.finish().await.unwrap();
    assert_eq!(within(rx.next()).await.unwrap().unwrap(), 7);
    assert!(within(rx.next()).await.is_none());
    // The frontend still holds its finished stream: that does not keep the drain waiting.
    let report = within(shutdown).await.unwrap();
    assert!(report.drained, "{report:?}");
    assert_eq!(report.streams_cut, 0);
    drop(rx);
}

async fn a_stream_open_past_the_grace_period_is_reported_cut(plane: &'static str) {
    let service = service(plane, Duration::from_millis(200)).await;
    let (info, pending) = service.register::<u32>(RegisterOptions::default()).unwrap();
    let mut tx = service.connect::<u32>(&info).await.unwrap();
    tx.send_prologue(Ok(())).await.unwrap();
    let mut rx = within(pending.established()).await.unwrap();
    let report = within(service.shutdown()).await;
    assert!(!report.drained, "{report:?}");
    assert_eq!(
        report.streams_cut, 2,
        "the stream, on each side: {report:?}"
    );
    // The reader is told its stream ended, not left waiting.
    assert!(within(rx.next()).await.is_some_and(|r| r.is_err()));
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_shutdown_waits_for_a_stream_that_finishes_in_time() {
    a_stream_finishing_during_the_grace_period_drains_cleanly("tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_shutdown_reports_a_stream_open_past_the_grace_period() {
    a_stream_open_past_the_grace_period_is_reported_cut("tcp").await;
}

#[cfg(feature = "tcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn velo_shutdown_waits_for_a_stream_that_finishes_in_time() {
    a_stream_finishing_during_the_grace_period_drains_cleanly("velo").await;
}

#[cfg(feature = "tcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn velo_shutdown_reports_a_stream_open_past_the_grace_period() {
    a_stream_open_past_the_grace_period_is_reported_cut("velo").await;
}
