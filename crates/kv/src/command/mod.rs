//! Key-value commands: parsing client arguments into typed commands (with Redis-compatible error
//! messages), and the log encoding of a write (its argument list, length-prefixed).

use bytes::Bytes;
use chorus_curp::rifl::{Envelope, ENVELOPE_BYTES};
use chorus_resp::Value;

pub use crate::decimal::Decimal;
use crate::decimal::{parse_float, Float};
pub use crate::expiry::ExpireAt;
pub use geo::{metres_per_unit, position, GeoRead, GeoSearch, SearchCommand};
pub use scripts::{script_sha, FunctionRead, FunctionWrite, RestorePolicy, ScriptCall, ScriptRef};
pub use stream_groups::{Claim, DeliveredAt, GroupRead, GroupReadFrom, GroupStart, GroupWrite, PendingRange};
pub use streams::{resolve_last_ids, NewId, ReadAfter, StreamId, StreamRead, StreamWrite, Trim, TrimTo};
pub use zsets::{
    parse_score, Aggregate, CombineOptions, Direction, LexBound, RangeQuery, ScoreBound, ZRange, ZaddOptions, ZsetOp,
    ZsetRead, ZsetWrite,
};

mod geo;
mod scripts;
mod stream_groups;
mod streams;
pub mod table;
mod zsets;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetCondition {
    Always,
    IfAbsent,
    IfPresent,
}

impl SetCondition {
    /// From NX (only if absent) and XX (only if present) flags, NX first.
    pub fn from_flags(nx: bool, xx: bool) -> SetCondition {
        match (nx, xx) {
            (true, _) => SetCondition::IfAbsent,
            (_, true) => SetCondition::IfPresent,
            _ => SetCondition::Always,
        }
    }
}

/// What a write that replaces a string's value does to the key's time to live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlChange {
    /// The key no longer expires (SET without options, MSET, GETSET).
    Clear,
    /// KEEPTTL.
    Keep,
    Set(ExpireAt),
}

/// EXPIRE's NX / XX / GT / LT (XX may join GT or LT; NX joins none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExpireCondition {
    /// Only if the key has no time to live.
    pub if_none: bool,
    /// Only if it has one.
    pub if_some: bool,
    /// Only if the new deadline is later (a key without one counts as never expiring).
    pub if_later: bool,
    /// Only if the new deadline is earlier.
    pub if_earlier: bool,
}

impl ExpireCondition {
    /// Whether a key whose deadline is `current` (`None`: it has none) takes `new`.
    pub fn allows(&self, current: Option<i64>, new: i64) -> bool {
        !(self.if_none && current.is_some()
            || self.if_some && current.is_none()
            || self.if_later && current.is_none_or(|c| new <= c)
            || self.if_earlier && current.is_some_and(|c| new >= c))
    }
}

/// A command that changes state; goes through the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Set {
        key: Bytes,
        value: Bytes,
        condition: SetCondition,
        /// SETNX answers 1/0 instead of OK/nil.
        reply_as_int: bool,
        ttl: TtlChange,
        /// SET ... GET and GETSET answer the value the key held.
        reply_old: bool,
        /// The command's name, for errors that name it.
        name: &'static str,
    },
    GetDel(Bytes),
    /// GETEX with an option: the value, and the key's time to live changed (`None`: PERSIST).
    /// A malformed time is an error only if the key holds a string, as in Redis.
    GetEx {
        key: Bytes,
        expire: Result<Option<ExpireAt>, CommandError>,
    },
    Expire {
        key: Bytes,
        at: ExpireAt,
        condition: ExpireCondition,
        name: &'static str,
    },
    Persist(Bytes),
    /// Internal (the leader's sweep, never a client's): deletes those of `keys` that have
    /// expired by the entry's time.
    DeleteExpired(Vec<Bytes>),
    SetRange {
        key: Bytes,
        offset: usize,
        value: Bytes,
    },
    /// SETBIT: bit `offset` (0 is the first byte's most significant) set or cleared.
    SetBit {
        key: Bytes,
        offset: u64,
        on: bool,
    },
    /// BITOP: `dest` set to the sources combined byte by byte (shorter ones padded with zero
    /// bytes), or deleted when every source is empty or missing.
    BitOp {
        op: BitOp,
        dest: Bytes,
        sources: Vec<Bytes>,
    },
    /// PFADD: the elements added to the HyperLogLog (made if missing).
    PfAdd {
        key: Bytes,
        elements: Vec<Bytes>,
    },
    /// PFMERGE: `dest` (made if missing) raised to the union of itself and the sources.
    PfMerge {
        dest: Bytes,
        sources: Vec<Bytes>,
    },
    /// SORT ... STORE: the destination becomes a list of what the sort answers.
    Sort(SortArgs),
    Restore(RestoreArgs),
    /// BITFIELD with a SET or INCRBY: the string grows to the farthest field written.
    BitField {
        key: Bytes,
        fields: Vec<BitField>,
    },
    /// The increment as given: Redis reads it only once it knows the key holds a string.
    IncrByFloat {
        key: Bytes,
        increment: Bytes,
    },
    MSetNx(Vec<(Bytes, Bytes)>),
    HIncrBy {
        key: Bytes,
        field: Bytes,
        delta: i64,
    },
    HIncrByFloat {
        key: Bytes,
        field: Bytes,
        increment: Decimal,
    },
    HSetNx {
        key: Bytes,
        field: Bytes,
        value: Bytes,
    },
    /// RENAME, or RENAMENX (`only_if_absent`).
    Rename {
        from: Bytes,
        to: Bytes,
        only_if_absent: bool,
    },
    Copy {
        from: Bytes,
        to: Bytes,
        replace: bool,
    },
    /// FLUSHALL / FLUSHDB: every key (see `touches_every_key`).
    FlushAll,
    /// EXEC of a MULTI transaction: unless one of `watched` no longer has the fingerprint it
    /// had when its client watched it (see `KvState::fingerprint`), every command runs, in
    /// order, in one entry; the reply is theirs as an array (a null array when aborted).
    Exec {
        watched: Vec<(Bytes, Bytes)>,
        commands: Vec<Vec<Bytes>>,
    },
    /// EVAL / EVALSHA: the script runs on every replica, in the entry's place in the log.
    Script(ScriptCall),
    /// SCRIPT LOAD: every replica learns the script (EVALSHA finds it on any node).
    ScriptLoad(Bytes),
    ScriptFlush,
    /// FUNCTION LOAD, DELETE, FLUSH and RESTORE.
    Functions(FunctionWrite),
    /// CONFIG SET notify-keyspace-events: every node notifies alike from this entry on.
    KeyspaceEvents(u16),
    /// PUBLISH (or SPUBLISH, `sharded`: to a shard channel): every node hands the message to
    /// its subscribers as it applies the entry.
    Publish {
        channel: Bytes,
        message: Bytes,
        sharded: bool,
    },
    Sets(SetWrite),
    Lists(ListWrite),
    Zsets(ZsetWrite),
    Streams(StreamWrite),
    Del(Vec<Bytes>),
    MSet(Vec<(Bytes, Bytes)>),
    IncrBy {
        key: Bytes,
        delta: i64,
    },
    Append {
        key: Bytes,
        value: Bytes,
    },
    HSet {
        key: Bytes,
        pairs: Vec<(Bytes, Bytes)>,
        /// HMSET answers OK instead of the number of new fields.
        reply_ok: bool,
    },
    HDel {
        key: Bytes,
        fields: Vec<Bytes>,
    },
}

/// A list's head (LEFT) or tail (RIGHT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Left,
    Right,
}

/// Writes to lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListWrite {
    /// LPUSH / RPUSH, or (`only_if_exists`) LPUSHX / RPUSHX.
    Push {
        key: Bytes,
        elements: Vec<Bytes>,
        end: End,
        only_if_exists: bool,
    },
    /// LPOP / RPOP; `count` given or not (the reply differs).
    Pop {
        key: Bytes,
        count: Option<usize>,
        end: End,
    },
    Set {
        key: Bytes,
        at: i64,
        element: Bytes,
    },
    Remove {
        key: Bytes,
        count: i64,
        element: Bytes,
    },
    Trim {
        key: Bytes,
        start: i64,
        stop: i64,
    },
    /// LMOVE, RPOPLPUSH.
    Move {
        from: Bytes,
        to: Bytes,
        from_end: End,
        to_end: End,
    },
    /// LMPOP: up to `count` elements from the first of `keys` that holds any.
    MultiPop {
        keys: Vec<Bytes>,
        end: End,
        count: usize,
    },
    /// LINSERT: `element` before (or `after`) the first element equal to `pivot`.
    Insert {
        key: Bytes,
        after: bool,
        pivot: Bytes,
        element: Bytes,
    },
}

impl ListWrite {
    fn keys(&self) -> Vec<Bytes> {
        match self {
            ListWrite::Push { key, .. }
            | ListWrite::Pop { key, .. }
            | ListWrite::Set { key, .. }
            | ListWrite::Remove { key, .. }
            | ListWrite::Trim { key, .. }
            | ListWrite::Insert { key, .. } => vec![key.clone()],
            ListWrite::Move { from, to, .. } => vec![from.clone(), to.clone()],
            ListWrite::MultiPop { keys, .. } => keys.clone(),
        }
    }
}

/// Reads of lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListRead {
    Len(Bytes),
    Range {
        key: Bytes,
        start: i64,
        stop: i64,
    },
    Index {
        key: Bytes,
        at: i64,
    },
    /// LPOS: `rank` counts matches from the head (from the tail if negative), `count` given or
    /// not (0: every match), `max_len` elements looked at (0: all).
    Pos {
        key: Bytes,
        element: Bytes,
        rank: i64,
        count: Option<usize>,
        max_len: usize,
    },
}

/// SINTER, SUNION, SDIFF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOp {
    Inter,
    Union,
    Diff,
}

/// Writes to sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetWrite {
    Add {
        key: Bytes,
        members: Vec<Bytes>,
    },
    Remove {
        key: Bytes,
        members: Vec<Bytes>,
    },
    /// SPOP; `count` given or not (the reply differs).
    Pop {
        key: Bytes,
        count: Option<usize>,
    },
    Move {
        from: Bytes,
        to: Bytes,
        member: Bytes,
    },
    /// SINTERSTORE, SUNIONSTORE, SDIFFSTORE.
    Store {
        op: SetOp,
        destination: Bytes,
        keys: Vec<Bytes>,
    },
}

impl SetWrite {
    fn keys(&self) -> Vec<Bytes> {
        match self {
            SetWrite::Add { key, .. } | SetWrite::Remove { key, .. } | SetWrite::Pop { key, .. } => vec![key.clone()],
            SetWrite::Move { from, to, .. } => vec![from.clone(), to.clone()],
            SetWrite::Store { destination, keys, .. } => std::iter::once(destination).chain(keys).cloned().collect(),
        }
    }
}

/// Reads of sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetRead {
    Members(Bytes),
    IsMember {
        key: Bytes,
        member: Bytes,
    },
    MIsMember {
        key: Bytes,
        members: Vec<Bytes>,
    },
    Card(Bytes),
    RandMember {
        key: Bytes,
        count: Option<i64>,
    },
    Operation {
        op: SetOp,
        keys: Vec<Bytes>,
    },
    /// SINTERCARD; a limit of 0 is none.
    InterCard {
        keys: Vec<Bytes>,
        limit: usize,
    },
    Scan {
        key: Bytes,
        args: ScanArgs,
    },
}

