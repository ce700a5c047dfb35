//! Per-lane state: handshake parameters, the batch being built, sealed batches waiting for
//! the transport, timers, and (frontend) the lane's table of wire stream ids.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use velo_wire::{FRAME_HEADER_LEN, FrameDecoder, FrameKind, Packer, StreamId, frame_header};

use crate::StreamKey;
use crate::flush::{FlushPolicy, FlushReason, Pending};
use crate::wire_table::WireTable;

/// A lane's index within its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneId(pub u16);

impl std::fmt::Display for LaneId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lane {}", self.0)
    }
}

/// Where a lane is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LaneState {
    /// Not connected (yet, or again after a failure).
    Down,
    /// Handshake done; records flow.
    Up,
    /// Failed or closed; a CLOSE frame may still wait in [`Mux::poll_transmit`](crate::Mux::poll_transmit).
    Closed,
}

/// What the peer announced in its HELLO.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerParams {
    pub(crate) window: u32,
    pub(crate) max_frame_len: u32,
    pub(crate) heartbeat_interval: Duration,
}

#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) state: LaneState,
    pub(crate) peer: PeerParams,
    pub(crate) decoder: FrameDecoder,
    /// Live streams placed on this lane (for least-loaded placement).
    pub(crate) streams: u32,
    /// Frontend: worker slot -> stream, for streams opened on this lane and not released
    /// (an entry outlives a stream the worker ended, to catch records after its end).
    pub(crate) wire: WireTable,
    pub(crate) tx: Tx,
    pub(crate) last_rx: Instant,
    /// Since when the driver has been writing chunks it took from
    /// [`Mux::poll_transmit`](crate::Mux::poll_transmit) without reporting them written
    /// ([`Mux::handle_transmitted`](crate::Mux::handle_transmitted)).
    pub(crate) writing_since: Option<Instant>,
    /// The driver was told this lane has something to transmit and has not polled since.
    pub(crate) signalled: bool,
    /// A send was refused because the buffer was full: report `LaneWritable` once it drains.
    pub(crate) blocked: bool,
    /// Frontend: streams with unreturned credit, granted on the next sealed batch.
    pub(crate) grant_list: Vec<StreamKey>,
    /// Frontend: streams opened on this lane that the application has not answered yet
    /// (ACCEPT or CANCEL); at most `max_pending_opens`.
    pub(crate) pending_opens: u32,
    /// Worker: the streams opened on this lane, oldest first. A frontend that leaves the
    /// oldest unanswered (no ACCEPT, no CANCEL) for the idle timeout after its OPEN was taken
    /// for the transport, while the lane stays alive, is broken: the lane is closed (an OPEN
    /// still queued behind a backlog has not reached it yet). Answered entries are dropped as
    /// they reach the front; at most one per stream.
    pub(crate) unanswered: VecDeque<Unanswered>,
}

/// Worker: a stream whose OPEN the frontend has not answered yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unanswered {
    pub(crate) key: StreamKey,
    /// The chunk (`Tx::pushed_chunks` numbering) its OPEN goes out in.
    pub(crate) chunk: u64,
    /// When that chunk was taken for the transport.
    pub(crate) sent: Option<Instant>,
}

impl Lane {
    pub(crate) fn new(max_frame_len: u32, now: Instant) -> Self {
        Self {
            state: LaneState::Down,
            peer: PeerParams {
                window: 1,
                max_frame_len: velo_wire::MIN_MAX_FRAME_LEN,
                heartbeat_interval: Duration::from_secs(1),
            },
            decoder: FrameDecoder::new(max_frame_len),
            streams: 0,
            wire: WireTable::default(),
            tx: Tx::new(now),
            last_rx: now,
            writing_since: None,
            signalled: false,
            blocked: false,
            grant_list: Vec::new(),
            pending_opens: 0,
            unanswered: VecDeque::new(),
        }
    }

    pub(crate) fn wire_slot(&self, id: StreamId) -> Option<StreamKey> {
        self.wire.lookup(id)
    }

    pub(crate) fn clear_wire_slot(&mut self, id: StreamId) {
        self.wire.remove(id);
    }
}

