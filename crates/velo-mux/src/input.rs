//! Received bytes: frames, then records dispatched to their streams.
//!
//! Peer input is parsed, never trusted: every lookup is checked, every count is checked
//! arithmetic, and nothing is allocated by a length the peer chose unless it is within a
//! configured bound (`max_frame_len` for frames, `max_streams` for the wire table).

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use velo_wire::{CancelCode, Frame, Record, RecordView, StreamId, Token};

use crate::items::ItemQueue;
use crate::lane::LaneState;
use crate::slab::Key;
use crate::state::{Event, State};
use crate::stream::{Half, RecvHalf, Stream};
use crate::wire_table::WireSlot;
use crate::{LaneError, LaneId, Mux, MuxEvent, Side, StreamEnd, StreamKey};

impl Mux {
    /// Feeds bytes received on `lane`. Complete frames are consumed from `src`; a partial
    /// frame stays for the next call.
    ///
    /// # Errors
    ///
    /// The [`LaneError`] that closed the lane: malformed bytes, a broken rule, or the peer's
    /// CLOSE. The lane's streams have been told; the driver should write what
    /// [`poll_transmit`](Self::poll_transmit) still yields (a CLOSE frame) and close the
    /// transport. Bytes for a lane that is not up are ignored.
    pub fn handle_input(
        &mut self,
        now: Instant,
        lane: LaneId,
        src: &mut BytesMut,
    ) -> Result<(), LaneError> {
        let i = usize::from(lane.0);
        match self.lanes.get(i) {
            Some(l) if l.state == LaneState::Up => {}
            _ => {
                src.clear();
                return Ok(());
            }
        }
        let before = src.len();
        self.lanes[i].last_rx = now;
        let result = self.decode_frames(now, lane, src);
        self.stats.bytes_received += (before - src.len()) as u64;
        if let Err(e) = &result {
            src.clear();
            self.close_lane(lane, e.clone());
        }
        result
    }

    fn decode_frames(
        &mut self,
        now: Instant,
        lane: LaneId,
        src: &mut BytesMut,
    ) -> Result<(), LaneError> {
        let i = usize::from(lane.0);
        loop {
            let Some(frame) = self.lanes[i].decoder.decode(src)? else {
                return Ok(());
            };
            match frame {
                Frame::Batch(batch) => {
                    self.stats.batches_received += 1;
                    self.on_batch(now, lane, &batch)?;
                }
                Frame::Close(close) => {
                    return Err(LaneError::PeerClosed {
                        code: close.code,
                        reason: close.reason,
                    });
                }
                Frame::Hello(_) => return Err(LaneError::Protocol("HELLO after the handshake")),
                Frame::Auth(_) => return Err(LaneError::Protocol("AUTH after the handshake")),
            }
        }
    }

    fn on_batch(
        &mut self,
        now: Instant,
        lane: LaneId,
        batch: &velo_wire::Batch,
    ) -> Result<(), LaneError> {
        // A slice keeps the whole body alive: only payloads longer than a quarter of it stay
        // slices, so an item pins at most 4 times its size whatever frame it came in (a
        // PACKED frame of 130 KiB can unpack to 32 MiB of HEARTBEATs around one item).
        let copy_below = COPY_BELOW.max(batch.body().len() / 4 + 1);
        let body = batch.body();
        for record in batch.record_views() {
            self.stats.records_received += 1;
            match record? {
                RecordView::Data {
                    stream,
                    seq,
                    payload,
                } if self.config.side == Side::Frontend => {
                    let item = Arrived::new(payload, body, copy_below);
                    self.on_data(now, lane, stream, seq, item, false)?;
                }
                // A worker is sent no DATA: refused as any record only workers send, without
                // copying a payload of up to a frame's size first.
                RecordView::Data { .. } => return Err(WORKER_RECORD_TO_WORKER),
                RecordView::Decoded(record) => self.on_record(now, lane, record, copy_below)?,
            }
            self.check_control_bytes(lane)?;
        }
        Ok(())
    }

