//! The frontend's typed response stream.

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::Stream;
use serde::de::DeserializeOwned;
use velo_mux::StreamEnd;
use velo_session::RecvStream;

use crate::classic::ClassicReader;
use crate::observe::InFlight;
use crate::{Cause, Codec, Disconnect, ProtocolViolation, ResponseError};

/// A response stream: the worker's items, decoded, in order.
///
/// It ends with `None` after a clean end (the worker finished), or after a quiet end once
/// [`stop`](Self::stop) was asked and the worker wound down; any other end is one `Err`
/// (`Disconnected` "stream ended before generation completed", a worker error, or a protocol
/// violation) followed by `None`. Dropping it kills the stream: the worker is told to stop
/// generating.
pub struct ResponseStream<T> {
    inner: Inner,
    in_flight: InFlight,
    codec: Codec,
    stopped: bool,
    done: bool,
    _item: PhantomData<fn() -> T>,
}

enum Inner {
    Velo(RecvStream),
    Classic(ClassicReader),
}

impl<T> ResponseStream<T> {
    pub(crate) fn velo(stream: RecvStream, codec: Codec, in_flight: InFlight) -> Self {
        Self {
            inner: Inner::Velo(stream),
            in_flight,
            codec,
            stopped: false,
            done: false,
            _item: PhantomData,
        }
    }

    pub(crate) fn classic(reader: ClassicReader, codec: Codec, in_flight: InFlight) -> Self {
        Self {
            inner: Inner::Classic(reader),
            in_flight,
            codec,
            stopped: false,
            done: false,
            _item: PhantomData,
        }
    }

    /// Asks the worker to stop generating soon (graceful). Items already produced keep coming;
    /// the stream then ends quietly.
    pub fn stop(&mut self) {
        self.stopped = true;
        match &mut self.inner {
            Inner::Velo(s) => s.stop(),
            Inner::Classic(r) => r.stop(),
        }
    }

    /// Stops the stream now: the worker is told, nothing more is read.
    pub fn kill(&mut self) {
        self.end_with(velo_wire::CancelCode::CANCELLED);
    }

    /// Stops the stream now, telling the worker `code` (the velo plane carries it; the
    /// classic plane has only its kill).
    fn end_with(&mut self, code: velo_wire::CancelCode) {
        self.done = true;
        self.in_flight.end(None);
        match &mut self.inner {
            Inner::Velo(s) => s.cancel(code),
            Inner::Classic(r) => r.kill(),
        }
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The codec items are decoded with.
    pub fn codec(&self) -> Codec {
        self.codec
    }
}

impl<T: DeserializeOwned> ResponseStream<T> {
    /// Polls for the next item, decoded where it lies (the velo plane lends it in place).
    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Next<T>> {
        let codec = self.codec;
        let decoded = |r: Result<T, ResponseError>| match r {
            Ok(item) => Next::Item(item),
            Err(e) => Next::Undecodable(e),
        };
        match &mut self.inner {
            Inner::Classic(r) => match r.poll_item(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Ok(b))) => Poll::Ready(decoded(codec.decode(&b))),
                // A quiet end after stop: the worker may close without its sentinel. Any
                // other loss (a reset, this plane shutting down) is still one.
                Poll::Ready(Some(Err(ResponseError::Disconnected(Disconnect::Closed))))
                    if self.stopped =>
                {
                    Poll::Ready(Next::End(None))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Next::End(Some(e))),
                Poll::Ready(None) => Poll::Ready(Next::End(None)),
            },
            Inner::Velo(s) => match s.poll_recv_slice(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Ok(b))) => Poll::Ready(decoded(codec.decode(b))),
                Poll::Ready(Some(Err(end))) => Poll::Ready(Next::End(map_end(end, self.stopped))),
                Poll::Ready(None) => Poll::Ready(Next::End(None)),
            },
        }
    }
}

/// What [`ResponseStream::poll_item`] found.
enum Next<T> {
    Item(T),
    /// An item that did not decode.
    Undecodable(ResponseError),
    /// The end: quiet (`None`) or an error.
    End(Option<ResponseError>),
}

/// How a velo stream's abnormal end looks to the application; `None` is a quiet end.
fn map_end(end: StreamEnd, stopped: bool) -> Option<ResponseError> {
    match end {
        StreamEnd::Finished => None,
        StreamEnd::Error { code, .. } if code == velo_mux::RESET_DROPPED => {
            (!stopped).then_some(ResponseError::Disconnected(Disconnect::Dropped))
        }
        StreamEnd::Error { code, message } => Some(ResponseError::Worker { code, message }),
        StreamEnd::Cancelled(_) => None,
        StreamEnd::Lost(e) => Some(ResponseError::lost(Cause::lane(e))),
        StreamEnd::Violation(reason) => {
            Some(ResponseError::Protocol(ProtocolViolation::Stream(reason)))
        }
        // A worker's own view of its reset; a frontend never sees it.
        _ => Some(ResponseError::Disconnected(Disconnect::Dropped)),
    }
}

impl<T: DeserializeOwned> Stream for ResponseStream<T> {
    type Item = Result<T, ResponseError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // `ResponseStream` is `Unpin`: every field is.
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match ready!(this.poll_item(cx)) {
            Next::Item(item) => Poll::Ready(Some(Ok(item))),
            Next::Undecodable(e) => {
                // The worker sends what we cannot read: stop it, as its fault (it is no
                // cancellation of its work), and report once.
                this.in_flight.end(Some(&e));
                this.end_with(velo_wire::CancelCode::PROTOCOL_ERROR);
                Poll::Ready(Some(Err(e)))
            }
            Next::End(e) => {
                this.done = true;
                this.in_flight.end(e.as_ref());
                Poll::Ready(e.map(Err))
            }
        }
    }
}

impl<T> Drop for ResponseStream<T> {
    fn drop(&mut self) {
        if !self.done {
            self.kill();
        }
    }
}

impl<T> std::fmt::Debug for ResponseStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStream")
            .field("codec", &self.codec)
            .field("stopped", &self.stopped)
            .finish()
    }
}
