//! UCX settings.

use std::time::Duration;

use velo_session::{ConfigError, SessionSettings};

/// Default time a new lane has to complete its handshake: 5 s. UCX reports an unreachable
/// frontend asynchronously (an endpoint error after `ucp_ep_create` returned), so the HELLO
/// round trip is also what bounds connection setup.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on flushing a closing lane before its endpoint is force-closed: 1 s. A dead
/// peer never acknowledges the flush; its endpoint error usually arrives first anyway.
pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Default bound on bytes received on one lane and not yet taken by its reader: 256 MiB.
/// The mux reads as fast as bytes arrive and credit bounds what a well-behaved peer sends, so
/// only a peer ignoring credit (or a starved reader) reaches it; the lane then fails.
pub const DEFAULT_MAX_LANE_QUEUE_BYTES: usize = 256 * 1024 * 1024;

/// Where the UCX worker is progressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressEngine {
    /// A task on the caller's tokio runtime (on its `TaskTracker`), woken through the UCX
    /// worker's event fd (`AsyncFd`). No thread hop between the application and UCX: the
    /// cheapest per message on this machine (see the crate docs for the measurement).
    #[default]
    Task,
    /// A dedicated OS thread running the same driver on a current-thread runtime of its own:
    /// isolates UCX from a busy application runtime at the cost of two cross-thread wakeups
    /// per round trip. Start-up waits (blocking, milliseconds) for the thread's UCX worker.
    Thread,
}

/// Close timeouts accepted: 1 ms..=1 h.
const CLOSE_TIMEOUTS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);
/// Lane queue bounds accepted, in bytes: 64 KiB..=16 GiB (below a frame or two, a lane
/// would fail under a well-behaved peer).
const LANE_QUEUE_BYTES: std::ops::RangeInclusive<usize> = 64 * 1024..=1 << 34;

/// Settings of the UCX transport, shared by frontends and workers.
///
/// Valid by construction: build it with [`builder`](Self::builder), which checks every value;
/// the getters read it. The default is valid.
#[derive(Debug, Clone)]
pub struct UcxConfig {
    tls: Option<String>,
    net_devices: Option<String>,
    engine: ProgressEngine,
    close_timeout: Duration,
    max_lane_queue_bytes: usize,
    session: SessionSettings,
}

impl Default for UcxConfig {
    fn default() -> Self {
        Self {
            tls: None,
            net_devices: None,
            engine: ProgressEngine::default(),
            close_timeout: DEFAULT_CLOSE_TIMEOUT,
            max_lane_queue_bytes: DEFAULT_MAX_LANE_QUEUE_BYTES,
            session: SessionSettings::builder()
                .handshake_timeout(DEFAULT_HANDSHAKE_TIMEOUT)
                .build()
                .expect("the default handshake timeout is in range"),
        }
    }
}

impl UcxConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> UcxConfigBuilder {
        UcxConfigBuilder(Self::default())
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> UcxConfigBuilder {
        UcxConfigBuilder(self.clone())
    }

    /// The defaults restricted to TCP over the loopback device (`UCX_TLS=tcp`,
    /// `UCX_NET_DEVICES=lo`): what tests and single-host benchmarks use, whatever the
    /// environment says.
    pub fn loopback() -> Self {
        Self {
            tls: Some("tcp".to_owned()),
            net_devices: Some("lo".to_owned()),
            ..Self::default()
        }
    }

