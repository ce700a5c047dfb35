//! Stories of a worker whose input makes the frontend hold or queue more than it should:
//! OPENs the application has not answered yet (`max_pending_opens`), and control records
//! (CANCEL, ACCEPT, CREDIT, ...) queued for a peer that does not read them
//! (`max_control_bytes`). Each bound holds whatever the peer sends.

mod common;

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use velo_mux::testing::Pair;
use velo_mux::{ChurnLimit, LaneError, LaneId, MuxConfig, MuxEvent, Side, StreamKey};
use velo_wire::{Batch, CancelCode, CloseCode, Frame, Record, StreamId, Token};

use common::*;

const LANE: LaneId = LaneId(0);

/// One lane; the frontend answers OPENs only when the test says so.
fn pair(frontend: impl FnOnce(velo_mux::MuxConfigBuilder) -> velo_mux::MuxConfigBuilder) -> Pair {
    let worker = MuxConfig::builder(Side::Worker).lanes(1).build().unwrap();
    let frontend = frontend(MuxConfig::builder(Side::Frontend).lanes(1))
        .churn_limit(ChurnLimit {
            burst: 1 << 20,
            per_second: 1,
        })
        .build()
        .unwrap();
    let mut pair = Pair::new((worker, frontend));
    pair.auto_accept = false;
    pair.drive();
    pair
}

fn open(slot: u32) -> Record {
    Record::Open {
        stream: StreamId::new(slot, 0),
        ticket: u64::from(slot),
        token: Token([0; 16]),
        prologue: Bytes::from_static(PROLOGUE),
    }
}

/// The frontend's streams opened so far, oldest first, drained from its events.
fn opened(pair: &mut Pair) -> Vec<StreamKey> {
    let mut keys = Vec::new();
    pair.frontend_events.retain(|e| match e {
        MuxEvent::Opened { stream, .. } => {
            keys.push(*stream);
            false
        }
        _ => true,
    });
    keys
}

#[test]
fn opens_past_the_pending_cap_are_refused_until_the_application_answers() {
    let mut pair = pair(|c| c.max_pending_opens(4));
    let five: Vec<_> = (0..5).map(open).collect();
    inject(&mut pair, LANE, &five).unwrap();
    let pending = opened(&mut pair);
    assert_eq!(pending.len(), 4, "the fifth OPEN found the lane full");
    let stats = pair.frontend.stats();
    assert_eq!(stats.pending_opens_refused, 1);
    assert_eq!(stats.streams_refused, 1);
    assert_eq!(stats.churn, 1, "a refused OPEN is churn");
    // Answering one (either way) frees its place.
    pair.frontend.accept_stream(pair.now, pending[0]);
    inject(&mut pair, LANE, &[open(5), open(6)]).unwrap();
    assert_eq!(opened(&mut pair).len(), 1);
    assert_eq!(pair.frontend.stats().pending_opens_refused, 2);
}

#[test]
fn input_pauses_at_half_the_pending_cap_and_resumes_once_the_application_answers() {
    // A worker opening thousands of streams at once is legitimate: its OPENs wait in the
    // socket while the application answers, instead of being refused past the cap (a loaded
    // frontend whose reader ran ahead of its application refused a legitimate burst).
    let mut pair = pair(|c| c.max_pending_opens(8));
    let four: Vec<_> = (0..4).map(open).collect();
    inject(&mut pair, LANE, &four).unwrap();
    let pending = opened(&mut pair);
    assert_eq!(pending.len(), 4);
    assert!(
        !pair.frontend.wants_input(LANE),
        "half the cap unanswered: the driver stops reading"
    );
    pair.frontend.accept_stream(pair.now, pending[0]);
    assert!(pair.frontend.wants_input(LANE), "answered: input resumes");
    let writable = std::iter::from_fn(|| pair.frontend.poll_event())
        .any(|e| matches!(e, MuxEvent::LaneWritable(LANE)));
    assert!(writable, "the driver is told it may read again");
    assert_eq!(pair.frontend.stats().pending_opens_refused, 0);
}

#[test]
fn a_transmit_does_not_resume_input_paused_on_unanswered_opens() {
    // Writing out an ACCEPT frees bytes, not OPENs: input stays paused until the application
    // answers enough of them (a resume here made the driver read, then pause again at once).
    let mut pair = pair(|c| c.max_pending_opens(8));
    let five: Vec<_> = (0..5).map(open).collect();
    inject(&mut pair, LANE, &five).unwrap();
    let pending = opened(&mut pair);
    assert!(!pair.frontend.wants_input(LANE), "five of eight unanswered");
    while pair.frontend.poll_event().is_some() {}
    pair.frontend.accept_stream(pair.now, pending[0]);
    pair.frontend.flush_hint(pair.now);
    let mut out = Vec::new();
    while pair
        .frontend
        .poll_transmit(pair.now, LANE, &mut out)
        .is_some()
    {}
    assert!(!out.is_empty(), "the ACCEPT was written");
    let resumed = std::iter::from_fn(|| pair.frontend.poll_event())
        .any(|e| matches!(e, MuxEvent::LaneWritable(LANE)));
    assert!(!resumed, "four OPENs, half the cap, are still unanswered");
    pair.frontend.accept_stream(pair.now, pending[1]);
    let resumed = std::iter::from_fn(|| pair.frontend.poll_event())
        .any(|e| matches!(e, MuxEvent::LaneWritable(LANE)));
    assert!(resumed, "three unanswered: input resumes");
}

