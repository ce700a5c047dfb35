//! Where a frontend stream's items wait for its handle, so that a handle woken for them takes
//! them without the connection's lock.
//!
//! # Why
//!
//! Every stream of a connection reads from the connection's one mux. Were each handle to take
//! the connection's lock per wake, as it did, every consumer task on every runtime thread would
//! queue behind the lane readers on that lock (measured at 1,024 streams with two runtime
//! threads: the lock's contention and the futex waits it caused were ~6% of the frontend's CPU,
//! and grow with the threads a frontend runs). Here the lane reader, which holds the lock
//! anyway when the mux says a stream is readable, moves the stream's items into its mailbox
//! when the handle is waiting with nothing in hand, and wakes it; the handle then takes them
//! under the mailbox's own lock, which only that reader and that handle ever take.
//!
//! # The bound and the credit
//!
//! Items move into the mailbox exactly when the handle would have taken them itself (it waits,
//! its queue is empty), by the same [`Mux::recv_all`](velo_mux::Mux::recv_all), which returns
//! their credit: a stream still holds at most two credit windows (one in its handle, one in the
//! mux), and credit still goes back only for items handed over.
//!
//! # Why no wake-up is lost
//!
//! Lock order is the connection's, then a mailbox's. A `Readable` event comes once per drain
//! of the mux's queue; the reader handling it either finds the handle waiting (and delivers),
//! or marks the mailbox `in_mux` (and wakes whoever waits). A handle waits only after finding
//! its mailbox empty and not `in_mux` under the mailbox's lock, or after draining the mux
//! itself under the connection's lock: either way the next item makes a `Readable` that finds
//! it waiting.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Instant;

use velo_mux::{ItemQueue, Mux, StreamEnd, StreamKey};

/// One frontend stream's mailbox; shared by its handle and its connection's waker table.
#[derive(Debug, Default)]
pub(crate) struct Mailbox(Mutex<Slot>);

/// What a mailbox holds.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// Items handed over by a lane reader, in order.
    pub(crate) items: ItemQueue,
    /// The stream's end, handed over after its last item.
    pub(crate) end: Option<StreamEnd>,
    /// The handle waiting with nothing in hand.
    pub(crate) waker: Option<Waker>,
    /// The mux holds items or the end that were not handed over (the handle was busy): the
    /// handle takes them itself, under the connection's lock, before it waits again.
    pub(crate) in_mux: bool,
}

impl Mailbox {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Slot> {
        // Nothing panics under this lock; a poisoned one still holds consistent state.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A lane reader's answer to `Readable(key)`, under the connection's lock: hands the items
    /// (and the end) to a waiting handle, or leaves them in the mux and marks them there.
    /// Returns the waker to wake once the connection's lock is released.
    pub(crate) fn on_readable(&self, mux: &mut Mux, now: Instant, key: StreamKey) -> Option<Waker> {
        let mut slot = self.lock();
        let Some(waker) = slot.waker.take() else {
            slot.in_mux = true;
            return None;
        };
        if slot.items.is_empty() && slot.end.is_none() && !slot.in_mux {
            if let Some(Some(end)) = mux.recv_all(now, key, &mut slot.items) {
                slot.end = Some(end);
            }
        } else {
            // Not expected (a waiting handle has taken everything), but never lose an item.
            slot.in_mux = true;
        }
        Some(waker)
    }
}

impl Slot {
    /// Registers `waker` as the waiting handle's.
    pub(crate) fn wait(&mut self, waker: &Waker) {
        match &self.waker {
            Some(old) if old.will_wake(waker) => {}
            _ => self.waker = Some(waker.clone()),
        }
    }
}
