//! A hash map from keys that also answers prefix scans over the keys a predicate selects. Point
//! lookups — every read and write — cost one hash; only keys that can be scanned (for `kv`, the
//! fields of hashes) pay for an ordered set beside it.

use std::collections::BTreeSet;
use std::ops::Bound;

use bytes::Bytes;
use foldhash::HashMap;

/// Which keys prefix scans must find. A scan is asked only for prefixes of such keys.
pub type Scannable = fn(&[u8]) -> bool;

pub fn every_key(_: &[u8]) -> bool {
    true
}

#[derive(Debug)]
pub struct ScanMap<V> {
    map: HashMap<Bytes, V>,
    ordered: BTreeSet<Bytes>,
    scannable: Scannable,
}

impl<V> ScanMap<V> {
    pub fn new(scannable: Scannable) -> Self {
        ScanMap {
            map: HashMap::default(),
            ordered: BTreeSet::new(),
            scannable,
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&V> {
        self.map.get(key)
    }

    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut V> {
        self.map.get_mut(key)
    }

    pub fn get_key_value(&self, key: &[u8]) -> Option<(&Bytes, &V)> {
        self.map.get_key_value(key)
    }

    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.map.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn insert(&mut self, key: Bytes, value: V) -> Option<V> {
        let old = self.map.insert(key.clone(), value);
        if old.is_none() && (self.scannable)(&key) {
            self.ordered.insert(key);
        }
        old
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<V> {
        let old = self.map.remove(key);
        if old.is_some() && (self.scannable)(key) {
            self.ordered.remove(key);
        }
        old
    }

    /// Entries whose key starts with `prefix`, in key order.
    pub fn prefix<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = (&'a Bytes, &'a V)> + 'a {
        debug_assert!(
            (self.scannable)(prefix),
            "scans are asked only for prefixes of scannable keys"
        );
        self.ordered
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |key| key.starts_with(prefix))
            .map(|key| (key, &self.map[key]))
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Bytes, &V)> {
        self.map.iter()
    }

    /// Empties the map, returning its entries in no particular order.
    pub fn take_all(&mut self) -> Vec<(Bytes, V)> {
        self.ordered.clear();
        self.map.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_see_exactly_the_scannable_keys_present() {
        let mut m = ScanMap::new(|k| k.first() == Some(&b'h'));
        for key in ["h1a", "h1b", "h2a", "s1", "h1c"] {
            m.insert(Bytes::from(key), key.len());
        }
        m.insert(Bytes::from("h1a"), 9);
        m.remove(b"h1b");
        m.remove(b"s1");
        let scanned: Vec<_> = m.prefix(b"h1").map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(scanned, vec![(Bytes::from("h1a"), 9), (Bytes::from("h1c"), 3)]);
        assert_eq!(m.len(), 3);
        assert_eq!(m.take_all().len(), 3);
        assert_eq!(m.prefix(b"h").count(), 0);
    }
}
