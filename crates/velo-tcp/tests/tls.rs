//! TLS on TCP lanes: a TLS/plaintext mismatch is a clear error on both sides, mutual TLS
//! refuses workers without a certificate from the client CA, a silent TLS handshake is cut at
//! its deadline, and a reloaded certificate serves new lanes while old ones go on.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{TLS_TIMEOUT, TcpTls, loopback};
use tokio::io::AsyncWriteExt;
use tokio_util::task::TaskTracker;
use velo_mux::{MuxConfig, Side};
use velo_session::FrontendParts;
use velo_session::contract::{Inbox, eventually, next_item, send_now, within};
use velo_session::{ConnectError, WorkerEndpoint};
use velo_tcp::{TcpConfig, TcpFrontend, TcpWorker};
use velo_tls::{ClientIdentity, ClientTls, ServerTls, Trust};
use velo_wire::{CloseCode, Token};

async fn frontend(
    cfg: TcpConfig,
    tracker: &TaskTracker,
) -> (
    TcpFrontend,
    tokio::sync::mpsc::Receiver<velo_session::IncomingStream>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let mux = MuxConfig::builder(Side::Frontend).build().unwrap();
    let parts = FrontendParts::new(mux, Arc::new(Inbox(tx)), tracker.clone());
    let f = velo_tcp::bind_frontend(loopback(), cfg, parts)
        .await
        .unwrap();
    (f, rx)
}

fn worker(cfg: TcpConfig, tracker: &TaskTracker) -> WorkerEndpoint {
    let mux = MuxConfig::builder(Side::Worker).build().unwrap();
    TcpWorker::new(mux, cfg, tracker.clone()).endpoint().clone()
}

async fn prepare(w: &WorkerEndpoint, f: &TcpFrontend) -> Result<velo_session::Peer, ConnectError> {
    within("preparing", w.peer(f.local_addr(), f.instance())).await
}

fn server_cfg(tls: Arc<ServerTls>) -> TcpConfig {
    TcpConfig::builder().tls_server(Some(tls)).build().unwrap()
}

