//! Stories of whether a worker's end reached the frontend. A worker that ends a stream before
//! the frontend accepted it cannot know the frontend ever saw it: if the lane fails (or the
//! frontend refuses it) first, the worker is told its end was not delivered, so the request
//! can fail or be retried instead of leaving the frontend waiting for a stream that is gone.

mod common;

use velo_mux::testing::{Pair, default_configs};
use velo_mux::{CloseReason, LaneError, LaneId, MuxEvent, StreamEnd, StreamKey, TransportEnd};
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
            .any(|e| matches!(e, MuxEvent::Accepted(k) if *k == s))
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

fn lost_opens(pair: &Pair) -> Vec<(u64, velo_wire::Token)> {
    pair.worker_events
        .iter()
        .filter_map(|e| match e {
            MuxEvent::LostBeforeAccept { ticket, token, .. } => Some((*ticket, *token)),
            _ => None,
        })
        .collect()
}

/// Nobody waits on a stream its worker dropped, so only the worker's mux can say that the
/// frontend never saw it: it keeps the stream until the answer, and when the lane dies first
/// it asks for the loss to be announced again (elsewhere) so the frontend's request ends.
#[test]
fn a_dropped_stream_the_frontend_never_took_is_announced_when_its_lane_dies() {
    let mut pair = Pair::new(default_configs());
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker_send(s, b"half");
    let lane = pair.worker.stream_lane(s).unwrap();
    pair.worker.release(pair.now, s);
    assert!(
        pair.worker.stream_state(s).is_some(),
        "kept until the answer"
    );
    pair.kill_lane(lane);
    assert_eq!(lost_opens(&pair), vec![(ticket, velo_wire::Token([7; 16]))]);
    assert!(
        pair.worker.stream_state(s).is_none(),
        "forgotten once answered"
    );
    assert!(closed_events(&pair, s).is_empty(), "nobody holds it");
}

/// Live streams the frontend had not accepted when their lane died are announced too; those
/// it had accepted are not (the frontend ends them itself), nor are announcements.
#[test]
fn only_streams_the_frontend_never_took_are_announced() {
    let (w, f) = configs(|b| b.lanes(1));
    let mut pair = Pair::new((w, f.with_lanes(1)));
    let (taken, _) = pair.open_stream(PROLOGUE);
    pair.drive();
    let (fresh, fresh_ticket) = pair.open_stream(PROLOGUE);
    let (notice, _) = pair.open_stream(b"");
    pair.worker.set_announcements(notice, 0);
    pair.kill_lane(LaneId(0));
    assert_eq!(
        lost_opens(&pair),
        vec![(fresh_ticket, velo_wire::Token([7; 16]))]
    );
    for s in [taken, fresh, notice] {
        assert!(matches!(pair.worker.send_end(s), Some(StreamEnd::Lost(_))));
    }
    assert_eq!(pair.worker.stats().opens_lost, 1);
}

#[test]
fn a_dropped_stream_is_forgotten_once_the_frontend_answers() {
    let mut pair = Pair::new(default_configs());
    let (s, _) = pair.open_stream(PROLOGUE);
    pair.worker.release(pair.now, s);
    assert!(pair.worker.stream_state(s).is_some());
    pair.drive();
    assert!(pair.worker.stream_state(s).is_none());
    assert!(lost_opens(&pair).is_empty());
}
