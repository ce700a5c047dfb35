//! An in-memory transport for velo-session: lanes are `tokio::io::duplex` pipes, dialed by a
//! [`Dialer`] and accepted by a [`LaneListener`], so every test runs the real handshake and
//! accept loop under paused time without a socket. The test can stall a side's reads (a peer
//! that stopped reading) or writes (a wedged process), end one side's reads (a FIN), or sever
//! a lane (the connection dropped).
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::io::{AsyncWrite, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use velo_mux::{MuxConfig, MuxConfigBuilder, Side};
use velo_session::{
    AcceptSettings, Acceptor, Dialer, FrontendEndpoint, FrontendSettings, IncomingStream, LaneIo,
    LaneListener, LaneRead, LaneWrite, RawLane, WorkerEndpoint, WorkerSettings,
};
use velo_wire::{CloseCode, InstanceId, Token};

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

/// Waits until `cond` holds, checking every few milliseconds of virtual time; fails the test
/// after [`BOUND`]. For state that another task updates after the event the test observed.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(DIAL_TIME).await;
        }
    })
    .await;
}

/// A switch the test flips and lane halves wait on (poll-based, like the lanes).
#[derive(Clone, Default)]
pub struct Signal(Arc<SignalInner>);

#[derive(Default)]
struct SignalInner {
    on: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
}

impl Signal {
    pub fn on() -> Self {
        let s = Self::default();
        s.set(true);
        s
    }

    pub fn set(&self, on: bool) {
        self.0.on.store(on, Ordering::SeqCst);
        for w in self.0.wakers.lock().unwrap().drain(..) {
            w.wake();
        }
    }

    /// Turns the signal on for good (severing a lane, ending a side's reads).
    pub fn cancel(&self) {
        self.set(true);
    }

    pub fn is_on(&self) -> bool {
        self.0.on.load(Ordering::SeqCst)
    }

