//! TCP settings, valid by construction: [`TcpConfig::builder`] checks every value when built.

use std::sync::Arc;
use std::time::Duration;

use velo_mux::handshake::{MAX_IDLE_TIMEOUT, MIN_IDLE_TIMEOUT};
use velo_session::{ConfigError, SessionSettings};
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

/// Socket buffer sizes accepted, in bytes: 4 KiB..=1 GiB (the kernel caps them further at
/// `net.core.wmem_max` and `rmem_max`).
const SOCKET_BUFFERS: std::ops::RangeInclusive<u32> = 4096..=1 << 30;
/// Connect timeouts accepted: 1 ms..=1 h.
const CONNECT_TIMEOUTS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);
/// Listen backlogs accepted (the kernel caps it further at `net.core.somaxconn`).
const BACKLOGS: std::ops::RangeInclusive<u32> = 1..=65_535;

/// Settings of the TCP transport, shared by frontends and workers.
///
/// Valid by construction: build it with [`builder`](Self::builder), which checks every value;
/// the getters read it. The default is valid.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    send_buffer: Option<u32>,
    recv_buffer: Option<u32>,
    connect_timeout: Duration,
    backlog: u32,
    liveness: Option<Duration>,
    session: SessionSettings,
    tls_server: Option<Arc<ServerTls>>,
    tls_client: Option<Arc<ClientTls>>,
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

impl TcpConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> TcpConfigBuilder {
        TcpConfigBuilder(Self::default())
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> TcpConfigBuilder {
        TcpConfigBuilder(self.clone())
    }

    /// `SO_SNDBUF` in bytes, set before connect or listen; `None` keeps the OS default.
    pub fn send_buffer(&self) -> Option<u32> {
        self.send_buffer
    }
    /// `SO_RCVBUF` in bytes, set before connect or listen; `None` keeps the OS default.
    pub fn recv_buffer(&self) -> Option<u32> {
        self.recv_buffer
    }
    /// Bound on establishing a TCP connection (worker).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
    /// Listen backlog (frontend).
    pub fn backlog(&self) -> u32 {
        self.backlog
    }
    /// How long the kernel keeps a lane whose peer vanished; `None` leaves the kernel's
    /// defaults (see [`TcpConfigBuilder::liveness`]).
    pub fn liveness(&self) -> Option<Duration> {
        self.liveness
    }
    /// What velo-session takes: the handshake bounds, the frontend's limits, the lane reader's
    /// buffer, the worker's backoff, secret and instance. With [`tls_server`](Self::tls_server)
    /// set, its establish timeout is the TLS handshake timeout.
    pub fn session(&self) -> &SessionSettings {
        &self.session
    }
    /// TLS on the frontend's listener, if any.
    pub fn tls_server(&self) -> Option<&Arc<ServerTls>> {
        self.tls_server.as_ref()
    }
    /// TLS on the worker's lanes, if any.
    pub fn tls_client(&self) -> Option<&Arc<ClientTls>> {
        self.tls_client.as_ref()
    }
}

/// Builds a [`TcpConfig`], starting from the defaults; [`build`](Self::build) checks every
/// value.
#[derive(Debug, Clone)]
pub struct TcpConfigBuilder(TcpConfig);

impl TcpConfigBuilder {
    velo_session::builder_setters! {
        /// `SO_SNDBUF` in bytes, 4 KiB..=1 GiB, set before connect or listen; `None` keeps the
        /// OS default (default 4 MiB).
        send_buffer: Option<u32>;
        /// `SO_RCVBUF` in bytes, 4 KiB..=1 GiB, set before connect or listen; `None` keeps the
        /// OS default (default 4 MiB).
        recv_buffer: Option<u32>;
        /// Bound on establishing a TCP connection (worker), 1 ms..=1 h (default 3 s).
        connect_timeout: Duration;
        /// Listen backlog (frontend), 1..=65535 (default 1024).
        backlog: u32;
        /// How long the kernel keeps a lane whose peer vanished (`TCP_USER_TIMEOUT`, and
        /// keepalive probes from a third of it), 100 ms..=1 h like the mux's idle timeout; set it
        /// to that timeout (default 10 s). `None` leaves the kernel's defaults (retransmissions
        /// for about 15 minutes).
        liveness: Option<Duration>;
        /// What velo-session takes (default: its defaults).
        session: SessionSettings;
        /// TLS on the frontend's listener (its certificate, and its clients' CA for mutual TLS);
        /// `None` for plaintext lanes (the default). Shared, so a reload reaches the running
        /// listener. Its handshake timeout becomes the session's establish timeout.
        tls_server: Option<Arc<ServerTls>>;
        /// TLS on the worker's lanes (how it verifies frontends, its own certificate); `None`
        /// for plaintext lanes (the default).
        tls_client: Option<Arc<ClientTls>>;
    }