impl Write {
    /// The keys the write touches. Two writes on disjoint keys commute: applied in either order
    /// they leave the same state and give the same replies (CURP's witnesses rely on it).
    pub fn keys(&self) -> Vec<Bytes> {
        match self {
            Write::Set { key, .. }
            | Write::GetDel(key)
            | Write::GetEx { key, .. }
            | Write::Expire { key, .. }
            | Write::Persist(key)
            | Write::IncrBy { key, .. }
            | Write::SetRange { key, .. }
            | Write::SetBit { key, .. }
            | Write::PfAdd { key, .. }
            | Write::BitField { key, .. }
            | Write::IncrByFloat { key, .. }
            | Write::HIncrBy { key, .. }
            | Write::HIncrByFloat { key, .. }
            | Write::HSetNx { key, .. }
            | Write::Append { key, .. }
            | Write::HSet { key, .. }
            | Write::HDel { key, .. } => vec![key.clone()],
            Write::Del(keys) | Write::DeleteExpired(keys) => keys.clone(),
            Write::MSet(pairs) | Write::MSetNx(pairs) => pairs.iter().map(|(k, _)| k.clone()).collect(),
            Write::Rename { from, to, .. } | Write::Copy { from, to, .. } => vec![from.clone(), to.clone()],
            Write::BitOp { dest, sources, .. } | Write::PfMerge { dest, sources } => {
                std::iter::once(dest).chain(sources).cloned().collect()
            }
            Write::Sort(args) => std::iter::once(&args.key).chain(&args.store).cloned().collect(),
            Write::Restore(args) => vec![args.key.clone()],
            // See `touches_every_key`.
            Write::FlushAll => Vec::new(),
            Write::Exec { watched, commands } => watched
                .iter()
                .map(|(key, _)| key.clone())
                .chain(commands.iter().flat_map(|args| match Command::parse(args) {
                    Ok(Some(Command::Write(write))) => write.keys(),
                    _ => Vec::new(),
                }))
                .collect(),
            Write::Script(call) => call.keys.clone(),
            Write::ScriptLoad(_) | Write::ScriptFlush | Write::Functions(_) | Write::KeyspaceEvents(_) => Vec::new(),
            // Not a key, but messages to one channel must keep their order: they do not commute.
            Write::Publish { channel, .. } => vec![channel.clone()],
            Write::Sets(write) => write.keys(),
            Write::Lists(write) => write.keys(),
            Write::Zsets(write) => write.keys(),
            Write::Streams(write) => write.keys(),
        }
    }

    /// Whether the write touches every key, so commutes with none: it is never recorded by
    /// CURP's witnesses or answered before it commits, and nothing proposed after it is either
    /// until it applies.
    pub fn touches_every_key(&self) -> bool {
        match self {
            // A script may touch keys it did not declare; what the writes after a keyspace
            // events setting notify depends on where it is in the log; which functions there
            // are decides what the FCALLs after a FUNCTION write do.
            Write::FlushAll | Write::Script(_) | Write::Functions(_) | Write::KeyspaceEvents(_) => true,
            // BY and GET patterns read keys no argument names.
            Write::Sort(args) => args.reads_other_keys(),
            Write::Exec { commands, .. } => commands
                .iter()
                .any(|args| matches!(Command::parse(args), Ok(Some(Command::Write(w))) if w.touches_every_key())),
            _ => false,
        }
    }

    /// Whether what the write does depends on when it applies (beyond whether its keys have
    /// expired by then): it gives a key a deadline relative to the entry's time, or one that may
    /// already have passed. Such a write is never answered before it commits (CURP), because
    /// a write recovered from witnesses applies later than it was first ordered.
    pub fn reads_the_clock(&self) -> bool {
        match self {
            Write::Set { ttl, .. } => matches!(ttl, TtlChange::Set(_)),
            Write::GetEx { expire, .. } => !matches!(expire, Ok(None)),
            // SPOP's pick is drawn from the entry's time.
            Write::Expire { .. } | Write::DeleteExpired(_) | Write::Sets(SetWrite::Pop { .. }) => true,
            // Several commands' replies, each depending on the ones before: answered only once
            // the transaction has run.
            Write::Exec { .. } => true,
            // Its reply counts the subscribers there are when it applies. XADD's ids come from
            // the entry's time (and streams are never answered early).
            Write::Publish { .. } | Write::Streams(_) => true,
            // A TTL counts from the entry's time.
            Write::Restore(_) => true,
            _ => false,
        }
    }
}

/// A command that only reads state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// `read`, for a connection with client-side caching on (`client`, its id): the raft loop
    /// records `keys` for it as it executes the read (see `tracking`).
    Tracked {
        client: u64,
        keys: Vec<Bytes>,
        read: Box<Read>,
    },
    Get(Bytes),
    MGet(Vec<Bytes>),
    Exists(Vec<Bytes>),
    StrLen(Bytes),
    Type(Bytes),
    HGet {
        key: Bytes,
        field: Bytes,
    },
    HMGet {
        key: Bytes,
        fields: Vec<Bytes>,
    },
    HGetAll(Bytes),
    HKeys(Bytes),
    HVals(Bytes),
    HStrLen {
        key: Bytes,
        field: Bytes,
    },
    HLen(Bytes),
    HExists {
        key: Bytes,
        field: Bytes,
    },
    DbSize,
    /// LASTSAVE: when the latest write this node applied was made (its entry's time, in
    /// seconds): every write is on disk once it applies, so that is the last save.
    LastSave,
    /// INFO's keyspace line: how many keys, and how many of them have a deadline.
    KeyspaceCounts,
    /// MEMORY USAGE: about what `key` takes in memory, were its values all cached (nil when it
    /// does not exist).
    MemoryUsage(Bytes),
    /// TTL / PTTL (`in_ms`).
    Ttl {
        key: Bytes,
        in_ms: bool,
    },
    /// EXPIRETIME / PEXPIRETIME (`in_ms`).
    ExpireTime {
        key: Bytes,
        in_ms: bool,
    },
    /// Internal (the leader's sweep): up to `limit` keys whose time to live has run out.
    ExpiredKeys {
        limit: usize,
    },
    GetRange {
        key: Bytes,
        start: i64,
        end: i64,
    },
    GetBit {
        key: Bytes,
        offset: u64,
    },
    /// BITCOUNT: the range's error, if any, is answered only for a string key (Redis 7.0 looks
    /// the key up first: a missing key counts 0 whatever follows it).
    BitCount {
        key: Bytes,
        range: Result<Option<BitRange>, CommandError>,
    },
    /// BITPOS: as BITCOUNT, the range is checked after the key.
    BitPos {
        key: Bytes,
        bit: bool,
        range: Result<Option<BitRange>, CommandError>,
    },
    /// SORT without STORE, and SORT_RO.
    Sort(SortArgs),
    /// LCS: the options' error, if any, is answered after the keys' type is checked.
    Lcs {
        keys: [Bytes; 2],
        options: Result<LcsOptions, CommandError>,
    },
    /// DUMP: the key's value as a RESTORE payload.
    Dump(Bytes),
    /// OBJECT ENCODING, REFCOUNT, IDLETIME or FREQ.
    Object {
        info: ObjectInfo,
        key: Bytes,
    },
    /// A container command's HELP: its lines.
    Help(&'static [&'static str]),
    /// BITFIELD (or BITFIELD_RO) that only GETs.
    BitField {
        key: Bytes,
        fields: Vec<BitField>,
    },
    /// PFCOUNT: one HyperLogLog's cardinality, or the union's of several.
    PfCount(Vec<Bytes>),
    /// HRANDFIELD key [count [WITHVALUES]].
    HRandField {
        key: Bytes,
        count: Option<i64>,
        with_values: bool,
    },
    Keys(Bytes),
    Scan(ScanArgs),
    HScan {
        key: Bytes,
        args: ScanArgs,
        no_values: bool,
    },
    RandomKey,
    /// WATCH: each key's fingerprint now, to be compared when the transaction runs.
    Fingerprints(Vec<Bytes>),
    /// LDC's FETCH from a peer: each store key's value if it is cached here at its version
    /// (never read from disk), else nil.
    Cached(Vec<(Bytes, u64)>),
    /// EVAL_RO / EVALSHA_RO: a script that may only read.
    Script(ScriptCall),
    ScriptExists(Vec<Bytes>),
    Functions(FunctionRead),
    Sets(SetRead),
    Lists(ListRead),
    Zsets(ZsetRead),
    Streams(StreamRead),
    Geo(GeoRead),
}

/// A BITCOUNT or BITPOS range: bytes, or bits with `BIT`; negative bounds count from the end;
/// BITPOS may leave out the end (up to the string's end, and clear bits past it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitRange {
    pub start: i64,
    pub end: Option<i64>,
    pub in_bits: bool,
}

/// A bit range's arguments, errors in the order Redis finds them: BITCOUNT reads the end before
/// the unit, BITPOS the unit before the end.
fn bit_range(args: &[Bytes], unit_before_end: bool) -> Result<Option<BitRange>, CommandError> {
    let unit = |arg: Option<&Bytes>| match arg.map(|a| a.to_ascii_lowercase()) {
        None => Ok(false),
        Some(unit) if unit == b"byte" => Ok(false),
        Some(unit) if unit == b"bit" => Ok(true),
        Some(_) => Err(syntax_error()),
    };
    let Some(start) = args.first() else {
        return Ok(None);
    };
    let start = parse_i64(start)?;
    let (end, in_bits) = if unit_before_end {
        let in_bits = unit(args.get(2))?;
        (args.get(1).map(|end| parse_i64(end)).transpose()?, in_bits)
    } else {
        let end = args.get(1).map(|end| parse_i64(end)).transpose()?;
        // BITCOUNT answers 0 for two negative bounds the wrong way round before it reads the
        // unit: a unit it would refuse is not refused then.
        let backwards = end.is_some_and(|end| start < 0 && end < 0 && start > end);
        (end, if backwards { false } else { unit(args.get(2))? })
    };
    Ok(Some(BitRange { start, end, in_bits }))
}

/// BITOP's operation, applied byte by byte across the sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitOp {
    And,
    Or,
    Xor,
    Not,
}

/// A container command's subcommand, checked against its arity (with the command's and the
/// subcommand's names, negative: at least) as Redis 7.0 checks it.
pub(super) fn subcommand(
    command: &str,
    rest: &[Bytes],
    arities: &[(&'static str, i64)],
) -> Result<&'static str, CommandError> {
    let given = String::from_utf8_lossy(&rest[0]);
    let lower = given.to_ascii_lowercase();
    let Some(&(name, arity)) = arities.iter().find(|(name, _)| *name == lower) else {
        return Err(format!(
            "ERR unknown subcommand '{given}'. Try {} HELP.",
            command.to_ascii_uppercase()
        ));
    };
    let argc = rest.len() as i64 + 1;
    if (arity >= 0 && argc != arity) || argc < arity.abs() {
        return Err(format!("ERR wrong number of arguments for '{command}|{name}' command"));
    }
    Ok(name)
}

/// OBJECT's subcommands that read a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectInfo {
    Encoding,
    RefCount,
    IdleTime,
    Frequency,
}

