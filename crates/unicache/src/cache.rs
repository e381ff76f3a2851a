//! A deterministic item cache: items (byte strings) ↔ slot numbers, with LRU, LFU or LeCaR
//! eviction, bounded by an item count and a byte budget.
//!
//! Determinism is the whole point: every replica feeds the same items in the same order (the
//! committed log) and must end up with the same slots. So the cache has no clock but an access
//! counter, hash maps are used only for lookups (never iterated), ties are broken by recency,
//! LeCaR's coin comes from a seed the caller derives from the log index, and LeCaR's weights are
//! fixed-point integers rather than floats.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::str::FromStr;

use bytes::Bytes;

use crate::fixed;
use crate::varint::{self, Reader};
use crate::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    Lru,
    Lfu,
    /// Regret-weighted choice between LRU and LFU with eviction histories (Vietri et al.,
    /// HotStorage 2018), as the UniCache paper uses.
    LeCaR,
}

impl Policy {
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Lfu => "lfu",
            Policy::LeCaR => "lecar",
        }
    }

    fn code(&self) -> u8 {
        match self {
            Policy::Lru => 1,
            Policy::Lfu => 2,
            Policy::LeCaR => 3,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Policy, String> {
        match s.to_ascii_lowercase().as_str() {
            "lru" => Ok(Policy::Lru),
            "lfu" => Ok(Policy::Lfu),
            "lecar" => Ok(Policy::LeCaR),
            other => Err(format!("unknown cache policy '{other}'; use lru, lfu or lecar")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    pub policy: Policy,
    /// Most items held at once.
    pub max_items: u32,
    /// Most bytes of items held at once.
    pub max_bytes: usize,
}

impl CacheConfig {
    /// Items larger than this are never cached: one item may take at most 1/16 of the budget.
    pub fn max_item_bytes(&self) -> usize {
        (self.max_bytes / 16).max(1)
    }

    /// Identifies the settings; replicas with different settings build different caches.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv::new();
        h.write(&[self.policy.code()]);
        h.write(&self.max_items.to_le_bytes());
        h.write(&(self.max_bytes as u64).to_le_bytes());
        h.finish()
    }
}

/// FNV-1a, for fingerprints and digests that must be identical on every replica.
pub struct Fnv(u64);

impl Fnv {
    pub fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv::new()
    }
}

/// The item hash: 8 bytes at a time, little-endian by definition, so it is the same on every
/// replica and platform (LeCaR's histories, and so its choices, depend on it). It is computed
/// once per access and keys every lookup.
pub fn item_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (bytes.len() as u64) ^ 0x243F_6A88_85A3_08D3;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let v = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        h = (h ^ v).wrapping_mul(K).rotate_left(31);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(last)).wrapping_mul(K).rotate_left(31);
    }
    splitmix(h)
}

/// Hashes a key that already is a hash.
#[derive(Default, Clone, Copy)]
struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type HashKeyed<V> = HashMap<u64, V, BuildHasherDefault<PassThrough>>;

const NIL: u32 = u32::MAX;

/// Previous and next slot in a doubly linked list threaded through the slots.
#[derive(Debug, Clone, Copy)]
struct Links {
    prev: u32,
    next: u32,
}

const UNLINKED: Links = Links { prev: NIL, next: NIL };

/// A list's ends: `head` is the eviction end (least recent).
#[derive(Debug, Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
}

const EMPTY: Ends = Ends { head: NIL, tail: NIL };

#[derive(Debug, Clone)]
struct Slot {
    item: Bytes,
    hash: u64,
    last_used: u64,
    frequency: u64,
    /// Place in the recency list (LRU and LeCaR).
    lru: Links,
    /// Place in its frequency bucket's list (LFU and LeCaR).
    lfu: Links,
}

/// Items evicted by one policy, remembered by hash (with the access count at eviction) so that
/// a later miss on them counts as that policy's regret. FIFO-bounded; entries removed early stay
/// in `order` until they reach the front.
#[derive(Debug, Clone, Default)]
struct History {
    order: VecDeque<(u64, u64)>,
    members: HashKeyed<u64>,
}

impl History {
    fn add(&mut self, hash: u64, at: u64, capacity: usize) {
        self.members.insert(hash, at);
        self.order.push_back((hash, at));
        while self.members.len() > capacity || self.order.len() > 2 * capacity.max(1) {
            let Some((old, t)) = self.order.pop_front() else { break };
            if self.members.get(&old) == Some(&t) {
                self.members.remove(&old);
            }
        }
    }

