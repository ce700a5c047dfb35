//! Plane selection and settings, from the environment as Dynamo names them.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::env::Env;
use crate::security::{ENV_CLUSTER_SECRET_PATH, TlsConfig};
use velo_mux::handshake::{MAX_IDLE_TIMEOUT, MIN_IDLE_TIMEOUT};

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
/// `DYN_VELO_IDLE_TIMEOUT_MS`: the liveness bound of both planes, in ms (default 10000;
/// [`ResponsePlaneConfigBuilder::idle_timeout`]).
pub const ENV_IDLE_TIMEOUT_MS: &str = "DYN_VELO_IDLE_TIMEOUT_MS";

/// `DYN_VELO_COMPRESSION`: `lz4` or `none`: whether the velo plane packs the batches it sends
/// where the peer accepts it (default: `lz4` on TCP lanes, `none` on UCX;
/// [`ResponsePlaneConfigBuilder::compression`]).
pub const ENV_COMPRESSION: &str = "DYN_VELO_COMPRESSION";

/// Default batching delay: 5 ms (Dynamo PR #15231).
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(5);
/// Longest batching delay accepted, in ms.
pub const MAX_BATCH_MS: u64 = 10_000;
/// Default largest message: 32 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: u32 = 33_554_432;

/// Which response plane a process uses. Frontend and worker must agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plane {
    /// The classic plane Dynamo ships by default: one TCP connection per response stream
    /// (`DYN_RESPONSE_PLANE=tcp`).
    Classic,
    /// The velo plane: streams multiplexed over a few lanes per worker and frontend.
    Velo,
}

impl Plane {
    /// The name used in `DYN_RESPONSE_PLANE` and in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Classic => "tcp",
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

/// The response plane's configuration, valid by construction: build it with
/// [`builder`](Self::builder) (or read it with [`from_env`](Self::from_env)), which checks
/// every value; the getters read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponsePlaneConfig {
    plane: Plane,
    transport: VeloTransport,
    batching: Batching,
    host: Option<IpAddr>,
    port: u16,
    max_message_size: u32,
    lanes: u16,
    window: u32,
    idle_timeout: Duration,
    eager_edges: bool,
    eager_ends: bool,
    eager_opens: bool,
    /// `None`: the transport's default ([`ResponsePlaneConfig::compression`]).
    compression: Option<velo_mux::Compression>,
    ucx_tls: Option<String>,
    ucx_net_devices: Option<String>,
    tls: TlsConfig,
    secret_path: Option<PathBuf>,
    worker_instance: Option<u64>,
}

/// Builds a [`ResponsePlaneConfig`], starting from the defaults.
#[derive(Debug, Clone)]
pub struct ResponsePlaneConfigBuilder(ResponsePlaneConfig);

impl Default for ResponsePlaneConfig {
    fn default() -> Self {
        Self {
            plane: Plane::Classic,
            transport: VeloTransport::Tcp,
            batching: Batching::Delay(DEFAULT_BATCH_DELAY),
            host: None,
            port: 0,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            lanes: velo_mux::DEFAULT_LANES,
            window: velo_mux::DEFAULT_WINDOW,
            idle_timeout: velo_mux::DEFAULT_IDLE_TIMEOUT,
            eager_edges: true,
            eager_ends: true,
            eager_opens: false,
            compression: None,
            ucx_tls: None,
            ucx_net_devices: None,
            tls: TlsConfig::default(),
            secret_path: None,
            worker_instance: None,
        }
    }
}

