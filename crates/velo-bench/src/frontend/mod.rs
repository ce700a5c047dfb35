//! The frontend process role: the load, and what it measures.
//!
//! Two loads ([`Load`]): a *closed loop* of `concurrency` clients, each sending a request,
//! reading its response stream to the end and starting the next; and an *open loop*, where
//! requests arrive at a configured rate (a seeded Poisson process) whatever completes, as real
//! users' do, in steps of rising rate. A closed loop has one measurement window; an open loop
//! has one per rate. Each window is reported once the requests that arrived in it have ended
//! (or a bounded drain has passed: those still running are counted as late).

mod load;
mod request;
mod stats;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;
use tokio::time::Instant;

pub use self::stats::{FrontendReport, Hists};
use self::stats::{Stats, Timings};
use crate::adapter::BenchFrontend;
use crate::protocol::{FrontendCommand, FrontendLine};

/// The load.
#[derive(Debug, Clone)]
pub struct FrontendOpts {
    /// Worker processes (the plane knows how to reach each).
    pub worker_processes: usize,
    /// Mock engines per worker process.
    pub engines_per_process: u32,
    /// How requests arrive.
    pub load: Load,
    /// Prompt length.
    pub isl: u32,
    /// Output length.
    pub osl: u32,
    /// Time before the first measurement window. The window also waits for the first request
    /// to complete, so that process and connection set-up on a slow (loaded) machine never
    /// eat into it.
    pub warmup: Duration,
    /// Each measurement window.
    pub duration: Duration,
    /// After a window: how long the requests that arrived in it get to end before it is
    /// reported (the next step's load runs meanwhile, so it is also that step's settling
    /// time before its own window).
    pub settle: Duration,
}

/// How requests arrive.
#[derive(Debug, Clone, PartialEq)]
pub enum Load {
    /// `concurrency` clients, each sending its next request when its last one has ended.
    Closed {
        /// Requests in flight at all times.
        concurrency: u32,
    },
    /// Requests arrive as a Poisson process, independent of completions: one step (and one
    /// window) per rate, in order.
    Open {
        /// Offered load per step, requests per second.
        rates: Vec<f64>,
        /// Seed of the arrival times.
        seed: u64,
        /// Requests in flight at most; an arrival beyond it is dropped and counted (the
        /// frontend did not keep up).
        max_in_flight: u32,
    },
}

impl Load {
    /// The number of steps (windows): one per rate of an open loop, one for a closed loop.
    pub fn steps(&self) -> usize {
        match self {
            Self::Closed { .. } => 1,
            Self::Open { rates, .. } => rates.len().max(1),
        }
    }

    /// The offered rate of step `step` (0 for a closed loop).
    pub fn rate(&self, step: usize) -> f64 {
        match self {
            Self::Closed { .. } => 0.0,
            Self::Open { rates, .. } => rates.get(step).copied().unwrap_or(0.0),
        }
    }
}

/// Width of a time-series bucket.
pub const BUCKET: Duration = Duration::from_millis(BUCKET_MS);
/// [`BUCKET`] in milliseconds (what an item's bucket is computed with: a 64-bit division).
pub const BUCKET_MS: u64 = 100;
/// Most time-series buckets kept (one hour).
const MAX_BUCKETS: usize = 36_000;
/// No window is open (the value of [`Shared::window`]'s atomic).
const NO_WINDOW: u32 = 0;

/// What the load's tasks share.
pub(crate) struct Shared {
    /// When the load started.
    start: Instant,
    /// One more than the index of the step whose window is open; [`NO_WINDOW`] between.
    window: AtomicU32,
    /// The step whose load runs (an open loop's rate).
    load_step: AtomicU32,
    /// Set when the first request completes, successfully or not; `first_notify` then wakes
    /// the first window's start.
    first_done: AtomicBool,
    first_notify: Notify,
    stop: AtomicBool,
    next_id: AtomicU64,
    in_flight: AtomicU64,
    /// Woken when the last request in flight ends after `stop`.
    drained: Notify,
    state: Mutex<State>,
}

/// Per-step figures and the run's token series, under one lock.
struct State {
    steps: Vec<Step>,
    series: Vec<u64>,
}