    fn take(&mut self, hash: u64) -> Option<u64> {
        self.members.remove(&hash)
    }

    fn is_live(&self, hash: u64, at: u64) -> bool {
        self.members.get(&hash) == Some(&at)
    }
}

/// LeCaR learning rate λ = 0.45 and ln(1/0.005) (the discount reaches 0.005 after one cache
/// size of accesses), in Q32.
const LEARNING_RATE: u64 = 1_932_735_283;
const LN_200: u64 = 22_756_099_813;
/// Weights stay within [1%, 99%] so the losing policy can win back.
const MIN_WEIGHT: u64 = fixed::ONE / 100;

#[derive(Debug, Clone)]
struct LeCaR {
    /// Probability of evicting by LRU (LFU gets the rest), Q32.
    weight_lru: u64,
    evicted_by_lru: History,
    evicted_by_lfu: History,
}

/// What an access did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Hit(u32),
    Inserted(u32),
    /// Not cached: too large, or its hash collides with a different cached item.
    Skipped,
}

/// O(1) per access: a hash index, a recency list, and frequency buckets each holding their
/// items least recent first (so LFU breaks ties toward the least recent, as LRU would).
#[derive(Debug, Clone)]
pub struct ItemCache {
    config: CacheConfig,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    index: HashKeyed<u32>,
    len: usize,
    bytes: usize,
    clock: u64,
    recency: Ends,
    /// frequency → its bucket's list; the first key is the least frequency present.
    buckets: BTreeMap<u64, Ends>,
    lecar: LeCaR,
}

/// SplitMix64's finalizer: spreads every bit of `z` over the whole word. Replicas rely on it
/// giving the same value everywhere and in every version (this cache's policy, LDC's owners).
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Which of a slot's two link sets a list uses.
#[derive(Clone, Copy)]
enum List {
    Recency,
    Frequency,
}

