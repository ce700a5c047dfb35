//! Classic plane, worker side: a connection per stream, one write per item.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

use super::frame::{self, DATA, HANDSHAKE, KILL, PROLOGUE, SENTINEL, STOP};
use crate::ResponseError;
use crate::info::{StreamAddress, hex_token};

/// Time to connect to the frontend.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

const RUNNING: u8 = 0;
const STOPPED: u8 = 1;
const KILLED: u8 = 2;

/// What the frontend asked of one classic stream, fed by a reader task.
#[derive(Debug, Default)]
pub(crate) struct ClassicControl {
    state: AtomicU8,
    changed: Notify,
    finished: AtomicBool,
}

impl ClassicControl {
    pub(crate) fn is_stopped(&self) -> bool {
        self.state.load(Ordering::Acquire) >= STOPPED
    }

    pub(crate) fn is_killed(&self) -> bool {
        self.state.load(Ordering::Acquire) == KILLED
    }

    /// Waits until the state is at least `at_least`.
    pub(crate) async fn wait(&self, at_least: u8) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change in between is not missed.
            notified.as_mut().enable();
            if self.state.load(Ordering::Acquire) >= at_least {
                return;
            }
            notified.await;
        }
    }

    pub(crate) async fn stopped(&self) {
        self.wait(STOPPED).await;
    }

    pub(crate) async fn killed(&self) {
        self.wait(KILLED).await;
    }

    fn raise(&self, to: u8, cancellations: &AtomicU64) {
        let before = self.state.fetch_max(to, Ordering::AcqRel);
        if before < to {
            if before == RUNNING && !self.finished.load(Ordering::Acquire) {
                cancellations.fetch_add(1, Ordering::Relaxed);
            }
            self.changed.notify_waiters();
        }
    }
}

/// One classic stream's sending side.
pub(crate) struct ClassicWriter {
    write: OwnedWriteHalf,
    control: Arc<ClassicControl>,
    out: Vec<u8>,
    max: u32,
}

impl ClassicWriter {
    /// Dials the frontend for one stream and names the stream.
    pub(crate) async fn connect(
        addr: &StreamAddress,
        max: u32,
        tracker: &TaskTracker,
        cancellations: Arc<AtomicU64>,
    ) -> Result<Self, ResponseError> {
        let unreachable = |e: std::io::Error| ResponseError::Unreachable {
            reason: format!("{}: {e}", addr.addr),
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr.addr))
            .await
            .map_err(|_| ResponseError::Unreachable {
                reason: format!("{}: connect timed out", addr.addr),
            })?
            .map_err(unreachable)?;
        stream.set_nodelay(true).map_err(unreachable)?;
        let (read, write) = stream.into_split();
        let control = Arc::new(ClassicControl::default());
        tracker.spawn(watch_control(read, control.clone(), cancellations));
        let mut w = Self {
            write,
            control,
            out: Vec::with_capacity(256),
            max,
        };
        let handshake =
            serde_json::json!({ "stream": addr.ticket, "token": hex_token(&addr.token()?) });
        w.send_message(HANDSHAKE, handshake.to_string().as_bytes())
            .await?;
        Ok(w)
    }

    pub(crate) fn control(&self) -> Arc<ClassicControl> {
        self.control.clone()
    }

    pub(crate) async fn prologue(&mut self, json: &[u8]) -> Result<(), ResponseError> {
        self.send_message(PROLOGUE, json).await
    }

    /// One item, one write.
    pub(crate) async fn item(&mut self, item: &[u8]) -> Result<(), ResponseError> {
        if self.control.is_killed() {
            return Err(ResponseError::Cancelled { graceful: false });
        }
        self.send_message(DATA, item).await
    }

    /// The sentinel, then the end of the connection.
    pub(crate) async fn finish(&mut self) -> Result<(), ResponseError> {
        self.control.finished.store(true, Ordering::Release);
        self.send_message(SENTINEL, &[]).await?;
        self.write
            .shutdown()
            .await
            .map_err(ResponseError::ended_early)
    }

    async fn send_message(&mut self, kind: u8, payload: &[u8]) -> Result<(), ResponseError> {
        let max = self.max;
        if payload.len() > max as usize {
            return Err(ResponseError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        self.out.clear();
        self.out
            .extend_from_slice(&frame::header(kind, payload.len()));
        self.out.extend_from_slice(payload);
        match self.write.write_all(&self.out).await {
            Ok(()) => Ok(()),
            Err(_) if self.control.is_killed() => Err(ResponseError::Cancelled { graceful: false }),
            Err(e) => Err(ResponseError::ended_early(e)),
        }
    }
}

/// Reads the frontend's control messages (stop, kill) until the connection ends; the end
/// of the connection counts as a kill (the frontend dropped the stream).
async fn watch_control(
    mut read: OwnedReadHalf,
    control: Arc<ClassicControl>,
    cancellations: Arc<AtomicU64>,
) {
    let mut buf = BytesMut::with_capacity(64);
    loop {
        match frame::decode(&mut buf, 0) {
            Ok(Some((STOP, _))) => {
                control.raise(STOPPED, &cancellations);
                continue;
            }
            Ok(Some((KILL, _))) | Err(_) => break,
            Ok(Some(_)) => break,
            Ok(None) => {}
        }
        match read.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    control.raise(KILLED, &cancellations);
}
