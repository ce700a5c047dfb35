//! velo-serve end to end over loopback with a real HTTP client, on both response planes:
//! the OpenAI chunk format field by field, `[DONE]`, usage, errors, overload, a client
//! disconnect reaching the engine, a worker process killed mid-stream, a worker removed from
//! discovery while requests wait for it.

mod harness;

use std::time::{Duration, Instant};

use harness::{BOUND, Cluster, MODEL, chat, events, json, next_event};
use response_plane::Plane;
use velo_serve::frontend::metrics::Outcome;

/// Runs `$check` on the velo plane and on the classic plane, as two tests.
macro_rules! both_planes {
    ($velo:ident, $classic:ident, $check:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $velo() {
            $check(Plane::Velo).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $classic() {
            $check(Plane::Classic).await;
        }
    };
}

both_planes!(
    streamed_chat_chunks_velo,
    streamed_chat_chunks_classic,
    a_streamed_chat_has_dynamos_chunks_usage_and_done
);

async fn a_streamed_chat_has_dynamos_chunks_usage_and_done(plane: Plane) {
    let c = Cluster::start(plane, 1, |_| {}).await;
    let extra = serde_json::json!({"ignore_eos": true, "stream_options": {"include_usage": true}});
    let (_conn, mut r) = c.post("/v1/chat/completions", &chat(5, true, extra)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = events(&mut r).await;
    assert_eq!(events.len(), 5 + 2, "5 tokens, usage, [DONE]: {events:?}");
    assert!(events.iter().all(|e| e.event.is_none()), "{events:?}");
    let chunks: Vec<serde_json::Value> = events[..6].iter().map(|e| json(&e.data)).collect();
    let id = chunks[0]["id"].as_str().expect("an id");
    assert!(id.starts_with("chatcmpl-") && id.len() == 9 + 32, "{id}");
    for (i, c) in chunks[..5].iter().enumerate() {
        assert_eq!(c["id"], id);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], MODEL);
        assert!(
            c["created"].as_u64().is_some_and(|t| t > 1_600_000_000),
            "{c}"
        );
        assert_eq!(
            c["usage"],
            serde_json::Value::Null,
            "usage is null until the last chunk"
        );
        let choice = &c["choices"][0];
        assert_eq!(choice["index"], 0);
        assert_eq!(choice["logprobs"], serde_json::Value::Null);
        assert!(
            choice["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty()),
            "{c}"
        );
        let role = choice["delta"].get("role");
        if i == 0 {
            assert_eq!(
                role,
                Some(&serde_json::json!("assistant")),
                "role on the first chunk"
            );
        } else {
            assert_eq!(role, None, "role only on the first chunk: {c}");
        }
        let finish = if i == 4 {
            serde_json::json!("length")
        } else {
            serde_json::Value::Null
        };
        assert_eq!(choice["finish_reason"], finish, "{c}");
    }
    let usage = &chunks[5];
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["id"], id);
    let prompt = 3 + (3 + 3) + (3 + 4); // reply primer, "Be brief.", "Hello, world!"
    assert_eq!(
        usage["usage"],
        serde_json::json!({"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5})
    );
    assert_eq!(events[6].data, "[DONE]");
}

both_planes!(
    unary_and_completions_velo,
    unary_and_completions_classic,
    unary_answers_completions_and_eos_follow_openai
);

async fn unary_answers_completions_and_eos_follow_openai(plane: Plane) {
    let c = Cluster::start(plane, 2, |_| {}).await;
    // Without ignore_eos the mock model stops at its own end of sequence: "stop".
    let (_conn, r) = c
        .post(
            "/v1/chat/completions",
            &chat(1000, false, serde_json::json!({})),
        )
        .await;
    assert_eq!(r.status, 200);
    let body = json(&r.text().await.expect("a body"));
    assert_eq!(body["object"], "chat.completion");
    assert!(
        body["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("chatcmpl-")),
        "{body}"
    );
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "stop");
    let n = body["usage"]["completion_tokens"].as_u64().expect("usage");
    assert!((16..=256).contains(&n), "the mock model's own length: {n}");
    assert!(
        !choice["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
    );
    // /v1/completions, streaming, with the token limit reached and nvext.ignore_eos.
    let body = serde_json::json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3,
        "stream": true, "nvext": {"ignore_eos": true}});
    let (_conn, mut r) = c.post("/v1/completions", &body).await;
    assert_eq!(r.status, 200);
    let events = events(&mut r).await;
    assert_eq!(events.len(), 4, "{events:?}");
    for (i, e) in events[..3].iter().enumerate() {
        let chunk = json(&e.data);
        assert_eq!(chunk["object"], "text_completion");
        assert!(
            chunk["id"].as_str().is_some_and(|i| i.starts_with("cmpl-")),
            "{chunk}"
        );
        assert!(
            chunk.get("usage").is_none(),
            "no usage without include_usage: {chunk}"
        );
        let finish = if i == 2 {
            serde_json::json!("length")
        } else {
            serde_json::Value::Null
        };
        assert_eq!(chunk["choices"][0]["finish_reason"], finish);
        assert!(chunk["choices"][0]["text"].is_string());
    }
    assert_eq!(events[3].data, "[DONE]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_and_the_info_routes_answer() {
    let c = Cluster::start(Plane::Velo, 1, |_| {}).await;
    for (body, status, param) in [
        (serde_json::json!({"model": MODEL}), 400, None),
        (
            chat(5000, true, serde_json::json!({})),
            400,
            Some("max_tokens"),
        ),
        (
            chat(1, true, serde_json::json!({"max_completion_tokens": 0})),
            400,
            Some("max_completion_tokens"),
        ),
        (
            chat(1, true, serde_json::json!({"model": "gpt-7"})),
            404,
            Some("model"),
        ),
    ] {
        let (_conn, r) = c.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status, status, "{body}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let e = json(&r.text().await.expect("a body"));
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{e}"
        );
        assert!(e["error"]["type"].is_string(), "{e}");
        assert_eq!(e["error"]["param"].as_str(), param, "{e}");
    }
    let mut conn = velo_serve::client::Conn::open(c.addr())
        .await
        .expect("connect");
    let r = conn
        .send("POST", "/v1/completions", Some("{\"model\": ".into()))
        .await
        .expect("an answer");
    assert_eq!(r.status, 400);
    assert!(json(&r.text().await.expect("a body"))["error"]["message"].is_string());
    let (status, models) = c.get("/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(json(&models)["data"][0]["id"], MODEL);
    let (status, health) = c.get("/health").await;
    assert_eq!(
        (status, json(&health)["status"].as_str()),
        (200, Some("healthy"))
    );
    let (status, metrics) = c.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("dynamo_frontend_requests_total{model=\"velo-mock\",endpoint=\"chat_completions\",request_type=\"unary\",status=\"error\",error_type=\"validation\"} 3"), "{metrics}");
    assert!(metrics.contains("# TYPE dynamo_frontend_time_to_first_token_seconds histogram"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_a_503_with_retry_after_not_a_queue() {
    let c = Cluster::start(Plane::Velo, 1, |f| {
        f.admission.max_in_flight = 1;
        f.admission.max_queued = 0;
    })
    .await;
    let long = chat(4000, true, serde_json::json!({"ignore_eos": true}));
    let (_held, mut first) = c.post("/v1/chat/completions", &long).await;
    assert_eq!(first.status, 200);
    let _ = next_event(&mut first).await;
    let (_conn, r) = c
        .post(
            "/v1/chat/completions",
            &chat(1, true, serde_json::json!({})),
        )
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    let e = json(&r.text().await.expect("a body"));
    assert_eq!(e["error"]["code"], "overloaded");
    assert_eq!(
        c.frontend.state().metrics.requests_with(Outcome::Overload),
        1
    );
}

both_planes!(
    disconnect_frees_the_slot_velo,
    disconnect_frees_the_slot_classic,
    a_client_that_disconnects_mid_stream_frees_its_engine_slot
);

async fn a_client_that_disconnects_mid_stream_frees_its_engine_slot(plane: Plane) {
    let c = Cluster::start(plane, 1, |_| {}).await;
    let stats = c.workers[0].stats().clone();
    let long = chat(4000, true, serde_json::json!({"ignore_eos": true}));
    let (conn, mut r) = c.post("/v1/chat/completions", &long).await;
    assert_eq!(r.status, 200);
    for _ in 0..3 {
        let e = next_event(&mut r).await;
        assert!(e.event.is_none(), "{e:?}");
    }
    assert_eq!(stats.snapshot()[0], 1, "the request holds an engine slot");
    drop((r, conn));
    c.wait_for("the engine to free the slot", |_| stats.snapshot()[0] == 0)
        .await;
    let [_, admitted, completed, cancelled, _] = stats.snapshot();
    assert_eq!(
        (admitted, completed, cancelled),
        (1, 0, 1),
        "the engine saw the kill"
    );
    let m = &c.frontend.state().metrics;
    c.wait_for("the frontend to count the disconnect", |_| {
        m.requests_with(Outcome::Cancelled) == 1
    })
    .await;
}

both_planes!(
    worker_killed_velo,
    worker_killed_classic,
    a_worker_process_killed_mid_stream_ends_the_stream_with_an_error_event
);

async fn a_worker_process_killed_mid_stream_ends_the_stream_with_an_error_event(plane: Plane) {
    let c = Cluster::start(plane, 0, |_| {}).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_velo-serve"))
        .arg("worker")
        .args(["--engines", "1", "--speedup", "10"])
        .env(velo_serve::discovery::ENV_FILE_KV, c.root())
        .env(response_plane::ENV_PLANE, plane_name(plane))
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the worker process starts");
    c.wait_for("the worker process to be discovered", |c| {
        c.frontend.state().pool.len() == 1
    })
    .await;
    let long = chat(4000, true, serde_json::json!({"ignore_eos": true}));
    let (_conn, mut r) = c.post("/v1/chat/completions", &long).await;
    assert_eq!(r.status, 200);
    let _ = next_event(&mut r).await;
    let killed = Instant::now();
    child.start_kill().expect("SIGKILL");
    let _ = child.wait().await;
    let rest = events(&mut r).await;
    let last = rest.last().expect("an event after the kill");
    assert_eq!(
        last.event.as_deref(),
        Some("error"),
        "{} events, the last {last:?}",
        rest.len()
    );
    let e = json(&last.data);
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{e}"
    );
    assert!(
        rest.iter().all(|e| e.data != "[DONE]"),
        "no [DONE] after an error: {rest:?}"
    );
    // Well within the liveness bound (10 s): the kernel closes a dead process's sockets.
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "{:?}",
        killed.elapsed()
    );
    c.wait_for("the dead worker to leave routing", |c| {
        c.frontend.state().pool.is_empty()
    })
    .await;
}

both_planes!(
    removed_worker_velo,
    removed_worker_classic,
    requests_waiting_on_a_worker_removed_from_discovery_are_retried_on_another
);

/// A worker that takes requests and never answers: its streams wait for a prologue.
async fn silent_worker() -> (std::net::SocketAddr, tokio::sync::mpsc::Receiver<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("an address");
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let open = velo_serve::work::RequestAuth::open();
        if velo_serve::work::auth::worker_handshake(&mut stream, &open)
            .await
            .is_err()
        {
            return;
        }
        let mut frames = tokio_util::codec::FramedRead::new(
            stream,
            tokio_util::codec::LengthDelimitedCodec::new(),
        );
        while let Some(Ok(_)) = futures::StreamExt::next(&mut frames).await {
            let _ = tx.send(()).await;
        }
    });
    (addr, rx)
}