impl ItemCache {
    pub fn new(config: CacheConfig) -> ItemCache {
        assert!(config.max_items > 0 && config.max_bytes > 0, "an empty cache");
        ItemCache {
            config,
            slots: Vec::new(),
            free: Vec::new(),
            index: HashKeyed::default(),
            len: 0,
            bytes: 0,
            clock: 0,
            recency: EMPTY,
            buckets: BTreeMap::new(),
            lecar: LeCaR {
                weight_lru: fixed::ONE / 2,
                evicted_by_lru: History::default(),
                evicted_by_lfu: History::default(),
            },
        }
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of items held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The slot holding `item`, without touching it (encoding must not change the cache).
    pub fn lookup(&self, item: &[u8]) -> Option<u32> {
        let slot = *self.index.get(&item_hash(item))?;
        (self.slot(slot).item.as_ref() == item).then_some(slot)
    }

    /// The item in `slot`.
    pub fn get(&self, slot: u32) -> Option<&Bytes> {
        self.slots.get(slot as usize)?.as_ref().map(|s| &s.item)
    }

    fn slot(&self, slot: u32) -> &Slot {
        self.slots[slot as usize].as_ref().expect("linked slot is occupied")
    }

    fn slot_mut(&mut self, slot: u32) -> &mut Slot {
        self.slots[slot as usize].as_mut().expect("linked slot is occupied")
    }

    fn links(&mut self, slot: u32, list: List) -> &mut Links {
        let s = self.slot_mut(slot);
        match list {
            List::Recency => &mut s.lru,
            List::Frequency => &mut s.lfu,
        }
    }

    fn list_remove(&mut self, ends: &mut Ends, slot: u32, list: List) {
        let Links { prev, next } = std::mem::replace(self.links(slot, list), UNLINKED);
        if prev == NIL {
            ends.head = next;
        } else {
            self.links(prev, list).next = next;
        }
        if next == NIL {
            ends.tail = prev;
        } else {
            self.links(next, list).prev = prev;
        }
    }

    fn list_push(&mut self, ends: &mut Ends, slot: u32, list: List) {
        *self.links(slot, list) = Links {
            prev: ends.tail,
            next: NIL,
        };
        if ends.tail == NIL {
            ends.head = slot;
        } else {
            self.links(ends.tail, list).next = slot;
        }
        ends.tail = slot;
    }

    fn uses_recency(&self) -> bool {
        self.config.policy != Policy::Lfu
    }

    fn uses_frequency(&self) -> bool {
        self.config.policy != Policy::Lru
    }

    fn unlink(&mut self, slot: u32) {
        if self.uses_recency() {
            let mut ends = self.recency;
            self.list_remove(&mut ends, slot, List::Recency);
            self.recency = ends;
        }
        if self.uses_frequency() {
            let frequency = self.slot(slot).frequency;
            let mut ends = self.buckets[&frequency];
            self.list_remove(&mut ends, slot, List::Frequency);
            if ends.head == NIL {
                self.buckets.remove(&frequency);
            } else {
                self.buckets.insert(frequency, ends);
            }
        }
    }

    /// Puts `slot` at the most recent end of its lists.
    fn link(&mut self, slot: u32) {
        if self.uses_recency() {
            let mut ends = self.recency;
            self.list_push(&mut ends, slot, List::Recency);
            self.recency = ends;
        }
        if self.uses_frequency() {
            let frequency = self.slot(slot).frequency;
            let mut ends = self.buckets.get(&frequency).copied().unwrap_or(EMPTY);
            self.list_push(&mut ends, slot, List::Frequency);
            self.buckets.insert(frequency, ends);
        }
    }

    /// Feeds one item of the committed log. `seed` must be the same on every replica for the
    /// same access (derive it from the log index and the item's position).
    pub fn access(&mut self, item: &Bytes, seed: u64) -> Access {
        self.clock += 1;
        let now = self.clock;
        let hash = item_hash(item);
        if let Some(&slot) = self.index.get(&hash) {
            if self.slot(slot).item != item {
                return Access::Skipped;
            }
            self.unlink(slot);
            let s = self.slot_mut(slot);
            s.last_used = now;
            s.frequency += 1;
            self.link(slot);
            return Access::Hit(slot);
        }
        if item.len() > self.config.max_item_bytes() {
            return Access::Skipped;
        }
        if self.config.policy == Policy::LeCaR {
            self.learn_from_miss(hash, now);
        }
        while self.len >= self.config.max_items as usize || self.bytes + item.len() > self.config.max_bytes {
            self.evict(seed);
        }
        // A copy: the caller's bytes may be a slice of a large buffer (a whole log entry) that
        // the cache must not keep alive.
        let item = Bytes::copy_from_slice(item);
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        self.len += 1;
        self.bytes += item.len();
        self.index.insert(hash, slot);
        self.slots[slot as usize] = Some(Slot {
            item,
            hash,
            last_used: now,
            frequency: 1,
            lru: UNLINKED,
            lfu: UNLINKED,
        });
        self.link(slot);
        Access::Inserted(slot)
    }

    /// LeCaR: a miss on an item one policy evicted is that policy's regret; shift weight to the
    /// other policy, more the more recent the eviction.
    fn learn_from_miss(&mut self, hash: u64, now: u64) {
        let (evicted_at, lru_regret) = match self.lecar.evicted_by_lru.take(hash) {
            Some(at) => (at, true),
            None => match self.lecar.evicted_by_lfu.take(hash) {
                Some(at) => (at, false),
                None => return,
            },
        };
        let age = now - evicted_at;
        let exponent = (u128::from(LN_200) * u128::from(age)) / u128::from(self.config.max_items);
        let discount = fixed::exp_neg(exponent.min(u128::from(u64::MAX)) as u64);
        let boost = fixed::exp(fixed::mul(LEARNING_RATE, discount));
        let (mut w_lru, mut w_lfu) = (self.lecar.weight_lru, fixed::ONE - self.lecar.weight_lru);
        if lru_regret {
            w_lfu = fixed::mul(w_lfu, boost);
        } else {
            w_lru = fixed::mul(w_lru, boost);
        }
        self.lecar.weight_lru = fixed::div(w_lru, w_lru + w_lfu).clamp(MIN_WEIGHT, fixed::ONE - MIN_WEIGHT);
    }

    fn evict(&mut self, seed: u64) {
        let by_lru = match self.config.policy {
            Policy::Lru => true,
            Policy::Lfu => false,
            Policy::LeCaR => (splitmix(seed ^ splitmix(self.clock)) >> 32) < self.lecar.weight_lru,
        };
        let victim = if by_lru {
            self.recency.head
        } else {
            self.buckets
                .values()
                .next()
                .expect("a full cache has a least frequent item")
                .head
        };
        assert_ne!(victim, NIL, "a full cache has a victim");
        self.unlink(victim);
        let slot = self.slots[victim as usize].take().expect("victim slot is occupied");
        self.index.remove(&slot.hash);
        self.len -= 1;
        self.bytes -= slot.item.len();
        self.free.push(victim);
        if self.config.policy == Policy::LeCaR {
            let capacity = self.config.max_items as usize;
            let history = if by_lru {
                &mut self.lecar.evicted_by_lru
            } else {
                &mut self.lecar.evicted_by_lfu
            };
            history.add(slot.hash, self.clock, capacity);
        }
    }

    /// The whole state in a canonical byte form (for snapshots and for comparing replicas).
    /// List order need not be stored: it follows from each item's last use.
    pub fn serialize(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&self.config.fingerprint().to_le_bytes());
        varint::put(out, self.clock);
        varint::put(out, self.lecar.weight_lru);
        varint::put(out, self.slots.len() as u64);
        for slot in &self.slots {
            match slot {
                None => out.push(0),
                Some(s) => {
                    out.push(1);
                    varint::put_bytes(out, &s.item);
                    varint::put(out, s.last_used);
                    varint::put(out, s.frequency);
                }
            }
        }
        varint::put(out, self.free.len() as u64);
        for slot in &self.free {
            varint::put(out, u64::from(*slot));
        }
        for history in [&self.lecar.evicted_by_lru, &self.lecar.evicted_by_lfu] {
            varint::put(out, history.order.len() as u64);
            for (hash, at) in &history.order {
                out.push(u8::from(history.is_live(*hash, *at)));
                out.extend_from_slice(&hash.to_le_bytes());
                varint::put(out, *at);
            }
        }
    }

