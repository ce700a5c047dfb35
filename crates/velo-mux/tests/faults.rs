//! Stories of how streams and lanes end: cancellation, stale generations, protocol
//! violations, lane failures, liveness and limits, on the deterministic harness.

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use velo_mux::testing::{Pair, default_configs};
use velo_mux::{
    CloseReason, LaneError, LaneId, LaneState, MuxConfig, MuxEvent, OpenError, Recv, SendError,
    Side, StreamEnd,
};
use velo_wire::{Batch, CancelCode, CloseCode, Frame, GoAwayCode, Record, StreamId, Token};

use common::*;

#[test]
fn records_for_a_stale_generation_are_dropped_and_counted() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    let f = pair.frontend_key(ticket);
    let lane = pair.frontend.stream_lane(f).unwrap();
    let id = pair.frontend.stream_wire_id(f).unwrap();
    pair.worker_finish(s, b"");
    pair.worker.release(pair.now, s);
    pair.drive();
    pair.frontend_read(f);
    pair.frontend.release(pair.now, f);
    // A late record of the old stream, and one naming a generation never used.
    let stale = StreamId::new(id.slot(), id.generation());
    let future = StreamId::new(id.slot(), id.generation() + 5);
    inject(
        &mut pair,
        lane,
        &[
            Record::Data {
                stream: stale,
                seq: 1,
                payload: Bytes::from_static(b"late"),
            },
            Record::Data {
                stream: future,
                seq: 0,
                payload: Bytes::from_static(b"alien"),
            },
        ],
    )
    .unwrap();
    assert_eq!(pair.frontend.stats().stale_drops, 2);
    assert!(pair.frontend_read_all().is_empty(), "nothing delivered");
    // The worker reuses the slot with a new generation: its records land in the new stream.
    let (s2, t2) = pair.open_stream(PROLOGUE);
    assert_eq!(pair.worker.stream_wire_id(s2).unwrap().slot(), id.slot());
    assert_ne!(
        pair.worker.stream_wire_id(s2).unwrap().generation(),
        id.generation()
    );
    pair.worker_send(s2, b"fresh");
    pair.drive();
    let got = pair.frontend_read(pair.frontend_key(t2));
    assert_eq!(items(&got), vec![&b"fresh"[..]]);
}

#[test]
fn cancel_ends_the_stream_on_both_sides_exactly_once() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker_send(s, b"one");
    pair.drive();
    let f = pair.frontend_key(ticket);
    pair.frontend.cancel(pair.now, f, CancelCode::CANCELLED);
    pair.worker_send(s, b"in flight");
    pair.drive();
    let closed: Vec<_> = pair
        .worker_events
        .iter()
        .filter(|e| matches!(e, MuxEvent::Closed { .. }))
        .collect();
    assert_eq!(
        closed,
        vec![&MuxEvent::Closed {
            stream: s,
            reason: CloseReason::Cancelled(CancelCode::CANCELLED)
        }]
    );
    assert_eq!(
        pair.worker.send(pair.now, s, b"x"),
        Err(SendError::Closed(StreamEnd::Cancelled(
            CancelCode::CANCELLED
        )))
    );
    assert_eq!(
        pair.frontend_read(f),
        vec![Recv::End(StreamEnd::Cancelled(CancelCode::CANCELLED))]
    );
    assert!(
        pair.frontend.stats().stale_drops >= 1,
        "the record in flight was dropped"
    );
}

#[test]
fn dropping_the_receiver_cancels_the_stream() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    pair.frontend.release(pair.now, pair.frontend_key(ticket));
    pair.drive();
    assert!(pair.worker_events.contains(&MuxEvent::Closed {
        stream: s,
        reason: CloseReason::Cancelled(CancelCode::CANCELLED)
    }));
    assert_eq!(pair.frontend.stream_count(), 0);
}

