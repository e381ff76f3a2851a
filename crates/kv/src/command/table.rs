//! The command table COMMAND reports: every command Chorus answers, with Redis's arity (the
//! argument count with the name; negative: at least that many), flags, and where its keys are
//! (first, last — negative counts from the end — and step; 0, 0, 0 when it has none or they
//! are found from a count, `movablekeys`).

use bytes::Bytes;
use chorus_resp::Value;

pub struct CommandSpec {
    pub name: &'static str,
    pub arity: i64,
    pub flags: &'static [&'static str],
    pub first_key: i64,
    pub last_key: i64,
    pub step: i64,
    pub group: &'static str,
}

const W: &[&str] = &["write"];
const R: &[&str] = &["readonly"];
/// Blocking commands Redis 7.0 keeps out of scripts.
const WBS: &[&str] = &["write", "blocking", "noscript"];
const WM: &[&str] = &["write", "movablekeys"];
const RM: &[&str] = &["readonly", "movablekeys"];
const WBM: &[&str] = &["write", "blocking", "movablekeys"];
const RBM: &[&str] = &["readonly", "blocking", "movablekeys"];
const S: &[&str] = &["noscript"];
const P: &[&str] = &["pubsub", "noscript"];
/// Scripts and functions: their keys come from a count.
const SCRIPT: &[&str] = &["noscript", "movablekeys"];
const SCRIPT_RO: &[&str] = &["noscript", "readonly", "movablekeys"];

const fn spec(
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
    group: &'static str,
) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        flags,
        first_key: keys.0,
        last_key: keys.1,
        step: keys.2,
        group,
    }
}

const ONE: (i64, i64, i64) = (1, 1, 1);
const ALL: (i64, i64, i64) = (1, -1, 1);
const TWO: (i64, i64, i64) = (1, 2, 1);
const NONE: (i64, i64, i64) = (0, 0, 0);

