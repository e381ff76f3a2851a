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
//!
//! Redis 7's functions (FCALL) run the same way: a VM of their own, in which the library's code
//! runs first, as FUNCTION LOAD ran it, to register its functions; `functions.rs` keeps the
//! libraries.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chorus_resp::{format_double, format_human_double, Value};
use mlua::{Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LuaValue, VmState};

use super::{KvState, SCRIPT_TAG};
use crate::command::{script_sha, table, Command, ScriptCall, ScriptRef};

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

/// The chunk an EVAL script is compiled as, which its errors name.
const SCRIPT_CHUNK: &str = "user_script";
/// The chunk a function library is compiled as.
const FUNCTION_CHUNK: &str = "user_function";

/// What a call runs: an EVAL script (named in errors by its SHA-1), or a function (named by its
/// name) of a library, whose code includes its metadata line.
#[derive(Clone, Copy)]
pub(super) enum Program<'a> {
    Script { sha: &'a str, text: &'a [u8] },
    Function { name: &'a str, library: &'a [u8] },
}

impl Program<'_> {
    fn chunk(&self) -> &'static str {
        match self {
            Program::Script { .. } => SCRIPT_CHUNK,
            Program::Function { .. } => FUNCTION_CHUNK,
        }
    }

    fn label(&self) -> &str {
        match self {
            Program::Script { sha, .. } => sha,
            Program::Function { name, .. } => name,
        }
    }
}

/// The flags `redis.register_function` takes, in the order FUNCTION LIST gives them; a
/// function's flags are a bit set over this list.
const FUNCTION_FLAGS: [&str; 5] = [
    "no-writes",
    "allow-oom",
    "allow-stale",
    "no-cluster",
    "allow-cross-slot-keys",
];
const NO_WRITES: u8 = 1;

/// A function a library registers when its code runs.
pub(super) struct FunctionInfo {
    pub name: Bytes,
    pub description: Option<Bytes>,
    pub flags: u8,
}

impl FunctionInfo {
    pub fn flag_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        FUNCTION_FLAGS
            .iter()
            .enumerate()
            .filter(|(bit, _)| self.flags & (1 << bit) != 0)
            .map(|(_, name)| *name)
    }
}

/// A library's function names, descriptions and flags, from running its code (`body`: the code
/// after the metadata line) in a VM of its own; the error is Redis's reply for a library that
/// does not compile or whose code fails.
pub(super) fn library_functions(body: &[u8]) -> Result<Vec<FunctionInfo>, Value> {
    let lua = new_vm().unwrap_or_else(|e| panic!("cannot start a Lua VM: {e}"));
    let registered = register_library(&lua, body).unwrap_or_else(|e| panic!("cannot set up a Lua VM: {e}"))?;
    Ok(registered.into_iter().map(|(info, _)| info).collect())
}

/// What a library registered: each function, with its callback.
type Registered = Vec<(FunctionInfo, Function)>;