#[test]
fn dropping_the_sender_without_finish_ends_the_stream_abnormally() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker_send(s, b"partial");
    pair.worker.release(pair.now, s);
    pair.drive();
    let got = pair.frontend_read(pair.frontend_key(ticket));
    assert_eq!(items(&got), vec![&b"partial"[..]]);
    assert!(
        matches!(
            ends(&got)[..],
            [StreamEnd::Error {
                code: velo_mux::RESET_DROPPED,
                ..
            }]
        ),
        "{got:?}"
    );
}

#[test]
fn killing_a_lane_ends_only_its_streams_exactly_once() {
    let mut pair = Pair::new(default_configs());
    let streams: Vec<_> = (0..8).map(|_| pair.open_stream(PROLOGUE)).collect();
    pair.drive();
    let dead = LaneId(1);
    pair.kill_lane(dead);
    pair.drive();
    for (s, ticket) in &streams {
        let f = pair.frontend_key(*ticket);
        let on_dead = pair.worker.stream_lane(*s) == Some(dead);
        let closed = pair
            .worker_events
            .iter()
            .filter(|e| matches!(e, MuxEvent::Closed { stream, .. } if stream == s))
            .count();
        assert_eq!(
            closed,
            usize::from(on_dead),
            "worker told once, only if on the dead lane"
        );
        let got = pair.frontend_read(f);
        if on_dead {
            assert!(
                matches!(ends(&got)[..], [StreamEnd::Lost(LaneError::Transport(_))]),
                "{got:?}"
            );
        } else {
            assert!(ends(&got).is_empty());
            pair.worker_send(*s, b"still alive");
        }
    }
    pair.drive();
    assert_eq!(pair.frontend.stats().streams_lost, 2);
    assert_eq!(pair.worker.stats().streams_lost, 2);
    // New streams avoid the dead lane.
    let (s, _) = pair.open_stream(PROLOGUE);
    assert_ne!(pair.worker.stream_lane(s), Some(dead));
}

#[test]
fn garbage_bytes_close_only_that_lane_and_tell_the_peer() {
    let mut pair = Pair::new(default_configs());
    let streams: Vec<_> = (0..4).map(|_| pair.open_stream(PROLOGUE)).collect();
    pair.drive();
    let mut junk = BytesMut::from(&[0x02, 0x03, 0, 0, 0, 0xee, 0xee, 0xee][..]);
    let err = pair
        .frontend
        .handle_input(pair.now, LaneId(0), &mut junk)
        .unwrap_err();
    assert!(
        matches!(
            err,
            LaneError::Malformed(velo_wire::WireError::UnknownRecord { kind: 0xee })
        ),
        "{err}"
    );
    pair.drive();
    assert_eq!(pair.frontend.lane_state(LaneId(0)), LaneState::Closed);
    assert_eq!(pair.frontend.lane_state(LaneId(1)), LaneState::Up);
    // The worker got the CLOSE frame and ended the lane's stream with the peer's reason.
    assert!(
        pair.lane_errors
            .iter()
            .any(|(side, lane, e)| *side == Side::Worker
                && *lane == LaneId(0)
                && matches!(
                    e,
                    LaneError::PeerClosed {
                        code: CloseCode::PROTOCOL_ERROR,
                        ..
                    }
                ))
    );
    let lost = streams
        .iter()
        .filter(|(s, _)| pair.worker.send(pair.now, *s, b"x").is_err())
        .count();
    assert_eq!(lost, 1);
}

