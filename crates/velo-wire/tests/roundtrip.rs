//! Round trips: whatever the encoder writes, the decoder reads back unchanged, however the
//! bytes are split on the way.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use velo_wire::{
    Auth, Batch, CAP_AUTH, CAP_WORKER_INSTANCE, CancelCode, Close, CloseCode, ErrorCode, Frame,
    FrameDecoder, GoAwayCode, Hello, InstanceId, Record, RecordView, Role, StreamId, Token,
};

const MAX: u32 = 1 << 20;

fn stream_id() -> impl Strategy<Value = StreamId> {
    // Mix small ids (one-byte varints) with the extremes.
    let field = prop_oneof![0u32..200, any::<u32>()];
    (field.clone(), field).prop_map(|(s, g)| StreamId::new(s, g))
}

fn payload() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..200),
        1 => proptest::collection::vec(any::<u8>(), 0..5000),
    ]
    .prop_map(Bytes::from)
}

fn record() -> impl Strategy<Value = Record> {
    prop_oneof![
        1 => (stream_id(), any::<u64>(), any::<[u8; 16]>(), payload()).prop_map(
            |(stream, ticket, t, prologue)| Record::Open { stream, ticket, token: Token(t), prologue }
        ),
        4 => (stream_id(), any::<u32>(), payload())
            .prop_map(|(stream, seq, payload)| Record::Data { stream, seq, payload }),
        1 => (stream_id(), any::<u32>(), payload())
            .prop_map(|(stream, seq, payload)| Record::Final { stream, seq, payload }),
        1 => (stream_id(), any::<u32>(), ".{0,40}")
            .prop_map(|(stream, code, message)| Record::Error { stream, code: ErrorCode(code), message }),
        1 => stream_id().prop_map(|stream| Record::Stop { stream }),
        1 => stream_id().prop_map(|stream| Record::Accept { stream }),
        1 => (stream_id(), any::<u32>()).prop_map(|(stream, code)| Record::Cancel { stream, code: CancelCode(code) }),
        1 => (stream_id(), 1u32..).prop_map(|(stream, grant)| Record::Credit { stream, grant }),
        1 => Just(Record::Heartbeat),
        1 => any::<u32>().prop_map(|code| Record::GoAway { code: GoAwayCode(code) }),
    ]
}

fn hello() -> impl Strategy<Value = Hello> {
    (
        1u16..=64,
        any::<u16>(),
        1u128..,
        any::<u128>(),
        4096u32..,
        1u32..,
        1u32..,
        any::<u32>(),
        any::<bool>(),
        proptest::option::of(any::<[u8; 32]>().prop_filter("nonzero", |n| n != &[0; 32])),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(
            |(count, idx, me, peer, max, window, idle, caps, worker, nonce, instance)| Hello {
                role: if worker { Role::Worker } else { Role::Frontend },
                lane_index: idx % count,
                lane_count: count,
                instance_id: InstanceId::from_u128(me),
                peer_instance_id: InstanceId::from_u128(peer),
                max_frame_len: max,
                initial_window: window,
                idle_timeout_ms: idle,
                capabilities: caps & !(CAP_AUTH | CAP_WORKER_INSTANCE),
                auth_nonce: nonce,
                worker_instance: instance,
            },
        )
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        1 => hello().prop_map(Frame::Hello),
        4 => proptest::collection::vec(record(), 1..20).prop_map(|r| Frame::Batch(Batch::from_records(&r))),
        1 => (any::<u16>(), ".{0,100}").prop_map(|(c, r)| Frame::Close(Close::new(CloseCode(c), r))),
        1 => any::<[u8; 32]>().prop_map(|mac| Frame::Auth(Auth { mac })),
    ]
}

fn encode_all(frames: &[Frame]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        f.encode(&mut out);
    }
    out
}

/// Decodes `wire`, fed in pieces of the given sizes (the last piece takes the rest).
fn decode_in_chunks(wire: &[u8], chunks: &[usize]) -> Vec<Frame> {
    let mut decoder = FrameDecoder::new(MAX);
    let mut src = BytesMut::new();
    let mut frames = Vec::new();
    let mut rest = wire;
    let mut sizes = chunks.iter().copied();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        src.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        while let Some(f) = decoder.decode(&mut src).expect("valid input") {
            frames.push(f);
        }
    }
    assert!(src.is_empty(), "no bytes left over");
    frames
}

fn records_of(frames: &[Frame]) -> Vec<Record> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Batch(b) => Some(b.records().map(|r| r.expect("valid record"))),
            _ => None,
        })
        .flatten()
        .collect()
}

proptest! {
    #[test]
    fn every_record_kind_round_trips(records in proptest::collection::vec(record(), 1..50)) {
        let batch = Batch::from_records(&records);
        let decoded: Vec<Record> = batch.records().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&decoded, &records);
        for r in &records {
            let mut out = Vec::new();
            r.encode(&mut out);
            prop_assert_eq!(out.len(), r.encoded_len());
        }
    }

    #[test]
    fn random_frame_streams_survive_random_chunking(
        frames in proptest::collection::vec(frame(), 1..8),
        chunks in proptest::collection::vec(1usize..300, 0..64),
    ) {
        let wire = encode_all(&frames);
        let decoded = decode_in_chunks(&wire, &chunks);
        prop_assert_eq!(&decoded, &frames);
        prop_assert_eq!(records_of(&decoded), records_of(&frames));
    }
}

