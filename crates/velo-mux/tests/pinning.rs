//! What a frontend's queued items and pending prologues keep alive, measured with a counting
//! allocator: their own bytes, never the frame they came in. A PACKED frame of a few KiB can
//! unpack to megabytes (one record padded with HEARTBEATs squeezes ~250:1), so a slice of its
//! body would let a worker pin 250 bytes of frontend memory for every byte it sends.
//!
//! One test in this binary: the allocator counts the whole process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use velo_mux::{LaneId, Mux, MuxConfig, MuxEvent, Recv, Side, StreamKey};
use velo_wire::{InstanceId, Packer, Record, StreamId, Token};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

fn signed(n: usize) -> isize {
    isize::try_from(n).expect("allocation sizes fit isize")
}

// SAFETY: every call is forwarded to `System` with the same arguments.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(signed(layout.size()), Ordering::Relaxed);
        // SAFETY: as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(signed(layout.size()), Ordering::Relaxed);
        // SAFETY: as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(signed(layout.size()), Ordering::Relaxed);
        // SAFETY: as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(signed(new_size) - signed(layout.size()), Ordering::Relaxed);
        // SAFETY: as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes each PACKED frame unpacks to (under the frontend's 32 MiB frame limit).
const UNPACKED: usize = 2 << 20;
const LANE: LaneId = LaneId(0);

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn frontend(now: Instant) -> Mux {
    let frontend = MuxConfig::builder(Side::Frontend).build().unwrap();
    let worker = MuxConfig::builder(Side::Worker).build().unwrap();
    let mut mux = Mux::new(frontend, now);
    let hello = worker.hello(0, InstanceId::from_u128(1), InstanceId::from_u128(2));
    mux.handle_lane_up(now, LANE, &hello);
    mux
}

/// A PACKED frame whose body is `record` followed by HEARTBEATs up to `UNPACKED` bytes.
fn packed(record: &Record) -> BytesMut {
    let mut body = Vec::with_capacity(UNPACKED);
    record.encode(&mut body);
    body.resize(UNPACKED, 0x08);
    let mut wire = BytesMut::new();
    assert!(Packer::default().pack(&body, &mut wire), "it shrinks");
    wire
}

fn open(slot: u32) -> Record {
    Record::Open {
        stream: StreamId::new(slot, 0),
        ticket: u64::from(slot),
        token: Token([7; 16]),
        prologue: Bytes::from_static(b"{\"model\":\"m\"}"),
    }
}

/// Feeds `frame` and returns the events it caused.
fn feed(mux: &mut Mux, now: Instant, mut frame: BytesMut) -> Vec<MuxEvent> {
    mux.handle_input(now, LANE, &mut frame).unwrap();
    std::iter::from_fn(|| mux.poll_event()).collect()
}

fn opened(events: Vec<MuxEvent>) -> Vec<(StreamKey, Bytes)> {
    events
        .into_iter()
        .filter_map(|e| match e {
            MuxEvent::Opened {
                stream, prologue, ..
            } => Some((stream, prologue)),
            _ => None,
        })
        .collect()
}

#[test]
fn queued_items_and_pending_prologues_pin_their_own_bytes_not_the_frames_they_came_in() {
    #[allow(clippy::disallowed_methods)] // the epoch of a virtual clock; never read again
    let now = Instant::now();

    // Four streams opened in four frames that unpack to 2 MiB each; the application keeps
    // their prologues while it decides (as velo-session's `IncomingStream` does).
    let mut mux = frontend(now);
    let before = live();
    let mut prologues = Vec::new();
    for slot in 0..4 {
        prologues.extend(opened(feed(&mut mux, now, packed(&open(slot)))));
    }
    let pinned = live() - before;
    assert_eq!(prologues.len(), 4);
    assert!(
        pinned < 1 << 20,
        "4 pending prologues of 13 bytes keep {pinned} bytes alive"
    );

    // Eight items of 16 KiB (long enough to be slices of a plain batch) queued on a stream
    // that is not read, each in a frame that unpacks to 2 MiB.
    let (key, _) = prologues[0].clone();
    mux.accept_stream(now, key);
    let before = live();
    for seq in 0..8 {
        let data = Record::Data {
            stream: StreamId::new(0, 0),
            seq,
            payload: Bytes::from(vec![b'x'; 16 * 1024]),
        };
        feed(&mut mux, now, packed(&data));
    }
    let pinned = live() - before;
    assert_eq!(mux.queued(key), 8);
    assert!(
        pinned <= 4 * 8 * 16 * 1024 + (1 << 20),
        "8 queued items of 16 KiB keep {pinned} bytes alive (at most 4 times their size)"
    );
    let Some(Recv::Item(first)) = mux.recv(now, key) else {
        panic!("the first item is there")
    };
    assert_eq!(first.len(), 16 * 1024);
}
