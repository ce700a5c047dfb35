//! The harness itself: every arm this build has runs for a moment at tiny concurrency in every
//! table (closed loop, saturation, open loop), and the JSON report has every key, delivered
//! tokens, and no errors. Not a timed test.
//!
//! With the `peers` feature the peer arms run too: velo-bench first builds their binaries in
//! `peers/` with the cheap `smoke` profile (a cold build takes minutes, see README.md).

use std::path::Path;
use std::process::Command;

const KEYS: [&str; 17] = [
    "arm",
    "requests_per_s",
    "output_tokens_per_s",
    "frontend_cpu_ms_per_request",
    "frontend_cpu_us_per_token",
    "tx_segments_per_token",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "latency_p99_ms",
    "itl_mean_p99_ms",
    "errors",
    "requests",
    "worker_cpu_us_per_token",
    "frontend_wakeups_per_token",
    "chunk_gap_p99_ms",
    "limit",
    "engines",
];

/// The engines' figures every arm has.
const ENGINE_KEYS: [&str; 7] = [
    "prefill_passes_per_s",
    "new_per_prefill",
    "decode_passes_per_s",
    "prefill_time_pct",
    "pass_lag_ms",
    "arrival_gap_cv",
    "clustered_arrivals_pct",
];

#[test]
fn every_arm_runs_and_reports_every_key() {
    let dir = std::env::temp_dir().join(format!("velo-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("report.json");
    let plots = dir.join("plots");
    let stdout = run_velo_bench(&json, &plots);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let arms = doc["arms"].as_array().expect("an arms array");
    let names: Vec<&str> = arms.iter().filter_map(|a| a["arm"].as_str()).collect();
    for name in expected_arms() {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    for arm in arms {
        check_arm(arm, &stdout);
    }
    for arm in doc["saturation"]["arms"]
        .as_array()
        .expect("a saturation table")
    {
        check_arm(arm, &stdout);
    }
    check_open_loop(&doc["open"], &names);
    check_plots(&plots);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every arm has open-loop steps at the offered rates, with tokens.
fn check_open_loop(open: &serde_json::Value, names: &[&str]) {
    assert_eq!(open["slo"]["ttft_p99_ms"].as_f64(), Some(1000.0));
    let arms = open["arms"].as_array().expect("an open-loop table");
    assert_eq!(arms.len(), names.len());
    for arm in arms {
        let name = arm["arm"].as_str().unwrap_or("?");
        let steps = arm["steps"].as_array().expect("steps");
        assert!(!steps.is_empty(), "{name}: no open-loop step");
        assert_eq!(steps[0]["offered_rate"].as_f64(), Some(20.0), "{name}");
        assert!(
            steps[0]["output_tokens_per_s"].as_f64().unwrap() > 0.0,
            "{name}: no tokens"
        );
        assert!(arm["highest_sustained_rate"].as_f64().is_some(), "{name}");
        assert!(arm["limit"].as_str().is_some(), "{name}");
    }
}

/// Runs every arm for a moment at tiny concurrency, writing `json` and `plots`; returns the
/// bench's stdout.
fn run_velo_bench(json: &Path, plots: &Path) -> String {
    // The window opens after the warm-up and the first completed request, however long
    // process and connection set-up take on a loaded machine: set-up never eats the window.
    let out = Command::new(env!("CARGO_BIN_EXE_velo-bench"))
        .args([
            "--arms",
            "all",
            "--concurrency",
            "4",
            "--duration",
            "1.5",
            "--warmup",
            "0.5",
            "--repeats",
            "1",
        ])
        .args([
            "--workers",
            "2",
            "--worker-processes",
            "1",
            "--osl",
            "16",
            "--isl",
            "64",
        ])
        .args([
            "--sat-concurrency",
            "8",
            "--sat-workers",
            "2",
            "--sat-duration",
            "1",
            "--rates",
            "20,40",
            "--open-duration",
            "1",
            "--open-settle",
            "0.5",
            "--slo-ttft-p99-ms",
            "1000",
        ])
        .args(["--peers-profile", "smoke"])
        .arg("--json")
        .arg(json)
        .arg("--plots")
        .arg(plots)
        .output()
        .expect("run velo-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "velo-bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

/// The arms this build has.
fn expected_arms() -> Vec<&'static str> {
    let mut expected = vec![
        "velo-tcp-5ms",
        "velo-tcp-greedy",
        "velo-tcp-pass",
        "tcp",
        "velo-tcp-5ms-tls",
        "tcp-tls",
    ];
    if cfg!(feature = "ucx") {
        expected.push("velo-ucx");
    }
    if cfg!(feature = "peers") {
        expected.extend([
            "dynamo-tcp",
            "dynamo-tcp-drt",
            "dynamo-quic",
            "velo-0.21",
            "velo-0.21-5ms",
            "velo-0.21-pass",
        ]);
    }
    expected
}

/// One arm's JSON has every key, tokens, requests, no errors and the configuration, and the
/// table has its row.
fn check_arm(arm: &serde_json::Value, stdout: &str) {
    let name = arm["arm"].as_str().unwrap_or("?");
    for key in KEYS {
        assert!(!arm[key].is_null(), "{name}: missing {key}");
    }
    for key in ENGINE_KEYS {
        assert!(
            !arm["engines"][key].is_null(),
            "{name}: missing engines.{key}"
        );
    }
    assert!(
        arm["engines"]["new_per_prefill"].as_f64().unwrap() >= 1.0,
        "{name}: every prefill pass admits a request"
    );
    assert!(
        arm["output_tokens_per_s"].as_f64().unwrap() > 0.0,
        "{name}: no tokens"
    );
    assert!(
        arm["requests"].as_f64().unwrap() > 0.0,
        "{name}: no requests"
    );
    assert_eq!(
        arm["errors"].as_f64(),
        Some(0.0),
        "{name}: errors {:?}",
        arm["error_samples"]
    );
    assert!(
        arm["config"]["concurrency"].as_u64().is_some(),
        "{name}: configuration recorded"
    );
    assert!(
        stdout.contains(&format!("| {name} |")),
        "{name} is in the table"
    );
}

/// Every plot has curves.
fn check_plots(dir: &Path) {
    for svg in ["ttft_cdf.svg", "itl_cdf.svg", "tokens_per_s.svg"] {
        let text = std::fs::read_to_string(dir.join(svg)).unwrap_or_default();
        assert!(
            text.contains("<svg") && text.contains("polyline"),
            "{svg} has curves"
        );
    }
}
