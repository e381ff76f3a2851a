//! Streams: each is one group of the store holding a record per entry and one for the stream:
//!
//! - `e` then the entry's id (milliseconds and sequence number, 8 big-endian bytes each, so key
//!   order is id order), whose value is the entry's fields and values;
//! - `m`, the stream's last id, how many entries were ever added, the largest id deleted and how
//!   many entries it holds: a stream with no entries left still exists, as in Redis;
//! - its consumer groups' records (`stream_groups`).
//!
//! XADD's `*` ids come from the entry's time, which the leader fixes for every replica.

use std::ops::Bound;

use bytes::{BufMut, Bytes, BytesMut};
use chorus_resp::Value;

use super::{group_prefix, unreadable, unreadable_value, KeyType, KvState, STREAM_TAG};
use crate::command::{NewId, ReadAfter, StreamId, StreamRead, StreamWrite, Trim, TrimTo};
use crate::keyspace_events;

const ENTRY_RECORD: u8 = b'e';
const META_RECORD: u8 = b'm';
const ID_NOT_GREATER: &str = "ERR The ID specified in XADD is equal or smaller than the target stream top item";

/// What a stream keeps besides its entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Meta {
    pub last_id: StreamId,
    pub entries_added: u64,
    pub max_deleted_id: StreamId,
    pub length: u64,
}

impl Meta {
    fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(48);
        out.put_slice(&self.last_id.to_bytes());
        out.put_u64(self.entries_added);
        out.put_slice(&self.max_deleted_id.to_bytes());
        out.put_u64(self.length);
        out.freeze()
    }

    fn decode(bytes: &[u8]) -> Option<Meta> {
        if bytes.len() != 48 {
            return None;
        }
        Some(Meta {
            last_id: StreamId::from_bytes(&bytes[..16])?,
            entries_added: u64::from_be_bytes(bytes[16..24].try_into().ok()?),
            max_deleted_id: StreamId::from_bytes(&bytes[24..40])?,
            length: u64::from_be_bytes(bytes[40..].try_into().ok()?),
        })
    }
}

pub(super) fn stream_prefix(key: &[u8]) -> BytesMut {
    group_prefix(STREAM_TAG, key)
}

pub(super) fn meta_key(key: &[u8]) -> Bytes {
    let mut k = stream_prefix(key);
    k.put_u8(META_RECORD);
    k.freeze()
}

pub(super) fn entry_key(key: &[u8], id: StreamId) -> Bytes {
    let mut k = stream_prefix(key);
    k.put_u8(ENTRY_RECORD);
    k.put_slice(&id.to_bytes());
    k.freeze()
}

/// A bound on entry records (after the stream's prefix) at `id`.
fn entry_bound(id: StreamId) -> Vec<u8> {
    let mut bound = vec![ENTRY_RECORD];
    bound.extend_from_slice(&id.to_bytes());
    bound
}

/// An entry's fields and values: their count, then each with its length (4 big-endian bytes).
fn encode_fields(pairs: &[(Bytes, Bytes)]) -> Bytes {
    let len = 4 + pairs.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>();
    let mut out = BytesMut::with_capacity(len);
    out.put_u32(u32::try_from(pairs.len()).expect("fewer than 4 G fields"));
    for item in pairs.iter().flat_map(|(f, v)| [f, v]) {
        out.put_u32(u32::try_from(item.len()).expect("items are shorter than 4 GiB"));
        out.put_slice(item);
    }
    out.freeze()
}

/// The fields and values `encode_fields` wrote, as one flat list; `None` if malformed.
fn decode_fields(value: &Bytes) -> Option<Vec<Bytes>> {
    let count = u32::from_be_bytes(value.get(..4)?.try_into().ok()?) as usize;
    let mut items = Vec::with_capacity(count.min(value.len()) * 2);
    let mut at = 4;
    for _ in 0..count * 2 {
        let len = u32::from_be_bytes(value.get(at..at + 4)?.try_into().ok()?) as usize;
        at += 4;
        let end = at.checked_add(len).filter(|&end| end <= value.len())?;
        items.push(value.slice(at..end));
        at = end;
    }
    (at == value.len()).then_some(items)
}

