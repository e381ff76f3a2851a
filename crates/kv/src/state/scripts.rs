//! Lua scripts (EVAL, EVALSHA, SCRIPT): the log carries the script call, and every replica runs
//! it where the entry applies, so a script must do the same thing on every replica. It runs in
//! Lua 5.1 (Redis's), with what a script may use and nothing that differs between replicas:
//! the base functions, `string`, `table` and `math` (whose `random` starts from the same seed in
//! every call), and `redis.call` / `redis.pcall` on the state; no clocks, files or modules, and
//! creating a global is an error, as in Redis 7. Each call gets a Lua VM of its own, so nothing
//! one call leaves behind (garbage, a changed library) can make the next behave differently on
//! one replica than on another. A runaway script stops at an instruction budget or a memory
//! limit — counts, not times, in a VM that starts alike everywhere, so every replica stops it at
//! the same point. A script's writes are not undone when it fails part-way, as in Redis. Known
//! scripts are kept in the state (`l` and the SHA-1), so EVALSHA finds a script on every node
//! once any node ran or loaded it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use chorus_resp::{format_double, format_human_double, Value};
use mlua::{Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LuaValue, VmState};

use super::{KvState, SCRIPT_TAG};
use crate::command::{script_sha, Command, ScriptCall, ScriptRef, Write};

/// Limits that stop a runaway script, which holds up the log's apply on every replica while it
/// runs (tens of milliseconds at these limits).
const MEMORY_LIMIT_BYTES: usize = 32 << 20;
const HOOK_EVERY_INSTRUCTIONS: u32 = 10_000;
const INSTRUCTION_BUDGET: u64 = 20_000_000;

/// The globals a script finds, besides KEYS, ARGV and `redis`.
const SAFE_GLOBALS: &[&str] = &[
    "_G",
    "_VERSION",
    "assert",
    "error",
    "ipairs",
    "next",
    "pairs",
    "pcall",
    "rawequal",
    "rawget",
    "rawset",
    "select",
    "setmetatable",
    "tonumber",
    "tostring",
    "type",
    "unpack",
    "xpcall",
    "string",
    "table",
    "math",
];

/// A reply that ends the script: a command's error raised by `redis.call`, or a limit.
#[derive(Debug)]
struct ScriptError(String);

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScriptError {}

/// A Lua VM for one call, with the limits set.
fn new_vm() -> mlua::Result<Lua> {
    let lua = Lua::new_with(StdLib::STRING | StdLib::TABLE | StdLib::MATH, LuaOptions::default())?;
    lua.set_memory_limit(MEMORY_LIMIT_BYTES)?;
    let instructions = Arc::new(AtomicU64::new(0));
    lua.set_hook(
        HookTriggers {
            every_nth_instruction: Some(HOOK_EVERY_INSTRUCTIONS),
            ..HookTriggers::new()
        },
        move |_, _| {
            let ran = instructions.fetch_add(u64::from(HOOK_EVERY_INSTRUCTIONS), Ordering::Relaxed);
            if ran >= INSTRUCTION_BUDGET {
                return Err(mlua::Error::external(ScriptError(format!(
                    "ERR script ran past its budget of {INSTRUCTION_BUDGET} Lua instructions"
                ))));
            }
            Ok(VmState::Continue)
        },
    )?;
    Ok(lua)
}

