//! The classic plane's own bounds: its watcher tasks end when the worker plane closes or
//! aborts, and a finished stream's watcher never waits for ever on a frontend that does not
//! close. Every wait is bounded.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use response_plane::{
    ConnectionInfo, FrontendPlane, PendingResponse, RegisterOptions, ResponseError,
    ResponsePlaneConfig, ResponseSender, WorkerPlane,
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

/// A frontend and a worker on loopback with liveness bound `idle`, and one stream between
/// them whose prologue went out: its sender and its pending handle.
async fn one_stream<T: serde::Serialize + serde::de::DeserializeOwned>(
    idle: Duration,
) -> (
    FrontendPlane,
    WorkerPlane,
    ResponseSender<T>,
    PendingResponse<T>,
) {
    let frontend = FrontendPlane::bind(config(idle), TaskTracker::new())
        .await
        .unwrap();
    let worker = WorkerPlane::new(config(idle), TaskTracker::new()).unwrap();
    let (info, pending) = frontend.register::<T>(RegisterOptions::default()).unwrap();
    let mut tx = within("connect", worker.connect::<T>(&info)).await.unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    (frontend, worker, tx, pending)
}

/// A real frontend only mints a valid address; this points it at `fake` instead.
fn redirected(info: &ConnectionInfo, fake: std::net::SocketAddr) -> ConnectionInfo {
    let mut address: serde_json::Value = serde_json::from_str(&info.info).unwrap();
    address["addr"] = fake.to_string().into();
    ConnectionInfo {
        transport: info.transport.clone(),
        info: address.to_string(),
    }
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
    let info = redirected(&info, fake.local_addr().unwrap());
    let tracker = TaskTracker::new();
    let worker = WorkerPlane::new(config(Duration::from_secs(1)), tracker.clone()).unwrap();
    let (tx, accepted) = within("connect", async {
        tokio::join!(worker.connect::<u32>(&info), fake.accept())
    })
    .await;
    let (mut tx, _wedged) = (tx.unwrap(), accepted.unwrap());
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    within("send", tx.send(&1)).await.unwrap();
    // The fake never said it took the stream: the finish cannot count it delivered.
    let r = within("finish", tx.finish()).await;
    assert!(matches!(r, Err(ResponseError::Disconnected(_))), "{r:?}");
    tracker.close();
    within("the watcher ends", tracker.wait()).await;
}

/// The classic stream's messages, written by hand: `u32` LE length (kind + payload), kind.
fn message(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut m = u32::try_from(payload.len() + 1)
        .unwrap()
        .to_le_bytes()
        .to_vec();
    m.push(kind);
    m.extend_from_slice(payload);
    m
}

/// A worker played by hand: dials `info`'s frontend and names the stream.
async fn hand_worker(info: &ConnectionInfo) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let address: serde_json::Value = serde_json::from_str(&info.info).unwrap();
    let addr: std::net::SocketAddr = address["addr"].as_str().unwrap().parse().unwrap();
    let mut s = within("dial", tokio::net::TcpStream::connect(addr))
        .await
        .unwrap();
    let hello = serde_json::json!({ "stream": address["ticket"], "token": address["token"] });
    s.write_all(&message(0x01, hello.to_string().as_bytes()))
        .await
        .unwrap();
    s
}

