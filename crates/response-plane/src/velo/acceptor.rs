//! The registry as velo-session's `Acceptor`: each OPEN goes to its registration.

use std::sync::Arc;

use velo_session::{Acceptor, IncomingStream};
use velo_wire::CancelCode;

use crate::registry::{Arrival, Refusal, Registry};
use crate::stats::PlaneCounters;

/// Hands each OPEN to its registration, or refuses it so the worker stops generating.
pub(crate) struct RegistryAcceptor {
    pub(crate) registry: Arc<Registry>,
    pub(crate) counters: Arc<PlaneCounters>,
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
                    self.counters.arrivals_refused.inc();
                }
            }
            Err(refusal) => {
                if refusal == Refusal::WrongWorker {
                    tracing::debug!(
                        ticket = incoming.ticket(),
                        ?from,
                        "stream refused: tied to another worker"
                    );
                    self.counters.arrivals_wrong_worker.inc();
                }
                // Dropped, timed out, cancelled, or not ours: the worker is told to stop.
                incoming.refuse(CancelCode::REFUSED);
                self.counters.arrivals_refused.inc();
            }
        }
    }
}
