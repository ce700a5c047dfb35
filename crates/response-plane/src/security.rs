//! TLS and the cluster secret, as the environment names them: Dynamo's `DYN_TCP_TLS_*`
//! contract, checked more strictly than Dynamo does (a half-set configuration is a startup
//! error naming the variable and what is missing, where Dynamo only warns), and
//! `DYN_VELO_CLUSTER_SECRET_PATH` for the velo plane's challenge-response.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use velo_session::ClusterSecret;
use velo_tls::{ClientIdentity, ClientTls, ServerTls, TlsError, Trust};

use crate::ConfigError;
use crate::env::Env;

/// `DYN_TCP_TLS_CERT_PATH`: the frontend's certificate chain (PEM).
pub const ENV_TLS_CERT_PATH: &str = "DYN_TCP_TLS_CERT_PATH";
/// `DYN_TCP_TLS_KEY_PATH`: the frontend's private key (PEM).
pub const ENV_TLS_KEY_PATH: &str = "DYN_TCP_TLS_KEY_PATH";
/// `DYN_TCP_TLS_CA_CERT_PATH`: the CA a worker verifies frontends against (PEM).
pub const ENV_TLS_CA_CERT_PATH: &str = "DYN_TCP_TLS_CA_CERT_PATH";
/// `DYN_TCP_TLS_INSECURE`: `1`/`true` makes a worker skip verifying frontends (development).
pub const ENV_TLS_INSECURE: &str = "DYN_TCP_TLS_INSECURE";
/// `DYN_TCP_TLS_SERVER_NAME`: the name a frontend's certificate must carry (when workers dial
/// it by IP address).
pub const ENV_TLS_SERVER_NAME: &str = "DYN_TCP_TLS_SERVER_NAME";
/// `DYN_TCP_TLS_HANDSHAKE_TIMEOUT_SECS`: bound on one TLS handshake (default 3).
pub const ENV_TLS_HANDSHAKE_TIMEOUT_SECS: &str = "DYN_TCP_TLS_HANDSHAKE_TIMEOUT_SECS";
/// `DYN_TCP_TLS_CLIENT_CERT_PATH`: the worker's certificate for mutual TLS (PEM).
pub const ENV_TLS_CLIENT_CERT_PATH: &str = "DYN_TCP_TLS_CLIENT_CERT_PATH";
/// `DYN_TCP_TLS_CLIENT_KEY_PATH`: the worker's private key for mutual TLS (PEM).
pub const ENV_TLS_CLIENT_KEY_PATH: &str = "DYN_TCP_TLS_CLIENT_KEY_PATH";
/// `DYN_TCP_TLS_CLIENT_CA_CERT_PATH`: a frontend requires workers' certificates signed by this
/// CA (mutual TLS).
pub const ENV_TLS_CLIENT_CA_CERT_PATH: &str = "DYN_TCP_TLS_CLIENT_CA_CERT_PATH";
/// `DYN_VELO_CLUSTER_SECRET_PATH`: a file holding the cluster secret (16 to 4,096 bytes;
/// surrounding whitespace is ignored) every velo frontend and worker proves in its handshake.
pub const ENV_CLUSTER_SECRET_PATH: &str = "DYN_VELO_CLUSTER_SECRET_PATH";

/// Longest TLS handshake timeout accepted, in seconds.
pub const MAX_TLS_HANDSHAKE_SECS: u64 = 300;

/// TLS settings of both roles (a cluster usually hands every process the same ones): what a
/// frontend serves and what a worker trusts. Paths only; the files are read when the
/// configuration is built (to refuse a bad one at startup) and when a plane starts or
/// reloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// The frontend's certificate chain (`DYN_TCP_TLS_CERT_PATH`).
    pub cert: Option<PathBuf>,
    /// The frontend's key (`DYN_TCP_TLS_KEY_PATH`).
    pub key: Option<PathBuf>,
    /// The CA frontends are verified against (`DYN_TCP_TLS_CA_CERT_PATH`).
    pub ca: Option<PathBuf>,
    /// Workers skip verifying frontends (`DYN_TCP_TLS_INSECURE`; development only).
    pub insecure: bool,
    /// The name frontends' certificates are verified by (`DYN_TCP_TLS_SERVER_NAME`).
    pub server_name: Option<String>,
    /// Bound on one TLS handshake (`DYN_TCP_TLS_HANDSHAKE_TIMEOUT_SECS`, default 3 s).
    pub handshake_timeout: Duration,
    /// The worker's certificate for mutual TLS (`DYN_TCP_TLS_CLIENT_CERT_PATH`).
    pub client_cert: Option<PathBuf>,
    /// The worker's key for mutual TLS (`DYN_TCP_TLS_CLIENT_KEY_PATH`).
    pub client_key: Option<PathBuf>,
    /// The CA workers' certificates must chain to (`DYN_TCP_TLS_CLIENT_CA_CERT_PATH`).
    pub client_ca: Option<PathBuf>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert: None,
            key: None,
            ca: None,
            insecure: false,
            server_name: None,
            handshake_timeout: velo_tls::DEFAULT_HANDSHAKE_TIMEOUT,
            client_cert: None,
            client_key: None,
            client_ca: None,
        }
    }
}

