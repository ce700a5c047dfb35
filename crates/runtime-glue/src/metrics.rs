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
    BATCH_RECORDS_BUCKETS, FLUSH_REASONS, FrontendPlane, PlaneStats, WorkerPlane,
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

/// A counter read from each side's stats at scrape time.
fn observe_counter(
    meter: &Meter,
    sides: &Sides,
    name: &'static str,
    help: &'static str,
    read: fn(&PlaneStats) -> u64,
) {
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

fn register_observables(meter: &Meter, sides: &Sides, active: Arc<Active>) {
    let worker_only = Sides {
        frontend: None,
        worker: sides.worker.clone(),
    };
    {
        let sides = worker_only;
        meter
            .u64_observable_counter("dynamo_component_cancellation")
            .with_description(
                "Response streams the frontend stopped or killed, counted once each (worker)",
            )
            .with_callback(move |obs| {
                let n: u64 = sides.each().iter().map(|(_, s)| s.cancellations).sum();
                obs.observe(n, &[]);
            })
            .build();
    }
    observe_counter(
        meter,
        sides,
        "velo_response_streams_registered",
        "Streams registered (frontend)",
        |s| s.streams_registered,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_streams_established",
        "Streams whose prologue arrived (frontend) or that were set up (worker)",
        |s| s.streams_established,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_streams_opened",
        "Streams opened on the transport",
        |s| s.streams_opened,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_records_sent",
        "Records written",
        |s| s.records_sent,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_records_received",
        "Records read",
        |s| s.records_received,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_bytes_sent",
        "Bytes written to the transport",
        |s| s.bytes_sent,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_bytes_received",
        "Bytes read from the transport",
        |s| s.bytes_received,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_batches_sent",
        "Batches written",
        |s| s.batches_sent,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_credit_stalls",
        "Sends that waited for credit",
        |s| s.credit_stalls,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_stale_drops",
        "Records dropped for naming a stream that is gone",
        |s| s.stale_drops,
    );
    observe_counter(
        meter,
        sides,
        "velo_response_handshake_failures",
        "Connections whose handshake failed or timed out",
        |s| s.handshake_failures,
    );
    {
        let sides = sides.clone();
        meter
            .u64_observable_counter("velo_response_streams_ended")
            .with_description("Streams ended on the transport, by reason")
            .with_callback(move |obs| {
                for (side, s) in sides.each() {
                    for (reason, n) in [
                        ("finished", s.streams_finished),
                        ("errored", s.streams_errored),
                        ("cancelled", s.streams_cancelled),
                        ("lost", s.streams_lost),
                    ] {
                        obs.observe(
                            n,
                            &[KeyValue::new("side", side), KeyValue::new("reason", reason)],
                        );
                    }
                }
            })
            .build();
    }
    {
        let sides = sides.clone();
        meter
            .u64_observable_counter("velo_response_flushes")
            .with_description("Batches written, by what flushed them")
            .with_callback(move |obs| {
                for (side, s) in sides.each() {
                    for (reason, n) in FLUSH_REASONS.iter().zip(s.flush_reasons) {
                        obs.observe(
                            n,
                            &[
                                KeyValue::new("side", side),
                                KeyValue::new("reason", *reason),
                            ],
                        );
                    }
                }
            })
            .build();
    }
    {
        let sides = sides.clone();
        meter
            .i64_observable_gauge("velo_response_lanes_connected")
            .with_description("Lanes up right now")
            .with_callback(move |obs| {
                for (side, s) in sides.each() {
                    let up = i64::try_from(s.lanes_up).unwrap_or(i64::MAX)
                        - i64::try_from(s.lanes_closed).unwrap_or(0);
                    obs.observe(up.max(0), &[KeyValue::new("side", side)]);
                }
            })
            .build();
    }
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
