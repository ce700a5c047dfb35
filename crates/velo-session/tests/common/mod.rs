//! An in-memory transport for velo-session: lanes are `tokio::io::duplex` pipes, the
//! handshake is a direct call into the frontend endpoint, and the test can stall a side's
//! reads (a peer that stopped reading) or sever a lane (the connection dropped), so every
//! test runs under paused time without a socket.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_mux::handshake::Expect;
use velo_mux::{MuxConfig, MuxConfigBuilder, Side};
use velo_session::{
    Acceptor, ConnectError, Connector, FrontendEndpoint, FrontendSettings, IncomingStream, LaneIo,
    LaneRead, LaneWrite, WorkerEndpoint, WorkerSettings,
};
use velo_wire::{CloseCode, Hello, InstanceId, Token};

/// Every wait in these tests is bounded by this much virtual time.
pub const BOUND: Duration = Duration::from_secs(60);

/// How long a lane dial takes (virtual time).
pub const DIAL_TIME: Duration = Duration::from_millis(10);

/// Bytes a lane's pipe holds in each direction before a writer waits.
pub const PIPE_BYTES: usize = 64 * 1024;

/// A stream address nobody checks (the test acceptor takes every stream).
pub const TOKEN: Token = Token([7; 16]);

/// The prologue every test stream carries.
pub const PROLOGUE: &[u8] = br#"{"error":null}"#;

/// Resolves `f`, failing the test if it takes longer than [`BOUND`].
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {BOUND:?}"))
}

/// Asserts that `f` is still pending after [`BOUND`] of virtual time in which every task
/// ran until idle: nothing that could complete it happened.
pub async fn still_pending<T>(what: &str, f: Pin<&mut impl Future<Output = T>>) {
    if tokio::time::timeout(BOUND, f).await.is_ok() {
        panic!("{what} completed, but nothing should have let it");
    }
}

/// Opens and closes a gate that a lane side's reader waits on: closed, the side stops
/// reading, as a wedged or SIGSTOPped peer does, and the pipe fills up behind it.
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    pub fn open() -> Self {
        Self(Arc::new(watch::Sender::new(true)))
    }

    pub fn set(&self, open: bool) {
        self.0.send_replace(open);
    }

    async fn wait_open(rx: &mut watch::Receiver<bool>) {
        // Cancel safe: `wait_for` only reads the channel.
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// One in-memory lane as the test sees it.
#[derive(Clone)]
pub struct LaneHandle {
    /// Severs both directions: reads end, writes fail (a connection reset).
    pub sever: CancellationToken,
    /// Whether the frontend side reads.
    pub frontend_reads: Gate,
    /// Whether the worker side reads.
    pub worker_reads: Gate,
    /// Whether the frontend side's writes go through (closed: they wait, as a SIGSTOPped
    /// process's would).
    pub frontend_writes: Gate,
    /// Whether the worker side's writes go through.
    pub worker_writes: Gate,
    /// Ends the worker side's reads (a FIN from the frontend), leaving its writes as they are.
    pub worker_eof: CancellationToken,
    /// Ends the frontend side's reads, leaving its writes as they are.
    pub frontend_eof: CancellationToken,
}

impl LaneHandle {
    fn new() -> Self {
        Self {
            sever: CancellationToken::new(),
            frontend_reads: Gate::open(),
            worker_reads: Gate::open(),
            frontend_writes: Gate::open(),
            worker_writes: Gate::open(),
            worker_eof: CancellationToken::new(),
            frontend_eof: CancellationToken::new(),
        }
    }

    /// The frontend stops dead: it neither reads nor writes (SIGSTOP, a wedged process).
    pub fn wedge_frontend(&self) {
        self.frontend_reads.set(false);
        self.frontend_writes.set(false);
    }
}

struct MemRead {
    read: ReadHalf<DuplexStream>,
    gate: watch::Receiver<bool>,
    sever: CancellationToken,
    eof: CancellationToken,
}

impl LaneRead for MemRead {
    fn read<'a>(
        &'a mut self,
        buf: &'a mut BytesMut,
    ) -> Pin<Box<dyn Future<Output = io::Result<usize>> + Send + 'a>> {
        Box::pin(async move {
            // Cancel safe: both waits lose nothing, and `read_buf` reads nothing if dropped.
            tokio::select! {
                () = async {
                    Gate::wait_open(&mut self.gate).await;
                } => {}
                () = self.sever.cancelled() => return Ok(0),
                () = self.eof.cancelled() => return Ok(0),
            }
            tokio::select! {
                r = self.read.read_buf(buf) => r,
                () = self.sever.cancelled() => Ok(0),
                () = self.eof.cancelled() => Ok(0),
            }
        })
    }
}

struct MemWrite {
    write: WriteHalf<DuplexStream>,
    gate: watch::Receiver<bool>,
    sever: CancellationToken,
}

