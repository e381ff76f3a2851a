//! Consumer groups, as records in their stream's group of the store (after the stream's prefix):
//!
//! - `g` then the group's name: its last delivered id and how many entries it has read;
//! - `p`, the group name's length (4 big-endian bytes), the name, then an entry's id: an entry
//!   delivered and not yet acknowledged (the pending entries list), with when it was delivered,
//!   how often, and to which consumer;
//! - `c`, the group name's length, the name, then a consumer's name: when it was last seen.
//!
//! Delivery and seen times come from the entry's time, which the leader fixes for every replica;
//! idle times are read against the reading node's clock.

use std::ops::Bound;

use bytes::{BufMut, Bytes, BytesMut};
use chorus_resp::Value;

use super::streams::{entry_key, entry_reply, stream_prefix, Meta};
use super::{unreadable, unreadable_value, KvState};
use crate::command::{Claim, DeliveredAt, GroupRead, GroupReadFrom, GroupStart, GroupWrite, PendingRange, StreamId};
use crate::keyspace_events;

const GROUP_RECORD: u8 = b'g';
const PENDING_RECORD: u8 = b'p';
const CONSUMER_RECORD: u8 = b'c';

/// A group's counter of entries read when it cannot be known (Redis's -1).
const UNKNOWN: i64 = -1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    last_id: StreamId,
    entries_read: i64,
}

impl Group {
    fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(24);
        out.put_slice(&self.last_id.to_bytes());
        out.put_i64(self.entries_read);
        out.freeze()
    }

    fn decode(bytes: &[u8]) -> Option<Group> {
        if bytes.len() != 24 {
            return None;
        }
        Some(Group {
            last_id: StreamId::from_bytes(&bytes[..16])?,
            entries_read: i64::from_be_bytes(bytes[16..].try_into().ok()?),
        })
    }
}

/// A pending entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    delivered_ms: i64,
    deliveries: i64,
    consumer: Bytes,
}

impl Pending {
    fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(16 + self.consumer.len());
        out.put_i64(self.delivered_ms);
        out.put_i64(self.deliveries);
        out.put_slice(&self.consumer);
        out.freeze()
    }

    fn decode(bytes: &Bytes) -> Option<Pending> {
        Some(Pending {
            delivered_ms: i64::from_be_bytes(bytes.get(..8)?.try_into().ok()?),
            deliveries: i64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?),
            consumer: bytes.slice(16..),
        })
    }
}

/// Where a group's records of one kind start (after the stream's prefix).
fn named(kind: u8, group: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + group.len());
    out.push(kind);
    out.extend_from_slice(
        &u32::try_from(group.len())
            .expect("names are shorter than 4 GiB")
            .to_be_bytes(),
    );
    out.extend_from_slice(group);
    out
}

fn record_key(key: &[u8], rest: &[&[u8]]) -> Bytes {
    let mut k = stream_prefix(key);
    for part in rest {
        k.put_slice(part);
    }
    k.freeze()
}

fn group_key(key: &[u8], group: &[u8]) -> Bytes {
    record_key(key, &[&[GROUP_RECORD], group])
}

fn pending_key(key: &[u8], group: &[u8], id: StreamId) -> Bytes {
    record_key(key, &[&named(PENDING_RECORD, group), &id.to_bytes()])
}

fn consumer_key(key: &[u8], group: &[u8], consumer: &[u8]) -> Bytes {
    record_key(key, &[&named(CONSUMER_RECORD, group), consumer])
}