async fn requests_waiting_on_a_worker_removed_from_discovery_are_retried_on_another(plane: Plane) {
    let mut c = Cluster::start(plane, 0, |_| {}).await;
    let (addr, mut received) = silent_worker().await;
    let silent = velo_serve::discovery::Instance {
        namespace: "dynamo".into(),
        component: "backend".into(),
        endpoint: "generate".into(),
        instance_id: 0x51_1e47,
        transport: velo_serve::discovery::Transport::Tcp(addr.to_string()),
    };
    let lease =
        velo_serve::discovery::lease::Lease::publish(&c.discovery, &silent).expect("publish");
    c.wait_for("the silent worker to be discovered", |c| {
        c.frontend.state().pool.len() == 1
    })
    .await;
    let started = Instant::now();
    let mut requests = Vec::new();
    for _ in 0..3 {
        let addr = c.addr();
        requests.push(tokio::spawn(async move {
            let mut conn = velo_serve::client::Conn::open(addr).await.expect("connect");
            let body = chat(4, true, serde_json::json!({"ignore_eos": true})).to_string();
            let mut r = conn
                .post("/v1/chat/completions", &body)
                .await
                .expect("an answer");
            (r.status, events(&mut r).await)
        }));
    }
    for _ in 0..3 {
        tokio::time::timeout(BOUND, received.recv())
            .await
            .expect("the silent worker got a request");
    }
    c.add_worker().await;
    lease.close();
    for r in requests {
        let (status, events) = tokio::time::timeout(BOUND, r)
            .await
            .expect("in time")
            .expect("the request task");
        assert_eq!(status, 200);
        assert_eq!(
            events.last().map(|e| e.data.as_str()),
            Some("[DONE]"),
            "{events:?}"
        );
        assert_eq!(events.len(), 5, "{events:?}");
    }
    // Far below the 60 s the requests would otherwise have waited for their prologue.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let m = &c.frontend.state().metrics;
    assert!(m.migrations.load(std::sync::atomic::Ordering::Relaxed) >= 3);
    assert_eq!(
        c.frontend.state().pool.ids(),
        vec![c.workers[0].instance_id()]
    );
}

