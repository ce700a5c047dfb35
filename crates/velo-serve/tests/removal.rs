//! A worker that leaves discovery while it generates (a drain, an expired lease) and never
//! finishes: the requests it holds end after the removal grace, streamed or not. A worker that
//! stays listed while its engine stalls: they end after the item timeout.

mod harness;

use std::time::Duration;

use harness::{BOUND, Cluster, chat};
use response_plane::Plane;
use velo_serve::worker::Worker;

/// A worker whose engines run at the mocker's slowest (speedup 0.001: ~22 s per forward
/// pass): it opens a request's stream (the prologue) at once, then generates nothing within
/// the test, as a stuck engine would.
async fn stuck_worker(c: &mut Cluster) -> usize {
    let mut config = harness::worker_config(c.plane.clone(), c.discovery.clone());
    config.speedup = 0.001;
    let w = Worker::start(config).await.expect("a worker starts");
    let id = w.instance_id();
    c.workers.push(w);
    c.wait_for("the worker to be discovered", |c| {
        c.frontend.state().pool.ids().contains(&id)
    })
    .await;
    c.workers.len() - 1
}

/// A request for 1,000 tokens (streamed or not) and its whole answer: status and body.
async fn long_request(addr: std::net::SocketAddr, stream: bool) -> (u16, String) {
    let mut conn = velo_serve::client::Conn::open(addr).await.expect("connect");
    let body = chat(1000, stream, serde_json::json!({"ignore_eos": true})).to_string();
    let r = conn
        .post("/v1/chat/completions", &body)
        .await
        .expect("an answer");
    (r.status, r.text().await.expect("a body"))
}

async fn removed_worker_ends_the_request(stream: bool) {
    let mut c = Cluster::start(Plane::Velo, 0, |f| {
        f.removal_grace = Duration::from_millis(200);
    })
    .await;
    let w = stuck_worker(&mut c).await;
    let stats = c.workers[w].stats().clone();
    let request = tokio::spawn(long_request(c.addr(), stream));
    c.wait_for("the worker to open the request's stream", |_| {
        stats.snapshot()[1] == 1
    })
    .await;
    // The frontend has the stream's prologue: the request is past dispatch (a removal before
    // it would retry the request elsewhere).
    c.wait_for("the frontend to receive the prologue", |c| {
        c.frontend
            .state()
            .service
            .render_metrics()
            .lines()
            .any(|l| {
                l.starts_with("velo_response_stream_setup_seconds_count")
                    && l.contains("frontend")
                    && l.ends_with(" 1")
            })
    })
    .await;
    c.workers[w].leave_discovery();
    c.wait_for("the worker to leave routing", |c| {
        c.frontend.state().pool.is_empty()
    })
    .await;
    // The removal grace is 200 ms: the request must end well within BOUND (30 s).
    let (status, body) = tokio::time::timeout(BOUND, request)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "stream={stream}: the request on a worker removed from discovery is still open \
                 {BOUND:?} after its removal (removal grace 200 ms)"
            )
        })
        .expect("the request task");
    if stream {
        assert_eq!(status, 200);
        assert!(body.contains("event: error"), "{body}");
        assert!(body.contains("left discovery"), "{body}");
    } else {
        assert_eq!(status, 502, "{body}");
        assert!(body.contains("left discovery"), "{body}");
    }
}

/// A streamed request on a stuck worker that left discovery ends with an error event after
/// the removal grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_request_on_a_removed_stuck_worker_ends_after_the_grace() {
    removed_worker_ends_the_request(true).await;
}

/// A unary request on a stuck worker that left discovery ends with 502 after the removal
/// grace (it waited forever when only the streamed path watched the removal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_request_on_a_removed_stuck_worker_ends_after_the_grace() {
    removed_worker_ends_the_request(false).await;
}

/// A stuck worker that stays in discovery (alive, its lease kept): each request on it fails
/// once its stream has gone the item timeout without an item, streamed (an error event) or
/// not (504), instead of holding its client, its admission turn and the worker's slot.
async fn stalled_worker_fails_the_request(stream: bool) {
    let mut c = Cluster::start(Plane::Velo, 0, |f| {
        f.item_timeout = Duration::from_millis(300);
    })
    .await;
    stuck_worker(&mut c).await;
    let (status, body) = tokio::time::timeout(BOUND, long_request(c.addr(), stream))
        .await
    .unwrap_or_else(|_| {
        panic!(
            "stream={stream}: a stalled request is still open after {BOUND:?} (item timeout 300 ms)"
        )
    });
    if stream {
        assert_eq!(status, 200);
        assert!(body.contains("event: error"), "{body}");
    } else {
        assert_eq!(status, 504, "{body}");
    }
    assert!(body.contains("item_timeout"), "names the bound: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_request_on_a_stalled_worker_fails_after_the_item_timeout() {
    stalled_worker_fails_the_request(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_request_on_a_stalled_worker_fails_after_the_item_timeout() {
    stalled_worker_fails_the_request(false).await;
}