    /// Ready once the signal is `on`; registers the task otherwise.
    fn poll_until(&self, cx: &mut Context<'_>, on: bool) -> Poll<()> {
        if self.is_on() == on {
            return Poll::Ready(());
        }
        self.register(cx);
        if self.is_on() == on {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Whether the signal is on, registering the task to hear when it changes.
    fn poll_on(&self, cx: &mut Context<'_>) -> bool {
        if self.is_on() {
            return true;
        }
        self.register(cx);
        self.is_on()
    }

    /// Registers the task once (a lane half polls its signals on every read and write).
    fn register(&self, cx: &mut Context<'_>) {
        let mut wakers = self.0.wakers.lock().unwrap();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
    }
}

/// One in-memory lane as the test sees it.
#[derive(Clone)]
pub struct LaneHandle {
    /// Severs both directions: reads end, writes fail (a connection reset).
    pub sever: Signal,
    /// Whether the frontend side reads.
    pub frontend_reads: Signal,
    /// Whether the worker side reads.
    pub worker_reads: Signal,
    /// Whether the frontend side's writes go through (off: they wait, as a SIGSTOPped
    /// process's would).
    pub frontend_writes: Signal,
    /// Whether the worker side's writes go through.
    pub worker_writes: Signal,
    /// Ends the worker side's reads (a FIN from the frontend), leaving its writes as they are.
    pub worker_eof: Signal,
    /// Ends the frontend side's reads, leaving its writes as they are.
    pub frontend_eof: Signal,
}

impl LaneHandle {
    fn new() -> Self {
        Self {
            sever: Signal::default(),
            frontend_reads: Signal::on(),
            worker_reads: Signal::on(),
            frontend_writes: Signal::on(),
            worker_writes: Signal::on(),
            worker_eof: Signal::default(),
            frontend_eof: Signal::default(),
        }
    }

    /// The frontend stops dead: it neither reads nor writes (SIGSTOP, a wedged process).
    pub fn wedge_frontend(&self) {
        self.frontend_reads.set(false);
        self.frontend_writes.set(false);
    }
}

/// Which end of a lane.
#[derive(Clone, Copy)]
enum End {
    Worker,
    Frontend,
}

/// One end of an in-memory lane.
struct MemLane {
    read: ReadHalf<DuplexStream>,
    write: WriteHalf<DuplexStream>,
    reads: Signal,
    writes: Signal,
    eof: Signal,
    sever: Signal,
}

impl MemLane {
    fn new(stream: DuplexStream, h: &LaneHandle, end: End) -> Self {
        let (read, write) = tokio::io::split(stream);
        let (reads, writes, eof) = match end {
            End::Worker => (&h.worker_reads, &h.worker_writes, &h.worker_eof),
            End::Frontend => (&h.frontend_reads, &h.frontend_writes, &h.frontend_eof),
        };
        Self {
            read,
            write,
            reads: reads.clone(),
            writes: writes.clone(),
            eof: eof.clone(),
            sever: h.sever.clone(),
        }
    }
}

struct MemRead {
    read: ReadHalf<DuplexStream>,
    reads: Signal,
    eof: Signal,
    sever: Signal,
}

struct MemWrite {
    write: WriteHalf<DuplexStream>,
    writes: Signal,
    sever: Signal,
}

fn poll_read(
    read: &mut ReadHalf<DuplexStream>,
    (reads, eof, sever): (&Signal, &Signal, &Signal),
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    if sever.poll_on(cx) || eof.poll_on(cx) {
        return Poll::Ready(Ok(0));
    }
    if reads.poll_until(cx, true).is_pending() {
        return Poll::Pending;
    }
    tokio_util::io::poll_read_buf(Pin::new(read), cx, buf)
}

fn poll_write(
    write: &mut WriteHalf<DuplexStream>,
    (writes, sever): (&Signal, &Signal),
    cx: &mut Context<'_>,
    chunks: &mut Vec<Bytes>,
) -> Poll<io::Result<()>> {
    loop {
        if sever.poll_on(cx) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if writes.poll_until(cx, true).is_pending() {
            return Poll::Pending;
        }
        let Some(first) = chunks.first_mut() else {
            return Poll::Ready(Ok(()));
        };
        let n = std::task::ready!(Pin::new(&mut *write).poll_write(cx, first))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        first.advance(n);
        if first.is_empty() {
            chunks.remove(0);
        }
    }
}

fn poll_close(
    write: &mut WriteHalf<DuplexStream>,
    sever: &Signal,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    if sever.poll_on(cx) {
        return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
    }
    Pin::new(write).poll_shutdown(cx)
}

impl LaneRead for MemLane {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        poll_read(
            &mut self.read,
            (&self.reads, &self.eof, &self.sever),
            cx,
            buf,
        )
    }
}

impl LaneWrite for MemLane {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        poll_write(&mut self.write, (&self.writes, &self.sever), cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_close(&mut self.write, &self.sever, cx)
    }
}

impl RawLane for MemLane {
    fn into_io(self: Box<Self>) -> LaneIo {
        let this = *self;
        LaneIo {
            read: Box::new(MemRead {
                read: this.read,
                reads: this.reads,
                eof: this.eof,
                sever: this.sever.clone(),
            }),
            write: Box::new(MemWrite {
                write: this.write,
                writes: this.writes,
                sever: this.sever,
            }),
        }
    }
}

impl LaneRead for MemRead {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        poll_read(
            &mut self.read,
            (&self.reads, &self.eof, &self.sever),
            cx,
            buf,
        )
    }
}

impl LaneWrite for MemWrite {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        poll_write(&mut self.write, (&self.writes, &self.sever), cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_close(&mut self.write, &self.sever, cx)
    }
}

/// A frontend's end of the in-memory network: the lanes workers dial to its address.
pub struct MemListener(mpsc::UnboundedReceiver<Box<dyn RawLane>>);

impl LaneListener for MemListener {
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Box<dyn RawLane>>>> {
        self.0.poll_recv(cx).map(|lane| lane.map(Ok))
    }
}

/// The in-memory network: addresses served by frontends, dials that can be made to fail, and
/// a record of every lane dialed.
pub struct MemNet {
    listeners: Mutex<HashMap<SocketAddr, mpsc::UnboundedSender<Box<dyn RawLane>>>>,
    dials: AtomicUsize,
    dialed: Mutex<Vec<SocketAddr>>,
    failing: AtomicBool,
    lanes: Mutex<Vec<LaneHandle>>,
}