/// The smallest byte string greater than every one starting with `prefix`; `None` if there is
/// none (all bytes 0xff).
fn past_prefix(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn no_group(key: &[u8], group: &[u8]) -> Value {
    Value::error(format!(
        "NOGROUP No such key '{}' or consumer group '{}'",
        String::from_utf8_lossy(key),
        String::from_utf8_lossy(group)
    ))
}

fn no_such_group(key: &[u8], group: &[u8]) -> Value {
    Value::error(format!(
        "NOGROUP No such consumer group '{}' for key name '{}'",
        String::from_utf8_lossy(group),
        String::from_utf8_lossy(key)
    ))
}

/// A counter Redis reports as nil when unknown.
fn known(n: Option<i64>) -> Value {
    n.map_or(Value::null(), Value::Integer)
}

/// Whether the stream holds a deleted entry's place between `from` and `to` (inclusive), as far
/// as its meta tells: only the largest deleted id is kept.
fn has_tombstones(meta: &Meta, first_id: StreamId, from: StreamId, to: StreamId) -> bool {
    if meta.length == 0 || meta.max_deleted_id == StreamId::MIN || first_id > meta.max_deleted_id {
        return false;
    }
    from <= meta.max_deleted_id && meta.max_deleted_id <= to
}

/// How many entries were added up to `id`, counting from the first ever added, when the meta
/// tells (Redis's estimate of a group's read counter).
fn entries_up_to(meta: &Meta, first_id: StreamId, id: StreamId) -> Option<i64> {
    let added = meta.entries_added as i64;
    if added == 0 {
        return Some(0);
    }
    if meta.length == 0 && id <= meta.last_id {
        return Some(added);
    }
    if id == meta.last_id {
        return Some(added);
    }
    if id > meta.last_id {
        return None;
    }
    if meta.max_deleted_id == StreamId::MIN || meta.max_deleted_id < first_id {
        if id < first_id {
            return Some(added - meta.length as i64);
        }
        if id == first_id {
            return Some(added - meta.length as i64 + 1);
        }
    }
    None
}

/// How many entries the group has yet to read, when it can be known.
fn lag(meta: &Meta, first_id: StreamId, group: &Group) -> Option<i64> {
    if meta.entries_added == 0 {
        return Some(0);
    }
    if group.entries_read != UNKNOWN && !has_tombstones(meta, first_id, group.last_id, StreamId::MAX) {
        return Some(meta.entries_added as i64 - group.entries_read);
    }
    entries_up_to(meta, first_id, group.last_id).map(|read| meta.entries_added as i64 - read)
}

impl KvState {
    fn group(&mut self, key: &[u8], group: &[u8]) -> Option<Group> {
        let value = self
            .store
            .get(&group_key(key, group))
            .unwrap_or_else(|e| unreadable(e))?;
        Some(Group::decode(&value).unwrap_or_else(|| unreadable_value()))
    }

    fn put_group(&mut self, index: u64, key: &[u8], name: &[u8], group: &Group) {
        self.store.write(index, group_key(key, name), Some(group.encode()));
    }

    /// The stream and its group: `Ok(None)` when either is missing.
    fn stream_and_group(&mut self, key: &[u8], group: &[u8]) -> Result<Option<(Meta, Group)>, Value> {
        let Some(meta) = self.stream_meta(key)? else {
            return Ok(None);
        };
        Ok(self.group(key, group).map(|g| (meta, g)))
    }

    /// The id of the stream's first entry (0-0 when it has none).
    fn first_id(&mut self, key: &[u8]) -> StreamId {
        let first = self.stream_entries(key, StreamId::MIN, StreamId::MAX, 1, false);
        first.first().map_or(StreamId::MIN, |(id, _)| *id)
    }

    /// The id of the stream's last entry still there, if any.
    pub(super) fn last_entry_id(&mut self, key: &[u8]) -> Option<StreamId> {
        let last = self.stream_entries(key, StreamId::MIN, StreamId::MAX, 1, true);
        last.first().map(|(id, _)| *id)
    }

    fn pending(&mut self, key: &[u8], group: &[u8], id: StreamId) -> Option<Pending> {
        let value = self
            .store
            .get(&pending_key(key, group, id))
            .unwrap_or_else(|e| unreadable(e))?;
        Some(Pending::decode(&value).unwrap_or_else(|| unreadable_value()))
    }

    fn put_pending(&mut self, index: u64, key: &[u8], group: &[u8], id: StreamId, pending: &Pending) {
        self.store
            .write(index, pending_key(key, group, id), Some(pending.encode()));
    }

    /// Up to `take` pending entries of the group from `from` to `to` (inclusive), in id order.
    fn pending_between(
        &mut self,
        key: &[u8],
        group: &[u8],
        from: StreamId,
        to: StreamId,
        take: usize,
    ) -> Vec<(StreamId, Pending)> {
        if from > to {
            return Vec::new();
        }
        let prefix = stream_prefix(key);
        let start = named(PENDING_RECORD, group);
        let (mut low, mut high) = (start.clone(), start);
        low.extend_from_slice(&from.to_bytes());
        high.extend_from_slice(&to.to_bytes());
        let keys = self.store.group_keys_between(
            &prefix,
            (Bound::Included(low.as_slice()), Bound::Included(high.as_slice())),
            0,
            take,
            false,
        );
        keys.into_iter()
            .map(|k| {
                let id = StreamId::from_bytes(&k[k.len() - 16..]).unwrap_or_else(|| unreadable_value());
                let value = self.store.get(&k).unwrap_or_else(|e| unreadable(e));
                let pending = value.as_ref().and_then(Pending::decode);
                (id, pending.unwrap_or_else(|| unreadable_value()))
            })
            .collect()
    }

    /// The store keys of a group's records of one kind, in key order, and how long their
    /// common start is (the stream's prefix, the kind and the group's name).
    fn group_record_keys(&mut self, key: &[u8], kind: u8, group: &[u8]) -> (Vec<Bytes>, usize) {
        let prefix = stream_prefix(key);
        let start = named(kind, group);
        let end = past_prefix(&start);
        let to = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let keys =
            self.store
                .group_keys_between(&prefix, (Bound::Included(start.as_slice()), to), 0, usize::MAX, false);
        (keys, prefix.len() + start.len())
    }

    /// The group's consumers' names, in name order, with when each was last seen.
    fn consumers(&mut self, key: &[u8], group: &[u8]) -> Vec<(Bytes, i64)> {
        let (keys, names_at) = self.group_record_keys(key, CONSUMER_RECORD, group);
        keys.into_iter()
            .map(|k| {
                let name = k.slice(names_at..);
                let value = self.store.get(&k).unwrap_or_else(|e| unreadable(e));
                let seen = value
                    .as_deref()
                    .and_then(|v| Some(i64::from_be_bytes(v.try_into().ok()?)));
                (name, seen.unwrap_or_else(|| unreadable_value()))
            })
            .collect()
    }

    /// The names of the stream's groups, in name order.
    fn group_names(&mut self, key: &[u8]) -> Vec<Bytes> {
        let prefix = stream_prefix(key);
        let keys = self.store.group_keys_between(
            &prefix,
            (
                Bound::Included([GROUP_RECORD].as_slice()),
                Bound::Excluded([GROUP_RECORD + 1].as_slice()),
            ),
            0,
            usize::MAX,
            false,
        );
        keys.into_iter().map(|k| k.slice(prefix.len() + 1..)).collect()
    }

    /// Marks the consumer seen now, creating it (with its event) if it is new.
    fn see_consumer(&mut self, index: u64, key: &[u8], group: &[u8], consumer: &[u8]) {
        let record = consumer_key(key, group, consumer);
        if !self.store.contains(&record) {
            self.notify(keyspace_events::STREAM, "xgroup-createconsumer", key);
        }
        let now = Bytes::copy_from_slice(&(self.now_ms as i64).to_be_bytes());
        self.store.write(index, record, Some(now));
    }

    /// Creates a consumer; false if it exists.
    fn create_consumer(&mut self, index: u64, key: &[u8], group: &[u8], consumer: &[u8]) -> bool {
        if self.store.contains(&consumer_key(key, group, consumer)) {
            return false;
        }
        self.see_consumer(index, key, group, consumer);
        true
    }

    /// Deletes a group's records of one kind (pending entries or consumers) for which `doomed`
    /// holds; how many.
    fn delete_group_records(
        &mut self,
        index: u64,
        key: &[u8],
        kind: u8,
        group: &[u8],
        mut doomed: impl FnMut(&Bytes, &Bytes) -> bool,
    ) -> usize {
        let (keys, _) = self.group_record_keys(key, kind, group);
        let mut deleted = 0;
        for k in keys {
            let value = self.store.get(&k).unwrap_or_else(|e| unreadable(e));
            let value = value.unwrap_or_else(|| unreadable_value());
            if doomed(&k, &value) {
                self.store.write(index, k, None);
                deleted += 1;
            }
        }
        deleted
    }

    pub(super) fn execute_group_write(&mut self, index: u64, write: GroupWrite) -> Value {
        match self.try_group_write(index, write) {
            Ok(reply) | Err(reply) => reply,
        }
    }

    fn try_group_write(&mut self, index: u64, write: GroupWrite) -> Result<Value, Value> {
        let now = self.now_ms as i64;
        Ok(match write {
            GroupWrite::Create {
                key,
                group,
                start,
                make_stream,
                entries_read,
            } => {
                let meta = self.stream_meta(&key)?;
                if meta.is_none() && !make_stream {
                    return Err(Value::error(
                        "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to \
                         use the MKSTREAM option to create an empty stream automatically.",
                    ));
                }
                let last_id = match start.map_err(Value::error)? {
                    GroupStart::Id(id) => id,
                    GroupStart::Last => meta.map_or(StreamId::MIN, |meta| meta.last_id),
                };
                if meta.is_none() {
                    self.put_stream_meta(index, &key, &Meta::default());
                }
                if self.group(&key, &group).is_some() {
                    return Err(Value::error("BUSYGROUP Consumer Group name already exists"));
                }
                let entries_read = entries_read.map_or(UNKNOWN, |n| n as i64);
                self.put_group(index, &key, &group, &Group { last_id, entries_read });
                self.notify(keyspace_events::STREAM, "xgroup-create", &key);
                Value::ok()
            }
            GroupWrite::SetId {
                key,
                group,
                start,
                entries_read,
            } => {
                let Some((meta, _)) = self.group_or_error(&key, &group)? else {
                    unreachable!("group_or_error answers a missing group")
                };
                let last_id = match start.map_err(Value::error)? {
                    GroupStart::Id(id) => id,
                    GroupStart::Last => meta.last_id,
                };
                let entries_read = entries_read.map_or(UNKNOWN, |n| n as i64);
                self.put_group(index, &key, &group, &Group { last_id, entries_read });
                self.notify(keyspace_events::STREAM, "xgroup-setid", &key);
                Value::ok()
            }
            GroupWrite::Destroy { key, group } => {
                if self.stream_meta(&key)?.is_none() {
                    return Err(missing_key_for_xgroup());
                }
                if self.group(&key, &group).is_none() {
                    return Ok(Value::Integer(0));
                }
                self.store.write(index, group_key(&key, &group), None);
                self.delete_group_records(index, &key, PENDING_RECORD, &group, |_, _| true);
                self.delete_group_records(index, &key, CONSUMER_RECORD, &group, |_, _| true);
                self.notify(keyspace_events::STREAM, "xgroup-destroy", &key);
                Value::Integer(1)
            }
            GroupWrite::CreateConsumer { key, group, consumer } => {
                self.group_or_error(&key, &group)?;
                Value::Integer(i64::from(self.create_consumer(index, &key, &group, &consumer)))
            }
            GroupWrite::DeleteConsumer { key, group, consumer } => {
                self.group_or_error(&key, &group)?;
                let record = consumer_key(&key, &group, &consumer);
                if !self.store.contains(&record) {
                    return Ok(Value::Integer(0));
                }
                let pending = self.delete_group_records(index, &key, PENDING_RECORD, &group, |_, value| {
                    Pending::decode(value).is_some_and(|p| p.consumer == consumer)
                });
                self.store.write(index, record, None);
                self.notify(keyspace_events::STREAM, "xgroup-delconsumer", &key);
                Value::Integer(pending as i64)
            }
            GroupWrite::Read {
                group,
                consumer,
                count,
                no_ack,
                streams,
            } => self.read_for_group(index, &group, &consumer, count, no_ack, streams)?,
            GroupWrite::Ack { key, group, ids } => {
                let Some(_) = self.stream_and_group(&key, &group)? else {
                    return Ok(Value::Integer(0));
                };
                let mut acknowledged = 0;
                for id in ids.map_err(Value::error)? {
                    let record = pending_key(&key, &group, id);
                    if self.store.contains(&record) {
                        self.store.write(index, record, None);
                        acknowledged += 1;
                    }
                }
                Value::Integer(acknowledged)
            }
            GroupWrite::Claim {
                key,
                group,
                consumer,
                claim,
            } => {
                let Some((_, mut g)) = self.stream_and_group(&key, &group)? else {
                    return Err(no_group(&key, &group));
                };
                let claim = claim.map_err(Value::error)?;
                if claim.last_id > g.last_id {
                    g.last_id = claim.last_id;
                    self.put_group(index, &key, &group, &g);
                }
                self.claim(index, &key, &group, &consumer, claim, now)
            }
            GroupWrite::AutoClaim {
                key,
                group,
                consumer,
                min_idle_ms,
                start,
                count,
                just_id,
            } => {
                if self.stream_and_group(&key, &group)?.is_none() {
                    return Err(no_group(&key, &group));
                }
                // Redis looks at no more than ten pending entries per entry asked for.
                let attempts = count.saturating_mul(10).min(usize::MAX as u64 - 1) as usize;
                let looked = self.pending_between(&key, &group, start, StreamId::MAX, attempts.saturating_add(1));
                let mut left = count;
                let mut next = StreamId::MIN;
                let (mut claimed, mut deleted) = (Vec::new(), Vec::new());
                for (at, (id, mut pending)) in looked.into_iter().enumerate() {
                    if left == 0 || at == attempts {
                        next = id;
                        break;
                    }
                    let entry = self.store.get(&entry_key(&key, id)).unwrap_or_else(|e| unreadable(e));
                    let Some(entry) = entry else {
                        self.store.write(index, pending_key(&key, &group, id), None);
                        deleted.push(Value::bulk(id.text()));
                        left -= 1;
                        continue;
                    };
                    if min_idle_ms > 0 && now - pending.delivered_ms < min_idle_ms {
                        continue;
                    }
                    if claimed.is_empty() {
                        self.see_consumer(index, &key, &group, &consumer);
                    }
                    pending.delivered_ms = now;
                    if !just_id {
                        pending.deliveries += 1;
                    }
                    pending.consumer = consumer.clone();
                    self.put_pending(index, &key, &group, id, &pending);
                    claimed.push(if just_id {
                        Value::bulk(id.text())
                    } else {
                        entry_reply(id, &entry)
                    });
                    left -= 1;
                }
                Value::array(vec![
                    Value::bulk(next.text()),
                    Value::array(claimed),
                    Value::array(deleted),
                ])
            }
        })
    }

    /// The stream and group XGROUP's SETID, CREATECONSUMER and DELCONSUMER need, or their error.
    fn group_or_error(&mut self, key: &[u8], group: &[u8]) -> Result<Option<(Meta, Group)>, Value> {
        let Some(meta) = self.stream_meta(key)? else {
            return Err(missing_key_for_xgroup());
        };
        match self.group(key, group) {
            None => Err(no_such_group(key, group)),
            Some(g) => Ok(Some((meta, g))),
        }
    }

    fn claim(&mut self, index: u64, key: &[u8], group: &[u8], consumer: &Bytes, claim: Claim, now: i64) -> Value {
        let delivered = match claim.delivered {
            DeliveredAt::Now => now,
            DeliveredAt::IdleMs(idle) => now.saturating_sub(idle),
            DeliveredAt::UnixMs(at) => at,
        };
        // A time in the future or before 1970 is taken as now, as Redis does.
        let delivered = if (0..=now).contains(&delivered) { delivered } else { now };
        let mut claimed = Vec::new();
        for id in claim.ids {
            let pending = self.pending(key, group, id);
            let entry = self.store.get(&entry_key(key, id)).unwrap_or_else(|e| unreadable(e));
            let Some(entry) = entry else {
                if pending.is_some() {
                    self.store.write(index, pending_key(key, group, id), None);
                }
                continue;
            };
            let (mut pending, forced) = match pending {
                Some(pending) => (pending, false),
                None if claim.force => (
                    Pending {
                        delivered_ms: now,
                        deliveries: 1,
                        consumer: consumer.clone(),
                    },
                    true,
                ),
                None => continue,
            };
            if !forced && claim.min_idle_ms > 0 && now - pending.delivered_ms < claim.min_idle_ms {
                continue;
            }
            // As Redis 7.0: a consumer is made (or seen) by the first entry it claims.
            if claimed.is_empty() {
                self.see_consumer(index, key, group, consumer);
            }
            pending.delivered_ms = delivered;
            if claim.retry_count >= 0 {
                pending.deliveries = claim.retry_count;
            } else if !claim.just_id {
                pending.deliveries += 1;
            }
            pending.consumer = consumer.clone();
            self.put_pending(index, key, group, id, &pending);
            claimed.push(if claim.just_id {
                Value::bulk(id.text())
            } else {
                entry_reply(id, &entry)
            });
        }
        Value::array(claimed)
    }

    /// XREADGROUP: each stream's new entries (recorded as pending to `consumer` unless
    /// `no_ack`), or the consumer's own pending ones after an id.
    fn read_for_group(
        &mut self,
        index: u64,
        group: &[u8],
        consumer: &Bytes,
        count: u64,
        no_ack: bool,
        streams: Vec<(Bytes, Result<GroupReadFrom, crate::command::CommandError>)>,
    ) -> Result<Value, Value> {
        let mut checked = Vec::with_capacity(streams.len());
        for (key, from) in streams {
            if self.stream_and_group(&key, group)?.is_none() {
                return Err(Value::error(format!(
                    "NOGROUP No such key '{}' or consumer group '{}' in XREADGROUP with GROUP option",
                    String::from_utf8_lossy(&key),
                    String::from_utf8_lossy(group)
                )));
            };
            checked.push((key, from.map_err(Value::error)?));
        }
        let now = self.now_ms as i64;
        let take = if count == 0 { usize::MAX } else { count as usize };
        let mut served = Vec::new();
        for (key, from) in checked {
            let entries = match from {
                GroupReadFrom::PendingAfter(after) => {
                    self.see_consumer(index, &key, group, consumer);
                    let Some(from) = after.next() else {
                        served.push((Value::bulk(key), Value::array(Vec::new())));
                        continue;
                    };
                    let mine: Vec<(StreamId, Pending)> = self
                        .pending_between(&key, group, from, StreamId::MAX, usize::MAX)
                        .into_iter()
                        .filter(|(_, p)| p.consumer == consumer)
                        .take(take)
                        .collect();
                    let mut entries = Vec::with_capacity(mine.len());
                    for (id, mut pending) in mine {
                        match self.store.get(&entry_key(&key, id)).unwrap_or_else(|e| unreadable(e)) {
                            Some(entry) => {
                                entries.push(entry_reply(id, &entry));
                                pending.delivered_ms = now;
                                pending.deliveries += 1;
                                self.put_pending(index, &key, group, id, &pending);
                            }
                            // Deleted since it was delivered: its id with no fields.
                            None => entries.push(Value::array(vec![Value::bulk(id.text()), Value::Array(None)])),
                        }
                    }
                    entries
                }
                GroupReadFrom::Undelivered => {
                    // Read afresh for each stream named: one named twice is served from where
                    // the first serving left the group, as in Redis.
                    let (meta, mut g) = self
                        .stream_and_group(&key, group)?
                        .expect("checked above, and serving a read deletes no group");
                    if self.last_entry_id(&key).is_none_or(|last| last <= g.last_id) {
                        continue;
                    }
                    let Some(from) = g.last_id.next() else { continue };
                    // As Redis 7.0: a consumer is made (or seen) by a read that serves it.
                    self.see_consumer(index, &key, group, consumer);
                    let first_id = self.first_id(&key);
                    let new = self.stream_entries(&key, from, StreamId::MAX, take, false);
                    let mut entries = Vec::with_capacity(new.len());
                    for (id, entry) in new {
                        // Counted on while no deleted entry's place lies ahead, as Redis 7.0
                        // counts.
                        if g.entries_read != UNKNOWN && !has_tombstones(&meta, first_id, id, StreamId::MAX) {
                            g.entries_read += 1;
                        } else if meta.entries_added > 0 {
                            g.entries_read = entries_up_to(&meta, first_id, id).unwrap_or(UNKNOWN);
                        }
                        g.last_id = id;
                        entries.push(entry_reply(id, &entry));
                        if !no_ack {
                            let pending = Pending {
                                delivered_ms: now,
                                deliveries: 1,
                                consumer: consumer.clone(),
                            };
                            self.put_pending(index, &key, group, id, &pending);
                        }
                    }
                    self.put_group(index, &key, group, &g);
                    entries
                }
            };
            served.push((Value::bulk(key), Value::array(entries)));
        }
        Ok(if served.is_empty() {
            Value::Array(None)
        } else {
            Value::KeyedPairs(served)
        })
    }

    pub(super) fn read_group(&mut self, read: &GroupRead) -> Result<Value, Value> {
        let now = self.now_ms as i64;
        Ok(match read {
            GroupRead::Help(lines) => super::help_reply(lines),
            GroupRead::Undelivered { group, keys } => {
                for key in keys {
                    let Ok(Some((_, g))) = self.stream_and_group(key, group) else {
                        return Ok(Value::Integer(1));
                    };
                    if self.last_entry_id(key).is_some_and(|last| last > g.last_id) {
                        return Ok(Value::Integer(1));
                    }
                }
                Value::Integer(0)
            }
            GroupRead::Pending { key, group, range } => {
                let Some(_) = self.stream_and_group(key, group)? else {
                    return Err(no_group(key, group));
                };
                match range {
                    None => self.pending_summary(key, group),
                    Some(range) => self.pending_range(key, group, range, now),
                }
            }
            GroupRead::Groups(key) => {
                let Some(meta) = self.stream_meta(key)? else {
                    return Err(Value::error("ERR no such key"));
                };
                let first_id = self.first_id(key);
                let mut groups = Vec::new();
                for name in self.group_names(key) {
                    let g = self.group(key, &name).unwrap_or_else(|| unreadable_value());
                    let consumers = self.consumers(key, &name).len();
                    let pending = self
                        .pending_between(key, &name, StreamId::MIN, StreamId::MAX, usize::MAX)
                        .len();
                    let entries_read = (g.entries_read != UNKNOWN).then_some(g.entries_read);
                    groups.push(Value::Map(vec![
                        (Value::bulk("name"), Value::bulk(name)),
                        (Value::bulk("consumers"), Value::Integer(consumers as i64)),
                        (Value::bulk("pending"), Value::Integer(pending as i64)),
                        (Value::bulk("last-delivered-id"), Value::bulk(g.last_id.text())),
                        (Value::bulk("entries-read"), known(entries_read)),
                        (Value::bulk("lag"), known(lag(&meta, first_id, &g))),
                    ]));
                }
                Value::array(groups)
            }
            GroupRead::Consumers { key, group } => {
                if self.stream_meta(key)?.is_none() {
                    return Err(Value::error("ERR no such key"));
                }
                if self.group(key, group).is_none() {
                    return Err(no_such_group(key, group));
                }
                let pending = self.pending_between(key, group, StreamId::MIN, StreamId::MAX, usize::MAX);
                let consumers = self.consumers(key, group);
                let replies = consumers
                    .into_iter()
                    .map(|(name, seen_ms)| {
                        let mine = pending.iter().filter(|(_, p)| p.consumer == name).count();
                        Value::Map(vec![
                            (Value::bulk("name"), Value::bulk(name)),
                            (Value::bulk("pending"), Value::Integer(mine as i64)),
                            (Value::bulk("idle"), Value::Integer((now - seen_ms).max(0))),
                        ])
                    })
                    .collect();
                Value::array(replies)
            }
            GroupRead::Stream { key, full } => {
                let Some(meta) = self.stream_meta(key)? else {
                    return Err(Value::error("ERR no such key"));
                };
                let full = full.clone().map_err(Value::error)?;
                self.stream_info(key, &meta, full)
            }
        })
    }

    /// XINFO STREAM's reply, or with `full` (so many entries and pending entries per list, 0:
    /// all) XINFO STREAM FULL's.
    fn stream_info(&mut self, key: &[u8], meta: &Meta, full: Option<u64>) -> Value {
        let first = self.stream_entries(key, StreamId::MIN, StreamId::MAX, 1, false);
        let first_id = first.first().map_or(StreamId::MIN, |(id, _)| *id);
        let mut info = vec![
            (Value::bulk("length"), Value::Integer(meta.length as i64)),
            // Chorus keeps each entry as a record of its own: no radix tree of nodes.
            (Value::bulk("radix-tree-keys"), Value::Integer(meta.length as i64)),
            (Value::bulk("radix-tree-nodes"), Value::Integer(meta.length as i64)),
            (Value::bulk("last-generated-id"), Value::bulk(meta.last_id.text())),
            (
                Value::bulk("max-deleted-entry-id"),
                Value::bulk(meta.max_deleted_id.text()),
            ),
            (Value::bulk("entries-added"), Value::Integer(meta.entries_added as i64)),
            (Value::bulk("recorded-first-entry-id"), Value::bulk(first_id.text())),
        ];
        let names = self.group_names(key);
        let Some(count) = full else {
            let last = self.stream_entries(key, StreamId::MIN, StreamId::MAX, 1, true);
            let edge = |entries: &[(StreamId, Bytes)]| {
                entries
                    .first()
                    .map_or(Value::null(), |(id, entry)| entry_reply(*id, entry))
            };
            info.extend([
                (Value::bulk("groups"), Value::Integer(names.len() as i64)),
                (Value::bulk("first-entry"), edge(&first)),
                (Value::bulk("last-entry"), edge(&last)),
            ]);
            return Value::Map(info);
        };
        let take = if count == 0 { usize::MAX } else { count as usize };
        let entries = self.stream_entries(key, StreamId::MIN, StreamId::MAX, take, false);
        let entries = entries.iter().map(|(id, entry)| entry_reply(*id, entry)).collect();
        let mut groups = Vec::with_capacity(names.len());
        for name in names {
            let g = self.group(key, &name).unwrap_or_else(|| unreadable_value());
            let pending = self.pending_between(key, &name, StreamId::MIN, StreamId::MAX, usize::MAX);
            let listed = pending.iter().take(take).map(|(id, p)| {
                Value::array(vec![
                    Value::bulk(id.text()),
                    Value::bulk(p.consumer.clone()),
                    Value::Integer(p.delivered_ms),
                    Value::Integer(p.deliveries),
                ])
            });
            let listed = Value::array(listed.collect());
            let consumers = self
                .consumers(key, &name)
                .into_iter()
                .map(|(consumer, seen_ms)| {
                    let mine: Vec<&(StreamId, Pending)> =
                        pending.iter().filter(|(_, p)| p.consumer == consumer).collect();
                    let listed = mine.iter().take(take).map(|(id, p)| {
                        Value::array(vec![
                            Value::bulk(id.text()),
                            Value::Integer(p.delivered_ms),
                            Value::Integer(p.deliveries),
                        ])
                    });
                    Value::Map(vec![
                        (Value::bulk("name"), Value::bulk(consumer.clone())),
                        (Value::bulk("seen-time"), Value::Integer(seen_ms)),
                        (Value::bulk("pel-count"), Value::Integer(mine.len() as i64)),
                        (Value::bulk("pending"), Value::array(listed.collect())),
                    ])
                })
                .collect();
            let entries_read = (g.entries_read != UNKNOWN).then_some(g.entries_read);
            groups.push(Value::Map(vec![
                (Value::bulk("name"), Value::bulk(name)),
                (Value::bulk("last-delivered-id"), Value::bulk(g.last_id.text())),
                (Value::bulk("entries-read"), known(entries_read)),
                (Value::bulk("lag"), known(lag(meta, first_id, &g))),
                (Value::bulk("pel-count"), Value::Integer(pending.len() as i64)),
                (Value::bulk("pending"), listed),
                (Value::bulk("consumers"), Value::array(consumers)),
            ]));
        }
        info.extend([
            (Value::bulk("entries"), Value::array(entries)),
            (Value::bulk("groups"), Value::array(groups)),
        ]);
        Value::Map(info)
    }

    fn pending_summary(&mut self, key: &[u8], group: &[u8]) -> Value {
        let pending = self.pending_between(key, group, StreamId::MIN, StreamId::MAX, usize::MAX);
        let (Some((first, _)), Some((last, _))) = (pending.first(), pending.last()) else {
            return Value::array(vec![
                Value::Integer(0),
                Value::null(),
                Value::null(),
                Value::Array(None),
            ]);
        };
        let mut per_consumer: Vec<(Bytes, usize)> = Vec::new();
        let mut by_name: Vec<&Bytes> = pending.iter().map(|(_, p)| &p.consumer).collect();
        by_name.sort();
        for name in by_name {
            match per_consumer.last_mut() {
                Some((last, n)) if last == name => *n += 1,
                _ => per_consumer.push((name.clone(), 1)),
            }
        }
        Value::array(vec![
            Value::Integer(pending.len() as i64),
            Value::bulk(first.text()),
            Value::bulk(last.text()),
            Value::array(
                per_consumer
                    .into_iter()
                    .map(|(name, n)| Value::array(vec![Value::bulk(name), Value::bulk(n.to_string())]))
                    .collect(),
            ),
        ])
    }

    fn pending_range(&mut self, key: &[u8], group: &[u8], range: &PendingRange, now: i64) -> Value {
        if let Some(consumer) = &range.consumer {
            if !self.store.contains(&consumer_key(key, group, consumer)) {
                return Value::array(Vec::new());
            }
        }
        let mut left = range.count;
        let mut replies = Vec::new();
        for (id, pending) in self.pending_between(key, group, range.from, range.to, usize::MAX) {
            if left == 0 {
                break;
            }
            if range.consumer.as_ref().is_some_and(|c| *c != pending.consumer) {
                continue;
            }
            let idle = now - pending.delivered_ms;
            if range.min_idle_ms != 0 && idle < range.min_idle_ms {
                continue;
            }
            left -= 1;
            replies.push(Value::array(vec![
                Value::bulk(id.text()),
                Value::bulk(pending.consumer),
                Value::Integer(idle.max(0)),
                Value::Integer(pending.deliveries),
            ]));
        }
        Value::array(replies)
    }
}

fn missing_key_for_xgroup() -> Value {
    Value::error(
        "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the \
         MKSTREAM option to create an empty stream automatically.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_and_pending_records_decode_as_encoded_and_refuse_other_lengths() {
        let group = Group {
            last_id: StreamId { ms: 7, seq: 2 },
            entries_read: UNKNOWN,
        };
        assert_eq!(Group::decode(&group.encode()), Some(group));
        assert_eq!(Group::decode(&group.encode()[..23]), None);
        let pending = Pending {
            delivered_ms: 1_700_000_000_000,
            deliveries: 3,
            consumer: Bytes::from("alice"),
        };
        assert_eq!(Pending::decode(&pending.encode()), Some(pending));
        assert_eq!(Pending::decode(&Bytes::from_static(&[0; 15])), None);
    }

    #[test]
    fn a_prefix_is_passed_by_the_next_string_up() {
        assert_eq!(past_prefix(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(past_prefix(&[1, 0xff]), Some(vec![2]));
        assert_eq!(past_prefix(&[0xff, 0xff]), None);
    }

    #[test]
    fn the_read_counter_is_known_only_where_no_deleted_entry_hides_the_count() {
        let meta = Meta {
            last_id: StreamId { ms: 10, seq: 0 },
            entries_added: 10,
            max_deleted_id: StreamId::MIN,
            length: 6,
        };
        let first = StreamId { ms: 5, seq: 0 };
        assert_eq!(entries_up_to(&meta, first, StreamId { ms: 10, seq: 0 }), Some(10));
        assert_eq!(entries_up_to(&meta, first, first), Some(5));
        assert_eq!(entries_up_to(&meta, first, StreamId::MIN), Some(4));
        assert_eq!(entries_up_to(&meta, first, StreamId { ms: 7, seq: 0 }), None);
        assert_eq!(entries_up_to(&meta, first, StreamId { ms: 11, seq: 0 }), None);
        let fragmented = Meta {
            max_deleted_id: StreamId { ms: 7, seq: 0 },
            ..meta
        };
        assert_eq!(entries_up_to(&fragmented, first, StreamId::MIN), None);
    }
}
