//! Shared pieces of the loopback tests.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use velo_mux::{MuxConfig, Side};
use velo_session::{Acceptor, IncomingStream};
use velo_tcp::{TcpConfig, TcpFrontend, TcpWorker};

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

/// The defaults, with the default handshake bound: a test that exercises a timeout sets its
/// own, so that no other test races a short one on a loaded machine.
pub fn tcp_config() -> TcpConfig {
    TcpConfig {
        handshake_timeout: velo_session::DEFAULT_HANDSHAKE_TIMEOUT,
        ..TcpConfig::default()
    }
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

pub async fn frontend(tracker: &TaskTracker) -> (TcpFrontend, mpsc::Receiver<IncomingStream>) {
    let (tx, rx) = mpsc::channel(20_000);
    let mux = MuxConfig::builder(Side::Frontend)
        .max_streams(20_000)
        .build()
        .unwrap();
    let f = TcpFrontend::bind(
        loopback(),
        mux,
        tcp_config(),
        Arc::new(Inbox(tx)),
        tracker.clone(),
    )
    .await
    .unwrap();
    (f, rx)
}

pub fn worker(tracker: &TaskTracker) -> TcpWorker {
    worker_with(tracker, |b| b)
}

pub fn worker_with(
    tracker: &TaskTracker,
    f: impl FnOnce(velo_mux::MuxConfigBuilder) -> velo_mux::MuxConfigBuilder,
) -> TcpWorker {
    let mux = f(MuxConfig::builder(Side::Worker).max_streams(20_000))
        .build()
        .unwrap();
    TcpWorker::new(mux, tcp_config(), tracker.clone())
}

pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {BOUND:?}"))
}

/// Established TCP connections whose local or remote port is `port`, from the kernel's table.
pub fn established_connections(port: u16) -> usize {
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port_of = |a: &str| {
                a.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            // Only the frontend's side of each connection: local port == listener port.
            if f.len() > 3 && f[3] == "01" && port_of(f[1]) == Some(port) {
                n += 1;
            }
        }
    }
    n
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
