//! Plane selection and settings, from the environment as Dynamo names them.

use std::net::IpAddr;
use std::time::Duration;

/// `DYN_RESPONSE_PLANE`: `tcp` (default, the classic plane) or `velo`.
pub const ENV_PLANE: &str = "DYN_RESPONSE_PLANE";
/// `DYN_VELO_RESPONSE_TRANSPORT`: `tcp` (default) or `ucx`.
pub const ENV_TRANSPORT: &str = "DYN_VELO_RESPONSE_TRANSPORT";
/// `DYN_VELO_RESPONSE_BATCH_MS`: maximum batching delay in ms; 0 is greedy (default 5).
pub const ENV_BATCH_MS: &str = "DYN_VELO_RESPONSE_BATCH_MS";
/// `DYN_TCP_RESPONSE_STREAM_HOST`: the address a frontend listens on and advertises.
pub const ENV_HOST: &str = "DYN_TCP_RESPONSE_STREAM_HOST";
/// `DYN_TCP_RESPONSE_STREAM_PORT`: the port a frontend listens on (default 0: any).
pub const ENV_PORT: &str = "DYN_TCP_RESPONSE_STREAM_PORT";
/// `DYN_TCP_MAX_MESSAGE_SIZE`: the largest frame or message in bytes (default 32 MiB).
pub const ENV_MAX_MESSAGE_SIZE: &str = "DYN_TCP_MAX_MESSAGE_SIZE";

/// Default batching delay: 5 ms (Dynamo PR #15231).
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(5);
/// Longest batching delay accepted from the environment, in ms.
pub const MAX_BATCH_MS: u64 = 10_000;
/// Default largest message: 32 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: u32 = 33_554_432;

/// Which response plane a process uses. Frontend and worker must agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plane {
    /// The classic plane: one TCP connection per response stream.
    Tcp,
    /// The velo plane: streams multiplexed over a few lanes per worker and frontend.
    Velo,
}

impl Plane {
    /// The name used in `DYN_RESPONSE_PLANE` and in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Velo => "velo",
        }
    }
}

/// What the velo plane's lanes run over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VeloTransport {
    /// TCP connections.
    Tcp,
    /// UCX active messages (RDMA fabrics); needs the `ucx` feature.
    Ucx,
}

impl VeloTransport {
    /// The name used in `DYN_VELO_RESPONSE_TRANSPORT`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Ucx => "ucx",
        }
    }
}

/// When the velo plane writes a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// Write whenever anything is pending.
    Greedy,
    /// Wait at most this long for a batch to fill.
    Delay(Duration),
}

/// The response plane's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResponsePlaneConfig {
    /// Which plane.
    pub plane: Plane,
    /// The velo plane's transport.
    pub transport: VeloTransport,
    /// The velo plane's batching.
    pub batching: Batching,
    /// Where a frontend listens and what it advertises; `None` listens on every interface
    /// and advertises this host's routable address.
    pub host: Option<IpAddr>,
    /// The port a frontend listens on; 0 lets the OS choose.
    pub port: u16,
    /// Largest frame (velo) or message (classic), in bytes.
    pub max_message_size: u32,
    /// Lanes per worker and frontend (velo).
    pub lanes: u16,
    /// Credit window per stream, in items (velo).
    pub window: u32,
    /// The liveness bound, on both planes (default 10 s, `velo_mux::DEFAULT_IDLE_TIMEOUT`).
    /// A velo lane silent this long is declared dead (heartbeats keep live ones talking).
    /// Every TCP socket of either plane gives up on a peer that vanished without a FIN or RST
    /// within it: `TCP_USER_TIMEOUT` for unacknowledged data, keepalive probes from a third
    /// of it on for idle connections (a live but quiet peer answers them and is never cut).
    /// A classic worker whose stream ended waits at most this long for the frontend to close
    /// the connection before it stops watching.
    pub idle_timeout: Duration,
    /// Flush a stream's prologue, first item and end at once, whatever the batching delay
    /// (velo; on by default): TTFT and completion never wait for a batch, the items in
    /// between do. Off reproduces a plain fixed delay (Dynamo PR #15231's 5 ms arm).
    pub eager_edges: bool,
    /// UCX transports for the velo plane over UCX (`UCX_TLS` syntax, such as `tcp`), applied
    /// to the plane's own UCX context; `None` keeps UCX's setting (its `UCX_TLS` environment
    /// variable, or every transport). Not read from the environment by this crate: UCX reads
    /// `UCX_TLS` itself.
    pub ucx_tls: Option<String>,
    /// UCX devices for the velo plane over UCX (`UCX_NET_DEVICES` syntax, such as `lo`),
    /// applied like [`ucx_tls`](Self::ucx_tls).
    pub ucx_net_devices: Option<String>,
}

