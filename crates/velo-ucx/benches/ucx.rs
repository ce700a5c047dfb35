//! UCX lanes against TCP lanes through the same session and mux path, on loopback: records per
//! second and time-to-deliver of 100-byte items, for 1 and 1,024 concurrent streams, with both
//! UCX progress engines.
//!
//! - `flood`: producers send as fast as credit allows (4 lanes; the 5 ms and the greedy flush
//!   policy). Records/s, process CPU per record (every thread: both sides, UCX's progress and
//!   async threads), and the time-to-deliver percentiles under that saturation (queueing).
//! - `ping`: each stream keeps one item in flight (sends the next once the frontend got the
//!   last), greedy flush: the time-to-deliver of an item without queueing, p50 and p99.
//!
//! Time-to-deliver is measured from just before `send` on the worker to the frontend's
//! `recv`, on one clock (both sides are threads of this process, each on its own
//! single-threaded runtime, as two processes would be).
//!
//! The TCP lanes are a minimal TCP transport written here over `velo-session` (vectored
//! writes, `TCP_NODELAY`): `velo-tcp` sits on the same layer as this crate and may not be its
//! dependency, not even for a bench. Its own bench (`cargo bench -p velo-tcp`) measures it.
//!
//! `cargo bench -p velo-ucx --features ucx --bench ucx [-- --secs N]`

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::io::AsyncWrite;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;
use velo_mux::{FlushPolicy, MuxConfig, Side};
use velo_session::{
    AcceptSettings, Acceptor, Dialer, FrontendEndpoint, FrontendSettings, IncomingStream, LaneIo,
    LaneListener, LaneRead, LaneWrite, RawLane, WorkerEndpoint, WorkerSettings,
};
use velo_ucx::{ProgressEngine, UcxConfig, UcxFrontend, UcxWorker};
use velo_wire::{InstanceId, Token};

/// Item size, in bytes.
const ITEM: usize = 100;
/// Most time-to-deliver samples kept per run.
const MAX_SAMPLES: usize = 2_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lanes {
    Tcp,
    Ucx(ProgressEngine),
}

impl Lanes {
    fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Ucx(ProgressEngine::Task) => "ucx (task engine)",
            Self::Ucx(ProgressEngine::Thread) => "ucx (thread engine)",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    Flood,
    Ping,
}

/// What the frontend side shares with the measurement.
struct Shared {
    epoch: Instant,
    delivered: AtomicU64,
    /// Time-to-deliver samples in ns; recorded only while `measuring`.
    samples: Mutex<Vec<u64>>,
    measuring: AtomicBool,
    /// Ping: the count of items delivered per stream, and a wake for its producer.
    acks: Vec<(AtomicU64, Notify)>,
}

impl Shared {
    fn new(streams: usize) -> Self {
        Self {
            epoch: Instant::now(),
            delivered: AtomicU64::new(0),
            samples: Mutex::new(Vec::new()),
            measuring: AtomicBool::new(false),
            acks: (0..streams)
                .map(|_| (AtomicU64::new(0), Notify::new()))
                .collect(),
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

struct Counting(Arc<Shared>);

impl Acceptor for Counting {
    fn accept(&self, incoming: IncomingStream) {
        let mut stream = incoming.accept();
        let shared = self.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(item)) = stream.recv().await {
                let now = shared.now_ns();
                let (id, sent) = ((&item[..8]).get_u64_le(), (&item[8..16]).get_u64_le());
                shared.delivered.fetch_add(1, Ordering::Relaxed);
                if shared.measuring.load(Ordering::Relaxed) {
                    let mut s = shared.samples.lock().unwrap();
                    if s.len() < MAX_SAMPLES {
                        s.push(now.saturating_sub(sent));
                    }
                }
                if let Some((n, wake)) = usize::try_from(id).ok().and_then(|i| shared.acks.get(i)) {
                    n.fetch_add(1, Ordering::Release);
                    wake.notify_one();
                }
            }
        });
    }
}

/// The two ends of one transport.
enum Front {
    Tcp(TcpFront),
    Ucx(UcxFrontend),
}

impl Front {
    async fn bind(lanes: Lanes, acceptor: Arc<dyn Acceptor>, tracker: &TaskTracker) -> Self {
        let mux = MuxConfig::builder(Side::Frontend).build().unwrap();
        match lanes {
            Lanes::Tcp => Self::Tcp(TcpFront::bind(mux, acceptor, tracker).await),
            Lanes::Ucx(engine) => {
                let cfg = UcxConfig {
                    engine,
                    ..UcxConfig::loopback()
                };
                let f = UcxFrontend::bind(
                    "127.0.0.1:0".parse().unwrap(),
                    mux,
                    cfg,
                    acceptor,
                    tracker.clone(),
                )
                .await
                .unwrap();
                Self::Ucx(f)
            }
        }
    }

