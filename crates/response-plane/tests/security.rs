//! Security of both planes as users configure it: Dynamo's `DYN_TCP_TLS_*` variables (a
//! half-set configuration stops startup naming the variable), the velo plane's cluster
//! secret, streams bound to the worker they were sent to, a routable default bind, and a
//! certificate reload reachable from a running plane.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use response_plane::{
    ConfigError, ConnectionInfo, FrontendPlane, PendingResponse, RegisterOptions, ResponseError,
    ResponsePlaneConfig, ResponseSender, StartError, TlsMismatch, WorkerPlane,
};
use tokio_util::task::TaskTracker;
use velo_tls::testing::TestPki;

/// A bound on every wait of these stories.
const BOUND: Duration = Duration::from_secs(20);

/// The planes each story runs on, by their `DYN_RESPONSE_PLANE` names: the velo plane needs
/// its TCP lanes (feature `tcp`); `tcp` is the classic plane.
#[cfg(feature = "tcp")]
const PLANES: &[&str] = &["velo", "tcp"];
#[cfg(not(feature = "tcp"))]
const PLANES: &[&str] = &["tcp"];

/// A configuration from `vars` (plus a loopback host).
fn config(vars: &[(&str, String)]) -> Result<ResponsePlaneConfig, ConfigError> {
    let mut map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    map.entry("DYN_TCP_RESPONSE_STREAM_HOST".into())
        .or_insert_with(|| "127.0.0.1".into());
    ResponsePlaneConfig::from_lookup(move |v| map.get(v).cloned())
}

fn path(pki: &TestPki, name: &str) -> String {
    pki.path(name).display().to_string()
}

/// Every TLS variable of a cluster with mutual TLS, as one env for frontends and workers.
fn mtls_env(pki: &TestPki, plane: &str) -> Vec<(&'static str, String)> {
    let mut vars = pki.mutual_tls_env();
    vars.push(("DYN_RESPONSE_PLANE", plane.to_owned()));
    vars
}

fn err_text(vars: &[(&str, String)]) -> String {
    config(vars).unwrap_err().to_string()
}

#[test]
fn a_half_set_tls_configuration_is_a_startup_error_naming_what_is_missing() {
    let pki = TestPki::new();
    let cert = ("DYN_TCP_TLS_CERT_PATH", path(&pki, "server.pem"));
    let key = ("DYN_TCP_TLS_KEY_PATH", path(&pki, "server.key"));
    let ca = ("DYN_TCP_TLS_CA_CERT_PATH", path(&pki, "ca.pem"));
    let text = err_text(std::slice::from_ref(&cert));
    assert!(
        text.contains("DYN_TCP_TLS_CERT_PATH is set but DYN_TCP_TLS_KEY_PATH is not"),
        "{text}"
    );

    let client_cert = ("DYN_TCP_TLS_CLIENT_CERT_PATH", path(&pki, "client.pem"));
    let client_key = ("DYN_TCP_TLS_CLIENT_KEY_PATH", path(&pki, "client.key"));
    let text = err_text(&[client_cert.clone(), client_key.clone()]);
    assert!(
        text.starts_with("DYN_TCP_TLS_CLIENT_CERT_PATH is set, but"),
        "{text}"
    );
    assert!(text.contains("DYN_TCP_TLS_CA_CERT_PATH"), "{text}");

    let insecure = ("DYN_TCP_TLS_INSECURE", "1".to_owned());
    let text = err_text(&[ca.clone(), insecure]);
    assert!(
        text.starts_with("DYN_TCP_TLS_INSECURE is set with"),
        "{text}"
    );

    let client_ca = ("DYN_TCP_TLS_CLIENT_CA_CERT_PATH", path(&pki, "ca.pem"));
    let text = err_text(&[client_ca]);
    assert!(
        text.starts_with("DYN_TCP_TLS_CLIENT_CA_CERT_PATH is set, but"),
        "{text}"
    );

    let bad = ("DYN_TCP_TLS_INSECURE", "yes".to_owned());
    assert!(err_text(&[bad]).contains("DYN_TCP_TLS_INSECURE=\"yes\""));
    let slow = ("DYN_TCP_TLS_HANDSHAKE_TIMEOUT_SECS", "0".to_owned());
    assert!(err_text(&[slow]).contains("DYN_TCP_TLS_HANDSHAKE_TIMEOUT_SECS"));
    config(&[cert, key, ca]).unwrap();
}