const OBJECT_HELP: &[&str] = &[
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    How Redis would represent the key's value, judged from what it holds now.",
    "FREQ <key>",
    "    The key's access frequency: Chorus keeps none (no LFU policy).",
    "IDLETIME <key>",
    "    Seconds since the key was last used: Chorus keeps no access times, so 0.",
    "REFCOUNT <key>",
    "    References to the key's value, as Redis would count them.",
    "HELP",
    "    Shows this list.",
];

fn object(rest: &[Bytes]) -> Result<Command, CommandError> {
    let sub = subcommand(
        "object",
        rest,
        &[
            ("encoding", 3),
            ("freq", 3),
            ("idletime", 3),
            ("refcount", 3),
            ("help", 2),
        ],
    )?;
    let info = match sub {
        "help" => return Ok(Command::Read(Read::Help(OBJECT_HELP))),
        "encoding" => ObjectInfo::Encoding,
        "freq" => ObjectInfo::Frequency,
        "idletime" => ObjectInfo::IdleTime,
        _ => ObjectInfo::RefCount,
    };
    Ok(Command::Read(Read::Object {
        info,
        key: rest[1].clone(),
    }))
}

/// LCS's options: the string (neither), its length (LEN), or the matching ranges (IDX), those
/// at least `min_match_len` long, with their lengths if `with_match_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LcsOptions {
    pub len_only: bool,
    pub ranges: bool,
    pub min_match_len: u64,
    pub with_match_len: bool,
}

fn lcs_options(rest: &[Bytes]) -> Result<LcsOptions, CommandError> {
    let mut options = LcsOptions {
        len_only: false,
        ranges: false,
        min_match_len: 0,
        with_match_len: false,
    };
    let mut at = 0;
    while at < rest.len() {
        match rest[at].to_ascii_lowercase().as_slice() {
            b"idx" => options.ranges = true,
            b"len" => options.len_only = true,
            b"withmatchlen" => options.with_match_len = true,
            b"minmatchlen" if at + 1 < rest.len() => {
                options.min_match_len = parse_i64(&rest[at + 1])?.max(0) as u64;
                at += 1;
            }
            _ => return Err(syntax_error()),
        }
        at += 1;
    }
    if options.len_only && options.ranges {
        return Err("ERR If you want both the length and indexes, please just use IDX.".into());
    }
    Ok(options)
}

/// SORT's (or SORT_RO's) options, all checked before the key is looked at, as in Redis 7.0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortArgs {
    pub key: Bytes,
    pub descending: bool,
    pub alpha: bool,
    /// LIMIT offset count, as given.
    pub limit: Option<(i64, i64)>,
    /// BY: a pattern whose `*` each element replaces (`key->field` reads a hash's field).
    pub by: Option<Bytes>,
    /// Some BY had no `*`: no sorting at all (even if a later BY has one, as in Redis).
    pub unsorted: bool,
    /// GET patterns, in order (`#`: the element itself).
    pub gets: Vec<Bytes>,
    pub store: Option<Bytes>,
}

impl SortArgs {
    /// Whether the sort reads keys its patterns name (not declared keys).
    pub fn reads_other_keys(&self) -> bool {
        self.by.as_ref().is_some_and(|by| by.contains(&b'*')) || self.gets.iter().any(|get| get.as_ref() != b"#")
    }
}

/// RESTORE's arguments: the payload is decoded where it applies, and the TTL's error, if any, is
/// answered after BUSYKEY, as in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreArgs {
    pub key: Bytes,
    pub ttl_ms: Result<i64, CommandError>,
    pub payload: Bytes,
    pub replace: bool,
    /// ABSTTL: the TTL is a Unix time in milliseconds.
    pub absolute: bool,
}

/// RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME seconds] [FREQ frequency]. IDLETIME and
/// FREQ are checked and, Chorus keeping no access times, otherwise ignored.
fn restore(rest: &[Bytes]) -> Result<Command, CommandError> {
    let (mut replace, mut absolute, mut idle_given, mut frequency_given) = (false, false, false, false);
    let mut at = 3;
    while at < rest.len() {
        let more = rest.len() - at - 1;
        match rest[at].to_ascii_lowercase().as_slice() {
            b"replace" => replace = true,
            b"absttl" => absolute = true,
            b"idletime" if more >= 1 && !frequency_given => {
                if parse_i64(&rest[at + 1])? < 0 {
                    return Err("ERR Invalid IDLETIME value, must be >= 0".into());
                }
                idle_given = true;
                at += 1;
            }
            b"freq" if more >= 1 && !idle_given => {
                if !(0..=255).contains(&parse_i64(&rest[at + 1])?) {
                    return Err("ERR Invalid FREQ value, must be >= 0 and <= 255".into());
                }
                frequency_given = true;
                at += 1;
            }
            _ => return Err(syntax_error()),
        }
        at += 1;
    }
    let ttl_ms = parse_i64(&rest[1]).and_then(|ttl| {
        if ttl < 0 {
            Err("ERR Invalid TTL value, must be >= 0".into())
        } else {
            Ok(ttl)
        }
    });
    Ok(Command::Write(Write::Restore(RestoreArgs {
        key: rest[0].clone(),
        ttl_ms,
        payload: rest[2].clone(),
        replace,
        absolute,
    })))
}

fn sort_args(rest: &[Bytes], read_only_command: bool) -> Result<SortArgs, CommandError> {
    let mut args = SortArgs {
        key: rest[0].clone(),
        descending: false,
        alpha: false,
        limit: None,
        by: None,
        unsorted: false,
        gets: Vec::new(),
        store: None,
    };
    let mut at = 1;
    while at < rest.len() {
        let more = rest.len() - at - 1;
        match rest[at].to_ascii_lowercase().as_slice() {
            b"asc" => args.descending = false,
            b"desc" => args.descending = true,
            b"alpha" => args.alpha = true,
            b"limit" if more >= 2 => {
                args.limit = Some((parse_i64(&rest[at + 1])?, parse_i64(&rest[at + 2])?));
                at += 2;
            }
            b"store" if more >= 1 && !read_only_command => {
                args.store = Some(rest[at + 1].clone());
                at += 1;
            }
            b"by" if more >= 1 => {
                args.unsorted |= !rest[at + 1].contains(&b'*');
                args.by = Some(rest[at + 1].clone());
                at += 1;
            }
            b"get" if more >= 1 => {
                args.gets.push(rest[at + 1].clone());
                at += 1;
            }
            _ => return Err(syntax_error()),
        }
        at += 1;
    }
    Ok(args)
}

/// What BITFIELD does when a SET or INCRBY leaves its field's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    Wrap,
    /// Saturate: the field's largest or smallest value.
    Sat,
    /// The operation does nothing and answers nil.
    Fail,
}

/// One of BITFIELD's operations on a field of `bits` bits (at most 64 signed, 63 unsigned) at a
/// bit offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitField {
    pub op: BitFieldOp,
    pub signed: bool,
    pub bits: u32,
    pub offset: u64,
    pub overflow: Overflow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitFieldOp {
    Get,
    Set(i64),
    IncrBy(i64),
}

/// BITFIELD's (or BITFIELD_RO's) operations, every argument checked in Redis 7.0's order before
/// the key is looked at: a read when they only GET, else a write.
fn bitfield(rest: &[Bytes], read_only_command: bool) -> Result<Command, CommandError> {
    const TYPE_ERROR: &str =
        "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.";
    const MAX_BITS: u64 = 512 * 1024 * 1024 * 8;
    let offset_error = || CommandError::from("ERR bit offset is not an integer or out of range");
    let mut fields = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut at = 1;
    while at < rest.len() {
        let more = rest.len() - at - 1;
        let word = rest[at].to_ascii_lowercase();
        let op = match word.as_slice() {
            b"get" if more >= 2 => BitFieldOp::Get,
            b"set" if more >= 3 => BitFieldOp::Set(0),
            b"incrby" if more >= 3 => BitFieldOp::IncrBy(0),
            b"overflow" if more >= 1 => {
                overflow = match rest[at + 1].to_ascii_lowercase().as_slice() {
                    b"wrap" => Overflow::Wrap,
                    b"sat" => Overflow::Sat,
                    b"fail" => Overflow::Fail,
                    _ => return Err("ERR Invalid OVERFLOW type specified".into()),
                };
                at += 2;
                continue;
            }
            _ => return Err(syntax_error()),
        };
        let kind = &rest[at + 1];
        let signed = match kind.first() {
            Some(b'i') => true,
            Some(b'u') => false,
            _ => return Err(TYPE_ERROR.into()),
        };
        let bits = match parse_i64(&kind[1..]) {
            Ok(bits) if bits >= 1 && bits <= if signed { 64 } else { 63 } => bits as u32,
            _ => return Err(TYPE_ERROR.into()),
        };
        let offset_arg = &rest[at + 2];
        let offset = match offset_arg.strip_prefix(b"#") {
            Some(index) => parse_i64(index).ok().and_then(|i| i.checked_mul(i64::from(bits))),
            None => parse_i64(offset_arg).ok(),
        };
        let offset = match offset {
            Some(offset) if offset >= 0 && (offset as u64) < MAX_BITS => offset as u64,
            _ => return Err(offset_error()),
        };
        let op = match op {
            BitFieldOp::Get => op,
            BitFieldOp::Set(_) => BitFieldOp::Set(parse_i64(&rest[at + 3])?),
            BitFieldOp::IncrBy(_) => BitFieldOp::IncrBy(parse_i64(&rest[at + 3])?),
        };
        fields.push(BitField {
            op,
            signed,
            bits,
            offset,
            overflow,
        });
        at += if op == BitFieldOp::Get { 3 } else { 4 };
    }
    let key = rest[0].clone();
    if fields.iter().all(|f| f.op == BitFieldOp::Get) {
        Ok(Command::Read(Read::BitField { key, fields }))
    } else if read_only_command {
        Err("ERR BITFIELD_RO only supports the GET subcommand".into())
    } else {
        Ok(Command::Write(Write::BitField { key, fields }))
    }
}

/// A bit's value as SETBIT and BITPOS take it: 0 or 1.
fn bit_value(n: i64) -> Option<bool> {
    match n {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
}

/// A bit offset: from 0 to the bits of the longest string (512 MiB).
fn parse_bit_offset(arg: &[u8]) -> Result<u64, CommandError> {
    const MAX_BITS: i64 = 512 * 1024 * 1024 * 8;
    match parse_i64(arg) {
        Ok(offset) if (0..MAX_BITS).contains(&offset) => Ok(offset as u64),
        _ => Err("ERR bit offset is not an integer or out of range".into()),
    }
}

/// What SCAN and HSCAN take after the key: where to go on from, MATCH, COUNT and (SCAN) TYPE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanArgs {
    pub cursor: u64,
    pub pattern: Option<Bytes>,
    pub count: usize,
    /// `string` or `hash` (another type matches nothing).
    pub type_name: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Write(Write),
    Read(Read),
    Blocking(Blocking),
}

/// BLPOP, BRPOP, BLMPOP, BLMOVE, BRPOPLPUSH: the non-blocking write each waits to succeed
/// (`attempt`, as a client would send it: that is what the log holds), tried whenever one of
/// `keys` may hold an element, until it finds one or `timeout_ms` passes (`None`: never).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocking {
    pub attempt: Vec<Bytes>,
    pub keys: Vec<Bytes>,
    pub timeout_ms: Option<u64>,
    pub reply: BlockingReply,
    pub look: Look,
}

