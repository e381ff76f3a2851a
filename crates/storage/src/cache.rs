//! The object cache: values of durable records, bounded in bytes, evicted by S3-FIFO (Yang et
//! al., SOSP'23). New objects enter a small FIFO; those read again before they reach its head move
//! to the main FIFO, the rest leave and are remembered in a ghost FIFO of key hashes, so an object
//! that comes back soon goes straight to main. Main is a FIFO with reinsertion for objects read
//! since their last pass. One-hit wonders — most of a scan, most of a write-heavy workload —
//! never displace the working set, and no read moves a list node, so a hit costs one hash lookup.

use std::collections::VecDeque;
use std::hash::BuildHasher;

use bytes::Bytes;
use foldhash::{HashMap, HashSet};

/// Bookkeeping bytes charged per object on top of its key and value.
const OBJECT_OVERHEAD_BYTES: usize = 64;
const MAX_FREQUENCY: u8 = 3;

struct Slot {
    value: Bytes,
    frequency: u8,
    in_main: bool,
    /// Distinguishes this object from an earlier one under the same key still queued.
    generation: u64,
}

#[derive(Default)]
pub struct ObjectCache {
    capacity_bytes: usize,
    small_capacity_bytes: usize,
    slots: HashMap<Bytes, Slot>,
    small: VecDeque<(Bytes, u64)>,
    main: VecDeque<(Bytes, u64)>,
    small_bytes: usize,
    main_bytes: usize,
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

    pub fn get(&mut self, key: &[u8]) -> Option<Bytes> {
        match self.slots.get_mut(key) {
            Some(slot) => {
                slot.frequency = (slot.frequency + 1).min(MAX_FREQUENCY);
                self.hits += 1;
                Some(slot.value.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Caches `value` under `key`, replacing an older value.
    pub fn insert(&mut self, key: Bytes, value: Bytes) {
        let bytes = charge(&key, &value);
        if bytes > self.capacity_bytes {
            self.remove(&key);
            return;
        }
        if let Some(slot) = self.slots.get_mut(&key) {
            let old = charge(&key, &slot.value);
            let queue_bytes = if slot.in_main {
                &mut self.main_bytes
            } else {
                &mut self.small_bytes
            };
            *queue_bytes = *queue_bytes - old + bytes;
            slot.value = value;
        } else {
            let generation = self.next_generation;
            self.next_generation += 1;
            let in_main = self.ghost_set.remove(&self.slots.hasher().hash_one(&key));
            if in_main {
                self.main.push_back((key.clone(), generation));
                self.main_bytes += bytes;
            } else {
                self.small.push_back((key.clone(), generation));
                self.small_bytes += bytes;
            }
            self.slots.insert(
                key,
                Slot {
                    value,
                    frequency: 0,
                    in_main,
                    generation,
                },
            );
        }
        while self.small_bytes + self.main_bytes > self.capacity_bytes {
            self.evict_one();
        }
    }

    /// Forgets `key` (its record was overwritten or deleted). Its queue entry goes stale.
    pub fn remove(&mut self, key: &[u8]) {
        if let Some(slot) = self.slots.remove(key) {
            let bytes = charge(key, &slot.value);
            if slot.in_main {
                self.main_bytes -= bytes;
            } else {
                self.small_bytes -= bytes;
            }
        }
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            objects: self.slots.len(),
            bytes: self.small_bytes + self.main_bytes,
            hits: self.hits,
            misses: self.misses,
        }
    }

    fn evict_one(&mut self) {
        if self.small_bytes > self.small_capacity_bytes || self.main.is_empty() {
            self.evict_from_small();
        } else {
            self.evict_from_main();
        }
    }

    /// Whether a queue entry still names the live object under its key.
    fn live(&self, key: &[u8], generation: u64) -> bool {
        self.slots.get(key).is_some_and(|s| s.generation == generation)
    }

    fn evict_from_small(&mut self) {
        while let Some((key, generation)) = self.small.pop_front() {
            if !self.live(&key, generation) {
                continue;
            }
            let slot = self.slots.get_mut(&key).expect("live");
            let bytes = charge(&key, &slot.value);
            self.small_bytes -= bytes;
            if slot.frequency > 0 {
                slot.frequency = 0;
                slot.in_main = true;
                self.main_bytes += bytes;
                self.main.push_back((key, generation));
            } else {
                self.slots.remove(&key);
                self.remember_ghost(&key);
                return;
            }
            if self.small_bytes + self.main_bytes <= self.capacity_bytes {
                return;
            }
        }
        self.evict_from_main();
    }

    fn evict_from_main(&mut self) {
        while let Some((key, generation)) = self.main.pop_front() {
            if !self.live(&key, generation) {
                continue;
            }
            let slot = self.slots.get_mut(&key).expect("live");
            if slot.frequency > 0 {
                slot.frequency -= 1;
                self.main.push_back((key, generation));
            } else {
                let bytes = charge(&key, &slot.value);
                self.slots.remove(&key);
                self.main_bytes -= bytes;
                return;
            }
        }
    }

    fn remember_ghost(&mut self, key: &[u8]) {
        let h = self.slots.hasher().hash_one(key);
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
    use super::*;

    fn key(i: u32) -> Bytes {
        Bytes::from(format!("k{i:05}"))
    }

    #[test]
    fn stays_within_its_byte_budget_and_serves_what_it_holds() {
        let mut c = ObjectCache::new(10_000);
        for i in 0..1_000 {
            c.insert(key(i), Bytes::from(vec![i as u8; 50]));
            assert!(c.stats().bytes <= 10_000);
        }
        let held: Vec<u32> = (0..1_000).filter(|i| c.slots.contains_key(&key(*i))).collect();
        assert!(!held.is_empty());
        for i in held {
            assert_eq!(c.get(&key(i)).unwrap(), Bytes::from(vec![i as u8; 50]));
        }
    }

    #[test]
    fn a_scan_does_not_evict_the_working_set() {
        let mut c = ObjectCache::new(20 * (64 + 6 + 10));
        for i in 0..10 {
            c.insert(key(i), Bytes::from(vec![0; 10]));
        }
        for _ in 0..3 {
            for i in 0..10 {
                c.get(&key(i));
            }
        }
        for i in 100..1_000 {
            c.insert(key(i), Bytes::from(vec![0; 10]));
            for w in 0..10 {
                c.get(&key(w));
            }
        }
        let kept = (0..10).filter(|i| c.slots.contains_key(&key(*i))).count();
        assert_eq!(kept, 10, "the read-again keys survive 900 one-time inserts");
    }

    #[test]
    fn replacing_and_removing_keep_the_byte_count_exact() {
        let mut c = ObjectCache::new(1_000_000);
        c.insert(key(1), Bytes::from(vec![0; 100]));
        c.insert(key(1), Bytes::from(vec![0; 10]));
        assert_eq!(c.stats().bytes, charge(&key(1), &[0; 10]));
        c.remove(&key(1));
        assert_eq!(c.stats().bytes, 0);
        assert_eq!(c.get(&key(1)), None);
        c.insert(key(2), Bytes::from(vec![0; 2_000_000]));
        assert_eq!(c.stats().objects, 0, "an object larger than the cache is not cached");
    }
}
