//! Stateful property tests: random operation sequences against a worker and a frontend mux,
//! with the invariants checked after every step.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use velo_mux::testing::Pair;
use velo_mux::{
    FlushPolicy, LaneId, MuxConfig, MuxEvent, Recv, SendError, Side, StreamEnd, StreamKey,
};
use velo_wire::{CancelCode, ErrorCode, GoAwayCode, Token};

#[derive(Debug, Clone)]
enum Op {
    Open,
    Send { stream: usize, n: u8 },
    SendBig { stream: usize },
    Finish { stream: usize },
    Reset { stream: usize },
    Read { stream: usize, n: u8 },
    ReadAll,
    Stop { stream: usize },
    Cancel { stream: usize },
    DropReceiver { stream: usize },
    DropSender { stream: usize },
    Flush,
    Advance { ms: u16 },
    Step,
    KillLane { lane: u16 },
    GoAway,
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0usize..12;
    prop_oneof![
        4 => Just(Op::Open),
        8 => (s.clone(), 1u8..20).prop_map(|(stream, n)| Op::Send { stream, n }),
        1 => s.clone().prop_map(|stream| Op::SendBig { stream }),
        2 => s.clone().prop_map(|stream| Op::Finish { stream }),
        1 => s.clone().prop_map(|stream| Op::Reset { stream }),
        6 => (s.clone(), 1u8..40).prop_map(|(stream, n)| Op::Read { stream, n }),
        2 => Just(Op::ReadAll),
        1 => s.clone().prop_map(|stream| Op::Stop { stream }),
        1 => s.clone().prop_map(|stream| Op::Cancel { stream }),
        1 => s.clone().prop_map(|stream| Op::DropReceiver { stream }),
        1 => s.clone().prop_map(|stream| Op::DropSender { stream }),
        2 => Just(Op::Flush),
        3 => (0u16..20).prop_map(|ms| Op::Advance { ms }),
        4 => Just(Op::Step),
        1 => (0u16..3).prop_map(|lane| Op::KillLane { lane }),
        1 => Just(Op::GoAway),
    ]
}

/// What the test knows about one stream.
#[derive(Debug, Default)]
struct Model {
    worker: Option<StreamKey>,
    ticket: u64,
    sent: Vec<Vec<u8>>,
    delivered: Vec<Vec<u8>>,
    frontend_ends: Vec<StreamEnd>,
    worker_closed: usize,
    /// Times the worker was told whether the end it gave the stream was delivered
    /// (`Accepted` after its own end, or `Closed`): at most once.
    delivery_told: usize,
    worker_ended_locally: bool,
    receiver_dropped: bool,
    sender_dropped: bool,
}

struct World {
    pair: Pair,
    streams: Vec<Model>,
    by_worker_key: HashMap<StreamKey, usize>,
    next_ticket: u64,
}

impl World {
    fn new() -> Self {
        let w = MuxConfig::builder(Side::Worker)
            .lanes(3)
            .window(4)
            .build()
            .unwrap();
        let f = MuxConfig::builder(Side::Frontend)
            .lanes(3)
            .window(4)
            .flush(FlushPolicy::with_max_delay(Duration::from_millis(2)))
            .build()
            .unwrap();
        let pair = Pair::new((w, f)).with_latency(Duration::from_micros(300));
        Self {
            pair,
            streams: Vec::new(),
            by_worker_key: HashMap::new(),
            next_ticket: 1,
        }
    }

    fn frontend_key(&self, i: usize) -> Option<StreamKey> {
        let m = self.streams.get(i)?;
        if m.receiver_dropped {
            return None;
        }
        self.pair.accepted.get(&m.ticket).copied()
    }