pub const COMMANDS: &[CommandSpec] = &[
    spec("get", 2, R, ONE, "string"),
    spec("set", -3, W, ONE, "string"),
    spec("setnx", 3, W, ONE, "string"),
    spec("setex", 4, W, ONE, "string"),
    spec("psetex", 4, W, ONE, "string"),
    spec("getset", 3, W, ONE, "string"),
    spec("getdel", 2, W, ONE, "string"),
    spec("getex", -2, W, ONE, "string"),
    spec("getrange", 4, R, ONE, "string"),
    spec("substr", 4, R, ONE, "string"),
    spec("setrange", 4, W, ONE, "string"),
    spec("lcs", -3, R, TWO, "string"),
    spec("setbit", 4, W, ONE, "bitmap"),
    spec("getbit", 3, R, ONE, "bitmap"),
    spec("bitcount", -2, R, ONE, "bitmap"),
    spec("bitpos", -3, R, ONE, "bitmap"),
    spec("bitop", -4, W, (2, -1, 1), "bitmap"),
    spec("bitfield", -2, W, ONE, "bitmap"),
    spec("sort", -2, WM, ONE, "generic"),
    spec("dump", 2, R, ONE, "generic"),
    spec("object", -2, R, NONE, "generic"),
    spec("restore", -4, W, ONE, "generic"),
    spec("sort_ro", -2, R, ONE, "generic"),
    spec("bitfield_ro", -2, R, ONE, "bitmap"),
    spec("pfadd", -2, W, ONE, "hyperloglog"),
    spec("pfcount", -2, R, ALL, "hyperloglog"),
    spec("pfmerge", -2, W, ALL, "hyperloglog"),
    spec("geoadd", -5, W, ONE, "geo"),
    spec("geodist", -4, R, ONE, "geo"),
    spec("geohash", -2, R, ONE, "geo"),
    spec("geopos", -2, R, ONE, "geo"),
    spec("georadius", -6, WM, ONE, "geo"),
    spec("georadius_ro", -6, R, ONE, "geo"),
    spec("georadiusbymember", -5, WM, ONE, "geo"),
    spec("georadiusbymember_ro", -5, R, ONE, "geo"),
    spec("geosearch", -7, R, ONE, "geo"),
    spec("geosearchstore", -8, W, TWO, "geo"),
    spec("mget", -2, R, ALL, "string"),
    spec("mset", -3, W, (1, -1, 2), "string"),
    spec("msetnx", -3, W, (1, -1, 2), "string"),
    spec("incr", 2, W, ONE, "string"),
    spec("incrby", 3, W, ONE, "string"),
    spec("decr", 2, W, ONE, "string"),
    spec("decrby", 3, W, ONE, "string"),
    spec("incrbyfloat", 3, W, ONE, "string"),
    spec("append", 3, W, ONE, "string"),
    spec("strlen", 2, R, ONE, "string"),
    spec("hset", -4, W, ONE, "hash"),
    spec("hmset", -4, W, ONE, "hash"),
    spec("hsetnx", 4, W, ONE, "hash"),
    spec("hget", 3, R, ONE, "hash"),
    spec("hmget", -3, R, ONE, "hash"),
    spec("hgetall", 2, R, ONE, "hash"),
    spec("hkeys", 2, R, ONE, "hash"),
    spec("hvals", 2, R, ONE, "hash"),
    spec("hstrlen", 3, R, ONE, "hash"),
    spec("hdel", -3, W, ONE, "hash"),
    spec("hlen", 2, R, ONE, "hash"),
    spec("hexists", 3, R, ONE, "hash"),
    spec("hincrby", 4, W, ONE, "hash"),
    spec("hincrbyfloat", 4, W, ONE, "hash"),
    spec("hrandfield", -2, R, ONE, "hash"),
    spec("hscan", -3, R, ONE, "hash"),
    spec("sadd", -3, W, ONE, "set"),
    spec("srem", -3, W, ONE, "set"),
    spec("smembers", 2, R, ONE, "set"),
    spec("sismember", 3, R, ONE, "set"),
    spec("smismember", -3, R, ONE, "set"),
    spec("scard", 2, R, ONE, "set"),
    spec("spop", -2, W, ONE, "set"),
    spec("srandmember", -2, R, ONE, "set"),
    spec("smove", 4, W, TWO, "set"),
    spec("sinter", -2, R, ALL, "set"),
    spec("sunion", -2, R, ALL, "set"),
    spec("sdiff", -2, R, ALL, "set"),
    spec("sinterstore", -3, W, ALL, "set"),
    spec("sunionstore", -3, W, ALL, "set"),
    spec("sdiffstore", -3, W, ALL, "set"),
    spec("sintercard", -3, RM, NONE, "set"),
    spec("sscan", -3, R, ONE, "set"),
    spec("lpush", -3, W, ONE, "list"),
    spec("rpush", -3, W, ONE, "list"),
    spec("lpushx", -3, W, ONE, "list"),
    spec("rpushx", -3, W, ONE, "list"),
    spec("lpop", -2, W, ONE, "list"),
    spec("rpop", -2, W, ONE, "list"),
    spec("lmpop", -4, WM, NONE, "list"),
    spec("lrange", 4, R, ONE, "list"),
    spec("llen", 2, R, ONE, "list"),
    spec("lindex", 3, R, ONE, "list"),
    spec("lset", 4, W, ONE, "list"),
    spec("lrem", 4, W, ONE, "list"),
    spec("ltrim", 4, W, ONE, "list"),
    spec("lmove", 5, W, TWO, "list"),
    spec("rpoplpush", 3, W, TWO, "list"),
    spec("linsert", 5, W, ONE, "list"),
    spec("lpos", -3, R, ONE, "list"),
    spec("xadd", -5, W, ONE, "stream"),
    spec("xlen", 2, R, ONE, "stream"),
    spec("xrange", -4, R, ONE, "stream"),
    spec("xrevrange", -4, R, ONE, "stream"),
    spec("xdel", -3, W, ONE, "stream"),
    spec("xtrim", -4, W, ONE, "stream"),
    spec("xsetid", -3, W, ONE, "stream"),
    spec("xread", -4, RBM, NONE, "stream"),
    spec("xgroup", -2, W, (2, 2, 1), "stream"),
    spec("xreadgroup", -7, WBM, NONE, "stream"),
    spec("xack", -4, W, ONE, "stream"),
    spec("xpending", -3, R, ONE, "stream"),
    spec("xclaim", -6, W, ONE, "stream"),
    spec("xautoclaim", -6, W, ONE, "stream"),
    spec("xinfo", -2, R, (2, 2, 1), "stream"),
    spec("blpop", -3, WBS, (1, -2, 1), "list"),
    spec("brpop", -3, WBS, (1, -2, 1), "list"),
    spec("blmpop", -5, WBM, NONE, "list"),
    spec("blmove", 6, WBS, TWO, "list"),
    spec("brpoplpush", 4, WBS, TWO, "list"),
    spec("zadd", -4, W, ONE, "sorted-set"),
    spec("zincrby", 4, W, ONE, "sorted-set"),
    spec("zrem", -3, W, ONE, "sorted-set"),
    spec("zscore", 3, R, ONE, "sorted-set"),
    spec("zmscore", -3, R, ONE, "sorted-set"),
    spec("zcard", 2, R, ONE, "sorted-set"),
    spec("zcount", 4, R, ONE, "sorted-set"),
    spec("zlexcount", 4, R, ONE, "sorted-set"),
    spec("zrange", -4, R, ONE, "sorted-set"),
    spec("zrevrange", -4, R, ONE, "sorted-set"),
    spec("zrangebyscore", -4, R, ONE, "sorted-set"),
    spec("zrevrangebyscore", -4, R, ONE, "sorted-set"),
    spec("zrangebylex", -4, R, ONE, "sorted-set"),
    spec("zrevrangebylex", -4, R, ONE, "sorted-set"),
    spec("zrank", 3, R, ONE, "sorted-set"),
    spec("zrevrank", 3, R, ONE, "sorted-set"),
    spec("zpopmin", -2, W, ONE, "sorted-set"),
    spec("zpopmax", -2, W, ONE, "sorted-set"),
    spec("zmpop", -4, WM, NONE, "sorted-set"),
    spec("bzpopmin", -3, WBS, (1, -2, 1), "sorted-set"),
    spec("bzpopmax", -3, WBS, (1, -2, 1), "sorted-set"),
    spec("bzmpop", -5, WBM, NONE, "sorted-set"),
    spec("zremrangebyrank", 4, W, ONE, "sorted-set"),
    spec("zremrangebyscore", 4, W, ONE, "sorted-set"),
    spec("zremrangebylex", 4, W, ONE, "sorted-set"),
    spec("zrangestore", -5, W, TWO, "sorted-set"),
    spec("zunionstore", -4, WM, ONE, "sorted-set"),
    spec("zinterstore", -4, WM, ONE, "sorted-set"),
    spec("zdiffstore", -4, WM, ONE, "sorted-set"),
    spec("zunion", -3, RM, NONE, "sorted-set"),
    spec("zinter", -3, RM, NONE, "sorted-set"),
    spec("zdiff", -3, RM, NONE, "sorted-set"),
    spec("zintercard", -3, RM, NONE, "sorted-set"),
    spec("zrandmember", -2, R, ONE, "sorted-set"),
    spec("zscan", -3, R, ONE, "sorted-set"),
    spec("del", -2, W, ALL, "generic"),
    spec("unlink", -2, W, ALL, "generic"),
    spec("exists", -2, R, ALL, "generic"),
    spec("type", 2, R, ONE, "generic"),
    spec("keys", 2, R, NONE, "generic"),
    spec("scan", -2, R, NONE, "generic"),
    spec("randomkey", 1, R, NONE, "generic"),
    spec("rename", 3, W, TWO, "generic"),
    spec("renamenx", 3, W, TWO, "generic"),
    spec("copy", -3, W, TWO, "generic"),
    spec("expire", -3, W, ONE, "generic"),
    spec("pexpire", -3, W, ONE, "generic"),
    spec("expireat", -3, W, ONE, "generic"),
    spec("pexpireat", -3, W, ONE, "generic"),
    spec("ttl", 2, R, ONE, "generic"),
    spec("pttl", 2, R, ONE, "generic"),
    spec("expiretime", 2, R, ONE, "generic"),
    spec("pexpiretime", 2, R, ONE, "generic"),
    spec("persist", 2, W, ONE, "generic"),
    spec("flushall", -1, W, NONE, "server"),
    spec("flushdb", -1, W, NONE, "server"),
    spec("dbsize", 1, R, NONE, "server"),
    spec("touch", -2, R, ALL, "generic"),
    spec("time", 1, &["random", "fast"], NONE, "server"),
    spec("monitor", 1, &["admin", "noscript", "loading", "stale"], NONE, "server"),
    spec("lastsave", 1, &["random", "fast", "loading", "stale"], NONE, "server"),
    spec("save", 1, &["admin", "noscript"], NONE, "server"),
    spec("bgsave", -1, &["admin", "noscript"], NONE, "server"),
    spec("bgrewriteaof", 1, &["admin", "noscript"], NONE, "server"),
    spec(
        "shutdown",
        -1,
        &["admin", "noscript", "loading", "stale"],
        NONE,
        "server",
    ),
    spec("memory", -2, R, NONE, "server"),
    spec("multi", 1, S, NONE, "transactions"),
    spec("exec", 1, S, NONE, "transactions"),
    spec("discard", 1, S, NONE, "transactions"),
    spec("watch", -2, S, ALL, "transactions"),
    spec("unwatch", 1, S, NONE, "transactions"),
    spec("eval", -3, SCRIPT, NONE, "scripting"),
    spec("evalsha", -3, SCRIPT, NONE, "scripting"),
    spec("eval_ro", -3, SCRIPT_RO, NONE, "scripting"),
    spec("evalsha_ro", -3, SCRIPT_RO, NONE, "scripting"),
    spec("script", -2, S, NONE, "scripting"),
    spec("fcall", -3, SCRIPT, NONE, "scripting"),
    spec("fcall_ro", -3, SCRIPT_RO, NONE, "scripting"),
    spec("function", -2, S, NONE, "scripting"),
    spec("subscribe", -2, P, NONE, "pubsub"),
    spec("unsubscribe", -1, P, NONE, "pubsub"),
    spec("psubscribe", -2, P, NONE, "pubsub"),
    spec("punsubscribe", -1, P, NONE, "pubsub"),
    spec("publish", 3, &["pubsub", "fast"], NONE, "pubsub"),
    spec("spublish", 3, &["pubsub", "fast"], ONE, "pubsub"),
    spec("ssubscribe", -2, P, ALL, "pubsub"),
    spec("sunsubscribe", -1, P, ALL, "pubsub"),
    spec("pubsub", -2, P, NONE, "pubsub"),
    spec("ping", -1, &["fast"], NONE, "connection"),
    spec("echo", 2, &["fast"], NONE, "connection"),
    spec("quit", -1, &["fast"], NONE, "connection"),
    spec(
        "reset",
        1,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        NONE,
        "connection",
    ),
    spec("select", 2, &["fast"], NONE, "connection"),
    spec("hello", -1, &["noscript", "fast"], NONE, "connection"),
    spec(
        "auth",
        -2,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        NONE,
        "connection",
    ),
    spec("acl", -2, S, NONE, "server"),
    spec("client", -2, S, NONE, "connection"),
    spec("readonly", 1, &["fast"], NONE, "cluster"),
    spec("readwrite", 1, &["fast"], NONE, "cluster"),
    spec("cluster", -2, S, NONE, "cluster"),
    spec("wait", 3, &["noscript"], NONE, "generic"),
    spec("info", -1, S, NONE, "server"),
    spec("config", -2, S, NONE, "server"),
    spec("command", -1, S, NONE, "server"),
    spec("slowlog", -2, &["admin", "random", "loading", "stale"], NONE, "server"),
    spec(
        "latency",
        -2,
        &["admin", "noscript", "loading", "stale"],
        NONE,
        "server",
    ),
    spec("module", -2, &["admin", "noscript"], NONE, "server"),
    spec("rifl", -2, S, NONE, "chorus"),
    spec("curp", -2, S, NONE, "chorus"),
];

