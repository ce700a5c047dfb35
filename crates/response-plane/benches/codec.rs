//! Decoding one engine item (Dynamo's `LLMEngineOutput` shape, MessagePack with field names):
//! `rmp_serde` alone against the plane's decoder (its fast reader, `rmp_serde` as fallback).
//!
//! `cargo bench -p response-plane --bench codec`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use response_plane::fuzzing::Item;

/// 64 items as engines send them: the last one ends the request.
fn items() -> Vec<Vec<u8>> {
    (0..64u32)
        .map(|i| Item {
            token_ids: vec![i.wrapping_mul(2_654_435_761) % 151_936],
            text: Some([" the", " response", " plane", ","][i as usize % 4].to_owned()),
            cum_log_probs: Some(-0.25 * f64::from(i)),
            finish_reason: (i == 63).then(|| "length".to_owned()),
            index: Some(i),
        })
        .map(|item| rmp_serde::to_vec_named(&item).expect("encodes"))
        .collect()
}

fn decode(c: &mut Criterion) {
    let items = items();
    let mut group = c.benchmark_group("decode 64 items");
    group.bench_function("rmp_serde", |b| {
        b.iter(|| {
            for bytes in &items {
                black_box(rmp_serde::from_slice::<Item>(black_box(bytes)).expect("decodes"));
            }
        });
    });
    group.bench_function("plane", |b| {
        b.iter(|| {
            for bytes in &items {
                let item: Item =
                    response_plane::fuzzing::decode_msgpack(black_box(bytes)).expect("decodes");
                black_box(item);
            }
        });
    });
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