    fn on_record(
        &mut self,
        now: Instant,
        lane: LaneId,
        record: Record,
        copy_below: usize,
    ) -> Result<(), LaneError> {
        match (self.config.side, record) {
            (_, Record::Heartbeat) => Ok(()),
            (_, Record::GoAway { code }) => {
                if self.peer_goaway.is_none() {
                    self.peer_goaway = Some(code);
                    self.events.push_back(MuxEvent::GoAway { code });
                }
                Ok(())
            }
            (Side::Frontend, record) => self.on_worker_record(now, lane, record, copy_below),
            (Side::Worker, record) => self.on_frontend_record(lane, record),
        }
    }

    /// Frontend: a record only workers send.
    fn on_worker_record(
        &mut self,
        now: Instant,
        lane: LaneId,
        record: Record,
        copy_below: usize,
    ) -> Result<(), LaneError> {
        match record {
            Record::Open {
                stream,
                ticket,
                token,
                prologue,
            } => self.on_open(now, lane, stream, ticket, token, prologue),
            Record::Data {
                stream,
                seq,
                payload,
            } => {
                let item = Arrived::new(&payload, &payload, copy_below);
                self.on_data(now, lane, stream, seq, item, false)
            }
            Record::Final {
                stream,
                seq,
                payload,
            } => {
                let item = Arrived::new(&payload, &payload, copy_below);
                self.on_data(now, lane, stream, seq, item, true)
            }
            Record::Error {
                stream,
                code,
                message,
            } => {
                let Some(key) = self.live_wire(lane, stream) else {
                    return Ok(());
                };
                let before_any_item = matches!(
                    self.streams.get(key).map(|s| &s.half),
                    Some(Half::Recv(r)) if r.seq == 0
                );
                self.end_stream(key, Event::Error, StreamEnd::Error { code, message });
                if before_any_item {
                    // Opened and reset before its first item: churn.
                    self.churned(now)?;
                }
                Ok(())
            }
            _ => Err(LaneError::Protocol(
                "a frontend received a record only frontends send",
            )),
        }
    }

    /// Worker: a record only frontends send.
    fn on_frontend_record(&mut self, lane: LaneId, record: Record) -> Result<(), LaneError> {
        match record {
            Record::Credit { stream, grant } => self.on_credit(lane, stream, grant),
            Record::Stop { stream } => {
                if let Some(key) = self.own_stream(lane, stream)?
                    && let Some(s) = self.streams.get_mut(key)
                    && s.state == State::Open
                {
                    s.state = State::Stopping;
                    self.stats.remote_cancellations += 1;
                    self.events.push_back(MuxEvent::StopRequested(key));
                }
                Ok(())
            }
            Record::Cancel { stream, code } => {
                if let Some(key) = self.awaiting_delivery(lane, stream) {
                    self.end_undelivered(key, StreamEnd::Cancelled(code));
                } else if let Some(key) = self.own_stream(lane, stream)? {
                    if self
                        .streams
                        .get(key)
                        .is_some_and(|s| s.state == State::Open)
                    {
                        self.stats.remote_cancellations += 1;
                    }
                    self.end_stream(key, Event::Cancel, StreamEnd::Cancelled(code));
                }
                Ok(())
            }
            Record::Accept { stream } => self.on_accept(lane, stream),
            _ => Err(WORKER_RECORD_TO_WORKER),
        }
    }

    /// Worker: the frontend took the stream ([`MuxEvent::Accepted`]); if this side had ended
    /// it already, its end is now known delivered.
    fn on_accept(&mut self, lane: LaneId, id: StreamId) -> Result<(), LaneError> {
        let key = Key {
            index: id.slot(),
            generation: id.generation(),
        };
        let Some(s) = self.streams.get_mut(key) else {
            self.stats.stale_drops += 1;
            return Ok(());
        };
        if s.lane != lane {
            return Err(LaneError::Protocol("ACCEPT for a stream on another lane"));
        }
        let Half::Send(h) = &mut s.half else {
            return Ok(());
        };
        if h.end.as_ref().is_some_and(|e| !e.is_own()) {
            // Already ended by the frontend or the lane: the answer came too late to matter.
            self.stats.stale_drops += 1;
            return Ok(());
        }
        if std::mem::replace(&mut h.accepted, true) {
            return Err(LaneError::Protocol("a second ACCEPT for a stream"));
        }
        if h.released {
            self.streams.remove(key);
        } else {
            self.events.push_back(MuxEvent::Accepted(key));
        }
        self.drop_answered(lane);
        Ok(())
    }