impl ResponsePlaneConfig {
    /// A builder starting from the defaults (the classic plane, as Dynamo's default).
    pub fn builder() -> ResponsePlaneConfigBuilder {
        ResponsePlaneConfigBuilder(Self::default())
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> ResponsePlaneConfigBuilder {
        ResponsePlaneConfigBuilder(self.clone())
    }

    /// Which plane.
    pub fn plane(&self) -> Plane {
        self.plane
    }
    /// The velo plane's transport.
    pub fn transport(&self) -> VeloTransport {
        self.transport
    }
    /// The velo plane's batching.
    pub fn batching(&self) -> Batching {
        self.batching
    }
    /// Where a frontend listens and what it advertises; `None` listens on (and advertises)
    /// this host's routable address, as Dynamo does, never on every interface.
    pub fn host(&self) -> Option<IpAddr> {
        self.host
    }
    /// The port a frontend listens on; 0 lets the OS choose.
    pub fn port(&self) -> u16 {
        self.port
    }
    /// Largest frame (velo) or message (classic), in bytes.
    pub fn max_message_size(&self) -> u32 {
        self.max_message_size
    }
    /// Lanes per worker and frontend (velo).
    pub fn lanes(&self) -> u16 {
        self.lanes
    }
    /// Credit window per stream, in items (velo).
    pub fn window(&self) -> u32 {
        self.window
    }
    /// The liveness bound, on both planes (see [`ResponsePlaneConfigBuilder::idle_timeout`]).
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }
    /// Whether a stream's prologue, first item and end skip the batching delay (velo).
    pub fn eager_edges(&self) -> bool {
        self.eager_edges
    }
    /// With [`eager_edges`](Self::eager_edges), whether a stream's end skips the batching
    /// delay too (velo).
    pub fn eager_ends(&self) -> bool {
        self.eager_ends
    }
    /// With [`eager_edges`](Self::eager_edges), whether a stream's prologue skips the
    /// batching delay too (velo).
    pub fn eager_opens(&self) -> bool {
        self.eager_opens
    }
    /// Whether the velo plane packs the batches it sends (where the peer accepts it): as set,
    /// else LZ4 on TCP lanes (bytes cost packets on a real network) and none on UCX (an RDMA
    /// fabric moves bytes for less than packing them costs).
    pub fn compression(&self) -> velo_mux::Compression {
        self.compression.unwrap_or(match self.transport {
            VeloTransport::Tcp => velo_mux::Compression::Lz4,
            VeloTransport::Ucx => velo_mux::Compression::None,
        })
    }
    /// UCX transports of the plane's own UCX context, if set.
    pub fn ucx_tls(&self) -> Option<&str> {
        self.ucx_tls.as_deref()
    }
    /// UCX devices of the plane's own UCX context, if set.
    pub fn ucx_net_devices(&self) -> Option<&str> {
        self.ucx_net_devices.as_deref()
    }
    /// TLS of TCP lanes and classic connections (`DYN_TCP_TLS_*`).
    pub fn tls(&self) -> &TlsConfig {
        &self.tls
    }
    /// The file holding the velo plane's cluster secret (`DYN_VELO_CLUSTER_SECRET_PATH`).
    pub fn secret_path(&self) -> Option<&std::path::Path> {
        self.secret_path.as_deref()
    }
    /// This worker's discovery instance id, announced in its handshakes (velo).
    pub fn worker_instance(&self) -> Option<u64> {
        self.worker_instance
    }

    /// The cluster secret, read from its file.
    pub(crate) fn secret(&self) -> Result<Option<velo_session::ClusterSecret>, ConfigError> {
        self.secret_path
            .as_deref()
            .map(crate::security::read_secret)
            .transpose()
    }

    /// Reads the configuration from the process environment.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable, its value and what is allowed.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(crate::env::var)
    }

    /// Reads the configuration through `lookup` (the environment, or a map in tests).
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::builder().env(&Env::new(lookup))?.build()
    }

    /// The velo plane's mux settings for `side` (valid: the builder checked them).
    pub(crate) fn mux(&self, side: velo_mux::Side) -> velo_mux::MuxConfig {
        self.mux_builder(side)
            .build()
            .expect("ResponsePlaneConfig::build checked every mux setting")
    }

    fn mux_builder(&self, side: velo_mux::Side) -> velo_mux::MuxConfigBuilder {
        velo_mux::MuxConfig::builder(side)
            .lanes(self.lanes)
            .window(self.window)
            .max_frame_len(self.max_message_size)
            .flush(self.flush_policy())
            .idle_timeout(self.idle_timeout)
            // A frontend sends control records only (ACCEPT, CREDIT, CANCEL...): each differs
            // from the last in its stream id, and LZ4 cannot shrink them
            // (`velo-mux/tests/packing.rs`), so trying would only cost.
            .compression(match side {
                velo_mux::Side::Worker => self.compression(),
                velo_mux::Side::Frontend => velo_mux::Compression::None,
            })
    }

    /// The velo plane's flush policy.
    pub(crate) fn flush_policy(&self) -> velo_mux::FlushPolicy {
        let policy = match self.batching {
            Batching::Greedy => velo_mux::FlushPolicy::greedy(),
            Batching::Delay(d) => velo_mux::FlushPolicy::with_max_delay(d),
        };
        velo_mux::FlushPolicy {
            eager_edges: self.eager_edges,
            eager_ends: self.eager_ends,
            eager_opens: self.eager_opens,
            ..policy
        }
    }
}

