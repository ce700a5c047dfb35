//! Metrics through OpenTelemetry, exposed in the Prometheus text format.
//!
//! Exporter: `opentelemetry-prometheus`, the OpenTelemetry project's own Prometheus exporter,
//! released in lockstep with the SDK. It feeds a `prometheus::Registry` whose text encoder
//! produces the standard exposition format (checked with `promtool check metrics` in the
//! tests), so a scrape needs no collector in between. The transport's counters live in plain
//! stats structs; they are read by observable instruments at scrape time, so the hot path
//! pays nothing for metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use response_plane::{
    BATCH_RECORDS_BUCKETS, FlushReason, FrontendPlane, HandshakeStats, MuxStats, PlaneStats,
    WorkerPlane,
};

/// Histogram boundaries for stream setup, in seconds: 100 us to 10 s.
pub const SETUP_SECONDS_BOUNDARIES: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Streams in flight per side, shared with the service's stream handles.
#[derive(Debug, Default)]
pub(crate) struct Active {
    pub(crate) frontend: AtomicU64,
    pub(crate) worker: AtomicU64,
    pub(crate) zero: tokio::sync::Notify,
}

impl Active {
    pub(crate) fn total(&self) -> u64 {
        self.frontend.load(Ordering::Acquire) + self.worker.load(Ordering::Acquire)
    }

