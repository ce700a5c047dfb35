//! The frontend's accept loop and per-lane handshakes.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_session::FrontendEndpoint;
use velo_wire::{CloseCode, Frame};

use crate::UcxConfig;
use crate::handshake::{ReadError, read_frame, refuse, write_hello};
use crate::lane::Lane;
use crate::stats::Counters;

pub(crate) struct Accept {
    pub(crate) lanes: mpsc::Receiver<Lane>,
    pub(crate) endpoint: FrontendEndpoint,
    pub(crate) cfg: UcxConfig,
    pub(crate) counters: Arc<Counters>,
    pub(crate) tracker: TaskTracker,
    pub(crate) stop: CancellationToken,
}

/// Takes the lanes the driver accepted until `stop`; each handshake runs in its own task so a
/// silent peer cannot stall the others.
pub(crate) async fn accept_loop(mut a: Accept) {
    let slots = Arc::new(Semaphore::new(a.cfg.max_connections));
    loop {
        // Cancel safety: `recv` loses no lane when dropped.
        let mut lane = tokio::select! {
            l = a.lanes.recv() => match l {
                Some(l) => l,
                None => break,
            },
            () = a.stop.cancelled() => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            a.counters.connections_refused.inc();
            a.tracker.spawn(async move {
                refuse(
                    &mut lane,
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
                () = handshake(lane, permit, endpoint, &cfg, &counters) => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

async fn handshake(
    mut lane: Lane,
    permit: tokio::sync::OwnedSemaphorePermit,
    endpoint: FrontendEndpoint,
    cfg: &UcxConfig,
    counters: &Counters,
) {
    let mut buf = BytesMut::with_capacity(256);
    let frame =
        match tokio::time::timeout(cfg.handshake_timeout, read_frame(&mut lane, &mut buf)).await {
            Err(_) => {
                counters.handshake_timeouts.inc();
                tracing::debug!("ucx handshake timed out");
                refuse(
                    &mut lane,
                    CloseCode::BAD_HANDSHAKE,
                    "no handshake within the timeout",
                )
                .await;
                return;
            }
            Ok(Err(ReadError::Wire(e))) => {
                counters.handshake_failures.inc();
                tracing::debug!(error = %e, "invalid ucx handshake");
                refuse(&mut lane, e.close_code(), &e.to_string()).await;
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
            &mut lane,
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
            tracing::debug!(error = %e, "ucx handshake refused");
            refuse(&mut lane, e.close_code(), &e.to_string()).await;
            return;
        }
    };
    if endpoint.is_closing() {
        refuse(
            &mut lane,
            CloseCode::SHUTTING_DOWN,
            "frontend is shutting down",
        )
        .await;
        return;
    }
    if let Err(e) = write_hello(&mut lane, answer).await {
        tracing::debug!(error = %e, "writing the ucx handshake failed");
        counters.handshake_failures.inc();
        return;
    }
    // Nothing is sent on a lane before its handshake completes, so there is no race between
    // the answer above and the lane's tasks starting below.
    if let Err(e) = endpoint.attach_lane(&hello, lane.into_io(buf, Some(permit))) {
        // Only a race with another lane or with shutdown gets here (`answer` checked the
        // rest); dropping the lane closes its endpoint and the worker sees it end.
        counters.handshake_failures.inc();
        tracing::debug!(error = %e, "ucx lane not attached");
    } else {
        counters.lanes_accepted.inc();
    }
}
