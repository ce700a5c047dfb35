//! The `mux` fuzz target's world: a worker and a frontend mux joined by in-memory lanes that
//! move bytes only when an operation says so, as a driver would (it reads only while
//! [`Mux::wants_input`], runs each lane's timers before writing, and closes the transport
//! after a lane's CLOSE frame).

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use velo_wire::{CloseCode, InstanceId, Record, StreamId, Token};

use super::model::Model;
use super::ops::{Op, Who};
use crate::{LaneId, LaneState, Mux, MuxConfig};

/// The worker's instance id in every fuzz run.
const WORKER_ID: InstanceId = InstanceId::from_u128(1);
/// The frontend's instance id in every fuzz run.
const FRONTEND_ID: InstanceId = InstanceId::from_u128(2);

/// Length of a chained item (above [`CHAIN_THRESHOLD`](crate::CHAIN_THRESHOLD), below the
/// smallest record limit a peer may announce).
pub(crate) const BIG_ITEM: usize = 3000;

/// Slots at and above this are never a live stream in a fuzz run (the configurations allow
/// at most 64 streams): injected records use them as stale ids.
const STALE_SLOT: u32 = 4096;

/// A worker and a frontend mux with their lanes, on a virtual clock.
pub(crate) struct World {
    pub(crate) worker: Mux,
    pub(crate) frontend: Mux,
    pub(crate) now: Instant,
    pub(crate) lanes: u16,
    /// Bytes in flight, by sender (`Who` index) and lane.
    pub(crate) wire: [Vec<Vec<u8>>; 2],
    /// Receive buffers, by sender and lane (the receiver's side of that lane).
    pub(crate) rx: [Vec<BytesMut>; 2],
    chunks: Vec<Bytes>,
    pub(crate) model: Model,
}

impl World {
    /// Both muxes with every lane up.
    pub(crate) fn new((worker, frontend): (MuxConfig, MuxConfig), now: Instant) -> Self {
        let lanes = worker.lanes();
        let n = usize::from(lanes);
        let mut world = Self {
            worker: Mux::new(worker, now),
            frontend: Mux::new(frontend, now),
            now,
            lanes,
            wire: [vec![Vec::new(); n], vec![Vec::new(); n]],
            rx: [vec![BytesMut::new(); n], vec![BytesMut::new(); n]],
            chunks: Vec::new(),
            model: Model::default(),
        };
        for lane in 0..lanes {
            world.lane_up(LaneId(lane));
        }
        world
    }

    pub(crate) fn mux(&mut self, who: Who) -> &mut Mux {
        match who {
            Who::Worker => &mut self.worker,
            Who::Frontend => &mut self.frontend,
        }
    }

    fn lane(&self, lane: u8) -> LaneId {
        LaneId(u16::from(lane) % self.lanes)
    }

    /// Runs one operation, then checks every invariant and bound.
    pub(crate) fn apply(&mut self, op: Op) {
        match op {
            Op::Open { prologue } => self.open(prologue),
            Op::Send { stream, n, len } => self.send(stream, n, len),
            Op::SendBig { stream } => self.send_big(stream),
            Op::Finish { stream, len } => self.finish(stream, len),
            Op::Reset { stream } => self.reset(stream),
            Op::Read { stream, n } => self.read(stream, usize::from(n)),
            Op::ReadAll { stream } => self.read_all(stream),
            Op::Stop { stream } => self.stop(stream),
            Op::Cancel { stream, code } => self.cancel(stream, code),
            Op::Release { who, stream } => self.release(who, stream),
            Op::FlushHint { who } => {
                let now = self.now;
                self.mux(who).flush_hint(now);
            }
            Op::GoAway { who, code } => {
                let now = self.now;
                self.mux(who)
                    .go_away(now, velo_wire::GoAwayCode(u32::from(code)));
            }
            Op::Transmit { who, lane } => {
                self.transmit(who, self.lane(lane));
            }
            Op::Deliver { who, lane, max } => {
                let max = if max == 0 {
                    usize::MAX
                } else {
                    usize::from(max)
                };
                self.deliver(who, self.lane(lane), max);
            }
            Op::Pump => {
                self.pump();
            }
            Op::Advance { ms } => self.advance(Duration::from_millis(u64::from(ms))),
            Op::Close { who, lane } => {
                let lane = self.lane(lane);
                self.mux(who)
                    .close(lane, CloseCode::SHUTTING_DOWN, "closed by the fuzz run");
            }
            Op::KillLane { lane } => self.kill_lane(self.lane(lane)),
            Op::LaneUp { lane } => self.reconnect(self.lane(lane)),
            Op::InjectFrame { who, lane, body } => self.inject_frame(who, lane, &body),
            Op::InjectRecord {
                who,
                lane,
                kind,
                stream,
                value,
            } => self.inject_record(who, lane, kind, stream, value),
            Op::InjectRaw { who, lane, bytes } => {
                self.model.taint_all();
                let lane = usize::from(self.lane(lane).0);
                self.wire[who as usize][lane].extend_from_slice(&bytes);
            }
            Op::Settle => self.settle(),
        }
        self.absorb();
        self.check();
    }

