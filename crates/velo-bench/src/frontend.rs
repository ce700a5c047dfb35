//! The frontend process role: a closed loop of `concurrency` clients, each sending a request,
//! reading its response stream to the end, and starting the next.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::adapter::{BenchFrontend, BenchStream};
use crate::protocol::FrontendLine;
use crate::reqplane::Request;

/// The load.
#[derive(Debug, Clone)]
pub struct FrontendOpts {
    /// Worker processes (the plane knows how to reach each).
    pub worker_processes: usize,
    /// Mock engines per worker process.
    pub engines_per_process: u32,
    /// Requests in flight at all times.
    pub concurrency: u32,
    /// Prompt length.
    pub isl: u32,
    /// Output length.
    pub osl: u32,
    /// Time before the measurement window. The window also waits for the first request to
    /// complete, so that process and connection set-up on a slow (loaded) machine never eat
    /// into it.
    pub warmup: Duration,
    /// The measurement window.
    pub duration: Duration,
}

/// Width of a time-series bucket.
pub const BUCKET: Duration = Duration::from_millis(100);
/// Most time-series buckets kept (one hour).
const MAX_BUCKETS: usize = 36_000;

/// What the frontend measured, said as [`FrontendLine::Result`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FrontendReport {
    /// Successful requests completed inside the window.
    pub requests: u64,
    /// Requests that failed inside the window.
    pub errors: u64,
    /// Output tokens received inside the window.
    pub tokens: u64,
    /// The window's length, in seconds.
    pub window_s: f64,
    /// Time to first token, ms: p50, p99.
    pub ttft_p50_ms: f64,
    /// TTFT p99, ms.
    pub ttft_p99_ms: f64,
    /// Time from sending the request to the prologue (the stream established), ms: p50.
    #[serde(default)]
    pub prologue_p50_ms: f64,
    /// Time to the prologue, ms: p99.
    #[serde(default)]
    pub prologue_p99_ms: f64,
    /// Request latency p50, ms.
    pub latency_p50_ms: f64,
    /// Request latency p99, ms.
    pub latency_p99_ms: f64,
    /// p50 over requests of each request's mean inter-token gap, ms.
    pub itl_mean_p50_ms: f64,
    /// p99 over requests of each request's mean inter-token gap, ms (Dynamo's ITL p99).
    pub itl_mean_p99_ms: f64,
    /// TTFT CDF: (ms, fraction) points.
    pub ttft_cdf: Vec<(f64, f64)>,
    /// Per-request mean ITL CDF: (ms, fraction) points.
    pub itl_cdf: Vec<(f64, f64)>,
    /// Output tokens per 100 ms bucket since the load started.
    pub tokens_series: Vec<u64>,
    /// The first few error messages.
    pub error_samples: Vec<String>,
}

const WARMUP: u8 = 0;
const WINDOW: u8 = 1;
const DONE: u8 = 2;

struct Shared {
    phase: AtomicU8,
    /// Set when the first request completes, successfully or not; `first_notify` then wakes
    /// the window's start.
    first_done: AtomicBool,
    first_notify: Notify,
    stop: AtomicBool,
    next_id: AtomicU64,
    stats: Mutex<Stats>,
}

struct Stats {
    ttft: Histogram<u64>,
    prologue: Histogram<u64>,
    latency: Histogram<u64>,
    itl: Histogram<u64>,
    requests: u64,
    errors: u64,
    tokens: u64,
    series: Vec<u64>,
    error_samples: Vec<String>,
}

/// When one request's stream reached each point, and the tokens it carried.
struct Timings {
    established: Instant,
    first: Instant,
    last: Instant,
    tokens: u64,
}

/// Runs the load and says, on stdout, [`FrontendLine::Ready`], then `WindowStart`,
/// `WindowMid` and `WindowEnd` (the orchestrator samples CPU and sockets on those lines); the
/// role then says `Result` with the report returned.
///
/// # Errors
///
/// When stdout is gone.
pub async fn run<F: BenchFrontend>(
    plane: F,
    opts: FrontendOpts,
) -> std::io::Result<FrontendReport> {
    let plane = Arc::new(plane);
    let shared = Arc::new(Shared::new());
    FrontendLine::Ready { port: plane.port() }.say().await?;
    let start = Instant::now();
    let clients = spawn_clients(&plane, &shared, &opts, start);
    wait_for_warm_up(&shared, start + opts.warmup).await;
    let window_s = measure_window(&shared, opts.duration).await?;
    shared.stop.store(true, Ordering::Release);
    for c in clients {
        // Clients in the middle of a request are not waited for: nothing they do now counts.
        c.abort();
    }
    Ok(shared.stats().report(window_s))
}