/// What a blocked command checks on its own node's state before it tries its attempt through
/// the log: a failed attempt is a write, which wakes the others blocked on its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// One of the keys holds something (a list or sorted set exists only while it has an element).
    AnyKeyExists,
    /// XREADGROUP: one of the streams has an entry its group has not delivered, or is missing or
    /// lacks the group (the attempt's error is the reply).
    Undelivered { group: Bytes },
}

/// How a blocking command answers, from its attempt's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockingReply {
    /// BLPOP / BRPOP: LMPOP's `[key, [element]]` as `[key, element]`; a null array on timeout.
    KeyAndElement,
    /// BLMPOP: as LMPOP; a null array on timeout.
    KeyAndElements,
    /// BLMOVE / BRPOPLPUSH: as LMOVE; a null bulk string on timeout.
    Element,
    /// BZPOPMIN / BZPOPMAX: ZMPOP's `[key, [[member, score]]]` as `[key, member, score]`; a null
    /// array on timeout.
    KeyMemberScore,
    /// XREAD BLOCK: as XREAD; a null array on timeout.
    Streams,
    /// XREADGROUP BLOCK: as XREADGROUP; a null array on timeout.
    GroupStreams,
}

impl BlockingReply {
    /// The reply to the client from an attempt's reply; `None` when the attempt found nothing.
    pub fn from_attempt(self, reply: Value) -> Option<Value> {
        match (self, reply) {
            (_, Value::Array(None) | Value::Bulk(None)) => None,
            (BlockingReply::KeyAndElement, Value::Array(Some(mut pair))) if pair.len() == 2 => {
                let elements = pair.pop().expect("two items");
                let key = pair.pop().expect("two items");
                match elements {
                    Value::Array(Some(mut one)) if one.len() == 1 => Some(Value::array(vec![key, one.remove(0)])),
                    other => Some(Value::error(format!("ERR unexpected LMPOP reply {other:?}"))),
                }
            }
            (BlockingReply::KeyMemberScore, Value::Array(Some(mut pair))) if pair.len() == 2 => {
                let popped = pair.pop().expect("two items");
                let key = pair.pop().expect("two items");
                match popped {
                    Value::Array(Some(mut one)) if one.len() == 1 => match one.remove(0) {
                        Value::Array(Some(mut member_score)) if member_score.len() == 2 => {
                            let score = member_score.pop().expect("two items");
                            Some(Value::array(vec![key, member_score.remove(0), score]))
                        }
                        other => Some(Value::error(format!("ERR unexpected ZMPOP reply {other:?}"))),
                    },
                    other => Some(Value::error(format!("ERR unexpected ZMPOP reply {other:?}"))),
                }
            }
            (_, reply) => Some(reply),
        }
    }

    pub fn timed_out(self) -> Value {
        match self {
            BlockingReply::Element => Value::null(),
            _ => Value::Array(None),
        }
    }
}

/// A Redis-style error message (without the leading '-').
pub type CommandError = String;

fn wrong_arity(name: &str) -> CommandError {
    format!("ERR wrong number of arguments for '{name}' command")
}

/// Whether a command got the number of arguments it takes; the error if not.
trait ArityCheck: Fn(usize) -> Result<(), CommandError> {}
impl<F: Fn(usize) -> Result<(), CommandError>> ArityCheck for F {}

/// Checks that command `name` got exactly, and at least, some number of arguments after its
/// name (`given` of them), as Redis's arity error words it.
fn arity_checks(name: &str, given: usize) -> (impl ArityCheck + '_, impl ArityCheck + '_) {
    let check = move |ok: bool| if ok { Ok(()) } else { Err(wrong_arity(name)) };
    (move |n| check(given == n), move |n| check(given >= n))
}

pub fn syntax_error() -> CommandError {
    "ERR syntax error".into()
}

const LPOS_ZERO_RANK: &str = "ERR RANK can't be zero: use 1 to start from the first match, 2 from the \
     second ... or use negative to start from the end of the list";

/// What LMPOP and ZMPOP share, checked in Redis's order: numkeys, that many keys, the end to pop
/// from (read by `end`), then COUNT n.
fn multi_pop_args<'a, E>(
    rest: &'a [Bytes],
    name: &str,
    end: impl FnOnce(&[u8]) -> Result<E, CommandError>,
) -> Result<(&'a [Bytes], E, usize), CommandError> {
    if rest.len() < 3 {
        return Err(wrong_arity(name));
    }
    let numkeys = parse_i64(&rest[0])
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| CommandError::from("ERR numkeys should be greater than 0"))?;
    if numkeys > rest.len() - 2 {
        return Err(syntax_error());
    }
    let end = end(&rest[1 + numkeys])?;
    let count = match &rest[2 + numkeys..] {
        [] => 1,
        [word, n] if word.eq_ignore_ascii_case(b"count") => parse_i64(n)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| CommandError::from("ERR count should be greater than 0"))?,
        _ => return Err(syntax_error()),
    };
    Ok((&rest[1..1 + numkeys], end, count))
}

/// LMPOP's arguments: numkeys, the keys, LEFT or RIGHT, then COUNT n.
fn lmpop(rest: &[Bytes]) -> Result<ListWrite, CommandError> {
    let (keys, end, count) = multi_pop_args(rest, "lmpop", end_arg)?;
    Ok(ListWrite::MultiPop {
        keys: keys.to_vec(),
        end,
        count,
    })
}

/// A blocking command's timeout in seconds (fractions allowed); 0 waits for ever.
fn timeout_arg(arg: &[u8]) -> Result<Option<u64>, CommandError> {
    let seconds: f64 = std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| s.is_finite())
        .ok_or_else(|| CommandError::from("ERR timeout is not a float or out of range"))?;
    if seconds < 0.0 {
        return Err("ERR timeout is negative".into());
    }
    Ok((seconds > 0.0).then(|| (seconds * 1000.0).ceil() as u64))
}

const POP_COUNT_OUT_OF_RANGE: &str = "ERR value is out of range, must be positive";

/// A count that Redis refuses with the one `error` whether it is no integer or negative.
fn count_arg(arg: &[u8], error: &str) -> Result<usize, CommandError> {
    parse_i64(arg)
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| CommandError::from(error))
}

/// LEFT or RIGHT.
fn end_arg(arg: &[u8]) -> Result<End, CommandError> {
    if arg.eq_ignore_ascii_case(b"left") {
        Ok(End::Left)
    } else if arg.eq_ignore_ascii_case(b"right") {
        Ok(End::Right)
    } else {
        Err(syntax_error())
    }
}

/// The set operation a command's name says.
fn set_op(name: &str) -> SetOp {
    if name.starts_with("sinter") {
        SetOp::Inter
    } else if name.starts_with("sunion") {
        SetOp::Union
    } else {
        SetOp::Diff
    }
}

pub fn not_a_float() -> CommandError {
    "ERR value is not a valid float".into()
}

pub fn invalid_expire_time(name: &str) -> CommandError {
    format!("ERR invalid expire time in '{name}' command")
}

/// The time to live given to SET, SETEX, PSETEX or GETEX, as Redis checks it: a positive
/// integer (seconds small enough to be counted in milliseconds).
fn expire_arg(arg: &[u8], seconds: bool, absolute: bool, name: &str) -> Result<ExpireAt, CommandError> {
    let n = parse_i64(arg)?;
    if n <= 0 || (seconds && n > i64::MAX / 1000) {
        return Err(invalid_expire_time(name));
    }
    let ms = if seconds { n * 1000 } else { n };
    Ok(if absolute {
        ExpireAt::UnixMs(ms)
    } else {
        ExpireAt::AfterMs(ms)
    })
}

/// The options of SET (`for_set`) or GETEX, read as Redis reads them: an option may repeat, but
/// not be combined with one it excludes.
struct StringOptions {
    condition: SetCondition,
    reply_old: bool,
    keep_ttl: bool,
    persist: bool,
    /// A malformed time is kept as its error: GETEX reports it only after looking up the key.
    expire: Result<Option<ExpireAt>, CommandError>,
}

fn string_options(opts: &[Bytes], for_set: bool, name: &str) -> Result<StringOptions, CommandError> {
    let mut o = StringOptions {
        condition: SetCondition::Always,
        reply_old: false,
        keep_ttl: false,
        persist: false,
        expire: Ok(None),
    };
    // Which of EX / PX / EXAT / PXAT was given (by its upper-case name) and its argument, read
    // once every option has passed the syntax check, as Redis does.
    let mut expire_kind: Option<Vec<u8>> = None;
    let mut expire_arg_given: Option<&Bytes> = None;
    let mut i = 0;
    while i < opts.len() {
        let opt = opts[i].to_ascii_uppercase();
        let next = opts.get(i + 1);
        let other_expiry = |kind: &[u8]| expire_kind.as_deref().is_some_and(|k| k != kind);
        match opt.as_slice() {
            b"NX" if for_set && o.condition != SetCondition::IfPresent => o.condition = SetCondition::IfAbsent,
            b"XX" if for_set && o.condition != SetCondition::IfAbsent => o.condition = SetCondition::IfPresent,
            b"GET" if for_set => o.reply_old = true,
            b"KEEPTTL" if for_set && expire_kind.is_none() => o.keep_ttl = true,
            b"PERSIST" if !for_set && expire_kind.is_none() => o.persist = true,
            b"EX" | b"PX" | b"EXAT" | b"PXAT" if !o.keep_ttl && !o.persist && !other_expiry(&opt) && next.is_some() => {
                expire_kind = Some(opt);
                expire_arg_given = next;
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    if let (Some(kind), Some(arg)) = (expire_kind, expire_arg_given) {
        let seconds = kind == b"EX" || kind == b"EXAT";
        o.expire = expire_arg(arg, seconds, kind.ends_with(b"AT"), name).map(Some);
    }
    Ok(o)
}

/// EXPIRE's options, checked as Redis checks them.
fn expire_condition(opts: &[Bytes]) -> Result<ExpireCondition, CommandError> {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in opts {
        match opt.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"GT" => gt = true,
            b"LT" => lt = true,
            _ => return Err(format!("ERR Unsupported option {}", String::from_utf8_lossy(opt))),
        }
    }
    if nx && (xx || gt || lt) {
        return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
    }
    if gt && lt {
        return Err("ERR GT and LT options at the same time are not compatible".into());
    }
    Ok(ExpireCondition {
        if_none: nx,
        if_some: xx,
        if_later: gt,
        if_earlier: lt,
    })
}

/// SCAN's cursor, COUNT, MATCH and TYPE (`with_type`) or HSCAN's (and NOVALUES, returned).
fn scan_args(rest: &[Bytes], with_type: bool, allow_no_values: bool) -> Result<(ScanArgs, bool), CommandError> {
    let cursor = std::str::from_utf8(&rest[0])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| CommandError::from("ERR invalid cursor"))?;
    let mut args = ScanArgs {
        cursor,
        pattern: None,
        count: 10,
        type_name: None,
    };
    let mut no_values = false;
    let mut i = 1;
    while i < rest.len() {
        let opt = rest[i].to_ascii_uppercase();
        if opt.as_slice() == b"NOVALUES" && allow_no_values {
            no_values = true;
            i += 1;
            continue;
        }
        match (opt.as_slice(), rest.get(i + 1)) {
            (b"COUNT", Some(v)) => {
                let count = parse_i64(v)?;
                if count < 1 {
                    return Err(syntax_error());
                }
                args.count = usize::try_from(count).unwrap_or(usize::MAX);
            }
            (b"MATCH", Some(v)) => args.pattern = Some(v.clone()),
            (b"TYPE", Some(v)) if with_type => args.type_name = Some(Bytes::from(v.to_ascii_lowercase())),
            _ => return Err(syntax_error()),
        }
        i += 2;
    }
    Ok((args, no_values))
}

/// An integer as Redis reads one (its `string2ll`): an optional `-`, then digits with no leading
/// zero (`0` alone excepted), nothing else — no `+`, no spaces, no `-0` — within 64 bits. Rust's
/// own parsing takes `+1` and `01`, and INCR would then succeed where Redis refuses.
pub fn parse_i64(arg: &[u8]) -> Result<i64, CommandError> {
    let not_integer = || CommandError::from("ERR value is not an integer or out of range");
    let digits = arg.strip_prefix(b"-").unwrap_or(arg);
    let canonical = match digits {
        [b'0'] => digits.len() == arg.len(),
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical {
        return Err(not_integer());
    }
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(not_integer)
}

fn pairs(args: &[Bytes], name: &str) -> Result<Vec<(Bytes, Bytes)>, CommandError> {
    if args.is_empty() || !args.len().is_multiple_of(2) {
        return Err(wrong_arity(name));
    }
    Ok(args.chunks_exact(2).map(|p| (p[0].clone(), p[1].clone())).collect())
}

/// The lower-cased command name, for dispatch and metrics.
pub fn command_name(args: &[Bytes]) -> String {
    args.first()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .unwrap_or_default()
}

/// Longest command name `short_name` lower-cases; longer ones name no command Chorus knows.
pub const MAX_COMMAND_NAME_BYTES: usize = 20;

/// The lower-cased command name in `buf`, without allocating (this runs for every command);
/// `None` when it is too long or not ASCII to be a command Chorus knows.
pub fn short_name<'b>(args: &[Bytes], buf: &'b mut [u8; MAX_COMMAND_NAME_BYTES]) -> Option<&'b str> {
    let word = args.first()?;
    let lowered = buf.get_mut(..word.len())?;
    lowered.copy_from_slice(word);
    lowered.make_ascii_lowercase();
    std::str::from_utf8(lowered).ok().filter(|name| name.is_ascii())
}

