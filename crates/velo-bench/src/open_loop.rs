//! The open-loop table: per arm, one row per offered rate, and the highest rate each arm
//! sustains under a stated TTFT p99 objective.

use serde::Serialize;

use crate::report::{Capacity, Figures, limit};

/// What "sustains a rate" means: TTFT p99 within the objective, and (almost) every arrival
/// served.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slo {
    /// The TTFT p99 objective, ms.
    pub ttft_p99_ms: f64,
    /// Arrivals that may fail, be dropped or not end within the drain, percent.
    pub unserved_pct: f64,
}

impl Slo {
    /// Whether a step with figures `f` met the objective.
    pub fn met_by(&self, f: &Figures) -> bool {
        let arrivals = f.requests + f.errors + f.unserved;
        let failed = f.errors + f.unserved;
        f.requests > 0.0
            && f.ttft_p99_ms <= self.ttft_p99_ms
            && failed <= self.unserved_pct / 100.0 * arrivals
    }
}

/// One arm's open-loop steps.
#[derive(Debug, Clone, Serialize)]
pub struct OpenArm {
    /// The arm.
    pub arm: String,
    /// Each step measured, in rising rate (the sweep stops after the first step missed).
    pub steps: Vec<Figures>,
    /// The highest offered rate met, requests per second (0: none).
    pub highest_sustained_rate: f64,
    /// What limits the arm at the first rate it did not sustain (or at the last one, if it
    /// sustained every rate).
    pub limit: String,
}

impl OpenArm {
    /// The arm `arm`'s steps, judged by `slo`, its limits on `cap`.
    pub fn new(arm: &str, steps: Vec<Figures>, slo: &Slo, cap: Capacity) -> Self {
        let highest_sustained_rate = steps
            .iter()
            .take_while(|f| slo.met_by(f))
            .map(|f| f.offered_rate)
            .fold(0.0, f64::max);
        let at = steps
            .iter()
            .find(|f| !slo.met_by(f))
            .or_else(|| steps.last());
        let limit = match at {
            Some(f) if !slo.met_by(f) => {
                format!("missed at {:.0} req/s: {}", f.offered_rate, limit(f, cap))
            }
            Some(f) => format!(
                "met every rate; at {:.0} req/s: {}",
                f.offered_rate,
                limit(f, cap)
            ),
            None => "not measured".into(),
        };
        Self {
            arm: arm.to_owned(),
            steps,
            highest_sustained_rate,
            limit,
        }
    }
}

/// Prints the open-loop table, the highest sustained rates and the limits line.
pub fn print_table(arms: &[OpenArm], slo: &Slo) {
    println!(
        "| arm | offered req/s | done req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL mean p99 ms | chunk gap p99 ms | FE CPU us/tok | worker CPU us/tok | FE wakes/tok | unserved | met |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for a in arms {
        for f in &a.steps {
            println!(
                "| {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.0} | {} |",
                a.arm,
                f.offered_rate,
                f.requests_per_s,
                f.output_tokens_per_s,
                f.ttft_p50_ms,
                f.ttft_p99_ms,
                f.itl_mean_p99_ms,
                f.chunk_gap_p99_ms,
                f.frontend_cpu_us_per_token,
                f.worker_cpu_us_per_token,
                f.frontend_wakeups_per_token,
                f.unserved + f.errors,
                if slo.met_by(f) { "yes" } else { "no" },
            );
        }
    }
    println!();
    let best: Vec<String> = arms
        .iter()
        .map(|a| format!("{} {:.0}", a.arm, a.highest_sustained_rate))
        .collect();
    println!(
        "Highest rate sustained with TTFT p99 <= {} ms (req/s): {}.",
        slo.ttft_p99_ms,
        best.join("; ")
    );
    let limits: Vec<String> = arms
        .iter()
        .map(|a| format!("{}: {}", a.arm, a.limit))
        .collect();
    println!("Limits: {}.", limits.join("; "));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(rate: f64, ttft_p99_ms: f64, unserved: f64) -> Figures {
        Figures {
            offered_rate: rate,
            requests: 1000.0,
            ttft_p99_ms,
            unserved,
            frontend_cores: 0.5,
            worker_cores: 0.5,
            ..Figures::default()
        }
    }

    const SLO: Slo = Slo {
        ttft_p99_ms: 50.0,
        unserved_pct: 0.1,
    };
    const CAP: Capacity = Capacity {
        frontend: 1.0,
        worker: 1.0,
        total: 2.0,
    };

    #[test]
    fn the_highest_sustained_rate_is_the_last_met_before_the_first_miss() {
        let steps = vec![
            step(100.0, 5.0, 0.0),
            step(200.0, 9.0, 1.0),
            step(400.0, 80.0, 0.0),
        ];
        let a = OpenArm::new("x", steps, &SLO, CAP);
        assert_eq!(a.highest_sustained_rate, 200.0);
        assert!(
            a.limit.starts_with("missed at 400 req/s: fleet"),
            "{}",
            a.limit
        );
    }

    #[test]
    fn unserved_arrivals_beyond_the_allowance_miss_the_objective() {
        assert!(!SLO.met_by(&step(100.0, 5.0, 2.0)));
        let a = OpenArm::new("x", vec![step(100.0, 5.0, 5.0)], &SLO, CAP);
        assert_eq!(a.highest_sustained_rate, 0.0);
        let all = OpenArm::new("y", vec![step(100.0, 5.0, 0.0)], &SLO, CAP);
        assert!(all.limit.starts_with("met every rate"), "{}", all.limit);
    }
}