    /// Worker: the stream `id` names on `lane` if this side ended it and waits to learn
    /// whether the frontend took it.
    fn awaiting_delivery(&self, lane: LaneId, id: StreamId) -> Option<StreamKey> {
        let key = Key {
            index: id.slot(),
            generation: id.generation(),
        };
        let s = self.streams.get(key)?;
        let Half::Send(h) = &s.half else { return None };
        (s.lane == lane && h.awaits_delivery()).then_some(key)
    }

    /// Worker: the end this side gave `key` was not delivered (`end`: the frontend refused
    /// the stream, or the lane was lost, before it accepted it); said once, as
    /// [`MuxEvent::Closed`].
    pub(crate) fn end_undelivered(&mut self, key: StreamKey, end: StreamEnd) {
        let Some(Stream {
            half: Half::Send(h),
            ..
        }) = self.streams.get_mut(key)
        else {
            return;
        };
        let reason = match &end {
            StreamEnd::Cancelled(code) => crate::CloseReason::Cancelled(*code),
            StreamEnd::Lost(e) => crate::CloseReason::Lost(e.clone()),
            _ => return,
        };
        self.stats.ends_undelivered += 1;
        if h.released {
            self.streams.remove(key);
            return;
        }
        h.end = Some(end);
        self.events.push_back(MuxEvent::Closed {
            stream: key,
            reason,
        });
    }

    fn on_open(
        &mut self,
        now: Instant,
        lane: LaneId,
        id: StreamId,
        ticket: u64,
        token: Token,
        prologue: Bytes,
    ) -> Result<(), LaneError> {
        let i = usize::from(lane.0);
        let refuse = |mux: &mut Self, code| {
            mux.stats.streams_refused += 1;
            mux.push_record(lane, &Record::Cancel { stream: id, code }, true);
            mux.update_ready(lane, now);
        };
        let slot = id.slot();
        if slot >= self.config.max_streams {
            refuse(self, CancelCode::TOO_MANY_STREAMS);
            return self.churned(now);
        }
        if prologue.len() > self.config.max_prologue_len() as usize {
            tracing::debug!(stream = %id, len = prologue.len(), "prologue over the cap");
            refuse(self, CancelCode::PROTOCOL_ERROR);
            return self.churned(now);
        }
        if let Some(existing) = self.lanes[i].wire.get(slot) {
            let live = self
                .streams
                .get(existing.key)
                .is_some_and(|s| s.state.is_live());
            match (existing.generation == id.generation(), live) {
                (true, true) => {
                    return self.violate(now, existing.key, "second OPEN for a live stream");
                }
                (true, false) => {
                    self.after_end(existing.key);
                    return Ok(());
                }
                (false, true) => {
                    return Err(LaneError::Protocol(
                        "OPEN reuses a slot whose stream is still live on this lane",
                    ));
                }
                // The worker released its finished stream and reuses the slot; this side
                // has not released its stream yet. The new stream takes the entry.
                (false, false) => {}
            }
        }
        if self.pending_opens_full(lane) {
            self.stats.pending_opens_refused += 1;
            refuse(self, CancelCode::TOO_MANY_STREAMS);
            return self.churned(now);
        }
        // The prologue is kept until the application answers the OPEN: a copy, so it keeps
        // its own bytes alive (at most `max_prologue_len`), not the frame it came in.
        let prologue = Bytes::copy_from_slice(&prologue);
        let window = self.config.window;
        let stream = Stream {
            state: State::Open,
            lane,
            wire: id,
            half: Half::Recv(RecvHalf::new(window, self.spare_queues.take())),
        };
        let Some(key) = self.streams.insert(stream, self.config.max_streams) else {
            refuse(self, CancelCode::TOO_MANY_STREAMS);
            return self.churned(now);
        };
        self.lanes[i].wire.insert(
            slot,
            WireSlot {
                generation: id.generation(),
                key,
            },
        );
        self.lanes[i].streams += 1;
        self.opened_pending(lane);
        self.stats.streams_opened += 1;
        self.events.push_back(MuxEvent::Opened {
            stream: key,
            ticket,
            token,
            prologue,
        });
        Ok(())
    }

