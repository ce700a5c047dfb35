//! The request channel to a worker, on loopback: a worker that stops reading must not hold
//! the frontend's requests once it is removed.

use std::pin::pin;
use std::time::Duration;

use response_plane::ConnectionInfo;
use tokio_util::task::TaskTracker;
use velo_serve::work::{RequestAuth, WireEnding, WorkChannel, WorkRequest};

/// Bounds every wait of these tests.
const BOUND: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_send_waiting_on_a_worker_that_stopped_reading_ends_when_the_worker_is_removed() {
    // A worker whose socket stays open but is never read (a stopped process, a wedged loop).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted_tx, accepted) = tokio::sync::oneshot::channel();
    let held = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        velo_serve::work::auth::worker_handshake(&mut socket, &RequestAuth::open())
            .await
            .unwrap();
        let _ = accepted_tx.send(());
        std::future::pending::<()>().await;
        drop(socket);
    });
    let tracker = TaskTracker::new();
    let channel = WorkChannel::connect(addr, &RequestAuth::open(), &tracker)
        .await
        .unwrap();
    tokio::time::timeout(BOUND, accepted)
        .await
        .unwrap()
        .unwrap();
    let request = WorkRequest {
        id: 1,
        prompt_tokens: 1,
        output_tokens: 1,
        ending: WireEnding::Eos,
        info: ConnectionInfo {
            transport: "tcp".into(),
            info: "x".repeat(16_000),
        },
    };
    // Fill the socket and the queue: sends go through at once until one has to wait.
    let mut sent = 0u32;
    while tokio::time::timeout(Duration::from_millis(200), channel.send(&request))
        .await
        .is_ok()
    {
        sent += 1;
        assert!(sent < 100_000, "the queue and the socket are bounded");
    }
    // A send that waits for room (polled once: it is waiting)...
    let mut send = pin!(channel.send(&request));
    assert!(
        tokio::time::timeout(Duration::ZERO, send.as_mut())
            .await
            .is_err(),
        "the queue is full"
    );
    // ...ends once the worker is removed (what the pool does when its lease expires).
    channel.close();
    let ended = tokio::time::timeout(BOUND, send).await;
    assert!(
        matches!(ended, Ok(Err(_))),
        "the send is still waiting {BOUND:?} after the worker was removed"
    );
    held.abort();
}
