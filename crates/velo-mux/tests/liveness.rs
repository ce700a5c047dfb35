//! Liveness while a write is in progress: the driver reports writes done with
//! `handle_transmitted`; until then the lane's only timers are the idle and write-stall
//! timeouts, so a peer that stops reading is detected even though it keeps heartbeating.

mod common;

use std::time::Duration;

use common::{PROLOGUE, configs, items};
use velo_mux::MuxConfig;
use velo_mux::testing::{Pair, default_configs};
use velo_mux::{CloseReason, LaneError, LaneId, LaneState, MuxEvent, Side};

const IDLE: Duration = velo_mux::DEFAULT_IDLE_TIMEOUT;

/// Default configurations with one lane on both sides.
fn one_lane() -> (MuxConfig, MuxConfig) {
    let (w, f) = configs(|b| b.lanes(1));
    let f = f.with_lanes(1);
    (w, f)
}

/// One lane, on a frontend that waits `idle` for silence: longer than the worker, so the
/// worker's bound is the one a story sees.
fn patient_frontend(idle: Duration) -> (MuxConfig, MuxConfig) {
    let (w, _) = one_lane();
    let f = MuxConfig::builder(Side::Frontend)
        .idle_timeout(idle)
        .build()
        .unwrap()
        .with_lanes(1);
    (w, f)
}

#[test]
fn a_write_stalled_for_the_idle_timeout_closes_the_lane_though_the_peer_heartbeats() {
    // The frontend waits longer for silence than the worker for its write, so the story
    // does not depend on which of two timers at one instant runs first.
    let mut pair = Pair::new(patient_frontend(IDLE * 2));
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.drive();
    pair.stall_writes(Side::Worker, true);
    pair.worker_send(s, b"stuck");
    pair.step_now();
    let stalled_at = pair.now;
    // The frontend heartbeats all along, so the lane is not idle: only the write is stuck.
    pair.advance(IDLE - Duration::from_millis(1));
    assert_eq!(pair.worker.lane_state(LaneId(0)), LaneState::Up);
    pair.advance(Duration::from_millis(1));
    assert_eq!(pair.worker.lane_state(LaneId(0)), LaneState::Closed);
    assert_eq!(pair.now - stalled_at, IDLE);
    assert!(pair.worker_events.iter().any(|e| matches!(e,
        MuxEvent::Closed { stream, reason: CloseReason::Lost(LaneError::WriteStalled(d)) }
            if *stream == s && *d == IDLE)));
}

#[test]
fn a_write_in_progress_arms_only_the_liveness_timers() {
    let mut pair = Pair::new(one_lane());
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.drive();
    pair.stall_writes(Side::Worker, true);
    pair.worker_send(s, b"first");
    pair.step_now();
    let since = pair.now;
    // More records queue behind the write; their flush deadline and any heartbeat wait for
    // it, so the writer's timer is not in the past (a driver would spin on it).
    pair.worker_send(s, b"second");
    pair.advance(Duration::from_secs(1));
    let t = pair.worker.lane_timeout(LaneId(0)).expect("the lane is up");
    assert!(t > pair.now, "timer {:?} in the past", pair.now - t);
    assert!(t <= since + IDLE);
}

#[test]
fn a_write_that_completes_in_time_keeps_the_lane_and_delivers_everything() {
    let mut pair = Pair::new(one_lane());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    pair.stall_writes(Side::Worker, true);
    pair.worker_send(s, b"a");
    pair.step_now();
    pair.worker_send(s, b"b");
    pair.advance(IDLE / 2);
    pair.stall_writes(Side::Worker, false);
    pair.worker_finish(s, b"c");
    pair.drive();
    assert_eq!(pair.worker.lane_state(LaneId(0)), LaneState::Up);
    let key = pair.frontend_key(ticket);
    let got = pair.frontend_read(key);
    assert_eq!(items(&got), vec![&b"a"[..], b"b", b"c"]);
}

#[test]
fn a_peer_that_announces_a_millisecond_idle_timeout_is_refused() {
    let (w, _) = default_configs();
    let mut hello = w.hello(
        0,
        velo_wire::InstanceId::from_u128(1),
        velo_wire::InstanceId::ANY,
    );
    let expect = velo_mux::handshake::Expect {
        role: velo_wire::Role::Worker,
        local_instance: velo_wire::InstanceId::from_u128(2),
        peer_instance: None,
        lane: None,
    };
    for (ms, ok) in [
        (1, false),
        (99, false),
        (100, true),
        (3_600_000, true),
        (3_600_001, false),
    ] {
        hello.idle_timeout_ms = ms;
        let r = expect.check(&hello);
        assert_eq!(r.is_ok(), ok, "idle_timeout_ms {ms}: {r:?}");
        if let Err(e) = r {
            assert_eq!(e.close_code(), velo_wire::CloseCode::BAD_HANDSHAKE);
            assert!(e.to_string().contains("100..=3600000 ms"), "{e}");
        }
    }
}