impl ResponsePlaneConfigBuilder {
    /// Which plane (default: classic, as Dynamo).
    pub fn plane(mut self, plane: Plane) -> Self {
        self.0.plane = plane;
        self
    }
    /// The velo plane's transport (default TCP).
    pub fn transport(mut self, transport: VeloTransport) -> Self {
        self.0.transport = transport;
        self
    }
    /// The velo plane's batching (default: at most 5 ms), delays up to [`MAX_BATCH_MS`].
    pub fn batching(mut self, batching: Batching) -> Self {
        self.0.batching = batching;
        self
    }
    /// Where a frontend listens and what it advertises (default: this host's routable
    /// address). An unspecified address (`0.0.0.0`, `::`) is refused when built: it cannot
    /// be advertised, and it would listen on every interface.
    pub fn host(mut self, host: Option<IpAddr>) -> Self {
        self.0.host = host;
        self
    }
    /// The port a frontend listens on (default 0: the OS chooses).
    pub fn port(mut self, port: u16) -> Self {
        self.0.port = port;
        self
    }
    /// Largest frame (velo) or message (classic), 4096 bytes..=1 GiB (default 32 MiB).
    pub fn max_message_size(mut self, bytes: u32) -> Self {
        self.0.max_message_size = bytes;
        self
    }
    /// Lanes per worker and frontend, 1..=64 (velo; default 4).
    pub fn lanes(mut self, lanes: u16) -> Self {
        self.0.lanes = lanes;
        self
    }
    /// Credit window per stream, 1..=65536 items (velo; default 32).
    pub fn window(mut self, window: u32) -> Self {
        self.0.window = window;
        self
    }
    /// The liveness bound on both planes, 100 ms..=1 h (default 10 s). A velo lane silent
    /// this long, or whose write makes no progress this long, is declared dead (heartbeats
    /// keep live ones talking). Every TCP socket of either plane gives up on a peer that
    /// vanished without a FIN or RST within it: `TCP_USER_TIMEOUT` for unacknowledged data,
    /// keepalive probes from a third of it on for idle connections (a live but quiet peer
    /// answers them and is never cut). `TCP_USER_TIMEOUT` also ends a connection whose window
    /// stays closed this long: on the classic plane a frontend application that stops reading
    /// a stream for longer loses it (`Disconnected`; velo lanes are always read, a paused
    /// stream only holds its credit). A classic worker whose stream ended waits at most this
    /// long for the frontend to close the connection before it stops watching.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.0.idle_timeout = timeout;
        self
    }
    /// Flush a stream's prologue, first item and end at once, whatever the batching delay
    /// (velo; on by default): TTFT and completion never wait for a batch, the items in
    /// between do. Off reproduces a plain fixed delay (Dynamo PR #15231's 5 ms arm).
    pub fn eager_edges(mut self, on: bool) -> Self {
        self.0.eager_edges = on;
        self
    }
    /// With eager edges, flush a stream's end at once too (velo; on by default). Off, the
    /// end waits for its batch like the items before it: a request completes up to the
    /// batching delay later, and a closed-loop client's next requests arrive together (fewer,
    /// larger prefill passes), while the prologue and the first item still go at once.
    pub fn eager_ends(mut self, on: bool) -> Self {
        self.0.eager_ends = on;
        self
    }
    /// With eager edges, flush a stream's prologue at once too (velo; off by default). Off,
    /// the prologue waits for its batch and goes at the latest with the stream's first item
    /// or after the batching delay: one eager batch fewer per stream (a write, a packet, a
    /// wake-up on each side), TTFT and completion as before, the pending handle resolved up
    /// to the batching delay later. Measured at 256 on the bench's 1,500-byte-MTU network:
    /// 16% fewer packets and 10% less frontend CPU per token, prologue p50 0.1 -> 1.8 ms.
    pub fn eager_opens(mut self, on: bool) -> Self {
        self.0.eager_opens = on;
        self
    }
    /// UCX transports for the velo plane over UCX (`UCX_TLS` syntax, such as `tcp`), applied
    /// to the plane's own UCX context; `None` (the default) keeps UCX's setting (its `UCX_TLS`
    /// environment variable, or every transport).
    pub fn ucx_tls(mut self, tls: Option<String>) -> Self {
        self.0.ucx_tls = tls;
        self
    }
    /// UCX devices for the velo plane over UCX (`UCX_NET_DEVICES` syntax, such as `lo`),
    /// applied like [`ucx_tls`](Self::ucx_tls).
    pub fn ucx_net_devices(mut self, devices: Option<String>) -> Self {
        self.0.ucx_net_devices = devices;
        self
    }

    /// TLS of TCP lanes (velo over TCP) and classic connections (default: none).
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.0.tls = tls;
        self
    }
    /// Whether the velo plane packs (LZ4-compresses) the batches it sends, on lanes whose
    /// peer accepts it (every velo-rs peer does). Default: LZ4 on TCP lanes, none on UCX
    /// ([`ResponsePlaneConfig::compression`]). On the bench's 1,500-byte-MTU network packing
    /// cut packets per token by 35-44% at the same offered load, CPU per token unchanged; on
    /// loopback, where bytes cost nothing, it costs 3-5% more CPU per token at concurrency
    /// 256. Frontends never pack: their control records do not shrink.
    pub fn compression(mut self, compression: velo_mux::Compression) -> Self {
        self.0.compression = Some(compression);
        self
    }
    /// The file holding the velo plane's cluster secret (default: none); read when built.
    pub fn secret_path(mut self, path: Option<PathBuf>) -> Self {
        self.0.secret_path = path;
        self
    }
    /// This worker's discovery instance id (default: none). A frontend opens the streams it
    /// tied to an instance ([`PendingResponse::associate`](crate::PendingResponse::associate))
    /// only to connections that announced that instance.
    pub fn worker_instance(mut self, instance: Option<u64>) -> Self {
        self.0.worker_instance = instance;
        self
    }

    /// Applies the `DYN_*` variables `env` sets (others keep their current value).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidEnv`] naming the variable, its value and what is allowed.
    pub fn env<F: Fn(&str) -> Option<String>>(mut self, env: &Env<F>) -> Result<Self, ConfigError> {
        let c = &mut self.0;
        let planes = [("tcp", Plane::Classic), ("velo", Plane::Velo)];
        if let Some(p) = env.choice(ENV_PLANE, &planes, "expected `tcp` (the default) or `velo`")? {
            c.plane = p;
        }
        let transports = [("tcp", VeloTransport::Tcp), ("ucx", VeloTransport::Ucx)];
        let allowed = "expected `tcp` (the default) or `ucx`";
        if let Some(t) = env.choice(ENV_TRANSPORT, &transports, allowed)? {
            c.transport = t;
        }
        const BATCH: &str = "expected 0 (greedy: write whenever data is pending) or a positive \
                             integer number of milliseconds up to 10000";
        if let Some(d) = env.millis(ENV_BATCH_MS, MAX_BATCH_MS, BATCH)? {
            c.batching = if d.is_zero() {
                Batching::Greedy
            } else {
                Batching::Delay(d)
            };
        }
        let packing = [
            ("none", velo_mux::Compression::None),
            ("lz4", velo_mux::Compression::Lz4),
        ];
        let allowed = "expected `lz4` (the default on TCP lanes) or `none` (the default on UCX)";
        if let Some(p) = env.choice(ENV_COMPRESSION, &packing, allowed)? {
            c.compression = Some(p);
        }
        let idle = "expected a whole number of milliseconds from 100 to 3600000";
        let range = millis(MIN_IDLE_TIMEOUT)..=millis(MAX_IDLE_TIMEOUT);
        if let Some(ms) = env.number::<u64>(ENV_IDLE_TIMEOUT_MS, range, idle)? {
            c.idle_timeout = Duration::from_millis(ms);
        }
        if let Some(h) = env.parsed(ENV_HOST, "expected an IPv4 or IPv6 address")? {
            c.host = Some(h);
        }
        if let Some(p) = env.number(ENV_PORT, 0..=65535, "expected a port number 0..=65535")? {
            c.port = p;
        }
        let size = "expected a size in bytes from 4096 to 1073741824";
        let range = u64::from(velo_wire::MIN_MAX_FRAME_LEN)..=1 << 30;
        if let Some(n) = env.number(ENV_MAX_MESSAGE_SIZE, range, size)? {
            c.max_message_size = n;
        }
        c.tls.apply_env(env)?;
        let secret = "expected the path of a file holding the cluster secret";
        if let Some(p) = env.map(ENV_CLUSTER_SECRET_PATH, secret, |v| {
            (!v.is_empty()).then(|| PathBuf::from(v))
        })? {
            c.secret_path = Some(p);
        }
        Ok(self)
    }

    /// Checks every value.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming the setting (a UCX transport list without a
    /// network transport among them, when UCX is compiled in), [`ConfigError::UcxNotCompiled`].
    pub fn build(self) -> Result<ResponsePlaneConfig, ConfigError> {
        let c = self.0;
        if c.plane == Plane::Velo && c.transport == VeloTransport::Ucx && !cfg!(feature = "ucx") {
            return Err(ConfigError::UcxNotCompiled);
        }
        if let Some(host) = c.host.filter(IpAddr::is_unspecified) {
            return Err(ConfigError::UnspecifiedHost { host });
        }
        c.tls.check()?;
        c.secret()?;
        if let Batching::Delay(d) = c.batching
            && (d.is_zero() || d > Duration::from_millis(MAX_BATCH_MS))
        {
            return Err(ConfigError::OutOfRange {
                setting: "batching delay",
                value: format!("{d:?}"),
                allowed: "must be above zero (Greedy is zero) and at most 10 s",
            });
        }
        for side in [velo_mux::Side::Frontend, velo_mux::Side::Worker] {
            c.mux_builder(side).build()?;
        }
        #[cfg(feature = "ucx")]
        crate::velo::ucx_builder(&c).build().map_err(ucx_setting)?;
        Ok(c)
    }
}

