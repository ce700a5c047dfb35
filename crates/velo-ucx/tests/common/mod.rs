//! Shared pieces of the UCX loopback tests.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use velo_mux::{MuxConfig, Side};
use velo_session::{Acceptor, IncomingStream};
use velo_ucx::{UcxConfig, UcxFrontend, UcxWorker};

/// Every test wait is bounded by this.
pub const BOUND: Duration = Duration::from_secs(20);

/// Added to a configured bound when a test checks that something happened within it: a
/// loaded machine may run us late, never early.
pub const SLACK: Duration = Duration::from_secs(5);

/// Hands incoming streams to the test through a bounded channel.
pub struct Inbox(pub mpsc::Sender<IncomingStream>);

impl Acceptor for Inbox {
    fn accept(&self, incoming: IncomingStream) {
        if let Err(e) = self.0.try_send(incoming) {
            panic!("test inbox full: {e}");
        }
    }
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A loopback address where nothing listens for as long as the returned socket is held: the
/// port is bound (without `SO_REUSEADDR`) and never listens, so no other test can take it
/// and every connection attempt is refused.
pub fn closed_port() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(loopback()).unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// TCP over `lo` whatever the environment says (`UcxConfig::loopback`), with the default
/// handshake bound (tests that exercise the bound set a shorter one themselves).
pub fn ucx_config() -> UcxConfig {
    UcxConfig::loopback()
}

pub async fn frontend(tracker: &TaskTracker) -> (UcxFrontend, mpsc::Receiver<IncomingStream>) {
    frontend_with(tracker, ucx_config()).await
}

pub async fn frontend_with(
    tracker: &TaskTracker,
    cfg: UcxConfig,
) -> (UcxFrontend, mpsc::Receiver<IncomingStream>) {
    let (tx, rx) = mpsc::channel(20_000);
    let mux = MuxConfig::builder(Side::Frontend)
        .max_streams(20_000)
        .build()
        .unwrap();
    let f = UcxFrontend::bind(loopback(), mux, cfg, Arc::new(Inbox(tx)), tracker.clone())
        .await
        .unwrap();
    (f, rx)
}

pub fn worker(tracker: &TaskTracker) -> UcxWorker {
    worker_with(tracker, ucx_config(), |b| b)
}

pub fn worker_with(
    tracker: &TaskTracker,
    cfg: UcxConfig,
    f: impl FnOnce(velo_mux::MuxConfigBuilder) -> velo_mux::MuxConfigBuilder,
) -> UcxWorker {
    let mux = f(MuxConfig::builder(Side::Worker).max_streams(20_000))
        .build()
        .unwrap();
    UcxWorker::new(mux, cfg, tracker.clone()).unwrap()
}

pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {BOUND:?}"))
}

/// Waits until `cond` holds, polling; fails the test after the bound. For counters that the
/// other side updates just after the event the test observed.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}
