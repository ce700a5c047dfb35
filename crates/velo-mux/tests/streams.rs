//! Stories of streams between a worker and a frontend mux, on the deterministic harness.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use velo_mux::testing::{Pair, default_configs};
use velo_mux::{
    Blocked, CloseReason, FlushPolicy, LaneError, LaneId, LaneState, MuxConfig, MuxEvent,
    OpenError, Recv, SendError, Side, StreamEnd,
};
use velo_wire::{Batch, CancelCode, CloseCode, Frame, Record, StreamId, Token};

const PROLOGUE: &[u8] = br#"{"error":null}"#;

fn configs(
    worker: impl FnOnce(velo_mux::MuxConfigBuilder) -> velo_mux::MuxConfigBuilder,
) -> (MuxConfig, MuxConfig) {
    let w = worker(MuxConfig::builder(Side::Worker)).build().unwrap();
    let (_, f) = default_configs();
    (w, f)
}

fn items(recv: &[Recv]) -> Vec<&[u8]> {
    recv.iter()
        .filter_map(|r| match r {
            Recv::Item(b) => Some(&b[..]),
            Recv::End(_) => None,
        })
        .collect()
}

fn ends(recv: &[Recv]) -> Vec<&StreamEnd> {
    recv.iter()
        .filter_map(|r| match r {
            Recv::End(e) => Some(e),
            Recv::Item(_) => None,
        })
        .collect()
}

/// Feeds hand-made records to the frontend on `lane`, as if the worker had sent them.
fn inject(pair: &mut Pair, lane: LaneId, records: &[Record]) -> Result<(), LaneError> {
    let mut buf = BytesMut::new();
    Frame::Batch(Batch::from_records(records)).encode(&mut buf);
    let r = pair.frontend.handle_input(pair.now, lane, &mut buf);
    pair.step_now();
    r
}

#[test]
fn items_arrive_in_order_with_prologue_and_clean_end() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    for i in 0..10u8 {
        pair.worker_send(s, &[i; 3]);
    }
    pair.worker_finish(s, b"last");
    pair.drive();
    let opened: Vec<_> = pair
        .frontend_events
        .iter()
        .filter_map(|e| match e {
            MuxEvent::Opened {
                ticket,
                prologue,
                token,
                ..
            } => Some((*ticket, prologue.clone(), *token)),
            _ => None,
        })
        .collect();
    assert_eq!(
        opened,
        vec![(ticket, Bytes::from_static(PROLOGUE), Token([7; 16]))]
    );
    let f = pair.frontend_key(ticket);
    let got = pair.frontend_read(f);
    let mut want: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 3]).collect();
    want.push(b"last".to_vec());
    assert_eq!(items(&got), want.iter().map(|v| &v[..]).collect::<Vec<_>>());
    assert_eq!(ends(&got), vec![&StreamEnd::Finished]);
    // The end is delivered exactly once.
    assert!(pair.frontend_read(f).is_empty());
    assert_eq!(pair.frontend.stats().streams_finished, 1);
    assert_eq!(pair.worker.stats().streams_finished, 1);
}

#[test]
fn full_window_still_finishes() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    for i in 0..32u32 {
        pair.worker_send(s, &i.to_le_bytes());
    }
    assert_eq!(
        pair.worker.send(pair.now, s, b"x"),
        Err(SendError::WouldBlock(Blocked::Credit))
    );
    // The terminal record has its own credit: finishing a full window never wedges.
    pair.worker_finish(s, b"");
    pair.drive();
    let got = pair.frontend_read(pair.frontend_key(ticket));
    assert_eq!(items(&got).len(), 32);
    assert_eq!(ends(&got), vec![&StreamEnd::Finished]);
}

#[test]
fn sender_without_credit_waits_for_writable_then_resumes() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    for _ in 0..32 {
        pair.worker_send(s, b"item");
    }
    assert_eq!(
        pair.worker.send(pair.now, s, b"item"),
        Err(SendError::WouldBlock(Blocked::Credit))
    );
    pair.drive();
    assert!(
        !pair.worker_events.contains(&MuxEvent::Writable(s)),
        "no credit before the consumer reads"
    );
    // The consumer reads half a window: one grant goes back, the sender may continue.
    let f = pair.frontend_key(ticket);
    for _ in 0..16 {
        assert!(matches!(
            pair.frontend.recv(pair.now, f),
            Some(Recv::Item(_))
        ));
    }
    pair.drive();
    assert!(pair.worker_events.contains(&MuxEvent::Writable(s)));
    assert_eq!(pair.worker.send_credit(s), Some(16));
    pair.worker_send(s, b"item");
    assert_eq!(pair.worker.stats().credit_stalls, 1);
}

