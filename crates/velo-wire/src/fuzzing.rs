//! Fuzz entry points, shared by `fuzz/` (cargo-fuzz) and the corpus replay tests, and the
//! replay machinery every crate with a fuzz target uses under `cargo test` ([`replay`]).

pub mod replay;

use bytes::BytesMut;

use crate::{Batch, FRAME_HEADER_LEN, Frame, FrameDecoder, FrameKind, Packer, Record, RecordView};

/// Largest frame body accepted by the fuzz decoder: small, so inputs exercise the limit.
pub const FUZZ_MAX_FRAME_LEN: u32 = 64 * 1024;

/// Decodes `data` as a stream of frames and checks the codec's promises:
/// decoding never panics, and every frame that decodes (records included) re-encodes to
/// exactly the bytes it was decoded from, and a batch's record views agree with its records,
/// errors included. A PACKED frame's batch re-encodes to exactly the
/// body it unpacked to, and that body packed again by [`Packer`] decodes to the same batch.
///
/// Returns how many frames decoded before the input ended or turned out corrupt.
///
/// # Panics
///
/// When a promise is broken; that is the bug the fuzzer looks for.
pub fn decode_roundtrip(data: &[u8]) -> usize {
    let mut src = BytesMut::from(data);
    let mut decoder = FrameDecoder::new(FUZZ_MAX_FRAME_LEN);
    decoder.accept_packed();
    let mut offset = 0;
    let mut frames = 0;
    loop {
        let before = src.len();
        let Ok(Some(frame)) = decoder.decode(&mut src) else {
            return frames;
        };
        let consumed = before - src.len();
        let original = &data[offset..offset + consumed];
        offset += consumed;
        let canonical = match &frame {
            Frame::Batch(batch) if original.first() == Some(&FrameKind::Packed.to_byte()) => {
                views_agree(batch);
                let records: Result<Vec<Record>, _> = batch.records().collect();
                let Ok(records) = records else { return frames };
                assert_eq!(
                    Batch::from_records(&records).body(),
                    batch.body(),
                    "packed frame {frames} does not unpack to canonical records"
                );
                repack(batch);
                original.to_vec()
            }
            Frame::Batch(batch) => {
                views_agree(batch);
                let records: Result<Vec<Record>, _> = batch.records().collect();
                let Ok(records) = records else { return frames };
                let mut out = Vec::new();
                Frame::Batch(Batch::from_records(&records)).encode(&mut out);
                out
            }
            other => {
                let mut out = Vec::new();
                other.encode(&mut out);
                out
            }
        };
        assert_eq!(
            canonical, original,
            "frame {frames} does not re-encode canonically: {frame:?}"
        );
        frames += 1;
    }
}

/// Checks that [`Batch::record_views`] yields what [`Batch::records`] does, record for record
/// and error for error.
fn views_agree(batch: &Batch) {
    let mut views = batch.record_views();
    for record in batch.records() {
        let Some(view) = views.next() else {
            panic!("fewer views than records");
        };
        match (record, view) {
            (Ok(record), Ok(RecordView::Decoded(view))) => assert_eq!(record, view),
            (
                Ok(Record::Data {
                    stream,
                    seq,
                    payload,
                }),
                Ok(RecordView::Data {
                    stream: s,
                    seq: q,
                    payload: p,
                }),
            ) => assert_eq!((stream, seq, &payload[..]), (s, q, p)),
            (Err(a), Err(b)) => assert_eq!(a, b),
            (record, view) => panic!("a view differs: {record:?} against {view:?}"),
        }
    }
    assert!(views.next().is_none(), "more views than records");
}

/// Packs `batch`'s body with [`Packer`] and checks it decodes back to the same batch.
fn repack(batch: &Batch) {
    let mut wire = BytesMut::new();
    if !Packer::default().pack(batch.body(), &mut wire) {
        return;
    }
    assert!(
        wire.len() - FRAME_HEADER_LEN < batch.body().len(),
        "packing grew the batch"
    );
    let mut decoder = FrameDecoder::new(FUZZ_MAX_FRAME_LEN);
    decoder.accept_packed();
    let again = decoder.decode(&mut wire);
    assert_eq!(
        again,
        Ok(Some(Frame::Batch(batch.clone()))),
        "repacked batch differs"
    );
}
