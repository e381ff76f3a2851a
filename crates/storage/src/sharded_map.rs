//! A hash map split into shards by its keys' hash, so that growing never rehashes more than one
//! shard at once. One table of millions of keys doubles in one step — every key rehashed and
//! moved, seconds on a small machine, on the raft loop that applies the write (seen: 7.3 million
//! keys stalled all three nodes together, long enough for three elections in a row). A shard
//! holds 1/256 of the keys, so its doubling takes a few ms, and the shards reach their sizes at
//! different writes.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use foldhash::HashMap;

const SHARD_BITS: u32 = 8;
const SHARDS: usize = 1 << SHARD_BITS;

#[derive(Debug)]
pub struct ShardedMap<K, V> {
    shards: Box<[HashMap<K, V>]>,
    len: usize,
}

impl<K, V> Default for ShardedMap<K, V> {
    fn default() -> Self {
        ShardedMap {
            shards: (0..SHARDS).map(|_| HashMap::default()).collect(),
            len: 0,
        }
    }
}

/// The shard of a key: from a hash with a fixed seed, independent of the seeds the shards'
/// tables hash with (so a shard's keys still spread over its table).
fn shard_of<Q: Hash + ?Sized>(key: &Q) -> usize {
    const SHARD_SEED: u64 = 0x5ca1_ab1e_d00d_f00d;
    (foldhash::fast::FixedState::with_seed(SHARD_SEED).hash_one(key) >> (u64::BITS - SHARD_BITS)) as usize
}

impl<K: Hash + Eq, V> ShardedMap<K, V> {
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[shard_of(key)].get(key)
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[shard_of(key)].get_mut(key)
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let old = self.shards[shard_of(&key)].insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let old = self.shards[shard_of(key)].remove(key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Makes room for `keys` at once, each in its shard.
    pub fn reserve_for<'a, Q>(&mut self, keys: impl IntoIterator<Item = &'a Q>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized + 'a,
    {
        let mut per_shard = vec![0usize; SHARDS];
        for key in keys {
            per_shard[shard_of(key)] += 1;
        }
        for (shard, more) in self.shards.iter_mut().zip(per_shard) {
            shard.reserve(more);
        }
    }
}

impl<K, V> ShardedMap<K, V> {
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes the shards' tables take as hashbrown sizes them: a power of two of buckets, 8 per
    /// 7 entries of capacity, and a control byte per bucket.
    pub fn allocated_bytes(&self) -> usize {
        self.shards
            .iter()
            .filter(|table| table.capacity() > 0)
            .map(|table| {
                let buckets = (table.capacity() * 8).div_ceil(7).next_power_of_two();
                buckets * (std::mem::size_of::<(K, V)>() + 1)
            })
            .sum()
    }

    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.shards.iter().flat_map(|shard| shard.iter())
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.shards.iter().flat_map(|shard| shard.keys())
    }

    pub fn into_entries(self) -> impl Iterator<Item = (K, V)> {
        self.shards.into_vec().into_iter().flat_map(|shard| shard.into_iter())
    }

    pub fn into_values(self) -> impl Iterator<Item = V> {
        self.into_entries().map(|(_, value)| value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_one_map_and_spreads_its_keys() {
        let mut map: ShardedMap<Vec<u8>, u64> = ShardedMap::default();
        let key = |i: u64| format!("key{i}").into_bytes();
        map.reserve_for((0..1_000).map(key).collect::<Vec<_>>().iter().map(Vec::as_slice));
        for i in 0..100_000 {
            assert_eq!(map.insert(key(i), i), None);
        }
        assert_eq!(map.insert(key(7), 70), Some(7));
        assert_eq!(map.len(), 100_000);
        assert_eq!(map.get(&key(7)[..]), Some(&70));
        *map.get_mut(&key(8)[..]).unwrap() += 1;
        assert_eq!(map.get(&key(8)[..]), Some(&9));
        assert_eq!(map.remove(&key(9)[..]), Some(9));
        assert_eq!(map.remove(&key(9)[..]), None);
        assert_eq!(map.len(), 99_999);
        assert_eq!(map.iter().count(), 99_999);
        assert_eq!(map.keys().count(), 99_999);
        let largest = map.shards.iter().map(|shard| shard.len()).max().unwrap();
        assert!(largest < 2 * 100_000 / SHARDS, "one shard holds {largest} keys");
        let mut values: Vec<u64> = map.into_values().collect();
        values.sort_unstable();
        assert_eq!(values.len(), 99_999);
        // Keys 7 (overwritten) and 70 hold 70; nothing holds 7 any more.
        assert_eq!(values.iter().filter(|v| **v == 70).count(), 2);
        assert!(values.binary_search(&7).is_err());
    }
}