pub(super) fn entry_reply(id: StreamId, value: &Bytes) -> Value {
    let fields = decode_fields(value).unwrap_or_else(|| unreadable_value());
    Value::array(vec![
        Value::bulk(id.text()),
        Value::array(fields.into_iter().map(Value::bulk).collect()),
    ])
}

/// The id XADD gives an entry after `last` at `now_ms`; `None` when it would not be greater.
fn new_id(requested: NewId, last: StreamId, now_ms: u64) -> Option<StreamId> {
    match requested {
        NewId::Auto if now_ms > last.ms => Some(StreamId { ms: now_ms, seq: 0 }),
        NewId::Auto => last.next(),
        NewId::AutoSeq(ms) if ms > last.ms => Some(StreamId { ms, seq: 0 }),
        NewId::AutoSeq(ms) if ms == last.ms => last.seq.checked_add(1).map(|seq| StreamId { ms, seq }),
        NewId::AutoSeq(_) => None,
        NewId::Explicit(id) => (id > last).then_some(id),
    }
}

impl KvState {
    /// The stream `key` holds: `None` if nothing, `WRONGTYPE` if something else.
    pub(super) fn stream_meta(&mut self, key: &[u8]) -> Result<Option<Meta>, Value> {
        if !self.type_check(key, KeyType::Stream)? {
            return Ok(None);
        }
        let meta = self.store.get(&meta_key(key)).unwrap_or_else(|e| unreadable(e));
        let meta = meta.as_deref().and_then(Meta::decode);
        Ok(Some(meta.unwrap_or_else(|| unreadable_value())))
    }

    pub(super) fn put_stream_meta(&mut self, index: u64, key: &[u8], meta: &Meta) {
        self.store.write(index, meta_key(key), Some(meta.encode()));
    }

    /// Up to `take` entries of stream `key` from `from` to `to` (inclusive), in id order or
    /// (`backwards`) from `to` down.
    pub(super) fn stream_entries(
        &mut self,
        key: &[u8],
        from: StreamId,
        to: StreamId,
        take: usize,
        backwards: bool,
    ) -> Vec<(StreamId, Bytes)> {
        if from > to {
            return Vec::new();
        }
        let prefix = stream_prefix(key);
        let (from, to) = (entry_bound(from), entry_bound(to));
        let keys = self.store.group_keys_between(
            &prefix,
            (Bound::Included(from.as_slice()), Bound::Included(to.as_slice())),
            0,
            take,
            backwards,
        );
        keys.into_iter()
            .map(|k| {
                let id = StreamId::from_bytes(&k[prefix.len() + 1..]).unwrap_or_else(|| unreadable_value());
                let value = self.store.get(&k).unwrap_or_else(|e| unreadable(e));
                (id, value.unwrap_or_else(|| unreadable_value()))
            })
            .collect()
    }

    /// Removes the oldest entries of stream `key` that `trim` says go, and counts them out of
    /// `meta`; how many it removed.
    fn trim_stream(&mut self, index: u64, key: &[u8], meta: &mut Meta, trim: &Trim) -> usize {
        let limit = trim.limit.map_or(usize::MAX, |n| n as usize);
        let doomed = match trim.to {
            TrimTo::MaxLen(max_len) => {
                let excess = meta.length.saturating_sub(max_len) as usize;
                self.stream_entries(key, StreamId::MIN, StreamId::MAX, excess.min(limit), false)
            }
            TrimTo::MinId(min_id) => match min_id.previous() {
                Some(below) => self.stream_entries(key, StreamId::MIN, below, limit, false),
                None => Vec::new(),
            },
        };
        for (id, _) in &doomed {
            self.store.write(index, entry_key(key, *id), None);
        }
        meta.length -= doomed.len() as u64;
        doomed.len()
    }

