//! The frontend's handle on one response stream.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use velo_mux::{ItemQueue, StreamEnd, StreamKey};
use velo_wire::{CancelCode, Token};

use crate::mailbox::Mailbox;
use crate::peer::Peer;

/// A response stream as the frontend reads it.
///
/// Items come in order. A clean end (the worker's FINAL) ends the sequence; any other end
/// (worker error, lane lost, cancellation) is reported once as `Err`. Dropping the handle
/// cancels the stream (the worker sees a CANCEL).
///
/// Each wake moves every queued item into the handle at once, returning their credit to the
/// worker: a stream therefore holds at most two credit windows (one here, one in the mux).
/// A waiting handle's items are handed to it by the lane reader that received them, so it
/// takes them without the connection's lock (see `mailbox.rs`).
#[derive(Debug)]
pub struct RecvStream {
    peer: Peer,
    key: StreamKey,
    items: ItemQueue,
    end: Option<StreamEnd>,
    reported: bool,
    mailbox: Arc<Mailbox>,
    /// The connection hands items to `mailbox` (attached on the first take).
    attached: bool,
}

impl RecvStream {
    pub(crate) fn new(peer: Peer, key: StreamKey) -> Self {
        Self {
            peer,
            key,
            items: ItemQueue::new(),
            end: None,
            reported: false,
            mailbox: Arc::default(),
            attached: false,
        }
    }

    /// The next item: `Some(Ok(item))`, `Some(Err(end))` once for an abnormal end, `None`
    /// after a clean end (and after the abnormal end was reported).
    ///
    /// Each item is handed over as `Bytes` of its own (a copy for a small one):
    /// [`recv_with`](Self::recv_with) reads it in place instead.
    pub async fn recv(&mut self) -> Option<Result<Bytes, StreamEnd>> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Polls for the next item; see [`recv`](Self::recv).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, StreamEnd>>> {
        if self.ready(cx) {
            return Poll::Ready(self.items.pop_bytes().map(Ok));
        }
        self.poll_end()
    }

    /// The next item, read in place by `read`: as [`recv`](Self::recv), without an allocation
    /// or a shared reference count per item.
    pub async fn recv_with<R>(
        &mut self,
        mut read: impl FnMut(&[u8]) -> R,
    ) -> Option<Result<R, StreamEnd>> {
        poll_fn(|cx| {
            self.poll_recv_slice(cx)
                .map(|r| r.map(|r| r.map(&mut read)))
        })
        .await
    }

