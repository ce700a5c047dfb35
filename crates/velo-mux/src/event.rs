//! What the mux tells its driver.

use bytes::Bytes;
use velo_wire::Token;

use crate::{CloseReason, LaneError, LaneId, StreamKey};

/// Something the driver must act on, drained with [`Mux::poll_event`](crate::Mux::poll_event).
///
/// The queue is bounded by the number of streams: each stream has at most one pending event of
/// each kind (a `Readable` is not repeated until the stream's queue was drained), plus one
/// `LostBeforeAccept` for each stream a lane's loss ended before the frontend took it (those
/// streams have left the table; at most `max_streams` from each loss).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MuxEvent {
    /// Frontend: the worker opened a stream. The driver checks `ticket` and `token` against its
    /// registrations and either hands the stream to its consumer or refuses it with
    /// [`Mux::cancel`](crate::Mux::cancel) and [`CancelCode::REFUSED`](velo_wire::CancelCode).
    Opened {
        /// The new stream.
        stream: StreamKey,
        /// The registration key from the stream's address.
        ticket: u64,
        /// The secret from the stream's address.
        token: Token,
        /// The prologue (JSON bytes).
        prologue: Bytes,
    },
    /// Frontend: items or the stream's end can be read with [`Mux::recv`](crate::Mux::recv).
    Readable(StreamKey),
    /// Worker: a stream that was refused for lack of credit has credit again.
    Writable(StreamKey),
    /// Worker: the frontend asked this stream to finish soon (graceful stop).
    StopRequested(StreamKey),
    /// Worker: the stream was ended by the frontend or its lane. Sent at most once per stream:
    /// for a stream the worker finished or reset itself, only when that end was not
    /// delivered (the lane failed, or the frontend refused the stream, before it accepted
    /// it; see [`Mux::end_delivery`](crate::Mux::end_delivery)).
    Closed {
        /// The stream.
        stream: StreamKey,
        /// What ended it.
        reason: CloseReason,
    },
    /// Worker: the frontend took the stream (ACCEPT): from now on it reports the stream's end
    /// to its reader, so an end this side sends is delivered
    /// ([`Mux::end_delivery`](crate::Mux::end_delivery) says `Ok`).
    Accepted(StreamKey),
    /// Worker: the lane of a stream the frontend had not accepted died: the frontend may never
    /// have seen it and would wait for it. The driver announces the loss on another lane or
    /// connection: an OPEN with `ticket`, `token` and an empty prologue (abandoned), then an
    /// ERROR, opened with [`set_announcements`](crate::Mux::set_announcements)`(remaining)`.
    LostBeforeAccept {
        /// The stream's registration key.
        ticket: u64,
        /// The stream's secret.
        token: Token,
        /// How many more times the announcement's own loss may be announced.
        remaining: u8,
    },
    /// Worker: a lane whose buffer was full has room again.
    LaneWritable(LaneId),
    /// A lane failed or was closed. Its streams were told first.
    LaneClosed {
        /// The lane.
        lane: LaneId,
        /// Why.
        error: LaneError,
    },
    /// The peer takes no new streams (GOAWAY); open ones may finish.
    GoAway {
        /// The peer's code.
        code: velo_wire::GoAwayCode,
    },
}