#[test]
fn a_sequence_gap_kills_only_that_stream() {
    let mut pair = Pair::new(default_configs());
    let (a, ta) = pair.open_stream(PROLOGUE);
    let (_b, tb) = pair.open_stream(PROLOGUE);
    pair.drive();
    let fa = pair.frontend_key(ta);
    let lane = pair.frontend.stream_lane(fa).unwrap();
    let id = pair.worker.stream_wire_id(a).unwrap();
    inject(
        &mut pair,
        lane,
        &[Record::Data {
            stream: id,
            seq: 5,
            payload: Bytes::new(),
        }],
    )
    .unwrap();
    pair.drive();
    assert_eq!(
        pair.frontend_read(fa),
        vec![Recv::End(StreamEnd::Violation("sequence gap"))]
    );
    assert!(pair.worker_events.contains(&MuxEvent::Closed {
        stream: a,
        reason: CloseReason::Cancelled(CancelCode::PROTOCOL_ERROR)
    }));
    assert_eq!(pair.frontend.lane_state(lane), LaneState::Up);
    assert!(
        pair.frontend_read(pair.frontend_key(tb)).is_empty(),
        "the sibling is untouched"
    );
}

#[test]
fn data_beyond_the_window_kills_only_that_stream() {
    let mut pair = Pair::new(default_configs());
    let (a, ta) = pair.open_stream(PROLOGUE);
    pair.drive();
    let fa = pair.frontend_key(ta);
    let lane = pair.frontend.stream_lane(fa).unwrap();
    let id = pair.worker.stream_wire_id(a).unwrap();
    let flood: Vec<Record> = (0..33)
        .map(|seq| Record::Data {
            stream: id,
            seq,
            payload: Bytes::from_static(b"x"),
        })
        .collect();
    inject(&mut pair, lane, &flood).unwrap();
    let got = pair.frontend_read(fa);
    assert_eq!(items(&got).len(), 32, "the window's worth is delivered");
    assert_eq!(
        ends(&got),
        vec![&StreamEnd::Violation("DATA without credit")]
    );
}

#[test]
fn a_second_open_for_a_live_stream_is_a_stream_violation() {
    let mut pair = Pair::new(default_configs());
    let (a, ta) = pair.open_stream(PROLOGUE);
    pair.drive();
    let fa = pair.frontend_key(ta);
    let lane = pair.frontend.stream_lane(fa).unwrap();
    let id = pair.worker.stream_wire_id(a).unwrap();
    let again = Record::Open {
        stream: id,
        ticket: 99,
        token: Token([0; 16]),
        prologue: Bytes::new(),
    };
    inject(&mut pair, lane, &[again]).unwrap();
    assert_eq!(
        pair.frontend_read(fa),
        vec![Recv::End(StreamEnd::Violation(
            "second OPEN for a live stream"
        ))]
    );
    assert_eq!(pair.frontend.lane_state(lane), LaneState::Up);
}

#[test]
fn records_of_the_wrong_direction_close_the_lane() {
    let mut pair = Pair::new(default_configs());
    let err = inject(
        &mut pair,
        LaneId(2),
        &[Record::Credit {
            stream: StreamId::new(0, 0),
            grant: 1,
        }],
    )
    .unwrap_err();
    assert_eq!(
        err,
        LaneError::Protocol("a frontend received a record only frontends send")
    );
    assert_eq!(pair.frontend.lane_state(LaneId(2)), LaneState::Closed);
}

#[test]
fn silent_peer_is_detected_by_the_idle_timer() {
    let (w, f) = configs(|b| b.idle_timeout(Duration::from_secs(2)));
    let mut pair = Pair::new((w, f));
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.drive();
    // Heartbeats keep the connection up: the frontend speaks every 2 s / 3.
    pair.advance(Duration::from_secs(10));
    assert_eq!(pair.worker.lane_state(LaneId(0)), LaneState::Up);
    // Then the frontend goes silent with its connections still open. Its last heartbeat was at
    // most 667 ms ago, so the worker gives up between 1.33 s and 2 s from now.
    pair.blackhole(Side::Frontend, true);
    let silent_at = pair.now;
    pair.advance(Duration::from_millis(1300));
    assert_eq!(pair.worker.lane_state(LaneId(0)), LaneState::Up);
    pair.advance(Duration::from_millis(700));
    assert_eq!(
        pair.worker.lane_state(LaneId(0)),
        LaneState::Closed,
        "{:?} after silence",
        pair.now - silent_at
    );
    assert!(pair.worker_events.iter().any(|e| matches!(e,
        MuxEvent::Closed { stream, reason: CloseReason::Lost(LaneError::IdleTimeout(_)) } if *stream == s)));
}