    fn on_data(
        &mut self,
        now: Instant,
        lane: LaneId,
        id: StreamId,
        seq: u32,
        item: Arrived<'_>,
        last: bool,
    ) -> Result<(), LaneError> {
        let Some(key) = self.live_wire(lane, id) else {
            return Ok(());
        };
        let len = item.payload.len() as u64;
        let Some(s) = self.streams.get_mut(key) else {
            return Ok(());
        };
        let Half::Recv(r) = &mut s.half else {
            return Ok(());
        };
        if seq != r.seq {
            return self.violate(now, key, "sequence gap");
        }
        if !last {
            let Some(available) = r.available.checked_sub(1) else {
                return self.violate(now, key, "DATA without credit");
            };
            r.available = available;
            r.seq = r.seq.wrapping_add(1);
        }
        self.stats.payload_bytes_received += len;
        if !last || !item.payload.is_empty() {
            item.push_to(&mut r.queue);
            r.final_queued = last;
            if !r.readable_signalled {
                r.readable_signalled = true;
                self.events.push_back(MuxEvent::Readable(key));
            }
        }
        if last {
            self.end_stream(key, Event::Finish, StreamEnd::Finished);
        }
        Ok(())
    }

    fn on_credit(&mut self, lane: LaneId, id: StreamId, grant: u32) -> Result<(), LaneError> {
        let Some(key) = self.own_stream(lane, id)? else {
            return Ok(());
        };
        let Some(s) = self.streams.get_mut(key) else {
            return Ok(());
        };
        let Half::Send(h) = &mut s.half else {
            return Ok(());
        };
        let credit = h
            .credit
            .checked_add(grant)
            .filter(|&c| c <= h.window)
            .ok_or(LaneError::Protocol(
                "CREDIT raises a stream above its window",
            ))?;
        h.credit = credit;
        if h.blocked {
            h.blocked = false;
            self.events.push_back(MuxEvent::Writable(key));
        }
        Ok(())
    }

    /// Frontend: one stream of churn (refused, or reset before its first item). Past the
    /// connection's churn limit, the lane that caused it closes.
    ///
    /// # Errors
    ///
    /// [`LaneError::ChurnLimit`] past the limit.
    pub(crate) fn churned(&mut self, now: Instant) -> Result<(), LaneError> {
        self.stats.churn += 1;
        if self.churn.take(now) {
            return Ok(());
        }
        self.stats.churn_closes += 1;
        let limit = self.config.churn;
        Err(LaneError::ChurnLimit {
            burst: limit.burst,
            per_second: limit.per_second,
        })
    }

    /// Frontend: the live stream `id` names on `lane`, or `None`: a stale record (dropped and
    /// counted), or one after the stream's FINAL or ERROR (the worker's error, see
    /// [`after_end`](Self::after_end)).
    fn live_wire(&mut self, lane: LaneId, id: StreamId) -> Option<StreamKey> {
        let key = self.lanes[usize::from(lane.0)].wire_slot(id);
        match key.and_then(|k| self.streams.get(k).map(|s| (k, s.state.is_live()))) {
            Some((k, true)) => Some(k),
            Some((k, false)) => {
                // Only streams the worker ended keep their entry once ended.
                self.after_end(k);
                None
            }
            None => {
                self.stats.stale_drops += 1;
                None
            }
        }
    }

    /// Frontend: the worker sent a record for a stream it had ended with FINAL or ERROR.
    /// Counted; the stream's end becomes a violation if the application has not read it yet
    /// (the worker did not end it as it said), and siblings on the lane are unaffected.
    fn after_end(&mut self, key: StreamKey) {
        self.stats.records_after_end += 1;
        let Some(Stream {
            half: Half::Recv(r),
            ..
        }) = self.streams.get_mut(key)
        else {
            return;
        };
        if !r.end_delivered {
            r.end = Some(StreamEnd::Violation("a record after the stream's end"));
            if !r.readable_signalled {
                r.readable_signalled = true;
                self.events.push_back(MuxEvent::Readable(key));
            }
        }
    }

