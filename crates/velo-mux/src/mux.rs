//! The mux: one connection (one worker process and one frontend instance, N lanes).
//!
//! This file holds the type, lane lifecycle, timers and the transmit path. The worker's
//! stream calls are in `send.rs`, the frontend's in `recv.rs`, and record dispatch in
//! `input.rs`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use velo_wire::{Close, CloseCode, Frame, Hello, Record};

use crate::flush::FlushReason;
use crate::lane::{Lane, LaneState, PeerParams};
use crate::slab::Slab;
use crate::state::{Event, State};
use crate::stream::{Half, Stream};
use crate::{
    LaneError, LaneId, MuxConfig, MuxEvent, MuxStats, Side, StreamEnd, StreamKey, TransportEnd,
};

/// Most chunks handed to the transport by one [`Mux::poll_transmit`]: well under `IOV_MAX`
/// (1,024 on Linux) so one vectored write takes them all.
pub const MAX_TRANSMIT_CHUNKS: usize = 64;

/// Payloads at least this long are chained as their own buffer instead of copied into the
/// batch (h2 chains above 256 bytes with vectored I/O; items here are typically 50-200 bytes,
/// so they are copied, and only large ones, such as a 1 MiB item, skip the copy).
pub const CHAIN_THRESHOLD: usize = 1024;

/// What one [`Mux::poll_transmit`] handed to the transport.
#[must_use = "the chunks must be written to the lane"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Total bytes in the chunks.
    pub bytes: usize,
    /// Number of chunks (buffers for one vectored write).
    pub chunks: usize,
}

/// Lanes whose driver should run [`Mux::poll_transmit`] now, as a bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaneSet(pub u64);

impl LaneSet {
    /// Whether no lane is in the set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The lanes in the set, lowest first (a bit scan: it costs one step per lane in the
    /// set, nothing for an empty set; drivers call it after every mux call).
    pub fn iter(self) -> impl Iterator<Item = LaneId> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let i = bits.trailing_zeros();
            bits &= bits - 1;
            // `i < 64`: a u64 has no more bits.
            u16::try_from(i).ok().map(LaneId)
        })
    }
}

/// A sans-IO multiplexer of response streams over the lanes of one connection.
///
/// # Call protocol
///
/// A driver (one per transport) owns the mux and runs the same loop for every lane:
///
/// 1. After a lane's handshake, [`handle_lane_up`](Self::handle_lane_up) with the peer's HELLO.
/// 2. Feed received bytes with [`handle_input`](Self::handle_input); report a dead transport
///    with [`handle_lane_lost`](Self::handle_lane_lost).
/// 3. After any call, drain [`poll_event`](Self::poll_event) (wake consumers and producers)
///    and [`poll_ready_lanes`](Self::poll_ready_lanes) (wake those lanes' writers).
/// 4. A lane writer calls [`poll_transmit`](Self::poll_transmit) and writes the chunks it
///    gets, in order, then reports them written with
///    [`handle_transmitted`](Self::handle_transmitted) and calls it again until it returns
///    `None`.
/// 5. Arm a timer for [`poll_timeout`](Self::poll_timeout) (or per lane,
///    [`lane_timeout`](Self::lane_timeout)) and call [`handle_timeout`](Self::handle_timeout)
///    when it fires, **also while a write is in progress**: that is how a peer that went
///    silent, or stopped reading, is detected (the lane closes with
///    [`LaneError::IdleTimeout`] or [`LaneError::WriteStalled`]; the driver then abandons the
///    write).
///
/// The application side uses [`open`](Self::open), [`send`](Self::send),
/// [`finish`](Self::finish) and [`reset`](Self::reset) on a worker, and
/// [`recv`](Self::recv), [`stop`](Self::stop), [`cancel`](Self::cancel) on a frontend; both
/// end with [`release`](Self::release). Time is always an argument: the mux never reads a
/// clock.
#[derive(Debug)]
pub struct Mux {
    pub(crate) config: MuxConfig,
    pub(crate) lanes: Vec<Lane>,
    pub(crate) streams: Slab<Stream>,
    pub(crate) events: VecDeque<MuxEvent>,
    pub(crate) ready_lanes: u64,
    pub(crate) stats: MuxStats,
    /// The peer sent GOAWAY with this code.
    pub(crate) peer_goaway: Option<velo_wire::GoAwayCode>,
    /// This side sent GOAWAY (once is enough).
    pub(crate) local_goaway: bool,
    /// The connection's churn budget (frontend).
    pub(crate) churn: crate::churn::ChurnBucket,
    /// Receive queues of released streams, for the next accepted ones (frontend).
    pub(crate) spare_queues: crate::spare::SpareQueues,
}

