//! `fuzz-smoke`: replay the committed corpus plus seeded random inputs under `cargo test`
//! (works everywhere), then, when cargo-fuzz is installed, fuzz every target for a few
//! seconds with `--sanitizer none`, which works on a stable toolchain.

use crate::cmd::{Cmd, project_root};
use crate::{Result, flags};

/// Seconds each fuzz target runs by default.
const DEFAULT_SECS: u32 = 10;

/// The cargo-fuzz crate, relative to the repository root.
const FUZZ_DIR: &str = "fuzz";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Options {
    /// Seconds each fuzz target runs.
    pub(crate) secs: u32,
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
    Cmd::cargo()
        .args(["test", "-p", "velo-wire", "--test", "fuzz_replay"])
        .run()?;
    if !Cmd::cargo().args(["fuzz", "--version"]).succeeds() {
        println!(
            "cargo-fuzz not installed: replayed the corpus only (cargo install cargo-fuzz to fuzz)"
        );
        return Ok(());
    }
    let list = Cmd::cargo().args(["fuzz", "list"]).dir(FUZZ_DIR).read()?;
    let targets: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if targets.is_empty() {
        return Err("fuzz-smoke: `cargo fuzz list` found no fuzz targets in fuzz/".into());
    }
    for target in &targets {
        fuzz(target, opts.secs)?;
    }
    println!(
        "fuzz-smoke: ok (corpus replayed; {} fuzzed {} s each)",
        targets.join(", "),
        opts.secs
    );
    Ok(())
}

/// Fuzzes `target` for `secs` seconds. New inputs go to a scratch directory under
/// `fuzz/target/`, so the committed corpus (read as a second, seed directory) stays unchanged.
fn fuzz(target: &str, secs: u32) -> Result {
    let scratch = format!("target/smoke-corpus/{target}");
    std::fs::create_dir_all(project_root().join(FUZZ_DIR).join(&scratch))
        .map_err(|e| format!("cannot create {FUZZ_DIR}/{scratch}: {e}"))?;
    let mut corpora = vec![scratch];
    let committed = format!("corpus/{target}");
    if project_root().join(FUZZ_DIR).join(&committed).is_dir() {
        corpora.push(committed);
    }
    Cmd::cargo()
        .args(["fuzz", "run", target, "--sanitizer", "none"])
        .args(corpora)
        .arg("--")
        .arg(format!("-max_total_time={secs}"))
        .dir(FUZZ_DIR)
        .run()
        .map_err(|e| {
            format!("fuzz target `{target}` failed (crash inputs in fuzz/artifacts/{target}/): {e}")
                .into()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options> {
        Options::parse(&args.iter().map(|&a| a.to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn secs_defaults_to_ten_and_must_be_positive() {
        assert_eq!(parse(&[]).ok(), Some(Options { secs: 10 }));
        assert_eq!(parse(&["--secs", "5"]).ok(), Some(Options { secs: 5 }));
        assert!(parse(&["--secs", "0"]).is_err());
        assert!(parse(&["--secs", "soon"]).is_err());
    }
}