impl Default for ResponsePlaneConfig {
    fn default() -> Self {
        Self {
            plane: Plane::Tcp,
            transport: VeloTransport::Tcp,
            batching: Batching::Delay(DEFAULT_BATCH_DELAY),
            host: None,
            port: 0,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            lanes: velo_mux::DEFAULT_LANES,
            window: velo_mux::DEFAULT_WINDOW,
            idle_timeout: velo_mux::DEFAULT_IDLE_TIMEOUT,
            eager_edges: true,
            ucx_tls: None,
            ucx_net_devices: None,
        }
    }
}

/// Why the configuration is unusable. Startup stops on any of these; nothing falls back to a
/// default silently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// An environment variable holds a value that is not allowed.
    #[error("invalid {var}={value:?}: {allowed}")]
    InvalidEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// UCX was requested but this build has no UCX support.
    #[error(
        "{ENV_TRANSPORT}=ucx but this build has no UCX support: rebuild with the `ucx` cargo \
         feature (of response-plane, or runtime-glue)"
    )]
    UcxNotCompiled,
}

impl ResponsePlaneConfig {
    /// Reads the configuration from the process environment.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable, its value and what is allowed.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Reads the configuration through `lookup` (the environment, or a map in tests).
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        if let Some(v) = lookup(ENV_PLANE) {
            c.plane = match v.as_str() {
                "tcp" => Plane::Tcp,
                "velo" => Plane::Velo,
                _ => {
                    return Err(invalid(
                        ENV_PLANE,
                        v,
                        "expected `tcp` (the default) or `velo`",
                    ));
                }
            };
        }
        if let Some(v) = lookup(ENV_TRANSPORT) {
            c.transport = match v.as_str() {
                "tcp" => VeloTransport::Tcp,
                "ucx" => VeloTransport::Ucx,
                _ => {
                    return Err(invalid(
                        ENV_TRANSPORT,
                        v,
                        "expected `tcp` (the default) or `ucx`",
                    ));
                }
            };
        }
        if let Some(v) = lookup(ENV_BATCH_MS) {
            const ALLOWED: &str = "expected 0 (greedy: write whenever data is pending) or a positive integer \
                                   number of milliseconds up to 10000";
            let ms = digits(&v)
                .filter(|&ms| ms <= MAX_BATCH_MS)
                .ok_or_else(|| invalid(ENV_BATCH_MS, v, ALLOWED))?;
            c.batching = if ms == 0 {
                Batching::Greedy
            } else {
                Batching::Delay(Duration::from_millis(ms))
            };
        }
        if let Some(v) = lookup(ENV_HOST) {
            c.host = Some(
                v.parse()
                    .map_err(|_| invalid(ENV_HOST, v, "expected an IPv4 or IPv6 address"))?,
            );
        }
        if let Some(v) = lookup(ENV_PORT) {
            c.port = digits(&v)
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| invalid(ENV_PORT, v, "expected a port number 0..=65535"))?;
        }
        if let Some(v) = lookup(ENV_MAX_MESSAGE_SIZE) {
            c.max_message_size = digits(&v)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (velo_wire::MIN_MAX_FRAME_LEN..=1 << 30).contains(n))
                .ok_or_else(|| {
                    invalid(
                        ENV_MAX_MESSAGE_SIZE,
                        v,
                        "expected a size in bytes from 4096 to 1073741824",
                    )
                })?;
        }
        if c.plane == Plane::Velo && c.transport == VeloTransport::Ucx && !cfg!(feature = "ucx") {
            return Err(ConfigError::UcxNotCompiled);
        }
        Ok(c)
    }

    /// The velo plane's flush policy.
    pub(crate) fn flush_policy(&self) -> velo_mux::FlushPolicy {
        let policy = match self.batching {
            Batching::Greedy => velo_mux::FlushPolicy::greedy(),
            Batching::Delay(d) => velo_mux::FlushPolicy::with_max_delay(d),
        };
        velo_mux::FlushPolicy {
            eager_edges: self.eager_edges,
            ..policy
        }
    }
}

fn invalid(var: &'static str, value: String, allowed: &'static str) -> ConfigError {
    ConfigError::InvalidEnv {
        var,
        value,
        allowed,
    }
}

/// A non-empty string of ASCII digits as a number (no sign, no spaces, no fraction).
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flush_policy_carries_batching_and_eager_edges() {
        let c = ResponsePlaneConfig::default();
        let p = c.flush_policy();
        assert_eq!(p.max_delay, DEFAULT_BATCH_DELAY);
        assert!(p.eager_edges, "edges flush at once by default");

        let plain = ResponsePlaneConfig {
            eager_edges: false,
            batching: Batching::Greedy,
            ..c
        };
        let p = plain.flush_policy();
        assert!(!p.eager_edges);
        assert_eq!(
            p,
            velo_mux::FlushPolicy {
                eager_edges: false,
                ..velo_mux::FlushPolicy::greedy()
            }
        );
    }
}
