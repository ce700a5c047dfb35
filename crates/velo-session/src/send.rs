//! The worker's handle on one response stream.

use std::future::poll_fn;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use velo_mux::{Blocked, SendError, StreamEnd, StreamKey};

use crate::StreamError;
use crate::peer::{Peer, WakeOn};

/// A response stream opened by a worker: items go out in order, under the frontend's credit.
///
/// Dropping it without [`finish`](Self::finish) or [`reset`](Self::reset) ends the stream
/// abnormally for the frontend (an ERROR record with [`velo_mux::RESET_DROPPED`]).
#[derive(Debug)]
pub struct SendStream {
    peer: Peer,
    key: StreamKey,
    released: bool,
    /// Shared with this stream's watches: set once, when the stream is released.
    after_release: Arc<AfterRelease>,
}

/// What a stream's watches know once its sender has let it go (the mux forgets the stream
/// then): the end the frontend or a lane caused, or `None` if this side ended it.
type AfterRelease = OnceLock<Option<StreamEnd>>;

impl SendStream {
    pub(crate) fn new(peer: Peer, key: StreamKey) -> Self {
        Self {
            peer,
            key,
            released: false,
            after_release: Arc::new(OnceLock::new()),
        }
    }

    /// Sends one item, waiting while the stream has no credit or the lane's buffer is full.
    ///
    /// # Errors
    ///
    /// [`StreamError::Closed`] once the stream has ended (cancelled by the frontend, lane
    /// lost); [`StreamError::TooLarge`] for an item above the frame limit.
    pub async fn send(&mut self, item: &[u8]) -> Result<(), StreamError> {
        poll_fn(|cx| self.poll_send(cx, item)).await
    }

    /// Sends one item given as [`Bytes`]; large items are written without a copy.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    pub async fn send_bytes(&mut self, item: Bytes) -> Result<(), StreamError> {
        poll_fn(|cx| self.poll_with(cx, |st, now, key| st.mux.send_bytes(now, key, item.clone())))
            .await
    }

    /// Sends one item if credit and buffer space allow it now, without waiting.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send); `Ok(false)` means "would wait".
    pub fn try_send(&mut self, item: &[u8]) -> Result<bool, StreamError> {
        let key = self.key;
        match self.peer.with(|st, now| st.mux.send(now, key, item)) {
            Ok(()) => Ok(true),
            Err(SendError::WouldBlock(_)) => Ok(false),
            Err(e) => Err(map_send_error(e)),
        }
    }

    /// Polls sending `item`: `Ready(Ok)` once queued.
    pub fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        item: &[u8],
    ) -> Poll<Result<(), StreamError>> {
        self.poll_with(cx, |st, now, key| st.mux.send(now, key, item))
    }

    /// Ends the stream cleanly with `last` as its final item (or empty), and returns once
    /// the end is known delivered: the frontend has accepted the stream, so it reports the
    /// end (or the lane's loss) to its reader. That is at once for a stream whose ACCEPT
    /// came before; otherwise when it arrives (about a round trip after the OPEN). Never
    /// waits for credit: the terminal record has its own.
    ///
    /// # Errors
    ///
    /// [`StreamError::Closed`] if the stream had already ended;
    /// [`StreamError::Undelivered`] if the lane failed, or the frontend refused the stream,
    /// before it accepted it: the frontend may never have seen the stream, so fail or retry
    /// the request through the request path.
    pub async fn finish(mut self, last: Bytes) -> Result<(), StreamError> {
        let r =
            poll_fn(|cx| self.poll_with(cx, |st, now, key| st.mux.finish(now, key, last.clone())))
                .await;
        let r = match r {
            Ok(()) => poll_fn(|cx| self.poll_delivered(cx)).await,
            Err(e) => Err(e),
        };
        self.release();
        r
    }

    /// Resolves once the frontend has taken the stream (its ACCEPT arrived, about a round
    /// trip after the OPEN), with `true`; with `false` if the stream ended first. From then on
    /// the frontend reports the stream's end to its reader whatever happens to the lane.
    pub async fn accepted(&mut self) -> bool {
        poll_fn(|cx| {
            let key = self.key;
            self.peer.with(|st, _| {
                if st.mux.is_accepted(key) {
                    return Poll::Ready(true);
                }
                if !st.mux.stream_state(key).is_some_and(|s| s.is_live()) {
                    return Poll::Ready(false);
                }
                // `Accepted` and `Closed` wake the send waker.
                Peer::register(st, key, WakeOn::Send, cx.waker());
                Poll::Pending
            })
        })
        .await
    }

    /// Polls whether the end this side gave the stream was delivered.
    fn poll_delivered(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamError>> {
        let key = self.key;
        self.peer.with(|st, _| match st.mux.end_delivery(key) {
            Some(Ok(())) => Poll::Ready(Ok(())),
            Some(Err(end)) => Poll::Ready(Err(StreamError::Undelivered(end))),
            None => {
                // `Accepted` and `Closed` wake the send waker.
                Peer::register(st, key, WakeOn::Send, cx.waker());
                Poll::Pending
            }
        })
    }

    /// Ends the stream abnormally with an application error code and message.
    ///
    /// # Errors
    ///
    /// [`StreamError::Closed`] if the stream had already ended.
    pub fn reset(mut self, code: velo_wire::ErrorCode, message: &str) -> Result<(), StreamError> {
        let key = self.key;
        let r = self
            .peer
            .with(|st, now| st.mux.reset(now, key, code, message))
            .map_err(map_send_error);
        self.release();
        r
    }

    /// Resolves when the frontend asks the stream to stop (graceful), or the stream ends.
    pub async fn stopped(&self) {
        self.watch().stopped().await;
    }

    /// Resolves when the stream was ended by the frontend (cancel, refusal) or by its lane,
    /// with the reason. Never resolves for a stream this side finishes.
    pub async fn closed(&self) -> StreamEnd {
        self.watch().closed().await
    }

    /// Whether the frontend asked the stream to stop.
    pub fn is_stop_requested(&self) -> bool {
        self.watch().is_stop_requested()
    }

    /// A cheap handle that watches for the frontend's stop and cancel while another task
    /// sends.
    pub fn watch(&self) -> StreamWatch {
        StreamWatch {
            peer: self.peer.clone(),
            key: self.key,
            after_release: self.after_release.clone(),
        }
    }

    /// Flushes this connection's open batches now (the once-per-forward-pass hint).
    pub fn flush(&self) {
        self.peer.flush();
    }

    /// The connection this stream belongs to.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    fn poll_with(
        &mut self,
        cx: &mut Context<'_>,
        op: impl FnOnce(
            &mut crate::peer::PeerState,
            std::time::Instant,
            StreamKey,
        ) -> Result<(), SendError>,
    ) -> Poll<Result<(), StreamError>> {
        let key = self.key;
        self.peer.with(|st, now| match op(st, now, key) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(SendError::WouldBlock(Blocked::Credit)) => {
                Peer::register(st, key, WakeOn::Send, cx.waker());
                Poll::Pending
            }
            Err(SendError::WouldBlock(Blocked::Lane)) => {
                match st.mux.stream_lane(key) {
                    Some(lane) => Peer::register_lane(st, lane, cx.waker()),
                    None => return Poll::Ready(Err(StreamError::Misuse(SendError::UnknownStream))),
                }
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(map_send_error(e))),
        })
    }

    fn release(&mut self) {
        if !self.released {
            self.released = true;
            let key = self.key;
            let after = &self.after_release;
            self.peer.with(|st, now| {
                // Under the lock, so a watch sees either the live stream or this record.
                if after.set(remote_end(st, key)).is_err() {
                    tracing::debug!(?key, "a stream was released twice");
                }
                // Watches re-check, and resolve or stop waiting for good.
                Peer::wake_watchers(st, key);
                st.mux.release(now, key);
                Peer::forget(st, key);
            });
        }
    }
}

