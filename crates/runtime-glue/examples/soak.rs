//! Soak: a frontend and a worker in one process run random response streams for a long time,
//! with random stops, kills and dropped handles, while resident memory is sampled. At the end
//! an oracle checks that every stream ended exactly once and that nothing was left behind.
//!
//! `cargo xtask soak --duration 10m` (or `cargo run --release -p runtime-glue --example soak --
//! --duration 600 --summary soak.json`). Exits non-zero when the oracle fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use response_plane::{RegisterOptions, ResponseError};
use runtime_glue::{ResponseService, Roles, ServiceConfig};

#[derive(Default)]
struct Counts {
    started: AtomicU64,
    clean: AtomicU64,
    stopped_quietly: AtomicU64,
    killed: AtomicU64,
    receiver_dropped: AtomicU64,
    sender_dropped_seen: AtomicU64,
    unexpected: AtomicU64,
}

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
    let duration = Duration::from_secs_f64(arg("--duration", "30").parse().unwrap_or(30.0));
    let concurrency: u64 = arg("--concurrency", "256").parse().unwrap_or(256);
    let plane = arg("--plane", "velo");
    let summary = arg("--summary", "");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let ok = rt.block_on(soak(duration, concurrency, &plane, &summary));
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

async fn soak(duration: Duration, concurrency: u64, plane: &str, summary: &str) -> bool {
    let plane = plane.to_owned();
    let config = ServiceConfig::from_lookup(Roles::BOTH, |v| match v {
        "DYN_RESPONSE_PLANE" => Some(plane.clone()),
        "DYN_TCP_RESPONSE_STREAM_HOST" => Some("127.0.0.1".into()),
        _ => None,
    })
    .expect("valid settings");
    let service = ResponseService::start(config)
        .await
        .expect("the service starts");
    let counts = Arc::new(Counts::default());
    let deadline = Instant::now() + duration;
    let mut clients = Vec::new();
    for c in 0..concurrency {
        let (service, counts) = (service.clone(), counts.clone());
        clients.push(tokio::spawn(async move {
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
                one_stream(&service, &counts, fate, items).await;
            }
        }));
    }
    let flusher = {
        let service = service.clone();
        tokio::spawn(async move {
            loop {
                service.flush();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
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
    for c in clients {
        let _ = tokio::time::timeout(Duration::from_secs(30), c).await;
    }
    flusher.abort();
    // Let the last ends and credits settle, then look for anything left behind.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pending = service
        .frontend()
        .map_or(0, response_plane::FrontendPlane::pending);
    let fstats = service
        .frontend()
        .map(response_plane::FrontendPlane::stats)
        .unwrap_or_default();
    let report = service.shutdown().await;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let started = get(&counts.started);
    let ended = get(&counts.clean)
        + get(&counts.stopped_quietly)
        + get(&counts.killed)
        + get(&counts.receiver_dropped)
        + get(&counts.sender_dropped_seen);
    // RSS after the first tenth of the run (warm) against the end: growth means a leak.
    let warm = samples.get(samples.len() / 10).map_or(0, |s| s.1);
    let last = samples.last().map_or(0, |s| s.1);
    let growth = if warm > 0 {
        last as f64 / warm as f64
    } else {
        1.0
    };
    let mut failures = Vec::new();
    if ended != started {
        failures.push(format!("{started} streams started but {ended} ended"));
    }
    if get(&counts.unexpected) > 0 {
        failures.push(format!(
            "{} streams ended in an unexpected way",
            get(&counts.unexpected)
        ));
    }
    if pending != 0 {
        failures.push(format!("{pending} registrations left pending"));
    }
    if fstats.streams_active() != 0 {
        failures.push(format!(
            "{} transport streams still active",
            fstats.streams_active()
        ));
    }
    if growth > 1.5 {
        failures.push(format!(
            "RSS grew {growth:.2}x after warm-up ({warm} -> {last} KiB)"
        ));
    }
    if report.outcome() != "clean" {
        failures.push(format!("shutdown was {}", report.outcome()));
    }
    let doc = serde_json::json!({
        "duration_s": duration.as_secs_f64(), "concurrency": concurrency, "plane": plane,
        "streams": started, "clean": get(&counts.clean), "stopped_quietly": get(&counts.stopped_quietly),
        "killed": get(&counts.killed), "receiver_dropped": get(&counts.receiver_dropped),
        "sender_dropped": get(&counts.sender_dropped_seen), "unexpected": get(&counts.unexpected),
        "pending_left": pending, "rss_warm_kib": warm, "rss_end_kib": last, "rss_growth": growth,
        "rss_samples": samples, "shutdown": report.outcome(), "failures": failures,
    });
    println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    if !summary.is_empty() {
        let _ = std::fs::write(
            summary,
            serde_json::to_string_pretty(&doc).unwrap_or_default(),
        );
    }
    failures.is_empty()
}

/// One stream with a chosen fate; counts how it ended, and whether that is what the fate
/// implies (the oracle).
async fn one_stream(service: &ResponseService, counts: &Counts, fate: Fate, items: u64) {
    counts.started.fetch_add(1, Ordering::Relaxed);
    let bump = |c: &AtomicU64| {
        c.fetch_add(1, Ordering::Relaxed);
    };
    let Ok((info, pending)) = service.register::<u64>(RegisterOptions::default()) else {
        bump(&counts.unexpected);
        return;
    };
    let producer = {
        let service = service.clone();
        async move {
            let mut tx = service.connect::<u64>(&info).await?;
            tx.send_prologue(Ok(())).await?;
            let ctx = tx.context();
            for i in 0..items {
                if ctx.is_stopped() {
                    break;
                }
                if matches!(fate, Fate::DropSender) && i == items / 2 {
                    return Ok::<_, ResponseError>(()); // dropped without finishing
                }
                tx.send(&i).await?;
            }
            tx.finish().await
        }
    };
    let consumer = async {
        let Ok(mut rx) = pending.established().await else {
            return false;
        };
        let mut seen = 0u64;
        loop {
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
    let (sent, received_as_expected) = tokio::join!(producer, consumer);
    let expected_send = match fate {
        Fate::Finish | Fate::DropSender => sent.is_ok(),
        _ => true, // stopped or killed producers may see a cancellation
    };
    if !(received_as_expected && expected_send) {
        bump(&counts.unexpected);
    }
    bump(match fate {
        Fate::Finish => &counts.clean,
        Fate::Stop => &counts.stopped_quietly,
        Fate::Kill => &counts.killed,
        Fate::DropReceiver => &counts.receiver_dropped,
        Fate::DropSender => &counts.sender_dropped_seen,
    });
}