#[test]
fn an_empty_or_unreadable_pem_is_a_startup_error_naming_its_variable() {
    let pki = TestPki::new();
    std::fs::write(pki.path("empty.pem"), "").unwrap();
    let text = err_text(&[
        ("DYN_TCP_TLS_CERT_PATH", path(&pki, "empty.pem")),
        ("DYN_TCP_TLS_KEY_PATH", path(&pki, "server.key")),
    ]);
    assert!(text.starts_with("DYN_TCP_TLS_CERT_PATH:"), "{text}");
    assert!(text.contains("empty.pem"), "{text}");
    let text = err_text(&[("DYN_TCP_TLS_CA_CERT_PATH", path(&pki, "missing.pem"))]);
    assert!(text.starts_with("DYN_TCP_TLS_CA_CERT_PATH:"), "{text}");
    assert!(text.contains("missing.pem"), "{text}");
}

#[test]
fn a_cluster_secret_must_be_readable_and_long_enough() {
    let pki = TestPki::new();
    std::fs::write(pki.path("short"), "too short\n").unwrap();
    let text = err_text(&[("DYN_VELO_CLUSTER_SECRET_PATH", path(&pki, "short"))]);
    assert!(text.starts_with("DYN_VELO_CLUSTER_SECRET_PATH="), "{text}");
    assert!(text.contains("16..=4096 bytes, got 9"), "{text}");
    let text = err_text(&[("DYN_VELO_CLUSTER_SECRET_PATH", path(&pki, "absent"))]);
    assert!(text.contains("cannot read it"), "{text}");
}

#[test]
fn an_unspecified_host_is_refused_and_none_means_a_routable_address() {
    let text = err_text(&[("DYN_TCP_RESPONSE_STREAM_HOST", "0.0.0.0".into())]);
    assert!(
        text.contains("unspecified address cannot be advertised"),
        "{text}"
    );
    assert!(err_text(&[("DYN_TCP_RESPONSE_STREAM_HOST", "::".into())]).contains("unspecified"));
}

#[tokio::test]
async fn a_worker_that_cannot_verify_tls_frontends_does_not_start() {
    let pki = TestPki::new();
    let c = config(&[
        ("DYN_RESPONSE_PLANE", "velo".into()),
        ("DYN_TCP_TLS_CERT_PATH", path(&pki, "server.pem")),
        ("DYN_TCP_TLS_KEY_PATH", path(&pki, "server.key")),
    ])
    .unwrap();
    let err = WorkerPlane::new(c, TaskTracker::new()).unwrap_err();
    assert!(matches!(err, StartError::Config(_)), "{err}");
    assert!(
        err.to_string()
            .starts_with("DYN_TCP_TLS_CA_CERT_PATH is not set"),
        "{err}"
    );
    // And a frontend whose workers expect TLS it does not serve.
    let c = config(&[("DYN_TCP_TLS_CA_CERT_PATH", path(&pki, "ca.pem"))]).unwrap();
    let err = FrontendPlane::bind(c, TaskTracker::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("DYN_TCP_TLS_CERT_PATH is not set"),
        "{err}"
    );
    // A worker of a mutual-TLS cluster without its own certificate.
    let mut env = mtls_env(&pki, "velo");
    env.retain(|(k, _)| {
        !k.starts_with("DYN_TCP_TLS_CLIENT_CERT") && !k.starts_with("DYN_TCP_TLS_CLIENT_KEY")
    });
    let err = WorkerPlane::new(config(&env).unwrap(), TaskTracker::new()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("DYN_TCP_TLS_CLIENT_CERT_PATH is not set"),
        "{err}"
    );
}

