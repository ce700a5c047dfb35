//! What a slow consumer costs the frontend in bytes, measured with a counting allocator (its
//! own test binary, one test, so nothing else allocates meanwhile).
//!
//! A consumer that never reads holds its stream's credit window of items. Those items must
//! cost about their own size, not the receive buffers they arrived in: items sliced out of a
//! 64 KiB read buffer kept the whole buffer alive for a few bytes of payload.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use common::{World, within};

/// Live heap bytes of this process.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counter is only
// arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(
            isize::try_from(layout.size()).unwrap_or(isize::MAX),
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(
            isize::try_from(layout.size()).unwrap_or(isize::MAX),
            Ordering::Relaxed,
        );
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const WINDOW: u32 = 32;
const ITEM: usize = 100;

#[tokio::test(start_paused = true)]
async fn a_slow_consumer_costs_about_its_items_not_the_buffers_they_arrived_in() {
    let mut w = World::with(|b| b.window(WINDOW), |b| b.lanes(1));
    let (mut slow_tx, slow_rx) = w.stream(0).await;
    let (mut busy_tx, mut busy_rx) = w.stream(1).await;
    let before = LIVE.load(Ordering::Relaxed);
    let filler = vec![7u8; 1000];
    for i in 0..WINDOW {
        // One item for the slow stream, then a receive buffer's worth for a busy sibling
        // that is read at once: each slow item arrives in another read.
        slow_tx
            .send(&[u8::try_from(i).unwrap(); ITEM])
            .await
            .unwrap();
        slow_tx.flush();
        for _ in 0..70 {
            busy_tx.send(&filler).await.unwrap();
            within("the busy stream's item", busy_rx.recv())
                .await
                .unwrap()
                .unwrap();
        }
    }
    let held = LIVE.load(Ordering::Relaxed) - before;
    // Its 32 items of 100 B, plus one receive buffer the reader may be between (64 KiB)
    // and queue overhead; not 32 receive buffers (2 MiB).
    let bound = 128 * 1024;
    assert!(
        held < bound,
        "a consumer holding {WINDOW} items of {ITEM} B costs {held} bytes (bound {bound})"
    );
    drop((slow_rx, slow_tx, busy_tx, busy_rx));
    w.shut_down().await;
}