    /// Rebuilds a cache serialized by a replica with the same `config`.
    pub fn deserialize(config: CacheConfig, reader: &mut Reader<'_>) -> Result<ItemCache, Error> {
        if reader.take(SNAPSHOT_MAGIC.len())? != SNAPSHOT_MAGIC {
            return Err(Error::Malformed("not a UniCache cache snapshot"));
        }
        let fingerprint = u64::from_le_bytes(reader.take(8)?.try_into().expect("8 bytes"));
        if fingerprint != config.fingerprint() {
            return Err(Error::SettingsDiffer);
        }
        let mut cache = ItemCache::new(config);
        cache.clock = reader.varint()?;
        cache.lecar.weight_lru = reader.varint()?;
        let slot_count = reader.varint()?;
        if slot_count > u64::from(config.max_items) {
            return Err(Error::Malformed("more slots than the cache holds"));
        }
        let mut by_last_use = Vec::new();
        for slot in 0..slot_count as u32 {
            match reader.u8()? {
                0 => cache.slots.push(None),
                1 => {
                    let item = Bytes::copy_from_slice(reader.bytes()?);
                    let last_used = reader.varint()?;
                    let frequency = reader.varint()?;
                    let hash = item_hash(&item);
                    if last_used > cache.clock || frequency == 0 || cache.index.insert(hash, slot).is_some() {
                        return Err(Error::Malformed("inconsistent cache slot"));
                    }
                    cache.len += 1;
                    cache.bytes += item.len();
                    cache.slots.push(Some(Slot {
                        item,
                        hash,
                        last_used,
                        frequency,
                        lru: UNLINKED,
                        lfu: UNLINKED,
                    }));
                    by_last_use.push((last_used, slot));
                }
                _ => return Err(Error::Malformed("bad slot tag")),
            }
        }
        by_last_use.sort_unstable();
        if by_last_use.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(Error::Malformed("two items with the same last use"));
        }
        for (_, slot) in by_last_use {
            cache.link(slot);
        }
        let free_count = reader.varint()?;
        if free_count > slot_count {
            return Err(Error::Malformed("more free slots than slots"));
        }
        for _ in 0..free_count {
            let slot = u32::try_from(reader.varint()?).map_err(|_| Error::Malformed("slot out of range"))?;
            if cache.slots.get(slot as usize).is_none_or(Option::is_some) {
                return Err(Error::Malformed("free slot is occupied or out of range"));
            }
            cache.free.push(slot);
        }
        if cache.free.len() + cache.len != cache.slots.len() || cache.bytes > config.max_bytes {
            return Err(Error::Malformed("cache accounting does not add up"));
        }
        for which in 0..2 {
            let count = reader.varint()?;
            for _ in 0..count {
                let live = reader.u8()? == 1;
                let hash = u64::from_le_bytes(reader.take(8)?.try_into().expect("8 bytes"));
                let at = reader.varint()?;
                let history = if which == 0 {
                    &mut cache.lecar.evicted_by_lru
                } else {
                    &mut cache.lecar.evicted_by_lfu
                };
                if live {
                    history.members.insert(hash, at);
                }
                history.order.push_back((hash, at));
            }
        }
        Ok(cache)
    }

    /// A digest of the canonical state: equal caches have equal digests.
    pub fn digest(&self) -> u64 {
        let mut out = Vec::with_capacity(self.bytes + self.slots.len() * 8 + 64);
        self.serialize(&mut out);
        let mut h = Fnv::new();
        h.write(&out);
        h.finish()
    }
}

