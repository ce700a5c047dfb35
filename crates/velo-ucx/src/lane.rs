//! One lane as the session layer sees it: bytes in from the driver, chunks out to it.
//!
//! # Why the inbox is a mutex
//!
//! The driver (one task or thread) appends received bytes and the lane's reader task takes
//! them. A channel would cost an allocation and a wake per UCX message; the inbox is one
//! `Mutex<BytesMut>` the driver appends to once per progress pass and the reader empties
//! once per wake, so a lock does a pass's worth of work. Neither side holds it across an
//! `.await` or a UCX call.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use velo_session::{LaneIo, LaneRead, LaneWrite};

use crate::driver::{Command, LaneKey, WRITE_WINDOW_KIB};

/// How a lane's receive side ended.
#[derive(Debug, Clone)]
pub(crate) enum End {
    /// The peer ended the lane in order (its fin arrived after all its data).
    Fin,
    /// This side closed the lane.
    Closed,
    /// The endpoint failed, or the peer broke the message order.
    Failed(String),
}

/// Received bytes waiting for the lane's reader.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
}

#[derive(Debug, Default)]
struct InboxState {
    ready: BytesMut,
    end: Option<End>,
    waker: Option<Waker>,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends `bytes` (emptying it) and wakes the reader. Returns the bytes now unread.
    pub(crate) fn push(&self, bytes: &mut BytesMut) -> usize {
        if bytes.is_empty() {
            return self.lock().ready.len();
        }
        let (waker, unread) = {
            let mut st = self.lock();
            if st.ready.is_empty() {
                std::mem::swap(&mut st.ready, bytes);
            } else {
                st.ready.extend_from_slice(bytes);
                bytes.clear();
            }
            (st.waker.take(), st.ready.len())
        };
        if let Some(w) = waker {
            w.wake();
        }
        unread
    }

    /// Ends the lane's receive side (the first end wins) and wakes the reader.
    pub(crate) fn end(&self, end: End) {
        let waker = {
            let mut st = self.lock();
            st.end.get_or_insert(end);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Moves every ready byte into `buf`; at the end, 0 (an orderly end) or the failure.
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let mut st = self.lock();
        if !st.ready.is_empty() {
            let n = st.ready.len();
            if buf.is_empty() {
                std::mem::swap(buf, &mut st.ready);
            } else {
                buf.extend_from_slice(&st.ready);
                st.ready.clear();
            }
            return Poll::Ready(Ok(n));
        }
        match &st.end {
            Some(End::Fin | End::Closed) => Poll::Ready(Ok(0)),
            Some(End::Failed(why)) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                why.clone(),
            ))),
            None => {
                if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    st.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// A lane between the driver and its user (a handshake, then the session's pumps).
pub(crate) struct Lane {
    key: LaneKey,
    inbox: Arc<Inbox>,
    window: Arc<Semaphore>,
    cmd: mpsc::UnboundedSender<Command>,
    release: Arc<Release>,
}

/// Tells the driver when the last half of a lane is gone (closes its endpoint if still open).
struct Release {
    key: LaneKey,
    cmd: mpsc::UnboundedSender<Command>,
}

impl Drop for Release {
    fn drop(&mut self) {
        // The driver may have stopped already; then there is nothing to release.
        let _ = self.cmd.send(Command::Release { lane: self.key });
    }
}

impl Lane {
    pub(crate) fn new(
        key: LaneKey,
        inbox: Arc<Inbox>,
        window: Arc<Semaphore>,
        cmd: mpsc::UnboundedSender<Command>,
    ) -> Self {
        let release = Arc::new(Release {
            key,
            cmd: cmd.clone(),
        });
        Self {
            key,
            inbox,
            window,
            cmd,
            release,
        }
    }

    pub(crate) fn key(&self) -> LaneKey {
        self.key
    }

    /// Appends received bytes to `buf`; 0 at an orderly end. Cancel safe.
    pub(crate) async fn read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.inbox.poll_read(cx, buf)).await
    }

