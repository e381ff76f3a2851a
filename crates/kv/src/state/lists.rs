//! Lists: each list is one group of the store with a record per element, keyed by a position
//! (`L`, the key's length as 4 big-endian bytes, the key, then the position as 8 bytes that sort
//! as the signed number does). A push takes the position before the first element or after the
//! last, so pushing and popping at either end writes one record however long the list is, and
//! LLEN counts without reading. Positions left by removals in the middle (LREM) stay as gaps;
//! order is all that matters.

use bytes::{BufMut, Bytes};
use chorus_resp::Value;

use super::{group_prefix, unreadable, KeyType, KvState, LIST_TAG};
use crate::command::{End, ListRead, ListWrite};
use crate::keyspace_events;

/// Where positions of a new list start.
const FIRST_POSITION: i64 = 0;

pub(super) fn list_prefix(key: &[u8]) -> bytes::BytesMut {
    group_prefix(LIST_TAG, key)
}

fn element_key(key: &[u8], position: i64) -> Bytes {
    let mut k = list_prefix(key);
    k.put_u64((position as u64) ^ (1 << 63));
    k.freeze()
}

/// The position an element's storage key holds.
fn position_of(storage_key: &[u8]) -> i64 {
    let bytes: [u8; 8] = storage_key[storage_key.len() - 8..]
        .try_into()
        .expect("an element key ends with its position");
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

/// Redis's reading of a start and stop index against a list of `len` elements: the range of
/// elements they cover, empty when none.
fn index_range(len: usize, start: i64, stop: i64) -> std::ops::Range<usize> {
    let len = len as i64;
    let from_end = |i: i64| if i < 0 { len + i } else { i };
    let start = from_end(start).max(0);
    let stop = from_end(stop).min(len - 1);
    if start > stop || start >= len {
        0..0
    } else {
        start as usize..stop as usize + 1
    }
}

impl KvState {
    pub(super) fn is_list(&self, key: &[u8]) -> bool {
        self.holds_group(LIST_TAG, key)
    }

    fn list_len(&mut self, key: &[u8]) -> usize {
        self.group_size(LIST_TAG, key)
    }

    /// The storage keys of up to `take` elements after skipping `skip`, from the head or the tail.
    fn element_keys(&mut self, key: &[u8], skip: usize, take: usize, end: End) -> Vec<Bytes> {
        self.store
            .group_keys_range(&list_prefix(key), skip, take, end == End::Right)
    }

    fn element(&mut self, storage_key: &[u8]) -> Bytes {
        self.store
            .get(storage_key)
            .unwrap_or_else(|e| unreadable(e))
            .expect("an indexed element has a value")
    }

    /// Every element, in order, with its storage key (`WRONGTYPE` for another type).
    pub(super) fn list_elements(&mut self, key: &[u8]) -> Result<Vec<(Bytes, Bytes)>, Value> {
        if !self.type_check(key, KeyType::List)? {
            return Ok(Vec::new());
        }
        let len = self.list_len(key);
        let keys = self.element_keys(key, 0, len, End::Left);
        Ok(keys.into_iter().map(|k| (k.clone(), self.element(&k))).collect())
    }

    /// Pushes `elements` one by one at `end` of the list `key` (which holds a list or nothing).
    pub(super) fn push(&mut self, index: u64, key: &[u8], elements: Vec<Bytes>, end: End) -> usize {
        let mut next = match self.element_keys(key, 0, 1, end).first() {
            None => FIRST_POSITION,
            Some(edge) if end == End::Left => position_of(edge) - 1,
            Some(edge) => position_of(edge) + 1,
        };
        for element in elements {
            self.store.write(index, element_key(key, next), Some(element));
            next += if end == End::Left { -1 } else { 1 };
        }
        self.list_len(key)
    }

    /// Takes up to `count` elements from `end`.
    fn take(&mut self, index: u64, key: &[u8], count: usize, end: End) -> Vec<Bytes> {
        let keys = self.element_keys(key, 0, count, end);
        let mut taken = Vec::with_capacity(keys.len());
        for k in keys {
            taken.push(self.element(&k));
            self.store.write(index, k, None);
        }
        taken
    }

    /// A list left without elements is gone, and its deadline with it.
    fn forget_if_empty(&mut self, index: u64, key: &[u8]) {
        if self.list_len(key) == 0 {
            self.set_deadline(index, key, None);
        }
    }

    /// Notes a pop from the list `key`'s `end`, and its deletion if that emptied it.
    fn notify_popped(&mut self, key: &[u8], end: End) {
        let event = match end {
            End::Left => "lpop",
            End::Right => "rpop",
        };
        self.notify(keyspace_events::LIST, event, key);
        self.notify_if_emptied(key);
    }

    /// Applies a list write from the entry at `index`.
    pub(super) fn execute_list_write(&mut self, index: u64, write: ListWrite) -> Value {
        match write {
            ListWrite::Push {
                key,
                elements,
                end,
                only_if_exists,
            } => match self.type_check(&key, KeyType::List) {
                Err(e) => e,
                Ok(false) if only_if_exists => Value::Integer(0),
                Ok(_) => {
                    let len = self.push(index, &key, elements, end);
                    self.notify(keyspace_events::LIST, push_event(end), &key);
                    Value::Integer(len as i64)
                }
            },
            ListWrite::Pop { key, count, end } => match self.type_check(&key, KeyType::List) {
                Err(e) => e,
                Ok(false) if count.is_some() => Value::Array(None),
                Ok(false) => Value::null(),
                Ok(true) => {
                    let popped = self.take(index, &key, count.unwrap_or(1), end);
                    // A count of 0 pops nothing: no event, as in Redis.
                    if !popped.is_empty() {
                        self.forget_if_empty(index, &key);
                        self.notify_popped(&key, end);
                    }
                    pop_reply(popped, count)
                }
            },
            ListWrite::Set { key, at, element } => match self.lset_target(&key, at) {
                Err(e) => e,
                Ok(storage_key) => {
                    self.store.write(index, storage_key, Some(element));
                    self.notify(keyspace_events::LIST, "lset", &key);
                    Value::ok()
                }
            },
            ListWrite::Remove { key, count, element } => {
                let elements = match self.list_elements(&key) {
                    Err(e) => return e,
                    Ok(elements) => elements,
                };
                let doomed = lrem_targets(&elements, count, &element);
                for storage_key in &doomed {
                    self.store.write(index, storage_key.clone(), None);
                }
                self.forget_if_empty(index, &key);
                if !doomed.is_empty() {
                    self.notify(keyspace_events::LIST, "lrem", &key);
                    self.notify_if_emptied(&key);
                }
                Value::Integer(doomed.len() as i64)
            }
            ListWrite::Trim { key, start, stop } => match self.type_check(&key, KeyType::List) {
                Err(e) => e,
                Ok(false) => Value::ok(),
                Ok(true) => {
                    let len = self.list_len(&key);
                    let kept = index_range(len, start, stop);
                    let all = self.element_keys(&key, 0, len, End::Left);
                    for (i, storage_key) in all.into_iter().enumerate() {
                        if !kept.contains(&i) {
                            self.store.write(index, storage_key, None);
                        }
                    }
                    self.forget_if_empty(index, &key);
                    self.notify(keyspace_events::LIST, "ltrim", &key);
                    self.notify_if_emptied(&key);
                    Value::ok()
                }
            },
            ListWrite::MultiPop { keys, end, count } => match self.first_list(&keys) {
                Err(e) => e,
                Ok(None) => Value::Array(None),
                Ok(Some(key)) => {
                    let popped = self.take(index, &key, count, end);
                    self.forget_if_empty(index, &key);
                    self.notify_popped(&key, end);
                    Value::array(vec![
                        Value::bulk(key),
                        Value::array(popped.into_iter().map(Value::bulk).collect()),
                    ])
                }
            },
            ListWrite::Insert {
                key,
                after,
                pivot,
                element,
            } => match self.linsert_target(&key, after, &pivot) {
                Err(reply) => reply,
                Ok(None) => Value::Integer(-1),
                Ok(Some(at)) => {
                    self.insert_at(index, &key, at, element);
                    self.notify(keyspace_events::LIST, "linsert", &key);
                    Value::Integer(self.list_len(&key) as i64)
                }
            },
            ListWrite::Move {
                from,
                to,
                from_end,
                to_end,
            } => match self.lmove_check(&from, &to) {
                Err(e) => e,
                Ok(false) => Value::null(),
                Ok(true) => {
                    // Taken before the push, so a list rotated onto itself never looks empty.
                    let element = self.take(index, &from, 1, from_end).remove(0);
                    self.push(index, &to, vec![element.clone()], to_end);
                    self.forget_if_empty(index, &from);
                    self.notify(keyspace_events::LIST, push_event(to_end), &to);
                    self.notify_popped(&from, from_end);
                    Value::bulk(element)
                }
            },
        }
    }

    /// Inserts `element` so that it becomes the `at`-th element (0-based) of the list `key`.
    /// Between two elements with no position free between them, the shorter side moves one
    /// position outwards: at most half the list is rewritten.
    fn insert_at(&mut self, index: u64, key: &[u8], at: usize, element: Bytes) {
        let len = self.list_len(key);
        if at == 0 || at == len {
            let end = if at == 0 { End::Left } else { End::Right };
            self.push(index, key, vec![element], end);
            return;
        }
        let neighbours = self.element_keys(key, at - 1, 2, End::Left);
        let (left, right) = (position_of(&neighbours[0]), position_of(&neighbours[1]));
        if right - left > 1 {
            self.store
                .write(index, element_key(key, left + (right - left) / 2), Some(element));
            return;
        }
        let (moved, step, freed) = if at <= len - at {
            (self.element_keys(key, 0, at, End::Left), -1, left)
        } else {
            (self.element_keys(key, 0, len - at, End::Right), 1, right)
        };
        // Each element moves into a position free already or freed by the one moved before it.
        for storage_key in moved {
            let value = self.element(&storage_key);
            let position = position_of(&storage_key);
            self.store.write(index, storage_key, None);
            self.store.write(index, element_key(key, position + step), Some(value));
        }
        self.store.write(index, element_key(key, freed), Some(element));
    }

    /// Where LINSERT puts its element: `Ok(None)` when the pivot is not found (-1); as the
    /// error, Redis's reply for a key holding nothing (0) or something else.
    fn linsert_target(&mut self, key: &[u8], after: bool, pivot: &[u8]) -> Result<Option<usize>, Value> {
        if !self.type_check(key, KeyType::List)? {
            return Err(Value::Integer(0));
        }
        let elements = self.list_elements(key)?;
        Ok(elements
            .iter()
            .position(|(_, value)| value.as_ref() == pivot)
            .map(|i| i + usize::from(after)))
    }

    /// The first of `keys` holding a list, as LMPOP looks: `WRONGTYPE` from a key before it
    /// that holds something else.
    fn first_list(&mut self, keys: &[Bytes]) -> Result<Option<Bytes>, Value> {
        for key in keys {
            if self.type_check(key, KeyType::List)? {
                return Ok(Some(key.clone()));
            }
        }
        Ok(None)
    }

    /// The storage key LSET writes, or Redis's error.
    fn lset_target(&mut self, key: &[u8], at: i64) -> Result<Bytes, Value> {
        if !self.type_check(key, KeyType::List)? {
            return Err(Value::error("ERR no such key"));
        }
        let len = self.list_len(key) as i64;
        let position = if at < 0 { len + at } else { at };
        if !(0..len).contains(&position) {
            return Err(Value::error("ERR index out of range"));
        }
        Ok(self.element_keys(key, position as usize, 1, End::Left).remove(0))
    }

    /// Whether LMOVE moves an element: the source is a non-empty list and the destination a
    /// list or nothing.
    fn lmove_check(&mut self, from: &[u8], to: &[u8]) -> Result<bool, Value> {
        if !self.type_check(from, KeyType::List)? {
            return Ok(false);
        }
        self.type_check(to, KeyType::List)?;
        Ok(true)
    }

    /// What applying a list write would answer, without applying it (see `preview_write`).
    pub(super) fn preview_list_write(&mut self, write: &ListWrite) -> Value {
        match write {
            ListWrite::Push {
                key,
                elements,
                only_if_exists,
                ..
            } => match self.type_check(key, KeyType::List) {
                Err(e) => e,
                Ok(false) if *only_if_exists => Value::Integer(0),
                Ok(_) => Value::Integer((self.list_len(key) + elements.len()) as i64),
            },
            ListWrite::Pop { key, count, end } => match self.type_check(key, KeyType::List) {
                Err(e) => e,
                Ok(false) if count.is_some() => Value::Array(None),
                Ok(false) => Value::null(),
                Ok(true) => {
                    let keys = self.element_keys(key, 0, count.unwrap_or(1), *end);
                    let values = keys.iter().map(|k| self.element(k)).collect();
                    pop_reply(values, *count)
                }
            },
            ListWrite::Set { key, at, .. } => self.lset_target(key, *at).map_or_else(|e| e, |_| Value::ok()),
            ListWrite::Remove { key, count, element } => match self.list_elements(key) {
                Err(e) => e,
                Ok(elements) => Value::Integer(lrem_targets(&elements, *count, element).len() as i64),
            },
            ListWrite::Trim { key, .. } => self.type_check(key, KeyType::List).map_or_else(|e| e, |_| Value::ok()),
            ListWrite::MultiPop { keys, end, count } => match self.first_list(keys) {
                Err(e) => e,
                Ok(None) => Value::Array(None),
                Ok(Some(key)) => {
                    let keys = self.element_keys(&key, 0, *count, *end);
                    let popped = keys.iter().map(|k| Value::bulk(self.element(k))).collect();
                    Value::array(vec![Value::bulk(key), Value::array(popped)])
                }
            },
            ListWrite::Insert { key, after, pivot, .. } => match self.linsert_target(key, *after, pivot) {
                Err(reply) => reply,
                Ok(None) => Value::Integer(-1),
                Ok(Some(_)) => Value::Integer(self.list_len(key) as i64 + 1),
            },
            ListWrite::Move { from, to, from_end, .. } => match self.lmove_check(from, to) {
                Err(e) => e,
                Ok(false) => Value::null(),
                Ok(true) => {
                    let k = self.element_keys(from, 0, 1, *from_end).remove(0);
                    Value::bulk(self.element(&k))
                }
            },
        }
    }

    pub(super) fn read_list(&mut self, read: &ListRead) -> Result<Value, Value> {
        Ok(match read {
            ListRead::Len(key) => {
                self.type_check(key, KeyType::List)?;
                Value::Integer(self.list_len(key) as i64)
            }
            ListRead::Range { key, start, stop } => {
                if !self.type_check(key, KeyType::List)? {
                    return Ok(Value::array(Vec::new()));
                }
                let range = index_range(self.list_len(key), *start, *stop);
                let keys = self.element_keys(key, range.start, range.len(), End::Left);
                Value::array(keys.iter().map(|k| Value::bulk(self.element(k))).collect())
            }
            ListRead::Pos {
                key,
                element,
                rank,
                count,
                max_len,
            } => {
                let elements = self.list_elements(key)?;
                let len = elements.len();
                let looked_at = if *max_len == 0 { len } else { len.min(*max_len) };
                let order: Box<dyn Iterator<Item = usize>> = if *rank > 0 {
                    Box::new(0..looked_at)
                } else {
                    Box::new((len - looked_at..len).rev())
                };
                let wanted = match count {
                    Some(0) => usize::MAX,
                    Some(n) => *n,
                    None => 1,
                };
                let found: Vec<Value> = order
                    .filter(|i| elements[*i].1 == element)
                    .skip(rank.unsigned_abs() as usize - 1)
                    .take(wanted)
                    .map(|i| Value::Integer(i as i64))
                    .collect();
                match count {
                    Some(_) => Value::array(found),
                    None => found.into_iter().next().unwrap_or_else(Value::null),
                }
            }
            ListRead::Index { key, at } => {
                if !self.type_check(key, KeyType::List)? {
                    return Ok(Value::null());
                }
                let len = self.list_len(key) as i64;
                let position = if *at < 0 { len + at } else { *at };
                if !(0..len).contains(&position) {
                    return Ok(Value::null());
                }
                let k = self.element_keys(key, position as usize, 1, End::Left).remove(0);
                Value::bulk(self.element(&k))
            }
        })
    }
}

/// LPOP / RPOP's reply: one element (or nil) without a count, an array with one.
fn pop_reply(popped: Vec<Bytes>, count: Option<usize>) -> Value {
    match count {
        None => Value::Bulk(popped.into_iter().next()),
        Some(_) => Value::array(popped.into_iter().map(Value::bulk).collect()),
    }
}

/// The storage keys LREM deletes: elements equal to `element`, up to `count` of them from the
/// head (from the tail for a negative count, all for 0).
fn lrem_targets(elements: &[(Bytes, Bytes)], count: i64, element: &[u8]) -> Vec<Bytes> {
    let limit = if count == 0 {
        usize::MAX
    } else {
        count.unsigned_abs().min(usize::MAX as u64) as usize
    };
    let matching = |(_, value): &&(Bytes, Bytes)| value.as_ref() == element;
    let keys = |pairs: Vec<&(Bytes, Bytes)>| pairs.into_iter().map(|(k, _)| k.clone()).collect();
    if count < 0 {
        keys(elements.iter().rev().filter(matching).take(limit).collect())
    } else {
        keys(elements.iter().filter(matching).take(limit).collect())
    }
}

/// The event a push to `end` is notified as.
fn push_event(end: End) -> &'static str {
    match end {
        End::Left => "lpush",
        End::Right => "rpush",
    }
}
