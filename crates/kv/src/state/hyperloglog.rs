//! PFADD, PFCOUNT and PFMERGE on HyperLogLog strings (the format is `crate::hyperloglog`'s).
//!
//! PFCOUNT is a read: unlike Redis it does not write the cardinality it counted back into the
//! string, so any node answers it without a log entry; the cached cardinality's bytes of a
//! HyperLogLog therefore read "stale" here where Redis has refreshed them, and nothing else
//! differs.

use bytes::Bytes;
use chorus_resp::Value;

use super::KvState;
use crate::hyperloglog::{self as hll, HllError};
use crate::keyspace_events;

fn hll_error(e: HllError) -> Value {
    Value::error(e.message())
}

impl KvState {
    /// The HyperLogLog `key` holds for a write, if any; WRONGTYPE for another type or a
    /// string that is not one.
    fn hll_to_update(&mut self, key: &[u8]) -> Result<Option<Bytes>, Value> {
        let value = self.string_to_update(key)?;
        if let Some(value) = &value {
            hll::check(value).map_err(hll_error)?;
        }
        Ok(value)
    }

    /// PFADD's new value of `key` (`None` when no register changed) and reply.
    fn pf_added(&mut self, key: &[u8], elements: &[Bytes]) -> Result<(Option<Vec<u8>>, Value), Value> {
        let (mut value, mut updated) = match self.hll_to_update(key)? {
            None => (hll::empty(), true),
            Some(value) => (value.to_vec(), false),
        };
        for element in elements {
            updated |= hll::add(&mut value, element).map_err(hll_error)?;
        }
        if updated {
            hll::invalidate_count(&mut value);
        }
        Ok((updated.then_some(value), Value::Integer(i64::from(updated))))
    }

    /// PFADD: 1 if a register changed (or the key was made), else 0.
    pub(super) fn pf_add(&mut self, index: u64, key: &Bytes, elements: &[Bytes]) -> Value {
        match self.pf_added(key, elements) {
            Err(e) => e,
            Ok((None, reply)) => reply,
            Ok((Some(value), reply)) => {
                self.set_string(index, key, Bytes::from(value));
                self.notify(keyspace_events::STRING, "pfadd", key);
                reply
            }
        }
    }

    /// What PFADD will answer, before it applies.
    pub(super) fn preview_pf_add(&mut self, key: &[u8], elements: &[Bytes]) -> Value {
        self.pf_added(key, elements).map_or_else(|e| e, |(_, reply)| reply)
    }

    /// PFMERGE's new value of `dest`: its registers raised to every source's (`dest` itself
    /// counting as the first source, as in Redis), dense if any of them was.
    fn pf_merged(&mut self, dest: &Bytes, sources: &[Bytes]) -> Result<Vec<u8>, Value> {
        let mut max = [0u8; hll::REGISTERS];
        let mut dense = false;
        let held = self.hll_to_update(dest)?;
        let mut merge = |value: &[u8]| {
            dense |= hll::is_dense(value);
            hll::merge_into(&mut max, value).map_err(hll_error)
        };
        if let Some(value) = &held {
            merge(value)?;
        }
        for key in sources {
            if let Some(value) = self.hll_to_update(key)? {
                merge(&value)?;
            }
        }
        let mut merged = held.map_or_else(hll::empty, |value| value.to_vec());
        if dense {
            hll::make_dense(&mut merged).map_err(hll_error)?;
        }
        for (register, &value) in max.iter().enumerate() {
            if value > 0 {
                hll::set_register(&mut merged, register, value).map_err(hll_error)?;
            }
        }
        hll::invalidate_count(&mut merged);
        Ok(merged)
    }

    /// PFMERGE: OK, and a `pfadd` event even when nothing changed (as Redis).
    pub(super) fn pf_merge(&mut self, index: u64, dest: &Bytes, sources: &[Bytes]) -> Value {
        match self.pf_merged(dest, sources) {
            Err(e) => e,
            Ok(merged) => {
                self.set_string(index, dest, Bytes::from(merged));
                self.notify(keyspace_events::STRING, "pfadd", dest);
                Value::ok()
            }
        }
    }

    /// What PFMERGE will answer, before it applies.
    pub(super) fn preview_pf_merge(&mut self, dest: &Bytes, sources: &[Bytes]) -> Value {
        self.pf_merged(dest, sources).map_or_else(|e| e, |_| Value::ok())
    }

    /// PFCOUNT: one key's cardinality (its recorded one if still fresh), or the union's.
    pub(super) fn pf_count(&mut self, keys: &[Bytes]) -> Result<Value, Value> {
        if let [key] = keys {
            let Some(value) = self.string(key)? else {
                return Ok(Value::Integer(0));
            };
            hll::check(&value).map_err(hll_error)?;
            let count = match hll::cached_count(&value) {
                Some(count) => count,
                None => hll::count(&value).map_err(hll_error)?,
            };
            return Ok(Value::Integer(count as i64));
        }
        let mut max = [0u8; hll::REGISTERS];
        for key in keys {
            if let Some(value) = self.string(key)? {
                hll::check(&value).map_err(hll_error)?;
                hll::merge_into(&mut max, &value).map_err(hll_error)?;
            }
        }
        Ok(Value::Integer(hll::count_registers(&max) as i64))
    }
}
