//! The values the store holds in memory: the object cache of durable values, bounded in bytes and
//! evicted by S3-FIFO (Yang et al., SOSP'23), and the values of writes whose batch is not in a
//! segment yet. New objects enter a small FIFO; those read again before they reach its head move
//! to the main FIFO, the rest leave and are remembered in a ghost FIFO of key hashes, so an object
//! that comes back soon goes straight to main. Main is a FIFO with reinsertion for objects read
//! since their last pass. One-hit wonders — most of a scan, most of a write-heavy workload —
//! never displace the working set.
//!
//! Values live in a slab; a key's index entry names its value by a 4-byte `ValueSlot`, so the
//! index spends 4 bytes per key on values rather than room for two of them, and the FIFOs hold
//! slots, not keys. A slot leaves a FIFO only at its head: an overwritten object keeps its slot
//! and its place, held unwritten until its new value is durable; a deleted one stays queued,
//! empty, until the FIFO reaches it or is compacted.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::num::NonZeroU32;

use bytes::Bytes;
use foldhash::HashSet;

use crate::scan_map::SingleKey;

/// Bytes charged per cached object on top of its key and value, so that `capacity_bytes` is the
/// memory the cache takes: its 72-byte slab entry, its FIFO slot, its ghost once evicted from
/// main (a hash in a FIFO and in a set), the shared header of the value's buffer, the framing of
/// the applied command that buffer holds besides the value, and the allocator's chunk headers,
/// rounding and fragmentation around them. Measured as the resident memory a node gains per
/// cached object of a 16-byte key and a 100-byte value: 41 MiB for 32 MiB more of cache at 244
/// bytes an object (`scripts/bench-rss` at 16 and 48 MiB), about 312 bytes an object.
pub const OBJECT_OVERHEAD_BYTES: usize = 196;
const MAX_FREQUENCY: u8 = 3;
/// A FIFO is compacted once it holds this many released objects more than live ones.
const COMPACT_AFTER_RELEASED: usize = 1_024;

/// Names a value in the slab, from its key's index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueSlot(NonZeroU32);

impl ValueSlot {
    fn of(index: u32) -> ValueSlot {
        ValueSlot(NonZeroU32::new(index + 1).expect("fewer than 2^32 - 1 values in memory"))
    }

    fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// On the free list.
    Free,
    /// The value of a write whose batch is not durable yet: neither charged nor evictable (the
    /// store bounds unwritten batches) and in no FIFO.
    Unwritten,
    Small,
    Main,
    /// Overwritten while in a FIFO: unwritten, and cached again in its place once written. If
    /// the FIFO reaches it first it leaves the FIFO and is plainly unwritten.
    UnwrittenInSmall,
    UnwrittenInMain,
    /// Released while in a FIFO: empty, freed when the FIFO reaches it or is compacted.
    ReleasedInSmall,
    ReleasedInMain,
}

impl State {
    fn is_unwritten(self) -> bool {
        matches!(
            self,
            State::Unwritten | State::UnwrittenInSmall | State::UnwrittenInMain
        )
    }
}

#[derive(Debug)]
struct Object {
    /// Where eviction finds the index entry to clear (empty while unwritten).
    key: SingleKey,
    value: Bytes,
    frequency: u8,
    state: State,
}

/// Where the policy finds a key's value slot when it evicts.
pub trait CacheSlots {
    fn slot(&mut self, key: &[u8]) -> Option<&mut Option<ValueSlot>>;
}

#[derive(Default)]
pub struct ObjectCache {
    capacity_bytes: usize,
    small_capacity_bytes: usize,
    slab: Vec<Object>,
    free: Vec<u32>,
    small: VecDeque<u32>,
    main: VecDeque<u32>,
    small_bytes: usize,
    main_bytes: usize,
    small_objects: usize,
    main_objects: usize,
    /// Entries of each FIFO that are released: what a compaction would free.
    small_released: usize,
    main_released: usize,
    ghost: VecDeque<u64>,
    ghost_set: HashSet<u64>,
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

    /// Holds the value of a write whose batch is not durable yet, until `written` or `release`.
    pub fn hold_unwritten(&mut self, value: Bytes) -> ValueSlot {
        self.allocate(Object {
            key: SingleKey::empty(),
            value,
            frequency: 0,
            state: State::Unwritten,
        })
    }

