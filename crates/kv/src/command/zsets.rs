//! Sorted-set commands, parsed and checked in the order Redis 7.0 checks them, so a bad command
//! gets the error Redis gives.

use bytes::Bytes;
use chorus_resp::Double;

use super::{
    arity_checks, count_arg, multi_pop_args, parse_i64, scan_args, syntax_error, Blocking, BlockingReply, Command,
    CommandError, Look, Read, ScanArgs, SetCondition, Write, POP_COUNT_OUT_OF_RANGE,
};

/// Writes to sorted sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZsetWrite {
    /// ZADD, and ZINCRBY (an INCR without conditions whose reply is always the new score).
    Add {
        key: Bytes,
        options: ZaddOptions,
        pairs: Vec<(Double, Bytes)>,
    },
    Remove {
        key: Bytes,
        members: Vec<Bytes>,
    },
    /// ZPOPMIN / ZPOPMAX (`highest`); `count` given or not (the reply differs).
    Pop {
        key: Bytes,
        highest: bool,
        count: Option<usize>,
    },
    /// ZMPOP: up to `count` members from the first of `keys` that holds any.
    MultiPop {
        keys: Vec<Bytes>,
        highest: bool,
        count: usize,
    },
    /// ZREMRANGEBYRANK, ZREMRANGEBYSCORE, ZREMRANGEBYLEX.
    RemoveRange {
        key: Bytes,
        range: ZRange,
    },
    /// GEOSEARCHSTORE, or GEORADIUS with STORE: the destination becomes what the search finds.
    GeoStore(super::GeoSearch),
    /// ZRANGESTORE: `destination` becomes what the range of `source` holds.
    RangeStore {
        destination: Bytes,
        source: Bytes,
        query: RangeQuery,
    },
    /// ZUNIONSTORE, ZINTERSTORE, ZDIFFSTORE: `destination` becomes the union, intersection or
    /// difference of `keys` (sorted sets, or sets whose members score 1).
    CombineStore {
        op: ZsetOp,
        destination: Bytes,
        keys: Vec<Bytes>,
        options: Result<CombineOptions, CommandError>,
    },
}

impl ZsetWrite {
    pub(super) fn keys(&self) -> Vec<Bytes> {
        match self {
            ZsetWrite::Add { key, .. }
            | ZsetWrite::Remove { key, .. }
            | ZsetWrite::Pop { key, .. }
            | ZsetWrite::RemoveRange { key, .. } => vec![key.clone()],
            ZsetWrite::MultiPop { keys, .. } => keys.clone(),
            ZsetWrite::RangeStore {
                destination, source, ..
            } => vec![destination.clone(), source.clone()],
            ZsetWrite::CombineStore { destination, keys, .. } => {
                std::iter::once(destination).chain(keys).cloned().collect()
            }
            ZsetWrite::GeoStore(search) => search.keys(),
        }
    }
}

/// ZADD's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZaddOptions {
    /// NX (only new members) or XX (only existing ones).
    pub condition: SetCondition,
    /// GT / LT: an existing member's score only moves up / down.
    pub only: Option<Direction>,
    /// CH: the reply counts changed scores too.
    pub count_changed: bool,
    /// INCR: the score is added to the current one, and the reply is the new score.
    pub increment: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Up,
    Down,
}

/// Reads of sorted sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZsetRead {
    Score {
        key: Bytes,
        member: Bytes,
    },
    MScore {
        key: Bytes,
        members: Vec<Bytes>,
    },
    Card(Bytes),
    /// ZCOUNT, ZLEXCOUNT.
    Count {
        key: Bytes,
        range: ZRange,
    },
    Range {
        key: Bytes,
        query: RangeQuery,
    },
    /// ZRANK / ZREVRANK (`from_highest`).
    Rank {
        key: Bytes,
        member: Bytes,
        from_highest: bool,
    },
    RandMember {
        key: Bytes,
        count: Option<i64>,
        with_scores: bool,
    },
    Scan {
        key: Bytes,
        args: ScanArgs,
    },
    /// ZUNION, ZINTER, ZDIFF: the members and scores `CombineStore` would store.
    Combine {
        op: ZsetOp,
        keys: Vec<Bytes>,
        options: Result<CombineOptions, CommandError>,
    },
    /// ZINTERCARD: how many members the intersection of `keys` has, counted up to the limit.
    InterCard {
        keys: Vec<Bytes>,
        options: Result<CombineOptions, CommandError>,
    },
}