/// Why the configuration is unusable. Startup stops on any of these; nothing falls back to a
/// default silently.
#[derive(Debug, Clone, thiserror::Error)]
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
    /// A setting is outside its allowed range.
    #[error("invalid {setting} {value}: {allowed}")]
    OutOfRange {
        /// The setting.
        setting: &'static str,
        /// The rejected value, rendered.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// One of a pair of TLS variables is set without the other.
    #[error("{var} is set but {missing} is not: TLS needs both")]
    TlsHalfSet {
        /// The variable that is set.
        var: &'static str,
        /// The one missing.
        missing: &'static str,
    },
    /// TLS variables that do not make a usable configuration together (or for this role).
    #[error("{var} {problem}")]
    TlsMismatch {
        /// The variable at fault.
        var: &'static str,
        /// What is wrong, and what would fix it.
        problem: &'static str,
    },
    /// A TLS file is unreadable, empty or invalid.
    #[error("{var}: {source}")]
    Tls {
        /// The variable naming the file.
        var: &'static str,
        /// What is wrong with it.
        #[source]
        source: velo_tls::TlsError,
    },
    /// The cluster secret's file cannot be read.
    #[error("{ENV_CLUSTER_SECRET_PATH}={path:?}: cannot read it: {source}")]
    SecretRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The cluster secret is too short or too long.
    #[error("{ENV_CLUSTER_SECRET_PATH}={path:?}: {source}")]
    SecretLength {
        /// The file.
        path: PathBuf,
        /// Its length.
        #[source]
        source: velo_session::SecretError,
    },
    /// The host to listen on is unspecified (`0.0.0.0` or `::`): it cannot be advertised to
    /// workers, and it would listen on every interface.
    #[error(
        "{ENV_HOST}={host}: an unspecified address cannot be advertised; name this host's \
         routable address, or leave it unset to use it"
    )]
    UnspecifiedHost {
        /// The address given.
        host: IpAddr,
    },
    /// UCX was requested but this build has no UCX support.
    #[error(
        "{ENV_TRANSPORT}=ucx but this build has no UCX support: rebuild with the `ucx` cargo \
         feature (of response-plane, or runtime-glue)"
    )]
    UcxNotCompiled,
}

