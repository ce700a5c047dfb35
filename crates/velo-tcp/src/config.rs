//! TCP settings.

use std::time::Duration;

use velo_session::{Backoff, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_CONNECTIONS};

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
    /// Bound on the handshake of one lane (both sides).
    pub handshake_timeout: Duration,
    /// Connections a frontend holds at most; more are refused with CLOSE `limit`.
    pub max_connections: usize,
    /// Listen backlog (frontend).
    pub backlog: u32,
    /// Each lane reader's buffer, in bytes.
    pub read_buffer: usize,
    /// Backoff between failed preparations of one frontend (worker).
    pub backoff: Backoff,
    /// How long the kernel keeps a lane whose peer vanished (`TCP_USER_TIMEOUT`, and
    /// keepalive probes from a third of it); set it to the mux's idle timeout. `None` leaves
    /// the kernel's defaults (retransmissions for about 15 minutes).
    pub liveness: Option<Duration>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            send_buffer: Some(DEFAULT_SOCKET_BUFFER),
            recv_buffer: Some(DEFAULT_SOCKET_BUFFER),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            backlog: DEFAULT_BACKLOG,
            read_buffer: velo_session::DEFAULT_READ_BUFFER,
            backoff: Backoff::default(),
            liveness: Some(DEFAULT_LIVENESS),
        }
    }
}
