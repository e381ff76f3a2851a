//! The object cache: values of durable records, bounded in bytes, evicted by S3-FIFO (Yang et
//! al., SOSP'23). New objects enter a small FIFO; those read again before they reach its head move
//! to the main FIFO, the rest leave and are remembered in a ghost FIFO of key hashes, so an object
//! that comes back soon goes straight to main. Main is a FIFO with reinsertion for objects read
//! since their last pass. One-hit wonders — most of a scan, most of a write-heavy workload —
//! never displace the working set.
//!
//! A cached value lives in the index entry of its key (`Cached`), so a hit costs no lookup beyond
//! the index's own; the policy keeps only the FIFOs of keys and the byte counts, and reaches
//! entries through `CacheSlots` when it evicts.

use std::collections::VecDeque;
use std::hash::BuildHasher;

use bytes::Bytes;
use foldhash::HashSet;

/// Bookkeeping bytes charged per object on top of its key and value.
const OBJECT_OVERHEAD_BYTES: usize = 64;
const MAX_FREQUENCY: u8 = 3;

/// A value held in the cache, stored in its key's index entry.
#[derive(Debug, Clone)]
pub struct Cached {
    value: Bytes,
    frequency: u8,
    in_main: bool,
    /// Distinguishes this object from an earlier one under the same key still queued.
    generation: u64,
}

/// Where the policy finds the cache slot of a key when it evicts.
pub trait CacheSlots {
    fn slot(&mut self, key: &[u8]) -> Option<&mut Option<Cached>>;
}

#[derive(Default)]
pub struct ObjectCache {
    capacity_bytes: usize,
    small_capacity_bytes: usize,
    small: VecDeque<(Bytes, u64)>,
    main: VecDeque<(Bytes, u64)>,
    small_bytes: usize,
    main_bytes: usize,
    objects: usize,
    ghost: VecDeque<u64>,
    ghost_set: HashSet<u64>,
    next_generation: u64,
    hits: u64,
    misses: u64,
}

/// Counters a caller can report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub objects: usize,
    pub bytes: usize,
    pub hits: u64,
    pub misses: u64,
}

fn charge(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + OBJECT_OVERHEAD_BYTES
}

impl ObjectCache {
    pub fn new(capacity_bytes: usize) -> Self {
        ObjectCache {
            capacity_bytes,
            small_capacity_bytes: capacity_bytes / 10,
            ..ObjectCache::default()
        }
    }