impl Command {
    /// Parses a data command. `Ok(None)` means the name is not a data command.
    pub fn parse(args: &[Bytes]) -> Result<Option<Command>, CommandError> {
        let mut buf = [0u8; MAX_COMMAND_NAME_BYTES];
        let Some(name) = short_name(args, &mut buf) else {
            return Ok(None);
        };
        let rest = &args[1..];
        let (exact, at_least) = arity_checks(name, rest.len());
        let cmd = match name {
            "get" => {
                exact(1)?;
                Command::Read(Read::Get(rest[0].clone()))
            }
            "set" => {
                at_least(2)?;
                let o = string_options(&rest[2..], true, "set")?;
                let ttl = match (o.expire?, o.keep_ttl) {
                    (Some(at), _) => TtlChange::Set(at),
                    (None, true) => TtlChange::Keep,
                    (None, false) => TtlChange::Clear,
                };
                Command::Write(Write::Set {
                    key: rest[0].clone(),
                    value: rest[1].clone(),
                    condition: o.condition,
                    reply_as_int: false,
                    ttl,
                    reply_old: o.reply_old,
                    name: "set",
                })
            }
            "setnx" => {
                exact(2)?;
                Command::Write(Write::Set {
                    key: rest[0].clone(),
                    value: rest[1].clone(),
                    condition: SetCondition::IfAbsent,
                    reply_as_int: true,
                    ttl: TtlChange::Clear,
                    reply_old: false,
                    name: "setnx",
                })
            }
            "setex" | "psetex" => {
                exact(3)?;
                let (seconds, name) = if name == "setex" {
                    (true, "setex")
                } else {
                    (false, "psetex")
                };
                Command::Write(Write::Set {
                    key: rest[0].clone(),
                    value: rest[2].clone(),
                    condition: SetCondition::Always,
                    reply_as_int: false,
                    ttl: TtlChange::Set(expire_arg(&rest[1], seconds, false, name)?),
                    reply_old: false,
                    name,
                })
            }
            "getset" => {
                exact(2)?;
                Command::Write(Write::Set {
                    key: rest[0].clone(),
                    value: rest[1].clone(),
                    condition: SetCondition::Always,
                    reply_as_int: false,
                    ttl: TtlChange::Clear,
                    reply_old: true,
                    name: "getset",
                })
            }
            "getdel" => {
                exact(1)?;
                Command::Write(Write::GetDel(rest[0].clone()))
            }
            "getex" => {
                at_least(1)?;
                let o = string_options(&rest[1..], false, "getex")?;
                let key = rest[0].clone();
                match (o.expire, o.persist) {
                    (Ok(None), false) => Command::Read(Read::Get(key)),
                    (expire, _) => Command::Write(Write::GetEx { key, expire }),
                }
            }
            "expire" | "pexpire" | "expireat" | "pexpireat" => {
                at_least(2)?;
                let condition = expire_condition(&rest[2..])?;
                let (seconds, absolute, name) = match name {
                    "expire" => (true, false, "expire"),
                    "pexpire" => (false, false, "pexpire"),
                    "expireat" => (true, true, "expireat"),
                    _ => (false, true, "pexpireat"),
                };
                let n = parse_i64(&rest[1])?;
                let ms = if seconds {
                    n.checked_mul(1000).ok_or_else(|| invalid_expire_time(name))?
                } else {
                    n
                };
                Command::Write(Write::Expire {
                    key: rest[0].clone(),
                    at: if absolute {
                        ExpireAt::UnixMs(ms)
                    } else {
                        ExpireAt::AfterMs(ms)
                    },
                    condition,
                    name,
                })
            }
            "persist" => {
                exact(1)?;
                Command::Write(Write::Persist(rest[0].clone()))
            }
            "ttl" | "pttl" => {
                exact(1)?;
                Command::Read(Read::Ttl {
                    key: rest[0].clone(),
                    in_ms: name == "pttl",
                })
            }
            "expiretime" | "pexpiretime" => {
                exact(1)?;
                Command::Read(Read::ExpireTime {
                    key: rest[0].clone(),
                    in_ms: name == "pexpiretime",
                })
            }
            "del" | "unlink" => {
                at_least(1)?;
                Command::Write(Write::Del(rest.to_vec()))
            }
            // TOUCH only counts the keys that exist, as Chorus keeps no access times.
            "exists" | "touch" => {
                at_least(1)?;
                Command::Read(Read::Exists(rest.to_vec()))
            }
            "mget" => {
                at_least(1)?;
                Command::Read(Read::MGet(rest.to_vec()))
            }
            "mset" => Command::Write(Write::MSet(pairs(rest, name)?)),
            "incr" | "decr" => {
                exact(1)?;
                let delta = if name == "incr" { 1 } else { -1 };
                Command::Write(Write::IncrBy {
                    key: rest[0].clone(),
                    delta,
                })
            }
            "incrby" | "decrby" => {
                exact(2)?;
                let n = parse_i64(&rest[1])?;
                let delta = if name == "incrby" {
                    n
                } else {
                    n.checked_neg()
                        .ok_or_else(|| "ERR decrement would overflow".to_string())?
                };
                Command::Write(Write::IncrBy {
                    key: rest[0].clone(),
                    delta,
                })
            }
            "append" => {
                exact(2)?;
                Command::Write(Write::Append {
                    key: rest[0].clone(),
                    value: rest[1].clone(),
                })
            }
            "strlen" => {
                exact(1)?;
                Command::Read(Read::StrLen(rest[0].clone()))
            }
            "type" => {
                exact(1)?;
                Command::Read(Read::Type(rest[0].clone()))
            }
            "hset" | "hmset" => {
                at_least(3)?;
                Command::Write(Write::HSet {
                    key: rest[0].clone(),
                    pairs: pairs(&rest[1..], name)?,
                    reply_ok: name == "hmset",
                })
            }
            "hget" => {
                exact(2)?;
                Command::Read(Read::HGet {
                    key: rest[0].clone(),
                    field: rest[1].clone(),
                })
            }
            "hmget" => {
                at_least(2)?;
                Command::Read(Read::HMGet {
                    key: rest[0].clone(),
                    fields: rest[1..].to_vec(),
                })
            }
            "hgetall" => {
                exact(1)?;
                Command::Read(Read::HGetAll(rest[0].clone()))
            }
            "hdel" => {
                at_least(2)?;
                Command::Write(Write::HDel {
                    key: rest[0].clone(),
                    fields: rest[1..].to_vec(),
                })
            }
            "hkeys" => {
                exact(1)?;
                Command::Read(Read::HKeys(rest[0].clone()))
            }
            "hvals" => {
                exact(1)?;
                Command::Read(Read::HVals(rest[0].clone()))
            }
            "hstrlen" => {
                exact(2)?;
                Command::Read(Read::HStrLen {
                    key: rest[0].clone(),
                    field: rest[1].clone(),
                })
            }
            "hlen" => {
                exact(1)?;
                Command::Read(Read::HLen(rest[0].clone()))
            }
            "hexists" => {
                exact(2)?;
                Command::Read(Read::HExists {
                    key: rest[0].clone(),
                    field: rest[1].clone(),
                })
            }
            "dbsize" => {
                exact(0)?;
                Command::Read(Read::DbSize)
            }
            "lastsave" => {
                exact(0)?;
                Command::Read(Read::LastSave)
            }
            "getrange" | "substr" => {
                exact(3)?;
                Command::Read(Read::GetRange {
                    key: rest[0].clone(),
                    start: parse_i64(&rest[1])?,
                    end: parse_i64(&rest[2])?,
                })
            }
            "setrange" => {
                exact(3)?;
                let offset = parse_i64(&rest[1])?;
                let offset = usize::try_from(offset).map_err(|_| CommandError::from("ERR offset is out of range"))?;
                Command::Write(Write::SetRange {
                    key: rest[0].clone(),
                    offset,
                    value: rest[2].clone(),
                })
            }
            "setbit" => {
                exact(3)?;
                let offset = parse_bit_offset(&rest[1])?;
                let on = parse_i64(&rest[2])
                    .ok()
                    .and_then(bit_value)
                    .ok_or_else(|| CommandError::from("ERR bit is not an integer or out of range"))?;
                Command::Write(Write::SetBit {
                    key: rest[0].clone(),
                    offset,
                    on,
                })
            }
            "bitop" => {
                at_least(3)?;
                let op = match rest[0].to_ascii_lowercase().as_slice() {
                    b"and" => BitOp::And,
                    b"or" => BitOp::Or,
                    b"xor" => BitOp::Xor,
                    b"not" => BitOp::Not,
                    _ => return Err(syntax_error()),
                };
                if op == BitOp::Not && rest.len() != 3 {
                    return Err("ERR BITOP NOT must be called with a single source key.".into());
                }
                Command::Write(Write::BitOp {
                    op,
                    dest: rest[1].clone(),
                    sources: rest[2..].to_vec(),
                })
            }
            "lcs" => {
                at_least(2)?;
                Command::Read(Read::Lcs {
                    keys: [rest[0].clone(), rest[1].clone()],
                    options: lcs_options(&rest[2..]),
                })
            }
            "object" => {
                at_least(1)?;
                object(rest)?
            }
            "dump" => {
                exact(1)?;
                Command::Read(Read::Dump(rest[0].clone()))
            }
            "restore" => {
                at_least(3)?;
                restore(rest)?
            }
            "sort" | "sort_ro" => {
                at_least(1)?;
                let args = sort_args(rest, name == "sort_ro")?;
                if args.store.is_some() {
                    Command::Write(Write::Sort(args))
                } else {
                    Command::Read(Read::Sort(args))
                }
            }
            "bitfield" | "bitfield_ro" => {
                at_least(1)?;
                bitfield(rest, name == "bitfield_ro")?
            }
            "getbit" => {
                exact(2)?;
                Command::Read(Read::GetBit {
                    key: rest[0].clone(),
                    offset: parse_bit_offset(&rest[1])?,
                })
            }
            "bitcount" => {
                at_least(1)?;
                let range = match rest.len() {
                    1 | 3 | 4 => bit_range(&rest[1..], false),
                    _ => Err(syntax_error()),
                };
                Command::Read(Read::BitCount {
                    key: rest[0].clone(),
                    range,
                })
            }
            "bitpos" => {
                at_least(2)?;
                let bit = bit_value(parse_i64(&rest[1])?)
                    .ok_or_else(|| CommandError::from("ERR The bit argument must be 1 or 0."))?;
                let range = match rest.len() {
                    2..=5 => bit_range(&rest[2..], true),
                    _ => Err(syntax_error()),
                };
                Command::Read(Read::BitPos {
                    key: rest[0].clone(),
                    bit,
                    range,
                })
            }
            "pfadd" => {
                at_least(1)?;
                Command::Write(Write::PfAdd {
                    key: rest[0].clone(),
                    elements: rest[1..].to_vec(),
                })
            }
            "pfmerge" => {
                at_least(1)?;
                Command::Write(Write::PfMerge {
                    dest: rest[0].clone(),
                    sources: rest[1..].to_vec(),
                })
            }
            "pfcount" => {
                at_least(1)?;
                Command::Read(Read::PfCount(rest.to_vec()))
            }
            "incrbyfloat" => {
                exact(2)?;
                Command::Write(Write::IncrByFloat {
                    key: rest[0].clone(),
                    increment: rest[1].clone(),
                })
            }
            "msetnx" => Command::Write(Write::MSetNx(pairs(rest, name)?)),
            "hincrby" => {
                exact(3)?;
                Command::Write(Write::HIncrBy {
                    key: rest[0].clone(),
                    field: rest[1].clone(),
                    delta: parse_i64(&rest[2])?,
                })
            }
            "hincrbyfloat" => {
                exact(3)?;
                let increment = match parse_float(&rest[2]) {
                    Some(Float::Finite(increment)) => increment,
                    Some(Float::Infinite) => return Err("ERR value is NaN or Infinity".into()),
                    None => return Err(not_a_float()),
                };
                Command::Write(Write::HIncrByFloat {
                    key: rest[0].clone(),
                    field: rest[1].clone(),
                    increment,
                })
            }
            "hsetnx" => {
                exact(3)?;
                Command::Write(Write::HSetNx {
                    key: rest[0].clone(),
                    field: rest[1].clone(),
                    value: rest[2].clone(),
                })
            }
            "hrandfield" => {
                at_least(1)?;
                if rest.len() > 3 || (rest.len() == 3 && !rest[2].eq_ignore_ascii_case(b"withvalues")) {
                    return Err(syntax_error());
                }
                Command::Read(Read::HRandField {
                    key: rest[0].clone(),
                    count: rest.get(1).map(|c| parse_i64(c)).transpose()?,
                    with_values: rest.len() == 3,
                })
            }
            "keys" => {
                exact(1)?;
                Command::Read(Read::Keys(rest[0].clone()))
            }
            "scan" => {
                at_least(1)?;
                Command::Read(Read::Scan(scan_args(rest, true, false)?.0))
            }
            "hscan" => {
                at_least(2)?;
                let (args, no_values) = scan_args(&rest[1..], false, true)?;
                Command::Read(Read::HScan {
                    key: rest[0].clone(),
                    args,
                    no_values,
                })
            }
            "randomkey" => {
                exact(0)?;
                Command::Read(Read::RandomKey)
            }
            "rename" | "renamenx" => {
                exact(2)?;
                Command::Write(Write::Rename {
                    from: rest[0].clone(),
                    to: rest[1].clone(),
                    only_if_absent: name == "renamenx",
                })
            }
            "copy" => {
                at_least(2)?;
                let mut replace = false;
                let mut i = 2;
                while i < rest.len() {
                    match rest[i].to_ascii_uppercase().as_slice() {
                        b"REPLACE" => replace = true,
                        b"DB" if i + 1 < rest.len() => {
                            if parse_i64(&rest[i + 1])? != 0 {
                                return Err("ERR DB index is out of range".into());
                            }
                            i += 1;
                        }
                        _ => return Err(syntax_error()),
                    }
                    i += 1;
                }
                Command::Write(Write::Copy {
                    from: rest[0].clone(),
                    to: rest[1].clone(),
                    replace,
                })
            }
            "sadd" | "srem" => {
                at_least(2)?;
                let (key, members) = (rest[0].clone(), rest[1..].to_vec());
                Command::Write(Write::Sets(if name == "sadd" {
                    SetWrite::Add { key, members }
                } else {
                    SetWrite::Remove { key, members }
                }))
            }
            "spop" => {
                at_least(1)?;
                if rest.len() > 2 {
                    return Err(syntax_error());
                }
                let count = rest.get(1).map(|c| count_arg(c, POP_COUNT_OUT_OF_RANGE)).transpose()?;
                Command::Write(Write::Sets(SetWrite::Pop {
                    key: rest[0].clone(),
                    count,
                }))
            }
            "smove" => {
                exact(3)?;
                Command::Write(Write::Sets(SetWrite::Move {
                    from: rest[0].clone(),
                    to: rest[1].clone(),
                    member: rest[2].clone(),
                }))
            }
            "sinterstore" | "sunionstore" | "sdiffstore" => {
                at_least(2)?;
                Command::Write(Write::Sets(SetWrite::Store {
                    op: set_op(name),
                    destination: rest[0].clone(),
                    keys: rest[1..].to_vec(),
                }))
            }
            "sinter" | "sunion" | "sdiff" => {
                at_least(1)?;
                Command::Read(Read::Sets(SetRead::Operation {
                    op: set_op(name),
                    keys: rest.to_vec(),
                }))
            }
            "smembers" => {
                exact(1)?;
                Command::Read(Read::Sets(SetRead::Members(rest[0].clone())))
            }
            "sismember" => {
                exact(2)?;
                Command::Read(Read::Sets(SetRead::IsMember {
                    key: rest[0].clone(),
                    member: rest[1].clone(),
                }))
            }
            "smismember" => {
                at_least(2)?;
                Command::Read(Read::Sets(SetRead::MIsMember {
                    key: rest[0].clone(),
                    members: rest[1..].to_vec(),
                }))
            }
            "scard" => {
                exact(1)?;
                Command::Read(Read::Sets(SetRead::Card(rest[0].clone())))
            }
            "srandmember" => {
                at_least(1)?;
                if rest.len() > 2 {
                    return Err(syntax_error());
                }
                Command::Read(Read::Sets(SetRead::RandMember {
                    key: rest[0].clone(),
                    count: rest.get(1).map(|c| parse_i64(c)).transpose()?,
                }))
            }
            "sintercard" => {
                at_least(2)?;
                let numkeys = parse_i64(&rest[0])
                    .ok()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| *n > 0)
                    .ok_or_else(|| CommandError::from("ERR numkeys should be greater than 0"))?;
                if numkeys > rest.len() - 1 {
                    return Err("ERR Number of keys can't be greater than number of args".into());
                }
                let mut limit = 0;
                let options = &rest[1 + numkeys..];
                match options {
                    [] => {}
                    [word, value] if word.eq_ignore_ascii_case(b"limit") => {
                        limit = count_arg(value, "ERR LIMIT can't be negative")?;
                    }
                    _ => return Err(syntax_error()),
                }
                Command::Read(Read::Sets(SetRead::InterCard {
                    keys: rest[1..1 + numkeys].to_vec(),
                    limit,
                }))
            }
            "sscan" => {
                at_least(2)?;
                Command::Read(Read::Sets(SetRead::Scan {
                    key: rest[0].clone(),
                    args: scan_args(&rest[1..], false, false)?.0,
                }))
            }
            "lpush" | "rpush" | "lpushx" | "rpushx" => {
                at_least(2)?;
                Command::Write(Write::Lists(ListWrite::Push {
                    key: rest[0].clone(),
                    elements: rest[1..].to_vec(),
                    end: if name.starts_with('l') { End::Left } else { End::Right },
                    only_if_exists: name.ends_with('x'),
                }))
            }
            "lpop" | "rpop" => {
                at_least(1)?;
                if rest.len() > 2 {
                    return Err(wrong_arity(name));
                }
                let count = rest.get(1).map(|c| count_arg(c, POP_COUNT_OUT_OF_RANGE)).transpose()?;
                Command::Write(Write::Lists(ListWrite::Pop {
                    key: rest[0].clone(),
                    count,
                    end: if name == "lpop" { End::Left } else { End::Right },
                }))
            }
            "lset" => {
                exact(3)?;
                Command::Write(Write::Lists(ListWrite::Set {
                    key: rest[0].clone(),
                    at: parse_i64(&rest[1])?,
                    element: rest[2].clone(),
                }))
            }
            "lrem" => {
                exact(3)?;
                Command::Write(Write::Lists(ListWrite::Remove {
                    key: rest[0].clone(),
                    count: parse_i64(&rest[1])?,
                    element: rest[2].clone(),
                }))
            }
            "ltrim" => {
                exact(3)?;
                Command::Write(Write::Lists(ListWrite::Trim {
                    key: rest[0].clone(),
                    start: parse_i64(&rest[1])?,
                    stop: parse_i64(&rest[2])?,
                }))
            }
            "lmove" | "rpoplpush" => {
                let (from_end, to_end) = if name == "lmove" {
                    exact(4)?;
                    (end_arg(&rest[2])?, end_arg(&rest[3])?)
                } else {
                    exact(2)?;
                    (End::Right, End::Left)
                };
                Command::Write(Write::Lists(ListWrite::Move {
                    from: rest[0].clone(),
                    to: rest[1].clone(),
                    from_end,
                    to_end,
                }))
            }
            "lmpop" => Command::Write(Write::Lists(lmpop(rest)?)),
            "blpop" | "brpop" => {
                at_least(2)?;
                let (keys, timeout) = rest.split_at(rest.len() - 1);
                let mut attempt = vec![Bytes::from_static(b"LMPOP"), Bytes::from(keys.len().to_string())];
                attempt.extend_from_slice(keys);
                attempt.push(Bytes::from_static(if name == "blpop" { b"LEFT" } else { b"RIGHT" }));
                Command::Blocking(Blocking {
                    attempt,
                    keys: keys.to_vec(),
                    timeout_ms: timeout_arg(&timeout[0])?,
                    reply: BlockingReply::KeyAndElement,
                    look: Look::AnyKeyExists,
                })
            }
            "blmpop" => {
                at_least(3)?;
                let timeout_ms = timeout_arg(&rest[0])?;
                let ListWrite::MultiPop { keys, .. } = lmpop(&rest[1..])? else {
                    unreachable!("lmpop parses to a multi-pop")
                };
                let mut attempt = vec![Bytes::from_static(b"LMPOP")];
                attempt.extend_from_slice(&rest[1..]);
                Command::Blocking(Blocking {
                    attempt,
                    keys,
                    timeout_ms,
                    reply: BlockingReply::KeyAndElements,
                    look: Look::AnyKeyExists,
                })
            }
            "blmove" | "brpoplpush" => {
                let (ends, timeout) = if name == "blmove" {
                    exact(5)?;
                    end_arg(&rest[2])?;
                    end_arg(&rest[3])?;
                    (&rest[2..4], &rest[4])
                } else {
                    exact(3)?;
                    (&[][..], &rest[2])
                };
                let mut attempt = vec![Bytes::from_static(if name == "blmove" {
                    b"LMOVE"
                } else {
                    b"RPOPLPUSH"
                })];
                attempt.extend_from_slice(&rest[..2]);
                attempt.extend_from_slice(ends);
                Command::Blocking(Blocking {
                    attempt,
                    keys: vec![rest[0].clone()],
                    timeout_ms: timeout_arg(timeout)?,
                    reply: BlockingReply::Element,
                    look: Look::AnyKeyExists,
                })
            }
            "linsert" => {
                exact(4)?;
                let after = if rest[1].eq_ignore_ascii_case(b"after") {
                    true
                } else if rest[1].eq_ignore_ascii_case(b"before") {
                    false
                } else {
                    return Err(syntax_error());
                };
                Command::Write(Write::Lists(ListWrite::Insert {
                    key: rest[0].clone(),
                    after,
                    pivot: rest[2].clone(),
                    element: rest[3].clone(),
                }))
            }
            "lpos" => {
                at_least(2)?;
                let (mut rank, mut count, mut max_len) = (1, None, 0);
                let options = &rest[2..];
                if !options.len().is_multiple_of(2) {
                    return Err(syntax_error());
                }
                for pair in options.chunks_exact(2) {
                    let option = pair[0].to_ascii_uppercase();
                    if !matches!(option.as_slice(), b"RANK" | b"COUNT" | b"MAXLEN") {
                        return Err(syntax_error());
                    }
                    let n = parse_i64(&pair[1])?;
                    match option.as_slice() {
                        b"RANK" if n == 0 => return Err(LPOS_ZERO_RANK.into()),
                        b"RANK" => rank = n.max(-i64::MAX),
                        b"COUNT" => {
                            count = Some(
                                usize::try_from(n).map_err(|_| CommandError::from("ERR COUNT can't be negative"))?,
                            )
                        }
                        _ => {
                            max_len =
                                usize::try_from(n).map_err(|_| CommandError::from("ERR MAXLEN can't be negative"))?
                        }
                    }
                }
                Command::Read(Read::Lists(ListRead::Pos {
                    key: rest[0].clone(),
                    element: rest[1].clone(),
                    rank,
                    count,
                    max_len,
                }))
            }
            "llen" => {
                exact(1)?;
                Command::Read(Read::Lists(ListRead::Len(rest[0].clone())))
            }
            "lrange" => {
                exact(3)?;
                Command::Read(Read::Lists(ListRead::Range {
                    key: rest[0].clone(),
                    start: parse_i64(&rest[1])?,
                    stop: parse_i64(&rest[2])?,
                }))
            }
            "lindex" => {
                exact(2)?;
                Command::Read(Read::Lists(ListRead::Index {
                    key: rest[0].clone(),
                    at: parse_i64(&rest[1])?,
                }))
            }
            "publish" | "spublish" => {
                exact(2)?;
                Command::Write(Write::Publish {
                    channel: rest[0].clone(),
                    message: rest[1].clone(),
                    sharded: name == "spublish",
                })
            }
            // Only the front end writes EXEC with arguments: what a MULTI queued, for the log.
            "exec" => Command::Write(exec_from_args(rest)?),
            // The one setting that is state: the front end answers the rest of CONFIG.
            "config"
                if rest.len() == 3
                    && rest[0].eq_ignore_ascii_case(b"set")
                    && rest[1].eq_ignore_ascii_case(b"notify-keyspace-events") =>
            {
                Command::Write(Write::KeyspaceEvents(crate::keyspace_events::parse(&rest[2])?))
            }
            "flushall" | "flushdb" => {
                let mode_known =
                    |mode: &Bytes| mode.eq_ignore_ascii_case(b"async") || mode.eq_ignore_ascii_case(b"sync");
                if rest.len() > 1 || rest.first().is_some_and(|mode| !mode_known(mode)) {
                    return Err(syntax_error());
                }
                Command::Write(Write::FlushAll)
            }
            _ => {
                return zsets::parse(name, rest)
                    .or_else(|| streams::parse(name, rest))
                    .or_else(|| stream_groups::parse(name, rest))
                    .or_else(|| scripts::parse(name, rest))
                    .or_else(|| geo::parse(name, rest, &args[0]))
                    .transpose()
            }
        };
        Ok(Some(cmd))
    }
}

