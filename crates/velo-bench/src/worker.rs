//! The worker process role: mock engines behind a request channel.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::adapter::{BenchSink, BenchWorker};
use crate::item::EngineOutput;
use crate::mocker::{MAX_BATCHED_TOKENS, MAX_RUNNING, pass_time};
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

/// Setup failures (the frontend could not be reached, or refused), for the process's log.
static SETUP_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Runs the worker process: prints `READY <addr>` once its request channel listens, then
/// serves requests until killed.
///
/// # Errors
///
/// The listener's I/O error.
pub async fn run<W: BenchWorker>(plane: W, opts: WorkerOpts) -> std::io::Result<()> {
    let plane = Arc::new(plane);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let mut out = tokio::io::stdout();
    out.write_all(format!("READY {}\n", listener.local_addr()?).as_bytes())
        .await?;
    out.flush().await?;
    let engines: Arc<Vec<EngineQueue<W>>> = Arc::new(
        (0..opts.engines)
            .map(|_| {
                let (tx, rx) = mpsc::channel(16_384);
                tokio::spawn(engine(plane.clone(), rx, opts));
                tx
            })
            .collect(),
    );
    loop {
        let (stream, _) = listener.accept().await?;
        let (plane, engines) = (plane.clone(), engines.clone());
        tokio::spawn(reqplane::serve(stream, move |req| {
            let (plane, engines) = (plane.clone(), engines.clone());
            // The request's setup (connect, prologue) runs beside the engine, as a server's
            // request handler does; the engine takes it once ready.
            tokio::spawn(async move {
                match plane.open(&req.info).await {
                    Ok(sink) => {
                        let i = req.worker as usize % engines.len();
                        let _ = engines[i].send((req, sink)).await;
                    }
                    Err(e) => {
                        if SETUP_FAILURES.fetch_add(1, Ordering::Relaxed) < 5 {
                            eprintln!("worker: stream setup failed: {e}");
                        }
                    }
                }
            });
        }));
    }
}

/// Where a process hands ready requests to one engine.
type EngineQueue<W> = mpsc::Sender<(Request, <W as BenchWorker>::Sink)>;

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
        // Admit waiting requests up to the running and batched-token limits.
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
        let kv: u64 = running
            .iter()
            .map(|r| u64::from(r.req.isl) + u64::from(r.generated))
            .sum();
        // Passes follow an absolute timeline: the timer's 1 ms granularity adds jitter, not drift.
        next_pass += pass_time(new_tokens, kv, opts.speedup);
        let now = Instant::now();
        if next_pass > now {
            tokio::time::sleep_until(next_pass).await;
        } else if now - next_pass > std::time::Duration::from_millis(50) {
            next_pass = now; // far behind (overloaded): don't try to catch up in a burst
        }
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
                    let _ = done.sink.finish().await;
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
