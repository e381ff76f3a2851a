//! Lua scripting commands: EVAL, EVALSHA and their read-only forms, SCRIPT, and Redis 7's
//! functions (FCALL, FCALL_RO, FUNCTION), checked as Redis 7.0 checks them.

use bytes::Bytes;

use super::{parse_i64, subcommand, wrong_arity, Command, CommandError, Read, Write};
use crate::dump;

/// A script call: the script (its text, or the SHA-1 of one the state holds), the keys it
/// declares and its other arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall {
    pub script: ScriptRef,
    pub keys: Vec<Bytes>,
    pub args: Vec<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptRef {
    /// EVAL's script text.
    Text(Bytes),
    /// EVALSHA's SHA-1, in lowercase hex.
    Sha(Bytes),
    /// FCALL's function. Redis checks FCALL's numkeys only once it has found the function, so
    /// a refused numkeys travels with the call (`keys` and `args` are then empty).
    Function {
        name: Bytes,
        numkeys_error: Option<CommandError>,
    },
}

/// FUNCTION's writes: each changes the libraries every replica holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FunctionWrite {
    /// FUNCTION LOAD [REPLACE] code.
    Load { code: Bytes, replace: bool },
    /// FUNCTION DELETE library.
    Delete(Bytes),
    /// FUNCTION FLUSH [ASYNC|SYNC].
    Flush,
    /// FUNCTION RESTORE: the libraries' code, read from the payload, and what to do with the
    /// libraries there are.
    Restore {
        libraries: Vec<Bytes>,
        policy: RestorePolicy,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestorePolicy {
    /// Drop every library first.
    Flush,
    /// Add the libraries; refuse all of them if one's name is taken.
    Append,
    /// Add the libraries, replacing those of the same name.
    Replace,
}

/// FUNCTION's reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FunctionRead {
    /// FUNCTION LIST [LIBRARYNAME pattern] [WITHCODE].
    List {
        pattern: Option<Bytes>,
        with_code: bool,
    },
    Stats,
    /// FUNCTION DUMP: every library in a payload FUNCTION RESTORE (Chorus's or Redis's) takes.
    Dump,
}

const FUNCTION_HELP: &[&str] = &[
    "FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "LOAD [REPLACE] <FUNCTION CODE>",
    "    Create a new library with the given library name and code.",
    "DELETE <LIBRARY NAME>",
    "    Delete the given library.",
    "LIST [LIBRARYNAME PATTERN] [WITHCODE]",
    "    Return general information on all the libraries:",
    "    * Library name",
    "    * The engine used to run the Library",
    "    * Library description",
    "    * Functions list",
    "    * Library code (if WITHCODE is given)",
    "    It also possible to get only function that matches a pattern using LIBRARYNAME argument.",
    "STATS",
    "    Return information about the current function running:",
    "    * Function name",
    "    * Command used to run the function",
    "    * Duration in MS that the function is running",
    "    If no function is running, return nil",
    "    In addition, returns a list of available engines.",
    "KILL",
    "    Kill the current running function.",
    "FLUSH [ASYNC|SYNC]",
    "    Delete all the libraries.",
    "    When called without the optional mode argument, the behavior is determined by the",
    "    lazyfree-lazy-user-flush configuration directive. Valid modes are:",
    "    * ASYNC: Asynchronously flush the libraries.",
    "    * SYNC: Synchronously flush the libraries.",
    "DUMP",
    "    Return a serialized payload representing the current libraries, can be restored using FUNCTION RESTORE command",
    "RESTORE <PAYLOAD> [FLUSH|APPEND|REPLACE]",
    "    Restore the libraries represented by the given payload, it is possible to give a restore policy to",
    "    control how to handle existing libraries (default APPEND):",
    "    * FLUSH: delete all existing libraries.",
    "    * APPEND: appends the restored libraries to the existing libraries. On collision, abort.",
    "    * REPLACE: appends the restored libraries to the existing libraries, On collision, replace the old",
    "      libraries with the new libraries (notice that even on this option there is a chance of failure",
    "      in case of functions name collision with another library).",
    "HELP",
    "    Prints this help.",
];

