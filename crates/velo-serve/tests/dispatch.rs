//! Dispatch against workers that take requests and never answer them (a wedged engine loop, a
//! worker that cannot reach the frontend's response plane): however many workers it tries, a
//! request waits for a prologue `establish_timeout` in all, then gets a 503.

mod harness;

use std::time::Duration;

use harness::{Cluster, chat};
use response_plane::Plane;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_serve::discovery::lease::Lease;
use velo_serve::discovery::{Instance, Transport};

/// A worker listed in discovery whose request plane reads every request and answers none.
async fn silent_worker(c: &Cluster, instance_id: u64, stop: &CancellationToken) -> Lease {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serve = velo_serve::work::serve(
        listener,
        velo_serve::work::WorkLimits::default(),
        velo_serve::work::RequestAuth::open(),
        std::sync::Arc::default(),
        TaskTracker::new(),
        stop.clone(),
        |_| {},
    );
    tokio::spawn(serve);
    let d = &c.discovery;
    let instance = Instance {
        namespace: d.namespace.clone(),
        component: d.component.clone(),
        endpoint: d.endpoint.clone(),
        instance_id,
        transport: Transport::Tcp(addr.to_string()),
    };
    let lease = Lease::publish(d, &instance).unwrap();
    c.wait_for("the silent worker to be routed to", |c| {
        c.frontend.state().pool.ids().contains(&instance_id)
    })
    .await;
    lease
}

/// Four silent workers and four attempts: each attempt used to wait the whole
/// `establish_timeout` (four of them are at least 8 s, a lower bound the waits alone set);
/// the request's wait is one `establish_timeout` in all (2 s here; the bound of 6 s leaves
/// 4 s for a loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_worker_answers_waits_one_establish_timeout_in_all() {
    let establish = Duration::from_secs(2);
    let c = Cluster::start(Plane::Velo, 0, |f| {
        f.establish_timeout = establish;
        f.max_attempts = 4;
    })
    .await;
    let stop = CancellationToken::new();
    let mut leases = Vec::new();
    for id in 1..=4 {
        leases.push(silent_worker(&c, id, &stop).await);
    }
    let started = tokio::time::Instant::now();
    let (_conn, r) = c
        .post(
            "/v1/chat/completions",
            &chat(8, false, serde_json::json!({})),
        )
        .await;
    let waited = started.elapsed();
    let status = r.status;
    let body = r.text().await.expect("a body");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("establish_timeout"),
        "names the bound: {body}"
    );
    assert!(
        waited < establish * 3,
        "answered after {waited:?}: the attempts waited {establish:?} each"
    );
    stop.cancel();
    drop(leases);
}
