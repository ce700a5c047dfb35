//! UCX settings.

use std::time::Duration;

use velo_session::SessionSettings;

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

/// Settings of the UCX transport, shared by frontends and workers.
#[derive(Debug, Clone)]
pub struct UcxConfig {
    /// UCX transports (`UCX_TLS` syntax, for example `"tcp"` or `"rc,tcp"`), applied to this
    /// transport's UCX context with `ucp_config_modify` so the process environment is left
    /// alone. `None` keeps UCX's own setting: `UCX_TLS` from the environment, or UCX's default
    /// (every transport; with peer-failure handling on, UCX then picks tcp or an RDMA
    /// transport, never shared memory). A list without any network transport (for example
    /// `"sm,self"`) is refused at start-up: the listener and peer-failure handling need one.
    pub tls: Option<String>,
    /// UCX devices (`UCX_NET_DEVICES` syntax, for example `"lo"` or `"mlx5_0:1"`), applied like
    /// `tls`. Loopback tests set `"lo"` so no second rail over another interface is used.
    pub net_devices: Option<String>,
    /// Where the UCX worker is progressed.
    pub engine: ProgressEngine,
    /// Bound on flushing a closing lane before its endpoint is force-closed.
    pub close_timeout: Duration,
    /// Bytes received on a lane and not yet read that make the lane fail (peer's fault).
    pub max_lane_queue_bytes: usize,
    /// What velo-session takes: the handshake bound (which also bounds UCX connection setup,
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`] by default), the frontend's connection limit, the lane
    /// reader's buffer, the worker's backoff.
    pub session: SessionSettings,
}

impl Default for UcxConfig {
    fn default() -> Self {
        Self {
            tls: None,
            net_devices: None,
            engine: ProgressEngine::default(),
            close_timeout: DEFAULT_CLOSE_TIMEOUT,
            max_lane_queue_bytes: DEFAULT_MAX_LANE_QUEUE_BYTES,
            session: SessionSettings {
                handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
                ..SessionSettings::default()
            },
        }
    }
}

impl UcxConfig {
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

/// Checks a `UCX_TLS` value: `Err` with the reason when it names no network transport.
/// Exclusion lists (`^sm`) and `all` keep the network transports and pass.
pub(crate) fn check_transports(tls: &str) -> Result<(), String> {
    let tls = tls.trim();
    if tls.is_empty() || tls.starts_with('^') {
        return Ok(());
    }
    let network = tls
        .split(',')
        .map(|t| t.trim().split(':').next().unwrap_or_default())
        .filter(|t| !t.is_empty())
        .any(|t| !LOCAL_ONLY.contains(&t));
    if network {
        Ok(())
    } else {
        Err(format!(
            "UCX_TLS={tls} names no network transport: velo-ucx needs tcp or an RDMA \
             transport (its listener and peer-failure handling do not work over shared memory)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(tls: &str, ok: bool) {
        assert_eq!(check_transports(tls).is_ok(), ok, "{tls}");
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
        let why = check_transports("sm,self").unwrap_err();
        assert!(
            why.contains("UCX_TLS=sm,self names no network transport"),
            "{why}"
        );
    }

    #[test]
    fn loopback_pins_tcp_over_lo() {
        let c = UcxConfig::loopback();
        assert_eq!(c.tls.as_deref(), Some("tcp"));
        assert_eq!(c.net_devices.as_deref(), Some("lo"));
        assert_eq!(UcxConfig::default().tls, None);
    }
}
