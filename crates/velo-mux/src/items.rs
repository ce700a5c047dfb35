//! A frontend stream's received items, kept back to back in one buffer of the stream's own.
//!
//! # Why
//!
//! Handing each item over as a `Bytes` of its own cost two atomic updates of a shared
//! reference count per item (one when it was cut from a shared chunk, one when it was
//! dropped): 11% of a frontend's CPU at saturation, the largest single cost measured on the
//! receive path. Here a small item is copied once, from the receive buffer into its stream's
//! buffer, and read in place by whoever takes the queue: no allocation, no shared count.
//!
//! # Bounds
//!
//! A queue's buffer holds its unread items' bytes and at most as many again of read ones
//! (read bytes are dropped once they are half the buffer, or all of them when the queue
//! empties), in a capacity at most twice that (a `Vec` doubles); an emptied queue keeps at
//! most [`ITEM_BUFFER_KEEP`] bytes of capacity. Items the receiver keeps as slices of what they
//! arrived in (the large ones) are held as `Bytes`; one lent by [`ItemQueue::pop`] is let go
//! when the next item is read.

use std::collections::VecDeque;

use bytes::Bytes;

/// Bytes of buffer an emptied queue keeps for its next items: 4 KiB, a window of token-sized
/// items (a queue grown past it by larger items gives the rest back).
pub const ITEM_BUFFER_KEEP: usize = 4 * 1024;

/// Bytes a queue's buffer starts with: 1 KiB, ten token-sized items (growing from nothing
/// took four reallocations for as many).
pub const ITEM_BUFFER_FIRST: usize = 1024;

/// The length recorded for an item held as `Bytes` (in `owned`), not in the buffer.
const OWNED: u32 = u32::MAX;

/// Items in order: small ones copied into one buffer, large ones held as `Bytes`.
///
/// [`pop`](Self::pop) lends the next item; [`pop_bytes`](Self::pop_bytes) hands it over as
/// `Bytes` (a copy for an item kept in the buffer).
#[derive(Debug, Default)]
pub struct ItemQueue {
    /// Copied items, back to back; those before `read` were read.
    buf: Vec<u8>,
    read: usize,
    /// Each item's length in `buf`, or [`OWNED`].
    lens: VecDeque<u32>,
    /// The items held as `Bytes`, in order.
    owned: VecDeque<Bytes>,
    /// The item [`pop`](Self::pop) lent last when it was held as `Bytes`.
    lent: Bytes,
}

impl ItemQueue {
    /// An empty queue that has allocated nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Items in the queue.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether the queue holds no item.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Appends a copy of `item`.
    pub fn push_copy(&mut self, item: &[u8]) {
        let len = match u32::try_from(item.len()) {
            Ok(len) if len != OWNED => len,
            _ => return self.push_bytes(Bytes::copy_from_slice(item)),
        };
        self.make_room();
        if self.buf.capacity() == 0 {
            self.buf.reserve(item.len().max(ITEM_BUFFER_FIRST));
        }
        self.buf.extend_from_slice(item);
        self.lens.push_back(len);
    }

    /// Appends `item` as it is (no copy).
    pub fn push_bytes(&mut self, item: Bytes) {
        self.lens.push_back(OWNED);
        self.owned.push_back(item);
    }

    /// Lends the first item and removes it, or `None` when the queue is empty.
    pub fn pop(&mut self) -> Option<&[u8]> {
        let Some(len) = self.lens.pop_front() else {
            self.reset();
            return None;
        };
        if len == OWNED {
            self.lent = self.owned.pop_front().unwrap_or_default();
            return Some(&self.lent);
        }
        if !self.lent.is_empty() {
            // Lent until this call only: it may pin a whole receive buffer.
            self.lent = Bytes::new();
        }
        let start = self.read;
        self.read += len as usize;
        self.buf.get(start..self.read)
    }

    /// Removes the first item and hands it over, or `None` when the queue is empty.
    pub fn pop_bytes(&mut self) -> Option<Bytes> {
        if self.lens.front() == Some(&OWNED) {
            self.lens.pop_front();
            return self.owned.pop_front();
        }
        self.pop().map(Bytes::copy_from_slice)
    }

    /// Moves every item of `other` to the end of this queue, leaving `other` empty. When this
    /// queue is empty the two are swapped: nothing is copied, and `other` keeps this queue's
    /// allocations for its next items.
    pub fn append(&mut self, other: &mut Self) {
        if self.is_empty() {
            std::mem::swap(self, other);
            other.clear();
            return;
        }
        while let Some(len) = other.lens.front().copied() {
            if len == OWNED {
                if let Some(b) = other.pop_bytes() {
                    self.push_bytes(b);
                }
            } else if let Some(item) = other.pop() {
                self.make_room();
                self.buf.extend_from_slice(item);
                self.lens.push_back(len);
            }
        }
        other.reset();
    }