    /// The value in `slot`, if any; a cached one counts as read again.
    pub fn get(&mut self, slot: Option<ValueSlot>) -> Option<Bytes> {
        let Some(slot) = slot else {
            self.misses += 1;
            return None;
        };
        let object = &mut self.slab[slot.index()];
        match object.state {
            State::Unwritten | State::UnwrittenInSmall | State::UnwrittenInMain => {}
            State::Small | State::Main => {
                object.frequency = (object.frequency + 1).min(MAX_FREQUENCY);
                self.hits += 1;
            }
            state => panic!("an index entry names a {state:?} value slot"),
        }
        Some(object.value.clone())
    }

    /// Holds `value`, a newer write of the key whose value is in `slot` (if any), until it is
    /// written: a cached object stops counting against the cache but keeps its place. `unwritten`
    /// says whether the key's index entry is, which its value must agree with.
    pub fn overwrite(&mut self, slot: &mut Option<ValueSlot>, unwritten: bool, value: Bytes) {
        let Some(held) = *slot else {
            assert!(!unwritten, "an unwritten index entry holds its value");
            *slot = Some(self.hold_unwritten(value));
            return;
        };
        let object = &mut self.slab[held.index()];
        assert_eq!(
            object.state.is_unwritten(),
            unwritten,
            "an index entry and its value agree"
        );
        let bytes = charge(object.key.as_slice(), &object.value);
        object.value = value;
        match object.state {
            State::Unwritten | State::UnwrittenInSmall | State::UnwrittenInMain => {}
            State::Small => {
                object.state = State::UnwrittenInSmall;
                self.small_bytes -= bytes;
                self.small_objects -= 1;
            }
            State::Main => {
                object.state = State::UnwrittenInMain;
                self.main_bytes -= bytes;
                self.main_objects -= 1;
            }
            state => panic!("an index entry names a {state:?} value slot"),
        }
    }

    /// The unwritten value in `slot`, of `key`, `value_len` bytes long, is now durable: it becomes
    /// a cached object, or leaves memory if it is larger than the cache. A key that was not cached
    /// before this write leaves memory too unless `cache_new` (LDC's quick demotion: writes do not
    /// put the same object in every replica's cache); one that was keeps its place, updated. Call
    /// `evict` afterwards.
    pub fn written(&mut self, key: &Bytes, slot: &mut Option<ValueSlot>, value_len: usize, cache_new: bool) {
        let held = slot.expect("a written value was held");
        let object = &mut self.slab[held.index()];
        assert_eq!(object.value.len(), value_len, "the segment holds the value written");
        let bytes = charge(key, &object.value);
        if bytes > self.capacity_bytes || (object.state == State::Unwritten && !cache_new) {
            self.release(slot, true);
            return;
        }
        match object.state {
            State::Unwritten => {
                object.key = SingleKey::from_slice(key);
                self.enqueue(held, bytes);
            }
            State::UnwrittenInSmall => {
                object.state = State::Small;
                self.small_bytes += bytes;
                self.small_objects += 1;
            }
            State::UnwrittenInMain => {
                object.state = State::Main;
                self.main_bytes += bytes;
                self.main_objects += 1;
            }
            state => panic!("a {state:?} value is written"),
        }
    }

    /// Caches `value`, read from `key`'s segment, in the empty `slot`. Call `evict` afterwards.
    pub fn admit(&mut self, key: &[u8], slot: &mut Option<ValueSlot>, value: Bytes) {
        assert!(slot.is_none(), "a value read from disk was not in memory");
        let bytes = charge(key, &value);
        if bytes > self.capacity_bytes {
            return;
        }
        let admitted = self.allocate(Object {
            key: SingleKey::from_slice(key),
            value,
            frequency: 0,
            state: State::Unwritten,
        });
        self.enqueue(admitted, bytes);
        *slot = Some(admitted);
    }

