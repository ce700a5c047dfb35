//! The request plane's errors: a local secret that cannot be had, and a handshake that
//! failed, each saying whose fault it is.

use std::path::PathBuf;
use std::time::Duration;

use velo_session::{MAX_SECRET_LEN, MIN_SECRET_LEN};

use super::Side;

/// Which variables turn the request plane's TLS on, for the mismatch errors.
const TLS_VARS: &str = "a frontend serves TLS when DYN_TCP_TLS_CERT_PATH is set, a worker \
                        speaks it when DYN_TCP_TLS_CA_CERT_PATH or DYN_TCP_TLS_INSECURE is set";

/// Why the request plane's secret (or TLS) could not be had (a local configuration error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The secret's file cannot be read.
    #[error("cannot read the cluster secret {} (DYN_VELO_CLUSTER_SECRET_PATH): {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The secret is shorter or longer than allowed.
    #[error(
        "the cluster secret{} is {len} bytes: it must be {MIN_SECRET_LEN}..={MAX_SECRET_LEN}",
        path.as_ref().map(|p| format!(" {} (DYN_VELO_CLUSTER_SECRET_PATH)", p.display())).unwrap_or_default()
    )]
    Length {
        /// The file, if the secret came from one.
        path: Option<PathBuf>,
        /// The secret's length in bytes.
        len: usize,
    },
    /// A TLS file of the response plane's configuration (`DYN_TCP_TLS_*`) cannot be loaded
    /// for the request plane (it changed since the configuration was checked).
    #[error("cannot load the request plane's TLS (DYN_TCP_TLS_*): {0}")]
    Tls(#[from] velo_tls::TlsError),
}

/// Why a request-plane handshake failed. Each variant says whose fault it is: the peer's
/// (it is not a velo-serve peer, or does not know the secret), the configuration's (a secret
/// on one side only, or two different secrets), or the network's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer's first bytes are no greeting: it is not velo-serve, or one from before the
    /// handshake (which writes request frames at once).
    #[error(
        "the {peer} did not greet: its first bytes are not a velo-serve request-plane greeting \
         (not velo-serve, or one too old to authenticate its request plane)"
    )]
    NotAGreeting {
        /// The side the peer should be.
        peer: Side,
    },
    /// The peer greets in a role it should not have (a byte it sent back to us, or two
    /// frontends).
    #[error("expected a {peer}'s greeting, got a {got}'s")]
    WrongRole {
        /// The side the peer should be.
        peer: Side,
        /// The side it said it is.
        got: Side,
    },
    /// A greeting or verdict byte with a value the protocol does not define (peer's fault).
    #[error("the {peer} sent {value} as its {what}, which is not a valid value")]
    Malformed {
        /// The side the peer should be.
        peer: Side,
        /// The field.
        what: &'static str,
        /// The byte received.
        value: u8,
    },
    /// This side has a secret and the peer has none (configuration).
    #[error(
        "the {peer} has no cluster secret, but this {local} requires one \
         (DYN_VELO_CLUSTER_SECRET_PATH is set here and not there)",
        local = peer.other()
    )]
    PeerHasNoSecret {
        /// The peer's side.
        peer: Side,
    },
    /// The peer has a secret and this side has none (configuration).
    #[error(
        "the {peer} requires a cluster secret, but this {local} has none \
         (DYN_VELO_CLUSTER_SECRET_PATH is set there and not here)",
        local = peer.other()
    )]
    NoLocalSecret {
        /// The peer's side.
        peer: Side,
    },
    /// The peer's proof does not verify under this side's secret: the two hold different
    /// secrets, or the peer does not know it.
    #[error(
        "the {peer}'s proof does not match this {local}'s cluster secret: the two hold \
         different secrets (or the {peer} does not know it)",
        local = peer.other()
    )]
    BadProof {
        /// The peer's side.
        peer: Side,
    },
    /// The worker did not accept this frontend's proof: the two hold different secrets.
    #[error(
        "the worker refused this frontend's proof: the two hold different cluster secrets \
         (DYN_VELO_CLUSTER_SECRET_PATH)"
    )]
    Refused,
    /// This side speaks TLS on the request plane and the peer does not (configuration).
    #[error(
        "the {peer} has no TLS on the request plane, but this {local} requires it ({TLS_VARS})",
        local = peer.other()
    )]
    PeerLacksTls {
        /// The peer's side.
        peer: Side,
    },
    /// The peer speaks TLS on the request plane and this side does not (configuration).
    #[error(
        "the {peer} requires TLS on the request plane, but this {local} has none ({TLS_VARS})",
        local = peer.other()
    )]
    NoLocalTls {
        /// The peer's side.
        peer: Side,
    },
    /// A worker read a plaintext greeting, from a peer saying it is a frontend that requires
    /// TLS, and has no TLS itself. Unauthenticated: the peer's claim, which only a
    /// configuration mismatch (or a stranger) makes.
    #[error(
        "the peer says it is a frontend requiring TLS on the request plane; this worker has \
         none ({TLS_VARS})"
    )]
    ClaimsTlsRequired,
    /// The frontend meant another worker instance than the one it reached: a stale or forged
    /// discovery entry, or someone relaying between the frontend and another worker.
    #[error(
        "the frontend means worker instance {meant:x}, but reached instance {actual:x} (a stale \
         or forged discovery entry, or a relay): refused by this {local}",
        local = peer.other()
    )]
    WrongInstance {
        /// The peer's side.
        peer: Side,
        /// The instance the frontend named.
        meant: u64,
        /// The instance the worker is.
        actual: u64,
    },
    /// The TLS handshake failed: the peer's certificate is not trusted here, or this side's
    /// is not trusted there, or a required client certificate is missing.
    #[error("the TLS handshake with the {peer} failed: {source}")]
    Tls {
        /// The peer's side.
        peer: Side,
        /// What TLS said.
        #[source]
        source: std::io::Error,
    },
    /// The peer closed the connection before the handshake was done.
    #[error("the {peer} closed the connection while this side waited for its {awaiting}")]
    Closed {
        /// The peer's side.
        peer: Side,
        /// What this side was waiting for.
        awaiting: &'static str,
    },
    /// The handshake did not finish within [`HANDSHAKE_TIMEOUT`](super::HANDSHAKE_TIMEOUT).
    #[error("the {peer} did not complete the request-plane handshake within {bound:?}")]
    Timeout {
        /// The peer's side.
        peer: Side,
        /// The bound.
        bound: Duration,
    },
    /// The connection failed (network).
    #[error("I/O error during the request-plane handshake with the {peer}: {source}")]
    Io {
        /// The peer's side.
        peer: Side,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}
