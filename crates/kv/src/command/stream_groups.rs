//! Consumer groups of streams (XGROUP, XREADGROUP, XACK, XPENDING, XCLAIM, XAUTOCLAIM, XINFO),
//! parsed and checked in the order Redis 7.0 checks them, so a bad command gets the error Redis
//! gives. An error Redis finds only after looking the key and group up is carried in the command
//! (a `Result` field) and answered when the write or read runs.

use bytes::Bytes;

use super::streams::{interval_id, read_args, strict_id, StreamId, StreamRead, StreamWrite};
use super::{parse_i64, subcommand, syntax_error, Blocking, BlockingReply, Command, CommandError, Look, Read, Write};

/// Where XGROUP CREATE and SETID put a group's last delivered id: at an id, or (`$`) at the
/// stream's last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupStart {
    Id(StreamId),
    Last,
}

/// Where XREADGROUP reads a stream: entries never delivered to the group (`>`), or the consumer's
/// own pending entries after an id (its history).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupReadFrom {
    Undelivered,
    PendingAfter(StreamId),
}

/// When XCLAIM records its entries as delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveredAt {
    Now,
    /// IDLE: so many milliseconds ago.
    IdleMs(i64),
    /// TIME: at a Unix time in milliseconds.
    UnixMs(i64),
}

/// XCLAIM's arguments after the consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub min_idle_ms: i64,
    pub ids: Vec<StreamId>,
    pub delivered: DeliveredAt,
    /// RETRYCOUNT; a negative one is as if not given.
    pub retry_count: i64,
    pub force: bool,
    pub just_id: bool,
    pub last_id: StreamId,
}

/// Writes to a stream's consumer groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupWrite {
    Create {
        key: Bytes,
        group: Bytes,
        start: Result<GroupStart, CommandError>,
        make_stream: bool,
        /// ENTRIESREAD; `None` when not given or -1 (unknown).
        entries_read: Option<u64>,
    },
    SetId {
        key: Bytes,
        group: Bytes,
        start: Result<GroupStart, CommandError>,
        entries_read: Option<u64>,
    },
    Destroy {
        key: Bytes,
        group: Bytes,
    },
    CreateConsumer {
        key: Bytes,
        group: Bytes,
        consumer: Bytes,
    },
    DeleteConsumer {
        key: Bytes,
        group: Bytes,
        consumer: Bytes,
    },
    /// XREADGROUP without waiting: a null array when no stream has an entry to deliver.
    Read {
        group: Bytes,
        consumer: Bytes,
        count: u64,
        no_ack: bool,
        streams: Vec<(Bytes, Result<GroupReadFrom, CommandError>)>,
    },
    Ack {
        key: Bytes,
        group: Bytes,
        ids: Result<Vec<StreamId>, CommandError>,
    },
    Claim {
        key: Bytes,
        group: Bytes,
        consumer: Bytes,
        claim: Result<Claim, CommandError>,
    },
    AutoClaim {
        key: Bytes,
        group: Bytes,
        consumer: Bytes,
        min_idle_ms: i64,
        start: StreamId,
        count: u64,
        just_id: bool,
    },
}

impl GroupWrite {
    pub(super) fn keys(&self) -> Vec<Bytes> {
        match self {
            GroupWrite::Read { streams, .. } => streams.iter().map(|(key, _)| key.clone()).collect(),
            GroupWrite::Create { key, .. }
            | GroupWrite::SetId { key, .. }
            | GroupWrite::Destroy { key, .. }
            | GroupWrite::CreateConsumer { key, .. }
            | GroupWrite::DeleteConsumer { key, .. }
            | GroupWrite::Ack { key, .. }
            | GroupWrite::Claim { key, .. }
            | GroupWrite::AutoClaim { key, .. } => vec![key.clone()],
        }
    }
}

/// XPENDING's extended form: entries from `from` to `to` (inclusive), idle at least
/// `min_idle_ms`, of one consumer or all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRange {
    pub min_idle_ms: i64,
    pub from: StreamId,
    pub to: StreamId,
    pub count: u64,
    pub consumer: Option<Bytes>,
}

/// Reads of consumer groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRead {
    /// XPENDING: the summary, or (`range`) the entries.
    Pending {
        key: Bytes,
        group: Bytes,
        range: Option<PendingRange>,
    },
    /// XINFO GROUPS.
    Groups(Bytes),
    /// XINFO CONSUMERS.
    Consumers { key: Bytes, group: Bytes },
    /// XINFO STREAM, or with FULL up to so many entries and pending entries of each list (0:
    /// all); an error in the options is answered after the key's checks.
    Stream {
        key: Bytes,
        full: Result<Option<u64>, CommandError>,
    },
    /// A subcommand's HELP lines.
    Help(&'static [&'static str]),
    /// What a blocked XREADGROUP looks at: 1 when one of the streams has an entry past the
    /// group's last delivered id, or is missing, of another type or without the group.
    Undelivered { group: Bytes, keys: Vec<Bytes> },
}

