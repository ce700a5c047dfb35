//! TCP settings.

use std::sync::Arc;
use std::time::Duration;

use velo_session::SessionSettings;
use velo_tls::{ClientTls, ServerTls};

/// Default time to establish a TCP connection: 3 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default socket send and receive buffers: 4 MiB, set before connect or listen (Velo saw a
/// ~100x collapse when buffers were sized after data started flowing).
pub const DEFAULT_SOCKET_BUFFER: u32 = 4 * 1024 * 1024;
/// Listen backlog.
pub const DEFAULT_BACKLOG: u32 = 1024;
/// Default liveness bound of a lane socket: the mux's default idle timeout (10 s).
pub const DEFAULT_LIVENESS: Duration = velo_mux::DEFAULT_IDLE_TIMEOUT;

/// Settings of the TCP transport, shared by frontends and workers.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// `SO_SNDBUF` in bytes, set before connect or listen; `None` keeps the OS default.
    pub send_buffer: Option<u32>,
    /// `SO_RCVBUF` in bytes, set before connect or listen; `None` keeps the OS default.
    pub recv_buffer: Option<u32>,
    /// Bound on establishing a TCP connection (worker).
    pub connect_timeout: Duration,
    /// Listen backlog (frontend).
    pub backlog: u32,
    /// How long the kernel keeps a lane whose peer vanished (`TCP_USER_TIMEOUT`, and
    /// keepalive probes from a third of it); set it to the mux's idle timeout. `None` leaves
    /// the kernel's defaults (retransmissions for about 15 minutes).
    pub liveness: Option<Duration>,
    /// What velo-session takes: the handshake bound (from the TCP connection on), the
    /// frontend's connection limit, the lane reader's buffer, the worker's backoff.
    pub session: SessionSettings,
    /// TLS on the frontend's listener (its certificate, and its clients' CA for mutual TLS);
    /// `None` for plaintext lanes. Shared, so a reload reaches the running listener.
    pub tls_server: Option<Arc<ServerTls>>,
    /// TLS on the worker's lanes (how it verifies frontends, its own certificate).
    pub tls_client: Option<Arc<ClientTls>>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            send_buffer: Some(DEFAULT_SOCKET_BUFFER),
            recv_buffer: Some(DEFAULT_SOCKET_BUFFER),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            backlog: DEFAULT_BACKLOG,
            liveness: Some(DEFAULT_LIVENESS),
            session: SessionSettings::default(),
            tls_server: None,
            tls_client: None,
        }
    }
}
