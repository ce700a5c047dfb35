//! What the mock engines of one worker process did: forward passes, how many new requests
//! each prefill pass admitted, how much of the engines' modelled time went to prefill, how late
//! passes ran behind their timeline, and how spread out requests arrived at each engine.
//!
//! These are the closed loop's feedback, measured: a plane that delivers ends (and so sends
//! the next requests) in clumps makes fewer, bigger prefill passes, and the mocker charges a
//! fixed cost per prefill pass. The engines count; the orchestrator asks for a snapshot at the
//! window's edges (`SAMPLE` on the worker's stdin, answered by
//! [`WorkerLine::Engines`](crate::protocol::WorkerLine::Engines)) and reports the difference.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Inter-arrival gaps below this count as clustered (an arrival right behind another).
pub const CLUSTERED_GAP: Duration = Duration::from_micros(100);
/// Gaps are clamped to this before squaring, so the sum of squares stays far from overflow.
const MAX_GAP: Duration = Duration::from_secs(1);

/// Counters shared by the engines of one process (each engine adds to them from its own task).
#[derive(Debug)]
pub struct EngineCounters {
    epoch: Instant,
    passes: AtomicU64,
    prefill_passes: AtomicU64,
    admitted: AtomicU64,
    model_ns: AtomicU64,
    prefill_ns: AtomicU64,
    lag_ns: AtomicU64,
    arrivals: AtomicU64,
    gaps: AtomicU64,
    gap_us: AtomicU64,
    gap_us_sq: AtomicU64,
    clustered: AtomicU64,
    /// Per engine: when its last request arrived, ns after `epoch` plus one (0: none yet).
    last_arrival: Box<[AtomicU64]>,
}

/// A snapshot of [`EngineCounters`], or the difference of two.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Forward passes.
    pub passes: u64,
    /// Passes that admitted new requests (and so paid a prefill).
    pub prefill_passes: u64,
    /// Requests admitted by those passes.
    pub admitted: u64,
    /// Modelled engine time of every pass (decode plus prefill), ns.
    pub model_ns: u64,
    /// Of which prefill, ns.
    pub prefill_ns: u64,
    /// How far passes ran behind their timeline in all (timer granularity, or a starved CPU), ns.
    pub lag_ns: u64,
    /// Requests that reached an engine (stream open, queued for admission).
    pub arrivals: u64,
    /// Inter-arrival gaps measured (per engine: every arrival after its first).
    pub gaps: u64,
    /// Sum of those gaps, us.
    pub gap_us: u64,
    /// Sum of their squares, us^2 (each gap clamped to 1 s).
    pub gap_us_sq: u64,
    /// Gaps shorter than [`CLUSTERED_GAP`].
    pub clustered: u64,
}

/// What the engine counters say about one window, as the report shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EngineFigures {
    /// Prefill passes per second, all engines.
    pub prefill_passes_per_s: f64,
    /// New requests per prefill pass.
    pub new_per_prefill: f64,
    /// Decode-only passes per second (passes that admitted nobody), all engines.
    pub decode_passes_per_s: f64,
    /// Share of the engines' modelled time spent in prefill, percent.
    pub prefill_time_pct: f64,
    /// Mean lag of a pass behind its timeline, ms.
    pub pass_lag_ms: f64,
    /// Coefficient of variation of the gaps between arrivals at an engine (Poisson: 1;
    /// above 1: clumped; below 1: evenly spread).
    pub arrival_gap_cv: f64,
    /// Share of arrivals within [`CLUSTERED_GAP`] of the previous one at their engine, percent.
    pub clustered_arrivals_pct: f64,
}

