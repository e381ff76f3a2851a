//! Stream commands (XADD, XLEN, XRANGE, XREVRANGE, XDEL, XTRIM, XREAD), parsed and checked in
//! the order Redis 7.0 checks them, so a bad command gets the error Redis gives.

use bytes::Bytes;

use super::stream_groups::{GroupRead, GroupWrite};
use super::{
    arity_checks, parse_i64, syntax_error, wrong_arity, Blocking, BlockingReply, Command, CommandError, Look, Read,
    Write,
};

const INVALID_ID: &str = "ERR Invalid stream ID specified as stream command argument";

/// An entry's id: milliseconds, then a sequence number within them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    pub const MIN: StreamId = StreamId { ms: 0, seq: 0 };
    pub const MAX: StreamId = StreamId {
        ms: u64::MAX,
        seq: u64::MAX,
    };

    /// The next id up, if there is one.
    pub fn next(self) -> Option<StreamId> {
        match self.seq.checked_add(1) {
            Some(seq) => Some(StreamId { ms: self.ms, seq }),
            None => Some(StreamId {
                ms: self.ms.checked_add(1)?,
                seq: 0,
            }),
        }
    }

    /// The next id down, if there is one.
    pub fn previous(self) -> Option<StreamId> {
        match self.seq.checked_sub(1) {
            Some(seq) => Some(StreamId { ms: self.ms, seq }),
            None => Some(StreamId {
                ms: self.ms.checked_sub(1)?,
                seq: u64::MAX,
            }),
        }
    }

    /// `ms-seq`, as replies write it.
    pub fn text(self) -> String {
        format!("{}-{}", self.ms, self.seq)
    }

    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&self.ms.to_be_bytes());
        out[8..].copy_from_slice(&self.seq.to_be_bytes());
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<StreamId> {
        let bytes: &[u8; 16] = bytes.try_into().ok()?;
        Some(StreamId {
            ms: u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")),
            seq: u64::from_be_bytes(bytes[8..].try_into().expect("8 bytes")),
        })
    }
}

/// The id XADD gives its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewId {
    /// `*`: from the entry's time.
    Auto,
    /// `ms-*`: the next sequence number within `ms`.
    AutoSeq(u64),
    Explicit(StreamId),
}

/// What trimming keeps: at most so many entries, or those from an id on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrimTo {
    MaxLen(u64),
    MinId(StreamId),
}

/// XADD's and XTRIM's trimming. `~` (approximate) is accepted and trims exactly: Redis trims
/// whole nodes of its own layout, and "at least this many kept" holds either way. LIMIT bounds
/// how many entries one approximate trim removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trim {
    pub to: TrimTo,
    pub limit: Option<u64>,
}

/// Writes to streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamWrite {
    Add {
        key: Bytes,
        /// NOMKSTREAM: a missing stream is not created (the reply is nil).
        no_create: bool,
        trim: Option<Trim>,
        id: NewId,
        pairs: Vec<(Bytes, Bytes)>,
    },
    /// The ids, or their error: Redis answers a missing key (0) and a key of another type first.
    Delete {
        key: Bytes,
        ids: Result<Vec<StreamId>, CommandError>,
    },
    Trim {
        key: Bytes,
        trim: Trim,
    },
    /// XSETID: the stream's last id, and optionally its count of entries ever added and its
    /// largest deleted id.
    SetId {
        key: Bytes,
        last_id: StreamId,
        entries_added: Option<u64>,
        max_deleted_id: Option<StreamId>,
    },
    Group(GroupWrite),
}

impl StreamWrite {
    pub(super) fn keys(&self) -> Vec<Bytes> {
        match self {
            StreamWrite::Add { key, .. }
            | StreamWrite::Delete { key, .. }
            | StreamWrite::Trim { key, .. }
            | StreamWrite::SetId { key, .. } => vec![key.clone()],
            StreamWrite::Group(write) => write.keys(),
        }
    }
}

/// Where XREAD reads a stream from: after an id, or (`$`) after its last entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAfter {
    Id(StreamId),
    Last,
}

