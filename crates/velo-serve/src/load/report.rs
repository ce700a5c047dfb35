//! What one load run measured, from the client's side, and how it prints.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Client-side figures of one run (times in ms).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// The run's label (the plane).
    pub label: String,
    /// `closed` or `open`.
    pub mode: String,
    /// Users (closed) or arrivals per second (open).
    pub load: f64,
    /// Requests that started in the window and completed with `[DONE]`.
    pub requests_ok: u64,
    /// HTTP errors: non-200 answers, error events, broken or truncated streams, connect
    /// failures.
    pub http_errors: u64,
    /// Of those, 503s (overload).
    pub http_503: u64,
    /// Open-loop arrivals not sent because `--max-outstanding` requests were outstanding.
    pub dropped_arrivals: u64,
    /// Output tokens received per second in the window.
    pub output_tokens_per_s: f64,
    /// Time to first token.
    pub ttft_p50_ms: f64,
    /// Time to first token.
    pub ttft_p99_ms: f64,
    /// Gap between consecutive chunks, every gap of every request.
    pub chunk_gap_p50_ms: f64,
    /// Gap between consecutive chunks, every gap of every request.
    pub chunk_gap_p99_ms: f64,
    /// p99 over requests of each request's mean inter-token latency.
    pub itl_mean_p99_ms: f64,
    /// Frontend CPU per output token, all threads, in µs.
    pub frontend_cpu_us_per_token: f64,
    /// Of which the HTTP side (everything but the plane's threads).
    pub http_cpu_us_per_token: f64,
    /// Of which the response plane's threads (with `--plane-thread`).
    pub plane_cpu_us_per_token: f64,
    /// Frontend CPU cores used on average in the window.
    pub frontend_cores: f64,
}

/// Histograms of microseconds.
#[derive(Debug)]
pub struct Latencies {
    /// Time to first token.
    pub ttft: Histogram<u64>,
    /// Chunk gaps.
    pub gap: Histogram<u64>,
    /// Per-request mean ITL.
    pub itl_mean: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        let h = || Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds");
        Self {
            ttft: h(),
            gap: h(),
            itl_mean: h(),
        }
    }
}

/// A percentile of a histogram of µs, in ms.
pub fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    h.value_at_quantile(q) as f64 / 1000.0
}

/// The table's header.
pub const HEADER: &str = "| plane | load | ok req | HTTP errors (503s) | dropped arrivals | out tok/s | TTFT p50 ms | TTFT p99 ms | chunk gap p50 ms | chunk gap p99 ms | ITL mean p99 ms | FE CPU us/tok | HTTP us/tok | plane us/tok |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

impl Report {
    /// One table row.
    pub fn row(&self) -> String {
        let load = match self.mode.as_str() {
            "open" => format!("open {:.0} req/s", self.load),
            _ => format!("closed {:.0}", self.load),
        };
        format!(
            "| {} | {load} | {} | {} ({}) | {} | {:.0} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} |",
            self.label,
            self.requests_ok,
            self.http_errors,
            self.http_503,
            self.dropped_arrivals,
            self.output_tokens_per_s,
            self.ttft_p50_ms,
            self.ttft_p99_ms,
            self.chunk_gap_p50_ms,
            self.chunk_gap_p99_ms,
            self.itl_mean_p99_ms,
            self.frontend_cpu_us_per_token,
            self.http_cpu_us_per_token,
            self.plane_cpu_us_per_token,
        )
    }
}
