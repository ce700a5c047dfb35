//! The one error type of this layer: every variant is the peer's fault (malformed input).

/// Why a byte string is not valid protocol v3.
///
/// Every variant describes malformed input from the peer; the codec never fails for local
/// reasons. A transport treats any of them as fatal for the lane the bytes arrived on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The handshake names a protocol version this build does not speak.
    #[error("unsupported protocol version {got}: this side speaks version {supported}")]
    UnsupportedVersion {
        /// The version the peer announced.
        got: u8,
        /// The only version this build speaks.
        supported: u8,
    },
    /// The handshake does not start with the magic bytes `VELO`.
    #[error(
        "bad handshake magic {got:02x?}: expected \"VELO\" (56 45 4c 4f); the peer does not speak the velo protocol"
    )]
    BadMagic {
        /// The four bytes received instead.
        got: [u8; 4],
    },
    /// A frame header names a kind this version does not define.
    #[error(
        "unknown frame kind {kind:#04x}: version 3 defines 0x01 hello, 0x02 batch, 0x03 close, 0x04 auth, 0x05 packed"
    )]
    UnknownFrame {
        /// The kind byte received.
        kind: u8,
    },
    /// A PACKED frame arrived, but this side never announced that it accepts them
    /// ([`CAP_PACKED`](crate::CAP_PACKED)), or it arrived during the handshake.
    #[error(
        "unexpected packed frame (0x05): this side did not announce capability bit 2 (packed batches) to the peer"
    )]
    UnexpectedPacked,
    /// A PACKED frame's LZ4 block does not unpack to the BATCH body its prefix announces.
    #[error("malformed packed frame: {reason}")]
    BadPacked {
        /// What was wrong with it.
        reason: &'static str,
    },
    /// A record inside a batch names a kind this version does not define.
    #[error("unknown record kind {kind:#04x}: version 3 defines 0x01..=0x0a")]
    UnknownRecord {
        /// The kind byte received.
        kind: u8,
    },
    /// A frame header announces a body longer than this side accepts.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge {
        /// The announced body length.
        len: u32,
        /// The configured maximum body length.
        max: u32,
    },
    /// A fixed-size frame body has the wrong length.
    #[error("{frame} frame body is {len} bytes: expected {expected}")]
    BadFrameLength {
        /// Which frame kind.
        frame: &'static str,
        /// The length received.
        len: u32,
        /// The length version 3 requires.
        expected: u32,
    },
    /// A record ends before its last field.
    #[error("truncated {record} record: its {field} runs past the end of the batch")]
    Truncated {
        /// The record kind being decoded.
        record: &'static str,
        /// The first field that did not fit.
        field: &'static str,
    },
    /// A batch frame carries no records.
    #[error("empty batch: a batch frame must carry at least one record")]
    EmptyBatch,
    /// A varint uses more bytes than the minimal encoding.
    #[error("non-canonical varint in {field}: version 3 requires the shortest encoding")]
    NonCanonicalVarint {
        /// The field being decoded.
        field: &'static str,
    },
    /// A varint does not fit its field's width.
    #[error("varint in {field} overflows {bits} bits")]
    VarintOverflow {
        /// The field being decoded.
        field: &'static str,
        /// The field's width in bits.
        bits: u32,
    },
    /// A text field is not valid UTF-8.
    #[error("{field} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field being decoded.
        field: &'static str,
    },
    /// A field holds a value version 3 forbids.
    #[error("invalid {field}: {reason}")]
    InvalidField {
        /// The field being decoded.
        field: &'static str,
        /// What is allowed.
        reason: &'static str,
    },
}

impl WireError {
    /// The close code a lane sends its peer before closing because of this error.
    pub fn close_code(&self) -> crate::CloseCode {
        match self {
            Self::UnsupportedVersion { .. } => crate::CloseCode::UNSUPPORTED_VERSION,
            Self::FrameTooLarge { .. } => crate::CloseCode::FRAME_TOO_LARGE,
            _ => crate::CloseCode::PROTOCOL_ERROR,
        }
    }
}
