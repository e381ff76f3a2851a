//! Lua scripting commands: EVAL, EVALSHA and their read-only forms, and SCRIPT, checked as
//! Redis 7.0 checks them.

use bytes::Bytes;

use super::{parse_i64, wrong_arity, Command, CommandError, Read, Write};

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
}

/// EVAL's and EVALSHA's arguments after the script: numkeys, the keys, the arguments.
fn call(script: ScriptRef, rest: &[Bytes]) -> Result<ScriptCall, CommandError> {
    let numkeys = parse_i64(&rest[0])?;
    if numkeys < 0 {
        return Err("ERR Number of keys can't be negative".into());
    }
    let numkeys = usize::try_from(numkeys).unwrap_or(usize::MAX);
    if numkeys > rest.len() - 1 {
        return Err("ERR Number of keys can't be greater than number of args".into());
    }
    Ok(ScriptCall {
        script,
        keys: rest[1..1 + numkeys].to_vec(),
        args: rest[1 + numkeys..].to_vec(),
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
