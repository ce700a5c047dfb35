//! The legitimate worker's load during an attack, and the resources sampled meanwhile.

use std::time::Duration;

use futures::StreamExt;
use response_plane::{FrontendPlane, RegisterOptions, WorkerPlane};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{LEGIT_INSTANCE, Scale};

/// What the legitimate requests of one window did.
#[derive(Debug, Clone, Default)]
pub struct Legit {
    /// Requests whose every item arrived, then a clean end.
    pub ok: u64,
    /// Requests that failed in any way.
    pub failed: u64,
    /// Each successful request's mean gap between items, in microseconds.
    pub mean_itl_us: Vec<u64>,
}

impl Legit {
    /// Requests in the window.
    pub fn total(&self) -> u64 {
        self.ok + self.failed
    }

    /// Successful requests, in percent.
    pub fn success_pct(&self) -> f64 {
        if self.total() == 0 {
            return 0.0;
        }
        self.ok as f64 * 100.0 / self.total() as f64
    }

    /// The p99 over requests of their mean inter-token gap, in ms.
    pub fn itl_p99_ms(&self) -> f64 {
        let mut v = self.mean_itl_us.clone();
        v.sort_unstable();
        let Some(last) = v.len().checked_sub(1) else {
            return 0.0;
        };
        let i = (last * 99).div_ceil(100);
        v.get(i).copied().unwrap_or_default() as f64 / 1000.0
    }

    fn add(&mut self, other: Self) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.mean_itl_us.extend(other.mean_itl_us);
    }
}

/// Runs `scale.streams` request loops until `stop`; each request registers a stream tied to
/// the legitimate instance, the worker sends `scale.items` items `scale.item_gap` apart, and
/// the frontend times their arrival.
pub(super) async fn run(
    frontend: FrontendPlane,
    worker: WorkerPlane,
    scale: Scale,
    stop: CancellationToken,
) -> Legit {
    let loops: Vec<_> = (0..scale.streams)
        .map(|_| {
            let (f, w, stop) = (frontend.clone(), worker.clone(), stop.clone());
            tokio::spawn(async move {
                let mut out = Legit::default();
                while !stop.is_cancelled() {
                    match tokio::time::timeout(Duration::from_secs(20), request(&f, &w, scale))
                        .await
                    {
                        Ok(Some(itl)) => {
                            out.ok += 1;
                            out.mean_itl_us.push(itl);
                        }
                        _ => out.failed += 1,
                    }
                }
                out
            })
        })
        .collect();
    let mut total = Legit::default();
    for l in loops {
        if let Ok(part) = l.await {
            total.add(part);
        }
    }
    total
}

/// One request: its mean inter-token gap in microseconds, or `None` if it failed.
async fn request(f: &FrontendPlane, w: &WorkerPlane, scale: Scale) -> Option<u64> {
    let (info, pending) = f.register::<u32>(RegisterOptions::default()).ok()?;
    pending.associate(LEGIT_INSTANCE).ok()?;
    let w = w.clone();
    let send = tokio::spawn(async move {
        let mut s = w.connect::<u32>(&info).await.ok()?;
        s.send_prologue(Ok(())).await.ok()?;
        for i in 0..scale.items {
            s.send(&u32::try_from(i).unwrap_or(u32::MAX)).await.ok()?;
            s.flush();
            tokio::time::sleep(scale.item_gap).await;
        }
        s.finish().await.ok()
    });
    let mut stream = pending.established().await.ok()?;
    let (mut first, mut last, mut n) = (None, Instant::now(), 0u32);
    while let Some(item) = stream.next().await {
        item.ok()?;
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        n += 1;
    }
    send.await.ok()??;
    let items = u32::try_from(scale.items).ok()?;
    if n != items || n < 2 {
        return None;
    }
    let span = last.duration_since(first?);
    u64::try_from((span / (n - 1)).as_micros()).ok()
}

/// Samples, until `stop`, the connections to `port` and this process's resident memory;
/// returns their peaks (memory as growth over the start, in KiB) and the CPU time the
/// sampling took, in seconds.
///
/// Runs on a blocking-pool thread, not on the runtime the frontend shares: with 10,000
/// sockets on the machine (an attack's and the frontend's ends), one read of
/// `/proc/net/tcp` costs about 35 ms of kernel time, which on a runtime thread stalled the
/// frontend and the legitimate worker every period and showed as their latency.
pub(super) async fn sample_peak(port: u16, stop: CancellationToken) -> (usize, i64, f64) {
    tokio::task::spawn_blocking(move || {
        let cpu0 = crate::procfs::thread_cpu_seconds();
        let rss0 = rss_kib();
        let (mut conns, mut rss) = (0, 0);
        loop {
            conns = conns.max(connections(port));
            rss = rss.max(rss_kib() - rss0);
            if stop.is_cancelled() {
                return (conns, rss, crate::procfs::thread_cpu_seconds() - cpu0);
            }
            // The sampling period (a pause between reads, not a wait for a condition).
            std::thread::sleep(SAMPLE_PERIOD);
        }
    })
    .await
    .unwrap_or_default()
}

/// How often [`sample_peak`] reads: often enough to see a flood held for seconds, rarely
/// enough that its reads (kernel time on the cores the frontend uses) stay small.
const SAMPLE_PERIOD: Duration = Duration::from_millis(250);

/// This process's resident memory, in KiB.
fn rss_kib() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Connections whose local port is `port` (the frontend's side) that the frontend holds or
/// has yet to accept: established, half-open (`SYN_RECV`), or closed by the peer but not yet by
/// the frontend (`CLOSE_WAIT`). Sockets the frontend has closed and the kernel keeps for a
/// while (`FIN_WAIT`, `TIME_WAIT`, `LAST_ACK`) are not its to hold, and counting them carried
/// one attack's connections into the next rows.
fn connections(port: u16) -> usize {
    const HELD: [&str; 3] = ["01", "03", "08"];
    let n = crate::procfs::tcp_on_port("/proc/net", port, |state| HELD.contains(&state));
    usize::try_from(n).unwrap_or(usize::MAX)
}
