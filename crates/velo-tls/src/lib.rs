//! TLS for velo's TCP lanes and for the classic plane: rustls configurations built from PEM
//! files (Dynamo's `DYN_TCP_TLS_*` contract), checked when built and reloadable while a
//! service runs.
//!
//! # Layer contract
//!
//! This crate reads certificate files and builds rustls configurations; it never opens a
//! socket, spawns a task or knows the velo protocol. The transports (`velo-tcp`, the classic
//! plane in `response-plane`) wrap their TCP streams with the acceptor and connector it hands
//! out. Its crypto provider is rustls' `ring`: it builds with a C compiler alone, while
//! rustls' default (`aws-lc-rs`) needs cmake, which neither CI nor Dynamo's own TLS uses.
//!
//! # Main types
//!
//! - [`ServerTls`]: a frontend's certificate and key, and, for mutual TLS, the CA its
//!   clients' certificates must chain to. [`ServerTls::acceptor`] is the configuration of
//!   the moment; [`ServerTls::reload`] rereads the files (lanes already up keep their
//!   session, new ones use the new certificate).
//! - [`ClientTls`]: how a worker verifies frontends ([`Trust`]: a CA, or, for development
//!   only, nothing), the name it verifies, and its own certificate for mutual TLS.
//!
//! # Example
//!
//! ```no_run
//! # fn demo() -> Result<(), velo_tls::TlsError> {
//! use std::time::Duration;
//! use velo_tls::{ClientTls, ServerTls, Trust};
//!
//! let server = ServerTls::new("cert.pem".into(), "key.pem".into(), None, Duration::from_secs(3))?;
//! let client = ClientTls::new(Trust::Ca("ca.pem".into()), None, None, Duration::from_secs(3))?;
//! let _acceptor = server.acceptor();
//! let _connector = client.connector();
//! server.reload()?; // new certificate files, no restart
//! # Ok(()) }
//! ```

mod client;
mod error;
mod insecure;
mod pem;
mod server;
#[cfg(feature = "__test-pki")]
#[doc(hidden)]
pub mod testing;

use std::sync::Arc;

pub use client::{ClientIdentity, ClientTls, Trust};
pub use error::{PlaintextAnswer, TlsError};
pub use server::ServerTls;

/// Re-exported so transports name one version of it.
pub use tokio_rustls;

/// Default bound on one TLS handshake: 3 s, Dynamo's `DYN_TCP_TLS_HANDSHAKE_TIMEOUT_SECS`
/// default.
pub const DEFAULT_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The first byte of every TLS record that starts a handshake (content type 22): how a
/// plaintext listener recognises a peer that speaks TLS to it.
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The one crypto provider every configuration here uses.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
