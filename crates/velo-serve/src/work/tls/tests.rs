//! Both sides of a request-plane connection over loopback, with TLS on both, on one only, or
//! with certificates the other side refuses: each side's error names the right side, and
//! arrives well within the handshake's bound.

use std::sync::Arc;
use std::time::Instant;

use tokio::net::{TcpListener, TcpStream};
use velo_tls::testing::TestPki;
use velo_tls::{ClientIdentity, ClientTls, DEFAULT_HANDSHAKE_TIMEOUT, ServerTls, Trust};

use super::{HANDSHAKE_TIMEOUT, HandshakeError, RequestAuth, Side, frontend_open, worker_open};

const SECRET: &[u8] = b"the velo-serve tests' secret....";

fn secret() -> RequestAuth {
    RequestAuth::with_secret(SECRET).expect("a valid secret")
}

/// A frontend serving the PKI's server certificate, requiring client certificates when
/// `mutual`.
fn frontend(pki: &TestPki, mutual: bool) -> RequestAuth {
    frontend_with(secret(), pki, mutual)
}

/// [`frontend`] with `auth`'s secret (or none) inside TLS.
fn frontend_with(auth: RequestAuth, pki: &TestPki, mutual: bool) -> RequestAuth {
    let client_ca = mutual.then(|| pki.path("ca.pem"));
    let tls = ServerTls::new(
        pki.path("server.pem"),
        pki.path("server.key"),
        client_ca,
        DEFAULT_HANDSHAKE_TIMEOUT,
    )
    .expect("the server's TLS loads");
    auth.with_frontend_tls(Arc::new(tls))
}

/// A worker trusting the CA in `ca` (under the PKI's directory), with the PKI's client
/// certificate when `identity`.
fn worker(pki: &TestPki, ca: &str, identity: bool) -> RequestAuth {
    worker_with(secret(), pki, ca, identity)
}

/// [`worker`] with `auth`'s secret (or none) inside TLS.
fn worker_with(auth: RequestAuth, pki: &TestPki, ca: &str, identity: bool) -> RequestAuth {
    let identity = identity.then(|| ClientIdentity {
        cert: pki.path("client.pem"),
        key: pki.path("client.key"),
    });
    let tls = ClientTls::new(
        Trust::Ca(pki.path(ca)),
        None,
        identity,
        DEFAULT_HANDSHAKE_TIMEOUT,
    )
    .expect("the client's TLS loads");
    auth.with_worker_tls(Arc::new(tls))
}

/// Runs both sides' handshakes on one loopback connection; each side's outcome (whether
/// it ended in a link) and how long the slower took.
async fn handshake(
    f: &RequestAuth,
    w: &RequestAuth,
) -> (
    Result<(), HandshakeError>,
    Result<(), HandshakeError>,
    std::time::Duration,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let start = Instant::now();
    let front = async {
        let stream = TcpStream::connect(addr).await.unwrap();
        frontend_open(stream, f).await.map(drop)
    };
    let back = async {
        let (stream, peer) = listener.accept().await.unwrap();
        worker_open(stream, peer.ip(), w).await.map(drop)
    };
    let (f, w) = tokio::join!(front, back);
    (f, w, start.elapsed())
}

#[tokio::test]
async fn tls_on_both_sides_with_the_secret_inside_opens_the_connection() {
    let pki = TestPki::new();
    let (f, w, _) = handshake(&frontend(&pki, true), &worker(&pki, "ca.pem", true)).await;
    assert!(f.is_ok() && w.is_ok(), "frontend: {f:?}, worker: {w:?}");
}

#[tokio::test]
async fn tls_on_the_frontend_only_is_an_error_on_both_sides_naming_the_worker() {
    let pki = TestPki::new();
    let (f, w, took) = handshake(&frontend(&pki, false), &secret()).await;
    assert!(took < HANDSHAKE_TIMEOUT, "took {took:?}");
    let f = f.expect_err("the frontend refuses").to_string();
    assert!(
        f.contains("the worker has no TLS on the request plane, but this frontend requires it"),
        "{f}"
    );
    let w = w.expect_err("the worker refuses").to_string();
    assert!(
        w.contains("the peer says it is a frontend requiring TLS on the request plane; this worker has none"),
        "{w}"
    );
}

