//! Velo protocol v3 on the wire: frames and records, encoded and decoded without I/O.
//!
//! This crate is the bottom layer of velo-rs. It turns bytes into [`Frame`]s and records back
//! into bytes, and nothing else: it never touches a socket, reads a clock, spawns a task or
//! imports tokio. The byte layout is specified in `docs/protocol.md`; a test parses that
//! document's hex examples and checks them against this code.
//!
//! # What it promises
//!
//! - **Peer input is never trusted.** Decoding any byte string returns a value or a
//!   [`WireError`] naming what was wrong; it never panics. A frame's length is checked against
//!   the configured maximum before any memory is reserved for it.
//! - **No copies on receive.** Payloads are [`bytes::Bytes`] slices of the received buffer.
//! - **One encoding per value.** Varints must be minimal, so a decoded frame re-encodes to the
//!   exact bytes it came from (the fuzz target checks this).
//!
//! # Example
//!
//! ```
//! use bytes::{Bytes, BytesMut};
//! use velo_wire::{Batch, Frame, FrameDecoder, Record, StreamId};
//!
//! let stream = StreamId::new(7, 1);
//! let batch = Batch::from_records(&[
//!     Record::Data { stream, seq: 0, payload: Bytes::from_static(b"hello") },
//!     Record::Final { stream, seq: 1, payload: Bytes::new() },
//! ]);
//! let mut wire = BytesMut::new();
//! Frame::Batch(batch).encode(&mut wire);
//!
//! let mut decoder = FrameDecoder::new(velo_wire::DEFAULT_MAX_FRAME_LEN);
//! let Some(Frame::Batch(got)) = decoder.decode(&mut wire)? else { panic!("one batch") };
//! let records: Vec<Record> = got.records().collect::<Result<_, _>>()?;
//! assert_eq!(records.len(), 2);
//! # Ok::<(), velo_wire::WireError>(())
//! ```

mod auth;
mod batch;
mod close;
mod codes;
mod error;
mod frame;
mod hello;
mod ids;
mod packed;
mod record;
mod varint;

#[cfg(any(fuzzing, feature = "__fuzz"))]
#[doc(hidden)]
pub mod fuzzing;

pub use auth::{AUTH_MAC_LEN, Auth};
pub use batch::{Batch, RecordView, RecordViews, Records};
pub use close::{Close, MAX_CLOSE_REASON_LEN};
pub use codes::{CancelCode, CloseCode, ErrorCode, GoAwayCode};
pub use error::WireError;
pub use frame::{FRAME_HEADER_LEN, Frame, FrameDecoder, FrameKind, frame_header};
pub use hello::{
    AUTH_NONCE_LEN, CAP_AUTH, CAP_PACKED, CAP_WORKER_INSTANCE, HELLO_BODY_LEN, Hello, MAX_LANES,
};
pub use ids::{InstanceId, Role, StreamId, Token};
pub use packed::{MIN_PACK_LEN, PACKED_PREFIX_LEN, Packer};
pub use record::{
    DataKind, MAX_DATA_HEADER_LEN, Record, data_header_len, encode_data_header, encode_open,
    open_len,
};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u8 = 3;

/// The four bytes every HELLO body starts with.
pub const MAGIC: [u8; 4] = *b"VELO";

/// Default largest frame body, in bytes: 32 MiB, Dynamo's `DYN_TCP_MAX_MESSAGE_SIZE` default.
pub const DEFAULT_MAX_FRAME_LEN: u32 = 32 * 1024 * 1024;

/// Smallest `max_frame_len` a peer may announce, in bytes: enough for a HELLO, a CLOSE and
/// small records, so limits can be tight without making the protocol unusable.
pub const MIN_MAX_FRAME_LEN: u32 = 4096;