/// Reads of streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamRead {
    Len(Bytes),
    /// XRANGE, or XREVRANGE (`reverse`, from `to` down to `from`); both bounds inclusive.
    /// `count`: `Some(0)` answers a null array, as Redis does.
    Range {
        key: Bytes,
        from: StreamId,
        to: StreamId,
        count: Option<u64>,
        reverse: bool,
    },
    /// XREAD without waiting: each stream's entries after its id, up to `count` each (0: all);
    /// a null array when none has any. Each id may be an error, answered in the streams' order
    /// after the key's type, as Redis does.
    Read {
        count: u64,
        streams: Vec<(Bytes, Result<ReadAfter, CommandError>)>,
    },
    /// Each stream's last id (0-0 for a missing one): what XREAD BLOCK's `$` stands for.
    LastIds(Vec<Bytes>),
    Group(GroupRead),
}

/// An id as XADD, XDEL, XTRIM and XREAD take it: `ms-seq`, or `ms` with the sequence number
/// `missing_seq`; with `auto_seq`, `ms-*` is allowed (`None` for the sequence number).
fn parse_id(arg: &[u8], missing_seq: u64, auto_seq: bool) -> Result<(u64, Option<u64>), CommandError> {
    let number = |digits: &[u8]| -> Result<u64, CommandError> {
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(INVALID_ID.into());
        }
        std::str::from_utf8(digits)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| INVALID_ID.into())
    };
    if arg.len() > 127 {
        return Err(INVALID_ID.into());
    }
    match arg.iter().position(|&b| b == b'-') {
        None => Ok((number(arg)?, Some(missing_seq))),
        Some(dash) => {
            let ms = number(&arg[..dash])?;
            let seq = &arg[dash + 1..];
            if auto_seq && seq == b"*" {
                Ok((ms, None))
            } else {
                Ok((ms, Some(number(seq)?)))
            }
        }
    }
}

/// A whole id (`-` and `+` refused), its sequence number 0 when left out.
pub(super) fn strict_id(arg: &[u8]) -> Result<StreamId, CommandError> {
    let (ms, seq) = parse_id(arg, 0, false)?;
    Ok(StreamId {
        ms,
        seq: seq.expect("no auto sequence asked for"),
    })
}

/// XSETID key last-id [ENTRIESADDED n] [MAXDELETEDID id], checked before the key as in Redis.
fn xsetid(rest: &[Bytes]) -> Result<StreamWrite, CommandError> {
    let last_id = strict_id(&rest[1])?;
    let (mut entries_added, mut max_deleted_id) = (None, None);
    let mut at = 2;
    while at < rest.len() {
        let has_value = at + 1 < rest.len();
        match rest[at].to_ascii_lowercase().as_slice() {
            b"entriesadded" if has_value => {
                let n = parse_i64(&rest[at + 1])?;
                entries_added =
                    Some(u64::try_from(n).map_err(|_| CommandError::from("ERR entries_added must be positive"))?);
            }
            b"maxdeletedid" if has_value => {
                let id = strict_id(&rest[at + 1])?;
                if last_id < id {
                    return Err(
                        "ERR The ID specified in XSETID is smaller than the provided max_deleted_entry_id".into(),
                    );
                }
                max_deleted_id = Some(id);
            }
            _ => return Err(syntax_error()),
        }
        at += 2;
    }
    Ok(StreamWrite::SetId {
        key: rest[0].clone(),
        last_id,
        entries_added,
        max_deleted_id,
    })
}

/// A range bound of XRANGE: `-`, `+`, an id (a left-out sequence number is `missing_seq`), or
/// `(` then an id, exclusive.
pub(super) fn interval_id(arg: &[u8], missing_seq: u64, start: bool) -> Result<StreamId, CommandError> {
    match arg {
        b"-" => return Ok(StreamId::MIN),
        b"+" => return Ok(StreamId::MAX),
        _ => {}
    }
    let (exclusive, id) = match arg.strip_prefix(b"(") {
        Some(rest) if !rest.is_empty() => (true, rest),
        _ => (false, arg),
    };
    if exclusive && (id == b"-" || id == b"+") {
        return Err(INVALID_ID.into());
    }
    let (ms, seq) = parse_id(id, missing_seq, false)?;
    let id = StreamId {
        ms,
        seq: seq.expect("no auto sequence asked for"),
    };
    if !exclusive {
        return Ok(id);
    }
    if start {
        id.next().ok_or_else(|| "ERR invalid start ID for the interval".into())
    } else {
        id.previous()
            .ok_or_else(|| "ERR invalid end ID for the interval".into())
    }
}

