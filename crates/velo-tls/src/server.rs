//! A frontend's TLS: its certificate and key, and the CA of its clients for mutual TLS.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;

use crate::{TlsError, pem, provider};

/// A listener's TLS settings, read from PEM files and rebuilt by [`reload`](Self::reload).
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    handshake_timeout: Duration,
    current: RwLock<Arc<ServerConfig>>,
}

impl ServerTls {
    /// Reads the certificate chain `cert`, its private key `key` and, when set, the CA that
    /// clients' certificates must chain to (`client_ca`: mutual TLS, clients without a valid
    /// certificate are refused during the handshake).
    ///
    /// # Errors
    ///
    /// [`TlsError`] naming the file that is unreadable, empty or invalid, or the key that does
    /// not match the certificate.
    pub fn new(
        cert: PathBuf,
        key: PathBuf,
        client_ca: Option<PathBuf>,
        handshake_timeout: Duration,
    ) -> Result<Self, TlsError> {
        let config = build(&cert, &key, client_ca.as_deref())?;
        Ok(Self {
            cert,
            key,
            client_ca,
            handshake_timeout,
            current: RwLock::new(config),
        })
    }

    /// The acceptor new connections use: the configuration of the last successful load.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config())
    }

    /// Rereads every file. Connections already up keep their session; new ones get the new
    /// configuration.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); the configuration in use stays as it was.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = build(&self.cert, &self.key, self.client_ca.as_deref())?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        tracing::info!(cert = ?self.cert, "TLS certificate reloaded");
        Ok(())
    }

    /// Bound on one TLS handshake.
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }

    /// Whether clients must present a certificate (mutual TLS).
    pub fn requires_client_cert(&self) -> bool {
        self.client_ca.is_some()
    }

    /// The files this configuration is read from (for a file watch).
    pub fn files(&self) -> Vec<&Path> {
        let mut files = vec![self.cert.as_path(), self.key.as_path()];
        files.extend(self.client_ca.as_deref());
        files
    }

    fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert)
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

fn build(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = pem::certs(cert, "server certificate")?;
    let key = pem::key(key, "server private key")?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "TLS protocol versions",
            source,
        })?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let roots = pem::roots(path, "client CA certificate")?;
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: path.to_owned(),
                    source: Arc::new(e),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Rustls {
            what: "server certificate and key",
            source,
        })?;
    Ok(Arc::new(config))
}
