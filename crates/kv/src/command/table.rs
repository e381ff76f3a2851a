//! The command table COMMAND reports: every command Chorus answers, with Redis's arity (the
//! argument count with the name; negative: at least that many), flags, and where its keys are
//! (first, last — negative counts from the end — and step; 0, 0, 0 when it has none or they
//! are found from a count, `movablekeys`).

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
const WB: &[&str] = &["write", "blocking"];
const WM: &[&str] = &["write", "movablekeys"];
const RM: &[&str] = &["readonly", "movablekeys"];
const WBM: &[&str] = &["write", "blocking", "movablekeys"];
const S: &[&str] = &["noscript"];
const P: &[&str] = &["pubsub", "noscript"];

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
    spec("setbit", 4, W, ONE, "bitmap"),
    spec("getbit", 3, R, ONE, "bitmap"),
    spec("bitcount", -2, R, ONE, "bitmap"),
    spec("bitpos", -3, R, ONE, "bitmap"),
    spec("bitop", -4, W, (2, -1, 1), "bitmap"),
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
    spec("blpop", -3, WB, (1, -2, 1), "list"),
    spec("brpop", -3, WB, (1, -2, 1), "list"),
    spec("blmpop", -5, WBM, NONE, "list"),
    spec("blmove", 6, WB, TWO, "list"),
    spec("brpoplpush", 4, WB, TWO, "list"),
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
    spec("bzpopmin", -3, WB, (1, -2, 1), "sorted-set"),
    spec("bzpopmax", -3, WB, (1, -2, 1), "sorted-set"),
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
    spec("multi", 1, S, NONE, "transactions"),
    spec("exec", 1, S, NONE, "transactions"),
    spec("discard", 1, S, NONE, "transactions"),
    spec("watch", -2, S, ALL, "transactions"),
    spec("unwatch", 1, S, NONE, "transactions"),
    spec("eval", -3, &["noscript", "movablekeys"], NONE, "scripting"),
    spec("evalsha", -3, &["noscript", "movablekeys"], NONE, "scripting"),
    spec(
        "eval_ro",
        -3,
        &["noscript", "readonly", "movablekeys"],
        NONE,
        "scripting",
    ),
    spec(
        "evalsha_ro",
        -3,
        &["noscript", "readonly", "movablekeys"],
        NONE,
        "scripting",
    ),
    spec("script", -2, S, NONE, "scripting"),
    spec("subscribe", -2, P, NONE, "pubsub"),
    spec("unsubscribe", -1, P, NONE, "pubsub"),
    spec("psubscribe", -2, P, NONE, "pubsub"),
    spec("punsubscribe", -1, P, NONE, "pubsub"),
    spec("publish", 3, &["pubsub", "fast"], NONE, "pubsub"),
    spec("pubsub", -2, P, NONE, "pubsub"),
    spec("ping", -1, &["fast"], NONE, "connection"),
    spec("echo", 2, &["fast"], NONE, "connection"),
    spec("quit", -1, &["fast"], NONE, "connection"),
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
