//! Running external commands: echo the command line, run it, fail loudly on a non-zero exit.

use std::ffi::OsString;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Result;

/// The repository root: xtask lives one directory below it.
pub(crate) fn project_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// A command line, run from a directory of the repository (its root unless [`Cmd::dir`]).
#[derive(Debug, Clone)]
pub(crate) struct Cmd {
    program: OsString,
    /// How the program is echoed: `cargo` rather than the toolchain path in `$CARGO`.
    shown: String,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    dir: PathBuf,
}

impl Cmd {
    /// `cargo`, taken from `$CARGO` so the toolchain running xtask runs everything else.
    pub(crate) fn cargo() -> Self {
        let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        Self {
            program,
            ..Self::new("cargo")
        }
    }

    /// Any program found on `PATH`.
    pub(crate) fn new(program: &str) -> Self {
        Self {
            program: program.into(),
            shown: program.to_owned(),
            args: Vec::new(),
            envs: Vec::new(),
            dir: project_root(),
        }
    }

    pub(crate) fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub(crate) fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Runs from `dir`, relative to the repository root.
    pub(crate) fn dir(mut self, dir: &str) -> Self {
        self.dir = project_root().join(dir);
        self
    }

    /// Runs the command with inherited output.
    pub(crate) fn run(&self) -> Result {
        self.echo();
        let status = self
            .command()
            .status()
            .map_err(|e| format!("cannot run `{self}`: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("`{self}` failed ({status})").into())
        }
    }

    /// Runs the command and returns its standard output; errors still go to the terminal.
    pub(crate) fn read(&self) -> Result<String> {
        self.echo();
        let out = self
            .command()
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run `{self}`: {e}"))?;
        if !out.status.success() {
            return Err(format!("`{self}` failed ({})", out.status).into());
        }
        String::from_utf8(out.stdout).map_err(|_| format!("`{self}` printed non-UTF-8").into())
    }

    /// Runs a `cargo test` command with its output passed through, and returns how many tests
    /// ran (the sum of the `passed` counts of every `test result:` line it printed).
    pub(crate) fn run_tests(&self) -> Result<TestCount> {
        self.echo();
        let mut child = self
            .command()
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run `{self}`: {e}"))?;
        let mut count = TestCount::default();
        if let Some(out) = child.stdout.take() {
            for line in BufReader::new(out).lines() {
                let line = line.map_err(|e| format!("reading the output of `{self}`: {e}"))?;
                println!("{line}");
                count.add_line(&line);
            }
        }
        let status = child
            .wait()
            .map_err(|e| format!("cannot wait for `{self}`: {e}"))?;
        if status.success() {
            Ok(count)
        } else {
            Err(format!("`{self}` failed ({status})").into())
        }
    }

    /// Runs the command with its standard output and error written to `log` (created or
    /// truncated), and returns its exit status, whatever it is.
    pub(crate) fn run_logged(&self, log: &Path) -> Result<std::process::ExitStatus> {
        self.echo();
        eprintln!("  (output in {})", log.display());
        let file = std::fs::File::create(log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = file
            .try_clone()
            .map_err(|e| format!("cannot reopen {}: {e}", log.display()))?;
        self.command()
            .stdout(file)
            .stderr(err)
            .status()
            .map_err(|e| format!("cannot run `{self}`: {e}").into())
    }

    /// Whether the command runs and exits successfully; its error output is hidden, since a
    /// failure is an answer here, not a problem.
    pub(crate) fn succeeds(&self) -> bool {
        self.echo();
        self.command()
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args).current_dir(&self.dir);
        for (key, value) in &self.envs {
            command.env(key, value);
        }
        command
    }

    fn echo(&self) {
        match self.dir.strip_prefix(project_root()) {
            Ok(rel) if rel.as_os_str().is_empty() => eprintln!("$ {self}"),
            Ok(rel) => eprintln!("$ (cd {} && {self})", rel.display()),
            Err(_) => eprintln!("$ (cd {} && {self})", self.dir.display()),
        }
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (key, value) in &self.envs {
            write!(f, "{key}={} ", quote(value))?;
        }
        f.write_str(&self.shown)?;
        for arg in &self.args {
            write!(f, " {}", quote(arg))?;
        }
        Ok(())
    }
}

/// Tests counted from `cargo test` output.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TestCount {
    /// Tests that ran and passed.
    pub(crate) passed: u64,
    /// Tests marked `#[ignore]`, not run.
    pub(crate) ignored: u64,
}

impl TestCount {
    /// Adds the counts of a `test result: ok. 3 passed; 0 failed; 1 ignored; ...` line; other
    /// lines are ignored.
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// Quotes a word for echoing when a shell would split it.
fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_=./:,@+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_counts_add_up_over_every_result_line() {
        let mut count = TestCount::default();
        for line in [
            "running 3 tests",
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "test a_passed_test ... ok",
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
            "   test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        ] {
            count.add_line(line);
        }
        assert_eq!(
            count,
            TestCount {
                passed: 15,
                ignored: 1
            }
        );
    }

    #[test]
    fn echo_shows_env_and_quotes_words_with_spaces() {
        let cmd = Cmd::cargo()
            .env("RUSTDOCFLAGS", "-D warnings")
            .args(["doc", "--no-deps"]);
        assert_eq!(
            cmd.to_string(),
            "RUSTDOCFLAGS='-D warnings' cargo doc --no-deps"
        );
        assert_eq!(quote(""), "''");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