impl Mux {
    /// A mux with all lanes down.
    pub fn new(config: MuxConfig, now: Instant) -> Self {
        let lanes = (0..config.lanes)
            .map(|_| Lane::new(config.max_frame_len, now))
            .collect();
        Self {
            lanes,
            streams: Slab::new(),
            events: VecDeque::new(),
            ready_lanes: 0,
            stats: MuxStats::default(),
            peer_goaway: None,
            local_goaway: false,
            churn: crate::churn::ChurnBucket::new(config.churn, now),
            spare_queues: crate::spare::SpareQueues::default(),
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &MuxConfig {
        &self.config
    }

    /// Counters since creation.
    pub fn stats(&self) -> MuxStats {
        self.stats
    }

    /// Streams currently held (live or ended but not yet released).
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// The state of `lane`.
    pub fn lane_state(&self, lane: LaneId) -> LaneState {
        self.lanes
            .get(usize::from(lane.0))
            .map_or(LaneState::Closed, |l| l.state)
    }

    /// Live streams placed on `lane`.
    pub fn lane_streams(&self, lane: LaneId) -> u32 {
        self.lanes.get(usize::from(lane.0)).map_or(0, |l| l.streams)
    }

    /// Bytes queued on `lane` and not yet handed to the transport.
    pub fn lane_buffered(&self, lane: LaneId) -> usize {
        self.lanes
            .get(usize::from(lane.0))
            .map_or(0, |l| l.tx.buffered())
    }

    /// Whether everything queued on `lane` has been written: nothing buffered, and no chunk
    /// taken by [`poll_transmit`](Self::poll_transmit) still waiting for
    /// [`handle_transmitted`](Self::handle_transmitted). A lane that is not up counts as
    /// flushed.
    pub fn lane_flushed(&self, lane: LaneId) -> bool {
        self.lanes
            .get(usize::from(lane.0))
            .is_none_or(|l| l.tx.buffered() == 0 && l.writing_since.is_none())
    }

    /// Frontend: heap bytes of `lane`'s table from worker slots to streams (it follows the
    /// live streams, whatever slot numbers the worker uses).
    pub fn lane_table_bytes(&self, lane: LaneId) -> usize {
        self.lanes
            .get(usize::from(lane.0))
            .map_or(0, |l| l.wire.heap_bytes())
    }

    /// Frontend: entries `lane`'s list of streams with credit to return keeps allocated between
    /// batches: after a burst of streams, at most 1,024 (the rest is given back).
    pub fn lane_grant_list_capacity(&self, lane: LaneId) -> usize {
        self.lanes
            .get(usize::from(lane.0))
            .map_or(0, |l| l.grant_list.capacity())
    }

    /// Frontend: receive queues of released streams kept for the next accepted ones (at most
    /// 256, each of at most 64 items).
    pub fn spare_queue_count(&self) -> usize {
        self.spare_queues.len()
    }

    /// Whether the driver should read more input for `lane`: not while the bytes queued for
    /// the peer on it are at [`MuxConfig::max_buffered_bytes`], its control bytes at half
    /// of [`MuxConfig::max_control_bytes`] (input can queue more: refused OPENs, violations),
    /// or its unanswered OPENs at half of [`MuxConfig::max_pending_opens`] (a reader that ran
    /// ahead of the application would refuse a legitimate burst of OPENs past the cap).
    /// A driver that gets `false` stops reading until [`MuxEvent::LaneWritable`] (the peer
    /// read enough, or the application answered) or the lane closes, so a peer that sends
    /// without reading cannot grow this side's queue.
    pub fn wants_input(&mut self, lane: LaneId) -> bool {
        let max = self.config.max_buffered_bytes;
        let max_control = self.config.max_control_bytes / 2;
        let max_pending = self.config.pending_opens_pause();
        let Some(l) = self.lanes.get_mut(usize::from(lane.0)) else {
            return true;
        };
        if l.state != LaneState::Up
            || (l.tx.buffered() < max
                && l.tx.control_bytes() < max_control
                && l.pending_opens < max_pending)
        {
            return true;
        }
        l.blocked = true;
        self.stats.input_pauses += 1;
        false
    }

    /// Whether any lane is up.
    pub fn is_connected(&self) -> bool {
        self.lanes.iter().any(|l| l.state == LaneState::Up)
    }

    /// The peer's GOAWAY code, if it sent one.
    pub fn peer_going_away(&self) -> Option<velo_wire::GoAwayCode> {
        self.peer_goaway
    }

    /// The lane a stream was placed on.
    pub fn stream_lane(&self, key: StreamKey) -> Option<LaneId> {
        self.streams.get(key).map(|s| s.lane)
    }

    /// A stream's lifecycle state.
    pub fn stream_state(&self, key: StreamKey) -> Option<State> {
        self.streams.get(key).map(|s| s.state)
    }

    /// A stream's id on the wire.
    pub fn stream_wire_id(&self, key: StreamKey) -> Option<velo_wire::StreamId> {
        self.streams.get(key).map(|s| s.wire)
    }

    /// Marks `lane` up after its handshake; `peer` is the peer's HELLO (already checked with
    /// [`handshake::Expect`](crate::handshake::Expect)). A lane that was closed comes back
    /// with fresh state.
    ///
    /// # Panics
    ///
    /// If `lane` is not below the configured lane count (a driver bug).
    pub fn handle_lane_up(&mut self, now: Instant, lane: LaneId, peer: &Hello) {
        let max_frame_len = self.config.max_frame_len;
        let l = self
            .lanes
            .get_mut(usize::from(lane.0))
            .expect("lane index below the configured count");
        if l.state == LaneState::Up {
            self.close_lane(lane, LaneError::Transport(TransportEnd::Replaced));
        }
        let l = &mut self.lanes[usize::from(lane.0)];
        *l = Lane::new(max_frame_len, now);
        l.state = LaneState::Up;
        l.decoder.accept_packed();
        if self.config.compression == crate::config::Compression::Lz4
            && peer.capabilities & velo_wire::CAP_PACKED != 0
        {
            l.tx.packer = Some(velo_wire::Packer::default());
        }
        l.peer = PeerParams {
            window: peer.initial_window,
            max_frame_len: peer.max_frame_len,
            // The peer closes after idle_timeout_ms of silence: speak at least 3 times as often
            // (never more often than for the shortest timeout a HELLO may announce, whatever
            // a driver let through).
            heartbeat_interval: Duration::from_millis(u64::from(peer.idle_timeout_ms)).clamp(
                crate::handshake::MIN_IDLE_TIMEOUT,
                crate::handshake::MAX_IDLE_TIMEOUT,
            ) / 3,
        };
        self.stats.lanes_up += 1;
    }

    /// Reports that `lane`'s transport failed or ended. Every live stream on it ends, exactly
    /// once, with `reason`.
    pub fn handle_lane_lost(&mut self, lane: LaneId, end: TransportEnd) {
        self.close_lane(lane, LaneError::Transport(end));
    }

    /// Closes `lane` from this side (for example at shutdown): its streams end as lost, and a
    /// CLOSE frame with `code` and `reason` waits in [`poll_transmit`](Self::poll_transmit).
    pub fn close(&mut self, lane: LaneId, code: CloseCode, reason: impl Into<String>) {
        self.close_lane(
            lane,
            LaneError::Local {
                code,
                reason: reason.into(),
            },
        );
    }

    /// Tells the peer (GOAWAY on every lane, once) that this side takes no new streams on
    /// this connection: a worker opens no more streams on it (it opens them on a new
    /// connection), and open streams finish normally. OPENs already on their way when the
    /// GOAWAY left still arrive as [`MuxEvent::Opened`]: the frontend's application decides
    /// (it serves the streams it registered before going away).
    pub fn go_away(&mut self, now: Instant, code: velo_wire::GoAwayCode) {
        if std::mem::replace(&mut self.local_goaway, true) {
            return;
        }
        for i in 0..self.lanes.len() {
            let lane = lane_id(i);
            if self.lanes[i].state == LaneState::Up {
                self.push_record(lane, &Record::GoAway { code }, true);
                self.update_ready(lane, now);
            }
        }
    }

    /// Flushes every lane's open batch now: the engine's once-per-forward-pass hint.
    pub fn flush_hint(&mut self, now: Instant) {
        for i in 0..self.lanes.len() {
            if self.lanes[i].tx.open {
                self.lanes[i].tx.hinted = true;
                self.update_ready(lane_id(i), now);
            }
        }
    }

    /// The next event for the driver, if any.
    pub fn poll_event(&mut self) -> Option<MuxEvent> {
        self.events.pop_front()
    }

    /// The lanes [`poll_ready_lanes`](Self::poll_ready_lanes) would return, without taking
    /// them.
    pub fn ready_lanes(&self) -> LaneSet {
        LaneSet(self.ready_lanes)
    }

    /// Lanes whose writer should run and has not been told yet: something is due for
    /// transmission, or the lane's earliest deadline moved earlier (a batch opened) so the
    /// writer must re-arm its timer from [`lane_timeout`](Self::lane_timeout).
    pub fn poll_ready_lanes(&mut self) -> LaneSet {
        LaneSet(std::mem::take(&mut self.ready_lanes))
    }

    /// Hands `lane`'s due batches to the transport: appends up to [`MAX_TRANSMIT_CHUNKS`]
    /// chunks to `out`, to be written in order. `None` when there is nothing to write.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        lane: LaneId,
        out: &mut Vec<Bytes>,
    ) -> Option<Transmit> {
        let i = usize::from(lane.0);
        let cap = self.batch_cap(i);
        let l = self.lanes.get_mut(i)?;
        l.signalled = false;
        if l.state == LaneState::Up
            && let Some(reason) = l.tx.due(&self.config.flush, cap, now)
        {
            self.seal(lane, reason);
        }
        let l = &mut self.lanes[i];
        if l.tx.ready.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut chunks = 0;
        while chunks < MAX_TRANSMIT_CHUNKS {
            let Some(chunk) = l.tx.pop_ready() else {
                break;
            };
            bytes += chunk.len();
            chunks += 1;
            out.push(chunk);
        }
        let taken = l.tx.taken_chunks;
        for u in l.unanswered.iter_mut().take_while(|u| u.chunk < taken) {
            u.sent.get_or_insert(now);
        }
        l.tx.last_tx = now;
        l.writing_since.get_or_insert(now);
        self.stats.bytes_sent += bytes as u64;
        if !l.tx.ready.is_empty() {
            // More than one transmit's worth: the writer must come back.
            l.signalled = true;
            self.ready_lanes |= 1 << lane.0;
        }
        self.resume_input(lane);
        Some(Transmit { bytes, chunks })
    }

    /// Reports that every chunk taken from [`poll_transmit`](Self::poll_transmit) on `lane`
    /// has been written. Until then the lane counts as writing: its only timers are the idle
    /// timeout and the write-stall timeout (the same length), since nothing else can go out.
    pub fn handle_transmitted(&mut self, now: Instant, lane: LaneId) {
        if let Some(l) = self.lanes.get_mut(usize::from(lane.0)) {
            l.writing_since = None;
            l.tx.last_tx = now;
        }
    }

    /// The earliest instant at which [`handle_timeout`](Self::handle_timeout) has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        (0..self.lanes.len())
            .filter_map(|i| self.lane_timeout(lane_id(i)))
            .min()
    }

