//! The request plane's TLS, with the response plane's material and the TCP roles inverted
//! (see the parent module's docs, "TLS"): the frontend, which connects, is the TLS server;
//! the worker, which accepts, is the TLS client. [`frontend_open`] and [`worker_open`] run
//! one side's whole handshake, TLS first when on and then the secret's ([`super::auth`])
//! inside it, under one bound, and return the connection requests then flow on: a [`Link`].
//!
//! A mismatch is told apart at the first byte each side reads, never waited out: a TLS
//! frontend peeks the worker's first byte (a ClientHello record starts with
//! [`TLS_HANDSHAKE_RECORD`], a plaintext greeting with `v`) and answers a plaintext worker
//! with a greeting that says TLS is required; a plaintext frontend reads the worker's
//! ClientHello where a greeting should be; a TLS worker reads the plaintext frontend's
//! greeting where a TLS record should be.
//!
//! [`watch`] follows a certificate rotation: a running side rereads its files when they
//! change, so new connections use them.

pub(crate) mod watch;

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use velo_tls::TLS_HANDSHAKE_RECORD;

use super::auth::{
    self, GREETING_LEN, HANDSHAKE_TIMEOUT, HandshakeError, MAGIC, RequestAuth, Side,
};

/// What a request-plane connection is once its handshake is done: a TCP stream, or a TLS
/// session over one.
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A connection past its handshake. Boxed: the indirection costs a call per request frame
/// read or written (not per token), and keeps one type for plaintext and TLS.
pub(crate) type Link = Box<dyn Io>;

/// The largest TLS record a peer may send (2^14 bytes of plaintext, plus what encryption
/// adds): how much a plaintext frontend reads of a worker's ClientHello at most.
const MAX_RECORD: u64 = (1 << 14) + 2048;

/// The frontend's side of a fresh connection: TLS (as the server) when `auth` has it, then
/// the secret's handshake inside it; all within [`HANDSHAKE_TIMEOUT`]. Sends nothing of a
/// request: on `Ok`, the worker proved itself.
pub(crate) async fn frontend_open(
    stream: TcpStream,
    auth: &RequestAuth,
) -> Result<Link, HandshakeError> {
    auth::bounded(Side::Worker, HANDSHAKE_TIMEOUT, async {
        let mut link = frontend_tls(stream, auth).await?;
        auth::frontend(&mut link, auth).await?;
        Ok(link)
    })
    .await
}

/// The worker's side of an accepted connection from `peer`: TLS (as the client, naming the
/// frontend by `DYN_TCP_TLS_SERVER_NAME`, else by `peer`, the connection's source IP: not a
/// dialed address, as on the response plane) when `auth` has it, then the secret's
/// handshake inside it; all within [`HANDSHAKE_TIMEOUT`]. Reads no request byte: on `Ok`, the
/// frontend proved itself.
pub(crate) async fn worker_open(
    stream: TcpStream,
    peer: IpAddr,
    auth: &RequestAuth,
) -> Result<Link, HandshakeError> {
    auth::bounded(Side::Frontend, HANDSHAKE_TIMEOUT, async {
        let mut link = worker_tls(stream, peer, auth).await?;
        auth::worker(&mut link, auth).await?;
        Ok(link)
    })
    .await
}

async fn frontend_tls(stream: TcpStream, auth: &RequestAuth) -> Result<Link, HandshakeError> {
    let peer = Side::Worker;
    let Some(tls) = auth.frontend_tls() else {
        return Ok(Box::new(stream));
    };
    let mut first = [0u8; 1];
    let read = stream
        .peek(&mut first)
        .await
        .map_err(|source| HandshakeError::Io { peer, source })?;
    match first {
        _ if read == 0 => Err(HandshakeError::Closed {
            peer,
            awaiting: "TLS handshake",
        }),
        [TLS_HANDSHAKE_RECORD] => {
            let bound = tls.handshake_timeout().min(HANDSHAKE_TIMEOUT);
            match tokio::time::timeout(bound, tls.acceptor().accept(stream)).await {
                Ok(Ok(session)) => Ok(Box::new(session)),
                Ok(Err(source)) => Err(HandshakeError::Tls { peer, source }),
                Err(_) => Err(HandshakeError::Timeout { peer, bound }),
            }
        }
        [b] if b == MAGIC[0] => {
            tell_tls_required(stream).await;
            Err(HandshakeError::PeerLacksTls { peer })
        }
        _ => Err(HandshakeError::NotAGreeting { peer }),
    }
}

/// Best effort: reads a plaintext worker's greeting (so closing resets nothing it has yet to
/// read), answers with a greeting saying TLS is required, and closes.
async fn tell_tls_required(mut stream: TcpStream) {
    let mut theirs = [0u8; GREETING_LEN];
    if stream.read_exact(&mut theirs).await.is_err() {
        return;
    }
    let told = stream.write_all(&auth::tls_required_greeting()).await;
    if told.is_err() || stream.shutdown().await.is_err() {
        tracing::debug!("the plaintext worker is already gone");
    }
}

async fn worker_tls(
    stream: TcpStream,
    peer_ip: IpAddr,
    auth: &RequestAuth,
) -> Result<Link, HandshakeError> {
    let peer = Side::Frontend;
    let Some(tls) = auth.worker_tls() else {
        return Ok(Box::new(stream));
    };
    let bound = tls.handshake_timeout().min(HANDSHAKE_TIMEOUT);
    let connect = tls
        .connector()
        .connect(tls.server_name(peer_ip), FirstByte::new(stream))
        .into_fallible();
    match tokio::time::timeout(bound, connect).await {
        Ok(Ok(session)) => Ok(Box::new(session)),
        Ok(Err((_, stream))) if stream.first == Some(MAGIC[0]) => {
            Err(HandshakeError::PeerLacksTls { peer })
        }
        Ok(Err((source, _))) => Err(HandshakeError::Tls { peer, source }),
        Err(_) => Err(HandshakeError::Timeout { peer, bound }),
    }
}

/// Reads the rest of a TLS record whose first byte was read: its header, then at most
/// [`MAX_RECORD`] bytes of body. Best effort; the caller bounds it in time.
pub(super) async fn drain_record<S: AsyncRead + Unpin>(stream: &mut S) {
    let mut header = [0u8; 4];
    if stream.read_exact(&mut header).await.is_err() {
        return;
    }
    let len = u64::from(u16::from_be_bytes([header[2], header[3]])).min(MAX_RECORD);
    let mut body = stream.take(len);
    if tokio::io::copy(&mut body, &mut tokio::io::sink())
        .await
        .is_err()
    {
        tracing::debug!("the TLS worker is already gone");
    }
}

/// A stream that remembers the first byte read from it: what a worker's failed TLS
/// handshake read where a record should start.
struct FirstByte<S> {
    inner: S,
    first: Option<u8>,
}

impl<S> FirstByte<S> {
    fn new(inner: S) -> Self {
        Self { inner, first: None }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FirstByte<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        if self.first.is_none() {
            self.first = buf.filled().get(before).copied();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FirstByte<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
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
}

#[cfg(test)]
mod tests;
