//! The velo response plane's multiplexer: many response streams between one worker process
//! and one frontend, over a set of lanes, as a sans-IO state machine.
//!
//! # Layer contract
//!
//! This crate decides *what* goes on the wire and *when*; it never does I/O. It reads no
//! clock (every call takes `now`), opens no socket, spawns nothing and never imports tokio.
//! Bytes come in through [`Mux::handle_input`], batches leave through [`Mux::poll_transmit`],
//! and everything the driver must act on comes out of [`Mux::poll_event`]. The TCP and UCX
//! drivers are thin loops around it (see `velo-session`), which is why the hard logic here is
//! tested deterministically with virtual time (the `testing` module, behind the `test-util`
//! feature).
//!
//! # What it does
//!
//! - **Streams** are opened by the worker ([`Mux::open`], carrying the prologue), fed with
//!   [`Mux::send`] and ended with [`Mux::finish`] or [`Mux::reset`]; the frontend reads them
//!   with [`Mux::recv`] and may [`Mux::stop`] or [`Mux::cancel`] them. Each stream ends
//!   exactly once on each side. Stream ids carry a generation; records for a stale
//!   generation are dropped and counted ([`MuxStats::stale_drops`]).
//! - **Lanes**: a stream is placed on the least-loaded lane and stays there. A failed lane
//!   ends only its own streams, each told once.
//! - **Credits**: each stream may have `window` DATA records (32 by default) unconsumed; the
//!   terminal record has its own reserved credit, so a full window never wedges a finish.
//!   Grants go back in batches (half a window at a time, or riding on a batch that is sent
//!   anyway). A send without credit is refused with [`Blocked::Credit`] and the application
//!   waits for [`MuxEvent::Writable`]: backpressure, not failure.
//! - **Batching**: records of all streams of a lane share a batch, flushed by the
//!   [`FlushPolicy`]: a maximum delay (5 ms default, 0 greedy), size caps, or the
//!   application's [`Mux::flush_hint`] (once per engine forward pass).
//! - **Liveness**: a lane that hears nothing for the idle timeout is closed; heartbeats go at
//!   the head of the next batch, never behind queued data.
//!
//! # Bounds
//!
//! | bound | setting | at the bound |
//! |---|---|---|
//! | streams per connection | `max_streams` (65,536) | worker: [`OpenError::TooManyStreams`]; frontend: the OPEN is refused with CANCEL |
//! | OPENs a lane holds unanswered by the application (frontend) | `max_pending_opens` (4,096) | the OPEN is refused with CANCEL `too_many_streams` before any stream state is kept, counted `pending_opens_refused` and as churn |
//! | control bytes queued per lane (ACCEPT, CANCEL, CREDIT, STOP, HEARTBEAT, GOAWAY; both sides) | `max_control_bytes` (1 MiB) | input pauses at half of it ([`Mux::wants_input`]); input that queues past it (one frame) closes the lane, CLOSE `limit` ([`LaneError::ControlQueueFull`]) |
//! | items buffered per stream (frontend) | `window` (32) + the last item | the worker is out of credit and waits; more is a protocol violation of that stream |
//! | bytes queued per lane (both sides) | `max_buffered_bytes` (4 MiB) | sends and large OPENs wait ([`Blocked::Lane`], [`OpenError::LaneFull`]); records under [`CHAIN_THRESHOLD`] that end or open a stream are always taken (at most one of each per stream); the driver stops reading input ([`Mux::wants_input`]), which could queue refusals |
//! | a write in progress | `idle_timeout` (10 s) | the lane closes ([`LaneError::WriteStalled`]) |
//! | silence from the peer | `idle_timeout` (10 s) | the lane closes ([`LaneError::IdleTimeout`]) |
//! | peer's heartbeat demand | a HELLO's idle timeout within 100 ms..=1 h | the lane is refused ([`handshake::HandshakeError::IdleTimeout`]) |
//! | frontend slot table per lane | 1 KiB page per 64 worker slots in use, plus 8 B per page up to the highest | pages are freed with their last stream |
//! | bytes a queued item keeps alive (frontend) | items under [`COPY_BELOW`] (16 KiB) are copied out of the receive buffer into their stream's own buffer ([`ItemQueue`]: the buffer's length is at most twice its unread bytes and its capacity at most twice that; [`ITEM_BUFFER_KEEP`] (4 KiB) once emptied), and so are those of at most a quarter of their batch's body; the others pin at most 4 times their size, whatever the frame | a consumer that stops reading costs its items' bytes, not the buffers they arrived in |
//! | receive queues kept for reuse (frontend) | [`SPARE_QUEUES`] (256) of at most [`SPARE_QUEUE_ITEMS`] (64) items and [`ITEM_BUFFER_KEEP`] bytes: 1.1 MiB | a released stream's queue is dropped instead of kept |
//! | a stream's prologue (both sides) | `max_prologue_len` (64 KiB); a frontend keeps a copy, not the frame it came in | worker: [`OpenError::PrologueTooLarge`]; frontend: the OPEN is refused with CANCEL `protocol_error`, counted as churn |
//! | streams refused, reset or killed for a protocol violation before their first item, per connection (frontend) | `churn_limit` (a burst of 1,024, then 256/s) | the lane that went past it closes with CLOSE `churn_limit` ([`LaneError::ChurnLimit`]) |
//! | frame size | `max_frame_len` (32 MiB) | larger incoming frames close the lane; larger items are refused ([`SendError::TooLarge`]) |
//! | batch size | [`FlushPolicy`] (64 KiB, 1,024 records) | the batch is sealed and a new one starts |
//! | events | one pending event of each kind per stream, plus one `LostBeforeAccept` per stream a lane's loss ended unseen (at most `max_streams` from each loss) | - |
//!
//! # Example
//!
//! ```
//! use std::time::Instant;
//! use velo_mux::testing::Pair;
//! use velo_mux::{Recv, MuxEvent};
//!
//! let mut pair = Pair::new(velo_mux::testing::default_configs());
//! let (stream, _) = pair.open_stream(b"{\"error\":null}");
//! pair.worker_send(stream, b"token 1");
//! pair.worker_finish(stream, b"");
//! pair.drive();
//! let got = pair.frontend_read_all();
//! assert_eq!(got.len(), 1);
//! ```

