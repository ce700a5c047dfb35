//! Reading and writing handshake frames on a fresh lane (the same frames as over TCP).

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use velo_wire::{Close, CloseCode, Frame, FrameDecoder, Hello, WireError};

use crate::lane::Lane;

/// Largest frame accepted before the handshake completes: a HELLO is 58 bytes and a CLOSE at
/// most 1 KiB, so a peer cannot make us buffer more than this before it has identified itself.
pub(crate) const HANDSHAKE_MAX_FRAME: u32 = velo_wire::MIN_MAX_FRAME_LEN;

/// Bound on sending a refusal (CLOSE frame, then the lane's orderly end).
const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);

/// What went wrong reading a handshake frame.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The lane failed (UCX endpoint error: unreachable, rejected, reset).
    Io(io::Error),
    Wire(WireError),
    Eof,
}

/// Reads one frame; bytes past it stay in `buf`.
pub(crate) async fn read_frame(lane: &mut Lane, buf: &mut BytesMut) -> Result<Frame, ReadError> {
    let mut decoder = FrameDecoder::new(HANDSHAKE_MAX_FRAME);
    loop {
        if let Some(frame) = decoder.decode(buf).map_err(ReadError::Wire)? {
            return Ok(frame);
        }
        match lane.read(buf).await {
            Ok(0) => return Err(ReadError::Eof),
            Ok(_) => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
}

pub(crate) async fn write_hello(lane: &mut Lane, hello: Hello) -> io::Result<()> {
    let mut out = Vec::with_capacity(64);
    Frame::Hello(hello).encode(&mut out);
    lane.write(&mut vec![Bytes::from(out)]).await
}

/// Sends a CLOSE frame and ends the lane, best effort (the peer may be gone).
pub(crate) async fn refuse(lane: &mut Lane, code: CloseCode, reason: &str) {
    let mut out = Vec::with_capacity(64 + reason.len());
    Frame::Close(Close::new(code, reason)).encode(&mut out);
    let sent = tokio::time::timeout(REFUSE_TIMEOUT, async {
        lane.write(&mut vec![Bytes::from(out)]).await?;
        lane.close().await
    })
    .await;
    if !matches!(sent, Ok(Ok(()))) {
        tracing::debug!(?code, "could not deliver a handshake refusal");
    }
}