    /// Empties `slot`: its key was deleted. `unwritten` says whether the key's index entry was.
    pub fn release(&mut self, slot: &mut Option<ValueSlot>, unwritten: bool) {
        let Some(released) = slot.take() else {
            assert!(!unwritten, "an unwritten index entry holds its value");
            return;
        };
        let object = &mut self.slab[released.index()];
        assert_eq!(
            object.state.is_unwritten(),
            unwritten,
            "an index entry and its value agree"
        );
        let bytes = charge(object.key.as_slice(), &object.value);
        object.value = Bytes::new();
        object.key = SingleKey::empty();
        let in_small = match object.state {
            State::Unwritten => {
                self.free_slot(released);
                return;
            }
            State::Small => {
                self.small_bytes -= bytes;
                self.small_objects -= 1;
                true
            }
            State::UnwrittenInSmall => true,
            State::Main => {
                self.main_bytes -= bytes;
                self.main_objects -= 1;
                false
            }
            State::UnwrittenInMain => false,
            state => panic!("an index entry names a {state:?} value slot"),
        };
        if in_small {
            object.state = State::ReleasedInSmall;
            self.small_released += 1;
            if self.small_released > self.small.len() / 2 + COMPACT_AFTER_RELEASED {
                self.compact(false);
            }
        } else {
            object.state = State::ReleasedInMain;
            self.main_released += 1;
            if self.main_released > self.main.len() / 2 + COMPACT_AFTER_RELEASED {
                self.compact(true);
            }
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
            objects: self.small_objects + self.main_objects,
            bytes: self.small_bytes + self.main_bytes,
            hits: self.hits,
            misses: self.misses,
        }
    }

    fn allocate(&mut self, object: Object) -> ValueSlot {
        let index = match self.free.pop() {
            Some(index) => {
                let free = &mut self.slab[index as usize];
                assert_eq!(free.state, State::Free, "the free list holds free slots");
                *free = object;
                index
            }
            None => {
                let index = u32::try_from(self.slab.len()).expect("fewer than 2^32 - 1 values in memory");
                self.slab.push(object);
                index
            }
        };
        ValueSlot::of(index)
    }

    fn free_slot(&mut self, slot: ValueSlot) {
        let object = &mut self.slab[slot.index()];
        object.state = State::Free;
        object.value = Bytes::new();
        object.key = SingleKey::empty();
        self.free.push(slot.index() as u32);
    }

    /// Queues the held object in `slot`, `bytes` as charged: into main if its key left the
    /// cache recently, else into small.
    fn enqueue(&mut self, slot: ValueSlot, bytes: usize) {
        let object = &mut self.slab[slot.index()];
        let in_main = self
            .ghost_set
            .remove(&self.ghost_set.hasher().hash_one(object.key.as_slice()));
        let index = slot.index() as u32;
        if in_main {
            object.state = State::Main;
            self.main.push_back(index);
            self.main_bytes += bytes;
            self.main_objects += 1;
        } else {
            object.state = State::Small;
            self.small.push_back(index);
            self.small_bytes += bytes;
            self.small_objects += 1;
        }
    }

    /// Clears the index entry that names the cached object in `slot` and frees it.
    fn drop_object(&mut self, slots: &mut impl CacheSlots, slot: ValueSlot) {
        let key = &self.slab[slot.index()].key;
        let entry = slots.slot(key.as_slice()).expect("a cached object's key is indexed");
        assert_eq!(*entry, Some(slot), "a cached object is its key's value");
        *entry = None;
        self.free_slot(slot);
    }

    /// Pops the small (or main) FIFO up to its first cached object, freeing the released slots
    /// before it and letting the unwritten ones leave.
    fn pop_cached(&mut self, from_main: bool) -> Option<u32> {
        let (cached, unwritten, released) = if from_main {
            (State::Main, State::UnwrittenInMain, State::ReleasedInMain)
        } else {
            (State::Small, State::UnwrittenInSmall, State::ReleasedInSmall)
        };
        loop {
            let index = if from_main {
                self.main.pop_front()
            } else {
                self.small.pop_front()
            }?;
            let object = &mut self.slab[index as usize];
            match object.state {
                state if state == cached => return Some(index),
                state if state == unwritten => object.state = State::Unwritten,
                state if state == released => {
                    if from_main {
                        self.main_released -= 1;
                    } else {
                        self.small_released -= 1;
                    }
                    self.free_slot(ValueSlot::of(index));
                }
                state => panic!("a FIFO of {cached:?} objects holds a {state:?} slot"),
            }
        }
    }

    fn evict_from_small(&mut self, slots: &mut impl CacheSlots) {
        while let Some(index) = self.pop_cached(false) {
            let object = &mut self.slab[index as usize];
            let bytes = charge(object.key.as_slice(), &object.value);
            self.small_bytes -= bytes;
            self.small_objects -= 1;
            if object.frequency > 0 {
                object.frequency = 0;
                object.state = State::Main;
                self.main_bytes += bytes;
                self.main_objects += 1;
                self.main.push_back(index);
                if self.small_bytes + self.main_bytes <= self.capacity_bytes {
                    return;
                }
            } else {
                let ghost = self.ghost_set.hasher().hash_one(object.key.as_slice());
                self.drop_object(slots, ValueSlot::of(index));
                self.remember_ghost(ghost);
                return;
            }
        }
    }

