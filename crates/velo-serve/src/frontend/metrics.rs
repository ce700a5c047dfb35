//! The frontend's HTTP metrics under Dynamo's `dynamo_frontend_*` names: request counters by
//! endpoint, type and outcome, in-flight and queued gauges, and histograms of time to first
//! token, inter-token latency, request duration and sequence lengths. Plain atomics on the hot
//! path, rendered in the Prometheus text format at scrape time (the response plane's own
//! metrics come from runtime-glue and are served beside these).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::openai::Endpoint;

/// How a request ended, as Dynamo's `error_type` label says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Served.
    Success,
    /// 400: the request was invalid.
    Validation,
    /// 404: no such model.
    NotFound,
    /// 503: too much load, or no worker.
    Overload,
    /// The client went away.
    Cancelled,
    /// The service failed (a worker was lost, an engine error).
    Internal,
}

const OUTCOMES: [Outcome; 6] = [
    Outcome::Success,
    Outcome::Validation,
    Outcome::NotFound,
    Outcome::Overload,
    Outcome::Cancelled,
    Outcome::Internal,
];

impl Outcome {
    fn error_type(self) -> &'static str {
        match self {
            Self::Success => "",
            Self::Validation => "validation",
            Self::NotFound => "not_found",
            Self::Overload => "overload",
            Self::Cancelled => "cancelled",
            Self::Internal => "internal",
        }
    }

    fn status(self) -> &'static str {
        match self {
            Self::Success => "success",
            _ => "error",
        }
    }

    /// The outcome of an HTTP error status.
    pub fn of_status(status: u16) -> Self {
        match status {
            400..=403 | 405..=499 => Self::Validation,
            404 => Self::NotFound,
            503 => Self::Overload,
            _ => Self::Internal,
        }
    }
}

