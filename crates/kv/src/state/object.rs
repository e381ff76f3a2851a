//! OBJECT ENCODING, REFCOUNT, IDLETIME and FREQ, answered as Redis 7.0 would for what a key holds
//! now. Redis keeps a container in its larger encoding once converted, even after it shrinks;
//! Chorus, storing every container one way, judges by the present contents.

use chorus_resp::Value;

use super::{KeyType, KvState, Stored, HASH_TAG, SET_TAG, ZSET_TAG};
use crate::command::{parse_i64, ObjectInfo};

/// Redis 7.0's defaults for its compact encodings.
const INTSET_MAX_ENTRIES: usize = 512;
const LISTPACK_MAX_ENTRIES: usize = 128;
const LISTPACK_MAX_VALUE_BYTES: usize = 64;
/// The longest string Redis keeps inline with its object header.
const EMBSTR_MAX_BYTES: usize = 44;
/// Redis shares the integers below this among all keys (their count of references shows as
/// `i32::MAX`).
const SHARED_INTEGERS: i64 = 10_000;

fn is_integer(bytes: &[u8]) -> bool {
    bytes.len() <= 20 && parse_i64(bytes).is_ok()
}

impl KvState {
    pub(super) fn object_info(&mut self, info: ObjectInfo, key: &[u8]) -> Result<Value, Value> {
        let Some(key_type) = self.key_type(key) else {
            return Ok(Value::null());
        };
        Ok(match info {
            ObjectInfo::IdleTime => Value::Integer(0),
            ObjectInfo::Frequency => {
                return Err(Value::error(
                    "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note \
                     that when switching between policies at runtime LRU and LFU data will take some time to \
                     adjust.",
                ))
            }
            ObjectInfo::RefCount => {
                let shared = key_type == KeyType::String
                    && self
                        .string(key)?
                        .is_some_and(|value| parse_i64(&value).is_ok_and(|n| (0..SHARED_INTEGERS).contains(&n)));
                Value::Integer(if shared { i64::from(i32::MAX) } else { 1 })
            }
            // Large containers, lists and streams are told apart without reading them.
            ObjectInfo::Encoding => Value::bulk(match key_type {
                KeyType::List => "quicklist",
                KeyType::Stream => "stream",
                KeyType::Set if self.group_size(SET_TAG, key) > INTSET_MAX_ENTRIES => "hashtable",
                KeyType::Zset if self.group_size(ZSET_TAG, key) / 2 > LISTPACK_MAX_ENTRIES => "skiplist",
                KeyType::Hash if self.group_size(HASH_TAG, key) > LISTPACK_MAX_ENTRIES => "hashtable",
                _ => self.small_encoding(key),
            }),
        })
    }

    /// The encoding of a string, or of a set, sorted set or hash small enough to be compact
    /// if its members are.
    fn small_encoding(&mut self, key: &[u8]) -> &'static str {
        match self.stored(key) {
            Some(Stored::String(value)) if is_integer(&value) => "int",
            Some(Stored::String(value)) if value.len() <= EMBSTR_MAX_BYTES => "embstr",
            Some(Stored::String(_)) => "raw",
            Some(Stored::Set(members))
                if members.len() <= INTSET_MAX_ENTRIES && members.iter().all(|m| is_integer(m)) =>
            {
                "intset"
            }
            Some(Stored::Set(_)) => "hashtable",
            Some(Stored::Zset(members))
                if members.len() <= LISTPACK_MAX_ENTRIES
                    && members.iter().all(|(m, _)| m.len() <= LISTPACK_MAX_VALUE_BYTES) =>
            {
                "listpack"
            }
            Some(Stored::Zset(_)) => "skiplist",
            Some(Stored::Hash(fields))
                if fields.len() <= LISTPACK_MAX_ENTRIES
                    && fields
                        .iter()
                        .all(|(f, v)| f.len() <= LISTPACK_MAX_VALUE_BYTES && v.len() <= LISTPACK_MAX_VALUE_BYTES) =>
            {
                "listpack"
            }
            Some(Stored::Hash(_)) => "hashtable",
            Some(Stored::List(_)) => "quicklist",
            Some(Stored::Stream(_)) => "stream",
            None => "none",
        }
    }
}
