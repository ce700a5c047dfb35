//! Frontend: a lane's table from the worker's stream slots to this side's streams.
//!
//! The worker chooses slot numbers, so the table must not be sized by them: a single OPEN
//! naming slot 65,535 once grew a flat table to 1 MiB. Entries live in pages of
//! [`PAGE_SLOTS`], allocated when a page gets its first entry and freed when it loses its
//! last, so memory follows the streams that are live on the lane: at most one page per live
//! stream (a worker's slots are dense, so usually far less), plus a directory of one pointer
//! per page up to the highest page in use (8 KiB at the default 65,536 streams).
//! A lookup is two indexings, no hashing.

use velo_wire::StreamId;

use crate::StreamKey;

/// Slots per page: 64 entries of 16 bytes, 1 KiB.
pub(crate) const PAGE_SLOTS: usize = 64;

/// Which local stream a worker slot on this lane belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WireSlot {
    pub(crate) generation: u32,
    pub(crate) key: StreamKey,
}

#[derive(Debug)]
struct Page {
    slots: [Option<WireSlot>; PAGE_SLOTS],
    used: usize,
}

#[derive(Debug, Default)]
pub(crate) struct WireTable {
    pages: Vec<Option<Box<Page>>>,
    len: usize,
}

impl WireTable {
    /// The entry for worker slot `slot`, whatever its generation.
    pub(crate) fn get(&self, slot: u32) -> Option<WireSlot> {
        let (page, at) = split(slot)?;
        self.pages.get(page)?.as_ref()?.slots[at]
    }

    /// The local stream `id` names, if the entry for its slot has its generation.
    pub(crate) fn lookup(&self, id: StreamId) -> Option<StreamKey> {
        self.get(id.slot())
            .filter(|e| e.generation == id.generation())
            .map(|e| e.key)
    }

    /// Sets the entry of `slot`, replacing any.
    pub(crate) fn insert(&mut self, slot: u32, entry: WireSlot) {
        let Some((page, at)) = split(slot) else {
            return;
        };
        if self.pages.len() <= page {
            self.pages.resize_with(page + 1, || None);
        }
        let p = self.pages[page].get_or_insert_with(|| {
            Box::new(Page {
                slots: [None; PAGE_SLOTS],
                used: 0,
            })
        });
        if p.slots[at].replace(entry).is_none() {
            p.used += 1;
            self.len += 1;
        }
    }

    /// Removes the entry of `id`'s slot if it has `id`'s generation.
    pub(crate) fn remove(&mut self, id: StreamId) {
        let Some((page, at)) = split(id.slot()) else {
            return;
        };
        let Some(Some(p)) = self.pages.get_mut(page) else {
            return;
        };
        if p.slots[at].is_none_or(|e| e.generation != id.generation()) {
            return;
        }
        p.slots[at] = None;
        p.used -= 1;
        self.len -= 1;
        if p.used == 0 {
            self.pages[page] = None;
            while self.pages.last().is_some_and(Option::is_none) {
                self.pages.pop();
            }
            if self.pages.capacity() > 4 * self.pages.len().max(PAGE_SLOTS) {
                self.pages.shrink_to_fit();
            }
        }
    }

    /// Drops every entry and the memory they used.
    pub(crate) fn clear(&mut self) {
        self.pages = Vec::new();
        self.len = 0;
    }

    /// Entries held.
    #[cfg(any(test, feature = "__fuzz"))]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Pages allocated (each holds at least one entry).
    #[cfg(feature = "__fuzz")]
    pub(crate) fn pages(&self) -> usize {
        self.pages.iter().flatten().count()
    }

    /// Length of the page directory (one more than the highest page in use).
    #[cfg(feature = "__fuzz")]
    pub(crate) fn directory_len(&self) -> usize {
        self.pages.len()
    }

    /// Heap bytes the table holds: its directory and pages.
    pub(crate) fn heap_bytes(&self) -> usize {
        let pages = self.pages.iter().flatten().count();
        self.pages.capacity() * size_of::<Option<Box<Page>>>() + pages * size_of::<Page>()
    }
}

/// A slot's page and index within it (`None` only where `usize` is narrower than `u32`).
fn split(slot: u32) -> Option<(usize, usize)> {
    let slot = usize::try_from(slot).ok()?;
    Some((slot / PAGE_SLOTS, slot % PAGE_SLOTS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slab::Key;

    fn entry(generation: u32, index: u32) -> WireSlot {
        WireSlot {
            generation,
            key: Key {
                index,
                generation: 0,
            },
        }
    }

    #[test]
    fn one_high_slot_costs_one_page_and_a_directory() {
        let mut t = WireTable::default();
        t.insert(65_535, entry(1, 0));
        assert!(
            t.heap_bytes() <= 8 * 1024 + size_of::<Page>(),
            "{}",
            t.heap_bytes()
        );
        assert_eq!(t.lookup(StreamId::new(65_535, 1)), Some(entry(1, 0).key));
        t.remove(StreamId::new(65_535, 1));
        assert_eq!(t.heap_bytes(), 0, "the last entry gone, nothing is held");
    }

    #[test]
    fn lookups_check_the_generation_and_removal_only_takes_its_own() {
        let mut t = WireTable::default();
        t.insert(3, entry(7, 1));
        assert_eq!(t.lookup(StreamId::new(3, 6)), None);
        t.remove(StreamId::new(3, 6));
        assert_eq!(t.len(), 1, "another generation's removal leaves the entry");
        t.insert(3, entry(8, 2));
        assert_eq!(t.len(), 1, "a replaced entry is not counted twice");
        assert_eq!(t.lookup(StreamId::new(3, 8)), Some(entry(8, 2).key));
    }

    #[test]
    fn memory_follows_the_live_entries() {
        let mut t = WireTable::default();
        for slot in 0..10_000 {
            t.insert(slot, entry(1, slot));
        }
        let full = t.heap_bytes();
        for slot in 0..9_990 {
            t.remove(StreamId::new(slot, 1));
        }
        assert_eq!(t.len(), 10);
        assert!(t.heap_bytes() * 20 < full, "{} of {full}", t.heap_bytes());
        t.clear();
        assert_eq!(t.heap_bytes(), 0);
    }
}
