//! Lanes spoken by hand: a peer of another version, garbage, a silent or half-open peer, a
//! frontend that answers wrongly.

use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use velo_wire::{Close, Frame, FrameDecoder, Hello, InstanceId, Role};

use super::within;
use crate::RawLane;

/// A lane a story reads and writes by hand.
pub trait RawPeer: Send + 'static {
    /// Writes all of `bytes`.
    fn write(&mut self, bytes: &[u8]) -> impl Future<Output = io::Result<()>> + Send;

    /// Reads more bytes into `buf` (appending); `Ok(0)` at the peer's orderly end. Cancel
    /// safe: nothing is lost if the future is dropped before it completes.
    fn read(&mut self, buf: &mut BytesMut) -> impl Future<Output = io::Result<usize>> + Send;
}

/// A listener for raw lanes (a frontend played by hand).
pub trait RawListener: Send + 'static {
    /// The lanes it yields.
    type Lane: RawPeer;

    /// Where it listens.
    fn addr(&self) -> SocketAddr;

    /// The next lane a peer opened; `None` once the listener is gone.
    fn accept(&mut self) -> impl Future<Output = Option<Self::Lane>> + Send;
}

/// A byte stream (a TCP connection, an in-memory pipe) as a [`RawPeer`].
#[derive(Debug)]
pub struct IoLane<S>(pub S);

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> RawPeer for IoLane<S> {
    async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes).await
    }

    async fn read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.0.read_buf(buf).await
    }
}

/// A transport's raw lane, before any handshake.
impl RawPeer for Box<dyn RawLane> {
    async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut chunks = vec![Bytes::copy_from_slice(bytes)];
        poll_fn(|cx| self.poll_write(cx, &mut chunks)).await
    }

    async fn read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        poll_fn(|cx| self.poll_read(cx, buf)).await
    }
}

/// A worker's HELLO for lane 0 of a one-lane connection to frontend `frontend`.
pub fn worker_hello(frontend: InstanceId) -> Hello {
    Hello {
        role: Role::Worker,
        lane_index: 0,
        lane_count: 1,
        instance_id: InstanceId::from_u128(77),
        peer_instance_id: frontend,
        max_frame_len: 1 << 20,
        initial_window: 32,
        idle_timeout_ms: 10_000,
        capabilities: 0,
        auth_nonce: None,
        worker_instance: None,
    }
}

/// `hello` encoded, with its version byte overwritten by `version`.
pub fn hello_bytes(hello: &Hello, version: u8) -> Vec<u8> {
    let mut bytes = Vec::new();
    Frame::Hello(*hello).encode(&mut bytes);
    bytes[VERSION_OFFSET] = version;
    bytes
}

/// The next frame from `lane`; `None` once the lane ends (or fails) first.
///
/// # Panics
///
/// If the bytes are not a frame, or nothing arrives within the bound.
pub async fn read_frame(lane: &mut impl RawPeer) -> Option<Frame> {
    let mut buf = BytesMut::new();
    let mut decoder = FrameDecoder::new(velo_wire::MIN_MAX_FRAME_LEN);
    loop {
        if let Some(frame) = decoder.decode(&mut buf).expect("a valid frame") {
            return Some(frame);
        }
        let n = within("a frame", lane.read(&mut buf)).await.ok()?;
        if n == 0 {
            return None;
        }
    }
}

/// The CLOSE frame `lane` sends, past any other frames (a lane's heartbeats).
///
/// # Panics
///
/// If the lane ends first, or sends bytes that are not frames.
pub async fn read_close(lane: &mut impl RawPeer) -> Close {
    let mut buf = BytesMut::new();
    let mut decoder = FrameDecoder::new(velo_wire::MIN_MAX_FRAME_LEN);
    loop {
        while let Some(frame) = decoder.decode(&mut buf).expect("a valid frame") {
            if let Frame::Close(c) = frame {
                return c;
            }
        }
        let n = within("a CLOSE frame", lane.read(&mut buf)).await;
        assert!(
            n.as_ref().is_ok_and(|n| *n > 0),
            "the lane ended without a CLOSE frame: {n:?}"
        );
    }
}

/// Where a HELLO frame's version byte is: after the frame header (5 bytes) and the magic (4).
const VERSION_OFFSET: usize = 9;
