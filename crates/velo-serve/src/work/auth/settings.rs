//! What a side of the request plane proves and demands: the cluster secret, and the response
//! plane's TLS material in the request plane's (inverted) roles.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use response_plane::ResponsePlaneConfig;
use velo_session::ClusterSecret;
use velo_tls::{ClientIdentity, ClientTls, ServerTls, TlsError, Trust};

use super::{SecretError, Side};

/// What this side proves and demands on the request plane: the cluster secret, or nothing
/// (every peer without a secret is served, and one with a secret refused); and TLS, or none.
/// On this plane TLS roles are the TCP roles inverted (see [`crate::work`], "TLS"): a
/// frontend is the TLS server ([`with_frontend_tls`](Self::with_frontend_tls)), a worker the
/// TLS client ([`with_worker_tls`](Self::with_worker_tls)). Cheap to clone, and clones share
/// the TLS: a reload (a running frontend's or worker's watch of the files, see
/// [`crate::work`], "TLS") reaches every clone. Never prints the secret.
#[derive(Clone, Default)]
pub struct RequestAuth {
    pub(super) secret: Option<ClusterSecret>,
    pub(super) instance: Option<u64>,
    frontend_tls: Option<Arc<ServerTls>>,
    worker_tls: Option<Arc<ClientTls>>,
}

impl RequestAuth {
    /// No secret and no TLS: the request plane authenticates nobody, in plaintext.
    pub fn open() -> Self {
        Self::default()
    }

    /// The secret `bytes` (as in the secret's file, surrounding ASCII whitespace ignored).
    ///
    /// # Errors
    ///
    /// [`SecretError::Length`] when they are shorter or longer than a secret may be.
    pub fn with_secret(bytes: &[u8]) -> Result<Self, SecretError> {
        let bytes = bytes.trim_ascii();
        let secret = ClusterSecret::new(bytes).map_err(|_| SecretError::Length {
            path: None,
            len: bytes.len(),
        })?;
        Ok(Self {
            secret: Some(secret),
            ..Self::default()
        })
    }

    /// Names the worker instance (its discovery id, not 0) in this side's greeting: as a
    /// frontend, the worker it means to reach; as a worker, its own. When both sides name one
    /// they must agree ([`HandshakeError::WrongInstance`](super::HandshakeError::WrongInstance)),
    /// so a stale or forged discovery entry, or a relay to another worker, is refused. A side
    /// naming none (0) checks nothing, and is checked by nobody.
    #[must_use]
    pub fn with_instance(mut self, id: u64) -> Self {
        self.instance = Some(id).filter(|&id| id != 0);
        self
    }

    /// As a frontend, serves TLS with `tls` (its response-plane server identity) on every
    /// request-plane connection, and requires it of workers.
    #[must_use]
    pub fn with_frontend_tls(mut self, tls: Arc<ServerTls>) -> Self {
        self.frontend_tls = Some(tls);
        self
    }

    /// As a worker, speaks TLS as a client with `tls` (its response-plane trust and client
    /// identity) on every request-plane connection, and requires it of frontends.
    #[must_use]
    pub fn with_worker_tls(mut self, tls: Arc<ClientTls>) -> Self {
        self.worker_tls = Some(tls);
        self
    }

    /// The response plane's security for `side`: its secret, read from the file `config`
    /// names (`DYN_VELO_CLUSTER_SECRET_PATH`) as the plane reads it, or none when it names
    /// none; and its TLS (`DYN_TCP_TLS_*`), as a frontend's server identity
    /// ([`TlsConfig::server_enabled`](response_plane::TlsConfig::server_enabled)) or a
    /// worker's trust ([`TlsConfig::client_enabled`](response_plane::TlsConfig::client_enabled)),
    /// or none.
    ///
    /// # Errors
    ///
    /// [`SecretError`] when the secret's file cannot be read or holds no usable secret, or a
    /// TLS file cannot be loaded.
    pub fn from_config(config: &ResponsePlaneConfig, side: Side) -> Result<Self, SecretError> {
        let mut auth = match config.secret_path() {
            None => Self::open(),
            Some(path) => {
                let bytes = std::fs::read(path).map_err(|source| SecretError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                Self::with_secret(&bytes).map_err(|e| match e {
                    SecretError::Length { len, .. } => SecretError::Length {
                        path: Some(path.to_owned()),
                        len,
                    },
                    other => other,
                })?
            }
        };
        let tls = config.tls();
        match side {
            Side::Frontend => {
                if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                    let server = ServerTls::new(
                        cert.clone(),
                        key.clone(),
                        tls.client_ca.clone(),
                        tls.handshake_timeout,
                    )?;
                    auth = auth.with_frontend_tls(Arc::new(server));
                }
            }
            Side::Worker => {
                let trust = match (&tls.ca, tls.insecure) {
                    (Some(ca), _) => Some(Trust::Ca(ca.clone())),
                    (None, true) => Some(Trust::Insecure),
                    (None, false) => None,
                };
                if let Some(trust) = trust {
                    let identity = match (&tls.client_cert, &tls.client_key) {
                        (Some(cert), Some(key)) => Some(ClientIdentity {
                            cert: cert.clone(),
                            key: key.clone(),
                        }),
                        _ => None,
                    };
                    let name = tls.server_name.clone();
                    let client = ClientTls::new(trust, name, identity, tls.handshake_timeout)?;
                    auth = auth.with_worker_tls(Arc::new(client));
                }
            }
        }
        Ok(auth)
    }

    /// Whether this side has a secret (and so demands one).
    pub fn has_secret(&self) -> bool {
        self.secret.is_some()
    }

    /// Whether this side speaks TLS on the request plane (as a frontend or as a worker).
    pub fn has_tls(&self) -> bool {
        self.frontend_tls.is_some() || self.worker_tls.is_some()
    }

    /// The TLS a frontend serves, if any.
    pub(crate) fn frontend_tls(&self) -> Option<&ServerTls> {
        self.frontend_tls.as_deref()
    }

    /// The TLS a worker dials with, if any.
    pub(crate) fn worker_tls(&self) -> Option<&ClientTls> {
        self.worker_tls.as_deref()
    }

    /// Rereads this side's TLS files: connections already up keep their session, new ones
    /// use the new files.
    ///
    /// # Errors
    ///
    /// [`TlsError`] naming the file that does not load; the TLS in use then stays as it was
    /// (a frontend's and a worker's are reread separately, each all or nothing).
    pub(crate) fn reload_tls(&self) -> Result<(), TlsError> {
        if let Some(server) = &self.frontend_tls {
            server.reload()?;
        }
        if let Some(client) = &self.worker_tls {
            client.reload()?;
        }
        Ok(())
    }

    /// The files this side's TLS is read from (none without TLS), for the watch.
    pub(crate) fn tls_files(&self) -> Vec<PathBuf> {
        let server = self.frontend_tls.iter().flat_map(|s| s.files());
        let client = self.worker_tls.iter().flat_map(|c| c.files());
        server.chain(client).map(Path::to_owned).collect()
    }
}

impl std::fmt::Debug for RequestAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = if self.has_secret() { "set" } else { "none" };
        let tls = match (&self.frontend_tls, &self.worker_tls) {
            (Some(_), Some(_)) => "frontend and worker",
            (Some(_), None) => "frontend (server)",
            (None, Some(_)) => "worker (client)",
            (None, None) => "none",
        };
        write!(f, "RequestAuth {{ secret: {secret}, tls: {tls} }}")
    }
}
