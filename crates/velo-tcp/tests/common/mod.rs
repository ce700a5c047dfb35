//! The TCP transport as the transport contract drives it (`velo_session::contract`), on
//! loopback sockets.
#![allow(dead_code, unreachable_pub)]

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use velo_tls::testing::TestPki;
use velo_tls::{ClientTls, ServerTls, Trust};

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
        let cfg = TcpConfig::builder().session(session).build().unwrap();
        velo_tcp::bind_frontend(addr.unwrap_or_else(loopback), cfg, parts).await
    }

    fn worker(&self, settings: WorkerSettings, tracker: &TaskTracker) -> WorkerEndpoint {
        let cfg = TcpConfig::builder()
            .session(settings.session().unwrap())
            .build()
            .unwrap();
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

/// Established TCP connections whose local address is `listener` (an IPv4 listener's), from
/// the kernel's table: the listener's side of each. The address, not only the port: a socket
/// bound to another loopback address may have the same port number.
pub fn established_connections(listener: SocketAddr) -> usize {
    let SocketAddr::V4(v4) = listener else {
        return 0;
    };
    // The kernel writes an IPv4 address as the hex of its bytes in host (little-endian) order.
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return 0;
    };
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() > 3 && f[3] == "01" && f[1].eq_ignore_ascii_case(&local)
        })
        .count()
}

/// TCP with TLS on every lane (a throwaway PKI per story): the whole contract again, with
/// raw peers speaking TLS too.
#[derive(Clone)]
pub struct TcpTls {
    pub pki: Arc<TestPki>,
}

impl Default for TcpTls {
    fn default() -> Self {
        Self {
            pki: Arc::new(TestPki::new()),
        }
    }
}

impl TcpTls {
    pub fn server(&self) -> Arc<ServerTls> {
        let p = &self.pki;
        Arc::new(
            ServerTls::new(
                p.path("server.pem"),
                p.path("server.key"),
                None,
                TLS_TIMEOUT,
            )
            .unwrap(),
        )
    }

    pub fn client(&self) -> Arc<ClientTls> {
        let ca = Trust::Ca(self.pki.path("ca.pem"));
        Arc::new(ClientTls::new(ca, None, None, TLS_TIMEOUT).unwrap())
    }
}

/// TLS handshake bound of the stories.
pub const TLS_TIMEOUT: Duration = Duration::from_secs(3);

type ClientStream = velo_tls::tokio_rustls::client::TlsStream<TcpStream>;
type ServerStream = velo_tls::tokio_rustls::server::TlsStream<TcpStream>;

impl Transport for TcpTls {
    type Frontend = TcpFrontend;
    type Worker = WorkerEndpoint;
    type Raw = IoLane<RawTls>;
    type RawListener = RawTlsListener;

    async fn frontend(&self, spec: FrontendSpec) -> io::Result<TcpFrontend> {
        let (parts, session, addr) = spec.into_parts();
        let cfg = TcpConfig::builder()
            .session(session)
            .tls_server(Some(self.server()))
            .build()
            .unwrap();
        velo_tcp::bind_frontend(addr.unwrap_or_else(loopback), cfg, parts).await
    }

    fn worker(&self, settings: WorkerSettings, tracker: &TaskTracker) -> WorkerEndpoint {
        let cfg = TcpConfig::builder()
            .session(settings.session().unwrap())
            .tls_client(Some(self.client()))
            .build()
            .unwrap();
        TcpWorker::new(settings.mux, cfg, tracker.clone())
            .endpoint()
            .clone()
    }

    async fn dial_raw(&self, addr: SocketAddr) -> io::Result<IoLane<RawTls>> {
        let tcp = TcpStream::connect(addr).await?;
        let tls = self.client();
        let s = tls
            .connector()
            .connect(tls.server_name(addr.ip()), tcp)
            .await?;
        Ok(IoLane(RawTls::Client(Box::new(s))))
    }

    async fn listen_raw(&self) -> io::Result<RawTlsListener> {
        let l = TcpListener::bind(loopback()).await?;
        Ok(RawTlsListener(l, self.server()))
    }

    fn unreachable(&self) -> Unreachable {
        Unreachable::loopback_port()
    }
}

/// A TLS stream a story speaks by hand, from either end.
pub enum RawTls {
    Client(Box<ClientStream>),
    Server(Box<ServerStream>),
}

impl AsyncRead for RawTls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Self::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for RawTls {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Client(s) => Pin::new(s.as_mut()).poll_write(cx, b),
            Self::Server(s) => Pin::new(s.as_mut()).poll_write(cx, b),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Self::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Client(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Self::Server(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A TLS listener whose connections the story speaks by hand.
pub struct RawTlsListener(TcpListener, Arc<ServerTls>);

impl RawListener for RawTlsListener {
    type Lane = IoLane<RawTls>;

    fn addr(&self) -> SocketAddr {
        self.0.local_addr().expect("a bound listener's address")
    }

    async fn accept(&mut self) -> Option<IoLane<RawTls>> {
        loop {
            let (tcp, _) = self.0.accept().await.ok()?;
            if let Ok(s) = self.1.acceptor().accept(tcp).await {
                return Some(IoLane(RawTls::Server(Box::new(s))));
            }
        }
    }
}
