//! Reading and writing handshake frames on a fresh connection.

use std::io;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use velo_wire::{Close, CloseCode, Frame, FrameDecoder, Hello, WireError};

/// Largest frame accepted before the handshake completes: a HELLO is 58 bytes and a CLOSE at
/// most 1 KiB, so a peer cannot make us buffer more than this before it has identified itself.
pub(crate) const HANDSHAKE_MAX_FRAME: u32 = velo_wire::MIN_MAX_FRAME_LEN;

/// What went wrong reading a handshake frame.
#[derive(Debug)]
pub(crate) enum ReadError {
    Io(io::Error),
    Wire(WireError),
    Eof,
}

/// Reads one frame; bytes past it stay in `buf`.
pub(crate) async fn read_frame(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
) -> Result<Frame, ReadError> {
    let mut decoder = FrameDecoder::new(HANDSHAKE_MAX_FRAME);
    loop {
        if let Some(frame) = decoder.decode(buf).map_err(ReadError::Wire)? {
            return Ok(frame);
        }
        buf.reserve(256);
        match stream.read_buf(buf).await {
            Ok(0) => return Err(ReadError::Eof),
            Ok(_) => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
}

pub(crate) async fn write_hello(stream: &mut TcpStream, hello: Hello) -> io::Result<()> {
    let mut out = Vec::with_capacity(64);
    Frame::Hello(hello).encode(&mut out);
    stream.write_all(&out).await
}

/// Sends a CLOSE frame and shuts the connection down, best effort (the peer may be gone).
pub(crate) async fn refuse(stream: &mut TcpStream, code: CloseCode, reason: &str) {
    let mut out = Vec::with_capacity(64 + reason.len());
    Frame::Close(Close::new(code, reason)).encode(&mut out);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        stream.write_all(&out).await?;
        stream.shutdown().await
    })
    .await;
}
