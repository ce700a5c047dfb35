//! The soak's end-of-run oracle: every stream ended exactly once, none outlived its deadline,
//! every stream no fault touched ended as its fate says, nothing is left pending or active,
//! RSS stayed flat after the warm-up, and shutdown was clean. Prints (and writes) a summary.

use std::sync::atomic::{AtomicU64, Ordering};

use runtime_glue::ResponseService;

use super::{Counts, MAX_RSS_GROWTH, Opts, STREAM_DEADLINE, faults};

/// What was left when the load stopped.
struct Leftovers {
    pending: usize,
    active: u64,
    shutdown: &'static str,
}

/// Checks the run; prints the summary and writes it to `--summary`. Whether every check passed.
pub(crate) async fn judge(
    service: &ResponseService,
    counts: &Counts,
    samples: &[(f64, u64)],
    fault_counts: Option<[u64; 4]>,
    opts: &Opts,
) -> bool {
    let pending = service
        .frontend()
        .map_or(0, response_plane::FrontendPlane::pending);
    let active = service
        .frontend()
        .map(response_plane::FrontendPlane::stats)
        .unwrap_or_default()
        .streams_active();
    let shutdown = service.shutdown().await.outcome();
    let left = Leftovers {
        pending,
        active,
        shutdown,
    };
    let (warm, last, growth) = rss_growth(samples);
    let mut failures = failures(counts, &left);
    if growth > MAX_RSS_GROWTH {
        failures.push(format!(
            "RSS grew {growth:.2}x after warm-up ({warm} -> {last} KiB)"
        ));
    }
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let faults_doc = fault_counts.map(|c| {
        let kinds: serde_json::Map<String, serde_json::Value> = faults::KINDS
            .iter()
            .zip(c)
            .map(|(k, n)| ((*k).to_owned(), n.into()))
            .collect();
        serde_json::json!({
            "injected": kinds, "faulted_streams": get(&counts.faulted),
            "faulted_disrupted": get(&counts.faulted_disrupted),
        })
    });
    let doc = serde_json::json!({
        "duration_s": opts.duration.as_secs_f64(), "concurrency": opts.concurrency, "plane": opts.plane,
        "streams": get(&counts.started), "clean": get(&counts.clean), "stopped_quietly": get(&counts.stopped_quietly),
        "killed": get(&counts.killed), "receiver_dropped": get(&counts.receiver_dropped),
        "sender_dropped": get(&counts.sender_dropped_seen), "unexpected": get(&counts.unexpected),
        "hung": get(&counts.hung), "faults": faults_doc,
        "pending_left": left.pending, "rss_warm_kib": warm, "rss_end_kib": last, "rss_growth": growth,
        "rss_samples": samples, "shutdown": left.shutdown, "failures": failures,
    });
    let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    println!("{text}");
    if !opts.summary.is_empty() {
        let _ = std::fs::write(&opts.summary, text);
    }
    failures.is_empty()
}

/// RSS after the first tenth of the run (warm), at the end, and their ratio: growth means a
/// leak.
fn rss_growth(samples: &[(f64, u64)]) -> (u64, u64, f64) {
    let warm = samples.get(samples.len() / 10).map_or(0, |s| s.1);
    let last = samples.last().map_or(0, |s| s.1);
    let growth = if warm > 0 {
        last as f64 / warm as f64
    } else {
        1.0
    };
    (warm, last, growth)
}

/// Every check but RSS that failed.
fn failures(counts: &Counts, left: &Leftovers) -> Vec<String> {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let started = get(&counts.started);
    let ended = get(&counts.clean)
        + get(&counts.stopped_quietly)
        + get(&counts.killed)
        + get(&counts.receiver_dropped)
        + get(&counts.sender_dropped_seen);
    let mut failures = Vec::new();
    if ended != started {
        failures.push(format!("{started} streams started but {ended} ended"));
    }
    if get(&counts.hung) > 0 {
        failures.push(format!(
            "{} streams still running after {STREAM_DEADLINE:?}",
            get(&counts.hung)
        ));
    }
    if get(&counts.unexpected) > 0 {
        failures.push(format!(
            "{} streams no fault touched ended in an unexpected way",
            get(&counts.unexpected)
        ));
    }
    if left.pending != 0 {
        failures.push(format!("{} registrations left pending", left.pending));
    }
    if left.active != 0 {
        failures.push(format!("{} transport streams still active", left.active));
    }
    if left.shutdown != "clean" {
        failures.push(format!("shutdown was {}", left.shutdown));
    }
    failures
}