/// Runs a library's code (`body`) as FUNCTION LOAD does: its globals are only `redis`, with
/// `register_function`, `log` and the log levels. Returns what it registered. The callbacks
/// read their globals through the library's environment, which reads the VM's globals once
/// loading is over.
fn register_library(lua: &Lua, body: &[u8]) -> mlua::Result<Result<Registered, Value>> {
    let registered = Arc::new(Mutex::new(Registered::new()));
    let loading = Arc::new(AtomicBool::new(true));
    let load_redis = lua.create_table()?;
    let (into, still_loading) = (registered.clone(), loading.clone());
    load_redis.raw_set(
        "register_function",
        lua.create_function(move |_, args: MultiValue| {
            if !still_loading.load(Ordering::Relaxed) {
                return Err(registration_error(
                    "redis.register_function can only be called on FUNCTION LOAD command",
                ));
            }
            let (info, callback) = registration(args)?;
            let mut into = into.lock().expect("one VM runs on one thread");
            if !is_function_name(&info.name) {
                return Err(registration_error(INVALID_NAME));
            }
            if into.iter().any(|(known, _)| known.name == info.name) {
                return Err(registration_error("Function already exists in the library"));
            }
            into.push((info, callback));
            Ok(())
        })?,
    )?;
    redis_log(lua, &load_redis)?;
    load_redis.set_metatable(Some(readonly_guard(lua, FUNCTION_CHUNK)?))?;
    let load_api = lua.create_table()?;
    load_api.raw_set("redis", load_redis)?;
    load_api.set_metatable(Some(readonly_guard(lua, FUNCTION_CHUNK)?))?;
    let environment = lua.create_table()?;
    let reads_through = readonly_guard(lua, FUNCTION_CHUNK)?;
    reads_through.raw_set("__index", load_api)?;
    environment.set_metatable(Some(reads_through.clone()))?;
    let code = lua
        .load(body)
        .set_name(format!("@{FUNCTION_CHUNK}"))
        .set_environment(environment)
        .into_function();
    let code = match code {
        Ok(code) => code,
        Err(e) => {
            return Ok(Err(Value::error(format!(
                "ERR Error compiling function: {}",
                compile_error_message(e)
            ))))
        }
    };
    if let Err(e) = code.call::<()>(()) {
        return Ok(Err(Value::error(format!(
            "ERR Error registering functions: {}",
            error_message(&e)
        ))));
    }
    loading.store(false, Ordering::Relaxed);
    reads_through.raw_set("__index", lua.globals())?;
    let registered = std::mem::take(&mut *registered.lock().expect("one VM runs on one thread"));
    Ok(Ok(registered))
}

/// What Redis says of a function or library name that is not letters, digits and underscores.
pub(super) const INVALID_NAME: &str =
    "Library names can only contain letters, numbers, or underscores(_) and must be at least one character long";