    /// Worker: the live stream `id` names, or `None` when it is stale (dropped and counted).
    ///
    /// # Errors
    ///
    /// A record for a live stream of another lane breaks the lane rule.
    fn own_stream(&mut self, lane: LaneId, id: StreamId) -> Result<Option<StreamKey>, LaneError> {
        let key = Key {
            index: id.slot(),
            generation: id.generation(),
        };
        match self.streams.get(key) {
            Some(s) if s.state.is_live() && s.lane != lane => {
                Err(LaneError::Protocol("record for a stream on another lane"))
            }
            Some(s) if s.state.is_live() => Ok(Some(key)),
            _ => {
                self.stats.stale_drops += 1;
                Ok(None)
            }
        }
    }

    /// Frontend: ends a stream that broke a protocol rule and tells the worker (CANCEL with
    /// [`CancelCode::PROTOCOL_ERROR`]). Only this stream dies; one that dies before its first
    /// item counts as churn, as a refused or reset one does (else OPEN and a bad record
    /// would open and kill streams past the churn limit).
    ///
    /// # Errors
    ///
    /// [`LaneError::ChurnLimit`] when that churn is past the limit.
    fn violate(
        &mut self,
        now: Instant,
        key: StreamKey,
        reason: &'static str,
    ) -> Result<(), LaneError> {
        let Some(s) = self.streams.get(key) else {
            return Ok(());
        };
        let (lane, wire) = (s.lane, s.wire);
        tracing::debug!(stream = %wire, reason, "stream protocol violation");
        let mut before_any_item = false;
        if let Some(Stream {
            half: Half::Recv(r),
            ..
        }) = self.streams.get_mut(key)
        {
            r.answered = true;
            before_any_item = r.seq == 0;
        }
        self.answered(key);
        self.end_stream(key, Event::Violation, StreamEnd::Violation(reason));
        self.push_record(
            lane,
            &Record::Cancel {
                stream: wire,
                code: CancelCode::PROTOCOL_ERROR,
            },
            true,
        );
        self.update_ready(lane, now);
        if before_any_item {
            self.churned(now)?;
        }
        Ok(())
    }
}

/// Items below this many bytes are copied out of the receive buffer into their stream's own
/// buffer ([`ItemQueue`]) as their record is decoded; larger ones stay slices of it.
///
/// A slice keeps its whole buffer alive (a reader's 64 KiB, or a frame of up to 32 MiB), so
/// a consumer that stops reading would hold a window of buffers for a window of small items:
/// 32 items of 100 B cost 2 MiB. Copied, they cost their size. A payload stays a slice only
/// when it is at least this long **and** longer than a quarter of its batch's body, so a
/// slice pins at most 4 times its size whatever the frame (the read buffer is 64 KiB, larger
/// frames and every unpacked PACKED body get a buffer of their own). The copy costs ~16 ns
/// per item (`cargo bench -p velo-mux`, 100 B items).
pub const COPY_BELOW: usize = 16 * 1024;

/// Why a worker's lane closes when its frontend sends a record only workers send.
const WORKER_RECORD_TO_WORKER: LaneError =
    LaneError::Protocol("a worker received a record only workers send");

/// A DATA or FINAL payload as it arrived: borrowed from `source`, the buffer it came in.
struct Arrived<'a> {
    payload: &'a [u8],
    source: &'a Bytes,
    /// Payloads shorter than this are copied into their stream's queue; longer ones are kept
    /// as slices of `source`.
    copy_below: usize,
}

impl<'a> Arrived<'a> {
    /// `payload` must lie within `source`.
    fn new(payload: &'a [u8], source: &'a Bytes, copy_below: usize) -> Self {
        Self {
            payload,
            source,
            copy_below,
        }
    }

    fn push_to(self, queue: &mut ItemQueue) {
        if self.payload.len() < self.copy_below {
            queue.push_copy(self.payload);
        } else {
            queue.push_bytes(self.source.slice_ref(self.payload));
        }
    }
}
