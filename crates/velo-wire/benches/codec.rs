//! Codec throughput: a batch of 1,024 DATA records with 64-byte payloads across 256 streams,
//! encoded and decoded. Prints allocations per record for decode (the target is zero).
//!
//! `cargo bench -p velo-wire --bench codec`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{BufMut, BytesMut};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use velo_wire::{
    DataKind, FRAME_HEADER_LEN, Frame, FrameDecoder, FrameKind, Record, StreamId,
    encode_data_header, frame_header,
};

/// Counts allocations so the bench can report allocations per record.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const RECORDS: usize = 1024;
const STREAMS: u32 = 256;
const PAYLOAD: [u8; 64] = [0x5a; 64];

/// Encodes the batch the way the mux does: header placeholder, records copied in place.
fn encode_batch(buf: &mut BytesMut) {
    let start = buf.len();
    buf.put_slice(&[0; FRAME_HEADER_LEN]);
    for i in 0..RECORDS {
        let slot = u32::try_from(i).unwrap() % STREAMS;
        let seq = u32::try_from(i).unwrap() / STREAMS;
        encode_data_header(buf, DataKind::Data, StreamId::new(slot, 1), seq, 64);
        buf.put_slice(&PAYLOAD);
    }
    let body = u32::try_from(buf.len() - start - FRAME_HEADER_LEN).unwrap();
    buf[start..start + FRAME_HEADER_LEN].copy_from_slice(&frame_header(FrameKind::Batch, body));
}

/// Decodes one frame and walks its records; returns the payload bytes seen.
fn decode_batch(src: &mut BytesMut, decoder: &mut FrameDecoder) -> usize {
    let Ok(Some(Frame::Batch(batch))) = decoder.decode(src) else {
        panic!("a batch")
    };
    let mut bytes = 0;
    for r in batch.records() {
        match r {
            Ok(Record::Data {
                stream,
                seq,
                payload,
            }) => {
                black_box((stream, seq));
                bytes += payload.len();
                black_box(payload);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    bytes
}

fn bench(c: &mut Criterion) {
    let mut wire = BytesMut::with_capacity(128 * 1024);
    encode_batch(&mut wire);
    let wire = wire.freeze();
    println!(
        "batch: {RECORDS} records, {} bytes, {:.1} bytes per record",
        wire.len(),
        wire.len() as f64 / RECORDS as f64
    );

    // Allocations per record on decode, measured outside criterion's timing loop.
    let mut decoder = FrameDecoder::new(velo_wire::DEFAULT_MAX_FRAME_LEN);
    let rounds = 100u64;
    let inputs: Vec<BytesMut> = (0..rounds).map(|_| BytesMut::from(&wire[..])).collect();
    let before = ALLOCS.load(Ordering::Relaxed);
    for mut src in inputs {
        black_box(decode_batch(&mut src, &mut decoder));
    }
    let decode_allocs = ALLOCS.load(Ordering::Relaxed) - before;
    let mut buf = BytesMut::with_capacity(128 * 1024);
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..rounds {
        buf.clear();
        encode_batch(&mut buf);
    }
    let encode_allocs = ALLOCS.load(Ordering::Relaxed) - before;
    let per = |n: u64| n as f64 / (rounds as f64 * RECORDS as f64);
    println!(
        "allocations per record: decode {:.5} ({decode_allocs} in {rounds} batches), encode {:.5} ({encode_allocs})",
        per(decode_allocs),
        per(encode_allocs)
    );

    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(RECORDS as u64));
    g.bench_function("encode_1024x64B", |b| {
        let mut buf = BytesMut::with_capacity(128 * 1024);
        b.iter(|| {
            buf.clear();
            encode_batch(&mut buf);
            black_box(buf.len());
        });
    });
    g.bench_function("decode_1024x64B", |b| {
        let mut decoder = FrameDecoder::new(velo_wire::DEFAULT_MAX_FRAME_LEN);
        b.iter_batched(
            || BytesMut::from(&wire[..]),
            |mut src| decode_batch(&mut src, &mut decoder),
            BatchSize::SmallInput,
        );
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
