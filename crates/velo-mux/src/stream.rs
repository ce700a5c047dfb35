//! Per-stream bookkeeping for each side.

use velo_wire::{StreamId, Token};

use crate::items::ItemQueue;
use crate::state::State;
use crate::{LaneId, StreamEnd};

/// One stream of a mux.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) state: State,
    pub(crate) lane: LaneId,
    /// The stream's id on the wire (the worker's slot and generation).
    pub(crate) wire: StreamId,
    pub(crate) half: Half,
}

/// The side-specific half of a stream.
#[derive(Debug)]
pub(crate) enum Half {
    Send(SendHalf),
    Recv(RecvHalf),
}

/// Worker side: sending items under credit.
#[derive(Debug)]
pub(crate) struct SendHalf {
    /// DATA records that may still be sent before a grant. The terminal record needs none.
    pub(crate) credit: u32,
    /// The peer's window: credit never exceeds it.
    pub(crate) window: u32,
    /// Sequence number of the next DATA record.
    pub(crate) seq: u32,
    /// A send was refused for credit: report `Writable` when credit comes back.
    pub(crate) blocked: bool,
    /// Why the stream ended, once it has.
    pub(crate) end: Option<StreamEnd>,
    /// The frontend answered the OPEN with ACCEPT: it now reports the stream's end to its
    /// reader whatever happens to the lane, so an end this side sends counts as delivered.
    pub(crate) accepted: bool,
    /// The OPEN's registration, to announce the stream again if its lane dies before ACCEPT.
    pub(crate) ticket: u64,
    pub(crate) token: Token,
    /// How many more times losing the stream before ACCEPT is announced: an announcement
    /// that is lost too is announced again, a bounded number of times.
    pub(crate) announcements: u8,
    /// The application let go while the answer was on its way: forget the stream once it
    /// comes (or the lane dies).
    pub(crate) released: bool,
}

impl SendHalf {
    /// This side ended the stream before the frontend accepted it: whether the end was
    /// delivered is not known yet.
    pub(crate) fn awaits_delivery(&self) -> bool {
        !self.accepted && matches!(self.end, Some(StreamEnd::Finished | StreamEnd::Reset(_)))
    }
}

/// Frontend side: received items waiting for the application, and credit accounting.
///
/// Invariant (checked by the property tests): `available + queued_data + unreturned ==
/// window` while the stream is live, so the worker can never have more than `window` DATA
/// records in flight or queued here.
#[derive(Debug)]
pub(crate) struct RecvHalf {
    /// Items not yet read. Every one used credit (DATA) except, when `final_queued`, the last
    /// (the item FINAL carried). A reader takes it whole.
    pub(crate) queue: ItemQueue,
    /// The last queued item came with FINAL and used no credit.
    pub(crate) final_queued: bool,
    /// The end, delivered after the queue drains.
    pub(crate) end: Option<StreamEnd>,
    /// The end was handed to the application.
    pub(crate) end_delivered: bool,
    /// Expected seq of the next DATA or FINAL.
    pub(crate) seq: u32,
    /// DATA the worker may still send before the next grant.
    pub(crate) available: u32,
    /// Items read by the application whose credit has not been returned yet.
    pub(crate) unreturned: u32,
    /// Our window for this stream.
    pub(crate) window: u32,
    /// A `Readable` event is outstanding (not repeated until the queue is drained).
    pub(crate) readable_signalled: bool,
    /// The stream is in its lane's list of streams with unreturned credit.
    pub(crate) in_grant_list: bool,
    /// STOP was sent.
    pub(crate) stop_sent: bool,
    /// The OPEN was answered (ACCEPT or CANCEL sent): the worker knows whether we took it.
    pub(crate) answered: bool,
    /// Not answered yet, and counted in its lane's pending opens (`max_pending_opens`).
    pub(crate) pending: bool,
}

impl RecvHalf {
    /// A live stream's receive half; `queue` is empty (a kept one, or new).
    pub(crate) fn new(window: u32, queue: ItemQueue) -> Self {
        Self {
            queue,
            final_queued: false,
            end: None,
            end_delivered: false,
            seq: 0,
            available: window,
            unreturned: 0,
            window,
            readable_signalled: false,
            in_grant_list: false,
            stop_sent: false,
            answered: false,
            pending: true,
        }
    }

    /// Items queued that used credit.
    #[cfg(feature = "test-util")]
    pub(crate) fn queued_data(&self) -> u32 {
        let data = self.queue.len() - usize::from(self.final_queued && !self.queue.is_empty());
        u32::try_from(data).unwrap_or(u32::MAX)
    }
}
