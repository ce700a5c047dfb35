//! Running the load: users or arrivals, one streaming request each, timed per SSE chunk.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::report::{Latencies, Report, ms};
use super::{LoadArgs, Mode, cpu};
use crate::client::{self, Conn};

/// How long requests still running when the window ends may take to finish.
const DRAIN: Duration = Duration::from_secs(60);
/// Idle connections kept for reuse in the open loop.
const MAX_IDLE_CONNS: usize = 4096;

struct Shared {
    addr: std::net::SocketAddr,
    body: String,
    window: (Instant, Instant),
    latencies: Mutex<Latencies>,
    ok: AtomicU64,
    errors: AtomicU64,
    errors_503: AtomicU64,
    dropped: AtomicU64,
    tokens: AtomicU64,
    idle: Mutex<Vec<Conn>>,
    outstanding: AtomicUsize,
}

/// What one request saw.
#[derive(Default)]
struct Seen {
    first: Option<Instant>,
    last: Option<Instant>,
    tokens_in_window: u64,
    chunks: u64,
    gaps_us: Vec<u64>,
}

#[derive(Deserialize)]
struct Chunk {
    object: String,
    #[serde(default)]
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
}

/// Runs the load `args` describes and prints (and optionally writes) its report.
///
/// # Errors
///
/// The frontend never became healthy; the report could not be written.
pub async fn run(args: LoadArgs) -> Result<(), Box<dyn std::error::Error>> {
    wait_ready(&args).await?;
    let start = Instant::now() + Duration::from_secs_f64(args.warmup_s);
    let window = (start, start + Duration::from_secs_f64(args.duration_s));
    let shared = Arc::new(Shared {
        addr: args.addr,
        body: request_body(&args),
        window,
        latencies: Mutex::new(Latencies::default()),
        ok: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        errors_503: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        tokens: AtomicU64::new(0),
        idle: Mutex::new(Vec::new()),
        outstanding: AtomicUsize::new(0),
    });
    let pid = args.frontend_pid;
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(window.0.into()).await;
        let before = cpu::by_thread_name(pid);
        tokio::time::sleep_until(window.1.into()).await;
        (before, cpu::by_thread_name(pid))
    });
    let tasks = match args.mode {
        Mode::Closed => closed(&shared, args.concurrency),
        Mode::Open => open(&shared, args.rate, args.max_outstanding).await,
    };
    let drain = tokio::time::sleep_until((window.1 + DRAIN).into());
    tokio::pin!(drain);
    for t in tasks {
        tokio::select! {
            _ = t => {}
            () = &mut drain => break,
        }
    }
    let (before, after) = cpu.await?;
    let report = report(&args, &shared, &before, &after);
    println!("{}\n{}", super::report::HEADER, report.row());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

async fn wait_ready(args: &LoadArgs) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs_f64(args.wait_ready_s);
    loop {
        let r = client::get_text(args.addr, "/health", Duration::from_secs(2)).await;
        if matches!(r, Ok((200, _))) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} did not report healthy within {}s: {r:?}",
                args.addr, args.wait_ready_s
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn request_body(args: &LoadArgs) -> String {
    let prompt = "word ".repeat(args.isl);
    serde_json::json!({
        "model": args.model,
        "messages": [{"role": "user", "content": prompt.trim_end()}],
        "max_tokens": args.osl,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

fn closed(shared: &Arc<Shared>, users: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..users.max(1))
        .map(|_| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let mut conn: Option<Conn> = None;
                while Instant::now() < shared.window.1 {
                    conn = one(&shared, conn.take()).await;
                }
            })
        })
        .collect()
}

async fn open(
    shared: &Arc<Shared>,
    rate: f64,
    max_outstanding: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let mut next = Instant::now();
    let rate = rate.max(0.001);
    while next < shared.window.1 {
        tokio::time::sleep_until(next.into()).await;
        // Exponential inter-arrival times: a Poisson process.
        let u: f64 = rand::random::<f64>().max(1e-12);
        next += Duration::from_secs_f64(-u.ln() / rate);
        if shared.outstanding.load(Ordering::Relaxed) >= max_outstanding {
            if in_window(shared, Instant::now()) {
                shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        shared.outstanding.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let conn = shared
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            if let Some(c) = one(&shared, conn).await {
                let mut idle = shared.idle.lock().unwrap_or_else(PoisonError::into_inner);
                if idle.len() < MAX_IDLE_CONNS {
                    idle.push(c);
                }
            }
            shared.outstanding.fetch_sub(1, Ordering::Relaxed);
        }));
        tasks.retain(|t| !t.is_finished());
    }
    tasks
}

fn in_window(shared: &Shared, t: Instant) -> bool {
    t >= shared.window.0 && t < shared.window.1
}

