//! Stories of a worker that makes the frontend work for nothing: OPENs that are refused,
//! OPENs reset before their first item ("rapid reset"), and oversized prologues. Each costs a
//! bounded, counted amount; past the churn limit the lane closes with `churn_limit`.

mod common;

use bytes::Bytes;
use velo_mux::testing::Pair;
use velo_mux::{ChurnLimit, LaneError, LaneId, MuxConfig, Side};
use velo_wire::{CancelCode, ErrorCode, Record, StreamId, Token};

use common::*;

const LIMIT: ChurnLimit = ChurnLimit {
    burst: 8,
    per_second: 1,
};

fn pair() -> Pair {
    let worker = MuxConfig::builder(Side::Worker)
        .lanes(1)
        .max_prologue_len(64)
        .build()
        .unwrap();
    let frontend = MuxConfig::builder(Side::Frontend)
        .lanes(1)
        .churn_limit(LIMIT)
        .max_prologue_len(64)
        .build()
        .unwrap();
    let mut pair = Pair::new((worker, frontend));
    pair.drive();
    pair
}

fn open(slot: u32, prologue: &[u8]) -> Record {
    Record::Open {
        stream: StreamId::new(slot, 0),
        ticket: u64::from(slot),
        token: Token([0; 16]),
        prologue: Bytes::copy_from_slice(prologue),
    }
}

#[test]
fn opens_the_frontend_refuses_close_the_lane_past_the_churn_limit() {
    let mut pair = pair();
    // Refused: never taken (a stream the frontend accepted and then dropped is no refusal).
    pair.auto_accept = false;
    for slot in 0..8 {
        inject(&mut pair, LaneId(0), &[open(slot, PROLOGUE)]).unwrap();
        let key = pair.frontend_key(u64::from(slot));
        pair.frontend.cancel(pair.now, key, CancelCode::REFUSED);
    }
    assert_eq!(pair.frontend.stats().churn, 8);
    assert!(pair.frontend.is_connected(), "the burst is absorbed");
    inject(&mut pair, LaneId(0), &[open(8, PROLOGUE)]).unwrap();
    let key = pair.frontend_key(8);
    pair.frontend.cancel(pair.now, key, CancelCode::REFUSED);
    assert!(
        !pair.frontend.is_connected(),
        "the ninth refusal closes the lane"
    );
    assert_eq!(pair.frontend.stats().churn_closes, 1);
}

#[test]
fn opens_reset_before_their_first_item_count_and_streams_that_worked_do_not() {
    let mut pair = pair();
    // A stream that delivered an item, then failed: real work, not churn.
    inject(
        &mut pair,
        LaneId(0),
        &[
            open(100, PROLOGUE),
            Record::Data {
                stream: StreamId::new(100, 0),
                seq: 0,
                payload: Bytes::from_static(b"x"),
            },
            Record::Error {
                stream: StreamId::new(100, 0),
                code: ErrorCode(1),
                message: "engine".into(),
            },
        ],
    )
    .unwrap();
    assert_eq!(pair.frontend.stats().churn, 0);
    for slot in 0..8 {
        inject(&mut pair, LaneId(0), &reset(slot)).unwrap();
    }
    let err = inject(&mut pair, LaneId(0), &reset(8)).unwrap_err();
    assert!(
        matches!(err, LaneError::ChurnLimit { burst: 8, .. }),
        "{err}"
    );
    assert_eq!(err.close_code(), Some(velo_wire::CloseCode::CHURN_LIMIT));
}

#[test]
fn opens_killed_by_a_bad_record_before_their_first_item_count_as_churn() {
    let mut pair = pair();
    // An OPEN then a DATA out of sequence: the stream dies for the violation, the frontend
    // having done an OPEN's work for it (and a CANCEL back), as for a reset.
    let violated = |slot: u32| {
        [
            open(slot, PROLOGUE),
            Record::Data {
                stream: StreamId::new(slot, 0),
                seq: 1,
                payload: Bytes::from_static(b"x"),
            },
        ]
    };
    for slot in 0..8 {
        inject(&mut pair, LaneId(0), &violated(slot)).unwrap();
    }
    assert_eq!(pair.frontend.stats().churn, 8);
    let err = inject(&mut pair, LaneId(0), &violated(8)).unwrap_err();
    assert!(
        matches!(err, LaneError::ChurnLimit { burst: 8, .. }),
        "{err}"
    );
}

