//! Per-arm figures: computed per run, summarized as medians over repeats, printed and saved.

use serde::Serialize;

use crate::engine_stats::EngineFigures;
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
    /// Frontend CPU over the window, cores.
    pub frontend_cores: f64,
    /// Worker processes' CPU over the window, cores.
    pub worker_cores: f64,
    /// Frontend threads runnable but waiting for a CPU, cores (time over the window).
    pub frontend_wait_cores: f64,
    /// Worker threads runnable but waiting for a CPU, cores.
    pub worker_wait_cores: f64,
    /// Frontend thread wake-ups (voluntary context switches) per output token.
    pub frontend_wakeups_per_token: f64,
    /// Worker thread wake-ups per output token.
    pub worker_wakeups_per_token: f64,
    /// Packets sent (both directions) per output token: TCP segments plus UDP datagrams.
    pub tx_segments_per_token: f64,
    /// Of them, the packets the frontends sent (ACKs, credit) per output token, on the netns
    /// topology (0 on loopback).
    pub frontend_tx_segments_per_token: f64,
    /// Machine-wide soft-interrupt time over the window, cores (the whole machine: other
    /// load counts too).
    pub softirq_cores: f64,
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
    /// p99 of every gap between consecutive items of a stream, ms.
    pub chunk_gap_p99_ms: f64,
    /// Failed requests.
    pub errors: f64,
    /// Failed requests, percent of all finished in the window.
    pub error_pct: f64,
    /// Successful requests in the window.
    pub requests: f64,
    /// Offered load, requests per second (open loop; 0 for a closed loop).
    pub offered_rate: f64,
    /// Arrivals in the window that were dropped or had not ended by the report (open loop).
    pub unserved: f64,
    /// The mock engines' passes and arrivals.
    pub engines: EngineFigures,
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
            frontend_cores: run.frontend_cpu_s / w,
            worker_cores: run.worker_cpu_s / w,
            frontend_wait_cores: run.frontend_wait_s / w,
            worker_wait_cores: run.worker_wait_s / w,
            frontend_wakeups_per_token: per(run.frontend_wakeups as f64, tok),
            worker_wakeups_per_token: per(run.worker_wakeups as f64, tok),
            tx_segments_per_token: per(run.segments as f64, tok),
            frontend_tx_segments_per_token: per(run.frontend_segments as f64, tok),
            softirq_cores: run.softirq_s / w,
            connections: run.connections as f64,
            ttft_p50_ms: r.ttft_p50_ms,
            ttft_p99_ms: r.ttft_p99_ms,
            prologue_p50_ms: r.prologue_p50_ms,
            latency_p99_ms: r.latency_p99_ms,
            itl_mean_p99_ms: r.itl_mean_p99_ms,
            chunk_gap_p99_ms: r.chunk_gap_p99_ms,
            errors: r.errors as f64,
            error_pct: per(100.0 * r.errors as f64, req + r.errors as f64),
            requests: req,
            offered_rate: r.offered_rate,
            unserved: (r.dropped + r.late) as f64,
            engines: run.engines.figures(w),
        }
    }

    /// The median of each figure over `runs`.
    pub fn median(runs: &[Self]) -> Self {
        let m = |f: fn(&Self) -> f64| median(runs.iter().map(f).collect());
        let engines: Vec<EngineFigures> = runs.iter().map(|r| r.engines).collect();
        Self {
            requests_per_s: m(|f| f.requests_per_s),
            output_tokens_per_s: m(|f| f.output_tokens_per_s),
            frontend_cpu_ms_per_request: m(|f| f.frontend_cpu_ms_per_request),
            frontend_cpu_us_per_token: m(|f| f.frontend_cpu_us_per_token),
            worker_cpu_us_per_token: m(|f| f.worker_cpu_us_per_token),
            frontend_cores: m(|f| f.frontend_cores),
            worker_cores: m(|f| f.worker_cores),
            frontend_wait_cores: m(|f| f.frontend_wait_cores),
            worker_wait_cores: m(|f| f.worker_wait_cores),
            frontend_wakeups_per_token: m(|f| f.frontend_wakeups_per_token),
            worker_wakeups_per_token: m(|f| f.worker_wakeups_per_token),
            tx_segments_per_token: m(|f| f.tx_segments_per_token),
            frontend_tx_segments_per_token: m(|f| f.frontend_tx_segments_per_token),
            softirq_cores: m(|f| f.softirq_cores),
            connections: m(|f| f.connections),
            ttft_p50_ms: m(|f| f.ttft_p50_ms),
            ttft_p99_ms: m(|f| f.ttft_p99_ms),
            prologue_p50_ms: m(|f| f.prologue_p50_ms),
            latency_p99_ms: m(|f| f.latency_p99_ms),
            itl_mean_p99_ms: m(|f| f.itl_mean_p99_ms),
            chunk_gap_p99_ms: m(|f| f.chunk_gap_p99_ms),
            errors: m(|f| f.errors),
            error_pct: m(|f| f.error_pct),
            requests: m(|f| f.requests),
            offered_rate: m(|f| f.offered_rate),
            unserved: m(|f| f.unserved),
            engines: EngineFigures::median(&engines),
        }
    }
}

/// The median of `v` (0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
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
    /// What limits it: frontend CPU, worker CPU, both, or the fleet.
    pub limit: String,
    /// Every repeat.
    pub runs: Vec<Figures>,
    /// Error messages seen (first few).
    pub error_samples: Vec<String>,
}

/// The CPU the frontends and the workers may use, cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// The frontends' share (1 when pinned to one CPU).
    pub frontend: f64,
    /// The workers' share.
    pub worker: f64,
    /// The machine's.
    pub total: f64,
}

