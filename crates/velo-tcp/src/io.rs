//! A lane over one TCP stream: the whole stream for the handshake, then its two halves for
//! the lane's reader and writer. Writes are vectored and zero-copy (large payloads were
//! chained by the mux, not copied).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use velo_session::{LaneIo, LaneRead, LaneWrite, RawLane};

/// Most buffers passed to one `writev`.
const MAX_IOVECS: usize = 64;

/// A TCP connection before its handshake.
pub(crate) struct TcpLane(pub(crate) TcpStream);

struct TcpRead(OwnedReadHalf);

struct TcpWrite(OwnedWriteHalf);

impl LaneRead for TcpLane {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        read(Pin::new(&mut self.0), cx, buf)
    }
}

impl LaneWrite for TcpLane {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        write(Pin::new(&mut self.0), cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl RawLane for TcpLane {
    fn into_io(self: Box<Self>) -> LaneIo {
        let (read, write) = self.0.into_split();
        LaneIo {
            read: Box::new(TcpRead(read)),
            write: Box::new(TcpWrite(write)),
        }
    }
}

impl LaneRead for TcpRead {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        read(Pin::new(&mut self.0), cx, buf)
    }
}

impl LaneWrite for TcpWrite {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        write(Pin::new(&mut self.0), cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

fn read(
    r: Pin<&mut impl AsyncRead>,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    tokio_util::io::poll_read_buf(r, cx, buf)
}

/// Writes `chunks` with as few `writev` calls as the socket allows, removing what was written.
fn write(
    mut w: Pin<&mut impl AsyncWrite>,
    cx: &mut Context<'_>,
    chunks: &mut Vec<Bytes>,
) -> Poll<io::Result<()>> {
    while !chunks.is_empty() {
        let written = {
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let n = chunks.len().min(MAX_IOVECS);
            for (slot, chunk) in slices.iter_mut().zip(&chunks[..n]) {
                *slot = IoSlice::new(chunk);
            }
            ready!(w.as_mut().poll_write_vectored(cx, &slices[..n]))?
        };
        if written == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        consume(chunks, written);
    }
    Poll::Ready(Ok(()))
}

/// Removes `n` written bytes from the front of `chunks`.
fn consume(chunks: &mut Vec<Bytes>, mut n: usize) {
    let whole = chunks
        .iter()
        .take_while(|c| {
            let done = c.len() <= n;
            if done {
                n -= c.len();
            }
            done
        })
        .count();
    chunks.drain(..whole);
    if let Some(first) = chunks.first_mut() {
        first.advance(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_write_drops_whole_chunks_and_advances_the_next() {
        let mut chunks = vec![
            Bytes::from_static(b"abc"),
            Bytes::from_static(b"de"),
            Bytes::from_static(b"fgh"),
        ];
        consume(&mut chunks, 6);
        assert_eq!(chunks, vec![Bytes::from_static(b"gh")]);
        consume(&mut chunks, 2);
        assert!(chunks.is_empty());
    }
}
