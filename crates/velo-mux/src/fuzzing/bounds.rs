//! The checks the `mux` fuzz target makes after every operation, whatever the peer sent:
//! the property tests' invariants ([`Mux::check_invariants`]: credit conservation, lane load,
//! bytes queued per lane), and the bounds the crate docs promise for buffered items, the
//! per-lane tables, the event queue and a lane's receive buffer.

use bytes::BytesMut;
use velo_wire::FRAME_HEADER_LEN;

use super::ops::Who;
use super::world::World;
use crate::stream::Half;
use crate::wire_table::PAGE_SLOTS;
use crate::{LaneId, Mux, MuxEvent};

/// Kinds of event one stream can have pending at once (`Opened`, `Readable`, `Writable`,
/// `StopRequested`, `Closed`).
const EVENTS_PER_STREAM: usize = 5;
/// Kinds of event one lane can have pending at once (`LaneWritable`, `LaneClosed`).
const EVENTS_PER_LANE: usize = 2;

/// Items a frontend stream may hold: its window, plus the item its FINAL carried.
const ITEMS_ABOVE_WINDOW: usize = 1;

/// The event queue holds at most one event of each kind per stream, plus lane events and a
/// GOAWAY ("one pending event of each kind per stream", `MuxEvent`'s docs), plus one
/// `LostBeforeAccept` per stream a lane's loss ended unseen: those streams have left the
/// table, but there were never more than `max_streams` of them.
///
/// # Panics
///
/// When the queue is longer.
pub(crate) fn check_event_queue(mux: &Mux) {
    let lost = mux
        .events
        .iter()
        .filter(|e| matches!(e, MuxEvent::LostBeforeAccept { .. }))
        .count();
    let max_lost = usize::try_from(mux.config.max_streams).unwrap_or(usize::MAX);
    assert!(
        lost <= max_lost,
        "{:?}: {lost} lost streams to announce, max_streams {max_lost}",
        mux.config.side
    );
    let others = mux.events.len() - lost;
    let bound = EVENTS_PER_STREAM * (mux.streams.len() + 1) + EVENTS_PER_LANE * mux.lanes.len() + 1;
    assert!(
        others <= bound,
        "{:?}: {others} events pending, bound {bound}",
        mux.config.side,
    );
}

impl World {
    /// Every invariant and bound, on both sides.
    ///
    /// # Panics
    ///
    /// On the first one broken.
    pub(crate) fn check(&self) {
        for mux in [&self.worker, &self.frontend] {
            if let Err(e) = mux.check_invariants() {
                panic!("{:?}: invariant broken: {e}", mux.config.side);
            }
            check_streams(mux);
            check_lanes(mux);
        }
    }

    /// After `handle_input` on `lane` of `receiver`: an error left nothing behind, and a
    /// success left less than one whole frame (a complete frame is never left undecoded, and
    /// no more than one frame's bytes are held).
    pub(crate) fn check_leftover(&self, receiver: Who, lane: LaneId, rx: &BytesMut, ok: bool) {
        let max = receiver_max(self, receiver);
        if ok {
            assert!(
                rx.len() < FRAME_HEADER_LEN + max,
                "{receiver:?} {lane}: {} bytes left undecoded (frame limit {max})",
                rx.len()
            );
        } else {
            assert!(
                rx.is_empty(),
                "{receiver:?} {lane}: input kept after the lane failed"
            );
        }
    }
}

fn receiver_max(world: &World, receiver: Who) -> usize {
    let config = match receiver {
        Who::Worker => world.worker.config(),
        Who::Frontend => world.frontend.config(),
    };
    usize::try_from(config.max_frame_len()).unwrap_or(usize::MAX)
}

/// A frontend stream holds at most its window of items plus the last one.
fn check_streams(mux: &Mux) {
    for (key, s) in mux.streams.iter() {
        if let Half::Recv(r) = &s.half {
            let window = usize::try_from(r.window).unwrap_or(usize::MAX);
            assert!(
                r.queue.len() <= window + ITEMS_ABOVE_WINDOW,
                "{key:?}: {} items queued, window {window}",
                r.queue.len()
            );
        }
    }
}

/// A lane's table follows the live streams (pages only for slots in use, a directory only up
/// to the highest slot the stream limit allows), and its grant list names each stream once.
fn check_lanes(mux: &Mux) {
    let held = mux.streams.len();
    let max_slot = usize::try_from(mux.config.max_streams).unwrap_or(usize::MAX);
    for (i, l) in mux.lanes.iter().enumerate() {
        assert!(
            l.wire.len() <= held && l.wire.pages() <= l.wire.len(),
            "lane {i}: table of {} entries in {} pages, {held} streams held",
            l.wire.len(),
            l.wire.pages()
        );
        assert!(
            l.wire.directory_len() <= max_slot / PAGE_SLOTS + 1,
            "lane {i}: table directory of {} pages, stream limit {max_slot}",
            l.wire.directory_len()
        );
        check_grant_list(mux, i);
    }
}

/// A lane's grant list names each stream it holds at most once. (Keys of streams released
/// since the lane's last sealed batch stay listed until then, at most a heartbeat interval;
/// they are skipped when the batch is sealed.)
fn check_grant_list(mux: &Mux, lane: usize) {
    let list = &mux.lanes[lane].grant_list;
    let mut held: Vec<_> = list
        .iter()
        .filter(|k| mux.streams.get(**k).is_some())
        .collect();
    held.sort_unstable();
    let n = held.len();
    held.dedup();
    assert_eq!(
        held.len(),
        n,
        "lane {lane}: a stream is listed twice for credit"
    );
}