    /// The earliest instant at which `lane` has timer work: a flush deadline, a heartbeat or
    /// the idle timeout.
    pub fn lane_timeout(&self, lane: LaneId) -> Option<Instant> {
        let l = self.lanes.get(usize::from(lane.0))?;
        if l.state != LaneState::Up {
            return None;
        }
        let idle = l.last_rx + self.config.idle_timeout;
        if let Some(since) = l.writing_since {
            // Mid-write nothing else can go out: only the two liveness bounds matter.
            return Some(idle.min(since + self.config.idle_timeout));
        }
        let heartbeat = l.tx.last_tx + l.peer.heartbeat_interval;
        let mut t = idle.min(heartbeat);
        if let Some(sent) = self.oldest_unanswered(l) {
            t = t.min(sent + self.config.idle_timeout);
        }
        if l.tx.open {
            if let Some(oldest) = l.tx.oldest {
                t = t.min(oldest + self.config.flush.max_delay);
            }
            if let Some(g) = l.tx.grant_deadline {
                t = t.min(g);
            }
        }
        Some(t)
    }

    /// Runs timer work due at `now`: idle lanes are closed, and so are lanes whose write has
    /// been stuck for the idle timeout; heartbeats are queued and batches whose deadline
    /// passed marked ready.
    pub fn handle_timeout(&mut self, now: Instant) {
        for i in 0..self.lanes.len() {
            self.handle_lane_timeout(now, lane_id(i));
        }
    }

