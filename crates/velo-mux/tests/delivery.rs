//! Stories of whether a worker's end reached the frontend. A worker that ends a stream before
//! the frontend accepted it cannot know the frontend ever saw it: if the lane fails (or the
//! frontend refuses it) first, the worker is told its end was not delivered, so the request
//! can fail or be retried instead of leaving the frontend waiting for a stream that is gone.

mod common;

use velo_mux::testing::{Pair, default_configs};
use velo_mux::{CloseReason, LaneError, MuxEvent, StreamEnd, StreamKey, TransportEnd};
use velo_wire::CancelCode;

use common::*;

fn closed_events(pair: &Pair, key: StreamKey) -> Vec<CloseReason> {
    pair.worker_events
        .iter()
        .filter_map(|e| match e {
            MuxEvent::Closed { stream, reason } if *stream == key => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_stream_finished_before_its_accept_is_undelivered_when_the_lane_dies_first() {
    let mut pair = Pair::new(default_configs());
    let (s, _ticket) = pair.open_stream(PROLOGUE);
    pair.worker_send(s, b"only");
    pair.worker_finish(s, b"");
    let lane = pair.worker.stream_lane(s).unwrap();
    // Nothing was transmitted: the OPEN, the item and the FINAL die with the lane.
    pair.kill_lane(lane);
    let lost = StreamEnd::Lost(LaneError::Transport(TransportEnd::Aborted));
    assert_eq!(pair.worker.send_end(s), Some(lost.clone()));
    assert_eq!(pair.worker.end_delivery(s), Some(Err(lost)));
    assert_eq!(
        closed_events(&pair, s),
        vec![CloseReason::Lost(LaneError::Transport(
            TransportEnd::Aborted
        ))],
        "told exactly once"
    );
    assert_eq!(pair.worker.stats().ends_undelivered, 1);
}

#[test]
fn a_stream_finished_after_its_accept_is_delivered_whatever_the_lane_does_next() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.drive();
    let f = pair.frontend_key(ticket);
    pair.worker_send(s, b"only");
    pair.worker_finish(s, b"");
    assert_eq!(pair.worker.end_delivery(s), Some(Ok(())));
    let lane = pair.worker.stream_lane(s).unwrap();
    pair.kill_lane(lane);
    // The frontend took the stream, so it is the one that reports the loss to its reader.
    assert!(closed_events(&pair, s).is_empty());
    assert_eq!(pair.worker.end_delivery(s), Some(Ok(())));
    let got = pair.frontend_read(f);
    assert!(matches!(ends(&got)[..], [StreamEnd::Lost(_)]), "{got:?}");
}

#[test]
fn a_finish_waits_for_the_accept_and_is_delivered_once_it_arrives() {
    let mut pair = Pair::new(default_configs());
    let (s, _ticket) = pair.open_stream(PROLOGUE);
    pair.worker_finish(s, b"last");
    assert_eq!(pair.worker.end_delivery(s), None, "not known yet");
    pair.drive();
    assert_eq!(pair.worker.end_delivery(s), Some(Ok(())));
    assert!(
        pair.worker_events
            .iter()
            .any(|e| matches!(e, MuxEvent::Delivered(k) if *k == s))
    );
    assert!(closed_events(&pair, s).is_empty());
    assert_eq!(pair.worker.stats().ends_undelivered, 0);
}

#[test]
fn a_refusal_of_a_stream_that_had_already_finished_reaches_the_worker() {
    let mut pair = Pair::new(default_configs());
    pair.auto_accept = false;
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker_send(s, b"only");
    pair.worker_finish(s, b"");
    pair.drive();
    // The whole stream arrived in one batch: it has ended on the frontend before anyone
    // looked at its ticket. The ticket is unknown, so the frontend refuses it.
    let f = pair.frontend_key(ticket);
    pair.frontend.cancel(pair.now, f, CancelCode::REFUSED);
    pair.drive();
    let refused = StreamEnd::Cancelled(CancelCode::REFUSED);
    assert_eq!(pair.worker.end_delivery(s), Some(Err(refused)));
    assert_eq!(
        closed_events(&pair, s),
        vec![CloseReason::Cancelled(CancelCode::REFUSED)]
    );
}

#[test]
fn a_frontend_that_releases_an_unanswered_stream_refuses_it() {
    let mut pair = Pair::new(default_configs());
    pair.auto_accept = false;
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker_finish(s, b"");
    pair.drive();
    let f = pair.frontend_key(ticket);
    pair.frontend_read(f);
    pair.frontend.release(pair.now, f);
    pair.drive();
    assert_eq!(
        pair.worker.end_delivery(s),
        Some(Err(StreamEnd::Cancelled(CancelCode::CANCELLED)))
    );
}