#[test]
fn grants_are_batched_never_one_per_record() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    let f_key = {
        pair.drive();
        pair.frontend_key(ticket)
    };
    let mut received = 0;
    for round in 0..20 {
        for i in 0..8u8 {
            pair.worker.send(pair.now, s, &[round, i]).unwrap();
        }
        pair.drive();
        received += items(&pair.frontend_read(f_key)).len();
    }
    assert_eq!(received, 160);
    let grants = pair.frontend.stats().grants_sent;
    // 160 records at window 32: a grant per 16 records, about 10, never 160.
    assert!(
        (9..=12).contains(&grants),
        "{grants} grants for 160 records"
    );
}

#[test]
fn five_ms_policy_never_holds_a_record_longer_than_5ms() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    let f = pair.frontend_key(ticket);
    for step in 0..50u64 {
        let sent_at = pair.now;
        pair.worker.send(pair.now, s, &step.to_le_bytes()).unwrap();
        // Let 1 ms pass between some sends so batches mix old and new records.
        pair.advance(Duration::from_micros(700 * (step % 3)));
        let before = pair.frontend.stats().records_received;
        pair.advance(Duration::from_millis(5).saturating_sub(pair.now - sent_at));
        assert!(
            pair.frontend.stats().records_received > before || pair.worker.is_flushed(),
            "a record waited more than 5 ms (step {step})"
        );
        assert!(
            pair.worker.is_flushed(),
            "record still queued 5 ms after it was sent (step {step})"
        );
        pair.frontend_read(f);
    }
    assert!(pair.worker.stats().flush_deadline > 0);
}

#[test]
fn five_ms_policy_holds_records_until_the_deadline() {
    let mut pair = Pair::new(default_configs());
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.drive();
    pair.worker.send(pair.now, s, b"a").unwrap();
    pair.advance(Duration::from_micros(4900));
    assert!(!pair.worker.is_flushed(), "flushed before its deadline");
    pair.advance(Duration::from_micros(100));
    assert!(pair.worker.is_flushed());
}

#[test]
fn greedy_policy_flushes_on_the_next_poll() {
    let mut pair = Pair::new(configs(|b| b.flush(FlushPolicy::greedy())));
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.step_now();
    let t0 = pair.now;
    pair.worker.send(pair.now, s, b"a").unwrap();
    assert!(
        !pair.worker.ready_lanes().is_empty(),
        "the lane is signalled at once"
    );
    assert!(pair.step_now());
    assert!(pair.worker.is_flushed());
    assert_eq!(pair.now, t0, "no virtual time passed");
    assert!(pair.worker.stats().flush_greedy >= 1);
}

#[test]
fn flush_hint_flushes_immediately() {
    let mut pair = Pair::new(default_configs());
    let (a, _) = pair.open_stream(PROLOGUE);
    let (b, _) = pair.open_stream(PROLOGUE);
    pair.worker.send(pair.now, a, b"x").unwrap();
    pair.worker.send(pair.now, b, b"y").unwrap();
    // Opening the batches only asks the writers to re-arm their timers: nothing is due yet.
    let rearm = pair.worker.poll_ready_lanes();
    assert!(!rearm.is_empty());
    let mut chunks = Vec::new();
    for lane in rearm.iter() {
        assert!(
            pair.worker
                .poll_transmit(pair.now, lane, &mut chunks)
                .is_none()
        );
    }
    assert!(!pair.worker.is_flushed());
    pair.worker.flush_hint(pair.now);
    assert!(!pair.worker.poll_ready_lanes().is_empty());
    pair.step_now();
    assert!(pair.worker.is_flushed());
    assert_eq!(
        pair.worker.stats().flush_hint,
        2,
        "one batch per lane in use"
    );
}