    /// [`handle_timeout`](Self::handle_timeout) for one lane.
    pub fn handle_lane_timeout(&mut self, now: Instant, lane: LaneId) {
        let idle_timeout = self.config.idle_timeout;
        let Some(l) = self.lanes.get_mut(usize::from(lane.0)) else {
            return;
        };
        if l.state != LaneState::Up {
            return;
        }
        if now.saturating_duration_since(l.last_rx) >= idle_timeout {
            self.close_lane(lane, LaneError::IdleTimeout(idle_timeout));
            return;
        }
        if let Some(since) = l.writing_since {
            if now.saturating_duration_since(since) >= idle_timeout {
                self.close_lane(lane, LaneError::WriteStalled(idle_timeout));
            }
            return;
        }
        self.drop_answered(lane);
        let l = &mut self.lanes[usize::from(lane.0)];
        if let Some(sent) = l.unanswered.front().and_then(|u| u.sent)
            && now.saturating_duration_since(sent) >= idle_timeout
        {
            self.close_lane(lane, LaneError::Unanswered(idle_timeout));
            return;
        }
        let heartbeat_due =
            now.saturating_duration_since(l.tx.last_tx) >= l.peer.heartbeat_interval;
        if heartbeat_due && !l.tx.urgent && l.tx.ready.is_empty() {
            self.push_record(lane, &Record::Heartbeat, true);
            self.stats.heartbeats_sent += 1;
        }
        self.update_ready(lane, now);
    }

