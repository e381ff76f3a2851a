//! A map from keys, two levels deep so that keys sharing a group prefix (for `kv`, the fields of
//! one hash) sit together: a key without a group is one hash lookup; a grouped key is one hash
//! lookup of its group and a search among the group's few neighbours, and a scan of a group
//! touches one small ordered map instead of entries scattered over a large table. Reading all
//! ten fields of a record therefore costs about as many cache misses as reading one.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::ops::Bound;

use bytes::Bytes;

use crate::sharded_map::ShardedMap;

/// The length of `key`'s group prefix, or `None` when the key belongs to no group. Scans are
/// asked only for whole group prefixes.
pub type GroupOf = fn(&[u8]) -> Option<usize>;

pub fn no_groups(_: &[u8]) -> Option<usize> {
    None
}

/// Longest key held in the hash table's bucket itself rather than on the heap: with its length
/// and the variant's tag, as large as a `Bytes`.
const INLINE_KEY_BYTES: usize = 23;

/// A key outside groups. Short keys (most are) sit in the bucket, so that matching a probed
/// key reads the bucket the lookup reads anyway instead of missing the cache a second time on a
/// key allocated elsewhere long ago, and a new key costs no allocation.
#[derive(Debug)]
pub(crate) enum SingleKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY_BYTES] },
    Heap(Bytes),
}

const _: () = assert!(std::mem::size_of::<SingleKey>() == std::mem::size_of::<Bytes>());

impl SingleKey {
    pub(crate) fn empty() -> SingleKey {
        SingleKey::Inline {
            len: 0,
            bytes: [0; INLINE_KEY_BYTES],
        }
    }

    fn inline(key: &[u8]) -> Option<SingleKey> {
        (key.len() <= INLINE_KEY_BYTES).then(|| {
            let mut bytes = [0; INLINE_KEY_BYTES];
            bytes[..key.len()].copy_from_slice(key);
            SingleKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        })
    }

    /// A long key is copied into a buffer of its own: a caller's key may be a slice of a larger
    /// buffer (an applied command), all of which holding it would keep alive, and a buffer shared
    /// with the caller costs a header besides.
    pub(crate) fn from_slice(key: &[u8]) -> SingleKey {
        SingleKey::inline(key).unwrap_or_else(|| SingleKey::Heap(Bytes::copy_from_slice(key)))
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            SingleKey::Inline { len, bytes } => &bytes[..*len as usize],
            SingleKey::Heap(key) => key,
        }
    }
}

