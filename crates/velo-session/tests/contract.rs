//! The transport contract (`velo_session::contract`) run against the in-memory transport of
//! these tests: the reference the real transports (velo-tcp, velo-ucx) are held to.

mod common;

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use common::{MemListener, MemNet};
use tokio_util::task::TaskTracker;
use velo_session::contract::{FrontendSpec, RawListener, Transport, Unreachable};
use velo_session::{
    Dialer, LaneListener, ListeningFrontend, RawLane, WorkerEndpoint, WorkerSettings,
};

velo_session::transport_contract!(memory => Memory);

/// A fresh in-memory network per story; every frontend and raw listener on it gets an address
/// of its own.
#[derive(Clone)]
struct Memory {
    net: Arc<MemNet>,
    next_port: Arc<AtomicU16>,
}

impl Default for Memory {
    fn default() -> Self {
        Self {
            net: MemNet::new(),
            next_port: Arc::new(AtomicU16::new(FIRST_PORT)),
        }
    }
}

impl Memory {
    fn fresh_addr(&self) -> SocketAddr {
        let port = self.next_port.fetch_add(1, Ordering::Relaxed);
        SocketAddr::from(([127, 0, 0, 1], port))
    }
}

impl Transport for Memory {
    type Frontend = ListeningFrontend;
    type Worker = WorkerEndpoint;
    type Raw = Box<dyn RawLane>;
    type RawListener = MemRawListener;

    async fn frontend(&self, spec: FrontendSpec) -> io::Result<ListeningFrontend> {
        let (parts, session, addr) = spec.into_parts();
        let addr = addr.unwrap_or_else(|| self.fresh_addr());
        let listener = self.net.listen(addr);
        Ok(ListeningFrontend::new(parts, &session, listener, addr, ()))
    }

    fn worker(&self, settings: WorkerSettings, tracker: &TaskTracker) -> WorkerEndpoint {
        WorkerEndpoint::new(settings, self.net.clone(), tracker.clone())
    }

    async fn dial_raw(&self, addr: SocketAddr) -> io::Result<Box<dyn RawLane>> {
        self.net.dial(addr).await
    }

    async fn listen_raw(&self) -> io::Result<MemRawListener> {
        let addr = self.fresh_addr();
        Ok(MemRawListener {
            addr,
            lanes: self.net.listen(addr),
        })
    }

    fn unreachable(&self) -> Unreachable {
        // Nobody ever serves a fresh address.
        Unreachable {
            addr: self.fresh_addr(),
            guard: Box::new(()),
        }
    }
}

/// The lanes dialed to an address, taken by hand.
struct MemRawListener {
    addr: SocketAddr,
    lanes: MemListener,
}

impl RawListener for MemRawListener {
    type Lane = Box<dyn RawLane>;

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    async fn accept(&mut self) -> Option<Box<dyn RawLane>> {
        poll_fn(|cx| self.lanes.poll_accept(cx)).await?.ok()
    }
}

/// The first port handed out on an in-memory network (any; none is a real socket).
const FIRST_PORT: u16 = 10_000;
