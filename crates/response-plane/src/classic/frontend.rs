//! Classic plane, frontend side: accept one connection per stream, match it to its
//! registration, read items straight from the socket.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, DropGuard, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

use super::conn::{Conn, ConnRead, ConnWrite};
use super::frame::{
    self, ACCEPTED, DATA, HANDSHAKE, HEARTBEAT, KILL, NO_TLS, PROLOGUE, REQUIRES_TLS, SENTINEL,
    STOP,
};
use super::mismatch;
use super::socket::set_liveness;
use crate::registry::{Arrival, Registry};
use crate::stats::PlaneCounters;
use crate::{Cause, Disconnect, ProtocolViolation, ResponseError, prologue};
use velo_session::{HandshakeBudget, HandshakeTicket};

/// Least time a new connection has to name its stream; the liveness bound when longer. A
/// busy worker can take seconds to write its first message after its connect completed (a
/// burst of thousands of streams on a loaded host did, at 5 s): the name is the first thing
/// it sends, so this is the same silence as any other.
const MIN_HANDSHAKE_WAIT: Duration = Duration::from_secs(5);
/// Listen backlog of the classic listener.
const BACKLOG: u32 = 4096;
/// Largest handshake message, in bytes.
const MAX_HANDSHAKE: u32 = 1024;
/// Classic connections that have not named their stream yet (TLS and the first message
/// still to come), in all: past it a new connection is closed at once, so silent or slow
/// connections cannot take every file descriptor. Every stream is a connection on this
/// plane, so the budget is sized for bursts of thousands of streams, not for a few lanes.
pub(crate) const CLASSIC_HANDSHAKES: usize = 8192;
/// The same, from one source address: one flooding host cannot take more than half.
pub(crate) const CLASSIC_HANDSHAKES_PER_SOURCE: usize = 4096;
/// Longest a plaintext frontend waits for a TLS worker it refused to close first (a TLS
/// frontend waits its TLS handshake timeout): Dynamo's default TLS handshake timeout.
const REFUSAL_LINGER: Duration = velo_tls::DEFAULT_HANDSHAKE_TIMEOUT;

#[derive(Deserialize)]
struct Handshake {
    stream: u64,
    token: String,
    /// The worker's discovery instance (absent from Dynamo's own workers): a registration
    /// tied to an instance is only claimed by a connection naming it.
    #[serde(default)]
    worker: Option<u64>,
}

/// The classic listener.
pub(crate) struct ClassicFrontend {
    pub(crate) local_addr: SocketAddr,
    stop: CancellationToken,
    done: CancellationToken,
}

/// What every connection's handshake task needs.
#[derive(Clone)]
pub(crate) struct Accept {
    pub(crate) registry: Arc<Registry>,
    pub(crate) max: u32,
    pub(crate) liveness: Duration,
    /// TLS on every connection, when set (the handshake runs in the connection's task).
    pub(crate) tls: Option<Arc<velo_tls::ServerTls>>,
    /// The plane's counters (arrivals refused, those from the wrong worker, TLS mismatches).
    pub(crate) counters: Arc<PlaneCounters>,
    /// Connections that have not named their stream yet, per source and in all.
    pub(crate) handshakes: Arc<HandshakeBudget>,
    /// Cancelled when the plane shuts down or aborts: the accept loop ends, and so does every
    /// stream, named or not.
    pub(crate) stop: CancellationToken,
    /// Where each established stream's closer waits for `stop`.
    pub(crate) tracker: TaskTracker,
}

impl ClassicFrontend {
    /// Listens on `addr`; every accepted connection gives up on a vanished worker within
    /// `liveness` (the plane's `idle_timeout`).
    pub(crate) async fn bind(
        addr: SocketAddr,
        accept: Accept,
        tracker: TaskTracker,
    ) -> std::io::Result<Self> {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        // As deep as the kernel allows by default (`somaxconn`): one connection per stream
        // arrives in bursts. The accept loop is still what limits this plane at scale.
        let listener = socket.listen(BACKLOG)?;
        let local_addr = listener.local_addr()?;
        let (stop, done) = (accept.stop.clone(), CancellationToken::new());
        let (s, d, t) = (stop.clone(), done.clone(), tracker.clone());
        tracker.spawn(async move {
            loop {
                // Cancel safety: `accept` loses no connection when dropped.
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = s.cancelled() => break,
                };
                let Ok((stream, peer)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let Ok(place) = accept.handshakes.enter(Some(peer.ip())) else {
                    // Closed unread: a flood learns nothing, and holds nothing.
                    accept.counters.classic_handshakes_refused.inc();
                    continue;
                };
                let (accept, s2) = (accept.clone(), s.clone());
                let (evicted, counters) = (place.eviction(), accept.counters.clone());
                t.spawn(async move {
                    // Its place goes to a lighter source only before the stream is named.
                    tokio::select! {
                        () = handshake(stream, accept, place) => {}
                        () = s2.cancelled() => {}
                        () = evicted.cancelled() => {
                            counters.classic_handshakes_evicted.inc();
                        }
                    }
                });
            }
            d.cancel();
        });
        Ok(Self {
            local_addr,
            stop,
            done,
        })
    }