impl TlsConfig {
    /// Whether frontends serve TLS (a certificate is configured).
    pub fn server_enabled(&self) -> bool {
        self.cert.is_some()
    }

    /// Whether workers dial with TLS (a CA, or the insecure flag, is configured).
    pub fn client_enabled(&self) -> bool {
        self.ca.is_some() || self.insecure
    }

    /// Whether anything is configured.
    pub fn is_enabled(&self) -> bool {
        self.server_enabled() || self.client_enabled() || self.client_ca.is_some()
    }

    /// Applies the `DYN_TCP_TLS_*` variables `env` sets.
    pub(crate) fn apply_env<F: Fn(&str) -> Option<String>>(
        &mut self,
        env: &Env<F>,
    ) -> Result<(), ConfigError> {
        let path = |var| env.map(var, "expected the path of a PEM file", non_empty::<PathBuf>);
        for (var, slot) in [
            (ENV_TLS_CERT_PATH, &mut self.cert),
            (ENV_TLS_KEY_PATH, &mut self.key),
            (ENV_TLS_CA_CERT_PATH, &mut self.ca),
            (ENV_TLS_CLIENT_CERT_PATH, &mut self.client_cert),
            (ENV_TLS_CLIENT_KEY_PATH, &mut self.client_key),
            (ENV_TLS_CLIENT_CA_CERT_PATH, &mut self.client_ca),
        ] {
            if let Some(p) = path(var)? {
                *slot = Some(p);
            }
        }
        let flags = [("1", true), ("true", true), ("0", false), ("false", false)];
        let allowed = "expected 1 or true (skip verifying frontends: development only), 0 or false";
        if let Some(on) = env.choice(ENV_TLS_INSECURE, &flags, allowed)? {
            self.insecure = on;
        }
        let name = "expected a DNS name or an IP address";
        if let Some(n) = env.map(ENV_TLS_SERVER_NAME, name, non_empty::<String>)? {
            self.server_name = Some(n);
        }
        let secs = "expected a whole number of seconds from 1 to 300";
        if let Some(s) = env.number::<u64>(
            ENV_TLS_HANDSHAKE_TIMEOUT_SECS,
            1..=MAX_TLS_HANDSHAKE_SECS,
            secs,
        )? {
            self.handshake_timeout = Duration::from_secs(s);
        }
        Ok(())
    }