    /// Puts `lane` up on both sides with fresh state (a new connection).
    fn lane_up(&mut self, lane: LaneId) {
        let i = usize::from(lane.0);
        for side in 0..2 {
            self.wire[side][i].clear();
            self.rx[side][i].clear();
        }
        let to_worker = self.frontend.config().hello(lane.0, FRONTEND_ID, WORKER_ID);
        let to_frontend = self.worker.config().hello(lane.0, WORKER_ID, FRONTEND_ID);
        self.worker.handle_lane_up(self.now, lane, &to_worker);
        self.frontend.handle_lane_up(self.now, lane, &to_frontend);
    }

    /// A new connection for `lane` unless it is up on both sides.
    fn reconnect(&mut self, lane: LaneId) {
        let up = |m: &Mux| m.lane_state(lane) == LaneState::Up;
        if !(up(&self.worker) && up(&self.frontend)) {
            self.absorb();
            self.lane_up(lane);
        }
    }

    fn kill_lane(&mut self, lane: LaneId) {
        let i = usize::from(lane.0);
        for side in 0..2 {
            self.wire[side][i].clear();
            self.rx[side][i].clear();
        }
        self.worker
            .handle_lane_lost(lane, crate::TransportEnd::Aborted);
        self.frontend
            .handle_lane_lost(lane, crate::TransportEnd::Aborted);
    }

    /// The lane writer of `who`: timers, then one transmit, written at once. Returns whether
    /// anything was written.
    pub(crate) fn transmit(&mut self, who: Who, lane: LaneId) -> bool {
        let now = self.now;
        let mut chunks = std::mem::take(&mut self.chunks);
        let mux = self.mux(who);
        mux.handle_lane_timeout(now, lane);
        let sent = mux.poll_transmit(now, lane, &mut chunks).is_some();
        if sent {
            mux.handle_transmitted(now, lane);
        }
        let wire = &mut self.wire[who as usize][usize::from(lane.0)];
        for chunk in chunks.drain(..) {
            wire.extend_from_slice(&chunk);
        }
        self.chunks = chunks;
        self.absorb();
        sent
    }

    /// Moves up to `max` bytes `who` sent on `lane` into the receiver, if it reads now.
    /// Returns whether any byte moved.
    pub(crate) fn deliver(&mut self, who: Who, lane: LaneId, max: usize) -> bool {
        let i = usize::from(lane.0);
        let n = self.wire[who as usize][i].len().min(max);
        let receiver = match who {
            Who::Worker => Who::Frontend,
            Who::Frontend => Who::Worker,
        };
        if n == 0 || !self.mux(receiver).wants_input(lane) {
            return false;
        }
        let bytes: Vec<u8> = self.wire[who as usize][i].drain(..n).collect();
        let mut rx = std::mem::take(&mut self.rx[who as usize][i]);
        rx.extend_from_slice(&bytes);
        let now = self.now;
        let result = self.mux(receiver).handle_input(now, lane, &mut rx);
        self.check_leftover(receiver, lane, &rx, result.is_ok());
        self.rx[who as usize][i] = rx;
        self.absorb();
        true
    }

    /// Every writer transmits all it has, everything in flight is delivered, and a lane one
    /// side has closed (its CLOSE frame gone) ends for the other side too, as its transport
    /// closes. Returns whether anything moved.
    pub(crate) fn pump(&mut self) -> bool {
        let mut moved = false;
        for lane in (0..self.lanes).map(LaneId) {
            for who in [Who::Worker, Who::Frontend] {
                while self.transmit(who, lane) {
                    moved = true;
                }
                moved |= self.deliver(who, lane, usize::MAX);
            }
            moved |= self.close_half_closed(lane);
        }
        moved
    }