    /// The value in `slot`, if cached, counted as read again.
    pub fn get(&mut self, slot: &mut Option<Cached>) -> Option<Bytes> {
        match slot {
            Some(cached) => {
                cached.frequency = (cached.frequency + 1).min(MAX_FREQUENCY);
                self.hits += 1;
                Some(cached.value.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Caches `value` as `key`'s in `slot`, replacing an older value. Call `evict` afterwards.
    pub fn admit(&mut self, key: &Bytes, slot: &mut Option<Cached>, value: Bytes) {
        let bytes = charge(key, &value);
        if bytes > self.capacity_bytes {
            self.forget(key, slot);
            return;
        }
        if let Some(cached) = slot {
            let old = charge(key, &cached.value);
            let queue_bytes = if cached.in_main {
                &mut self.main_bytes
            } else {
                &mut self.small_bytes
            };
            *queue_bytes = *queue_bytes - old + bytes;
            cached.value = value;
            return;
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        let in_main = self.ghost_set.remove(&self.ghost_set.hasher().hash_one(key.as_ref()));
        if in_main {
            self.main.push_back((key.clone(), generation));
            self.main_bytes += bytes;
        } else {
            self.small.push_back((key.clone(), generation));
            self.small_bytes += bytes;
        }
        self.objects += 1;
        *slot = Some(Cached {
            value,
            frequency: 0,
            in_main,
            generation,
        });
    }

    /// Empties `slot` (its record was overwritten or deleted). Its queue entry goes stale.
    pub fn forget(&mut self, key: &[u8], slot: &mut Option<Cached>) {
        if let Some(cached) = slot.take() {
            let bytes = charge(key, &cached.value);
            if cached.in_main {
                self.main_bytes -= bytes;
            } else {
                self.small_bytes -= bytes;
            }
            self.objects -= 1;
        }
    }

    /// Evicts until the cache is within its budget.
    pub fn evict(&mut self, slots: &mut impl CacheSlots) {
        while self.small_bytes + self.main_bytes > self.capacity_bytes {
            if self.small_bytes > self.small_capacity_bytes || self.main_bytes == 0 {
                self.evict_from_small(slots);
            } else {
                self.evict_from_main(slots);
            }
        }
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            objects: self.objects,
            bytes: self.small_bytes + self.main_bytes,
            hits: self.hits,
            misses: self.misses,
        }
    }

    /// The live object a queue entry names, if it is still cached under that generation.
    fn live<'a>(slots: &'a mut impl CacheSlots, key: &[u8], generation: u64) -> Option<&'a mut Option<Cached>> {
        slots
            .slot(key)
            .filter(|slot| slot.as_ref().is_some_and(|c| c.generation == generation))
    }

    fn evict_from_small(&mut self, slots: &mut impl CacheSlots) {
        while let Some((key, generation)) = self.small.pop_front() {
            let Some(slot) = Self::live(slots, &key, generation) else {
                continue;
            };
            let cached = slot.as_mut().expect("live");
            let bytes = charge(&key, &cached.value);
            self.small_bytes -= bytes;
            if cached.frequency > 0 {
                cached.frequency = 0;
                cached.in_main = true;
                self.main_bytes += bytes;
                self.main.push_back((key, generation));
                if self.small_bytes + self.main_bytes <= self.capacity_bytes {
                    return;
                }
            } else {
                *slot = None;
                self.objects -= 1;
                self.remember_ghost(&key);
                return;
            }
        }
    }

    fn evict_from_main(&mut self, slots: &mut impl CacheSlots) {
        while let Some((key, generation)) = self.main.pop_front() {
            let Some(slot) = Self::live(slots, &key, generation) else {
                continue;
            };
            let cached = slot.as_mut().expect("live");
            if cached.frequency > 0 {
                cached.frequency -= 1;
                self.main.push_back((key, generation));
            } else {
                self.main_bytes -= charge(&key, &cached.value);
                *slot = None;
                self.objects -= 1;
                return;
            }
        }
    }

    fn remember_ghost(&mut self, key: &[u8]) {
        let h = self.ghost_set.hasher().hash_one(key);
        if self.ghost_set.insert(h) {
            self.ghost.push_back(h);
        }
        // As many ghosts as the main queue holds objects, as the paper sizes it.
        while self.ghost.len() > self.main.len().max(16) {
            if let Some(old) = self.ghost.pop_front() {
                self.ghost_set.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[derive(Default)]
    struct Slots(HashMap<Bytes, Option<Cached>>);

    impl CacheSlots for Slots {
        fn slot(&mut self, key: &[u8]) -> Option<&mut Option<Cached>> {
            self.0.get_mut(key)
        }
    }

    impl Slots {
        fn insert(&mut self, cache: &mut ObjectCache, key: Bytes, value: Bytes) {
            let slot = self.0.entry(key.clone()).or_default();
            cache.admit(&key, slot, value);
            cache.evict(self);
        }
        fn get(&mut self, cache: &mut ObjectCache, key: &Bytes) -> Option<Bytes> {
            cache.get(self.0.get_mut(key)?)
        }
        fn held(&self, key: &Bytes) -> bool {
            self.0.get(key).is_some_and(Option::is_some)
        }
    }

    fn key(i: u32) -> Bytes {
        Bytes::from(format!("k{i:05}"))
    }

    #[test]
    fn stays_within_its_byte_budget_and_serves_what_it_holds() {
        let mut c = ObjectCache::new(10_000);
        let mut s = Slots::default();
        for i in 0..1_000 {
            s.insert(&mut c, key(i), Bytes::from(vec![i as u8; 50]));
            assert!(c.stats().bytes <= 10_000);
        }
        let held: Vec<u32> = (0..1_000).filter(|i| s.held(&key(*i))).collect();
        assert!(!held.is_empty());
        assert_eq!(held.len(), c.stats().objects);
        for i in held {
            assert_eq!(s.get(&mut c, &key(i)).unwrap(), Bytes::from(vec![i as u8; 50]));
        }
    }

    #[test]
    fn a_scan_does_not_evict_the_working_set() {
        let mut c = ObjectCache::new(20 * (64 + 6 + 10));
        let mut s = Slots::default();
        for i in 0..10 {
            s.insert(&mut c, key(i), Bytes::from(vec![0; 10]));
        }
        for _ in 0..3 {
            for i in 0..10 {
                s.get(&mut c, &key(i));
            }
        }
        for i in 100..1_000 {
            s.insert(&mut c, key(i), Bytes::from(vec![0; 10]));
            for w in 0..10 {
                s.get(&mut c, &key(w));
            }
        }
        let kept = (0..10).filter(|i| s.held(&key(*i))).count();
        assert_eq!(kept, 10, "the read-again keys survive 900 one-time inserts");
    }

    #[test]
    fn replacing_and_forgetting_keep_the_byte_count_exact() {
        let mut c = ObjectCache::new(1_000_000);
        let mut s = Slots::default();
        s.insert(&mut c, key(1), Bytes::from(vec![0; 100]));
        s.insert(&mut c, key(1), Bytes::from(vec![0; 10]));
        assert_eq!(c.stats().bytes, charge(&key(1), &[0; 10]));
        c.forget(&key(1), s.0.get_mut(&key(1)).unwrap());
        assert_eq!(c.stats().bytes, 0);
        assert_eq!(s.get(&mut c, &key(1)), None);
        s.insert(&mut c, key(2), Bytes::from(vec![0; 2_000_000]));
        assert_eq!(c.stats().objects, 0, "an object larger than the cache is not cached");
    }
}