    /// UCX transports of this transport's UCX context, if set (see
    /// [`UcxConfigBuilder::tls`]).
    pub fn tls(&self) -> Option<&str> {
        self.tls.as_deref()
    }
    /// UCX devices of this transport's UCX context, if set (see
    /// [`UcxConfigBuilder::net_devices`]).
    pub fn net_devices(&self) -> Option<&str> {
        self.net_devices.as_deref()
    }
    /// Where the UCX worker is progressed.
    pub fn engine(&self) -> ProgressEngine {
        self.engine
    }
    /// Bound on flushing a closing lane before its endpoint is force-closed.
    pub fn close_timeout(&self) -> Duration {
        self.close_timeout
    }
    /// Bytes received on a lane and not yet read that make the lane fail (peer's fault).
    pub fn max_lane_queue_bytes(&self) -> usize {
        self.max_lane_queue_bytes
    }
    /// What velo-session takes: the handshake bound (which also bounds UCX connection setup,
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`] by default), the frontend's limits, the lane reader's
    /// buffer, the worker's backoff, secret and instance.
    pub fn session(&self) -> &SessionSettings {
        &self.session
    }
}

/// Builds a [`UcxConfig`], starting from the defaults; [`build`](Self::build) checks every
/// value.
#[derive(Debug, Clone)]
pub struct UcxConfigBuilder(UcxConfig);

impl UcxConfigBuilder {
    velo_session::builder_setters! {
        /// UCX transports (`UCX_TLS` syntax, for example `"tcp"` or `"rc,tcp"`), applied to this
        /// transport's UCX context with `ucp_config_modify` so the process environment is left
        /// alone. `None` (the default) keeps UCX's own setting: `UCX_TLS` from the environment
        /// (checked at start-up), or UCX's default (every transport; with peer-failure handling
        /// on, UCX then picks tcp or an RDMA transport, never shared memory). An empty list, or
        /// one without any network transport (for example `"sm,self"`), is refused when built:
        /// the listener and peer-failure handling need one.
        tls: Option<String>;
        /// UCX devices (`UCX_NET_DEVICES` syntax, for example `"lo"` or `"mlx5_0:1"`), applied
        /// like [`tls`](Self::tls); an empty list is refused when built. Loopback tests set
        /// `"lo"` so no second rail over another interface is used.
        net_devices: Option<String>;
        /// Where the UCX worker is progressed (default: a task).
        engine: ProgressEngine;
        /// Bound on flushing a closing lane before its endpoint is force-closed, 1 ms..=1 h
        /// (default 1 s).
        close_timeout: Duration;
        /// Bytes received on a lane and not yet read that make the lane fail (peer's fault),
        /// 64 KiB..=16 GiB (default 256 MiB).
        max_lane_queue_bytes: usize;
        /// What velo-session takes (default: its defaults, with a [`DEFAULT_HANDSHAKE_TIMEOUT`]
        /// handshake bound).
        session: SessionSettings;
    }

    /// Checks every value.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming the first setting outside its range, its value and
    /// what is allowed.
    pub fn build(self) -> Result<UcxConfig, ConfigError> {
        let c = self.0;
        if let Some(tls) = c.tls.as_deref()
            && (tls.trim().is_empty() || !names_network_transport(tls))
        {
            return Err(ConfigError::OutOfRange {
                field: "tls",
                value: format!("{tls:?}"),
                allowed: NEEDS_NETWORK,
            });
        }
        if c.net_devices
            .as_deref()
            .is_some_and(|d| d.trim().is_empty())
        {
            return Err(ConfigError::OutOfRange {
                field: "net_devices",
                value: format!("{:?}", c.net_devices.unwrap_or_default()),
                allowed: "must name a device (such as `lo` or `mlx5_0:1`), or be None for \
                          UCX's setting",
            });
        }
        let timeout = "must be from 1 ms to 1 h";
        ConfigError::check_range("close_timeout", c.close_timeout, CLOSE_TIMEOUTS, timeout)?;
        let queue = "must be from 64 KiB to 16 GiB";
        let bytes = c.max_lane_queue_bytes;
        ConfigError::check_range("max_lane_queue_bytes", bytes, LANE_QUEUE_BYTES, queue)?;
        Ok(c)
    }
}

/// UCX transports that only reach the same host or the same process: a `UCX_TLS` list made
/// of these alone cannot carry a lane (the listener needs a network transport, and shared
/// memory does not support peer-failure handling).
const LOCAL_ONLY: &[&str] = &[
    "self",
    "sm",
    "shm",
    "posix",
    "sysv",
    "cma",
    "knem",
    "xpmem",
    "cuda_copy",
    "cuda_ipc",
    "rocm_copy",
    "rocm_ipc",
    "gdr_copy",
];

/// What a `UCX_TLS` list must do, as a refused configuration says.
const NEEDS_NETWORK: &str = "must name a network transport (tcp or an RDMA transport): \
                             velo-ucx's listener and peer-failure handling do not work over \
                             shared memory";

/// Whether a `UCX_TLS` value names a network transport. Exclusion lists (`^sm`), `all` and
/// an empty value (UCX's default) keep the network transports and pass.
pub(crate) fn names_network_transport(tls: &str) -> bool {
    let tls = tls.trim();
    if tls.is_empty() || tls.starts_with('^') {
        return true;
    }
    tls.split(',')
        .map(|t| t.trim().split(':').next().unwrap_or_default())
        .filter(|t| !t.is_empty())
        .any(|t| !LOCAL_ONLY.contains(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(tls: &str, ok: bool) {
        assert_eq!(names_network_transport(tls), ok, "{tls}");
    }

    #[test]
    fn transport_lists_without_a_network_transport_are_refused() {
        check("tcp", true);
        check("rc,tcp", true);
        check("sm,self,tcp", true);
        check("all", true);
        check("^sm", true);
        check("ud_x", true);
        check("", true);
        check("sm,self", false);
        check("self", false);
        check(" posix , sysv,cma ", false);
    }

    /// What building with one setting changed says, as text; what was built if it was not
    /// refused.
    fn refusal(change: impl FnOnce(UcxConfigBuilder) -> UcxConfigBuilder) -> String {
        match change(UcxConfig::builder()).build() {
            Err(refused) => refused.to_string(),
            Ok(built) => panic!("expected a refusal, built {built:?}"),
        }
    }

    #[test]
    fn a_transport_list_that_cannot_carry_a_lane_is_refused_when_built() {
        let why = refusal(|b| b.tls(Some("sm,self".into())));
        assert!(
            why.starts_with("invalid tls \"sm,self\": must name a network transport"),
            "{why}"
        );
        let empty = refusal(|b| b.tls(Some(" ".into())));
        assert!(empty.starts_with("invalid tls \" \""), "{empty}");
        UcxConfig::builder()
            .tls(Some("rc,tcp".into()))
            .build()
            .expect("a network transport");
    }

    #[test]
    fn an_empty_device_list_is_refused_when_built() {
        let why = refusal(|b| b.net_devices(Some(String::new())));
        assert!(
            why.starts_with("invalid net_devices \"\": must name a device"),
            "{why}"
        );
    }

    #[test]
    fn a_zero_close_timeout_is_refused() {
        let why = refusal(|b| b.close_timeout(Duration::ZERO));
        assert_eq!(why, "invalid close_timeout 0ns: must be from 1 ms to 1 h");
    }

    #[test]
    fn a_lane_queue_bound_below_a_frame_is_refused() {
        let why = refusal(|b| b.max_lane_queue_bytes(0));
        assert_eq!(
            why,
            "invalid max_lane_queue_bytes 0: must be from 64 KiB to 16 GiB"
        );
    }

    #[test]
    fn the_defaults_and_loopback_are_valid_and_loopback_pins_tcp_over_lo() {
        let c = UcxConfig::loopback().to_builder().build().unwrap();
        assert_eq!(c.tls(), Some("tcp"));
        assert_eq!(c.net_devices(), Some("lo"));
        let d = UcxConfig::builder().build().unwrap();
        assert_eq!(d.tls(), None);
        assert_eq!(d.session().handshake_timeout(), DEFAULT_HANDSHAKE_TIMEOUT);
    }
}
