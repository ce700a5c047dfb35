//! The frontend's TCP listener, as velo-session's accept loop takes lanes from it.

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::net::TcpListener;
use velo_session::{LaneListener, RawLane};

use crate::lane::tcp_lane;
use crate::socket;
use crate::tls::TlsLane;

/// Yields accepted TCP connections with their per-connection options set.
pub(crate) struct TcpLaneListener {
    pub(crate) listener: TcpListener,
    pub(crate) liveness: Option<Duration>,
    /// TLS on every accepted connection, when set (its handshake runs in the lane's task).
    pub(crate) tls: Option<Arc<velo_tls::ServerTls>>,
}

impl LaneListener for TcpLaneListener {
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Box<dyn RawLane>>>> {
        let (stream, peer) = match ready!(self.listener.poll_accept(cx)) {
            Ok(accepted) => accepted,
            Err(e) => return Poll::Ready(Some(Err(e))),
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "set_nodelay failed");
        }
        if let Err(e) = socket::set_liveness(socket2::SockRef::from(&stream), self.liveness) {
            tracing::debug!(%peer, error = %e, "setting the liveness bound failed");
        }
        let lane: Box<dyn RawLane> = match &self.tls {
            Some(tls) => Box::new(TlsLane::accepting(stream, tls.acceptor())),
            None => Box::new(tcp_lane(stream)),
        };
        Poll::Ready(Some(Ok(lane)))
    }
}