/// A frontend that keeps its lane alive (it heartbeats) but answers an OPEN neither with
/// ACCEPT nor with CANCEL: the worker's stream, and a finish waiting to learn whether its end
/// was delivered, would wait for ever. After the idle timeout the worker closes the lane, and
/// the stream is lost (announced again elsewhere, as any stream lost before its ACCEPT).
#[test]
fn an_open_left_unanswered_for_the_idle_timeout_closes_the_lane() {
    let mut pair = Pair::new(one_lane());
    pair.auto_accept = false;
    let (s, _) = pair.open_stream(PROLOGUE);
    let opened = pair.now;
    pair.worker_finish(s, b"done");
    pair.drive();
    let left = opened + IDLE - pair.now;
    pair.advance(left - Duration::from_millis(1));
    assert_eq!(pair.worker.lane_state(LaneId(0)), LaneState::Up);
    pair.advance(Duration::from_millis(1));
    assert_eq!(pair.worker.lane_state(LaneId(0)), LaneState::Closed);
    assert!(
        pair.worker_events.iter().any(|e| matches!(e,
            MuxEvent::LaneClosed { error: LaneError::Unanswered(d), .. } if *d == IDLE)),
        "{:?}",
        pair.worker_events
    );
}

/// The same frontend answering in time keeps the lane: only an OPEN left unanswered counts.
#[test]
fn opens_answered_within_the_idle_timeout_keep_the_lane() {
    let mut pair = Pair::new(one_lane());
    pair.auto_accept = false;
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    pair.advance(IDLE / 2);
    let key = pair.frontend_key(ticket);
    let now = pair.now;
    pair.frontend.accept_stream(now, key);
    pair.worker_send(s, b"late but answered");
    pair.advance(IDLE * 2);
    assert_eq!(pair.worker.lane_state(LaneId(0)), LaneState::Up);
}

/// The bound runs from when the OPEN is taken for the transport, not from when it was queued:
/// an OPEN behind a backlog (the driver took nothing for twice the idle timeout, the frontend
/// alive all along) has not reached the frontend, which cannot be blamed for not answering
/// it. Once taken, the frontend has the idle timeout to answer.
#[test]
fn the_answer_is_awaited_from_when_the_open_is_taken_for_the_transport() {
    // The frontend is not the one to give up on the lane here.
    let pair = Pair::new(patient_frontend(IDLE * 10));
    let (mut worker, mut frontend, start) = (pair.worker, pair.frontend, pair.now);
    let lane = LaneId(0);
    worker
        .open(start, 1, &velo_wire::Token([7; 16]), PROLOGUE)
        .unwrap();
    // Keeps the worker's lane alive: the frontend's heartbeats, each second until `until`.
    let mut now = start;
    let mut heartbeat_until = |worker: &mut velo_mux::Mux, now: &mut std::time::Instant, until| {
        while *now < until {
            *now += Duration::from_secs(1);
            frontend.handle_timeout(*now);
            let mut chunks = Vec::new();
            while frontend.poll_transmit(*now, lane, &mut chunks).is_some() {
                frontend.handle_transmitted(*now, lane);
            }
            let mut rx = bytes::BytesMut::new();
            for c in chunks.drain(..) {
                rx.extend_from_slice(&c);
            }
            worker.handle_input(*now, lane, &mut rx).unwrap();
            worker.handle_timeout(*now);
        }
    };
    heartbeat_until(&mut worker, &mut now, start + IDLE * 2);
    assert_eq!(
        worker.lane_state(lane),
        LaneState::Up,
        "the OPEN is still queued"
    );
    // The driver takes the OPEN (and never delivers it: this frontend does not answer).
    let mut taken = Vec::new();
    while worker.poll_transmit(now, lane, &mut taken).is_some() {
        worker.handle_transmitted(now, lane);
    }
    let sent = now;
    heartbeat_until(&mut worker, &mut now, sent + IDLE - Duration::from_secs(1));
    assert_eq!(worker.lane_state(lane), LaneState::Up);
    heartbeat_until(&mut worker, &mut now, sent + IDLE);
    assert_eq!(worker.lane_state(lane), LaneState::Closed);
}
