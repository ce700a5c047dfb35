//! The command line: `velo-serve` (a frontend plus spawned mock workers, the one-command
//! start), `velo-serve frontend`, `velo-serve worker` (the roles apart, on one host or
//! several), and `velo-serve load` (the load generator behind `cargo xtask serve-bench`).
//! Response-plane settings come from the environment (`DYN_RESPONSE_PLANE`, ...), with `velo`
//! the default plane here.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use response_plane::{ConfigError, ENV_HOST, ENV_PLANE};
use runtime_glue::{Role, ServiceConfig};

use crate::discovery::{DiscoveryConfig, DiscoveryConfigError};
use crate::frontend::FrontendConfig;
use crate::frontend::admission::AdmissionLimits;
use crate::openai::Limits;
use crate::work::WorkLimits;
use crate::worker::WorkerConfig;

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "velo-serve",
    version,
    about = "An OpenAI-compatible streaming frontend on the velo response plane, with mock workers"
)]
pub struct Cli {
    /// A role to run alone; without one, a frontend and `--workers` mock worker processes.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The one-command start's settings.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The roles.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// The HTTP frontend alone (workers are found through discovery).
    Frontend(FrontendArgs),
    /// One mock worker process.
    Worker(WorkerArgs),
    /// The load generator: drives a running velo-serve over HTTP and reports.
    Load(crate::load::LoadArgs),
}

/// The one-command start: a frontend and worker processes.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The frontend's settings.
    #[command(flatten)]
    pub frontend: FrontendArgs,
    /// The workers' engine settings.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The workers' request-plane bounds.
    #[command(flatten)]
    pub work_limits: WorkLimitArgs,
    /// Mock worker processes to spawn.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
}

/// The frontend's settings.
#[derive(Debug, Clone, clap::Args)]
pub struct FrontendArgs {
    /// Where HTTP listens.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub http: SocketAddr,
    /// The model name served.
    #[arg(long, default_value = "velo-mock")]
    pub model: String,
    /// Most tokens one request may generate.
    #[arg(long, default_value_t = 8192)]
    pub max_tokens: u32,
    /// The model's context: most prompt plus generated tokens.
    #[arg(long, default_value_t = 32768)]
    pub context_tokens: u32,
    /// Requests served at once.
    #[arg(long, default_value_t = 4096)]
    pub max_in_flight: usize,
    /// Requests waiting for a turn before new ones get 503.
    #[arg(long, default_value_t = 1024)]
    pub max_queued: usize,
    /// Longest wait for a turn, ms.
    #[arg(long, default_value_t = 5000)]
    pub queue_timeout_ms: u64,
    /// Longest wait for a worker's prologue, ms, in all (every attempt shares it).
    #[arg(long, default_value_t = 30_000)]
    pub establish_timeout_ms: u64,
    /// How long a removed worker's streams may keep generating, ms.
    #[arg(long, default_value_t = 10_000)]
    pub removal_grace_ms: u64,
    /// How long a request's stream may go without an item (the first included) before the
    /// request fails, ms: an engine stalled on a live worker.
    #[arg(long, default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub item_timeout_ms: u64,
    /// Run the response plane on a thread of its own (`velo-plane`), so its CPU time can be
    /// told apart from the HTTP side's (serve-bench uses it).
    #[arg(long)]
    pub plane_thread: bool,
    /// Discovery settings.
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
}

/// Discovery settings.
#[derive(Debug, Clone, clap::Args)]
pub struct DiscoveryArgs {
    /// Lease TTL of discovery records, ms (Dynamo's: 10 s).
    #[arg(long, default_value_t = 10_000)]
    pub lease_ttl_ms: u64,
}

/// A worker's engine settings.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Mock engines per worker process.
    #[arg(long, default_value_t = 4)]
    pub engines: u32,
    /// The mocker's speedup ratio.
    #[arg(long, default_value_t = 10.0)]
    pub speedup: f64,
    /// Flush the response plane once per engine forward pass.
    #[arg(long)]
    pub flush_per_pass: bool,
}

/// A worker's request-plane bounds: what it holds, whatever its peers send.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkLimitArgs {
    /// Requests a worker holds at once (read off its request plane, not yet finished); at the
    /// limit it stops reading requests until one finishes.
    #[arg(long, default_value_t = crate::work::DEFAULT_MAX_REQUESTS)]
    pub max_requests: usize,
    /// Request-plane connections (from frontends) a worker serves at once; more wait to be
    /// accepted until one ends.
    #[arg(long, default_value_t = crate::work::DEFAULT_MAX_CONNECTIONS)]
    pub max_request_connections: usize,
}

