//! The worker's stream calls: open, send, finish, reset, release.

use std::time::Instant;

use bytes::Bytes;
use velo_wire::{
    DataKind, ErrorCode, Record, StreamId, Token, data_header_len, encode_data_header, encode_open,
    open_len,
};

use crate::lane::{LaneState, Unanswered};
use crate::mux::{CHAIN_THRESHOLD, lane_id};
use crate::state::{Event, State};
use crate::stream::{Half, SendHalf, Stream};
use crate::{Blocked, LaneId, Mux, OpenError, SendError, Side, StreamEnd, StreamKey};

/// Where a new stream goes.
enum Placement {
    Lane(LaneId),
    /// No lane is up.
    NoLane,
    /// Lanes are up but every one is full (large OPENs only).
    Full,
}

/// How many times the loss of one stream before the frontend's ACCEPT is announced: the
/// original loss and up to two lost announcements (lanes of one connection often die
/// together).
pub const ANNOUNCEMENTS: u8 = 3;

/// Error code sent in an ERROR record when a worker releases a stream it never finished
/// (the application dropped its sender): the frontend sees an abnormal end.
pub const RESET_DROPPED: ErrorCode = ErrorCode::DROPPED;

impl Mux {
    /// Worker: opens a stream on the least-loaded lane and queues its OPEN record carrying
    /// `prologue`. The stream starts with the credit the frontend announced for that lane.
    ///
    /// # Errors
    ///
    /// [`OpenError`]; nothing is sent when it fails.
    pub fn open(
        &mut self,
        now: Instant,
        ticket: u64,
        token: &Token,
        prologue: &[u8],
    ) -> Result<StreamKey, OpenError> {
        if self.config.side != Side::Worker {
            return Err(OpenError::WrongSide);
        }
        if let Some(code) = self.peer_goaway {
            return Err(OpenError::GoingAway(code));
        }
        let small = prologue.len() < CHAIN_THRESHOLD;
        let lane = match self.least_loaded_lane(small) {
            Placement::Lane(lane) => lane,
            Placement::NoLane => return Err(OpenError::NoLane),
            Placement::Full => {
                self.stats.lane_stalls += 1;
                return Err(OpenError::LaneFull);
            }
        };
        let i = usize::from(lane.0);
        let max = self.record_cap(i).min(self.config.max_prologue_len());
        let prologue_len = u32::try_from(prologue.len())
            .ok()
            .filter(|&l| l <= max)
            .ok_or(OpenError::PrologueTooLarge {
                len: prologue.len(),
                max,
            })?;
        let window = self.lanes[i].peer.window;
        let stream = Stream {
            state: State::Open,
            lane,
            wire: StreamId::new(0, 0),
            half: Half::Send(SendHalf {
                credit: window,
                window,
                seq: 0,
                blocked: false,
                end: None,
                accepted: false,
                ticket,
                token: *token,
                announcements: ANNOUNCEMENTS,
                released: false,
            }),
        };
        let key = self
            .streams
            .insert(stream, self.config.max_streams)
            .ok_or(OpenError::TooManyStreams(self.config.max_streams))?;
        let wire = StreamId::new(key.index(), key.generation());
        if let Some(s) = self.streams.get_mut(key) {
            s.wire = wire;
        }
        self.lanes[i].streams += 1;
        self.stats.streams_opened += 1;
        let len = open_len(wire, ticket, prologue_len);
        self.push_with(lane, len, now, |out| {
            encode_open(out, wire, ticket, token, prologue)
        });
        // In the open batch: the next chunk pushed.
        let chunk = self.lanes[i].tx.pushed_chunks;
        self.lanes[i].unanswered.push_back(Unanswered {
            key,
            chunk,
            sent: None,
        });
        self.lanes[i].tx.open_edge = true;
        self.update_ready(lane, now);
        Ok(key)
    }