    // ----- internals shared by send.rs, recv.rs and input.rs -----

    /// Largest batch body for lane `i`: the policy's cap, within the peer's frame limit.
    pub(crate) fn batch_cap(&self, i: usize) -> usize {
        let peer = self
            .lanes
            .get(i)
            .map_or(velo_wire::MIN_MAX_FRAME_LEN, |l| l.peer.max_frame_len);
        self.config.flush.max_batch_bytes.min(peer as usize)
    }

    /// Largest payload the peer of lane `i` accepts in one record.
    pub(crate) fn record_cap(&self, i: usize) -> u32 {
        let peer = self
            .lanes
            .get(i)
            .map_or(velo_wire::MIN_MAX_FRAME_LEN, |l| l.peer.max_frame_len);
        peer.min(self.config.max_frame_len).saturating_sub(64)
    }

    /// Appends a small record to `lane`'s open batch. `urgent` records flush it at once.
    pub(crate) fn push_record(&mut self, lane: LaneId, record: &Record, urgent: bool) {
        let i = usize::from(lane.0);
        let cap = self.batch_cap(i);
        let tx = &mut self.lanes[i].tx;
        if let Some(n) = tx.room_for(record.encoded_len(), cap) {
            self.stats.record_batch(n);
            self.stats.record_flush(FlushReason::Size);
        }
        record.encode(&mut tx.out);
        if crate::caps::is_control(record) {
            tx.control_open += record.encoded_len();
        }
        tx.records += 1;
        tx.urgent |= urgent;
        self.stats.records_sent += 1;
    }

    /// Appends a record written by `encode` (of `len` bytes) to `lane`'s open batch.
    pub(crate) fn push_with(
        &mut self,
        lane: LaneId,
        len: usize,
        now: Instant,
        encode: impl FnOnce(&mut BytesMut),
    ) {
        let i = usize::from(lane.0);
        let cap = self.batch_cap(i);
        let tx = &mut self.lanes[i].tx;
        if let Some(n) = tx.room_for(len, cap) {
            self.stats.record_batch(n);
            self.stats.record_flush(FlushReason::Size);
        }
        encode(&mut tx.out);
        tx.records += 1;
        tx.touch(now);
        self.stats.records_sent += 1;
    }

    /// Sends a record whose large `payload` is chained, not copied: it gets a batch of its
    /// own, sealed at once.
    pub(crate) fn push_chained(
        &mut self,
        lane: LaneId,
        header_len: usize,
        payload: Bytes,
        encode_header: impl FnOnce(&mut BytesMut),
    ) {
        let i = usize::from(lane.0);
        let tx = &mut self.lanes[i].tx;
        if let Some(n) = tx.seal() {
            self.stats.record_batch(n);
            self.stats.record_flush(FlushReason::Size);
        }
        let sealed = tx.room_for(header_len, usize::MAX);
        debug_assert!(sealed.is_none(), "the batch was sealed just above");
        encode_header(&mut tx.out);
        tx.records += 1;
        let sealed = tx.seal_with_tail(Some(payload));
        self.stats
            .record_batch(sealed.unwrap_or(crate::lane::Sealed {
                records: 1,
                saved: 0,
            }));
        self.stats.record_flush(FlushReason::Size);
        self.stats.records_sent += 1;
    }