    /// Refuses a half-set configuration, naming the variable and what is missing, then reads
    /// every file once so a bad one stops startup.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        pair(&self.cert, ENV_TLS_CERT_PATH, &self.key, ENV_TLS_KEY_PATH)?;
        pair(
            &self.client_cert,
            ENV_TLS_CLIENT_CERT_PATH,
            &self.client_key,
            ENV_TLS_CLIENT_KEY_PATH,
        )?;
        if self.ca.is_some() && self.insecure {
            return Err(half(
                ENV_TLS_INSECURE,
                "is set with DYN_TCP_TLS_CA_CERT_PATH: verify against the CA or skip verifying (development only), not both",
            ));
        }
        if self.client_cert.is_some() && !self.client_enabled() {
            return Err(half(
                ENV_TLS_CLIENT_CERT_PATH,
                "is set, but a worker with a certificate also needs DYN_TCP_TLS_CA_CERT_PATH (or DYN_TCP_TLS_INSECURE=1) to verify the frontend",
            ));
        }
        if self.server_name.is_some() && !self.client_enabled() {
            return Err(half(
                ENV_TLS_SERVER_NAME,
                "is set, but workers dial without TLS: set DYN_TCP_TLS_CA_CERT_PATH (or DYN_TCP_TLS_INSECURE=1)",
            ));
        }
        if self.client_ca.is_some() && !self.server_enabled() {
            return Err(half(
                ENV_TLS_CLIENT_CA_CERT_PATH,
                "is set, but frontends serve no TLS: set DYN_TCP_TLS_CERT_PATH and DYN_TCP_TLS_KEY_PATH",
            ));
        }
        // The velo plane's TCP lanes take the same range (their establish bound).
        let range = Duration::from_millis(1)..=Duration::from_secs(MAX_TLS_HANDSHAKE_SECS);
        let allowed = "must be from 1 ms to 300 s";
        let timeout = self.handshake_timeout;
        velo_mux::ConfigError::check_range("TLS handshake_timeout", timeout, range, allowed)?;
        self.server()?;
        self.client()?;
        Ok(())
    }

    /// A frontend's TLS, if configured.
    pub(crate) fn server(&self) -> Result<Option<Arc<ServerTls>>, ConfigError> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return Ok(None);
        };
        ServerTls::new(
            cert.clone(),
            key.clone(),
            self.client_ca.clone(),
            self.handshake_timeout,
        )
        .map(|t| Some(Arc::new(t)))
        .map_err(tls_error)
    }

    /// A worker's TLS, if configured.
    pub(crate) fn client(&self) -> Result<Option<Arc<ClientTls>>, ConfigError> {
        let trust = match (&self.ca, self.insecure) {
            (Some(ca), _) => Trust::Ca(ca.clone()),
            (None, true) => Trust::Insecure,
            (None, false) => return Ok(None),
        };
        let identity = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some(ClientIdentity {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        };
        ClientTls::new(
            trust,
            self.server_name.clone(),
            identity,
            self.handshake_timeout,
        )
        .map(|t| Some(Arc::new(t)))
        .map_err(tls_error)
    }

    /// A frontend's half of the cluster's TLS: refused when the cluster's workers expect TLS
    /// (a CA or the insecure flag is set) and this frontend has no certificate.
    pub(crate) fn check_frontend(&self) -> Result<(), ConfigError> {
        if self.client_enabled() && !self.server_enabled() {
            return Err(half(
                ENV_TLS_CERT_PATH,
                "is not set, but workers are configured for TLS (DYN_TCP_TLS_CA_CERT_PATH or DYN_TCP_TLS_INSECURE): this frontend needs DYN_TCP_TLS_CERT_PATH and DYN_TCP_TLS_KEY_PATH",
            ));
        }
        Ok(())
    }

    /// A worker's half: refused when frontends serve TLS and this worker cannot verify them,
    /// or frontends require client certificates and this worker has none.
    pub(crate) fn check_worker(&self) -> Result<(), ConfigError> {
        if self.server_enabled() && !self.client_enabled() {
            return Err(half(
                ENV_TLS_CA_CERT_PATH,
                "is not set, but frontends serve TLS (DYN_TCP_TLS_CERT_PATH): this worker needs the CA to verify them (or DYN_TCP_TLS_INSECURE=1, development only)",
            ));
        }
        if self.client_ca.is_some() && self.client_cert.is_none() {
            return Err(half(
                ENV_TLS_CLIENT_CERT_PATH,
                "is not set, but frontends require client certificates (DYN_TCP_TLS_CLIENT_CA_CERT_PATH): this worker needs DYN_TCP_TLS_CLIENT_CERT_PATH and DYN_TCP_TLS_CLIENT_KEY_PATH",
            ));
        }
        Ok(())
    }
}

/// Reads the cluster secret at `path`: the file's bytes without surrounding ASCII whitespace.
pub(crate) fn read_secret(path: &Path) -> Result<ClusterSecret, ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| ConfigError::SecretRead {
        path: path.to_owned(),
        source: Arc::new(e),
    })?;
    ClusterSecret::new(bytes.trim_ascii()).map_err(|source| ConfigError::SecretLength {
        path: path.to_owned(),
        source,
    })
}

fn non_empty<T: From<String>>(v: &str) -> Option<T> {
    (!v.is_empty()).then(|| T::from(v.to_owned()))
}

fn pair(
    a: &Option<PathBuf>,
    a_var: &'static str,
    b: &Option<PathBuf>,
    b_var: &'static str,
) -> Result<(), ConfigError> {
    match (a, b) {
        (Some(_), None) => Err(ConfigError::TlsHalfSet {
            var: a_var,
            missing: b_var,
        }),
        (None, Some(_)) => Err(ConfigError::TlsHalfSet {
            var: b_var,
            missing: a_var,
        }),
        _ => Ok(()),
    }
}