mod caps;
mod churn;
mod config;
mod error;
mod event;
pub mod flush;
pub mod handshake;
mod input;
mod items;
mod lane;
mod mux;
mod recv;
mod send;
mod slab;
mod spare;
pub mod state;
mod stats;
mod stream;
mod wire_table;

#[cfg(feature = "test-util")]
pub mod testing;

#[cfg(feature = "__fuzz")]
#[doc(hidden)]
pub mod fuzzing;

pub use churn::{ChurnLimit, DEFAULT_CHURN_LIMIT};
pub use config::{
    Compression, ConfigError, DEFAULT_GRANT_DELAY, DEFAULT_IDLE_TIMEOUT, DEFAULT_LANES,
    DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_CONTROL_BYTES, DEFAULT_MAX_PENDING_OPENS,
    DEFAULT_MAX_PROLOGUE_LEN, DEFAULT_MAX_STREAMS, DEFAULT_WINDOW, MuxConfig, MuxConfigBuilder,
    Side,
};
pub use error::{Blocked, CloseReason, LaneError, OpenError, SendError, TransportEnd};
pub use event::MuxEvent;
pub use flush::{FlushPolicy, FlushReason};
pub use input::COPY_BELOW;
pub use items::{ITEM_BUFFER_FIRST, ITEM_BUFFER_KEEP, ItemQueue};
pub use lane::{LaneId, LaneState};
pub use mux::{CHAIN_THRESHOLD, LaneSet, MAX_TRANSMIT_CHUNKS, Mux, Transmit};
pub use recv::Recv;
pub use send::{ANNOUNCEMENTS, RESET_DROPPED};
pub use slab::Key as StreamKey;
pub use spare::{SPARE_QUEUE_ITEMS, SPARE_QUEUES};
pub use stats::{BATCH_RECORDS_BUCKETS, Counter, MuxStats};

/// How a stream ended, as either side sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamEnd {
    /// The worker finished the stream cleanly (FINAL).
    #[error("finished")]
    Finished,
    /// The worker ended the stream with an error (ERROR), as the frontend sees it.
    #[error("worker ended the stream with error {code}: {message}")]
    Error {
        /// Application-defined code.
        code: velo_wire::ErrorCode,
        /// The worker's message.
        message: String,
    },
    /// The worker ended the stream with an error, as the worker sees it.
    #[error("reset by this side with code {0}")]
    Reset(velo_wire::ErrorCode),
    /// The frontend cancelled (or refused) the stream.
    #[error("cancelled ({0})")]
    Cancelled(velo_wire::CancelCode),
    /// The stream's lane failed before the stream ended.
    #[error("lane lost: {0}")]
    Lost(LaneError),
    /// The worker broke a protocol rule on this stream.
    #[error("protocol violation: {0}")]
    Violation(&'static str),
}

impl StreamEnd {
    /// Worker: whether this side ended the stream itself (FINAL or ERROR sent), rather than
    /// the frontend or the lane.
    pub fn is_own(&self) -> bool {
        matches!(self, Self::Finished | Self::Reset(_))
    }
}
