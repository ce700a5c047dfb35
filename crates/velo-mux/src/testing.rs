//! A deterministic two-peer harness: a worker mux and a frontend mux joined by in-memory
//! lanes with a configurable latency, on a virtual clock.
//!
//! Shaped like quinn-proto's test `Pair`: [`Pair::step`] moves every transmit onto the wire
//! and delivers what is due; when nothing is due it jumps the clock to the next deadline.
//! [`Pair::drive`] steps until nothing is in flight or pending, and fails if the peers never
//! settle. Tests then read as stories: open, send, finish, drive, check events.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use velo_wire::{InstanceId, Token};

use crate::{LaneError, LaneId, LaneState, Mux, MuxConfig, MuxEvent, Recv, Side, StreamKey};

/// Steps after which [`Pair::drive`] gives up: a pair that has not settled by then never will.
pub const DRIVE_LIMIT: usize = 100_000;

/// The worker and frontend configurations used by [`Pair::new`] by default: 4 lanes,
/// window 32, 5 ms flush delay.
pub fn default_configs() -> (MuxConfig, MuxConfig) {
    let w = MuxConfig::builder(Side::Worker)
        .build()
        .expect("defaults are valid");
    let f = MuxConfig::builder(Side::Frontend)
        .build()
        .expect("defaults are valid");
    (w, f)
}

/// Which direction bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToFrontend = 0,
    ToWorker = 1,
}

/// Two muxes, joined by in-memory lanes.
#[derive(Debug)]
pub struct Pair {
    /// The worker side.
    pub worker: Mux,
    /// The frontend side.
    pub frontend: Mux,
    /// The virtual clock.
    pub now: Instant,
    /// One-way delay of every lane.
    pub latency: Duration,
    /// Bytes in flight, per direction and lane, with their delivery time.
    wire: [Vec<VecDeque<(Instant, Bytes)>>; 2],
    /// Receive buffers, per direction and lane.
    rx: [Vec<BytesMut>; 2],
    /// Events the worker emitted, in order (drained by tests).
    pub worker_events: VecDeque<MuxEvent>,
    /// Events the frontend emitted, in order (drained by tests).
    pub frontend_events: VecDeque<MuxEvent>,
    /// Frontend streams by the ticket their OPEN carried.
    pub accepted: HashMap<u64, StreamKey>,
    /// Whether the frontend accepts every stream as its OPEN arrives (as a driver whose
    /// registrations all match does); `false` leaves the answer to the test.
    pub auto_accept: bool,
    /// Lane errors seen by (worker, frontend).
    pub lane_errors: Vec<(Side, LaneId, LaneError)>,
    next_ticket: u64,
    chunks: Vec<Bytes>,
    start: Instant,
    /// Sides whose transmits are dropped (a peer gone silent), by `Dir` index.
    blackholed: [bool; 2],
    /// Sides whose writes never complete (the peer stopped reading), by `Dir` index, and the
    /// one transmit each of their lanes holds meanwhile.
    stalled: [bool; 2],
    held: [Vec<Option<Bytes>>; 2],
    /// Each lane writer's armed timer, by `Dir` index and lane, as a real driver keeps it:
    /// a lane is polled only when signalled or when this deadline passes, so a missing
    /// signal shows up as a stuck test.
    armed: [Vec<Option<Instant>>; 2],
}

