//! The sending side of one response stream: the prologue exactly once and first, then items,
//! then the end, on either plane.

use std::marker::PhantomData;

use bytes::Bytes;
use serde::Serialize;
use velo_session::{Peer, SendStream};

use super::context::{StreamContext, Watch};
use crate::classic::ClassicWriter;
use crate::error::stream_error;
use crate::observe::InFlight;
use crate::{Codec, ResponseError, TypedError, prologue};

/// The sending side of one response stream.
///
/// Call [`send_prologue`](Self::send_prologue) exactly once, first; then
/// [`send`](Self::send) items and [`finish`](Self::finish). Dropping it without finishing
/// ends the stream abnormally for the frontend ("stream ended before generation completed").
/// Dropping it before the prologue ends the frontend's pending handle with `Disconnected`
/// (retryable: the request never got an answer), on either plane.
pub struct ResponseSender<T> {
    kind: Kind,
    codec: Codec,
    buf: Vec<u8>,
    context: StreamContext,
    in_flight: InFlight,
    _item: PhantomData<fn(&T)>,
}

/// Where a stream is in its life, and on which plane.
pub(super) enum Kind {
    /// Velo, connection ready, prologue not sent.
    VeloReady {
        peer: Peer,
        ticket: u64,
        token: [u8; 16],
    },
    Velo(SendStream),
    Classic(ClassicWriter),
    /// Classic, prologue sent.
    ClassicOpen(ClassicWriter),
    Done,
}

impl Kind {
    /// Velo, connection ready, prologue not sent.
    pub(super) fn velo(peer: Peer, ticket: u64, token: [u8; 16]) -> Self {
        Self::VeloReady {
            peer,
            ticket,
            token,
        }
    }
}

impl<T: Serialize> ResponseSender<T> {
    pub(super) fn new(kind: Kind, codec: Codec, in_flight: InFlight) -> Self {
        let context = StreamContext::new();
        if let Kind::Classic(w) = &kind {
            context.set(Watch::Classic(w.control()));
        }
        Self {
            kind,
            codec,
            buf: Vec::with_capacity(256),
            context,
            in_flight,
            _item: PhantomData,
        }
    }

    /// Sends the prologue: `Ok(())` once the engine accepted the request, or its typed
    /// refusal (which ends the stream).
    ///
    /// # Errors
    ///
    /// `Prologue` if one was sent already; transport errors.
    pub async fn send_prologue(
        &mut self,
        result: Result<(), TypedError>,
    ) -> Result<(), ResponseError> {
        let r = self.prologue(result).await;
        self.account(&r);
        r
    }

    async fn prologue(&mut self, result: Result<(), TypedError>) -> Result<(), ResponseError> {
        let json = prologue::encode(&result);
        match std::mem::replace(&mut self.kind, Kind::Done) {
            Kind::VeloReady {
                peer,
                ticket,
                token,
            } => {
                let token = velo_wire::Token(token);
                let stream = velo_session::open_when_room(&peer, ticket, &token, &json)
                    .await
                    .map_err(stream_error)?;
                self.context.set(Watch::Velo(stream.watch()));
                if result.is_err() {
                    stream.finish(Bytes::new()).await.map_err(stream_error)?;
                } else {
                    self.kind = Kind::Velo(stream);
                }
                Ok(())
            }
            Kind::Classic(mut w) => {
                w.prologue(&json).await?;
                if result.is_err() {
                    w.finish().await?;
                } else {
                    self.kind = Kind::ClassicOpen(w);
                }
                Ok(())
            }
            other => {
                self.kind = other;
                Err(ResponseError::Prologue("the prologue was already sent"))
            }
        }
    }

    /// Sends one item, waiting while the frontend's credit for this stream is used up.
    ///
    /// # Errors
    ///
    /// `Cancelled` after the frontend killed the stream, `Disconnected` when the connection
    /// is lost, `Prologue` before the prologue, `Encode`, `TooLarge`.
    pub async fn send(&mut self, item: &T) -> Result<(), ResponseError> {
        let r = self.item(item).await;
        self.account(&r);
        r
    }