    fn evict_from_main(&mut self, slots: &mut impl CacheSlots) {
        while let Some(index) = self.pop_cached(true) {
            let object = &mut self.slab[index as usize];
            if object.frequency > 0 {
                object.frequency -= 1;
                self.main.push_back(index);
            } else {
                self.main_bytes -= charge(object.key.as_slice(), &object.value);
                self.main_objects -= 1;
                self.drop_object(slots, ValueSlot::of(index));
                return;
            }
        }
    }

    /// Frees the released objects of the small (or main) FIFO, keeping the order of the rest.
    fn compact(&mut self, main: bool) {
        let (mut fifo, released) = if main {
            self.main_released = 0;
            (std::mem::take(&mut self.main), State::ReleasedInMain)
        } else {
            self.small_released = 0;
            (std::mem::take(&mut self.small), State::ReleasedInSmall)
        };
        fifo.retain(|&index| self.keep_queued(index, released));
        if main {
            self.main = fifo;
        } else {
            self.small = fifo;
        }
    }

    /// Whether a FIFO keeps `index`; frees it if it was `released`.
    fn keep_queued(&mut self, index: u32, released: State) -> bool {
        if self.slab[index as usize].state != released {
            return true;
        }
        self.free_slot(ValueSlot::of(index));
        false
    }

