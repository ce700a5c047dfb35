//! The sending side of one response stream: the prologue exactly once and first, then items,
//! then the end, on either plane.

use std::marker::PhantomData;

use bytes::Bytes;
use serde::Serialize;
use tokio_util::task::TaskTracker;
use velo_mux::OpenError;
use velo_session::{Peer, SendStream, StreamError, WorkerEndpoint};

use super::context::{StreamContext, Watch};
use crate::classic::ClassicWriter;
use crate::error::stream_error;
use crate::observe::InFlight;
use crate::{Cause, Codec, ResponseError, TypedError, prologue};

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
        /// How to reach the frontend again if `peer` stops taking new streams meanwhile.
        target: Box<VeloTarget>,
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
    pub(super) fn velo(peer: Peer, target: VeloTarget, ticket: u64, token: [u8; 16]) -> Self {
        Self::VeloReady {
            peer,
            target: Box::new(target),
            ticket,
            token,
        }
    }
}

/// A velo stream's frontend, and the endpoint that reaches it: the connection prepared for
/// the stream may stop taking new streams before its prologue goes out (the frontend said
/// GOAWAY, or its lanes died), and the stream is then opened on a fresh one.
pub(super) struct VeloTarget {
    pub(super) endpoint: WorkerEndpoint,
    pub(super) addr: std::net::SocketAddr,
    pub(super) instance: velo_wire::InstanceId,
    /// Where an abandonment that needs a fresh connection is announced from.
    pub(super) tracker: TaskTracker,
}

/// Whether `peer` refused an OPEN only because it takes no new streams (GOAWAY, no lane
/// left): a fresh connection to the same frontend may take it.
fn refused_for_going_away(e: &StreamError) -> bool {
    matches!(
        e,
        StreamError::Open(OpenError::GoingAway(_) | OpenError::NoLane)
    )
}

impl VeloTarget {
    /// Opens the stream on `peer`, or, if `peer` takes no new streams any more, once on a
    /// fresh connection to the same frontend.
    async fn open(
        &self,
        peer: &Peer,
        ticket: u64,
        token: &velo_wire::Token,
        prologue: &[u8],
    ) -> Result<SendStream, ResponseError> {
        match velo_session::open_when_room(peer, ticket, token, prologue).await {
            Err(e) if refused_for_going_away(&e) => {
                let fresh = self.fresh_peer().await?;
                velo_session::open_when_room(&fresh, ticket, token, prologue)
                    .await
                    .map_err(stream_error)
            }
            r => r.map_err(stream_error),
        }
    }

    /// A connection to the frontend that takes new streams: the cached one if it still
    /// does, else a new one.
    async fn fresh_peer(&self) -> Result<Peer, ResponseError> {
        self.endpoint
            .peer(self.addr, self.instance)
            .await
            .map_err(|e| ResponseError::Unreachable {
                addr: self.addr,
                cause: Cause::connect(e),
            })
    }

