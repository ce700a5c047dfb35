//! The hex examples in `docs/protocol.md` are the spec: this test parses them and checks that
//! the decoder reads each one as the frame it names and the encoder writes it byte for byte.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use velo_wire::{
    Auth, Batch, CancelCode, Close, CloseCode, DEFAULT_MAX_FRAME_LEN, ErrorCode, Frame,
    FrameDecoder, GoAwayCode, Hello, InstanceId, Record, Role, StreamId, Token,
};

/// Every `hex` block of the spec, by the name on its `# vector:` line.
fn spec_vectors() -> BTreeMap<String, Vec<u8>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/protocol.md");
    let doc = std::fs::read_to_string(path).expect("docs/protocol.md is readable");
    let mut vectors = BTreeMap::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```hex" {
            continue;
        }
        let mut name = None;
        let mut bytes = Vec::new();
        for line in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            if let Some(n) = line.trim().strip_prefix("# vector:") {
                name = Some(n.trim().to_owned());
                continue;
            }
            let data = line.split('#').next().unwrap_or_default();
            for tok in data.split_whitespace() {
                bytes.push(
                    u8::from_str_radix(tok, 16).unwrap_or_else(|_| panic!("bad hex {tok:?}")),
                );
            }
        }
        let name = name.expect("every hex block names its vector");
        assert!(
            vectors.insert(name.clone(), bytes).is_none(),
            "duplicate vector {name}"
        );
    }
    vectors
}

/// The worker HELLO of vector `hello-worker`; the auth vectors vary it.
fn hello_worker() -> Hello {
    Hello {
        role: Role::Worker,
        lane_index: 1,
        lane_count: 4,
        instance_id: InstanceId::from_u128(0x0123456789abcdef0011223344556677),
        peer_instance_id: InstanceId::from_u128(0xfedcba98765432108899aabbccddeeff),
        max_frame_len: 32 * 1024 * 1024,
        initial_window: 32,
        idle_timeout_ms: 10_000,
        capabilities: 0,
        auth_nonce: None,
        worker_instance: None,
    }
}

/// 64 hex digits as 32 bytes.
fn hex32(hex: &str) -> [u8; 32] {
    core::array::from_fn(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
}

/// The frame each vector must decode to.
fn expected_frames() -> BTreeMap<&'static str, Frame> {
    let token = Token(core::array::from_fn(|i| u8::try_from(i).unwrap()));
    let s01 = StreamId::new(0, 1);
    BTreeMap::from([
        ("hello-worker", Frame::Hello(hello_worker())),
        (
            "batch-open-data-final",
            Frame::Batch(Batch::from_records(&[
                Record::Open {
                    stream: s01,
                    ticket: 42,
                    token,
                    prologue: Bytes::from_static(br#"{"error":null}"#),
                },
                Record::Data {
                    stream: s01,
                    seq: 0,
                    payload: Bytes::from_static(b"\x92\x01\xa1a"),
                },
                Record::Final {
                    stream: s01,
                    seq: 1,
                    payload: Bytes::new(),
                },
            ])),
        ),
        (
            "batch-accept-credit-stop-heartbeat",
            Frame::Batch(Batch::from_records(&[
                Record::Accept { stream: s01 },
                Record::Credit {
                    stream: s01,
                    grant: 16,
                },
                Record::Credit {
                    stream: StreamId::new(200, 3),
                    grant: 16,
                },
                Record::Stop {
                    stream: StreamId::new(3, 0),
                },
                Record::Heartbeat,
            ])),
        ),
        (
            "batch-error-cancel-goaway",
            Frame::Batch(Batch::from_records(&[
                Record::Error {
                    stream: StreamId::new(300, 2),
                    code: ErrorCode(7),
                    message: "engine failed".into(),
                },
                Record::Cancel {
                    stream: StreamId::new(5, 0),
                    code: CancelCode::CANCELLED,
                },
                Record::GoAway {
                    code: GoAwayCode::DRAIN,
                },
            ])),
        ),
        (
            "close-unsupported-version",
            Frame::Close(Close::new(
                CloseCode::UNSUPPORTED_VERSION,
                "unsupported protocol version 2: this side speaks version 3",
            )),
        ),
        (
            "hello-worker-auth",
            Frame::Hello(Hello {
                lane_index: 0,
                auth_nonce: Some(core::array::from_fn(|i| u8::try_from(i).unwrap())),
                worker_instance: Some(0x1122_3344_5566_7788),
                ..hello_worker()
            }),
        ),
        (
            "hello-frontend-auth",
            Frame::Hello(Hello {
                role: Role::Frontend,
                lane_index: 0,
                instance_id: InstanceId::from_u128(0xfedc_ba98_7654_3210_8899_aabb_ccdd_eeff),
                peer_instance_id: InstanceId::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
                auth_nonce: Some(core::array::from_fn(|i| 0x20 + u8::try_from(i).unwrap())),
                ..hello_worker()
            }),
        ),
        (
            "auth-frontend",
            Frame::Auth(Auth {
                mac: hex32("34e94231ba91c4420d0083b8e996afa8bfa7482773757f3f3517490ed0fe92ca"),
            }),
        ),
        ("packed-three-items", Frame::Batch(packed_three_items())),
        (
            "auth-worker",
            Frame::Auth(Auth {
                mac: hex32("71c7930f3ac36f35240f3577279c6cba2886ca5b2187bf3253370fe64fe70991"),
            }),
        ),
    ])
}

/// The batch vector `packed-three-items` unpacks to.
fn packed_three_items() -> Batch {
    let stream = StreamId::new(0, 1);
    let item = |id: u8| {
        let mut p = b"\x82\xa9token_ids\x91".to_vec();
        p.push(id);
        p.extend_from_slice(b"\xa4text\xa4 the");
        Bytes::from(p)
    };
    Batch::from_records(&[
        Record::Data {
            stream,
            seq: 0,
            payload: item(7),
        },
        Record::Data {
            stream,
            seq: 1,
            payload: item(8),
        },
        Record::Data {
            stream,
            seq: 2,
            payload: item(9),
        },
    ])
}

/// Vectors of PACKED frames: the model has no packed frame to encode (a packed batch
/// decodes to [`Frame::Batch`], and another packer may choose other sequences).
fn is_packed(name: &str) -> bool {
    name.starts_with("packed-")
}

#[test]
fn a_packed_vector_is_refused_by_a_receiver_that_did_not_announce_packing() {
    let vectors = spec_vectors();
    let mut src = BytesMut::from(&vectors["packed-three-items"][..]);
    let err = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN)
        .decode(&mut src)
        .unwrap_err();
    assert_eq!(err, velo_wire::WireError::UnexpectedPacked);
}

#[test]
fn spec_and_test_name_the_same_vectors() {
    let in_spec: Vec<String> = spec_vectors().into_keys().collect();
    let in_test: Vec<String> = expected_frames().into_keys().map(str::to_owned).collect();
    assert_eq!(in_spec, in_test);
}

#[test]
fn spec_vectors_decode_to_the_named_frames() {
    let expected = expected_frames();
    for (name, bytes) in spec_vectors() {
        let mut src = BytesMut::from(&bytes[..]);
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
        decoder.accept_packed();
        let frame = decoder
            .decode(&mut src)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap_or_else(|| panic!("{name}: incomplete"));
        assert!(src.is_empty(), "{name}: {} trailing bytes", src.len());
        assert_eq!(&frame, &expected[name.as_str()], "{name}");
        if let Frame::Batch(batch) = &frame {
            let decoded: Vec<Record> = batch.records().collect::<Result<_, _>>().unwrap();
            let Frame::Batch(want) = &expected[name.as_str()] else {
                unreachable!()
            };
            let want: Vec<Record> = want.records().collect::<Result<_, _>>().unwrap();
            assert_eq!(decoded, want, "{name}: records");
        }
    }
}

#[test]
fn encoder_writes_the_spec_vectors_byte_for_byte() {
    let vectors = spec_vectors();
    for (name, frame) in expected_frames() {
        if is_packed(name) {
            continue;
        }
        let mut out = Vec::new();
        frame.encode(&mut out);
        assert_eq!(out.len(), frame.encoded_len(), "{name}: encoded_len");
        assert_eq!(out, vectors[name], "{name}");
    }
}