/// EVAL's and EVALSHA's arguments after the script: numkeys, the keys, the arguments.
fn call(script: ScriptRef, rest: &[Bytes]) -> Result<ScriptCall, CommandError> {
    let (keys, args) = split_keys(parse_i64(&rest[0])?, &rest[1..])?;
    Ok(ScriptCall { script, keys, args })
}

/// The first `numkeys` of `rest` are keys, the others arguments.
fn split_keys(numkeys: i64, rest: &[Bytes]) -> Result<(Vec<Bytes>, Vec<Bytes>), CommandError> {
    if numkeys < 0 {
        return Err("ERR Number of keys can't be negative".into());
    }
    let numkeys = usize::try_from(numkeys).unwrap_or(usize::MAX);
    if numkeys > rest.len() {
        return Err("ERR Number of keys can't be greater than number of args".into());
    }
    Ok((rest[..numkeys].to_vec(), rest[numkeys..].to_vec()))
}

/// FCALL's and FCALL_RO's arguments: the function, numkeys, the keys, the arguments.
fn function_call(rest: &[Bytes]) -> ScriptCall {
    let split = parse_i64(&rest[1])
        .map_err(|_| CommandError::from("ERR Bad number of keys provided"))
        .and_then(|numkeys| split_keys(numkeys, &rest[2..]));
    let ((keys, args), numkeys_error) = match split {
        Ok(split) => (split, None),
        Err(e) => ((Vec::new(), Vec::new()), Some(e)),
    };
    ScriptCall {
        script: ScriptRef::Function {
            name: rest[0].clone(),
            numkeys_error,
        },
        keys,
        args,
    }
}

/// Redis's error for a container's subcommand given the wrong arguments, naming it as given.
fn subcommand_syntax_error(given: &Bytes) -> CommandError {
    format!(
        "ERR unknown subcommand or wrong number of arguments for '{}'. Try FUNCTION HELP.",
        String::from_utf8_lossy(given)
    )
}

fn function(rest: &[Bytes]) -> Result<Command, CommandError> {
    let sub = subcommand(
        "function",
        rest,
        &[
            ("delete", 3),
            ("dump", 2),
            ("flush", -2),
            ("help", 2),
            ("kill", 2),
            ("list", -2),
            ("load", -3),
            ("restore", -3),
            ("stats", 2),
        ],
    )?;
    let is = |arg: &Bytes, word: &str| arg.eq_ignore_ascii_case(word.as_bytes());
    Ok(match sub {
        "load" => {
            let (code, options) = rest[1..].split_last().expect("LOAD has at least one argument");
            let mut replace = false;
            for option in options {
                if !is(option, "replace") {
                    return Err(format!("ERR Unknown option given: {}", String::from_utf8_lossy(option)));
                }
                replace = true;
            }
            Command::Write(Write::Functions(FunctionWrite::Load {
                code: code.clone(),
                replace,
            }))
        }
        "delete" => Command::Write(Write::Functions(FunctionWrite::Delete(rest[1].clone()))),
        "flush" => match &rest[1..] {
            [] => Command::Write(Write::Functions(FunctionWrite::Flush)),
            [mode] if is(mode, "sync") || is(mode, "async") => Command::Write(Write::Functions(FunctionWrite::Flush)),
            [_] => return Err("ERR FUNCTION FLUSH only supports SYNC|ASYNC option".into()),
            _ => return Err(subcommand_syntax_error(&rest[0])),
        },
        "restore" => {
            let policy = match &rest[2..] {
                [] => RestorePolicy::Append,
                [policy] if is(policy, "append") => RestorePolicy::Append,
                [policy] if is(policy, "replace") => RestorePolicy::Replace,
                [policy] if is(policy, "flush") => RestorePolicy::Flush,
                [_] => {
                    return Err(
                        "ERR Wrong restore policy given, value should be either FLUSH, APPEND or REPLACE.".into(),
                    )
                }
                _ => return Err(subcommand_syntax_error(&rest[0])),
            };
            let libraries = dump::decode_libraries(&rest[1]).map_err(CommandError::from)?;
            Command::Write(Write::Functions(FunctionWrite::Restore { libraries, policy }))
        }
        "list" => {
            let (mut pattern, mut with_code) = (None, false);
            let mut args = rest[1..].iter();
            while let Some(arg) = args.next() {
                if !with_code && is(arg, "withcode") {
                    with_code = true;
                } else if pattern.is_none() && is(arg, "libraryname") {
                    let given = args.next().ok_or("ERR library name argument was not given")?;
                    pattern = Some(given.clone());
                } else {
                    return Err(format!("ERR Unknown argument {}", String::from_utf8_lossy(arg)));
                }
            }
            Command::Read(Read::Functions(FunctionRead::List { pattern, with_code }))
        }
        "stats" => Command::Read(Read::Functions(FunctionRead::Stats)),
        "dump" => Command::Read(Read::Functions(FunctionRead::Dump)),
        // No function runs while a command is answered: the state applies one entry at a time.
        "kill" => return Err("NOTBUSY No scripts in execution right now.".into()),
        _ => Command::Read(Read::Help(FUNCTION_HELP)),
    })
}

