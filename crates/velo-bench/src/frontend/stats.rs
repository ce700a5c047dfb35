//! What a frontend measures over one window: counts, latency histograms, and the report it
//! says as [`FrontendLine::Result`](crate::protocol::FrontendLine::Result).
//!
//! The report carries its histograms (recorded values and counts), so the reports of several
//! frontends of one run merge into one whose percentiles are those of every request.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// What the frontend measured over one window.
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
    /// The load step (0 for a closed loop; the index of the rate for an open loop).
    #[serde(default)]
    pub step: u32,
    /// Offered load, requests per second (open loop; 0 for a closed loop).
    #[serde(default)]
    pub offered_rate: f64,
    /// Requests that arrived inside the window (open loop: the generator's arrivals).
    #[serde(default)]
    pub arrivals: u64,
    /// Arrivals inside the window that were not sent because too many requests were in flight
    /// (open loop): the frontend could not keep up.
    #[serde(default)]
    pub dropped: u64,
    /// Requests that arrived inside the window and had not ended when the report was made (a
    /// drain after the window); each is in the TTFT histogram with its wait so far, at least.
    #[serde(default)]
    pub late: u64,
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
    /// p50 of every gap between two consecutive items of a stream, ms.
    #[serde(default)]
    pub chunk_gap_p50_ms: f64,
    /// p99 of every gap between two consecutive items of a stream, ms.
    #[serde(default)]
    pub chunk_gap_p99_ms: f64,
    /// TTFT CDF: (ms, fraction) points.
    pub ttft_cdf: Vec<(f64, f64)>,
    /// Per-request mean ITL CDF: (ms, fraction) points.
    pub itl_cdf: Vec<(f64, f64)>,
    /// Output tokens per 100 ms bucket since the load started.
    pub tokens_series: Vec<u64>,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    /// The histograms the percentiles come from, for merging.
    #[serde(default)]
    pub hists: Hists,
}

/// Recorded values (us) and their counts, per histogram.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hists {
    /// Time to first token.
    pub ttft: Vec<(u64, u64)>,
    /// Time to the prologue.
    pub prologue: Vec<(u64, u64)>,
    /// Request latency.
    pub latency: Vec<(u64, u64)>,
    /// Per-request mean inter-token gap.
    pub itl: Vec<(u64, u64)>,
    /// Every gap between consecutive items.
    pub chunk_gap: Vec<(u64, u64)>,
}

/// Error messages kept per report.
const ERROR_SAMPLES: usize = 5;

/// One window's counts and histograms, as they are being recorded.
pub(crate) struct Stats {
    pub(crate) ttft: Histogram<u64>,
    pub(crate) prologue: Histogram<u64>,
    pub(crate) latency: Histogram<u64>,
    pub(crate) itl: Histogram<u64>,
    pub(crate) chunk_gap: Histogram<u64>,
    pub(crate) requests: u64,
    pub(crate) errors: u64,
    pub(crate) tokens: u64,
    pub(crate) arrivals: u64,
    pub(crate) dropped: u64,
    pub(crate) error_samples: Vec<String>,
    /// The window's length once it closed, seconds.
    pub(crate) window_s: f64,
}

/// When one request's stream reached each point, and the tokens it carried.
pub(crate) struct Timings {
    pub(crate) established: tokio::time::Instant,
    pub(crate) first: tokio::time::Instant,
    pub(crate) last: tokio::time::Instant,
    pub(crate) tokens: u64,
}

impl Stats {
    pub(crate) fn new() -> Self {
        Self {
            ttft: histogram(),
            prologue: histogram(),
            latency: histogram(),
            itl: histogram(),
            chunk_gap: histogram(),
            requests: 0,
            errors: 0,
            tokens: 0,
            arrivals: 0,
            dropped: 0,
            error_samples: Vec::new(),
            window_s: 0.0,
        }
    }

    /// A request that started in this window (at `t0`) and ended with `outcome`; `gaps` are
    /// its gaps between consecutive items, us.
    pub(crate) fn record_started(
        &mut self,
        t0: tokio::time::Instant,
        outcome: &Result<Timings, String>,
        gaps: &[u32],
    ) {
        let Ok(t) = outcome else { return };
        let _ = self.ttft.record(us(t.first - t0));
        let _ = self.prologue.record(us(t.established - t0));
        let _ = self.latency.record(us(t.last - t0));
        if t.tokens > 1 {
            let n = u32::try_from(t.tokens - 1).unwrap_or(u32::MAX);
            let _ = self.itl.record(us((t.last - t.first) / n));
        }
        for g in gaps {
            let _ = self.chunk_gap.record(u64::from(*g).max(1));
        }
    }

    /// A request that ended in this window with `outcome`; counted as a request or an error.
    pub(crate) fn record_ended(&mut self, outcome: &Result<Timings, String>) {
        match outcome {
            Ok(_) => self.requests += 1,
            Err(e) => self.record_error(e),
        }
    }

    /// A request that started in this window and failed after it (counted once).
    pub(crate) fn record_error(&mut self, e: &str) {
        self.errors += 1;
        if self.error_samples.len() < ERROR_SAMPLES {
            self.error_samples.push(e.to_owned());
        }
    }

    /// A request of this window that had not ended at the report, `waited` after it arrived.
    pub(crate) fn record_late(&mut self, waited: Duration) {
        let _ = self.ttft.record(us(waited));
    }

