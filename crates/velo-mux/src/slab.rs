//! A slab whose keys carry a generation, so a reused slot never answers to an old key
//! (h2's `store.rs` calls this the ABA guard).

/// A stream's key in its mux: slot index plus the slot's generation when the value was inserted.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl Key {
    /// The slot index.
    pub fn index(self) -> u32 {
        self.index
    }
    /// The slot's generation.
    pub fn generation(self) -> u32 {
        self.generation
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}g{}", self.index, self.generation)
    }
}

#[derive(Debug)]
struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

/// Values addressed by generational keys.
///
/// Freed slots are reused last-in first-out, so slot numbers (and their varints on the wire)
/// stay below the peak number of live values. When at most a quarter of the slots is in use,
/// free slots at the end are dropped so a slab that once held many values gives memory back;
/// `fresh_generation` makes sure a slot created again later never reuses a generation an old
/// key may still carry.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    len: usize,
    fresh_generation: u32,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            len: 0,
            fresh_generation: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Inserts `value`, returning its key, or `None` when `limit` slots are in use.
    pub(crate) fn insert(&mut self, value: T, limit: u32) -> Option<Key> {
        if let Some(index) = self.free.pop() {
            let e = &mut self.entries[index as usize];
            e.value = Some(value);
            self.len += 1;
            return Some(Key {
                index,
                generation: e.generation,
            });
        }
        let index = u32::try_from(self.entries.len())
            .ok()
            .filter(|&i| i < limit)?;
        let generation = self.fresh_generation;
        self.entries.push(Entry {
            generation,
            value: Some(value),
        });
        self.len += 1;
        Some(Key { index, generation })
    }

    pub(crate) fn get(&self, key: Key) -> Option<&T> {
        let e = self.entries.get(key.index as usize)?;
        if e.generation != key.generation {
            return None;
        }
        e.value.as_ref()
    }

    pub(crate) fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        let e = self.entries.get_mut(key.index as usize)?;
        if e.generation != key.generation {
            return None;
        }
        e.value.as_mut()
    }

    /// Removes the value at `key`; the slot's generation moves on so `key` goes stale.
    pub(crate) fn remove(&mut self, key: Key) -> Option<T> {
        let e = self.entries.get_mut(key.index as usize)?;
        if e.generation != key.generation {
            return None;
        }
        let value = e.value.take()?;
        e.generation = e.generation.wrapping_add(1);
        self.len -= 1;
        self.free.push(key.index);
        self.shrink_tail();
        Some(value)
    }

    /// Drops trailing free slots once at most a quarter of the slots is in use.
    fn shrink_tail(&mut self) {
        if self.entries.len() < MIN_SHRINK_LEN || self.len * 4 > self.entries.len() {
            return;
        }
        let before = self.entries.len();
        while let Some(last) = self.entries.last() {
            if last.value.is_some() {
                break;
            }
            // Slots created again later start above every generation this one handed out.
            self.fresh_generation = self.fresh_generation.max(last.generation);
            self.entries.pop();
        }
        if self.entries.len() < before {
            let len = self.entries.len();
            self.free.retain(|&i| (i as usize) < len);
            self.entries.shrink_to(len.max(MIN_SHRINK_LEN) * 2);
            self.free.shrink_to(self.free.len() * 2);
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (Key, &T)> {
        self.entries.iter().enumerate().filter_map(|(i, e)| {
            let index = u32::try_from(i).ok()?;
            e.value.as_ref().map(|v| {
                (
                    Key {
                        index,
                        generation: e.generation,
                    },
                    v,
                )
            })
        })
    }
}

/// Slabs smaller than this never shrink: churn at small sizes should not reallocate.
const MIN_SHRINK_LEN: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_slot_does_not_answer_to_the_old_key() {
        let mut s = Slab::new();
        let a = s.insert("a", 10).unwrap();
        assert_eq!(s.remove(a), Some("a"));
        let b = s.insert("b", 10).unwrap();
        assert_eq!(b.index, a.index);
        assert_ne!(b.generation, a.generation);
        assert_eq!(s.get(a), None);
        assert_eq!(s.get(b), Some(&"b"));
        assert_eq!(s.remove(a), None);
    }

    #[test]
    fn freed_slots_are_reused_and_the_limit_holds() {
        let mut s = Slab::new();
        let keys: Vec<_> = (0..5).map(|i| s.insert(i, 5).unwrap()).collect();
        assert!(s.insert(99, 5).is_none(), "limit of 5");
        s.remove(keys[3]);
        s.remove(keys[1]);
        let mut reused = [s.insert(7, 5).unwrap().index, s.insert(8, 5).unwrap().index];
        reused.sort();
        assert_eq!(reused, [1, 3]);
        assert!(s.insert(9, 5).is_none());
    }

    #[test]
    fn a_drained_slab_gives_memory_back() {
        let mut s = Slab::new();
        let keys: Vec<_> = (0..10_000)
            .map(|i| s.insert(i, u32::MAX).unwrap())
            .collect();
        for k in keys {
            s.remove(k);
        }
        assert_eq!(s.len(), 0);
        assert!(s.entries.len() <= 64, "{} entries left", s.entries.len());
    }

    #[test]
    fn a_slot_created_again_after_shrinking_never_reuses_an_old_generation() {
        let mut s = Slab::new();
        let keys: Vec<_> = (0..1000).map(|i| s.insert(i, u32::MAX).unwrap()).collect();
        let old_tail = keys[999];
        for k in &keys {
            s.remove(*k);
        }
        // Grow again past the old tail: slot 999 exists anew.
        let again: Vec<_> = (0..1000).map(|i| s.insert(i, u32::MAX).unwrap()).collect();
        let new_tail = again
            .iter()
            .find(|k| k.index == 999)
            .expect("slot 999 again");
        assert_ne!(new_tail.generation, old_tail.generation);
        assert_eq!(s.get(old_tail), None);
    }
}
