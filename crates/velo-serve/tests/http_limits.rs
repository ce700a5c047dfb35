//! The HTTP server's own bounds, against clients that send too little, too late or too much:
//! each is answered or cut within its bound, never held for ever.

mod harness;

use std::time::Duration;

use harness::{BOUND, Cluster};
use response_plane::Plane;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A frontend (no workers) whose header and body timeouts are `timeout`.
async fn frontend(timeout: Duration) -> Cluster {
    Cluster::start(Plane::Velo, 0, |f| {
        f.http_limits.header_read_timeout = timeout;
        f.http_limits.body_read_timeout = timeout;
    })
    .await
}

/// Everything the server sends on `conn` until it closes it (bounded).
async fn until_closed(conn: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(BOUND, conn.read_to_end(&mut answer)).await;
    // A reset after the answer is a close too.
    assert!(
        read.is_ok(),
        "the server still holds the connection after {BOUND:?}"
    );
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let c = frontend(Duration::from_millis(300)).await;
    let mut conn = TcpStream::connect(c.addr()).await.unwrap();
    conn.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut conn).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_is_answered_408() {
    let c = frontend(Duration::from_millis(300)).await;
    let mut conn = TcpStream::connect(c.addr()).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\
                Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":";
    conn.write_all(head.as_bytes()).await.unwrap();
    let answer = until_closed(&mut conn).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("\"error\""),
        "an OpenAI error object: {answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_answered_413_naming_the_limit() {
    let c = frontend(Duration::from_secs(10)).await;
    let limit = c.frontend.state().config.max_body_bytes;
    let mut conn = TcpStream::connect(c.addr()).await.unwrap();
    let len = limit + 1;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    // The body goes out while the answer is read: the server answers as soon as the limit
    // is passed, and closes the connection with the rest unread.
    let (mut read, mut write) = conn.into_split();
    let body = tokio::spawn(async move {
        let _ = write.write_all(&vec![b' '; len]).await;
        write
    });
    let mut answer = Vec::new();
    let done = tokio::time::timeout(BOUND, read.read_to_end(&mut answer)).await;
    assert!(done.is_ok(), "the server still holds the connection");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains(&format!("{limit} bytes")) && answer.contains("max_body_bytes"),
        "{answer}"
    );
    drop(body);
}

/// What a client that asks for a path or a method this server does not serve gets: an
/// OpenAI error object with 404 or 405, as for every other error, not an empty body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_and_methods_get_openai_error_objects() {
    let c = frontend(Duration::from_secs(10)).await;
    let (status, body) = c.get("/v1/embeddings").await;
    assert_eq!(status, 404, "{body}");
    let error = harness::json(&body);
    assert_eq!(error["error"]["type"], "not_found_error", "{body}");
    assert!(body.contains("/v1/embeddings"), "{body}");
    let (status, body) = c.get("/v1/chat/completions").await;
    assert_eq!(status, 405, "{body}");
    let error = harness::json(&body);
    assert_eq!(error["error"]["type"], "invalid_request_error", "{body}");
}

/// A client that asks for a long streamed answer and then stops reading it, with its window
/// closed: once the server's writes have made no progress for the write stall bound, the
/// connection is cut and its slot freed. One connection is allowed at a time, so the next
/// client is served only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_stream_is_cut_and_frees_its_slot() {
    let c = Cluster::start(Plane::Velo, 1, |f| {
        f.http_limits.max_connections = 1;
        f.http_limits.write_stall_timeout = Duration::from_millis(300);
        f.limits.max_tokens = 1_000_000;
        f.limits.context_tokens = 2_000_000;
    })
    .await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(c.addr()).await.unwrap();
    let body = harness::chat(1_000_000, true, serde_json::json!({"ignore_eos": true})).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stalled.write_all(request.as_bytes()).await.unwrap();
    // `stalled` is never read. The next client waits for the only slot (bounded by BOUND).
    let (status, answer) = c.get("/health").await;
    assert_eq!(status, 200, "{answer}");
    drop(stalled);
}

/// Clients whose bodies are slow to arrive hold the memory reserved for them: past the
/// server's budget for bodies being read (here the size of one largest body), another
/// request is answered 503 at once, naming the budget, instead of adding its buffer (4,096
/// connections times 4 MiB bodies would be 16 GiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_budget_for_bodies_in_flight_are_refused_at_once() {
    let c = Cluster::start(Plane::Velo, 0, |f| {
        f.max_body_bytes = 64 * 1024;
        f.http_limits.body_budget_bytes = 64 * 1024;
        f.http_limits.body_read_timeout = Duration::from_secs(60);
    })
    .await;
    let mut slow = TcpStream::connect(c.addr()).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\
                Content-Type: application/json\r\nContent-Length: 65536\r\n\r\n{\"model\":";
    slow.write_all(head.as_bytes()).await.unwrap();
    // The slow body holds the whole budget once the server reads its head: until then a
    // request may still get in (and fail for want of a worker), so ask until one is refused.
    let refused = tokio::time::timeout(BOUND, async {
        loop {
            let (_conn, r) = c
                .post(
                    "/v1/chat/completions",
                    &harness::chat(8, false, serde_json::json!({})),
                )
                .await;
            let status = r.status;
            let body = r.text().await.expect("a body");
            if status == 503 && body.contains("body_budget_bytes") {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a request refused for the budget while the slow body holds it");
    assert!(refused.contains("\"error\""), "{refused}");
    drop(slow);
}

/// A budget for bodies in flight smaller than the largest body allowed could never let such a
/// body be read, and would answer "retry later" for ever: the frontend refuses to start,
/// naming both settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_budget_below_the_largest_body_is_a_startup_error() {
    let mut config = harness::frontend_config(
        harness::plane(Plane::Velo),
        harness::discovery(Duration::from_secs(10)),
    );
    config.max_body_bytes = 1 << 20;
    config.http_limits.body_budget_bytes = 64 * 1024;
    let error = velo_serve::frontend::Frontend::start(config)
        .await
        .err()
        .expect("refused");
    let text = error.to_string();
    assert!(
        text.contains("body_budget_bytes") && text.contains("max_body_bytes"),
        "{text}"
    );
}
