//! The request plane under the cluster secret (`DYN_VELO_CLUSTER_SECRET_PATH`): a worker runs
//! only what a frontend that proved the secret sends it, and a frontend sends requests only to
//! a worker that proved it. Strangers, impostors and half-configured peers get a clear error
//! and a closed connection, never a hang. Real sockets on loopback.

mod harness;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use harness::intake::{
    closed_before_any_engine_saw_it, greeting, refusals_reach, request_numbered, worker_and_request,
};
use harness::{BOUND, Cluster, chat, events};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_serve::discovery::lease::Lease;
use velo_serve::discovery::{Instance, Transport};
use velo_serve::work::auth::{self, GREETING_LEN, HANDSHAKE_TIMEOUT, PROOF_LEN};
use velo_serve::work::{
    ConnectError, HandshakeError, IntakeStats, RequestAuth, WorkChannel, WorkLimits, WorkRequest,
};
use velo_serve::worker::Worker;

/// The cluster's secret.
const SECRET: &str = "the velo-serve tests' secret....";
/// Another secret, as a stranger or a misconfigured peer would hold.
const WRONG: &str = "not the velo-serve tests' secret";

/// Someone who reaches a worker's request port without the secret writes a well-formed request
/// pointing at a stream of their choosing (at once, or after greeting without a secret): the
/// worker closes the connection, counts it, and no engine runs the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_without_the_secret_gets_no_request_run() {
    let (worker, frontend, request) = worker_and_request(Some(SECRET)).await;
    let openings: [&[u8]; 2] = [&[], &greeting(1, 0)];
    for (n, opening) in (1..).zip(openings) {
        let mut stranger = TcpStream::connect(worker.address()).await.unwrap();
        stranger.write_all(opening).await.unwrap();
        stranger.write_all(&request).await.unwrap();
        closed_before_any_engine_saw_it(&mut stranger, &worker, n).await;
    }
    worker.abort();
    let _ = frontend.shutdown().await;
}

/// A stranger with another secret: run honestly, the handshake fails on its side too; sent
/// at once (a made-up proof and the request right behind it, not waiting for the worker's
/// verdict), the request is still never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_with_a_wrong_secret_gets_no_request_run() {
    let (worker, frontend, request) = worker_and_request(Some(SECRET)).await;
    let wrong = RequestAuth::with_secret(WRONG.as_bytes()).unwrap();

    let mut honest = TcpStream::connect(worker.address()).await.unwrap();
    let refused = auth::frontend_handshake(&mut honest, &wrong).await;
    assert!(
        matches!(refused, Err(HandshakeError::Refused)),
        "{refused:?}"
    );
    // Whatever it writes now goes nowhere (the worker closed; the write may fail).
    let _ = honest.write_all(&request).await;
    closed_before_any_engine_saw_it(&mut honest, &worker, 1).await;

    let mut pipelined = TcpStream::connect(worker.address()).await.unwrap();
    let mut bytes = greeting(1, 1).to_vec();
    bytes.extend_from_slice(&[0xa5; PROOF_LEN]);
    bytes.extend_from_slice(&request);
    pipelined.write_all(&bytes).await.unwrap();
    closed_before_any_engine_saw_it(&mut pipelined, &worker, 2).await;

    worker.abort();
    let _ = frontend.shutdown().await;
}

/// A worker that closed a connection whose handshake failed has its slot back: with room
/// for one connection, a frontend with the secret is served right after a stranger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_frees_its_slot_for_the_next_frontend() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, mut delivered) = mpsc::channel(4);
    let stop = CancellationToken::new();
    let stats = Arc::new(IntakeStats::default());
    let limits = WorkLimits {
        max_requests: 4,
        max_connections: 1,
    };
    let secret = RequestAuth::with_secret(SECRET.as_bytes()).unwrap();
    let deliver = move |raw: Bytes| {
        let _ = tx.try_send(WorkRequest::decode(&raw).map(|r| r.id).ok());
    };
    let tracker = TaskTracker::new();
    let serve = velo_serve::work::serve(
        listener,
        limits,
        secret.clone(),
        stats.clone(),
        tracker.clone(),
        stop.clone(),
        deliver,
    );
    tokio::spawn(serve);

    let mut stranger = TcpStream::connect(addr).await.unwrap();
    stranger.write_all(&greeting(1, 0)).await.unwrap();
    let mut rest = Vec::new();
    let end = tokio::time::timeout(BOUND, stranger.read_to_end(&mut rest)).await;
    assert!(end.is_ok(), "the stranger's connection stays open");
    // The worker closes the connection a moment before it counts the refusal.
    refusals_reach(&stats, 1).await;

    let channel = tokio::time::timeout(BOUND, WorkChannel::connect(addr, &secret, &tracker))
        .await
        .expect("the frontend is served in time: the stranger's slot was freed")
        .expect("the frontend passes the handshake");
    let request = request_numbered(7);
    channel.send(&request).await.unwrap();
    let got = tokio::time::timeout(BOUND, delivered.recv()).await;
    assert!(matches!(got, Ok(Some(Some(7)))), "{got:?}");
    channel.close();
    stop.cancel();
}

/// What a "worker" the frontend discovered did: how its handshake went, and what the
/// frontend sent after it.
#[derive(Debug)]
struct Impostor {
    accepted_at: Instant,
    bytes_after_handshake: usize,
}

