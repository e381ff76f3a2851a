//! The key-value state machine: strings and hashes in memory, fed by the committed log.
//! Snapshots serialise the whole map (the log-reduction work replaces this with segments).

use std::collections::HashMap;

use bytes::Bytes;
use chorus_log::StateMachine;
use chorus_resp::Value;

use crate::command::{decode_args, Command, Read, SetCondition, Write};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    Str(Bytes),
    Hash(HashMap<Bytes, Bytes>),
}

#[derive(Default)]
pub struct KvState {
    objects: HashMap<Bytes, Object>,
}

impl KvState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    fn string(&self, key: &[u8]) -> Result<Option<&Bytes>, Value> {
        match self.objects.get(key) {
            None => Ok(None),
            Some(Object::Str(s)) => Ok(Some(s)),
            Some(Object::Hash(_)) => Err(Value::error(WRONGTYPE)),
        }
    }

    fn hash(&self, key: &[u8]) -> Result<Option<&HashMap<Bytes, Bytes>>, Value> {
        match self.objects.get(key) {
            None => Ok(None),
            Some(Object::Hash(h)) => Ok(Some(h)),
            Some(Object::Str(_)) => Err(Value::error(WRONGTYPE)),
        }
    }

    /// Applies a write, taking its keys and values into the map as they are.
    pub fn execute_write(&mut self, write: Write) -> Value {
        match write {
            Write::Set {
                key,
                value,
                condition,
                reply_as_int,
            } => {
                let allowed = match condition {
                    SetCondition::Always => true,
                    SetCondition::IfAbsent => !self.objects.contains_key(&key),
                    SetCondition::IfPresent => self.objects.contains_key(&key),
                };
                if allowed {
                    self.objects.insert(key, Object::Str(value));
                }
                match (reply_as_int, allowed) {
                    (true, _) => Value::Integer(allowed as i64),
                    (false, true) => Value::ok(),
                    (false, false) => Value::null(),
                }
            }
            Write::Del(keys) => {
                Value::Integer(keys.iter().filter(|k| self.objects.remove(*k).is_some()).count() as i64)
            }
            Write::MSet(pairs) => {
                for (k, v) in pairs {
                    self.objects.insert(k, Object::Str(v));
                }
                Value::ok()
            }
            Write::IncrBy { key, delta } => {
                let current = match self.string(&key) {
                    Err(e) => return e,
                    Ok(None) => 0,
                    Ok(Some(s)) => match crate::command::parse_i64(s) {
                        Ok(n) => n,
                        Err(e) => return Value::error(e),
                    },
                };
                match current.checked_add(delta) {
                    Some(n) => {
                        self.objects.insert(key, Object::Str(Bytes::from(n.to_string())));
                        Value::Integer(n)
                    }
                    None => Value::error("ERR increment or decrement would overflow"),
                }
            }
            Write::Append { key, value } => {
                let appended = match self.string(&key) {
                    Err(e) => return e,
                    Ok(None) => value,
                    Ok(Some(s)) => {
                        let mut joined = Vec::with_capacity(s.len() + value.len());
                        joined.extend_from_slice(s);
                        joined.extend_from_slice(&value);
                        Bytes::from(joined)
                    }
                };
                let len = appended.len() as i64;
                self.objects.insert(key, Object::Str(appended));
                Value::Integer(len)
            }
            Write::HSet { key, pairs, reply_ok } => {
                if let Err(e) = self.hash(&key) {
                    return e;
                }
                let Object::Hash(h) = self.objects.entry(key).or_insert_with(|| Object::Hash(HashMap::new())) else {
                    unreachable!("type checked above");
                };
                let mut added = 0;
                for (field, value) in pairs {
                    added += usize::from(h.insert(field, value).is_none());
                }
                if reply_ok {
                    Value::ok()
                } else {
                    Value::Integer(added as i64)
                }
            }
            Write::HDel { key, fields } => {
                let removed = match self.objects.get_mut(&key) {
                    None => 0,
                    Some(Object::Str(_)) => return Value::error(WRONGTYPE),
                    Some(Object::Hash(h)) => fields.iter().filter(|f| h.remove(*f).is_some()).count(),
                };
                if matches!(self.objects.get(&key), Some(Object::Hash(h)) if h.is_empty()) {
                    self.objects.remove(&key);
                }
                Value::Integer(removed as i64)
            }
        }
    }

    pub fn execute_read(&self, read: &Read) -> Value {
        let result = || -> Result<Value, Value> {
            Ok(match read {
                Read::Get(key) => Value::Bulk(self.string(key)?.cloned()),
                Read::MGet(keys) => Value::array(
                    keys.iter()
                        .map(|k| match self.objects.get(k) {
                            Some(Object::Str(s)) => Value::bulk(s.clone()),
                            _ => Value::null(),
                        })
                        .collect(),
                ),
                Read::Exists(keys) => {
                    Value::Integer(keys.iter().filter(|k| self.objects.contains_key(*k)).count() as i64)
                }
                Read::StrLen(key) => Value::Integer(self.string(key)?.map_or(0, |s| s.len()) as i64),
                Read::Type(key) => Value::Simple(
                    match self.objects.get(key) {
                        None => "none",
                        Some(Object::Str(_)) => "string",
                        Some(Object::Hash(_)) => "hash",
                    }
                    .into(),
                ),
                Read::HGet { key, field } => Value::Bulk(self.hash(key)?.and_then(|h| h.get(field)).cloned()),
                Read::HMGet { key, fields } => {
                    let h = self.hash(key)?;
                    Value::array(
                        fields
                            .iter()
                            .map(|f| Value::Bulk(h.and_then(|h| h.get(f)).cloned()))
                            .collect(),
                    )
                }
                Read::HGetAll(key) => {
                    let mut pairs: Vec<_> = self.hash(key)?.into_iter().flatten().collect();
                    pairs.sort();
                    Value::array(
                        pairs
                            .into_iter()
                            .flat_map(|(f, v)| [Value::bulk(f.clone()), Value::bulk(v.clone())])
                            .collect(),
                    )
                }
                Read::HLen(key) => Value::Integer(self.hash(key)?.map_or(0, |h| h.len()) as i64),
                Read::HExists { key, field } => {
                    Value::Integer(self.hash(key)?.is_some_and(|h| h.contains_key(field)) as i64)
                }
                Read::DbSize => Value::Integer(self.objects.len() as i64),
            })
        };
        result().unwrap_or_else(|e| e)
    }
}

