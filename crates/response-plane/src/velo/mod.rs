//! The velo plane: the registry as velo-session's `Acceptor`, and the one place that knows
//! which transports are compiled in. Above this module a velo frontend or worker is a
//! velo-session endpoint plus a handle on its transport's resources, whatever the transport.

mod acceptor;
mod transport;

pub(crate) use acceptor::RegistryAcceptor;
#[cfg(feature = "ucx")]
pub(crate) use transport::ucx_builder;
pub(crate) use transport::{FrontendTransport, WorkerTransport, bind_frontend, start_worker};