/// XADD's id: `*`, `ms-*` or a whole one.
fn new_id(arg: &[u8]) -> Result<NewId, CommandError> {
    Ok(match arg {
        b"*" => NewId::Auto,
        given => match parse_id(given, 0, true)? {
            (ms, None) => NewId::AutoSeq(ms),
            (ms, Some(seq)) => NewId::Explicit(StreamId { ms, seq }),
        },
    })
}

/// XADD's and XTRIM's options up to the id (XADD) or the end (XTRIM): the trimming, NOMKSTREAM,
/// and XADD's id with where it is (read in the loop, so its error comes before the options'
/// last checks, as in Redis; `None` when the arguments end first).
type AddOrTrimOptions = (Option<Trim>, bool, Option<(usize, NewId)>);

fn add_or_trim_options(rest: &[Bytes], xadd: bool) -> Result<AddOrTrimOptions, CommandError> {
    let mut id = None;
    let mut to = None;
    let mut approximate = false;
    let mut limit = None;
    let mut no_create = false;
    let mut i = 1;
    while i < rest.len() {
        let more = rest.len() - 1 - i;
        let option = &rest[i];
        if xadd && option.as_ref() == b"*" {
            id = Some((i, NewId::Auto));
            break;
        }
        let strategy = [b"maxlen".as_slice(), b"minid"]
            .into_iter()
            .position(|name| option.eq_ignore_ascii_case(name));
        if let (Some(strategy), true) = (strategy, more > 0) {
            if to.is_some() {
                return Err("ERR syntax error, MAXLEN and MINID options at the same time are not compatible".into());
            }
            approximate = false;
            if more >= 2 && (rest[i + 1].as_ref() == b"~" || rest[i + 1].as_ref() == b"=") {
                approximate = rest[i + 1].as_ref() == b"~";
                i += 1;
            }
            let threshold = &rest[i + 1];
            to = Some(if strategy == 0 {
                let max_len = parse_i64(threshold)?;
                if max_len < 0 {
                    return Err("ERR The MAXLEN argument must be >= 0.".into());
                }
                TrimTo::MaxLen(max_len as u64)
            } else {
                TrimTo::MinId(strict_id(threshold)?)
            });
            i += 2;
        } else if option.eq_ignore_ascii_case(b"limit") && more > 0 {
            let given = parse_i64(&rest[i + 1])?;
            if given < 0 {
                return Err("ERR The LIMIT argument must be >= 0.".into());
            }
            limit = Some(given as u64);
            i += 2;
        } else if xadd && option.eq_ignore_ascii_case(b"nomkstream") {
            no_create = true;
            i += 1;
        } else if xadd {
            id = Some((i, new_id(option)?));
            break;
        } else {
            return Err(syntax_error());
        }
    }
    if limit.is_some_and(|n| n > 0) && to.is_none() {
        return Err("ERR syntax error, LIMIT cannot be used without specifying a trimming strategy".into());
    }
    if !xadd && to.is_none() {
        return Err("ERR syntax error, XTRIM must be called with a trimming strategy".into());
    }
    if limit.is_some() && !approximate {
        return Err("ERR syntax error, LIMIT cannot be used without the special ~ option".into());
    }
    // Redis's default for an approximate trim: 100 nodes of 100 entries.
    let limit = if approximate {
        Some(limit.unwrap_or(10_000)).filter(|&n| n > 0)
    } else {
        None
    };
    Ok((to.map(|to| Trim { to, limit }), no_create, id))
}