/// Whether `name` may name a library or a function: letters, digits and underscores, at least one.
pub(super) fn is_function_name(name: &[u8]) -> bool {
    !name.is_empty() && name.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

fn registration_error(message: &str) -> mlua::Error {
    mlua::Error::external(ScriptError(format!("ERR {message}")))
}

/// A string argument as Lua's `lua_isstring` takes one: a string, or a number as text.
fn lua_text(value: &LuaValue) -> Option<Bytes> {
    match value {
        LuaValue::String(s) => Some(Bytes::copy_from_slice(&s.as_bytes())),
        LuaValue::Integer(_) | LuaValue::Number(_) => value.to_string().ok().map(Bytes::from),
        _ => None,
    }
}

/// `redis.register_function`'s arguments, as Redis reads them: a name and a callback, or one
/// table of named arguments (`function_name`, `callback`, `description`, `flags`).
fn registration(args: MultiValue) -> mlua::Result<(FunctionInfo, Function)> {
    let args: Vec<LuaValue> = args.into_iter().collect();
    match args.as_slice() {
        [name, callback] => {
            let name = lua_text(name).ok_or_else(|| {
                registration_error("first argument to redis.register_function must be a string")
            })?;
            let LuaValue::Function(callback) = callback else {
                return Err(registration_error(
                    "second argument to redis.register_function must be a function",
                ));
            };
            let info = FunctionInfo {
                name,
                description: None,
                flags: 0,
            };
            Ok((info, callback.clone()))
        }
        [LuaValue::Table(named)] => {
            let (mut name, mut description, mut callback, mut flags) = (None, None, None, 0);
            for pair in named.clone().pairs::<LuaValue, LuaValue>() {
                let (key, value) = pair?;
                let key = lua_text(&key).ok_or_else(|| {
                    registration_error("named argument key given to redis.register_function is not a string")
                })?;
                match key.to_ascii_lowercase().as_slice() {
                    b"function_name" => {
                        name = Some(lua_text(&value).ok_or_else(|| {
                            registration_error("function_name argument given to redis.register_function must be a string")
                        })?);
                    }
                    b"description" => {
                        description = Some(lua_text(&value).ok_or_else(|| {
                            registration_error("description argument given to redis.register_function must be a string")
                        })?);
                    }
                    b"callback" => match value {
                        LuaValue::Function(f) => callback = Some(f),
                        _ => {
                            return Err(registration_error(
                                "callback argument given to redis.register_function must be a function",
                            ))
                        }
                    },
                    b"flags" => {
                        let LuaValue::Table(given) = value else {
                            return Err(registration_error(
                                "flags argument to redis.register_function must be a table representing function flags",
                            ));
                        };
                        flags = function_flags(&given)?;
                    }
                    _ => return Err(registration_error("unknown argument given to redis.register_function")),
                }
            }
            let name =
                name.ok_or_else(|| registration_error("redis.register_function must get a function name argument"))?;
            let callback =
                callback.ok_or_else(|| registration_error("redis.register_function must get a callback argument"))?;
            Ok((
                FunctionInfo {
                    name,
                    description,
                    flags,
                },
                callback,
            ))
        }
        [_] => Err(registration_error(
            "calling redis.register_function with a single argument is only applicable to Lua table (representing named arguments).",
        )),
        _ => Err(registration_error("wrong number of arguments to redis.register_function")),
    }
}

/// A `flags` table's bit set: its items from the first up to the first nil, each a known flag
/// (in any case).
fn function_flags(given: &Table) -> mlua::Result<u8> {
    let mut flags = 0;
    for i in 1.. {
        let item: LuaValue = given.raw_get(i)?;
        if item == LuaValue::Nil {
            break;
        }
        let bit = lua_text(&item)
            .and_then(|flag| {
                FUNCTION_FLAGS
                    .iter()
                    .position(|known| flag.eq_ignore_ascii_case(known.as_bytes()))
            })
            .ok_or_else(|| registration_error("unknown flag given"))?;
        flags |= 1 << bit;
    }
    Ok(flags)
}

/// A guard for a table that may not be written to, and whose missing names are errors, as
/// Redis words them.
fn readonly_guard(lua: &Lua, chunk: &'static str) -> mlua::Result<Table> {
    let guard = lua.create_table()?;
    guard.raw_set(
        "__newindex",
        lua.create_function(move |lua, _: MultiValue| -> mlua::Result<()> {
            Err(script_runtime_error(lua, chunk, "Attempt to modify a readonly table"))
        })?,
    )?;
    guard.raw_set(
        "__index",
        lua.create_function(move |lua, (_, name): (LuaValue, LuaValue)| -> mlua::Result<()> {
            let name = lua
                .coerce_string(name)?
                .map(|s| s.to_string_lossy())
                .unwrap_or_default();
            let message = format!("Script attempted to access nonexistent global variable '{name}'");
            Err(script_runtime_error(lua, chunk, &message))
        })?,
    )?;
    Ok(guard)
}

/// Sets a call's globals: only what a script may use, then `redis` and (for an EVAL script,
/// not a function) KEYS and ARGV, behind a guard against creating globals or reading undefined
/// ones.
fn set_globals(lua: &Lua, keys_and_args: Option<&ScriptCall>, redis: Table, chunk: &'static str) -> mlua::Result<()> {
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
    if let Some(call) = keys_and_args {
        globals.raw_set("KEYS", lua.create_sequence_from(strings(&call.keys)?)?)?;
        globals.raw_set("ARGV", lua.create_sequence_from(strings(&call.args)?)?)?;
    }
    globals.raw_set("redis", redis)?;
    globals.set_metatable(Some(readonly_guard(lua, chunk)?))?;
    Ok(())
}

/// An error raised in a script as Lua's `error(message, 2)` would raise it: with the place in
/// the script (compiled as `chunk`) it comes from.
fn script_runtime_error(lua: &Lua, chunk: &str, message: &str) -> mlua::Error {
    match lua.inspect_stack(1, |debug| debug.current_line()).flatten() {
        Some(line) => mlua::Error::RuntimeError(format!("{chunk}:{line}: {message}")),
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
    redis_log(lua, redis)
}

/// `redis.log` (which logs nothing: a replica's log is no place for a script's chatter) and the
/// log levels.
fn redis_log(lua: &Lua, redis: &Table) -> mlua::Result<()> {
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
    lua.load(text)
        .set_name(format!("@{SCRIPT_CHUNK}"))
        .into_function()
        .map_err(|e| {
            Value::error(format!(
                "ERR Error compiling script (new function): {}",
                compile_error_message(e)
            ))
        })
}

/// Lua's message for code that does not compile.
fn compile_error_message(error: mlua::Error) -> String {
    match error {
        mlua::Error::SyntaxError { message, .. } => message,
        other => other.to_string(),
    }
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
        Value::Push(items) | Value::Replies(items) | Value::Set(items) => to_lua(lua, Value::array(items))?,
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

/// The reply for a script or function that failed: its error as Redis 7.0 words it.
fn failure_reply(error: &mlua::Error, program: Program) -> Value {
    match error {
        mlua::Error::CallbackError { cause, .. } => failure_reply(cause, program),
        mlua::Error::WithContext { cause, .. } => failure_reply(cause, program),
        mlua::Error::RuntimeError(message) => {
            // Lua's own message, without the traceback mlua appends.
            let message = message.split("\nstack traceback:").next().unwrap_or_default();
            let chunk = program.chunk();
            let line = message
                .strip_prefix(chunk)
                .and_then(|rest| rest.strip_prefix(':'))
                .and_then(|rest| rest.split(':').next())
                .and_then(|line| line.parse::<u64>().ok());
            let place = line.map_or(String::new(), |line| format!(", on @{chunk}:{line}"));
            Value::error(format!("ERR {message} script: {}{place}.", program.label()))
        }
        other => Value::error(error_message(other)),
    }
}

/// A Lua error as one line of Redis's reply: a command's or a limit's error as it is, Lua's own
/// (a string) after `ERR`.
fn error_message(error: &mlua::Error) -> String {
    match error {
        mlua::Error::CallbackError { cause, .. } | mlua::Error::WithContext { cause, .. } => error_message(cause),
        mlua::Error::ExternalError(_) => match error.downcast_ref::<ScriptError>() {
            Some(ScriptError(message)) => message.clone(),
            None => format!("ERR {error}"),
        },
        mlua::Error::MemoryError(_) => "ERR script ran out of memory".to_string(),
        mlua::Error::RuntimeError(message) => {
            format!("ERR {}", message.split("\nstack traceback:").next().unwrap_or_default())
        }
        other => format!("ERR {other}"),
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
            ScriptRef::Function { name, numkeys_error } => {
                let Some(library) = self.function_library_code(name) else {
                    return Value::error("ERR Function not found");
                };
                if let Some(e) = numkeys_error {
                    return Value::error(e.clone());
                }
                let name = String::from_utf8_lossy(name);
                let program = Program::Function {
                    name: &name,
                    library: &library,
                };
                return self.run_in_new_vm(index, call, program, read_only);
            }
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
        let reply = self.run_in_new_vm(index, call, Program::Script { sha: &sha, text: &text }, read_only);
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

    /// Runs `program` in a VM of its own: an EVAL script, or a library's code and then the
    /// function it registered under the called name. A function without the `no-writes` flag
    /// is refused by FCALL_RO (`read_only`); one with it may not write even through FCALL.
    fn run_in_new_vm(&mut self, index: u64, call: &ScriptCall, program: Program, read_only: bool) -> Value {
        let lua = new_vm().unwrap_or_else(|e| panic!("cannot start a Lua VM: {e}"));
        let script = match program {
            Program::Script { text, .. } => match compile(&lua, text) {
                Ok(function) => Some(function),
                Err(e) => return e,
            },
            Program::Function { .. } => None,
        };
        let chunk = program.chunk();
        let read_only = Cell::new(read_only);
        let state = RefCell::new(&mut *self);
        let run = |lua: &Lua, args: MultiValue, protected: bool| -> mlua::Result<LuaValue> {
            let args = args
                .into_iter()
                .map(|arg| Ok(lua.coerce_string(arg)?.map(|s| Bytes::copy_from_slice(&s.as_bytes()))))
                .collect::<mlua::Result<Option<Vec<Bytes>>>>()?;
            // An argument that is no string or number fails the call as a command's error does.
            let reply = match args {
                Some(args) => state.borrow_mut().script_command(index, &args, read_only.get()),
                None => Value::error("ERR Lua redis lib command arguments must be strings or integers"),
            };
            match reply {
                Value::Error(message) if !protected => {
                    let line = lua.inspect_stack(1, |debug| debug.current_line()).flatten();
                    let place = line.map_or(String::new(), |line| format!(", on @{chunk}:{line}"));
                    Err(mlua::Error::external(ScriptError(format!(
                        "{message} script: {}{place}.",
                        program.label()
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
            let Program::Function { name, library } = program else {
                set_globals(&lua, Some(call), redis, chunk)?;
                return Ok(Ok(script.expect("a script compiled").call::<LuaValue>(())?));
            };
            set_globals(&lua, None, redis, chunk)?;
            let body = super::functions::library_body(library);
            let registered = match register_library(&lua, body)? {
                Ok(registered) => registered,
                Err(reply) => return Ok(Err(reply)),
            };
            let Some((info, callback)) = registered.into_iter().find(|(info, _)| info.name == name.as_bytes()) else {
                return Ok(Err(Value::error("ERR Function not found")));
            };
            if info.flags & NO_WRITES == 0 && read_only.get() {
                return Ok(Err(Value::error(
                    "ERR Can not execute a script with write flag using *_ro command.",
                )));
            }
            read_only.set(read_only.get() || info.flags & NO_WRITES != 0);
            let strings = |items: &[Bytes]| {
                lua.create_sequence_from(
                    items
                        .iter()
                        .map(|i| lua.create_string(i))
                        .collect::<mlua::Result<Vec<_>>>()?,
                )
            };
            Ok(Ok(
                callback.call::<LuaValue>((strings(&call.keys)?, strings(&call.args)?))?
            ))
        });
        match result {
            Ok(Ok(value)) => from_lua(value),
            Ok(Err(reply)) => reply,
            Err(e) => failure_reply(&e, program),
        }
    }

    /// One `redis.call` of a script: a data command, run where the script runs. Checked as
    /// Redis checks it: a known command, its arity, one a script may call, then its arguments.
    fn script_command(&mut self, index: u64, args: &[Bytes], read_only: bool) -> Value {
        let name = String::from_utf8_lossy(&args[0]);
        let Some(spec) = table::find(&name) else {
            return Value::error("ERR Unknown Redis command called from script");
        };
        let given = args.len() as i64;
        if (spec.arity >= 0 && given != spec.arity) || given < -spec.arity {
            return Value::error("ERR Wrong number of args calling Redis command from script");
        }
        if spec.flags.contains(&"noscript") {
            return Value::error("ERR This Redis command is not allowed from script");
        }
        // Before its arguments are read.
        if read_only && spec.flags.contains(&"write") {
            return Value::error("ERR Write commands are not allowed from read-only scripts.");
        }
        match Command::parse(args) {
            // A subcommand's arity ('object|encoding'), which the table does not hold.
            Err(e) if e.starts_with("ERR wrong number of arguments") => {
                Value::error("ERR Wrong number of args calling Redis command from script")
            }
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
