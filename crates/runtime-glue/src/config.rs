//! The service's configuration: the response plane's (from `response-plane`) plus the
//! runtime's own settings. One idiom, as in `response-plane`: a builder that validates when
//! built, fed by the environment (with optional command-line overrides) through
//! [`response_plane::env::Env`].

use std::net::SocketAddr;
use std::time::Duration;

use response_plane::env::Env;
use response_plane::{ConfigError, ResponsePlaneConfig};

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
/// Longest grace or teardown bound accepted (one hour).
pub const MAX_SHUTDOWN_WAIT: Duration = Duration::from_secs(3600);

/// Which sides of the response plane this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Registers streams and reads them (an HTTP frontend).
    Frontend,
    /// Opens streams and writes them (an inference worker).
    Worker,
    /// Both sides (one process serving itself, or tests).
    Both,
}

impl Role {
    /// Whether this process runs the frontend side.
    pub fn frontend(self) -> bool {
        matches!(self, Self::Frontend | Self::Both)
    }

    /// Whether this process runs the worker side.
    pub fn worker(self) -> bool {
        matches!(self, Self::Worker | Self::Both)
    }
}

/// Everything the service needs, validated: build it with [`ServiceConfig::builder`] or read
/// it with [`ServiceConfig::from_env`].
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    response_plane: ResponsePlaneConfig,
    role: Role,
    metrics_addr: Option<SocketAddr>,
    grace: Duration,
    teardown_timeout: Duration,
}

impl ServiceConfig {
    /// Defaults for `role`: the default plane, no metrics endpoint, 5 s grace, 10 s teardown.
    pub fn builder(role: Role) -> ServiceConfigBuilder {
        ServiceConfigBuilder(Self {
            response_plane: ResponsePlaneConfig::default(),
            role,
            metrics_addr: None,
            grace: DEFAULT_GRACE,
            teardown_timeout: DEFAULT_TEARDOWN_TIMEOUT,
        })
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> ServiceConfigBuilder {
        ServiceConfigBuilder(self.clone())
    }

    /// Reads the process environment.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable, its value and what is allowed.
    pub fn from_env(role: Role) -> Result<Self, ConfigError> {
        Self::from_lookup(role, response_plane::env::var)
    }

    /// Reads the environment with `args` overriding it.
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    pub fn from_args(role: Role, args: &ServiceArgs) -> Result<Self, ConfigError> {
        Self::from_lookup(role, |var| {
            args.get(var).or_else(|| response_plane::env::var(var))
        })
    }

    /// Reads the settings through `lookup`.
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(
        role: Role,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        Self::builder(role).env(&Env::new(lookup))?.build()
    }

    /// The response plane's settings.
    pub fn response_plane(&self) -> &ResponsePlaneConfig {
        &self.response_plane
    }

    /// Which sides run.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The Prometheus endpoint's address, if any (bounded: see the crate docs, "Metrics
    /// endpoint").
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Time open streams get to finish at shutdown.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Hard bound on transport teardown.
    pub fn teardown_timeout(&self) -> Duration {
        self.teardown_timeout
    }
}

/// Builds a [`ServiceConfig`]; [`build`](Self::build) checks every value.
#[derive(Debug, Clone)]
#[must_use]
pub struct ServiceConfigBuilder(ServiceConfig);

impl ServiceConfigBuilder {
    /// The response plane's settings (already validated by their own builder).
    pub fn response_plane(mut self, config: ResponsePlaneConfig) -> Self {
        self.0.response_plane = config;
        self
    }

    /// Which sides run.
    pub fn role(mut self, role: Role) -> Self {
        self.0.role = role;
        self
    }

    /// Serve metrics on `addr` (`None`: no endpoint).
    pub fn metrics_addr(mut self, addr: Option<SocketAddr>) -> Self {
        self.0.metrics_addr = addr;
        self
    }

    /// Time open streams get to finish at shutdown, at most [`MAX_SHUTDOWN_WAIT`].
    pub fn grace(mut self, grace: Duration) -> Self {
        self.0.grace = grace;
        self
    }

    /// Hard bound on transport teardown, at most [`MAX_SHUTDOWN_WAIT`].
    pub fn teardown_timeout(mut self, timeout: Duration) -> Self {
        self.0.teardown_timeout = timeout;
        self
    }

    /// Applies the variables `env` sets, the response plane's included (others keep their
    /// current value).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidEnv`] naming the variable, its value and what is allowed.
    pub fn env<F: Fn(&str) -> Option<String>>(mut self, env: &Env<F>) -> Result<Self, ConfigError> {
        let c = &mut self.0;
        c.response_plane = c.response_plane.to_builder().env(env)?.build()?;
        let addr = "expected host:port, e.g. 0.0.0.0:9090";
        if let Some(a) = env.parsed(ENV_METRICS_ADDR, addr)? {
            c.metrics_addr = Some(a);
        }
        const MS: &str = "expected a whole number of milliseconds up to 3600000";
        let max = u64::try_from(MAX_SHUTDOWN_WAIT.as_millis()).unwrap_or(u64::MAX);
        if let Some(g) = env.millis(ENV_GRACE_MS, max, MS)? {
            c.grace = g;
        }
        if let Some(t) = env.millis(ENV_TEARDOWN_MS, max, MS)? {
            c.teardown_timeout = t;
        }
        Ok(self)
    }

    /// Checks every value.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming the setting.
    pub fn build(self) -> Result<ServiceConfig, ConfigError> {
        let c = self.0;
        for (setting, value) in [("grace", c.grace), ("teardown timeout", c.teardown_timeout)] {
            if value > MAX_SHUTDOWN_WAIT {
                return Err(ConfigError::OutOfRange {
                    setting,
                    value: format!("{value:?}"),
                    allowed: "at most one hour",
                });
            }
        }
        Ok(c)
    }
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
