//! `flaky`: runs the test matrix several times while a CPU hog of our own (one busy thread
//! per core) competes for every core, the way a loaded CI machine does. A test that depends on
//! timing the scheduler decides fails here long before it fails on CI.
//!
//! The rows are built first, without the hog, so the runs measure tests, not compilers. A
//! failing row does not stop the run: every failure is listed at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cmd::TestCount;
use crate::test_matrix::{self, Planned, ignored_note};
use crate::{Result, flags};

/// Runs of the matrix by default.
const DEFAULT_RUNS: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Options {
    /// How many times the whole matrix runs under load.
    pub(crate) runs: u32,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        let flags = flags::parse(args, &["runs"])?;
        let Some(runs) = flags.get("runs") else {
            return Ok(Self { runs: DEFAULT_RUNS });
        };
        match runs.parse() {
            Ok(runs) if runs > 0 => Ok(Self { runs }),
            _ => Err(format!("--runs wants a positive number, not `{runs}`").into()),
        }
    }
}

/// One row's outcome in one run.
struct Outcome {
    run: u32,
    label: String,
    time: Duration,
    result: std::result::Result<TestCount, String>,
}

pub(crate) fn run(opts: Options) -> Result {
    let (rows, skipped) = test_matrix::plan()?;
    for row in &rows {
        row.command(&["--no-run"])
            .run()
            .map_err(|e| format!("flaky: building `{}` failed: {e}", row.label))?;
    }
    let hog = Hog::start();
    println!(
        "flaky: {} busy threads compete with the tests; {} runs of {} rows ({skipped} skipped)",
        hog.threads(),
        opts.runs,
        rows.len()
    );
    let start = Instant::now();
    let mut outcomes = Vec::new();
    for run in 1..=opts.runs {
        for row in &rows {
            outcomes.push(run_row(run, row));
        }
    }
    let wall = start.elapsed();
    drop(hog);
    report(&outcomes, wall)
}

fn run_row(run: u32, row: &Planned) -> Outcome {
    let start = Instant::now();
    let result = row.run().map_err(|e| e.to_string());
    Outcome {
        run,
        label: row.label.clone(),
        time: start.elapsed(),
        result,
    }
}

fn report(outcomes: &[Outcome], wall: Duration) -> Result {
    println!("\nflaky: every row, every run (under load)");
    let mut failures = Vec::new();
    let mut tests = 0;
    for o in outcomes {
        match &o.result {
            Ok(c) => {
                tests += c.passed;
                println!(
                    "  run {} {:<40}{:>6} passed{}{:>8.1} s",
                    o.run,
                    o.label,
                    c.passed,
                    ignored_note(c.ignored),
                    o.time.as_secs_f64()
                );
            }
            Err(e) => {
                println!(
                    "  run {} {:<40}  FAILED{:>8.1} s",
                    o.run,
                    o.label,
                    o.time.as_secs_f64()
                );
                failures.push(format!("run {}: {e}", o.run));
            }
        }
    }
    println!(
        "flaky: {} row runs, {tests} tests passed, {} failed rows, {:.1} s under load",
        outcomes.len(),
        failures.len(),
        wall.as_secs_f64()
    );
    if failures.is_empty() {
        println!("flaky: ok");
        Ok(())
    } else {
        Err(format!(
            "flaky: {} row runs failed:\n{}",
            failures.len(),
            failures.join("\n")
        )
        .into())
    }
}

/// One busy thread per core until dropped.
struct Hog {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Hog {
    fn start() -> Self {
        let n = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x: u64 = 1;
                    while !stop.load(Ordering::Relaxed) {
                        // Busy work the optimiser cannot remove.
                        for _ in 0..10_000 {
                            x = std::hint::black_box(
                                x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1),
                            );
                        }
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }

    fn threads(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                eprintln!("flaky: a hog thread panicked");
            }
        }
    }
}
