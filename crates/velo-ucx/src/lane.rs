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
use std::task::{Context, Poll, Waker, ready};

use bytes::{Bytes, BytesMut};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::PollSemaphore;
use velo_session::{LaneIo, LaneRead, LaneWrite, RawLane};

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

/// Bytes a read takes at least when the caller's buffer has no room left.
const MIN_READ: usize = 4096;

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

    /// Moves ready bytes into `buf`, at most its spare capacity (at least [`MIN_READ`]); at the
    /// end, 0 (an orderly end) or the failure.
    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let mut st = self.lock();
        if !st.ready.is_empty() {
            // At most the room left in `buf`, as a socket read: the reader can then pause
            // between reads (`Mux::wants_input`) with the rest still here, holding the peer
            // back, instead of taking megabytes of OPENs in one go.
            let room = (buf.capacity() - buf.len()).max(MIN_READ);
            let n = st.ready.len().min(room);
            if buf.is_empty() && n == st.ready.len() {
                std::mem::swap(buf, &mut st.ready);
            } else {
                buf.extend_from_slice(&st.ready.split_to(n));
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
    writer: Writer,
    release: Arc<Release>,
}

/// The sending side of a lane: write-window permits (held until UCX is done with the
/// buffers), the driver's command queue, and a close in progress.
struct Writer {
    key: LaneKey,
    window: PollSemaphore,
    cmd: mpsc::UnboundedSender<Command>,
    closing: Option<oneshot::Receiver<()>>,
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
            writer: Writer {
                key,
                window: PollSemaphore::new(window),
                cmd,
                closing: None,
            },
            release,
        }
    }

    pub(crate) fn key(&self) -> LaneKey {
        self.key
    }
}

impl LaneRead for Lane {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        self.inbox.poll_read(cx, buf)
    }
}

impl LaneWrite for Lane {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        self.writer.poll_write(cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.writer.poll_close(cx)
    }
}

impl RawLane for Lane {
    fn into_io(self: Box<Self>) -> LaneIo {
        let this = *self;
        LaneIo {
            read: Box::new(UcxRead {
                inbox: this.inbox,
                _release: this.release.clone(),
            }),
            write: Box::new(UcxWrite {
                writer: this.writer,
                _release: this.release,
            }),
        }
    }
}

impl Writer {
    /// Queues `chunks` for the driver and empties it, once the lane's write window has room
    /// for them (they hold its permits until UCX is done with the buffers). A failure of the
    /// lane shows here as a closed window, and first of all to the lane's reader.
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        if chunks.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let bytes: usize = chunks.iter().map(Bytes::len).sum();
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .clamp(1, WRITE_WINDOW_KIB);
        let Some(permit) = ready!(self.window.poll_acquire_many(cx, kib)) else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the lane was closed",
            )));
        };
        let chunks = std::mem::replace(chunks, Vec::with_capacity(chunks.capacity()));
        let write = Command::Write {
            lane: self.key,
            chunks,
            permit,
        };
        if self.cmd.send(write).is_err() {
            return Poll::Ready(Err(stopped()));
        }
        Poll::Ready(Ok(()))
    }

    /// Ends the lane in order (bounded by the driver's close timeout).
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.closing.is_none() {
            let (done, rx) = oneshot::channel();
            if self
                .cmd
                .send(Command::Close {
                    lane: self.key,
                    done,
                })
                .is_err()
            {
                return Poll::Ready(Ok(())); // the driver stopped: every endpoint is closed
            }
            self.closing = Some(rx);
        }
        let Some(rx) = self.closing.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        // A dropped reply means the driver stopped, which closed the endpoint too.
        let _ = ready!(Pin::new(rx).poll(cx));
        Poll::Ready(Ok(()))
    }
}

fn stopped() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the UCX transport has stopped",
    )
}

struct UcxRead {
    inbox: Arc<Inbox>,
    _release: Arc<Release>,
}

impl LaneRead for UcxRead {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        // Bytes leave the inbox only in the poll that returns them.
        self.inbox.poll_read(cx, buf)
    }
}

struct UcxWrite {
    writer: Writer,
    _release: Arc<Release>,
}

impl LaneWrite for UcxWrite {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        self.writer.poll_write(cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.writer.poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_takes_at_most_the_room_left_in_the_readers_buffer() {
        let inbox = Inbox::default();
        inbox.push(&mut BytesMut::from(&[7u8; 100_000][..]));
        let mut cx = Context::from_waker(Waker::noop());
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let Poll::Ready(Ok(n)) = inbox.poll_read(&mut cx, &mut buf) else {
            panic!("bytes are ready");
        };
        assert!(n <= 16 * 1024, "took {n} bytes into a 16 KiB buffer");
        assert_eq!(buf.len(), n);
        // The rest stays for the next reads, in order.
        let mut total = n;
        while let Poll::Ready(Ok(m)) =
            inbox.poll_read(&mut cx, &mut BytesMut::with_capacity(16 * 1024))
        {
            if m == 0 {
                break;
            }
            total += m;
        }
        assert_eq!(total, 100_000);
    }
}