fn xadd(rest: &[Bytes]) -> Result<StreamWrite, CommandError> {
    let (trim, no_create, id) = add_or_trim_options(rest, true)?;
    let Some((id_at, id)) = id else {
        return Err(wrong_arity("xadd"));
    };
    let fields = &rest[id_at + 1..];
    if fields.len() < 2 || !fields.len().is_multiple_of(2) {
        return Err(wrong_arity("xadd"));
    }
    if id == NewId::Explicit(StreamId::MIN) {
        return Err("ERR The ID specified in XADD must be greater than 0-0".into());
    }
    Ok(StreamWrite::Add {
        key: rest[0].clone(),
        no_create,
        trim,
        id,
        pairs: fields.chunks_exact(2).map(|p| (p[0].clone(), p[1].clone())).collect(),
    })
}

fn xrange(rest: &[Bytes], reverse: bool) -> Result<StreamRead, CommandError> {
    let (start, end) = if reverse {
        (&rest[2], &rest[1])
    } else {
        (&rest[1], &rest[2])
    };
    let from = interval_id(start, 0, true)?;
    let to = interval_id(end, u64::MAX, false)?;
    let mut count = None;
    let mut options = rest[3..].iter();
    while let Some(option) = options.next() {
        match options.next() {
            Some(n) if option.eq_ignore_ascii_case(b"count") => count = Some(parse_i64(n)?.max(0) as u64),
            _ => return Err(syntax_error()),
        }
    }
    Ok(StreamRead::Range {
        key: rest[0].clone(),
        from,
        to,
        count,
        reverse,
    })
}

/// What XREAD and XREADGROUP share: COUNT (0: all), how long it may wait (`None`: it does not),
/// XREADGROUP's GROUP and NOACK, and the streams' keys and ids as given.
pub(super) struct ReadArgs<'a> {
    pub count: u64,
    pub block_ms: Option<u64>,
    pub group: Option<(Bytes, Bytes)>,
    pub no_ack: bool,
    pub keys: &'a [Bytes],
    pub ids: &'a [Bytes],
}

/// XREAD's (or, `grouped`, XREADGROUP's) options in Redis 7.0's order of checks.
pub(super) fn read_args(rest: &[Bytes], grouped: bool) -> Result<ReadArgs<'_>, CommandError> {
    let mut count = 0;
    let mut block_ms = None;
    let mut group = None;
    let mut no_ack = false;
    let mut streams_at = None;
    let mut i = 0;
    while i < rest.len() {
        let more = rest.len() - 1 - i;
        let option = &rest[i];
        if option.eq_ignore_ascii_case(b"block") && more > 0 {
            let ms = parse_i64(&rest[i + 1]).map_err(|_| "ERR timeout is not an integer or out of range")?;
            if ms < 0 {
                return Err("ERR timeout is negative".into());
            }
            block_ms = Some(ms as u64);
            i += 2;
        } else if option.eq_ignore_ascii_case(b"count") && more > 0 {
            count = parse_i64(&rest[i + 1])?.max(0) as u64;
            i += 2;
        } else if option.eq_ignore_ascii_case(b"streams") && more > 0 {
            streams_at = Some(i + 1);
            break;
        } else if option.eq_ignore_ascii_case(b"group") && more >= 2 {
            if !grouped {
                return Err("ERR The GROUP option is only supported by XREADGROUP. You called XREAD instead.".into());
            }
            group = Some((rest[i + 1].clone(), rest[i + 2].clone()));
            i += 3;
        } else if option.eq_ignore_ascii_case(b"noack") {
            if !grouped {
                return Err("ERR The NOACK option is only supported by XREADGROUP. You called XREAD instead.".into());
            }
            no_ack = true;
            i += 1;
        } else {
            return Err(syntax_error());
        }
    }
    let Some(streams_at) = streams_at else {
        return Err(syntax_error());
    };
    let named = &rest[streams_at..];
    if !named.len().is_multiple_of(2) {
        return Err("ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.".into());
    }
    if grouped && group.is_none() {
        return Err("ERR Missing GROUP option for XREADGROUP".into());
    }
    let (keys, ids) = named.split_at(named.len() / 2);
    Ok(ReadArgs {
        count,
        block_ms,
        group,
        no_ack,
        keys,
        ids,
    })
}