/// A setting of the layers below (mux, session, transport) outside its range: the same
/// setting, value and allowed range, as the plane's own.
impl From<velo_mux::ConfigError> for ConfigError {
    fn from(e: velo_mux::ConfigError) -> Self {
        match e {
            velo_mux::ConfigError::OutOfRange {
                field,
                value,
                allowed,
            } => Self::OutOfRange {
                setting: field,
                value,
                allowed,
            },
            _ => Self::OutOfRange {
                setting: "transport",
                value: e.to_string(),
                allowed: "a valid transport configuration",
            },
        }
    }
}

/// A refused UCX setting under the plane's name for it (only the lists can be refused: the
/// rest are UCX's defaults).
#[cfg(feature = "ucx")]
fn ucx_setting(e: velo_mux::ConfigError) -> ConfigError {
    match ConfigError::from(e) {
        ConfigError::OutOfRange {
            setting,
            value,
            allowed,
        } => ConfigError::OutOfRange {
            setting: match setting {
                "tls" => "ucx_tls",
                "net_devices" => "ucx_net_devices",
                other => other,
            },
            value,
            allowed,
        },
        other => other,
    }
}

/// `d` in whole milliseconds (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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

        let plain = c
            .to_builder()
            .eager_edges(false)
            .batching(Batching::Greedy)
            .build()
            .unwrap();
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

    #[test]
    fn workers_pack_on_tcp_lanes_and_frontends_never_try() {
        let c = ResponsePlaneConfig::default();
        let side = |s| c.mux(s).compression();
        assert_eq!(side(velo_mux::Side::Worker), velo_mux::Compression::Lz4);
        assert_eq!(side(velo_mux::Side::Frontend), velo_mux::Compression::None);
        let raw = c
            .to_builder()
            .compression(velo_mux::Compression::None)
            .build()
            .unwrap();
        assert_eq!(
            raw.mux(velo_mux::Side::Worker).compression(),
            velo_mux::Compression::None
        );
    }

    #[test]
    fn a_tls_handshake_bound_of_zero_is_refused_when_built() {
        // The velo plane's TCP lanes would refuse it at start-up; the classic plane would
        // fail every TLS handshake at once.
        let tls = TlsConfig {
            handshake_timeout: Duration::ZERO,
            ..TlsConfig::default()
        };
        let err = ResponsePlaneConfig::builder().tls(tls).build().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid TLS handshake_timeout 0ns: must be from 1 ms to 300 s"
        );
    }

    #[test]
    fn a_setting_out_of_range_is_refused_when_built_naming_it() {
        let err = ResponsePlaneConfig::builder().lanes(0).build().unwrap_err();
        assert_eq!(err.to_string(), "invalid lanes 0: must be 1..=64");
        let err = ResponsePlaneConfig::builder()
            .idle_timeout(Duration::from_millis(1))
            .build()
            .unwrap_err();
        assert!(err.to_string().starts_with("invalid idle_timeout"), "{err}");
        let err = ResponsePlaneConfig::builder()
            .batching(Batching::Delay(Duration::from_secs(11)))
            .build()
            .unwrap_err();
        assert!(
            err.to_string().starts_with("invalid batching delay"),
            "{err}"
        );
    }

    /// A UCX transport list without a network transport (no lane could connect) is refused
    /// when the configuration is built, naming the setting, before anything starts.
    #[cfg(feature = "ucx")]
    #[test]
    fn a_ucx_transport_list_that_cannot_carry_lanes_is_refused_when_built() {
        let err = ResponsePlaneConfig::builder()
            .plane(Plane::Velo)
            .transport(VeloTransport::Ucx)
            .ucx_tls(Some("sm,self".to_owned()))
            .build()
            .unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::OutOfRange {
                    setting: "ucx_tls",
                    ..
                }
            ),
            "{err}"
        );
        let why = err.to_string();
        assert!(
            why.starts_with("invalid ucx_tls \"sm,self\": must name a network transport"),
            "{why}"
        );
    }
}