/// How ZUNION, ZINTER and ZDIFF (and their kin) combine their keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZsetOp {
    Union,
    Inter,
    Diff,
}

/// How a member's weighted scores in several keys become one (AGGREGATE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    Sum,
    Min,
    Max,
}

/// What follows the keys of ZUNION and its kin. Redis reads it only once every key's type has
/// passed, so a bad option is an error kept until then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CombineOptions {
    /// One per key (WEIGHTS; 1 when not given).
    pub weights: Vec<Double>,
    pub aggregate: Aggregate,
    pub with_scores: bool,
    /// ZINTERCARD's LIMIT: stop counting there (0: count all).
    pub limit: usize,
}

/// Which members a range command means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZRange {
    /// Positions in score order (negative ones count from the highest).
    Rank {
        start: i64,
        stop: i64,
    },
    Score {
        min: ScoreBound,
        max: ScoreBound,
    },
    /// Members between two strings, in member order (Redis defines it for members that share one
    /// score, and so does Chorus).
    Lex {
        min: LexBound,
        max: LexBound,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreBound {
    pub score: Double,
    pub exclusive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LexBound {
    /// `-`: below every member.
    Lowest,
    /// `+`: above every member.
    Highest,
    /// `[member`.
    Inclusive(Bytes),
    /// `(member`.
    Exclusive(Bytes),
}

/// ZRANGE's range and options (and those of the older forms that ZRANGE subsumes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeQuery {
    pub range: ZRange,
    /// REV: from the highest score (the score and lex bounds are then given max first).
    pub reverse: bool,
    /// LIMIT's offset (a negative one selects nothing) and count (a negative one is no limit).
    pub offset: i64,
    pub count: i64,
    pub with_scores: bool,
}

const NOT_A_FLOAT: &str = "ERR value is not a valid float";
const BOUND_NOT_A_FLOAT: &str = "ERR min or max is not a float";
const BOUND_NOT_A_STRING: &str = "ERR min or max not valid string range item";

/// A score as Redis reads one (`strtod`, whole argument, not NaN); `inf` and `-inf` included.
pub fn parse_score(arg: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(arg).ok()?;
    if text.starts_with(|c: char| c.is_ascii_whitespace()) {
        return None;
    }
    text.parse::<f64>().ok().filter(|score| !score.is_nan())
}

fn score_arg(arg: &[u8]) -> Result<Double, CommandError> {
    parse_score(arg).map(Double).ok_or_else(|| NOT_A_FLOAT.into())
}

fn score_bound(arg: &[u8]) -> Option<ScoreBound> {
    let (text, exclusive) = match arg.strip_prefix(b"(") {
        Some(rest) => (rest, true),
        None => (arg, false),
    };
    Some(ScoreBound {
        score: Double(parse_score(text)?),
        exclusive,
    })
}

fn lex_bound(arg: &Bytes) -> Option<LexBound> {
    match arg.first()? {
        b'-' if arg.len() == 1 => Some(LexBound::Lowest),
        b'+' if arg.len() == 1 => Some(LexBound::Highest),
        b'[' => Some(LexBound::Inclusive(arg.slice(1..))),
        b'(' => Some(LexBound::Exclusive(arg.slice(1..))),
        _ => None,
    }
}

fn score_range(min: &[u8], max: &[u8]) -> Result<ZRange, CommandError> {
    match (score_bound(min), score_bound(max)) {
        (Some(min), Some(max)) => Ok(ZRange::Score { min, max }),
        _ => Err(BOUND_NOT_A_FLOAT.into()),
    }
}

fn lex_range(min: &Bytes, max: &Bytes) -> Result<ZRange, CommandError> {
    match (lex_bound(min), lex_bound(max)) {
        (Some(min), Some(max)) => Ok(ZRange::Lex { min, max }),
        _ => Err(BOUND_NOT_A_STRING.into()),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RangeKind {
    Rank,
    Score,
    Lex,
}

/// ZRANGE and its older forms, as Redis's `zrangeGenericCommand` reads them: `args` are the
/// two bounds and the options; `kind` and `reverse` are fixed by the older forms' names.
fn range_query(
    args: &[Bytes],
    mut kind: Option<RangeKind>,
    mut reverse: Option<bool>,
    store: bool,
) -> Result<RangeQuery, CommandError> {
    let (mut offset, mut count, mut with_scores) = (0, -1, false);
    let mut i = 2;
    while i < args.len() {
        let option = args[i].to_ascii_lowercase();
        match option.as_slice() {
            b"withscores" if !store => with_scores = true,
            b"limit" if args.len() - i > 2 => {
                offset = parse_i64(&args[i + 1])?;
                count = parse_i64(&args[i + 2])?;
                i += 2;
            }
            b"rev" if reverse.is_none() => reverse = Some(true),
            b"bylex" if kind.is_none() => kind = Some(RangeKind::Lex),
            b"byscore" if kind.is_none() => kind = Some(RangeKind::Score),
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    let kind = kind.unwrap_or(RangeKind::Rank);
    let reverse = reverse.unwrap_or(false);
    if count != -1 && kind == RangeKind::Rank {
        return Err("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX".into());
    }
    if with_scores && kind == RangeKind::Lex {
        return Err("ERR syntax error, WITHSCORES not supported in combination with BYLEX".into());
    }
    let (mut min, mut max) = (&args[0], &args[1]);
    if reverse && kind != RangeKind::Rank {
        std::mem::swap(&mut min, &mut max);
    }
    let range = match kind {
        RangeKind::Rank => ZRange::Rank {
            start: parse_i64(min)?,
            stop: parse_i64(max)?,
        },
        RangeKind::Score => score_range(min, max)?,
        RangeKind::Lex => lex_range(min, max)?,
    };
    Ok(RangeQuery {
        range,
        reverse,
        offset,
        count,
        with_scores,
    })
}

fn zadd(rest: &[Bytes]) -> Result<ZsetWrite, CommandError> {
    let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) = (false, false, false, false, false, false);
    let mut at = 1;
    while let Some(word) = rest.get(at) {
        match word.to_ascii_lowercase().as_slice() {
            b"nx" => nx = true,
            b"xx" => xx = true,
            b"gt" => gt = true,
            b"lt" => lt = true,
            b"ch" => ch = true,
            b"incr" => incr = true,
            _ => break,
        }
        at += 1;
    }
    let elements = &rest[at..];
    if elements.is_empty() || !elements.len().is_multiple_of(2) {
        return Err(syntax_error());
    }
    if nx && xx {
        return Err("ERR XX and NX options at the same time are not compatible".into());
    }
    if [gt, lt, nx].into_iter().filter(|set| *set).count() > 1 {
        return Err("ERR GT, LT, and/or NX options at the same time are not compatible".into());
    }
    if incr && elements.len() > 2 {
        return Err("ERR INCR option supports a single increment-element pair".into());
    }
    let pairs = elements
        .chunks_exact(2)
        .map(|pair| Ok((score_arg(&pair[0])?, pair[1].clone())))
        .collect::<Result<Vec<_>, CommandError>>()?;
    Ok(ZsetWrite::Add {
        key: rest[0].clone(),
        options: ZaddOptions {
            condition: SetCondition::from_flags(nx, xx),
            only: match (gt, lt) {
                (true, _) => Some(Direction::Up),
                (_, true) => Some(Direction::Down),
                _ => None,
            },
            count_changed: ch,
            increment: incr,
        },
        pairs,
    })
}

/// ZMPOP's (and BZMPOP's) numkeys, keys, MIN or MAX, then COUNT n.
fn zmpop(rest: &[Bytes], name: &str) -> Result<ZsetWrite, CommandError> {
    let (keys, highest, count) = multi_pop_args(rest, name, |end| match end.to_ascii_lowercase().as_slice() {
        b"min" => Ok(false),
        b"max" => Ok(true),
        _ => Err(syntax_error()),
    })?;
    Ok(ZsetWrite::MultiPop {
        keys: keys.to_vec(),
        highest,
        count,
    })
}

/// The numkeys and keys of ZUNION and its kin (`rest` starts at numkeys), and what follows
/// them, read as Redis 7.0's `zunionInterDiffGenericCommand` reads it: `store` forms take no
/// WITHSCORES, ZDIFF no WEIGHTS or AGGREGATE, ZINTERCARD (`card`) only LIMIT.
fn combine_args(
    rest: &[Bytes],
    name: &str,
    op: ZsetOp,
    store: bool,
    card: bool,
) -> Result<(Vec<Bytes>, Result<CombineOptions, CommandError>), CommandError> {
    let numkeys = parse_i64(&rest[0])?;
    if numkeys < 1 {
        return Err(format!("ERR at least 1 input key is needed for '{name}' command"));
    }
    let numkeys = match usize::try_from(numkeys) {
        Ok(n) if n < rest.len() => n,
        _ => return Err(syntax_error()),
    };
    let keys = rest[1..=numkeys].to_vec();
    Ok((keys, combine_options(&rest[1 + numkeys..], numkeys, op, store, card)))
}

fn combine_options(
    args: &[Bytes],
    numkeys: usize,
    op: ZsetOp,
    store: bool,
    card: bool,
) -> Result<CombineOptions, CommandError> {
    let mut options = CombineOptions {
        weights: vec![Double(1.0); numkeys],
        aggregate: Aggregate::Sum,
        with_scores: false,
        limit: 0,
    };
    let scored = op != ZsetOp::Diff && !card;
    let mut at = 0;
    while at < args.len() {
        let remaining = args.len() - at;
        match args[at].to_ascii_lowercase().as_slice() {
            b"weights" if scored && remaining > numkeys => {
                for (weight, arg) in options.weights.iter_mut().zip(&args[at + 1..]) {
                    *weight = parse_score(arg)
                        .map(Double)
                        .ok_or_else(|| CommandError::from("ERR weight value is not a float"))?;
                }
                at += 1 + numkeys;
            }
            b"aggregate" if scored && remaining >= 2 => {
                options.aggregate = match args[at + 1].to_ascii_lowercase().as_slice() {
                    b"sum" => Aggregate::Sum,
                    b"min" => Aggregate::Min,
                    b"max" => Aggregate::Max,
                    _ => return Err(syntax_error()),
                };
                at += 2;
            }
            b"withscores" if !store && !card => {
                options.with_scores = true;
                at += 1;
            }
            b"limit" if card && remaining >= 2 => {
                options.limit = parse_i64(&args[at + 1])
                    .ok()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| CommandError::from("ERR LIMIT can't be negative"))?;
                at += 2;
            }
            _ => return Err(syntax_error()),
        }
    }
    Ok(options)
}

/// The sorted-set operation a command's name says.
fn zset_op(name: &str) -> ZsetOp {
    if name.starts_with("zunion") {
        ZsetOp::Union
    } else if name.starts_with("zinter") {
        ZsetOp::Inter
    } else {
        ZsetOp::Diff
    }
}

/// A sorted-set command, if `name` is one.
pub(super) fn parse(name: &str, rest: &[Bytes]) -> Option<Result<Command, CommandError>> {
    let (exact, at_least) = arity_checks(name, rest.len());
    let write = |w: ZsetWrite| Command::Write(Write::Zsets(w));
    let read = |r: ZsetRead| Command::Read(Read::Zsets(r));
    let parsed = (|| {
        Ok(match name {
            "zadd" => {
                at_least(3)?;
                write(zadd(rest)?)
            }
            "zincrby" => {
                exact(3)?;
                write(ZsetWrite::Add {
                    key: rest[0].clone(),
                    options: ZaddOptions {
                        condition: SetCondition::Always,
                        only: None,
                        count_changed: false,
                        increment: true,
                    },
                    pairs: vec![(score_arg(&rest[1])?, rest[2].clone())],
                })
            }
            "zrem" => {
                at_least(2)?;
                write(ZsetWrite::Remove {
                    key: rest[0].clone(),
                    members: rest[1..].to_vec(),
                })
            }
            "zpopmin" | "zpopmax" => {
                at_least(1)?;
                if rest.len() > 2 {
                    return Err(syntax_error());
                }
                write(ZsetWrite::Pop {
                    key: rest[0].clone(),
                    highest: name == "zpopmax",
                    count: rest.get(1).map(|c| count_arg(c, POP_COUNT_OUT_OF_RANGE)).transpose()?,
                })
            }
            "zmpop" => write(zmpop(rest, name)?),
            "bzpopmin" | "bzpopmax" => {
                at_least(2)?;
                let keys = &rest[..rest.len() - 1];
                let mut attempt = vec![Bytes::from_static(b"ZMPOP"), Bytes::from(keys.len().to_string())];
                attempt.extend_from_slice(keys);
                attempt.push(Bytes::from_static(if name == "bzpopmax" { b"MAX" } else { b"MIN" }));
                Command::Blocking(Blocking {
                    attempt,
                    keys: keys.to_vec(),
                    timeout_ms: super::timeout_arg(&rest[rest.len() - 1])?,
                    reply: BlockingReply::KeyMemberScore,
                    look: Look::AnyKeyExists,
                })
            }
            "bzmpop" => {
                at_least(4)?;
                let timeout_ms = super::timeout_arg(&rest[0])?;
                let ZsetWrite::MultiPop { keys, .. } = zmpop(&rest[1..], name)? else {
                    unreachable!("zmpop parses a multi-pop")
                };
                let mut attempt = vec![Bytes::from_static(b"ZMPOP")];
                attempt.extend_from_slice(&rest[1..]);
                Command::Blocking(Blocking {
                    attempt,
                    keys,
                    timeout_ms,
                    reply: BlockingReply::KeyAndElements,
                    look: Look::AnyKeyExists,
                })
            }
            "zremrangebyrank" => {
                exact(3)?;
                write(ZsetWrite::RemoveRange {
                    key: rest[0].clone(),
                    range: ZRange::Rank {
                        start: parse_i64(&rest[1])?,
                        stop: parse_i64(&rest[2])?,
                    },
                })
            }
            "zremrangebyscore" => {
                exact(3)?;
                write(ZsetWrite::RemoveRange {
                    key: rest[0].clone(),
                    range: score_range(&rest[1], &rest[2])?,
                })
            }
            "zremrangebylex" => {
                exact(3)?;
                write(ZsetWrite::RemoveRange {
                    key: rest[0].clone(),
                    range: lex_range(&rest[1], &rest[2])?,
                })
            }
            "zrangestore" => {
                at_least(4)?;
                write(ZsetWrite::RangeStore {
                    destination: rest[0].clone(),
                    source: rest[1].clone(),
                    query: range_query(&rest[2..], None, None, true)?,
                })
            }
            "zunionstore" | "zinterstore" | "zdiffstore" => {
                at_least(3)?;
                let op = zset_op(name);
                let (keys, options) = combine_args(&rest[1..], name, op, true, false)?;
                write(ZsetWrite::CombineStore {
                    op,
                    destination: rest[0].clone(),
                    keys,
                    options,
                })
            }
            "zunion" | "zinter" | "zdiff" => {
                at_least(2)?;
                let op = zset_op(name);
                let (keys, options) = combine_args(rest, name, op, false, false)?;
                read(ZsetRead::Combine { op, keys, options })
            }
            "zintercard" => {
                at_least(2)?;
                let (keys, options) = combine_args(rest, name, ZsetOp::Inter, false, true)?;
                read(ZsetRead::InterCard { keys, options })
            }
            "zscore" => {
                exact(2)?;
                read(ZsetRead::Score {
                    key: rest[0].clone(),
                    member: rest[1].clone(),
                })
            }
            "zmscore" => {
                at_least(2)?;
                read(ZsetRead::MScore {
                    key: rest[0].clone(),
                    members: rest[1..].to_vec(),
                })
            }
            "zcard" => {
                exact(1)?;
                read(ZsetRead::Card(rest[0].clone()))
            }
            "zcount" => {
                exact(3)?;
                read(ZsetRead::Count {
                    key: rest[0].clone(),
                    range: score_range(&rest[1], &rest[2])?,
                })
            }
            "zlexcount" => {
                exact(3)?;
                read(ZsetRead::Count {
                    key: rest[0].clone(),
                    range: lex_range(&rest[1], &rest[2])?,
                })
            }
            "zrange" | "zrevrange" | "zrangebyscore" | "zrevrangebyscore" | "zrangebylex" | "zrevrangebylex" => {
                at_least(3)?;
                let kind = match name {
                    "zrange" => None,
                    "zrevrange" => Some(RangeKind::Rank),
                    n if n.ends_with("byscore") => Some(RangeKind::Score),
                    _ => Some(RangeKind::Lex),
                };
                let reverse = (name != "zrange").then(|| name.starts_with("zrev"));
                read(ZsetRead::Range {
                    key: rest[0].clone(),
                    query: range_query(&rest[1..], kind, reverse, false)?,
                })
            }
            "zrank" | "zrevrank" => {
                exact(2)?;
                read(ZsetRead::Rank {
                    key: rest[0].clone(),
                    member: rest[1].clone(),
                    from_highest: name == "zrevrank",
                })
            }
            "zrandmember" => {
                at_least(1)?;
                let with_scores = match rest.get(2) {
                    None => false,
                    Some(word) if word.eq_ignore_ascii_case(b"withscores") && rest.len() == 3 => true,
                    Some(_) => return Err(syntax_error()),
                };
                read(ZsetRead::RandMember {
                    key: rest[0].clone(),
                    count: rest.get(1).map(|c| parse_i64(c)).transpose()?,
                    with_scores,
                })
            }
            "zscan" => {
                at_least(2)?;
                read(ZsetRead::Scan {
                    key: rest[0].clone(),
                    args: scan_args(&rest[1..], false, false)?.0,
                })
            }
            _ => return Ok(None),
        }
        .into())
    })();
    parsed.transpose()
}