/// A "worker" listed in discovery that does not know the secret, in one of two ways: it says
/// it has none (`claims_secret` false), or it claims one, accepts any proof and answers with
/// a made-up proof of its own. Reports every connection the frontend makes to it.
async fn impostor(c: &Cluster, claims_secret: bool) -> (Lease, mpsc::Receiver<Impostor>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let accepted_at = Instant::now();
            let mode = u8::from(claims_secret);
            if conn.write_all(&greeting(2, mode)).await.is_err() {
                continue;
            }
            let mut theirs = [0; GREETING_LEN + PROOF_LEN];
            let expected = if claims_secret {
                theirs.len()
            } else {
                GREETING_LEN
            };
            if conn.read_exact(&mut theirs[..expected]).await.is_err() {
                continue;
            }
            if claims_secret {
                let mut accept = [0x77; 1 + PROOF_LEN];
                accept[0] = 1;
                let _ = conn.write_all(&accept).await;
            }
            let mut rest = Vec::new();
            let _ = conn.read_to_end(&mut rest).await;
            let report = Impostor {
                accepted_at,
                bytes_after_handshake: rest.len(),
            };
            if tx.send(report).await.is_err() {
                return;
            }
        }
    });
    let d = &c.discovery;
    let instance = Instance {
        namespace: d.namespace.clone(),
        component: d.component.clone(),
        endpoint: d.endpoint.clone(),
        instance_id: 0x1337,
        transport: Transport::Tcp(addr.to_string()),
    };
    (Lease::publish(d, &instance).unwrap(), rx)
}

/// A frontend with the secret discovers a "worker" that cannot prove it: the frontend closes
/// the connection without sending a single request byte, never routes to it (a request gets
/// 503), and tries it again only after a pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_does_not_know_the_secret_is_refused_by_the_frontend() {
    for claims_secret in [false, true] {
        let c = Cluster::start_on(harness::plane_with_secret(Some(SECRET)), 0, |_| {}).await;
        let (lease, mut connections) = impostor(&c, claims_secret).await;
        let first = tokio::time::timeout(BOUND, connections.recv())
            .await
            .expect("the frontend connects and closes in time")
            .expect("the impostor runs");
        assert_eq!(
            first.bytes_after_handshake, 0,
            "claims a secret: {claims_secret}: the frontend sent a request"
        );
        assert!(c.frontend.state().pool.is_empty(), "routed to the impostor");
        let (_conn, r) = c
            .post(
                "/v1/chat/completions",
                &chat(4, false, serde_json::json!({})),
            )
            .await;
        assert_eq!(r.status, 503, "claims a secret: {claims_secret}");
        let second = tokio::time::timeout(BOUND, connections.recv())
            .await
            .expect("the frontend tries again")
            .expect("the impostor runs");
        assert_eq!(second.bytes_after_handshake, 0);
        let pause = second.accepted_at - first.accepted_at;
        assert!(
            pause >= velo_serve::frontend::pool::RETRY_PAUSE,
            "tried again after {pause:?}"
        );
        lease.close();
    }
}

/// The story with the secret on both sides: a streamed chat served end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_and_a_worker_sharing_the_secret_serve_a_chat() {
    let c = Cluster::start_on(harness::plane_with_secret(Some(SECRET)), 1, |_| {}).await;
    let (_conn, mut r) = c
        .post(
            "/v1/chat/completions",
            &chat(8, true, serde_json::json!({"ignore_eos": true})),
        )
        .await;
    assert_eq!(r.status, 200);
    let events = events(&mut r).await;
    assert_eq!(events.len(), 8 + 1, "8 tokens, then [DONE]: {events:?}");
    assert_eq!(events[8].data, "[DONE]");
    let refused = c.workers[0]
        .intake_stats()
        .handshakes_refused
        .load(Ordering::Relaxed);
    assert_eq!(refused, 0);
}

/// A secret on one side only, either way round: the frontend's connect fails at once (well
/// within the handshake's bound) naming the side without the secret; the worker refuses the
/// connection and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_on_one_side_only_is_a_clear_error_not_a_hang() {
    let cases = [
        (
            Some(SECRET),
            RequestAuth::open(),
            "the worker requires a cluster secret, but this frontend has none",
        ),
        (
            None,
            RequestAuth::with_secret(SECRET.as_bytes()).unwrap(),
            "the worker has no cluster secret, but this frontend requires one",
        ),
    ];
    for (worker_secret, frontend, want) in cases {
        let config = harness::worker_config(
            harness::plane_with_secret(worker_secret),
            harness::discovery(Duration::from_secs(10)),
        );
        let worker = Worker::start(config).await.expect("the worker starts");
        let tracker = TaskTracker::new();
        let start = Instant::now();
        let r = WorkChannel::connect(worker.address(), &frontend, &tracker).await;
        let took = start.elapsed();
        let err = match r {
            Err(ConnectError::Handshake(e)) => e.to_string(),
            other => panic!("not a handshake error: {other:?}"),
        };
        assert!(err.contains(want), "{err}");
        assert!(
            took < HANDSHAKE_TIMEOUT,
            "took {took:?}: a hang, not an answer"
        );
        refusals_reach(worker.intake_stats(), 1).await;
        worker.abort();
    }
}