pub fn find(name: &str) -> Option<&'static CommandSpec> {
    COMMANDS.iter().find(|spec| spec.name.eq_ignore_ascii_case(name))
}

impl CommandSpec {
    /// COMMAND INFO's entry, in Redis 7's ten fields (no ACL categories, tips, key specifications
    /// or subcommands: the first, last and step fields say where the keys are).
    pub fn info(&self) -> Value {
        Value::array(vec![
            Value::bulk(self.name),
            Value::Integer(self.arity),
            Value::array(self.flags.iter().map(|f| Value::Simple((*f).into())).collect()),
            Value::Integer(self.first_key),
            Value::Integer(self.last_key),
            Value::Integer(self.step),
            Value::array(Vec::new()),
            Value::array(Vec::new()),
            Value::array(Vec::new()),
            Value::array(Vec::new()),
        ])
    }

    /// COMMAND DOCS's entry: the command's group.
    pub fn docs(&self) -> Value {
        Value::map(vec![(Value::bulk("group"), Value::bulk(self.group))])
    }
}

/// Subcommands whose keys differ from what their command's table entry says: their arity (of
/// the whole command, as Redis 7's subcommand table has it) and where their key is, if any.
const SUBCOMMANDS: &[(&str, &str, i64, Option<i64>)] = &[
    ("object", "encoding", 3, Some(2)),
    ("object", "freq", 3, Some(2)),
    ("object", "idletime", 3, Some(2)),
    ("object", "refcount", 3, Some(2)),
    ("memory", "usage", -3, Some(2)),
    ("xinfo", "help", 2, None),
    ("xgroup", "help", 2, None),
];

