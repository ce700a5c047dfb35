//! In-memory lanes for the `handshake` fuzz target: a listener that yields one raw lane per
//! connection in the input, each reading the connection's bytes in fixed-size reads and then
//! waiting until the run ends its transport, and writing into a buffer the checks read.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use velo_wire::{Frame, FrameDecoder, Hello};

use super::MAX_CONNECTIONS;
use crate::{LaneIo, LaneListener, LaneRead, LaneWrite, RawLane};

/// One connection of the input: its bytes and the size of each read.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    pub(crate) bytes: Bytes,
    pub(crate) read_size: usize,
}

impl Connection {
    /// The HELLO the frontend's handshake reader takes from these bytes, if any.
    pub(crate) fn hello(&self) -> Option<Hello> {
        let mut src = BytesMut::from(&self.bytes[..]);
        let mut decoder = FrameDecoder::new(crate::HANDSHAKE_MAX_FRAME);
        match decoder.decode(&mut src) {
            Ok(Some(Frame::Hello(hello))) => Some(hello),
            _ => None,
        }
    }
}

/// Splits the input into connections: each is a read size byte, a `u16` LE length, then that
/// many bytes (fewer if the input ends).
pub(crate) fn parse(mut data: &[u8]) -> Vec<Connection> {
    let mut connections = Vec::new();
    while connections.len() < MAX_CONNECTIONS {
        let [read_size, lo, hi, rest @ ..] = data else {
            break;
        };
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
        let (bytes, rest) = rest.split_at(len);
        connections.push(Connection {
            bytes: Bytes::copy_from_slice(bytes),
            read_size: usize::from(*read_size).max(1),
        });
        data = rest;
    }
    connections
}

/// Ends every lane's transport at once (reads return end of stream), and the listener.
#[derive(Clone, Default)]
pub(crate) struct End(Arc<Mutex<EndState>>);

#[derive(Default)]
struct EndState {
    fired: bool,
    wakers: Vec<Waker>,
}

impl End {
    pub(crate) fn fire(&self) {
        let mut st = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        st.fired = true;
        for w in st.wakers.drain(..) {
            w.wake();
        }
    }

    /// Ready once fired; otherwise registers `cx`'s waker.
    fn poll(&self, cx: &Context<'_>) -> Poll<()> {
        let mut st = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if st.fired {
            return Poll::Ready(());
        }
        st.wakers.push(cx.waker().clone());
        Poll::Pending
    }
}

/// What the frontend wrote on one lane.
pub(crate) type Output = Arc<Mutex<Vec<u8>>>;

/// Yields the connections' lanes, then waits for the end.
pub(crate) struct Listener {
    lanes: Vec<MemLane>,
    end: End,
}

impl Listener {
    pub(crate) fn new(connections: &[Connection], end: &End) -> (Self, Vec<Output>) {
        let outputs: Vec<Output> = connections.iter().map(|_| Output::default()).collect();
        let mut lanes: Vec<MemLane> = connections
            .iter()
            .zip(&outputs)
            .map(|(c, out)| MemLane {
                read: MemRead {
                    rest: c.bytes.clone(),
                    read_size: c.read_size,
                    end: end.clone(),
                },
                out: out.clone(),
            })
            .collect();
        lanes.reverse();
        let end = end.clone();
        (Self { lanes, end }, outputs)
    }
}

impl LaneListener for Listener {
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Box<dyn RawLane>>>> {
        if let Some(lane) = self.lanes.pop() {
            return Poll::Ready(Some(Ok(Box::new(lane))));
        }
        self.end.poll(cx).map(|()| None)
    }
}

/// One in-memory lane.
struct MemLane {
    read: MemRead,
    out: Output,
}

struct MemRead {
    rest: Bytes,
    read_size: usize,
    end: End,
}

struct MemWrite {
    out: Output,
}

impl LaneRead for MemRead {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        if self.rest.is_empty() {
            return self.end.poll(cx).map(|()| Ok(0));
        }
        let n = self.read_size.min(self.rest.len());
        buf.extend_from_slice(&self.rest.split_to(n));
        Poll::Ready(Ok(n))
    }
}

impl LaneWrite for MemWrite {
    fn poll_write(
        &mut self,
        _cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        for chunk in chunks.drain(..) {
            out.extend_from_slice(&chunk);
        }
        Poll::Ready(Ok(()))
    }

    fn poll_close(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl LaneRead for MemLane {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        self.read.poll_read(cx, buf)
    }
}

impl LaneWrite for MemLane {
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        MemWrite {
            out: self.out.clone(),
        }
        .poll_write(cx, chunks)
    }

    fn poll_close(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl RawLane for MemLane {
    fn into_io(self: Box<Self>) -> LaneIo {
        LaneIo {
            read: Box::new(self.read),
            write: Box::new(MemWrite { out: self.out }),
        }
    }
}
