//! Per-arm figures: computed per run, summarized as medians over repeats, printed and saved.

use serde::Serialize;

use crate::frontend::FrontendReport;
use crate::orchestrate::Run;

/// Every figure of one run (or the median of several), as the report shows it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// Successful requests per second in the window.
    pub requests_per_s: f64,
    /// Output tokens per second in the window.
    pub output_tokens_per_s: f64,
    /// Frontend CPU (user + system) per successful request, ms.
    pub frontend_cpu_ms_per_request: f64,
    /// Frontend CPU per output token, us.
    pub frontend_cpu_us_per_token: f64,
    /// Worker processes' CPU per output token, us.
    pub worker_cpu_us_per_token: f64,
    /// Packets sent on the host (loopback, both directions) per output token: TCP segments
    /// plus UDP datagrams.
    pub tx_segments_per_token: f64,
    /// The plane's connections at mid-window (see [`crate::arms::Conns`]).
    pub connections: f64,
    /// TTFT p50, ms.
    pub ttft_p50_ms: f64,
    /// TTFT p99, ms.
    pub ttft_p99_ms: f64,
    /// Request to prologue (stream established), p50, ms.
    pub prologue_p50_ms: f64,
    /// Request latency p99, ms.
    pub latency_p99_ms: f64,
    /// p99 over requests of each request's mean inter-token gap, ms.
    pub itl_mean_p99_ms: f64,
    /// Failed requests.
    pub errors: f64,
    /// Failed requests, percent of all finished in the window.
    pub error_pct: f64,
    /// Successful requests in the window.
    pub requests: f64,
}

impl Figures {
    /// The figures of one run.
    pub fn of(run: &Run) -> Self {
        let r: &FrontendReport = &run.report;
        let w = r.window_s.max(1e-9);
        let (req, tok) = (r.requests as f64, r.tokens as f64);
        let per = |x: f64, n: f64| if n > 0.0 { x / n } else { 0.0 };
        Self {
            requests_per_s: req / w,
            output_tokens_per_s: tok / w,
            frontend_cpu_ms_per_request: per(run.frontend_cpu_s * 1e3, req),
            frontend_cpu_us_per_token: per(run.frontend_cpu_s * 1e6, tok),
            worker_cpu_us_per_token: per(run.worker_cpu_s * 1e6, tok),
            tx_segments_per_token: per(run.segments as f64, tok),
            connections: run.connections as f64,
            ttft_p50_ms: r.ttft_p50_ms,
            ttft_p99_ms: r.ttft_p99_ms,
            prologue_p50_ms: r.prologue_p50_ms,
            latency_p99_ms: r.latency_p99_ms,
            itl_mean_p99_ms: r.itl_mean_p99_ms,
            errors: r.errors as f64,
            error_pct: per(100.0 * r.errors as f64, req + r.errors as f64),
            requests: req,
        }
    }

    /// The median of each figure over `runs`.
    pub fn median(runs: &[Self]) -> Self {
        let m = |f: fn(&Self) -> f64| median(runs.iter().map(f).collect());
        Self {
            requests_per_s: m(|f| f.requests_per_s),
            output_tokens_per_s: m(|f| f.output_tokens_per_s),
            frontend_cpu_ms_per_request: m(|f| f.frontend_cpu_ms_per_request),
            frontend_cpu_us_per_token: m(|f| f.frontend_cpu_us_per_token),
            worker_cpu_us_per_token: m(|f| f.worker_cpu_us_per_token),
            tx_segments_per_token: m(|f| f.tx_segments_per_token),
            connections: m(|f| f.connections),
            ttft_p50_ms: m(|f| f.ttft_p50_ms),
            ttft_p99_ms: m(|f| f.ttft_p99_ms),
            prologue_p50_ms: m(|f| f.prologue_p50_ms),
            latency_p99_ms: m(|f| f.latency_p99_ms),
            itl_mean_p99_ms: m(|f| f.itl_mean_p99_ms),
            errors: m(|f| f.errors),
            error_pct: m(|f| f.error_pct),
            requests: m(|f| f.requests),
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One arm's results.
#[derive(Debug, Clone, Serialize)]
pub struct ArmReport {
    /// The arm.
    pub arm: String,
    /// What the arm is.
    pub about: String,
    /// Medians over the repeats.
    #[serde(flatten)]
    pub median: Figures,
    /// Every repeat.
    pub runs: Vec<Figures>,
    /// Error messages seen (first few).
    pub error_samples: Vec<String>,
}

/// Prints the comparison table (medians).
pub fn print_table(arms: &[ArmReport]) {
    println!(
        "| arm | req/s | out tok/s | FE CPU ms/req | FE CPU us/tok | worker CPU us/tok | pkts/tok | conns | TTFT p50 ms | TTFT p99 ms | latency p99 ms | ITL mean p99 ms | errors |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for a in arms {
        let f = &a.median;
        println!(
            "| {} | {:.0} | {:.0} | {:.3} | {:.2} | {:.2} | {:.3} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} | {:.0} ({:.2}%) |",
            a.arm,
            f.requests_per_s,
            f.output_tokens_per_s,
            f.frontend_cpu_ms_per_request,
            f.frontend_cpu_us_per_token,
            f.worker_cpu_us_per_token,
            f.tx_segments_per_token,
            f.connections,
            f.ttft_p50_ms,
            f.ttft_p99_ms,
            f.latency_p99_ms,
            f.itl_mean_p99_ms,
            f.errors,
            f.error_pct,
        );
    }
}
