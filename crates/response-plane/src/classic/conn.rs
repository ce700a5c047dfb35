//! A classic connection, plaintext or TLS (Dynamo's `DYN_TCP_TLS_*`), and its two halves.
//! Plaintext connections keep tokio's lock-free owned halves (the classic baseline is
//! measured as Dynamo runs it); TLS ones share the TLS state through `tokio::io::split`.

use std::io;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use velo_tls::tokio_rustls::TlsStream;

/// One classic connection.
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// Its receiving half.
pub(crate) enum ConnRead {
    Plain(OwnedReadHalf),
    Tls {
        half: ReadHalf<TlsStream<TcpStream>>,
        /// The socket, to shut it down from this half.
        socket: socket2::Socket,
    },
}

/// Its sending half. Dropping it closes the connection's sending side, TLS or not (a
/// plaintext half's drop is a FIN; a TLS half's a close_notify, then a FIN), so the peer sees
/// the end at once though the receiving half lives on.
pub(crate) enum ConnWrite {
    Plain(OwnedWriteHalf),
    Tls {
        /// Behind a lock only so a best-effort control write can go out from `&self`, as
        /// `OwnedWriteHalf::try_write` does for plaintext.
        half: Mutex<WriteHalf<TlsStream<TcpStream>>>,
        /// The socket, to shut its sending side down when the half is dropped.
        socket: socket2::Socket,
    },
}

impl Conn {
    /// The two halves.
    ///
    /// # Errors
    ///
    /// Duplicating a TLS connection's socket handle failed (out of file descriptors).
    pub(crate) fn into_split(self) -> io::Result<(ConnRead, ConnWrite)> {
        match self {
            Self::Plain(s) => {
                let (r, w) = s.into_split();
                Ok((ConnRead::Plain(r), ConnWrite::Plain(w)))
            }
            Self::Tls(s) => {
                let tcp = socket2::SockRef::from(s.get_ref().0);
                let (socket, write_socket) = (tcp.try_clone()?, tcp.try_clone()?);
                let (half, w) = tokio::io::split(*s);
                let write = ConnWrite::Tls {
                    half: Mutex::new(w),
                    socket: write_socket,
                };
                Ok((ConnRead::Tls { half, socket }, write))
            }
        }
    }
}

impl ConnRead {
    /// Shuts the whole connection down, both ways (the plane is stopping).
    pub(crate) fn shutdown(&self) {
        let r = match self {
            Self::Plain(r) => socket2::SockRef::from(r.as_ref()).shutdown(std::net::Shutdown::Both),
            Self::Tls { socket, .. } => socket.shutdown(std::net::Shutdown::Both),
        };
        if let Err(e) = r {
            tracing::debug!(error = %e, "shutting a classic connection down failed");
        }
    }
}

impl ConnWrite {
    /// Writes a few control bytes if the socket takes them at once, best effort: nothing
    /// waits, nothing is retried (a stop or kill the frontend sends to an idle socket).
    pub(crate) fn try_send(&self, bytes: &[u8]) {
        match self {
            Self::Plain(w) => {
                let _ = w.try_write(bytes);
            }
            Self::Tls { half, .. } => {
                let mut w = half.lock().unwrap_or_else(PoisonError::into_inner);
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let _ = Pin::new(&mut *w).poll_write(&mut cx, bytes);
                let _ = Pin::new(&mut *w).poll_flush(&mut cx);
            }
        }
    }

    /// Shuts the whole connection down, both ways (the plane is stopping), from this half.
    pub(crate) fn shutdown_both(&self) {
        let r = match self {
            Self::Plain(w) => socket2::SockRef::from(w.as_ref()).shutdown(std::net::Shutdown::Both),
            Self::Tls { socket, .. } => socket.shutdown(std::net::Shutdown::Both),
        };
        if let Err(e) = r
            && e.kind() != io::ErrorKind::NotConnected
        {
            tracing::debug!(error = %e, "shutting a classic connection down failed");
        }
    }

    /// The TCP stream under a plaintext half (tests check its options).
    #[cfg(test)]
    pub(crate) fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Self::Plain(w) => Some(w.as_ref()),
            Self::Tls { .. } => None,
        }
    }
}

impl Drop for ConnWrite {
    /// A TLS half: the close_notify if the socket takes it at once (nothing waits), then the
    /// FIN either way. The TLS stream is shared with the receiving half, which keeps the
    /// socket open: without this the peer would see nothing until that half is dropped too.
    /// (A plaintext half sends its FIN itself.)
    fn drop(&mut self) {
        let Self::Tls { half, socket } = self else {
            return;
        };
        let w = half.get_mut().unwrap_or_else(PoisonError::into_inner);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let _ = Pin::new(w).poll_shutdown(&mut cx);
        if let Err(e) = socket.shutdown(std::net::Shutdown::Write)
            && e.kind() != io::ErrorKind::NotConnected
        {
            tracing::debug!(error = %e, "closing a classic TLS connection's sending side failed");
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for ConnRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(r) => Pin::new(r).poll_read(cx, buf),
            Self::Tls { half, .. } => Pin::new(half).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ConnWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(w) => Pin::new(w).poll_write(cx, buf),
            Self::Tls { half, .. } => {
                let w = half.get_mut().unwrap_or_else(PoisonError::into_inner);
                Pin::new(w).poll_write(cx, buf)
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(w) => Pin::new(w).poll_flush(cx),
            Self::Tls { half, .. } => {
                let w = half.get_mut().unwrap_or_else(PoisonError::into_inner);
                Pin::new(w).poll_flush(cx)
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(w) => Pin::new(w).poll_shutdown(cx),
            Self::Tls { half, .. } => {
                let w = half.get_mut().unwrap_or_else(PoisonError::into_inner);
                Pin::new(w).poll_shutdown(cx)
            }
        }
    }
}