    /// Seals `lane`'s open batch for `reason`, first adding credit grants waiting to ride along.
    pub(crate) fn seal(&mut self, lane: LaneId, reason: FlushReason) {
        if self.config.side == Side::Frontend {
            self.piggyback_grants(lane);
        }
        let Some(n) = self.lanes[usize::from(lane.0)].tx.seal() else {
            return;
        };
        self.stats.record_batch(n);
        self.stats.record_flush(reason);
    }

    /// Tells the driver `lane` should transmit if its batch is due or chunks wait.
    pub(crate) fn update_ready(&mut self, lane: LaneId, now: Instant) {
        let i = usize::from(lane.0);
        let cap = self.batch_cap(i);
        let l = &mut self.lanes[i];
        let rearm = std::mem::take(&mut l.tx.rearm);
        if l.signalled || l.state == LaneState::Down {
            return;
        }
        if rearm || !l.tx.ready.is_empty() || l.tx.due(&self.config.flush, cap, now).is_some() {
            l.signalled = true;
            self.ready_lanes |= 1 << lane.0;
        }
    }

    /// Ends every live stream of `lane` with `error`, discards its queue, queues a CLOSE
    /// frame when the error calls for one, and reports `LaneClosed`.
    pub(crate) fn close_lane(&mut self, lane: LaneId, error: LaneError) {
        let i = usize::from(lane.0);
        let Some(l) = self.lanes.get(i) else { return };
        if l.state == LaneState::Closed {
            return;
        }
        let was_up = l.state == LaneState::Up;
        let on_lane: Vec<(StreamKey, bool)> = self
            .streams
            .iter()
            .filter(|(_, s)| s.lane == lane)
            .filter_map(|(k, s)| match &s.half {
                _ if s.state.is_live() => Some((k, true)),
                // Ended by this worker before the frontend accepted it: not delivered.
                Half::Send(h) if h.awaits_delivery() => Some((k, false)),
                _ => None,
            })
            .collect();
        for &(key, _) in &on_lane {
            self.announce_if_unseen(key);
        }
        for (key, live) in on_lane {
            let end = StreamEnd::Lost(error.clone());
            if live {
                self.end_stream(key, Event::LaneLost, end);
            } else {
                self.end_undelivered(key, end);
            }
        }
        self.forget_pending(lane);
        let l = &mut self.lanes[i];
        l.tx.discard();
        l.wire.clear();
        l.grant_list.clear();
        l.unanswered.clear();
        l.state = LaneState::Closed;
        l.signalled = false;
        if let (true, Some(code)) = (was_up, error.close_code()) {
            let mut buf = BytesMut::new();
            Frame::Close(Close::new(code, error.to_string())).encode(&mut buf);
            l.tx.push_ready(buf.freeze(), 0);
        }
        self.stats.lanes_closed += 1;
        tracing::debug!(%lane, %error, "lane closed");
        self.events.push_back(MuxEvent::LaneClosed { lane, error });
        self.update_ready_closed(lane);
    }

    /// Worker: when the OPEN of the oldest stream of lane `l` the frontend has not answered
    /// was taken for the transport (`None` while it waits in the lane's queue).
    fn oldest_unanswered(&self, l: &Lane) -> Option<Instant> {
        l.unanswered
            .iter()
            .find(|u| self.awaits_answer(u.key))
            .and_then(|u| u.sent)
    }

    /// Worker: whether the frontend has answered stream `key` neither with ACCEPT nor with
    /// CANCEL, while it is live or its end waits for that answer.
    fn awaits_answer(&self, key: StreamKey) -> bool {
        matches!(
            self.streams.get(key),
            Some(Stream { half: Half::Send(h), state, .. })
                if !h.accepted && (state.is_live() || h.awaits_delivery())
        )
    }