/// One step's window, as it is being recorded.
struct Step {
    stats: Stats,
    /// Requests that arrived in the window and have not ended: id and arrival.
    pending: HashMap<u64, Instant>,
    /// Reported already: later records are dropped.
    reported: bool,
}

/// Runs the load: says [`FrontendLine::Ready`], waits for [`FrontendCommand::Go`] on stdin
/// (so that several frontends start together), then per step `WindowStart`, `WindowMid`,
/// `WindowEnd` (the orchestrator samples CPU, sockets and engines on those lines) and `Result`
/// with that window's report. Returns the reports.
///
/// # Errors
///
/// When stdout is gone.
pub async fn run<F: BenchFrontend>(
    plane: F,
    opts: FrontendOpts,
) -> std::io::Result<Vec<FrontendReport>> {
    let plane = Arc::new(plane);
    FrontendLine::Ready { port: plane.port() }.say().await?;
    wait_for_go().await;
    let shared = Arc::new(Shared::new(opts.load.steps()));
    let tasks = load::start(&plane, &shared, &opts);
    wait_for_warm_up(&shared, shared.start + opts.warmup).await;
    let mut reports = Vec::new();
    for step in 0..opts.load.steps() {
        if step > 0 {
            tokio::time::sleep(opts.settle).await;
            reports.push(report(&shared, &opts, step - 1).await?);
        }
        measure_window(&shared, step, opts.duration).await?;
        if step + 1 < opts.load.steps() {
            shared.load_step.store(step_id(step + 1), Ordering::Release);
        }
    }
    shared.stop.store(true, Ordering::Release);
    let drained = shared.drained.notified();
    if shared.in_flight.load(Ordering::Acquire) > 0 {
        // Bounded: requests still running after `settle` are counted as late.
        let _ = tokio::time::timeout(opts.settle, drained).await;
    }
    for t in tasks {
        t.abort();
    }
    reports.push(report(&shared, &opts, opts.load.steps() - 1).await?);
    Ok(reports)
}

/// Waits for [`FrontendCommand::Go`]; an ended or unreadable stdin (a frontend run by hand)
/// starts at once.
async fn wait_for_go() {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match line.parse::<FrontendCommand>() {
            Ok(FrontendCommand::Go) => return,
            Err(e) => eprintln!("frontend: {e}"),
        }
    }
}

/// Waits until `until` (the warm-up's end) and until the first request has completed.
async fn wait_for_warm_up(shared: &Shared, until: Instant) {
    tokio::time::sleep_until(until).await;
    if !shared.first_done.load(Ordering::Acquire) {
        // `notify_one` keeps a permit: a completion before this wait is not missed.
        shared.first_notify.notified().await;
    }
}

/// Opens step `step`'s window and says where it starts, its middle and its end.
async fn measure_window(shared: &Shared, step: usize, duration: Duration) -> std::io::Result<()> {
    shared.window.store(step_id(step), Ordering::Release);
    FrontendLine::WindowStart.say().await?;
    let window_start = Instant::now();
    tokio::time::sleep(duration / 2).await;
    FrontendLine::WindowMid.say().await?;
    tokio::time::sleep_until(window_start + duration).await;
    shared.window.store(NO_WINDOW, Ordering::Release);
    let window_s = window_start.elapsed().as_secs_f64();
    shared.lock().steps[step].stats.window_s = window_s;
    FrontendLine::WindowEnd.say().await
}

/// Makes step `step`'s report (requests of its window still running count as late) and says
/// it.
async fn report(
    shared: &Shared,
    opts: &FrontendOpts,
    step: usize,
) -> std::io::Result<FrontendReport> {
    let report = {
        let mut st = shared.lock();
        let series = st.series.clone();
        let s = &mut st.steps[step];
        s.reported = true;
        let now = Instant::now();
        for t0 in s.pending.values() {
            s.stats.record_late(now - *t0);
        }
        let late = s.pending.len() as u64;
        s.pending.clear();
        let window_s = s.stats.window_s;
        FrontendReport {
            step: u32::try_from(step).unwrap_or(u32::MAX),
            offered_rate: opts.load.rate(step),
            ..s.stats.report(window_s, late, series)
        }
    };
    FrontendLine::Result(Box::new(report.clone())).say().await?;
    Ok(report)
}