/// Channel commands: Redis 7 marks their channel as "not a key", so COMMAND GETKEYS finds none.
const CHANNEL_COMMANDS: &[&str] = &["spublish", "ssubscribe", "sunsubscribe"];

/// COMMAND GETKEYS: the keys of a whole command (`args`: its name and arguments), found as
/// Redis 7.0 finds them — from the table's first, last and step, or, for a command whose keys
/// move (`movablekeys`), from its own rule. The error is Redis's reply text.
pub fn keys_of(args: &[Bytes]) -> Result<Vec<Bytes>, &'static str> {
    let name = String::from_utf8_lossy(args.first().ok_or("ERR Invalid command specified")?).to_ascii_lowercase();
    let spec = find(&name).ok_or("ERR Invalid command specified")?;
    let subcommand = args.get(1).map(|sub| String::from_utf8_lossy(sub).to_ascii_lowercase());
    let listed_subcommand = SUBCOMMANDS
        .iter()
        .find(|(command, sub, _, _)| *command == name && Some(*sub) == subcommand.as_deref());
    let arity = listed_subcommand.map_or(spec.arity, |(_, _, arity, _)| *arity);
    let arity_holds = if arity < 0 {
        args.len() >= arity.unsigned_abs() as usize
    } else {
        args.len() == arity as usize
    };
    if !arity_holds {
        return Err("ERR Invalid number of arguments specified for command");
    }
    let (first, last, step) = match listed_subcommand {
        Some((_, _, _, Some(at))) => (*at, *at, 1),
        Some((_, _, _, None)) => (0, 0, 0),
        None => (spec.first_key, spec.last_key, spec.step),
    };
    let keys = if spec.flags.contains(&"movablekeys") {
        movable_keys(&name, args)
    } else if first == 0 || CHANNEL_COMMANDS.contains(&name.as_str()) {
        return Err("ERR The command has no key arguments");
    } else {
        let last = if last < 0 { args.len() as i64 + last } else { last };
        (first..=last)
            .step_by(step as usize)
            .filter_map(|at| args.get(at as usize).cloned())
            .collect()
    };
    // Scripts and functions may name no keys at all; every other command names at least one.
    if keys.is_empty() && spec.group != "scripting" {
        return Err("ERR Invalid arguments specified for command");
    }
    Ok(keys)
}

