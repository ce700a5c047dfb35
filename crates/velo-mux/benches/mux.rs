//! The full path between a worker mux and a frontend mux in one thread: send, batch, decode,
//! deliver to the consumer, and credit back. 1,024 streams on 4 lanes, 100-byte items.
//! Also prints allocations per record (send path and whole path) from a counting allocator.
//!
//! `cargo bench -p velo-mux --bench mux`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use velo_mux::{FlushPolicy, LaneId, Mux, MuxConfig, MuxEvent, Side, StreamKey};
use velo_wire::{InstanceId, Token};

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

const STREAMS: usize = 1024;
const LANES: u16 = 4;
const ITEM: [u8; 100] = [0x42; 100];

/// A worker and a frontend mux with every lane up, 1,024 open streams, and the buffers a
/// driver would keep.
struct Bench {
    worker: Mux,
    frontend: Mux,
    senders: Vec<StreamKey>,
    receivers: Vec<StreamKey>,
    rx_front: Vec<BytesMut>,
    rx_worker: Vec<BytesMut>,
    chunks: Vec<Bytes>,
    items: velo_mux::ItemQueue,
    now: Instant,
    delivered: u64,
}

impl Bench {
    fn new() -> Self {
        #[allow(clippy::disallowed_methods)] // the benchmark's clock, passed into the muxes
        let now = Instant::now();
        // The engine flushes once per pass; the window is Velo's 32.
        let policy = FlushPolicy::with_max_delay(Duration::from_millis(5));
        let wc = MuxConfig::builder(Side::Worker)
            .lanes(LANES)
            .flush(policy)
            .build()
            .unwrap();
        let fc = MuxConfig::builder(Side::Frontend)
            .lanes(LANES)
            .build()
            .unwrap();
        let (wid, fid) = (InstanceId::from_u128(1), InstanceId::from_u128(2));
        let mut worker = Mux::new(wc, now);
        let mut frontend = Mux::new(fc, now);
        for i in 0..LANES {
            worker.handle_lane_up(now, LaneId(i), &frontend.config().hello(i, fid, wid));
            frontend.handle_lane_up(now, LaneId(i), &worker.config().hello(i, wid, fid));
        }
        let senders = (0..STREAMS)
            .map(|t| {
                worker
                    .open(now, t as u64, &Token([0; 16]), br#"{"error":null}"#)
                    .unwrap()
            })
            .collect();
        let mut b = Self {
            worker,
            frontend,
            senders,
            receivers: Vec::new(),
            rx_front: vec![BytesMut::with_capacity(256 * 1024); usize::from(LANES)],
            rx_worker: vec![BytesMut::with_capacity(64 * 1024); usize::from(LANES)],
            chunks: Vec::with_capacity(64),
            items: velo_mux::ItemQueue::new(),
            now,
            delivered: 0,
        };
        b.worker.flush_hint(now);
        b.pump();
        b
    }

    /// One engine pass: an item for every stream, a flush hint, then everything delivered
    /// and consumed, and the credit returned.
    fn pass(&mut self) {
        self.now += Duration::from_micros(100);
        for &s in &self.senders {
            self.worker
                .send(self.now, s, &ITEM)
                .expect("credit is returned every pass");
        }
        self.worker.flush_hint(self.now);
        self.pump();
    }

    fn pump(&mut self) {
        let now = self.now;
        for i in 0..LANES {
            let lane = LaneId(i);
            while let Some(_t) = self.worker.poll_transmit(now, lane, &mut self.chunks) {
                let rx = &mut self.rx_front[usize::from(i)];
                for c in self.chunks.drain(..) {
                    rx.extend_from_slice(&c); // the socket's copy
                }
                self.worker.handle_transmitted(now, lane);
            }
            self.frontend
                .handle_input(now, lane, &mut self.rx_front[usize::from(i)])
                .unwrap();
        }
        while let Some(e) = self.frontend.poll_event() {
            match e {
                MuxEvent::Opened { stream, .. } => self.receivers.push(stream),
                MuxEvent::Readable(stream) => {
                    self.frontend.recv_all(now, stream, &mut self.items);
                    self.delivered += self.items.len() as u64;
                    while let Some(item) = self.items.pop() {
                        black_box(item);
                    }
                }
                _ => {}
            }
        }
        // Grants: flushed by their deadline in a real driver; here at the end of the pass.
        self.frontend.handle_timeout(now + Duration::from_millis(2));
        for i in 0..LANES {
            let lane = LaneId(i);
            while let Some(_t) =
                self.frontend
                    .poll_transmit(now + Duration::from_millis(2), lane, &mut self.chunks)
            {
                let rx = &mut self.rx_worker[usize::from(i)];
                for c in self.chunks.drain(..) {
                    rx.extend_from_slice(&c);
                }
                self.frontend
                    .handle_transmitted(now + Duration::from_millis(2), lane);
            }
            self.worker
                .handle_input(now, lane, &mut self.rx_worker[usize::from(i)])
                .unwrap();
        }
        while self.worker.poll_event().is_some() {}
    }
}

fn bench(c: &mut Criterion) {
    let mut b = Bench::new();
    for _ in 0..64 {
        b.pass(); // warm up buffers to their steady-state size
    }
    // Allocations per record, outside criterion's timing: send path alone, then whole path.
    let rounds = 200u64;
    let mut send_allocs = 0;
    let before_all = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..rounds {
        b.now += Duration::from_micros(100);
        let before = ALLOCS.load(Ordering::Relaxed);
        for &s in &b.senders {
            b.worker.send(b.now, s, &ITEM).unwrap();
        }
        b.worker.flush_hint(b.now);
        send_allocs += ALLOCS.load(Ordering::Relaxed) - before;
        b.pump();
    }
    let all_allocs = ALLOCS.load(Ordering::Relaxed) - before_all;
    let records = rounds * STREAMS as u64;
    println!(
        "allocations per record: send path {:.4} ({send_allocs} in {records} records), whole path {:.4} ({all_allocs})",
        send_allocs as f64 / records as f64,
        all_allocs as f64 / records as f64,
    );
    let s = b.worker.stats();
    println!(
        "batches {} records/batch {:.1}, grants {}",
        s.batches_sent,
        s.records_sent as f64 / s.batches_sent.max(1) as f64,
        b.frontend.stats().grants_sent
    );

    let mut g = c.benchmark_group("mux");
    g.throughput(Throughput::Elements(STREAMS as u64));
    g.bench_function("full_path_1024_streams_4_lanes_100B", |bench| {
        bench.iter(|| b.pass())
    });
    g.finish();
    assert!(b.delivered > 0);
}

criterion_group!(benches, bench);
criterion_main!(benches);
