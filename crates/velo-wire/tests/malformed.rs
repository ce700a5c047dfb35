//! Malformed input: each case decodes to its specific error, never a panic or a wrong frame.

use bytes::BytesMut;
use velo_wire::{DEFAULT_MAX_FRAME_LEN, Frame, FrameDecoder, Record, WireError};

/// Decodes one frame and, for a batch, all its records; returns the first error.
fn decode(bytes: &[u8], max: u32) -> Result<Option<Vec<Record>>, WireError> {
    let mut src = BytesMut::from(bytes);
    match FrameDecoder::new(max).decode(&mut src)? {
        None => Ok(None),
        Some(Frame::Batch(b)) => b.records().collect::<Result<Vec<_>, _>>().map(Some),
        Some(_) => Ok(Some(Vec::new())),
    }
}

fn check(name: &str, bytes: &[u8], expect: Result<Option<usize>, WireError>) {
    let got = decode(bytes, DEFAULT_MAX_FRAME_LEN).map(|o| o.map(|r| r.len()));
    assert_eq!(got, expect, "{name}: {bytes:02x?}");
}

fn batch(body: &[u8]) -> Vec<u8> {
    let mut v = vec![0x02];
    v.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
    v.extend_from_slice(body);
    v
}

fn hello_body(version: u8) -> Vec<u8> {
    let mut b = b"VELO".to_vec();
    b.push(version);
    b.push(1); // worker
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&7u128.to_le_bytes());
    b.extend_from_slice(&0u128.to_le_bytes());
    b.extend_from_slice(&(1u32 << 20).to_le_bytes());
    b.extend_from_slice(&32u32.to_le_bytes());
    b.extend_from_slice(&10_000u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b
}

fn hello(body: &[u8]) -> Vec<u8> {
    let mut v = vec![0x01];
    v.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
    v.extend_from_slice(body);
    v
}

const T: fn(&'static str, &'static str) -> WireError =
    |record, field| WireError::Truncated { record, field };

#[test]
fn a_valid_hello_is_accepted() {
    check("hello", &hello(&hello_body(3)), Ok(Some(0)));
}

#[test]
fn version_mismatch_names_both_versions() {
    for v in [0u8, 2, 4, 255] {
        check(
            "old version",
            &hello(&hello_body(v)),
            Err(WireError::UnsupportedVersion {
                got: v,
                supported: 3,
            }),
        );
        // A shorter or longer body of another version still reports the version first.
        check(
            "other layout",
            &hello(&hello_body(v)[..20]),
            Err(WireError::UnsupportedVersion {
                got: v,
                supported: 3,
            }),
        );
    }
    let msg = WireError::UnsupportedVersion {
        got: 2,
        supported: 3,
    }
    .to_string();
    assert!(msg.contains('2') && msg.contains('3'), "{msg}");
}

#[test]
fn hello_errors() {
    let mut bad_magic = hello_body(3);
    bad_magic[0] = b'X';
    check(
        "bad magic",
        &hello(&bad_magic),
        Err(WireError::BadMagic { got: *b"XELO" }),
    );
    let mut long = hello_body(3);
    long.push(0);
    check(
        "trailing byte",
        &hello(&long),
        Err(WireError::BadFrameLength {
            frame: "hello",
            len: 59,
            expected: 58,
        }),
    );
    check(
        "zero length",
        &hello(&[]),
        Err(WireError::BadFrameLength {
            frame: "hello",
            len: 0,
            expected: 58,
        }),
    );
    let mut role = hello_body(3);
    role[5] = 9;
    check(
        "bad role",
        &hello(&role),
        Err(WireError::InvalidField {
            field: "hello role",
            reason: "must be 1 (worker) or 2 (frontend)",
        }),
    );
    let mut idx = hello_body(3);
    idx[6] = 4; // lane 4 of 4
    check(
        "lane index",
        &hello(&idx),
        Err(WireError::InvalidField {
            field: "hello lane_index",
            reason: "must be less than lane_count",
        }),
    );
    let mut zero_id = hello_body(3);
    zero_id[10..26].fill(0);
    check(
        "zero instance",
        &hello(&zero_id),
        Err(WireError::InvalidField {
            field: "hello instance_id",
            reason: "must not be zero",
        }),
    );
}

#[test]
fn unknown_kinds_are_named() {
    check(
        "frame kind",
        &[0x07, 1, 0, 0, 0, 8],
        Err(WireError::UnknownFrame { kind: 7 }),
    );
    // The frame kind is judged as soon as its byte arrives.
    check(
        "frame kind alone",
        &[0xff],
        Err(WireError::UnknownFrame { kind: 0xff }),
    );
    check(
        "record kind",
        &batch(&[0x0b]),
        Err(WireError::UnknownRecord { kind: 0x0b }),
    );
    check(
        "record kind zero",
        &batch(&[0x00]),
        Err(WireError::UnknownRecord { kind: 0 }),
    );
    // A valid record followed by garbage: the garbage is an error, not ignored.
    check(
        "trailing garbage",
        &batch(&[0x08, 0xee]),
        Err(WireError::UnknownRecord { kind: 0xee }),
    );
}

#[test]
fn an_unknown_record_kind_names_the_kinds_version_3_defines() {
    // ACCEPT (0x0a) is the last kind version 3 defines; the message goes to the peer in CLOSE.
    let message = WireError::UnknownRecord { kind: 0x0b }.to_string();
    assert_eq!(
        message,
        "unknown record kind 0x0b: version 3 defines 0x01..=0x0a"
    );
}