    /// Stops accepting, ends every stream, and waits for the accept loop to end.
    pub(crate) async fn shutdown(&self) {
        self.stop.cancel();
        self.done.cancelled().await;
    }

    /// Stops accepting and ends every stream; the accept loop ends on its task.
    pub(crate) fn abort(&self) {
        self.stop.cancel();
    }
}

/// Reads a new connection's stream name (after TLS) and hands the connection to its pending
/// handle; `place` in the handshake budget is held until the name is read.
async fn handshake(stream: TcpStream, accept: Accept, place: HandshakeTicket) {
    let (max, liveness) = (accept.max, accept.liveness);
    let refused = &accept.counters.arrivals_refused;
    let _ = stream.set_nodelay(true);
    if let Err(e) = set_liveness(&stream, liveness) {
        // Without it a vanished worker would hold this stream for ever: refuse it.
        tracing::debug!(error = %e, "cannot bound a classic connection's liveness");
        refused.inc();
        return;
    }
    let mut stream = match secure(stream, accept.tls.as_deref()).await {
        Secured::Conn(conn) => conn,
        Secured::Plaintext(mut stream) => {
            accept.counters.classic_tls_mismatches.inc();
            tracing::debug!(
                "a plaintext classic worker at this TLS frontend: told TLS is required"
            );
            let linger = accept
                .tls
                .as_deref()
                .map(velo_tls::ServerTls::handshake_timeout);
            mismatch::refuse(&mut stream, REQUIRES_TLS, linger.unwrap_or(REFUSAL_LINGER)).await;
            return;
        }
        Secured::Failed => {
            refused.inc();
            return;
        }
    };
    let mut buf = BytesMut::with_capacity(256);
    let wait = liveness.max(MIN_HANDSHAKE_WAIT);
    let read = tokio::time::timeout(
        wait,
        read_message(&mut stream, &mut buf, MAX_HANDSHAKE, wait),
    )
    .await;
    let Ok(Ok((HANDSHAKE, body))) = read else {
        if accept.tls.is_none() && mismatch::is_client_hello(&buf) {
            accept.counters.classic_tls_mismatches.inc();
            tracing::debug!("a TLS classic worker at this plaintext frontend: told it has no TLS");
            mismatch::refuse(&mut stream, NO_TLS, REFUSAL_LINGER).await;
        } else {
            refused.inc();
        }
        return;
    };
    let Ok(h) = serde_json::from_slice::<Handshake>(&body) else {
        refused.inc();
        return;
    };
    // Named: from here on the connection is a stream's, not an unauthenticated stranger's.
    drop(place);
    let Some(token) = crate::info::parse_token(&h.token) else {
        refused.inc();
        send(&mut stream, KILL).await;
        return;
    };
    match accept.registry.claim(h.stream, &token, h.worker) {
        Ok(tx) if !tx.is_closed() => {
            // Taken: the worker may count its end delivered from now on, since the pending
            // handle reports whatever happens to the connection.
            if !send(&mut stream, ACCEPTED).await {
                // The worker went away (not this plane): its request may go elsewhere.
                let lost = ResponseError::Disconnected(Disconnect::Closed);
                let _ = tx.send(Arrival::Failed(lost));
                return;
            }
            let incoming = Incoming {
                stream,
                buf,
                max,
                idle: liveness,
                plane_stop: accept.stop.clone(),
                tracker: accept.tracker.clone(),
            };
            // If the pending handle went away meanwhile the connection is dropped: the
            // worker sees its end.
            let _ = tx.send(Arrival::Classic(incoming));
        }
        // The pending handle is already gone, or the ticket is not one we hold.
        Ok(_) => {
            refused.inc();
            send(&mut stream, KILL).await;
        }
        Err(refusal) => {
            refused.inc();
            if refusal == crate::registry::Refusal::WrongWorker {
                accept.counters.arrivals_wrong_worker.inc();
            }
            send(&mut stream, KILL).await;
        }
    }
}