    async fn item(&mut self, item: &T) -> Result<(), ResponseError> {
        self.codec.encode(item, &mut self.buf)?;
        match &mut self.kind {
            Kind::Velo(s) => {
                let r = if self.buf.len() >= velo_mux::CHAIN_THRESHOLD {
                    // Large items are handed over whole (zero-copy); the buffer starts anew.
                    let big = std::mem::replace(&mut self.buf, Vec::with_capacity(256));
                    s.send_bytes(Bytes::from(big)).await
                } else {
                    s.send(&self.buf).await
                };
                r.map_err(stream_error)
            }
            Kind::ClassicOpen(w) => w.item(&self.buf).await,
            Kind::VeloReady { .. } | Kind::Classic(_) => {
                Err(ResponseError::Prologue("send the prologue before any item"))
            }
            Kind::Done => Err(ResponseError::Prologue("the stream has ended")),
        }
    }

    /// Ends the stream cleanly (the `complete_final` end), and returns once the frontend has
    /// the stream: from then on it reports the stream's end to its reader, whatever happens
    /// to the connection. On the velo plane that is at once for any stream the frontend took
    /// before (its ACCEPT came back about a round trip after the prologue); a stream finished
    /// sooner waits for that answer.
    ///
    /// # Errors
    ///
    /// `Cancelled` or `Disconnected` if the stream had already ended, or if the frontend
    /// refused it or the connection failed before the frontend took it: the frontend may
    /// never have seen the stream, so fail (or retry) the request through the request path
    /// rather than count it served.
    pub async fn finish(mut self) -> Result<(), ResponseError> {
        let r = self.end().await;
        self.account(&r);
        r
    }

    async fn end(&mut self) -> Result<(), ResponseError> {
        match std::mem::replace(&mut self.kind, Kind::Done) {
            Kind::Velo(s) => s.finish(Bytes::new()).await.map_err(stream_error),
            Kind::ClassicOpen(mut w) => w.finish().await,
            Kind::Done => Err(ResponseError::Prologue("the stream has ended")),
            _ => Err(ResponseError::Prologue(
                "send the prologue before finishing",
            )),
        }
    }

    /// Flushes this stream's connection now (velo; the classic plane writes every item at
    /// once anyway). Prefer [`WorkerPlane::flush`](crate::WorkerPlane::flush) once per forward pass.
    pub fn flush(&self) {
        if let Kind::Velo(s) = &self.kind {
            s.flush();
        }
    }

    /// The stream's cancellation signals, for the engine.
    pub fn context(&self) -> StreamContext {
        self.context.clone()
    }

    /// Counts a failed call as a stream error (cancellations aside); one that ends the
    /// stream (anything but the caller's own mistake) also ends its time in flight.
    fn account(&mut self, r: &Result<(), ResponseError>) {
        match r {
            Err(e) if e.is_caller() => self.in_flight.count_error(),
            Err(e) => self.in_flight.end(Some(e)),
            Ok(()) => {}
        }
    }
}

impl<T> Drop for ResponseSender<T> {
    fn drop(&mut self) {
        // Velo, before the prologue: nothing reached the frontend yet, so say the stream is
        // abandoned (an OPEN with an empty prologue) and reset it at once (dropping the
        // stream sends ERROR `RESET_DROPPED`). The classic plane needs nothing: dropping
        // the connection ends the frontend's wait.
        if let Kind::VeloReady {
            peer,
            ticket,
            token,
        } = &self.kind
        {
            let token = velo_wire::Token(*token);
            match velo_session::open_on(peer, *ticket, &token, prologue::ABANDONED) {
                Ok(stream) => drop(stream),
                // The connection is gone or going away: the establish timeout ends the wait.
                Err(e) => tracing::debug!(error = %e, "cannot report an abandoned stream"),
            }
        }
    }
}

impl<T> std::fmt::Debug for ResponseSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseSender")
            .field("codec", &self.codec)
            .finish()
    }
}