    /// A lane closed on one side, with nothing left to write or in flight from it: the
    /// driver closed the transport, so the other side loses the lane.
    fn close_half_closed(&mut self, lane: LaneId) -> bool {
        let i = usize::from(lane.0);
        for (who, other) in [(Who::Worker, Who::Frontend), (Who::Frontend, Who::Worker)] {
            let done = self.mux(who).lane_state(lane) == LaneState::Closed
                && self.mux(who).lane_buffered(lane) == 0
                && self.wire[who as usize][i].is_empty();
            if done && self.mux(other).lane_state(lane) == LaneState::Up {
                self.mux(other)
                    .handle_lane_lost(lane, crate::TransportEnd::Closed);
                self.absorb();
                return true;
            }
        }
        false
    }

    /// Virtual time moves on by `d`; both sides run their timers.
    pub(crate) fn advance(&mut self, d: Duration) {
        self.now += d;
        let now = self.now;
        self.worker.handle_timeout(now);
        self.frontend.handle_timeout(now);
    }

    /// A BATCH frame with `body` from `who`, delivered at a frame boundary: only when the
    /// receiver holds no partial frame and nothing is in flight before it.
    fn inject_frame(&mut self, who: Who, lane: u8, body: &[u8]) {
        let lane = self.lane(lane);
        let i = usize::from(lane.0);
        if !self.rx[who as usize][i].is_empty() || !self.wire[who as usize][i].is_empty() {
            return;
        }
        self.model.taint_all();
        let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
        let wire = &mut self.wire[who as usize][i];
        wire.extend_from_slice(&velo_wire::frame_header(velo_wire::FrameKind::Batch, len));
        wire.extend_from_slice(body);
        self.deliver(who, lane, usize::MAX);
    }

    /// One well-formed record from `who` for the stream the fuzzer names (which is then no
    /// longer checked against the model), or for a stale id.
    fn inject_record(&mut self, who: Who, lane: u8, kind: u8, stream: u8, value: u32) {
        let lane = self.lane(lane);
        let i = usize::from(lane.0);
        if !self.rx[who as usize][i].is_empty() || !self.wire[who as usize][i].is_empty() {
            return;
        }
        let id = match self.model.wire_id(stream, &self.worker) {
            Some((index, id)) if kind & 0x80 == 0 => {
                self.model.taint(index);
                id
            }
            _ => StreamId::new(STALE_SLOT + u32::from(stream), value % 4),
        };
        let record = injected_record(kind, id, value);
        let mut body = BytesMut::new();
        record.encode(&mut body);
        let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
        let wire = &mut self.wire[who as usize][i];
        wire.extend_from_slice(&velo_wire::frame_header(velo_wire::FrameKind::Batch, len));
        wire.extend_from_slice(&body);
        self.deliver(who, lane, usize::MAX);
    }
}

/// A record of kind `kind` (low bits) for `id`, its fields taken from `value`. OPENs carry
/// ticket 0, which no fuzz stream has, so the frontend refuses them.
fn injected_record(kind: u8, id: StreamId, value: u32) -> Record {
    let small = Bytes::from(value.to_le_bytes().to_vec());
    match kind % 9 {
        0 => Record::Open {
            stream: id,
            ticket: 0,
            token: Token([0; 16]),
            prologue: small,
        },
        1 => Record::Data {
            stream: id,
            seq: value % 8,
            payload: small,
        },
        2 => Record::Final {
            stream: id,
            seq: value % 8,
            payload: small,
        },
        3 => Record::Error {
            stream: id,
            code: velo_wire::ErrorCode(value),
            message: "injected".into(),
        },
        4 => Record::Stop { stream: id },
        5 => Record::Cancel {
            stream: id,
            code: velo_wire::CancelCode(value % 6),
        },
        6 => Record::Credit {
            stream: id,
            grant: value % 70 + 1,
        },
        7 => Record::Heartbeat,
        8 => Record::Accept { stream: id },
        _ => Record::GoAway {
            code: velo_wire::GoAwayCode(value),
        },
    }
}