/// A connection after its TLS handshake, or what stopped it.
enum Secured {
    /// Ready for the classic handshake: TLS done, or a plaintext listener.
    Conn(Conn),
    /// A TLS listener's worker began with a byte that starts no TLS handshake: it speaks
    /// plaintext.
    Plaintext(TcpStream),
    /// The TLS handshake failed (a certificate refused, garbage, the connection lost) or
    /// timed out.
    Failed,
}

/// The connection after its TLS handshake, the first byte read (peeked) and the handshake
/// both under the TLS handshake timeout; or as it is without TLS.
async fn secure(stream: TcpStream, tls: Option<&velo_tls::ServerTls>) -> Secured {
    let Some(tls) = tls else {
        return Secured::Conn(Conn::Plain(stream));
    };
    let timeout = tls.handshake_timeout();
    let handshake = async {
        let mut first = [0u8; 1];
        match stream.peek(&mut first).await {
            Ok(1) if mismatch::begins_tls(first) => {}
            Ok(1) => return Secured::Plaintext(stream),
            Ok(_) => return Secured::Failed,
            Err(e) => {
                tracing::debug!(error = %e, "a classic connection failed before its TLS handshake");
                return Secured::Failed;
            }
        }
        match tls.acceptor().accept(stream).await {
            Ok(s) => Secured::Conn(Conn::Tls(Box::new(
                velo_tls::tokio_rustls::TlsStream::Server(s),
            ))),
            Err(e) => {
                tracing::debug!(error = %e, "classic TLS handshake failed");
                Secured::Failed
            }
        }
    };
    tokio::time::timeout(timeout, handshake)
        .await
        .unwrap_or_else(|_| {
            tracing::debug!(?timeout, "classic TLS handshake timed out");
            Secured::Failed
        })
}

/// Sends a control message of `kind` (ACCEPTED, KILL) and flushes it; whether it went out.
async fn send(stream: &mut Conn, kind: u8) -> bool {
    stream.write_all(&frame::header(kind, 0)).await.is_ok() && stream.flush().await.is_ok()
}

/// The next message other than a heartbeat; a peer silent for `idle` is lost.
async fn read_message(
    stream: &mut Conn,
    buf: &mut BytesMut,
    max: u32,
    idle: Duration,
) -> Result<(u8, BytesMut), ResponseError> {
    use tokio::io::AsyncReadExt;
    loop {
        match frame::decode(buf, max)? {
            Some((HEARTBEAT, _)) => continue,
            Some(m) => return Ok(m),
            None => {}
        }
        buf.reserve(4096);
        let n = tokio::time::timeout(idle, stream.read_buf(buf))
            .await
            .map_err(|_| ResponseError::lost(Cause::timeout(idle)))?
            .map_err(|e| ResponseError::lost(Cause::io(e)))?;
        if n == 0 {
            return Err(ResponseError::Disconnected(Disconnect::Closed));
        }
    }
}

/// A classic connection matched to its registration, before its prologue.
pub(crate) struct Incoming {
    stream: Conn,
    buf: BytesMut,
    max: u32,
    /// The liveness bound: a worker silent this long (no item, no heartbeat) is lost.
    idle: Duration,
    /// The plane's stop: the stream ends with it.
    plane_stop: CancellationToken,
    /// Where the stream's closer runs.
    tracker: TaskTracker,
}

/// How a classic stream ends when its frontend plane shuts down or aborts under it.
fn plane_stopped() -> ResponseError {
    ResponseError::lost(Cause::io(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the frontend's response plane shut down",
    )))
}

/// When the plane stops, tells the worker of `write`'s stream to stop (KILL, best effort) and
/// shuts its connection down both ways, whether or not the application still reads the
/// stream: a task on `tracker`, ended by the returned guard when the stream is dropped. It
/// holds the sending half weakly: a stream that ended cleanly (its half dropped) is left be.
fn close_on_stop(
    write: &Arc<ConnWrite>,
    plane_stop: CancellationToken,
    tracker: &TaskTracker,
) -> DropGuard {
    let write = Arc::downgrade(write);
    let done = CancellationToken::new();
    let ended = done.clone();
    tracker.spawn(async move {
        tokio::select! {
            () = plane_stop.cancelled() => {
                if let Some(write) = write.upgrade() {
                    write.try_send(&frame::header(KILL, 0));
                    write.shutdown_both();
                }
            }
            () = ended.cancelled() => {}
        }
    });
    done.drop_guard()
}