    /// Tells the frontend stream `ticket` is abandoned (an OPEN with the abandoned prologue,
    /// then a reset): on `peer` at once, or, if `peer` takes no new streams, from a task on
    /// a fresh connection (a stream dropped at any point is announced, or the frontend's
    /// request waits for its establish timeout).
    fn abandon(self, peer: &Peer, ticket: u64, token: velo_wire::Token) {
        match velo_session::open_on(peer, ticket, &token, prologue::ABANDONED) {
            Ok(stream) => drop(stream),
            Err(e) if refused_for_going_away(&e) => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    tracing::debug!("no runtime to report an abandoned stream from");
                    return;
                };
                let tracker = self.tracker.clone();
                let announce = async move {
                    let opened = match self.fresh_peer().await {
                        Ok(fresh) => {
                            velo_session::open_on(&fresh, ticket, &token, prologue::ABANDONED)
                                .map_err(stream_error)
                        }
                        Err(e) => Err(e),
                    };
                    match opened {
                        Ok(stream) => drop(stream),
                        Err(e) => tracing::debug!(error = %e, "cannot report an abandoned stream"),
                    }
                };
                tracker.spawn_on(announce, &runtime);
            }
            // The connection is gone: the establish timeout ends the wait.
            Err(e) => tracing::debug!(error = %e, "cannot report an abandoned stream"),
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
        if let Kind::VeloReady {
            peer,
            target,
            ticket,
            token,
        } = &self.kind
        {
            // The parts stay in `self` until the open is done (it may prepare a new
            // connection): a caller that gives up on this future (a timeout, a select) drops
            // the sender with them, and its drop announces the stream abandoned.
            let token = velo_wire::Token(*token);
            let opened = target.open(peer, *ticket, &token, &json).await;
            self.kind = Kind::Done;
            let stream = match opened {
                Ok(stream) => stream,
                Err(e) => {
                    self.context.set(Watch::Never);
                    return Err(e);
                }
            };
            self.context.set(Watch::Velo(stream.watch()));
            if result.is_err() {
                stream.finish(Bytes::new()).await.map_err(stream_error)?;
            } else {
                self.kind = Kind::Velo(stream);
            }
            return Ok(());
        }
        match std::mem::replace(&mut self.kind, Kind::Done) {
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
            target,
            ticket,
            token,
        } = std::mem::replace(&mut self.kind, Kind::Done)
        {
            self.context.set(Watch::Never);
            target.abandon(&peer, ticket, velo_wire::Token(token));
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

#[cfg(all(test, feature = "tcp"))]
mod tests {
    use std::time::Duration;

    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::{
        Disconnect, FrontendPlane, Plane, RegisterOptions, ResponsePlaneConfig, WorkerPlane,
    };

    const BOUND: Duration = Duration::from_secs(20);

    type Connected = (
        FrontendPlane,
        WorkerPlane,
        crate::PendingResponse<u32>,
        ResponseSender<u32>,
    );

    /// A velo frontend and a worker on loopback, and a stream of the frontend's that the
    /// worker has connected for (its prologue not sent).
    async fn connected() -> Connected {
        let config = ResponsePlaneConfig::builder()
            .plane(Plane::Velo)
            .host(Some("127.0.0.1".parse().unwrap()))
            .build()
            .unwrap();
        let frontend = FrontendPlane::bind(config.clone(), TaskTracker::new())
            .await
            .unwrap();
        let worker = WorkerPlane::new(config, TaskTracker::new()).unwrap();
        let opts = RegisterOptions {
            establish_timeout: None,
            ..RegisterOptions::default()
        };
        let (info, pending) = frontend.register::<u32>(opts).unwrap();
        let tx = tokio::time::timeout(BOUND, worker.connect::<u32>(&info))
            .await
            .unwrap()
            .unwrap();
        (frontend, worker, pending, tx)
    }

    /// As [`connected`], then the frontend says GOAWAY to that connection. Returns once the
    /// worker has heard it.
    async fn connected_then_going_away() -> Connected {
        let (frontend, worker, pending, tx) = connected().await;
        let Kind::VeloReady { peer, .. } = &tx.kind else {
            panic!("a velo stream before its prologue");
        };
        frontend.go_away();
        let deadline = tokio::time::Instant::now() + BOUND;
        while !peer.is_going_away() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the GOAWAY never arrived"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        (frontend, worker, pending, tx)
    }

    /// Waits (bounded) for `pending` to end, and checks the worker said it abandoned the
    /// stream (retryable) rather than leaving the request to its establish timeout.
    async fn abandoned(pending: crate::PendingResponse<u32>) {
        let r = tokio::time::timeout(BOUND, pending.established())
            .await
            .expect("the frontend learns the stream is abandoned");
        assert!(
            matches!(r, Err(ResponseError::Disconnected(Disconnect::Abandoned))),
            "{r:?}"
        );
    }

    /// The frontend drains the connection between the worker's connect and its prologue
    /// (a rolling restart, a lane rebalance): the stream opens on a fresh connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prologue_after_the_frontends_goaway_opens_on_a_fresh_connection() {
        let (frontend, worker, pending, mut tx) = connected_then_going_away().await;
        tx.send_prologue(Ok(())).await.unwrap();
        tx.send(&7).await.unwrap();
        tokio::time::timeout(BOUND, tx.finish())
            .await
            .unwrap()
            .unwrap();
        let mut rx = tokio::time::timeout(BOUND, pending.established())
            .await
            .expect("the stream reached the frontend")
            .unwrap();
        let first = tokio::time::timeout(BOUND, futures::StreamExt::next(&mut rx)).await;
        assert_eq!(first.unwrap().map(Result::unwrap), Some(7));
        worker.close();
        frontend.shutdown().await;
    }

    /// An engine that waits on a stream's signals learns the stream is over when its sender
    /// is dropped before the prologue (nothing will ever stop or kill it otherwise).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_dropped_before_its_prologue_reads_as_killed_to_its_engine() {
        let (frontend, worker, _pending, tx) = connected().await;
        let ctx = tx.context();
        assert!(!ctx.is_killed());
        drop(tx);
        tokio::time::timeout(BOUND, ctx.killed())
            .await
            .expect("killed() resolves");
        tokio::time::timeout(BOUND, ctx.stopped())
            .await
            .expect("stopped() resolves");
        assert!(ctx.is_killed() && ctx.is_stopped());
        worker.close();
        frontend.shutdown().await;
    }

    /// The engine gives up on its prologue while the stream is being opened on a fresh
    /// connection (a timeout around `send_prologue`), then drops the sender: the stream is
    /// still announced abandoned and still reads as killed to its engine.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prologue_given_up_while_reconnecting_still_abandons_the_stream() {
        let (frontend, worker, pending, mut tx) = connected_then_going_away().await;
        let ctx = tx.context();
        {
            let prologue = tx.send_prologue(Ok(()));
            tokio::pin!(prologue);
            // The first poll starts the new connection: it cannot be ready yet.
            assert!(futures::FutureExt::now_or_never(prologue.as_mut()).is_none());
        }
        drop(tx);
        tokio::time::timeout(BOUND, ctx.killed())
            .await
            .expect("killed() resolves");
        abandoned(pending).await;
        worker.close();
        frontend.shutdown().await;
    }

    /// As above, but the engine drops the stream before its prologue: the frontend's
    /// request still learns it is abandoned (retryable), instead of waiting.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_dropped_after_the_frontends_goaway_is_still_reported_abandoned() {
        let (frontend, worker, pending, tx) = connected_then_going_away().await;
        drop(tx);
        abandoned(pending).await;
        worker.close();
        frontend.shutdown().await;
    }
}