    pub(super) fn execute_stream_write(&mut self, index: u64, write: StreamWrite) -> Value {
        match write {
            StreamWrite::Add {
                key,
                no_create,
                trim,
                id,
                pairs,
            } => {
                let meta = match self.stream_meta(&key) {
                    Err(e) => return e,
                    Ok(None) if no_create => return Value::null(),
                    Ok(meta) => meta.unwrap_or_default(),
                };
                if meta.last_id == StreamId::MAX {
                    return Value::error("ERR The stream has exhausted the last possible ID, unable to add more items");
                }
                let Some(id) = new_id(id, meta.last_id, self.now_ms) else {
                    return Value::error(ID_NOT_GREATER);
                };
                self.store
                    .write(index, entry_key(&key, id), Some(encode_fields(&pairs)));
                let mut meta = Meta {
                    last_id: id,
                    entries_added: meta.entries_added + 1,
                    length: meta.length + 1,
                    ..meta
                };
                self.notify(keyspace_events::STREAM, "xadd", &key);
                if trim.is_some_and(|trim| self.trim_stream(index, &key, &mut meta, &trim) > 0) {
                    self.notify(keyspace_events::STREAM, "xtrim", &key);
                }
                self.put_stream_meta(index, &key, &meta);
                Value::bulk(id.text())
            }
            StreamWrite::Delete { key, ids } => {
                let mut meta = match self.stream_meta(&key) {
                    Err(e) => return e,
                    Ok(None) => return Value::Integer(0),
                    Ok(Some(meta)) => meta,
                };
                let ids = match ids {
                    Err(e) => return Value::error(e),
                    Ok(ids) => ids,
                };
                let mut deleted = 0;
                for id in ids {
                    let record = entry_key(&key, id);
                    if self.store.contains(&record) {
                        self.store.write(index, record, None);
                        meta.max_deleted_id = meta.max_deleted_id.max(id);
                        meta.length -= 1;
                        deleted += 1;
                    }
                }
                if deleted > 0 {
                    self.put_stream_meta(index, &key, &meta);
                    self.notify(keyspace_events::STREAM, "xdel", &key);
                }
                Value::Integer(deleted)
            }
            StreamWrite::Trim { key, trim } => {
                let mut meta = match self.stream_meta(&key) {
                    Err(e) => return e,
                    Ok(None) => return Value::Integer(0),
                    Ok(Some(meta)) => meta,
                };
                let removed = self.trim_stream(index, &key, &mut meta, &trim);
                if removed > 0 {
                    self.put_stream_meta(index, &key, &meta);
                    self.notify(keyspace_events::STREAM, "xtrim", &key);
                }
                Value::Integer(removed as i64)
            }
            StreamWrite::SetId {
                key,
                last_id,
                entries_added,
                max_deleted_id,
            } => {
                let mut meta = match self.stream_meta(&key) {
                    Err(e) => return e,
                    Ok(None) => return Value::error("ERR no such key"),
                    Ok(Some(meta)) => meta,
                };
                if meta.length > 0 {
                    if self.last_entry_id(&key).is_some_and(|top| last_id < top) {
                        return Value::error(
                            "ERR The ID specified in XSETID is smaller than the target stream top item",
                        );
                    }
                    if entries_added.is_some_and(|added| meta.length > added) {
                        return Value::error(
                            "ERR The entries_added specified in XSETID is smaller than the target stream length",
                        );
                    }
                }
                meta.last_id = last_id;
                meta.entries_added = entries_added.unwrap_or(meta.entries_added);
                if let Some(id) = max_deleted_id.filter(|id| *id != StreamId::MIN) {
                    meta.max_deleted_id = id;
                }
                self.put_stream_meta(index, &key, &meta);
                self.notify(keyspace_events::STREAM, "xsetid", &key);
                Value::ok()
            }
            StreamWrite::Group(write) => self.execute_group_write(index, write),
        }
    }