/// Hashes and compares as the key's bytes, so the table is searched with a `&[u8]`.
impl Hash for SingleKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl PartialEq for SingleKey {
    fn eq(&self, other: &SingleKey) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for SingleKey {}

impl Borrow<[u8]> for SingleKey {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

#[derive(Debug)]
pub struct ScanMap<V> {
    singles: ShardedMap<SingleKey, V>,
    /// Group prefix → the group's keys by what follows the prefix (compared without the shared
    /// prefix), each with its whole key.
    groups: ShardedMap<Bytes, BTreeMap<Bytes, (Bytes, V)>>,
    group_of: GroupOf,
    len: usize,
}

impl<V> ScanMap<V> {
    pub fn new(group_of: GroupOf) -> Self {
        ScanMap {
            singles: ShardedMap::default(),
            groups: ShardedMap::default(),
            group_of,
            len: 0,
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&V> {
        match (self.group_of)(key) {
            None => self.singles.get(key),
            Some(n) => self.groups.get(&key[..n])?.get(&key[n..]).map(|(_, v)| v),
        }
    }

    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut V> {
        match (self.group_of)(key) {
            None => self.singles.get_mut(key),
            Some(n) => self.groups.get_mut(&key[..n])?.get_mut(&key[n..]).map(|(_, v)| v),
        }
    }

    /// Makes room for those of `keys` outside groups at once, rather than by repeated doubling
    /// (each a rehash of every key) as they arrive.
    pub fn reserve_for<'a>(&mut self, keys: impl IntoIterator<Item = &'a [u8]>) {
        let group_of = self.group_of;
        self.singles
            .reserve_for(keys.into_iter().filter(|key| group_of(key).is_none()));
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes allocated for the entries: the hash tables as hashbrown sizes them, and each
    /// group's members by their size alone (a lower bound: tree nodes' slack is not counted).
    pub fn allocated_bytes(&self) -> usize {
        let members = self.len - self.singles.len();
        self.singles.allocated_bytes()
            + self.groups.allocated_bytes()
            + members * std::mem::size_of::<(Bytes, (Bytes, V))>()
    }

    pub fn insert(&mut self, key: Bytes, value: V) -> Option<V> {
        let old = match (self.group_of)(&key) {
            None => self.singles.insert(SingleKey::from_slice(&key), value),
            Some(n) => {
                // A copy, for the reason `SingleKey::from_slice` gives.
                let key = Bytes::copy_from_slice(&key);
                let member = key.slice(n..);
                match self.groups.get_mut(&key[..n]) {
                    Some(group) => group.insert(member, (key, value)).map(|(_, v)| v),
                    None => {
                        let prefix = key.slice(..n);
                        self.groups.insert(prefix, BTreeMap::from([(member, (key, value))]));
                        None
                    }
                }
            }
        };
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<V> {
        let old = match (self.group_of)(key) {
            None => self.singles.remove(key),
            Some(n) => {
                let group = self.groups.get_mut(&key[..n])?;
                let old = group.remove(&key[n..]).map(|(_, v)| v);
                if group.is_empty() {
                    self.groups.remove(&key[..n]);
                }
                old
            }
        };
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Entries of the group whose prefix is `group`, in key order.
    pub fn group<'a>(&'a self, group: &[u8]) -> impl DoubleEndedIterator<Item = (&'a Bytes, &'a V)> + 'a {
        debug_assert_eq!(
            (self.group_of)(group),
            Some(group.len()),
            "scans are asked for whole group prefixes"
        );
        self.groups
            .get(group)
            .into_iter()
            .flat_map(|members| members.values().map(|(key, value)| (key, value)))
    }

    /// Entries of the group whose prefix is `group` whose keys, after the prefix, lie between
    /// `from` and `to`, in key order (none when the bounds cross).
    pub fn group_range<'a>(
        &'a self,
        group: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
    ) -> impl DoubleEndedIterator<Item = (&'a Bytes, &'a V)> + 'a {
        let crossed = match (from, to) {
            (Bound::Included(a), Bound::Included(b)) => a > b,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => a >= b,
            _ => false,
        };
        self.groups
            .get(group)
            .filter(|_| !crossed)
            .map(|members| members.range::<[u8], _>((from, to)))
            .into_iter()
            .flatten()
            .map(|(_, (key, value))| (key, value))
    }

    /// Entries of the group whose prefix is `group`, in key order, for updating.
    pub fn group_mut<'a>(&'a mut self, group: &[u8]) -> impl Iterator<Item = (&'a Bytes, &'a mut V)> + 'a {
        self.groups
            .get_mut(group)
            .into_iter()
            .flat_map(|members| members.values_mut().map(|(key, value)| (&*key, value)))
    }

    /// Every entry, taken out, in no particular order.
    pub fn into_entries(self) -> impl Iterator<Item = (Bytes, V)> {
        self.singles
            .into_entries()
            .map(|(key, value)| {
                let key = match key {
                    SingleKey::Heap(key) => key,
                    inline => Bytes::copy_from_slice(inline.as_slice()),
                };
                (key, value)
            })
            .chain(self.groups.into_values().flat_map(|members| members.into_values()))
    }