    fn read(&mut self, i: usize, max: usize) {
        let Some(key) = self.frontend_key(i) else {
            return;
        };
        for _ in 0..max {
            match self.pair.frontend.recv(self.pair.now, key) {
                Some(Recv::Item(b)) => self.streams[i].delivered.push(b.to_vec()),
                Some(Recv::End(e)) => self.streams[i].frontend_ends.push(e),
                None => break,
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        let now = self.pair.now;
        let n = self.streams.len();
        let pick = |s: usize| if n == 0 { None } else { Some(s % n) };
        match *op {
            Op::Open => {
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                if let Ok(key) = self.pair.worker.open(now, ticket, &Token([1; 16]), b"{}") {
                    self.by_worker_key.insert(key, self.streams.len());
                    self.streams.push(Model {
                        worker: Some(key),
                        ticket,
                        ..Model::default()
                    });
                }
            }
            Op::Send { stream, n } => {
                let Some(i) = pick(stream) else { return };
                let Some(key) = self.streams[i]
                    .worker
                    .filter(|_| !self.streams[i].sender_dropped)
                else {
                    return;
                };
                for _ in 0..n {
                    let payload =
                        format!("{}:{}", self.streams[i].ticket, self.streams[i].sent.len())
                            .into_bytes();
                    match self.pair.worker.send(now, key, &payload) {
                        Ok(()) => self.streams[i].sent.push(payload),
                        Err(SendError::WouldBlock(_) | SendError::Closed(_)) => break,
                        Err(e) => panic!("unexpected send error {e}"),
                    }
                }
            }
            Op::SendBig { stream } => {
                let Some(i) = pick(stream) else { return };
                let Some(key) = self.streams[i]
                    .worker
                    .filter(|_| !self.streams[i].sender_dropped)
                else {
                    return;
                };
                let mut payload =
                    format!("{}:{}:", self.streams[i].ticket, self.streams[i].sent.len())
                        .into_bytes();
                payload.resize(5000, b'x');
                if self
                    .pair
                    .worker
                    .send_bytes(now, key, payload.clone().into())
                    .is_ok()
                {
                    self.streams[i].sent.push(payload);
                }
            }
            Op::Finish { stream } | Op::Reset { stream } => {
                let Some(i) = pick(stream) else { return };
                let Some(key) = self.streams[i]
                    .worker
                    .filter(|_| !self.streams[i].sender_dropped)
                else {
                    return;
                };
                let r = if matches!(op, Op::Finish { .. }) {
                    self.pair.worker.finish(now, key, bytes::Bytes::new())
                } else {
                    self.pair
                        .worker
                        .reset(now, key, ErrorCode(7), "engine failed")
                };
                if r.is_ok() {
                    assert!(!self.streams[i].worker_ended_locally, "ended twice locally");
                    self.streams[i].worker_ended_locally = true;
                }
            }
            Op::Read { stream, n } => {
                if let Some(i) = pick(stream) {
                    self.read(i, usize::from(n));
                }
            }
            Op::ReadAll => (0..n).for_each(|i| self.read(i, usize::MAX)),
            Op::Stop { stream } => {
                if let Some(key) = pick(stream).and_then(|i| self.frontend_key(i)) {
                    self.pair.frontend.stop(now, key);
                }
            }
            Op::Cancel { stream } => {
                if let Some(key) = pick(stream).and_then(|i| self.frontend_key(i)) {
                    self.pair.frontend.cancel(now, key, CancelCode::CANCELLED);
                }
            }
            Op::DropReceiver { stream } => {
                if let Some(i) = pick(stream)
                    && let Some(key) = self.frontend_key(i)
                {
                    self.pair.frontend.release(now, key);
                    self.streams[i].receiver_dropped = true;
                }
            }
            Op::DropSender { stream } => {
                if let Some(i) = pick(stream)
                    && let Some(key) = self.streams[i]
                        .worker
                        .filter(|_| !self.streams[i].sender_dropped)
                {
                    self.pair.worker.release(now, key);
                    self.streams[i].sender_dropped = true;
                }
            }
            Op::Flush => self.pair.worker.flush_hint(now),
            Op::Advance { ms } => self.pair.advance(Duration::from_millis(u64::from(ms))),
            Op::Step => {
                self.pair.step();
            }
            Op::KillLane { lane } => self.pair.kill_lane(LaneId(lane)),
            Op::GoAway => self.pair.frontend.go_away(now, GoAwayCode::DRAIN),
        }
        self.pair.step_now();
        self.absorb_events();
    }

    fn absorb_events(&mut self) {
        while let Some(e) = self.pair.worker_events.pop_front() {
            match e {
                MuxEvent::Closed { stream, .. } => {
                    let m = &mut self.streams[self.by_worker_key[&stream]];
                    if m.worker_ended_locally {
                        m.delivery_told += 1;
                    } else {
                        m.worker_closed += 1;
                    }
                }
                MuxEvent::Accepted(stream) => {
                    let m = &mut self.streams[self.by_worker_key[&stream]];
                    if m.worker_ended_locally {
                        m.delivery_told += 1;
                    }
                }
                _ => {}
            }
        }
        self.pair.frontend_events.clear();
    }

    fn check(&self) -> Result<(), TestCaseError> {
        self.pair
            .worker
            .check_invariants()
            .map_err(TestCaseError::fail)?;
        self.pair
            .frontend
            .check_invariants()
            .map_err(TestCaseError::fail)?;
        for (i, m) in self.streams.iter().enumerate() {
            prop_assert!(
                m.delivered.len() <= m.sent.len(),
                "stream {i}: more delivered than sent"
            );
            prop_assert_eq!(
                &m.delivered[..],
                &m.sent[..m.delivered.len()],
                "stream {}: not a prefix, in order",
                i
            );
            prop_assert!(
                m.frontend_ends.len() <= 1,
                "stream {i}: {} ends on the frontend",
                m.frontend_ends.len()
            );
            prop_assert!(
                m.worker_closed + usize::from(m.worker_ended_locally) <= 1,
                "stream {i}: ended {} times on the worker",
                m.worker_closed + usize::from(m.worker_ended_locally)
            );
            prop_assert!(
                m.delivery_told <= 1,
                "stream {i}: told {} times whether its end was delivered",
                m.delivery_told
            );
            if m.frontend_ends.first() == Some(&StreamEnd::Finished) {
                prop_assert_eq!(
                    m.delivered.len(),
                    m.sent.len(),
                    "stream {}: finished with items missing",
                    i
                );
            }
        }
        Ok(())
    }

    /// Once both sides are idle and everything was read, nothing may be stuck.
    fn check_settled(&mut self) -> Result<(), TestCaseError> {
        self.pair
            .drive_bounded(100_000)
            .map_err(TestCaseError::fail)?;
        for i in 0..self.streams.len() {
            self.read(i, usize::MAX);
        }
        self.pair
            .drive_bounded(100_000)
            .map_err(TestCaseError::fail)?;
        self.absorb_events();
        self.check()?;
        for (i, m) in self.streams.iter().enumerate() {
            let Some(wkey) = m.worker else { continue };
            if m.worker_ended_locally && !m.sender_dropped {
                prop_assert!(
                    self.pair.worker.end_delivery(wkey).is_some(),
                    "stream {i}: the worker still waits to learn whether its end was delivered"
                );
            }
            let Some(fkey) = self.frontend_key(i) else {
                continue;
            };
            let worker_live = self
                .pair
                .worker
                .stream_state(wkey)
                .is_some_and(|s| s.is_live())
                && !m.sender_dropped;
            let frontend_live = self
                .pair
                .frontend
                .stream_state(fkey)
                .is_some_and(|s| s.is_live());
            if worker_live && frontend_live {
                prop_assert_eq!(
                    m.delivered.len(),
                    m.sent.len(),
                    "stream {}: items stuck in flight",
                    i
                );
                let credit = self.pair.worker.send_credit(wkey).unwrap_or(0);
                prop_assert!(
                    credit > 0,
                    "stream {i}: credit stuck at 0 with everything read"
                );
            }
            if !worker_live && self.pair.worker.stream_state(wkey).is_some() {
                prop_assert_eq!(
                    m.frontend_ends.len(),
                    1,
                    "stream {}: ended on the worker, not on the frontend",
                    i
                );
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_operation_sequences_keep_every_invariant(ops in proptest::collection::vec(op(), 1..80)) {
        let mut world = World::new();
        for op in &ops {
            world.apply(op);
            world.check()?;
        }
        world.check_settled()?;
    }
}
