//! One lane's halves over a TCP stream.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::OwnedSemaphorePermit;
use velo_session::{LaneIo, LaneRead, LaneWrite};

/// Most buffers passed to one `writev`.
const MAX_IOVECS: usize = 64;

/// Splits a handshaken stream into lane halves. `leftover` holds bytes read past the
/// handshake; `permit` (frontend) holds a connection slot for as long as the lane reads.
pub(crate) fn lane_io(
    stream: TcpStream,
    leftover: BytesMut,
    permit: Option<OwnedSemaphorePermit>,
) -> LaneIo {
    let (read, write) = stream.into_split();
    LaneIo {
        read: Box::new(TcpRead {
            read,
            leftover,
            _permit: permit,
        }),
        write: Box::new(TcpWrite { write }),
    }
}

struct TcpRead {
    read: OwnedReadHalf,
    leftover: BytesMut,
    _permit: Option<OwnedSemaphorePermit>,
}

impl LaneRead for TcpRead {
    fn read<'a>(
        &'a mut self,
        buf: &'a mut BytesMut,
    ) -> Pin<Box<dyn Future<Output = io::Result<usize>> + Send + 'a>> {
        Box::pin(async move {
            if !self.leftover.is_empty() {
                let n = self.leftover.len();
                buf.extend_from_slice(&self.leftover);
                self.leftover.clear();
                return Ok(n);
            }
            // Cancel safe: `read_buf` reads nothing if dropped before completing.
            self.read.read_buf(buf).await
        })
    }
}

struct TcpWrite {
    write: OwnedWriteHalf,
}

impl LaneWrite for TcpWrite {
    fn write<'a>(
        &'a mut self,
        chunks: &'a mut Vec<Bytes>,
    ) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>> {
        Box::pin(write_all_vectored(&mut self.write, chunks))
    }

    fn close<'a>(&'a mut self) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>> {
        Box::pin(self.write.shutdown())
    }
}

/// Writes every chunk in order with as few `writev` calls as the socket allows, then clears
/// `chunks`. Large payloads were chained by the mux, not copied, so this is zero-copy.
pub(crate) async fn write_all_vectored(
    w: &mut OwnedWriteHalf,
    chunks: &mut Vec<Bytes>,
) -> io::Result<()> {
    let mut first = 0;
    while first < chunks.len() {
        let written = {
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let n = chunks.len().saturating_sub(first).min(MAX_IOVECS);
            for (slot, chunk) in slices.iter_mut().zip(&chunks[first..first + n]) {
                *slot = IoSlice::new(chunk);
            }
            w.write_vectored(&slices[..n]).await?
        };
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut left = written;
        while left > 0 {
            let chunk = &mut chunks[first];
            if left >= chunk.len() {
                left -= chunk.len();
                first += 1;
            } else {
                chunk.advance(left);
                left = 0;
            }
        }
    }
    chunks.clear();
    Ok(())
}