#[test]
fn every_two_way_split_of_a_batch_stream_decodes_the_same() {
    let s = StreamId::new(130, 2);
    let frames = vec![
        Frame::Batch(Batch::from_records(&[
            Record::Open {
                stream: s,
                ticket: 1 << 40,
                token: Token([7; 16]),
                prologue: Bytes::from_static(b"{\"error\":null}"),
            },
            Record::Data {
                stream: s,
                seq: 0,
                payload: Bytes::from(vec![1u8; 150]),
            },
        ])),
        Frame::Batch(Batch::from_records(&[
            Record::Credit {
                stream: s,
                grant: 16,
            },
            Record::Heartbeat,
        ])),
        Frame::Batch(Batch::from_records(&[
            Record::Data {
                stream: s,
                seq: 1,
                payload: Bytes::from_static(b"x"),
            },
            Record::Final {
                stream: s,
                seq: 2,
                payload: Bytes::new(),
            },
        ])),
        Frame::Close(Close::new(CloseCode::NORMAL, "bye")),
    ];
    let wire = encode_all(&frames);
    for split in 0..=wire.len() {
        let decoded = decode_in_chunks(&wire, &[split]);
        assert_eq!(decoded, frames, "split at {split}");
    }
    // One byte at a time is the extreme case of random chunking.
    assert_eq!(decode_in_chunks(&wire, &vec![1; wire.len()]), frames);
}

#[test]
fn payloads_are_slices_of_the_received_buffer_not_copies() {
    let s = StreamId::new(1, 0);
    let wire = encode_all(&[Frame::Batch(Batch::from_records(&[Record::Data {
        stream: s,
        seq: 0,
        payload: Bytes::from(vec![9u8; 64]),
    }]))]);
    let mut src = BytesMut::from(&wire[..]);
    let Some(Frame::Batch(batch)) = FrameDecoder::new(MAX).decode(&mut src).unwrap() else {
        panic!("a batch");
    };
    let Some(Ok(Record::Data { payload, .. })) = batch.records().next() else {
        panic!("data")
    };
    let body = batch.body().as_ptr_range();
    assert!(
        body.contains(&payload.as_ptr()),
        "payload points into the batch body"
    );
}

/// A batch with short and long payloads, on the fast path and the general decoder's; its
/// records, and the batch as a receiver decodes it.
fn mixed_batch() -> (Vec<Record>, Batch) {
    let s = StreamId::new(1, 0);
    let data = |seq, len: usize| Record::Data {
        stream: s,
        seq,
        payload: Bytes::from(vec![7u8; len]),
    };
    // A long varint (seq) takes the general decoder's path; the others the fast path.
    let records = vec![
        data(0, 10),
        data(1, 200),
        data(1 << 20, 10),
        Record::Final {
            stream: s,
            seq: 3,
            payload: Bytes::from_static(b"end"),
        },
    ];
    let wire = encode_all(&[Frame::Batch(Batch::from_records(&records))]);
    let mut src = BytesMut::from(&wire[..]);
    let Some(Frame::Batch(batch)) = FrameDecoder::new(MAX).decode(&mut src).unwrap() else {
        panic!("a batch");
    };
    (records, batch)
}

/// Each decoded payload's start: whether it lies in `body`.
fn in_body(decoded: &[Record], body: &std::ops::Range<*const u8>) -> Vec<bool> {
    decoded
        .iter()
        .map(|r| match r {
            Record::Data { payload, .. } | Record::Final { payload, .. } => {
                body.contains(&payload.as_ptr())
            }
            _ => unreachable!(),
        })
        .collect()
}

#[test]
fn records_copying_below_copies_short_payloads_and_slices_the_others() {
    let (records, batch) = mixed_batch();
    let body = batch.body().as_ptr_range();
    let decoded: Vec<Record> = batch
        .records_copying_below(100)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(decoded, records, "copying changes no value");
    assert_eq!(in_body(&decoded, &body), vec![false, true, false, false]);
}

#[test]
fn record_views_leave_data_payloads_in_the_body_and_decode_the_rest() {
    let (records, batch) = mixed_batch();
    let body = batch.body().as_ptr_range();
    let views: Vec<RecordView<'_>> = batch.record_views().collect::<Result<_, _>>().unwrap();
    assert_eq!(views.len(), records.len());
    for (view, record) in views.iter().zip(&records) {
        match (view, record) {
            (
                RecordView::Data {
                    stream,
                    seq,
                    payload,
                },
                Record::Data {
                    stream: s,
                    seq: q,
                    payload: p,
                },
            ) => {
                assert_eq!((stream, seq, *payload), (s, q, &p[..]));
                assert!(body.contains(&payload.as_ptr()), "borrowed, not copied");
            }
            (RecordView::Decoded(decoded), record) => assert_eq!(decoded, record),
            other => panic!("a view of the wrong kind: {other:?}"),
        }
    }
    assert!(
        matches!(views[2], RecordView::Decoded(Record::Data { .. })),
        "a DATA record with a wide field is decoded by the general decoder"
    );
}
