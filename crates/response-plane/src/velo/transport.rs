//! The velo transports behind one interface: the `cfg` attributes of the velo plane live
//! here and nowhere else.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio_util::task::TaskTracker;
use velo_session::{
    Acceptor, FrontendEndpoint, FrontendParts, HandshakeStats, ListeningFrontend, TransportControl,
    WorkerEndpoint,
};

use crate::security::Security;
use crate::{ResponsePlaneConfig, StartError, VeloTransport};

/// A listening velo frontend, whatever carries its lanes.
pub(crate) trait FrontendTransport: Send + Sync + 'static {
    /// The velo-session endpoint: connections, mux counters, go-away, close.
    fn endpoint(&self) -> &FrontendEndpoint;
    /// Where workers connect.
    fn local_addr(&self) -> SocketAddr;
    /// The handshake counters of every lane accepted.
    fn handshake_stats(&self) -> HandshakeStats;
    /// Stops accepting, closes every lane gracefully and lets the transport wind down.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
    /// Stops everything at once.
    fn abort(&self);
}

/// A velo worker, whatever carries its lanes.
pub(crate) trait WorkerTransport: Send + Sync + 'static {
    /// The velo-session endpoint: connections, streams, flush.
    fn endpoint(&self) -> &WorkerEndpoint;
    /// The handshake counters of every lane dialed.
    fn handshake_stats(&self) -> HandshakeStats;
    /// Closes every connection (a CLOSE each) and lets the transport wind down.
    fn close(&self);
    /// Stops every connection at once.
    fn abort(&self);
}

/// Binds a velo frontend on `addr` over the configured transport.
///
/// # Errors
///
/// [`StartError::NotCompiled`] for a transport this build lacks; the transport's bind or
/// initialisation failure.
#[cfg_attr(not(any(feature = "tcp", feature = "ucx")), allow(unused_variables))]
pub(crate) async fn bind_frontend(
    config: &ResponsePlaneConfig,
    addr: SocketAddr,
    acceptor: Arc<dyn Acceptor>,
    tracker: TaskTracker,
    security: &Security,
) -> Result<Box<dyn FrontendTransport>, StartError> {
    let parts = FrontendParts::new(config.mux(velo_mux::Side::Frontend), acceptor, tracker);
    match config.transport() {
        #[cfg(feature = "tcp")]
        VeloTransport::Tcp => {
            let f = velo_tcp::bind_frontend(addr, tcp_config(config, security)?, parts)
                .await
                .map_err(|e| StartError::Bind {
                    addr,
                    source: Arc::new(e),
                })?;
            Ok(Box::new(f))
        }
        #[cfg(feature = "ucx")]
        VeloTransport::Ucx => {
            let f = velo_ucx::bind_frontend(addr, ucx_config(config, security)?, parts)
                .await
                .map_err(StartError::Ucx)?;
            Ok(Box::new(f))
        }
        #[allow(unreachable_patterns)] // every transport compiled in
        other => Err(not_compiled(other)),
    }
}

/// Starts a velo worker over `transport`.
///
/// # Errors
///
/// [`StartError::NotCompiled`] for a transport this build lacks; the transport's
/// initialisation failure.
#[cfg_attr(not(any(feature = "tcp", feature = "ucx")), allow(unused_variables))]
pub(crate) fn start_worker(
    config: &ResponsePlaneConfig,
    transport: VeloTransport,
    tracker: TaskTracker,
    security: &Security,
) -> Result<Arc<dyn WorkerTransport>, StartError> {
    let mux = config.mux(velo_mux::Side::Worker);
    match transport {
        #[cfg(feature = "tcp")]
        VeloTransport::Tcp => Ok(Arc::new(velo_tcp::TcpWorker::new(
            mux,
            tcp_config(config, security)?,
            tracker,
        ))),
        #[cfg(feature = "ucx")]
        VeloTransport::Ucx => {
            let w = velo_ucx::UcxWorker::new(mux, ucx_config(config, security)?, tracker)
                .map_err(StartError::Ucx)?;
            Ok(Arc::new(w))
        }
        #[allow(unreachable_patterns)] // every transport compiled in
        other => Err(not_compiled(other)),
    }
}

