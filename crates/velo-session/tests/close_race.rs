//! A worker endpoint closed while a connection is being prepared never keeps that
//! connection: when the handshake completes just as `close()` runs, the preparation either
//! stops or, if it already got its lanes, closes them at once; nothing is cached and the
//! request fails `ShuttingDown`.
//!
//! The race is made exact: the worker's only lane calls `close()` from inside the read that
//! delivers the frontend's HELLO, so the handshake completes in the very poll that sees the
//! endpoint closed. Which of the two the preparation notices first is up to `select!`, so
//! the story runs several times.

mod common;

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use common::{MemNet, addr, frontend, frontend_config, within, worker_config};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio_util::task::TaskTracker;
use velo_session::{
    ConnectError, Dialer, LaneIo, LaneRead, LaneWrite, OpenStreamError, RawLane, WorkerEndpoint,
    WorkerSettings,
};
use velo_wire::Token;

/// A lane that closes `worker` when its first bytes arrive (the frontend's HELLO).
struct ClosingLane {
    inner: Box<dyn RawLane>,
    worker: Arc<OnceLock<WorkerEndpoint>>,
    closed: bool,
}

impl LaneRead for ClosingLane {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let r = self.inner.poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) && !self.closed {
            self.closed = true;
            self.worker.get().expect("the worker exists").close();
        }
        r
    }
}

impl LaneWrite for ClosingLane {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        self.inner.poll_write(cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_close(cx)
    }
}

impl RawLane for ClosingLane {
    fn into_io(self: Box<Self>) -> LaneIo {
        self.inner.into_io()
    }
}

/// Dials through `net`, wrapping each lane in a [`ClosingLane`].
struct ClosingDialer {
    net: Arc<MemNet>,
    worker: Arc<OnceLock<WorkerEndpoint>>,
}

impl Dialer for ClosingDialer {
    fn dial(&self, at: SocketAddr) -> BoxFuture<'static, io::Result<Box<dyn RawLane>>> {
        let (dial, worker) = (self.net.dial(at), self.worker.clone());
        async move {
            let inner = dial.await?;
            let lane: Box<dyn RawLane> = Box::new(ClosingLane {
                inner,
                worker,
                closed: false,
            });
            Ok(lane)
        }
        .boxed()
    }
}

#[tokio::test(start_paused = true)]
async fn a_connection_prepared_as_the_worker_closes_is_closed_not_kept() {
    for round in 0..16 {
        let tracker = TaskTracker::new();
        let (frontend, _inbox) = frontend(&tracker, frontend_config(|b| b.lanes(1)));
        let net = MemNet::new();
        net.serve(&frontend);
        let slot = Arc::new(OnceLock::new());
        let dialer = ClosingDialer {
            net: net.clone(),
            worker: slot.clone(),
        };
        let settings = WorkerSettings::new(worker_config(|b| b.lanes(1)));
        let worker = WorkerEndpoint::new(settings, Arc::new(dialer), tracker.clone());
        assert!(slot.set(worker.clone()).is_ok());
        let opened = within(
            "the open",
            worker.open(addr(), frontend.instance(), 1, &Token([7; 16]), b"{}"),
        )
        .await;
        assert!(
            matches!(
                opened,
                Err(OpenStreamError::Connect(ConnectError::ShuttingDown))
            ),
            "round {round}: {:?}",
            opened.map(|_| "a stream")
        );
        assert!(
            worker.peers().is_empty(),
            "round {round}: a connection was kept"
        );
        common::eventually("the frontend's connection ending", || {
            frontend.peers().iter().all(|p| !p.is_alive())
        })
        .await;
        frontend.abort();
        tracker.close();
        within("every task ending", tracker.wait()).await;
    }
}