/// One request on `conn` (or a new connection); returns the connection if reusable.
async fn one(shared: &Shared, conn: Option<Conn>) -> Option<Conn> {
    let started = Instant::now();
    let counted = in_window(shared, started);
    let mut seen = Seen::default();
    let (result, conn) = request(shared, conn, started, &mut seen).await;
    shared
        .tokens
        .fetch_add(seen.tokens_in_window, Ordering::Relaxed);
    if !counted {
        return conn;
    }
    match result {
        Ok(()) => {
            shared.ok.fetch_add(1, Ordering::Relaxed);
            record(shared, started, &seen);
        }
        Err(status) => {
            shared.errors.fetch_add(1, Ordering::Relaxed);
            if status == Some(503) {
                shared.errors_503.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    conn
}

/// Sends the request and reads its stream; `Err(status)` on failure (`None`: not an HTTP
/// status).
async fn request(
    shared: &Shared,
    conn: Option<Conn>,
    started: Instant,
    seen: &mut Seen,
) -> (Result<(), Option<u16>>, Option<Conn>) {
    let mut conn = match conn.filter(Conn::is_open) {
        Some(c) => c,
        None => match Conn::open(shared.addr).await {
            Ok(c) => c,
            Err(_) => return (Err(None), None),
        },
    };
    let Ok(mut response) = conn.post("/v1/chat/completions", &shared.body).await else {
        return (Err(None), None);
    };
    if response.status != 200 {
        let status = response.status;
        let _ = response.text().await;
        return (Err(Some(status)), Some(conn));
    }
    let _ = started;
    loop {
        match response.next_event().await {
            Ok(Some(ev)) if ev.event.is_some() => return (Err(None), None),
            Ok(Some(ev)) if ev.data == "[DONE]" => break,
            Ok(Some(ev)) => chunk(shared, &ev.data, seen),
            Ok(None) | Err(_) => return (Err(None), None),
        }
    }
    // Read to the end, so the connection can carry the next request.
    if response.next_event().await.is_err() {
        return (Ok(()), None);
    }
    (Ok(()), Some(conn))
}

fn chunk(shared: &Shared, data: &str, seen: &mut Seen) {
    let now = Instant::now();
    let Ok(c) = serde_json::from_str::<Chunk>(data) else {
        return;
    };
    let has_content = c.object == "chat.completion.chunk"
        && c.choices
            .iter()
            .any(|ch| ch.delta.as_ref().is_some_and(|d| d.content.is_some()));
    if !has_content {
        return;
    }
    if let Some(last) = seen.last {
        seen.gaps_us
            .push(u64::try_from((now - last).as_micros()).unwrap_or(u64::MAX));
    }
    seen.first.get_or_insert(now);
    seen.last = Some(now);
    seen.chunks += 1;
    if in_window(shared, now) {
        seen.tokens_in_window += 1;
    }
}

fn record(shared: &Shared, started: Instant, seen: &Seen) {
    let (Some(first), Some(last)) = (seen.first, seen.last) else {
        return;
    };
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
    let mut l = shared
        .latencies
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let _ = l.ttft.record(us(first - started));
    for &g in &seen.gaps_us {
        let _ = l.gap.record(g.max(1));
    }
    if seen.chunks > 1 {
        let mean = (last - first) / u32::try_from(seen.chunks - 1).unwrap_or(u32::MAX);
        let _ = l.itl_mean.record(us(mean));
    }
}

fn report(
    args: &LoadArgs,
    shared: &Shared,
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Report {
    let secs = args.duration_s.max(1e-9);
    let tokens = shared.tokens.load(Ordering::Relaxed) as f64;
    let l = shared
        .latencies
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut groups: BTreeMap<&str, f64> = BTreeMap::new();
    for (name, &t) in after {
        let d = t - before.get(name).copied().unwrap_or(0.0);
        *groups.entry(cpu::group(name)).or_insert(0.0) += d.max(0.0);
    }
    let per_token = |s: f64| if tokens > 0.0 { s * 1e6 / tokens } else { 0.0 };
    let (http, plane) = (
        groups.get("http").copied().unwrap_or(0.0),
        groups.get("plane").copied().unwrap_or(0.0),
    );
    Report {
        label: args.label.clone(),
        mode: match args.mode {
            Mode::Closed => "closed".into(),
            Mode::Open => "open".into(),
        },
        load: match args.mode {
            Mode::Closed => args.concurrency as f64,
            Mode::Open => args.rate,
        },
        requests_ok: shared.ok.load(Ordering::Relaxed),
        http_errors: shared.errors.load(Ordering::Relaxed),
        http_503: shared.errors_503.load(Ordering::Relaxed),
        dropped_arrivals: shared.dropped.load(Ordering::Relaxed),
        output_tokens_per_s: tokens / secs,
        ttft_p50_ms: ms(&l.ttft, 0.5),
        ttft_p99_ms: ms(&l.ttft, 0.99),
        chunk_gap_p50_ms: ms(&l.gap, 0.5),
        chunk_gap_p99_ms: ms(&l.gap, 0.99),
        itl_mean_p99_ms: ms(&l.itl_mean, 0.99),
        frontend_cpu_us_per_token: per_token(http + plane),
        http_cpu_us_per_token: per_token(http),
        plane_cpu_us_per_token: per_token(plane),
        frontend_cores: (http + plane) / secs,
    }
}
