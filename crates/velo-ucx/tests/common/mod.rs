//! The UCX transport as the transport contract drives it (`velo_session::contract`), over TCP
//! on the loopback device.
#![allow(dead_code, unreachable_pub)]

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use tokio_util::task::TaskTracker;
use velo_session::contract::{self, FrontendSpec, RawListener, RawPeer, Transport, Unreachable};
use velo_session::{WorkerEndpoint, WorkerSettings};
use velo_ucx::testing::{RawEndpoint, RawLane};
use velo_ucx::{UcxConfig, UcxFrontend, UcxWorker};

/// UCX with `cfg` (TCP over `lo` by default, whatever the environment says); a story's
/// frontend and worker settings override its handshake bound, connection limit, backoff and
/// read buffer.
#[derive(Debug, Clone)]
pub struct Ucx {
    pub cfg: UcxConfig,
}

impl Default for Ucx {
    fn default() -> Self {
        Self {
            cfg: UcxConfig::loopback(),
        }
    }
}

impl Transport for Ucx {
    type Frontend = UcxFrontend;
    type Worker = Worker;
    type Raw = UcxRaw;
    type RawListener = RawUcxListener;

    async fn frontend(&self, spec: FrontendSpec) -> io::Result<UcxFrontend> {
        let (parts, session, addr) = spec.into_parts();
        let cfg = self.cfg.to_builder().session(session).build().unwrap();
        let bound = velo_ucx::bind_frontend(addr.unwrap_or_else(loopback), cfg, parts).await;
        bound.map_err(io::Error::other)
    }

    fn worker(&self, settings: WorkerSettings, tracker: &TaskTracker) -> Worker {
        let session = settings.session().unwrap();
        let cfg = self.cfg.to_builder().session(session).build().unwrap();
        Worker(UcxWorker::new(settings.mux, cfg, tracker.clone()).expect("a UCX worker starts"))
    }

    async fn dial_raw(&self, addr: SocketAddr) -> io::Result<UcxRaw> {
        // A UCX worker of its own, on a tracker of its own: a story may hold the lane open
        // while it waits for its own tasks; dropping the lane stops the worker.
        let endpoint = RawEndpoint::new(None, &UcxConfig::loopback(), &TaskTracker::new())
            .map_err(io::Error::other)?;
        let lane = endpoint.connect(addr).await.map_err(io::Error::other)?;
        Ok(UcxRaw {
            lane,
            _endpoint: Some(AbortOnDrop(endpoint)),
        })
    }

    async fn listen_raw(&self) -> io::Result<RawUcxListener> {
        let endpoint = RawEndpoint::new(
            Some(loopback()),
            &UcxConfig::loopback(),
            &TaskTracker::new(),
        )
        .map_err(io::Error::other)?;
        let port = endpoint.port().expect("a listening endpoint has a port");
        Ok(RawUcxListener {
            addr: SocketAddr::new(loopback().ip(), port),
            endpoint: AbortOnDrop(endpoint),
        })
    }

    fn unreachable(&self) -> Unreachable {
        Unreachable::loopback_port()
    }

    fn shutdown_bound(&self) -> Duration {
        // Each closing lane's flush, then the UCX teardown.
        self.cfg.close_timeout() + UCX_TEARDOWN
    }
}

/// velo-ucx's bound on tearing down a UCX worker (`sys::TEARDOWN_TIME`).
const UCX_TEARDOWN: Duration = Duration::from_millis(200);

/// A UCX worker as the contract uses it.
#[derive(Clone)]
pub struct Worker(pub UcxWorker);

impl contract::Worker for Worker {
    fn endpoint(&self) -> &WorkerEndpoint {
        self.0.endpoint()
    }

    fn close(&self) {
        self.0.close();
    }
}

/// A UCX lane spoken by hand; a dialed one stops its own UCX worker when dropped.
pub struct UcxRaw {
    lane: RawLane,
    _endpoint: Option<AbortOnDrop>,
}

impl RawPeer for UcxRaw {
    async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.lane.write(bytes).await
    }

    async fn read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.lane.read(buf).await
    }
}

/// A UCX listener whose lanes the test speaks by hand; dropping it stops its UCX worker.
pub struct RawUcxListener {
    addr: SocketAddr,
    endpoint: AbortOnDrop,
}

impl RawListener for RawUcxListener {
    type Lane = UcxRaw;

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    async fn accept(&mut self) -> Option<UcxRaw> {
        let lane = self.endpoint.0.accept().await?;
        Some(UcxRaw {
            lane,
            _endpoint: None,
        })
    }
}

/// A raw UCX worker, stopped (every endpoint force-closed) when dropped.
struct AbortOnDrop(RawEndpoint);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}