const SNAPSHOT_MAGIC: &[u8; 8] = b"CHKVSN01";
const TAG_STR: u8 = 1;
const TAG_HASH: u8 = 2;

fn put_blob(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

struct SnapshotReader<'a> {
    buf: &'a [u8],
}

impl<'a> SnapshotReader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!("truncated: wanted {n} bytes, {} left", self.buf.len()));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn blob(&mut self) -> Result<Bytes, String> {
        let n = self.u32()? as usize;
        Ok(Bytes::copy_from_slice(self.take(n)?))
    }
}

impl StateMachine for KvState {
    type Query = Read;
    type Output = Value;

    fn apply(&mut self, _index: u64, command: &[u8]) -> Value {
        let args = match decode_args(command) {
            Ok(args) => args,
            Err(e) => return Value::error(format!("ERR undecodable command in log: {e}")),
        };
        match Command::parse(&args) {
            Ok(Some(Command::Write(w))) => self.execute_write(w),
            Ok(Some(Command::Read(_))) | Ok(None) => Value::error("ERR only write commands belong in the log"),
            Err(e) => Value::error(e),
        }
    }

    fn query(&self, query: &Read) -> Value {
        self.execute_read(query)
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.objects.len() * 64);
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&(self.objects.len() as u64).to_le_bytes());
        for (key, object) in &self.objects {
            match object {
                Object::Str(s) => {
                    out.push(TAG_STR);
                    put_blob(&mut out, key);
                    put_blob(&mut out, s);
                }
                Object::Hash(h) => {
                    out.push(TAG_HASH);
                    put_blob(&mut out, key);
                    out.extend_from_slice(&(h.len() as u32).to_le_bytes());
                    for (f, v) in h {
                        put_blob(&mut out, f);
                        put_blob(&mut out, v);
                    }
                }
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Copying the map costs a table and a reference count per value; serialising the copy (the
    /// megabytes of the snapshot) then happens off the raft loop.
    fn snapshot_later(&self) -> Box<dyn FnOnce() -> Vec<u8> + Send> {
        let copy = KvState {
            objects: self.objects.clone(),
        };
        Box::new(move || copy.snapshot())
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        if snapshot.len() < SNAPSHOT_MAGIC.len() + 12 || &snapshot[..8] != SNAPSHOT_MAGIC {
            return Err("not a key-value snapshot".into());
        }
        let (body, crc) = snapshot.split_at(snapshot.len() - 4);
        if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err("key-value snapshot checksum mismatch".into());
        }
        let mut r = SnapshotReader { buf: &body[8..] };
        let count = r.u64()? as usize;
        let mut objects = HashMap::with_capacity(count.min(body.len() / 9));
        for _ in 0..count {
            let tag = r.take(1)?[0];
            let key = r.blob()?;
            let object = match tag {
                TAG_STR => Object::Str(r.blob()?),
                TAG_HASH => {
                    let n = r.u32()? as usize;
                    let mut h = HashMap::with_capacity(n.min(r.buf.len() / 8));
                    for _ in 0..n {
                        h.insert(r.blob()?, r.blob()?);
                    }
                    Object::Hash(h)
                }
                other => return Err(format!("unknown object tag {other}")),
            };
            objects.insert(key, object);
        }
        if !r.buf.is_empty() {
            return Err("trailing bytes in key-value snapshot".into());
        }
        self.objects = objects;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::encode_args;

    fn run(state: &mut KvState, cmd: &str) -> Value {
        let args: Vec<Bytes> = cmd.split(' ').map(|p| Bytes::copy_from_slice(p.as_bytes())).collect();
        match Command::parse(&args).unwrap().unwrap() {
            Command::Write(_) => state.apply(1, &encode_args(&args)),
            Command::Read(r) => state.query(&r),
        }
    }

    #[test]
    fn string_commands_behave_like_redis() {
        let mut s = KvState::new();
        assert_eq!(run(&mut s, "SET a 1"), Value::ok());
        assert_eq!(run(&mut s, "SET a 2 NX"), Value::null());
        assert_eq!(run(&mut s, "SET b 2 XX"), Value::null());
        assert_eq!(run(&mut s, "SETNX b 5"), Value::Integer(1));
        assert_eq!(run(&mut s, "INCR a"), Value::Integer(2));
        assert_eq!(run(&mut s, "INCRBY a 40"), Value::Integer(42));
        assert_eq!(run(&mut s, "DECR a"), Value::Integer(41));
        assert_eq!(run(&mut s, "APPEND a x"), Value::Integer(3));
        assert!(run(&mut s, "INCR a").is_error(), "41x is not an integer");
        assert_eq!(run(&mut s, "GET a"), Value::bulk("41x"));
        assert_eq!(run(&mut s, "STRLEN a"), Value::Integer(3));
        assert_eq!(run(&mut s, "MSET c 3 d 4"), Value::ok());
        assert_eq!(
            run(&mut s, "MGET c nope d"),
            Value::array(vec![Value::bulk("3"), Value::null(), Value::bulk("4")])
        );
        assert_eq!(run(&mut s, "EXISTS a c nope a"), Value::Integer(3));
        assert_eq!(run(&mut s, "DEL a nope"), Value::Integer(1));
        assert_eq!(run(&mut s, "DBSIZE"), Value::Integer(3));
        assert_eq!(run(&mut s, "SET max 9223372036854775807"), Value::ok());
        assert!(run(&mut s, "INCR max").is_error());
        assert_eq!(run(&mut s, "GET max"), Value::bulk("9223372036854775807"));
    }

    #[test]
    fn hash_commands_and_wrongtype() {
        let mut s = KvState::new();
        assert_eq!(run(&mut s, "HSET h f1 v1 f2 v2"), Value::Integer(2));
        assert_eq!(run(&mut s, "HSET h f1 v9"), Value::Integer(0));
        assert_eq!(run(&mut s, "HGET h f1"), Value::bulk("v9"));
        assert_eq!(run(&mut s, "HLEN h"), Value::Integer(2));
        assert_eq!(
            run(&mut s, "HGETALL h"),
            Value::array(vec![
                Value::bulk("f1"),
                Value::bulk("v9"),
                Value::bulk("f2"),
                Value::bulk("v2")
            ])
        );
        assert_eq!(run(&mut s, "HDEL h f1 f2 f3"), Value::Integer(2));
        assert_eq!(run(&mut s, "EXISTS h"), Value::Integer(0), "empty hashes disappear");
        run(&mut s, "SET str x");
        assert!(run(&mut s, "HSET str f v").is_error());
        assert!(run(&mut s, "HGET str f").is_error());
        run(&mut s, "HSET h f v");
        assert!(run(&mut s, "GET h").is_error());
        assert!(run(&mut s, "INCR h").is_error());
        assert_eq!(
            run(&mut s, "GET str"),
            Value::bulk("x"),
            "failed commands change nothing"
        );
    }

    #[test]
    fn snapshot_round_trip_and_corruption_detected() {
        let mut s = KvState::new();
        run(&mut s, "SET a 1");
        run(&mut s, "HSET h f v g w");
        let snap = s.snapshot();
        let mut restored = KvState::new();
        restored.restore(&snap).unwrap();
        assert_eq!(restored.objects, s.objects);
        for i in 0..snap.len() {
            let mut bad = snap.clone();
            bad[i] ^= 0x04;
            assert!(KvState::new().restore(&bad).is_err(), "flip at byte {i}");
        }
        assert!(KvState::new().restore(&snap[..snap.len() - 1]).is_err());
    }

    #[test]
    fn a_deferred_snapshot_holds_the_state_as_it_was_when_captured() {
        let mut s = KvState::new();
        run(&mut s, "SET a 1");
        run(&mut s, "HSET h f v");
        let captured = s.objects.clone();
        let serialise = s.snapshot_later();
        run(&mut s, "SET a 2");
        run(&mut s, "HSET h f changed g new");
        run(&mut s, "SET b 3");
        let mut restored = KvState::new();
        restored.restore(&serialise()).unwrap();
        assert_eq!(restored.objects, captured, "writes after the capture stay out");
        assert_ne!(restored.objects, s.objects);
    }

    #[test]
    fn garbage_in_the_log_is_an_error_reply_not_a_panic() {
        let mut s = KvState::new();
        assert!(s.apply(1, b"").is_error());
        assert!(s.apply(1, &[1, 255, 255, 255, 255]).is_error());
        assert!(s
            .apply(1, &encode_args(&[Bytes::from("GET"), Bytes::from("k")]))
            .is_error());
    }
}