    /// Drops every item, keeping at most [`ITEM_BUFFER_KEEP`] bytes of buffer.
    pub fn clear(&mut self) {
        self.lens.clear();
        self.owned.clear();
        self.reset();
    }

    /// Bytes of buffer allocated (for the bounds' tests and the kept queues' limit).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Items the queue has room for without allocating.
    pub fn item_capacity(&self) -> usize {
        self.lens.capacity()
    }

    /// Whether the queue has room allocated for items held as `Bytes` (large ones).
    pub(crate) fn has_room_for_held(&self) -> bool {
        self.owned.capacity() > 0
    }

    /// Forgets read bytes before a copy goes in: all of them when the queue is empty, else
    /// once they are half the buffer (so the buffer stays within twice the unread bytes, at a
    /// cost of at most one move of each unread byte per byte read).
    fn make_room(&mut self) {
        if self.lens.is_empty() {
            self.reset();
        } else if self.read > 0 && self.read >= self.buf.len() / 2 {
            self.buf.drain(..self.read);
            self.read = 0;
        }
    }

    /// Empties the buffer (its items were all read or dropped), keeping at most
    /// [`ITEM_BUFFER_KEEP`] bytes of it, and lets go of the item lent last.
    fn reset(&mut self) {
        self.buf.clear();
        self.read = 0;
        if self.buf.capacity() > ITEM_BUFFER_KEEP {
            self.buf.shrink_to(ITEM_BUFFER_KEEP);
        }
        if !self.lent.is_empty() {
            self.lent = Bytes::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut ItemQueue) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| q.pop().map(<[u8]>::to_vec)).collect()
    }

    #[test]
    fn items_come_out_in_order_whether_copied_or_held() {
        let mut q = ItemQueue::new();
        q.push_copy(b"one");
        q.push_bytes(Bytes::from_static(b"two"));
        q.push_copy(b"");
        q.push_copy(b"four");
        assert_eq!(q.len(), 4);
        assert_eq!(q.pop_bytes().as_deref(), Some(&b"one"[..]));
        assert_eq!(drain(&mut q), [&b"two"[..], b"", b"four"]);
        assert!(q.is_empty());
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn an_item_lent_from_bytes_is_let_go_once_the_next_item_is_read() {
        // Large items are held as slices of the buffer they arrived in, which they pin.
        let held = Bytes::from(vec![9u8; 100]);
        let mut q = ItemQueue::new();
        q.push_bytes(held.clone());
        q.push_copy(b"small");
        q.push_copy(b"more");
        assert_eq!(q.pop(), Some(&held[..]));
        assert_eq!(q.pop(), Some(&b"small"[..]));
        assert!(
            held.is_unique(),
            "the queue still pins the item lent before"
        );
    }

    #[test]
    fn appending_to_an_empty_queue_swaps_and_to_a_busy_one_keeps_order() {
        let mut a = ItemQueue::new();
        let mut b = ItemQueue::new();
        b.push_copy(b"x");
        b.push_bytes(Bytes::from_static(b"y"));
        a.append(&mut b);
        assert!(b.is_empty());
        b.push_copy(b"z");
        b.push_bytes(Bytes::from_static(b"w"));
        a.append(&mut b);
        assert!(b.is_empty());
        assert_eq!(drain(&mut a), [b"x", b"y", b"z", b"w"]);
    }

    #[test]
    fn a_reader_one_item_behind_keeps_the_buffer_within_twice_its_unread_bytes() {
        let mut q = ItemQueue::new();
        let item = [7u8; 100];
        q.push_copy(&item);
        for _ in 0..10_000 {
            q.push_copy(&item);
            assert_eq!(q.pop(), Some(&item[..]));
            assert!(q.buf.len() <= 2 * q.len() * item.len() + item.len());
        }
    }

    #[test]
    fn an_emptied_queue_keeps_at_most_its_share_of_buffer() {
        let mut q = ItemQueue::new();
        for _ in 0..64 {
            q.push_copy(&[1u8; 1000]);
        }
        assert!(q.buffer_capacity() > ITEM_BUFFER_KEEP);
        while q.pop().is_some() {}
        assert!(q.buffer_capacity() <= ITEM_BUFFER_KEEP);
        q.push_copy(&[1u8; 1000]);
        q.clear();
        assert!(q.buffer_capacity() <= ITEM_BUFFER_KEEP);
    }
}