/// The arguments EXEC carries in the log: the number of watched keys, each key and its
/// fingerprint, then per queued command its number of arguments and the arguments.
pub fn exec_args(watched: &[(Bytes, Bytes)], commands: &[Vec<Bytes>]) -> Vec<Bytes> {
    let count = |n: usize| Bytes::from(n.to_string());
    let mut args = vec![Bytes::from_static(b"EXEC"), count(watched.len())];
    for (key, fingerprint) in watched {
        args.extend([key.clone(), fingerprint.clone()]);
    }
    for command in commands {
        args.push(count(command.len()));
        args.extend(command.iter().cloned());
    }
    args
}

fn exec_from_args(rest: &[Bytes]) -> Result<Write, CommandError> {
    let malformed = || CommandError::from("ERR EXEC without MULTI");
    let count = |arg: Option<&Bytes>| -> Result<usize, CommandError> {
        let n = parse_i64(arg.ok_or_else(malformed)?).map_err(|_| malformed())?;
        usize::try_from(n).map_err(|_| malformed())
    };
    let watched_count = count(rest.first())?;
    let watched_end = watched_count
        .checked_mul(2)
        .and_then(|n| n.checked_add(1))
        .filter(|end| *end <= rest.len())
        .ok_or_else(malformed)?;
    let watched = rest[1..watched_end]
        .chunks_exact(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect();
    let mut commands = Vec::new();
    let mut at = watched_end;
    while at < rest.len() {
        let len = count(rest.get(at))?;
        let end = (at + 1)
            .checked_add(len)
            .filter(|end| *end <= rest.len() && len > 0)
            .ok_or_else(malformed)?;
        commands.push(rest[at + 1..end].to_vec());
        at = end;
    }
    Ok(Write::Exec { watched, commands })
}

pub(crate) const ARGS_VERSION: u8 = 1;
/// A write with its RIFL envelope: `[2][envelope]` then the argument list as in version 1.
pub(crate) const ENVELOPE_VERSION: u8 = 2;
/// Control commands. RIFL's leases: `[3][1]` registers an incarnation; `[3][2][incarnation u64]
/// [forgotten_below u64]` renews one. CURP: `[3][3][term u64]` ends the recovery of the leader
/// of `term`. Expiry: `[3][4]` then keys as an argument list deletes those that have expired.
const CONTROL_VERSION: u8 = 3;
const REGISTER: u8 = 1;
const RENEW: u8 = 2;
const CURP_RECOVERED: u8 = 3;
const DELETE_EXPIRED: u8 = 4;

/// A command as the log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Logged {
    /// A write without an envelope (logs written before RIFL, and tools that bypass it).
    Args(Vec<Bytes>),
    Enveloped(Envelope, Vec<Bytes>),
    Register,
    Renew {
        incarnation: u64,
        forgotten_below: u64,
    },
    /// The leader of `term` has proposed every write it recovered from the witnesses (they
    /// precede this in the log): every witness lets go of records from older terms.
    CurpRecovered {
        term: u64,
    },
    /// The leader's sweep of keys whose time to live ran out.
    DeleteExpired(Vec<Bytes>),
}

