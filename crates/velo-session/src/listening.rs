//! A frontend serving the lanes of one [`LaneListener`]: its endpoint, its accept loop, the
//! address workers reach, and whatever the transport runs beside them, stopped in order.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::task::TaskTracker;
use velo_mux::MuxConfig;
use velo_wire::InstanceId;

use crate::{Accepting, Acceptor, FrontendEndpoint, HandshakeStats, LaneListener, SessionSettings};

/// What every transport's frontend is made of besides its transport: who it is, how its
/// connections run, where their streams go and where their tasks run.
pub struct FrontendParts {
    /// Its instance id (part of every stream address it hands out); a restarted frontend
    /// takes a new one ([`new_instance_id`](crate::new_instance_id)).
    pub instance: InstanceId,
    /// The mux configuration (frontend side).
    pub mux: MuxConfig,
    /// Where incoming streams go.
    pub acceptor: Arc<dyn Acceptor>,
    /// Where its accept loop and lane tasks run.
    pub tracker: TaskTracker,
}

impl FrontendParts {
    /// A frontend under a fresh instance id.
    pub fn new(mux: MuxConfig, acceptor: Arc<dyn Acceptor>, tracker: TaskTracker) -> Self {
        Self {
            instance: crate::new_instance_id(),
            mux,
            acceptor,
            tracker,
        }
    }
}

/// What a transport runs beside a frontend's listener and lanes (velo-ucx: the progress
/// driver that owns the UCX worker), told as the frontend stops. A transport with nothing to
/// tell (velo-tcp: the kernel runs its sockets) uses `()`.
pub trait TransportControl: Send + Sync + 'static {
    /// The accept loop has ended: stop taking connections, resolving once stopped. The lanes
    /// are told to close after it.
    fn stop_listening(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// Every lane was told to close: wind down once the last one has.
    fn close(&self) {}

    /// Stop now: every lane's tasks were told to end at once.
    fn abort(&self) {}
}

/// Nothing runs beside the listener.
impl TransportControl for () {}

/// A frontend listening for worker lanes: the [`FrontendEndpoint`] its lanes join, the accept
/// loop feeding it from a transport's [`LaneListener`], where workers connect, and the
/// transport's [`TransportControl`] (`C`).
///
/// Every transport's frontend is one of these; the transport only builds the listener.
pub struct ListeningFrontend<C = ()> {
    endpoint: FrontendEndpoint,
    accepting: Accepting,
    local_addr: SocketAddr,
    transport: C,
}

impl<C: TransportControl> ListeningFrontend<C> {
    /// A frontend endpoint made of `parts` with `session`'s settings, accepting lanes from
    /// `listener` (which listens at `local_addr`) on `parts.tracker`; `transport` runs beside.
    pub fn new(
        parts: FrontendParts,
        session: &SessionSettings,
        listener: impl LaneListener,
        local_addr: SocketAddr,
        transport: C,
    ) -> Self {
        let FrontendParts {
            instance,
            mux,
            acceptor,
            tracker,
        } = parts;
        let endpoint = FrontendEndpoint::new(session.frontend(mux), instance, acceptor, tracker);
        let accepting = endpoint.accept(listener, session.accept());
        tracing::debug!(%local_addr, instance = %endpoint.instance(), "frontend listening");
        Self {
            endpoint,
            accepting,
            local_addr,
            transport,
        }
    }

    /// Where workers connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This frontend's instance id.
    pub fn instance(&self) -> InstanceId {
        self.endpoint.instance()
    }

    /// The endpoint (connections, stats, go-away).
    pub fn endpoint(&self) -> &FrontendEndpoint {
        &self.endpoint
    }

    /// The handshake counters of every connection accepted.
    pub fn handshake_stats(&self) -> HandshakeStats {
        self.accepting.stats()
    }

    /// What the transport runs beside the listener (velo-ucx: its driver's counters).
    pub fn transport(&self) -> &C {
        &self.transport
    }

    /// Stops accepting (handshakes in progress are dropped) and waits for the accept loop to
    /// exit and the transport to stop listening, then closes every lane gracefully (a CLOSE
    /// frame each). Lane tasks and whatever the transport runs end on their own; wait for
    /// them on the tracker, or see [`abort`](Self::abort) for a hard stop.
    pub async fn shutdown(&self) {
        self.accepting.shutdown().await;
        self.transport.stop_listening().await;
        self.endpoint.close();
        self.transport.close();
    }

    /// Stops everything at once: no more accepts, every lane's tasks end now, and so does
    /// whatever the transport runs.
    pub fn abort(&self) {
        self.accepting.stop();
        self.endpoint.abort();
        self.transport.abort();
    }
}

/// Every transport's frontend, as the transport contract drives it.
#[cfg(feature = "__contract")]
impl<C: TransportControl> crate::contract::Frontend for ListeningFrontend<C> {
    fn endpoint(&self) -> &FrontendEndpoint {
        Self::endpoint(self)
    }

    fn addr(&self) -> SocketAddr {
        self.local_addr()
    }

    fn handshake_stats(&self) -> HandshakeStats {
        Self::handshake_stats(self)
    }

    async fn shutdown(&self) {
        Self::shutdown(self).await;
    }

    fn abort(&self) {
        Self::abort(self);
    }
}