impl LaneWrite for MemWrite {
    fn write<'a>(
        &'a mut self,
        chunks: &'a mut Vec<Bytes>,
    ) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>> {
        Box::pin(async move {
            let write = async {
                Gate::wait_open(&mut self.gate).await;
                for chunk in chunks.iter() {
                    self.write.write_all(chunk).await?;
                }
                Ok(())
            };
            let r = tokio::select! {
                r = write => r,
                () = self.sever.cancelled() => Err(io::ErrorKind::ConnectionReset.into()),
            };
            chunks.clear();
            r
        })
    }

    fn close<'a>(&'a mut self) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>> {
        Box::pin(async move {
            tokio::select! {
                r = self.write.shutdown() => r,
                () = self.sever.cancelled() => Err(io::ErrorKind::ConnectionReset.into()),
            }
        })
    }
}

/// Which end of a lane.
#[derive(Clone, Copy)]
enum End {
    Worker,
    Frontend,
}

fn lane_io(stream: DuplexStream, h: &LaneHandle, end: End) -> LaneIo {
    let (read, write) = tokio::io::split(stream);
    let (reads, writes, eof) = match end {
        End::Worker => (&h.worker_reads, &h.worker_writes, &h.worker_eof),
        End::Frontend => (&h.frontend_reads, &h.frontend_writes, &h.frontend_eof),
    };
    LaneIo {
        read: Box::new(MemRead {
            read,
            gate: reads.0.subscribe(),
            sever: h.sever.clone(),
            eof: eof.clone(),
        }),
        write: Box::new(MemWrite {
            write,
            gate: writes.0.subscribe(),
            sever: h.sever.clone(),
        }),
    }
}

/// Hands incoming streams to the test.
pub struct Inbox(pub mpsc::Sender<IncomingStream>);

impl Acceptor for Inbox {
    fn accept(&self, incoming: IncomingStream) {
        if let Err(e) = self.0.try_send(incoming) {
            panic!("test inbox full: {e}");
        }
    }
}

/// The worker's connector over in-memory lanes to any of the frontends it knows, with a
/// switch that makes dials fail and a record of every lane it made.
pub struct MemConnector {
    frontends: Mutex<Vec<FrontendEndpoint>>,
    dials: AtomicUsize,
    dialed: Mutex<Vec<SocketAddr>>,
    failing: AtomicBool,
    lanes: Mutex<Vec<LaneHandle>>,
}

impl MemConnector {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            frontends: Mutex::new(Vec::new()),
            dials: AtomicUsize::new(0),
            dialed: Mutex::new(Vec::new()),
            failing: AtomicBool::new(false),
            lanes: Mutex::new(Vec::new()),
        })
    }

    /// Makes `frontend` reachable (replacing one with the same instance id).
    pub fn serve(&self, frontend: &FrontendEndpoint) {
        let mut all = self.frontends.lock().unwrap();
        all.retain(|f| f.instance() != frontend.instance());
        all.push(frontend.clone());
    }

    /// Lane dials attempted so far.
    pub fn dials(&self) -> usize {
        self.dials.load(Ordering::SeqCst)
    }

    /// The address of every lane dial so far, in order.
    pub fn dialed(&self) -> Vec<SocketAddr> {
        self.dialed.lock().unwrap().clone()
    }

    /// Makes every dial fail with a connection refusal (or succeed again).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// The lanes made so far, in dial order.
    pub fn lanes(&self) -> Vec<LaneHandle> {
        self.lanes.lock().unwrap().clone()
    }

    fn dial(
        &self,
        addr: SocketAddr,
        hello: &Hello,
        expect: Expect,
    ) -> Result<(Hello, LaneIo), ConnectError> {
        self.dials.fetch_add(1, Ordering::SeqCst);
        self.dialed.lock().unwrap().push(addr);
        let refused = |reason: &str| ConnectError::Io {
            addr: addr.to_string(),
            source: Arc::new(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                reason.to_owned(),
            )),
        };
        if self.failing.load(Ordering::SeqCst) {
            return Err(refused("dials fail (test switch)"));
        }
        let frontend = self
            .frontends
            .lock()
            .unwrap()
            .iter()
            .find(|f| Some(f.instance()) == expect.peer_instance)
            .cloned()
            .ok_or_else(|| refused("no such frontend"))?;
        let answer = frontend.answer(hello).map_err(|e| ConnectError::Refused {
            addr: addr.to_string(),
            code: e.close_code(),
            reason: e.to_string(),
        })?;
        expect
            .check(&answer)
            .map_err(|source| ConnectError::Handshake {
                addr: addr.to_string(),
                source,
            })?;
        let (worker_end, frontend_end) = tokio::io::duplex(PIPE_BYTES);
        let handle = LaneHandle::new();
        frontend
            .attach_lane(hello, lane_io(frontend_end, &handle, End::Frontend))
            .map_err(|e| ConnectError::Refused {
                addr: addr.to_string(),
                code: e.close_code(),
                reason: e.to_string(),
            })?;
        let io = lane_io(worker_end, &handle, End::Worker);
        self.lanes.lock().unwrap().push(handle);
        Ok((answer, io))
    }
}