const XGROUP_HELP: &[&str] = &[
    "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CREATE <key> <groupname> <id|$> [MKSTREAM] [ENTRIESREAD <n>]",
    "    Adds a consumer group; MKSTREAM makes an empty stream when the key is missing.",
    "CREATECONSUMER <key> <groupname> <consumer>",
    "    Adds a consumer to a group.",
    "DELCONSUMER <key> <groupname> <consumer>",
    "    Removes a consumer and its pending entries.",
    "DESTROY <key> <groupname>",
    "    Removes a group.",
    "SETID <key> <groupname> <id|$> [ENTRIESREAD <n>]",
    "    Moves a group's last delivered id.",
    "HELP",
    "    Shows this list.",
];

const XINFO_HELP: &[&str] = &[
    "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CONSUMERS <key> <groupname>",
    "    A group's consumers.",
    "GROUPS <key>",
    "    A stream's consumer groups.",
    "STREAM <key> [FULL [COUNT <count>]]",
    "    A stream's length, ids and first and last entries; FULL: its entries, groups and consumers.",
    "HELP",
    "    Shows this list.",
];

fn subcommand_syntax_error(command: &str, given: &[u8]) -> CommandError {
    format!(
        "ERR unknown subcommand or wrong number of arguments for '{}'. Try {} HELP.",
        String::from_utf8_lossy(given),
        command.to_ascii_uppercase()
    )
}

/// An id where `-` and `+` stand for the smallest and largest.
fn loose_id(arg: &[u8]) -> Result<StreamId, CommandError> {
    match arg {
        b"-" => Ok(StreamId::MIN),
        b"+" => Ok(StreamId::MAX),
        _ => strict_id(arg),
    }
}

fn xgroup(rest: &[Bytes]) -> Result<Command, CommandError> {
    let arities = [
        ("create", -5),
        ("setid", -5),
        ("destroy", 4),
        ("createconsumer", 5),
        ("delconsumer", 5),
        ("help", 2),
    ];
    let sub = subcommand("xgroup", rest, &arities)?;
    let write = |w: GroupWrite| Command::Write(Write::Streams(StreamWrite::Group(w)));
    if sub == "help" {
        return Ok(Command::Read(Read::Streams(StreamRead::Group(GroupRead::Help(
            XGROUP_HELP,
        )))));
    }
    let (key, group) = (rest[1].clone(), rest[2].clone());
    let mut make_stream = false;
    let mut entries_read = None;
    let mut i = 4;
    while i < rest.len() {
        let option = &rest[i];
        if sub == "create" && option.eq_ignore_ascii_case(b"mkstream") {
            make_stream = true;
            i += 1;
        } else if (sub == "create" || sub == "setid")
            && option.eq_ignore_ascii_case(b"entriesread")
            && i + 1 < rest.len()
        {
            let given = parse_i64(&rest[i + 1])?;
            if given < -1 {
                return Err("ERR value for ENTRIESREAD must be positive or -1".into());
            }
            entries_read = u64::try_from(given).ok();
            i += 2;
        } else {
            return Err(subcommand_syntax_error("xgroup", &rest[0]));
        }
    }
    // Checked after the key and group, as Redis does.
    let argc = rest.len() + 1;
    let start = |fits: bool, parse: fn(&[u8]) -> Result<StreamId, CommandError>| {
        if !fits {
            return Err(subcommand_syntax_error("xgroup", &rest[0]));
        }
        match rest[3].as_ref() {
            b"$" => Ok(GroupStart::Last),
            id => parse(id).map(GroupStart::Id),
        }
    };
    Ok(write(match sub {
        "create" => GroupWrite::Create {
            key,
            group,
            start: start(argc <= 8, strict_id),
            make_stream,
            entries_read,
        },
        "setid" => GroupWrite::SetId {
            key,
            group,
            start: start(argc == 5 || argc == 7, loose_id),
            entries_read,
        },
        "destroy" => GroupWrite::Destroy { key, group },
        "createconsumer" => GroupWrite::CreateConsumer {
            key,
            group,
            consumer: rest[3].clone(),
        },
        "delconsumer" => GroupWrite::DeleteConsumer {
            key,
            group,
            consumer: rest[3].clone(),
        },
        _ => unreachable!("every subcommand is matched"),
    }))
}

const DOLLAR_IN_XREADGROUP: &str = "ERR The $ ID is meaningless in the context of XREADGROUP: you want to read the \
     history of this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just \
     return an empty result set.";