/// A worker that goes silent (its host keeps the connection open and answers TCP, as a
/// stuck or stopped process does) is noticed within the liveness bound, before and after
/// its prologue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_worker_ends_its_classic_streams_within_the_liveness_bound() {
    use tokio::io::AsyncWriteExt;
    let idle = Duration::from_millis(500);
    let frontend = FrontendPlane::bind(config(idle), TaskTracker::new())
        .await
        .unwrap();
    let bound = idle * 10;
    // Silent before its prologue.
    let (info, pending) = frontend
        .register::<u32>(RegisterOptions::default())
        .unwrap();
    let _silent = hand_worker(&info).await;
    let r = tokio::time::timeout(bound, pending.established()).await;
    assert!(
        matches!(r, Ok(Err(ResponseError::Disconnected(_)))),
        "{r:?}"
    );
    // Silent after an item.
    let (info, pending) = frontend
        .register::<u32>(RegisterOptions::default())
        .unwrap();
    let mut w = hand_worker(&info).await;
    w.write_all(&message(0x02, br#"{"error":null}"#))
        .await
        .unwrap();
    w.write_all(&message(0x03, &rmp_serde::to_vec(&7u32).unwrap()))
        .await
        .unwrap();
    let mut rx = within("established", pending.established()).await.unwrap();
    assert_eq!(within("item", rx.next()).await, Some(Ok(7)));
    let end = tokio::time::timeout(bound, rx.next()).await;
    assert!(
        matches!(end, Ok(Some(Err(ResponseError::Disconnected(_))))),
        "{end:?}"
    );
}

/// A stream with nothing to say for several liveness periods stays up: the worker proves
/// it is alive in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_classic_stream_outlives_the_liveness_bound() {
    let idle = Duration::from_millis(300);
    let (_frontend, _worker, mut tx, pending) = one_stream::<u32>(idle).await;
    let mut rx = within("established", pending.established()).await.unwrap();
    // The scenario is time passing with nothing sent (a long prefill, a slow engine).
    tokio::time::sleep(idle * 4).await;
    within("send", tx.send(&1)).await.unwrap();
    assert_eq!(within("item", rx.next()).await, Some(Ok(1)));
    within("finish", tx.finish()).await.unwrap();
    assert_eq!(within("end", rx.next()).await, None);
}

/// A worker whose stream's connection died before the frontend took it says so on a new
/// connection, so the frontend's request ends (retryable) instead of waiting for a stream
/// that is gone. Here the first connection is cut by a middlebox that takes it and closes
/// it; later ones pass through to the frontend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_stream_lost_before_the_frontend_took_it_is_announced_again() {
    let idle = Duration::from_secs(2);
    let frontend = FrontendPlane::bind(config(idle), TaskTracker::new())
        .await
        .unwrap();
    let (info, pending) = frontend
        .register::<u32>(RegisterOptions::default())
        .unwrap();
    let real = frontend.address();
    let middlebox = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let info = redirected(&info, middlebox.local_addr().unwrap());
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut conn, _)) = middlebox.accept().await {
            if std::mem::take(&mut first) {
                drop(conn); // cut before anything reaches the frontend
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut up) = tokio::net::TcpStream::connect(real).await {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                }
            });
        }
    });
    let worker = WorkerPlane::new(config(idle), TaskTracker::new()).unwrap();
    let mut tx = within("connect", worker.connect::<u32>(&info))
        .await
        .unwrap();
    // The prologue may or may not make it into the dying socket; either way the stream is
    // dropped, as an engine does after an error.
    let _ = tx.send_prologue(Ok(())).await;
    drop(tx);
    let r = within("the pending request ends", pending.established()).await;
    assert!(
        matches!(
            r,
            Err(ResponseError::Disconnected(
                response_plane::Disconnect::Abandoned
            ))
        ),
        "{r:?}"
    );
}

/// A worker that names its stream and at once resets its connection, before the frontend's
/// ACCEPTED goes out: the worker went away, and the pending handle says so (retryable), not
/// that this plane shut down (`Closed`, which a caller does not retry elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reset_right_after_naming_its_stream_is_a_disconnect_not_a_closed_plane() {
    let frontend = FrontendPlane::bind(config(Duration::from_secs(10)), TaskTracker::new())
        .await
        .unwrap();
    let (info, pending) = frontend
        .register::<serde_json::Value>(RegisterOptions::default())
        .unwrap();
    let worker = hand_worker(&info).await;
    socket2::SockRef::from(&worker)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(worker); // RST
    let error = within("the pending handle's answer", pending.established())
        .await
        .expect_err("no stream: the worker is gone");
    assert!(
        matches!(error, ResponseError::Disconnected(_)),
        "the worker went away, the plane is running: {error:?}"
    );
    assert!(error.is_retryable());
}

/// An established classic stream whose worker holds it open (a long generation), on a
/// frontend with a liveness bound far beyond the test: stopping the frontend plane (`stop`)
/// ends the stream for its reader at once, as the velo plane's closed lanes do, instead of
/// leaving it to the worker.
async fn stopping_the_frontend_plane_ends_its_classic_streams(
    stop: impl AsyncFnOnce(&FrontendPlane),
) {
    ends_with_its_plane(Reader::Reading, stop).await;
}

