//! The harness the transports' benches share (feature `__bench`; bench-only, never for
//! users): the command line, the two sides of a run each on a runtime of its own, the stop
//! signal, the measurement window and CPU time from `/proc`.
//!
//! A run starts a frontend (its streams taken by [`EachItem`]) and a worker with
//! [`spawn_side`] (each a thread with a single-threaded runtime, as two processes would be),
//! waits out [`Timing::warm_up`], takes a [`Window`] of whatever it counts, then sets the
//! [`Stop`] both sides watch.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Acceptor, IncomingStream};

/// Measured seconds per run unless `--secs` says otherwise.
const DEFAULT_SECS: f64 = 3.0;
/// Warm-up before each measurement.
const WARMUP: Duration = Duration::from_millis(700);
/// Warm-up and measurement of a quick run (`cargo test --benches`).
const QUICK: (Duration, Duration) = (Duration::from_millis(100), Duration::from_millis(300));
/// How often a side waiting for [`Stop`] looks at it.
const STOP_POLL: Duration = Duration::from_millis(10);
/// Clock ticks per second of `/proc`'s CPU times (`USER_HZ`).
const TICKS_PER_SEC: f64 = 100.0;

/// How long each run warms up and measures.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Before the measurement starts.
    pub warmup: Duration,
    /// The measurement.
    pub measure: Duration,
}

impl Timing {
    /// From the command line: `--secs N` (default 3) measured after 0.7 s of warm-up; quick
    /// (0.1 s and 0.3 s) when run without `--bench`, as `cargo test --benches` runs benches.
    pub fn from_args() -> Self {
        let args: Vec<String> = std::env::args().collect();
        let secs = args
            .iter()
            .position(|a| a == "--secs")
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_SECS);
        if args.iter().any(|a| a == "--bench") {
            Self {
                warmup: WARMUP,
                measure: Duration::from_secs_f64(secs),
            }
        } else {
            let (warmup, measure) = QUICK;
            Self { warmup, measure }
        }
    }

    /// Sleeps through the warm-up.
    pub fn warm_up(&self) {
        std::thread::sleep(self.warmup);
    }

    /// Samples with `sample` now and once the measurement has run.
    pub fn window<S>(&self, mut sample: impl FnMut() -> S) -> Window<S> {
        let (start, t0) = (sample(), Instant::now());
        std::thread::sleep(self.measure);
        let (end, t1) = (sample(), Instant::now());
        Window {
            start,
            end,
            elapsed: t1 - t0,
        }
    }
}

/// What a run counted at the start and the end of its measurement.
#[derive(Debug, Clone, Copy)]
pub struct Window<S> {
    /// At the start.
    pub start: S,
    /// At the end.
    pub end: S,
    /// Time between the two.
    pub elapsed: Duration,
}

/// Set when a run's measurement is over: producers stop, each side shuts down.
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// Tells every side to stop.
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the run is over.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Resolves once the run is over (looking every 10 ms: a side waiting here costs nothing
    /// measurable).
    pub async fn wait(&self) {
        while !self.is_set() {
            tokio::time::sleep(STOP_POLL).await;
        }
    }
}

/// The frontend's [`Acceptor`] of a bench: takes every stream and hands each of its items to
/// `F` as it arrives, on a task per stream (spawned on the frontend's runtime).
#[derive(Debug, Clone)]
pub struct EachItem<F>(pub F);

impl<F: Fn(&[u8]) + Clone + Send + Sync + 'static> Acceptor for EachItem<F> {
    fn accept(&self, incoming: IncomingStream) {
        let mut stream = incoming.accept();
        let on_item = self.0.clone();
        tokio::spawn(async move { while let Some(Ok(())) = stream.recv_with(&on_item).await {} });
    }
}

/// Runs `side` on a thread of its own, on a single-threaded runtime with every driver on.
///
/// # Panics
///
/// If the thread or the runtime cannot start (the joined handle carries a panic of `side`).
pub fn spawn_side<F, Fut>(side: F) -> JoinHandle<Fut::Output>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future,
    Fut::Output: Send + 'static,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a bench runtime");
        rt.block_on(side())
    })
}

/// CPU time (user + system) of this whole process, in seconds.
pub fn process_cpu() -> f64 {
    stat_cpu("/proc/self/stat")
}

/// A thread of this process whose CPU time a run reads.
#[derive(Debug, Clone)]
pub struct ThreadCpu(String);

impl ThreadCpu {
    /// The calling thread.
    pub fn current() -> Self {
        let tid = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        Self(tid)
    }

    /// Its CPU time (user + system), in seconds.
    pub fn seconds(&self) -> f64 {
        stat_cpu(&format!("/proc/self/task/{}/stat", self.0))
    }
}

/// utime + stime of a `/proc` `stat` file, in seconds; 0 when it cannot be read.
fn stat_cpu(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the ")".
    (ticks(11) + ticks(12)) / TICKS_PER_SEC
}