    fn target(&self) -> (SocketAddr, InstanceId) {
        match self {
            Self::Tcp(f) => (f.addr, f.endpoint.instance()),
            Self::Ucx(f) => (f.local_addr(), f.instance()),
        }
    }

    fn abort(&self) {
        match self {
            Self::Tcp(f) => f.endpoint.abort(),
            Self::Ucx(f) => f.abort(),
        }
    }
}

fn worker_endpoint(
    lanes: Lanes,
    mux: MuxConfig,
    tracker: &TaskTracker,
) -> (WorkerEndpoint, Option<UcxWorker>) {
    match lanes {
        Lanes::Tcp => {
            let settings = WorkerSettings::new(mux);
            (
                WorkerEndpoint::new(settings, Arc::new(TcpDial), tracker.clone()),
                None,
            )
        }
        Lanes::Ucx(engine) => {
            let cfg = UcxConfig {
                engine,
                ..UcxConfig::loopback()
            };
            let w = UcxWorker::new(mux, cfg, tracker.clone()).unwrap();
            (w.endpoint().clone(), Some(w))
        }
    }
}

struct Outcome {
    records_per_s: f64,
    cpu_ns_per_record: f64,
    p50_us: f64,
    p99_us: f64,
}

fn run(
    lanes: Lanes,
    load: Load,
    streams: u64,
    policy: FlushPolicy,
    warmup: Duration,
    measure: Duration,
) -> Outcome {
    let n = usize::try_from(streams).unwrap();
    let shared = Arc::new(Shared::new(n));
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let frontend = {
        let (shared, stop) = (shared.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let tracker = TaskTracker::new();
                let f = Front::bind(lanes, Arc::new(Counting(shared)), &tracker).await;
                addr_tx.send(f.target()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                f.abort();
                tracker.close();
                let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
            });
        })
    };
    let (addr, id) = addr_rx.recv().unwrap();
    let worker = {
        let (shared, stop) = (shared.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let tracker = TaskTracker::new();
                let mux = MuxConfig::builder(Side::Worker)
                    .lanes(4)
                    .flush(policy)
                    .build()
                    .unwrap();
                let (endpoint, ucx) = worker_endpoint(lanes, mux, &tracker);
                let mut tasks = Vec::new();
                for t in 0..streams {
                    let mut s = endpoint
                        .open(addr, id, t, &Token([0; 16]), b"{\"error\":null}")
                        .await
                        .unwrap();
                    let (stop, shared) = (stop.clone(), shared.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut item = [7u8; ITEM];
                        item[..8].copy_from_slice(&t.to_le_bytes());
                        let (acked, wake) = &shared.acks[usize::try_from(t).unwrap()];
                        let mut sent = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            if load == Load::Ping {
                                // One item in flight: wait for the last one's delivery.
                                while acked.load(Ordering::Acquire) < sent {
                                    let woken = wake.notified();
                                    if acked.load(Ordering::Acquire) >= sent {
                                        break;
                                    }
                                    if tokio::time::timeout(Duration::from_millis(100), woken)
                                        .await
                                        .is_err()
                                        && stop.load(Ordering::Relaxed)
                                    {
                                        return;
                                    }
                                }
                            }
                            item[8..16].copy_from_slice(&shared.now_ns().to_le_bytes());
                            if s.send(&item).await.is_err() {
                                break;
                            }
                            sent += 1;
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
                endpoint.abort();
                drop(ucx);
                tracker.close();
                let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
            });
        })
    };
    std::thread::sleep(warmup);
    shared.measuring.store(true, Ordering::Relaxed);
    let (r0, c0, t0) = (
        shared.delivered.load(Ordering::Relaxed),
        process_cpu(),
        Instant::now(),
    );
    std::thread::sleep(measure);
    let (r1, c1, t1) = (
        shared.delivered.load(Ordering::Relaxed),
        process_cpu(),
        Instant::now(),
    );
    shared.measuring.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    frontend.join().unwrap();
    let records = (r1 - r0) as f64;
    let mut samples = std::mem::take(&mut *shared.samples.lock().unwrap());
    samples.sort_unstable();
    // The sample at per-mille `p` of the sorted samples, in µs.
    let pct = |p: usize| {
        let i = samples.len().saturating_sub(1) * p / 1000;
        samples.get(i).map_or(f64::NAN, |&ns| ns as f64 / 1e3)
    };
    Outcome {
        records_per_s: records / (t1 - t0).as_secs_f64(),
        cpu_ns_per_record: (c1 - c0) * 1e9 / records.max(1.0),
        p50_us: pct(500),
        p99_us: pct(990),
    }
}

