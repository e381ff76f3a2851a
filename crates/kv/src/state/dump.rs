//! DUMP and RESTORE (the payload format is `crate::dump`'s).

use chorus_resp::Value;

use super::{KvState, Stored};
use crate::command::RestoreArgs;
use crate::dump::{self, DumpValue};
use crate::keyspace_events;

impl KvState {
    /// DUMP: the payload of what `key` holds, or nil.
    pub(super) fn dump(&mut self, key: &[u8]) -> Result<Value, Value> {
        if !self.exists(key) {
            return Ok(Value::null());
        }
        let value = match self.stored(key) {
            None => return Ok(Value::null()),
            Some(Stored::String(bytes)) => DumpValue::String(bytes),
            Some(Stored::List(items)) => DumpValue::List(items),
            Some(Stored::Set(members)) => DumpValue::Set(members),
            Some(Stored::Zset(members)) => DumpValue::Zset(members),
            Some(Stored::Hash(fields)) => DumpValue::Hash(fields),
            Some(Stored::Stream(_)) => return Err(Value::error("ERR DUMP of a stream is not supported by Chorus")),
        };
        Ok(Value::bulk(dump::encode(&value)))
    }

    /// What RESTORE does, checked in Redis 7.0's order (BUSYKEY, the TTL, the payload): the
    /// value and its deadline (`None` inside: it has expired already), or the error.
    fn restoring(&mut self, args: &RestoreArgs) -> Result<(DumpValue, Option<Option<u64>>), Value> {
        if !args.replace && self.exists(&args.key) {
            return Err(Value::error("BUSYKEY Target key name already exists."));
        }
        let ttl_ms = *args.ttl_ms.as_ref().map_err(|e| Value::error(e.clone()))?;
        let value = dump::decode(&args.payload).map_err(|e| Value::error(e.message()))?;
        let deadline = match ttl_ms {
            0 => Some(None),
            ttl if args.absolute => (ttl > self.now_ms as i64).then_some(Some(ttl as u64)),
            ttl => {
                let at = ttl.saturating_add(self.now_ms as i64);
                (at > self.now_ms as i64).then_some(Some(at as u64))
            }
        };
        Ok((value, deadline))
    }

    pub(super) fn restore(&mut self, index: u64, args: &RestoreArgs) -> Value {
        let key = &args.key;
        let (value, deadline) = match self.restoring(args) {
            Err(e) => return e,
            Ok(restoring) => restoring,
        };
        let Some(deadline) = deadline else {
            // Expired on arrival: the key is only deleted (REPLACE), as in Redis.
            if args.replace && self.delete(index, key) {
                self.notify(keyspace_events::GENERIC, "del", key);
            }
            return Value::ok();
        };
        let stored = match value {
            DumpValue::String(bytes) => Stored::String(bytes),
            DumpValue::List(items) => Stored::List(items),
            DumpValue::Set(members) => Stored::Set(members),
            DumpValue::Zset(members) => Stored::Zset(members),
            DumpValue::Hash(fields) => Stored::Hash(fields),
        };
        self.put_stored(index, key, stored, deadline);
        self.notify(keyspace_events::GENERIC, "restore", key);
        Value::ok()
    }

    /// What RESTORE will answer, before it applies.
    pub(super) fn preview_restore(&mut self, args: &RestoreArgs) -> Value {
        self.restoring(args).map_or_else(|e| e, |_| Value::ok())
    }
}
