//! The worker process role: mock engines behind an ingress.
//!
//! [`Engines`] runs the mock engines of one process. An [`Ingress`] takes requests off the
//! wire and hands each, still encoded, to [`Engines::serve`], which has the plane open its
//! response stream and queues it at its engine. The default ingress is our request channel
//! ([`RequestChannel`]); a peer plane whose frontend insists on its own request plane
//! (Dynamo's QUIC plane) brings its own.

use std::collections::VecDeque;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::adapter::{BenchSink, BenchWorker};
use crate::engine_stats::{EngineCounters, EngineStats};
use crate::item::EngineOutput;
use crate::mocker::{MAX_BATCHED_TOKENS, MAX_RUNNING, pass_time, prefill_time};
use crate::protocol::{WorkerCommand, WorkerLine};
use crate::reqplane::{self, Request};

/// How a worker process runs its engines.
#[derive(Debug, Clone, Copy)]
pub struct WorkerOpts {
    /// Mock engines in this process.
    pub engines: u32,
    /// The mocker's speedup ratio.
    pub speedup: f64,
    /// Call the plane's flush hint at the end of every forward pass.
    pub flush_per_pass: bool,
}

/// Requests queued at one engine before its ingress waits.
const ENGINE_QUEUE: usize = 16_384;
/// Setup failures printed to the process's log, at most.
const LOGGED_FAILURES: u64 = 5;

/// Setup failures (the frontend could not be reached, or refused), for the process's log.
static SETUP_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Where a worker process takes requests from.
pub trait Ingress<W: BenchWorker>: Send + 'static {
    /// Starts taking requests, handing each to [`Engines::serve`], and returns the address
    /// the frontend sends requests to (announced as [`WorkerLine::Ready`]).
    fn start(self, engines: Arc<Engines<W>>)
    -> impl Future<Output = Result<String, String>> + Send;
}

/// Our request channel ([`crate::reqplane`]) on an ephemeral port of the process's host
/// address ([`host`]: loopback unless the worker role was given `--host`).
pub struct RequestChannel;

/// The address this process serves on, set once by the worker role from `--host` (every
/// process of a run has its own address on the `netns` topology).
static HOST: OnceLock<IpAddr> = OnceLock::new();

/// Sets the address this process serves on; only the first call counts.
pub fn set_host(host: IpAddr) {
    let _ = HOST.set(host);
}

/// The address this process serves on (loopback unless [`set_host`] said otherwise).
pub fn host() -> IpAddr {
    HOST.get()
        .copied()
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

impl<W: BenchWorker> Ingress<W> for RequestChannel {
    async fn start(self, engines: Arc<Engines<W>>) -> Result<String, String> {
        let listener = TcpListener::bind((host(), 0))
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let engines = engines.clone();
                tokio::spawn(reqplane::serve(stream, move |raw| {
                    let engines = engines.clone();
                    // The request's setup (connect, prologue) runs beside the engine, as a
                    // server's request handler does; the engine takes it once ready.
                    tokio::spawn(async move { engines.serve(raw).await });
                }));
            }
        });
        Ok(addr.to_string())
    }
}

/// The mock engines of one worker process.
pub struct Engines<W: BenchWorker> {
    plane: Arc<W>,
    queues: Vec<EngineQueue<W>>,
    counters: Arc<EngineCounters>,
}

/// Where a process hands ready requests to one engine.
type EngineQueue<W> = mpsc::Sender<(Request, <W as BenchWorker>::Sink)>;

impl<W: BenchWorker> Engines<W> {
    /// Starts `opts.engines` engines (at least one) on the current runtime.
    pub fn start(plane: Arc<W>, opts: WorkerOpts) -> Arc<Self> {
        let engines = opts.engines.max(1) as usize;
        let counters = Arc::new(EngineCounters::new(engines));
        let queues = (0..engines)
            .map(|_| {
                let (tx, rx) = mpsc::channel(ENGINE_QUEUE);
                tokio::spawn(engine(plane.clone(), rx, opts, counters.clone()));
                tx
            })
            .collect();
        Arc::new(Self {
            plane,
            queues,
            counters,
        })
    }

    /// What the engines have done so far (passes, prefill batching, arrivals).
    pub fn stats(&self) -> EngineStats {
        self.counters.snapshot()
    }

    /// The plane the engines send on.
    pub fn plane(&self) -> &Arc<W> {
        &self.plane
    }

    /// Opens the response stream of one encoded request and queues it at its engine. A
    /// failure is counted and the first few are logged: the frontend sees it as its own error.
    pub async fn serve(&self, raw: Bytes) {
        match self.plane.open(raw).await {
            Ok((req, sink)) => {
                let i = req.worker as usize % self.queues.len();
                self.counters.on_arrival(i);
                let _ = self.queues[i].send((req, sink)).await;
            }
            Err(e) => {
                if SETUP_FAILURES.fetch_add(1, Ordering::Relaxed) < LOGGED_FAILURES {
                    eprintln!("worker: stream setup failed: {e}");
                }
            }
        }
    }
}

