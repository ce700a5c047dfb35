//! The report's tables, each a set of runs of every arm: the closed loop (medians of repeats,
//! interleaved across arms), the plane-saturation run, and the open-loop rate sweep (each arm
//! until the first rate it does not sustain).

use indicatif::ProgressBar;

use crate::arms::Arm;
use crate::open_loop::{OpenArm, Slo};
use crate::orchestrate::{self, Run, RunOpts};
use crate::report::{ArmReport, Capacity, Figures, limit};

/// Which tables a report has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// A closed loop at the configured concurrency, on the configured fleet.
    Closed,
    /// A closed loop at high concurrency, frontend pinned to one core, a fleet sized not to
    /// be the limit: how much one frontend core carries.
    Saturation,
    /// Requests arriving at rising rates (Poisson), on the saturation run's fleet.
    Open,
}

impl Table {
    /// Parses a comma-separated list (`closed,saturation,open`, or `all`).
    ///
    /// # Errors
    ///
    /// A message naming the unknown table and the known ones.
    pub fn parse_list(spec: &str) -> Result<Vec<Self>, String> {
        if spec == "all" {
            return Ok(vec![Self::Closed, Self::Saturation, Self::Open]);
        }
        spec.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|t| match t {
                "closed" => Ok(Self::Closed),
                "saturation" => Ok(Self::Saturation),
                "open" => Ok(Self::Open),
                other => Err(format!(
                    "unknown table {other:?}; the tables are closed, saturation, open (or all)"
                )),
            })
            .collect()
    }

    /// Its name in `--tables` and in the JSON report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Saturation => "saturation",
            Self::Open => "open",
        }
    }
}

/// The CPU each side may use with `opts` on a machine of `cpus` cores.
pub fn capacity(opts: &RunOpts, cpus: f64) -> Capacity {
    if opts.pin {
        Capacity {
            frontend: 1.0,
            worker: 1.0,
            total: 2.0_f64.min(cpus),
        }
    } else {
        Capacity {
            frontend: (f64::from(opts.frontend_threads.max(1)) * f64::from(opts.frontends.max(1)))
                .min(cpus),
            worker: cpus,
            total: cpus,
        }
    }
}

/// Runs every arm `repeats` times, the repeats interleaved across arms; returns each arm's
/// report (medians) and its runs.
///
/// # Errors
///
/// The first run that failed, naming its arm.
pub fn closed(
    arms: &[Arm],
    opts: &RunOpts,
    repeats: u32,
    cap: Capacity,
    bar: &ProgressBar,
) -> Result<(Vec<ArmReport>, Vec<Vec<Run>>), String> {
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); arms.len()];
    for repeat in 0..repeats {
        for (i, arm) in arms.iter().enumerate() {
            bar.set_message(format!("{} (repeat {}/{repeats})", arm.name, repeat + 1));
            let runs = orchestrate::run_arm(arm, opts, repeat, &mut |_| true)
                .map_err(|e| format!("arm {}: {e}", arm.name))?;
            results[i].extend(runs);
            bar.inc(1);
        }
    }
    let reports = arms
        .iter()
        .zip(&results)
        .map(|(arm, runs)| {
            let figures: Vec<Figures> = runs.iter().map(Figures::of).collect();
            let median = Figures::median(&figures);
            ArmReport {
                arm: arm.name.to_owned(),
                about: arm.about.to_owned(),
                limit: limit(&median, cap),
                median,
                runs: figures,
                error_samples: runs
                    .iter()
                    .flat_map(|r| r.report.error_samples.clone())
                    .take(5)
                    .collect(),
            }
        })
        .collect();
    Ok((reports, results))
}

/// Runs every arm once through the rates of `opts.load`, stopping an arm after the first
/// rate it does not sustain under `slo`.
///
/// # Errors
///
/// The first run that failed, naming its arm.
pub fn open(
    arms: &[Arm],
    opts: &RunOpts,
    slo: &Slo,
    cap: Capacity,
    bar: &ProgressBar,
) -> Result<Vec<OpenArm>, String> {
    arms.iter()
        .map(|arm| {
            bar.set_message(format!("{} (open loop)", arm.name));
            let mut keep_going = |run: &Run| slo.met_by(&Figures::of(run));
            let runs = orchestrate::run_arm(arm, opts, 0, &mut keep_going)
                .map_err(|e| format!("arm {} (open loop): {e}", arm.name))?;
            bar.inc(1);
            let steps = runs.iter().map(Figures::of).collect();
            Ok(OpenArm::new(arm.name, steps, slo, cap))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lists_parse_and_unknown_tables_are_named() {
        assert_eq!(Table::parse_list("all").unwrap().len(), 3);
        assert_eq!(
            Table::parse_list("open, closed").unwrap(),
            vec![Table::Open, Table::Closed]
        );
        let e = Table::parse_list("closed,fast").unwrap_err();
        assert!(e.contains("\"fast\""), "{e}");
        for t in Table::parse_list("all").unwrap() {
            assert_eq!(Table::parse_list(t.name()).unwrap(), vec![t]);
        }
    }
}