    /// Every entry, in no particular order (tests recount what the store tracks from it).
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &V)> + '_ {
        self.singles.iter().map(|(key, value)| (key.as_slice(), value)).chain(
            self.groups
                .iter()
                .flat_map(|(_, members)| members.values().map(|(key, value)| (key.as_ref(), value))),
        )
    }

    /// Every key in no group, in no particular order.
    pub fn ungrouped_keys(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.singles.keys().map(SingleKey::as_slice)
    }

    /// The prefix of every group holding a key, in no particular order.
    pub fn group_prefixes(&self) -> impl Iterator<Item = &Bytes> + '_ {
        self.groups.keys()
    }

    /// How many keys are in no group.
    pub fn ungrouped_len(&self) -> usize {
        self.singles.len()
    }

    /// How many groups hold a key.
    pub fn groups_len(&self) -> usize {
        self.groups.len()
    }

    /// How many keys the group whose prefix is `group` holds.
    pub fn group_len(&self, group: &[u8]) -> usize {
        self.groups.get(group).map_or(0, BTreeMap::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys "g<digit>..." group by their first two bytes.
    fn two_byte_groups(key: &[u8]) -> Option<usize> {
        (key.first() == Some(&b'g') && key.len() >= 2).then_some(2)
    }

    #[test]
    fn a_group_range_holds_the_keys_between_its_bounds_and_nothing_when_they_cross() {
        let mut m = ScanMap::new(two_byte_groups);
        for key in ["g1a", "g1b", "g1c", "g2a"] {
            m.insert(Bytes::from(key), ());
        }
        let keys = |from, to| -> Vec<&[u8]> { m.group_range(b"g1", from, to).map(|(k, _)| &k[..]).collect() };
        use Bound::{Excluded, Included, Unbounded};
        assert_eq!(keys(Included(b"b"), Unbounded), [b"g1b", b"g1c"]);
        assert_eq!(keys(Excluded(b"a"), Excluded(b"c")), [b"g1b"]);
        assert_eq!(keys(Included(b"b"), Included(b"b")), [b"g1b"]);
        assert!(keys(Included(b"c"), Included(b"b")).is_empty());
        assert!(keys(Excluded(b"b"), Excluded(b"b")).is_empty());
        assert!(keys(Included(b"b"), Excluded(b"b")).is_empty());
    }

    #[test]
    fn long_and_grouped_keys_do_not_keep_the_buffer_they_came_from() {
        let mut m = ScanMap::new(two_byte_groups);
        let single = Bytes::from(b"a key longer than the twenty-three bytes kept inline, then a value".to_vec());
        m.insert(single.slice(..52), 1);
        assert!(single.is_unique(), "the index holds a copy of a long key");
        let grouped = Bytes::from(b"g1 field of a hash, then its value".to_vec());
        m.insert(grouped.slice(..18), 2);
        assert!(grouped.is_unique(), "the index holds a copy of a grouped key");
        assert_eq!(m.get(&single[..52]), Some(&1));
        assert_eq!(m.get(&grouped[..18]), Some(&2));
    }

    #[test]
    fn allocated_bytes_follow_the_tables_capacity() {
        let mut m: ScanMap<[u64; 4]> = ScanMap::new(no_groups);
        let entry_bytes = std::mem::size_of::<(SingleKey, [u64; 4])>() + 1;
        assert_eq!(entry_bytes, 65);
        assert_eq!(m.allocated_bytes(), 0);
        for i in 0..100_000u32 {
            m.insert(Bytes::from(i.to_string()), [0; 4]);
        }
        // Each shard's table holds its keys at 7/8 of its buckets at most, and at least 7/16
        // (it doubled when full).
        let allocated = m.allocated_bytes();
        assert!(
            (100_000 * entry_bytes * 8 / 7..=100_000 * entry_bytes * 16 / 7).contains(&allocated),
            "{allocated} bytes for 100,000 keys"
        );
    }

    #[test]
    fn groups_hold_exactly_their_keys_in_order() {
        let mut m = ScanMap::new(two_byte_groups);
        for key in ["g1b", "g1a", "g2a", "s1", "g1c"] {
            m.insert(Bytes::from(key), key.len());
        }
        assert_eq!(m.insert(Bytes::from("g1a"), 9), Some(3));
        assert_eq!(m.remove(b"g1b"), Some(3));
        assert_eq!(m.remove(b"s1"), Some(2));
        assert_eq!(m.remove(b"s1"), None);
        let scanned: Vec<_> = m.group(b"g1").map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(scanned, vec![(Bytes::from("g1a"), 9), (Bytes::from("g1c"), 3)]);
        assert_eq!(m.get(b"g2a"), Some(&3));
        assert_eq!(m.len(), 3);
        assert_eq!(m.remove(b"g2a"), Some(3));
        assert!(m.groups.get(b"g2".as_slice()).is_none(), "an emptied group goes");
        assert_eq!((m.group_len(b"g1"), m.group_len(b"g2")), (2, 0));
        assert_eq!((m.ungrouped_len(), m.groups_len()), (0, 1));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn keys_short_enough_to_sit_inline_and_longer_ones_behave_alike() {
        let mut m = ScanMap::new(no_groups);
        let keys: Vec<Bytes> = [0, 1, INLINE_KEY_BYTES - 1, INLINE_KEY_BYTES, INLINE_KEY_BYTES + 1, 300]
            .iter()
            .map(|&len| Bytes::from(vec![b'k'; len]))
            .collect();
        for (value, key) in keys.iter().enumerate() {
            assert_eq!(m.insert(key.clone(), value), None);
        }
        for (value, key) in keys.iter().enumerate() {
            assert_eq!(m.get(key), Some(&value), "key of {} bytes", key.len());
            assert_eq!(m.insert(key.clone(), value + 100), Some(value));
        }
        assert_eq!(m.len(), keys.len());
        assert!(m.get(&[b'k'; INLINE_KEY_BYTES + 2]).is_none());
        for (value, key) in keys.iter().enumerate() {
            assert_eq!(m.remove(key), Some(value + 100));
            assert!(m.get(key).is_none());
        }
        assert_eq!(m.len(), 0);
    }
}