/// CPU time (user + system) of this whole process, in seconds.
fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the ")".
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = args
        .iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    // `cargo test --benches` runs benches without `--bench`; keep that quick.
    let quick = !args.iter().any(|a| a == "--bench");
    let (warmup, measure) = if quick {
        (Duration::from_millis(100), Duration::from_millis(300))
    } else {
        (Duration::from_millis(700), Duration::from_secs_f64(secs))
    };
    println!(
        "| lanes | load | streams | flush | records/s | CPU ns/record (process) | deliver p50 µs | deliver p99 µs |"
    );
    println!("|---|---|---:|---|---:|---:|---:|---:|");
    let transports = [
        Lanes::Tcp,
        Lanes::Ucx(ProgressEngine::Task),
        Lanes::Ucx(ProgressEngine::Thread),
    ];
    let runs = [
        (Load::Flood, "5 ms", FlushPolicy::default()),
        (Load::Flood, "greedy", FlushPolicy::greedy()),
        (Load::Ping, "greedy", FlushPolicy::greedy()),
    ];
    for streams in [1u64, 1024] {
        for (load, flush, policy) in runs {
            for lanes in transports {
                let o = run(lanes, load, streams, policy, warmup, measure);
                println!(
                    "| {} | {load:?} | {streams} | {flush} | {:.0} | {:.0} | {:.1} | {:.1} |",
                    lanes.name(),
                    o.records_per_s,
                    o.cpu_ns_per_record,
                    o.p50_us,
                    o.p99_us
                );
            }
        }
    }
}

// --- A minimal TCP lane transport over velo-session (see the module docs) ------------------

struct TcpFront {
    endpoint: FrontendEndpoint,
    addr: SocketAddr,
}

impl TcpFront {
    async fn bind(mux: MuxConfig, acceptor: Arc<dyn Acceptor>, tracker: &TaskTracker) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let settings = FrontendSettings {
            mux,
            read_buffer: velo_session::DEFAULT_READ_BUFFER,
        };
        let endpoint = FrontendEndpoint::new(
            settings,
            velo_session::new_instance_id(),
            acceptor,
            tracker.clone(),
        );
        endpoint.accept(TcpAccept(listener), AcceptSettings::default());
        Self { endpoint, addr }
    }
}

/// Plain TCP lanes for the comparison (velo-tcp sets more socket options; a bench of velo-ucx
/// does not depend on its sibling transport).
struct TcpAccept(TcpListener);

impl LaneListener for TcpAccept {
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Box<dyn RawLane>>>> {
        let (stream, _) = match ready!(self.0.poll_accept(cx)) {
            Ok(a) => a,
            Err(e) => return Poll::Ready(Some(Err(e))),
        };
        stream.set_nodelay(true).unwrap();
        Poll::Ready(Some(Ok(Box::new(TcpLane(stream)))))
    }
}

struct TcpDial;

impl Dialer for TcpDial {
    fn dial(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Box<dyn RawLane>>> {
        async move {
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(TcpLane(stream)) as Box<dyn RawLane>)
        }
        .boxed()
    }
}

struct TcpLane(TcpStream);

struct TcpRead(tokio::net::tcp::OwnedReadHalf);

struct TcpWrite(tokio::net::tcp::OwnedWriteHalf);

impl RawLane for TcpLane {
    fn into_io(self: Box<Self>) -> LaneIo {
        let (read, write) = self.0.into_split();
        LaneIo {
            read: Box::new(TcpRead(read)),
            write: Box::new(TcpWrite(write)),
        }
    }
}

impl LaneRead for TcpLane {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_read_buf(Pin::new(&mut self.0), cx, buf)
    }
}

impl LaneWrite for TcpLane {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        poll_write(Pin::new(&mut self.0), cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl LaneRead for TcpRead {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_read_buf(Pin::new(&mut self.0), cx, buf)
    }
}

impl LaneWrite for TcpWrite {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        poll_write(Pin::new(&mut self.0), cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

fn poll_write(
    mut w: Pin<&mut impl AsyncWrite>,
    cx: &mut Context<'_>,
    chunks: &mut Vec<Bytes>,
) -> Poll<io::Result<()>> {
    while !chunks.is_empty() {
        let slices: Vec<io::IoSlice<'_>> = chunks.iter().map(|c| io::IoSlice::new(c)).collect();
        let mut left = ready!(w.as_mut().poll_write_vectored(cx, &slices))?;
        if left == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        while left > 0 {
            if left >= chunks[0].len() {
                left -= chunks.remove(0).len();
            } else {
                chunks[0].advance(left);
                left = 0;
            }
        }
    }
    Poll::Ready(Ok(()))
}
