//! The load generator behind `cargo xtask serve-bench`: drives a running velo-serve over HTTP
//! as an OpenAI client would (streaming chat completions, SSE parsed per chunk), either
//! open-loop (Poisson arrivals at `--rate` requests/s) or closed-loop (`--concurrency` users,
//! each sending its next request when the last one ended), and reports client-side figures
//! ([`report`]) plus the frontend process's CPU per token, split by thread (`cpu`).

pub mod cpu;
pub mod report;
pub mod run;

use std::net::SocketAddr;

pub use run::run;

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// `--concurrency` users, each sending its next request when the last ended.
    Closed,
    /// Poisson arrivals at `--rate` requests/s.
    Open,
}

/// The load generator's settings.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// The frontend's HTTP address.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub addr: SocketAddr,
    /// The model name.
    #[arg(long, default_value = "velo-mock")]
    pub model: String,
    /// Closed or open loop.
    #[arg(long, value_enum, default_value_t = Mode::Closed)]
    pub mode: Mode,
    /// Users (closed loop).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Arrivals per second (open loop).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Most requests outstanding in the open loop; arrivals past it are not sent (counted as
    /// dropped arrivals).
    #[arg(long, default_value_t = 8192)]
    pub max_outstanding: usize,
    /// Prompt length in words (about one token each).
    #[arg(long, default_value_t = 128)]
    pub isl: usize,
    /// Output tokens per request (`max_tokens` with `ignore_eos`).
    #[arg(long, default_value_t = 128)]
    pub osl: u32,
    /// Seconds of load before the measurement window.
    #[arg(long, default_value_t = 2.0)]
    pub warmup_s: f64,
    /// Seconds of the measurement window.
    #[arg(long, default_value_t = 8.0)]
    pub duration_s: f64,
    /// Seconds to wait for the frontend to report healthy first.
    #[arg(long, default_value_t = 60.0)]
    pub wait_ready_s: f64,
    /// The frontend process, for its CPU time (0: not measured).
    #[arg(long, default_value_t = 0)]
    pub frontend_pid: u32,
    /// A label for the report (the plane's name).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}
