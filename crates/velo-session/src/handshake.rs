//! The v3 HELLO/CLOSE exchange on a fresh lane, the same for every transport: the frontend's
//! side (read a HELLO, answer or refuse) and the worker's (send a HELLO, check the answer).

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use velo_mux::handshake::Expect;
use velo_wire::{Close, CloseCode, Frame, FrameDecoder, Hello, WireError};

use crate::io::{self as lane_io, RawLane};

/// Largest frame accepted before the handshake completes: a HELLO is 58 bytes and a CLOSE at
/// most 1 KiB, so a peer cannot make us buffer more than this before it has identified itself.
pub const HANDSHAKE_MAX_FRAME: u32 = velo_wire::MIN_MAX_FRAME_LEN;

/// Bound on delivering a refusal (a CLOSE frame, then the lane's orderly end): a peer that
/// does not read gets no more of our time than this.
pub const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Bytes read at a time during the handshake.
const READ_CHUNK: usize = 256;

/// What went wrong reading a handshake frame.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The transport failed.
    Io(io::Error),
    /// The bytes are not a valid frame (or too large for a handshake).
    Wire(WireError),
    /// The peer ended the lane before a whole frame.
    Eof,
}

/// Reads one frame; bytes past it stay in `buf`.
pub(crate) async fn read_frame(
    lane: &mut dyn RawLane,
    buf: &mut BytesMut,
) -> Result<Frame, ReadError> {
    let mut decoder = FrameDecoder::new(HANDSHAKE_MAX_FRAME);
    loop {
        if let Some(frame) = decoder.decode(buf).map_err(ReadError::Wire)? {
            return Ok(frame);
        }
        buf.reserve(READ_CHUNK);
        match lane_io::read(lane, buf).await {
            Ok(0) => return Err(ReadError::Eof),
            Ok(_) => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
}

/// Sends one frame.
pub(crate) async fn write_frame(lane: &mut dyn RawLane, frame: Frame) -> io::Result<()> {
    let mut out = BytesMut::with_capacity(64);
    frame.encode(&mut out);
    lane_io::write(lane, &mut vec![Bytes::from(out)]).await
}

/// Sends a CLOSE frame and ends the lane, best effort (the peer may be gone) and bounded by
/// [`REFUSE_TIMEOUT`].
pub(crate) async fn refuse(lane: &mut dyn RawLane, code: CloseCode, reason: &str) {
    let sent = tokio::time::timeout(REFUSE_TIMEOUT, async {
        write_frame(lane, Frame::Close(Close::new(code, reason))).await?;
        lane_io::close(lane).await
    })
    .await;
    if !matches!(sent, Ok(Ok(()))) {
        tracing::debug!(%code, "could not deliver a handshake refusal");
    }
}

/// Why a worker's side of the handshake failed, before the session names the frontend.
#[derive(Debug)]
pub(crate) enum DialHandshakeError {
    Io(io::Error),
    Wire(WireError),
    Refused(Close),
    Handshake(velo_mux::handshake::HandshakeError),
    UnexpectedFrame,
    Eof,
}

/// The worker's side: sends `hello`, reads the answer and checks it with `expect`. Returns
/// the frontend's HELLO and the bytes read past it.
pub(crate) async fn dial_handshake(
    lane: &mut dyn RawLane,
    hello: Hello,
    expect: Expect,
) -> Result<(Hello, BytesMut), DialHandshakeError> {
    write_frame(lane, Frame::Hello(hello))
        .await
        .map_err(DialHandshakeError::Io)?;
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let frame = read_frame(lane, &mut buf).await.map_err(|e| match e {
        ReadError::Io(e) => DialHandshakeError::Io(e),
        ReadError::Wire(e) => DialHandshakeError::Wire(e),
        ReadError::Eof => DialHandshakeError::Eof,
    })?;
    match frame {
        Frame::Hello(answer) => {
            expect
                .check(&answer)
                .map_err(DialHandshakeError::Handshake)?;
            Ok((answer, buf))
        }
        Frame::Close(close) => Err(DialHandshakeError::Refused(close)),
        Frame::Batch(_) => Err(DialHandshakeError::UnexpectedFrame),
    }
}
