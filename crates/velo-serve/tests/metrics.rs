//! The frontend's metrics count what clients got: a unary client that went away is a
//! disconnect, a slow client cut off is counted the tokens it was sent (not the one dropped),
//! and a request that never reached a worker adds nothing to the per-request histograms.

mod harness;

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use response_plane::Plane;
use velo_serve::frontend::metrics::Outcome;
use velo_serve::worker::Worker;

use harness::{BOUND, Cluster, chat};

/// A unary request whose client goes away while the worker generates is a disconnect, as a
/// streamed one is (Dynamo counts both), and its answer's length is what it had received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_client_that_goes_away_is_counted_as_disconnected() {
    let c = Cluster::start(Plane::Velo, 1, |_| {}).await;
    let stats = c.workers[0].stats().clone();
    let (addr, body) = (
        c.addr(),
        chat(4000, false, serde_json::json!({"ignore_eos": true})),
    );
    let client = tokio::spawn(async move {
        let mut conn = velo_serve::client::Conn::open(addr).await.unwrap();
        let _ = conn.post("/v1/chat/completions", &body.to_string()).await;
    });
    c.wait_for("the request to hold an engine slot", |_| {
        stats.snapshot()[0] == 1
    })
    .await;
    let m = &c.frontend.state().metrics;
    c.wait_for("the frontend to receive the first token", |_| {
        m.ttft.count() == 1
    })
    .await;
    client.abort();
    c.wait_for("the frontend to count the request cancelled", |_| {
        m.requests_with(Outcome::Cancelled) == 1
    })
    .await;
    c.wait_for("the frontend to count the disconnect", |_| {
        m.disconnected.load(Ordering::Relaxed) == 1
    })
    .await;
    c.wait_for("the answer's length recorded", |_| m.osl.count() == 1)
        .await;
    assert!(
        m.osl.sum() >= 1.0,
        "the answer's length counts the tokens received before the client left"
    );
}

/// A streamed answer to a client that reads nothing: once its buffer is full the frontend
/// cuts it. `output_tokens_total` then counts exactly the tokens the client was sent (it
/// reads them all after the cut), not the token that found the buffer full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_cut_off_is_counted_only_the_tokens_it_was_sent() {
    let mut c = Cluster::start(Plane::Velo, 0, |f| {
        f.limits.max_tokens = 100_000;
        f.limits.context_tokens = 131_072;
    })
    .await;
    let mut config = harness::worker_config(c.plane.clone(), c.discovery.clone());
    config.speedup = 1000.0;
    let worker = Worker::start(config).await.expect("a worker starts");
    let id = worker.instance_id();
    c.workers.push(worker);
    c.wait_for("the worker to be discovered", |c| {
        c.frontend.state().pool.ids().contains(&id)
    })
    .await;
    // A small receive window, so the sockets hold few of the events the client leaves unread.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(c.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let body = chat(100_000, true, serde_json::json!({"ignore_eos": true})).to_string();
    let request = hyper::Request::post("/v1/chat/completions")
        .header("host", c.addr().to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = tokio::time::timeout(BOUND, sender.send_request(request))
        .await
        .expect("an answer in time")
        .unwrap();
    assert_eq!(response.status(), 200);
    let m = &c.frontend.state().metrics;
    c.wait_for("the frontend to cut the client that does not read", |_| {
        m.slow_clients.load(Ordering::Relaxed) == 1
    })
    .await;
    let text = tokio::time::timeout(BOUND, response.into_body().collect())
        .await
        .expect("the rest of the answer in time")
        .expect("a clean end after the cut")
        .to_bytes();
    let text = String::from_utf8_lossy(&text);
    let sent = text.matches("data: {").count();
    assert!(!text.contains("[DONE]"), "a cut answer has no [DONE]");
    assert_eq!(
        m.output_tokens.load(Ordering::Relaxed),
        u64::try_from(sent).unwrap(),
        "output_tokens_total counts the tokens sent to the client"
    );
}

/// A request no worker could take (none is listed) fails in dispatch: it is counted as an
/// overload, but it has no duration, prompt or answer length worth a histogram sample.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_reached_a_worker_adds_no_histogram_samples() {
    let c = Cluster::start(Plane::Velo, 0, |_| {}).await;
    let (_conn, r) = c
        .post(
            "/v1/chat/completions",
            &chat(8, false, serde_json::json!({})),
        )
        .await;
    assert_eq!(r.status, 503);
    let m = &c.frontend.state().metrics;
    c.wait_for("the frontend to count the overload", |_| {
        m.requests_with(Outcome::Overload) == 1
    })
    .await;
    let (_, text) = c.get("/metrics").await;
    for name in [
        "dynamo_frontend_request_duration_seconds",
        "dynamo_frontend_input_sequence_tokens",
        "dynamo_frontend_output_sequence_tokens",
    ] {
        let needle = format!("{name}_count{{model=\"velo-mock\"}} 0\n");
        assert!(text.contains(&needle), "{needle} missing from:\n{text}");
    }
}