/// One stream from `worker` to `frontend`, its items read back.
async fn one_stream(frontend: &FrontendPlane, worker: &WorkerPlane) -> Vec<String> {
    let (info, pending) = frontend
        .register::<String>(RegisterOptions::default())
        .unwrap();
    send_two(worker, &info).await;
    let stream = tokio::time::timeout(BOUND, pending.established())
        .await
        .unwrap()
        .unwrap();
    let items: Vec<_> = tokio::time::timeout(BOUND, stream.collect::<Vec<_>>())
        .await
        .unwrap();
    items.into_iter().map(Result::unwrap).collect()
}

async fn send_two(worker: &WorkerPlane, info: &ConnectionInfo) {
    let mut s = tokio::time::timeout(BOUND, worker.connect::<String>(info))
        .await
        .unwrap()
        .unwrap();
    s.send_prologue(Ok(())).await.unwrap();
    s.send(&"one".to_owned()).await.unwrap();
    s.send(&"two".to_owned()).await.unwrap();
    s.finish().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_planes_carry_streams_over_mutual_tls_with_a_cluster_secret() {
    let pki = TestPki::new();
    std::fs::write(pki.path("secret"), "a cluster secret of thirty-two b\n").unwrap();
    for &plane in PLANES {
        let mut env = mtls_env(&pki, plane);
        env.push(("DYN_VELO_CLUSTER_SECRET_PATH", path(&pki, "secret")));
        let tracker = TaskTracker::new();
        let frontend = FrontendPlane::bind(config(&env).unwrap(), tracker.clone())
            .await
            .unwrap();
        let worker = WorkerPlane::new(config(&env).unwrap(), tracker.clone()).unwrap();
        assert_eq!(
            one_stream(&frontend, &worker).await,
            ["one", "two"],
            "{plane}"
        );
        frontend.shutdown().await;
        worker.close();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_tied_to_a_worker_is_refused_from_any_other_even_with_its_token() {
    for &plane in PLANES {
        let base = config(&[("DYN_RESPONSE_PLANE", plane.into())]).unwrap();
        let tracker = TaskTracker::new();
        let frontend = FrontendPlane::bind(base.clone(), tracker.clone())
            .await
            .unwrap();
        let as_worker = |id| {
            let c = base.to_builder().worker_instance(Some(id)).build().unwrap();
            WorkerPlane::new(c, tracker.clone()).unwrap()
        };
        let (right, intruder) = (as_worker(7), as_worker(8));
        let (info, pending) = frontend
            .register::<String>(RegisterOptions::default())
            .unwrap();
        pending.associate(7).unwrap();
        // The intruder has the whole address, token included.
        if let Ok(Ok(mut s)) = tokio::time::timeout(BOUND, intruder.connect::<String>(&info)).await
        {
            let _ = s.send_prologue(Ok(())).await;
            let _ = s.send(&"forged".to_owned()).await;
        }
        let deadline = tokio::time::Instant::now() + BOUND;
        while frontend.stats().arrivals_wrong_worker == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{plane}: refusal not counted"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            frontend.pending(),
            1,
            "{plane}: the registration still waits"
        );
        send_two(&right, &info).await;
        let stream = tokio::time::timeout(BOUND, pending.established())
            .await
            .unwrap()
            .unwrap();
        let items: Vec<_> = stream.map(Result::unwrap).collect().await;
        assert_eq!(items, ["one", "two"], "{plane}");
        frontend.shutdown().await;
    }
}

/// A velo plane with TLS whose worker trusts `ca` (a file of `pki`).
#[cfg(feature = "tcp")]
fn rotation_env(pki: &TestPki, ca: &str) -> Vec<(&'static str, String)> {
    vec![
        ("DYN_RESPONSE_PLANE", "velo".to_owned()),
        ("DYN_TCP_TLS_CERT_PATH", path(pki, "server.pem")),
        ("DYN_TCP_TLS_KEY_PATH", path(pki, "server.key")),
        ("DYN_TCP_TLS_CA_CERT_PATH", path(pki, ca)),
    ]
}

/// A PKI with a second CA (`next-*`) and a frontend serving the first CA's certificate.
#[cfg(feature = "tcp")]
async fn rotation_start() -> (TestPki, TaskTracker, FrontendPlane) {
    let pki = TestPki::new();
    pki.foreign("next");
    let tracker = TaskTracker::new();
    let config = config(&rotation_env(&pki, "ca.pem")).unwrap();
    let frontend = FrontendPlane::bind(config, tracker.clone()).await.unwrap();
    (pki, tracker, frontend)
}

/// The frontend's certificate files rotate to ones the next CA vouches for.
#[cfg(feature = "tcp")]
fn rotate(pki: &TestPki) {
    std::fs::copy(pki.path("next-server.pem"), pki.path("server.pem")).unwrap();
    std::fs::copy(pki.path("next-server.key"), pki.path("server.key")).unwrap();
}

#[cfg(feature = "tcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_frontend_reloads_its_certificate_for_new_workers() {
    let (pki, tracker, frontend) = rotation_start().await;
    let env = |ca: &str| rotation_env(&pki, ca);
    let old = WorkerPlane::new(config(&env("ca.pem")).unwrap(), tracker.clone()).unwrap();
    assert_eq!(one_stream(&frontend, &old).await, ["one", "two"]);
    rotate(&pki);
    frontend.reload_tls().unwrap();
    let next = WorkerPlane::new(config(&env("next-ca.pem")).unwrap(), tracker.clone()).unwrap();
    assert_eq!(one_stream(&frontend, &next).await, ["one", "two"]);
    // The old worker's connection was made before: it keeps its session.
    assert_eq!(one_stream(&frontend, &old).await, ["one", "two"]);
    frontend.shutdown().await;
}

/// Without `reload_tls`: rotated files are picked up by the plane's own watch (every
/// `TLS_WATCH_INTERVAL`), so a worker that trusts only the new CA gets in. Each try is a fresh
/// worker (a failed preparation is cached for its backoff); tries are bounded in number.
#[cfg(feature = "tcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_frontend_picks_up_rotated_certificate_files_by_itself() {
    let (pki, tracker, frontend) = rotation_start().await;
    let env = |ca: &str| rotation_env(&pki, ca);
    rotate(&pki);
    let tries = 4 * BOUND.as_secs() / response_plane::TLS_WATCH_INTERVAL.as_secs();
    let mut served = false;
    for _ in 0..tries {
        let next = WorkerPlane::new(config(&env("next-ca.pem")).unwrap(), tracker.clone()).unwrap();
        let (info, pending) = frontend
            .register::<String>(RegisterOptions::default())
            .unwrap();
        let sent = tokio::time::timeout(BOUND, next.connect::<String>(&info)).await;
        if let Ok(Ok(mut s)) = sent {
            s.send_prologue(Ok(())).await.unwrap();
            s.finish().await.unwrap();
            tokio::time::timeout(BOUND, pending.established())
                .await
                .unwrap()
                .unwrap();
            served = true;
            break;
        }
        next.abort();
        // The watch checks every interval; wait for a tick of it rather than spin.
        tokio::time::sleep(response_plane::TLS_WATCH_INTERVAL / 4).await;
    }
    assert!(served, "the rotated certificate was never served");
    frontend.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_worker_gets_nothing_from_a_tls_frontend_on_either_plane() {
    let pki = TestPki::new();
    for &plane in PLANES {
        let tracker = TaskTracker::new();
        let frontend =
            FrontendPlane::bind(config(&mtls_env(&pki, plane)).unwrap(), tracker.clone())
                .await
                .unwrap();
        let plain = config(&[("DYN_RESPONSE_PLANE", plane.into())]).unwrap();
        let worker = WorkerPlane::new(plain, tracker.clone()).unwrap();
        let opts = RegisterOptions {
            establish_timeout: Some(Duration::from_millis(500)),
            ..RegisterOptions::default()
        };
        let (info, pending) = frontend.register::<String>(opts).unwrap();
        match tokio::time::timeout(BOUND, worker.connect::<String>(&info))
            .await
            .unwrap()
        {
            Err(e) => {
                assert!(e.to_string().contains("requires TLS"), "{plane}: {e}");
                assert_tls_mismatch(&e, TlsMismatch::FrontendRequiresTls);
            }
            Ok(mut s) => {
                // A classic worker learns it from the frontend's answer, after its connect
                // (`a_plaintext_classic_worker_is_told_the_frontend_requires_tls`).
                let _ = s.send_prologue(Ok(())).await;
            }
        }
        let err = tokio::time::timeout(BOUND, pending.established())
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(err, ResponseError::ResponseTimeout { .. }),
            "{plane}: {err}"
        );
        frontend.shutdown().await;
    }
}

