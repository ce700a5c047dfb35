//! The two loads: closed-loop clients, and an open-loop generator of Poisson arrivals.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{FrontendOpts, Load, Shared, request};
use crate::adapter::BenchFrontend;

/// Longest sleep of the generator before it looks at the step and the stop flag again.
const GENERATOR_POLL: Duration = Duration::from_millis(20);

/// Starts `opts.load`; returns its tasks (aborted once the run is over).
pub(super) fn start<F: BenchFrontend>(
    plane: &Arc<F>,
    shared: &Arc<Shared>,
    opts: &FrontendOpts,
) -> Vec<JoinHandle<()>> {
    match &opts.load {
        Load::Closed { concurrency } => (0..*concurrency)
            .map(|_| tokio::spawn(client(plane.clone(), shared.clone(), opts.clone())))
            .collect(),
        Load::Open {
            rates,
            seed,
            max_in_flight,
        } => {
            let arrivals = Arrivals {
                rates: rates.clone(),
                rng: StdRng::seed_from_u64(*seed),
                max_in_flight: u64::from(*max_in_flight),
            };
            vec![tokio::spawn(generate(
                plane.clone(),
                shared.clone(),
                opts.clone(),
                arrivals,
            ))]
        }
    }
}

/// One closed-loop client: a request, then the next, until the run stops.
async fn client<F: BenchFrontend>(plane: Arc<F>, shared: Arc<Shared>, opts: FrontendOpts) {
    while !shared.stopped() {
        let id = shared.begin_request();
        let t0 = Instant::now();
        if let Some(step) = shared.window() {
            shared.count_arrival(step, false);
        }
        request::serve(&*plane, &shared, &opts, id, t0).await;
        shared.end_request();
    }
}

/// The open loop's arrival process.
struct Arrivals {
    rates: Vec<f64>,
    rng: StdRng,
    max_in_flight: u64,
}

impl Arrivals {
    /// The gap to the next arrival at `rate` per second (exponentially distributed).
    fn gap(&mut self, rate: f64) -> Duration {
        if rate <= 0.0 {
            return GENERATOR_POLL;
        }
        // 1 - u is in (0, 1]: its logarithm is finite.
        let u: f64 = self.rng.random();
        Duration::from_secs_f64((-(1.0 - u).ln() / rate).min(3600.0))
    }
}

/// Sends requests at the current step's rate until the run stops. A request's clock starts
/// at its scheduled arrival, so a generator that falls behind (a frontend short of CPU)
/// shows in TTFT rather than hiding it. The Poisson process restarts when the step changes.
async fn generate<F: BenchFrontend>(
    plane: Arc<F>,
    shared: Arc<Shared>,
    opts: FrontendOpts,
    mut arrivals: Arrivals,
) {
    let mut step = shared.load_step();
    let mut rate = arrivals.rates.get(step).copied().unwrap_or(0.0);
    let mut next = Instant::now() + arrivals.gap(rate);
    while !shared.stopped() {
        let now = Instant::now();
        if shared.load_step() != step {
            step = shared.load_step();
            rate = arrivals.rates.get(step).copied().unwrap_or(0.0);
            next = now + arrivals.gap(rate);
            continue;
        }
        if next > now {
            tokio::time::sleep_until(next.min(now + GENERATOR_POLL)).await;
            continue;
        }
        arrive(&plane, &shared, &opts, next, arrivals.max_in_flight);
        next += arrivals.gap(rate);
    }
}

/// One arrival, scheduled at `t0`: sent unless `max_in_flight` requests are running.
fn arrive<F: BenchFrontend>(
    plane: &Arc<F>,
    shared: &Arc<Shared>,
    opts: &FrontendOpts,
    t0: Instant,
    max_in_flight: u64,
) {
    let dropped = shared.in_flight.load(Ordering::Acquire) >= max_in_flight;
    if let Some(step) = shared.window() {
        shared.count_arrival(step, dropped);
    }
    if dropped {
        return;
    }
    let id = shared.begin_request();
    let (plane, shared, opts) = (plane.clone(), shared.clone(), opts.clone());
    tokio::spawn(async move {
        request::serve(&*plane, &shared, &opts, id, t0).await;
        shared.end_request();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_gaps_average_one_over_the_rate_and_repeat_with_the_seed() {
        let arrivals = |seed| Arrivals {
            rates: vec![1000.0],
            rng: StdRng::seed_from_u64(seed),
            max_in_flight: 1,
        };
        let (mut a, mut b) = (arrivals(7), arrivals(7));
        let n = 20_000;
        let gaps: Vec<Duration> = (0..n).map(|_| a.gap(1000.0)).collect();
        let again: Vec<Duration> = (0..n).map(|_| b.gap(1000.0)).collect();
        assert_eq!(gaps, again);
        let mean = gaps.iter().sum::<Duration>().as_secs_f64() / f64::from(n);
        assert!((mean - 0.001).abs() < 0.00005, "mean gap {mean} s");
        let mut c = arrivals(8);
        let other: Vec<Duration> = (0..10).map(|_| c.gap(1000.0)).collect();
        assert_ne!(other, gaps[..10]);
    }
}
