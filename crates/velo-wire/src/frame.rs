//! Frames and the two-phase frame decoder.

use bytes::{Buf, BufMut, BytesMut};

use crate::{Auth, Batch, Close, Hello, WireError, hello::HELLO_BODY_LEN};

/// Length of every frame header: a kind byte and a `u32` little-endian body length.
pub const FRAME_HEADER_LEN: usize = 5;

/// The kinds of frame version 3 defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// [`Hello`], the lane handshake.
    Hello,
    /// [`Batch`], records of many streams.
    Batch,
    /// [`Close`], the lane's last words.
    Close,
    /// [`Auth`], a proof of the cluster secret during the handshake.
    Auth,
    /// A BATCH body compressed with LZ4 ([`Packer`](crate::Packer)); it decodes to
    /// [`Frame::Batch`]. Only to a peer whose HELLO announced [`CAP_PACKED`](crate::CAP_PACKED).
    Packed,
}

impl FrameKind {
    /// The kind byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            Self::Hello => 0x01,
            Self::Batch => 0x02,
            Self::Close => 0x03,
            Self::Auth => 0x04,
            Self::Packed => 0x05,
        }
    }

    fn from_byte(b: u8) -> Result<Self, WireError> {
        match b {
            0x01 => Ok(Self::Hello),
            0x02 => Ok(Self::Batch),
            0x03 => Ok(Self::Close),
            0x04 => Ok(Self::Auth),
            0x05 => Ok(Self::Packed),
            kind => Err(WireError::UnknownFrame { kind }),
        }
    }
}

/// Writes a frame header for a body of `body_len` bytes.
#[inline]
pub fn frame_header(kind: FrameKind, body_len: u32) -> [u8; FRAME_HEADER_LEN] {
    let l = body_len.to_le_bytes();
    [kind.to_byte(), l[0], l[1], l[2], l[3]]
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The lane handshake.
    Hello(Hello),
    /// Records of many streams.
    Batch(Batch),
    /// The lane's last words.
    Close(Close),
    /// A proof of the cluster secret (handshake only).
    Auth(Auth),
}

impl Frame {
    /// Appends the frame (header and body) to `dst`.
    ///
    /// # Panics
    ///
    /// If the body is 4 GiB or longer.
    pub fn encode(&self, dst: &mut impl BufMut) {
        let body_len = u32::try_from(self.encoded_len() - FRAME_HEADER_LEN)
            .expect("frame bodies are capped far below 4 GiB");
        match self {
            Self::Hello(h) => {
                dst.put_slice(&frame_header(FrameKind::Hello, body_len));
                h.encode_body(dst);
            }
            Self::Batch(b) => {
                dst.put_slice(&frame_header(FrameKind::Batch, body_len));
                b.encode_body(dst);
            }
            Self::Close(c) => {
                dst.put_slice(&frame_header(FrameKind::Close, body_len));
                c.encode_body(dst);
            }
            Self::Auth(a) => {
                dst.put_slice(&frame_header(FrameKind::Auth, body_len));
                a.encode_body(dst);
            }
        }
    }

    /// Length of the frame's encoding (header and body), in bytes.
    pub fn encoded_len(&self) -> usize {
        FRAME_HEADER_LEN
            + match self {
                Self::Hello(h) => h.body_len(),
                Self::Batch(b) => b.body().len(),
                Self::Close(c) => c.body_len(),
                Self::Auth(_) => crate::auth::AUTH_MAC_LEN,
            }
    }
}

/// Decodes frames from a byte stream, header first, then body.
///
/// It follows the `tokio_util::codec::Decoder` contract: `Ok(None)` asks for more bytes,
/// `Err` means the stream is corrupt and must be closed. A body length is checked against
/// `max_frame_len` before any memory is reserved for it.
#[derive(Debug)]
pub struct FrameDecoder {
    max_frame_len: u32,
    /// PACKED frames are accepted (this side announced [`CAP_PACKED`](crate::CAP_PACKED)).
    packed: bool,
    state: DecodeState,
}

#[derive(Debug, Clone, Copy)]
enum DecodeState {
    Head,
    Body { kind: FrameKind, len: usize },
}

impl FrameDecoder {
    /// A decoder refusing frames whose body exceeds `max_frame_len` bytes.
    pub fn new(max_frame_len: u32) -> Self {
        Self {
            max_frame_len,
            packed: false,
            state: DecodeState::Head,
        }
    }

    /// Accepts PACKED frames from now on: this side announced
    /// [`CAP_PACKED`](crate::CAP_PACKED) in its HELLO. Without it a PACKED frame is
    /// [`WireError::UnexpectedPacked`]. A PACKED frame's unpacked body is held to
    /// `max_frame_len` like a BATCH's.
    pub fn accept_packed(&mut self) {
        self.packed = true;
    }

    /// The largest body this decoder accepts.
    pub fn max_frame_len(&self) -> u32 {
        self.max_frame_len
    }

    /// Decodes the next frame from the front of `src`.
    ///
    /// # Errors
    ///
    /// Any [`WireError`] about the frame header or a HELLO/CLOSE body. Batch records are
    /// checked later, while iterating [`Batch::records`].
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        let (kind, len) = match self.state {
            DecodeState::Head => match self.decode_head(src)? {
                Some(head) => head,
                None => return Ok(None),
            },
            DecodeState::Body { kind, len } => (kind, len),
        };
        if src.len() < len {
            self.state = DecodeState::Body { kind, len };
            return Ok(None);
        }
        self.state = DecodeState::Head;
        let body = src.split_to(len);
        // Room for the next header, so the next read lands contiguously.
        src.reserve(FRAME_HEADER_LEN);
        let frame = match kind {
            FrameKind::Batch => Frame::Batch(Batch::new(body.freeze())?),
            FrameKind::Hello => Frame::Hello(Hello::decode_body(&body)?),
            FrameKind::Close => Frame::Close(Close::decode_body(&body)?),
            FrameKind::Auth => Frame::Auth(Auth::decode_body(&body)?),
            FrameKind::Packed => Frame::Batch(Batch::new(crate::packed::unpack(
                &body,
                self.max_frame_len,
            )?)?),
        };
        Ok(Some(frame))
    }

    fn decode_head(&mut self, src: &mut BytesMut) -> Result<Option<(FrameKind, usize)>, WireError> {
        let Some(head) = src.first_chunk::<FRAME_HEADER_LEN>() else {
            // Kind errors are reported as soon as the first byte arrives.
            if let Some(&k) = src.first() {
                FrameKind::from_byte(k)?;
            }
            return Ok(None);
        };
        let kind = FrameKind::from_byte(head[0])?;
        if kind == FrameKind::Packed && !self.packed {
            return Err(WireError::UnexpectedPacked);
        }
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        if len > self.max_frame_len {
            return Err(WireError::FrameTooLarge {
                len,
                max: self.max_frame_len,
            });
        }
        if kind == FrameKind::Hello && len < 5 {
            // Too short to even carry magic and version: nothing more to wait for.
            return Err(WireError::BadFrameLength {
                frame: "hello",
                len,
                expected: HELLO_BODY_LEN,
            });
        }
        let len = usize::try_from(len).map_err(|_| WireError::FrameTooLarge {
            len,
            max: self.max_frame_len,
        })?;
        src.advance(FRAME_HEADER_LEN);
        // The length is validated: reserve the body plus the next header in one go.
        src.reserve(len + FRAME_HEADER_LEN);
        Ok(Some((kind, len)))
    }
}