/// Starts `opts.concurrency` closed-loop clients, spreading requests over every engine of
/// every worker process.
fn spawn_clients<F: BenchFrontend>(
    plane: &Arc<F>,
    shared: &Arc<Shared>,
    opts: &FrontendOpts,
    start: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    let targets = u64::try_from(opts.worker_processes.max(1)).unwrap_or(1)
        * u64::from(opts.engines_per_process.max(1));
    (0..opts.concurrency)
        .map(|_| {
            tokio::spawn(client(
                plane.clone(),
                shared.clone(),
                opts.clone(),
                start,
                targets,
            ))
        })
        .collect()
}

/// Waits until `until` (the warm-up's end) and until the first request has completed.
async fn wait_for_warm_up(shared: &Shared, until: Instant) {
    tokio::time::sleep_until(until).await;
    if !shared.first_done.load(Ordering::Acquire) {
        // `notify_one` keeps a permit: a completion before this wait is not missed.
        shared.first_notify.notified().await;
    }
}

/// Opens the measurement window, says where it starts, its middle and its end, and returns
/// its length in seconds.
async fn measure_window(shared: &Shared, duration: Duration) -> std::io::Result<f64> {
    shared.phase.store(WINDOW, Ordering::Release);
    FrontendLine::WindowStart.say().await?;
    let window_start = Instant::now();
    tokio::time::sleep(duration / 2).await;
    FrontendLine::WindowMid.say().await?;
    tokio::time::sleep_until(window_start + duration).await;
    shared.phase.store(DONE, Ordering::Release);
    let window_s = window_start.elapsed().as_secs_f64();
    FrontendLine::WindowEnd.say().await?;
    Ok(window_s)
}