fn xread(rest: &[Bytes]) -> Result<Command, CommandError> {
    let args = read_args(rest, false)?;
    let streams: Vec<(Bytes, Result<ReadAfter, CommandError>)> = args
        .keys
        .iter()
        .zip(args.ids)
        .map(|(key, id)| {
            let after = match id.as_ref() {
                b"$" => Ok(ReadAfter::Last),
                b">" => Err(
                    "ERR The > ID can be specified only when calling XREADGROUP using the GROUP <group> \
                     <consumer> option."
                        .into(),
                ),
                id => strict_id(id).map(ReadAfter::Id),
            };
            (key.clone(), after)
        })
        .collect();
    // An id in error is answered at once (a read finds the error).
    let valid: Option<Vec<(Bytes, ReadAfter)>> = streams
        .iter()
        .map(|(key, after)| after.clone().ok().map(|after| (key.clone(), after)))
        .collect();
    let count = args.count;
    Ok(match (args.block_ms, valid) {
        (Some(timeout_ms), Some(valid)) => Command::Blocking(Blocking {
            keys: valid.iter().map(|(key, _)| key.clone()).collect(),
            attempt: xread_attempt(count, &valid),
            timeout_ms: (timeout_ms > 0).then_some(timeout_ms),
            reply: BlockingReply::Streams,
            look: Look::AnyKeyExists,
        }),
        _ => Command::Read(Read::Streams(StreamRead::Read { count, streams })),
    })
}

/// The XREAD a blocked XREAD attempts, with its `$`s as given: `resolve_last_ids` replaces
/// them once the command arrives, so that every attempt reads after the same ids.
fn xread_attempt(count: u64, streams: &[(Bytes, ReadAfter)]) -> Vec<Bytes> {
    let mut args = vec![
        Bytes::from_static(b"XREAD"),
        Bytes::from_static(b"COUNT"),
        Bytes::from(count.to_string()),
        Bytes::from_static(b"STREAMS"),
    ];
    args.extend(streams.iter().map(|(key, _)| key.clone()));
    args.extend(streams.iter().map(|(_, after)| match after {
        ReadAfter::Id(id) => Bytes::from(id.text()),
        ReadAfter::Last => Bytes::from_static(b"$"),
    }));
    args
}

/// Replaces each `$` of a blocked XREAD's `attempt` with its stream's last id (`last_ids`, as
/// `StreamRead::LastIds` answers them, in the streams' order).
pub fn resolve_last_ids(attempt: &mut [Bytes], last_ids: &[Bytes]) {
    let first_id = attempt.len() - last_ids.len();
    for (arg, last) in attempt[first_id..].iter_mut().zip(last_ids) {
        if arg.as_ref() == b"$" {
            *arg = last.clone();
        }
    }
}

pub(super) fn parse(name: &str, rest: &[Bytes]) -> Option<Result<Command, CommandError>> {
    let (exact, at_least) = arity_checks(name, rest.len());
    let write = |w: StreamWrite| Command::Write(Write::Streams(w));
    let read = |r: StreamRead| Command::Read(Read::Streams(r));
    let parsed = (|| -> Result<Option<Command>, CommandError> {
        Ok(match name {
            "xadd" => {
                at_least(4)?;
                write(xadd(rest)?)
            }
            "xlen" => {
                exact(1)?;
                read(StreamRead::Len(rest[0].clone()))
            }
            "xrange" | "xrevrange" => {
                at_least(3)?;
                read(xrange(rest, name == "xrevrange")?)
            }
            "xdel" => {
                at_least(2)?;
                write(StreamWrite::Delete {
                    key: rest[0].clone(),
                    ids: rest[1..].iter().map(|id| strict_id(id)).collect(),
                })
            }
            "xsetid" => {
                at_least(2)?;
                write(xsetid(rest)?)
            }
            "xtrim" => {
                at_least(3)?;
                let (trim, _, _) = add_or_trim_options(rest, false)?;
                write(StreamWrite::Trim {
                    key: rest[0].clone(),
                    trim: trim.expect("XTRIM's options name a strategy"),
                })
            }
            "xread" => {
                at_least(3)?;
                xread(rest)?
            }
            _ => return Ok(None),
        }
        .into())
    })();
    parsed.transpose()
}
