//! `bench`: the criterion benches of the codec and mux crates, optionally saving or comparing
//! against a named baseline.

use crate::cmd::Cmd;
use crate::{Result, flags, metadata};

/// Crates whose benches `bench` runs.
const BENCHED: &[&str] = &["velo-wire", "velo-mux"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Options {
    /// Run and report only.
    Run,
    /// Save the results as a named criterion baseline.
    Save(String),
    /// Compare against a saved baseline.
    Compare(String),
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        let flags = flags::parse(args, &["save", "baseline"])?;
        match (flags.get("save"), flags.get("baseline")) {
            (None, None) => Ok(Self::Run),
            (Some(name), None) => Ok(Self::Save((*name).to_owned())),
            (None, Some(name)) => Ok(Self::Compare((*name).to_owned())),
            (Some(_), Some(_)) => Err("--save and --baseline exclude each other: compare \
                                       against a baseline, then save a new one"
                .into()),
        }
    }

    fn criterion_args(&self) -> Vec<String> {
        match self {
            Self::Run => Vec::new(),
            Self::Save(name) => vec!["--save-baseline".into(), name.clone()],
            Self::Compare(name) => vec!["--baseline".into(), name.clone()],
        }
    }
}

pub(crate) fn run(opts: &Options) -> Result {
    let ws = metadata::workspace()?;
    let mut cmd = Cmd::cargo().arg("bench");
    let mut benches = Vec::new();
    for &krate in BENCHED {
        match ws.member(krate) {
            Some(pkg) if !pkg.benches.is_empty() => {
                cmd = cmd.args(["-p", krate]);
                benches.extend(pkg.benches.iter().cloned());
            }
            _ => println!("bench: skipping {krate}: it declares no [[bench]] targets yet"),
        }
    }
    if benches.is_empty() {
        println!("bench: nothing to run");
        return Ok(());
    }
    // Name each bench: `cargo bench` alone also runs the libtest harness of the library,
    // which rejects criterion's flags.
    benches.sort();
    benches.dedup();
    for bench in benches {
        cmd = cmd.args(["--bench".to_owned(), bench]);
    }
    cmd.arg("--").args(opts.criterion_args()).run()
}