/// An OPEN in `slot` and its reset before any item: one unit of churn.
fn reset(slot: u32) -> [Record; 2] {
    [
        open(slot, PROLOGUE),
        Record::Error {
            stream: StreamId::new(slot, 0),
            code: ErrorCode::DROPPED,
            message: String::new(),
        },
    ]
}

#[test]
fn a_prologue_over_the_cap_is_refused_on_both_sides() {
    let mut pair = pair();
    let big = [b' '; 65];
    let err = pair
        .worker
        .open(pair.now, 1, &Token([0; 16]), &big)
        .unwrap_err();
    assert!(
        matches!(err, velo_mux::OpenError::PrologueTooLarge { len: 65, .. }),
        "{err}"
    );
    // A worker ignoring its own cap is refused by the frontend, and that is churn.
    inject(&mut pair, LaneId(0), &[open(1, &big)]).unwrap();
    assert_eq!(pair.frontend.stats().streams_refused, 1);
    assert_eq!(pair.frontend.stats().churn, 1);
    assert_eq!(
        pair.frontend.stats().streams_opened,
        0,
        "no stream state was kept"
    );
}

#[test]
fn the_churn_budget_refills_at_its_rate() {
    let mut pair = pair();
    for slot in 0..8 {
        inject(&mut pair, LaneId(0), &reset(slot)).unwrap();
    }
    // One per second: after a second, one more is absorbed.
    pair.now += std::time::Duration::from_secs(1);
    inject(&mut pair, LaneId(0), &reset(8)).unwrap();
    assert!(inject(&mut pair, LaneId(0), &reset(9)).is_err());
}

#[test]
fn released_receive_queues_are_reused_by_the_next_streams_and_a_burst_keeps_at_most_the_bound() {
    use velo_mux::SPARE_QUEUES;

    let mut pair = Pair::new(velo_mux::testing::default_configs());
    let burst = SPARE_QUEUES + 44;
    let mut tickets = Vec::new();
    for _ in 0..burst {
        let (s, ticket) = pair.open_stream(PROLOGUE);
        pair.worker_send(s, b"an item");
        pair.worker_finish(s, b"");
        tickets.push(ticket);
    }
    pair.drive();
    for ticket in &tickets {
        let key = pair.frontend_key(*ticket);
        assert!(!pair.frontend_read(key).is_empty());
        pair.frontend.release(pair.now, key);
    }
    assert_eq!(
        pair.frontend.spare_queue_count(),
        SPARE_QUEUES,
        "{burst} released queues, at most {SPARE_QUEUES} kept"
    );
    for _ in 0..10 {
        pair.open_stream(PROLOGUE);
    }
    pair.drive();
    assert_eq!(
        pair.frontend.spare_queue_count(),
        SPARE_QUEUES - 10,
        "each accepted stream took a kept queue"
    );
    // A reader taking its stream's items for the first time swaps in a kept queue too, and
    // a reader done with its stream gives its queue back.
    let (s, ticket) = pair.open_stream(PROLOGUE);
    pair.worker_send(s, b"an item");
    pair.drive();
    let key = pair.frontend_key(ticket);
    let kept = pair.frontend.spare_queue_count();
    let mut reader = velo_mux::ItemQueue::new();
    pair.frontend.recv_all(pair.now, key, &mut reader);
    assert_eq!(reader.len(), 1);
    assert_eq!(pair.frontend.spare_queue_count(), kept - 1);
    pair.frontend.release(pair.now, key);
    pair.frontend.give_queue(reader);
    assert_eq!(pair.frontend.spare_queue_count(), kept + 1);
}

/// Streams the frontend took and then dropped with a code other than `cancelled` (an item it
/// could not decode: `protocol_error`) cost the worker's connection nothing: however many,
/// they are no refusals and no churn, and the lane stays up for the streams beside them.
#[test]
fn streams_the_frontend_took_and_dropped_for_their_items_are_not_churn() {
    let mut pair = pair();
    for slot in 0..2 * LIMIT.burst {
        inject(&mut pair, LaneId(0), &[open(slot, PROLOGUE)]).unwrap();
        let key = pair.frontend_key(u64::from(slot));
        pair.frontend
            .cancel(pair.now, key, CancelCode::PROTOCOL_ERROR);
    }
    let stats = pair.frontend.stats();
    assert_eq!((stats.churn, stats.streams_refused), (0, 0));
    assert!(pair.frontend.is_connected());
}