/// What the application did with the stream before its plane stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    Reading,
    /// Asked the worker to stop (`ResponseStream::stop`), which this worker has not acted on.
    AskedToStop,
}

async fn ends_with_its_plane(reader: Reader, stop: impl AsyncFnOnce(&FrontendPlane)) {
    let idle = Duration::from_secs(600);
    let (frontend, worker, mut tx, pending) = one_stream::<u32>(idle).await;
    within("send", tx.send(&1)).await.unwrap();
    let mut rx = within("established", pending.established()).await.unwrap();
    assert_eq!(within("item", rx.next()).await, Some(Ok(1)));
    if reader == Reader::AskedToStop {
        rx.stop();
    }
    stop(&frontend).await;
    let end = within("the stream ends with its plane", rx.next()).await;
    assert!(
        matches!(end, Some(Err(ResponseError::Disconnected(_)))),
        "{end:?}"
    );
    assert_eq!(within("then nothing", rx.next()).await, None);
    worker.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_the_classic_streams_still_open() {
    stopping_the_frontend_plane_ends_its_classic_streams(async |f| f.shutdown().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_ends_the_classic_streams_still_open() {
    stopping_the_frontend_plane_ends_its_classic_streams(async |f| f.abort()).await;
}

/// A stream whose application asked its worker to stop still ends quietly only when the
/// worker ends it; its plane shutting down first is a lost stream, as on the velo plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_stream_still_hears_that_its_plane_shut_down() {
    ends_with_its_plane(Reader::AskedToStop, async |f| f.shutdown().await).await;
}

/// After `abort`, as after `shutdown`, the classic listener takes no connection: the accept
/// loop has ended and its socket is closed (bounded polling: the loop ends on its task).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_stops_the_classic_listener() {
    let frontend = FrontendPlane::bind(config(Duration::from_secs(10)), TaskTracker::new())
        .await
        .unwrap();
    let addr = frontend.address();
    frontend.abort();
    within("the listener closes", async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// A frontend application that stops reading a classic stream for longer than the liveness
/// bound while its worker has plenty to send: the worker's kernel gives up on the closed
/// window (`TCP_USER_TIMEOUT`, the same bound that notices a vanished frontend), and both
/// sides are told the stream is lost; nothing hangs. The pause is the scenario: time passing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_pauses_past_the_liveness_bound_loses_its_stream_on_both_sides() {
    let idle = Duration::from_secs(1);
    let (_frontend, _worker, mut tx, pending) = one_stream::<Vec<u8>>(idle).await;
    // Far more than loopback's socket buffers hold: the window closes.
    const ITEMS: usize = 512;
    let item = vec![7u8; 64 * 1024];
    let sender = tokio::spawn(async move {
        for _ in 0..ITEMS {
            tx.send(&item).await?;
        }
        tx.finish().await
    });
    let mut rx = within("established", pending.established()).await.unwrap();
    tokio::time::sleep(idle * 5).await;
    let mut got = 0;
    let end = loop {
        match within("an item or the end", rx.next()).await {
            Some(Ok(_)) => got += 1,
            other => break other,
        }
    };
    assert!(got < ITEMS, "the stream survived a pause past the bound");
    assert!(
        matches!(end, Some(Err(ResponseError::Disconnected(_)))),
        "{end:?}"
    );
    let sent = within("the worker is told", sender).await.unwrap();
    assert!(
        matches!(sent, Err(ResponseError::Disconnected(_))),
        "{sent:?}"
    );
}

/// As above, but the application holds its stream without reading it (a consumer that is
/// backpressured): the plane's stop still ends the stream's connection, so its worker stops
/// generating instead of sending to a frontend that has shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_ends_the_classic_streams_nobody_reads() {
    let idle = Duration::from_secs(600);
    let (frontend, worker, mut tx, pending) = one_stream::<u32>(idle).await;
    let ctx = tx.context();
    let rx = within("established", pending.established()).await.unwrap();
    frontend.abort();
    within("the worker's engine is told", ctx.killed()).await;
    // Told as a kill (the frontend ended it), not as a lost connection.
    let err = within("a send after the stop fails", async {
        loop {
            if let Err(e) = tx.send(&1).await {
                break e;
            }
        }
    })
    .await;
    assert!(err.is_cancelled(), "{err}");
    assert_eq!(worker.stats().classic_cancellations, 1);
    drop(rx);
    worker.close();
}
