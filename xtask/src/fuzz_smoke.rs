//! `fuzz-smoke`: replays every fuzz target's committed corpus plus seeded mutations under
//! `cargo test` (works everywhere), then fuzzes every target (`cargo fuzz list`) for a fixed
//! budget with `--sanitizer none`, which works on a stable toolchain, and prints each
//! target's exec count.
//!
//! Without cargo-fuzz the second part is skipped with a note, unless `VELO_REQUIRE_FUZZ=1`
//! (CI sets it: `.ci/run` installs cargo-fuzz), which makes that an error.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::cmd::Cmd;
use crate::fuzz::{self, Budget, Outcome};
use crate::{Result, flags};

/// Seconds each fuzz target runs by default: CI's budget. Six targets on two cores take three
/// minutes of fuzzing, after a build of about two.
pub(crate) const DEFAULT_SECS: u64 = 60;

/// Set to `1` to fail when cargo-fuzz is missing instead of only replaying the corpora.
pub(crate) const REQUIRE_ENV: &str = "VELO_REQUIRE_FUZZ";

/// The crates whose `tests/fuzz_replay.rs` replay fuzz corpora, and the targets each owns.
/// Every target `cargo fuzz list` names must be owned by one.
const REPLAYS: &[(&str, &[&str])] = &[
    ("velo-wire", &["decode"]),
    ("velo-mux", &["mux"]),
    ("velo-session", &["handshake"]),
    ("velo-ucx", &["ucx_message"]),
    ("response-plane", &["prologue", "classic_reader"]),
];

/// Most targets fuzzed at once (one per core, up to this).
const MAX_JOBS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Options {
    /// Seconds each fuzz target runs.
    pub(crate) secs: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self { secs: DEFAULT_SECS }
    }
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        let flags = flags::parse(args, &["secs"])?;
        let Some(secs) = flags.get("secs") else {
            return Ok(Self::default());
        };
        match secs.parse() {
            Ok(secs) if secs > 0 => Ok(Self { secs }),
            _ => Err(format!("--secs wants a positive number of seconds, not `{secs}`").into()),
        }
    }
}

pub(crate) fn run(opts: Options) -> Result {
    for (krate, _) in REPLAYS {
        Cmd::cargo()
            .args(["test", "-p", krate, "--test", "fuzz_replay"])
            .run()?;
    }
    if !fuzz::installed() {
        if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
            return Err(format!(
                "{REQUIRE_ENV}=1 but cargo-fuzz is not installed: `cargo install cargo-fuzz --locked`"
            )
            .into());
        }
        println!(
            "cargo-fuzz not installed: replayed the corpora only (cargo install cargo-fuzz \
             --locked to fuzz; {REQUIRE_ENV}=1 makes this an error)"
        );
        return Ok(());
    }
    let targets = fuzz::list_targets()?;
    check_owners(&targets)?;
    fuzz::build()?;
    let start = Instant::now();
    let outcomes = run_all(&targets, Budget::Secs(opts.secs));
    fuzz::report("fuzz-smoke", &outcomes)?;
    println!(
        "fuzz-smoke: ok ({} targets replayed and fuzzed {} s each, {:.0} s in all)",
        targets.len(),
        opts.secs,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Every target has a replay test and every replayed target exists.
fn check_owners(targets: &[String]) -> Result {
    let owned: Vec<&str> = REPLAYS
        .iter()
        .flat_map(|(_, t)| t.iter().copied())
        .collect();
    let unowned: Vec<&str> = targets
        .iter()
        .map(String::as_str)
        .filter(|t| !owned.contains(t))
        .collect();
    let missing: Vec<&str> = owned
        .iter()
        .copied()
        .filter(|t| !targets.iter().any(|x| x == t))
        .collect();
    if unowned.is_empty() && missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "fuzz targets without a replay test in xtask's REPLAYS: [{}]; replayed but not in \
         `cargo fuzz list`: [{}]",
        unowned.join(", "),
        missing.join(", ")
    )
    .into())
}

/// Fuzzes every target within `budget`, one per core at a time; outcomes in target order.
fn run_all(targets: &[String], budget: Budget) -> Vec<Outcome> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let jobs = cores.clamp(1, MAX_JOBS).min(targets.len());
    let next = AtomicUsize::new(0);
    let outcomes: Mutex<Vec<(usize, Outcome)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                while let Some(target) = targets.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let i = targets.iter().position(|t| t == target).unwrap_or(0);
                    let outcome = fuzz::run_target(target, budget, "smoke-corpus");
                    println!("fuzz-smoke: {}", outcome.line());
                    outcomes
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((i, outcome));
                }
            });
        }
    });
    let mut outcomes = outcomes
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    outcomes.sort_by_key(|(i, _)| *i);
    outcomes.into_iter().map(|(_, o)| o).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options> {
        Options::parse(&args.iter().map(|&a| a.to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn secs_defaults_to_the_ci_budget_and_must_be_positive() {
        assert_eq!(parse(&[]).ok(), Some(Options { secs: DEFAULT_SECS }));
        assert_eq!(parse(&["--secs", "5"]).ok(), Some(Options { secs: 5 }));
        assert!(parse(&["--secs", "0"]).is_err());
        assert!(parse(&["--secs", "soon"]).is_err());
    }

    #[test]
    fn every_target_needs_a_replay_owner() {
        let all: Vec<String> = REPLAYS
            .iter()
            .flat_map(|(_, t)| t.iter().map(|&t| t.to_owned()))
            .collect();
        assert!(check_owners(&all).is_ok());
        let mut extra = all.clone();
        extra.push("new_target".into());
        assert!(check_owners(&extra).is_err());
        assert!(check_owners(&all[1..]).is_err());
    }
}