fn xreadgroup(rest: &[Bytes]) -> Result<Command, CommandError> {
    let args = read_args(rest, true)?;
    let (group, consumer) = args.group.expect("XREADGROUP's arguments name a group");
    let streams: Vec<(Bytes, Result<GroupReadFrom, CommandError>)> = args
        .keys
        .iter()
        .zip(args.ids)
        .map(|(key, id)| {
            let from = match id.as_ref() {
                b">" => Ok(GroupReadFrom::Undelivered),
                b"$" => Err(DOLLAR_IN_XREADGROUP.into()),
                id => strict_id(id).map(GroupReadFrom::PendingAfter),
            };
            (key.clone(), from)
        })
        .collect();
    let all_undelivered = streams.iter().all(|(_, from)| *from == Ok(GroupReadFrom::Undelivered));
    match args.block_ms {
        // Only new entries are waited for: history is answered at once.
        Some(timeout_ms) if all_undelivered => {
            let mut attempt = vec![
                Bytes::from_static(b"XREADGROUP"),
                Bytes::from_static(b"GROUP"),
                group.clone(),
                consumer,
                Bytes::from_static(b"COUNT"),
                Bytes::from(args.count.to_string()),
            ];
            if args.no_ack {
                attempt.push(Bytes::from_static(b"NOACK"));
            }
            attempt.push(Bytes::from_static(b"STREAMS"));
            attempt.extend(args.keys.iter().cloned());
            attempt.extend(args.keys.iter().map(|_| Bytes::from_static(b">")));
            Ok(Command::Blocking(Blocking {
                attempt,
                keys: args.keys.to_vec(),
                timeout_ms: (timeout_ms > 0).then_some(timeout_ms),
                reply: BlockingReply::GroupStreams,
                look: Look::Undelivered { group },
            }))
        }
        _ => Ok(Command::Write(Write::Streams(StreamWrite::Group(GroupWrite::Read {
            group,
            consumer,
            count: args.count,
            no_ack: args.no_ack,
            streams,
        })))),
    }
}

fn xclaim(rest: &[Bytes]) -> Result<Claim, CommandError> {
    let min_idle_ms = parse_i64(&rest[3])
        .map_err(|_| "ERR Invalid min-idle-time argument for XCLAIM")?
        .max(0);
    let ids: Vec<StreamId> = rest[4..].iter().map_while(|arg| strict_id(arg).ok()).collect();
    let mut claim = Claim {
        min_idle_ms,
        delivered: DeliveredAt::Now,
        retry_count: -1,
        force: false,
        just_id: false,
        last_id: StreamId::MIN,
        ids,
    };
    let mut i = 4 + claim.ids.len();
    while i < rest.len() {
        let option = &rest[i];
        let more = i + 1 < rest.len();
        let number =
            |name: &str| parse_i64(&rest[i + 1]).map_err(|_| format!("ERR Invalid {name} option argument for XCLAIM"));
        if option.eq_ignore_ascii_case(b"force") {
            claim.force = true;
        } else if option.eq_ignore_ascii_case(b"justid") {
            claim.just_id = true;
        } else if option.eq_ignore_ascii_case(b"idle") && more {
            claim.delivered = DeliveredAt::IdleMs(number("IDLE")?);
            i += 1;
        } else if option.eq_ignore_ascii_case(b"time") && more {
            claim.delivered = DeliveredAt::UnixMs(number("TIME")?);
            i += 1;
        } else if option.eq_ignore_ascii_case(b"retrycount") && more {
            claim.retry_count = number("RETRYCOUNT")?;
            i += 1;
        } else if option.eq_ignore_ascii_case(b"lastid") && more {
            claim.last_id = strict_id(&rest[i + 1])?;
            i += 1;
        } else {
            return Err(format!(
                "ERR Unrecognized XCLAIM option '{}'",
                String::from_utf8_lossy(option)
            ));
        }
        i += 1;
    }
    Ok(claim)
}

/// The most entries XAUTOCLAIM's COUNT may ask for, as Redis bounds it.
const AUTOCLAIM_MAX_COUNT: i64 = i64::MAX / 16;