impl Shared {
    fn new() -> Self {
        Self {
            phase: AtomicU8::new(WARMUP),
            first_done: AtomicBool::new(false),
            first_notify: Notify::new(),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            stats: Mutex::new(Stats::new()),
        }
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    /// Wakes the window's start on the first completed request.
    fn on_request_done(&self) {
        if !self.first_done.load(Ordering::Relaxed) && !self.first_done.swap(true, Ordering::AcqRel)
        {
            self.first_notify.notify_one();
        }
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Stats {
    fn new() -> Self {
        let hist = || Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
        Self {
            ttft: hist(),
            prologue: hist(),
            latency: hist(),
            itl: hist(),
            requests: 0,
            errors: 0,
            tokens: 0,
            series: Vec::new(),
            error_samples: Vec::new(),
        }
    }

    /// Counts one request sent at `t0` in phase `started` and finished in phase `finished`:
    /// a success finished in the window counts as a request, the timings of one started in
    /// the window are recorded, and a failure touching the window counts as an error.
    fn record(&mut self, t0: Instant, outcome: Result<Timings, String>, started: u8, finished: u8) {
        let (in_window, done_in_window) = (started == WINDOW, finished == WINDOW);
        match outcome {
            Ok(t) => {
                if done_in_window {
                    self.requests += 1;
                }
                if in_window {
                    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
                    let _ = self.ttft.record(us(t.first - t0));
                    let _ = self.prologue.record(us(t.established - t0));
                    let _ = self.latency.record(us(t.last - t0));
                    if t.tokens > 1 {
                        let gaps = u32::try_from(t.tokens - 1).unwrap_or(u32::MAX);
                        let _ = self.itl.record(us((t.last - t.first) / gaps));
                    }
                }
            }
            Err(e) => {
                if done_in_window || in_window {
                    self.errors += 1;
                    if self.error_samples.len() < 5 {
                        self.error_samples.push(e);
                    }
                }
            }
        }
    }

    /// The report of a window of `window_s` seconds.
    fn report(&self, window_s: f64) -> FrontendReport {
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let cdf = |h: &Histogram<u64>| -> Vec<(f64, f64)> {
            if h.is_empty() {
                return Vec::new();
            }
            (1..=200)
                .map(|i| f64::from(i) / 200.0)
                .map(|q| (ms(h, q.min(0.9999)), q))
                .collect()
        };
        FrontendReport {
            requests: self.requests,
            errors: self.errors,
            tokens: self.tokens,
            window_s,
            ttft_p50_ms: ms(&self.ttft, 0.5),
            prologue_p50_ms: ms(&self.prologue, 0.5),
            prologue_p99_ms: ms(&self.prologue, 0.99),
            ttft_p99_ms: ms(&self.ttft, 0.99),
            latency_p50_ms: ms(&self.latency, 0.5),
            latency_p99_ms: ms(&self.latency, 0.99),
            itl_mean_p50_ms: ms(&self.itl, 0.5),
            itl_mean_p99_ms: ms(&self.itl, 0.99),
            ttft_cdf: cdf(&self.ttft),
            itl_cdf: cdf(&self.itl),
            tokens_series: self.series.clone(),
            error_samples: self.error_samples.clone(),
        }
    }
}

/// One closed-loop client.
async fn client<F: BenchFrontend>(
    plane: Arc<F>,
    shared: Arc<Shared>,
    opts: FrontendOpts,
    start: Instant,
    targets: u64,
) {
    let mut series: Vec<u64> = Vec::new();
    let mut window_tokens = 0u64;
    let bucket_of = |t: Instant| {
        usize::try_from((t - start).as_millis() / BUCKET.as_millis())
            .unwrap_or(MAX_BUCKETS)
            .min(MAX_BUCKETS)
    };
    while !shared.stop.load(Ordering::Acquire) {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let target = id % targets;
        let per = u64::from(opts.engines_per_process.max(1));
        let (process, engine) = (
            usize::try_from(target / per).unwrap_or(0),
            u32::try_from(target % per).unwrap_or(0),
        );
        let t0 = Instant::now();
        let started = shared.phase();
        let outcome = one_request(
            &*plane,
            process,
            id,
            engine,
            &opts,
            &shared,
            &mut series,
            &mut window_tokens,
            bucket_of,
        )
        .await;
        let finished = shared.phase();
        shared.on_request_done();
        let mut st = shared.stats();
        st.record(t0, outcome, started, finished);
        st.tokens += std::mem::take(&mut window_tokens);
        merge(&mut st.series, &mut series);
    }
}

fn merge(into: &mut Vec<u64>, from: &mut Vec<u64>) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from.iter()) {
        *a += b;
    }
    from.clear();
}

/// Sends one request and reads its stream to the end.
#[allow(clippy::too_many_arguments)]
async fn one_request<F: BenchFrontend>(
    plane: &F,
    process: usize,
    id: u64,
    engine: u32,
    opts: &FrontendOpts,
    shared: &Shared,
    series: &mut Vec<u64>,
    window_tokens: &mut u64,
    bucket_of: impl Fn(Instant) -> usize,
) -> Result<Timings, String> {
    let request = Request {
        id,
        worker: engine,
        isl: opts.isl,
        osl: opts.osl,
        info: String::new(),
    };
    let mut stream = plane.request(process, request).await?;
    let established = Instant::now();
    let mut first = None;
    let mut last = Instant::now();
    let mut n = 0u64;
    while let Some(item) = stream.next_item().await {
        let item = item?;
        let now = Instant::now();
        let tokens = item.token_ids.len() as u64;
        n += tokens;
        first.get_or_insert(now);
        last = now;
        let b = bucket_of(now);
        if series.len() <= b {
            series.resize(b + 1, 0);
        }
        series[b] += tokens;
        if shared.phase.load(Ordering::Relaxed) == WINDOW {
            *window_tokens += tokens;
        }
    }
    if n < u64::from(opts.osl) {
        return Err(format!("stream ended after {n} of {} tokens", opts.osl));
    }
    Ok(Timings {
        established,
        first: first.unwrap_or(last),
        last,
        tokens: n,
    })
}
