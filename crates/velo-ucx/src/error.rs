//! Why the UCX transport could not start.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

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
    /// The transports `UCX_TLS` names in the environment cannot carry a lane (a
    /// configured list is checked when the configuration is built).
    #[error(
        "UCX initialisation failed: UCX_TLS={tls} names no network transport: velo-ucx needs \
         tcp or an RDMA transport (its listener and peer-failure handling do not work over \
         shared memory)"
    )]
    Transports {
        /// The environment's `UCX_TLS`.
        tls: String,
    },
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
    Thread(#[source] ThreadFailure),
}

/// Why the dedicated progress thread (`ProgressEngine::Thread`) could not be started.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadFailure {
    /// The OS would not spawn it.
    #[error("cannot spawn it: {0}")]
    Spawn(#[source] Arc<std::io::Error>),
    /// Its runtime could not be built.
    #[error("cannot build its runtime: {0}")]
    Runtime(#[source] Arc<std::io::Error>),
    /// It did not report ready in time.
    #[error("it did not report ready within {0:?}")]
    Timeout(Duration),
    /// It ended before reporting ready.
    #[error("it ended before reporting ready")]
    Ended,
}

/// Failures compare by kind (an I/O error by its `ErrorKind`).
impl PartialEq for ThreadFailure {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Spawn(a), Self::Spawn(b)) | (Self::Runtime(a), Self::Runtime(b)) => {
                a.kind() == b.kind()
            }
            (Self::Timeout(a), Self::Timeout(b)) => a == b,
            (Self::Ended, Self::Ended) => true,
            _ => false,
        }
    }
}

impl Eq for ThreadFailure {}