    /// Checks every value.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming the first setting outside its range, its value and
    /// what is allowed.
    pub fn build(self) -> Result<TcpConfig, ConfigError> {
        let mut c = self.0;
        let buffer = "must be from 4096 bytes to 1 GiB, or None for the OS default";
        if let Some(n) = c.send_buffer {
            ConfigError::check_range("send_buffer", n, SOCKET_BUFFERS, buffer)?;
        }
        if let Some(n) = c.recv_buffer {
            ConfigError::check_range("recv_buffer", n, SOCKET_BUFFERS, buffer)?;
        }
        let timeout = "must be from 1 ms to 1 h";
        ConfigError::check_range(
            "connect_timeout",
            c.connect_timeout,
            CONNECT_TIMEOUTS,
            timeout,
        )?;
        ConfigError::check_range("backlog", c.backlog, BACKLOGS, "must be 1..=65535")?;
        if let Some(bound) = c.liveness {
            let allowed = "must be from 100 ms to 1 h (the mux's idle timeout range), or None \
                           for the kernel's defaults";
            let range = MIN_IDLE_TIMEOUT..=MAX_IDLE_TIMEOUT;
            ConfigError::check_range("liveness", bound, range, allowed)?;
        }
        if let Some(tls) = &c.tls_server {
            let timeout = tls.handshake_timeout();
            c.session = c
                .session
                .to_builder()
                .establish_timeout(timeout)
                .build()
                .map_err(|_| ConfigError::OutOfRange {
                    field: "tls_server handshake timeout",
                    value: format!("{timeout:?}"),
                    allowed: "must be from 1 ms to 1 h (it bounds a lane's TLS handshake)",
                })?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What building with one setting changed says, as text.
    fn refusal(change: impl FnOnce(TcpConfigBuilder) -> TcpConfigBuilder) -> String {
        change(TcpConfig::builder())
            .build()
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn the_defaults_are_valid() {
        let c = TcpConfig::builder().build().unwrap();
        assert_eq!(c.send_buffer(), Some(DEFAULT_SOCKET_BUFFER));
        assert_eq!(c.session(), &SessionSettings::default());
    }

    #[test]
    fn a_zero_socket_buffer_is_refused_naming_it() {
        let s = refusal(|b| b.send_buffer(Some(0)));
        assert_eq!(
            s,
            "invalid send_buffer 0: must be from 4096 bytes to 1 GiB, or None for the OS default"
        );
        let r = refusal(|b| b.recv_buffer(Some(0)));
        assert!(r.starts_with("invalid recv_buffer 0"), "{r}");
        // Past i32::MAX the kernel would read a negative size.
        let r = refusal(|b| b.recv_buffer(Some(u32::MAX)));
        assert!(r.starts_with("invalid recv_buffer"), "{r}");
        TcpConfig::builder()
            .send_buffer(None)
            .recv_buffer(None)
            .build()
            .expect("None keeps the OS default");
    }

    fn server_tls(pki: &velo_tls::testing::TestPki, handshake: Duration) -> Arc<ServerTls> {
        let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
        Arc::new(ServerTls::new(cert, key, None, handshake).unwrap())
    }

    #[test]
    fn a_tls_listener_bounds_each_lanes_establish_phase_by_its_handshake_timeout() {
        let pki = velo_tls::testing::TestPki::new();
        let tls = server_tls(&pki, Duration::from_millis(1500));
        let c = TcpConfig::builder().tls_server(Some(tls)).build().unwrap();
        let establish = c.session().establish_timeout();
        assert_eq!(establish, Duration::from_millis(1500));
    }

    #[test]
    fn a_tls_handshake_timeout_of_zero_is_refused_naming_it() {
        let pki = velo_tls::testing::TestPki::new();
        let tls = server_tls(&pki, Duration::ZERO);
        let why = refusal(|b| b.tls_server(Some(tls)));
        assert!(
            why.starts_with("invalid tls_server handshake timeout 0ns: must be from 1 ms"),
            "{why}"
        );
    }

    #[test]
    fn a_zero_connect_timeout_or_backlog_is_refused_naming_it() {
        type Change = fn(TcpConfigBuilder) -> TcpConfigBuilder;
        let cases: [(Change, &str); 2] = [
            (
                |b| b.connect_timeout(Duration::ZERO),
                "invalid connect_timeout 0ns: must be from 1 ms to 1 h",
            ),
            (|b| b.backlog(0), "invalid backlog 0: must be 1..=65535"),
        ];
        for (change, want) in cases {
            assert_eq!(refusal(change), want);
        }
    }

    #[test]
    fn a_liveness_bound_the_kernel_would_read_as_its_default_is_refused() {
        // TCP_USER_TIMEOUT 0 means "the kernel's default": a silent opt-out.
        let l = refusal(|b| b.liveness(Some(Duration::ZERO)));
        assert!(
            l.starts_with("invalid liveness 0ns: must be from 100 ms"),
            "{l}"
        );
        let l = refusal(|b| b.liveness(Some(Duration::from_secs(7200))));
        assert!(l.starts_with("invalid liveness 7200s"), "{l}");
    }
}