fn not_compiled(transport: VeloTransport) -> StartError {
    StartError::NotCompiled {
        what: match transport {
            VeloTransport::Tcp => "velo over tcp",
            VeloTransport::Ucx => "velo over ucx",
        },
        feature: transport.name(),
    }
}

/// The TCP settings of the plane: the transport's defaults, with the lanes' sockets giving
/// up on a vanished peer within the configured idle timeout, and the plane's TLS, secret and
/// worker instance.
///
/// # Errors
///
/// A setting outside the transport's range (`ResponsePlaneConfig::build` checked the same
/// ranges, so only a TLS handshake timeout set past them reaches this).
#[cfg(feature = "tcp")]
fn tcp_config(
    c: &ResponsePlaneConfig,
    security: &Security,
) -> Result<velo_tcp::TcpConfig, StartError> {
    let session = session(velo_tcp::TcpConfig::default().session(), c, security)?;
    let config = velo_tcp::TcpConfig::builder()
        .liveness(Some(c.idle_timeout()))
        .tls_server(security.server.clone())
        .tls_client(security.client.clone())
        .session(session)
        .build();
    Ok(config.map_err(crate::ConfigError::from)?)
}

/// The UCX settings of the plane: UCX's defaults, with the transports and devices the
/// configuration names (`ResponsePlaneConfig::build` checked them).
///
/// # Errors
///
/// As [`tcp_config`].
#[cfg(feature = "ucx")]
fn ucx_config(
    c: &ResponsePlaneConfig,
    security: &Security,
) -> Result<velo_ucx::UcxConfig, StartError> {
    let session = session(velo_ucx::UcxConfig::default().session(), c, security)?;
    let config = ucx_builder(c).session(session).build();
    Ok(config.map_err(crate::ConfigError::from)?)
}

/// The UCX settings the plane's configuration names.
#[cfg(feature = "ucx")]
pub(crate) fn ucx_builder(c: &ResponsePlaneConfig) -> velo_ucx::UcxConfigBuilder {
    velo_ucx::UcxConfig::builder()
        .tls(c.ucx_tls().map(str::to_owned))
        .net_devices(c.ucx_net_devices().map(str::to_owned))
}

/// A transport's session settings with the plane's cluster secret and worker instance.
#[cfg(any(feature = "tcp", feature = "ucx"))]
fn session(
    defaults: &velo_session::SessionSettings,
    c: &ResponsePlaneConfig,
    security: &Security,
) -> Result<velo_session::SessionSettings, crate::ConfigError> {
    let session = defaults
        .to_builder()
        .secret(security.secret.clone())
        .worker_instance(c.worker_instance())
        .build()?;
    Ok(session)
}

/// Every transport's frontend is velo-session's.
impl<C: TransportControl> FrontendTransport for ListeningFrontend<C> {
    fn endpoint(&self) -> &FrontendEndpoint {
        self.endpoint()
    }
    fn local_addr(&self) -> SocketAddr {
        self.local_addr()
    }
    fn handshake_stats(&self) -> HandshakeStats {
        self.handshake_stats()
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.shutdown())
    }
    fn abort(&self) {
        self.abort();
    }
}

#[cfg(feature = "tcp")]
impl WorkerTransport for velo_tcp::TcpWorker {
    fn endpoint(&self) -> &WorkerEndpoint {
        self.endpoint()
    }
    fn handshake_stats(&self) -> HandshakeStats {
        self.stats()
    }
    fn close(&self) {
        self.close();
    }
    fn abort(&self) {
        self.abort();
    }
}

#[cfg(feature = "ucx")]
impl WorkerTransport for velo_ucx::UcxWorker {
    fn endpoint(&self) -> &WorkerEndpoint {
        self.endpoint()
    }
    fn handshake_stats(&self) -> HandshakeStats {
        self.handshake_stats()
    }
    fn close(&self) {
        self.close();
    }
    fn abort(&self) {
        self.abort();
    }
}
