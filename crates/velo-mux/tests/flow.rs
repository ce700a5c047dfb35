//! Stories of items, credit and batching between a worker and a frontend mux, on the
//! deterministic harness.

mod common;

use std::time::Duration;

use bytes::Bytes;
use velo_mux::testing::{Pair, default_configs};
use velo_mux::{
    Blocked, FlushPolicy, FlushReason, LaneId, LaneState, MuxConfig, MuxEvent, Recv, SendError,
    Side, StreamEnd,
};
use velo_wire::Token;

use common::*;

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
    assert!(pair.worker.stats().flushed(FlushReason::Deadline) > 0);
}

#[test]
fn five_ms_policy_holds_records_until_the_deadline() {
    let mut pair = Pair::new(default_configs());
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.worker.send(pair.now, s, b"first").unwrap();
    pair.drive();
    // Past the stream's first item, records wait for their batch.
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
    pair.worker.send(pair.now, s, b"first").unwrap();
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
    assert!(pair.worker.stats().flushed(FlushReason::Greedy) >= 1);
}

#[test]
fn flush_hint_flushes_immediately() {
    let mut pair = Pair::new(default_configs());
    let (a, _) = pair.open_stream(PROLOGUE);
    let (b, _) = pair.open_stream(PROLOGUE);
    pair.worker.send(pair.now, a, b"first").unwrap();
    pair.worker.send(pair.now, b, b"first").unwrap();
    pair.drive();
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
    assert!(!pair.worker.ready_lanes().is_empty());
    pair.step_now();
    assert!(pair.worker.is_flushed());
    assert_eq!(
        pair.worker.stats().flushed(FlushReason::Hint),
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
    assert!(pair.worker.stats().flushed(FlushReason::Control) >= 1);
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
fn items_that_spend_half_or_the_last_of_a_streams_credit_go_at_once() {
    // A stream that sends faster than the batch delay spends its credit before its batch goes:
    // the frontend returns credit only for records it has read, so holding them stalls the
    // stream for the rest of the delay.
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker.send(pair.now, s, b"first").unwrap();
    pair.drive();
    let f = pair.frontend_key(ticket);
    let t0 = pair.now;
    let window = pair.worker.send_credit(s).unwrap() + 1;
    let credit = |pair: &Pair| pair.worker.send_credit(s).unwrap();
    while credit(&pair) > window / 2 + 1 {
        pair.worker_send(s, b"x");
    }
    pair.step_now();
    assert!(
        !pair.worker.is_flushed(),
        "items with credit to spare wait for their batch"
    );
    pair.worker_send(s, b"half");
    assert_eq!(credit(&pair), window / 2);
    pair.step_now();
    assert!(
        pair.worker.is_flushed(),
        "the item that spends half the window takes its batch along at once"
    );
    while credit(&pair) > 1 {
        pair.worker_send(s, b"y");
    }
    pair.step_now();
    assert!(!pair.worker.is_flushed(), "the next items batch again");
    pair.worker_send(s, b"last");
    pair.step_now();
    assert!(
        pair.worker.is_flushed(),
        "the item that spends the last credit goes at once"
    );
    assert_eq!(pair.now, t0, "no virtual time passed");
    let read = pair.frontend_read(f);
    assert_eq!(items(&read).len(), usize::try_from(window).unwrap());
    assert_eq!(pair.worker.stats().flushed(FlushReason::Credit), 2);
}

#[test]
fn opening_a_batch_tells_the_writer_to_rearm_its_timer() {
    let mut pair = Pair::new(default_configs());
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.worker.send(pair.now, s, b"first").unwrap();
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
fn a_streams_first_item_takes_its_prologue_along_and_neither_it_nor_the_end_waits() {
    let mut pair = Pair::new(default_configs());
    let t0 = pair.now;
    let (s, ticket) = pair.open_stream(PROLOGUE);
    // The OPEN waits for its batch under the default policy...
    pair.step_now();
    assert!(!pair.worker.is_flushed(), "the prologue waits");
    // ...until the first item, which goes out at once and takes it along.
    pair.worker.send(pair.now, s, b"first token").unwrap();
    assert!(pair.step_now());
    assert!(pair.worker.is_flushed());
    assert!(
        pair.accepted.contains_key(&ticket),
        "the frontend has the prologue at t0"
    );
    assert_eq!(pair.now, t0, "no virtual time passed");
    // ...but later items batch...
    pair.worker.send(pair.now, s, b"second").unwrap();
    pair.step_now();
    assert!(
        !pair.worker.is_flushed(),
        "the second item waits for its batch"
    );
    // ...until the end, which takes them along at once.
    pair.worker_finish(s, b"");
    pair.step_now();
    assert!(pair.worker.is_flushed(), "the end does not wait");
    assert_eq!(pair.now, t0);
    let f = pair.frontend_key(ticket);
    assert_eq!(
        items(&pair.frontend_read(f)),
        vec![&b"first token"[..], &b"second"[..]]
    );
    assert_eq!(pair.worker.stats().flushed(FlushReason::Edge), 2);
}

#[test]
fn a_prologue_without_items_goes_with_its_batch_after_the_delay() {
    let mut pair = Pair::new(default_configs());
    let (_s, ticket) = pair.open_stream(PROLOGUE);
    pair.step_now();
    assert!(!pair.accepted.contains_key(&ticket));
    pair.advance(Duration::from_millis(5));
    assert!(
        pair.accepted.contains_key(&ticket),
        "a long prefill delays the prologue by at most the batching delay"
    );
}

#[test]
fn with_eager_opens_the_prologue_goes_at_once() {
    let policy = FlushPolicy {
        eager_opens: true,
        ..FlushPolicy::default()
    };
    let mut pair = Pair::new(configs(|b| b.flush(policy)));
    let t0 = pair.now;
    let (_s, ticket) = pair.open_stream(PROLOGUE);
    assert!(pair.step_now());
    assert!(pair.worker.is_flushed());
    assert!(pair.accepted.contains_key(&ticket));
    assert_eq!(pair.now, t0);
    assert_eq!(pair.worker.stats().flushed(FlushReason::Edge), 1);
}

#[test]
fn without_eager_ends_the_first_item_goes_at_once_and_the_end_waits_for_the_batch() {
    let policy = FlushPolicy {
        eager_ends: false,
        ..FlushPolicy::default()
    };
    let mut pair = Pair::new(configs(|b| b.flush(policy)));
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker.send(pair.now, s, b"first token").unwrap();
    pair.step_now();
    assert!(pair.worker.is_flushed(), "the first item goes at once");
    assert!(pair.accepted.contains_key(&ticket), "with the prologue");
    pair.worker_finish(s, b"");
    pair.step_now();
    assert!(!pair.worker.is_flushed(), "the end waits for its batch");
    pair.advance(Duration::from_millis(5));
    assert!(pair.worker.is_flushed(), "and goes with it");
    let f = pair.frontend_key(ticket);
    assert_eq!(
        ends(&pair.frontend_read(f)),
        vec![&StreamEnd::Finished],
        "the stream ends cleanly"
    );
}

#[test]
fn without_eager_edges_even_the_prologue_waits_for_the_batch() {
    let policy = FlushPolicy {
        eager_edges: false,
        ..FlushPolicy::default()
    };
    let mut pair = Pair::new(configs(|b| b.flush(policy)));
    let (_s, ticket) = pair.open_stream(PROLOGUE);
    pair.step_now();
    assert!(!pair.accepted.contains_key(&ticket));
    pair.advance(Duration::from_millis(5));
    assert!(pair.accepted.contains_key(&ticket));
}

#[test]
fn a_small_item_is_copied_out_of_the_receive_buffer_and_a_large_one_is_a_slice_of_it() {
    use bytes::BytesMut;
    use velo_mux::COPY_BELOW;
    use velo_wire::{Batch, Frame, Record};

    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    let key = pair.frontend_key(ticket);
    let lane = pair.worker.stream_lane(s).unwrap();
    let stream = pair.worker.stream_wire_id(s).unwrap();
    // Two items as the worker would send them, in one frame in one receive buffer (with room
    // for the whole frame, as a lane reader reserves it, so decoding does not move it).
    let small = Bytes::from(vec![1u8; 100]);
    let large = Bytes::from(vec![2u8; COPY_BELOW]);
    let mut buf = BytesMut::with_capacity(4 * COPY_BELOW);
    Frame::Batch(Batch::from_records(&[
        Record::Data {
            stream,
            seq: 0,
            payload: small.clone(),
        },
        Record::Data {
            stream,
            seq: 1,
            payload: large.clone(),
        },
    ]))
    .encode(&mut buf);
    let received = buf.as_ptr_range();
    pair.frontend
        .handle_input(pair.now, lane, &mut buf)
        .unwrap();
    let got: Vec<Bytes> = pair
        .frontend_read(key)
        .into_iter()
        .filter_map(|r| match r {
            Recv::Item(b) => Some(b),
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![small, large]);
    assert!(
        !received.contains(&got[0].as_ptr()),
        "a 100-byte item must not keep the receive buffer alive"
    );
    assert!(
        received.contains(&got[1].as_ptr()),
        "an item of COPY_BELOW bytes stays a slice of the receive buffer"
    );
}
