//! What a transport provides: a raw byte lane (one connection, before and after its
//! handshake), a listener that yields them, and a dialer that opens them.
//!
//! Every lane operation is poll-based, as tokio's `AsyncRead`/`AsyncWrite` are: no future is
//! boxed per socket read or write. Writes take owned [`Bytes`] chunks rather than slices so a
//! transport that hands buffers to a NIC (UCX) keeps them alive without copying.

use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use tokio::sync::OwnedSemaphorePermit;

/// The receiving half of a lane.
pub trait LaneRead: Send + 'static {
    /// Reads more bytes into `buf` (appending). `Ready(Ok(0))` at a clean end of stream.
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>>;
}

/// The sending half of a lane.
pub trait LaneWrite: Send + 'static {
    /// Writes the chunks of `chunks`, in order, in as few calls as the transport allows
    /// (vectored writes), removing what was written from its front (a chunk written in part
    /// is advanced). `Ready(Ok(()))` once `chunks` is empty.
    fn poll_write(&mut self, cx: &mut Context<'_>, chunks: &mut Vec<Bytes>)
    -> Poll<io::Result<()>>;

    /// Ends the lane from this side after the last write (TCP: shutdown of the write half).
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// One connection of a transport, both ways, as it comes from a [`LaneListener`] or a
/// [`Dialer`]: velo-session runs the handshake on it, then splits it for the lane's pumps.
pub trait RawLane: LaneRead + LaneWrite {
    /// The two halves, for the lane's reader and writer tasks.
    fn into_io(self: Box<Self>) -> LaneIo;

    /// Completes the transport's own handshake (TLS) on a lane a [`LaneListener`] yielded,
    /// before any velo frame. The accept loop polls it under its own deadline
    /// ([`AcceptSettings::establish_timeout`](crate::AcceptSettings)), in the lane's task,
    /// never in the accept loop. The default has nothing to do.
    ///
    /// # Errors
    ///
    /// [`EstablishError`]; after [`EstablishError::WrongProtocol`] the lane's writes still
    /// reach the peer, so it can be told why in a CLOSE frame.
    fn poll_establish(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), EstablishError>> {
        Poll::Ready(Ok(()))
    }

    /// The peer's address, when the transport knows it: its IP address is the unit of the
    /// per-source handshake budget ([`AcceptSettings::max_handshakes_per_source`](crate::AcceptSettings)).
    fn peer_addr(&self) -> Option<SocketAddr> {
        None
    }
}

/// The reason of the plaintext CLOSE (`bad_handshake`) a TLS listener answers a plaintext
/// velo HELLO with: one text, so a worker can tell this refusal from any other.
pub const TLS_REQUIRED_REASON: &str =
    "this frontend requires TLS; the worker sent a plaintext HELLO";

/// Why a transport's own handshake failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EstablishError {
    /// The peer speaks another protocol than this lane expects (plaintext velo to a TLS
    /// listener); the lane can still carry a plaintext CLOSE saying so.
    #[error("{0}")]
    WrongProtocol(&'static str),
    /// The handshake failed (a TLS alert, a certificate refused, the connection lost).
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Yields the raw lanes peers open to a frontend.
pub trait LaneListener: Send + 'static {
    /// The next lane a peer opened, or an accept error (counted; the accept loop goes on
    /// after a short pause); `Ready(None)` once the listener is gone for good.
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Box<dyn RawLane>>>>;
}

/// Opens raw lanes to a frontend (a worker's side of a transport). Any function of the
/// address returning a future of the lane is one: `move |addr| dial(cfg.clone(), addr)`.
pub trait Dialer: Send + Sync + 'static {
    /// Connects one lane to `addr`. Connecting is rare (once per lane per frontend), so a
    /// boxed future is fine here.
    fn dial(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Box<dyn RawLane>>>;
}

impl<F, Fut> Dialer for F
where
    F: Fn(SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = io::Result<Box<dyn RawLane>>> + Send + 'static,
{
    fn dial(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Box<dyn RawLane>>> {
        Box::pin(self(addr))
    }
}

/// A lane's two halves.
pub struct LaneIo {
    /// Reads from the peer.
    pub read: Box<dyn LaneRead>,
    /// Writes to the peer.
    pub write: Box<dyn LaneWrite>,
}

impl std::fmt::Debug for LaneIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LaneIo { .. }")
    }
}

/// Reads `lane` once (see [`LaneRead::poll_read`]). Cancel safe: nothing is read if dropped.
pub(crate) async fn read<R: LaneRead + ?Sized>(
    lane: &mut R,
    buf: &mut BytesMut,
) -> io::Result<usize> {
    poll_fn(|cx| lane.poll_read(cx, buf)).await
}

/// Writes every chunk (see [`LaneWrite::poll_write`]).
pub(crate) async fn write<W: LaneWrite + ?Sized>(
    lane: &mut W,
    chunks: &mut Vec<Bytes>,
) -> io::Result<()> {
    poll_fn(|cx| lane.poll_write(cx, chunks)).await
}

/// Completes the transport's handshake (see [`RawLane::poll_establish`]).
pub(crate) async fn establish<L: RawLane + ?Sized>(lane: &mut L) -> Result<(), EstablishError> {
    poll_fn(|cx| lane.poll_establish(cx)).await
}

/// Ends the lane from this side (see [`LaneWrite::poll_close`]).
pub(crate) async fn close<W: LaneWrite + ?Sized>(lane: &mut W) -> io::Result<()> {
    poll_fn(|cx| lane.poll_close(cx)).await
}

/// A lane's reader after its handshake: first the bytes read past the handshake frame, then
/// the transport's; it holds the lane's connection slot (frontend) for as long as it reads.
pub(crate) struct HandshakenRead {
    pub(crate) leftover: BytesMut,
    pub(crate) inner: Box<dyn LaneRead>,
    pub(crate) _slot: Option<OwnedSemaphorePermit>,
}

impl LaneRead for HandshakenRead {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        if self.leftover.is_empty() {
            return self.inner.poll_read(cx, buf);
        }
        let n = self.leftover.len();
        if buf.is_empty() {
            std::mem::swap(buf, &mut self.leftover);
        } else {
            buf.extend_from_slice(&self.leftover);
            self.leftover.clear();
        }
        Poll::Ready(Ok(n))
    }
}

/// Splits a handshaken lane, keeping `leftover` and `slot` with its reader.
pub(crate) fn handshaken(
    lane: Box<dyn RawLane>,
    leftover: BytesMut,
    slot: Option<OwnedSemaphorePermit>,
) -> LaneIo {
    let LaneIo { read, write } = lane.into_io();
    LaneIo {
        read: Box::new(HandshakenRead {
            leftover,
            inner: read,
            _slot: slot,
        }),
        write,
    }
}
