//! Why the UCX transport could not start.

use std::net::SocketAddr;

/// Why a UCX frontend or worker could not start. Every variant is a local problem (the UCX
/// installation, its configuration, or the address); peers cause none of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UcxError {
    /// A UCX call failed while setting up the context or worker.
    #[error("UCX initialisation failed: {step}: {status}")]
    Init {
        /// The UCX call.
        step: &'static str,
        /// UCX's status text.
        status: String,
    },
    /// The configured transports cannot carry a lane.
    #[error("UCX initialisation failed: {0}")]
    Transports(String),
    /// The UCX headers the bindings were generated from do not match the library loaded.
    #[error(
        "UCX initialisation failed: bindings generated from UCX {headers} headers but the \
         loaded library is UCX {library} (did ucx1-sys build its bundled UCX?)"
    )]
    Version {
        /// The headers' API version.
        headers: String,
        /// The library's version.
        library: String,
    },
    /// The listener could not be created on this address.
    #[error("cannot listen on {addr} with UCX: {status}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// UCX's status text.
        status: String,
    },
    /// The dedicated progress thread could not be started.
    #[error("UCX initialisation failed: cannot start the progress thread: {0}")]
    Thread(String),
}