impl Pair {
    /// Two muxes with all lanes up and no latency.
    pub fn new((worker, frontend): (MuxConfig, MuxConfig)) -> Self {
        #[allow(clippy::disallowed_methods)] // the epoch of the virtual clock; never read again
        let start = Instant::now();
        let lanes = usize::from(worker.lanes());
        let wid = InstanceId::from_u128(1);
        let fid = InstanceId::from_u128(2);
        let mut pair = Self {
            worker: Mux::new(worker, start),
            frontend: Mux::new(frontend, start),
            now: start,
            latency: Duration::ZERO,
            wire: [vec![VecDeque::new(); lanes], vec![VecDeque::new(); lanes]],
            rx: [vec![BytesMut::new(); lanes], vec![BytesMut::new(); lanes]],
            worker_events: VecDeque::new(),
            frontend_events: VecDeque::new(),
            accepted: HashMap::new(),
            auto_accept: true,
            lane_errors: Vec::new(),
            next_ticket: 1,
            chunks: Vec::new(),
            start,
            blackholed: [false; 2],
            stalled: [false; 2],
            held: [vec![None; lanes], vec![None; lanes]],
            armed: [vec![None; lanes], vec![None; lanes]],
        };
        for i in 0..lanes {
            let lane = LaneId(u16::try_from(i).expect("<= 64 lanes"));
            let fh = pair.frontend.config().hello(lane.0, fid, wid);
            let wh = pair.worker.config().hello(lane.0, wid, fid);
            pair.worker.handle_lane_up(start, lane, &fh);
            pair.frontend.handle_lane_up(start, lane, &wh);
        }
        pair
    }