/// The transmit side of a lane.
///
/// Records are encoded straight into `out`, where the open batch starts with a placeholder
/// frame header at `batch_start`. Sealing patches the header and moves the batch to `ready`
/// as a frozen `Bytes` (no copy; the buffer's allocation is reclaimed once the transport drops
/// it). Large payloads are not copied: their record gets a batch of its own whose payload is
/// chained as a separate `Bytes`, for a vectored write.
#[derive(Debug)]
pub(crate) struct Tx {
    pub(crate) out: BytesMut,
    /// An open batch exists in `out`.
    pub(crate) open: bool,
    pub(crate) records: u32,
    pub(crate) oldest: Option<Instant>,
    pub(crate) grant_deadline: Option<Instant>,
    pub(crate) urgent: bool,
    pub(crate) hinted: bool,
    /// A stream's first item is in the open batch.
    pub(crate) edge: bool,
    /// A stream's OPEN is in the open batch.
    pub(crate) open_edge: bool,
    /// A stream's end (FINAL or ERROR) is in the open batch.
    pub(crate) end_edge: bool,
    /// A stream spent half of its credit window, or the last of it, on a record in the open
    /// batch (see [`Pending::credit_low`]).
    pub(crate) credit_low: bool,
    /// The lane's earliest deadline moved earlier (a batch opened, or a first grant was
    /// queued): the driver must re-arm its timer.
    pub(crate) rearm: bool,
    /// Sealed chunks waiting for the transport, and their total length.
    pub(crate) ready: VecDeque<Bytes>,
    pub(crate) ready_bytes: usize,
    /// Control bytes (records carrying no stream payload) in the open batch.
    pub(crate) control_open: usize,
    /// Control bytes of each chunk in `ready`, in the same order, and their sum.
    ready_control: VecDeque<usize>,
    control_ready: usize,
    /// Records and batch count waiting in `ready`, for stats at hand-off.
    pub(crate) last_tx: Instant,
    /// Packs sealed batches: this side packs and the peer accepts PACKED frames.
    pub(crate) packer: Option<Packer>,
    /// Where packed frames are written (its spare capacity is reused like `out`'s).
    packed: BytesMut,
    /// Chunks ever pushed to `ready`, and ever taken for the transport: a record in the open
    /// batch goes out in chunk number `pushed_chunks`.
    pub(crate) pushed_chunks: u64,
    pub(crate) taken_chunks: u64,
}

/// A batch just sealed: its records, and the bytes packing saved (0 when sent as a BATCH).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sealed {
    pub(crate) records: u32,
    pub(crate) saved: usize,
}

/// Initial capacity of a lane's batch buffer, in bytes.
const TX_BUFFER: usize = 64 * 1024;

impl Tx {
    fn new(now: Instant) -> Self {
        Self {
            out: BytesMut::new(),
            open: false,
            records: 0,
            oldest: None,
            grant_deadline: None,
            urgent: false,
            hinted: false,
            edge: false,
            open_edge: false,
            end_edge: false,
            credit_low: false,
            rearm: false,
            ready: VecDeque::new(),
            ready_bytes: 0,
            control_open: 0,
            ready_control: VecDeque::new(),
            control_ready: 0,
            last_tx: now,
            packer: None,
            packed: BytesMut::new(),
            pushed_chunks: 0,
            taken_chunks: 0,
        }
    }

    /// Bytes held for the transport: the open batch plus sealed ones.
    pub(crate) fn buffered(&self) -> usize {
        self.out.len() + self.ready_bytes
    }

    /// Control bytes held for the transport (`max_control_bytes` bounds them).
    pub(crate) fn control_bytes(&self) -> usize {
        self.control_open + self.control_ready
    }

    /// Queues a sealed chunk holding `control` control bytes for the transport.
    pub(crate) fn push_ready(&mut self, chunk: Bytes, control: usize) {
        self.ready_bytes += chunk.len();
        self.control_ready += control;
        self.ready_control.push_back(control);
        self.ready.push_back(chunk);
        self.pushed_chunks += 1;
    }

    /// Takes the next sealed chunk for the transport.
    pub(crate) fn pop_ready(&mut self) -> Option<Bytes> {
        let chunk = self.ready.pop_front()?;
        self.taken_chunks += 1;
        self.ready_bytes -= chunk.len();
        self.control_ready -= self.ready_control.pop_front().unwrap_or(0);
        Some(chunk)
    }