impl Incoming {
    /// Reads the prologue: the stream, or the worker's refusal.
    pub(crate) async fn prologue(mut self) -> Result<ClassicReader, ResponseError> {
        let read = read_message(&mut self.stream, &mut self.buf, self.max, self.idle);
        // Cancel safety: whichever wins, the connection is dropped or moves on whole.
        let (kind, body) = tokio::select! {
            r = read => r?,
            () = self.plane_stop.cancelled() => return Err(plane_stopped()),
        };
        if kind != PROLOGUE {
            return Err(ResponseError::Protocol(
                ProtocolViolation::ExpectedPrologue { kind },
            ));
        }
        prologue::decode(&body)?;
        let (read, write) = self
            .stream
            .into_split()
            .map_err(|e| ResponseError::lost(Cause::io(e)))?;
        let write = Arc::new(write);
        let closer = close_on_stop(&write, self.plane_stop.clone(), &self.tracker);
        Ok(ClassicReader {
            read,
            write: Some(write),
            buf: self.buf,
            max: self.max,
            ended: false,
            idle: self.idle,
            last_rx: Instant::now(),
            silence: Box::pin(tokio::time::sleep(self.idle)),
            plane_stop: Box::pin(self.plane_stop.cancelled_owned()),
            _closer: closer,
        })
    }
}

/// Reads one classic stream's items from its socket.
pub(crate) struct ClassicReader {
    read: ConnRead,
    /// Dropped (a FIN to the worker) once the stream ended cleanly: the worker's control
    /// watcher ends then, not when the application drops this stream.
    write: Option<Arc<ConnWrite>>,
    buf: BytesMut,
    max: u32,
    ended: bool,
    /// The liveness bound, and when a byte last arrived: a worker silent for `idle` (no
    /// item, no heartbeat) is lost, though its host still answers TCP.
    idle: Duration,
    last_rx: Instant,
    silence: Pin<Box<Sleep>>,
    /// The plane's stop: the stream ends with it.
    plane_stop: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Ends the stream's closer when the stream is dropped.
    _closer: DropGuard,
}

