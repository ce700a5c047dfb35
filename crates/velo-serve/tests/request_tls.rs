//! The request plane under the response plane's TLS (`DYN_TCP_TLS_*`): with TLS on both
//! sides nothing of a request crosses in clear; a worker that does not trust the frontend, a
//! frontend that requires a client certificate the worker lacks, and TLS on one side only are
//! each a clear error, never a hang, and no request reaches an engine. Real sockets on
//! loopback; certificates made at test time.

mod harness;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use harness::{BOUND, Cluster, MODEL, events};
use response_plane::ResponsePlaneConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::task::TaskTracker;
use velo_serve::discovery::lease::Lease;
use velo_serve::discovery::{Instance, Transport};
use velo_serve::work::auth::{HANDSHAKE_TIMEOUT, Side};
use velo_serve::work::{ConnectError, RequestAuth, WorkChannel};
use velo_serve::worker::Worker;
use velo_tls::testing::TestPki;

/// The cluster's secret.
const SECRET: &str = "the velo-serve tests' secret....";
/// A prompt no other byte on the wire could spell by chance.
const PROMPT: &str = "zebra quartz marmalade 7741: the prompt that must not be seen";

/// The velo plane on loopback with `vars` (`DYN_TCP_TLS_*`) and the cluster secret.
fn plane(pki: &TestPki, vars: &[(&'static str, String)]) -> ResponsePlaneConfig {
    let mut vars = vars.to_vec();
    vars.extend([
        ("DYN_RESPONSE_PLANE", "velo".to_owned()),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1".to_owned()),
        (
            "DYN_VELO_CLUSTER_SECRET_PATH",
            pki.path("secret").display().to_string(),
        ),
    ]);
    ResponsePlaneConfig::from_lookup(|v| vars.iter().find(|(k, _)| *k == v).map(|(_, x)| x.clone()))
        .expect("a valid TLS configuration")
}

/// A fresh PKI with the cluster secret written next to its certificates.
fn pki() -> TestPki {
    let pki = TestPki::new();
    std::fs::write(pki.path("secret"), SECRET).expect("the secret is written");
    pki
}

/// `DYN_TCP_TLS_*` with only the listed variables of the mutual-TLS set.
fn only(pki: &TestPki, names: &[&str]) -> Vec<(&'static str, String)> {
    let mut vars = pki.mutual_tls_env();
    vars.retain(|(k, _)| names.contains(k));
    vars
}

const SERVER: [&str; 2] = ["DYN_TCP_TLS_CERT_PATH", "DYN_TCP_TLS_KEY_PATH"];
const TRUST: [&str; 1] = ["DYN_TCP_TLS_CA_CERT_PATH"];

/// Copies `from` to `to`, appending every byte to `seen`, until either side ends.
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    seen: Arc<Mutex<Vec<u8>>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(&buf[..n]);
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A TCP relay to `target` that records every byte it carries, both ways.
async fn recording_relay(target: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = TcpStream::connect(target).await else {
                continue;
            };
            let (ir, iw) = inbound.into_split();
            let (or, ow) = outbound.into_split();
            tokio::spawn(pipe(ir, ow, record.clone()));
            tokio::spawn(pipe(or, iw, record.clone()));
        }
    });
    (addr, seen)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// With TLS on both sides, a chat served through a relay that records the request plane:
/// the answer arrives, and neither the prompt, nor the request's JSON (its stream address and
/// token), nor the handshake's greeting crosses in clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_on_both_sides_no_request_crosses_the_request_plane_in_clear() {
    let pki = pki();
    let secured = plane(&pki, &pki.mutual_tls_env());
    let c = Cluster::start_on(secured.clone(), 0, |_| {}).await;
    // The worker publishes itself elsewhere: the frontend knows it only through the relay.
    let hidden = harness::discovery(Duration::from_secs(10));
    let worker = Worker::start(harness::worker_config(secured, hidden))
        .await
        .expect("the worker starts");
    let (relay, seen) = recording_relay(worker.address()).await;
    let d = &c.discovery;
    let id = worker.instance_id();
    let instance = Instance {
        namespace: d.namespace.clone(),
        component: d.component.clone(),
        endpoint: d.endpoint.clone(),
        instance_id: worker.instance_id(),
        transport: Transport::Tcp(relay.to_string()),
    };
    let lease = Lease::publish(d, &instance).unwrap();
    c.wait_for("the relayed worker to be routed to", |c| {
        c.frontend.state().pool.ids().contains(&id)
    })
    .await;

    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "stream": true,
        "ignore_eos": true,
    });
    let (_conn, mut r) = c.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    let events = events(&mut r).await;
    assert_eq!(events.len(), 8 + 1, "8 tokens, then [DONE]: {events:?}");

    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert!(!seen.is_empty(), "the relay carried the request plane");
    for clear in [
        PROMPT.as_bytes(),
        b"zebra quartz",
        b"prompt_tokens",
        b"\"info\"",
        b"\"token\"",
        b"velo-rq1",
    ] {
        assert!(
            !contains(&seen, clear),
            "{:?} crossed the request plane in clear: {:?}",
            String::from_utf8_lossy(clear),
            String::from_utf8_lossy(&seen)
        );
    }
    lease.close();
    worker.abort();
}