fn half(var: &'static str, problem: &'static str) -> ConfigError {
    ConfigError::TlsMismatch { var, problem }
}

/// A TLS file's error, naming the variable that points at it.
fn tls_error(source: TlsError) -> ConfigError {
    let var = match source.what() {
        "server private key" => ENV_TLS_KEY_PATH,
        "client CA certificate" => ENV_TLS_CLIENT_CA_CERT_PATH,
        "CA certificate" => ENV_TLS_CA_CERT_PATH,
        "client certificate" | "client certificate and key" => ENV_TLS_CLIENT_CERT_PATH,
        "client private key" => ENV_TLS_CLIENT_KEY_PATH,
        "server name" => ENV_TLS_SERVER_NAME,
        _ => ENV_TLS_CERT_PATH,
    };
    ConfigError::Tls { var, source }
}

/// A plane's TLS and secret, read from their files when the plane starts.
#[derive(Clone, Default)]
pub(crate) struct Security {
    /// A frontend's TLS (TCP lanes and classic connections).
    pub(crate) server: Option<Arc<ServerTls>>,
    /// A worker's TLS.
    pub(crate) client: Option<Arc<ClientTls>>,
    /// The velo plane's cluster secret.
    pub(crate) secret: Option<ClusterSecret>,
}

impl Security {
    /// A frontend's: refuses a configuration whose workers expect TLS this frontend lacks.
    pub(crate) fn frontend(config: &crate::ResponsePlaneConfig) -> Result<Self, ConfigError> {
        warn_if_secret_unused(config);
        let tcp = uses_tcp(config);
        if tcp {
            config.tls().check_frontend()?;
        }
        Ok(Self {
            server: if tcp { config.tls().server()? } else { None },
            client: None,
            secret: config.secret()?,
        })
    }

    /// A worker's: refuses a configuration whose frontends serve TLS this worker cannot
    /// verify, or require a certificate it lacks.
    pub(crate) fn worker(config: &crate::ResponsePlaneConfig) -> Result<Self, ConfigError> {
        warn_if_secret_unused(config);
        let tcp = uses_tcp(config);
        if tcp {
            config.tls().check_worker()?;
        }
        Ok(Self {
            server: None,
            client: if tcp { config.tls().client()? } else { None },
            secret: config.secret()?,
        })
    }

    /// Rereads the TLS files; connections already up keep their session.
    pub(crate) fn reload(&self) -> Result<(), ConfigError> {
        if let Some(s) = &self.server {
            s.reload().map_err(tls_error)?;
        }
        if let Some(c) = &self.client {
            c.reload().map_err(tls_error)?;
        }
        Ok(())
    }

    /// The TLS files, for the watch.
    pub(crate) fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = Vec::new();
        if let Some(s) = &self.server {
            files.extend(s.files().into_iter().map(Path::to_owned));
        }
        if let Some(c) = &self.client {
            files.extend(c.files().into_iter().map(Path::to_owned));
        }
        files
    }
}

/// The classic plane has no connection handshake to carry the cluster secret: a user who set
/// it must not believe its workers are authenticated by it.
fn warn_if_secret_unused(config: &crate::ResponsePlaneConfig) {
    if config.plane() == crate::Plane::Classic && config.secret_path().is_some() {
        tracing::warn!(
            "DYN_VELO_CLUSTER_SECRET_PATH is set but the classic plane (DYN_RESPONSE_PLANE=tcp) \
             does not use it: a classic stream is claimed by its address's one-time token (and \
             mutual TLS when DYN_TCP_TLS_* require client certificates), not by the secret"
        );
    }
}

/// Whether the plane runs over TCP (classic, or velo over TCP): UCX lanes have no TLS, and
/// their peers are authenticated by the cluster secret alone.
fn uses_tcp(config: &crate::ResponsePlaneConfig) -> bool {
    let tcp =
        config.plane() == crate::Plane::Classic || config.transport() == crate::VeloTransport::Tcp;
    if !tcp && config.tls().is_enabled() {
        tracing::warn!(
            "DYN_TCP_TLS_* are set but the velo plane runs over UCX, which has no TLS: its \
             lanes are authenticated by DYN_VELO_CLUSTER_SECRET_PATH only, and not encrypted"
        );
    }
    tcp
}
