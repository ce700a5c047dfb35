//! The list of wakers a [`Peer::with`](crate::peer::Peer) call collects under its lock and
//! wakes after unlocking, without allocating it again for every call.
//!
//! The list must leave the lock to be woken outside it. Moving it out with `mem::take` left
//! an unallocated list behind, so the next call grew one from nothing (a read that wakes a
//! hundred streams reallocated seven times). Instead each thread keeps one spare list: the
//! full list is swapped with it, woken, emptied, and kept as the thread's spare; the peer keeps
//! the spare's allocation. A list is kept only up to [`KEEP_WAKERS`] entries.

use std::cell::Cell;
use std::task::Waker;

/// Largest list kept between calls, in wakers (16 B each): 16 KiB per thread and per peer.
pub(crate) const KEEP_WAKERS: usize = 1024;

thread_local! {
    static SPARE: Cell<Vec<Waker>> = const { Cell::new(Vec::new()) };
}

/// Takes `list` (leaving the thread's spare, empty but allocated, in its place).
pub(crate) fn take(list: &mut Vec<Waker>) -> Vec<Waker> {
    let spare = SPARE.with(Cell::take);
    std::mem::replace(list, spare)
}

/// Wakes every waker in `list` and keeps it as the thread's spare.
pub(crate) fn wake_all(mut list: Vec<Waker>) {
    for w in list.drain(..) {
        w.wake();
    }
    if list.capacity() > 0 && list.capacity() <= KEEP_WAKERS {
        SPARE.with(|s| s.set(list));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_woken_list_is_reused_by_the_next_take_and_an_oversized_one_is_not() {
        let mut list = vec![Waker::noop().clone(); 100];
        let full = take(&mut list);
        assert_eq!(full.len(), 100);
        wake_all(full);
        let mut next = Vec::new();
        let _ = take(&mut next);
        assert!(
            next.is_empty() && next.capacity() >= 100,
            "the spare was reused"
        );

        let mut big = vec![Waker::noop().clone(); KEEP_WAKERS + 1];
        let full = take(&mut big);
        wake_all(full);
        let mut after = Vec::new();
        let _ = take(&mut after);
        assert_eq!(after.capacity(), 0, "an oversized list is not kept");

        let mut list = vec![Waker::noop().clone(); 10];
        wake_all(take(&mut list));
        wake_all(Vec::new());
        let mut next = Vec::new();
        let _ = take(&mut next);
        assert!(
            next.capacity() >= 10,
            "an unallocated list does not replace the spare"
        );
    }
}