impl MemNet {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            listeners: Mutex::new(HashMap::new()),
            dials: AtomicUsize::new(0),
            dialed: Mutex::new(Vec::new()),
            failing: AtomicBool::new(false),
            lanes: Mutex::new(Vec::new()),
        })
    }

    /// Makes `frontend` reachable at [`addr()`] (replacing whoever served it).
    pub fn serve(&self, frontend: &FrontendEndpoint) {
        self.serve_at(addr(), frontend);
    }

    /// Makes `frontend` reachable at `at` too: its accept loop takes the lanes dialed there.
    pub fn serve_at(&self, at: SocketAddr, frontend: &FrontendEndpoint) {
        frontend.accept(self.listen(at), AcceptSettings::default());
    }

    /// The lanes dialed to `at` from now on (replacing whoever listened there).
    pub fn listen(&self, at: SocketAddr) -> MemListener {
        let (tx, rx) = mpsc::unbounded_channel();
        self.listeners.lock().unwrap().insert(at, tx);
        MemListener(rx)
    }

    /// A lane to whoever serves `at`, whose worker end the test drives by hand.
    pub fn raw(&self, at: SocketAddr) -> (DuplexStream, LaneHandle) {
        let (worker_end, frontend_end) = tokio::io::duplex(PIPE_BYTES);
        let handle = LaneHandle::new();
        let lane: Box<dyn RawLane> = Box::new(MemLane::new(frontend_end, &handle, End::Frontend));
        let listeners = self.listeners.lock().unwrap();
        let to = listeners.get(&at).expect("someone serves the address");
        assert!(
            to.send(lane).is_ok(),
            "the frontend's accept loop is running"
        );
        (worker_end, handle)
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

    fn connect(&self, at: SocketAddr) -> io::Result<Box<dyn RawLane>> {
        self.dials.fetch_add(1, Ordering::SeqCst);
        self.dialed.lock().unwrap().push(at);
        let refused = |why: &str| io::Error::new(io::ErrorKind::ConnectionRefused, why.to_owned());
        if self.failing.load(Ordering::SeqCst) {
            return Err(refused("dials fail (test switch)"));
        }
        let listeners = self.listeners.lock().unwrap();
        let to = listeners
            .get(&at)
            .ok_or_else(|| refused("nobody serves the address"))?;
        let (worker_end, frontend_end) = tokio::io::duplex(PIPE_BYTES);
        let handle = LaneHandle::new();
        let frontend_lane = Box::new(MemLane::new(frontend_end, &handle, End::Frontend));
        to.send(frontend_lane)
            .map_err(|_| refused("the frontend stopped accepting"))?;
        self.lanes.lock().unwrap().push(handle.clone());
        Ok(Box::new(MemLane::new(worker_end, &handle, End::Worker)))
    }
}

impl Dialer for MemNet {
    fn dial(&self, at: SocketAddr) -> BoxFuture<'static, io::Result<Box<dyn RawLane>>> {
        let r = self.connect(at);
        async move {
            // A dial takes a moment, so concurrent first requests overlap as they do on a
            // network.
            tokio::time::sleep(DIAL_TIME).await;
            r
        }
        .boxed()
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

/// A frontend and a worker joined by in-memory lanes.
pub struct World {
    pub tracker: TaskTracker,
    pub frontend: FrontendEndpoint,
    pub inbox: mpsc::Receiver<IncomingStream>,
    pub worker: WorkerEndpoint,
    pub connector: Arc<MemNet>,
}

/// The address the worker dials.
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
    (frontend_with(tracker, mux, Arc::new(Inbox(tx))), rx)
}

/// A frontend endpoint handing its streams to `acceptor`.
pub fn frontend_with(
    tracker: &TaskTracker,
    mux: MuxConfig,
    acceptor: Arc<dyn Acceptor>,
) -> FrontendEndpoint {
    let settings = FrontendSettings::new(mux);
    FrontendEndpoint::new(
        settings,
        velo_session::new_instance_id(),
        acceptor,
        tracker.clone(),
    )
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
        let connector = MemNet::new();
        connector.serve(&frontend);
        let settings = WorkerSettings::new(worker_config(worker_mux));
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
        let rx = incoming.accept();
        let mut tx = tx;
        // The worker knows the frontend took it (a loss from now on is the frontend's to
        // report, and nothing is announced again).
        assert!(within("the ACCEPT", tx.accepted()).await);
        (tx, rx)
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