fn put_args(args: &[Bytes], out: &mut Vec<u8>) {
    out.extend_from_slice(&(args.len() as u32).to_le_bytes());
    for a in args {
        out.extend_from_slice(&(a.len() as u32).to_le_bytes());
        out.extend_from_slice(a);
    }
}

fn args_size(args: &[Bytes]) -> usize {
    4 + args.iter().map(|a| a.len() + 4).sum::<usize>()
}

/// Log encoding of a write: `[version u8][count u32]` then `[len u32][bytes]` per argument.
/// The raw argument list (not the typed command) is what travels, so every replica parses it the
/// same way and preprocessors (UniCache) see the command word, key and fields as separate items.
pub fn encode_args(args: &[Bytes]) -> Bytes {
    let mut out = Vec::with_capacity(1 + args_size(args));
    out.push(ARGS_VERSION);
    put_args(args, &mut out);
    Bytes::from(out)
}

/// Log encoding of a write that RIFL makes exactly-once.
pub fn encode_enveloped(envelope: &Envelope, args: &[Bytes]) -> Bytes {
    let mut out = Vec::with_capacity(1 + ENVELOPE_BYTES + args_size(args));
    out.push(ENVELOPE_VERSION);
    envelope.encode(&mut out);
    put_args(args, &mut out);
    Bytes::from(out)
}

/// The same enveloped write under another envelope.
pub fn reenvelope(command: &[u8], envelope: &Envelope) -> Bytes {
    assert_eq!(
        command.first(),
        Some(&ENVELOPE_VERSION),
        "only enveloped writes are re-enveloped"
    );
    let mut out = Vec::with_capacity(command.len());
    out.push(ENVELOPE_VERSION);
    envelope.encode(&mut out);
    out.extend_from_slice(&command[1 + ENVELOPE_BYTES..]);
    Bytes::from(out)
}

pub fn encode_register() -> Bytes {
    Bytes::from_static(&[CONTROL_VERSION, REGISTER])
}

pub fn encode_renew(incarnation: u64, forgotten_below: u64) -> Bytes {
    let mut out = Vec::with_capacity(18);
    out.extend_from_slice(&[CONTROL_VERSION, RENEW]);
    out.extend_from_slice(&incarnation.to_le_bytes());
    out.extend_from_slice(&forgotten_below.to_le_bytes());
    Bytes::from(out)
}

pub fn encode_curp_recovered(term: u64) -> Bytes {
    let mut out = Vec::with_capacity(10);
    out.extend_from_slice(&[CONTROL_VERSION, CURP_RECOVERED]);
    out.extend_from_slice(&term.to_le_bytes());
    Bytes::from(out)
}

pub fn encode_delete_expired(keys: &[Bytes]) -> Bytes {
    let mut out = Vec::with_capacity(2 + args_size(keys));
    out.extend_from_slice(&[CONTROL_VERSION, DELETE_EXPIRED]);
    put_args(keys, &mut out);
    Bytes::from(out)
}

/// Decodes a write's arguments as slices of one copy of `buf`: key and value of a SET share a
/// single allocation, which is what the state machine then holds.
pub fn decode_args(buf: &[u8]) -> Result<Vec<Bytes>, &'static str> {
    match decode_logged(buf)? {
        Logged::Args(args) => Ok(args),
        _ => Err("not a plain argument list"),
    }
}