    fn remember_ghost(&mut self, hash: u64) {
        if self.ghost_set.insert(hash) {
            self.ghost.push_back(hash);
        }
        // As many ghosts as the main queue holds objects, as the paper sizes it.
        while self.ghost.len() > self.main_objects.max(16) {
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

    /// An index of keys to value slots, as the store keeps one.
    #[derive(Default)]
    struct Slots(HashMap<Bytes, Option<ValueSlot>>);

    impl CacheSlots for Slots {
        fn slot(&mut self, key: &[u8]) -> Option<&mut Option<ValueSlot>> {
            self.0.get_mut(key)
        }
    }

    impl Slots {
        /// Writes `value` as the store does: held unwritten, then written and cached.
        fn write(&mut self, cache: &mut ObjectCache, key: Bytes, value: Bytes) {
            self.hold(cache, key.clone(), value);
            self.written(cache, &key);
        }
        fn hold(&mut self, cache: &mut ObjectCache, key: Bytes, value: Bytes) {
            let slot = self.0.entry(key).or_default();
            let unwritten = slot.is_some_and(|held| cache.slab[held.index()].state.is_unwritten());
            cache.overwrite(slot, unwritten, value.clone());
            assert_eq!(cache.get(*slot), Some(value), "an unwritten value is served");
        }
        fn written(&mut self, cache: &mut ObjectCache, key: &Bytes) {
            let slot = self.0.get_mut(key).unwrap();
            let value_len = cache.slab[slot.unwrap().index()].value.len();
            cache.written(key, slot, value_len, true);
            cache.evict(self);
        }
        fn delete(&mut self, cache: &mut ObjectCache, key: &Bytes) {
            let mut slot = self.0.remove(key).unwrap();
            cache.release(&mut slot, false);
        }
        fn get(&mut self, cache: &mut ObjectCache, key: &Bytes) -> Option<Bytes> {
            cache.get(*self.0.get(key)?)
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
        let mut c = ObjectCache::new(20_000);
        let mut s = Slots::default();
        for i in 0..1_000 {
            s.write(&mut c, key(i), Bytes::from(vec![i as u8; 50]));
            assert!(c.stats().bytes <= 20_000);
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
        let mut c = ObjectCache::new(20 * (OBJECT_OVERHEAD_BYTES + 6 + 10));
        let mut s = Slots::default();
        for i in 0..10 {
            s.write(&mut c, key(i), Bytes::from(vec![0; 10]));
        }
        for _ in 0..3 {
            for i in 0..10 {
                s.get(&mut c, &key(i));
            }
        }
        for i in 100..1_000 {
            s.write(&mut c, key(i), Bytes::from(vec![0; 10]));
            for w in 0..10 {
                s.get(&mut c, &key(w));
            }
        }
        let kept = (0..10).filter(|i| s.held(&key(*i))).count();
        assert_eq!(kept, 10, "the read-again keys survive 900 one-time inserts");
    }

    #[test]
    fn replacing_and_releasing_keep_the_byte_count_exact() {
        let mut c = ObjectCache::new(1_000_000);
        let mut s = Slots::default();
        s.write(&mut c, key(1), Bytes::from(vec![0; 100]));
        s.write(&mut c, key(1), Bytes::from(vec![0; 10]));
        assert_eq!(c.stats().bytes, charge(&key(1), &[0; 10]));
        c.release(s.0.get_mut(&key(1)).unwrap(), false);
        assert_eq!(c.stats().bytes, 0);
        assert_eq!(s.get(&mut c, &key(1)), None);
        s.write(&mut c, key(2), Bytes::from(vec![0; 2_000_000]));
        assert_eq!(c.stats().objects, 0, "an object larger than the cache is not cached");
        assert!(!s.held(&key(2)));
    }

    #[test]
    fn a_value_read_from_disk_is_admitted_into_an_empty_slot() {
        let mut c = ObjectCache::new(1_000_000);
        let mut slot = None;
        assert_eq!(c.get(slot), None);
        c.admit(b"k", &mut slot, Bytes::from_static(b"v"));
        assert_eq!(c.get(slot), Some(Bytes::from_static(b"v")));
        assert_eq!(
            c.stats(),
            CacheStats {
                objects: 1,
                bytes: charge(b"k", b"v"),
                hits: 1,
                misses: 1
            }
        );
    }

    #[test]
    fn an_overwritten_object_is_not_evicted_before_it_is_written_and_keeps_its_place() {
        let mut c = ObjectCache::new(10 * (OBJECT_OVERHEAD_BYTES + 6 + 10));
        let mut s = Slots::default();
        s.write(&mut c, key(0), Bytes::from(vec![0; 10]));
        s.get(&mut c, &key(0));
        s.hold(&mut c, key(0), Bytes::from(vec![1; 10]));
        for i in 1..100 {
            s.write(&mut c, key(i), Bytes::from(vec![0; 10]));
        }
        assert_eq!(
            s.get(&mut c, &key(0)),
            Some(Bytes::from(vec![1; 10])),
            "unwritten values stay"
        );
        s.written(&mut c, &key(0));
        assert!(c.stats().bytes <= 10 * (OBJECT_OVERHEAD_BYTES + 6 + 10));
        assert_eq!(s.get(&mut c, &key(0)), Some(Bytes::from(vec![1; 10])));
        s.hold(&mut c, key(1), Bytes::from(vec![2; 10]));
        s.written(&mut c, &key(1));
        s.get(&mut c, &key(1));
        s.hold(&mut c, key(1), Bytes::from(vec![3; 10]));
        s.written(&mut c, &key(1));
        assert_eq!(s.get(&mut c, &key(1)), Some(Bytes::from(vec![3; 10])));
    }

    #[test]
    fn a_write_not_to_be_cached_leaves_memory_once_written_unless_its_key_was_cached() {
        let mut c = ObjectCache::new(1 << 20);
        let mut s = Slots::default();
        s.write(&mut c, key(0), Bytes::from_static(b"cached"));
        for (k, value) in [(0, "updated"), (1, "not cached")] {
            s.hold(&mut c, key(k), Bytes::from(value));
            let slot = s.0.get_mut(&key(k)).unwrap();
            c.written(&key(k), slot, value.len(), false);
        }
        assert_eq!(
            s.get(&mut c, &key(0)),
            Some(Bytes::from("updated")),
            "kept in its place"
        );
        assert_eq!(s.get(&mut c, &key(1)), None, "demoted at once");
        assert_eq!(c.stats().objects, 1);
    }

    #[test]
    fn deletes_in_a_cache_that_never_fills_keep_its_memory_bounded() {
        let mut c = ObjectCache::new(1 << 30);
        let mut s = Slots::default();
        for round in 0..200u32 {
            for i in 0..100 {
                s.write(&mut c, key(i), Bytes::from(round.to_le_bytes().to_vec()));
                if round < 199 {
                    s.delete(&mut c, &key(i));
                }
            }
        }
        assert_eq!(c.stats().objects, 100);
        assert!(
            c.small.len() + c.main.len() <= 3 * 100 + 2 * COMPACT_AFTER_RELEASED,
            "{} queued for 100 objects after 20,000 writes",
            c.small.len() + c.main.len()
        );
        assert!(
            c.slab.len() <= 3 * 100 + 2 * COMPACT_AFTER_RELEASED,
            "{} slots",
            c.slab.len()
        );
        for i in 0..100 {
            assert_eq!(s.get(&mut c, &key(i)), Some(Bytes::from(199u32.to_le_bytes().to_vec())));
        }
    }
}