/// The keys of a `movablekeys` command, by its own rule; none when its arguments do not add up
/// (a key count past the end).
fn movable_keys(name: &str, args: &[Bytes]) -> Vec<Bytes> {
    let counted = |count_at: usize| -> Vec<Bytes> {
        let count = args
            .get(count_at)
            .and_then(|count| std::str::from_utf8(count).ok()?.parse::<usize>().ok());
        match count.and_then(|count| count.checked_add(count_at)) {
            Some(last) if last < args.len() => args[count_at + 1..=last].to_vec(),
            _ => Vec::new(),
        }
    };
    let position = |word: &[u8]| args.iter().position(|arg| arg.eq_ignore_ascii_case(word));
    match name {
        "sintercard" | "lmpop" | "zmpop" | "zunion" | "zinter" | "zdiff" | "zintercard" => counted(1),
        "blmpop" | "bzmpop" => counted(2),
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro" => counted(2),
        "zunionstore" | "zinterstore" | "zdiffstore" => {
            let mut keys = vec![args[1].clone()];
            keys.extend(counted(2));
            if keys.len() == 1 {
                keys.clear();
            }
            keys
        }
        "xread" | "xreadgroup" => match position(b"streams") {
            // Half of what follows STREAMS are keys, the other half their ids.
            Some(at) => {
                let streams = &args[at + 1..];
                streams[..streams.len() / 2].to_vec()
            }
            None => Vec::new(),
        },
        // The key, and where the last STORE puts the result.
        "sort" => {
            let mut destination = None;
            let mut at = 2;
            while let Some(word) = args.get(at) {
                let is = |option: &[u8]| word.eq_ignore_ascii_case(option);
                // LIMIT takes two arguments, BY and GET one; none of them is a key.
                at += if is(b"limit") {
                    3
                } else if is(b"by") || is(b"get") {
                    2
                } else {
                    if is(b"store") {
                        destination = args.get(at + 1).cloned().or(destination);
                    }
                    1
                };
            }
            std::iter::once(args[1].clone()).chain(destination).collect()
        }
        // The key, then where the first STORE and the first STOREDIST after the query put it.
        "georadius" | "georadiusbymember" => {
            let options_at = if name == "georadius" { 6 } else { 5 };
            let after = |option: &[u8]| {
                let options = args.get(options_at..).unwrap_or_default();
                let at = options.iter().position(|arg| arg.eq_ignore_ascii_case(option))?;
                options.get(at + 1).cloned()
            };
            std::iter::once(args[1].clone())
                .chain(after(b"store"))
                .chain(after(b"storedist"))
                .collect()
        }
        _ => unreachable!("no rule for the keys of movable command {name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(command: &str) -> Result<Vec<String>, &'static str> {
        let args: Vec<Bytes> = command.split(' ').map(|arg| Bytes::from(arg.to_string())).collect();
        keys_of(&args).map(|keys| keys.iter().map(|k| String::from_utf8_lossy(k).into_owned()).collect())
    }

    /// Every command whose keys move has a rule for them (the rest panic: the table and the
    /// rules disagree).
    #[test]
    fn every_movable_command_has_a_rule_for_its_keys() {
        for spec in COMMANDS.iter().filter(|spec| spec.flags.contains(&"movablekeys")) {
            let found = keys(&format!("{} 1 2 3 4 STREAMS 6 7 8 9", spec.name));
            assert!(
                found.as_ref().is_ok_and(|keys| !keys.is_empty()) || spec.group == "scripting",
                "{}: {found:?}",
                spec.name
            );
        }
    }

    #[test]
    fn keys_are_found_where_redis_finds_them() {
        assert_eq!(keys("MSET a 1 b 2"), Ok(vec!["a".into(), "b".into()]));
        assert_eq!(keys("BLPOP a b 0"), Ok(vec!["a".into(), "b".into()]));
        assert_eq!(
            keys("SORT k LIMIT 0 1 BY store GET store STORE d"),
            Ok(vec!["k".into(), "d".into()])
        );
        assert_eq!(
            keys("GEORADIUSBYMEMBER k store 1 km STOREDIST d STORE e STOREDIST f"),
            Ok(vec!["k".into(), "e".into(), "d".into()])
        );
        assert_eq!(
            keys("ZUNIONSTORE d 2 a b WEIGHTS 1 2"),
            Ok(vec!["d".into(), "a".into(), "b".into()])
        );
        assert_eq!(keys("XREAD COUNT 1 STREAMS s t 0 0"), Ok(vec!["s".into(), "t".into()]));
        assert_eq!(keys("EVAL x 3 a b"), Ok(vec![]));
        assert_eq!(
            keys("SINTERCARD 3 a b"),
            Err("ERR Invalid arguments specified for command")
        );
        assert_eq!(keys("OBJECT ENCODING k"), Ok(vec!["k".into()]));
        assert_eq!(
            keys("OBJECT ENCODING"),
            Err("ERR Invalid number of arguments specified for command")
        );
        assert_eq!(keys("SPUBLISH ch m"), Err("ERR The command has no key arguments"));
        assert_eq!(keys("NOSUCH k"), Err("ERR Invalid command specified"));
    }
}