fn client_cfg(tls: Arc<ClientTls>) -> TcpConfig {
    TcpConfig::builder().tls_client(Some(tls)).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_worker_is_told_the_frontend_requires_tls() {
    let net = TcpTls::default();
    let tracker = TaskTracker::new();
    let (f, _inbox) = frontend(server_cfg(net.server()), &tracker).await;
    let w = worker(TcpConfig::default(), &tracker);
    let err = prepare(&w, &f).await.unwrap_err();
    assert!(
        matches!(&err, ConnectError::Refused { code, reason, .. }
            if *code == CloseCode::BAD_HANDSHAKE && reason.contains("requires TLS")),
        "{err}"
    );
    eventually("the frontend counting it", || {
        f.handshake_stats().establish_failures >= 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_worker_is_told_the_frontend_speaks_plaintext() {
    let net = TcpTls::default();
    let tracker = TaskTracker::new();
    let (f, _inbox) = frontend(TcpConfig::default(), &tracker).await;
    let w = worker(client_cfg(net.client()), &tracker);
    let err = prepare(&w, &f).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("plaintext velo CLOSE"), "{text}");
    assert!(text.contains("does not use TLS"), "{text}");
    eventually("the frontend counting it", || {
        f.handshake_stats().handshake_failures >= 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_trusting_another_ca_refuses_the_frontend() {
    let net = TcpTls::default();
    net.pki.foreign("rogue");
    let tracker = TaskTracker::new();
    let (f, _inbox) = frontend(server_cfg(net.server()), &tracker).await;
    let rogue = ClientTls::new(
        Trust::Ca(net.pki.path("rogue-ca.pem")),
        None,
        None,
        TLS_TIMEOUT,
    )
    .unwrap();
    let w = worker(client_cfg(Arc::new(rogue)), &tracker);
    let err = prepare(&w, &f).await.unwrap_err();
    assert!(err.to_string().contains("TLS handshake failed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_only_workers_with_a_certificate_from_the_client_ca() {
    let net = TcpTls::default();
    net.pki.foreign("rogue");
    let p = &net.pki;
    let tracker = TaskTracker::new();
    let server = ServerTls::new(
        p.path("server.pem"),
        p.path("server.key"),
        Some(p.path("ca.pem")),
        TLS_TIMEOUT,
    )
    .unwrap();
    let (f, mut inbox) = frontend(server_cfg(Arc::new(server)), &tracker).await;
    let client = |name: Option<&str>| {
        let id = name.map(|n| ClientIdentity {
            cert: p.path(&format!("{n}.pem")),
            key: p.path(&format!("{n}.key")),
        });
        let tls = ClientTls::new(Trust::Ca(p.path("ca.pem")), None, id, TLS_TIMEOUT).unwrap();
        worker(client_cfg(Arc::new(tls)), &tracker)
    };
    for refused in [None, Some("rogue-client")] {
        let w = client(refused);
        let s = w.open(f.local_addr(), f.instance(), 1, &Token([0; 16]), b"{}");
        // TLS 1.3 clients finish first; the server's refusal arrives on the lane.
        let r = within("opening", s).await;
        if let Ok(mut s) = r {
            let _ = within("a send", s.send(b"x")).await;
            s.flush();
        }
    }
    eventually("both refusals counted", || {
        f.handshake_stats().establish_failures >= 2
    })
    .await;
    assert!(f.endpoint().peers().is_empty(), "no refused worker joined");
    let w = client(Some("client"));
    let mut s = within(
        "opening",
        w.open(f.local_addr(), f.instance(), 1, &Token([0; 16]), b"{}"),
    )
    .await
    .unwrap();
    send_now(&mut s, b"mutual").await;
    let mut r = within("a stream", inbox.recv()).await.unwrap().accept();
    assert_eq!(next_item(&mut r).await, &b"mutual"[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_handshake_that_stalls_is_cut_at_its_deadline() {
    let net = TcpTls::default();
    let tracker = TaskTracker::new();
    let p = &net.pki;
    let short = Duration::from_millis(300);
    let server = ServerTls::new(p.path("server.pem"), p.path("server.key"), None, short).unwrap();
    let (f, _inbox) = frontend(server_cfg(Arc::new(server)), &tracker).await;
    let mut stalled = tokio::net::TcpStream::connect(f.local_addr())
        .await
        .unwrap();
    // The first bytes of a TLS record header, then nothing.
    stalled.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    eventually("the stalled handshake cut", || {
        f.handshake_stats().establish_timeouts == 1
    })
    .await;
    assert_eq!(
        f.handshake_stats().handshake_timeouts,
        0,
        "the HELLO phase never began"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_certificate_serves_new_lanes_while_old_ones_go_on() {
    let net = TcpTls::default();
    net.pki.foreign("rogue");
    let p = &net.pki;
    let tracker = TaskTracker::new();
    let server = net.server();
    let (f, mut inbox) = frontend(server_cfg(server.clone()), &tracker).await;
    let old = worker(client_cfg(net.client()), &tracker);
    let mut s = within(
        "opening",
        old.open(f.local_addr(), f.instance(), 1, &Token([0; 16]), b"{}"),
    )
    .await
    .unwrap();
    let mut r = within("a stream", inbox.recv()).await.unwrap().accept();
    // A worker that trusts only the rogue CA cannot connect yet.
    let rogue_trust = || {
        let tls =
            ClientTls::new(Trust::Ca(p.path("rogue-ca.pem")), None, None, TLS_TIMEOUT).unwrap();
        worker(client_cfg(Arc::new(tls)), &tracker)
    };
    assert!(prepare(&rogue_trust(), &f).await.is_err());
    // Rotate to the rogue CA's certificate, and reload.
    std::fs::copy(p.path("rogue-server.pem"), p.path("server.pem")).unwrap();
    std::fs::copy(p.path("rogue-server.key"), p.path("server.key")).unwrap();
    server.reload().unwrap();
    prepare(&rogue_trust(), &f).await.unwrap();
    // The lane made before the reload keeps its session.
    send_now(&mut s, b"after the reload").await;
    assert_eq!(next_item(&mut r).await, &b"after the reload"[..]);
}
