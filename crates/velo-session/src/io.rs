//! What a transport provides for one lane: a way to read bytes and a way to write chunks.

use std::future::Future;
use std::io;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};

/// The receiving half of a lane.
pub trait LaneRead: Send + 'static {
    /// Reads more bytes into `buf` (appending). Returns 0 at a clean end of stream.
    ///
    /// Must be cancel safe: if the future is dropped, no bytes are lost.
    fn read<'a>(
        &'a mut self,
        buf: &'a mut BytesMut,
    ) -> Pin<Box<dyn Future<Output = io::Result<usize>> + Send + 'a>>;
}

/// The sending half of a lane.
pub trait LaneWrite: Send + 'static {
    /// Writes every chunk, in order, in as few calls as the transport allows (vectored writes),
    /// then clears `chunks`.
    fn write<'a>(
        &'a mut self,
        chunks: &'a mut Vec<Bytes>,
    ) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>>;

    /// Ends the lane from this side after the last write (TCP: shutdown of the write half).
    fn close<'a>(&'a mut self) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>>;
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