const SNAPSHOT_MAGIC: &[u8; 4] = b"UCC2";

#[cfg(test)]
mod tests {
    use super::*;

    fn config(policy: Policy, max_items: u32) -> CacheConfig {
        CacheConfig {
            policy,
            max_items,
            max_bytes: 1 << 20,
        }
    }

    fn item(n: u64) -> Bytes {
        Bytes::from(format!("item-{n}"))
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut c = ItemCache::new(config(Policy::Lru, 3));
        for n in [1, 2, 3, 1, 4] {
            c.access(&item(n), n);
        }
        assert!(c.lookup(b"item-2").is_none(), "2 was least recent");
        assert!(c.lookup(b"item-1").is_some() && c.lookup(b"item-4").is_some());
    }

    #[test]
    fn lfu_evicts_the_least_frequently_used() {
        let mut c = ItemCache::new(config(Policy::Lfu, 3));
        for n in [1, 1, 2, 2, 3, 4] {
            c.access(&item(n), n);
        }
        assert!(
            c.lookup(b"item-3").is_none(),
            "3 was used once and is oldest among the once-used"
        );
        assert!(c.lookup(b"item-1").is_some() && c.lookup(b"item-2").is_some());
    }

    #[test]
    fn lecar_learns_from_regret() {
        // A scan pattern that LFU handles and LRU does not: a hot set plus a stream of one-offs.
        let mut c = ItemCache::new(config(Policy::LeCaR, 20));
        let start = c.lecar.weight_lru;
        for round in 0..2_000u64 {
            c.access(&item(round % 10), round);
            c.access(&item(1_000 + round), round);
            c.access(&item(100 + round % 15), round);
        }
        assert_ne!(c.lecar.weight_lru, start, "LeCaR never adjusted its weights");
    }

    #[test]
    fn byte_budget_is_respected_and_large_items_are_skipped() {
        let mut c = ItemCache::new(CacheConfig {
            policy: Policy::Lru,
            max_items: 1000,
            max_bytes: 1600,
        });
        assert_eq!(c.access(&Bytes::from(vec![1u8; 101]), 0), Access::Skipped);
        for n in 0..100u8 {
            c.access(&Bytes::from(vec![n; 100]), u64::from(n));
            assert!(c.bytes() <= 1600);
        }
        assert_eq!(c.len(), 16);
    }

    #[test]
    fn same_accesses_same_cache_and_snapshots_restore_exactly() {
        for policy in [Policy::Lru, Policy::Lfu, Policy::LeCaR] {
            let cfg = config(policy, 50);
            let mut a = ItemCache::new(cfg);
            let mut b = ItemCache::new(cfg);
            let mut x = 7u64;
            for i in 0..5_000u64 {
                x = splitmix(x);
                let it = item(x % 120);
                a.access(&it, i);
                b.access(&it, i);
            }
            assert_eq!(a.digest(), b.digest(), "{policy}");
            let mut out = Vec::new();
            a.serialize(&mut out);
            let mut restored = ItemCache::deserialize(cfg, &mut Reader::new(&out)).unwrap();
            assert_eq!(restored.digest(), a.digest(), "{policy}");
            for i in 5_000..6_000u64 {
                x = splitmix(x);
                let it = item(x % 120);
                assert_eq!(restored.access(&it, i), a.access(&it, i), "{policy} after restore");
            }
            assert!(ItemCache::deserialize(config(policy, 51), &mut Reader::new(&out)).is_err());
            for cut in (0..out.len()).step_by(7) {
                assert!(ItemCache::deserialize(cfg, &mut Reader::new(&out[..cut])).is_err());
            }
        }
    }
}
