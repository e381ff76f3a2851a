//! The key-value state machine: what each command reads and writes. The state itself lives in
//! `chorus_storage::Store` (reduced segments on disk, an index and an object cache in memory);
//! this module maps Redis types onto its flat key space. What must be answered without reading
//! values — which keys are hashes, sets or lists, how many fields, members or elements each has,
//! how many keys exist — the store's index answers: each of these is a group of keys there.
//!
//! Storage keys: a string `k` is `s k`; field `f` of hash `k` is `h len(k) k f` (length as 4
//! big-endian bytes), so one hash's fields are adjacent and each field is its own record: HSET of
//! one field in a 10,000-field hash writes one record, and a reduced batch keeps only the fields
//! it touched. Member `m` of set `k` is `S len(k) k m` with an empty value, likewise
//! (`sets.rs`), and a list's elements are `L len(k) k position` (`lists.rs`). A non-idempotent command (INCR, APPEND, SPOP, …) is recorded as what it did.
//! RIFL's completion records (`chorus_curp::rifl`) are keys too, `r` then the record's key, so
//! snapshots, restarts and catch-up carry them like any other state; they form one group, which
//! `DBSIZE` leaves out. They are held in memory and written to the store when a snapshot is taken:
//! a restart opens the state as of its snapshot and replays the log from there, so the records
//! need be in the store only at that point.
//!
//! Key expiry: a key's deadline is the key `x` then the key (8 big-endian bytes of milliseconds
//! since the Unix epoch), also held in memory (`Deadlines`); the log's clock (`crate::expiry`)
//! is the key `c`, written with the completion records. Both form groups of their own, which
//! `DBSIZE` leaves out. A write first deletes those of its keys that have expired by its
//! entry's time, through the log like any deletion; a read hides them; the leader's sweep
//! deletes the rest (`Logged::DeleteExpired`).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use chorus_curp::durable_witness::DurableWitness;
use chorus_curp::rifl::{Completions, Envelope, Verdict};
use chorus_log::{FinishRead, SlowRead, SnapshotFiles, StateMachine};
use chorus_metrics::Gauge;
use chorus_resp::{parse_value, write_value, Limits, Value};
use chorus_storage::{Located, Manifest, Store, StoreError, StoreOptions, INDEX_BYTES_PER_RECORD};

use crate::command::{
    decode_logged, invalid_expire_time, not_a_float, Command, Decimal, End, ExpireAt, ExpireCondition, Logged, Read,
    ScanArgs, SetCondition, TtlChange, Write,
};
use crate::curp::ApplyWatch;
use crate::decimal::{parse_float, Float};
use crate::expiry::{wall_clock_ms, Deadlines};
use crate::fnv::fnv1a_64;
use crate::glob::glob_match;
use crate::keyspace_events;
use crate::ldc::{Ldc, ReadKind};
use crate::listeners::Hub;
use crate::speculation::Proposed;
use sets::member_key;

mod bits;
mod dump;
mod functions;
mod geo;
mod hyperloglog;
mod lcs;
mod lists;
mod object;
mod scripts;
mod sets;
mod sort;
mod stream_groups;
mod streams;
mod transactions;
mod zsets;
use crate::storage_metrics::StorageMetrics;

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// Redis's `proto-max-bulk-len`: no string grows past it.
const MAX_STRING_BYTES: usize = 512 * 1024 * 1024;
const STRING_TAG: u8 = b's';
const HASH_TAG: u8 = b'h';
const RIFL_TAG: u8 = b'r';
const SET_TAG: u8 = b'S';
const LIST_TAG: u8 = b'L';
const ZSET_TAG: u8 = b'Z';
const STREAM_TAG: u8 = b'X';
const EXPIRY_TAG: u8 = b'x';
const CLOCK_KEY: &[u8] = b"c";
const SCRIPT_TAG: u8 = b'l';
/// A function library's code, by its name.
const LIBRARY_TAG: u8 = b'F';
/// A function's library, by the function's name.
const FUNCTION_TAG: u8 = b'f';
/// The `notify-keyspace-events` flags (two bytes, big-endian).
const KEYSPACE_EVENTS_KEY: &[u8] = b"n";
/// Tags of keys that hold no client key: each is one group, left out of `DBSIZE`.
const BOOKKEEPING_TAGS: [u8; 7] = [
    RIFL_TAG,
    EXPIRY_TAG,
    CLOCK_KEY[0],
    SCRIPT_TAG,
    KEYSPACE_EVENTS_KEY[0],
    LIBRARY_TAG,
    FUNCTION_TAG,
];

/// Replies to writes that did not execute, which the front end acts on (a client sees them only
/// if it sends enveloped writes of its own).
pub const OUT_OF_ORDER: &str = "OUTOFORDER an earlier write of this client has not executed";
pub const EXPIRED: &str = "EXPIRED this client's lease has expired";
pub const STALE: &str = "STALE this write was acknowledged already";

fn string_key(key: &[u8]) -> Bytes {
    let mut k = BytesMut::with_capacity(1 + key.len());
    k.put_u8(STRING_TAG);
    k.put_slice(key);
    k.freeze()
}

/// The prefix of a hash's fields or a set's members: the type's tag, the key's length as 4
/// big-endian bytes, the key.
fn group_prefix(tag: u8, key: &[u8]) -> BytesMut {
    let mut k = BytesMut::with_capacity(5 + key.len() + 16);
    k.put_u8(tag);
    k.put_u32(u32::try_from(key.len()).expect("keys are shorter than 4 GiB"));
    k.put_slice(key);
    k
}

fn hash_prefix(key: &[u8]) -> BytesMut {
    group_prefix(HASH_TAG, key)
}

/// A xorshift step: the pseudo-random numbers of random picks.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn rifl_key(suffix: &[u8]) -> Bytes {
    let mut k = BytesMut::with_capacity(1 + suffix.len());
    k.put_u8(RIFL_TAG);
    k.put_slice(suffix);
    k.freeze()
}

fn expiry_key(key: &[u8]) -> Bytes {
    let mut k = BytesMut::with_capacity(1 + key.len());
    k.put_u8(EXPIRY_TAG);
    k.put_slice(key);
    k.freeze()
}

fn field_key(key: &[u8], field: &[u8]) -> Bytes {
    let mut k = hash_prefix(key);
    k.put_slice(field);
    k.freeze()
}

/// The types stored as groups of records (a record per hash field, set member, list element,
/// two per sorted-set member), each by its tag.
const GROUP_TYPES: [(u8, KeyType); 5] = [
    (HASH_TAG, KeyType::Hash),
    (SET_TAG, KeyType::Set),
    (LIST_TAG, KeyType::List),
    (ZSET_TAG, KeyType::Zset),
    (STREAM_TAG, KeyType::Stream),
];

/// Hash fields are the keys the store must scan by prefix (HGETALL, deleting a hash), and so
/// are the records of the other grouped types.
fn is_field_key(storage_key: &[u8]) -> bool {
    storage_key
        .first()
        .is_some_and(|tag| GROUP_TYPES.iter().any(|(group_tag, _)| group_tag == tag))
}

/// The fields of one hash form a group in the store: kept together, scanned together, counted
/// without a scan. The group is the field key's prefix naming the hash; strings are in no group.
fn group_of(storage_key: &[u8]) -> Option<usize> {
    if storage_key.first().is_some_and(|tag| BOOKKEEPING_TAGS.contains(tag)) {
        return Some(1);
    }
    if !is_field_key(storage_key) {
        return None;
    }
    let len = u32::from_be_bytes(storage_key.get(1..5)?.try_into().ok()?) as usize;
    let group_len = 5usize.checked_add(len)?;
    (storage_key.len() >= group_len).then_some(group_len)
}

pub struct KvState {
    store: Store,
    completions: Completions<Value>,
    /// What this node, as CURP leader, has proposed and not applied.
    proposed: Proposed,
    metrics: StorageMetrics,
    rifl_clients: Arc<Gauge>,
    /// With CURP: this node's witness (a record leaves it when its write applies here), and the
    /// front ends waiting for writes to apply here.
    curp: Option<(Arc<DurableWitness>, Arc<ApplyWatch>)>,
    deadlines: Deadlines,
    /// The largest time a leader fixed for an entry applied so far (ms since the Unix epoch).
    log_clock_ms: u64,
    /// The log's clock moved since it was last written to the store.
    log_clock_unwritten: bool,
    /// The time the command being executed runs at: the log's clock while applying, the later
    /// of it and the wall clock while reading.
    now_ms: u64,
    /// For the random picks of reads (RANDOMKEY, HRANDFIELD), which no replica need repeat.
    read_rng: u64,
    /// This node's pub/sub subscribers, to whom applied PUBLISHes go, and its blocked
    /// connections, woken by writes to their keys.
    listeners: Option<Arc<Hub>>,
    /// `notify-keyspace-events`, as the log last set it.
    keyspace_flags: u16,
    /// The keyspace events of the write being applied, sent once it has (see `notify`).
    key_events: Vec<(&'static str, Bytes)>,
    /// Whether the write being applied collects keyspace events: decided once per write, so
    /// one that starts while no one listens collects none, even if someone subscribes meanwhile.
    collecting_events: bool,
    /// With `--cache-mode ldc`: who owns which key, and how to fetch from the owner's cache.
    ldc: Option<Arc<Ldc>>,
}

/// A key's type, as TYPE names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum KeyType {
    String,
    Hash,
    Set,
    List,
    Zset,
    Stream,
}

impl KeyType {
    fn name(self) -> &'static str {
        match self {
            KeyType::String => "string",
            KeyType::Hash => "hash",
            KeyType::Set => "set",
            KeyType::List => "list",
            KeyType::Zset => "zset",
            KeyType::Stream => "stream",
        }
    }
}

/// What a key holds, read whole (RENAME, COPY).
enum Stored {
    String(Bytes),
    Hash(Vec<(Bytes, Bytes)>),
    Set(Vec<Bytes>),
    List(Vec<Bytes>),
    Zset(Vec<(Bytes, f64)>),
    /// A stream's records as stored, after its prefix.
    Stream(Vec<(Bytes, Bytes)>),
}

