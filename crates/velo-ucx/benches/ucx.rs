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
//! The TCP lanes are velo-session's byte-stream lane (`StreamLane`, the lane `velo-tcp` uses:
//! vectored zero-copy writes) over plain loopback sockets with `TCP_NODELAY`, listened for and
//! dialed here: `velo-tcp` sits on the same layer as this crate and may not be its dependency,
//! not even for a bench, and its socket buffer sizes and liveness bound are not set. Its own
//! bench (`cargo bench -p velo-tcp`) measures it.
//!
//! `cargo bench -p velo-ucx --features ucx --bench ucx [-- --secs N]`

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Buf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;
use velo_mux::{FlushPolicy, MuxConfig, Side};
use velo_session::bench::{self, EachItem, Stop, Timing};
use velo_session::{
    Acceptor, FrontendParts, LaneListener, ListeningFrontend, RawLane, SessionSettings, StreamLane,
    WorkerEndpoint, WorkerSettings,
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

    /// Counts a delivered item, samples its time-to-deliver while measuring, and wakes its
    /// stream's producer.
    fn on_item(&self, item: &[u8]) {
        let now = self.now_ns();
        let (id, sent) = ((&item[..8]).get_u64_le(), (&item[8..16]).get_u64_le());
        self.delivered.fetch_add(1, Ordering::Relaxed);
        if self.measuring.load(Ordering::Relaxed) {
            let mut s = self.samples.lock().unwrap();
            if s.len() < MAX_SAMPLES {
                s.push(now.saturating_sub(sent));
            }
        }
        if let Some((n, wake)) = usize::try_from(id).ok().and_then(|i| self.acks.get(i)) {
            n.fetch_add(1, Ordering::Release);
            wake.notify_one();
        }
    }
}

/// The frontend of one transport.
enum Front {
    Tcp(ListeningFrontend),
    Ucx(UcxFrontend),
}

impl Front {
    async fn bind(lanes: Lanes, acceptor: Arc<dyn Acceptor>, tracker: &TaskTracker) -> Self {
        let mux = MuxConfig::builder(Side::Frontend).build().unwrap();
        let parts = FrontendParts::new(mux, acceptor, tracker.clone());
        let addr = "127.0.0.1:0".parse().unwrap();
        match lanes {
            Lanes::Tcp => Self::Tcp(bind_tcp(addr, parts).await),
            Lanes::Ucx(engine) => {
                let cfg = UcxConfig::loopback()
                    .to_builder()
                    .engine(engine)
                    .build()
                    .unwrap();
                Self::Ucx(velo_ucx::bind_frontend(addr, cfg, parts).await.unwrap())
            }
        }
    }

    fn target(&self) -> (SocketAddr, InstanceId) {
        match self {
            Self::Tcp(f) => (f.local_addr(), f.instance()),
            Self::Ucx(f) => (f.local_addr(), f.instance()),
        }
    }

