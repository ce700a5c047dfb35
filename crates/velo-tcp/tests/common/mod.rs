//! The TCP transport as the transport contract drives it (`velo_session::contract`), on
//! loopback sockets.
#![allow(dead_code, unreachable_pub)]

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::task::TaskTracker;
use velo_session::contract::{FrontendSpec, IoLane, RawListener, Transport, Unreachable};
use velo_session::{WorkerEndpoint, WorkerSettings};
use velo_tcp::{TcpConfig, TcpFrontend, TcpWorker};

/// TCP over the loopback interface.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tcp;

impl Transport for Tcp {
    type Frontend = TcpFrontend;
    type Worker = WorkerEndpoint;
    type Raw = IoLane<TcpStream>;
    type RawListener = RawTcpListener;

    async fn frontend(&self, spec: FrontendSpec) -> io::Result<TcpFrontend> {
        let (parts, session, addr) = spec.into_parts();
        let cfg = TcpConfig {
            session,
            ..TcpConfig::default()
        };
        velo_tcp::bind_frontend(addr.unwrap_or_else(loopback), cfg, parts).await
    }

    fn worker(&self, settings: WorkerSettings, tracker: &TaskTracker) -> WorkerEndpoint {
        let cfg = TcpConfig {
            session: settings.session(),
            ..TcpConfig::default()
        };
        // A TCP worker is its endpoint: closing it closes the endpoint.
        TcpWorker::new(settings.mux, cfg, tracker.clone())
            .endpoint()
            .clone()
    }

    async fn dial_raw(&self, addr: SocketAddr) -> io::Result<IoLane<TcpStream>> {
        TcpStream::connect(addr).await.map(IoLane)
    }

    async fn listen_raw(&self) -> io::Result<RawTcpListener> {
        TcpListener::bind(loopback()).await.map(RawTcpListener)
    }

    fn unreachable(&self) -> Unreachable {
        Unreachable::loopback_port()
    }
}

/// A TCP listener whose connections the test speaks by hand.
pub struct RawTcpListener(TcpListener);

impl RawListener for RawTcpListener {
    type Lane = IoLane<TcpStream>;

    fn addr(&self) -> SocketAddr {
        self.0.local_addr().expect("a bound listener's address")
    }

    async fn accept(&mut self) -> Option<IoLane<TcpStream>> {
        self.0.accept().await.ok().map(|(s, _)| IoLane(s))
    }
}

pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
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