/// The first error a stream meets on its way up (connect, prologue, finish): one there must
/// be, and soon.
async fn classic_setup_error(worker: &WorkerPlane, info: &ConnectionInfo) -> ResponseError {
    let attempt = async {
        let mut s = worker.connect::<String>(info).await?;
        s.send_prologue(Ok(())).await?;
        s.finish().await
    };
    let outcome = tokio::time::timeout(BOUND, attempt).await;
    outcome.expect("a mismatch is never a hang").unwrap_err()
}

/// `err` is a frontend the worker cannot use, for the TLS mismatch `want`.
fn assert_tls_mismatch(err: &ResponseError, want: TlsMismatch) {
    let ResponseError::Unreachable { cause, .. } = err else {
        panic!("expected the frontend to be unusable, got: {err}");
    };
    assert_eq!(cause.as_tls_mismatch(), Some(want), "{err}");
}

/// Waits, bounded, until `frontend` has counted `n` classic TLS mismatches.
async fn mismatches_counted(frontend: &FrontendPlane, n: u64) {
    let deadline = tokio::time::Instant::now() + BOUND;
    while frontend.stats().classic_tls_mismatches < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the frontend never counted the mismatch"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(frontend.stats().classic_tls_mismatches, n);
}

/// Classic plane, a plaintext worker at a TLS frontend: the frontend sees a first byte that
/// begins no TLS handshake, counts it and says "TLS required" in plaintext; the worker's
/// stream fails with that typed cause (not a dropped connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_classic_worker_is_told_the_frontend_requires_tls() {
    let pki = TestPki::new();
    let tracker = TaskTracker::new();
    let tls = config(&mtls_env(&pki, "tcp")).unwrap();
    let frontend = FrontendPlane::bind(tls, tracker.clone()).await.unwrap();
    let plain = config(&[("DYN_RESPONSE_PLANE", "tcp".into())]).unwrap();
    let worker = WorkerPlane::new(plain, tracker.clone()).unwrap();
    let (info, _pending) = frontend
        .register::<String>(RegisterOptions::default())
        .unwrap();
    let err = classic_setup_error(&worker, &info).await;
    assert_tls_mismatch(&err, TlsMismatch::FrontendRequiresTls);
    assert!(err.to_string().contains("requires TLS"), "{err}");
    mismatches_counted(&frontend, 1).await;
    frontend.shutdown().await;
    worker.close();
}