#[tokio::test]
async fn tls_on_the_worker_only_is_an_error_on_both_sides_naming_the_frontend() {
    let pki = TestPki::new();
    let (f, w, took) = handshake(&secret(), &worker(&pki, "ca.pem", false)).await;
    assert!(took < HANDSHAKE_TIMEOUT, "took {took:?}");
    let f = f.expect_err("the frontend refuses").to_string();
    assert!(
        f.contains("the worker requires TLS on the request plane, but this frontend has none"),
        "{f}"
    );
    let w = w.expect_err("the worker refuses").to_string();
    assert!(
        w.contains("the frontend has no TLS on the request plane, but this worker requires it"),
        "{w}"
    );
}

#[tokio::test]
async fn a_worker_trusting_another_ca_refuses_the_frontends_certificate() {
    let pki = TestPki::new();
    pki.foreign("other");
    let (f, w, took) =
        handshake(&frontend(&pki, false), &worker(&pki, "other-ca.pem", false)).await;
    assert!(took < HANDSHAKE_TIMEOUT, "took {took:?}");
    let w = w.expect_err("the worker refuses");
    assert!(
        matches!(
            w,
            HandshakeError::Tls {
                peer: Side::Frontend,
                ..
            }
        ),
        "{w}"
    );
    assert!(w.to_string().contains("certificate"), "{w}");
    let f = f.expect_err("the frontend is refused");
    assert!(
        matches!(
            f,
            HandshakeError::Tls {
                peer: Side::Worker,
                ..
            }
        ),
        "{f}"
    );
}

#[tokio::test]
async fn a_frontend_requiring_client_certificates_refuses_a_worker_without_one() {
    let pki = TestPki::new();
    let (f, w, took) = handshake(&frontend(&pki, true), &worker(&pki, "ca.pem", false)).await;
    assert!(took < HANDSHAKE_TIMEOUT, "took {took:?}");
    let f = f.expect_err("the frontend refuses");
    assert!(
        matches!(
            f,
            HandshakeError::Tls {
                peer: Side::Worker,
                ..
            }
        ),
        "{f}"
    );
    assert!(w.is_err(), "the worker is refused: {w:?}");
}

/// Inside TLS the secret's handshake still decides: a worker with another secret refuses the
/// frontend (TLS alone admits nobody), and each side says so.
#[tokio::test]
async fn tls_on_both_sides_with_different_secrets_is_refused() {
    let pki = TestPki::new();
    let other = RequestAuth::with_secret(b"another secret, just as long....").unwrap();
    let w = worker_with(other, &pki, "ca.pem", false);
    let (f, w, took) = handshake(&frontend(&pki, false), &w).await;
    assert!(took < HANDSHAKE_TIMEOUT, "took {took:?}");
    assert!(matches!(f, Err(HandshakeError::Refused)), "{f:?}");
    assert!(
        matches!(
            w,
            Err(HandshakeError::BadProof {
                peer: Side::Frontend
            })
        ),
        "{w:?}"
    );
}

/// Inside TLS, a secret on one side only is the same clear error on both sides as without
/// TLS, either way round, at once.
#[tokio::test]
async fn tls_on_both_sides_with_a_secret_on_one_side_only_is_a_clear_error() {
    let pki = TestPki::new();
    let open = RequestAuth::open;
    let cases = [
        (
            frontend_with(open(), &pki, false),
            worker(&pki, "ca.pem", false),
            "the worker requires a cluster secret, but this frontend has none",
            "the frontend has no cluster secret, but this worker requires one",
        ),
        (
            frontend(&pki, false),
            worker_with(open(), &pki, "ca.pem", false),
            "the worker has no cluster secret, but this frontend requires one",
            "the frontend requires a cluster secret, but this worker has none",
        ),
    ];
    for (front, back, want_f, want_w) in cases {
        let (f, w, took) = handshake(&front, &back).await;
        assert!(took < HANDSHAKE_TIMEOUT, "took {took:?}");
        let f = f.expect_err("the frontend refuses").to_string();
        assert!(f.contains(want_f), "{f}");
        let w = w.expect_err("the worker refuses").to_string();
        assert!(w.contains(want_w), "{w}");
    }
}