    /// Resolves once no stream is in flight.
    pub(crate) async fn wait_zero(&self) {
        loop {
            let notified = self.zero.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.total() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// The service's instruments.
pub(crate) struct Metrics {
    registry: prometheus::Registry,
    _provider: SdkMeterProvider,
    errors: Counter<u64>,
    setup: Histogram<f64>,
    batch_records: Histogram<u64>,
    shutdowns: Counter<u64>,
    /// Batch histogram buckets already replayed into `batch_records`, per side.
    replayed: Mutex<[[u64; 12]; 2]>,
    frontend: Option<FrontendPlane>,
    worker: Option<WorkerPlane>,
}

const FRONTEND: &str = "frontend";
const WORKER: &str = "worker";

impl Metrics {
    pub(crate) fn new(
        frontend: Option<FrontendPlane>,
        worker: Option<WorkerPlane>,
        active: Arc<Active>,
    ) -> Result<Self, crate::StartupError> {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_target_info()
            .scope_info_enabled(false)
            .build()
            .map_err(|e| crate::StartupError::Telemetry(e.to_string()))?;
        let provider = SdkMeterProvider::builder().with_reader(exporter).build();
        let meter = provider.meter("velo-response-plane");
        let errors = meter
            .u64_counter("dynamo_component_errors")
            .with_description(
                "Errors by type; response_stream counts response stream failures, setup included",
            )
            .build();
        // Zero-valued series exist from the start, so dashboards and alerts see them.
        errors.add(0, &[KeyValue::new("error_type", "response_stream")]);
        let setup = meter
            .f64_histogram("velo_response_stream_setup")
            .with_unit("s")
            .with_description("Time to set a response stream up: register to prologue (frontend), connect (worker)")
            .with_boundaries(SETUP_SECONDS_BOUNDARIES.to_vec())
            .build();
        let batch_records = meter
            .u64_histogram("velo_response_batch_records")
            .with_description("Records per batch written")
            .with_boundaries(
                BATCH_RECORDS_BUCKETS
                    .iter()
                    .map(|&b| f64::from(b))
                    .collect(),
            )
            .build();
        let shutdowns = meter
            .u64_counter("velo_response_shutdowns")
            .with_description("Shutdowns by outcome")
            .build();
        let sides = Sides {
            frontend: frontend.clone(),
            worker: worker.clone(),
        };
        register_observables(&meter, &sides, active);
        Ok(Self {
            registry,
            _provider: provider,
            errors,
            setup,
            batch_records,
            shutdowns,
            replayed: Mutex::new([[0; 12]; 2]),
            frontend,
            worker,
        })
    }

    /// Counts one response stream failure.
    pub(crate) fn stream_error(&self) {
        self.errors
            .add(1, &[KeyValue::new("error_type", "response_stream")]);
    }

    /// Records a stream's setup time.
    pub(crate) fn setup_time(&self, side: &'static str, seconds: f64) {
        self.setup.record(seconds, &[KeyValue::new("side", side)]);
    }

    /// Counts a shutdown.
    pub(crate) fn shutdown(&self, outcome: &'static str) {
        self.shutdowns.add(1, &[KeyValue::new("outcome", outcome)]);
    }

    /// The current exposition, Prometheus text format.
    pub(crate) fn render(&self) -> String {
        self.replay_batches();
        let mut out = String::new();
        if let Err(e) =
            prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out)
        {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }

    /// Moves new batch-size observations from the transport's bucket counters into the
    /// histogram (each bucket's upper bound stands for its batches; the boundaries match, so
    /// the exported buckets are exact).
    fn replay_batches(&self) {
        let mut replayed = self.replayed.lock().unwrap_or_else(PoisonError::into_inner);
        let sides = [
            (FRONTEND, self.frontend.as_ref().map(FrontendPlane::stats)),
            (WORKER, self.worker.as_ref().map(WorkerPlane::stats)),
        ];
        for (i, (side, stats)) in sides.into_iter().enumerate() {
            let Some(stats) = stats else { continue };
            for (b, (&now, before)) in stats
                .mux
                .batch_records
                .iter()
                .zip(replayed[i].iter_mut())
                .enumerate()
            {
                let value = BATCH_RECORDS_BUCKETS
                    .get(b)
                    .copied()
                    .map_or(2048, u64::from);
                for _ in *before..now {
                    self.batch_records
                        .record(value, &[KeyValue::new("side", side)]);
                }
                *before = now;
            }
        }
    }
}

#[derive(Clone)]
struct Sides {
    frontend: Option<FrontendPlane>,
    worker: Option<WorkerPlane>,
}

impl Sides {
    fn each(&self) -> Vec<(&'static str, PlaneStats)> {
        let mut v = Vec::with_capacity(2);
        if let Some(f) = &self.frontend {
            v.push((FRONTEND, f.stats()));
        }
        if let Some(w) = &self.worker {
            v.push((WORKER, w.stats()));
        }
        v
    }
}

/// Prefix of the plane's own metric names.
const PREFIX: &str = "velo_response_";

/// Mux counters exported inside the `velo_response_streams_ended{reason}` family instead of
/// on their own, with their reason label.
const STREAM_ENDS: [(&str, &str); 5] = [
    ("streams_finished", "finished"),
    ("streams_errored", "errored"),
    ("streams_cancelled", "cancelled"),
    ("streams_lost", "lost"),
    ("streams_violated", "violated"),
];

/// Mux counters exported only through a gauge (`velo_response_lanes_connected`).
const IN_GAUGES: [&str; 2] = ["lanes_up", "lanes_closed"];

/// How one exported series reads a side's stats.
type Read = Box<dyn Fn(&PlaneStats) -> u64 + Send + Sync>;

/// Every counter the plane keeps, by the tables that declare them (`PlaneStats::COUNTERS`,
/// `MuxStats::COUNTERS`, `HandshakeStats::COUNTERS`): a counter added to one of them is
/// exported as `velo_response_<name>` with its doc line as help, and nothing else changes.
fn counters() -> Vec<(String, &'static str, Read)> {
    let plane = PlaneStats::COUNTERS
        .iter()
        .map(|c| (c.name, c.help, Box::new(c.read) as Read));
    let mux = MuxStats::COUNTERS
        .iter()
        .filter(|c| !IN_GAUGES.contains(&c.name) && !STREAM_ENDS.iter().any(|(n, _)| *n == c.name))
        .map(|c| {
            let read = c.read;
            (
                c.name,
                c.help,
                Box::new(move |s: &PlaneStats| read(&s.mux)) as Read,
            )
        });
    let handshake = HandshakeStats::COUNTERS.iter().map(|c| {
        let read = c.read;
        (
            c.name,
            c.help,
            Box::new(move |s: &PlaneStats| read(&s.handshake)) as Read,
        )
    });
    plane
        .chain(mux)
        .chain(handshake)
        .map(|(name, help, read)| (format!("{PREFIX}{name}"), help.trim(), read))
        .collect()
}

/// A counter read from each side's stats at scrape time.
fn observe_counter(meter: &Meter, sides: &Sides, name: String, help: &'static str, read: Read) {
    let sides = sides.clone();
    meter
        .u64_observable_counter(name)
        .with_description(help)
        .with_callback(move |obs| {
            for (side, s) in sides.each() {
                obs.observe(read(&s), &[KeyValue::new("side", side)]);
            }
        })
        .build();
}

/// A family of counters read from each side's stats, one series per label value.
fn observe_family(
    meter: &Meter,
    sides: &Sides,
    (name, help, label): (&'static str, &'static str, &'static str),
    series: Vec<(&'static str, Read)>,
) {
    let sides = sides.clone();
    meter
        .u64_observable_counter(name)
        .with_description(help)
        .with_callback(move |obs| {
            for (side, s) in sides.each() {
                for (value, read) in &series {
                    let labels = [KeyValue::new("side", side), KeyValue::new(label, *value)];
                    obs.observe(read(&s), &labels);
                }
            }
        })
        .build();
}

fn register_observables(meter: &Meter, sides: &Sides, active: Arc<Active>) {
    for (name, help, read) in counters() {
        observe_counter(meter, sides, name, help, read);
    }
    let mux_counter = |name: &str| -> Read {
        let c = MuxStats::COUNTERS
            .iter()
            .find(|c| c.name == name)
            .expect("STREAM_ENDS names mux counters (checked by a test)");
        let read = c.read;
        Box::new(move |s: &PlaneStats| read(&s.mux))
    };
    let ends = STREAM_ENDS
        .iter()
        .map(|&(name, reason)| (reason, mux_counter(name)))
        .collect();
    let family = (
        "velo_response_streams_ended",
        "Streams ended on the transport, by reason",
        "reason",
    );
    observe_family(meter, sides, family, ends);
    let flushes = FlushReason::ALL
        .iter()
        .map(|&r| {
            (
                r.name(),
                Box::new(move |s: &PlaneStats| s.mux.flushed(r)) as Read,
            )
        })
        .collect();
    let family = (
        "velo_response_flushes",
        "Batches written, by what flushed them",
        "reason",
    );
    observe_family(meter, sides, family, flushes);
    register_gauges(meter, sides, active);
}

/// Gauges, and the one counter Dynamo names without a side.
fn register_gauges(meter: &Meter, sides: &Sides, active: Arc<Active>) {
    let worker_only = sides.worker.clone();
    meter
        .u64_observable_counter("dynamo_component_cancellation")
        .with_description(
            "Response streams the frontend stopped or killed, counted once each (worker)",
        )
        .with_callback(move |obs| {
            let n = worker_only
                .as_ref()
                .map_or(0, |w| w.stats().cancellations());
            obs.observe(n, &[]);
        })
        .build();
    let lanes = sides.clone();
    meter
        .i64_observable_gauge("velo_response_lanes_connected")
        .with_description("Lanes up right now")
        .with_callback(move |obs| {
            for (side, s) in lanes.each() {
                let up = i64::try_from(s.lanes_connected()).unwrap_or(i64::MAX);
                obs.observe(up, &[KeyValue::new("side", side)]);
            }
        })
        .build();
    meter
        .u64_observable_gauge("velo_response_streams_active")
        .with_description("Response streams in flight through this service")
        .with_callback(move |obs| {
            obs.observe(
                active.frontend.load(Ordering::Relaxed),
                &[KeyValue::new("side", FRONTEND)],
            );
            obs.observe(
                active.worker.load(Ordering::Relaxed),
                &[KeyValue::new("side", WORKER)],
            );
        })
        .build();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_the_plane_keeps_is_exported_exactly_once() {
        let names: Vec<String> = counters().into_iter().map(|(n, _, _)| n).collect();
        for (i, n) in names.iter().enumerate() {
            assert!(!names[..i].contains(n), "{n} is exported twice");
        }
        for c in MuxStats::COUNTERS {
            let exported = names.contains(&format!("{PREFIX}{}", c.name))
                || STREAM_ENDS.iter().any(|(n, _)| *n == c.name)
                || IN_GAUGES.contains(&c.name);
            assert!(exported, "mux counter {} is not exported", c.name);
        }
        for (name, _) in STREAM_ENDS {
            assert!(
                MuxStats::COUNTERS.iter().any(|c| c.name == name),
                "STREAM_ENDS names {name}, which the mux does not count"
            );
        }
        for c in PlaneStats::COUNTERS.iter().chain([]) {
            assert!(names.contains(&format!("{PREFIX}{}", c.name)), "{}", c.name);
        }
        for c in HandshakeStats::COUNTERS {
            assert!(names.contains(&format!("{PREFIX}{}", c.name)), "{}", c.name);
        }
    }
}