impl Connector for MemConnector {
    fn connect_lane(
        &self,
        addr: SocketAddr,
        hello: Hello,
        expect: Expect,
    ) -> BoxFuture<'static, Result<(Hello, LaneIo), ConnectError>> {
        let r = self.dial(addr, &hello, expect);
        async move {
            // A dial takes a moment, so concurrent first requests overlap as they do on a
            // network.
            tokio::time::sleep(DIAL_TIME).await;
            r
        }
        .boxed()
    }
}

/// A frontend and a worker joined by in-memory lanes.
pub struct World {
    pub tracker: TaskTracker,
    pub frontend: FrontendEndpoint,
    pub inbox: mpsc::Receiver<IncomingStream>,
    pub worker: WorkerEndpoint,
    pub connector: Arc<MemConnector>,
}

/// The address the worker dials; the in-memory connector ignores it.
pub fn addr() -> SocketAddr {
    "127.0.0.1:9".parse().unwrap()
}

pub fn frontend_config(f: impl FnOnce(MuxConfigBuilder) -> MuxConfigBuilder) -> MuxConfig {
    f(MuxConfig::builder(Side::Frontend)).build().unwrap()
}

pub fn worker_config(f: impl FnOnce(MuxConfigBuilder) -> MuxConfigBuilder) -> MuxConfig {
    f(MuxConfig::builder(Side::Worker)).build().unwrap()
}

/// A frontend endpoint whose streams arrive in the returned inbox.
pub fn frontend(
    tracker: &TaskTracker,
    mux: MuxConfig,
) -> (FrontendEndpoint, mpsc::Receiver<IncomingStream>) {
    let (tx, rx) = mpsc::channel(1024);
    let settings = FrontendSettings {
        mux,
        read_buffer: velo_session::DEFAULT_READ_BUFFER,
    };
    let endpoint = FrontendEndpoint::new(
        settings,
        velo_session::new_instance_id(),
        Arc::new(Inbox(tx)),
        tracker.clone(),
    );
    (endpoint, rx)
}

impl World {
    /// Default configurations on both sides.
    pub fn new() -> Self {
        Self::with(|b| b, |b| b)
    }

    /// Configurations adjusted by `frontend` and `worker`.
    pub fn with(
        frontend_mux: impl FnOnce(MuxConfigBuilder) -> MuxConfigBuilder,
        worker_mux: impl FnOnce(MuxConfigBuilder) -> MuxConfigBuilder,
    ) -> Self {
        let tracker = TaskTracker::new();
        let (frontend, inbox) = frontend(&tracker, frontend_config(frontend_mux));
        let connector = MemConnector::new();
        connector.serve(&frontend);
        let settings = WorkerSettings {
            mux: worker_config(worker_mux),
            backoff: velo_session::Backoff::default(),
            read_buffer: velo_session::DEFAULT_READ_BUFFER,
            prepare_timeout: velo_session::DEFAULT_PREPARE_TIMEOUT,
        };
        let worker = WorkerEndpoint::new(settings, connector.clone(), tracker.clone());
        Self {
            tracker,
            frontend,
            inbox,
            worker,
            connector,
        }
    }

    /// Opens a stream from the worker and takes it on the frontend.
    pub async fn stream(
        &mut self,
        ticket: u64,
    ) -> (velo_session::SendStream, velo_session::RecvStream) {
        let tx = within(
            "opening a stream",
            self.worker
                .open(addr(), self.frontend.instance(), ticket, &TOKEN, PROLOGUE),
        )
        .await
        .expect("the stream opens");
        let incoming = within("the OPEN reaching the frontend", self.inbox.recv())
            .await
            .expect("the inbox is open");
        assert_eq!(incoming.ticket(), ticket);
        (tx, incoming.accept())
    }

    /// Aborts both endpoints and waits for every task they started.
    pub async fn shut_down(self) {
        self.worker.abort();
        self.frontend.abort();
        self.tracker.close();
        within("every lane task ending", self.tracker.wait()).await;
    }
}

/// The close code a shutting-down endpoint sends.
pub const SHUTTING_DOWN: CloseCode = CloseCode::SHUTTING_DOWN;

/// The instance id of nobody.
pub fn unknown_instance() -> InstanceId {
    velo_session::new_instance_id()
}

/// Waits until `cond` holds, checking after every millisecond of virtual time; fails the test
/// after [`BOUND`]. For state that another task updates after the event the test observed.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(DIAL_TIME).await;
        }
    })
    .await;
}

/// A lane from a hand-driven "worker" to `frontend`: the handshake is done, and the test
/// holds the worker's end of the pipe to write whatever bytes it likes (and to read, or not).
pub fn raw_lane(frontend: &FrontendEndpoint) -> (DuplexStream, LaneHandle) {
    let hello = worker_config(|b| b.lanes(1)).hello(
        0,
        velo_session::new_instance_id(),
        frontend.instance(),
    );
    frontend
        .answer(&hello)
        .expect("the frontend takes the lane");
    let (worker_end, frontend_end) = tokio::io::duplex(PIPE_BYTES);
    let handle = LaneHandle::new();
    frontend
        .attach_lane(&hello, lane_io(frontend_end, &handle, End::Frontend))
        .expect("the lane attaches");
    (worker_end, handle)
}