    /// The report of a window of `window_s` seconds with `late` requests still running.
    pub(crate) fn report(&self, window_s: f64, late: u64, series: Vec<u64>) -> FrontendReport {
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
            step: 0,
            offered_rate: 0.0,
            arrivals: self.arrivals,
            dropped: self.dropped,
            late,
            ttft_p50_ms: ms(&self.ttft, 0.5),
            ttft_p99_ms: ms(&self.ttft, 0.99),
            prologue_p50_ms: ms(&self.prologue, 0.5),
            prologue_p99_ms: ms(&self.prologue, 0.99),
            latency_p50_ms: ms(&self.latency, 0.5),
            latency_p99_ms: ms(&self.latency, 0.99),
            itl_mean_p50_ms: ms(&self.itl, 0.5),
            itl_mean_p99_ms: ms(&self.itl, 0.99),
            chunk_gap_p50_ms: ms(&self.chunk_gap, 0.5),
            chunk_gap_p99_ms: ms(&self.chunk_gap, 0.99),
            ttft_cdf: cdf(&self.ttft),
            itl_cdf: cdf(&self.itl),
            tokens_series: series,
            error_samples: self.error_samples.clone(),
            hists: Hists {
                ttft: recorded(&self.ttft),
                prologue: recorded(&self.prologue),
                latency: recorded(&self.latency),
                itl: recorded(&self.itl),
                chunk_gap: recorded(&self.chunk_gap),
            },
        }
    }
}

impl FrontendReport {
    /// One report for the same window of several frontends: counts and series add up,
    /// percentiles come from the merged histograms, the window is the longest.
    pub fn merge(reports: &[Self]) -> Self {
        let Some(first) = reports.first() else {
            return Self::default();
        };
        if reports.len() == 1 {
            return first.clone();
        }
        let mut st = Stats::new();
        let mut series: Vec<u64> = Vec::new();
        let (mut late, mut window_s) = (0, 0.0_f64);
        for r in reports {
            st.requests += r.requests;
            st.errors += r.errors;
            st.tokens += r.tokens;
            st.arrivals += r.arrivals;
            st.dropped += r.dropped;
            late += r.late;
            window_s = window_s.max(r.window_s);
            for e in &r.error_samples {
                if st.error_samples.len() < ERROR_SAMPLES {
                    st.error_samples.push(e.clone());
                }
            }
            add_recorded(&mut st.ttft, &r.hists.ttft);
            add_recorded(&mut st.prologue, &r.hists.prologue);
            add_recorded(&mut st.latency, &r.hists.latency);
            add_recorded(&mut st.itl, &r.hists.itl);
            add_recorded(&mut st.chunk_gap, &r.hists.chunk_gap);
            if series.len() < r.tokens_series.len() {
                series.resize(r.tokens_series.len(), 0);
            }
            for (a, b) in series.iter_mut().zip(&r.tokens_series) {
                *a += b;
            }
        }
        let offered_rate = reports.iter().map(|r| r.offered_rate).sum();
        Self {
            step: first.step,
            offered_rate,
            ..st.report(window_s, late, series)
        }
    }
}

/// A histogram of microseconds from 1 us to 10 minutes, 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds")
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn recorded(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

fn add_recorded(h: &mut Histogram<u64>, values: &[(u64, u64)]) {
    for (value, count) in values {
        let _ = h.record_n(*value, *count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_of(ttft_us: &[u64], tokens: u64) -> FrontendReport {
        let mut st = Stats::new();
        for v in ttft_us {
            st.ttft.record(*v).unwrap();
        }
        st.tokens = tokens;
        st.requests = ttft_us.len() as u64;
        st.report(2.0, 0, vec![tokens])
    }

    #[test]
    fn merged_reports_add_counts_and_take_percentiles_over_every_request() {
        let fast = report_of(&[1_000; 99], 990);
        let slow = report_of(&[100_000; 99], 990);
        let both = FrontendReport::merge(&[fast.clone(), slow]);
        assert_eq!((both.requests, both.tokens), (198, 1980));
        assert_eq!(both.tokens_series, vec![1980]);
        assert!(
            (fast.ttft_p99_ms - 1.0).abs() < 0.01,
            "{}",
            fast.ttft_p99_ms
        );
        assert!(
            (both.ttft_p50_ms - 1.0).abs() < 0.01,
            "{}",
            both.ttft_p50_ms
        );
        assert!(
            (both.ttft_p99_ms - 100.0).abs() < 0.1,
            "{}",
            both.ttft_p99_ms
        );
    }

    #[test]
    fn a_single_report_merges_to_itself_and_none_to_an_empty_one() {
        let one = report_of(&[5_000, 7_000], 10);
        assert_eq!(FrontendReport::merge(std::slice::from_ref(&one)), one);
        assert_eq!(FrontendReport::merge(&[]), FrontendReport::default());
    }

    #[test]
    fn late_requests_push_the_ttft_tail_out() {
        let mut st = Stats::new();
        for _ in 0..98 {
            st.ttft.record(1_000).unwrap();
        }
        st.record_late(Duration::from_secs(2));
        st.record_late(Duration::from_secs(2));
        let r = st.report(1.0, 2, Vec::new());
        assert_eq!(r.late, 2);
        assert!(r.ttft_p99_ms >= 2_000.0, "{}", r.ttft_p99_ms);
    }
}