/// Frontend input: `n` OPENs each followed by a second OPEN of the same live stream, a
/// violation the frontend answers with a CANCEL of its own: control bytes for every pair.
fn violations(first_slot: u32, n: u32) -> BytesMut {
    let records: Vec<_> = (first_slot..first_slot + n)
        .flat_map(|slot| [open(slot), open(slot)])
        .collect();
    let mut buf = BytesMut::new();
    Frame::Batch(Batch::from_records(&records)).encode(&mut buf);
    buf
}

/// Bytes of the CANCEL the frontend answers a violation of `slot` with.
fn cancel_len(slot: u32) -> usize {
    Record::Cancel {
        stream: StreamId::new(slot, 0),
        code: CancelCode::PROTOCOL_ERROR,
    }
    .encoded_len()
}

#[test]
fn input_that_queues_control_bytes_past_the_cap_closes_the_lane() {
    const MAX: usize = 4096;
    let mut pair = pair(|c| c.max_control_bytes(MAX));
    // Twice the cap's worth of CANCELs, asked for in one frame.
    let n = u32::try_from(2 * MAX / cancel_len(1000)).unwrap();
    let mut input = violations(1000, n);
    let err = pair
        .frontend
        .handle_input(pair.now, LANE, &mut input)
        .unwrap_err();
    assert_eq!(err, LaneError::ControlQueueFull { max: MAX });
    assert_eq!(err.close_code(), Some(CloseCode::LIMIT));
    assert_eq!(pair.frontend.stats().control_queue_closes, 1);
    assert!(
        pair.frontend.lane_buffered(LANE) < 256,
        "only the CLOSE is left: {} bytes",
        pair.frontend.lane_buffered(LANE)
    );
}

#[test]
fn input_pauses_at_half_the_control_cap_and_resumes_once_the_peer_reads() {
    const MAX: usize = 4096;
    let mut pair = pair(|c| c.max_control_bytes(MAX));
    // Just over half the cap.
    let n = u32::try_from(MAX / 2 / cancel_len(1000) + 1).unwrap();
    let mut input = violations(1000, n);
    pair.frontend
        .handle_input(pair.now, LANE, &mut input)
        .unwrap();
    assert!(
        !pair.frontend.wants_input(LANE),
        "a peer that does not read gets no more answers queued"
    );
    let mut chunks = Vec::new();
    while pair
        .frontend
        .poll_transmit(pair.now, LANE, &mut chunks)
        .is_some()
    {}
    assert!(pair.frontend.wants_input(LANE), "read: input resumes");
    let writable = std::iter::from_fn(|| pair.frontend.poll_event())
        .any(|e| matches!(e, MuxEvent::LaneWritable(LANE)));
    assert!(writable, "the driver is told it may read again");
}

/// What the application does between two frames of OPENs.
#[derive(Debug, Clone)]
enum Step {
    /// A frame of this many OPENs.
    Opens(u8),
    /// Accepts this many of the oldest unanswered streams.
    Accept(u8),
    /// Refuses this many of them.
    Refuse(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (1u8..=12).prop_map(Step::Opens),
        1 => (0u8..=6).prop_map(Step::Accept),
        1 => (0u8..=6).prop_map(Step::Refuse),
    ]
}

proptest! {
    /// Whatever the worker sends and however slowly the application answers, a lane never
    /// holds more than `max_pending_opens` OPENs unanswered, and every OPEN is either opened
    /// or refused and counted.
    #[test]
    fn unanswered_opens_never_exceed_the_cap(
        cap in 1u32..=8,
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let mut pair = pair(|c| c.max_pending_opens(cap));
        let mut unanswered: VecDeque<StreamKey> = VecDeque::new();
        let (mut sent, mut next_slot) = (0u64, 0u32);
        for step in steps {
            match step {
                Step::Opens(n) => {
                    let records: Vec<_> = (0..u32::from(n)).map(|i| open(next_slot + i)).collect();
                    next_slot += u32::from(n);
                    sent += u64::from(n);
                    inject(&mut pair, LANE, &records).unwrap();
                    unanswered.extend(opened(&mut pair));
                }
                Step::Accept(n) => {
                    for key in unanswered.drain(..usize::from(n).min(unanswered.len())) {
                        pair.frontend.accept_stream(pair.now, key);
                    }
                }
                Step::Refuse(n) => {
                    for key in unanswered.drain(..usize::from(n).min(unanswered.len())) {
                        pair.frontend.cancel(pair.now, key, CancelCode::REFUSED);
                    }
                }
            }
            prop_assert!(unanswered.len() <= cap as usize, "{} unanswered", unanswered.len());
            let stats = pair.frontend.stats();
            prop_assert_eq!(stats.streams_opened + stats.pending_opens_refused, sent);
            prop_assert!(pair.frontend.check_invariants().is_ok(), "{:?}", pair.frontend.check_invariants());
        }
    }
}

#[test]
fn the_caps_are_validated_when_built() {
    let field = |b: velo_mux::MuxConfigBuilder| match b.build() {
        Err(velo_mux::ConfigError::OutOfRange { field, .. }) => field,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let b = || MuxConfig::builder(Side::Frontend);
    assert_eq!(field(b().max_pending_opens(0)), "max_pending_opens");
    assert_eq!(
        field(b().max_pending_opens((1 << 24) + 1)),
        "max_pending_opens"
    );
    assert_eq!(field(b().max_control_bytes(4095)), "max_control_bytes");
    let c = b().build().unwrap();
    assert_eq!(c.max_pending_opens(), velo_mux::DEFAULT_MAX_PENDING_OPENS);
    assert_eq!(c.max_control_bytes(), velo_mux::DEFAULT_MAX_CONTROL_BYTES);
}
