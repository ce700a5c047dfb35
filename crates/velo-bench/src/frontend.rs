//! The frontend process role: a closed loop of `concurrency` clients, each sending a request,
//! reading its response stream to the end, and starting the next.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::adapter::{BenchFrontend, BenchStream};
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

/// What the frontend measured, printed as `RESULT <json>`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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

/// Runs the load and prints, on stdout, `READY`, `WINDOW_START`, `WINDOW_MID`, `WINDOW_END`
/// and finally `RESULT <json>` (the orchestrator samples CPU and sockets on those lines).
///
/// # Errors
///
/// When stdout is gone.
pub async fn run<F: BenchFrontend>(
    plane: F,
    opts: FrontendOpts,
) -> std::io::Result<FrontendReport> {
    let plane = Arc::new(plane);
    let hist = || Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    let shared = Arc::new(Shared {
        phase: AtomicU8::new(WARMUP),
        first_done: AtomicBool::new(false),
        first_notify: Notify::new(),
        stop: AtomicBool::new(false),
        next_id: AtomicU64::new(0),
        stats: Mutex::new(Stats {
            ttft: hist(),
            prologue: hist(),
            latency: hist(),
            itl: hist(),
            requests: 0,
            errors: 0,
            tokens: 0,
            series: Vec::new(),
            error_samples: Vec::new(),
        }),
    });
    let mut out = tokio::io::stdout();
    say(&mut out, &format!("READY {}", plane.port())).await?;
    let start = Instant::now();
    let targets = u64::try_from(opts.worker_processes.max(1)).unwrap_or(1)
        * u64::from(opts.engines_per_process.max(1));
    let clients: Vec<_> = (0..opts.concurrency)
        .map(|_| {
            tokio::spawn(client(
                plane.clone(),
                shared.clone(),
                opts.clone(),
                start,
                targets,
            ))
        })
        .collect();
    tokio::time::sleep_until(start + opts.warmup).await;
    if !shared.first_done.load(Ordering::Acquire) {
        // `notify_one` keeps a permit: a completion before this wait is not missed.
        shared.first_notify.notified().await;
    }
    shared.phase.store(WINDOW, Ordering::Release);
    say(&mut out, "WINDOW_START").await?;
    let window_start = Instant::now();
    tokio::time::sleep(opts.duration / 2).await;
    say(&mut out, "WINDOW_MID").await?;
    tokio::time::sleep_until(window_start + opts.duration).await;
    shared.phase.store(DONE, Ordering::Release);
    let window_s = window_start.elapsed().as_secs_f64();
    say(&mut out, "WINDOW_END").await?;
    shared.stop.store(true, Ordering::Release);
    for c in clients {
        // Clients in the middle of a request are not waited for: nothing they do now counts.
        c.abort();
    }
    let st = shared
        .stats
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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
    Ok(FrontendReport {
        requests: st.requests,
        errors: st.errors,
        tokens: st.tokens,
        window_s,
        ttft_p50_ms: ms(&st.ttft, 0.5),
        prologue_p50_ms: ms(&st.prologue, 0.5),
        prologue_p99_ms: ms(&st.prologue, 0.99),
        ttft_p99_ms: ms(&st.ttft, 0.99),
        latency_p50_ms: ms(&st.latency, 0.5),
        latency_p99_ms: ms(&st.latency, 0.99),
        itl_mean_p50_ms: ms(&st.itl, 0.5),
        itl_mean_p99_ms: ms(&st.itl, 0.99),
        ttft_cdf: cdf(&st.ttft),
        itl_cdf: cdf(&st.itl),
        tokens_series: st.series.clone(),
        error_samples: st.error_samples.clone(),
    })
}

async fn say(out: &mut tokio::io::Stdout, line: &str) -> std::io::Result<()> {
    out.write_all(line.as_bytes()).await?;
    out.write_all(b"\n").await?;
    out.flush().await
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
        let in_window = shared.phase.load(Ordering::Acquire) == WINDOW;
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
        let done_in_window = shared.phase.load(Ordering::Acquire) == WINDOW;
        if !shared.first_done.load(Ordering::Relaxed)
            && !shared.first_done.swap(true, Ordering::AcqRel)
        {
            shared.first_notify.notify_one();
        }
        let mut st = shared
            .stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match outcome {
            Ok((established, first, last, n)) => {
                if done_in_window {
                    st.requests += 1;
                }
                if in_window {
                    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
                    let _ = st.ttft.record(us(first - t0));
                    let _ = st.prologue.record(us(established - t0));
                    let _ = st.latency.record(us(last - t0));
                    if n > 1 {
                        let _ = st
                            .itl
                            .record(us((last - first) / u32::try_from(n - 1).unwrap_or(u32::MAX)));
                    }
                }
            }
            Err(e) => {
                if done_in_window || in_window {
                    st.errors += 1;
                    if st.error_samples.len() < 5 {
                        st.error_samples.push(e);
                    }
                }
            }
        }
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

/// Sends one request and reads its stream: (prologue time, first token time, last token time,
/// tokens).
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
) -> Result<(Instant, Instant, Instant, u64), String> {
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
    Ok((established, first.unwrap_or(last), last, n))
}