/// The value of [`Shared::window`] (and `load_step`) for step `step`.
fn step_id(step: usize) -> u32 {
    u32::try_from(step + 1).unwrap_or(u32::MAX)
}

impl Shared {
    fn new(steps: usize) -> Self {
        Self {
            start: Instant::now(),
            window: AtomicU32::new(NO_WINDOW),
            load_step: AtomicU32::new(step_id(0)),
            first_done: AtomicBool::new(false),
            first_notify: Notify::new(),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            drained: Notify::new(),
            state: Mutex::new(State {
                steps: (0..steps.max(1))
                    .map(|_| Step {
                        stats: Stats::new(),
                        pending: HashMap::new(),
                        reported: false,
                    })
                    .collect(),
                series: Vec::new(),
            }),
        }
    }

    /// The step whose window is open, if one is.
    pub(crate) fn window(&self) -> Option<usize> {
        match self.window.load(Ordering::Acquire) {
            NO_WINDOW => None,
            id => Some(id as usize - 1),
        }
    }

    /// The step whose load runs.
    fn load_step(&self) -> usize {
        (self.load_step.load(Ordering::Acquire) as usize).saturating_sub(1)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// A request starts; see [`end_request`](Self::end_request).
    fn begin_request(&self) -> u64 {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A request has ended; the last one after `stop` wakes the drain.
    fn end_request(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 && self.stopped() {
            self.drained.notify_one();
        }
    }

    /// Wakes the window's start on the first completed request.
    fn on_request_done(&self) {
        if !self.first_done.load(Ordering::Relaxed) && !self.first_done.swap(true, Ordering::AcqRel)
        {
            self.first_notify.notify_one();
        }
    }

    /// Request `id`, arrived at `t0` in step `step`'s window, is running.
    fn pending(&self, step: usize, id: u64, t0: Instant) {
        let mut st = self.lock();
        if let Some(s) = live(&mut st.steps, Some(step)) {
            s.pending.insert(id, t0);
        }
    }

    /// Records request `id` (arrived at `t0`, in the window of step `started` if any) that
    /// ended with `outcome` (in the window of step `ended` if any), and its tokens.
    fn record(
        &self,
        id: u64,
        t0: Instant,
        outcome: &Result<Timings, String>,
        started: Option<usize>,
        ended: Option<usize>,
        track: &mut request::Track,
    ) {
        let mut st = self.lock();
        let State { steps, series } = &mut *st;
        let current = track.window.map(|w| (w, track.window_tokens));
        for (step, tokens) in track.spilled.drain(..).chain(current) {
            if let Some(s) = live(steps, Some(step)) {
                s.stats.tokens += tokens;
            }
        }
        if let Some(s) = live(steps, started) {
            s.pending.remove(&id);
            s.stats.record_started(t0, outcome, &track.gaps);
            if let (Err(e), false) = (outcome, ended == started) {
                s.stats.record_error(e);
            }
        }
        if let Some(s) = live(steps, ended) {
            s.stats.record_ended(outcome);
        }
        merge_series(series, track);
    }

    /// An open loop's arrival in step `step`'s window; `dropped` if it was not sent.
    fn count_arrival(&self, step: usize, dropped: bool) {
        let mut st = self.lock();
        if let Some(s) = live(&mut st.steps, Some(step)) {
            s.stats.arrivals += 1;
            s.stats.dropped += u64::from(dropped);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Step `step`'s window, unless it was reported already (later records are dropped).
fn live(steps: &mut [Step], step: Option<usize>) -> Option<&mut Step> {
    steps.get_mut(step?).filter(|s| !s.reported)
}

/// Adds a request's tokens per bucket to the run's series.
fn merge_series(series: &mut Vec<u64>, track: &request::Track) {
    if track.buckets.is_empty() {
        return;
    }
    let Some(end) = track.first_bucket.checked_add(track.buckets.len()) else {
        return;
    };
    if series.len() < end {
        series.resize(end, 0);
    }
    for (i, tokens) in track.buckets.iter().enumerate() {
        series[track.first_bucket + i] += tokens;
    }
}
