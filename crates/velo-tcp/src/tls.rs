//! TLS lanes: the frontend tells a TLS client from a plaintext velo worker by its first byte
//! (a plaintext worker is answered with a plaintext CLOSE saying TLS is required), runs the
//! TLS handshake in the lane's own task under velo-session's deadline, and then the lane is
//! the TLS stream's two halves. A worker connects under the TLS handshake timeout and
//! recognises a plaintext frontend's CLOSE in place of a TLS answer.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use velo_session::{EstablishError, LaneIo, LaneRead, LaneWrite, RawLane};
use velo_tls::tokio_rustls::{Accept, TlsAcceptor, TlsStream};
use velo_tls::{ClientTls, TLS_HANDSHAKE_RECORD};
use velo_wire::FrameKind;

use velo_session::poll_write_chunks as write;

/// A TCP lane carrying TLS.
pub(crate) struct TlsLane {
    state: State,
    peer: Option<SocketAddr>,
}

enum State {
    /// Frontend: waiting for the first byte, to tell TLS from plaintext velo.
    Sniffing {
        stream: TcpStream,
        acceptor: TlsAcceptor,
    },
    /// Frontend: the TLS handshake.
    Accepting(Box<Accept<Sniffed>>),
    /// The handshake is done.
    Open(Box<TlsStream<Sniffed>>),
    /// A plaintext velo peer on a TLS listener: writes go out in plaintext, so it can be
    /// told why it is refused.
    Plain(TcpStream),
    /// The handshake failed; the lane is good for nothing.
    Failed,
}

impl TlsLane {
    /// A connection a TLS listener accepted; [`RawLane::poll_establish`] runs its handshake.
    pub(crate) fn accepting(stream: TcpStream, acceptor: TlsAcceptor) -> Self {
        let peer = stream.peer_addr().ok();
        Self {
            state: State::Sniffing { stream, acceptor },
            peer,
        }
    }

    fn poll_sniff(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), EstablishError>> {
        let State::Sniffing { stream, .. } = &mut self.state else {
            return Poll::Ready(Ok(()));
        };
        let mut first = [0u8; 1];
        let mut buf = ReadBuf::new(&mut first);
        ready!(stream.poll_peek(cx, &mut buf))?;
        let first = buf.filled().first().copied();
        let State::Sniffing { stream, acceptor } =
            std::mem::replace(&mut self.state, State::Failed)
        else {
            return Poll::Ready(Ok(()));
        };
        match first {
            Some(TLS_HANDSHAKE_RECORD) => {
                let sniffed = Sniffed::new(stream, None);
                self.state = State::Accepting(Box::new(acceptor.accept(sniffed)));
                Poll::Ready(Ok(()))
            }
            Some(b) if b == FrameKind::Hello.to_byte() => {
                self.state = State::Plain(stream);
                Poll::Ready(Err(EstablishError::WrongProtocol(
                    velo_session::TLS_REQUIRED_REASON,
                )))
            }
            Some(b) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a TLS handshake: first byte {b:#04x}"),
            )
            .into())),
            None => Poll::Ready(Err(io::Error::from(io::ErrorKind::UnexpectedEof).into())),
        }
    }
}

impl RawLane for TlsLane {
    fn poll_establish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), EstablishError>> {
        ready!(self.poll_sniff(cx))?;
        let State::Accepting(accept) = &mut self.state else {
            return Poll::Ready(Ok(()));
        };
        match ready!(Pin::new(accept.as_mut()).poll(cx)) {
            Ok(stream) => {
                self.state = State::Open(Box::new(TlsStream::Server(stream)));
                Poll::Ready(Ok(()))
            }
            Err(e) => {
                self.state = State::Failed;
                Poll::Ready(Err(e.into()))
            }
        }
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    fn into_io(self: Box<Self>) -> LaneIo {
        match self.state {
            State::Open(stream) => {
                let (r, w) = tokio::io::split(*stream);
                LaneIo {
                    read: Box::new(TlsRead(r)),
                    write: Box::new(TlsWrite(w)),
                }
            }
            // velo-session splits a lane only once its handshake succeeded.
            _ => LaneIo {
                read: Box::new(Broken),
                write: Box::new(Broken),
            },
        }
    }
}

impl LaneRead for TlsLane {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        match &mut self.state {
            State::Open(s) => read(Pin::new(s.as_mut()), cx, buf),
            State::Plain(s) => read(Pin::new(s), cx, buf),
            _ => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
}

impl LaneWrite for TlsLane {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Open(s) => write_flushed(Pin::new(s.as_mut()), cx, chunks),
            // Before TLS (a refusal at a limit) or instead of it: a plaintext CLOSE.
            State::Sniffing { stream: s, .. } | State::Plain(s) => write(Pin::new(s), cx, chunks),
            _ => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Open(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            State::Sniffing { stream: s, .. } | State::Plain(s) => Pin::new(s).poll_shutdown(cx),
            _ => Poll::Ready(Ok(())),
        }
    }
}