/// Sets a call's globals: only what a script may use, then KEYS, ARGV and `redis`, behind a
/// guard against creating globals or reading undefined ones.
fn set_globals(lua: &Lua, call: &ScriptCall, redis: Table) -> mlua::Result<()> {
    let globals = lua.globals();
    let names = globals
        .pairs::<LuaValue, LuaValue>()
        .map(|pair| pair.map(|(name, _)| name))
        .collect::<mlua::Result<Vec<_>>>()?;
    for name in names {
        let safe =
            matches!(&name, LuaValue::String(s) if SAFE_GLOBALS.iter().any(|g| s.as_bytes().as_ref() == g.as_bytes()));
        if !safe {
            globals.raw_set(name, LuaValue::Nil)?;
        }
    }
    let string: Table = globals.raw_get("string")?;
    string.raw_set("dump", LuaValue::Nil)?;
    let math: Table = globals.raw_get("math")?;
    math.raw_set("random", seeded_random(lua)?)?;
    math.raw_set("randomseed", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    let strings = |items: &[Bytes]| {
        items
            .iter()
            .map(|i| lua.create_string(i))
            .collect::<mlua::Result<Vec<_>>>()
    };
    globals.raw_set("KEYS", lua.create_sequence_from(strings(&call.keys)?)?)?;
    globals.raw_set("ARGV", lua.create_sequence_from(strings(&call.args)?)?)?;
    globals.raw_set("redis", redis)?;
    let guard = lua.create_table()?;
    guard.raw_set(
        "__newindex",
        lua.create_function(|lua, _: MultiValue| -> mlua::Result<()> {
            Err(script_runtime_error(lua, "Attempt to modify a readonly table"))
        })?,
    )?;
    guard.raw_set(
        "__index",
        lua.create_function(|lua, (_, name): (LuaValue, LuaValue)| -> mlua::Result<()> {
            let name = lua
                .coerce_string(name)?
                .map(|s| s.to_string_lossy())
                .unwrap_or_default();
            let message = format!("Script attempted to access nonexistent global variable '{name}'");
            Err(script_runtime_error(lua, &message))
        })?,
    )?;
    globals.set_metatable(Some(guard))?;
    Ok(())
}

/// An error raised in a script as Lua's `error(message, 2)` would raise it: with the place in
/// the script it comes from.
fn script_runtime_error(lua: &Lua, message: &str) -> mlua::Error {
    match lua.inspect_stack(1, |debug| debug.current_line()).flatten() {
        Some(line) => mlua::Error::RuntimeError(format!("user_script:{line}: {message}")),
        None => mlua::Error::RuntimeError(message.to_string()),
    }
}

/// `math.random` from a fixed seed (Park and Miller's generator): the same numbers in every
/// call, on every replica. `random()` is in [0, 1), `random(m)` in [1, m], `random(m, n)` in
/// [m, n].
fn seeded_random(lua: &Lua) -> mlua::Result<Function> {
    const MODULUS: u64 = 2_147_483_647;
    let state = AtomicU64::new(1);
    lua.create_function(move |_, (m, n): (Option<f64>, Option<f64>)| {
        let next = state.load(Ordering::Relaxed) * 16_807 % MODULUS;
        state.store(next, Ordering::Relaxed);
        let r = (next - 1) as f64 / (MODULUS - 1) as f64;
        Ok(match (m, n) {
            (None, _) => r,
            (Some(m), None) => (r * m).floor() + 1.0,
            (Some(m), Some(n)) => (r * (n - m + 1.0)).floor() + m,
        })
    })
}

/// The parts of `redis` that do not touch the state.
fn redis_helpers(lua: &Lua, redis: &Table) -> mlua::Result<()> {
    let reply_table = |field: &'static str| {
        lua.create_function(move |lua, message: mlua::String| {
            let table = lua.create_table()?;
            table.raw_set(field, message)?;
            Ok(table)
        })
    };
    redis.raw_set("error_reply", reply_table("err")?)?;
    redis.raw_set("status_reply", reply_table("ok")?)?;
    redis.raw_set(
        "sha1hex",
        lua.create_function(|_, text: mlua::String| Ok(script_sha(&text.as_bytes())))?,
    )?;
    redis.raw_set("log", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    for (level, name) in ["LOG_DEBUG", "LOG_VERBOSE", "LOG_NOTICE", "LOG_WARNING"]
        .iter()
        .enumerate()
    {
        redis.raw_set(*name, level)?;
    }
    Ok(())
}

fn compile(lua: &Lua, text: &[u8]) -> Result<Function, Value> {
    lua.load(text).set_name("@user_script").into_function().map_err(|e| {
        let message = match e {
            mlua::Error::SyntaxError { message, .. } => message,
            other => other.to_string(),
        };
        Value::error(format!("ERR Error compiling script (new function): {message}"))
    })
}

/// A command's reply as a script sees it (RESP2's types, as Redis gives scripts by default).
fn to_lua(lua: &Lua, value: Value) -> mlua::Result<LuaValue> {
    Ok(match value {
        Value::Integer(n) => LuaValue::Number(n as f64),
        Value::Bulk(Some(bytes)) => LuaValue::String(lua.create_string(&bytes)?),
        Value::Bulk(None) | Value::Array(None) => LuaValue::Boolean(false),
        Value::Double(d) => LuaValue::String(lua.create_string(format_double(d.0))?),
        Value::HumanDouble(d) => LuaValue::String(lua.create_string(format_human_double(d.0))?),
        Value::Array(Some(items)) => {
            let table = lua.create_table()?;
            for (i, item) in items.into_iter().enumerate() {
                table.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            LuaValue::Table(table)
        }
        Value::Push(items) | Value::Replies(items) => to_lua(lua, Value::array(items))?,
        Value::Map(pairs) | Value::Pairs(pairs) => {
            let flat = pairs.into_iter().flat_map(|(a, b)| [a, b]).collect();
            to_lua(lua, Value::array(flat))?
        }
        Value::KeyedPairs(pairs) => {
            let nested = pairs.into_iter().map(|(a, b)| Value::array(vec![a, b])).collect();
            to_lua(lua, Value::array(nested))?
        }
        Value::Simple(status) => {
            let table = lua.create_table()?;
            table.raw_set("ok", status.as_ref())?;
            LuaValue::Table(table)
        }
        Value::Error(message) => {
            let table = lua.create_table()?;
            table.raw_set("err", message)?;
            LuaValue::Table(table)
        }
    })
}

/// A script's result as a reply, by Redis's rules: numbers are truncated to integers, `false`
/// and `nil` are nil, tables with `err` or `ok` are errors and statuses, other tables are arrays
/// up to their first nil.
fn from_lua(value: LuaValue) -> Value {
    match value {
        LuaValue::Boolean(true) => Value::Integer(1),
        LuaValue::Integer(n) => Value::Integer(n),
        LuaValue::Number(n) => Value::Integer(lua_number_as_integer(n)),
        LuaValue::String(s) => Value::bulk(Bytes::copy_from_slice(&s.as_bytes())),
        LuaValue::Table(table) => {
            if let Ok(LuaValue::String(err)) = table.raw_get::<LuaValue>("err") {
                return Value::error(err.to_string_lossy());
            }
            if let Ok(LuaValue::String(ok)) = table.raw_get::<LuaValue>("ok") {
                return Value::Simple(ok.to_string_lossy().into());
            }
            let mut items = Vec::new();
            for i in 1.. {
                match table.raw_get::<LuaValue>(i) {
                    Ok(LuaValue::Nil) | Err(_) => break,
                    Ok(item) => items.push(from_lua(item)),
                }
            }
            Value::array(items)
        }
        _ => Value::null(),
    }
}

/// A Lua number as Redis makes it an integer reply: C's `(long long)` cast as x86-64 does it —
/// toward zero, and the smallest integer for what does not fit (or is not a number), where
/// Rust's `as` would saturate.
fn lua_number_as_integer(n: f64) -> i64 {
    const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
    if n.is_nan() || !(-TWO_TO_63..TWO_TO_63).contains(&n) {
        i64::MIN
    } else {
        n as i64
    }
}

/// The reply for a script that failed: its error as Redis 7.0 words it.
fn failure_reply(error: &mlua::Error, sha: &str) -> Value {
    match error {
        mlua::Error::CallbackError { cause, .. } => failure_reply(cause, sha),
        mlua::Error::WithContext { cause, .. } => failure_reply(cause, sha),
        mlua::Error::ExternalError(_) => match error.downcast_ref::<ScriptError>() {
            Some(ScriptError(message)) => Value::error(message.clone()),
            None => Value::error(format!("ERR {error}")),
        },
        mlua::Error::MemoryError(_) => Value::error("ERR script ran out of memory"),
        mlua::Error::RuntimeError(message) => {
            // Lua's own message, without the traceback mlua appends.
            let message = message.split("\nstack traceback:").next().unwrap_or_default();
            let line = message
                .strip_prefix("user_script:")
                .and_then(|rest| rest.split(':').next())
                .and_then(|line| line.parse::<u64>().ok());
            let place = line.map_or(String::new(), |line| format!(", on @user_script:{line}"));
            Value::error(format!("ERR {message} script: {sha}{place}."))
        }
        other => Value::error(format!("ERR {other}")),
    }
}

fn script_key(sha: &str) -> Bytes {
    let mut key = Vec::with_capacity(1 + sha.len());
    key.push(SCRIPT_TAG);
    key.extend_from_slice(sha.as_bytes());
    Bytes::from(key)
}

impl KvState {
    /// Runs a script call from the entry at `index` (`read_only`: EVAL_RO on one node, whose
    /// `redis.call` refuses writes).
    pub(super) fn run_script(&mut self, index: u64, call: &ScriptCall, read_only: bool) -> Value {
        let (sha, text) = match &call.script {
            ScriptRef::Text(text) => (script_sha(text), text.clone()),
            ScriptRef::Sha(sha) => {
                let sha = String::from_utf8_lossy(sha).into_owned();
                match self
                    .store
                    .get(&script_key(&sha))
                    .unwrap_or_else(|e| super::unreadable(e))
                {
                    Some(text) => (sha, text),
                    None => return Value::error("NOSCRIPT No matching script. Please use EVAL."),
                }
            }
        };
        let reply = self.run_in_new_vm(index, call, &sha, &text, read_only);
        if !read_only && matches!(call.script, ScriptRef::Text(_)) && !is_compile_error(&reply) {
            self.keep_script(index, &sha, &text);
        }
        reply
    }

    fn keep_script(&mut self, index: u64, sha: &str, text: &[u8]) {
        let key = script_key(sha);
        if !self.store.contains(&key) {
            self.store.write(index, key, Some(Bytes::copy_from_slice(text)));
        }
    }

    fn run_in_new_vm(&mut self, index: u64, call: &ScriptCall, sha: &str, text: &[u8], read_only: bool) -> Value {
        let lua = new_vm().unwrap_or_else(|e| panic!("cannot start a Lua VM: {e}"));
        let function = match compile(&lua, text) {
            Ok(function) => function,
            Err(e) => return e,
        };
        let state = RefCell::new(&mut *self);
        let run = |lua: &Lua, args: MultiValue, protected: bool| -> mlua::Result<LuaValue> {
            let args = args
                .into_iter()
                .map(|arg| match lua.coerce_string(arg)? {
                    Some(s) => Ok(Bytes::copy_from_slice(&s.as_bytes())),
                    None => Err(mlua::Error::external(ScriptError(
                        "ERR Lua redis lib command arguments must be strings or integers".into(),
                    ))),
                })
                .collect::<mlua::Result<Vec<Bytes>>>()?;
            match state.borrow_mut().script_command(index, &args, read_only) {
                Value::Error(message) if !protected => {
                    let line = lua.inspect_stack(1, |debug| debug.current_line()).flatten();
                    let place = line.map_or(String::new(), |line| format!(", on @user_script:{line}"));
                    Err(mlua::Error::external(ScriptError(format!(
                        "{message} script: {sha}{place}."
                    ))))
                }
                reply => to_lua(lua, reply),
            }
        };
        let result = lua.scope(|scope| {
            let redis = lua.create_table()?;
            redis.raw_set("call", scope.create_function(|lua, args| run(lua, args, false))?)?;
            redis.raw_set("pcall", scope.create_function(|lua, args| run(lua, args, true))?)?;
            redis_helpers(&lua, &redis)?;
            set_globals(&lua, call, redis)?;
            function.call::<LuaValue>(())
        });
        match result {
            Ok(value) => from_lua(value),
            Err(e) => failure_reply(&e, sha),
        }
    }

    /// One `redis.call` of a script: a data command, run where the script runs.
    fn script_command(&mut self, index: u64, args: &[Bytes], read_only: bool) -> Value {
        match Command::parse(args) {
            // Redis words an arity error from a script its own way.
            Err(e) if e.starts_with("ERR wrong number of arguments") => {
                Value::error("ERR Wrong number of args calling Redis command from script")
            }
            Ok(Some(Command::Write(
                Write::Exec { .. }
                | Write::Script(_)
                | Write::ScriptLoad(_)
                | Write::ScriptFlush
                | Write::KeyspaceEvents(_),
            ))) => Value::error("ERR This Redis command is not allowed from script"),
            Ok(Some(Command::Write(_) | Command::Blocking(_))) if read_only => {
                Value::error("ERR Write commands are not allowed from read-only scripts.")
            }
            Ok(Some(Command::Write(write))) => self.execute_write(index, write),
            Ok(Some(Command::Read(read))) => self.read_now(&read),
            Ok(Some(Command::Blocking(blocking))) => self.attempt_once(index, &blocking),
            Err(e) => Value::error(e),
            Ok(None) if args[0].eq_ignore_ascii_case(b"ping") => Value::Simple("PONG".into()),
            Ok(None) => Value::error("ERR Unknown Redis command called from script"),
        }
    }

    /// SCRIPT LOAD: compiles the script (refusing one that does not compile) and keeps it.
    pub(super) fn load_script(&mut self, index: u64, text: &Bytes) -> Value {
        let lua = new_vm().unwrap_or_else(|e| panic!("cannot start a Lua VM: {e}"));
        if let Err(e) = compile(&lua, text) {
            return e;
        }
        let sha = script_sha(text);
        self.keep_script(index, &sha, text);
        Value::bulk(sha)
    }

    /// SCRIPT FLUSH: forgets every script.
    pub(super) fn flush_scripts(&mut self, index: u64) -> Value {
        for key in self.store.group_keys(&[SCRIPT_TAG]) {
            self.store.write(index, key, None);
        }
        Value::ok()
    }

    /// SCRIPT EXISTS: whether each script is known.
    pub(super) fn scripts_exist(&self, shas: &[Bytes]) -> Value {
        let known = |sha: &Bytes| self.store.contains(&script_key(&String::from_utf8_lossy(sha)));
        Value::array(shas.iter().map(|sha| Value::Integer(i64::from(known(sha)))).collect())
    }
}

/// Whether a reply says the script did not compile (such a script is not kept).
fn is_compile_error(reply: &Value) -> bool {
    matches!(reply, Value::Error(e) if e.starts_with("ERR Error compiling script"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lua_number_becomes_the_integer_redis_makes_of_it() {
        assert_eq!(lua_number_as_integer(3.99), 3);
        assert_eq!(lua_number_as_integer(-3.99), -3);
        // 2^63 - 1 is no double: it rounds to 2^63, which no i64 holds.
        assert_eq!(lua_number_as_integer(9_223_372_036_854_775_807.0), i64::MIN);
        assert_eq!(lua_number_as_integer(-9_223_372_036_854_775_808.0), i64::MIN);
        assert_eq!(lua_number_as_integer(f64::NAN), i64::MIN);
        assert_eq!(lua_number_as_integer(1e300), i64::MIN);
    }
}