    /// Polls for the next item, lent until the next call; see [`recv_with`](Self::recv_with).
    pub fn poll_recv_slice(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<&[u8], StreamEnd>>> {
        if self.ready(cx) {
            return Poll::Ready(self.items.pop().map(Ok));
        }
        self.poll_end()
    }

    /// Whether an item is in hand, taking what the stream has when none is (and registering
    /// `cx` when it has nothing).
    fn ready(&mut self, cx: &mut Context<'_>) -> bool {
        if self.items.is_empty() {
            // A burst of large items read leaves no more than an empty queue keeps (also
            // once the end is known: the handle may live on long after it).
            self.items.clear();
            if self.end.is_none() {
                self.take(cx);
            }
        }
        !self.items.is_empty()
    }

    /// The end, once no item is left: reported once, then `None`; `Pending` before it.
    fn poll_end<T>(&mut self) -> Poll<Option<Result<T, StreamEnd>>> {
        match &self.end {
            None => Poll::Pending,
            Some(_) if self.reported => Poll::Ready(None),
            Some(StreamEnd::Finished) => {
                self.reported = true;
                Poll::Ready(None)
            }
            Some(end) => {
                self.reported = true;
                Poll::Ready(Some(Err(end.clone())))
            }
        }
    }

    /// Takes what the stream has for its (empty) handle: what a lane reader left in the
    /// mailbox, else, when the mailbox says items were left in the mux (or is not attached
    /// yet), whatever the mux holds, under the connection's lock. Registers `cx` to be woken
    /// when that finds nothing.
    fn take(&mut self, cx: &mut Context<'_>) {
        if self.attached {
            let mut slot = self.mailbox.lock();
            if !slot.items.is_empty() {
                std::mem::swap(&mut self.items, &mut slot.items);
            }
            self.end = slot.end.take();
            if !self.items.is_empty() || self.end.is_some() {
                return;
            }
            if !std::mem::take(&mut slot.in_mux) {
                slot.wait(cx.waker());
                return;
            }
        }
        let (key, items, mailbox) = (self.key, &mut self.items, &self.mailbox);
        let attach = !std::mem::replace(&mut self.attached, true);
        let end = self.peer.with(|st, now| {
            if attach {
                Peer::attach_mailbox(st, key, mailbox);
            }
            // No reader hands anything over while this lock is held: drain the mailbox (its
            // items are older than the mux's), then the mux.
            let mut slot = mailbox.lock();
            slot.in_mux = false;
            items.append(&mut slot.items);
            let early = slot.end.take();
            let end = st.mux.recv_all(now, key, items).map(|end| early.or(end));
            if items.is_empty() && matches!(end, Some(None)) {
                slot.wait(cx.waker());
            }
            end
        });
        match end {
            // The stream is gone from the mux: it was released, which only `Drop` does.
            None => self.end = Some(StreamEnd::Cancelled(CancelCode::CANCELLED)),
            Some(Some(end)) => self.end = Some(end),
            Some(None) => {}
        }
    }

    /// Bytes of buffer the handle holds for items taken and not read yet (memory accounting:
    /// once it has read everything, at most [`velo_mux::ITEM_BUFFER_KEEP`]).
    pub fn buffer_capacity(&self) -> usize {
        self.items.buffer_capacity()
    }

    /// How the stream ended, once its end has been read.
    pub fn end(&self) -> Option<&StreamEnd> {
        self.end.as_ref().filter(|_| self.reported)
    }

    /// Asks the worker to finish soon; items keep coming until the end.
    pub fn stop(&self) {
        let key = self.key;
        self.peer.with(|st, now| st.mux.stop(now, key));
    }

    /// Ends the stream now; the worker sees a CANCEL with `code`.
    pub fn cancel(&mut self, code: CancelCode) {
        let key = self.key;
        self.peer.with(|st, now| st.mux.cancel(now, key, code));
    }

    /// The connection this stream belongs to.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }
}

impl Drop for RecvStream {
    fn drop(&mut self) {
        let key = self.key;
        let items = std::mem::take(&mut self.items);
        self.peer.with(|st, now| {
            st.mux.release(now, key);
            st.mux.give_queue(items);
            Peer::forget(st, key);
        });
    }
}

/// A stream a worker just opened, waiting for the frontend to take or refuse it.
#[derive(Debug)]
pub struct IncomingStream {
    stream: Option<RecvStream>,
    ticket: u64,
    token: Token,
    prologue: Bytes,
}

impl IncomingStream {
    pub(crate) fn new(stream: RecvStream, ticket: u64, token: Token, prologue: Bytes) -> Self {
        Self {
            stream: Some(stream),
            ticket,
            token,
            prologue,
        }
    }

    /// The registration key from the stream's address.
    pub fn ticket(&self) -> u64 {
        self.ticket
    }

    /// The secret from the stream's address.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The discovery instance the opening worker's connection announced (see
    /// [`Peer::worker_instance`]).
    pub fn worker_instance(&self) -> Option<u64> {
        self.stream
            .as_ref()
            .and_then(|s| s.peer().worker_instance())
    }

    /// The prologue (JSON bytes).
    pub fn prologue(&self) -> &Bytes {
        &self.prologue
    }

    /// Tells the worker the stream is taken (ACCEPT), keeping it here: from now on this side
    /// reports the stream's end to whoever reads it, and the worker counts its end as
    /// delivered. Call it as soon as the stream has a consumer; [`accept`](Self::accept)
    /// does it too. Idempotent.
    pub fn confirm(&self) {
        if let Some(s) = &self.stream {
            let key = s.key;
            s.peer.with(|st, now| st.mux.accept_stream(now, key));
        }
    }

    /// Takes the stream (confirming it to the worker, if not done yet).
    pub fn accept(mut self) -> RecvStream {
        self.confirm();
        self.stream
            .take()
            .expect("an incoming stream is taken once")
    }

    /// Refuses the stream; the worker sees a CANCEL with `code`
    /// (typically [`CancelCode::REFUSED`]).
    pub fn refuse(mut self, code: CancelCode) {
        if let Some(mut s) = self.stream.take() {
            s.cancel(code);
        }
    }
}

impl Drop for IncomingStream {
    fn drop(&mut self) {
        if let Some(mut s) = self.stream.take() {
            s.cancel(CancelCode::REFUSED);
        }
    }
}
