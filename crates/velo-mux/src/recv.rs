//! The frontend's stream calls: recv, stop, cancel; and credit return.

use std::time::Instant;

use bytes::Bytes;
use velo_wire::{CancelCode, Record};

use crate::items::ItemQueue;
use crate::lane::LaneState;
use crate::state::{Event, State};
use crate::stream::Half;
use crate::{LaneId, Mux, StreamEnd, StreamKey};

/// What [`Mux::recv`] hands the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recv {
    /// The next item, in order.
    Item(Bytes),
    /// The stream's end, delivered exactly once, after every item.
    End(StreamEnd),
}

impl Mux {
    /// Frontend: the next item or the end of a stream, or `None` when nothing is there yet
    /// (wait for [`MuxEvent::Readable`](crate::MuxEvent::Readable)). Reading items returns
    /// their credit to the worker, in batches.
    pub fn recv(&mut self, now: Instant, key: StreamKey) -> Option<Recv> {
        let s = self.streams.get_mut(key)?;
        let lane = s.lane;
        let live = s.state.is_live();
        let Half::Recv(r) = &mut s.half else {
            return None;
        };
        if let Some(item) = r.queue.pop_bytes() {
            let used_credit = !(r.final_queued && r.queue.is_empty());
            if r.queue.is_empty() {
                r.readable_signalled = false;
                r.final_queued = false;
            }
            if used_credit && live {
                self.consumed(now, key, lane, 1);
            }
            return Some(Recv::Item(item));
        }
        r.readable_signalled = false;
        if r.end_delivered {
            return None;
        }
        let end = r.end.clone()?;
        r.end_delivered = true;
        Some(Recv::End(end))
    }

    /// Frontend: moves every queued item of a stream into `out` (one call per wake instead of
    /// one per item) and returns the end if it was reached. Returns `None` for an unknown key.
    ///
    /// When `out` is empty the queues are swapped, not copied: the reader takes the whole
    /// queue in O(1) and hands back its own (empty, allocated) queue for the next items; a
    /// reader's unallocated queue is first replaced by a kept one (see [`Mux::give_queue`]).
    pub fn recv_all(
        &mut self,
        now: Instant,
        key: StreamKey,
        out: &mut ItemQueue,
    ) -> Option<Option<StreamEnd>> {
        let s = self.streams.get_mut(key)?;
        let lane = s.lane;
        let live = s.state.is_live();
        let Half::Recv(r) = &mut s.half else {
            return None;
        };
        let taken = r.queue.len();
        let credited =
            u32::try_from(taken - usize::from(r.final_queued && taken > 0)).unwrap_or(u32::MAX);
        if out.is_empty() && out.item_capacity() == 0 {
            // A reader's first take: hand the stream a kept queue, not an unallocated one.
            *out = self.spare_queues.take();
        }
        out.append(&mut r.queue);
        r.final_queued = false;
        r.readable_signalled = false;
        let end = if r.end_delivered {
            None
        } else {
            let end = r.end.clone();
            r.end_delivered = end.is_some();
            end
        };
        if credited > 0 && live {
            self.consumed(now, key, lane, credited);
        }
        Some(end)
    }

    /// Frontend: a reader's queue it no longer needs (its stream was released), kept for the
    /// next streams' readers within the same bound as released streams' queues.
    pub fn give_queue(&mut self, queue: ItemQueue) {
        self.spare_queues.give(queue);
    }

    /// Frontend: asks the worker to finish the stream soon (graceful). Items keep coming until
    /// the end. Does nothing on an ended stream or after the first call.
    pub fn stop(&mut self, now: Instant, key: StreamKey) {
        let Some(s) = self.streams.get_mut(key) else {
            return;
        };
        let (lane, wire) = (s.lane, s.wire);
        let Half::Recv(r) = &mut s.half else { return };
        if r.stop_sent || !s.state.is_live() {
            return;
        }
        r.stop_sent = true;
        if let Ok(next) = s.state.on(Event::Stop) {
            s.state = next;
        }
        self.push_record(lane, &Record::Stop { stream: wire }, true);
        self.update_ready(lane, now);
    }

    /// Frontend: ends the stream now (hard cancel, or refusal of an OPEN with `code`
    /// [`CancelCode::REFUSED`]). Queued items are dropped; the worker is told with CANCEL and
    /// records still in flight are dropped as stale when they arrive. A code other than
    /// [`CancelCode::CANCELLED`] on a stream not answered yet is a refusal (counted; churn too
    /// while the stream is live); on one already accepted (an item it could not read:
    /// `PROTOCOL_ERROR`) it is neither.
    pub fn cancel(&mut self, now: Instant, key: StreamKey, code: CancelCode) {
        let Some(s) = self.streams.get_mut(key) else {
            return;
        };
        let (lane, wire, live) = (s.lane, s.wire, s.state.is_live());
        let Half::Recv(r) = &mut s.half else { return };
        if !live {
            // The worker ended it already; if we never answered its OPEN, the worker is
            // waiting to learn whether its end was delivered: it was not.
            if !std::mem::replace(&mut r.answered, true) {
                if code != CancelCode::CANCELLED {
                    self.stats.streams_refused += 1;
                }
                self.answered(key);
                self.push_control(now, lane, &Record::Cancel { stream: wire, code });
            }
            return;
        }
        r.queue.clear();
        r.final_queued = false;
        let accepted = std::mem::replace(&mut r.answered, true);
        self.answered(key);
        let refused = code != CancelCode::CANCELLED && !accepted;
        if refused {
            self.stats.streams_refused += 1;
        }
        self.end_stream(key, Event::Cancel, StreamEnd::Cancelled(code));
        self.push_record(lane, &Record::Cancel { stream: wire, code }, true);
        if refused && let Err(e) = self.churned(now) {
            self.close_lane(lane, e);
        }
        self.update_ready(lane, now);
    }

