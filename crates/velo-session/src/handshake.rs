//! The v3 HELLO/CLOSE exchange on a fresh lane, the same for every transport: the frontend's
//! side (read a HELLO, answer or refuse) and the worker's (send a HELLO, check the answer).

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use velo_mux::handshake::Expect;
use velo_wire::{Close, CloseCode, Frame, FrameDecoder, Hello, Role, WireError};

use crate::auth::{self, ClusterSecret};
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
    write_frames(lane, &[frame]).await
}

/// Sends frames in one write.
pub(crate) async fn write_frames(lane: &mut dyn RawLane, frames: &[Frame]) -> io::Result<()> {
    let mut out = BytesMut::with_capacity(256);
    for frame in frames {
        frame.encode(&mut out);
    }
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
    /// The cluster secret's exchange failed (this side sent a CLOSE saying why).
    Unauthenticated(&'static str),
    UnexpectedFrame,
    Eof,
}

impl From<ReadError> for DialHandshakeError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Io(e) => Self::Io(e),
            ReadError::Wire(e) => Self::Wire(e),
            ReadError::Eof => Self::Eof,
        }
    }
}

/// The worker's side: sends `hello` (with a challenge nonce when `secret` is set), reads the
/// answer and checks it with `expect`, then runs the secret's challenge-response. Returns
/// the frontend's HELLO and the bytes read past the handshake.
pub(crate) async fn dial_handshake(
    lane: &mut dyn RawLane,
    mut hello: Hello,
    expect: Expect,
    secret: Option<&ClusterSecret>,
) -> Result<(Hello, BytesMut), DialHandshakeError> {
    hello.auth_nonce = secret.map(|_| auth::nonce());
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    if let Err(e) = write_frame(lane, Frame::Hello(hello)).await {
        // A frontend refusing at a limit may close before it reads: its CLOSE says why.
        return Err(match read_frame(lane, &mut buf).await {
            Ok(Frame::Close(close)) => DialHandshakeError::Refused(close),
            _ => DialHandshakeError::Io(e),
        });
    }
    let answer = match read_frame(lane, &mut buf).await? {
        Frame::Hello(answer) => answer,
        Frame::Close(close) => return Err(DialHandshakeError::Refused(close)),
        Frame::Batch(_) | Frame::Auth(_) => return Err(DialHandshakeError::UnexpectedFrame),
    };
    expect
        .check(&answer)
        .map_err(DialHandshakeError::Handshake)?;
    match (secret, answer.auth_nonce) {
        (None, None) => {}
        (Some(secret), Some(_)) => prove(lane, &mut buf, secret, &hello, &answer).await?,
        (Some(_), None) => {
            let reason = "the frontend offers no proof of the cluster secret this worker holds";
            refuse(lane, CloseCode::UNAUTHENTICATED, reason).await;
            return Err(DialHandshakeError::Unauthenticated(reason));
        }
        (None, Some(_)) => {
            let reason = "the frontend asks for a cluster secret this worker does not hold";
            refuse(lane, CloseCode::UNAUTHENTICATED, reason).await;
            return Err(DialHandshakeError::Unauthenticated(reason));
        }
    }
    Ok((answer, buf))
}

/// The worker's half of the challenge-response: checks the frontend's proof (it holds the
/// secret), then sends this side's.
async fn prove(
    lane: &mut dyn RawLane,
    buf: &mut BytesMut,
    secret: &ClusterSecret,
    hello: &Hello,
    answer: &Hello,
) -> Result<(), DialHandshakeError> {
    let proof = match read_frame(lane, buf).await? {
        Frame::Auth(proof) => proof,
        Frame::Close(close) => return Err(DialHandshakeError::Refused(close)),
        Frame::Batch(_) | Frame::Hello(_) => return Err(DialHandshakeError::UnexpectedFrame),
    };
    if !secret.verify(Role::Frontend, hello, answer, &proof) {
        let reason = "the frontend's proof does not match this worker's cluster secret";
        refuse(lane, CloseCode::UNAUTHENTICATED, reason).await;
        return Err(DialHandshakeError::Unauthenticated(reason));
    }
    let mine = secret.proof(Role::Worker, hello, answer);
    write_frame(lane, Frame::Auth(mine))
        .await
        .map_err(DialHandshakeError::Io)
}