    fn abort(&self) {
        match self {
            Self::Tcp(f) => f.abort(),
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
                WorkerEndpoint::new(settings, Arc::new(dial_tcp), tracker.clone()),
                None,
            )
        }
        Lanes::Ucx(engine) => {
            let cfg = UcxConfig::loopback()
                .to_builder()
                .engine(engine)
                .build()
                .unwrap();
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

fn run(lanes: Lanes, load: Load, streams: u64, policy: FlushPolicy, timing: Timing) -> Outcome {
    let n = usize::try_from(streams).unwrap();
    let shared = Arc::new(Shared::new(n));
    let stop = Stop::default();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let frontend = {
        let (shared, stop) = (shared.clone(), stop.clone());
        bench::spawn_side(move || async move {
            let tracker = TaskTracker::new();
            let acceptor = EachItem(move |item: &[u8]| shared.on_item(item));
            let f = Front::bind(lanes, Arc::new(acceptor), &tracker).await;
            addr_tx.send(f.target()).unwrap();
            stop.wait().await;
            f.abort();
            tracker.close();
            let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
        })
    };
    let (addr, id) = addr_rx.recv().unwrap();
    let worker = {
        let (shared, stop) = (shared.clone(), stop.clone());
        bench::spawn_side(move || async move {
            let tracker = TaskTracker::new();
            let mux = MuxConfig::builder(Side::Worker)
                .lanes(4)
                .flush(policy)
                .build()
                .unwrap();
            let (endpoint, ucx) = worker_endpoint(lanes, mux, &tracker);
            let mut tasks = Vec::new();
            for t in 0..streams {
                let s = endpoint
                    .open(addr, id, t, &Token([0; 16]), b"{\"error\":null}")
                    .await
                    .unwrap();
                tasks.push(tokio::spawn(produce(
                    s,
                    t,
                    load,
                    shared.clone(),
                    stop.clone(),
                )));
            }
            for t in tasks {
                let _ = t.await;
            }
            endpoint.abort();
            drop(ucx);
            tracker.close();
            let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
        })
    };
    timing.warm_up();
    shared.measuring.store(true, Ordering::Relaxed);
    let w = timing.window(|| {
        (
            shared.delivered.load(Ordering::Relaxed),
            bench::process_cpu(),
        )
    });
    shared.measuring.store(false, Ordering::Relaxed);
    stop.set();
    worker.join().unwrap();
    frontend.join().unwrap();
    let ((r0, c0), (r1, c1)) = (w.start, w.end);
    let records = (r1 - r0) as f64;
    let mut samples = std::mem::take(&mut *shared.samples.lock().unwrap());
    samples.sort_unstable();
    // The sample at per-mille `p` of the sorted samples, in µs.
    let pct = |p: usize| {
        let i = samples.len().saturating_sub(1) * p / 1000;
        samples.get(i).map_or(f64::NAN, |&ns| ns as f64 / 1e3)
    };
    Outcome {
        records_per_s: records / w.elapsed.as_secs_f64(),
        cpu_ns_per_record: (c1 - c0) * 1e9 / records.max(1.0),
        p50_us: pct(500),
        p99_us: pct(990),
    }
}

/// Stream `t`'s producer: sends until the run stops, as fast as credit allows (flood) or with
/// one item in flight (ping), each item carrying its stream and its send time.
async fn produce(
    mut s: velo_session::SendStream,
    t: u64,
    load: Load,
    shared: Arc<Shared>,
    stop: Stop,
) {
    let mut item = [7u8; ITEM];
    item[..8].copy_from_slice(&t.to_le_bytes());
    let (acked, wake) = &shared.acks[usize::try_from(t).unwrap()];
    let mut sent = 0u64;
    while !stop.is_set() {
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
                    && stop.is_set()
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
}

fn main() {
    let timing = Timing::from_args();
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
                let o = run(lanes, load, streams, policy, timing);
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

/// A frontend taking plain TCP lanes on `addr`.
async fn bind_tcp(addr: SocketAddr, parts: FrontendParts) -> ListeningFrontend {
    let listener = TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let session = SessionSettings::default();
    ListeningFrontend::new(parts, &session, TcpAccept(listener), addr, ())
}

/// Plain TCP lanes for the comparison (velo-tcp sets more socket options; a bench of velo-ucx
/// does not depend on its sibling transport): velo-session's byte-stream lane, as velo-tcp's.
struct TcpAccept(TcpListener);

impl LaneListener for TcpAccept {
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Box<dyn RawLane>>>> {
        let (stream, _) = match ready!(self.0.poll_accept(cx)) {
            Ok(a) => a,
            Err(e) => return Poll::Ready(Some(Err(e))),
        };
        stream.set_nodelay(true).unwrap();
        Poll::Ready(Some(Ok(tcp_lane(stream))))
    }
}

/// Dials a plain TCP lane.
async fn dial_tcp(addr: SocketAddr) -> io::Result<Box<dyn RawLane>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(tcp_lane(stream))
}

fn tcp_lane(stream: TcpStream) -> Box<dyn RawLane> {
    Box::new(StreamLane::new(stream, TcpStream::into_split))
}