/// Decodes a command from the log.
pub fn decode_logged(buf: &[u8]) -> Result<Logged, &'static str> {
    let (&version, rest) = buf.split_first().ok_or("empty command")?;
    match version {
        ARGS_VERSION => Ok(Logged::Args(decode_arg_list(buf, 1)?)),
        ENVELOPE_VERSION => {
            let envelope = Envelope::decode(rest).map_err(|_| "malformed RIFL envelope")?;
            Ok(Logged::Enveloped(envelope, decode_arg_list(buf, 1 + ENVELOPE_BYTES)?))
        }
        CONTROL_VERSION => match rest {
            [REGISTER] => Ok(Logged::Register),
            [RENEW, numbers @ ..] if numbers.len() == 16 => Ok(Logged::Renew {
                incarnation: u64::from_le_bytes(numbers[..8].try_into().expect("eight bytes")),
                forgotten_below: u64::from_le_bytes(numbers[8..].try_into().expect("eight bytes")),
            }),
            [CURP_RECOVERED, term @ ..] if term.len() == 8 => Ok(Logged::CurpRecovered {
                term: u64::from_le_bytes(term.try_into().expect("eight bytes")),
            }),
            [DELETE_EXPIRED, ..] => Ok(Logged::DeleteExpired(decode_arg_list(buf, 2)?)),
            _ => Err("malformed control command"),
        },
        _ => Err("unknown command encoding version"),
    }
}

/// The argument list starting at `start` in `buf`, which it must fill exactly.
fn decode_arg_list(buf: &[u8], start: usize) -> Result<Vec<Bytes>, &'static str> {
    let owned = Bytes::copy_from_slice(buf);
    let mut rest = buf.get(start..).ok_or("truncated command")?;
    let take_u32 = |rest: &mut &[u8]| -> Result<usize, &'static str> {
        if rest.len() < 4 {
            return Err("truncated command");
        }
        let (n, tail) = rest.split_at(4);
        *rest = tail;
        Ok(u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize)
    };
    let count = take_u32(&mut rest)?;
    let mut args = Vec::with_capacity(count.min(rest.len() / 4));
    for _ in 0..count {
        let len = take_u32(&mut rest)?;
        if rest.len() < len {
            return Err("truncated command");
        }
        let start = buf.len() - rest.len();
        args.push(owned.slice(start..start + len));
        rest = &rest[len..];
    }
    if !rest.is_empty() {
        return Err("trailing bytes after command");
    }
    Ok(args)
}

/// A command's arguments from its words, one space apart, as the tests write commands.
#[cfg(test)]
pub(crate) fn args_of(text: &str) -> Vec<Bytes> {
    text.split(' ')
        .map(|word| Bytes::copy_from_slice(word.as_bytes()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::args_of as args;
    use super::*;

    #[test]
    fn a_wrong_number_of_arguments_is_refused_in_redis_words() {
        for (command, name) in [
            ("GET", "get"),
            ("GET a b", "get"),
            ("MSET a", "mset"),
            ("ZADD z 1", "zadd"),
            ("ZSCORE z", "zscore"),
        ] {
            let refused = Command::parse(&args(command)).err();
            let expected = format!("ERR wrong number of arguments for '{name}' command");
            assert_eq!(refused, Some(expected), "{command}");
        }
        for command in ["GET a", "MSET a 1 b 2", "ZADD z 1 m", "ZSCORE z m"] {
            assert!(matches!(Command::parse(&args(command)), Ok(Some(_))), "{command}");
        }
    }

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        for (text, value) in [("0", 0), ("-1", -1), ("42", 42), ("9223372036854775807", i64::MAX)] {
            assert_eq!(parse_i64(text.as_bytes()), Ok(value), "{text}");
        }
        assert_eq!(parse_i64(b"-9223372036854775808"), Ok(i64::MIN));
        for text in [
            "",
            "-",
            "+1",
            "01",
            "-0",
            "-01",
            " 1",
            "1 ",
            "1.0",
            "9223372036854775808",
            "abc",
        ] {
            assert!(
                parse_i64(text.as_bytes()).is_err(),
                "{text:?} is not an integer to Redis"
            );
        }
    }

    #[test]
    fn parses_with_redis_errors() {
        assert_eq!(
            Command::parse(&args("SET k v NX")).unwrap(),
            Some(Command::Write(Write::Set {
                key: "k".into(),
                value: "v".into(),
                condition: SetCondition::IfAbsent,
                reply_as_int: false,
                ttl: TtlChange::Clear,
                reply_old: false,
                name: "set",
            }))
        );
        assert_eq!(
            Command::parse(&args("get")).unwrap_err(),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(Command::parse(&args("SET k v NX XX")).unwrap_err(), "ERR syntax error");
        assert!(Command::parse(&args("INCRBY k nope")).is_err());
        assert!(Command::parse(&args("MSET a 1 b")).is_err());
        assert!(Command::parse(&args("DECRBY k -9223372036854775808")).is_err());
        assert_eq!(Command::parse(&args("SUBSCRIBE news")).unwrap(), None);
        assert_eq!(Command::parse(&args("aCommandNameLongerThanAny k")).unwrap(), None);
        assert_eq!(
            Command::parse(&[Bytes::from_static(b"g\xffet"), Bytes::from_static(b"k")]).unwrap(),
            None
        );
        assert!(matches!(
            Command::parse(&args("gEt k")),
            Ok(Some(Command::Read(Read::Get(_))))
        ));
    }

    #[test]
    fn expiry_options_are_read_as_redis_reads_them() {
        let set = |cmd: &str| match Command::parse(&args(cmd)) {
            Ok(Some(Command::Write(Write::Set {
                ttl,
                condition,
                reply_old,
                ..
            }))) => Ok((ttl, condition, reply_old)),
            Ok(other) => panic!("{cmd}: {other:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(
            set("SET k v px 1500 NX NX GET"),
            Ok((TtlChange::Set(ExpireAt::AfterMs(1500)), SetCondition::IfAbsent, true))
        );
        assert_eq!(
            set("SET k v EX 2 EX 3"),
            Ok((TtlChange::Set(ExpireAt::AfterMs(3000)), SetCondition::Always, false))
        );
        assert_eq!(
            set("SET k v EXAT 17 XX"),
            Ok((TtlChange::Set(ExpireAt::UnixMs(17_000)), SetCondition::IfPresent, false))
        );
        assert_eq!(set("SET k v KEEPTTL").unwrap().0, TtlChange::Keep);
        for bad in [
            "SET k v EX 1 PX 1",
            "SET k v KEEPTTL EX 1",
            "SET k v EX",
            "SET k v PERSIST",
            "SET k v NX XX",
            "SET k v PX -1 KEEPTTL",
        ] {
            assert_eq!(set(bad).unwrap_err(), "ERR syntax error", "{bad}");
        }
        for bad in ["SET k v EX 0", "SET k v PX -5", "SET k v EX 9223372036854776"] {
            assert_eq!(
                set(bad).unwrap_err(),
                "ERR invalid expire time in 'set' command",
                "{bad}"
            );
        }
        assert_eq!(
            set("SET k v EX 1.5").unwrap_err(),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            Command::parse(&args("SETEX k 0 v")).unwrap_err(),
            "ERR invalid expire time in 'setex' command"
        );
        assert!(matches!(
            Command::parse(&args("GETEX k")),
            Ok(Some(Command::Read(Read::Get(_))))
        ));
        assert!(matches!(
            Command::parse(&args("GETEX k PERSIST")),
            Ok(Some(Command::Write(Write::GetEx { expire: Ok(None), .. })))
        ));
        assert_eq!(Command::parse(&args("GETEX k NX")).unwrap_err(), "ERR syntax error");

        let expire = |cmd: &str| match Command::parse(&args(cmd)) {
            Ok(Some(Command::Write(Write::Expire { at, condition, .. }))) => Ok((at, condition)),
            Ok(other) => panic!("{cmd}: {other:?}"),
            Err(e) => Err(e),
        };
        let (at, condition) = expire("EXPIRE k -3 xx gt").unwrap();
        assert_eq!(at, ExpireAt::AfterMs(-3000));
        assert!(condition.if_some && condition.if_later && !condition.if_none);
        assert_eq!(expire("PEXPIREAT k 5").unwrap().0, ExpireAt::UnixMs(5));
        assert_eq!(
            expire("EXPIRE k 1 NX GT").unwrap_err(),
            "ERR NX and XX, GT or LT options at the same time are not compatible"
        );
        assert_eq!(
            expire("EXPIRE k 1 GT LT").unwrap_err(),
            "ERR GT and LT options at the same time are not compatible"
        );
        assert_eq!(expire("EXPIRE k 1 FOO").unwrap_err(), "ERR Unsupported option FOO");
        assert_eq!(
            expire("EXPIRE k 9223372036854775807").unwrap_err(),
            "ERR invalid expire time in 'expire' command"
        );
    }

    #[test]
    fn expire_conditions_treat_a_key_without_a_deadline_as_never_expiring() {
        let c = |if_none, if_some, if_later, if_earlier| ExpireCondition {
            if_none,
            if_some,
            if_later,
            if_earlier,
        };
        assert!(c(false, false, false, false).allows(Some(5), 1));
        assert!(c(true, false, false, false).allows(None, 1) && !c(true, false, false, false).allows(Some(5), 1));
        assert!(!c(false, true, false, false).allows(None, 1) && c(false, true, false, false).allows(Some(5), 1));
        assert!(!c(false, false, true, false).allows(None, 9) && c(false, false, true, false).allows(Some(5), 6));
        assert!(!c(false, false, true, false).allows(Some(5), 5));
        assert!(c(false, false, false, true).allows(None, 9) && !c(false, false, false, true).allows(Some(5), 5));
        assert!(!c(false, true, false, true).allows(None, 9), "XX LT needs a deadline");
    }

    #[test]
    fn args_round_trip_and_reject_truncation() {
        let a = args("HSET h f1 v1 f2 v2");
        let encoded = encode_args(&a);
        assert_eq!(decode_args(&encoded).unwrap(), a);
        for cut in 0..encoded.len() {
            assert!(decode_args(&encoded[..cut]).is_err());
        }
    }

    #[test]
    fn enveloped_writes_and_lease_commands_round_trip_and_reject_truncation() {
        use chorus_curp::rifl::ClientId;
        let a = args("INCR counter");
        let envelope = Envelope {
            client: ClientId {
                incarnation: 3 << 16,
                connection: 2,
            },
            seq: 5,
            first_unacked: 4,
        };
        let encoded = encode_enveloped(&envelope, &a);
        assert_eq!(decode_logged(&encoded).unwrap(), Logged::Enveloped(envelope, a.clone()));
        let moved = Envelope {
            seq: 1,
            first_unacked: 1,
            ..envelope
        };
        assert_eq!(
            decode_logged(&reenvelope(&encoded, &moved)).unwrap(),
            Logged::Enveloped(moved, a)
        );
        let renew = encode_renew(7, 9);
        assert_eq!(
            decode_logged(&renew).unwrap(),
            Logged::Renew {
                incarnation: 7,
                forgotten_below: 9
            }
        );
        assert_eq!(decode_logged(&encode_register()).unwrap(), Logged::Register);
        let recovered = encode_curp_recovered(12);
        assert_eq!(decode_logged(&recovered).unwrap(), Logged::CurpRecovered { term: 12 });
        let keys = args("lock:a lock:b");
        let expired = encode_delete_expired(&keys);
        assert_eq!(decode_logged(&expired).unwrap(), Logged::DeleteExpired(keys));
        for whole in [encoded, renew, recovered, expired] {
            for cut in 0..whole.len() {
                assert!(decode_logged(&whole[..cut]).is_err(), "cut at {cut}");
            }
        }
    }
}