#[test]
fn goaway_refuses_new_streams_while_open_ones_finish() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    pair.frontend.go_away(pair.now, GoAwayCode::DRAIN);
    pair.drive();
    assert!(pair.worker_events.contains(&MuxEvent::GoAway {
        code: GoAwayCode::DRAIN
    }));
    assert_eq!(
        pair.worker.open(pair.now, 1, &Token([0; 16]), PROLOGUE),
        Err(OpenError::GoingAway(GoAwayCode::DRAIN))
    );
    pair.worker_send(s, b"still here");
    pair.worker_finish(s, b"");
    pair.drive();
    let got = pair.frontend_read(pair.frontend_key(ticket));
    assert_eq!(items(&got), vec![&b"still here"[..]]);
    assert_eq!(ends(&got), vec![&StreamEnd::Finished]);
}

#[test]
fn opens_beyond_the_frontend_limit_are_refused_per_stream() {
    let w = MuxConfig::builder(Side::Worker)
        .max_streams(10)
        .build()
        .unwrap();
    let f = MuxConfig::builder(Side::Frontend)
        .max_streams(5)
        .build()
        .unwrap();
    let mut pair = Pair::new((w, f));
    let streams: Vec<_> = (0..7).map(|_| pair.open_stream(PROLOGUE)).collect();
    pair.drive();
    assert_eq!(pair.accepted.len(), 5);
    let refused = pair
        .worker_events
        .iter()
        .filter(|e| {
            matches!(
                e,
                MuxEvent::Closed {
                    reason: CloseReason::Cancelled(CancelCode::TOO_MANY_STREAMS),
                    ..
                }
            )
        })
        .count();
    assert_eq!(refused, 2);
    assert_eq!(pair.frontend.stats().streams_refused, 2);
    assert!(streams.len() == 7);
    // The worker's own limit is an open error.
    for _ in 0..3 {
        pair.worker
            .open(pair.now, 0, &Token([0; 16]), PROLOGUE)
            .unwrap();
    }
    assert_eq!(
        pair.worker.open(pair.now, 0, &Token([0; 16]), PROLOGUE),
        Err(OpenError::TooManyStreams(10))
    );
}

#[test]
fn a_peer_close_ends_the_lane_with_its_reason() {
    let mut pair = Pair::new(default_configs());
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.drive();
    let lane = pair.worker.stream_lane(s).unwrap();
    pair.frontend
        .close(lane, CloseCode::SHUTTING_DOWN, "frontend shutting down");
    pair.drive();
    assert!(pair.worker_events.iter().any(|e| matches!(e,
        MuxEvent::Closed { stream, reason: CloseReason::Lost(LaneError::PeerClosed { code: CloseCode::SHUTTING_DOWN, reason }) }
            if *stream == s && reason.contains("shutting down"))));
}

#[test]
fn a_record_naming_another_generation_of_a_live_slot_never_reaches_that_stream() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker_send(s, b"mine");
    pair.drive();
    let f = pair.frontend_key(ticket);
    let lane = pair.frontend.stream_lane(f).unwrap();
    let id = pair.worker.stream_wire_id(s).unwrap();
    // A buggy or hostile peer names the live slot under other generations.
    for generation in [
        id.generation().wrapping_add(1),
        id.generation().wrapping_sub(1),
    ] {
        let alien = StreamId::new(id.slot(), generation);
        inject(
            &mut pair,
            lane,
            &[Record::Data {
                stream: alien,
                seq: 1,
                payload: Bytes::from_static(b"alien"),
            }],
        )
        .unwrap();
    }
    assert_eq!(pair.frontend.stats().stale_drops, 2);
    assert_eq!(items(&pair.frontend_read(f)), vec![&b"mine"[..]]);
    pair.worker_send(s, b"still mine");
    pair.drive();
    assert_eq!(
        items(&pair.frontend_read(f)),
        vec![&b"still mine"[..]],
        "the live stream's sequence is intact"
    );
}