#[test]
fn oversized_frames_are_refused_before_buffering() {
    let mut huge = vec![0x02];
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    check(
        "u32::MAX length",
        &huge,
        Err(WireError::FrameTooLarge {
            len: u32::MAX,
            max: DEFAULT_MAX_FRAME_LEN,
        }),
    );
    let just_over = DEFAULT_MAX_FRAME_LEN + 1;
    let mut over = vec![0x02];
    over.extend_from_slice(&just_over.to_le_bytes());
    check(
        "max + 1",
        &over,
        Err(WireError::FrameTooLarge {
            len: just_over,
            max: DEFAULT_MAX_FRAME_LEN,
        }),
    );
    // The decoder did not reserve the announced length: capacity stays small.
    let mut src = BytesMut::from(&huge[..]);
    assert!(FrameDecoder::new(1024).decode(&mut src).is_err());
    assert!(
        src.capacity() < 1024,
        "capacity {} after a refused frame",
        src.capacity()
    );
}

#[test]
fn at_the_limit_is_accepted_and_waits_for_the_body() {
    let mut head = vec![0x02];
    head.extend_from_slice(&4096u32.to_le_bytes());
    assert_eq!(decode(&head, 4096), Ok(None));
}

#[test]
fn zero_lengths() {
    check("empty batch", &batch(&[]), Err(WireError::EmptyBatch));
    check("empty close", &[0x03, 0, 0, 0, 0], Err(T("close", "code")));
    check(
        "zero credit",
        &batch(&[0x07, 0x01, 0x00, 0x00]),
        Err(WireError::InvalidField {
            field: "credit grant",
            reason: "must be at least 1",
        }),
    );
    // Zero-length payloads are fine.
    check(
        "empty data",
        &batch(&[0x02, 0x01, 0x00, 0x00, 0x00]),
        Ok(Some(1)),
    );
}

#[test]
fn truncated_records_name_the_missing_field() {
    check(
        "data kind only",
        &batch(&[0x02]),
        Err(T("data", "stream slot")),
    );
    check(
        "data no gen",
        &batch(&[0x02, 0x01]),
        Err(T("data", "stream generation")),
    );
    check(
        "data no seq",
        &batch(&[0x02, 0x01, 0x00]),
        Err(T("data", "seq")),
    );
    check(
        "data no len",
        &batch(&[0x02, 0x01, 0x00, 0x00]),
        Err(T("data", "payload")),
    );
    check(
        "data short payload",
        &batch(&[0x02, 0x01, 0x00, 0x00, 0x05, 1, 2]),
        Err(T("data", "payload")),
    );
    check(
        "data len past u32 body",
        &batch(&[0x02, 0x01, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x0f]),
        Err(T("data", "payload")),
    );
    check(
        "open short token",
        &batch(&[0x01, 0x00, 0x00, 0x00, 1, 2, 3]),
        Err(T("open", "token")),
    );
    check(
        "final truncated",
        &batch(&[0x03, 0x01, 0x00]),
        Err(T("final", "seq")),
    );
    check(
        "error no message",
        &batch(&[0x04, 0x01, 0x00, 0x07]),
        Err(T("error", "message")),
    );
    check(
        "stop no gen",
        &batch(&[0x05, 0x01]),
        Err(T("stop", "stream generation")),
    );
    check(
        "cancel no code",
        &batch(&[0x06, 0x01, 0x00]),
        Err(T("cancel", "code")),
    );
    check("goaway no code", &batch(&[0x09]), Err(T("goaway", "code")));
    check(
        "varint cut",
        &batch(&[0x05, 0x81]),
        Err(T("stop", "stream slot")),
    );
}

#[test]
fn non_canonical_and_overflowing_varints() {
    check(
        "overlong slot",
        &batch(&[0x05, 0x81, 0x00, 0x00]),
        Err(WireError::NonCanonicalVarint {
            field: "stream slot",
        }),
    );
    check(
        "slot over u32",
        &batch(&[0x05, 0x80, 0x80, 0x80, 0x80, 0x10, 0x00]),
        Err(WireError::VarintOverflow {
            field: "stream slot",
            bits: 32,
        }),
    );
}

#[test]
fn invalid_utf8_text() {
    check(
        "error message",
        &batch(&[0x04, 0x01, 0x00, 0x07, 0x02, 0xc3, 0x28]),
        Err(WireError::InvalidUtf8 {
            field: "error message",
        }),
    );
    check(
        "close reason",
        &[0x03, 4, 0, 0, 0, 0, 0, 0xff, 0xfe],
        Err(WireError::InvalidUtf8 {
            field: "close reason",
        }),
    );
}

#[test]
fn bit_flips_in_a_valid_batch_never_panic() {
    let valid = batch(&[
        0x01, 0x00, 0x01, 0x2a, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0x02, b'{',
        b'}', 0x02, 0x00, 0x01, 0x00, 0x01, b'x', 0x03, 0x00, 0x01, 0x01, 0x00,
    ]);
    assert_eq!(
        decode(&valid, DEFAULT_MAX_FRAME_LEN)
            .unwrap()
            .unwrap()
            .len(),
        3
    );
    for byte in 0..valid.len() {
        for bit in 0..8 {
            let mut v = valid.clone();
            v[byte] ^= 1 << bit;
            let _ = decode(&v, DEFAULT_MAX_FRAME_LEN);
            let _ = velo_wire::fuzzing::decode_roundtrip(&v);
        }
    }
}