    /// Body bytes of the open batch.
    pub(crate) fn batch_body_len(&self) -> usize {
        if self.open {
            self.out.len() - FRAME_HEADER_LEN
        } else {
            0
        }
    }

    pub(crate) fn pending(&self) -> Pending {
        Pending {
            records: self.records,
            bytes: self.batch_body_len(),
            oldest: self.oldest,
            grant_deadline: self.grant_deadline,
            urgent: self.urgent,
            hinted: self.hinted,
            edge: self.edge,
            open_edge: self.open_edge,
            end_edge: self.end_edge,
            credit_low: self.credit_low,
        }
    }

    /// Makes sure a batch is open with room for `len` more body bytes under `cap`, sealing
    /// the current one first if it would overflow. Returns the batch it sealed.
    pub(crate) fn room_for(&mut self, len: usize, cap: usize) -> Option<Sealed> {
        let mut sealed = None;
        if self.open && self.batch_body_len() + len > cap {
            sealed = self.seal();
        }
        if !self.open {
            if self.out.capacity() - self.out.len() < FRAME_HEADER_LEN + len {
                self.out.reserve((FRAME_HEADER_LEN + len).max(TX_BUFFER));
            }
            self.out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
            self.open = true;
        }
        sealed
    }

    /// Seals the open batch into `ready`, packed when that is on and shrinks it.
    pub(crate) fn seal(&mut self) -> Option<Sealed> {
        self.seal_with_tail(None)
    }

    /// Seals the open batch, whose last record's payload is `tail` (not in `out`; such a
    /// batch, one large item, is never packed).
    pub(crate) fn seal_with_tail(&mut self, tail: Option<Bytes>) -> Option<Sealed> {
        if !self.open {
            return None;
        }
        let tail_len = tail.as_ref().map_or(0, Bytes::len);
        let body = self.out.len() - FRAME_HEADER_LEN + tail_len;
        let body = u32::try_from(body).expect("batches are capped below the frame limit");
        let packed = match &mut self.packer {
            Some(packer) if tail.is_none() => {
                packer.pack(&self.out[FRAME_HEADER_LEN..], &mut self.packed)
            }
            _ => false,
        };
        let mut saved = 0;
        let chunk = if packed {
            saved = self.out.len() - self.packed.len();
            // The batch's buffer is written again from its start.
            self.out.clear();
            self.packed.split().freeze()
        } else {
            self.out[..FRAME_HEADER_LEN].copy_from_slice(&frame_header(FrameKind::Batch, body));
            self.out.split().freeze()
        };
        let control = std::mem::take(&mut self.control_open);
        self.push_ready(chunk, control);
        if let Some(t) = tail {
            self.push_ready(t, 0);
        }
        let sealed = Sealed {
            records: self.records,
            saved,
        };
        self.open = false;
        self.records = 0;
        self.oldest = None;
        self.grant_deadline = None;
        self.urgent = false;
        self.hinted = false;
        self.edge = false;
        self.open_edge = false;
        self.end_edge = false;
        self.credit_low = false;
        Some(sealed)
    }

    /// Whether the open batch should be flushed now, and why.
    pub(crate) fn due(
        &self,
        policy: &FlushPolicy,
        cap: usize,
        now: Instant,
    ) -> Option<FlushReason> {
        if !self.open {
            return None;
        }
        let policy = FlushPolicy {
            max_batch_bytes: policy.max_batch_bytes.min(cap),
            ..*policy
        };
        match policy.decide(&self.pending(), now) {
            crate::flush::Flush::Now(reason) => Some(reason),
            _ => None,
        }
    }

    /// Notes when the open batch's oldest record arrived; the first one moves the lane's
    /// deadline earlier.
    pub(crate) fn touch(&mut self, now: Instant) {
        if self.oldest.is_none() {
            self.oldest = Some(now);
            self.rearm = true;
        }
    }

    /// Drops everything queued (the lane failed).
    pub(crate) fn discard(&mut self) {
        self.out.clear();
        self.open = false;
        self.records = 0;
        self.oldest = None;
        self.grant_deadline = None;
        self.urgent = false;
        self.hinted = false;
        self.edge = false;
        self.open_edge = false;
        self.end_edge = false;
        self.credit_low = false;
        self.ready.clear();
        self.ready_bytes = 0;
        self.control_open = 0;
        self.ready_control.clear();
        self.control_ready = 0;
    }
}