#[test]
fn a_cancel_for_an_old_generation_does_not_touch_the_slots_new_stream() {
    let mut pair = Pair::new(default_configs());
    let (old, _) = pair.open_stream(PROLOGUE);
    let old_id = pair.worker.stream_wire_id(old).unwrap();
    let lane = pair.worker.stream_lane(old).unwrap();
    pair.worker_finish(old, b"");
    pair.worker.release(pair.now, old);
    pair.drive();
    // Slots are reused lowest first: keep opening until the new stream lands on the old slot
    // and lane.
    let new = loop {
        let (k, _) = pair.open_stream(PROLOGUE);
        let id = pair.worker.stream_wire_id(k).unwrap();
        if id.slot() == old_id.slot() && pair.worker.stream_lane(k) == Some(lane) {
            break k;
        }
        assert!(id.slot() < 64, "the old slot was never reused");
    };
    assert_ne!(
        pair.worker.stream_wire_id(new).unwrap().generation(),
        old_id.generation()
    );
    // A late CANCEL of the old stream arrives on that lane.
    let stale_before = pair.worker.stats().stale_drops;
    let mut buf = BytesMut::new();
    Frame::Batch(Batch::from_records(&[Record::Cancel {
        stream: old_id,
        code: CancelCode::CANCELLED,
    }]))
    .encode(&mut buf);
    pair.worker.handle_input(pair.now, lane, &mut buf).unwrap();
    assert_eq!(pair.worker.stats().stale_drops, stale_before + 1);
    assert!(
        pair.worker.stream_state(new).unwrap().is_live(),
        "the new stream is untouched"
    );
    pair.worker_send(new, b"fine");
}

#[test]
fn an_open_in_flight_when_the_frontend_goes_away_is_still_delivered() {
    let mut pair = Pair::new(default_configs());
    // The worker opens before it can know; the frontend goes away while the OPEN travels.
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.frontend.go_away(pair.now, GoAwayCode::DRAIN);
    pair.drive();
    // The frontend's application decides (it serves streams it registered before going
    // away); the mux does not refuse them on its own.
    let key = pair.frontend_key(ticket);
    assert_eq!(pair.frontend.stats().streams_refused, 0);
    pair.worker_send(s, b"served during the drain");
    pair.worker_finish(s, b"");
    pair.drive();
    let got = pair.frontend_read(key);
    assert_eq!(items(&got), vec![&b"served during the drain"[..]]);
    assert_eq!(ends(&got), vec![&StreamEnd::Finished]);
}

#[test]
fn an_open_naming_a_high_slot_costs_memory_for_one_stream_not_for_the_slot_number() {
    let mut pair = Pair::new(default_configs());
    let lane = LaneId(0);
    let open = Record::Open {
        stream: StreamId::new(65_535, 1),
        ticket: 1,
        token: Token([0; 16]),
        prologue: Bytes::from_static(PROLOGUE),
    };
    inject(&mut pair, lane, &[open]).unwrap();
    assert_eq!(pair.frontend.stream_count(), 1);
    let bytes = pair.frontend.lane_table_bytes(lane);
    assert!(
        bytes <= 16 * 1024,
        "one OPEN made the lane's table hold {bytes} bytes"
    );
}