impl Drop for SendStream {
    fn drop(&mut self) {
        self.release();
    }
}

fn map_send_error(e: SendError) -> StreamError {
    match e {
        SendError::Closed(end) => StreamError::Closed(end),
        SendError::TooLarge { len, max } => StreamError::TooLarge { len, max },
        // Unknown streams, the wrong side; backpressure never gets here (the callers wait).
        misuse => StreamError::Misuse(misuse),
    }
}

/// Watches one worker stream for the frontend's stop and cancel. Cheap to clone; any number
/// of tasks may wait at once.
///
/// After the sender let the stream go (finished, reset or dropped), a watch still reports
/// an end the frontend or a lane caused before that; if this side ended the stream, neither
/// event ever fires. A watch never registers for a stream that is gone, so one held long
/// after its stream cannot disturb the stream that reuses its slot.
#[derive(Debug, Clone)]
pub struct StreamWatch {
    peer: Peer,
    key: StreamKey,
    after_release: Arc<AfterRelease>,
}

impl StreamWatch {
    /// Resolves when the frontend asks the stream to stop, or the frontend or the lane ends it.
    pub async fn stopped(&self) {
        poll_fn(|cx| {
            let key = self.key;
            self.peer.with(|st, _| {
                if let Some(after) = self.after_release.get() {
                    return if after.is_some() {
                        Poll::Ready(())
                    } else {
                        Poll::Pending // ended by this side: never
                    };
                }
                if st.mux.is_stop_requested(key) || remote_end(st, key).is_some() {
                    return Poll::Ready(());
                }
                Peer::register(st, key, WakeOn::Stop, cx.waker());
                Poll::Pending
            })
        })
        .await;
    }

    /// Resolves when the frontend (cancel, refusal) or the lane ends the stream.
    pub async fn closed(&self) -> StreamEnd {
        poll_fn(|cx| {
            let key = self.key;
            self.peer.with(|st, _| {
                if let Some(after) = self.after_release.get() {
                    return match after {
                        Some(end) => Poll::Ready(end.clone()),
                        None => Poll::Pending, // ended by this side: never
                    };
                }
                match remote_end(st, key) {
                    Some(end) => Poll::Ready(end),
                    None => {
                        Peer::register(st, key, WakeOn::Closed, cx.waker());
                        Poll::Pending
                    }
                }
            })
        })
        .await
    }

    /// Whether the frontend asked the stream to stop.
    pub fn is_stop_requested(&self) -> bool {
        self.peer.lock().mux.is_stop_requested(self.key)
    }

    /// How the frontend or the lane ended the stream, if they did.
    pub fn remote_end(&self) -> Option<StreamEnd> {
        let st = self.peer.lock();
        match self.after_release.get() {
            Some(after) => after.clone(),
            None => remote_end(&st, self.key),
        }
    }
}

/// The end of `key` if the frontend or a lane caused it.
fn remote_end(st: &crate::peer::PeerState, key: StreamKey) -> Option<StreamEnd> {
    match st.mux.send_end(key) {
        Some(end @ (StreamEnd::Cancelled(_) | StreamEnd::Lost(_) | StreamEnd::Violation(_))) => {
            Some(end)
        }
        _ => None,
    }
}
