//! Receive queues kept for reuse: a frontend accepts and releases thousands of streams a
//! second, and a new stream's queue would otherwise grow from nothing (allocations at 4, 8,
//! 16 and 32 items, and for its buffer) every time.

use crate::items::{ITEM_BUFFER_KEEP, ItemQueue};

/// Most released queues kept.
pub const SPARE_QUEUES: usize = 256;

/// Largest queue kept, in items (a stream's queue holds at most its window plus the final
/// item; a queue grown past this by a large window is given back).
pub const SPARE_QUEUE_ITEMS: usize = 64;

/// Empty receive queues of released streams: at most [`SPARE_QUEUES`], each with room for at
/// most [`SPARE_QUEUE_ITEMS`] items and [`ITEM_BUFFER_KEEP`] bytes (4.25 KiB), and none for
/// items held as `Bytes`, so at most 1.1 MiB whatever the peer does.
#[derive(Debug, Default)]
pub(crate) struct SpareQueues {
    queues: Vec<ItemQueue>,
}

impl SpareQueues {
    /// An empty queue, reused if one is kept.
    pub(crate) fn take(&mut self) -> ItemQueue {
        self.queues.pop().unwrap_or_default()
    }

    /// Keeps `queue` (emptied: its unread items are dropped now) if there is room and it is
    /// not oversized.
    pub(crate) fn give(&mut self, mut queue: ItemQueue) {
        if queue.item_capacity() == 0
            || queue.item_capacity() > SPARE_QUEUE_ITEMS
            || self.queues.len() >= SPARE_QUEUES
        {
            return;
        }
        queue.clear();
        if queue.buffer_capacity() > ITEM_BUFFER_KEEP || queue.has_room_for_held() {
            return;
        }
        self.queues.push(queue);
    }

    /// Queues kept.
    pub(crate) fn len(&self) -> usize {
        self.queues.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_of(items: usize) -> ItemQueue {
        let mut q = ItemQueue::new();
        for _ in 0..items {
            q.push_copy(b"unread");
        }
        q
    }

    #[test]
    fn keeps_at_most_the_bound_and_never_an_oversized_or_unallocated_queue() {
        let mut spare = SpareQueues::default();
        spare.give(ItemQueue::new());
        spare.give(queue_of(SPARE_QUEUE_ITEMS * 2));
        assert_eq!(spare.len(), 0);
        for _ in 0..SPARE_QUEUES + 10 {
            spare.give(queue_of(8));
        }
        assert_eq!(spare.len(), SPARE_QUEUES);
        let q = spare.take();
        assert!(
            q.is_empty() && q.item_capacity() >= 8 && q.buffer_capacity() <= ITEM_BUFFER_KEEP,
            "a kept queue is empty, allocated, and within its share of buffer"
        );
    }
}