/// Connects TLS over `stream` (dialed to `addr`) under the configured handshake timeout.
///
/// # Errors
///
/// The handshake's failure; a plaintext frontend is named as such.
pub(crate) async fn connect(
    stream: TcpStream,
    addr: SocketAddr,
    tls: &ClientTls,
) -> io::Result<TlsLane> {
    let first = Arc::new(Mutex::new(Vec::new()));
    let sniffed = Sniffed::new(stream, Some(first.clone()));
    let connect = tls.connector().connect(tls.server_name(addr.ip()), sniffed);
    let timeout = tls.handshake_timeout();
    let stream = match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            let first = std::mem::take(&mut *first.lock().unwrap_or_else(PoisonError::into_inner));
            return Err(match plaintext_close(first) {
                Some(detail) => io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    velo_tls::PlaintextAnswer { detail },
                ),
                None => io::Error::new(e.kind(), format!("TLS handshake failed: {e}")),
            });
        }
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TLS handshake within {timeout:?}"),
            ));
        }
    };
    Ok(TlsLane {
        state: State::Open(Box::new(TlsStream::Client(stream))),
        peer: Some(addr),
    })
}

/// Reads `r` into `buf` (appending).
fn read(
    r: Pin<&mut impl AsyncRead>,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    tokio_util::io::poll_read_buf(r, cx, buf)
}

/// Writes every chunk, then flushes the TLS records they became: a TLS stream may keep
/// encrypted bytes buffered that a plain socket would have sent.
fn write_flushed(
    mut w: Pin<&mut impl AsyncWrite>,
    cx: &mut Context<'_>,
    chunks: &mut Vec<Bytes>,
) -> Poll<io::Result<()>> {
    ready!(write(w.as_mut(), cx, chunks))?;
    w.poll_flush(cx)
}

/// What a plaintext CLOSE frame at the start of `bytes` says, if it is one: the frontend
/// refused the connection before TLS (it has no TLS, or it is at a limit).
fn plaintext_close(bytes: Vec<u8>) -> Option<String> {
    if bytes.first() != Some(&FrameKind::Close.to_byte()) {
        return None;
    }
    let mut src = BytesMut::from(&bytes[..]);
    let detail = match velo_wire::FrameDecoder::new(velo_wire::MIN_MAX_FRAME_LEN).decode(&mut src) {
        Ok(Some(velo_wire::Frame::Close(c))) => format!("({}): {}", c.code, c.reason),
        _ => "(unreadable)".to_owned(),
    };
    Some(format!(
        "the frontend answered the TLS handshake with a plaintext velo CLOSE {detail}; a \
         frontend without TLS answers so too"
    ))
}

/// Bytes of a stream's first read kept by [`Sniffed`]: a frame header and the longest CLOSE.
const SNIFF_LEN: usize = velo_wire::FRAME_HEADER_LEN + 2 + velo_wire::MAX_CLOSE_REASON_LEN;

/// A TCP stream that keeps the start of its first read (how a worker reads a plaintext
/// frontend's CLOSE after its TLS handshake failed on it).
pub(crate) struct Sniffed {
    inner: TcpStream,
    first: Option<Arc<Mutex<Vec<u8>>>>,
}

impl Sniffed {
    fn new(inner: TcpStream, first: Option<Arc<Mutex<Vec<u8>>>>) -> Self {
        Self { inner, first }
    }
}

impl AsyncRead for Sniffed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let read = buf.filled().get(before..).unwrap_or_default();
        if !read.is_empty()
            && let Some(first) = self.first.take()
        {
            let kept = read.get(..SNIFF_LEN).unwrap_or(read);
            first
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(kept);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Sniffed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

struct TlsRead(ReadHalf<TlsStream<Sniffed>>);

struct TlsWrite(WriteHalf<TlsStream<Sniffed>>);

impl LaneRead for TlsRead {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        read(Pin::new(&mut self.0), cx, buf)
    }
}

impl LaneWrite for TlsWrite {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        write_flushed(Pin::new(&mut self.0), cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The halves of a lane whose handshake failed.
struct Broken;

impl LaneRead for Broken {
    fn poll_read(&mut self, _: &mut Context<'_>, _: &mut BytesMut) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::NotConnected.into()))
    }
}

impl LaneWrite for Broken {
    fn poll_write(&mut self, _: &mut Context<'_>, _: &mut Vec<Bytes>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(io::ErrorKind::NotConnected.into()))
    }

    fn poll_close(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
