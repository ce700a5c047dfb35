//! `test-matrix`: `cargo test -p <crate>` over a table of feature sets per crate, the idea of
//! `cargo hack --feature-powerset` without the dependency.
//!
//! Rows naming a feature a crate does not declare yet are skipped with a note, so the table
//! can list features before they land.

use std::collections::BTreeSet;

use crate::Result;
use crate::cmd::{Cmd, TestCount};
use crate::metadata::{self, Package};
use crate::ucx;

/// The feature sets each crate is tested with.
const MATRIX: &[Row] = &[
    Row::new("velo-wire", Features::Default),
    Row::new("velo-mux", Features::Default),
    Row::new("velo-session", Features::Default),
    Row::new("velo-tls", Features::Default),
    Row::new("velo-tcp", Features::Default),
    Row::new("velo-ucx", Features::NoDefault),
    Row::ucx("velo-ucx", Features::Add("ucx")),
    Row::new("response-plane", Features::NoDefault),
    Row::new("response-plane", Features::Default),
    Row::ucx("response-plane", Features::Add("ucx")),
    Row::new("runtime-glue", Features::NoDefault),
    Row::new("runtime-glue", Features::Default),
    Row::ucx("runtime-glue", Features::All),
    Row::new("velo-bench", Features::Default),
    Row::new("velo-faults", Features::Default),
    Row::new("velo-serve", Features::Default),
    Row::new("xtask", Features::Default),
];

/// What a row runs on top of the crate itself.
#[derive(Debug, Clone, Copy)]
enum Needs {
    Nothing,
    /// The UCX library, since the row builds the UCX bindings.
    Ucx,
}

/// A feature selection, as `cargo test` flags.
#[derive(Debug, Clone, Copy)]
enum Features {
    Default,
    NoDefault,
    /// The default features plus one more.
    Add(&'static str),
    All,
}

#[derive(Debug, Clone, Copy)]
struct Row {
    krate: &'static str,
    features: Features,
    needs: Needs,
}

impl Row {
    const fn new(krate: &'static str, features: Features) -> Self {
        Self {
            krate,
            features,
            needs: Needs::Nothing,
        }
    }

    const fn ucx(krate: &'static str, features: Features) -> Self {
        Self {
            krate,
            features,
            needs: Needs::Ucx,
        }
    }
}

impl Features {
    fn args(self) -> Vec<String> {
        match self {
            Self::Default => Vec::new(),
            Self::NoDefault => vec!["--no-default-features".into()],
            Self::Add(feature) => vec!["--features".into(), feature.into()],
            Self::All => vec!["--all-features".into()],
        }
    }

    /// The features this selection turns on for `pkg`'s tests directly (before features
    /// enable others), or why the row cannot run: a feature not declared yet, or a
    /// `--no-default-features` row that the crate's own dev-dependency undoes.
    fn resolve(self, pkg: &Package) -> std::result::Result<BTreeSet<String>, String> {
        let mut features = self.asked(pkg)?;
        let Some(own) = pkg.self_dev_dep() else {
            return Ok(features);
        };
        let defaults = pkg.features.get("default").cloned().unwrap_or_default();
        if own.default_features && !defaults.is_empty() {
            if matches!(self, Self::NoDefault) {
                return Err(format!(
                    "{}'s dev-dependency on itself turns its default features back on, so \
                     `--no-default-features` would test them anyway (give that dependency \
                     `default-features = false`)",
                    pkg.name
                ));
            }
            features.extend(defaults);
        }
        features.extend(own.features.iter().cloned());
        Ok(features)
    }

    /// The features the `cargo test` flags ask for.
    fn asked(self, pkg: &Package) -> std::result::Result<BTreeSet<String>, String> {
        let defaults = || pkg.features.get("default").cloned().unwrap_or_default();
        match self {
            Self::NoDefault => Ok(BTreeSet::new()),
            Self::Default => Ok(defaults().into_iter().collect()),
            Self::All => Ok(pkg
                .features
                .keys()
                .filter(|f| *f != "default")
                .cloned()
                .collect()),
            Self::Add(feature) if pkg.has_feature(feature) => {
                Ok(defaults().into_iter().chain([feature.to_owned()]).collect())
            }
            Self::Add(feature) => Err(format!("{} declares no feature `{feature}` yet", pkg.name)),
        }
    }
}

/// A row that will run: what to print and the `cargo test` arguments.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    /// `crate --flags`, as printed.
    pub(crate) label: String,
    args: Vec<String>,
}

impl Planned {
    /// The row's `cargo test` command, plus `extra` arguments (such as `--no-run`).
    pub(crate) fn command(&self, extra: &[&str]) -> Cmd {
        Cmd::cargo()
            .arg("test")
            .args(self.args.iter().cloned())
            .args(extra.iter().copied())
    }

    /// Runs the row's tests.
    ///
    /// # Errors
    ///
    /// When a test fails, or when the row ran no test at all: a row that compiles nothing is
    /// a hole in the matrix, not a pass.
    pub(crate) fn run(&self) -> Result<TestCount> {
        let label = &self.label;
        let count = self
            .command(&[])
            .run_tests()
            .map_err(|e| format!("test-matrix: row `{label}` failed: {e}"))?;
        if count.passed == 0 {
            return Err(format!(
                "test-matrix: row `{label}` ran no tests: a row that tests nothing is a hole in \
                 the matrix (add tests, or remove the row)"
            )
            .into());
        }
        Ok(count)
    }
}