impl EngineCounters {
    /// Counters for `engines` engines, all zero.
    pub fn new(engines: usize) -> Self {
        Self {
            epoch: Instant::now(),
            passes: AtomicU64::new(0),
            prefill_passes: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            model_ns: AtomicU64::new(0),
            prefill_ns: AtomicU64::new(0),
            lag_ns: AtomicU64::new(0),
            arrivals: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            gap_us: AtomicU64::new(0),
            gap_us_sq: AtomicU64::new(0),
            clustered: AtomicU64::new(0),
            last_arrival: (0..engines.max(1)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A request reached engine `engine` (an index below the count given to [`new`](Self::new);
    /// others are counted as arrivals without a gap).
    pub fn on_arrival(&self, engine: usize) {
        add(&self.arrivals, 1);
        let now = ns(self.epoch.elapsed()).saturating_add(1);
        let Some(last) = self.last_arrival.get(engine) else {
            return;
        };
        let before = last.swap(now, Ordering::Relaxed);
        if before == 0 {
            return;
        }
        let gap = Duration::from_nanos(now.saturating_sub(before)).min(MAX_GAP);
        let us = u64::try_from(gap.as_micros()).unwrap_or(u64::MAX);
        add(&self.gaps, 1);
        add(&self.gap_us, us);
        add(&self.gap_us_sq, us.saturating_mul(us));
        if gap < CLUSTERED_GAP {
            add(&self.clustered, 1);
        }
    }

    /// One forward pass ran: it admitted `admitted` requests, modelled `model` of engine time
    /// of which `prefill` prefill, and began `lag` after its place on the timeline.
    pub fn on_pass(&self, admitted: usize, model: Duration, prefill: Duration, lag: Duration) {
        add(&self.passes, 1);
        if admitted > 0 {
            add(&self.prefill_passes, 1);
            add(&self.admitted, u64::try_from(admitted).unwrap_or(u64::MAX));
        }
        add(&self.model_ns, ns(model));
        add(&self.prefill_ns, ns(prefill));
        add(&self.lag_ns, ns(lag));
    }

    /// The counters now.
    pub fn snapshot(&self) -> EngineStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EngineStats {
            passes: get(&self.passes),
            prefill_passes: get(&self.prefill_passes),
            admitted: get(&self.admitted),
            model_ns: get(&self.model_ns),
            prefill_ns: get(&self.prefill_ns),
            lag_ns: get(&self.lag_ns),
            arrivals: get(&self.arrivals),
            gaps: get(&self.gaps),
            gap_us: get(&self.gap_us),
            gap_us_sq: get(&self.gap_us_sq),
            clustered: get(&self.clustered),
        }
    }
}

impl EngineStats {
    /// What was counted between `earlier` and `self`.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        Self {
            passes: d(self.passes, earlier.passes),
            prefill_passes: d(self.prefill_passes, earlier.prefill_passes),
            admitted: d(self.admitted, earlier.admitted),
            model_ns: d(self.model_ns, earlier.model_ns),
            prefill_ns: d(self.prefill_ns, earlier.prefill_ns),
            lag_ns: d(self.lag_ns, earlier.lag_ns),
            arrivals: d(self.arrivals, earlier.arrivals),
            gaps: d(self.gaps, earlier.gaps),
            gap_us: d(self.gap_us, earlier.gap_us),
            gap_us_sq: d(self.gap_us_sq, earlier.gap_us_sq),
            clustered: d(self.clustered, earlier.clustered),
        }
    }

    /// Both counts together (the engines of several processes).
    #[must_use]
    pub fn plus(&self, other: &Self) -> Self {
        let s = |a: u64, b: u64| a.saturating_add(b);
        Self {
            passes: s(self.passes, other.passes),
            prefill_passes: s(self.prefill_passes, other.prefill_passes),
            admitted: s(self.admitted, other.admitted),
            model_ns: s(self.model_ns, other.model_ns),
            prefill_ns: s(self.prefill_ns, other.prefill_ns),
            lag_ns: s(self.lag_ns, other.lag_ns),
            arrivals: s(self.arrivals, other.arrivals),
            gaps: s(self.gaps, other.gaps),
            gap_us: s(self.gap_us, other.gap_us),
            gap_us_sq: s(self.gap_us_sq, other.gap_us_sq),
            clustered: s(self.clustered, other.clustered),
        }
    }

    /// The figures of a window of `window_s` seconds.
    pub fn figures(&self, window_s: f64) -> EngineFigures {
        let per = |x: f64, n: f64| if n > 0.0 { x / n } else { 0.0 };
        let w = window_s.max(1e-9);
        let gaps = self.gaps as f64;
        let mean = per(self.gap_us as f64, gaps);
        let variance = (per(self.gap_us_sq as f64, gaps) - mean * mean).max(0.0);
        EngineFigures {
            prefill_passes_per_s: self.prefill_passes as f64 / w,
            new_per_prefill: per(self.admitted as f64, self.prefill_passes as f64),
            decode_passes_per_s: self.passes.saturating_sub(self.prefill_passes) as f64 / w,
            prefill_time_pct: per(100.0 * self.prefill_ns as f64, self.model_ns as f64),
            pass_lag_ms: per(self.lag_ns as f64 / 1e6, self.passes as f64),
            arrival_gap_cv: per(variance.sqrt(), mean),
            clustered_arrivals_pct: per(100.0 * self.clustered as f64, gaps),
        }
    }
}

impl EngineFigures {
    /// The median of each figure over `runs`.
    pub fn median(runs: &[Self]) -> Self {
        let m = |f: fn(&Self) -> f64| crate::report::median(runs.iter().map(f).collect());
        Self {
            prefill_passes_per_s: m(|f| f.prefill_passes_per_s),
            new_per_prefill: m(|f| f.new_per_prefill),
            decode_passes_per_s: m(|f| f.decode_passes_per_s),
            prefill_time_pct: m(|f| f.prefill_time_pct),
            pass_lag_ms: m(|f| f.pass_lag_ms),
            arrival_gap_cv: m(|f| f.arrival_gap_cv),
            clustered_arrivals_pct: m(|f| f.clustered_arrivals_pct),
        }
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_batching_is_counted_per_pass() {
        let c = EngineCounters::new(1);
        let ms = Duration::from_millis;
        c.on_pass(4, ms(5), ms(4), ms(1));
        c.on_pass(0, ms(1), Duration::ZERO, Duration::ZERO);
        c.on_pass(2, ms(4), ms(3), Duration::ZERO);
        let f = c.snapshot().figures(1.0);
        assert_eq!(f.prefill_passes_per_s, 2.0);
        assert_eq!(f.new_per_prefill, 3.0);
        assert_eq!(f.decode_passes_per_s, 1.0);
        assert!((f.prefill_time_pct - 70.0).abs() < 1e-9, "{f:?}");
        assert!((f.pass_lag_ms - 1.0 / 3.0).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn a_window_counts_only_what_happened_in_it() {
        let c = EngineCounters::new(2);
        c.on_pass(
            3,
            Duration::from_millis(2),
            Duration::from_millis(1),
            Duration::ZERO,
        );
        let before = c.snapshot();
        c.on_pass(
            1,
            Duration::from_millis(2),
            Duration::from_millis(1),
            Duration::ZERO,
        );
        let window = c.snapshot().since(&before);
        assert_eq!(
            (window.passes, window.prefill_passes, window.admitted),
            (1, 1, 1)
        );
        assert_eq!(window.plus(&window).admitted, 2);
    }

    #[test]
    fn arrivals_give_one_gap_per_engine_and_spread_is_the_cv_of_the_gaps() {
        let c = EngineCounters::new(2);
        for _ in 0..10 {
            c.on_arrival(0);
        }
        // An unknown engine counts as an arrival without a gap.
        c.on_arrival(7);
        let s = c.snapshot();
        assert_eq!((s.arrivals, s.gaps), (11, 9));
        let even = EngineStats {
            gaps: 4,
            gap_us: 4_000,
            gap_us_sq: 4_000_000,
            ..EngineStats::default()
        };
        assert_eq!(even.figures(1.0).arrival_gap_cv, 0.0);
        let clumped = EngineStats {
            gaps: 2,
            gap_us: 2_000,
            gap_us_sq: 2_000_000,
            clustered: 1,
            ..EngineStats::default()
        };
        assert_eq!(clumped.figures(1.0).clustered_arrivals_pct, 50.0);
        let spread = EngineStats {
            gaps: 2,
            gap_us: 2_000,
            gap_us_sq: 4_000_000,
            ..EngineStats::default()
        };
        assert!((spread.figures(1.0).arrival_gap_cv - 1.0).abs() < 1e-9);
    }
}