    /// Frontend: takes a stream the worker opened ([`MuxEvent::Opened`](crate::MuxEvent)):
    /// tells the worker with ACCEPT that from now on this side reports the stream's end to
    /// its reader, whatever happens to the lane. Answer every OPEN with this or
    /// [`cancel`](Self::cancel) (releasing an unanswered stream cancels it). The ACCEPT
    /// rides on the lane's next batch, or goes within the grant delay. Does nothing after
    /// the first answer or on a lane that is gone.
    pub fn accept_stream(&mut self, now: Instant, key: StreamKey) {
        let Some(s) = self.streams.get_mut(key) else {
            return;
        };
        let (lane, wire) = (s.lane, s.wire);
        let Half::Recv(r) = &mut s.half else { return };
        if std::mem::replace(&mut r.answered, true) {
            return;
        }
        self.answered(key);
        self.push_control(now, lane, &Record::Accept { stream: wire });
    }

    /// Queues a small frontend record that may wait for the grant delay (or ride on an
    /// earlier batch), on a lane that is still up.
    fn push_control(&mut self, now: Instant, lane: LaneId, record: &Record) {
        let i = usize::from(lane.0);
        if self.lanes.get(i).is_none_or(|l| l.state != LaneState::Up) {
            return;
        }
        self.push_record(lane, record, false);
        let tx = &mut self.lanes[i].tx;
        let deadline = now + self.config.grant_delay;
        tx.rearm |= tx.grant_deadline.is_none();
        tx.grant_deadline = Some(tx.grant_deadline.map_or(deadline, |d| d.min(deadline)));
        self.update_ready(lane, now);
    }

    /// Frontend: items waiting to be read on a stream.
    pub fn queued(&self, key: StreamKey) -> usize {
        match self.streams.get(key).map(|s| &s.half) {
            Some(Half::Recv(r)) => r.queue.len(),
            _ => 0,
        }
    }

    /// Returns credit for `n` consumed items; a CREDIT record goes out once half the window
    /// is unreturned (at once if the worker is nearly out of credit, else within the grant
    /// delay), and smaller amounts ride on the next batch that is sealed anyway.
    fn consumed(&mut self, now: Instant, key: StreamKey, lane: LaneId, n: u32) {
        let grant_delay = self.config.grant_delay;
        let Some(s) = self.streams.get_mut(key) else {
            return;
        };
        let wire = s.wire;
        let Half::Recv(r) = &mut s.half else { return };
        r.unreturned += n;
        let threshold = (r.window / 2).max(1);
        if r.unreturned < threshold {
            if !r.in_grant_list {
                r.in_grant_list = true;
                self.lanes[usize::from(lane.0)].grant_list.push(key);
            }
            return;
        }
        let grant = std::mem::take(&mut r.unreturned);
        // A worker with at most a quarter of its window left is about to stall: its grant goes
        // out now. Otherwise grants of all streams coalesce for `grant_delay`.
        let starving = r.available <= r.window / 4;
        r.available += grant;
        let record = Record::Credit {
            stream: wire,
            grant,
        };
        self.push_record(lane, &record, starving);
        self.stats.grants_sent += 1;
        if !starving {
            let tx = &mut self.lanes[usize::from(lane.0)].tx;
            let deadline = now + grant_delay;
            tx.rearm |= tx.grant_deadline.is_none();
            tx.grant_deadline = Some(tx.grant_deadline.map_or(deadline, |d| d.min(deadline)));
        }
        self.update_ready(lane, now);
    }

    /// Adds CREDIT records for every stream of `lane` with unreturned credit to the open batch
    /// (called just before it is sealed).
    pub(crate) fn piggyback_grants(&mut self, lane: LaneId) {
        let i = usize::from(lane.0);
        let list = std::mem::take(&mut self.lanes[i].grant_list);
        for key in &list {
            let Some(s) = self.streams.get_mut(*key) else {
                continue;
            };
            let (wire, live) = (s.wire, s.state.is_live());
            let Half::Recv(r) = &mut s.half else { continue };
            r.in_grant_list = false;
            if !live || r.unreturned == 0 {
                continue;
            }
            let grant = std::mem::take(&mut r.unreturned);
            r.available += grant;
            self.push_record(
                lane,
                &Record::Credit {
                    stream: wire,
                    grant,
                },
                false,
            );
            self.stats.grants_sent += 1;
        }
        // Keep the allocation for next time, unless a past burst left it much too big.
        let mut list = list;
        list.clear();
        if list.capacity() > GRANT_LIST_KEEP {
            list.shrink_to(GRANT_LIST_KEEP);
        }
        if self.lanes[i].grant_list.is_empty() {
            self.lanes[i].grant_list = list;
        }
    }

    /// Frontend: whether STOP was sent for the stream.
    pub fn is_stopping(&self, key: StreamKey) -> bool {
        self.streams
            .get(key)
            .is_some_and(|s| s.state == State::Stopping)
    }
}

/// Entries of a lane's grant list kept allocated between batches (a list longer than this
/// came from a burst of streams and is given back).
const GRANT_LIST_KEEP: usize = 1024;