/// The rows to run on this machine, and how many were skipped (UCX missing, a feature not
/// declared, the same features as an earlier row).
pub(crate) fn plan() -> Result<(Vec<Planned>, usize)> {
    let ws = metadata::workspace()?;
    let needs_ucx = MATRIX.iter().any(|r| matches!(r.needs, Needs::Ucx));
    let ucx_rows = needs_ucx
        && ucx::gate(&format!(
            "skipping ucx rows: UCX not found ({})",
            ucx::INSTALL_HINT
        ))?;
    let mut done: Vec<(&str, BTreeSet<String>)> = Vec::new();
    let mut planned = Vec::new();
    let mut skipped = 0;
    for row in MATRIX {
        let label = format!("{} {}", row.krate, row.features.args().join(" "));
        let label = label.trim_end().to_owned();
        if matches!(row.needs, Needs::Ucx) && !ucx_rows {
            skipped += 1;
            continue;
        }
        let Some(pkg) = ws.member(row.krate) else {
            println!(
                "test-matrix: skipping `{label}`: {} is not a workspace crate",
                row.krate
            );
            skipped += 1;
            continue;
        };
        let features = match row.features.resolve(pkg) {
            Ok(features) => features,
            Err(why) if matches!(row.features, Features::Add(_)) => {
                println!("test-matrix: skipping `{label}`: {why}");
                skipped += 1;
                continue;
            }
            Err(why) => return Err(format!("test-matrix: row `{label}`: {why}").into()),
        };
        if done.iter().any(|(k, f)| *k == row.krate && *f == features) {
            println!("test-matrix: skipping `{label}`: same features as an earlier row");
            skipped += 1;
            continue;
        }
        done.push((row.krate, features));
        let args = ["-p".to_owned(), row.krate.to_owned()]
            .into_iter()
            .chain(row.features.args())
            .collect();
        planned.push(Planned { label, args });
    }
    Ok((planned, skipped))
}

pub(crate) fn run() -> Result {
    let (rows, skipped) = plan()?;
    let mut counts = Vec::with_capacity(rows.len());
    for row in &rows {
        let start = std::time::Instant::now();
        let count = row.run()?;
        counts.push((row.label.as_str(), count, start.elapsed()));
    }
    println!("\ntest-matrix: tests per row (wall time: build and run)");
    for (label, count, took) in &counts {
        println!(
            "  {label:<40}{:>6} passed{:<12}{:>7.1} s",
            count.passed,
            ignored_note(count.ignored),
            took.as_secs_f64()
        );
    }
    let total: u64 = counts.iter().map(|(_, c, _)| c.passed).sum();
    println!(
        "test-matrix: ok ({} rows run, {skipped} skipped, {total} tests passed)",
        rows.len()
    );
    Ok(())
}

/// `, N ignored` when tests were ignored (each `#[ignore]` carries a note saying why).
pub(crate) fn ignored_note(ignored: u64) -> String {
    if ignored == 0 {
        String::new()
    } else {
        format!(", {ignored} ignored")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::metadata::{Dep, DepKind};

    fn package(features: &[(&str, &[&str])]) -> Package {
        let features: BTreeMap<String, Vec<String>> = features
            .iter()
            .map(|(f, on)| ((*f).to_owned(), on.iter().map(|&s| s.to_owned()).collect()))
            .collect();
        Package {
            name: "p".into(),
            features,
            benches: Vec::new(),
            deps: Vec::new(),
        }
    }

    fn check(pkg: &Package, features: Features, expect: std::result::Result<&[&str], &str>) {
        let got = features.resolve(pkg);
        match (&got, expect) {
            (Ok(got), Ok(want)) => assert!(got.iter().eq(want), "{features:?}: {got:?}"),
            (Err(got), Err(want)) => assert_eq!(got, want),
            _ => panic!("{features:?} resolved to {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn feature_sets_resolve_against_declared_features() {
        let pkg = package(&[("default", &["tcp"]), ("tcp", &[]), ("ucx", &[])]);
        check(&pkg, Features::NoDefault, Ok(&[]));
        check(&pkg, Features::Default, Ok(&["tcp"]));
        check(&pkg, Features::Add("ucx"), Ok(&["tcp", "ucx"]));
        check(&pkg, Features::All, Ok(&["tcp", "ucx"]));
        check(
            &pkg,
            Features::Add("test-util"),
            Err("p declares no feature `test-util` yet"),
        );
    }

    /// velo-mux's tests depend on velo-mux with `test-util`: every row has it, so a row
    /// adding it repeats the default row; a dev-dependency that keeps the defaults makes a
    /// `--no-default-features` row a lie, which is refused.
    #[test]
    fn a_crates_dev_dependency_on_itself_adds_its_features_to_every_row() {
        let mut pkg = package(&[("default", &["tcp"]), ("tcp", &[]), ("test-util", &[])]);
        pkg.deps.push(Dep {
            name: "p".into(),
            kind: DepKind::Dev,
            features: vec!["test-util".into()],
            default_features: false,
        });
        check(&pkg, Features::NoDefault, Ok(&["test-util"]));
        check(&pkg, Features::Default, Ok(&["tcp", "test-util"]));
        check(&pkg, Features::Add("test-util"), Ok(&["tcp", "test-util"]));
        pkg.deps[0].default_features = true;
        let refused = Features::NoDefault.resolve(&pkg).unwrap_err();
        assert!(refused.contains("default-features = false"), "{refused}");
        check(&pkg, Features::Default, Ok(&["tcp", "test-util"]));
    }

    #[test]
    fn a_crate_without_features_resolves_every_row_to_the_empty_set() {
        let pkg = package(&[]);
        check(&pkg, Features::Default, Ok(&[]));
        check(&pkg, Features::All, Ok(&[]));
    }
}