/// Share of a capacity above which it counts as the limit.
const SATURATED: f64 = 0.9;

/// What limits an arm with figures `f` on `cap`: the frontend's CPU, the workers' CPU, the
/// machine's CPU (both sides together), or none of them, so the mock fleet's timeline. A side
/// counts as busy while it runs or waits on the run queue for a CPU (another side, or other
/// load on the machine, took it).
pub fn limit(f: &Figures, cap: Capacity) -> String {
    let fe = f.frontend_cores + f.frontend_wait_cores;
    let wk = f.worker_cores + f.worker_wait_cores;
    let what = if fe >= SATURATED * cap.frontend {
        "frontend CPU"
    } else if wk >= SATURATED * cap.worker {
        "worker CPU"
    } else if fe + wk >= SATURATED * cap.total {
        "CPU (both sides)"
    } else {
        "fleet"
    };
    format!(
        "{what} (FE {:.2} + workers {:.2} cores, run-queue waits {:.2} + {:.2})",
        f.frontend_cores, f.worker_cores, f.frontend_wait_cores, f.worker_wait_cores
    )
}

/// Prints the comparison table (medians), the engines' table and the limits line.
pub fn print_table(arms: &[ArmReport]) {
    println!(
        "| arm | req/s | out tok/s | FE CPU us/tok | worker CPU us/tok | FE wakes/tok | worker wakes/tok | pkts/tok | conns | TTFT p50 ms | TTFT p99 ms | latency p99 ms | ITL mean p99 ms | chunk gap p99 ms | errors |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for a in arms {
        let f = &a.median;
        println!(
            "| {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.0} ({:.2}%) |",
            a.arm,
            f.requests_per_s,
            f.output_tokens_per_s,
            f.frontend_cpu_us_per_token,
            f.worker_cpu_us_per_token,
            f.frontend_wakeups_per_token,
            f.worker_wakeups_per_token,
            f.tx_segments_per_token,
            f.connections,
            f.ttft_p50_ms,
            f.ttft_p99_ms,
            f.latency_p99_ms,
            f.itl_mean_p99_ms,
            f.chunk_gap_p99_ms,
            f.errors,
            f.error_pct,
        );
    }
    println!();
    print_engines(arms);
    print_limits(arms);
}

/// The engines' side of the closed loop: how each plane's timing fed back into prefill
/// batching.
fn print_engines(arms: &[ArmReport]) {
    println!(
        "| arm | prefill passes/s | new req/prefill | decode-only passes/s | prefill time % | pass lag ms | arrival gap CV | clustered arrivals % | each run: out tok/s (new req/prefill) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for a in arms {
        let e = &a.median.engines;
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {:.1} | {:.2} | {:.2} | {:.1} | {} |",
            a.arm,
            e.prefill_passes_per_s,
            e.new_per_prefill,
            e.decode_passes_per_s,
            e.prefill_time_pct,
            e.pass_lag_ms,
            e.arrival_gap_cv,
            e.clustered_arrivals_pct,
            each_run(&a.runs),
        );
    }
    println!();
}

/// Every repeat's tokens/s beside its new requests per prefill pass: a closed loop settles
/// into a spread or a clustered mode per run, and a median of two hides which.
fn each_run(runs: &[Figures]) -> String {
    let runs: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "{:.0}k ({:.2})",
                r.output_tokens_per_s / 1000.0,
                r.engines.new_per_prefill
            )
        })
        .collect();
    runs.join(", ")
}

/// One line: what limits each arm.
pub fn print_limits(arms: &[ArmReport]) {
    let limits: Vec<String> = arms
        .iter()
        .map(|a| format!("{}: {}", a.arm, a.limit))
        .collect();
    println!("Limits: {}.", limits.join("; "));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cores(frontend_cores: f64, worker_cores: f64) -> Figures {
        Figures {
            frontend_cores,
            worker_cores,
            ..Figures::default()
        }
    }

    #[test]
    fn the_limit_is_the_side_whose_cpu_is_used_up_else_the_fleet() {
        let pinned = Capacity {
            frontend: 1.0,
            worker: 1.0,
            total: 2.0,
        };
        assert!(limit(&cores(0.97, 0.5), pinned).starts_with("frontend CPU"));
        assert!(limit(&cores(0.5, 0.95), pinned).starts_with("worker CPU"));
        assert!(limit(&cores(0.3, 0.4), pinned).starts_with("fleet"));
        let shared = Capacity {
            frontend: 2.0,
            worker: 2.0,
            total: 2.0,
        };
        assert!(limit(&cores(1.1, 0.8), shared).starts_with("CPU (both sides)"));
        assert_eq!(
            limit(&cores(0.25, 0.5), shared),
            "fleet (FE 0.25 + workers 0.50 cores, run-queue waits 0.00 + 0.00)"
        );
        let starved = Figures {
            frontend_wait_cores: 0.6,
            ..cores(0.35, 0.2)
        };
        assert!(limit(&starved, pinned).starts_with("frontend CPU"));
    }

    #[test]
    fn each_run_shows_its_tokens_per_second_and_new_requests_per_prefill() {
        let run = |tok: f64, new: f64| {
            let mut f = Figures {
                output_tokens_per_s: tok,
                ..Figures::default()
            };
            f.engines.new_per_prefill = new;
            f
        };
        let runs = [run(236_077.0, 1.17), run(254_475.0, 1.654)];
        assert_eq!(each_run(&runs), "236k (1.17), 254k (1.65)");
        assert_eq!(each_run(&[]), "");
    }

    #[test]
    fn medians_of_even_and_odd_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
