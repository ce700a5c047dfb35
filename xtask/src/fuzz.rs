//! Running cargo-fuzz targets: shared by `fuzz-smoke` (every target for a fixed budget, as CI
//! does) and `fuzz` (long local campaigns), both with `--sanitizer none`, which works on a
//! stable toolchain.
//!
//! A run's libFuzzer output goes to a log under `fuzz/target/logs/`, not the terminal (a
//! minute of fuzzing prints thousands of lines); each target gets one summary line with its
//! exec count, and a failing target gets its log's tail and its crash input's path. What the
//! fuzzer finds goes to a scratch corpus under `fuzz/target/`, and the committed corpus is
//! read as a second seed directory, so no run changes committed files.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use crate::cmd::{Cmd, project_root};
use crate::{Result, flags};

/// The cargo-fuzz crate, relative to the repository root.
pub(crate) const FUZZ_DIR: &str = "fuzz";

/// `cargo xtask fuzz`'s default time per target: 10 minutes.
const DEFAULT_CAMPAIGN_SECS: u64 = 600;

/// Lines of a failing target's log shown.
const LOG_TAIL_LINES: usize = 40;

/// Longest one input may run, in seconds, before libFuzzer reports it as a hang: inputs take
/// well under a millisecond, so this is only ever a livelock.
const INPUT_TIMEOUT_SECS: u32 = 30;

/// How long, or how many inputs, each target runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    /// Seconds of fuzzing (libFuzzer `-max_total_time`).
    Secs(u64),
    /// Inputs run (libFuzzer `-runs`).
    Runs(u64),
}

impl Budget {
    fn libfuzzer_flag(self) -> String {
        match self {
            Self::Secs(s) => format!("-max_total_time={s}"),
            Self::Runs(n) => format!("-runs={n}"),
        }
    }
}

/// `cargo xtask fuzz [--secs N | --runs N] [--target T]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) budget: Budget,
    /// Only this target; every target when `None`.
    pub(crate) target: Option<String>,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        let flags = flags::parse(args, &["secs", "runs", "target"])?;
        let positive = |name: &str, v: &str| -> Result<u64> {
            match v.parse() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("--{name} wants a positive number, not `{v}`").into()),
            }
        };
        let budget = match (flags.get("secs"), flags.get("runs")) {
            (Some(_), Some(_)) => return Err("give --secs or --runs, not both".into()),
            (Some(s), None) => Budget::Secs(positive("secs", s)?),
            (None, Some(r)) => Budget::Runs(positive("runs", r)?),
            (None, None) => Budget::Secs(DEFAULT_CAMPAIGN_SECS),
        };
        let target = flags.get("target").map(|t| (*t).to_owned());
        Ok(Self { budget, target })
    }
}

/// How one target's run went.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) target: String,
    /// Inputs run, from libFuzzer's final lines (`None` if it printed none).
    pub(crate) execs: Option<u64>,
    pub(crate) time: Duration,
    /// `Err` with what failed and where its crash input is.
    pub(crate) result: std::result::Result<(), String>,
}

impl Outcome {
    /// One line: target, execs, time, rate, result.
    pub(crate) fn line(&self) -> String {
        let secs = self.time.as_secs_f64();
        let (execs, rate) = match self.execs {
            Some(n) => (n.to_string(), format!("{:.0}/s", n as f64 / secs.max(1e-3))),
            None => ("?".to_owned(), "?".to_owned()),
        };
        let result = match &self.result {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("FAILED: {e}"),
        };
        format!(
            "{:<16}{execs:>14} execs {secs:>8.1} s {rate:>12}  {result}",
            self.target
        )
    }
}

/// `cargo xtask fuzz`: a long campaign, one target after another, each with the whole machine.
pub(crate) fn campaign(opts: &Options) -> Result {
    let mut targets = list_targets()?;
    if let Some(only) = &opts.target {
        if !targets.contains(only) {
            return Err(
                format!("no fuzz target `{only}` (targets: {})", targets.join(", ")).into(),
            );
        }
        targets = vec![only.clone()];
    }
    build()?;
    let mut outcomes = Vec::new();
    for target in &targets {
        let outcome = run_target(target, opts.budget, "campaign-corpus");
        println!("fuzz: {}", outcome.line());
        outcomes.push(outcome);
    }
    report("fuzz", &outcomes)
}

/// Prints every outcome; fails if one failed.
pub(crate) fn report(what: &str, outcomes: &[Outcome]) -> Result {
    println!("\n{what}: per target");
    for o in outcomes {
        println!("  {}", o.line());
    }
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.result.is_err())
        .map(|o| o.target.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: fuzz targets failed: {}", failed.join(", ")).into())
    }
}

/// Whether `cargo fuzz` runs here.
pub(crate) fn installed() -> bool {
    Cmd::cargo().args(["fuzz", "--version"]).succeeds()
}

/// The targets `cargo fuzz list` names.
pub(crate) fn list_targets() -> Result<Vec<String>> {
    let list = Cmd::cargo().args(["fuzz", "list"]).dir(FUZZ_DIR).read()?;
    let targets: Vec<String> = list
        .lines()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    if targets.is_empty() {
        return Err("`cargo fuzz list` found no fuzz targets in fuzz/".into());
    }
    Ok(targets)
}