/// A TLS worker at a plaintext frontend, on either plane: the frontend recognises the TLS
/// record and answers in plaintext (velo: a CLOSE; classic: a refusal message, counted); the
/// worker's handshake fails at once on it, with the typed cause "answered in plaintext".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_worker_is_told_the_frontend_answered_in_plaintext_on_either_plane() {
    let pki = TestPki::new();
    for &plane in PLANES {
        let tracker = TaskTracker::new();
        let plain = config(&[("DYN_RESPONSE_PLANE", plane.into())]).unwrap();
        let frontend = FrontendPlane::bind(plain, tracker.clone()).await.unwrap();
        let tls = config(&[
            ("DYN_RESPONSE_PLANE", plane.into()),
            ("DYN_TCP_TLS_CA_CERT_PATH", path(&pki, "ca.pem")),
        ])
        .unwrap();
        let worker = WorkerPlane::new(tls, tracker.clone()).unwrap();
        let (info, _pending) = frontend
            .register::<String>(RegisterOptions::default())
            .unwrap();
        let err = classic_setup_error(&worker, &info).await;
        assert_tls_mismatch(&err, TlsMismatch::FrontendAnsweredPlaintext);
        assert!(err.to_string().contains("plaintext"), "{plane}: {err}");
        if plane == "tcp" {
            mismatches_counted(&frontend, 1).await;
        }
        frontend.shutdown().await;
        worker.close();
    }
}

