//! A lane over a tokio byte stream (a TCP connection, TLS over one, a Unix socket): the whole
//! stream for the handshake, then its two halves for the lane's reader and writer. Writes are
//! vectored and zero-copy (large payloads were chained by the mux, not copied).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::{LaneIo, LaneRead, LaneWrite, RawLane};

/// Most buffers passed to one vectored write.
const MAX_IOVECS: usize = 64;

/// A byte stream `S` as a [`RawLane`], split by `split` into its read half `R` and write half
/// `W` once the handshake is done (`TcpStream::into_split` for TCP; `tokio::io::split` for a
/// stream without owned halves).
pub struct StreamLane<S, R, W> {
    stream: S,
    split: fn(S) -> (R, W),
    peer: Option<std::net::SocketAddr>,
}

impl<S, R, W> StreamLane<S, R, W> {
    /// `stream` as a lane, to be split by `split`.
    pub fn new(stream: S, split: fn(S) -> (R, W)) -> Self {
        Self {
            stream,
            split,
            peer: None,
        }
    }

    /// The same lane, reporting `peer` as the peer's address (see [`RawLane::peer_addr`]).
    pub fn with_peer(mut self, peer: Option<std::net::SocketAddr>) -> Self {
        self.peer = peer;
        self
    }
}

impl<S, R, W> LaneRead for StreamLane<S, R, W>
where
    S: AsyncRead + Unpin + Send + 'static,
    R: 'static,
    W: 'static,
{
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, buf)
    }
}

impl<S, R, W> LaneWrite for StreamLane<S, R, W>
where
    S: AsyncWrite + Unpin + Send + 'static,
    R: 'static,
    W: 'static,
{
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        poll_write_chunks(Pin::new(&mut self.stream), cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl<S, R, W> RawLane for StreamLane<S, R, W>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.peer
    }

    fn into_io(self: Box<Self>) -> LaneIo {
        let (read, write) = (self.split)(self.stream);
        LaneIo {
            read: Box::new(ReadHalf(read)),
            write: Box::new(WriteHalf(write)),
        }
    }
}

struct ReadHalf<R>(R);

struct WriteHalf<W>(W);

impl<R: AsyncRead + Unpin + Send + 'static> LaneRead for ReadHalf<R> {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_read_buf(Pin::new(&mut self.0), cx, buf)
    }
}

impl<W: AsyncWrite + Unpin + Send + 'static> LaneWrite for WriteHalf<W> {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        poll_write_chunks(Pin::new(&mut self.0), cx, chunks)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Writes `chunks` to `w` with as few vectored writes as it allows, removing what was written
/// (see [`LaneWrite::poll_write`]): the write half of any byte-stream lane.
///
/// # Errors
///
/// `w`'s, or [`io::ErrorKind::WriteZero`] when it takes nothing.
pub fn poll_write_chunks(
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

    #[tokio::test]
    async fn more_chunks_than_one_vectored_write_takes_arrive_whole_and_in_order_after_the_split() {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let lane: Box<dyn RawLane> = Box::new(StreamLane::new(ours, tokio::io::split));
        let LaneIo { mut write, .. } = lane.into_io();
        let mut peer: Box<dyn RawLane> = Box::new(StreamLane::new(theirs, tokio::io::split));
        let mut chunks: Vec<Bytes> = (0..u32::try_from(3 * MAX_IOVECS).unwrap())
            .map(|i| Bytes::from(i.to_le_bytes().to_vec()))
            .collect();
        let expected: Vec<u8> = chunks.iter().flatten().copied().collect();
        crate::io::write(&mut *write, &mut chunks).await.unwrap();
        assert!(chunks.is_empty());
        let mut got = BytesMut::new();
        while got.len() < expected.len() {
            let n = crate::io::read(&mut *peer, &mut got).await.unwrap();
            assert_ne!(n, 0, "the stream ended early");
        }
        assert_eq!(&got[..], &expected[..]);
    }
}