impl WorkLimitArgs {
    /// The bounds (checked when the worker starts).
    pub fn limits(&self) -> WorkLimits {
        WorkLimits {
            max_requests: self.max_requests,
            max_connections: self.max_request_connections,
        }
    }
}

/// One worker process.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Engine settings.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Request-plane bounds.
    #[command(flatten)]
    pub work_limits: WorkLimitArgs,
    /// Discovery settings.
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
    /// The address the request plane listens on and advertises. (Shutdown bounds and a
    /// metrics endpoint come from runtime-glue's `DYN_VELO_SHUTDOWN_GRACE_MS`,
    /// `DYN_VELO_TEARDOWN_TIMEOUT_MS` and `DYN_VELO_METRICS_ADDR`.)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Shut down when standard input ends: the one-command start passes a pipe, so its workers
    /// exit with it however it ends (a SIGKILL included).
    #[arg(long, hide = true)]
    pub exit_with_stdin: bool,
}

/// A setting that stops start-up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// A response-plane setting.
    #[error(transparent)]
    Plane(#[from] ConfigError),
    /// A discovery setting.
    #[error(transparent)]
    Discovery(#[from] DiscoveryConfigError),
}

/// Which host the plane listens on when the environment does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaneHost {
    /// The plane's own default (every interface, this host's routable address advertised).
    Routable,
    /// Loopback: everything runs on this host.
    Loopback,
}

/// The response-plane service's settings for `role` from the environment (the plane's
/// `DYN_*` variables, runtime-glue's `DYN_VELO_METRICS_ADDR` and shutdown bounds), with the
/// `velo` plane unless `DYN_RESPONSE_PLANE` says otherwise.
///
/// # Errors
///
/// [`ConfigError`] naming the variable, its value and what is allowed.
pub fn service_config(role: Role, host: PlaneHost) -> Result<ServiceConfig, ConfigError> {
    ServiceConfig::from_lookup(role, |var| {
        response_plane::env::var(var).or_else(|| match var {
            ENV_PLANE => Some("velo".to_owned()),
            ENV_HOST if host == PlaneHost::Loopback => Some(Ipv4Addr::LOCALHOST.to_string()),
            _ => None,
        })
    })
}

/// Discovery settings from the environment.
///
/// # Errors
///
/// [`DiscoveryConfigError`].
pub fn discovery_config(args: &DiscoveryArgs) -> Result<DiscoveryConfig, DiscoveryConfigError> {
    DiscoveryConfig::from_lookup(
        response_plane::env::var,
        Duration::from_millis(args.lease_ttl_ms),
    )
}

impl FrontendArgs {
    /// The frontend's configuration.
    ///
    /// # Errors
    ///
    /// [`SettingsError`].
    pub fn config(&self, host: PlaneHost) -> Result<FrontendConfig, SettingsError> {
        Ok(FrontendConfig {
            http: self.http,
            model: self.model.clone(),
            limits: Limits {
                max_tokens: self.max_tokens,
                context_tokens: self.context_tokens,
            },
            admission: AdmissionLimits {
                max_in_flight: self.max_in_flight.max(1),
                max_queued: self.max_queued,
                queue_timeout: Duration::from_millis(self.queue_timeout_ms),
            },
            establish_timeout: Duration::from_millis(self.establish_timeout_ms),
            max_attempts: crate::frontend::DEFAULT_MAX_ATTEMPTS,
            removal_grace: Duration::from_millis(self.removal_grace_ms),
            item_timeout: Duration::from_millis(self.item_timeout_ms),
            max_body_bytes: crate::frontend::DEFAULT_MAX_BODY_BYTES,
            http_limits: crate::frontend::http::HttpLimits::default(),
            service: service_config(Role::Frontend, host)?,
            plane_thread: self.plane_thread,
            discovery: discovery_config(&self.discovery)?,
        })
    }
}

impl WorkerArgs {
    /// The worker's configuration.
    ///
    /// # Errors
    ///
    /// [`SettingsError`].
    pub fn config(&self) -> Result<WorkerConfig, SettingsError> {
        Ok(WorkerConfig {
            service: service_config(Role::Worker, PlaneHost::Routable)?,
            discovery: discovery_config(&self.discovery)?,
            engines: self.engine.engines,
            speedup: self.engine.speedup,
            host: self.host,
            flush_per_pass: self.engine.flush_per_pass,
            work_limits: self.work_limits.limits(),
        })
    }
}