/// Builds every target once, so the runs that follow time fuzzing, not compiling.
pub(crate) fn build() -> Result {
    Cmd::cargo()
        .args(["fuzz", "build", "--sanitizer", "none"])
        .dir(FUZZ_DIR)
        .run()
}

/// Fuzzes `target` within `budget`, seeded by its committed corpus; what it finds goes to
/// `fuzz/target/<scratch>/<target>/`.
pub(crate) fn run_target(target: &str, budget: Budget, scratch: &str) -> Outcome {
    let start = Instant::now();
    let (status, log) = match spawn(target, budget, scratch) {
        Ok(done) => done,
        Err(e) => {
            return Outcome {
                target: target.to_owned(),
                execs: None,
                time: start.elapsed(),
                result: Err(e.to_string()),
            };
        }
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let execs = parse_execs(&text);
    let result = if status.success() {
        Ok(())
    } else {
        print_tail(&text, &log);
        Err(crash_note(target, status, &text, &log))
    };
    Outcome {
        target: target.to_owned(),
        execs,
        time: start.elapsed(),
        result,
    }
}

/// Runs `cargo fuzz run` for `target` with its output in a log file; returns its exit status
/// and the log's path.
fn spawn(target: &str, budget: Budget, scratch: &str) -> Result<(ExitStatus, PathBuf)> {
    let fuzz = project_root().join(FUZZ_DIR);
    let corpus = format!("target/{scratch}/{target}");
    let logs = fuzz.join("target/logs");
    for dir in [fuzz.join(&corpus), logs.clone()] {
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut corpora = vec![corpus];
    let committed = format!("corpus/{target}");
    if fuzz.join(&committed).is_dir() {
        corpora.push(committed);
    }
    let log = logs.join(format!("{target}.log"));
    let status = Cmd::cargo()
        .args(["fuzz", "run", target, "--sanitizer", "none"])
        .args(corpora)
        .args(["--", "-print_final_stats=1"])
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .arg(budget.libfuzzer_flag())
        .dir(FUZZ_DIR)
        .run_logged(&log)?;
    Ok((status, log))
}

/// Inputs run, from libFuzzer's final statistics (`stat::number_of_executed_units: N`), else
/// its `Done N runs in S second(s)` line, else the last `#N ... DONE` status line.
pub(crate) fn parse_execs(log: &str) -> Option<u64> {
    let number = |s: &str| s.trim().parse::<u64>().ok();
    let lines = || log.lines().rev();
    lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("stat::number_of_executed_units:")
                .and_then(number)
        })
        .or_else(|| {
            lines().find_map(|l| {
                let rest = l.trim().strip_prefix("Done ")?;
                number(rest.split_whitespace().next()?)
            })
        })
        .or_else(|| {
            lines().find_map(|l| {
                let rest = l.trim().strip_prefix('#')?;
                let (n, tail) = rest.split_once(char::is_whitespace)?;
                tail.trim_start().starts_with("DONE").then(|| number(n))?
            })
        })
}

/// What failed: the exit status and the crash input libFuzzer wrote, if any.
fn crash_note(target: &str, status: ExitStatus, log: &str, path: &Path) -> String {
    let artifact = log
        .lines()
        .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
        .map_or_else(
            || format!("see {}", path.display()),
            |p| format!("crash input {p}; replay with `cargo fuzz run {target} -s none {p}`"),
        );
    format!("{status}; {artifact}")
}

fn print_tail(text: &str, log: &Path) {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(LOG_TAIL_LINES);
    eprintln!(
        "--- last {} lines of {} ---",
        lines.len() - from,
        log.display()
    );
    for line in &lines[from..] {
        eprintln!("{line}");
    }
    eprintln!("---");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_counts_come_from_the_final_stats_or_the_done_lines() {
        let stats = "#1360169\tDONE   cov: 334 ft: 1413\nDone 1360169 runs in 21 second(s)\n\
                     stat::number_of_executed_units: 1360170\nstat::peak_rss_mb: 36\n";
        assert_eq!(parse_execs(stats), Some(1_360_170));
        assert_eq!(
            parse_execs("#42\tNEW cov: 1\nDone 434527 runs in 31 second(s)\n"),
            Some(434_527)
        );
        assert_eq!(
            parse_execs("#7\tNEW cov: 1\n#99\tDONE   cov: 3\n"),
            Some(99)
        );
        assert_eq!(parse_execs("INFO: Seed: 1\n"), None);
    }

    #[test]
    fn a_campaign_takes_seconds_or_runs_and_maybe_a_target() {
        let parse =
            |args: &[&str]| Options::parse(&args.iter().map(|&a| a.to_owned()).collect::<Vec<_>>());
        assert_eq!(
            parse(&[]).ok(),
            Some(Options {
                budget: Budget::Secs(600),
                target: None
            })
        );
        assert_eq!(
            parse(&["--runs", "10000000", "--target", "mux"]).ok(),
            Some(Options {
                budget: Budget::Runs(10_000_000),
                target: Some("mux".into())
            })
        );
        assert!(parse(&["--secs", "1", "--runs", "1"]).is_err());
        assert!(parse(&["--secs", "0"]).is_err());
    }
}