/// Histogram boundaries for latencies, in seconds: 0.1 ms to 60 s.
pub const LATENCY_BUCKETS: [f64; 20] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];
/// Histogram boundaries for sequence lengths, in tokens.
pub const TOKEN_BUCKETS: [f64; 12] = [
    1.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// A histogram of fixed buckets; the sum is kept in millionths.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records `value`.
    pub fn observe(&self, value: f64) {
        let i = self.bounds.partition_point(|&b| b < value);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        // Values are non-negative seconds or token counts; a millionth is plenty.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let micros = (value.max(0.0) * 1e6) as u64;
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The sum of the samples recorded (to a millionth).
    pub fn sum(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        sum
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0u64;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.counts.last().map_or(0, |c| c.load(Ordering::Relaxed));
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        #[allow(clippy::cast_precision_loss)]
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

/// The frontend's counters.
#[derive(Debug)]
pub struct FrontendMetrics {
    model: String,
    /// [endpoint][streaming][outcome]
    requests: [[[AtomicU64; OUTCOMES.len()]; 2]; 2],
    /// Requests being served (past admission).
    pub inflight: AtomicU64,
    /// Clients that went away before their answer was complete (streamed or unary, from
    /// admission on), since start. It only grows: Dynamo exposes its
    /// `dynamo_frontend_disconnected_clients` as a gauge it only ever increments, and this
    /// keeps its name and type so Dynamo's dashboards read it (take its `rate`).
    pub disconnected: AtomicU64,
    /// Clients killed for not reading (their buffer filled).
    pub slow_clients: AtomicU64,
    /// Requests retried on another worker before their first token.
    pub migrations: AtomicU64,
    /// Tokens sent to clients: queued for a streamed answer, or in a unary answer (a token
    /// dropped when its client was cut, or that a failed request never sent, is not counted).
    pub output_tokens: AtomicU64,
    /// Time to first token.
    pub ttft: Histogram,
    /// Gap between consecutive tokens.
    pub itl: Histogram,
    /// Request duration.
    pub duration: Histogram,
    /// Prompt tokens per request.
    pub isl: Histogram,
    /// Generated tokens per request.
    pub osl: Histogram,
}

impl FrontendMetrics {
    /// Counters for `model`.
    pub fn new(model: &str) -> Self {
        Self {
            model: model.replace(['"', '\\', '\n'], "_"),
            requests: Default::default(),
            inflight: AtomicU64::new(0),
            disconnected: AtomicU64::new(0),
            slow_clients: AtomicU64::new(0),
            migrations: AtomicU64::new(0),
            output_tokens: AtomicU64::new(0),
            ttft: Histogram::new(&LATENCY_BUCKETS),
            itl: Histogram::new(&LATENCY_BUCKETS),
            duration: Histogram::new(&LATENCY_BUCKETS),
            isl: Histogram::new(&TOKEN_BUCKETS),
            osl: Histogram::new(&TOKEN_BUCKETS),
        }
    }

    /// Counts a finished request.
    pub fn request(&self, endpoint: Endpoint, streaming: bool, outcome: Outcome) {
        let e = usize::from(endpoint == Endpoint::Completion);
        let o = OUTCOMES.iter().position(|&x| x == outcome).unwrap_or(0);
        self.requests[e][usize::from(streaming)][o].fetch_add(1, Ordering::Relaxed);
    }

    /// Records a duration histogram value.
    pub fn seconds(h: &Histogram, d: Duration) {
        h.observe(d.as_secs_f64());
    }

    /// Requests counted with `outcome` so far (every endpoint and type).
    pub fn requests_with(&self, outcome: Outcome) -> u64 {
        let o = OUTCOMES.iter().position(|&x| x == outcome).unwrap_or(0);
        self.requests
            .iter()
            .flatten()
            .map(|by| by[o].load(Ordering::Relaxed))
            .sum()
    }

    /// The Prometheus text exposition, `queued` requests waiting for admission.
    pub fn render(&self, queued: usize) -> String {
        let mut out = String::with_capacity(8192);
        self.render_requests(&mut out);
        self.render_gauges_and_counters(&mut out, queued);
        let labels = format!("model=\"{}\"", self.model);
        let histograms = [
            (
                &self.ttft,
                "dynamo_frontend_time_to_first_token_seconds",
                "Time to first token",
            ),
            (
                &self.itl,
                "dynamo_frontend_inter_token_latency_seconds",
                "Time between consecutive tokens",
            ),
            (
                &self.duration,
                "dynamo_frontend_request_duration_seconds",
                "Request duration",
            ),
            (
                &self.isl,
                "dynamo_frontend_input_sequence_tokens",
                "Prompt tokens per request",
            ),
            (
                &self.osl,
                "dynamo_frontend_output_sequence_tokens",
                "Generated tokens per request",
            ),
        ];
        for (h, name, help) in histograms {
            h.render(&mut out, name, &labels, help);
        }
        out
    }

    fn render_requests(&self, out: &mut String) {
        let m = &self.model;
        let name = "dynamo_frontend_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} LLM requests processed\n# TYPE {name} counter"
        );
        for (e, endpoint) in [Endpoint::Chat, Endpoint::Completion].iter().enumerate() {
            for (s, kind) in ["unary", "stream"].iter().enumerate() {
                for (o, outcome) in OUTCOMES.iter().enumerate() {
                    let v = self.requests[e][s][o].load(Ordering::Relaxed);
                    let _ = writeln!(
                        out,
                        "{name}{{model=\"{m}\",endpoint=\"{}\",request_type=\"{kind}\",status=\"{}\",error_type=\"{}\"}} {v}",
                        endpoint.name(),
                        outcome.status(),
                        outcome.error_type()
                    );
                }
            }
        }
    }

    fn render_gauges_and_counters(&self, out: &mut String, queued: usize) {
        let m = &self.model;
        let gauges = [
            (
                "dynamo_frontend_inflight_requests",
                "Requests being served",
                self.inflight.load(Ordering::Relaxed),
            ),
            (
                "dynamo_frontend_queued_requests",
                "Requests waiting for admission",
                u64::try_from(queued).unwrap_or(u64::MAX),
            ),
            (
                "dynamo_frontend_disconnected_clients",
                "Clients that disconnected before their answer was complete, since start (only grows)",
                self.disconnected.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{model=\"{m}\"}} {v}"
            );
        }
        let counters = [
            (
                "dynamo_frontend_output_tokens_total",
                "Tokens sent to clients",
                "",
                self.output_tokens.load(Ordering::Relaxed),
            ),
            (
                "dynamo_frontend_model_migration_total",
                "Requests retried on another worker",
                ",migration_type=\"new_request\"",
                self.migrations.load(Ordering::Relaxed),
            ),
            (
                "velo_serve_slow_clients_total",
                "Streams ended because their client did not read",
                "",
                self.slow_clients.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, extra, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{model=\"{m}\"{extra}}} {v}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_an_inf_bucket() {
        let h = Histogram::new(&TOKEN_BUCKETS);
        h.observe(10.0);
        h.observe(10_000.0);
        h.observe(1e9);
        let mut out = String::new();
        h.render(&mut out, "x", "model=\"m\"", "help");
        assert!(out.contains("x_bucket{model=\"m\",le=\"16\"} 1\n"), "{out}");
        assert!(
            out.contains("x_bucket{model=\"m\",le=\"16384\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{model=\"m\",le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("x_count{model=\"m\"} 3\n"), "{out}");
    }
}