    /// Queues `chunks` for sending, in order, and clears it (see [`write`]).
    pub(crate) async fn write(&mut self, chunks: &mut Vec<Bytes>) -> io::Result<()> {
        write(&self.cmd, self.key, &self.window, chunks).await
    }

    /// Ends the lane in order (bounded by the close timeout).
    pub(crate) async fn close(&mut self) -> io::Result<()> {
        close(&self.cmd, self.key).await
    }

    /// The session's view: `leftover` holds bytes read past the handshake; `permit`
    /// (frontend) holds a lane slot for as long as the lane reads.
    pub(crate) fn into_io(
        self,
        leftover: BytesMut,
        permit: Option<OwnedSemaphorePermit>,
    ) -> LaneIo {
        LaneIo {
            read: Box::new(UcxRead {
                inbox: self.inbox,
                leftover,
                _release: self.release.clone(),
                _permit: permit,
            }),
            write: Box::new(UcxWrite {
                key: self.key,
                window: self.window,
                cmd: self.cmd,
                _release: self.release,
            }),
        }
    }
}

/// Queues `chunks` for the driver and clears it: done once the lane's write window has room
/// for them (they hold its permits until UCX is done with the buffers). A failure of the lane
/// shows here as a closed window, and first of all to the lane's reader.
async fn write(
    cmd: &mpsc::UnboundedSender<Command>,
    lane: LaneKey,
    window: &Arc<Semaphore>,
    chunks: &mut Vec<Bytes>,
) -> io::Result<()> {
    let bytes: usize = chunks.iter().map(Bytes::len).sum();
    let kib = u32::try_from(bytes.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .clamp(1, WRITE_WINDOW_KIB);
    // Cancel safe: a dropped acquire takes no permit and queues nothing.
    let permit = window
        .clone()
        .acquire_many_owned(kib)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::ConnectionAborted, "the lane was closed"))?;
    let chunks = std::mem::replace(chunks, Vec::with_capacity(chunks.capacity()));
    if cmd
        .send(Command::Write {
            lane,
            chunks,
            permit,
        })
        .is_err()
    {
        return Err(stopped());
    }
    Ok(())
}

async fn close(cmd: &mpsc::UnboundedSender<Command>, lane: LaneKey) -> io::Result<()> {
    let (done, rx) = oneshot::channel();
    if cmd.send(Command::Close { lane, done }).is_err() {
        return Ok(()); // the driver stopped: every endpoint is closed already
    }
    let _ = rx.await;
    Ok(())
}

fn stopped() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the UCX transport has stopped",
    )
}

struct UcxRead {
    inbox: Arc<Inbox>,
    leftover: BytesMut,
    _release: Arc<Release>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl LaneRead for UcxRead {
    fn read<'a>(
        &'a mut self,
        buf: &'a mut BytesMut,
    ) -> Pin<Box<dyn Future<Output = io::Result<usize>> + Send + 'a>> {
        Box::pin(async move {
            if !self.leftover.is_empty() {
                let n = self.leftover.len();
                buf.extend_from_slice(&self.leftover);
                self.leftover.clear();
                return Ok(n);
            }
            // Cancel safe: bytes leave the inbox only in the poll that returns them.
            std::future::poll_fn(|cx| self.inbox.poll_read(cx, buf)).await
        })
    }
}

struct UcxWrite {
    key: LaneKey,
    window: Arc<Semaphore>,
    cmd: mpsc::UnboundedSender<Command>,
    _release: Arc<Release>,
}

impl LaneWrite for UcxWrite {
    fn write<'a>(
        &'a mut self,
        chunks: &'a mut Vec<Bytes>,
    ) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>> {
        Box::pin(write(&self.cmd, self.key, &self.window, chunks))
    }

    fn close<'a>(&'a mut self) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>> {
        Box::pin(close(&self.cmd, self.key))
    }
}