fn xautoclaim(rest: &[Bytes]) -> Result<GroupWrite, CommandError> {
    let min_idle_ms = parse_i64(&rest[3])
        .map_err(|_| "ERR Invalid min-idle-time argument for XAUTOCLAIM")?
        .max(0);
    let start = interval_id(&rest[4], 0, true)?;
    let mut count = 100;
    let mut just_id = false;
    let mut i = 5;
    while i < rest.len() {
        let option = &rest[i];
        if option.eq_ignore_ascii_case(b"count") && i + 1 < rest.len() {
            count = parse_i64(&rest[i + 1])
                .ok()
                .filter(|n| (1..=AUTOCLAIM_MAX_COUNT).contains(n))
                .ok_or("ERR COUNT must be > 0")? as u64;
            i += 2;
        } else if option.eq_ignore_ascii_case(b"justid") {
            just_id = true;
            i += 1;
        } else {
            return Err(syntax_error());
        }
    }
    Ok(GroupWrite::AutoClaim {
        key: rest[0].clone(),
        group: rest[1].clone(),
        consumer: rest[2].clone(),
        min_idle_ms,
        start,
        count,
        just_id,
    })
}

fn xpending(rest: &[Bytes]) -> Result<GroupRead, CommandError> {
    let argc = rest.len() + 1;
    if argc != 3 && !(6..=9).contains(&argc) {
        return Err(syntax_error());
    }
    let (key, group) = (rest[0].clone(), rest[1].clone());
    if argc == 3 {
        return Ok(GroupRead::Pending {
            key,
            group,
            range: None,
        });
    }
    let mut at = 2;
    let mut min_idle_ms = 0;
    if rest[2].eq_ignore_ascii_case(b"idle") {
        min_idle_ms = parse_i64(&rest[3])?;
        if argc < 8 {
            return Err(syntax_error());
        }
        at += 2;
    }
    let count = parse_i64(&rest[at + 2])?.max(0) as u64;
    let from = interval_id(&rest[at], 0, true)?;
    let to = interval_id(&rest[at + 1], u64::MAX, false)?;
    Ok(GroupRead::Pending {
        key,
        group,
        range: Some(PendingRange {
            min_idle_ms,
            from,
            to,
            count,
            consumer: rest.get(at + 3).cloned(),
        }),
    })
}

fn xinfo(rest: &[Bytes]) -> Result<GroupRead, CommandError> {
    let sub = subcommand(
        "xinfo",
        rest,
        &[("consumers", 4), ("groups", 3), ("stream", -3), ("help", 2)],
    )?;
    Ok(match sub {
        "help" => GroupRead::Help(XINFO_HELP),
        "groups" => GroupRead::Groups(rest[1].clone()),
        "consumers" => GroupRead::Consumers {
            key: rest[1].clone(),
            group: rest[2].clone(),
        },
        _ => GroupRead::Stream {
            key: rest[1].clone(),
            full: stream_info_options(rest),
        },
    })
}

/// XINFO STREAM's options: none, FULL, or FULL COUNT n (a negative count is Redis's default, 10).
fn stream_info_options(rest: &[Bytes]) -> Result<Option<u64>, CommandError> {
    let options = &rest[2..];
    match options {
        [] => Ok(None),
        [full] if full.eq_ignore_ascii_case(b"full") => Ok(Some(10)),
        [full, count, n] if full.eq_ignore_ascii_case(b"full") && count.eq_ignore_ascii_case(b"count") => {
            let n = parse_i64(n)?;
            Ok(Some(if n < 0 { 10 } else { n as u64 }))
        }
        _ => Err(subcommand_syntax_error("xinfo", &rest[0])),
    }
}

pub(super) fn parse(name: &str, rest: &[Bytes]) -> Option<Result<Command, CommandError>> {
    let write = |w: GroupWrite| Command::Write(Write::Streams(StreamWrite::Group(w)));
    let read = |r: GroupRead| Command::Read(Read::Streams(StreamRead::Group(r)));
    let (_, at_least) = super::arity_checks(name, rest.len());
    let parsed = (|| -> Result<Option<Command>, CommandError> {
        Ok(match name {
            "xgroup" => {
                at_least(1)?;
                xgroup(rest)?
            }
            "xreadgroup" => {
                at_least(6)?;
                xreadgroup(rest)?
            }
            "xack" => {
                at_least(3)?;
                write(GroupWrite::Ack {
                    key: rest[0].clone(),
                    group: rest[1].clone(),
                    ids: rest[2..].iter().map(|id| strict_id(id)).collect(),
                })
            }
            "xclaim" => {
                at_least(5)?;
                write(GroupWrite::Claim {
                    key: rest[0].clone(),
                    group: rest[1].clone(),
                    consumer: rest[2].clone(),
                    claim: xclaim(rest),
                })
            }
            "xautoclaim" => {
                at_least(5)?;
                write(xautoclaim(rest)?)
            }
            "xpending" => {
                at_least(2)?;
                read(xpending(rest)?)
            }
            "xinfo" => {
                at_least(1)?;
                read(xinfo(rest)?)
            }
            _ => return Ok(None),
        }
        .into())
    })();
    parsed.transpose()
}