    /// Worker: drops the answered streams at the front of `lane`'s unanswered list.
    pub(crate) fn drop_answered(&mut self, lane: LaneId) {
        let i = usize::from(lane.0);
        while let Some(key) = self
            .lanes
            .get(i)
            .and_then(|l| l.unanswered.front())
            .map(|u| u.key)
        {
            if self.awaits_answer(key) {
                return;
            }
            self.lanes[i].unanswered.pop_front();
        }
    }

    /// Worker: a stream the frontend had not accepted when its lane died may never have
    /// reached it, and its request would wait for it: ask for the loss to be announced on
    /// another lane ([`MuxEvent::LostBeforeAccept`]).
    fn announce_if_unseen(&mut self, key: StreamKey) {
        if let Some(Stream {
            half: Half::Send(h),
            ..
        }) = self.streams.get(key)
            && !h.accepted
            && h.announcements > 0
        {
            self.stats.opens_lost += 1;
            self.events.push_back(MuxEvent::LostBeforeAccept {
                ticket: h.ticket,
                token: h.token,
                remaining: h.announcements - 1,
            });
        }
    }

    fn update_ready_closed(&mut self, lane: LaneId) {
        let l = &mut self.lanes[usize::from(lane.0)];
        if !l.tx.ready.is_empty() && !l.signalled {
            l.signalled = true;
            self.ready_lanes |= 1 << lane.0;
        }
    }

    /// Moves a live stream to its end: state, counters, lane load, and what each side is told
    /// (a frontend reads the end after its queued items; a worker gets `Closed`, unless it
    /// ended the stream itself).
    pub(crate) fn end_stream(&mut self, key: StreamKey, event: Event, end: StreamEnd) {
        let Some(s) = self.streams.get_mut(key) else {
            return;
        };
        let Ok(next) = s.state.on(event) else { return };
        s.state = next;
        let lane = usize::from(s.lane.0);
        let wire = s.wire;
        let end_kind = match &end {
            StreamEnd::Finished | StreamEnd::Error { .. } => EndKind::Worker,
            _ => EndKind::Other,
        };
        match &end {
            StreamEnd::Finished => self.stats.streams_finished += 1,
            StreamEnd::Error { .. } | StreamEnd::Reset(_) => self.stats.streams_errored += 1,
            StreamEnd::Cancelled(_) => self.stats.streams_cancelled += 1,
            StreamEnd::Lost(_) => self.stats.streams_lost += 1,
            StreamEnd::Violation(_) => self.stats.streams_violated += 1,
        }
        match &mut s.half {
            Half::Send(h) => {
                let remote = match &end {
                    StreamEnd::Cancelled(code) => Some(crate::CloseReason::Cancelled(*code)),
                    StreamEnd::Lost(e) => Some(crate::CloseReason::Lost(e.clone())),
                    _ => None,
                };
                h.end = Some(end);
                if let Some(reason) = remote {
                    self.events.push_back(MuxEvent::Closed {
                        stream: key,
                        reason,
                    });
                }
            }
            Half::Recv(r) => {
                r.end = Some(end);
                if !r.readable_signalled {
                    r.readable_signalled = true;
                    self.events.push_back(MuxEvent::Readable(key));
                }
            }
        }
        // A stream the worker ended keeps its entry until it is released, so a record after
        // its end is recognised as the worker's error, not mistaken for a stale one.
        let worker_ended = matches!(end_kind, EndKind::Worker);
        if let Some(l) = self.lanes.get_mut(lane) {
            l.streams = l.streams.saturating_sub(1);
            if self.config.side == Side::Frontend && !worker_ended {
                l.clear_wire_slot(wire);
            }
        }
    }
}

/// Who ended a stream, as far as the frontend's wire table cares.
#[derive(Clone, Copy)]
enum EndKind {
    /// The worker, with FINAL or ERROR: nothing more may come for it.
    Worker,
    /// Anything else (cancel, lane loss, violation): records may still be in flight.
    Other,
}

pub(crate) fn lane_id(i: usize) -> LaneId {
    LaneId(u16::try_from(i).expect("at most 64 lanes"))
}

#[cfg(test)]
mod lane_set_tests {
    use super::*;

    #[test]
    fn a_lane_set_yields_its_lanes_lowest_first() {
        let got: Vec<u16> = LaneSet(
            0b1000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0000_0101,
        )
        .iter()
        .map(|l| l.0)
        .collect();
        assert_eq!(got, vec![0, 2, 63]);
        assert_eq!(LaneSet(0).iter().count(), 0);
        assert_eq!(LaneSet(u64::MAX).iter().count(), 64);
    }
}
