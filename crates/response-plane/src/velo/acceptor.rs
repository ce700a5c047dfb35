//! The registry as velo-session's `Acceptor`: each OPEN goes to its registration.

use std::sync::Arc;

use velo_session::{Acceptor, IncomingStream};
use velo_wire::CancelCode;

use crate::registry::{Arrival, Refusal, Registry};

/// Hands each OPEN to its registration, or refuses it so the worker stops generating.
pub(crate) struct RegistryAcceptor {
    pub(crate) registry: Arc<Registry>,
    pub(crate) refused: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) wrong_worker: Arc<std::sync::atomic::AtomicU64>,
}

impl Acceptor for RegistryAcceptor {
    fn accept(&self, incoming: IncomingStream) {
        let from = incoming.worker_instance();
        match self
            .registry
            .claim(incoming.ticket(), &incoming.token().0, from)
        {
            Ok(tx) => {
                // The registration takes it: the worker learns the stream arrived, so its
                // finish can count it delivered (the pending handle reports its end now).
                incoming.confirm();
                if let Err(Arrival::Velo(incoming)) = tx.send(Arrival::Velo(incoming)) {
                    // The pending handle went away while the stream was on its way: the
                    // cancellation still reaches the engine.
                    incoming.refuse(CancelCode::CANCELLED);
                    self.refused
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Err(refusal) => {
                if refusal == Refusal::WrongWorker {
                    tracing::debug!(
                        ticket = incoming.ticket(),
                        ?from,
                        "stream refused: tied to another worker"
                    );
                    self.wrong_worker
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                // Dropped, timed out, cancelled, or not ours: the worker is told to stop.
                incoming.refuse(CancelCode::REFUSED);
                self.refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}
