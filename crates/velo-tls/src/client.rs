//! A worker's TLS: how it verifies frontends, and its own certificate for mutual TLS.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::{TlsError, insecure, pem, provider};

/// How a worker decides that a frontend's certificate is genuine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// The certificate must chain to a CA in this PEM file (`DYN_TCP_TLS_CA_CERT_PATH`).
    Ca(PathBuf),
    /// Any certificate is accepted (`DYN_TCP_TLS_INSECURE`): traffic is encrypted but the
    /// frontend is not authenticated. Development only; a warning is logged.
    Insecure,
}

/// A worker's own certificate and key, for frontends that require one (mutual TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate chain, PEM (`DYN_TCP_TLS_CLIENT_CERT_PATH`).
    pub cert: PathBuf,
    /// Its private key, PEM (`DYN_TCP_TLS_CLIENT_KEY_PATH`).
    pub key: PathBuf,
}

/// A dialer's TLS settings, read from PEM files and rebuilt by [`reload`](Self::reload).
pub struct ClientTls {
    trust: Trust,
    server_name: Option<ServerName<'static>>,
    identity: Option<ClientIdentity>,
    handshake_timeout: Duration,
    current: RwLock<Arc<ClientConfig>>,
}

impl ClientTls {
    /// Reads the trust anchors and, when set, the worker's own certificate. `server_name` is
    /// the name a frontend's certificate must carry (`DYN_TCP_TLS_SERVER_NAME`); unset, the
    /// IP address dialed is verified.
    ///
    /// # Errors
    ///
    /// [`TlsError`] naming the file that is unreadable, empty or invalid, or an invalid name.
    pub fn new(
        trust: Trust,
        server_name: Option<String>,
        identity: Option<ClientIdentity>,
        handshake_timeout: Duration,
    ) -> Result<Self, TlsError> {
        let server_name = server_name
            .map(|n| ServerName::try_from(n.clone()).map_err(|_| TlsError::ServerName(n)))
            .transpose()?;
        if trust == Trust::Insecure {
            tracing::warn!(
                "TLS server verification is off (DYN_TCP_TLS_INSECURE): traffic is encrypted \
                 but frontends are not authenticated; development only"
            );
        }
        let config = build(&trust, identity.as_ref())?;
        Ok(Self {
            trust,
            server_name,
            identity,
            handshake_timeout,
            current: RwLock::new(config),
        })
    }

    /// The connector new lanes use: the configuration of the last successful load.
    pub fn connector(&self) -> TlsConnector {
        TlsConnector::from(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }

    /// The name to verify a frontend dialed at `ip` by: the configured one, else the address.
    pub fn server_name(&self, ip: IpAddr) -> ServerName<'static> {
        self.server_name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(ip.into()))
    }

    /// Rereads every file; lanes already up keep their session.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); the configuration in use stays as it was.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = build(&self.trust, self.identity.as_ref())?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        tracing::info!("TLS client configuration reloaded");
        Ok(())
    }

    /// Bound on one TLS handshake.
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }

    /// Whether this worker presents a certificate (mutual TLS).
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// The files this configuration is read from (for a file watch).
    pub fn files(&self) -> Vec<&Path> {
        let mut files = Vec::new();
        if let Trust::Ca(ca) = &self.trust {
            files.push(ca.as_path());
        }
        if let Some(id) = &self.identity {
            files.extend([id.cert.as_path(), id.key.as_path()]);
        }
        files
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("trust", &self.trust)
            .field("server_name", &self.server_name)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

fn build(trust: &Trust, identity: Option<&ClientIdentity>) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "TLS protocol versions",
            source,
        })?;
    let builder = match trust {
        Trust::Ca(path) => builder.with_root_certificates(pem::roots(path, "CA certificate")?),
        Trust::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(insecure::AnyServer::new(provider()))),
    };
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let chain = pem::certs(&id.cert, "client certificate")?;
            let key = pem::key(&id.key, "client private key")?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|source| TlsError::Rustls {
                    what: "client certificate and key",
                    source,
                })?
        }
    };
    Ok(Arc::new(config))
}