    pub(super) fn read_stream(&mut self, read: &StreamRead) -> Result<Value, Value> {
        Ok(match read {
            StreamRead::Len(key) => Value::Integer(self.stream_meta(key)?.map_or(0, |meta| meta.length as i64)),
            StreamRead::Range {
                key,
                from,
                to,
                count,
                reverse,
            } => {
                if self.stream_meta(key)?.is_none() {
                    return Ok(Value::array(Vec::new()));
                }
                if *count == Some(0) {
                    return Ok(Value::Array(None));
                }
                let take = count.map_or(usize::MAX, |n| n as usize);
                let entries = self.stream_entries(key, *from, *to, take, *reverse);
                Value::array(entries.iter().map(|(id, value)| entry_reply(*id, value)).collect())
            }
            StreamRead::Read { count, streams } => {
                let mut after = Vec::with_capacity(streams.len());
                for (key, read_after) in streams {
                    let meta = self.stream_meta(key)?;
                    let id = match read_after {
                        Err(e) => return Err(Value::error(e.clone())),
                        Ok(ReadAfter::Id(id)) => *id,
                        Ok(ReadAfter::Last) => meta.map_or(StreamId::MIN, |meta| meta.last_id),
                    };
                    after.push((key, meta.is_some(), id));
                }
                let take = if *count == 0 { usize::MAX } else { *count as usize };
                let mut served = Vec::new();
                for (key, exists, id) in after {
                    let Some(from) = id.next().filter(|_| exists) else {
                        continue;
                    };
                    let entries = self.stream_entries(key, from, StreamId::MAX, take, false);
                    if !entries.is_empty() {
                        let entries = entries.iter().map(|(id, value)| entry_reply(*id, value)).collect();
                        served.push((Value::bulk(key.clone()), Value::array(entries)));
                    }
                }
                if served.is_empty() {
                    Value::Array(None)
                } else {
                    Value::KeyedPairs(served)
                }
            }
            StreamRead::Group(read) => self.read_group(read)?,
            StreamRead::LastIds(keys) => {
                let mut ids = Vec::with_capacity(keys.len());
                for key in keys {
                    let last = self.stream_meta(key)?.map_or(StreamId::MIN, |meta| meta.last_id);
                    ids.push(Value::bulk(last.text()));
                }
                Value::array(ids)
            }
        })
    }

    /// A stream's records as they are stored (after its prefix), read whole (RENAME, COPY).
    pub(super) fn stream_records(&mut self, key: &[u8]) -> Vec<(Bytes, Bytes)> {
        let prefix = stream_prefix(key);
        let records = self.store.scan_group(&prefix).unwrap_or_else(|e| unreadable(e));
        records.into_iter().map(|(k, v)| (k.slice(prefix.len()..), v)).collect()
    }

    /// Writes a stream's records (`stream_records`) under `to`.
    pub(super) fn put_stream(&mut self, index: u64, to: &[u8], records: Vec<(Bytes, Bytes)>) {
        for (rest, value) in records {
            let mut k = stream_prefix(to);
            k.put_slice(&rest);
            self.store.write(index, k.freeze(), Some(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_decode_as_encoded_and_malformed_ones_are_refused() {
        let pairs = vec![
            (Bytes::from("f"), Bytes::from("")),
            (Bytes::from(""), Bytes::from("v2")),
        ];
        let encoded = encode_fields(&pairs);
        let flat: Vec<Bytes> = pairs.iter().flat_map(|(f, v)| [f.clone(), v.clone()]).collect();
        assert_eq!(decode_fields(&encoded), Some(flat));
        for cut in 0..encoded.len() {
            assert_eq!(decode_fields(&encoded.slice(..cut)), None, "cut at {cut}");
        }
        let mut longer = encoded.to_vec();
        longer.push(0);
        assert_eq!(decode_fields(&Bytes::from(longer)), None);
    }

    #[test]
    fn new_ids_grow_from_the_last_one() {
        let last = StreamId { ms: 5, seq: 3 };
        assert_eq!(new_id(NewId::Auto, last, 9), Some(StreamId { ms: 9, seq: 0 }));
        assert_eq!(new_id(NewId::Auto, last, 4), Some(StreamId { ms: 5, seq: 4 }));
        assert_eq!(new_id(NewId::AutoSeq(5), last, 0), Some(StreamId { ms: 5, seq: 4 }));
        assert_eq!(new_id(NewId::AutoSeq(4), last, 0), None);
        assert_eq!(new_id(NewId::Explicit(last), last, 0), None);
        let top = StreamId { ms: 5, seq: u64::MAX };
        assert_eq!(new_id(NewId::AutoSeq(5), top, 0), None);
        assert_eq!(new_id(NewId::Auto, top, 0), Some(StreamId { ms: 6, seq: 0 }));
    }
}