fn plane_name(p: Plane) -> &'static str {
    p.name()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_page_has_the_frontends_and_the_planes_metrics_and_is_valid_prometheus() {
    let c = Cluster::start(Plane::Velo, 1, |_| {}).await;
    let (_conn, mut r) = c
        .post(
            "/v1/chat/completions",
            &chat(3, true, serde_json::json!({"ignore_eos": true})),
        )
        .await;
    assert_eq!(events(&mut r).await.len(), 4);
    let (status, text) = c.get("/metrics").await;
    assert_eq!(status, 200);
    for needle in [
        "dynamo_frontend_requests_total{model=\"velo-mock\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"success\",error_type=\"\"} 1",
        "dynamo_frontend_output_tokens_total{model=\"velo-mock\"} 3",
        "dynamo_frontend_time_to_first_token_seconds_count{model=\"velo-mock\"} 1",
        "dynamo_frontend_inter_token_latency_seconds_count{model=\"velo-mock\"} 2",
        "velo_response_streams_registered",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    promtool_check(&text);
}

/// `promtool check metrics` accepts the exposition.
fn promtool_check(text: &str) {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child =
        child.expect("promtool is needed for this test: apt-get install prometheus (.ci/run does)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_stream_on_a_worker_removed_from_discovery_ends_with_an_error_after_the_grace() {
    let mut c = Cluster::start(Plane::Velo, 1, |f| {
        f.removal_grace = Duration::from_millis(200)
    })
    .await;
    let stats = c.workers[0].stats().clone();
    let long = chat(4000, true, serde_json::json!({"ignore_eos": true}));
    let (_conn, mut r) = c.post("/v1/chat/completions", &long).await;
    assert_eq!(r.status, 200);
    let _ = next_event(&mut r).await;
    c.add_worker().await;
    c.workers[0].leave_discovery();
    let rest = events(&mut r).await;
    let last = rest.last().expect("an event after the removal");
    assert_eq!(
        last.event.as_deref(),
        Some("error"),
        "{} events, the last {last:?}",
        rest.len()
    );
    assert!(
        json(&last.data)["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("left discovery")),
        "{last:?}"
    );
    c.wait_for("the removed worker's engine to see the kill", |_| {
        stats.snapshot()[0] == 0
    })
    .await;
    // The other worker serves on.
    let (_conn, mut r) = c
        .post(
            "/v1/chat/completions",
            &chat(3, true, serde_json::json!({"ignore_eos": true})),
        )
        .await;
    assert_eq!(
        events(&mut r)
            .await
            .last()
            .map(|e| e.data.clone())
            .as_deref(),
        Some("[DONE]")
    );
}