#[test]
fn thousand_streams_spread_over_four_lanes_within_one_of_even() {
    let mut pair = Pair::new(default_configs());
    for _ in 0..1000 {
        pair.open_stream(PROLOGUE);
    }
    let loads: Vec<u32> = (0..4)
        .map(|i| pair.worker.lane_streams(LaneId(i)))
        .collect();
    let (min, max) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
    assert!(max - min <= 1, "{loads:?}");
    assert_eq!(loads.iter().sum::<u32>(), 1000);
}

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
fn stop_is_graceful_items_keep_flowing_until_the_end() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    let f = pair.frontend_key(ticket);
    pair.frontend.stop(pair.now, f);
    pair.drive();
    assert!(pair.worker_events.contains(&MuxEvent::StopRequested(s)));
    assert!(pair.worker.is_stop_requested(s));
    pair.worker_send(s, b"after stop");
    pair.worker_finish(s, b"");
    pair.drive();
    let got = pair.frontend_read(f);
    assert_eq!(items(&got), vec![&b"after stop"[..]]);
    assert_eq!(ends(&got), vec![&StreamEnd::Finished]);
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
            reason: CloseReason::Cancelled(0)
        }]
    );
    assert_eq!(
        pair.worker.send(pair.now, s, b"x"),
        Err(SendError::Closed(StreamEnd::Cancelled(0)))
    );
    assert_eq!(
        pair.frontend_read(f),
        vec![Recv::End(StreamEnd::Cancelled(0))]
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
        reason: CloseReason::Cancelled(0)
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
fn heartbeats_keep_an_idle_connection_alive() {
    let mut pair = Pair::new(default_configs());
    pair.advance(Duration::from_secs(60));
    for i in 0..4 {
        assert_eq!(pair.worker.lane_state(LaneId(i)), LaneState::Up);
        assert_eq!(pair.frontend.lane_state(LaneId(i)), LaneState::Up);
    }
    let hb = pair.worker.stats().heartbeats_sent;
    // Every 10 s / 3 per lane: about 18 per lane in a minute.
    assert!((60..=80).contains(&hb), "{hb} heartbeats");
}

#[test]
fn heartbeats_do_not_wait_behind_queued_data() {
    let mut pair = Pair::new(configs(|b| {
        b.flush(FlushPolicy::with_max_delay(Duration::from_secs(10)))
    }));
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.drive();
    pair.advance(Duration::from_secs(3));
    pair.worker.send(pair.now, s, b"slow batch").unwrap();
    // The next heartbeat is due ~3.3 s after the last transmit: it flushes the batch with it.
    pair.advance(Duration::from_millis(500));
    assert!(
        pair.worker.is_flushed(),
        "the heartbeat went out with the queued record"
    );
    assert!(pair.worker.stats().flush_control >= 1);
}

#[test]
fn goaway_refuses_new_streams_while_open_ones_finish() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    pair.frontend.go_away(pair.now, 0);
    pair.drive();
    assert!(pair.worker_events.contains(&MuxEvent::GoAway { code: 0 }));
    assert_eq!(
        pair.worker.open(pair.now, 1, &Token([0; 16]), PROLOGUE),
        Err(OpenError::GoingAway(0))
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
fn a_one_mib_item_is_chained_and_arrives_intact() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    let big: Bytes = (0..1 << 20)
        .map(|i: u32| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    pair.worker.send_bytes(pair.now, s, big.clone()).unwrap();
    pair.worker.send(pair.now, s, b"small after").unwrap();
    pair.worker.finish(pair.now, s, big.clone()).unwrap();
    pair.drive();
    let got = pair.frontend_read(pair.frontend_key(ticket));
    assert_eq!(items(&got), vec![&big[..], &b"small after"[..], &big[..]]);
    assert_eq!(ends(&got), vec![&StreamEnd::Finished]);
}

#[test]
fn items_larger_than_a_frame_are_refused_locally() {
    let w = MuxConfig::builder(Side::Worker)
        .max_frame_len(4096)
        .build()
        .unwrap();
    let mut pair = Pair::new((w, default_configs().1));
    let (s, _) = pair.open_stream(PROLOGUE);
    let err = pair.worker.send(pair.now, s, &[0; 8192]).unwrap_err();
    assert!(
        matches!(err, SendError::TooLarge { len: 8192, .. }),
        "{err}"
    );
}

#[test]
fn a_full_lane_buffer_holds_senders_back_until_it_drains() {
    let w = MuxConfig::builder(Side::Worker)
        .lanes(1)
        .window(65_536)
        .max_buffered_bytes(64 * 1024)
        .build()
        .unwrap();
    let f = MuxConfig::builder(Side::Frontend)
        .lanes(1)
        .window(65_536)
        .build()
        .unwrap();
    let mut pair = Pair::new((w, f));
    let (s, _) = pair.open_stream(PROLOGUE);
    let mut sent = 0;
    let err = loop {
        match pair.worker.send(pair.now, s, &[1; 1000]) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 1000, "the lane never filled");
    };
    assert_eq!(err, SendError::WouldBlock(Blocked::Lane));
    assert!(pair.worker.lane_buffered(LaneId(0)) <= 64 * 1024 + 1100);
    // A small terminal record is still taken.
    pair.worker.finish(pair.now, s, Bytes::new()).unwrap();
    pair.step_now();
    assert!(
        pair.worker_events
            .contains(&MuxEvent::LaneWritable(LaneId(0)))
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
fn a_grant_to_a_nearly_stalled_worker_goes_out_at_once() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    for _ in 0..32 {
        pair.worker_send(s, b"x");
    }
    assert_eq!(
        pair.worker.send(pair.now, s, b"x"),
        Err(SendError::WouldBlock(Blocked::Credit))
    );
    pair.drive();
    let f = pair.frontend_key(ticket);
    // The worker has no credit left: the grant after 16 reads is urgent.
    for _ in 0..16 {
        pair.frontend.recv(pair.now, f);
    }
    assert!(
        !pair.frontend.ready_lanes().is_empty(),
        "flushed without waiting for the grant delay"
    );
    let t0 = pair.now;
    pair.step_now();
    assert_eq!(pair.now, t0);
    assert!(pair.worker_events.contains(&MuxEvent::Writable(s)));
}

#[test]
fn a_grant_to_a_worker_with_credit_to_spare_waits_for_the_grant_delay() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    for _ in 0..16 {
        pair.worker_send(s, b"x");
    }
    pair.drive();
    let f = pair.frontend_key(ticket);
    for _ in 0..16 {
        pair.frontend.recv(pair.now, f);
    }
    // The writer is asked to re-arm its timer, but nothing is due before the grant delay.
    assert!(!pair.frontend.ready_lanes().is_empty());
    pair.step_now();
    assert_eq!(pair.worker.send_credit(s), Some(16));
    pair.advance(Duration::from_millis(1));
    assert_eq!(pair.worker.send_credit(s), Some(32));
}

#[test]
fn opening_a_batch_tells_the_writer_to_rearm_its_timer() {
    let mut pair = Pair::new(default_configs());
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.drive();
    let lane = pair.worker.stream_lane(s).unwrap();
    let mut chunks = Vec::new();
    let _ = pair.worker.poll_ready_lanes();
    // The writer last armed its timer for the next heartbeat, seconds away.
    let armed = pair.worker.lane_timeout(lane).unwrap();
    assert!(armed - pair.now > Duration::from_secs(1));
    pair.worker.send(pair.now, s, b"a").unwrap();
    // The first record moved the lane's deadline to now + 5 ms: the writer is told.
    let ready = pair.worker.poll_ready_lanes();
    assert_eq!(ready.iter().collect::<Vec<_>>(), vec![lane]);
    assert!(
        pair.worker
            .poll_transmit(pair.now, lane, &mut chunks)
            .is_none()
    );
    assert_eq!(
        pair.worker.lane_timeout(lane),
        Some(pair.now + Duration::from_millis(5))
    );
    // More records in the same batch do not wake it again.
    pair.worker.send(pair.now, s, b"b").unwrap();
    assert!(pair.worker.poll_ready_lanes().is_empty());
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
    let mut buf = BytesMut::new();
    Frame::Batch(Batch::from_records(&[Record::Cancel {
        stream: old_id,
        code: CancelCode::CANCELLED,
    }]))
    .encode(&mut buf);
    pair.worker.handle_input(pair.now, lane, &mut buf).unwrap();
    assert_eq!(pair.worker.stats().stale_drops, 1);
    assert!(
        pair.worker.stream_state(new).unwrap().is_live(),
        "the new stream is untouched"
    );
    pair.worker_send(new, b"fine");
}