/// A container command's HELP: its lines as simple strings.
pub(crate) fn help_reply(lines: &[&'static str]) -> Value {
    Value::array(lines.iter().map(|line| Value::Simple((*line).into())).collect())
}

/// SCAN's order: a key's place is this 64-bit hash of it (FNV-1a, the same on every node and in
/// every version, so a cursor stays good on any node), never 0, which ends a scan.
fn scan_position(key: &[u8]) -> u64 {
    fnv1a_64(key).max(1)
}

/// The sum INCRBYFLOAT / HINCRBYFLOAT stores, or the error Redis gives; `current` is what the
/// key or field holds and `not_a_float` what Redis says when that is no number.
fn float_sum(current: Option<&[u8]>, increment: Float, not_a_float: &str) -> Result<Decimal, Value> {
    let current = match current.map(parse_float) {
        None => Float::Finite(Decimal::default()),
        Some(Some(value)) => value,
        Some(None) => return Err(Value::error(not_a_float)),
    };
    match (current, increment) {
        (Float::Finite(a), Float::Finite(b)) => a.checked_add(b).ok_or_else(|| {
            Value::error("ERR increment would take the value past 1.7e21, beyond the range Chorus keeps exactly")
        }),
        _ => Err(Value::error("ERR increment would produce NaN or Infinity")),
    }
}

/// The sum HINCRBY stores, or the error Redis gives.
fn hash_int_sum(current: Option<&[u8]>, delta: i64) -> Result<i64, Value> {
    let current = match current {
        None => 0,
        Some(value) => {
            crate::command::parse_i64(value).map_err(|_| Value::error("ERR hash value is not an integer"))?
        }
    };
    current
        .checked_add(delta)
        .ok_or_else(|| Value::error("ERR increment or decrement would overflow"))
}

/// The length SETRANGE leaves, or its error, for a string of `current_len` bytes (`None`: no
/// key); an empty value changes nothing.
fn set_range_len(current_len: Option<usize>, offset: usize, value_len: usize) -> Result<usize, Value> {
    if value_len == 0 {
        return Ok(current_len.unwrap_or(0));
    }
    match offset.checked_add(value_len) {
        Some(end) if end <= MAX_STRING_BYTES => Ok(end.max(current_len.unwrap_or(0))),
        _ => Err(Value::error(
            "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
        )),
    }
}

/// Rebuilds the deadlines and the log's clock from the store.
fn read_expiry(store: &mut Store) -> Result<(Deadlines, u64), String> {
    let corrupt = |what: &str| format!("expiry records: malformed {what}");
    let mut deadlines = Deadlines::default();
    for (storage_key, value) in store.scan_group(&[EXPIRY_TAG]).map_err(|e| e.to_string())? {
        let deadline = <[u8; 8]>::try_from(value.as_ref()).map_err(|_| corrupt("deadline"))?;
        deadlines.set(storage_key.slice(1..), u64::from_be_bytes(deadline));
    }
    let clock = match store.get(CLOCK_KEY).map_err(|e| e.to_string())? {
        Some(value) => u64::from_be_bytes(value.as_ref().try_into().map_err(|_| corrupt("clock"))?),
        None => 0,
    };
    Ok((deadlines, clock))
}

/// Rebuilds the completion records from the store's `r` keys.
fn read_completions(store: &mut Store) -> Result<Completions<Value>, String> {
    let records = store.scan_group(&[RIFL_TAG]).map_err(|e| e.to_string())?;
    Completions::restore(records.iter().map(|(k, v)| (&k[1..], v.as_ref())), &decode_reply)
        .map_err(|e| format!("completion records: {e}"))
}

fn encode_reply(value: &Value) -> Bytes {
    let mut out = Vec::with_capacity(16);
    write_value(value, &mut out);
    Bytes::from(out)
}

fn decode_reply(reply: &[u8]) -> Option<Value> {
    match parse_value(reply, &Limits::default()) {
        Ok(Some((value, used))) if used == reply.len() => Some(value),
        _ => None,
    }
}

/// A write is predicted only if its client's lease has this many entries left: it must still
/// hold when the write applies.
const PREDICT_LEASE_MARGIN_ENTRIES: u64 = 1 << 16;

/// Entries between two updates of the storage metrics.
const METRICS_EVERY_ENTRIES: u64 = 256;

/// A read of the state's own segments failed while applying: the replica cannot go on.
fn unreadable(e: StoreError) -> ! {
    panic!("the state machine cannot read its own storage: {e}")
}

/// A field read for a write failed: like `unreadable`, for the reads that return a reply.
fn unreadable_value() -> ! {
    panic!("the state machine cannot read its own storage while applying a write")
}

fn storage_error(e: StoreError) -> Value {
    Value::error(format!("ERR storage: {e}"))
}

impl KvState {
    /// Opens the state in `options.dir` as the local snapshot `snapshot` (a manifest) describes.
    pub fn open(options: StoreOptions, snapshot: Option<&[u8]>) -> Result<KvState, String> {
        let manifest = snapshot
            .map(Manifest::decode)
            .transpose()
            .map_err(|e| format!("snapshot manifest: {e}"))?;
        let options = StoreOptions { group_of, ..options };
        let mut store = Store::open(options, manifest.as_ref()).map_err(|e| e.to_string())?;
        let completions = read_completions(&mut store)?;
        let (deadlines, log_clock_ms) = read_expiry(&mut store)?;
        let keyspace_flags = match store.get(KEYSPACE_EVENTS_KEY).map_err(|e| e.to_string())? {
            Some(value) => u16::from_be_bytes(
                value
                    .as_ref()
                    .try_into()
                    .map_err(|_| "malformed keyspace events setting".to_string())?,
            ),
            None => 0,
        };
        Ok(KvState {
            store,
            completions,
            proposed: Proposed::default(),
            metrics: StorageMetrics::new(),
            rifl_clients: chorus_metrics::gauge(
                "chorus_rifl_clients",
                "RIFL clients whose completion records this replica keeps",
            ),
            curp: None,
            deadlines,
            log_clock_ms,
            log_clock_unwritten: false,
            now_ms: log_clock_ms,
            read_rng: wall_clock_ms() | 1,
            listeners: None,
            keyspace_flags,
            key_events: Vec::new(),
            collecting_events: false,
            ldc: None,
        })
    }

    /// With CURP: this node's witness, which lets go of each record as its write applies, and
    /// the front ends' watch on applied writes.
    pub fn with_curp(mut self, witness: Arc<DurableWitness>, applies: Arc<ApplyWatch>) -> KvState {
        self.curp = Some((witness, applies));
        self.drop_settled_records();
        self
    }

    /// Drops the witness records of writes this state has executed without applying them here
    /// one by one (they came in a snapshot, or applied before a restart).
    fn drop_settled_records(&self) {
        if let Some((witness, _)) = &self.curp {
            witness.drop_settled(|client, seq| self.completions.settled(client, seq));
        }
    }

    /// Hands applied PUBLISHes to this node's subscribers in `hub`, and wakes its blocked
    /// connections when their keys are written.
    pub fn with_listeners(mut self, hub: Arc<Hub>) -> KvState {
        hub.set_keyspace_flags(self.keyspace_flags);
        self.listeners = Some(hub);
        self
    }

    /// LDC: a miss of a key another node owns asks that node's cache before this node's device.
    /// The store must cache only the keys this node owns (`StoreOptions::caches`).
    pub fn with_ldc(mut self, ldc: Arc<Ldc>) -> KvState {
        self.ldc = Some(ldc);
        self
    }

    /// Notes that the write being applied did `event` to `key`, if keyspace events of `class`
    /// are on and someone on this node could hear them.
    fn notify(&mut self, class: u16, event: &'static str, key: &[u8]) {
        if self.collecting_events && keyspace_events::sends(self.keyspace_flags, class) {
            self.key_events.push((event, Bytes::copy_from_slice(key)));
        }
    }

    /// After a removal from the collection `key`: `del` if that emptied it.
    fn notify_if_emptied(&mut self, key: &[u8]) {
        if self.collecting_events
            && keyspace_events::sends(self.keyspace_flags, keyspace_events::GENERIC)
            && !self.exists(key)
        {
            self.notify(keyspace_events::GENERIC, "del", key);
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Keys: every string is an ungrouped key of the store, every hash one group (and the
    /// bookkeeping records a few more). Like Redis, it counts keys that expired and are not
    /// deleted yet.
    pub fn len(&mut self) -> usize {
        let bookkeeping = BOOKKEEPING_TAGS
            .iter()
            .filter(|tag| self.store.group_has_keys(&[**tag]))
            .count();
        self.store.ungrouped_keys() + self.store.groups() - bookkeeping
    }

    /// Clients with completion records.
    pub fn rifl_clients(&self) -> usize {
        self.completions.clients()
    }

    pub fn is_empty(&mut self) -> bool {
        self.len() == 0
    }

    /// Whether `key` has expired at the time of the command being executed.
    fn expired(&self, key: &[u8]) -> bool {
        self.deadlines.expired(key, self.now_ms)
    }

    /// Whether a string is stored under `key`, expired or not.
    fn stores_string(&self, key: &[u8]) -> bool {
        self.store.contains(&string_key(key))
    }

    /// Whether the store holds a group (a hash's fields, a set's members) for `key` under
    /// `tag`, expired or not.
    fn stores_group(&self, tag: u8, key: &[u8]) -> bool {
        self.stored_group_tag(key, &[tag]).is_some()
    }

    /// Which of `tags` the store holds a group under for `key`, expired or not. Every string
    /// written asks about every grouped type, so the prefix is built once, on the stack.
    fn stored_group_tag(&self, key: &[u8], tags: &[u8]) -> Option<u8> {
        let mut buf = [0u8; 128];
        let len = 5 + key.len();
        if len > buf.len() {
            let mut prefix = group_prefix(0, key);
            return tags.iter().copied().find(|tag| {
                prefix[0] = *tag;
                self.store.group_has_keys(&prefix)
            });
        }
        buf[1..5].copy_from_slice(&u32::try_from(key.len()).expect("short key").to_be_bytes());
        buf[5..len].copy_from_slice(key);
        tags.iter().copied().find(|tag| {
            buf[0] = *tag;
            self.store.group_has_keys(&buf[..len])
        })
    }

    /// The tag of the grouped type stored under `key`, expired or not.
    fn stored_type_tag(&self, key: &[u8]) -> Option<u8> {
        self.stored_group_tag(key, &GROUP_TYPES.map(|(tag, _)| tag))
    }

    fn is_hash(&self, key: &[u8]) -> bool {
        self.holds_group(HASH_TAG, key)
    }

    /// Whether `key` holds a live group (a hash, a set, a list) under `tag`.
    fn holds_group(&self, tag: u8, key: &[u8]) -> bool {
        !self.expired(key) && self.stores_group(tag, key)
    }

    /// How many fields, members or elements `key`'s group under `tag` holds (0 once expired).
    fn group_size(&mut self, tag: u8, key: &[u8]) -> usize {
        if self.expired(key) {
            return 0;
        }
        self.store.group_len(&group_prefix(tag, key))
    }

    fn exists(&self, key: &[u8]) -> bool {
        self.key_type(key).is_some()
    }

    /// What `key` holds, if anything live.
    fn key_type(&self, key: &[u8]) -> Option<KeyType> {
        if self.expired(key) {
            None
        } else if self.stores_string(key) {
            Some(KeyType::String)
        } else {
            let tag = self.stored_type_tag(key)?;
            GROUP_TYPES
                .iter()
                .find(|(t, _)| *t == tag)
                .map(|(_, key_type)| *key_type)
        }
    }

    /// Whether `key` holds a `wanted`: `Ok(false)` if it holds nothing, `WRONGTYPE` if it holds
    /// something else.
    fn type_check(&self, key: &[u8], wanted: KeyType) -> Result<bool, Value> {
        match self.key_type(key) {
            None => Ok(false),
            Some(held) if held == wanted => Ok(true),
            Some(_) => Err(Value::error(WRONGTYPE)),
        }
    }

    fn hash_len(&mut self, key: &[u8]) -> usize {
        self.group_size(HASH_TAG, key)
    }

    /// A string's value for a client's read: a storage error is the client's error reply. (A
    /// key is a string or a hash, never both: only a missing string needs the hash check.)
    fn string(&mut self, key: &[u8]) -> Result<Option<Bytes>, Value> {
        if self.expired(key) {
            return Ok(None);
        }
        match self.store.get(&string_key(key)).map_err(storage_error)? {
            None if self.key_type(key).is_some() => Err(Value::error(WRONGTYPE)),
            value => Ok(value),
        }
    }

    /// A string's value for a write: every replica must compute the same result, so a replica
    /// that cannot read its own storage stops.
    fn string_to_update(&mut self, key: &[u8]) -> Result<Option<Bytes>, Value> {
        if self.expired(key) {
            return Ok(None);
        }
        match self.store.get(&string_key(key)).unwrap_or_else(|e| unreadable(e)) {
            None if self.key_type(key).is_some() => Err(Value::error(WRONGTYPE)),
            value => Ok(value),
        }
    }

    /// Whether `key` is a hash; `WRONGTYPE` when it holds something else.
    fn hash_check(&self, key: &[u8]) -> Result<bool, Value> {
        self.type_check(key, KeyType::Hash)
    }

    /// A hash's fields and values, in field order (`WRONGTYPE` for a string).
    fn hash_fields(&mut self, key: &[u8]) -> Result<Vec<(Bytes, Bytes)>, Value> {
        if self.expired(key) {
            return Ok(Vec::new());
        }
        let prefix = hash_prefix(key);
        let fields = self.store.scan_group(&prefix).map_err(storage_error)?;
        if fields.is_empty() {
            self.hash_check(key)?;
        }
        Ok(fields
            .into_iter()
            .map(|(storage_key, value)| (storage_key.slice(prefix.len()..), value))
            .collect())
    }

    fn field(&mut self, key: &[u8], field: &[u8]) -> Result<Option<Bytes>, Value> {
        if self.expired(key) {
            return Ok(None);
        }
        self.store.get(&field_key(key, field)).map_err(storage_error)
    }

    /// Deletes the value `key` holds, expired or not, keeping its deadline; whether it held one.
    fn delete_value(&mut self, index: u64, key: &[u8]) -> bool {
        if let Some(tag) = self.stored_type_tag(key) {
            for record in self.store.group_keys(&group_prefix(tag, key)) {
                self.store.write(index, record, None);
            }
            true
        } else if self.stores_string(key) {
            self.store.write(index, string_key(key), None);
            true
        } else {
            false
        }
    }

    /// Deletes whatever `key` holds, and its deadline; whether it held anything live.
    fn delete(&mut self, index: u64, key: &[u8]) -> bool {
        let live = self.exists(key);
        self.delete_value(index, key);
        self.set_deadline(index, key, None);
        live
    }

    /// Gives `key` a deadline, or (`None`) takes its deadline away.
    fn set_deadline(&mut self, index: u64, key: &[u8], deadline_ms: Option<u64>) {
        match deadline_ms {
            Some(deadline) => {
                self.deadlines.set(Bytes::copy_from_slice(key), deadline);
                let value = Bytes::copy_from_slice(&deadline.to_be_bytes());
                self.store.write(index, expiry_key(key), Some(value));
            }
            None => {
                if self.deadlines.remove(key).is_some() {
                    self.store.write(index, expiry_key(key), None);
                }
            }
        }
    }

    /// Expires `key` at `deadline` (milliseconds since the Unix epoch): at once, deleting it, if
    /// that is not after the entry's time.
    fn expire_at(&mut self, index: u64, key: &[u8], deadline_ms: i64) {
        match u64::try_from(deadline_ms) {
            Ok(deadline) if deadline > self.now_ms => {
                self.set_deadline(index, key, Some(deadline));
                self.notify(keyspace_events::GENERIC, "expire", key);
            }
            _ => {
                if self.delete(index, key) {
                    self.notify(keyspace_events::GENERIC, "del", key);
                }
            }
        }
    }

    /// The deadline EXPIRE gives `key` (`None`: it gives none and answers 0), or its error.
    fn expire_decision(
        &self,
        key: &[u8],
        at: ExpireAt,
        condition: ExpireCondition,
        name: &str,
    ) -> Result<Option<i64>, Value> {
        let deadline = at
            .resolve(self.now_ms)
            .ok_or_else(|| Value::error(invalid_expire_time(name)))?;
        let current = self.deadlines.get(key).map(|d| d as i64);
        Ok((self.exists(key) && condition.allows(current, deadline)).then_some(deadline))
    }

    /// Deletes `key` through the log if it has expired by the entry's time.
    fn delete_if_expired(&mut self, index: u64, key: &[u8]) {
        if self.expired(key) {
            self.delete_value(index, key);
            self.set_deadline(index, key, None);
            self.notify(keyspace_events::EXPIRED, "expired", key);
        }
    }

    /// Replaces the value of `key` with a string, keeping its deadline.
    fn set_string(&mut self, index: u64, key: &[u8], value: Bytes) {
        if self.stored_type_tag(key).is_some() {
            self.delete_value(index, key);
        }
        self.store.write(index, string_key(key), Some(value));
    }

    /// The string, hash or set `key` holds, read for a write.
    fn stored(&mut self, key: &[u8]) -> Option<Stored> {
        if self.is_set(key) {
            return self.set_members(key).ok().map(Stored::Set);
        }
        if self.is_zset(key) {
            return Some(Stored::Zset(self.zset_members(key)));
        }
        if self.holds_group(STREAM_TAG, key) {
            return Some(Stored::Stream(self.stream_records(key)));
        }
        if self.is_list(key) {
            let elements = self.list_elements(key).ok()?;
            return Some(Stored::List(elements.into_iter().map(|(_, e)| e).collect()));
        }
        if self.is_hash(key) {
            let prefix = hash_prefix(key);
            let fields = self.store.scan_group(&prefix).unwrap_or_else(|e| unreadable(e));
            let fields = fields.into_iter().map(|(k, v)| (k.slice(prefix.len()..), v)).collect();
            return Some(Stored::Hash(fields));
        }
        self.string_to_update(key).ok().flatten().map(Stored::String)
    }

    /// Replaces whatever `to` holds with `value` and gives it `deadline`.
    fn put_stored(&mut self, index: u64, to: &[u8], value: Stored, deadline: Option<u64>) {
        self.delete(index, to);
        match value {
            Stored::String(value) => self.set_string(index, to, value),
            Stored::Hash(fields) => {
                for (field, value) in fields {
                    self.store.write(index, field_key(to, &field), Some(value));
                }
            }
            Stored::Set(members) => {
                for member in members {
                    self.store.write(index, member_key(to, &member), Some(Bytes::new()));
                }
            }
            Stored::Zset(members) => self.put_zset(index, to, members),
            Stored::Stream(records) => self.put_stream(index, to, records),
            Stored::List(elements) => {
                self.push(index, to, elements, End::Right);
            }
        }
        self.set_deadline(index, to, deadline);
    }

    /// Every live key and its type, in no particular order.
    fn live_keys(&mut self) -> Vec<(Bytes, KeyType)> {
        let strings = self
            .store
            .ungrouped_key_list()
            .into_iter()
            .filter_map(|k| (k.first() == Some(&STRING_TAG)).then(|| (k.slice(1..), KeyType::String)));
        let containers = self.store.group_prefixes().into_iter().filter_map(|prefix| {
            let tag = prefix.first()?;
            let (_, key_type) = GROUP_TYPES.iter().find(|(t, _)| t == tag)?;
            Some((prefix.slice(5..), *key_type))
        });
        let mut keys: Vec<(Bytes, KeyType)> = strings.chain(containers).collect();
        keys.retain(|(key, _)| !self.expired(key));
        keys
    }

    /// A number below `n` (which is not 0) for a read's random pick.
    fn random_below(&mut self, n: usize) -> usize {
        (xorshift(&mut self.read_rng) % n as u64) as usize
    }

    /// Applies a write from the entry at `index`.
    pub fn execute_write(&mut self, index: u64, write: Write) -> Value {
        let (notifying, observed) = match &self.listeners {
            Some(hub) => {
                let notifying = self.keyspace_flags != 0 && hub.any_subscribed();
                (notifying, notifying || hub.any_blocked() || hub.any_tracking())
            }
            None => (false, false),
        };
        if !observed {
            return self.execute_write_unobserved(index, write);
        }
        let hub = self.listeners.clone().expect("observed");
        let keys = write.keys();
        let touches_every_key = write.touches_every_key();
        // A key this write creates is `new` just before the first event of it. A transaction's
        // or a script's commands each say so themselves.
        let nested = matches!(write, Write::Exec { .. } | Write::Script(_));
        let mut absent: Vec<Bytes> =
            if notifying && !nested && keyspace_events::sends(self.keyspace_flags, keyspace_events::NEW) {
                keys.iter().filter(|k| !self.exists(k)).cloned().collect()
            } else {
                Vec::new()
            };
        let outer_collecting = std::mem::replace(&mut self.collecting_events, notifying);
        let reply = self.execute_write_unobserved(index, write);
        self.collecting_events = outer_collecting;
        if notifying {
            let flags = self.keyspace_flags;
            for (event, key) in std::mem::take(&mut self.key_events) {
                let created = absent.iter().position(|k| *k == key).map(|at| absent.swap_remove(at));
                let new = created.is_some() && event != "new";
                for event in new.then_some("new").into_iter().chain([event]) {
                    for (channel, message) in keyspace_events::messages(flags, event, &key) {
                        hub.publish(&channel, &message, false);
                    }
                }
            }
        }
        if hub.any_blocked() {
            for key in &keys {
                hub.key_written(key);
            }
        }
        if hub.any_tracking() {
            if touches_every_key {
                hub.everything_written();
            } else {
                hub.keys_written(&keys);
            }
        }
        reply
    }

    /// Applies `write`, with no blocked connection to tell.
    fn execute_write_unobserved(&mut self, index: u64, write: Write) -> Value {
        if !self.deadlines.is_empty() {
            for key in write.keys() {
                self.delete_if_expired(index, &key);
            }
        }
        match write {
            Write::Set {
                key,
                value,
                condition,
                reply_as_int,
                ttl,
                reply_old,
                name,
            } => {
                let deadline = match ttl {
                    TtlChange::Set(at) => match at.resolve(self.now_ms) {
                        Some(deadline) => Some(deadline),
                        None => return Value::error(invalid_expire_time(name)),
                    },
                    TtlChange::Keep | TtlChange::Clear => None,
                };
                let old = match reply_old.then(|| self.string_to_update(&key)) {
                    Some(Err(e)) => return e,
                    Some(Ok(old)) => Some(old),
                    None => None,
                };
                let allowed = match condition {
                    SetCondition::Always => true,
                    SetCondition::IfAbsent => !self.exists(&key),
                    SetCondition::IfPresent => self.exists(&key),
                };
                if allowed {
                    self.set_string(index, &key, value);
                    self.notify(keyspace_events::STRING, "set", &key);
                    match deadline {
                        // Redis gives the key its passed deadline, and expires it.
                        Some(deadline) if deadline <= self.now_ms as i64 => {
                            self.notify(keyspace_events::GENERIC, "expire", &key);
                            self.delete(index, &key);
                            self.notify(keyspace_events::EXPIRED, "expired", &key);
                        }
                        Some(deadline) => self.expire_at(index, &key, deadline),
                        None if ttl == TtlChange::Clear => self.set_deadline(index, &key, None),
                        None => {}
                    }
                }
                match (old, reply_as_int, allowed) {
                    (Some(old), _, _) => Value::Bulk(old),
                    (None, true, _) => Value::Integer(allowed as i64),
                    (None, false, true) => Value::ok(),
                    (None, false, false) => Value::null(),
                }
            }
            Write::GetDel(key) => match self.string_to_update(&key) {
                Err(e) => e,
                Ok(None) => Value::null(),
                Ok(Some(value)) => {
                    self.delete(index, &key);
                    self.notify(keyspace_events::GENERIC, "del", &key);
                    Value::Bulk(Some(value))
                }
            },
            Write::GetEx { key, expire } => {
                let value = match self.string_to_update(&key) {
                    Err(e) => return e,
                    Ok(None) => return Value::null(),
                    Ok(Some(value)) => value,
                };
                match expire.map(|at| at.map(|at| at.resolve(self.now_ms))) {
                    Err(e) => return Value::error(e),
                    Ok(Some(None)) => return Value::error(invalid_expire_time("getex")),
                    Ok(Some(Some(deadline))) => self.expire_at(index, &key, deadline),
                    Ok(None) => {
                        if self.deadlines.get(&key).is_some() {
                            self.set_deadline(index, &key, None);
                            self.notify(keyspace_events::GENERIC, "persist", &key);
                        }
                    }
                }
                Value::Bulk(Some(value))
            }
            Write::Expire {
                key,
                at,
                condition,
                name,
            } => match self.expire_decision(&key, at, condition, name) {
                Err(e) => e,
                Ok(None) => Value::Integer(0),
                Ok(Some(deadline)) => {
                    self.expire_at(index, &key, deadline);
                    Value::Integer(1)
                }
            },
            Write::Persist(key) => {
                let volatile = self.exists(&key) && self.deadlines.get(&key).is_some();
                if volatile {
                    self.set_deadline(index, &key, None);
                    self.notify(keyspace_events::GENERIC, "persist", &key);
                }
                Value::Integer(volatile as i64)
            }
            // Those that had expired are gone already, like every write's expired keys.
            Write::DeleteExpired(_) => Value::ok(),
            Write::SetRange { key, offset, value } => {
                let current = match self.string_to_update(&key) {
                    Err(e) => return e,
                    Ok(current) => current,
                };
                let len = match set_range_len(current.as_ref().map(Bytes::len), offset, value.len()) {
                    Err(e) => return e,
                    Ok(len) => len,
                };
                if !value.is_empty() {
                    let mut updated = current.map_or_else(Vec::new, |c| c.to_vec());
                    updated.resize(len, 0);
                    updated[offset..offset + value.len()].copy_from_slice(&value);
                    self.set_string(index, &key, Bytes::from(updated));
                    self.notify(keyspace_events::STRING, "setrange", &key);
                }
                Value::Integer(len as i64)
            }
            Write::SetBit { key, offset, on } => self.set_bit(index, &key, offset, on),
            Write::BitOp { op, dest, sources } => self.bit_op(index, op, &dest, &sources),
            Write::PfAdd { key, elements } => self.pf_add(index, &key, &elements),
            Write::BitField { key, fields } => self.bit_field(index, &key, &fields),
            Write::Sort(args) => self.sort_store(index, &args),
            Write::Restore(args) => self.restore(index, &args),
            Write::PfMerge { dest, sources } => self.pf_merge(index, &dest, &sources),
            Write::IncrByFloat { key, increment } => {
                let current = match self.string_to_update(&key) {
                    Err(e) => return e,
                    Ok(current) => current,
                };
                let sum = parse_float(&increment)
                    .ok_or_else(|| Value::error(not_a_float()))
                    .and_then(|increment| float_sum(current.as_deref(), increment, &not_a_float()));
                match sum {
                    Err(e) => e,
                    Ok(sum) => {
                        let sum = Bytes::from(sum.to_string());
                        self.set_string(index, &key, sum.clone());
                        self.notify(keyspace_events::STRING, "incrbyfloat", &key);
                        Value::Bulk(Some(sum))
                    }
                }
            }
            Write::MSetNx(pairs) => {
                if pairs.iter().any(|(k, _)| self.exists(k)) {
                    return Value::Integer(0);
                }
                for (k, v) in pairs {
                    self.set_string(index, &k, v);
                    self.set_deadline(index, &k, None);
                    self.notify(keyspace_events::STRING, "set", &k);
                }
                Value::Integer(1)
            }
            Write::HIncrBy { key, field, delta } => {
                if let Err(e) = self.hash_check(&key) {
                    return e;
                }
                let current = self.field(&key, &field).unwrap_or_else(|_| unreadable_value());
                match hash_int_sum(current.as_deref(), delta) {
                    Err(e) => e,
                    Ok(n) => {
                        self.store
                            .write(index, field_key(&key, &field), Some(Bytes::from(n.to_string())));
                        self.notify(keyspace_events::HASH, "hincrby", &key);
                        Value::Integer(n)
                    }
                }
            }
            Write::HIncrByFloat { key, field, increment } => {
                if let Err(e) = self.hash_check(&key) {
                    return e;
                }
                let current = self.field(&key, &field).unwrap_or_else(|_| unreadable_value());
                match float_sum(
                    current.as_deref(),
                    Float::Finite(increment),
                    "ERR hash value is not a float",
                ) {
                    Err(e) => e,
                    Ok(sum) => {
                        let sum = Bytes::from(sum.to_string());
                        self.store.write(index, field_key(&key, &field), Some(sum.clone()));
                        self.notify(keyspace_events::HASH, "hincrbyfloat", &key);
                        Value::Bulk(Some(sum))
                    }
                }
            }
            Write::HSetNx { key, field, value } => {
                if let Err(e) = self.hash_check(&key) {
                    return e;
                }
                let storage_key = field_key(&key, &field);
                if self.store.contains(&storage_key) {
                    return Value::Integer(0);
                }
                self.store.write(index, storage_key, Some(value));
                self.notify(keyspace_events::HASH, "hset", &key);
                Value::Integer(1)
            }
            Write::Rename {
                from,
                to,
                only_if_absent,
            } => {
                if !self.exists(&from) {
                    return Value::error("ERR no such key");
                }
                if from == to || (only_if_absent && self.exists(&to)) {
                    return if only_if_absent { Value::Integer(0) } else { Value::ok() };
                }
                let deadline = self.deadlines.get(&from);
                let value = self.stored(&from).expect("the key exists");
                // Redis creates the new key before it says where it came from.
                if self.collecting_events
                    && keyspace_events::sends(self.keyspace_flags, keyspace_events::NEW)
                    && !self.exists(&to)
                {
                    self.notify(keyspace_events::NEW, "new", &to);
                }
                self.delete(index, &from);
                self.put_stored(index, &to, value, deadline);
                self.notify(keyspace_events::GENERIC, "rename_from", &from);
                self.notify(keyspace_events::GENERIC, "rename_to", &to);
                if only_if_absent {
                    Value::Integer(1)
                } else {
                    Value::ok()
                }
            }
            Write::Copy { from, to, replace } => {
                if from == to {
                    return Value::error("ERR source and destination objects are the same");
                }
                if !self.exists(&from) || (!replace && self.exists(&to)) {
                    return Value::Integer(0);
                }
                let deadline = self.deadlines.get(&from);
                let value = self.stored(&from).expect("the key exists");
                self.put_stored(index, &to, value, deadline);
                self.notify(keyspace_events::GENERIC, "copy_to", &to);
                Value::Integer(1)
            }
            Write::Sets(write) => self.execute_set_write(index, write),
            Write::Lists(write) => self.execute_list_write(index, write),
            Write::Zsets(write) => self.execute_zset_write(index, write),
            Write::Streams(write) => self.execute_stream_write(index, write),
            Write::Exec { watched, commands } => self.execute_exec(index, &watched, commands),
            Write::Script(call) => self.run_script(index, &call, false),
            Write::ScriptLoad(text) => self.load_script(index, &text),
            Write::ScriptFlush => self.flush_scripts(index),
            Write::Functions(write) => self.execute_function_write(index, write),
            Write::KeyspaceEvents(flags) => {
                self.keyspace_flags = flags;
                let value = Bytes::copy_from_slice(&flags.to_be_bytes());
                self.store
                    .write(index, Bytes::from_static(KEYSPACE_EVENTS_KEY), Some(value));
                if let Some(hub) = &self.listeners {
                    hub.set_keyspace_flags(flags);
                }
                Value::ok()
            }
            Write::Publish {
                channel,
                message,
                sharded,
            } => Value::Integer(
                self.listeners
                    .as_ref()
                    .map_or(0, |hub| hub.publish(&channel, &message, sharded)) as i64,
            ),
            Write::FlushAll => {
                for key in self.store.ungrouped_key_list() {
                    if key.first() == Some(&STRING_TAG) {
                        self.store.write(index, key, None);
                    }
                }
                for prefix in self.store.group_prefixes() {
                    if prefix.first() == Some(&EXPIRY_TAG) || is_field_key(&prefix) {
                        for key in self.store.group_keys(&prefix) {
                            self.store.write(index, key, None);
                        }
                    }
                }
                self.deadlines = Deadlines::default();
                Value::ok()
            }
            Write::Del(keys) => {
                let mut deleted = 0;
                for key in &keys {
                    if self.delete(index, key) {
                        self.notify(keyspace_events::GENERIC, "del", key);
                        deleted += 1;
                    }
                }
                Value::Integer(deleted)
            }
            Write::MSet(pairs) => {
                for (k, v) in pairs {
                    self.set_string(index, &k, v);
                    self.set_deadline(index, &k, None);
                    self.notify(keyspace_events::STRING, "set", &k);
                }
                Value::ok()
            }
            Write::IncrBy { key, delta } => {
                let current = match self.string_to_update(&key) {
                    Err(e) => return e,
                    Ok(None) => 0,
                    Ok(Some(s)) => match crate::command::parse_i64(&s) {
                        Ok(n) => n,
                        Err(e) => return Value::error(e),
                    },
                };
                match current.checked_add(delta) {
                    Some(n) => {
                        self.set_string(index, &key, Bytes::from(n.to_string()));
                        self.notify(keyspace_events::STRING, "incrby", &key);
                        Value::Integer(n)
                    }
                    None => Value::error("ERR increment or decrement would overflow"),
                }
            }
            Write::Append { key, value } => {
                let appended = match self.string_to_update(&key) {
                    Err(e) => return e,
                    Ok(None) => value,
                    Ok(Some(s)) => {
                        let mut joined = Vec::with_capacity(s.len() + value.len());
                        joined.extend_from_slice(&s);
                        joined.extend_from_slice(&value);
                        Bytes::from(joined)
                    }
                };
                let len = appended.len() as i64;
                self.set_string(index, &key, appended);
                self.notify(keyspace_events::STRING, "append", &key);
                Value::Integer(len)
            }
            Write::HSet { key, pairs, reply_ok } => {
                if let Err(e) = self.hash_check(&key) {
                    return e;
                }
                let mut added = 0;
                for (field, value) in pairs {
                    let replaced = self.store.write(index, field_key(&key, &field), Some(value));
                    added += u64::from(!replaced);
                }
                self.notify(keyspace_events::HASH, "hset", &key);
                if reply_ok {
                    Value::ok()
                } else {
                    Value::Integer(added as i64)
                }
            }
            Write::HDel { key, fields } => {
                match self.hash_check(&key) {
                    Err(e) => return e,
                    Ok(false) => return Value::Integer(0),
                    Ok(true) => {}
                }
                let mut removed = 0;
                for field in fields {
                    let storage_key = field_key(&key, &field);
                    if self.store.contains(&storage_key) {
                        self.store.write(index, storage_key, None);
                        removed += 1;
                    }
                }
                if removed > 0 {
                    self.notify(keyspace_events::HASH, "hdel", &key);
                }
                if self.hash_len(&key) == 0 {
                    self.set_deadline(index, &key, None);
                    if removed > 0 {
                        self.notify(keyspace_events::GENERIC, "del", &key);
                    }
                }
                Value::Integer(removed as i64)
            }
        }
    }

    /// Writes the completion records and the log's clock, if they changed, as of the entry at
    /// `index`: a restart replays the log from the last snapshot and needs both as they were.
    fn flush_bookkeeping(&mut self, index: u64) {
        let store = &mut self.store;
        self.completions.flush(&encode_reply, &mut |key, value| {
            store.write(index, rifl_key(key), value);
        });
        if self.log_clock_unwritten {
            let clock = Bytes::copy_from_slice(&self.log_clock_ms.to_be_bytes());
            self.store.write(index, Bytes::from_static(CLOCK_KEY), Some(clock));
            self.log_clock_unwritten = false;
        }
    }

    fn execute_args(&mut self, index: u64, args: &[Bytes]) -> Value {
        match Command::parse(args) {
            Ok(Some(Command::Write(w))) => self.execute_write(index, w),
            Ok(Some(Command::Read(_) | Command::Blocking(_))) | Ok(None) => {
                Value::error("ERR only write commands belong in the log")
            }
            Err(e) => Value::error(e),
        }
    }

    /// Executes an enveloped write unless RIFL says it executed before or must not execute.
    /// A witness record of it is dropped once the write has executed (now or before); not when
    /// it could not execute yet (`OUTOFORDER`: recovery may still replay it in order).
    fn execute_once(&mut self, index: u64, envelope: &Envelope, args: &[Bytes]) -> Value {
        let reply = match self.completions.admit(index, envelope) {
            Verdict::Execute => {
                let reply = self.execute_args(index, args);
                self.completions.complete(envelope, reply.clone());
                reply
            }
            Verdict::Duplicate(reply) => reply,
            Verdict::Stale => Value::error(STALE),
            Verdict::OutOfOrder => {
                let reply = Value::error(OUT_OF_ORDER);
                if let Some((_, applies)) = &self.curp {
                    applies.applied(envelope.client, envelope.seq, &reply);
                }
                return reply;
            }
            Verdict::Expired => Value::error(EXPIRED),
        };
        if let Some((witness, applies)) = &self.curp {
            witness.applied(envelope.client, envelope.seq);
            applies.applied(envelope.client, envelope.seq, &reply);
        }
        reply
    }

    /// The reply applying `write` now would give, without applying it. Mirrors
    /// `execute_write` (a randomized test holds them equal).
    fn preview_write(&mut self, write: &Write) -> Value {
        match write {
            Write::Set {
                key,
                condition,
                reply_as_int,
                ttl,
                reply_old,
                name,
                ..
            } => {
                if let TtlChange::Set(at) = ttl {
                    if at.resolve(self.now_ms).is_none() {
                        return Value::error(invalid_expire_time(name));
                    }
                }
                let old = match reply_old.then(|| self.string_to_update(key)) {
                    Some(Err(e)) => return e,
                    Some(Ok(old)) => Some(old),
                    None => None,
                };
                let allowed = match condition {
                    SetCondition::Always => true,
                    SetCondition::IfAbsent => !self.exists(key),
                    SetCondition::IfPresent => self.exists(key),
                };
                match (old, reply_as_int, allowed) {
                    (Some(old), _, _) => Value::Bulk(old),
                    (None, true, _) => Value::Integer(allowed as i64),
                    (None, false, true) => Value::ok(),
                    (None, false, false) => Value::null(),
                }
            }
            Write::GetDel(key) => match self.string_to_update(key) {
                Err(e) => e,
                Ok(value) => Value::Bulk(value),
            },
            Write::GetEx { key, expire } => match self.string_to_update(key) {
                Err(e) => e,
                Ok(None) => Value::null(),
                Ok(Some(value)) => match expire {
                    Err(e) => Value::error(e.clone()),
                    Ok(Some(at)) if at.resolve(self.now_ms).is_none() => Value::error(invalid_expire_time("getex")),
                    Ok(_) => Value::Bulk(Some(value)),
                },
            },
            Write::Expire {
                key,
                at,
                condition,
                name,
            } => self
                .expire_decision(key, *at, *condition, name)
                .map_or_else(|e| e, |deadline| Value::Integer(i64::from(deadline.is_some()))),
            Write::Persist(key) => Value::Integer((self.exists(key) && self.deadlines.get(key).is_some()) as i64),
            Write::DeleteExpired(_) | Write::FlushAll => Value::ok(),
            Write::Sets(write) => self.preview_set_write(write),
            Write::Lists(write) => self.preview_list_write(write),
            Write::Zsets(write) => self.preview_zset_write(write),
            Write::Exec { .. } | Write::Script(_) | Write::Functions(_) | Write::Publish { .. } | Write::Streams(_) => {
                unreachable!(
                    "transactions, scripts, functions, PUBLISH and stream writes are never answered before \
                     they apply, so never previewed"
                )
            }
            Write::ScriptLoad(text) => Value::bulk(crate::command::script_sha(text)),
            Write::ScriptFlush | Write::KeyspaceEvents(_) => Value::ok(),
            Write::SetRange { key, offset, value } => match self.string_to_update(key) {
                Err(e) => e,
                Ok(current) => match set_range_len(current.as_ref().map(Bytes::len), *offset, value.len()) {
                    Err(e) => e,
                    Ok(len) => Value::Integer(len as i64),
                },
            },
            Write::SetBit { key, offset, .. } => self.preview_set_bit(key, *offset),
            Write::BitOp { sources, .. } => self.preview_bit_op(sources),
            Write::PfAdd { key, elements } => self.preview_pf_add(key, elements),
            Write::BitField { key, fields } => self.preview_bit_field(key, fields),
            Write::Sort(args) => self.preview_sort_store(args),
            Write::Restore(args) => self.preview_restore(args),
            Write::PfMerge { dest, sources } => self.preview_pf_merge(dest, sources),
            Write::IncrByFloat { key, increment } => match self.string_to_update(key) {
                Err(e) => e,
                Ok(current) => parse_float(increment)
                    .ok_or_else(|| Value::error(not_a_float()))
                    .and_then(|increment| float_sum(current.as_deref(), increment, &not_a_float()))
                    .map_or_else(|e| e, |sum| Value::bulk(sum.to_string())),
            },
            Write::MSetNx(pairs) => Value::Integer(i64::from(!pairs.iter().any(|(k, _)| self.exists(k)))),
            Write::HIncrBy { key, field, delta } => {
                if let Err(e) = self.hash_check(key) {
                    return e;
                }
                let current = self.field(key, field).unwrap_or_else(|_| unreadable_value());
                hash_int_sum(current.as_deref(), *delta).map_or_else(|e| e, Value::Integer)
            }
            Write::HIncrByFloat { key, field, increment } => {
                if let Err(e) = self.hash_check(key) {
                    return e;
                }
                let current = self.field(key, field).unwrap_or_else(|_| unreadable_value());
                float_sum(
                    current.as_deref(),
                    Float::Finite(*increment),
                    "ERR hash value is not a float",
                )
                .map_or_else(|e| e, |sum| Value::bulk(sum.to_string()))
            }
            Write::HSetNx { key, field, .. } => match self.hash_check(key) {
                Err(e) => e,
                Ok(is_hash) => Value::Integer(i64::from(!(is_hash && self.store.contains(&field_key(key, field))))),
            },
            Write::Rename {
                from,
                to,
                only_if_absent,
            } => {
                if !self.exists(from) {
                    Value::error("ERR no such key")
                } else if !only_if_absent {
                    Value::ok()
                } else {
                    Value::Integer(i64::from(from != to && !self.exists(to)))
                }
            }
            Write::Copy { from, to, replace } => {
                if from == to {
                    Value::error("ERR source and destination objects are the same")
                } else {
                    Value::Integer(i64::from(self.exists(from) && (*replace || !self.exists(to))))
                }
            }
            Write::Del(keys) => {
                let mut seen = std::collections::HashSet::new();
                let deleted = keys.iter().filter(|k| seen.insert(*k) && self.exists(k)).count();
                Value::Integer(deleted as i64)
            }
            Write::MSet(_) => Value::ok(),
            Write::IncrBy { key, delta } => {
                let current = match self.string_to_update(key) {
                    Err(e) => return e,
                    Ok(None) => 0,
                    Ok(Some(s)) => match crate::command::parse_i64(&s) {
                        Ok(n) => n,
                        Err(e) => return Value::error(e),
                    },
                };
                match current.checked_add(*delta) {
                    Some(n) => Value::Integer(n),
                    None => Value::error("ERR increment or decrement would overflow"),
                }
            }
            Write::Append { key, value } => match self.string_to_update(key) {
                Err(e) => e,
                Ok(current) => Value::Integer((current.map_or(0, |s| s.len()) + value.len()) as i64),
            },
            Write::HSet { key, pairs, reply_ok } => {
                let is_hash = match self.hash_check(key) {
                    Err(e) => return e,
                    Ok(is_hash) => is_hash,
                };
                if *reply_ok {
                    return Value::ok();
                }
                // An expired hash's fields are still stored until the write deletes them.
                let mut seen = std::collections::HashSet::new();
                let added = pairs
                    .iter()
                    .filter(|(f, _)| seen.insert(f) && !(is_hash && self.store.contains(&field_key(key, f))))
                    .count();
                Value::Integer(added as i64)
            }
            Write::HDel { key, fields } => match self.hash_check(key) {
                Err(e) => e,
                Ok(false) => Value::Integer(0),
                Ok(true) => {
                    let mut seen = std::collections::HashSet::new();
                    let removed = fields
                        .iter()
                        .filter(|f| seen.insert(*f) && self.store.contains(&field_key(key, f)))
                        .count();
                    Value::Integer(removed as i64)
                }
            },
        }
    }

    /// What the enveloped write `command` will answer when it applies at `index` or a little
    /// later, provided nothing applied before it touches its keys, and its client's writes
    /// before it (if `pending_next_seq` says some are proposed but not applied) all execute.
    /// With the keys it touches; `None` when it will not execute as its client's next write, or
    /// is not an enveloped write.
    fn predict(&mut self, index: u64, command: &[u8], pending_next_seq: Option<u64>) -> Option<(Vec<Bytes>, Value)> {
        let Ok(Logged::Enveloped(envelope, args)) = decode_logged(command) else {
            return None;
        };
        let next_seq = match pending_next_seq {
            Some(seq) => seq,
            None => self
                .completions
                .next_seq(index, envelope.client, PREDICT_LEASE_MARGIN_ENTRIES)?,
        };
        if envelope.seq != next_seq {
            return None;
        }
        match Command::parse(&args) {
            // Its effect depends on the time of the entry it lands in, which a recovery from the
            // witnesses would change.
            Ok(Some(Command::Write(write)))
                if write.reads_the_clock()
                    || write.touches_every_key()
                    || write.keys().iter().any(|k| self.deadlines.get(k).is_some()) =>
            {
                None
            }
            Ok(Some(Command::Write(write))) => Some((write.keys(), self.preview_write(&write))),
            // Applying it answers the same error and touches nothing.
            Err(e) => Some((Vec::new(), Value::error(e))),
            Ok(_) => None,
        }
    }

    pub fn execute_read(&mut self, read: &Read) -> Value {
        // A read changes nothing, so it may read this node's clock; never earlier than the log's,
        // so no read shows a key that a write already found expired.
        self.now_ms = wall_clock_ms().max(self.log_clock_ms);
        let reply = self.read_now(read);
        self.now_ms = self.log_clock_ms;
        reply
    }

    /// A read of `keys` for a connection with client-side caching on: it is told of the next
    /// write to each.
    fn tracked_read(&mut self, client: u64, keys: &[Bytes]) {
        if let Some(hub) = &self.listeners {
            hub.tracked_read(client, keys);
        }
    }

    fn read_now(&mut self, read: &Read) -> Value {
        let mut result = || -> Result<Value, Value> {
            Ok(match read {
                Read::Get(key) => Value::Bulk(self.string(key)?),
                Read::MGet(keys) => Value::array(
                    keys.iter()
                        .map(|k| Value::Bulk(self.string(k).ok().flatten()))
                        .collect(),
                ),
                Read::Exists(keys) => Value::Integer(keys.iter().filter(|k| self.exists(k)).count() as i64),
                Read::StrLen(key) => Value::Integer(self.string(key)?.map_or(0, |s| s.len()) as i64),
                Read::Type(key) => Value::Simple(self.key_type(key).map_or("none", KeyType::name).into()),
                Read::HGet { key, field } => {
                    self.hash_check(key)?;
                    Value::Bulk(self.field(key, field)?)
                }
                Read::HMGet { key, fields } => {
                    self.hash_check(key)?;
                    Value::array(
                        fields
                            .iter()
                            .map(|f| Ok(Value::Bulk(self.field(key, f)?)))
                            .collect::<Result<_, Value>>()?,
                    )
                }
                Read::HGetAll(key) => {
                    let pairs = self
                        .hash_fields(key)?
                        .into_iter()
                        .map(|(field, value)| (Value::bulk(field), Value::bulk(value)))
                        .collect();
                    Value::map(pairs)
                }
                Read::HKeys(key) => {
                    let fields = self.hash_fields(key)?;
                    Value::array(fields.into_iter().map(|(field, _)| Value::bulk(field)).collect())
                }
                Read::HVals(key) => {
                    let fields = self.hash_fields(key)?;
                    Value::array(fields.into_iter().map(|(_, value)| Value::bulk(value)).collect())
                }
                Read::HStrLen { key, field } => {
                    self.hash_check(key)?;
                    let value = self.field(key, field)?;
                    Value::Integer(value.map_or(0, |v| v.len() as i64))
                }
                Read::HLen(key) => {
                    self.hash_check(key)?;
                    Value::Integer(self.hash_len(key) as i64)
                }
                Read::HExists { key, field } => {
                    let present = self.hash_check(key)? && self.store.contains(&field_key(key, field));
                    Value::Integer(present as i64)
                }
                Read::DbSize => Value::Integer(self.len() as i64),
                Read::LastSave => Value::Integer((self.log_clock_ms / 1000) as i64),
                Read::KeyspaceCounts => Value::array(vec![
                    Value::Integer(self.len() as i64),
                    Value::Integer(self.deadlines.len() as i64),
                ]),
                Read::MemoryUsage(key) if !self.exists(key) => Value::null(),
                Read::MemoryUsage(key) => {
                    let (records, bytes) = match self.stored_type_tag(key) {
                        Some(tag) => self.store.group_record_bytes(&group_prefix(tag, key)),
                        None => (1, self.store.record_bytes(&string_key(key)).unwrap_or(0)),
                    };
                    Value::Integer((bytes + records * INDEX_BYTES_PER_RECORD) as i64)
                }
                Read::Ttl { key, in_ms } => Value::Integer(match (self.exists(key), self.deadlines.get(key)) {
                    (false, _) => -2,
                    (true, None) => -1,
                    (true, Some(deadline)) => {
                        let left_ms = deadline.saturating_sub(self.now_ms) as i64;
                        if *in_ms {
                            left_ms
                        } else {
                            (left_ms + 500) / 1000
                        }
                    }
                }),
                Read::ExpireTime { key, in_ms } => Value::Integer(match (self.exists(key), self.deadlines.get(key)) {
                    (false, _) => -2,
                    (true, None) => -1,
                    (true, Some(deadline)) if *in_ms => deadline as i64,
                    (true, Some(deadline)) => (deadline as i64 + 500) / 1000,
                }),
                Read::GetRange { key, start, end } => {
                    let value = self.string(key)?.unwrap_or_default();
                    Value::Bulk(Some(string_range(&value, *start, *end)))
                }
                Read::GetBit { key, offset } => self.get_bit(key, *offset)?,
                Read::BitCount { key, range } => self.bit_count(key, range)?,
                Read::BitPos { key, bit, range } => self.bit_pos(key, *bit, range)?,
                Read::PfCount(keys) => self.pf_count(keys)?,
                Read::BitField { key, fields } => self.bit_field_get(key, fields)?,
                Read::Sort(args) => self.sort_reply(args)?,
                Read::Dump(key) => self.dump(key)?,
                Read::Object { info, key } => self.object_info(*info, key)?,
                Read::Help(lines) => help_reply(lines),
                Read::Lcs { keys, options } => self.lcs(keys, options)?,
                Read::HRandField {
                    key,
                    count,
                    with_values,
                } => {
                    let fields = self.hash_fields(key)?;
                    match count {
                        None if fields.is_empty() => Value::null(),
                        None => Value::bulk(fields[self.random_below(fields.len())].0.clone()),
                        Some(count) => {
                            let picks = self.random_picks(fields.len(), *count).into_iter();
                            let picked = picks.map(|pick| fields[pick].clone());
                            if *with_values {
                                Value::Pairs(picked.map(|(f, v)| (Value::bulk(f), Value::bulk(v))).collect())
                            } else {
                                Value::array(picked.map(|(f, _)| Value::bulk(f)).collect())
                            }
                        }
                    }
                }
                Read::Keys(pattern) => Value::array(
                    self.live_keys()
                        .into_iter()
                        .filter(|(key, _)| glob_match(pattern, key, false))
                        .map(|(key, _)| Value::bulk(key))
                        .collect(),
                ),
                Read::Scan(args) => self.scan(args),
                Read::HScan { key, args, no_values } => {
                    let fields = self.hash_fields(key)?;
                    let mut out = Vec::new();
                    for (field, value) in fields {
                        if args.pattern.as_ref().is_some_and(|p| !glob_match(p, &field, false)) {
                            continue;
                        }
                        out.push(Value::bulk(field));
                        if !no_values {
                            out.push(Value::bulk(value));
                        }
                    }
                    // The whole hash at once, as Redis answers for small hashes: cursor 0.
                    Value::array(vec![Value::bulk("0"), Value::array(out)])
                }
                Read::Sets(read) => self.read_set(read)?,
                Read::Lists(read) => self.read_list(read)?,
                Read::Zsets(read) => self.read_zset(read)?,
                Read::Streams(read) => self.read_stream(read)?,
                Read::Geo(read) => self.read_geo(read)?,
                Read::Script(call) => self.run_script(0, call, true),
                Read::ScriptExists(shas) => self.scripts_exist(shas),
                Read::Functions(read) => self.read_functions(read),
                Read::Tracked { client, keys, read } => {
                    self.tracked_read(*client, keys);
                    self.read_now(read)
                }
                Read::Cached(keys) => Value::array(
                    keys.iter()
                        .map(|(key, version)| Value::Bulk(self.store.cached(key, *version)))
                        .collect(),
                ),
                Read::Fingerprints(keys) => {
                    Value::array(keys.iter().map(|k| Value::Bulk(Some(self.fingerprint(k)))).collect())
                }
                Read::RandomKey => {
                    let keys = self.live_keys();
                    if keys.is_empty() {
                        Value::null()
                    } else {
                        Value::bulk(keys[self.random_below(keys.len())].0.clone())
                    }
                }
                Read::ExpiredKeys { limit } => Value::array(
                    self.deadlines
                        .due(self.now_ms, *limit)
                        .into_iter()
                        .map(Value::bulk)
                        .collect(),
                ),
            })
        };
        result().unwrap_or_else(|e| e)
    }
}

/// GETRANGE's bytes of `value`, its indices read as Redis reads them.
fn string_range(value: &Bytes, start: i64, end: i64) -> Bytes {
    let len = value.len() as i64;
    if (start < 0 && end < 0 && start > end) || len == 0 {
        return Bytes::new();
    }
    let from_end = |i: i64| if i < 0 { (len + i).max(0) } else { i };
    let (start, end) = (from_end(start), from_end(end).min(len - 1));
    if start > end {
        return Bytes::new();
    }
    value.slice(start as usize..=end as usize)
}

impl KvState {
    /// HRANDFIELD's picks among `n` fields: `count` distinct ones (all if fewer), or, for a
    /// negative count, that many with repeats.
    fn random_picks(&mut self, n: usize, count: i64) -> Vec<usize> {
        if n == 0 {
            return Vec::new();
        }
        if count < 0 {
            let wanted = count.unsigned_abs().min(MAX_STRING_BYTES as u64) as usize;
            return (0..wanted).map(|_| self.random_below(n)).collect();
        }
        let mut order: Vec<usize> = (0..n).collect();
        let wanted = (count as u64).min(n as u64) as usize;
        for i in 0..wanted {
            let j = i + self.random_below(n - i);
            order.swap(i, j);
        }
        order.truncate(wanted);
        order
    }

    /// SCAN: the `count` keys next in `scan_position` order from the cursor on, then those of
    /// them that pass MATCH and TYPE; the next cursor is the place of the first key not taken.
    /// Every key present for a whole scan is returned at least once. A call reads every key's
    /// place (Redis's reads only the few it returns), so a scan of N keys costs N²/COUNT.
    fn scan(&mut self, args: &ScanArgs) -> Value {
        let mut taken: std::collections::BinaryHeap<(u64, Bytes, KeyType)> = Default::default();
        let mut next_cursor = u64::MAX;
        for (key, key_type) in self.live_keys() {
            let position = scan_position(&key);
            if position < args.cursor {
                continue;
            }
            taken.push((position, key, key_type));
            if taken.len() > args.count {
                let (left_out, ..) = taken.pop().expect("over count");
                next_cursor = next_cursor.min(left_out);
            }
        }
        let next_cursor = if next_cursor == u64::MAX { 0 } else { next_cursor };
        let keys = taken
            .into_sorted_vec()
            .into_iter()
            .filter(|(_, key, key_type)| {
                args.pattern.as_ref().is_none_or(|p| glob_match(p, key, false))
                    && args
                        .type_name
                        .as_ref()
                        .is_none_or(|t| t.as_ref() == key_type.name().as_bytes())
            })
            .map(|(_, key, _)| Value::bulk(key))
            .collect();
        Value::array(vec![Value::bulk(next_cursor.to_string()), Value::array(keys)])
    }
}

impl StateMachine for KvState {
    type Query = Read;
    type Output = Value;

    fn apply(&mut self, index: u64, command: &[u8]) -> Value {
        let logged = match decode_logged(command) {
            Ok(logged) => logged,
            Err(e) => return Value::error(format!("ERR undecodable command in log: {e}")),
        };
        let store = &mut self.store;
        let mut persist = |key: &[u8], value: Option<Bytes>| {
            store.write(index, rifl_key(key), value);
        };
        match logged {
            Logged::Args(args) => self.execute_args(index, &args),
            Logged::Enveloped(envelope, args) => self.execute_once(index, &envelope, &args),
            Logged::Register => match self.completions.register(index, &mut persist) {
                Ok(id) => Value::Integer(id as i64),
                Err(e) => Value::error(format!("TRYAGAIN {e}")),
            },
            Logged::Renew {
                incarnation,
                forgotten_below,
            } => {
                if self
                    .completions
                    .renew(index, incarnation, forgotten_below, &mut persist)
                {
                    Value::ok()
                } else {
                    Value::error(EXPIRED)
                }
            }
            Logged::CurpRecovered { term } => {
                if let Some((witness, _)) = &self.curp {
                    witness.reset(term);
                }
                Value::ok()
            }
            Logged::DeleteExpired(keys) => self.execute_write(index, Write::DeleteExpired(keys)),
        }
    }

    fn entry_time(&mut self, leader_time_ms: u64) {
        if leader_time_ms > self.log_clock_ms {
            self.log_clock_ms = leader_time_ms;
            self.log_clock_unwritten = true;
        }
        self.now_ms = self.log_clock_ms;
    }

    fn entry_applied(&mut self, index: u64) {
        // A snapshot taken right after this entry could no longer write at its index once the
        // batch is cut, so the records join the batch now.
        if self.store.cut_due() {
            self.flush_bookkeeping(index);
        }
        self.store.entry_applied(index);
        if !self.proposed.is_empty() {
            self.proposed.applied_through(index);
        }
        if index.is_multiple_of(METRICS_EVERY_ENTRIES) {
            self.metrics.publish(&mut self.store);
        }
    }

    fn query(&mut self, query: &Read) -> Value {
        if let Read::Tracked { client, keys, read } = query {
            self.tracked_read(*client, keys);
            return self.query(read);
        }
        self.execute_read(query)
    }

    /// A GET whose value is not in memory here (with `--value-direct-io`, or LDC) takes its slow
    /// step off the raft loop: with LDC, the owner's cache at the version this node's index holds
    /// (for a key another node owns); else the device, the value then cached if the key has not
    /// been written meanwhile (and, with LDC, is this node's). What the read returns is the key's
    /// value when the read was served here, after its ReadIndex, so it is linearizable even if a
    /// write lands while the slow step runs.
    fn query_or_defer(&mut self, query: &Read) -> Result<Value, SlowRead<Self>> {
        if let Read::Tracked { client, keys, read } = query {
            self.tracked_read(*client, keys);
            return self.query_or_defer(read);
        }
        let Read::Get(key) = query else {
            return Ok(self.query(query));
        };
        self.now_ms = wall_clock_ms().max(self.log_clock_ms);
        let expired = self.expired(key);
        self.now_ms = self.log_clock_ms;
        if expired {
            return Ok(Value::null());
        }
        let store_key = string_key(key);
        let located_at = Instant::now();
        let located = self.store.locate(&store_key);
        if let Some(ldc) = &self.ldc {
            ldc.record_read(&store_key);
            if let Ok(Located::Ready(Some(_))) = &located {
                ldc.observe(ReadKind::LocalHit, located_at.elapsed());
            }
        }
        let disk_read = match located {
            Err(e) => return Ok(storage_error(e)),
            Ok(Located::Ready(None)) if self.key_type(key).is_some() => return Ok(Value::error(WRONGTYPE)),
            Ok(Located::Ready(value)) => return Ok(Value::Bulk(value)),
            Ok(Located::OnDisk(disk_read)) => disk_read,
        };
        let key = key.clone();
        let version = disk_read.version();
        let ldc = self.ldc.clone();
        let read_device = move || -> FinishRead<Self> {
            let read_at = Instant::now();
            let read = disk_read.read();
            if let Some(ldc) = &ldc {
                ldc.observe(ReadKind::Device, read_at.elapsed());
            }
            Box::new(move |state: &mut KvState| match read {
                Ok(value) => {
                    state
                        .store
                        .admit_read(disk_read.key(), disk_read.version(), value.clone());
                    Value::Bulk(Some(value))
                }
                // Its segment was merged away meanwhile: read it where it is now.
                Err(_) => state.query(&Read::Get(key)),
            })
        };
        // Another node's key: its owner's cache, while asking it is (as measured) faster than
        // the device; a task waits for the answer, and only a miss there takes a thread.
        let Some((ldc, fetch)) = self
            .ldc
            .as_ref()
            .and_then(|ldc| Some((ldc.clone(), ldc.plan_fetch(&store_key)?)))
        else {
            return Err(SlowRead::Blocking(Box::new(read_device)));
        };
        Err(SlowRead::Waiting(Box::pin(async move {
            match ldc.fetch(fetch, store_key.clone(), version).await {
                Some(value) => Box::new(move |state: &mut KvState| {
                    state.store.admit_read(&store_key, version, value.clone());
                    Value::Bulk(Some(value))
                }) as FinishRead<Self>,
                None => tokio::task::spawn_blocking(read_device)
                    .await
                    .expect("a device read does not panic"),
            }
        })))
    }

    /// CURP, on the leader: the reply `command`, about to join the log at `index`, will give —
    /// known now, before it commits, because nothing proposed and unapplied touches its keys and
    /// it executes as its client's next write. `None` otherwise. Call before `proposed` for it.
    fn speculate(&mut self, index: u64, command: &[u8]) -> Option<Value> {
        let Ok(Logged::Enveloped(envelope, _)) = decode_logged(command) else {
            return None;
        };
        let pending_next_seq = self.proposed.next_seq(envelope.client);
        let (keys, reply) = self.predict(index, command, pending_next_seq)?;
        (!self.proposed.touches(&keys)).then_some(reply)
    }

    /// CURP, on the leader: `command` has joined the log at `index`. Called for every command
    /// in log order — this node's, those followers forwarded, and an inherited uncommitted tail.
    fn proposed(&mut self, index: u64, command: &[u8]) {
        let (args, client) = match decode_logged(command) {
            Ok(Logged::Args(args)) => (args, None),
            Ok(Logged::Enveloped(envelope, args)) => {
                let expected = self
                    .proposed
                    .next_seq(envelope.client)
                    .or_else(|| self.completions.next_seq(index, envelope.client, 0));
                // Only the write its client's sequence expects executes and moves it on.
                let next = expected.map(|e| if e == envelope.seq { e + 1 } else { e });
                (args, next.map(|next| (envelope.client, next)))
            }
            Ok(Logged::DeleteExpired(keys)) => {
                self.proposed.note(index, keys, None);
                return;
            }
            Ok(Logged::Register | Logged::Renew { .. } | Logged::CurpRecovered { .. }) | Err(_) => return,
        };
        let keys = match Command::parse(&args) {
            Ok(Some(Command::Write(write))) if write.touches_every_key() => {
                self.proposed.note_every_key(index);
                Vec::new()
            }
            Ok(Some(Command::Write(write))) => write.keys(),
            _ => Vec::new(),
        };
        self.proposed.note(index, keys, client);
    }

    /// CURP: this node is no longer the leader; what it proposed is someone else's to apply.
    fn forget_proposed(&mut self) {
        self.proposed.clear();
    }

    fn tick(&mut self) {
        self.store.tick();
        if let Some(ldc) = &self.ldc {
            let store = &self.store;
            ldc.reconsider(|| match store.cache_shape() {
                (Some(capacity_objects), Some(keys)) => Some((capacity_objects, keys as f64)),
                _ => None,
            });
        }
        self.metrics.publish(&mut self.store);
        self.rifl_clients.set(self.completions.clients() as i64);
    }

    fn out_of_space(&self) -> bool {
        self.store.out_of_space()
    }

    fn background_work(&self) -> bool {
        self.store.background_work()
    }

    /// The snapshot is the manifest of the segments holding the state; waiting for them is the
    /// only work, and it happens on the caller's thread.
    fn snapshot_later(&mut self) -> Box<dyn FnOnce() -> Vec<u8> + Send> {
        self.flush_bookkeeping(self.store.applied_index());
        let manifest = self.store.manifest_later();
        Box::new(move || manifest().encode())
    }

    fn snapshot_files(&mut self, snapshot: &[u8]) -> Result<SnapshotFiles, String> {
        let manifest = Manifest::decode(snapshot).map_err(|e| format!("snapshot manifest: {e}"))?;
        let mut pinned = self.store.pin_segments(&manifest).map_err(|e| e.to_string())?;
        Ok(SnapshotFiles {
            files: std::mem::take(&mut pinned.files),
            pin: Box::new(pinned),
        })
    }

    /// Segments the cleaner replaced are retired (off this thread) once no durable manifest lists
    /// them; a failure to remove one leaves it for the next start-up, which removes every
    /// unlisted segment.
    fn snapshot_persisted(&mut self, snapshot: &[u8]) {
        let manifest = Manifest::decode(snapshot).expect("a manifest this node wrote decodes");
        if let Err(e) = self.store.manifest_persisted(&manifest) {
            tracing::warn!(error = %e, "cannot delete segments the cleaner replaced");
        }
    }

    fn install_snapshot(&mut self, snapshot: &[u8], files_dir: &Path) -> Result<(), String> {
        let manifest = Manifest::decode(snapshot).map_err(|e| format!("snapshot manifest: {e}"))?;
        self.store.install(&manifest, files_dir).map_err(|e| e.to_string())?;
        self.completions = read_completions(&mut self.store)?;
        (self.deadlines, self.log_clock_ms) = read_expiry(&mut self.store)?;
        self.log_clock_unwritten = false;
        self.now_ms = self.log_clock_ms;
        self.drop_settled_records();
        // What a connection cached here may be older than the state installed.
        if let Some(hub) = &self.listeners {
            hub.everything_written();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{args_of as args, encode_args};
    use chorus_resp::Double;

    /// A state in a temporary directory, fed one command per log entry.
    struct Replica {
        state: KvState,
        index: u64,
        /// The time of the next entry: far ahead of the wall clock, so reads go by the log's
        /// clock too, and time passes only when a test says so.
        time_ms: u64,
        /// Last, so it is removed after the state closes.
        dir: tempfile::TempDir,
    }

    /// The next number below `n` from `state`.
    fn below(state: &mut u64, n: u64) -> u64 {
        xorshift(state) % n
    }

    fn options(dir: &std::path::Path) -> StoreOptions {
        StoreOptions {
            batch_writes: 3,
            cache_bytes: 200,
            ..StoreOptions::new(dir)
        }
    }

    impl Replica {
        fn new() -> Replica {
            let dir = tempfile::tempdir().unwrap();
            let state = KvState::open(options(dir.path()), None).unwrap();
            Replica {
                dir,
                state,
                index: 0,
                time_ms: wall_clock_ms() + 1_000_000_000,
            }
        }

        fn run(&mut self, cmd: &str) -> Value {
            self.run_args(args(cmd))
        }

        fn run_args(&mut self, args: Vec<Bytes>) -> Value {
            match Command::parse(&args).map(|c| c.expect("a data command")) {
                Ok(Command::Write(_)) => {
                    self.index += 1;
                    self.state.entry_time(self.time_ms);
                    let reply = self.state.apply(self.index, &encode_args(&args));
                    self.state.entry_applied(self.index);
                    reply
                }
                Ok(Command::Read(r)) => self.state.query(&r),
                Ok(Command::Blocking(_)) => panic!("the front end waits for blocking commands"),
                Err(e) => Value::error(e),
            }
        }

        /// Lets `ms` pass: an entry without commands, stamped that much later.
        fn advance(&mut self, ms: u64) {
            self.time_ms += ms;
            self.index += 1;
            self.state.entry_time(self.time_ms);
            self.state.entry_applied(self.index);
        }

        /// Takes a snapshot, drops the state (a restart) and reopens it from the snapshot.
        fn restart(&mut self) {
            let snapshot = self.state.snapshot_later()();
            let placeholder = KvState::open(options(&self.dir.path().join("scratch")), None).unwrap();
            drop(std::mem::replace(&mut self.state, placeholder));
            self.state = KvState::open(options(self.dir.path()), Some(&snapshot)).unwrap();
        }

        /// Takes a snapshot and stages the files a follower would be shipped with it.
        fn ship(&mut self) -> (Vec<u8>, tempfile::TempDir) {
            let snapshot = self.state.snapshot_later()();
            let shipped = self.state.snapshot_files(&snapshot).unwrap();
            let staged = tempfile::tempdir().unwrap();
            for (name, path) in &shipped.files {
                std::fs::copy(path, staged.path().join(name)).unwrap();
            }
            (snapshot, staged)
        }

        /// Everything a client can observe about these keys.
        fn observe(&mut self, keys: &[&str]) -> Vec<Value> {
            let mut seen = vec![self.run("DBSIZE")];
            for k in keys {
                seen.push(self.run(&format!("TYPE {k}")));
                seen.push(self.run(&format!("GET {k}")));
                seen.push(self.run(&format!("HGETALL {k}")));
                seen.push(self.run(&format!("HLEN {k}")));
                seen.push(self.run(&format!("PTTL {k}")));
            }
            seen
        }
    }

    #[test]
    fn string_commands_behave_like_redis() {
        let mut s = Replica::new();
        assert_eq!(s.run("SET a 1"), Value::ok());
        assert_eq!(s.run("SET a 2 NX"), Value::null());
        assert_eq!(s.run("SET b 2 XX"), Value::null());
        assert_eq!(s.run("SETNX b 5"), Value::Integer(1));
        assert_eq!(s.run("INCR a"), Value::Integer(2));
        assert_eq!(s.run("INCRBY a 40"), Value::Integer(42));
        assert_eq!(s.run("DECR a"), Value::Integer(41));
        assert_eq!(s.run("APPEND a x"), Value::Integer(3));
        assert!(s.run("INCR a").is_error(), "41x is not an integer");
        assert_eq!(s.run("GET a"), Value::bulk("41x"));
        assert_eq!(s.run("STRLEN a"), Value::Integer(3));
        assert_eq!(s.run("MSET c 3 d 4"), Value::ok());
        assert_eq!(
            s.run("MGET c nope d"),
            Value::array(vec![Value::bulk("3"), Value::null(), Value::bulk("4")])
        );
        assert_eq!(s.run("EXISTS a c nope a"), Value::Integer(3));
        assert_eq!(s.run("DEL a nope"), Value::Integer(1));
        assert_eq!(s.run("DBSIZE"), Value::Integer(3));
        assert_eq!(s.run("SET max 9223372036854775807"), Value::ok());
        assert!(s.run("INCR max").is_error());
        assert_eq!(s.run("GET max"), Value::bulk("9223372036854775807"));
    }

    /// An expired sorted set keeps its records until its deletion applies; no command may see
    /// them meanwhile (ZPOPMAX, the score and lex ranges, ZRANGESTORE and ZUNION read the
    /// records directly, not through the set's size).
    #[test]
    fn streams_take_entries_in_id_order_from_the_log_clock_and_survive_restarts() {
        let mut s = Replica::new();
        let entry = |id: &str, pairs: &[&str]| {
            Value::array(vec![
                Value::bulk(id.to_string()),
                Value::array(pairs.iter().map(|p| Value::bulk(p.to_string())).collect()),
            ])
        };
        let not_greater =
            Value::error("ERR The ID specified in XADD is equal or smaller than the target stream top item");
        let now = s.time_ms;
        assert_eq!(s.run("XADD s * a 1"), Value::bulk(format!("{now}-0")));
        assert_eq!(s.run("XADD s * b 2 c 3"), Value::bulk(format!("{now}-1")));
        s.advance(5);
        assert_eq!(s.run("XADD s * d 4"), Value::bulk(format!("{}-0", now + 5)));
        assert_eq!(s.run(&format!("XADD s {now}-9 e 5")), not_greater.clone());
        assert_eq!(s.run("XLEN s"), Value::Integer(3));
        assert_eq!(s.run("TYPE s"), Value::Simple("stream".into()));
        assert_eq!(
            s.run("XRANGE s - + COUNT 1"),
            Value::array(vec![entry(&format!("{now}-0"), &["a", "1"])])
        );
        assert_eq!(
            s.run(&format!("XREVRANGE s + ({now}-0")),
            Value::array(vec![
                entry(&format!("{}-0", now + 5), &["d", "4"]),
                entry(&format!("{now}-1"), &["b", "2", "c", "3"]),
            ])
        );
        assert_eq!(s.run("XTRIM s MAXLEN 1"), Value::Integer(2));
        assert_eq!(s.run(&format!("XDEL s {}-0 1-1", now + 5)), Value::Integer(1));
        // Empty, the stream still exists, and its ids still grow from the last one.
        assert_eq!(s.run("XLEN s"), Value::Integer(0));
        assert_eq!(s.run("EXISTS s"), Value::Integer(1));
        assert_eq!(s.run("XADD s 5-* f 6"), not_greater.clone());
        s.restart();
        assert_eq!(s.run("XADD s * f 6"), Value::bulk(format!("{}-1", now + 5)));
        assert_eq!(
            s.run("XREAD STREAMS s nope 0 0"),
            Value::KeyedPairs(vec![(
                Value::bulk("s"),
                Value::array(vec![entry(&format!("{}-1", now + 5), &["f", "6"])]),
            )])
        );
        assert_eq!(s.run("XREAD STREAMS s $"), Value::Array(None));
        assert_eq!(s.run("SET str x"), Value::ok());
        assert_eq!(s.run("XADD str * a 1"), Value::error(WRONGTYPE));
        assert_eq!(s.run("XLEN str"), Value::error(WRONGTYPE));
        assert_eq!(s.run("COPY s t"), Value::Integer(1));
        assert_eq!(s.run("DEL s"), Value::Integer(1));
        assert_eq!(s.run("XLEN t"), Value::Integer(1));
        assert!(!s.run("XADD t NOMKSTREAM * a 1").is_error());
        assert_eq!(s.run("XADD u NOMKSTREAM * a 1"), Value::null());
        assert_eq!(s.run("EXISTS u"), Value::Integer(0));
    }

    #[test]
    fn consumer_groups_deliver_each_entry_once_time_idleness_by_the_log_and_survive_restarts() {
        let mut s = Replica::new();
        let int = Value::Integer;
        let entry = |id: &str, v: &str| {
            Value::array(vec![
                Value::bulk(id.to_string()),
                Value::array(vec![Value::bulk("f"), Value::bulk(v.to_string())]),
            ])
        };
        let served = |entries: Vec<Value>| Value::KeyedPairs(vec![(Value::bulk("s"), Value::array(entries))]);
        assert_eq!(s.run("XGROUP CREATE s g $ MKSTREAM"), Value::ok());
        assert_eq!(s.run("XADD s 1-1 f a"), Value::bulk("1-1"));
        assert_eq!(s.run("XADD s 2-1 f b"), Value::bulk("2-1"));
        assert_eq!(
            s.run("XREADGROUP GROUP g alice COUNT 1 STREAMS s >"),
            served(vec![entry("1-1", "a")])
        );
        assert_eq!(
            s.run("XREADGROUP GROUP g bob STREAMS s >"),
            served(vec![entry("2-1", "b")])
        );
        assert_eq!(s.run("XREADGROUP GROUP g bob STREAMS s >"), Value::Array(None));
        assert_eq!(s.run("XGROUP CREATE u g $ MKSTREAM"), Value::ok());
        assert_eq!(s.run("XADD u 1-1 f c"), Value::bulk("1-1"));
        assert_eq!(
            s.run("XREADGROUP GROUP g carol NOACK STREAMS u u > >"),
            Value::KeyedPairs(vec![(Value::bulk("u"), Value::array(vec![entry("1-1", "c")]))]),
            "a stream named twice is served from where the first serving left the group"
        );
        s.advance(500);
        s.restart();
        // Pending entries, their consumers and idle times, the group's place: all in the state.
        let pending = |id: &str, who: &str, idle: i64, n: i64| {
            Value::array(vec![
                Value::bulk(id.to_string()),
                Value::bulk(who.to_string()),
                int(idle),
                int(n),
            ])
        };
        assert_eq!(
            s.run("XPENDING s g - + 10"),
            Value::array(vec![pending("1-1", "alice", 500, 1), pending("2-1", "bob", 500, 1)])
        );
        assert_eq!(s.run("XCLAIM s g carol 1000 1-1 JUSTID"), Value::array(vec![]));
        assert_eq!(s.run("XCLAIM s g carol 400 1-1"), Value::array(vec![entry("1-1", "a")]));
        assert_eq!(
            s.run("XPENDING s g - + 10 carol"),
            Value::array(vec![pending("1-1", "carol", 0, 2)])
        );
        assert_eq!(s.run("XACK s g 1-1 2-1 2-1"), int(2));
        assert_eq!(
            s.run("XPENDING s g"),
            Value::array(vec![int(0), Value::null(), Value::null(), Value::Array(None)])
        );
        assert_eq!(s.run("RENAME s t"), Value::ok());
        assert_eq!(s.run("XADD t 3-1 f c"), Value::bulk("3-1"));
        assert_eq!(
            s.run("XREADGROUP GROUP g dave STREAMS t >"),
            Value::KeyedPairs(vec![(Value::bulk("t"), Value::array(vec![entry("3-1", "c")]))])
        );
        let Value::Map(full) = s.run("XINFO STREAM t FULL COUNT 1") else {
            panic!("XINFO STREAM FULL answers a map")
        };
        let field = |name: &str| {
            full.iter()
                .find(|(k, _)| *k == Value::bulk(name.to_string()))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(field("entries"), Some(Value::array(vec![entry("1-1", "a")])));
        let Some(Value::Array(Some(groups))) = field("groups") else {
            panic!("groups are an array")
        };
        let Value::Map(group) = &groups[0] else {
            panic!("a group is a map")
        };
        assert!(group.contains(&(Value::bulk("pel-count"), int(1))), "{group:?}");
        assert_eq!(s.run("XGROUP DESTROY t g"), int(1));
        assert_eq!(s.run("XLEN t"), int(3));
        assert_eq!(
            s.run("XREADGROUP GROUP g dave STREAMS t >"),
            Value::error("NOGROUP No such key 't' or consumer group 'g' in XREADGROUP with GROUP option")
        );
    }

    #[test]
    fn an_expired_sorted_set_is_empty_to_every_command() {
        let mut s = Replica::new();
        let int = Value::Integer;
        assert_eq!(s.run("ZADD z 1 a 2 b"), int(2));
        assert_eq!(s.run("ZADD y 5 b"), int(1));
        assert_eq!(s.run("PEXPIRE z 100"), int(1));
        s.advance(200);
        let empty = Value::array(vec![]);
        assert_eq!(s.run("ZRANGE z -inf +inf BYSCORE"), empty);
        assert_eq!(s.run("ZRANGE z - + BYLEX"), empty);
        assert_eq!(s.run("ZUNION 2 z y"), Value::array(vec![Value::bulk("b")]));
        assert_eq!(s.run("ZRANGESTORE d z -inf +inf BYSCORE"), int(0));
        assert_eq!(s.run("ZREMRANGEBYSCORE z -inf +inf"), int(0));
        assert_eq!(s.run("ZPOPMAX z 2"), Value::Pairs(vec![]));
        assert_eq!(s.run("ZINTERSTORE d 2 z y"), int(0));
        assert_eq!(s.run("EXISTS d"), int(0));
    }

    #[test]
    fn keys_expire_at_the_time_the_log_gives_as_in_redis() {
        let mut s = Replica::new();
        let int = Value::Integer;
        assert_eq!(s.run("SET a 1 PX 1500"), Value::ok());
        assert_eq!(s.run("PTTL a"), int(1500));
        assert_eq!(s.run("TTL a"), int(2), "seconds are rounded");
        assert_eq!(s.run("PEXPIRETIME a"), int((s.time_ms + 1500) as i64));
        assert_eq!(s.run("HSET h f v"), int(1));
        assert_eq!(s.run("EXPIRE h 1"), int(1));
        assert_eq!(
            (s.run("TTL nope"), s.run("TTL a"), s.run("PERSIST nope")),
            (int(-2), int(2), int(0))
        );
        assert_eq!(s.run("INCR a"), int(2), "INCR keeps the time to live");
        assert_eq!(s.run("PTTL a"), int(1500));
        s.advance(1000);
        assert_eq!(s.run("HGETALL h"), Value::map(vec![]));
        assert_eq!(
            (s.run("EXISTS h"), s.run("TYPE h")),
            (int(0), Value::Simple("none".into()))
        );
        assert_eq!(s.run("HSET h g w"), int(1), "an expired hash is gone before the write");
        assert_eq!((s.run("HLEN h"), s.run("TTL h")), (int(1), int(-1)));
        assert_eq!(s.run("GET a"), Value::bulk("2"));
        s.advance(500);
        assert_eq!(
            (s.run("GET a"), s.run("PTTL a"), s.run("EXISTS a")),
            (Value::null(), int(-2), int(0))
        );
        assert_eq!(s.run("DBSIZE"), int(2), "like Redis, counted until deleted");
        assert_eq!(s.run("SET a 5 NX"), Value::ok());
        assert_eq!(s.run("DBSIZE"), int(2));

        // SET clears a time to live unless KEEPTTL; GET answers the old value.
        assert_eq!(s.run("SETEX k 10 v"), Value::ok());
        assert_eq!(s.run("SET k w KEEPTTL GET"), Value::bulk("v"));
        assert_eq!(s.run("TTL k"), int(10));
        assert_eq!(s.run("GETSET k x"), Value::bulk("w"));
        assert_eq!(s.run("TTL k"), int(-1));
        assert_eq!(s.run("SET h v GET"), Value::error(WRONGTYPE));
        assert_eq!(s.run("SET k y NX GET"), Value::bulk("x"), "not set, old value answered");

        // EXPIRE's conditions; a deadline in the past deletes.
        assert_eq!(s.run("PEXPIRE k 500 XX"), int(0));
        assert_eq!(s.run("PEXPIRE k 500 NX"), int(1));
        assert_eq!(s.run("PEXPIRE k 400 GT"), int(0));
        assert_eq!(s.run("PEXPIRE k 900 GT"), int(1));
        assert_eq!(s.run("PEXPIRE k 950 LT"), int(0));
        assert_eq!(s.run("PERSIST k"), int(1));
        assert_eq!(s.run("PEXPIRE k 100 GT"), int(0), "no deadline counts as never");
        assert_eq!(s.run("PEXPIRE k 100 LT"), int(1));
        assert_eq!(s.run("EXPIREAT k 1"), int(1));
        assert_eq!(s.run("EXISTS k"), int(0));
        assert_eq!(s.run(&format!("PEXPIREAT a {}", s.time_ms + 20)), int(1));
        assert_eq!(s.run("PTTL a"), int(20));
        assert_eq!(
            s.run("PEXPIRE a 9223372036854775807"),
            Value::error("ERR invalid expire time in 'pexpire' command")
        );

        // GETEX and GETDEL.
        assert_eq!(s.run("GETEX a PERSIST"), Value::bulk("5"));
        assert_eq!(s.run("TTL a"), int(-1));
        assert_eq!(s.run("GETEX a EX 3"), Value::bulk("5"));
        assert_eq!(s.run("TTL a"), int(3));
        assert_eq!(s.run("GETEX a PXAT 1"), Value::bulk("5"));
        assert_eq!(s.run("GET a"), Value::null());
        assert_eq!(s.run("GETEX h PERSIST"), Value::error(WRONGTYPE));
        assert_eq!(
            (s.run("SET d 1 EX 5"), s.run("GETDEL d"), s.run("GETDEL d")),
            (Value::ok(), Value::bulk("1"), Value::null())
        );
        assert_eq!(s.run("SET d 2"), Value::ok());
        assert_eq!(s.run("TTL d"), int(-1), "a deleted key's deadline went with it");
        assert_eq!(s.run("HDEL h g"), int(1));
        assert_eq!(s.run("DBSIZE"), int(1), "bookkeeping keys are not counted");
    }

    #[test]
    fn geospatial_indexes_answer_as_redis_answers() {
        // Replies from redis-server 7.0.15 to the same commands.
        let mut s = Replica::new();
        let int = Value::Integer;
        let bulk = |text: &str| Value::bulk(text.to_string());
        assert_eq!(
            s.run("GEOADD Sicily 13.361389 38.115556 Palermo 15.087269 37.502669 Catania"),
            int(2)
        );
        assert_eq!(
            s.run("GEOADD Sicily 181 0 x"),
            Value::error("ERR invalid longitude,latitude pair 181.000000,0.000000")
        );
        assert_eq!(
            s.run("ZSCORE Sicily Palermo"),
            Value::Double(Double(3_479_099_956_230_698.0))
        );
        assert_eq!(
            s.run("GEOPOS Sicily Palermo nope"),
            Value::array(vec![
                Value::array(vec![
                    Value::HumanDouble(Double(13.361_389_338_970_184)),
                    Value::HumanDouble(Double(38.115_556_395_496_3)),
                ]),
                Value::Array(None),
            ])
        );
        assert_eq!(s.run("GEODIST Sicily Palermo Catania km"), bulk("166.2742"));
        assert_eq!(
            s.run("GEOSEARCH Sicily FROMLONLAT 15 37 BYRADIUS 200 km ASC WITHDIST"),
            Value::array(vec![
                Value::array(vec![bulk("Catania"), bulk("56.4413")]),
                Value::array(vec![bulk("Palermo"), bulk("190.4424")]),
            ])
        );
        assert_eq!(
            s.run("geosearch Sicily FROMLONLAT 15 37 COUNT 1"),
            Value::error("ERR exactly one of BYRADIUS and BYBOX can be specified for geosearch"),
            "the name as the client wrote it"
        );
        assert_eq!(s.run("SET d x EX 100"), Value::ok());
        assert_eq!(
            s.run("GEOSEARCHSTORE d Sicily FROMLONLAT 15 37 BYRADIUS 100 km STOREDIST"),
            int(1)
        );
        assert_eq!(s.run("ZSCORE d Catania"), Value::Double(Double(56.441_257_870_158_2)));
        assert_eq!(s.run("TTL d"), int(-1), "the destination is replaced, deadline and all");
        assert_eq!(
            s.run("GEORADIUS Sicily 15 37 1 km STORE d"),
            int(0),
            "finding nothing deletes the destination"
        );
        assert_eq!(s.run("EXISTS d"), int(0));
    }

    #[test]
    fn hyperloglogs_count_merge_and_refuse_what_redis_refuses() {
        let mut s = Replica::new();
        let int = Value::Integer;
        let not_hll = Value::error("WRONGTYPE Key is not a valid HyperLogLog string value.");
        let corrupt = Value::error("INVALIDOBJ Corrupted HLL object detected");
        assert_eq!(
            (s.run("PFADD h"), s.run("PFADD h")),
            (int(1), int(0)),
            "made, then unchanged"
        );
        assert_eq!(s.run("PFCOUNT h"), int(0));
        assert_eq!((s.run("PFADD h a b c"), s.run("PFADD h a")), (int(1), int(0)));
        assert_eq!(s.run("PFCOUNT h"), int(3));
        let Value::Bulk(Some(h)) = s.run("GET h") else {
            panic!("a HyperLogLog is a string")
        };
        assert_eq!(
            h[15], 0x80,
            "PFCOUNT is a read: the cached count stays stale (Redis writes it)"
        );
        assert_eq!(
            h[16..],
            b"\x60\xf3\x80\x50\xb1\x84\x4b\xfb\x80\x42\x5a"[..],
            "Redis's registers"
        );
        assert_eq!(s.run("SET s abc"), Value::ok());
        assert_eq!(s.run("HSET hh f v"), int(1));
        assert_eq!(s.run("PFADD s x"), not_hll);
        assert_eq!(s.run("PFADD hh x"), Value::error(WRONGTYPE));
        assert_eq!(s.run("PFCOUNT h s"), not_hll);
        assert_eq!(s.run("PFCOUNT hh"), Value::error(WRONGTYPE));
        assert_eq!(s.run("PFCOUNT h nosuch"), int(3));
        assert_eq!(s.run("PFMERGE m h nosuch"), Value::ok());
        assert_eq!(s.run("PFCOUNT m"), int(3));
        assert_eq!(s.run("PFMERGE s h"), not_hll);
        assert_eq!(s.run("PFADD e a"), int(1));
        assert_eq!(s.run("EXPIRE e 100"), int(1));
        assert_eq!((s.run("PFADD e b"), s.run("PFMERGE e h")), (int(1), Value::ok()));
        assert_eq!(s.run("TTL e"), int(100), "PFADD and PFMERGE keep the key's deadline");
        assert_eq!(s.run("PFCOUNT e"), int(3), "a, b merged with a, b, c");
        // Opcodes covering one register too few; the cached count (0, fresh) is answered as is.
        let set = |value: &[u8]| vec![Bytes::from("SET"), Bytes::from("c"), Bytes::copy_from_slice(value)];
        assert_eq!(s.run_args(set(b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\0\x7f\xfe")), Value::ok());
        assert_eq!(s.run("PFCOUNT c"), int(0));
        assert_eq!(s.run("PFADD c x"), int(1), "x's register is covered");
        assert_eq!(
            s.run("GET c"),
            Value::bulk(&b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\x80\x7f\xf5\x84\x07"[..]),
            "edited as Redis edits it"
        );
        assert_eq!(
            (s.run("PFCOUNT c"), s.run("PFCOUNT c h")),
            (corrupt.clone(), corrupt.clone())
        );
        assert_eq!(s.run("PFMERGE n c"), corrupt);
        assert_eq!(s.run("EXISTS n"), int(0), "a refused PFMERGE makes nothing");
        assert_eq!(
            s.run("PFADD"),
            Value::error("ERR wrong number of arguments for 'pfadd' command")
        );
    }

    #[test]
    fn object_reports_the_encoding_redis_would_use_for_the_contents() {
        let mut s = Replica::new();
        let encoding = |s: &mut Replica, key: &str| s.run(&format!("OBJECT ENCODING {key}"));
        assert_eq!(s.run("MSET i 123 e hello"), Value::ok());
        assert_eq!(s.run("SADD small 1 2"), Value::Integer(2));
        assert_eq!(s.run("HSET h f v"), Value::Integer(1));
        assert_eq!(encoding(&mut s, "i"), Value::bulk("int"));
        assert_eq!(encoding(&mut s, "e"), Value::bulk("embstr"));
        assert_eq!(encoding(&mut s, "small"), Value::bulk("intset"));
        assert_eq!(s.run("SADD small a"), Value::Integer(1));
        assert_eq!(encoding(&mut s, "small"), Value::bulk("hashtable"));
        assert_eq!(encoding(&mut s, "h"), Value::bulk("listpack"));
        assert_eq!(encoding(&mut s, "none"), Value::null());
        assert_eq!(
            s.run("OBJECT REFCOUNT i"),
            Value::Integer(i64::from(i32::MAX)),
            "a shared integer"
        );
        assert_eq!(s.run("OBJECT REFCOUNT e"), Value::Integer(1));
        assert_eq!(s.run("OBJECT IDLETIME e"), Value::Integer(0));
        assert_eq!(
            s.run("OBJECT ENCODING"),
            Value::error("ERR wrong number of arguments for 'object|encoding' command")
        );
    }

    #[test]
    fn lcs_answers_as_redis_answers() {
        // Redis's own example, replies from redis-server 7.0.15.
        let mut s = Replica::new();
        assert_eq!(s.run("MSET key1 ohmytext key2 mynewtext"), Value::ok());
        assert_eq!(s.run("LCS key1 key2"), Value::bulk("mytext"));
        assert_eq!(s.run("LCS key1 key2 LEN"), Value::Integer(6));
        let range = |a: [i64; 2], b: [i64; 2], len: i64| {
            Value::array(vec![
                Value::array(a.map(Value::Integer).to_vec()),
                Value::array(b.map(Value::Integer).to_vec()),
                Value::Integer(len),
            ])
        };
        assert_eq!(
            s.run("LCS key1 key2 IDX MINMATCHLEN 4 WITHMATCHLEN"),
            Value::Map(vec![
                (Value::bulk("matches"), Value::array(vec![range([4, 7], [5, 8], 4)])),
                (Value::bulk("len"), Value::Integer(6)),
            ])
        );
        assert_eq!(s.run("HSET h f v"), Value::Integer(1));
        assert_eq!(
            s.run("LCS key1 h NOPE"),
            Value::error("ERR The specified keys must contain string values"),
            "the keys are checked before the options"
        );
    }

    #[test]
    fn sort_answers_as_redis_answers() {
        // Replies from redis-server 7.0.15 to the same commands.
        let mut s = Replica::new();
        let bulks = |items: &[&str]| Value::array(items.iter().map(|i| Value::bulk(i.to_string())).collect());
        assert_eq!(s.run("RPUSH l 3 1 10"), Value::Integer(3));
        assert_eq!(s.run("MSET w_3 30 w_1 10 w_10 5"), Value::ok());
        assert_eq!(s.run("SORT l"), bulks(&["1", "3", "10"]));
        assert_eq!(
            s.run("SORT l BY w_* GET # GET w_*"),
            bulks(&["10", "5", "1", "10", "3", "30"])
        );
        assert_eq!(
            s.run("SORT l BY nosort BY w_* DESC"),
            bulks(&["10", "1", "3"]),
            "a BY without * turns sorting off for good: the list reversed"
        );
        assert_eq!(s.run("RPUSH bad 1 x"), Value::Integer(2));
        assert_eq!(
            s.run("SORT bad"),
            Value::error("ERR One or more scores can't be converted into double")
        );
        assert_eq!(s.run("SORT l LIMIT 1 1 STORE d"), Value::Integer(1));
        assert_eq!(s.run("LRANGE d 0 -1"), bulks(&["3"]));
        assert_eq!(s.run("SORT_RO l STORE d"), Value::error("ERR syntax error"));
    }

    #[test]
    fn bit_fields_overflow_as_redis_overflows_them() {
        // Replies from redis-server 7.0.15 to the same commands.
        let mut s = Replica::new();
        let int = Value::Integer;
        assert_eq!(
            s.run("BITFIELD k SET i8 0 -100 GET u8 0 INCRBY i8 0 -100"),
            Value::array(vec![int(0), int(156), int(56)]),
            "-200 wraps to 56"
        );
        assert_eq!(
            s.run("BITFIELD k OVERFLOW SAT INCRBY i8 0 -100 OVERFLOW FAIL INCRBY i8 0 -100 GET u4 #1"),
            Value::array(vec![int(-44), Value::null(), int(4)])
        );
        assert_eq!(
            s.run("BITFIELD n OVERFLOW FAIL INCRBY u2 100 5"),
            Value::array(vec![Value::null()])
        );
        assert_eq!(
            s.run("STRLEN n"),
            int(13),
            "the string grows to the field even when the write fails"
        );
        assert_eq!(
            s.run("BITFIELD_RO k SET u8 0 1"),
            Value::error("ERR BITFIELD_RO only supports the GET subcommand")
        );
        assert_eq!(
            s.run("BITFIELD k GET u64 0"),
            Value::error(
                "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."
            )
        );
    }

    #[test]
    fn bits_are_set_read_counted_and_found_in_strings() {
        let mut s = Replica::new();
        let int = Value::Integer;
        assert_eq!(s.run("SETBIT b 9 1"), int(0));
        assert_eq!(s.run("GET b"), Value::bulk("\0\x40"), "a string grown with clear bytes");
        assert_eq!((s.run("SETBIT b 9 0"), s.run("SETBIT b 9 0")), (int(1), int(0)));
        assert_eq!(s.run("SET b abc EX 100"), Value::ok());
        assert_eq!(s.run("SETBIT b 7 1"), int(1));
        assert_eq!(s.run("GET b"), Value::bulk("abc"), "'a' has its last bit set already");
        assert_eq!(s.run("SETBIT b 6 1"), int(0));
        assert_eq!(s.run("GET b"), Value::bulk("cbc"));
        assert_eq!(s.run("TTL b"), int(100), "a bit set keeps the key's deadline");
        assert_eq!(
            (s.run("GETBIT b 6"), s.run("GETBIT b 1000"), s.run("GETBIT none 0")),
            (int(1), int(0), int(0))
        );
        assert_eq!(s.run("BITCOUNT b"), int(11));
        assert_eq!(s.run("BITCOUNT b 1 -1"), int(7));
        assert_eq!(s.run("BITPOS b 1"), int(1));
        assert_eq!(s.run("BITPOS b 0 1 -1"), int(8));
        assert_eq!(s.run("HSET h f v"), int(1));
        let wrong_type = Value::error(WRONGTYPE);
        assert_eq!(s.run("SETBIT h 0 1"), wrong_type);
        assert_eq!(s.run("GETBIT h 0"), wrong_type);
        assert_eq!(
            s.run("BITCOUNT h x y"),
            wrong_type,
            "the key's type is checked before the range"
        );
        assert_eq!(
            s.run("BITCOUNT none x y"),
            int(0),
            "a missing key counts 0 whatever the range"
        );
        assert_eq!(
            s.run("BITCOUNT b x y"),
            Value::error("ERR value is not an integer or out of range")
        );
        assert_eq!(
            s.run("BITCOUNT b -1 -2 nope"),
            int(0),
            "backwards negative bounds win over the unit"
        );
        assert_eq!(s.run("BITPOS none 0 x"), int(0));
        assert_eq!(s.run("BITOP XOR d b none"), int(3));
        assert_eq!(s.run("GET d"), Value::bulk("cbc"));
        assert_eq!(s.run("EXPIRE d 100"), int(1));
        assert_eq!(s.run("BITOP NOT d b"), int(3));
        assert_eq!(s.run("TTL d"), int(-1), "the result replaces the key, deadline and all");
        assert_eq!(s.run("BITOP AND d none"), int(0));
        assert_eq!(s.run("EXISTS d"), int(0), "an empty result deletes the destination");
        assert_eq!(s.run("BITOP OR d b h"), wrong_type);
        assert_eq!(s.run("BITOP OR h b"), int(3), "the destination may hold any type");
        assert_eq!(
            s.run("BITOP NOT d b b"),
            Value::error("ERR BITOP NOT must be called with a single source key.")
        );
        assert_eq!(s.run("BITOP NAND d b"), Value::error("ERR syntax error"));
        assert_eq!(
            s.run("BITPOS b 2"),
            Value::error("ERR The bit argument must be 1 or 0.")
        );
        assert_eq!(
            s.run("SETBIT b 4294967296 1"),
            Value::error("ERR bit offset is not an integer or out of range")
        );
        assert_eq!(
            s.run("SETBIT b 1 2"),
            Value::error("ERR bit is not an integer or out of range")
        );
    }

    #[test]
    fn more_string_hash_and_key_commands_behave_like_redis() {
        let mut s = Replica::new();
        let int = Value::Integer;
        assert_eq!(s.run("SETRANGE s 3 ab"), int(5));
        assert_eq!(s.run("GET s"), Value::bulk("\0\0\0ab"));
        assert_eq!(s.run("SET s Hello"), Value::ok());
        assert_eq!(s.run("SETRANGE s 1 EY"), int(5));
        assert_eq!(
            (s.run("GETRANGE s 0 -1"), s.run("GETRANGE s -3 -2")),
            (Value::bulk("HEYlo"), Value::bulk("Yl"))
        );
        assert_eq!(
            (s.run("GETRANGE s 3 1"), s.run("GETRANGE s 4 100")),
            (Value::bulk(""), Value::bulk("o"))
        );
        assert_eq!(s.run("GETRANGE nope 0 -1"), Value::bulk(""));
        assert_eq!(s.run("SETRANGE empty 5 "), int(0));
        assert_eq!(s.run("EXISTS empty"), int(0));
        assert_eq!(s.run("SETRANGE s -1 x"), Value::error("ERR offset is out of range"));

        assert_eq!(s.run("INCRBYFLOAT f 0.1"), Value::bulk("0.1"));
        assert_eq!(s.run("INCRBYFLOAT f 0.2"), Value::bulk("0.3"));
        assert_eq!(s.run("INCRBYFLOAT f -3"), Value::bulk("-2.7"));
        assert_eq!(s.run("INCRBYFLOAT f 5.0e3"), Value::bulk("4997.3"));
        assert_eq!(
            s.run("INCRBYFLOAT f inf"),
            Value::error("ERR increment would produce NaN or Infinity")
        );
        assert_eq!(s.run("INCRBYFLOAT s 1"), Value::error("ERR value is not a valid float"));
        assert_eq!(s.run("INCRBYFLOAT f x"), Value::error("ERR value is not a valid float"));

        assert_eq!(s.run("MSETNX a 1 b 2"), int(1));
        assert_eq!(s.run("MSETNX b 3 c 4"), int(0));
        assert_eq!(s.run("EXISTS c"), int(0));

        assert_eq!(s.run("HINCRBY h n 5"), int(5));
        assert_eq!(s.run("HINCRBY h n -7"), int(-2));
        assert_eq!(s.run("HSETNX h n 1"), int(0));
        assert_eq!(s.run("HSETNX h t x"), int(1));
        assert_eq!(s.run("HINCRBY h t 1"), Value::error("ERR hash value is not an integer"));
        assert_eq!(s.run("HINCRBYFLOAT h n 0.5"), Value::bulk("-1.5"));
        assert_eq!(
            s.run("HINCRBYFLOAT h t 1"),
            Value::error("ERR hash value is not a float")
        );
        assert_eq!(
            s.run("HINCRBYFLOAT h n inf"),
            Value::error("ERR value is NaN or Infinity")
        );
        assert_eq!(s.run("HINCRBY a n 1"), Value::error(WRONGTYPE));

        // RENAME and COPY move the value and its deadline.
        assert_eq!(s.run("PEXPIRE h 5000"), int(1));
        assert_eq!(s.run("RENAME h h2"), Value::ok());
        assert_eq!(
            (s.run("EXISTS h"), s.run("HGET h2 t"), s.run("PTTL h2")),
            (int(0), Value::bulk("x"), int(5000))
        );
        assert_eq!(s.run("RENAME nope x"), Value::error("ERR no such key"));
        assert_eq!(s.run("RENAMENX a b"), int(0));
        assert_eq!(s.run("RENAMENX a a2"), int(1));
        assert_eq!(s.run("RENAME b a2"), Value::ok());
        assert_eq!(s.run("GET a2"), Value::bulk("2"));
        assert_eq!(s.run("COPY h2 h3"), int(1));
        assert_eq!(s.run("COPY a2 h3"), int(0));
        assert_eq!(s.run("COPY a2 h3 REPLACE"), int(1));
        assert_eq!(
            (s.run("TYPE h3"), s.run("TYPE h2")),
            (Value::Simple("string".into()), Value::Simple("hash".into()))
        );
        assert_eq!(
            s.run("COPY a2 a2"),
            Value::error("ERR source and destination objects are the same")
        );
        assert_eq!(s.run("COPY a2 x DB 1"), Value::error("ERR DB index is out of range"));

        // KEYS, SCAN, HSCAN, RANDOMKEY, HRANDFIELD.
        let sorted = |v: Value| match v {
            Value::Array(Some(mut items)) => {
                items.sort_by_key(|i| format!("{i:?}"));
                items
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(sorted(s.run("KEYS h*")), vec![Value::bulk("h2"), Value::bulk("h3")]);
        assert_eq!(sorted(s.run("KEYS *")).len(), 5, "s f a2 h2 h3");
        assert_eq!(
            s.run("HSCAN h2 0 MATCH n*"),
            Value::array(vec![
                Value::bulk("0"),
                Value::array(vec![Value::bulk("n"), Value::bulk("-1.5")])
            ])
        );
        assert!(matches!(s.run("RANDOMKEY"), Value::Bulk(Some(_))));
        assert!(matches!(s.run("HRANDFIELD h2"), Value::Bulk(Some(_))));
        assert_eq!(
            sorted(s.run("HRANDFIELD h2 5")),
            vec![Value::bulk("n"), Value::bulk("t")]
        );
        match s.run("HRANDFIELD h2 -5 WITHVALUES") {
            Value::Pairs(pairs) => assert_eq!(pairs.len(), 5, "five picks, repeats allowed"),
            other => panic!("{other:?}"),
        }

        assert_eq!(s.run("FLUSHALL"), Value::ok());
        assert_eq!(
            (s.run("DBSIZE"), s.run("KEYS *"), s.run("RANDOMKEY")),
            (int(0), Value::array(vec![]), Value::null())
        );
        assert_eq!(s.run("PTTL h2"), int(-2));
        assert_eq!(s.run("FLUSHDB ASYNC"), Value::ok());
        assert!(Command::parse(&args("FLUSHALL NOW")).is_err());
    }

    #[test]
    fn set_commands_behave_like_redis() {
        let mut s = Replica::new();
        let int = Value::Integer;
        let members = |v: Value| match v {
            Value::Array(Some(items)) | Value::Set(items) => {
                let mut m: Vec<String> = items
                    .into_iter()
                    .map(|i| match i {
                        Value::Bulk(Some(b)) => String::from_utf8(b.to_vec()).unwrap(),
                        other => panic!("{other:?}"),
                    })
                    .collect();
                m.sort();
                m.join(",")
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(s.run("SADD s a b c a"), int(3));
        assert_eq!(s.run("SADD t b c d"), int(3));
        assert_eq!(
            (s.run("SCARD s"), s.run("TYPE s")),
            (int(3), Value::Simple("set".into()))
        );
        assert_eq!(members(s.run("SMEMBERS s")), "a,b,c");
        assert_eq!((s.run("SISMEMBER s a"), s.run("SISMEMBER s z")), (int(1), int(0)));
        assert_eq!(s.run("SMISMEMBER s a z"), Value::array(vec![int(1), int(0)]));
        assert_eq!(members(s.run("SINTER s t")), "b,c");
        assert_eq!(members(s.run("SUNION s t nope")), "a,b,c,d");
        assert_eq!(members(s.run("SDIFF s t")), "a");
        assert_eq!(s.run("SINTERCARD 2 s t LIMIT 1"), int(1));
        assert_eq!(s.run("SINTERSTORE u s t"), int(2));
        assert_eq!(members(s.run("SMEMBERS u")), "b,c");
        assert_eq!(s.run("SDIFFSTORE u s s"), int(0));
        assert_eq!(s.run("EXISTS u"), int(0), "an empty result deletes the destination");
        assert_eq!(s.run("SMOVE s t a"), int(1));
        assert_eq!((s.run("SMOVE s t a"), s.run("SMOVE nope t a")), (int(0), int(0)));
        assert_eq!(s.run("SREM s b c z"), int(2));
        assert_eq!(s.run("EXISTS s"), int(0), "a set without members is gone");

        s.run("SET str x");
        let wrong = Value::error(WRONGTYPE);
        assert_eq!(
            (s.run("SADD str a"), s.run("SMEMBERS str"), s.run("SINTER t str")),
            (wrong.clone(), wrong.clone(), wrong.clone())
        );
        assert_eq!(
            (s.run("GET t"), s.run("HGET t f"), s.run("SMOVE t str b")),
            (wrong.clone(), wrong.clone(), wrong)
        );
        assert_eq!(s.run("SET t x"), Value::ok(), "SET replaces a set");
        assert_eq!(s.run("SCARD t"), Value::error(WRONGTYPE));

        // SPOP takes members fixed by the entry: two replicas applying it alike pop alike.
        let mut other = Replica::new();
        // The same clock from the start: a log's clock never goes back.
        other.time_ms = s.time_ms;
        for r in [&mut s, &mut other] {
            r.run("SADD pool 1 2 3 4 5 6 7 8 9");
        }
        let (a, b) = (s.run("SPOP pool 3"), other.run("SPOP pool 3"));
        assert_eq!(a, b);
        assert_eq!(members(s.run("SMEMBERS pool")), members(other.run("SMEMBERS pool")));
        assert_eq!(s.run("SCARD pool"), int(6));
        assert!(matches!(s.run("SPOP pool"), Value::Bulk(Some(_))));
        assert_eq!(
            (s.run("SPOP nope"), s.run("SPOP nope 2")),
            (Value::null(), Value::Set(vec![]))
        );
        assert_eq!(
            s.run("SPOP pool -1"),
            Value::error("ERR value is out of range, must be positive")
        );
        assert_eq!(members(s.run("SRANDMEMBER pool 100")).split(',').count(), 5);
        match s.run("SRANDMEMBER pool -7") {
            Value::Array(Some(items)) => assert_eq!(items.len(), 7),
            other => panic!("{other:?}"),
        }
        assert_eq!(s.run("SSCAN pool 0 MATCH 1*"), s.run("SSCAN pool 0 MATCH 1*"));
        assert_eq!(
            s.run("SINTERCARD 3 a b"),
            Value::error("ERR Number of keys can't be greater than number of args")
        );

        // A set survives a restart, a snapshot shipped to another replica, RENAME and expiry.
        s.run("RENAME pool pool2");
        s.run("PEXPIRE pool2 100");
        s.restart();
        assert_eq!(s.run("SCARD pool2"), int(5));
        s.advance(100);
        assert_eq!((s.run("SCARD pool2"), s.run("SADD pool2 x")), (int(0), int(1)));
        assert_eq!(s.run("TTL pool2"), int(-1));
    }

    /// A sorted set is records per member, not one value: changing one member of a large set
    /// writes that member's records only, and the set stays in score order through renames and
    /// expiry.
    #[test]
    fn a_sorted_set_change_writes_only_the_changed_members_records() {
        let mut s = Replica::new();
        let members: Vec<String> = (0..1_000).map(|i| format!("{} m{i}", i % 97)).collect();
        assert_eq!(s.run(&format!("ZADD z {}", members.join(" "))), Value::Integer(1_000));
        let writes = |s: &mut Replica| s.state.store.stats().writes_in;
        let before = writes(&mut s);
        assert_eq!(s.run("ZADD z 5 new"), Value::Integer(1));
        assert_eq!(writes(&mut s) - before, 2, "a score record and an order record");
        let before = writes(&mut s);
        assert_eq!(s.run("ZINCRBY z 0.5 new"), Value::Double(Double(5.5)));
        assert_eq!(
            writes(&mut s) - before,
            3,
            "the old order record goes, two records come"
        );
        let before = writes(&mut s);
        assert_eq!(s.run("ZREM z new"), Value::Integer(1));
        assert_eq!(writes(&mut s) - before, 2);

        let lowest = Value::Pairs(vec![
            (Value::bulk("m0"), Value::Double(Double(0.0))),
            (Value::bulk("m194"), Value::Double(Double(0.0))),
        ]);
        assert_eq!(s.run("ZRANGE z 0 1 WITHSCORES"), lowest);
        assert_eq!(
            s.run("ZRANK z m96"),
            Value::Integer(998),
            "ninth of the ten at 96, by member"
        );
        assert_eq!(s.run("ZCOUNT z (95 +inf"), Value::Integer(10));
        assert_eq!(s.run("RENAME z y"), Value::ok());
        assert_eq!(
            (s.run("ZCARD z"), s.run("ZCARD y"), s.run("TYPE y")),
            (Value::Integer(0), Value::Integer(1_000), Value::Simple("zset".into()))
        );
        assert_eq!(s.run("ZRANGE y 0 1 WITHSCORES"), lowest);
        assert_eq!(s.run("PEXPIRE y 100"), Value::Integer(1));
        s.time_ms += 200;
        s.run("SET later 1");
        assert_eq!(
            (s.run("ZCARD y"), s.run("EXISTS y")),
            (Value::Integer(0), Value::Integer(0))
        );
        assert_eq!(s.run("ZADD y 1 a"), Value::Integer(1), "an expired set starts afresh");
        assert_eq!(s.run("ZRANGE y 0 -1"), Value::array(vec![Value::bulk("a")]));
    }

    #[test]
    fn list_commands_behave_like_redis() {
        let mut s = Replica::new();
        let int = Value::Integer;
        let list = |items: &[&str]| Value::array(items.iter().map(|i| Value::bulk(i.to_string())).collect());
        assert_eq!(s.run("RPUSH l a b c"), int(3));
        assert_eq!(s.run("LPUSH l z y"), int(5));
        assert_eq!(s.run("LRANGE l 0 -1"), list(&["y", "z", "a", "b", "c"]));
        assert_eq!(
            (s.run("LLEN l"), s.run("TYPE l")),
            (int(5), Value::Simple("list".into()))
        );
        assert_eq!(
            (s.run("LINDEX l -1"), s.run("LINDEX l 9")),
            (Value::bulk("c"), Value::null())
        );
        assert_eq!(s.run("LRANGE l -3 100"), list(&["a", "b", "c"]));
        assert_eq!(s.run("LPOP l"), Value::bulk("y"));
        assert_eq!(s.run("RPOP l 2"), list(&["c", "b"]));
        assert_eq!(
            (s.run("LPOP nope"), s.run("LPOP nope 2")),
            (Value::null(), Value::Array(None))
        );
        assert_eq!(s.run("LSET l 1 A"), Value::ok());
        assert_eq!(s.run("LSET l 5 A"), Value::error("ERR index out of range"));
        assert_eq!(s.run("LSET nope 0 A"), Value::error("ERR no such key"));
        assert_eq!(s.run("RPUSH l z z"), int(4));
        assert_eq!(s.run("LREM l -1 z"), int(1));
        assert_eq!(s.run("LRANGE l 0 -1"), list(&["z", "A", "z"]));
        assert_eq!(s.run("LREM l 0 z"), int(2));
        assert_eq!(s.run("RPUSH l b c d"), int(4));
        assert_eq!(s.run("LTRIM l 1 -2"), Value::ok());
        assert_eq!(s.run("LRANGE l 0 -1"), list(&["b", "c"]));
        assert_eq!(s.run("LMOVE l l LEFT RIGHT"), Value::bulk("b"));
        assert_eq!(s.run("RPOPLPUSH l m"), Value::bulk("b"));
        assert_eq!(
            (s.run("LRANGE l 0 -1"), s.run("LRANGE m 0 -1")),
            (list(&["c"]), list(&["b"]))
        );
        assert_eq!(s.run("LPUSHX nope a"), int(0));
        s.run("SET str x");
        assert_eq!(
            (s.run("LPUSH str a"), s.run("LMOVE l str LEFT LEFT")),
            (Value::error(WRONGTYPE), Value::error(WRONGTYPE))
        );
        assert_eq!(s.run("LTRIM l 5 10"), Value::ok());
        assert_eq!(s.run("EXISTS l"), int(0), "a list without elements is gone");
        assert_eq!(
            s.run("LPOP m 1 2"),
            Value::error("ERR wrong number of arguments for 'lpop' command")
        );

        // LINSERT into the middle again and again: positions run out and one side moves over.
        s.run("RPUSH ins a z");
        let mut expected = vec!["a".to_string(), "z".to_string()];
        for i in 0..40 {
            let (pivot, after) = if i % 3 == 0 { ("z", false) } else { ("a", true) };
            let element = format!("e{i}");
            let side = if after { "AFTER" } else { "BEFORE" };
            assert_eq!(
                s.run(&format!("LINSERT ins {side} {pivot} {element}")),
                int(expected.len() as i64 + 1)
            );
            let at = expected.iter().position(|e| e == pivot).unwrap() + usize::from(after);
            expected.insert(at, element);
        }
        let refs: Vec<&str> = expected.iter().map(String::as_str).collect();
        assert_eq!(s.run("LRANGE ins 0 -1"), list(&refs));
        assert_eq!(
            (s.run("LINSERT ins BEFORE nope x"), s.run("LINSERT none BEFORE a x")),
            (int(-1), int(0))
        );

        assert_eq!(s.run("LMPOP 2 none pos LEFT"), Value::Array(None));
        s.run("RPUSH pos a b");
        assert_eq!(
            s.run("LMPOP 2 none pos RIGHT COUNT 5"),
            Value::array(vec![Value::bulk("pos"), list(&["b", "a"])])
        );
        assert_eq!(s.run("LMPOP 1 str LEFT"), Value::error(WRONGTYPE));
        assert_eq!(
            s.run("LMPOP 0 pos LEFT"),
            Value::error("ERR numkeys should be greater than 0")
        );
        assert_eq!(
            s.run("LMPOP 1 pos LEFT COUNT 0"),
            Value::error("ERR count should be greater than 0")
        );
        s.run("RPUSH pos a b c b a b");
        assert_eq!((s.run("LPOS pos b"), s.run("LPOS pos b RANK -1")), (int(1), int(5)));
        assert_eq!(s.run("LPOS pos b RANK 2 COUNT 0"), Value::array(vec![int(3), int(5)]));
        assert_eq!(s.run("LPOS pos b RANK -2 COUNT 5 MAXLEN 3"), Value::array(vec![int(3)]));
        assert_eq!(
            (s.run("LPOS pos z"), s.run("LPOS pos z COUNT 2")),
            (Value::null(), Value::array(vec![]))
        );
        assert!(s.run("LPOS pos b RANK 0").is_error());

        // A one-element list rotated onto itself keeps its deadline; a list survives RENAME
        // and a restart in order.
        s.run("RPUSH r only");
        s.run("PEXPIRE r 5000");
        assert_eq!(s.run("LMOVE r r LEFT RIGHT"), Value::bulk("only"));
        assert_eq!(s.run("PTTL r"), int(5000));
        for i in 0..100 {
            s.run(&format!("RPUSH big e{i}"));
            s.run(&format!("LPUSH big f{i}"));
        }
        s.run("RENAME big big2");
        s.restart();
        assert_eq!(s.run("LLEN big2"), int(200));
        assert_eq!(s.run("LRANGE big2 0 1"), list(&["f99", "f98"]));
        assert_eq!(s.run("LINDEX big2 199"), Value::bulk("e99"));
        assert_eq!(s.run("LINDEX big2 100"), Value::bulk("e0"));
    }

    /// SCAN returns every key present for the whole scan at least once, whatever COUNT, with
    /// keys added and deleted while it runs.
    #[test]
    fn a_scan_returns_every_key_present_throughout() {
        let mut s = Replica::new();
        for i in 0..500 {
            s.run(&format!("SET k{i} v"));
        }
        s.run("HSET hash f v");
        for count in [1, 7, 100, 1000] {
            let mut seen = std::collections::HashSet::new();
            let mut cursor = "0".to_string();
            let mut calls = 0;
            loop {
                calls += 1;
                s.run(&format!("SET new{calls}-{count} v"));
                s.run(&format!("DEL new{}-{count}", calls - 1));
                let Value::Array(Some(reply)) = s.run(&format!("SCAN {cursor} COUNT {count}")) else {
                    panic!()
                };
                let Value::Bulk(Some(next)) = &reply[0] else { panic!() };
                let Value::Array(Some(keys)) = &reply[1] else { panic!() };
                assert!(keys.len() <= count);
                seen.extend(keys.iter().map(|k| format!("{k:?}")));
                cursor = String::from_utf8(next.to_vec()).unwrap();
                if cursor == "0" {
                    break;
                }
            }
            for i in 0..500 {
                let key = format!("{:?}", Value::bulk(format!("k{i}")));
                assert!(seen.contains(&key), "k{i} with COUNT {count}");
            }
            assert!(seen.contains(&format!("{:?}", Value::bulk("hash"))));
            assert!(calls >= 501 / count, "{calls} calls with COUNT {count}");
        }
        let Value::Array(Some(reply)) = s.run("SCAN 0 COUNT 10000 MATCH k1? TYPE string") else {
            panic!()
        };
        assert_eq!(sorted_len(&reply[1]), 10);
        let Value::Array(Some(reply)) = s.run("SCAN 0 COUNT 10000 TYPE hash") else {
            panic!()
        };
        assert_eq!(reply[1], Value::array(vec![Value::bulk("hash")]));
        assert_eq!(s.run("SCAN x"), Value::error("ERR invalid cursor"));
        assert_eq!(s.run("SCAN 0 COUNT 0"), Value::error("ERR syntax error"));
    }

    fn sorted_len(v: &Value) -> usize {
        match v {
            Value::Array(Some(items)) => items.len(),
            other => panic!("{other:?}"),
        }
    }

    /// The distributed-lock idiom: whoever takes the lock holds it until it expires, and only
    /// then can someone else take it.
    #[test]
    fn a_lock_taken_with_nx_px_is_held_for_its_time_and_no_longer() {
        let mut s = Replica::new();
        assert_eq!(s.run("SET lock:x alice NX PX 1000"), Value::ok());
        assert_eq!(s.run("SET lock:x bob NX PX 1000"), Value::null());
        s.advance(999);
        assert_eq!(s.run("SET lock:x bob NX PX 1000"), Value::null());
        assert_eq!(s.run("GET lock:x"), Value::bulk("alice"));
        s.advance(1);
        assert_eq!(s.run("GET lock:x"), Value::null());
        assert_eq!(s.run("SET lock:x bob NX PX 1000"), Value::ok());
        // A leader whose clock is behind cannot give the lock back early: the log's clock
        // never goes backwards.
        s.time_ms -= 5_000;
        assert_eq!(s.run("SET lock:x carol NX PX 1000"), Value::null());
        assert_eq!(s.run("PTTL lock:x"), Value::Integer(1000));
    }

    #[test]
    fn deadlines_and_the_log_clock_survive_restarts_and_shipping_and_the_sweep_deletes() {
        let mut s = Replica::new();
        for i in 0..10 {
            assert_eq!(s.run(&format!("SET k{i} v PX {}", 100 * (i + 1))), Value::ok());
        }
        s.run("HSET h f v");
        s.run("PEXPIRE h 5000");
        s.advance(250);
        s.restart();
        assert_eq!(s.run("PTTL h"), Value::Integer(4750));
        assert_eq!(s.run("EXISTS k1 k2 k3"), Value::Integer(2));
        // The clock came back too: an entry stamped earlier does not turn it back.
        s.time_ms -= 10_000;
        s.advance(0);
        assert_eq!(s.run("PTTL h"), Value::Integer(4750));
        s.time_ms += 10_000;

        let due = s.state.execute_read(&Read::ExpiredKeys { limit: 100 });
        assert_eq!(due, Value::array(vec![Value::bulk("k0"), Value::bulk("k1")]));
        assert_eq!(s.run("DBSIZE"), Value::Integer(11));
        s.index += 1;
        let sweep = crate::command::encode_delete_expired(&[Bytes::from("k0"), Bytes::from("k1"), Bytes::from("k2")]);
        s.state.entry_time(s.time_ms);
        assert_eq!(s.state.apply(s.index, &sweep), Value::ok());
        s.state.entry_applied(s.index);
        assert_eq!(s.run("DBSIZE"), Value::Integer(9), "k2 has not expired and stays");
        assert_eq!(s.run("PTTL k2"), Value::Integer(50));

        let (snapshot, files) = s.ship();
        let mut follower = Replica::new();
        follower.state.install_snapshot(&snapshot, files.path()).unwrap();
        follower.time_ms = s.time_ms;
        assert_eq!(follower.run("PTTL h"), Value::Integer(4750));
        assert_eq!(follower.observe(&["k2", "k9", "h"]), s.observe(&["k2", "k9", "h"]));
    }

    #[test]
    fn hash_commands_and_wrongtype() {
        let mut s = Replica::new();
        assert_eq!(s.run("HSET h f1 v1 f2 v2"), Value::Integer(2));
        assert_eq!(s.run("HSET h f1 v9"), Value::Integer(0));
        assert_eq!(
            s.run("HSET h f3 a f3 b"),
            Value::Integer(1),
            "a field repeated in one command counts once"
        );
        assert_eq!(s.run("HDEL h f3"), Value::Integer(1));
        assert_eq!(s.run("HGET h f1"), Value::bulk("v9"));
        assert_eq!(s.run("HLEN h"), Value::Integer(2));
        assert_eq!(
            s.run("HGETALL h"),
            Value::map(vec![
                (Value::bulk("f1"), Value::bulk("v9")),
                (Value::bulk("f2"), Value::bulk("v2"))
            ])
        );
        assert_eq!(s.run("HDEL h f1 f2 f3"), Value::Integer(2));
        assert_eq!(s.run("EXISTS h"), Value::Integer(0), "empty hashes disappear");
        s.run("SET str x");
        assert!(s.run("HSET str f v").is_error());
        assert!(s.run("HGET str f").is_error());
        s.run("HSET h f v");
        assert!(s.run("GET h").is_error());
        assert!(s.run("INCR h").is_error());
        assert_eq!(s.run("GET str"), Value::bulk("x"), "failed commands change nothing");
        assert_eq!(s.run("SET h plain"), Value::ok(), "SET replaces a hash, as in Redis");
        assert_eq!(s.run("TYPE h"), Value::Simple("string".into()));
        assert_eq!(s.run("HLEN h"), Value::error(WRONGTYPE));
        assert_eq!(s.run("DBSIZE"), Value::Integer(2));
        assert_eq!(s.run("DEL h str"), Value::Integer(2));
        assert_eq!(s.run("DBSIZE"), Value::Integer(0));
    }

    #[test]
    fn a_restart_from_the_manifest_keeps_everything_and_never_re_executes_a_command() {
        let mut s = Replica::new();
        s.run("SET a 1");
        s.run("INCR a");
        s.run("APPEND a z");
        s.run("HSET h f v g w");
        s.run("HDEL h g");
        s.run("SET gone x");
        s.run("DEL gone");
        for i in 0..50 {
            s.run(&format!("SET k{} {}", i % 7, i));
        }
        let keys = ["a", "h", "gone", "k0", "k6"];
        let before = s.observe(&keys);
        s.restart();
        assert_eq!(s.observe(&keys), before);
        assert_eq!(
            s.run("GET a"),
            Value::bulk("2z"),
            "INCR and APPEND persisted as their results"
        );
        s.run("HSET h n 1");
        s.restart();
        assert_eq!(s.run("HLEN h"), Value::Integer(2));
    }

    #[test]
    fn a_shipped_state_installs_on_another_replica() {
        let mut leader = Replica::new();
        for i in 0..40 {
            leader.run(&format!("SET s{} {i}", i % 9));
            leader.run(&format!("HSET h{} f{} {i}", i % 3, i % 5));
        }
        leader.run("DEL s1 h2");
        let (snapshot, staged) = leader.ship();
        let mut follower = Replica::new();
        follower.run("SET stale 1");
        let empty = tempfile::tempdir().unwrap();
        assert!(
            follower.state.install_snapshot(&snapshot, empty.path()).is_err(),
            "a shipment without its files is refused"
        );
        follower.state.install_snapshot(&snapshot, staged.path()).unwrap();
        follower.index = leader.index;
        let keys = ["s0", "s1", "s8", "h0", "h1", "h2", "stale"];
        assert_eq!(follower.observe(&keys), leader.observe(&keys));
    }

    #[test]
    fn reduction_figures_reach_the_metrics_endpoint() {
        let mut s = Replica::new();
        for i in 0..METRICS_EVERY_ENTRIES {
            s.run(&format!("SET k0 {i}"));
        }
        // Other tests in this process publish to the same counters, so only lower bounds hold.
        let text = chorus_metrics::render();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
        };
        assert!(value("chorus_storage_writes_total") >= METRICS_EVERY_ENTRIES as f64);
        assert!(value("chorus_storage_records_persisted_total") >= 1.0);
        assert!(value("chorus_storage_segment_bytes_written_total") >= 1.0);
    }

    /// One client's enveloped writes, applied as the log would hold them.
    struct RiflClient {
        incarnation: u64,
        connection: u64,
    }

    impl RiflClient {
        fn register(s: &mut Replica, connection: u64) -> RiflClient {
            s.index += 1;
            let Value::Integer(incarnation) = s.state.apply(s.index, &crate::command::encode_register()) else {
                panic!("registration failed")
            };
            s.state.entry_applied(s.index);
            RiflClient {
                incarnation: incarnation as u64,
                connection,
            }
        }

        fn write(&self, s: &mut Replica, seq: u64, first_unacked: u64, cmd: &str) -> Value {
            let args = args(cmd);
            let envelope = Envelope {
                client: chorus_curp::rifl::ClientId {
                    incarnation: self.incarnation,
                    connection: self.connection,
                },
                seq,
                first_unacked,
            };
            s.index += 1;
            s.state.entry_time(s.time_ms);
            let reply = s
                .state
                .apply(s.index, &crate::command::encode_enveloped(&envelope, &args));
            s.state.entry_applied(s.index);
            reply
        }
    }

    #[test]
    fn an_enveloped_incr_executes_once_however_often_it_arrives_across_restarts_and_shipping() {
        let mut s = Replica::new();
        let c = RiflClient::register(&mut s, 1);
        assert_eq!(c.write(&mut s, 1, 1, "INCR n"), Value::Integer(1));
        assert_eq!(
            c.write(&mut s, 1, 1, "INCR n"),
            Value::Integer(1),
            "a retry gets the recorded reply"
        );
        assert_eq!(c.write(&mut s, 3, 1, "INCR n"), Value::error(OUT_OF_ORDER));
        assert_eq!(c.write(&mut s, 2, 1, "INCR n"), Value::Integer(2));
        assert_eq!(s.run("DBSIZE"), Value::Integer(1), "completion records are not keys");
        s.restart();
        assert_eq!(
            c.write(&mut s, 2, 2, "INCR n"),
            Value::Integer(2),
            "records survive a restart"
        );
        let (snapshot, staged) = s.ship();
        let mut follower = Replica::new();
        follower.state.install_snapshot(&snapshot, staged.path()).unwrap();
        follower.index = s.index;
        assert_eq!(
            c.write(&mut follower, 2, 2, "INCR n"),
            Value::Integer(2),
            "and shipping"
        );
        assert_eq!(c.write(&mut follower, 1, 1, "INCR n"), Value::error(STALE));
        assert_eq!(c.write(&mut follower, 3, 3, "INCR n"), Value::Integer(3));
        assert_eq!(follower.run("GET n"), Value::bulk("3"));
        assert_eq!(follower.state.rifl_clients(), 1);
        let stranger = RiflClient {
            incarnation: c.incarnation + 1,
            connection: 1,
        };
        assert_eq!(stranger.write(&mut follower, 1, 1, "INCR n"), Value::error(EXPIRED));
        assert_eq!(follower.run("GET n"), Value::bulk("3"), "refused writes change nothing");
        // Records that change without a store write (failed commands, acknowledgements) reach
        // the store too, wherever a batch was cut.
        follower.run("HSET h f v");
        for seq in 4..20 {
            let cmd = if seq % 2 == 0 { "INCR h" } else { "INCR n" };
            let first = c.write(&mut follower, seq, seq, cmd);
            if seq % 3 == 0 {
                follower.restart();
            }
            assert_eq!(
                c.write(&mut follower, seq, seq, cmd),
                first,
                "write {seq} after a restart"
            );
        }
        assert_eq!(follower.run("GET n"), Value::bulk("11"));
    }

    /// A random write over a few keys, fields and values, of every kind.
    fn random_write(rng: &mut u64) -> String {
        let mut next = |n: u64| below(rng, n);
        let key = |r: u64| ["a", "b", "c", "h", "g"][r as usize];
        let (k1, k2, f) = (key(next(5)), key(next(5)), ["x", "y"][next(2) as usize]);
        let v = ["1", "-3", "v", "9223372036854775807"][next(4) as usize];
        let ms = ["1", "400", "900"][next(3) as usize];
        let float = ["0.5", "-2.25", "abc", "1e2"][next(4) as usize];
        let score = ["1", "-2.5", "inf", "-inf", "3"][next(5) as usize];
        match next(70) {
            69 => format!("ZDIFFSTORE {k1} 2 {k2} {k1}"),
            68 => format!(
                "{} {k2} 2 {k1} {k2} WEIGHTS 2 0.5 AGGREGATE {}",
                ["ZUNIONSTORE", "ZINTERSTORE"][next(2) as usize],
                ["SUM", "MIN", "MAX"][next(3) as usize]
            ),
            67 => format!("SETBIT {k1} {} {}", next(20), next(2)),
            57 => format!("ZADD {k1} {score} {f} 2 {f}"),
            58 => format!(
                "ZADD {k1} {} {score} {f}",
                ["NX", "XX CH", "GT", "LT CH", "INCR"][next(5) as usize]
            ),
            59 => format!("ZINCRBY {k1} {score} {f}"),
            60 => format!("ZREM {k1} {f} z {f}"),
            61 => format!("ZPOPMIN {k1} {}", next(3)),
            62 => format!("ZPOPMAX {k1}"),
            63 => format!("ZMPOP 2 {k1} {k2} MAX COUNT {}", 1 + next(3)),
            64 => format!("ZREMRANGEBYSCORE {k1} (1 +inf"),
            65 => format!("ZREMRANGEBYRANK {k1} 0 {}", next(3) as i64 - 1),
            66 => format!("ZRANGESTORE {k2} {k1} 0 -1"),
            26 => format!("SETRANGE {k1} {} {v}", next(4)),
            27 => format!("INCRBYFLOAT {k1} {float}"),
            28 => format!("MSETNX {k1} {v} {k2} {v}"),
            29 => format!("HINCRBY {k1} {f} {v}"),
            30 => format!("HINCRBYFLOAT {k1} {f} {float}"),
            31 => format!("HSETNX {k1} {f} {v}"),
            32 => format!("RENAME {k1} {k2}"),
            33 => format!("RENAMENX {k1} {k2}"),
            34 => format!("COPY {k1} {k2}"),
            35 => format!("COPY {k1} {k2} REPLACE"),
            36 => format!("SETRANGE {k1} 2 \"\""),
            37 => format!("SADD {k1} {f} {v} {f}"),
            38 => format!("SREM {k1} {f} z {f}"),
            39 => format!("SMOVE {k1} {k2} {f}"),
            40 => format!("SINTERSTORE {k1} {k2} {k1}"),
            41 => format!("SUNIONSTORE {k1} {k2} c"),
            42 => format!("SDIFFSTORE {k2} {k1} {k2}"),
            43 => format!("SPOP {k1} {}", next(3)),
            44 => format!("SPOP {k1}"),
            45 => format!("RPUSH {k1} {v} {f}"),
            46 => format!("LPUSH {k1} {f} {v}"),
            47 => format!("LPOP {k1} {}", next(3)),
            48 => format!("RPOP {k1}"),
            49 => format!("LREM {k1} {} {v}", next(3) as i64 - 1),
            50 => format!("LTRIM {k1} 1 -2"),
            51 => format!("LSET {k1} -1 {v}"),
            52 => format!("LMOVE {k1} {k2} LEFT RIGHT"),
            53 => format!("RPOPLPUSH {k1} {k1}"),
            54 => format!("LPUSHX {k1} {v}"),
            55 => format!("LINSERT {k1} {} {v} {f}", ["BEFORE", "AFTER"][next(2) as usize]),
            56 => format!("LMPOP 2 {k1} {k2} RIGHT COUNT {}", 1 + next(3)),
            12 => format!("SET {k1} {v} PX {ms}"),
            13 => format!("SET {k1} {v} KEEPTTL GET"),
            14 => format!("SET {k1} {v} NX PX {ms}"),
            15 => format!("SETEX {k1} 1 {v}"),
            16 => format!("PEXPIRE {k1} {ms}"),
            17 => format!("PEXPIRE {k1} {ms} GT"),
            18 => format!("PEXPIRE {k1} {ms} XX LT"),
            19 => format!("EXPIRE {k1} 1 NX"),
            20 => format!("EXPIREAT {k1} 1"),
            21 => format!("PERSIST {k1}"),
            22 => format!("GETEX {k1} PX {ms}"),
            23 => format!("GETEX {k1} PERSIST"),
            24 => format!("GETDEL {k1}"),
            25 => format!("GETSET {k1} {v}"),
            0 => format!("SET {k1} {v}"),
            1 => format!("SET {k1} {v} NX"),
            2 => format!("SET {k1} {v} XX"),
            3 => format!("SETNX {k1} {v}"),
            4 => format!("DEL {k1} {k2} {k1}"),
            5 => format!("MSET {k1} {v} {k2} {v}"),
            6 => format!("INCRBY {k1} {v}"),
            7 => format!("APPEND {k1} {v}"),
            8 => format!("HSET {k1} {f} {v} {f} {v}"),
            9 => format!("HMSET {k1} {f} {v}"),
            10 => format!("HDEL {k1} {f} {f} z"),
            _ => format!("INCR {k1}"),
        }
    }

    /// A CURP leader answers before a write applies: for every kind of write, on whatever state
    /// random writes left, the previewed reply is the one applying it gives, and it is
    /// predicted unless what the write does depends on the time of its entry.
    #[test]
    fn a_predicted_reply_is_the_reply_applying_gives() {
        let mut s = Replica::new();
        let c = RiflClient::register(&mut s, 1);
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut predicted_count = 0;
        for seq in 1..=3_000 {
            s.time_ms += below(&mut rng, 300);
            s.state.entry_time(s.time_ms);
            let cmd = random_write(&mut rng);
            let args = args(&cmd);
            let (previewed, timed) = match Command::parse(&args) {
                Ok(Some(Command::Write(write))) => (
                    s.state.preview_write(&write),
                    write.reads_the_clock() || write.keys().iter().any(|k| s.state.deadlines.get(k).is_some()),
                ),
                Err(e) => (Value::error(e), false),
                Ok(_) => panic!("{cmd} is a write"),
            };
            let envelope = Envelope {
                client: chorus_curp::rifl::ClientId {
                    incarnation: c.incarnation,
                    connection: 1,
                },
                seq,
                first_unacked: seq,
            };
            let logged = crate::command::encode_enveloped(&envelope, &args);
            assert_eq!(s.state.predict(s.index, &logged, Some(seq + 1)), None, "not its turn");
            let predicted = s.state.predict(s.index, &logged, None);
            assert_eq!(predicted.is_none(), timed, "{cmd}");
            let applied = c.write(&mut s, seq, seq, &cmd);
            assert_eq!(applied, previewed, "{cmd}");
            if let Some((keys, predicted)) = predicted {
                assert_eq!(applied, predicted, "{cmd}");
                assert!(keys.iter().all(|k| cmd.contains(std::str::from_utf8(k).unwrap())));
                predicted_count += 1;
            }
        }
        assert!(predicted_count > 1_000, "only {predicted_count} predicted");
    }

    /// A leader speculating while it proposes, with commands applying later, interleaved at
    /// random, from three clients that also resend: every speculative reply is the reply the
    /// command gives when it applies, and conflicting commands are not speculated on.
    #[test]
    fn a_speculative_reply_is_the_reply_the_write_gives_when_it_applies() {
        let mut s = Replica::new();
        let incarnation = RiflClient::register(&mut s, 1).incarnation;
        let mut rng = 0x1234_5678_9ABC_DEF1u64;
        let mut next = |n: u64| below(&mut rng, n);
        let mut commands_rng = 0x0FED_CBA9_8765_4321u64;
        let mut next_seq = [1u64; 3];
        let mut queue: std::collections::VecDeque<(u64, Bytes, Option<Value>)> = Default::default();
        let (mut speculated, mut declined) = (0, 0);
        for _ in 0..4_000 {
            // A few commands in flight, as on a leader whose log runs a little ahead.
            if queue.is_empty() || (queue.len() < 4 && next(2) == 0) {
                let connection = next(3);
                let seq = if next(10) == 0 && next_seq[connection as usize] > 1 {
                    next_seq[connection as usize] - 1
                } else {
                    next_seq[connection as usize] += 1;
                    next_seq[connection as usize] - 1
                };
                let cmd = random_write(&mut commands_rng);
                let args = args(&cmd);
                let envelope = Envelope {
                    client: chorus_curp::rifl::ClientId {
                        incarnation,
                        connection: connection + 1,
                    },
                    seq,
                    first_unacked: 1,
                };
                let logged = crate::command::encode_enveloped(&envelope, &args);
                let index = s.index + queue.len() as u64 + 1;
                let spec = s.state.speculate(index, &logged);
                if spec.is_some() {
                    speculated += 1;
                } else {
                    declined += 1;
                }
                s.state.proposed(index, &logged);
                queue.push_back((index, logged, spec));
            } else if let Some((index, logged, spec)) = queue.pop_front() {
                s.index += 1;
                assert_eq!(s.index, index);
                s.time_ms += next(300);
                s.state.entry_time(s.time_ms);
                let reply = s.state.apply(index, &logged);
                s.state.entry_applied(index);
                if let Some(spec) = spec {
                    assert_eq!(reply, spec, "entry {index}");
                }
            }
        }
        assert!(
            speculated > 500 && declined > 200,
            "{speculated} speculated, {declined} declined"
        );
        s.state.forget_proposed();
        assert!(s.state.proposed.is_empty());
    }

    /// FLUSHALL touches every key: while it is proposed and unapplied, a CURP leader answers no
    /// write early, whatever its keys.
    #[test]
    fn nothing_is_speculated_behind_a_flushall_until_it_applies() {
        let mut s = Replica::new();
        let incarnation = RiflClient::register(&mut s, 1).incarnation;
        s.run("SET k 1");
        let logged = |connection: u64, cmd: &str| {
            let envelope = Envelope {
                client: chorus_curp::rifl::ClientId {
                    incarnation,
                    connection,
                },
                seq: 1,
                first_unacked: 1,
            };
            crate::command::encode_enveloped(&envelope, &args(cmd))
        };
        let (flush, set) = (logged(1, "FLUSHALL"), logged(2, "SET k 2 NX"));
        let flush_index = s.index + 1;
        assert_eq!(s.state.speculate(flush_index, &flush), None, "FLUSHALL itself is not");
        s.state.proposed(flush_index, &flush);
        assert_eq!(s.state.speculate(flush_index + 1, &set), None);
        s.index = flush_index;
        s.state.apply(flush_index, &flush);
        s.state.entry_applied(flush_index);
        assert_eq!(s.state.speculate(flush_index + 1, &set), Some(Value::ok()));
    }

    /// Writes whose keys are disjoint commute: in either order they give the same replies and
    /// leave the same state — what lets CURP's witnesses hold them unordered.
    #[test]
    fn writes_on_disjoint_keys_commute() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut checked = 0;
        for _ in 0..300 {
            let prefix: Vec<String> = (0..6).map(|_| random_write(&mut rng)).collect();
            let (first, second) = (random_write(&mut rng), random_write(&mut rng));
            let keys = |cmd: &str| {
                let args = args(cmd);
                match Command::parse(&args) {
                    Ok(Some(Command::Write(w))) => w.keys(),
                    // A write that does not parse touches nothing.
                    _ => Vec::new(),
                }
            };
            if keys(&first).iter().any(|k| keys(&second).contains(k)) {
                continue;
            }
            checked += 1;
            let mut one = Replica::new();
            let mut other = Replica::new();
            for cmd in &prefix {
                one.run(cmd);
                other.run(cmd);
            }
            // Some of the prefix's deadlines pass.
            one.advance(500);
            other.advance(500);
            let (a1, b1) = (one.run(&first), one.run(&second));
            let (b2, a2) = (other.run(&second), other.run(&first));
            assert_eq!((a1, b1), (a2, b2), "{prefix:?} then {first} and {second}");
            let all = ["a", "b", "c", "h", "g"];
            assert_eq!(
                one.observe(&all),
                other.observe(&all),
                "{prefix:?} then {first} and {second}"
            );
        }
        assert!(checked > 100, "only {checked} disjoint pairs");
    }

    #[test]
    fn garbage_in_the_log_is_an_error_reply_not_a_panic() {
        let mut s = Replica::new();
        assert!(s.state.apply(1, b"").is_error());
        assert!(s.state.apply(1, &[1, 255, 255, 255, 255]).is_error());
        assert!(s
            .state
            .apply(1, &encode_args(&[Bytes::from("GET"), Bytes::from("k")]))
            .is_error());
        assert!(KvState::open(options(s.dir.path()), Some(b"not a manifest")).is_err());
    }
}
