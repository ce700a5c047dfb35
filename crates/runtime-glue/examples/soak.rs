//! Soak: a frontend and a worker in one process run random response streams for a long time,
//! with random stops, kills and dropped handles, while resident memory is sampled. At the end
//! an oracle checks that every stream ended exactly once and that nothing was left behind.
//!
//! With `--faults --proxy-bin PATH` (a `velo-faults` binary) half the streams go through a
//! fault proxy that resets, cuts and stalls every few seconds, or is killed and restarted
//! (`soak/faults.rs`); streams hit by a fault must still end exactly once and in time, the
//! others are held to the usual oracle.
//!
//! `cargo xtask soak --duration 10m [--faults]` (or `cargo run --release -p runtime-glue
//! --example soak -- --duration 600 --summary soak.json`). Exits non-zero when the oracle fails.

#[path = "soak/faults.rs"]
mod faults;
#[path = "soak/oracle.rs"]
mod oracle;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use response_plane::{RegisterOptions, ResponseError};
use runtime_glue::{ResponseService, Role, ServiceConfig};

use crate::faults::Faults;

/// Longest one stream may take, faults included (a stall, the idle timeout, a reconnection);
/// one still running then counts as hanging.
const STREAM_DEADLINE: Duration = Duration::from_secs(30);
/// RSS may grow at most this much between the end of the warm-up and the end of the run.
const MAX_RSS_GROWTH: f64 = 1.5;

#[derive(Default)]
struct Counts {
    started: AtomicU64,
    clean: AtomicU64,
    stopped_quietly: AtomicU64,
    killed: AtomicU64,
    receiver_dropped: AtomicU64,
    sender_dropped_seen: AtomicU64,
    unexpected: AtomicU64,
    /// Streams that outlived [`STREAM_DEADLINE`].
    hung: AtomicU64,
    /// Proxied streams a fault overlapped, and those of them that did not end as their fate
    /// says (allowed).
    faulted: AtomicU64,
    faulted_disrupted: AtomicU64,
}

/// Where a stream is, for the report on one that hangs: the producer's and the consumer's
/// last step (see [`Step`]) and items sent and seen.
#[derive(Default)]
struct Progress {
    producer: std::sync::atomic::AtomicU8,
    /// Set when the producer's last step failed.
    producer_failed: std::sync::atomic::AtomicBool,
    consumer: std::sync::atomic::AtomicU8,
    sent: AtomicU64,
    seen: AtomicU64,
}

/// Steps of either side, in order; 0 is the first (the producer connecting, the consumer
/// waiting for the prologue).
struct Step;

impl Step {
    const PROLOGUE: u8 = 1;
    const SEND: u8 = 2;
    const FINISH: u8 = 3;
    const READ: u8 = 2;
    const DONE: u8 = 4;
}

/// Hung streams described on standard error, at most.
const HUNG_REPORTS: u64 = 10;

#[derive(Clone, Copy, Debug)]
enum Fate {
    Finish,
    Stop,
    Kill,
    DropReceiver,
    DropSender,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: deterministic from the seed, good enough to vary the load.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The command line.
struct Opts {
    duration: Duration,
    concurrency: u64,
    plane: String,
    summary: String,
    /// `--faults`: the `velo-faults` binary that runs the proxy.
    faults: Option<String>,
    /// `--fault-kinds reset,cut,stall,proxy_restart` (default `all`).
    fault_kinds: String,
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_owned())
}