impl ClassicReader {
    /// The next item, `None` after the sentinel.
    pub(crate) fn poll_item(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, ResponseError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if self.plane_stop.as_mut().poll(cx).is_ready() {
            // The worker is told, then the connection closed both ways.
            self.kill();
            self.read.shutdown();
            return Poll::Ready(Some(Err(plane_stopped())));
        }
        loop {
            match frame::decode(&mut self.buf, self.max) {
                Err(e) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Ok(Some((DATA, item))) => return Poll::Ready(Some(Ok(item.freeze()))),
                Ok(Some((HEARTBEAT, _))) => continue,
                Ok(Some((SENTINEL, _))) => {
                    self.ended = true;
                    self.write = None;
                    if !self.buf.is_empty() {
                        return Poll::Ready(Some(Err(ResponseError::Protocol(
                            ProtocolViolation::DataAfterFinal,
                        ))));
                    }
                    return Poll::Ready(None);
                }
                Ok(Some((kind, _))) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(ResponseError::Protocol(
                        ProtocolViolation::UnexpectedMessage { kind },
                    ))));
                }
                Ok(None) => {}
            }
            if self.buf.capacity() - self.buf.len() < 1024 {
                self.buf.reserve(16 * 1024);
            }
            let read = tokio_util::io::poll_read_buf(Pin::new(&mut self.read), cx, &mut self.buf);
            let n = match ready!(self.unless_silent(read, cx)) {
                Ok(n) => n,
                Err(e) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(ResponseError::lost(Cause::io(e)))));
                }
            };
            if n == 0 {
                self.ended = true;
                return Poll::Ready(Some(Err(ResponseError::Disconnected(Disconnect::Closed))));
            }
            self.last_rx = Instant::now();
        }
    }

    /// `read`, or a timeout error once the worker has been silent for the liveness bound.
    fn unless_silent(
        &mut self,
        read: Poll<std::io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<usize>> {
        if read.is_ready() {
            return read;
        }
        let deadline = self.last_rx + self.idle;
        if self.silence.deadline() != deadline {
            self.silence.as_mut().reset(deadline);
        }
        ready!(self.silence.as_mut().poll(cx));
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the worker sent nothing for {:?}", self.idle),
        )))
    }

    /// Asks the worker to stop (best effort: a 5-byte write into an idle socket).
    pub(crate) fn stop(&self) {
        if let Some(write) = &self.write {
            write.try_send(&frame::header(STOP, 0));
        }
    }

    /// Tells the worker to stop now; the connection closes when the reader is dropped.
    pub(crate) fn kill(&mut self) {
        if !self.ended
            && let Some(write) = &self.write
        {
            write.try_send(&frame::header(KILL, 0));
        }
        self.ended = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a classic worker sends first: the handshake naming its stream.
    async fn name_stream(worker: &mut TcpStream, ticket: u64, token: &[u8; 16]) {
        let hello = serde_json::json!({ "stream": ticket, "token": crate::info::hex_token(token) })
            .to_string();
        worker
            .write_all(&frame::header(HANDSHAKE, hello.len()))
            .await
            .unwrap();
        worker.write_all(hello.as_bytes()).await.unwrap();
    }

    #[tokio::test]
    async fn accepted_sockets_give_up_on_a_vanished_worker_within_the_liveness_bound() {
        let registry = Arc::new(Registry::new());
        let bound = Duration::from_secs(9);
        let (tracker, addr) = (TaskTracker::new(), "127.0.0.1:0".parse().unwrap());
        let accept = Accept {
            registry: registry.clone(),
            max: 1 << 20,
            liveness: bound,
            tls: None,
            counters: Arc::default(),
            handshakes: HandshakeBudget::new(CLASSIC_HANDSHAKES, CLASSIC_HANDSHAKES_PER_SOURCE),
            stop: CancellationToken::new(),
            tracker: tracker.clone(),
        };
        let f = ClassicFrontend::bind(addr, accept, tracker).await.unwrap();
        let (ticket, token, rx) = registry.register().unwrap();
        let mut worker = TcpStream::connect(f.local_addr).await.unwrap();
        name_stream(&mut worker, ticket, &token).await;
        let arrival = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .unwrap()
            .unwrap();
        let Arrival::Classic(incoming) = arrival else {
            panic!("expected the classic connection");
        };
        let Conn::Plain(tcp) = &incoming.stream else {
            panic!("a plaintext connection");
        };
        crate::classic::socket::assert_liveness(tcp, bound);
        f.shutdown().await;
    }

    #[tokio::test]
    async fn a_source_past_its_handshake_budget_is_closed_at_once_and_another_still_gets_in() {
        let registry = Arc::new(Registry::new());
        let counters = Arc::new(PlaneCounters::default());
        let (tracker, addr) = (TaskTracker::new(), "127.0.0.1:0".parse().unwrap());
        let accept = Accept {
            registry: registry.clone(),
            max: 1 << 20,
            // A silent connection inside the budget waits this long for its name.
            liveness: Duration::from_secs(120),
            tls: None,
            counters: counters.clone(),
            handshakes: HandshakeBudget::new(3, 2),
            stop: CancellationToken::new(),
            tracker: tracker.clone(),
        };
        let f = ClassicFrontend::bind(addr, accept, tracker).await.unwrap();
        let from = |ip: [u8; 4]| {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::from((ip, 0))).unwrap();
            socket.connect(f.local_addr)
        };
        // Two silent connections from one address take its share.
        let _held = [
            from([127, 0, 0, 1]).await.unwrap(),
            from([127, 0, 0, 1]).await.unwrap(),
        ];
        // Its third is closed unread, long before any handshake deadline.
        let mut third = from([127, 0, 0, 1]).await.unwrap();
        let mut byte = [0u8; 1];
        let end = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::io::AsyncReadExt::read(&mut third, &mut byte),
        )
        .await
        .expect("the connection past the budget is closed, not kept waiting");
        assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
        // The accept loop counts the refusal before it closes the socket.
        assert_eq!(counters.snapshot().classic_handshakes_refused, 1);
        // Another address still names its stream and is served.
        let (ticket, token, rx) = registry.register().unwrap();
        let mut worker = from([127, 0, 0, 2]).await.unwrap();
        name_stream(&mut worker, ticket, &token).await;
        let arrival = tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .expect("the other address is served")
            .unwrap();
        assert!(matches!(arrival, Arrival::Classic(_)));
        f.shutdown().await;
    }
}
