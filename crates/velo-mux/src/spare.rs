//! Receive queues kept for reuse: a frontend accepts and releases thousands of streams a
//! second, and a new stream's queue would otherwise grow from nothing (an allocation at 4, 8,
//! 16 and 32 items) every time.

use std::collections::VecDeque;

use bytes::Bytes;

/// Most released queues kept.
pub const SPARE_QUEUES: usize = 256;

/// Largest queue kept, in items (a stream's queue holds at most its window plus the final
/// item; a queue grown past this by a large window is given back).
pub const SPARE_QUEUE_ITEMS: usize = 64;

/// Empty receive queues of released streams: at most [`SPARE_QUEUES`], each with room for at
/// most [`SPARE_QUEUE_ITEMS`] items (2 KiB), so at most 512 KiB whatever the peer does.
#[derive(Debug, Default)]
pub(crate) struct SpareQueues {
    queues: Vec<VecDeque<Bytes>>,
}

impl SpareQueues {
    /// An empty queue, reused if one is kept.
    pub(crate) fn take(&mut self) -> VecDeque<Bytes> {
        self.queues.pop().unwrap_or_default()
    }

    /// Keeps `queue` (emptied: its unread items are dropped now) if there is room and it is
    /// not oversized.
    pub(crate) fn give(&mut self, mut queue: VecDeque<Bytes>) {
        if queue.capacity() == 0
            || queue.capacity() > SPARE_QUEUE_ITEMS
            || self.queues.len() >= SPARE_QUEUES
        {
            return;
        }
        queue.clear();
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

    #[test]
    fn keeps_at_most_the_bound_and_never_an_oversized_or_unallocated_queue() {
        let mut spare = SpareQueues::default();
        spare.give(VecDeque::new());
        spare.give(VecDeque::with_capacity(SPARE_QUEUE_ITEMS * 2));
        assert_eq!(spare.len(), 0);
        for _ in 0..SPARE_QUEUES + 10 {
            let mut q = VecDeque::with_capacity(8);
            q.push_back(Bytes::from_static(b"unread"));
            spare.give(q);
        }
        assert_eq!(spare.len(), SPARE_QUEUES);
        let q = spare.take();
        assert!(
            q.is_empty() && q.capacity() >= 8,
            "a kept queue is empty and allocated"
        );
    }
}
