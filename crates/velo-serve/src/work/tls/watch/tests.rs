//! The watch on virtual time, with TLS handshakes over in-memory pipes: a rotated certificate
//! reaches the next handshake, a file that does not load leaves the certificate in use, and
//! the watch ends with its token.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use velo_tls::testing::TestPki;
use velo_tls::{ClientTls, DEFAULT_HANDSHAKE_TIMEOUT, ServerTls, Trust};

use super::*;

/// How many intervals a change may take to be seen: one, and one to spare.
const ROUNDS: u32 = 2;

/// A frontend's request-plane security serving the PKI's `server.pem`.
fn frontend(pki: &TestPki) -> RequestAuth {
    let server = ServerTls::new(
        pki.path("server.pem"),
        pki.path("server.key"),
        None,
        DEFAULT_HANDSHAKE_TIMEOUT,
    )
    .expect("the server's TLS loads");
    RequestAuth::open().with_frontend_tls(Arc::new(server))
}

/// A worker's TLS trusting the CA in `ca`.
fn trusting(pki: &TestPki, ca: &str) -> ClientTls {
    ClientTls::new(
        Trust::Ca(pki.path(ca)),
        None,
        None,
        DEFAULT_HANDSHAKE_TIMEOUT,
    )
    .expect("the client's TLS loads")
}

/// Whether a fresh TLS handshake between `auth`'s frontend and `worker` succeeds.
async fn accepted(auth: &RequestAuth, worker: &ClientTls) -> bool {
    let server = auth.frontend_tls().expect("a frontend with TLS");
    let (a, b) = tokio::io::duplex(64 * 1024);
    let name = worker.server_name(Ipv4Addr::LOCALHOST.into());
    let (s, c) = tokio::join!(
        server.acceptor().accept(a),
        worker.connector().connect(name, b)
    );
    s.is_ok() && c.is_ok()
}

/// Lets `rounds` watch intervals pass (virtual time).
async fn intervals(rounds: u32) {
    for _ in 0..rounds {
        tokio::time::sleep(TLS_WATCH_INTERVAL).await;
    }
}

fn copy(pki: &TestPki, from: &str, to: &str) {
    std::fs::copy(pki.path(from), pki.path(to)).expect("the file is copied");
}

#[tokio::test(start_paused = true)]
async fn a_rotated_certificate_reaches_the_next_handshake_and_a_bad_one_is_ignored() {
    let pki = TestPki::new();
    pki.foreign("other");
    let auth = frontend(&pki);
    let ours = trusting(&pki, "ca.pem");
    let theirs = trusting(&pki, "other-ca.pem");
    let tracker = TaskTracker::new();
    let stop = CancellationToken::new();
    spawn(&auth, &tracker, stop.clone());
    assert!(
        accepted(&auth, &ours).await,
        "the first certificate is served"
    );

    std::fs::write(pki.path("server.pem"), "not a certificate").expect("written");
    intervals(ROUNDS).await;
    assert!(
        accepted(&auth, &ours).await,
        "a certificate that does not load replaced the one in use"
    );

    copy(&pki, "other-server.pem", "server.pem");
    copy(&pki, "other-server.key", "server.key");
    let mut rounds = 0;
    while !accepted(&auth, &theirs).await {
        rounds += 1;
        assert!(rounds <= ROUNDS, "the rotated certificate was not served");
        intervals(1).await;
    }
    assert!(
        !accepted(&auth, &ours).await,
        "the old certificate is still served"
    );

    stop.cancel();
    tracker.close();
    let ended = tokio::time::timeout(Duration::from_secs(1), tracker.wait()).await;
    assert!(ended.is_ok(), "the watch outlived its token");
}

#[tokio::test]
async fn without_tls_nothing_is_watched() {
    let tracker = TaskTracker::new();
    spawn(&RequestAuth::open(), &tracker, CancellationToken::new());
    assert!(tracker.is_empty(), "a watch without files");
}
