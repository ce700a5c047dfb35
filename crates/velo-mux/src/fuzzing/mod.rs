//! Fuzz entry points of velo-mux, shared by `fuzz/` (cargo-fuzz) and the corpus replay test
//! (`tests/fuzz_replay.rs`). Behind the private `__fuzz` feature; not an API.
//!
//! [`mux_ops`] is the `mux` target: a worker and a frontend [`Mux`](crate::Mux) with their
//! lanes up, driven by an operation sequence decoded from the fuzzer's bytes (application
//! calls on both sides, transmits and deliveries in any chunking, timers, lane failures and
//! reconnects, and bytes a hostile peer sends: arbitrary frames, well-formed records naming
//! live or stale streams, raw bytes), with every invariant and bound checked after every
//! operation and a final check that nothing is stuck once both sides are idle.
//!
//! [`record_traffic`] records what crosses the lanes of a bench-shaped run, from which
//! `tests/fuzz_seeds.rs` makes the recorded-traffic seeds of every target's corpus.

mod app;
mod bounds;
mod model;
mod ops;
mod record;
mod settle;
mod world;

pub use record::{Traffic, engine_output, record_traffic};

use std::time::{Duration, Instant};

use crate::{FlushPolicy, MuxConfig, Side};

/// Operations run per input at most: enough for every lifecycle, few enough to keep an input
/// fast (libFuzzer's inputs are at most 4 KiB by default).
pub const MAX_OPS: usize = 256;

/// Idle timeout of both sides in a fuzz run: a few `Advance` operations without deliveries
/// close a lane, so idle and heartbeat paths are reached.
const FUZZ_IDLE_TIMEOUT: Duration = Duration::from_secs(1);

/// Batching delay of the configurations that batch.
const FUZZ_MAX_DELAY: Duration = Duration::from_millis(2);

/// Credit windows the fuzzer picks from, in records.
const WINDOWS: [u32; 4] = [1, 2, 4, 32];

/// Stream limit of the worker (and of the frontend unless it is the smaller one).
const MAX_STREAMS: u32 = 16;
/// The frontend's smaller stream limit: the worker's slots above it are refused.
const SMALL_MAX_STREAMS: u32 = 4;

/// The largest frame of the configurations that accept large ones: 64 KiB.
const LARGE_FRAME: u32 = 64 * 1024;

/// Bytes queued per lane before senders wait: the smallest allowed, so the bound is reached.
const MAX_BUFFERED: usize = 64 * 1024;

/// Runs the operation sequence `data` encodes (its first byte picks the configuration), then
/// settles the pair.
///
/// # Panics
///
/// When an invariant or bound breaks, a stream ends twice, an item is lost, duplicated or
/// corrupted, or a stream is stuck at idle: the bugs the fuzzer looks for.
pub fn mux_ops(data: &[u8]) {
    let mut input = ops::Input::new(data);
    let configs = configs(input.u8());
    let mut world = world::World::new(configs, epoch());
    for _ in 0..MAX_OPS {
        let Some(op) = input.op() else { break };
        world.apply(op);
    }
    world.settle();
}

/// The worker's and frontend's configurations `selector` picks: lane count (bits 0-1),
/// window (2-3), greedy or batching (4), eager edges off (5), a smaller frontend stream limit
/// (6), a frontend frame limit of 4 KiB instead of 64 KiB (7).
fn configs(selector: u8) -> (MuxConfig, MuxConfig) {
    let bit = |n: u8| selector & (1 << n) != 0;
    let lanes = 1 + u16::from(selector & 3) % 3;
    let window = WINDOWS[usize::from((selector >> 2) & 3)];
    let mut flush = if bit(4) {
        FlushPolicy::greedy()
    } else {
        FlushPolicy::with_max_delay(FUZZ_MAX_DELAY)
    };
    flush.eager_edges = !bit(5);
    // No selector bit is left: ends wait for the batch in half of the selectors.
    flush.eager_ends = selector.count_ones().is_multiple_of(2);
    // Both sides pack their batches (LZ4) in a third of the selectors, across both parities.
    let compression = if selector.count_ones().is_multiple_of(3) {
        crate::Compression::Lz4
    } else {
        crate::Compression::None
    };
    let frontend_streams = if bit(6) {
        SMALL_MAX_STREAMS
    } else {
        MAX_STREAMS
    };
    let frontend_frame = if bit(7) {
        velo_wire::MIN_MAX_FRAME_LEN
    } else {
        LARGE_FRAME
    };
    let build = |side, streams, frame| {
        MuxConfig::builder(side)
            .lanes(lanes)
            .window(window)
            .max_streams(streams)
            .max_frame_len(frame)
            .max_buffered_bytes(MAX_BUFFERED)
            .flush(flush)
            .idle_timeout(FUZZ_IDLE_TIMEOUT)
            .compression(compression)
            .build()
            .expect("fuzz configurations are in range")
    };
    (
        build(Side::Worker, MAX_STREAMS, LARGE_FRAME),
        build(Side::Frontend, frontend_streams, frontend_frame),
    )
}

/// The epoch of a run's virtual clock; only differences from it matter.
fn epoch() -> Instant {
    #[allow(clippy::disallowed_methods)] // the epoch of a virtual clock; never read again
    Instant::now()
}