/// Runs the worker process on our request channel: says [`WorkerLine::Ready`] once it
/// listens, then serves requests until killed.
///
/// # Errors
///
/// The listener's I/O error.
pub async fn run<W: BenchWorker>(plane: W, opts: WorkerOpts) -> Result<(), String> {
    run_with(plane, opts, RequestChannel).await
}

/// Runs the worker process on `ingress`: says [`WorkerLine::Ready`] once it takes requests,
/// then serves them until killed.
///
/// # Errors
///
/// The ingress's start-up failure.
pub async fn run_with<W: BenchWorker, I: Ingress<W>>(
    plane: W,
    opts: WorkerOpts,
    ingress: I,
) -> Result<(), String> {
    let engines = Engines::start(Arc::new(plane), opts);
    let address = ingress.start(engines.clone()).await?;
    WorkerLine::Ready { address }
        .say()
        .await
        .map_err(|e| e.to_string())?;
    answer_samples(&engines).await;
    std::future::pending::<()>().await;
    Ok(())
}

/// Answers every [`WorkerCommand::Sample`] on stdin with the engines' counters
/// ([`WorkerLine::Engines`]) until stdin ends; a line that is no command is logged and skipped.
async fn answer_samples<W: BenchWorker>(engines: &Engines<W>) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match line.parse::<WorkerCommand>() {
            Ok(WorkerCommand::Sample) => {
                if WorkerLine::Engines(engines.stats()).say().await.is_err() {
                    return;
                }
            }
            Err(e) => eprintln!("worker: {e}"),
        }
    }
}

struct Running<S> {
    req: Request,
    sink: S,
    generated: u32,
}

/// One mock engine: continuous batching, one token per running request per forward pass.
async fn engine<W: BenchWorker>(
    plane: Arc<W>,
    mut rx: mpsc::Receiver<(Request, W::Sink)>,
    opts: WorkerOpts,
    counters: Arc<EngineCounters>,
) {
    let mut running: Vec<Running<W::Sink>> = Vec::with_capacity(MAX_RUNNING);
    let mut waiting: VecDeque<(Request, W::Sink)> = VecDeque::new();
    let mut next_pass = Instant::now();
    loop {
        if running.is_empty() && waiting.is_empty() {
            match rx.recv().await {
                Some(r) => waiting.push_back(r),
                None => return,
            }
            next_pass = Instant::now();
        }
        while let Ok(r) = rx.try_recv() {
            waiting.push_back(r);
        }
        let before = running.len();
        let new_tokens = admit(&mut running, &mut waiting);
        let kv: u64 = running
            .iter()
            .map(|r| u64::from(r.req.isl) + u64::from(r.generated))
            .sum();
        // Passes follow an absolute timeline: the timer's 1 ms granularity adds jitter, not drift.
        let model = pass_time(new_tokens, kv, opts.speedup);
        next_pass += model;
        let now = Instant::now();
        let lag = if next_pass > now {
            tokio::time::sleep_until(next_pass).await;
            Instant::now().saturating_duration_since(next_pass)
        } else {
            let lag = now - next_pass;
            if lag > std::time::Duration::from_millis(50) {
                next_pass = now; // far behind (overloaded): don't try to catch up in a burst
            }
            lag
        };
        let prefill = prefill_time(new_tokens, opts.speedup);
        counters.on_pass(running.len() - before, model, prefill, lag);
        // Emit one token per running request; finished ones end with their last item.
        let mut i = 0;
        while i < running.len() {
            let r = &mut running[i];
            let last = r.generated + 1 >= r.req.osl;
            let item = EngineOutput::token(r.req.id, r.generated, last);
            r.generated += 1;
            let ok = r.sink.send(&item).await.is_ok();
            if last || !ok {
                let done = running.swap_remove(i);
                if ok {
                    // Done for the engine. A finish may wait for the frontend to confirm it
                    // took the stream (about a round trip after the first token, so rarely):
                    // that wait is the request's, never the pass's.
                    tokio::spawn(async move {
                        let _ = done.sink.finish().await;
                    });
                }
                continue;
            }
            i += 1;
        }
        if opts.flush_per_pass {
            plane.flush();
        }
    }
}

/// Admits waiting requests up to the running and batched-token limits; returns the prompt
/// tokens admitted (this pass's prefill).
fn admit<S>(running: &mut Vec<Running<S>>, waiting: &mut VecDeque<(Request, S)>) -> u32 {
    let mut new_tokens = 0u32;
    while running.len() < MAX_RUNNING {
        let Some((req, _)) = waiting.front() else {
            break;
        };
        let t = req.isl.min(MAX_BATCHED_TOKENS);
        if new_tokens > 0 && new_tokens + t > MAX_BATCHED_TOKENS {
            break;
        }
        new_tokens += t;
        let (req, sink) = waiting.pop_front().expect("checked above");
        running.push(Running {
            req,
            sink,
            generated: 0,
        });
    }
    new_tokens
}