    /// Worker: queues one item. Small payloads are copied into the lane's batch.
    ///
    /// # Errors
    ///
    /// [`SendError::WouldBlock`] when the stream has no credit or the lane buffer is full
    /// (wait for the event it names, then retry); [`SendError::Closed`] once the stream has
    /// ended; caller errors otherwise.
    pub fn send(&mut self, now: Instant, key: StreamKey, payload: &[u8]) -> Result<(), SendError> {
        let (lane, wire, seq) = self.check_send(key, payload.len(), DataKind::Data)?;
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        let header = data_header_len(wire, seq, len);
        self.push_with(lane, header + payload.len(), now, |out| {
            encode_data_header(out, DataKind::Data, wire, seq, len);
            out.extend_from_slice(payload);
        });
        self.after_data(now, lane, seq, payload.len());
        Ok(())
    }

    /// Worker: queues one item given as [`Bytes`]; payloads of [`CHAIN_THRESHOLD`] bytes or
    /// more are chained for a vectored write instead of copied.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    pub fn send_bytes(
        &mut self,
        now: Instant,
        key: StreamKey,
        payload: Bytes,
    ) -> Result<(), SendError> {
        if payload.len() < CHAIN_THRESHOLD {
            return self.send(now, key, &payload);
        }
        let (lane, wire, seq) = self.check_send(key, payload.len(), DataKind::Data)?;
        let n = payload.len();
        let len = u32::try_from(n).unwrap_or(u32::MAX);
        let header = data_header_len(wire, seq, len);
        self.push_chained(lane, header, payload, |out| {
            encode_data_header(out, DataKind::Data, wire, seq, len);
        });
        self.after_data(now, lane, seq, n);
        Ok(())
    }

    /// Worker: ends the stream cleanly with a FINAL record carrying `payload` (the last item,
    /// or empty). FINAL uses the credit reserved for it, so a full window never blocks it.
    ///
    /// # Errors
    ///
    /// [`SendError::WouldBlock`]`(Lane)` only when `payload` is large and the lane buffer is
    /// full; [`SendError::Closed`] if the stream had already ended.
    pub fn finish(
        &mut self,
        now: Instant,
        key: StreamKey,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let (lane, wire, seq) = self.check_send(key, payload.len(), DataKind::Final)?;
        let n = payload.len();
        let len = u32::try_from(n).unwrap_or(u32::MAX);
        let header = data_header_len(wire, seq, len);
        if n >= CHAIN_THRESHOLD {
            self.push_chained(lane, header, payload, |out| {
                encode_data_header(out, DataKind::Final, wire, seq, len);
            });
        } else {
            self.push_with(lane, header + n, now, |out| {
                encode_data_header(out, DataKind::Final, wire, seq, len);
                out.extend_from_slice(&payload);
            });
        }
        self.stats.payload_bytes_sent += n as u64;
        // The end is an edge record: the request's completion does not wait for a batch
        // (unless the policy lets ends wait).
        self.lanes[usize::from(lane.0)].tx.end_edge = true;
        self.end_stream(key, Event::Finish, StreamEnd::Finished);
        self.update_ready(lane, now);
        Ok(())
    }

    /// Worker: ends the stream abnormally with an ERROR record. Never blocks: an ERROR is
    /// small and uses the reserved credit.
    ///
    /// # Errors
    ///
    /// [`SendError::Closed`] if the stream had already ended; caller errors otherwise.
    pub fn reset(
        &mut self,
        now: Instant,
        key: StreamKey,
        code: ErrorCode,
        message: &str,
    ) -> Result<(), SendError> {
        let s = self.streams.get(key).ok_or(SendError::UnknownStream)?;
        let Half::Send(h) = &s.half else {
            return Err(SendError::WrongSide);
        };
        if !s.state.is_live() {
            return Err(SendError::Closed(
                h.end.clone().unwrap_or(StreamEnd::Finished),
            ));
        }
        let (lane, wire) = (s.lane, s.wire);
        // Bound the message so the record always fits a frame.
        let mut end = message.len().min(velo_wire::MAX_CLOSE_REASON_LEN);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let record = Record::Error {
            stream: wire,
            code,
            message: message[..end].to_owned(),
        };
        self.push_record(lane, &record, false);
        let tx = &mut self.lanes[usize::from(lane.0)].tx;
        tx.touch(now);
        // An end (here abnormal) is an edge record: it does not wait for a batch (unless the
        // policy lets ends wait).
        tx.end_edge = true;
        self.end_stream(key, Event::Error, StreamEnd::Reset(code));
        self.update_ready(lane, now);
        Ok(())
    }

    /// Lets go of a stream: its slot may be reused. A worker stream still live is reset with
    /// [`RESET_DROPPED`]; a frontend stream still live is cancelled. Unknown keys are ignored.
    pub fn release(&mut self, now: Instant, key: StreamKey) {
        let Some(s) = self.streams.get(key) else {
            return;
        };
        let (lane, wire, live) = (s.lane, s.wire, s.state.is_live());
        match s.half {
            Half::Send(_) => {
                if live {
                    // Live, so the reset cannot fail; nothing to report if it did.
                    let _ =
                        self.reset(now, key, RESET_DROPPED, "stream dropped before it finished");
                }
                if let Some(Stream {
                    half: Half::Send(h),
                    ..
                }) = self.streams.get_mut(key)
                    && h.awaits_delivery()
                {
                    // Kept until the frontend answers or the lane dies, so a loss is announced.
                    h.released = true;
                    return;
                }
            }
            // Live: cancelled. Ended by the worker but never answered: refused, so the worker
            // learns its end was not taken.
            Half::Recv(_) => self.cancel(now, key, velo_wire::CancelCode::CANCELLED),
        }
        if self.config.side == Side::Frontend
            && let Some(l) = self.lanes.get_mut(usize::from(lane.0))
        {
            // A stream the worker ended kept its entry until now.
            l.clear_wire_slot(wire);
        }
        if let Some(Stream {
            half: Half::Recv(r),
            ..
        }) = self.streams.remove(key)
        {
            self.spare_queues.give(r.queue);
        }
    }

    /// Worker: whether the frontend has taken the stream (its ACCEPT arrived).
    pub fn is_accepted(&self, key: StreamKey) -> bool {
        matches!(&self.streams.get(key).map(|s| &s.half), Some(Half::Send(h)) if h.accepted)
    }

    /// Worker: how many more times the loss of `key` before ACCEPT is announced
    /// ([`MuxEvent::LostBeforeAccept`](crate::MuxEvent)); an announcement is opened with the
    /// `remaining` its event carried, so a chain of losses ends.
    pub fn set_announcements(&mut self, key: StreamKey, remaining: u8) {
        if let Some(Stream {
            half: Half::Send(h),
            ..
        }) = self.streams.get_mut(key)
        {
            h.announcements = remaining;
        }
    }

    /// Worker: whether the frontend asked this stream to stop.
    pub fn is_stop_requested(&self, key: StreamKey) -> bool {
        self.streams
            .get(key)
            .is_some_and(|s| s.state == State::Stopping)
    }

    /// Worker: how the stream ended, if it has.
    pub fn send_end(&self, key: StreamKey) -> Option<StreamEnd> {
        match &self.streams.get(key)?.half {
            Half::Send(h) => h.end.clone(),
            Half::Recv(_) => None,
        }
    }

    /// Worker: whether the end this side gave a stream ([`finish`](Self::finish) or
    /// [`reset`](Self::reset)) reached the frontend: `Some(Ok(()))` once the frontend has
    /// accepted the stream (before or after the end); `Some(Err(end))` when the lane failed
    /// or the frontend refused the stream first, so the frontend may never have seen it;
    /// `None` while the answer is on its way ([`MuxEvent::Accepted`](crate::MuxEvent) or
    /// [`MuxEvent::Closed`](crate::MuxEvent) follows) or for a stream still live.
    pub fn end_delivery(&self, key: StreamKey) -> Option<Result<(), StreamEnd>> {
        let s = self.streams.get(key)?;
        let Half::Send(h) = &s.half else { return None };
        match h.end.as_ref()? {
            StreamEnd::Finished | StreamEnd::Reset(_) if h.accepted => Some(Ok(())),
            StreamEnd::Finished | StreamEnd::Reset(_) => None,
            other => Some(Err(other.clone())),
        }
    }

    /// Worker: DATA records the stream may send before its next grant.
    pub fn send_credit(&self, key: StreamKey) -> Option<u32> {
        match &self.streams.get(key)?.half {
            Half::Send(h) => Some(h.credit),
            Half::Recv(_) => None,
        }
    }

    /// The up lane with the fewest streams; for a large OPEN (`small` false), the least
    /// loaded one with room in its buffer, marking full lanes so they report
    /// `LaneWritable` once they drain.
    fn least_loaded_lane(&mut self, small: bool) -> Placement {
        let max = self.config.max_buffered_bytes;
        let mut any_up = false;
        let mut best: Option<(u32, usize)> = None;
        for (i, l) in self.lanes.iter_mut().enumerate() {
            if l.state != LaneState::Up {
                continue;
            }
            any_up = true;
            if !small && l.tx.buffered() >= max {
                l.blocked = true;
                continue;
            }
            if best.is_none_or(|(streams, _)| l.streams < streams) {
                best = Some((l.streams, i));
            }
        }
        match best {
            Some((_, i)) => Placement::Lane(lane_id(i)),
            None if any_up => Placement::Full,
            None => Placement::NoLane,
        }
    }

    /// Checks that `key` may send a record of `kind` with a payload of `len` bytes now;
    /// returns its lane, wire id and sequence number.
    fn check_send(
        &mut self,
        key: StreamKey,
        len: usize,
        kind: DataKind,
    ) -> Result<(LaneId, StreamId, u32), SendError> {
        let s = self.streams.get(key).ok_or(SendError::UnknownStream)?;
        let lane = s.lane;
        let i = usize::from(lane.0);
        let max = self.record_cap(i);
        let full = self.lanes[i].tx.buffered() >= self.config.max_buffered_bytes;
        let s = self.streams.get_mut(key).ok_or(SendError::UnknownStream)?;
        let wire = s.wire;
        let live = s.state.is_live();
        let Half::Send(h) = &mut s.half else {
            return Err(SendError::WrongSide);
        };
        if !live {
            return Err(SendError::Closed(
                h.end.clone().unwrap_or(StreamEnd::Finished),
            ));
        }
        if u32::try_from(len).map_or(true, |l| l > max) {
            return Err(SendError::TooLarge { len, max });
        }
        if kind == DataKind::Data && h.credit == 0 {
            h.blocked = true;
            self.stats.credit_stalls += 1;
            return Err(SendError::WouldBlock(Blocked::Credit));
        }
        // A small terminal record is always accepted, so finishing never waits on the lane.
        let terminal_small = kind == DataKind::Final && len < CHAIN_THRESHOLD;
        if full && !terminal_small {
            self.lanes[i].blocked = true;
            self.stats.lane_stalls += 1;
            return Err(SendError::WouldBlock(Blocked::Lane));
        }
        let seq = h.seq;
        if kind == DataKind::Data {
            h.credit -= 1;
            h.seq += 1;
            if h.credit == 0 || h.credit == h.window / 2 {
                self.lanes[i].tx.credit_low = true;
            }
        }
        Ok((lane, wire, seq))
    }

    fn after_data(&mut self, now: Instant, lane: LaneId, seq: u32, payload_len: usize) {
        self.stats.payload_bytes_sent += payload_len as u64;
        if seq == 0 {
            // The stream's first item: it goes out without waiting for the batch.
            self.lanes[usize::from(lane.0)].tx.edge = true;
        }
        self.update_ready(lane, now);
    }
}