#[test]
fn a_record_after_a_streams_final_is_reported_as_a_violation_not_dropped() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker_send(s, b"a");
    let id = pair.worker.stream_wire_id(s).unwrap();
    pair.worker_finish(s, b"");
    pair.drive();
    let fk = pair.frontend_key(ticket);
    let lane = pair.frontend.stream_lane(fk).unwrap();
    // A broken worker sends more on the finished stream (seq 1 follows the FINAL's).
    let late = Record::Data {
        stream: id,
        seq: 1,
        payload: Bytes::from_static(b"late"),
    };
    inject(&mut pair, lane, &[late]).unwrap();
    let got = pair.frontend_read(fk);
    assert_eq!(items(&got), vec![&b"a"[..]]);
    assert_eq!(
        ends(&got),
        vec![&StreamEnd::Violation("a record after the stream's end")]
    );
    assert_eq!(pair.frontend.stats().records_after_end, 1);
    assert_eq!(pair.frontend.stats().stale_drops, 0);
    assert_eq!(
        pair.frontend.lane_state(lane),
        LaneState::Up,
        "siblings are spared"
    );
}

#[test]
fn a_large_prologue_waits_for_room_in_a_full_lane_like_any_large_record() {
    let (w, _) = configs(|b| b.lanes(1).max_buffered_bytes(64 * 1024));
    let f = MuxConfig::builder(Side::Frontend)
        .lanes(1)
        .window(60_000)
        .build()
        .unwrap();
    let mut pair = Pair::new((w, f));
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.drive();
    // The frontend stops reading: the worker's lane fills up.
    pair.stall_writes(Side::Worker, true);
    let item = vec![0; 1000];
    let blocked = loop {
        match pair.worker.send(pair.now, s, &item) {
            Ok(()) => pair.step_now(),
            Err(e) => break e,
        };
    };
    assert_eq!(blocked, SendError::WouldBlock(velo_mux::Blocked::Lane));
    let big = vec![b' '; 2048];
    assert_eq!(
        pair.worker.open(pair.now, 2, &Token([0; 16]), &big),
        Err(OpenError::LaneFull)
    );
    // A small OPEN is always taken (like a small FINAL: at most one per stream).
    assert!(
        pair.worker
            .open(pair.now, 3, &Token([0; 16]), PROLOGUE)
            .is_ok()
    );
    // Once the peer reads again, the large one goes through.
    pair.stall_writes(Side::Worker, false);
    pair.drive();
    let r = pair.worker.open(pair.now, 4, &Token([0; 16]), &big);
    assert!(r.is_ok(), "{r:?}");
}

#[test]
fn a_burst_of_streams_returning_credit_leaves_no_burst_sized_grant_list_behind() {
    let mut pair = Pair::new(default_configs());
    // 8,000 streams over 4 lanes, one item each: every stream read once owes a little credit,
    // so each lane's grant list holds ~2,000 streams until its next batch.
    let streams: Vec<_> = (0..8_000).map(|_| pair.open_stream(PROLOGUE)).collect();
    for &(s, _) in &streams {
        pair.worker_send(s, b"one");
    }
    pair.drive();
    for &(_, ticket) in &streams {
        let key = pair.frontend_key(ticket);
        assert_eq!(items(&pair.frontend_read(key)).len(), 1);
    }
    let lanes = (0..4).map(LaneId);
    let peak: usize = lanes
        .clone()
        .map(|l| pair.frontend.lane_grant_list_capacity(l))
        .sum();
    assert!(peak > 4 * 1024, "the burst did not fill the lists: {peak}");
    // The streams end and are released; the frontend has nothing more to send, so the lists
    // go with its next batch at the latest: the heartbeat a third of the idle timeout on.
    for &(s, _) in &streams {
        pair.worker_finish(s, b"");
    }
    pair.drive();
    for &(_, ticket) in &streams {
        let key = pair.frontend_key(ticket);
        pair.frontend_read(key);
        pair.frontend.release(pair.now, key);
    }
    pair.advance(velo_mux::DEFAULT_IDLE_TIMEOUT / 2);
    for lane in lanes {
        let kept = pair.frontend.lane_grant_list_capacity(lane);
        assert!(
            kept <= 1024,
            "{lane:?} keeps room for {kept} grants after the burst"
        );
    }
}
