//! The frontend's accept loop and per-connection handshakes.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_session::FrontendEndpoint;
use velo_wire::{CloseCode, Frame};

use crate::handshake::{ReadError, read_frame, refuse, write_hello};
use crate::stats::Counters;
use crate::{TcpConfig, io};

pub(crate) struct Accept {
    pub(crate) listener: TcpListener,
    pub(crate) endpoint: FrontendEndpoint,
    pub(crate) cfg: TcpConfig,
    pub(crate) counters: Arc<Counters>,
    pub(crate) tracker: TaskTracker,
    pub(crate) stop: CancellationToken,
}

/// Accepts connections until `stop`; each handshake runs in its own task so a silent peer
/// cannot stall the others.
pub(crate) async fn accept_loop(a: Accept) {
    let slots = Arc::new(Semaphore::new(a.cfg.max_connections));
    loop {
        // Cancel safety: `accept` loses no connection when dropped.
        let accepted = tokio::select! {
            r = a.listener.accept() => r,
            () = a.stop.cancelled() => break,
        };
        let (mut stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                a.counters.accept_errors.inc();
                tracing::warn!(error = %e, "accept failed");
                // Out of file descriptors and similar: back off briefly instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        a.counters.connections_accepted.inc();
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            a.counters.connections_refused.inc();
            a.tracker.spawn(async move {
                refuse(
                    &mut stream,
                    CloseCode::LIMIT,
                    "frontend is at its connection limit",
                )
                .await;
            });
            continue;
        };
        let endpoint = a.endpoint.clone();
        let (cfg, counters, stop) = (a.cfg.clone(), a.counters.clone(), a.stop.clone());
        a.tracker.spawn(async move {
            tokio::select! {
                () = handshake(stream, peer, permit, endpoint, &cfg, &counters) => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

async fn handshake(
    mut stream: TcpStream,
    peer: SocketAddr,
    permit: tokio::sync::OwnedSemaphorePermit,
    endpoint: FrontendEndpoint,
    cfg: &TcpConfig,
    counters: &Counters,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "set_nodelay failed");
    }
    if let Err(e) = crate::socket::set_liveness(socket2::SockRef::from(&stream), cfg.liveness) {
        tracing::debug!(%peer, error = %e, "setting the liveness bound failed");
    }
    let mut buf = BytesMut::with_capacity(256);
    let frame = match tokio::time::timeout(cfg.handshake_timeout, read_frame(&mut stream, &mut buf))
        .await
    {
        Err(_) => {
            counters.handshake_timeouts.inc();
            tracing::debug!(%peer, "handshake timed out");
            refuse(
                &mut stream,
                CloseCode::BAD_HANDSHAKE,
                "no handshake within the timeout",
            )
            .await;
            return;
        }
        Ok(Err(ReadError::Wire(e))) => {
            counters.handshake_failures.inc();
            tracing::debug!(%peer, error = %e, "invalid handshake");
            refuse(&mut stream, e.close_code(), &e.to_string()).await;
            return;
        }
        Ok(Err(ReadError::Io(_) | ReadError::Eof)) => {
            counters.handshake_failures.inc();
            return;
        }
        Ok(Ok(frame)) => frame,
    };
    let Frame::Hello(hello) = frame else {
        counters.handshake_failures.inc();
        refuse(
            &mut stream,
            CloseCode::BAD_HANDSHAKE,
            "expected HELLO as the first frame",
        )
        .await;
        return;
    };
    let answer = match endpoint.answer(&hello) {
        Ok(a) => a,
        Err(e) => {
            counters.handshake_failures.inc();
            tracing::debug!(%peer, error = %e, "handshake refused");
            refuse(&mut stream, e.close_code(), &e.to_string()).await;
            return;
        }
    };
    if endpoint.is_closing() {
        refuse(
            &mut stream,
            CloseCode::SHUTTING_DOWN,
            "frontend is shutting down",
        )
        .await;
        return;
    }
    if let Err(e) = write_hello(&mut stream, answer).await {
        tracing::debug!(%peer, error = %e, "writing the handshake failed");
        counters.handshake_failures.inc();
        return;
    }
    // Nothing is sent on a lane before its handshake completes, so there is no race between
    // the answer above and the lane's tasks starting below.
    let io = io::lane_io(stream, buf, Some(permit));
    if let Err(e) = endpoint.attach_lane(&hello, io) {
        // Only a race with another lane or with shutdown gets here (`answer` checked the
        // rest); dropping the lane closes the connection and the worker sees it end.
        counters.handshake_failures.inc();
        tracing::debug!(%peer, error = %e, "lane not attached");
    } else {
        counters.lanes_accepted.inc();
    }
}