    /// Sets the one-way latency of every lane.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Virtual time elapsed since the pair was created.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Worker: opens a stream with a fresh ticket. Returns the worker's key and the ticket
    /// (which finds the frontend's key in [`accepted`](Self::accepted) once delivered).
    ///
    /// # Panics
    ///
    /// If the open fails.
    pub fn open_stream(&mut self, prologue: &[u8]) -> (StreamKey, u64) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let key = self
            .worker
            .open(self.now, ticket, &Token([7; 16]), prologue)
            .expect("open");
        (key, ticket)
    }

    /// Worker: sends one item, panicking on any error.
    pub fn worker_send(&mut self, key: StreamKey, payload: &[u8]) {
        self.worker.send(self.now, key, payload).expect("send");
    }

    /// Worker: finishes a stream, panicking on any error.
    pub fn worker_finish(&mut self, key: StreamKey, payload: &[u8]) {
        self.worker
            .finish(self.now, key, Bytes::copy_from_slice(payload))
            .expect("finish");
    }

    /// Frontend: the key of the stream opened with `ticket`.
    ///
    /// # Panics
    ///
    /// If no such stream was opened.
    pub fn frontend_key(&self, ticket: u64) -> StreamKey {
        *self
            .accepted
            .get(&ticket)
            .unwrap_or_else(|| panic!("ticket {ticket} was not opened"))
    }

    /// Frontend: reads everything available on one stream.
    pub fn frontend_read(&mut self, key: StreamKey) -> Vec<Recv> {
        let mut out = Vec::new();
        while let Some(r) = self.frontend.recv(self.now, key) {
            out.push(r);
        }
        out
    }

    /// Frontend: reads everything available on every accepted stream, by ticket.
    pub fn frontend_read_all(&mut self) -> Vec<(u64, Vec<Recv>)> {
        let mut tickets: Vec<_> = self.accepted.iter().map(|(t, k)| (*t, *k)).collect();
        tickets.sort();
        tickets
            .into_iter()
            .map(|(t, k)| (t, self.frontend_read(k)))
            .filter(|(_, r)| !r.is_empty())
            .collect()
    }

    /// Kills `lane` on both sides, as a transport failure would; bytes in flight are lost.
    pub fn kill_lane(&mut self, lane: LaneId) {
        let i = usize::from(lane.0);
        for d in 0..2 {
            self.wire[d][i].clear();
            self.rx[d][i].clear();
        }
        self.worker
            .handle_lane_lost(lane, crate::TransportEnd::Aborted);
        self.frontend
            .handle_lane_lost(lane, crate::TransportEnd::Aborted);
        self.collect_events();
    }

    /// Moves transmits onto the wire and delivers what is due at the current time. Returns
    /// whether anything moved.
    pub fn step_now(&mut self) -> bool {
        let mut moved = false;
        moved |= self.transmit(Dir::ToFrontend);
        moved |= self.transmit(Dir::ToWorker);
        moved |= self.deliver(Dir::ToFrontend);
        moved |= self.deliver(Dir::ToWorker);
        self.collect_events();
        moved
    }

    /// One step: work due now, or else a jump to the next deadline (delivery or flush) and
    /// the timer work due then. Returns `false` when nothing is due and nothing is pending.
    pub fn step(&mut self) -> bool {
        if self.step_now() {
            return true;
        }
        let Some(next) = self.next_work() else {
            return false;
        };
        self.advance_to(next);
        true
    }

    /// Steps until nothing is in flight or pending.
    ///
    /// # Panics
    ///
    /// If the pair does not settle within [`DRIVE_LIMIT`] steps.
    pub fn drive(&mut self) {
        if let Err(e) = self.drive_bounded(DRIVE_LIMIT) {
            panic!("{e}");
        }
    }

    /// Steps until nothing is in flight or pending, at most `max_steps` times.
    ///
    /// # Errors
    ///
    /// A message saying the pair did not settle.
    pub fn drive_bounded(&mut self, max_steps: usize) -> Result<(), String> {
        for _ in 0..max_steps {
            if !self.step() {
                return Ok(());
            }
        }
        Err(format!(
            "pair did not settle within {max_steps} steps (virtual time {:?})",
            self.elapsed()
        ))
    }

    /// Advances the clock by `d`, running lane timers (flushes, heartbeats, idle timeouts) and
    /// delivering what falls due on the way.
    pub fn advance(&mut self, d: Duration) {
        let target = self.now + d;
        for _ in 0..DRIVE_LIMIT {
            self.step_now();
            match self.next_timer() {
                Some(t) if t <= target && t > self.now => self.now = t,
                _ => break,
            }
        }
        self.now = target;
        self.step_now();
    }

    /// Drops (or stops dropping) everything `side` transmits from now on, as if it went silent
    /// while its connections stayed open.
    pub fn blackhole(&mut self, side: Side, on: bool) {
        let dir = match side {
            Side::Worker => Dir::ToFrontend,
            Side::Frontend => Dir::ToWorker,
        };
        self.blackholed[dir as usize] = on;
    }

    /// Makes `side`'s writes hang (or lets them complete again), as when its peer stops
    /// reading: each lane's writer takes one transmit from its mux and holds it, reporting
    /// nothing written, while the lane's timers keep running as a real driver's do. Undoing
    /// the stall puts the held bytes on the wire.
    pub fn stall_writes(&mut self, side: Side, on: bool) {
        let (dir, mux) = match side {
            Side::Worker => (Dir::ToFrontend, &mut self.worker),
            Side::Frontend => (Dir::ToWorker, &mut self.frontend),
        };
        self.stalled[dir as usize] = on;
        if on {
            return;
        }
        for (i, held) in self.held[dir as usize].iter_mut().enumerate() {
            if let Some(frame) = held.take() {
                let lane = LaneId(u16::try_from(i).expect("<= 64 lanes"));
                mux.handle_transmitted(self.now, lane);
                // The write completed: a driver's writer loops back at once.
                self.armed[dir as usize][i] = Some(self.now);
                let q = &mut self.wire[dir as usize][i];
                let at = q.back().map_or(self.now + self.latency, |(t, _)| {
                    (*t).max(self.now + self.latency)
                });
                q.push_back((at, frame));
            }
        }
    }

    /// Bytes in flight in both directions.
    pub fn in_flight(&self) -> usize {
        self.wire
            .iter()
            .flatten()
            .flatten()
            .map(|(_, b)| b.len())
            .sum()
    }

    fn advance_to(&mut self, t: Instant) {
        if t > self.now {
            self.now = t;
        }
    }

    /// The next instant with work other than idle heartbeats: a delivery, or an armed timer
    /// of a lane that has something queued.
    fn next_work(&self) -> Option<Instant> {
        let mut next = self.next_delivery();
        for (dir, mux) in [
            (Dir::ToFrontend, &self.worker),
            (Dir::ToWorker, &self.frontend),
        ] {
            for (i, armed) in self.armed[dir as usize].iter().enumerate() {
                let lane = LaneId(u16::try_from(i).expect("<= 64 lanes"));
                if mux.lane_buffered(lane) > 0 {
                    next = match (next, *armed) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
        }
        next
    }

    /// The earliest armed timer of any lane, or delivery.
    fn next_timer(&self) -> Option<Instant> {
        self.armed
            .iter()
            .flatten()
            .flatten()
            .copied()
            .chain(self.next_delivery())
            .min()
    }

    fn next_delivery(&self) -> Option<Instant> {
        self.wire
            .iter()
            .flatten()
            .filter_map(|q| q.front().map(|(t, _)| *t))
            .min()
    }

    /// Runs every lane writer that a real driver would run now: signalled ones, and those
    /// whose armed timer has passed. Each handles its lane's timers, transmits, and re-arms.
    fn transmit(&mut self, dir: Dir) -> bool {
        let mux = match dir {
            Dir::ToFrontend => &mut self.worker,
            Dir::ToWorker => &mut self.frontend,
        };
        let mut moved = false;
        let ready = mux.poll_ready_lanes();
        for i in 0..mux.config().lanes() {
            let lane = LaneId(i);
            let armed = self.armed[dir as usize][usize::from(i)];
            let timer_fired = armed.is_none_or(|t| t <= self.now);
            if !ready.iter().any(|l| l == lane) && !timer_fired {
                continue;
            }
            mux.handle_lane_timeout(self.now, lane);
            if self.stalled[dir as usize] {
                let held = &mut self.held[dir as usize][usize::from(i)];
                if held.is_none()
                    && mux
                        .poll_transmit(self.now, lane, &mut self.chunks)
                        .is_some()
                {
                    let mut frame = BytesMut::new();
                    for c in self.chunks.drain(..) {
                        frame.extend_from_slice(&c);
                    }
                    *held = Some(frame.freeze());
                    moved = true;
                }
                self.armed[dir as usize][usize::from(i)] = mux.lane_timeout(lane);
                continue;
            }
            while let Some(t) = mux.poll_transmit(self.now, lane, &mut self.chunks) {
                let mut frame = BytesMut::with_capacity(t.bytes);
                for c in self.chunks.drain(..) {
                    frame.extend_from_slice(&c);
                }
                // Written at once: the harness's wire takes anything.
                mux.handle_transmitted(self.now, lane);
                moved = true;
                if self.blackholed[dir as usize] {
                    continue;
                }
                let q = &mut self.wire[dir as usize][usize::from(i)];
                // Lanes are ordered: never deliver before what is already in flight.
                let at = q.back().map_or(self.now + self.latency, |(t, _)| {
                    (*t).max(self.now + self.latency)
                });
                q.push_back((at, frame.freeze()));
            }
            self.armed[dir as usize][usize::from(i)] = mux.lane_timeout(lane);
        }
        moved
    }

    fn deliver(&mut self, dir: Dir) -> bool {
        let mut moved = false;
        let lanes = self.wire[dir as usize].len();
        for i in 0..lanes {
            let lane = LaneId(u16::try_from(i).expect("<= 64 lanes"));
            while self.wire[dir as usize][i]
                .front()
                .is_some_and(|(t, _)| *t <= self.now)
            {
                let (_, bytes) = self.wire[dir as usize][i]
                    .pop_front()
                    .expect("checked above");
                let (mux, side) = match dir {
                    Dir::ToFrontend => (&mut self.frontend, Side::Frontend),
                    Dir::ToWorker => (&mut self.worker, Side::Worker),
                };
                if mux.lane_state(lane) != LaneState::Up {
                    continue;
                }
                let rx = &mut self.rx[dir as usize][i];
                rx.extend_from_slice(&bytes);
                if let Err(e) = mux.handle_input(self.now, lane, rx) {
                    self.lane_errors.push((side, lane, e));
                }
                moved = true;
            }
        }
        moved
    }

    fn collect_events(&mut self) {
        while let Some(e) = self.worker.poll_event() {
            self.worker_events.push_back(e);
        }
        while let Some(e) = self.frontend.poll_event() {
            if let MuxEvent::Opened { stream, ticket, .. } = &e {
                self.accepted.insert(*ticket, *stream);
                if self.auto_accept {
                    self.frontend.accept_stream(self.now, *stream);
                }
            }
            self.frontend_events.push_back(e);
        }
    }
}

impl Mux {
    /// Checks the mux's internal invariants; the property tests call it after every step.
    ///
    /// - frontend: for every live stream, `available + queued DATA + unreturned == window`
    ///   (the worker can never have more than a window outstanding);
    /// - worker: no stream's credit exceeds its window;
    /// - every lane's load count equals its live streams;
    /// - every lane up counts as pending opens exactly its unanswered streams, never more
    ///   than `max_pending_opens`, and counts no more control bytes than it queues;
    /// - no lane buffers more than `max_buffered_bytes` plus one largest record plus one small
    ///   terminal record per stream (the documented overshoot).
    ///
    /// # Errors
    ///
    /// A description of the first broken invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        use crate::stream::Half;
        let mut per_lane = vec![0u32; self.lanes.len()];
        for (key, s) in self.streams.iter() {
            if s.state.is_live() {
                per_lane[usize::from(s.lane.0)] += 1;
            }
            match &s.half {
                Half::Recv(r) if s.state.is_live() => {
                    let sum = u64::from(r.available)
                        + u64::from(r.queued_data())
                        + u64::from(r.unreturned);
                    if sum != u64::from(r.window) {
                        return Err(format!(
                            "{key:?}: available {} + queued {} + unreturned {} != window {}",
                            r.available,
                            r.queued_data(),
                            r.unreturned,
                            r.window
                        ));
                    }
                }
                Half::Send(h) if h.credit > h.window => {
                    return Err(format!(
                        "{key:?}: credit {} above window {}",
                        h.credit, h.window
                    ));
                }
                _ => {}
            }
        }
        for (i, l) in self.lanes.iter().enumerate() {
            let pending = self
                .streams
                .iter()
                .filter(|(_, s)| usize::from(s.lane.0) == i)
                .filter(|(_, s)| matches!(&s.half, Half::Recv(r) if r.pending && !r.answered))
                .count();
            if l.state == LaneState::Up && l.pending_opens as usize != pending {
                return Err(format!(
                    "lane {i}: {} pending opens counted, {pending} unanswered streams",
                    l.pending_opens
                ));
            }
            if l.pending_opens > self.config.max_pending_opens {
                return Err(format!("lane {i}: {} pending opens", l.pending_opens));
            }
            if l.tx.control_bytes() > l.tx.buffered() {
                return Err(format!(
                    "lane {i}: {} control bytes of {} queued",
                    l.tx.control_bytes(),
                    l.tx.buffered()
                ));
            }
            if l.state == LaneState::Up && l.streams != per_lane[i] {
                return Err(format!(
                    "lane {i}: load {} but {} live streams",
                    l.streams, per_lane[i]
                ));
            }
            let slack =
                self.record_cap(i) as usize + self.streams.len() * (crate::CHAIN_THRESHOLD + 64);
            if l.tx.buffered() > self.config.max_buffered_bytes + slack {
                return Err(format!("lane {i}: {} bytes buffered", l.tx.buffered()));
            }
        }
        Ok(())
    }

    /// Whether no lane has an open batch or chunks waiting for the transport.
    pub fn is_flushed(&self) -> bool {
        self.lanes.iter().all(|l| l.tx.buffered() == 0)
    }
}
