//! The service's configuration: the response plane's (from `response-plane`) plus the
//! runtime's own settings, from the environment with optional command-line overrides.

use std::net::SocketAddr;
use std::time::Duration;

use response_plane::ResponsePlaneConfig;

use crate::StartupError;

/// `DYN_VELO_METRICS_ADDR`: where the Prometheus endpoint listens (`host:port`); unset: no
/// endpoint.
pub const ENV_METRICS_ADDR: &str = "DYN_VELO_METRICS_ADDR";
/// `DYN_VELO_SHUTDOWN_GRACE_MS`: how long shutdown lets open streams finish (default 5000).
pub const ENV_GRACE_MS: &str = "DYN_VELO_SHUTDOWN_GRACE_MS";
/// `DYN_VELO_TEARDOWN_TIMEOUT_MS`: hard bound on tearing the transports down (default 10000).
pub const ENV_TEARDOWN_MS: &str = "DYN_VELO_TEARDOWN_TIMEOUT_MS";

/// Default grace period for open streams at shutdown.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// Default hard bound on transport teardown (Dynamo PR #15231: 10 s).
pub const DEFAULT_TEARDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest grace or teardown bound accepted, in ms (one hour).
const MAX_MS: u64 = 3_600_000;

/// Which sides of the response plane this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Roles {
    /// Registers streams and reads them (an HTTP frontend).
    pub frontend: bool,
    /// Opens streams and writes them (an inference worker).
    pub worker: bool,
}

impl Roles {
    /// Only the frontend side.
    pub const FRONTEND: Self = Self {
        frontend: true,
        worker: false,
    };
    /// Only the worker side.
    pub const WORKER: Self = Self {
        frontend: false,
        worker: true,
    };
    /// Both sides (one process serving itself, or tests).
    pub const BOTH: Self = Self {
        frontend: true,
        worker: true,
    };
}

/// Everything the service needs, validated.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// The response plane.
    pub plane: ResponsePlaneConfig,
    /// Which sides run.
    pub roles: Roles,
    /// The Prometheus endpoint's address, if any (bounded: see the crate docs, "Metrics
    /// endpoint").
    pub metrics_addr: Option<SocketAddr>,
    /// Time open streams get to finish at shutdown.
    pub grace: Duration,
    /// Hard bound on transport teardown.
    pub teardown_timeout: Duration,
}

/// Command-line overrides of the environment (each flag wins over its variable).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServiceArgs {
    /// Response plane: `tcp` (classic) or `velo` [env: DYN_RESPONSE_PLANE].
    #[arg(long)]
    pub response_plane: Option<String>,
    /// Velo transport: `tcp` or `ucx` [env: DYN_VELO_RESPONSE_TRANSPORT].
    #[arg(long)]
    pub velo_transport: Option<String>,
    /// Velo batching delay in ms; 0 is greedy [env: DYN_VELO_RESPONSE_BATCH_MS].
    #[arg(long)]
    pub velo_batch_ms: Option<String>,
    /// Prometheus endpoint address [env: DYN_VELO_METRICS_ADDR].
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Shutdown grace for open streams, ms [env: DYN_VELO_SHUTDOWN_GRACE_MS].
    #[arg(long)]
    pub shutdown_grace_ms: Option<String>,
    /// Hard bound on transport teardown, ms [env: DYN_VELO_TEARDOWN_TIMEOUT_MS].
    #[arg(long)]
    pub teardown_timeout_ms: Option<String>,
}

impl ServiceArgs {
    /// The flag that overrides `var`, if given.
    fn get(&self, var: &str) -> Option<String> {
        match var {
            response_plane::ENV_PLANE => self.response_plane.clone(),
            response_plane::ENV_TRANSPORT => self.velo_transport.clone(),
            response_plane::ENV_BATCH_MS => self.velo_batch_ms.clone(),
            ENV_METRICS_ADDR => self.metrics_addr.clone(),
            ENV_GRACE_MS => self.shutdown_grace_ms.clone(),
            ENV_TEARDOWN_MS => self.teardown_timeout_ms.clone(),
            _ => None,
        }
    }
}

impl ServiceConfig {
    /// Reads the process environment.
    ///
    /// # Errors
    ///
    /// [`StartupError::Config`] or [`StartupError::InvalidEnv`], naming the variable, its value
    /// and what is allowed.
    pub fn from_env(roles: Roles) -> Result<Self, StartupError> {
        Self::from_lookup(roles, |var| std::env::var(var).ok())
    }

    /// Reads the environment with `args` overriding it.
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    pub fn from_args(roles: Roles, args: &ServiceArgs) -> Result<Self, StartupError> {
        Self::from_lookup(roles, |var| {
            args.get(var).or_else(|| std::env::var(var).ok())
        })
    }

    /// Reads the settings through `lookup`.
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(
        roles: Roles,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, StartupError> {
        let plane = ResponsePlaneConfig::from_lookup(&lookup)?;
        let metrics_addr = match lookup(ENV_METRICS_ADDR) {
            None => None,
            Some(v) => Some(v.parse().map_err(|_| {
                invalid(ENV_METRICS_ADDR, v, "expected host:port, e.g. 0.0.0.0:9090")
            })?),
        };
        let ms = |var: &'static str, default: Duration| -> Result<Duration, StartupError> {
            match lookup(var) {
                None => Ok(default),
                Some(v) => digits(&v)
                    .filter(|&ms| ms <= MAX_MS)
                    .map(Duration::from_millis)
                    .ok_or_else(|| {
                        invalid(
                            var,
                            v,
                            "expected a whole number of milliseconds up to 3600000",
                        )
                    }),
            }
        };
        Ok(Self {
            plane,
            roles,
            metrics_addr,
            grace: ms(ENV_GRACE_MS, DEFAULT_GRACE)?,
            teardown_timeout: ms(ENV_TEARDOWN_MS, DEFAULT_TEARDOWN_TIMEOUT)?,
        })
    }
}

fn invalid(var: &'static str, value: String, allowed: &'static str) -> StartupError {
    StartupError::InvalidEnv {
        var,
        value,
        allowed,
    }
}

fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
