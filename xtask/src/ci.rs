//! `ci`: every check CI runs, in order, stopping at the first failure. A local pass means CI
//! passes.

use std::time::{Duration, Instant};

use crate::cmd::Cmd;
use crate::{Result, fuzz_smoke, layers, test_matrix, ucx};

/// A named check.
type Step = (&'static str, fn() -> Result);

/// The steps, in the order they run: cheap and likely to fail first.
const STEPS: &[Step] = &[
    ("fmt", fmt),
    ("clippy", clippy),
    ("doc", doc),
    ("check-layers", layers::run),
    ("test-matrix", test_matrix::run),
    ("peers-smoke", peers_smoke),
    ("fuzz-smoke", fuzz_smoke_default),
];

pub(crate) fn run() -> Result {
    let mut times: Vec<(&str, Duration)> = Vec::new();
    for &(name, step) in STEPS {
        eprintln!("\nci: step {name}");
        let start = Instant::now();
        let outcome = step();
        times.push((name, start.elapsed()));
        if let Err(e) = outcome {
            print_times(&times, Some(name));
            return Err(format!("ci: step `{name}` failed: {e}").into());
        }
    }
    print_times(&times, None);
    println!("ci: ok");
    Ok(())
}

fn fmt() -> Result {
    Cmd::cargo().args(["fmt", "--all", "--", "--check"]).run()
}

fn clippy() -> Result {
    let clippy = |features: &[&str]| {
        Cmd::cargo()
            .args(["clippy", "--workspace", "--all-targets"])
            .args(features.iter().copied())
            .args(["--", "-D", "warnings"])
            .run()
    };
    clippy(&[])?;
    let note = format!(
        "skipping clippy --all-features: UCX not found ({})",
        ucx::INSTALL_HINT
    );
    if ucx::gate(&note)? {
        clippy(&["--all-features"])?;
    }
    Ok(())
}

fn doc() -> Result {
    Cmd::cargo()
        .args(["doc", "--workspace", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings")
        .run()
}

/// velo-bench's smoke test with the peer arms: it builds the peer workspaces under `peers/`
/// (their `smoke` profile; dynamo-runtime needs `protoc`, which `.ci/run` installs) and runs
/// every arm, ours and the peers', for a moment.
fn peers_smoke() -> Result {
    Cmd::cargo()
        .args(["test", "-p", "velo-bench", "--features", "peers"])
        .run()
}

fn fuzz_smoke_default() -> Result {
    fuzz_smoke::run(fuzz_smoke::Options::default())
}

/// Prints each step's wall time, marking the failed step; steps after it did not run.
fn print_times(times: &[(&str, Duration)], failed: Option<&str>) {
    println!("\nci: time per step");
    for &(name, time) in times {
        let mark = if failed == Some(name) { "  FAILED" } else { "" };
        println!("  {name:<14}{:>8.1} s{mark}", time.as_secs_f64());
    }
    let total: Duration = times.iter().map(|&(_, t)| t).sum();
    println!("  {:<14}{:>8.1} s", "total", total.as_secs_f64());
}