/// `DYN_TCP_TLS_SERVER_NAME` is the name a worker verifies the frontend's certificate under
/// when it dials by IP: the certificate's name passes, any other is refused.
#[cfg(feature = "tcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_verifies_the_frontend_under_the_configured_server_name() {
    let pki = TestPki::new();
    let tracker = TaskTracker::new();
    let env = mtls_env(&pki, "velo");
    let frontend = FrontendPlane::bind(config(&env).unwrap(), tracker.clone())
        .await
        .unwrap();
    let named = |name: &str| {
        let mut env = env.clone();
        env.push(("DYN_TCP_TLS_SERVER_NAME", name.to_owned()));
        WorkerPlane::new(config(&env).unwrap(), tracker.clone()).unwrap()
    };
    assert_eq!(
        one_stream(&frontend, &named("localhost")).await,
        ["one", "two"]
    );
    let stranger = named("not-the-frontend.example");
    let (info, _pending) = frontend
        .register::<String>(RegisterOptions::default())
        .unwrap();
    let refused = tokio::time::timeout(BOUND, stranger.connect::<String>(&info))
        .await
        .unwrap();
    let err = refused.map(|_| "a stream").unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
    frontend.shutdown().await;
}

/// A relay to `to` that cuts the first connection it takes before anything reaches `to` (a
/// middlebox resetting one flow; after a TLS handshake with `tls` when set, as the frontend
/// would make it) and passes every later one through, bytes untouched.
async fn cut_first_connection_to(
    to: std::net::SocketAddr,
    tls: Option<velo_tls::ServerTls>,
) -> std::net::SocketAddr {
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = relay.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut conn, _)) = relay.accept().await {
            if std::mem::take(&mut first) {
                if let Some(tls) = &tls {
                    drop(tls.acceptor().accept(conn).await);
                }
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut up) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                }
            });
        }
    });
    at
}

/// `info` with its frontend address replaced by `addr`.
fn via(info: &ConnectionInfo, addr: std::net::SocketAddr) -> ConnectionInfo {
    let mut address: serde_json::Value = serde_json::from_str(&info.info).unwrap();
    address["addr"] = addr.to_string().into();
    ConnectionInfo {
        transport: info.transport.clone(),
        info: address.to_string(),
    }
}

