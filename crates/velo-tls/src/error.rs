//! What can be wrong with TLS files and settings.

use std::path::PathBuf;
use std::sync::Arc;

/// Why a TLS configuration could not be built (at startup, or on a reload, which then keeps
/// the configuration it had).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path:?}: {source}")]
    Read {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A file holds no PEM section of the kind expected, or an unparsable one.
    #[error("{path:?} holds no valid {what} in PEM form: {reason}")]
    Pem {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// The name to verify the frontend by is neither a DNS name nor an IP address.
    #[error("invalid TLS server name {0:?}: expected a DNS name or an IP address")]
    ServerName(String),
    /// rustls refused the material (a key that does not match its certificate, a CA that is
    /// not a valid trust anchor, ...).
    #[error("{what}: {source}")]
    Rustls {
        /// What was being built.
        what: &'static str,
        /// rustls' error.
        #[source]
        source: rustls::Error,
    },
    /// rustls refused the client-certificate verifier (an empty or invalid client CA).
    #[error("client CA {path:?}: {source}")]
    ClientCa {
        /// The CA file.
        path: PathBuf,
        /// rustls' error.
        #[source]
        source: Arc<rustls::server::VerifierBuilderError>,
    },
}

/// A TLS client's handshake was answered in plaintext: the peer has no TLS. Transports put
/// it inside the `io::Error` of a failed connect, so callers can tell it from other handshake
/// failures (`io::Error::get_ref`, then `downcast_ref`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct PlaintextAnswer {
    /// What the peer's plaintext answer said.
    pub detail: String,
}

impl TlsError {
    /// What the failing file or setting holds: `"server certificate"`, `"server private
    /// key"`, `"client CA certificate"`, `"CA certificate"`, `"client certificate"`, `"client
    /// private key"`, `"server name"`, or what rustls was building.
    pub fn what(&self) -> &'static str {
        match self {
            Self::Read { what, .. } | Self::Pem { what, .. } | Self::Rustls { what, .. } => what,
            Self::ServerName(_) => "server name",
            Self::ClientCa { .. } => "client CA certificate",
        }
    }
}