/// The SHA-1 of a script, as Redis names scripts: 40 lowercase hex digits.
pub fn script_sha(script: &[u8]) -> String {
    sha1_smol::Sha1::from(script).digest().to_string()
}

/// A scripting command, if `name` is one.
pub(super) fn parse(name: &str, rest: &[Bytes]) -> Option<Result<Command, CommandError>> {
    let at_least = |n: usize| {
        if rest.len() >= n {
            Ok(())
        } else {
            Err(wrong_arity(name))
        }
    };
    let parsed = (|| {
        Ok(match name {
            "eval" | "evalsha" | "eval_ro" | "evalsha_ro" => {
                at_least(2)?;
                let script = if name.starts_with("evalsha") {
                    ScriptRef::Sha(Bytes::from(rest[0].to_ascii_lowercase()))
                } else {
                    ScriptRef::Text(rest[0].clone())
                };
                let call = call(script, &rest[1..])?;
                if name.ends_with("_ro") {
                    Command::Read(Read::Script(call))
                } else {
                    Command::Write(Write::Script(call))
                }
            }
            "fcall" | "fcall_ro" => {
                at_least(2)?;
                let call = function_call(rest);
                if name == "fcall_ro" {
                    Command::Read(Read::Script(call))
                } else {
                    Command::Write(Write::Script(call))
                }
            }
            "function" => {
                at_least(1)?;
                function(rest)?
            }
            "script" => {
                at_least(1)?;
                let sub = rest[0].to_ascii_lowercase();
                let usage = || {
                    CommandError::from(format!(
                        "ERR unknown subcommand or wrong number of arguments for '{}'. Try SCRIPT HELP.",
                        String::from_utf8_lossy(&rest[0])
                    ))
                };
                match (sub.as_slice(), rest.len()) {
                    (b"load", 2) => Command::Write(Write::ScriptLoad(rest[1].clone())),
                    (b"exists", n) if n >= 2 => Command::Read(Read::ScriptExists(
                        rest[1..]
                            .iter()
                            .map(|sha| Bytes::from(sha.to_ascii_lowercase()))
                            .collect(),
                    )),
                    (b"flush", 1) => Command::Write(Write::ScriptFlush),
                    (b"flush", 2) if [&b"async"[..], b"sync"].contains(&rest[1].to_ascii_lowercase().as_slice()) => {
                        Command::Write(Write::ScriptFlush)
                    }
                    (b"flush", 2) => return Err("ERR SCRIPT FLUSH only support SYNC|ASYNC option".into()),
                    (b"kill", 1) => return Err("NOTBUSY No scripts in execution right now.".into()),
                    _ => return Err(usage()),
                }
            }
            _ => return Ok(None),
        }
        .into())
    })();
    parsed.transpose()
}