/// A classic stream tied to worker 7, whose first connection is cut before the frontend took
/// it: worker 7 announces the loss on a new connection, which the frontend must accept as
/// the stream's (same TLS, same worker instance), so the pending request ends `Abandoned`
/// (retryable) instead of waiting for its establish timeout (none here: it would wait for
/// ever).
async fn a_lost_classic_stream_is_announced_as_it_was_dialled(
    env: &[(&str, String)],
    tls: Option<velo_tls::ServerTls>,
) {
    let base = config(env).unwrap();
    let tracker = TaskTracker::new();
    let frontend = FrontendPlane::bind(base.clone(), tracker.clone())
        .await
        .unwrap();
    let worker = base.to_builder().worker_instance(Some(7)).build().unwrap();
    let worker = WorkerPlane::new(worker, tracker.clone()).unwrap();
    let opts = RegisterOptions {
        establish_timeout: None,
        ..RegisterOptions::default()
    };
    let (info, pending) = frontend.register::<String>(opts).unwrap();
    pending.associate(7).unwrap();
    let info = via(
        &info,
        cut_first_connection_to(frontend.address(), tls).await,
    );
    // The connect (TLS handshake included) or the prologue fails on the cut connection, or
    // the prologue goes into the dying socket; either way the engine drops the stream.
    if let Ok(Ok(mut s)) = tokio::time::timeout(BOUND, worker.connect::<String>(&info)).await {
        let _ = s.send_prologue(Ok(())).await;
    }
    let r = tokio::time::timeout(BOUND, pending.established())
        .await
        .expect("the loss is announced, the request does not wait for ever");
    assert!(
        matches!(
            r,
            Err(ResponseError::Disconnected(
                response_plane::Disconnect::Abandoned
            ))
        ),
        "{r:?}"
    );
    assert_eq!(frontend.stats().arrivals_wrong_worker, 0);
    frontend.shutdown().await;
    worker.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_classic_stream_tied_to_its_worker_is_announced_as_that_worker() {
    let env = [("DYN_RESPONSE_PLANE", "tcp".into())];
    a_lost_classic_stream_is_announced_as_it_was_dialled(&env, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_classic_stream_at_a_tls_frontend_is_announced_over_tls() {
    let pki = TestPki::new();
    let middlebox =
        velo_tls::ServerTls::new(pki.path("server.pem"), pki.path("server.key"), None, BOUND)
            .unwrap();
    a_lost_classic_stream_is_announced_as_it_was_dialled(&mtls_env(&pki, "tcp"), Some(middlebox))
        .await;
}

/// Classic plane over mutual TLS with a liveness bound far beyond every wait here (nothing in
/// these stories may rest on it), and one stream whose worker sent its prologue and "one".
async fn classic_tls_stream(
    pki: &TestPki,
) -> (
    FrontendPlane,
    WorkerPlane,
    ResponseSender<String>,
    PendingResponse<String>,
) {
    let base = config(&mtls_env(pki, "tcp")).unwrap();
    let base = base
        .to_builder()
        .idle_timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let frontend = FrontendPlane::bind(base.clone(), TaskTracker::new())
        .await
        .unwrap();
    let worker = WorkerPlane::new(base, TaskTracker::new()).unwrap();
    let (info, pending) = frontend
        .register::<String>(RegisterOptions::default())
        .unwrap();
    let mut tx = tokio::time::timeout(BOUND, worker.connect::<String>(&info))
        .await
        .unwrap()
        .unwrap();
    tx.send_prologue(Ok(())).await.unwrap();
    tx.send(&"one".to_owned()).await.unwrap();
    (frontend, worker, tx, pending)
}

/// Over TLS, as in plaintext, the frontend closes its sending side once a stream ended
/// cleanly (a close_notify and a FIN), though the application still holds the stream: the
/// worker's watch of the stream ends then (its engine's context reads the stream as over),
/// not a liveness bound later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_classic_tls_stream_releases_the_workers_watcher_at_once() {
    let pki = TestPki::new();
    let (frontend, worker, tx, pending) = classic_tls_stream(&pki).await;
    let ctx = tx.context();
    tokio::time::timeout(BOUND, tx.finish())
        .await
        .unwrap()
        .unwrap();
    let mut rx = tokio::time::timeout(BOUND, pending.established())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rx.next().await, Some(Ok("one".to_owned())));
    assert_eq!(rx.next().await, None);
    tokio::time::timeout(BOUND, ctx.killed())
        .await
        .expect("the worker's watch ends though the application keeps its stream");
    drop(rx);
    frontend.shutdown().await;
    worker.close();
}

/// Over TLS, as in plaintext, a worker that drops its stream mid-way closes its sending
/// side: the frontend learns at once that the stream is lost, not a liveness bound later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_tls_stream_dropped_by_its_worker_ends_at_the_frontend_at_once() {
    let pki = TestPki::new();
    let (frontend, worker, tx, pending) = classic_tls_stream(&pki).await;
    let mut rx = tokio::time::timeout(BOUND, pending.established())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rx.next().await, Some(Ok("one".to_owned())));
    drop(tx);
    let end = tokio::time::timeout(BOUND, rx.next())
        .await
        .expect("the frontend learns the stream is gone");
    assert!(
        matches!(end, Some(Err(ResponseError::Disconnected(_)))),
        "{end:?}"
    );
    frontend.shutdown().await;
    worker.close();
}
