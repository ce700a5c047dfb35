//! `faults`: the fault scenarios (the `velo-faults` binary, release build) against both
//! planes, one table; fails when a stream is left hanging, a detection exceeds its bound, a
//! stream meant to finish loses items, or the frontend's memory grows past its bound.

use crate::cmd::Cmd;
use crate::{Result, flags};

/// Flags passed through to `velo-faults`.
const FLAGS: &[&str] = &[
    "planes",
    "scenarios",
    "idle-ms",
    "slack-ms",
    "grace-ms",
    "logs",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    /// `--name value` pairs for `velo-faults`.
    args: Vec<String>,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        let flags = flags::parse(args, FLAGS)?;
        let args = flags
            .iter()
            .flat_map(|(name, value)| [format!("--{name}"), (*value).to_owned()])
            .collect();
        Ok(Self { args })
    }
}

pub(crate) fn run(opts: &Options) -> Result {
    Cmd::cargo()
        .args(["run", "--release", "-p", "velo-faults", "--"])
        .args(opts.args.iter().cloned())
        .run()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_flags_pass_through_and_others_are_refused() {
        let args: Vec<String> = ["--planes", "velo", "--idle-ms=1500"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let o = Options::parse(&args).unwrap();
        assert_eq!(o.args, ["--idle-ms", "1500", "--planes", "velo"]);
        assert!(Options::parse(&["--nope".to_owned(), "1".to_owned()]).is_err());
    }
}