fn main() -> std::process::ExitCode {
    let faults = std::env::args().any(|a| a == "--faults");
    let opts = Opts {
        duration: Duration::from_secs_f64(arg("--duration", "30").parse().unwrap_or(30.0)),
        concurrency: arg("--concurrency", "256").parse().unwrap_or(256),
        plane: arg("--plane", "velo"),
        summary: arg("--summary", ""),
        faults: faults.then(|| arg("--proxy-bin", "target/release/velo-faults")),
        fault_kinds: arg("--fault-kinds", "all"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let ok = rt.block_on(soak(opts));
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

async fn soak(opts: Opts) -> bool {
    let plane = opts.plane.clone();
    let mut config = ServiceConfig::from_lookup(Role::Both, |v| match v {
        "DYN_RESPONSE_PLANE" => Some(plane.clone()),
        "DYN_TCP_RESPONSE_STREAM_HOST" => Some("127.0.0.1".into()),
        _ => None,
    })
    .expect("valid settings");
    if opts.faults.is_some() {
        let plane = config
            .response_plane()
            .to_builder()
            .idle_timeout(faults::FAULT_IDLE)
            .build()
            .expect("a valid idle timeout");
        config = config
            .to_builder()
            .response_plane(plane)
            .build()
            .expect("valid settings");
    }
    let service = ResponseService::start(config)
        .await
        .expect("the service starts");
    let counts = Arc::new(Counts::default());
    let deadline = Instant::now() + opts.duration;
    let faults = match &opts.faults {
        None => None,
        Some(bin) => {
            let frontend = service
                .frontend()
                .map(response_plane::FrontendPlane::address);
            let frontend = frontend.expect("the soak runs a frontend");
            let started = faults::parse_kinds(&opts.fault_kinds)
                .and_then(|kinds| Faults::start(bin, frontend, kinds, 0x5eed_fa17, deadline));
            match started {
                Ok(f) => Some(Arc::new(f)),
                Err(e) => {
                    eprintln!("soak: cannot start the fault proxy: {e}");
                    return false;
                }
            }
        }
    };
    let clients = spawn_clients(&service, &counts, faults.as_ref(), &opts, deadline);
    let flusher = {
        let service = service.clone();
        tokio::spawn(async move {
            loop {
                service.flush();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let samples = sample_rss(&counts, deadline).await;
    for c in clients {
        let _ = tokio::time::timeout(STREAM_DEADLINE, c).await;
    }
    flusher.abort();
    let fault_counts = faults.as_deref().map(Faults::stop);
    // Let the last ends and credits settle, then look for anything left behind.
    tokio::time::sleep(Duration::from_millis(500)).await;
    oracle::judge(&service, &counts, &samples, fault_counts, &opts).await
}

/// The closed-loop clients: each runs one stream after another until the deadline.
fn spawn_clients(
    service: &ResponseService,
    counts: &Arc<Counts>,
    faults: Option<&Arc<Faults>>,
    opts: &Opts,
    deadline: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..opts.concurrency)
        .map(|c| {
            let (service, counts) = (service.clone(), counts.clone());
            let faults = faults.cloned();
            tokio::spawn(async move {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (c + 1));
                while Instant::now() < deadline {
                    let fate = match rng.below(20) {
                        0 => Fate::Stop,
                        1 => Fate::Kill,
                        2 => Fate::DropReceiver,
                        3 => Fate::DropSender,
                        _ => Fate::Finish,
                    };
                    let items = 1 + rng.below(200);
                    // Only draw a route with faults, so the plain soak's sequence is unchanged.
                    let proxied = faults.as_deref().filter(|_| rng.below(2) == 0);
                    judged_stream(&service, &counts, fate, items, proxied).await;
                }
            })
        })
        .collect()
}

/// One stream, bounded in time, classified: a stream no fault touched must end as its fate
/// says; a faulted one may end otherwise, but must end.
async fn judged_stream(
    service: &ResponseService,
    counts: &Counts,
    fate: Fate,
    items: u64,
    proxied: Option<&Faults>,
) {
    let started = Instant::now();
    let progress = Progress::default();
    let stream = one_stream(service, counts, fate, items, proxied, &progress);
    let outcome = tokio::time::timeout(STREAM_DEADLINE, stream).await;
    let bump = |c: &AtomicU64| {
        c.fetch_add(1, Ordering::Relaxed);
    };
    let Ok(as_expected) = outcome else {
        if counts.hung.fetch_add(1, Ordering::Relaxed) < HUNG_REPORTS {
            let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
            eprintln!(
                "soak: stream hung: {fate:?} of {items} items, {}, producer step {}{} after {} \
                 sent, consumer step {} after {} seen",
                if proxied.is_some() {
                    "proxied"
                } else {
                    "direct"
                },
                progress.producer.load(Ordering::Relaxed),
                if progress.producer_failed.load(Ordering::Relaxed) {
                    " (failed)"
                } else {
                    ""
                },
                get(&progress.sent),
                progress.consumer.load(Ordering::Relaxed),
                get(&progress.seen),
            );
        }
        return;
    };
    match proxied {
        Some(f) if f.overlaps(started, Instant::now()) => {
            bump(&counts.faulted);
            if !as_expected {
                bump(&counts.faulted_disrupted);
            }
        }
        _ if !as_expected => bump(&counts.unexpected),
        _ => {}
    }
}

/// Samples RSS once a second until the deadline.
async fn sample_rss(counts: &Counts, deadline: Instant) -> Vec<(f64, u64)> {
    let mut samples = Vec::new();
    let start = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(
            Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now())),
        )
        .await;
        samples.push((start.elapsed().as_secs_f64(), rss_kib()));
        eprintln!(
            "soak: {:>6.0} s  streams {:>9}  rss {:>7} KiB",
            start.elapsed().as_secs_f64(),
            counts.started.load(Ordering::Relaxed),
            rss_kib()
        );
    }
    samples
}

/// One stream with a chosen fate (through the fault proxy when `proxied`); counts how it
/// ended, and returns whether that is what the fate implies (the oracle).
async fn one_stream(
    service: &ResponseService,
    counts: &Counts,
    fate: Fate,
    items: u64,
    proxied: Option<&Faults>,
    progress: &Progress,
) -> bool {
    counts.started.fetch_add(1, Ordering::Relaxed);
    let step = |side: &std::sync::atomic::AtomicU8, s: u8| side.store(s, Ordering::Relaxed);
    let Ok((info, pending)) = service.register::<u64>(RegisterOptions::default()) else {
        return false;
    };
    let info = match proxied {
        Some(f) => f.via_proxy(&info),
        None => info,
    };
    // The worker's failure reaches the frontend the way a request's failure would (the
    // request plane): a frontend still waiting for the prologue then drops the registration.
    let (failed_tx, failed) = tokio::sync::oneshot::channel::<()>();
    let producer = {
        let service = service.clone();
        async move {
            let sent = produce(&service, &info, fate, items, progress).await;
            if sent.is_err() {
                progress.producer_failed.store(true, Ordering::Relaxed);
                let _ = failed_tx.send(());
            } else {
                step(&progress.producer, Step::DONE);
            }
            sent
        }
    };
    let consumer = async {
        // Cancel safety: dropping `established` drops the registration, as intended.
        let established = tokio::select! {
            r = pending.established() => r,
            Ok(()) = failed => return false,
        };
        let Ok(mut rx) = established else {
            return false;
        };
        step(&progress.consumer, Step::READ);
        let mut seen = 0u64;
        loop {
            progress.seen.store(seen, Ordering::Relaxed);
            if seen == items / 3 {
                match fate {
                    Fate::Stop => rx.stop(),
                    Fate::Kill => {
                        rx.kill();
                        return rx.next().await.is_none();
                    }
                    Fate::DropReceiver => return true,
                    _ => {}
                }
            }
            match rx.next().await {
                Some(Ok(v)) if v == seen => seen += 1,
                Some(Ok(_)) => return false,
                Some(Err(e)) => return matches!(fate, Fate::DropSender) && e.is_retryable(),
                None => {
                    return matches!(fate, Fate::Finish) && seen == items
                        || matches!(fate, Fate::Stop);
                }
            }
        }
    };
    let consumer = async {
        let r = consumer.await;
        step(&progress.consumer, Step::DONE);
        r
    };
    let (sent, received_as_expected) = tokio::join!(producer, consumer);
    let expected_send = match fate {
        Fate::Finish | Fate::DropSender => sent.is_ok(),
        _ => true, // stopped or killed producers may see a cancellation
    };
    counts_end(counts, fate);
    received_as_expected && expected_send
}

/// The worker's side of one stream: connect, prologue, items, finish (or a drop).
async fn produce(
    service: &ResponseService,
    info: &response_plane::ConnectionInfo,
    fate: Fate,
    items: u64,
    progress: &Progress,
) -> Result<(), ResponseError> {
    let step = |s: u8| progress.producer.store(s, Ordering::Relaxed);
    let mut tx = service.connect::<u64>(info).await?;
    step(Step::PROLOGUE);
    tx.send_prologue(Ok(())).await?;
    step(Step::SEND);
    let ctx = tx.context();
    for i in 0..items {
        if ctx.is_stopped() {
            break;
        }
        if matches!(fate, Fate::DropSender) && i == items / 2 {
            return Ok(()); // dropped without finishing
        }
        tx.send(&i).await?;
        progress.sent.store(i + 1, Ordering::Relaxed);
    }
    step(Step::FINISH);
    tx.finish().await
}

fn counts_end(counts: &Counts, fate: Fate) {
    let c = match fate {
        Fate::Finish => &counts.clean,
        Fate::Stop => &counts.stopped_quietly,
        Fate::Kill => &counts.killed,
        Fate::DropReceiver => &counts.receiver_dropped,
        Fate::DropSender => &counts.sender_dropped_seen,
    };
    c.fetch_add(1, Ordering::Relaxed);
}