/// Connects a frontend configured by `frontend` to a worker configured by `worker`; returns
/// the frontend's error, after checking it came well within the handshake's bound, that the
/// worker refused the connection and that no engine saw a request.
async fn refused(
    pki: &TestPki,
    frontend: &[(&'static str, String)],
    worker: &[(&'static str, String)],
) -> String {
    let config = harness::worker_config(
        plane(pki, worker),
        harness::discovery(Duration::from_secs(10)),
    );
    let worker = Worker::start(config).await.expect("the worker starts");
    let auth = RequestAuth::from_config(&plane(pki, frontend), Side::Frontend)
        .expect("the frontend's request-plane security loads");
    let tracker = TaskTracker::new();
    let start = Instant::now();
    let r = WorkChannel::connect(worker.address(), &auth, &tracker).await;
    let took = start.elapsed();
    let err = match r {
        Err(ConnectError::Handshake(e)) => e.to_string(),
        other => panic!("not a handshake error: {other:?}"),
    };
    assert!(took < HANDSHAKE_TIMEOUT, "took {took:?}: a hang: {err}");
    let intake = worker.intake_stats().clone();
    let start = Instant::now();
    while intake
        .handshakes_refused
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        assert!(start.elapsed() < BOUND, "the worker never refused: {err}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let [running, admitted, completed, cancelled, refused] = worker.stats().snapshot();
    assert_eq!(
        running + admitted + completed + cancelled + refused,
        0,
        "a request reached an engine"
    );
    worker.abort();
    err
}

/// A worker that trusts another CA refuses the frontend: the TLS handshake fails, the
/// frontend is told so, and nothing reaches an engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_trusts_another_ca_refuses_the_frontend() {
    let pki = pki();
    pki.foreign("other");
    let other_ca = (
        "DYN_TCP_TLS_CA_CERT_PATH",
        pki.path("other-ca.pem").display().to_string(),
    );
    let err = refused(&pki, &only(&pki, &SERVER), &[other_ca]).await;
    assert!(
        err.contains("TLS handshake with the worker failed"),
        "{err}"
    );
}

/// A frontend that requires client certificates refuses a worker that has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_requiring_client_certificates_refuses_a_worker_without_one() {
    let pki = pki();
    let err = refused(&pki, &pki.mutual_tls_env(), &only(&pki, &TRUST)).await;
    assert!(
        err.contains("TLS handshake with the worker failed"),
        "{err}"
    );
}

/// TLS on the frontend only: the frontend says the worker lacks it, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_the_frontend_only_is_a_clear_error_naming_the_worker() {
    let pki = pki();
    let err = refused(&pki, &only(&pki, &SERVER), &[]).await;
    assert!(
        err.contains("the worker has no TLS on the request plane, but this frontend requires it"),
        "{err}"
    );
}

/// TLS on the worker only: the frontend says it lacks TLS the worker requires, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_the_worker_only_is_a_clear_error_naming_the_frontend() {
    let pki = pki();
    let err = refused(&pki, &[], &only(&pki, &TRUST)).await;
    assert!(
        err.contains("the worker requires TLS on the request plane, but this frontend has none"),
        "{err}"
    );
}

/// A frontend starts with a certificate its workers do not trust, and a worker refuses it;
/// the certificate's files are then rotated, without a restart, to one the workers' CA
/// issued. The frontend's next try of the worker opens a new request-plane connection with
/// the new certificate, the worker accepts it, and a chat is served through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_frontend_certificate_reaches_new_request_plane_connections() {
    let pki = pki();
    pki.foreign("other");
    for (from, to) in [
        ("other-server.pem", "server.pem"),
        ("other-server.key", "server.key"),
    ] {
        std::fs::copy(pki.path(from), pki.path(to)).expect("the foreign identity is in place");
    }
    let secured = plane(&pki, &only(&pki, &[SERVER[0], SERVER[1], TRUST[0]]));
    let c = Cluster::start_on(secured.clone(), 0, |_| {}).await;
    let worker = Worker::start(harness::worker_config(secured, c.discovery.clone()))
        .await
        .expect("the worker starts");
    let id = worker.instance_id();
    let intake = worker.intake_stats().clone();
    let refusals = || {
        intake
            .handshakes_refused
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    c.wait_for("the worker to refuse the untrusted frontend", |_| {
        refusals() > 0
    })
    .await;
    assert!(
        !c.frontend.state().pool.ids().contains(&id),
        "a worker that refused the frontend is routed to"
    );

    // The rotation: a certificate and key from the workers' CA, written over the old files.
    pki.issue_server("server");
    c.wait_for(
        "a new request-plane connection with the rotated certificate",
        |c| c.frontend.state().pool.ids().contains(&id),
    )
    .await;

    // The response plane follows the files by a watch of its own; reloading it at once, as
    // SIGHUP does, keeps the chat from racing that watch.
    c.frontend
        .state()
        .plane
        .reload_tls()
        .expect("the rotated files load");
    let (_conn, mut r) = c
        .post(
            "/v1/chat/completions",
            &harness::chat(4, true, serde_json::json!({"ignore_eos": true})),
        )
        .await;
    assert_eq!(r.status, 200);
    let events = events(&mut r).await;
    assert_eq!(events.len(), 4 + 1, "4 tokens, then [DONE]: {events:?}");
    worker.abort();
}
