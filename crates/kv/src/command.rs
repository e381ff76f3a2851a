//! Key-value commands: parsing client arguments into typed commands (with Redis-compatible error
//! messages), and the log encoding of a write (its argument list, length-prefixed).

use bytes::Bytes;
use chorus_curp::rifl::{Envelope, ENVELOPE_BYTES};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetCondition {
    Always,
    IfAbsent,
    IfPresent,
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
    },
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

impl Write {
    /// The keys the write touches. Two writes on disjoint keys commute: applied in either order
    /// they leave the same state and give the same replies (CURP's witnesses rely on it).
    pub fn keys(&self) -> Vec<Bytes> {
        match self {
            Write::Set { key, .. }
            | Write::IncrBy { key, .. }
            | Write::Append { key, .. }
            | Write::HSet { key, .. }
            | Write::HDel { key, .. } => vec![key.clone()],
            Write::Del(keys) => keys.clone(),
            Write::MSet(pairs) => pairs.iter().map(|(k, _)| k.clone()).collect(),
        }
    }
}

/// A command that only reads state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Get(Bytes),
    MGet(Vec<Bytes>),
    Exists(Vec<Bytes>),
    StrLen(Bytes),
    Type(Bytes),
    HGet { key: Bytes, field: Bytes },
    HMGet { key: Bytes, fields: Vec<Bytes> },
    HGetAll(Bytes),
    HKeys(Bytes),
    HVals(Bytes),
    HStrLen { key: Bytes, field: Bytes },
    HLen(Bytes),
    HExists { key: Bytes, field: Bytes },
    DbSize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Write(Write),
    Read(Read),
}

/// A Redis-style error message (without the leading '-').
pub type CommandError = String;

fn wrong_arity(name: &str) -> CommandError {
    format!("ERR wrong number of arguments for '{name}' command")
}

pub fn syntax_error() -> CommandError {
    "ERR syntax error".into()
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
pub const MAX_COMMAND_NAME_BYTES: usize = 16;

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
        let exact = |n: usize| {
            if rest.len() == n {
                Ok(())
            } else {
                Err(wrong_arity(name))
            }
        };
        let at_least = |n: usize| {
            if rest.len() >= n {
                Ok(())
            } else {
                Err(wrong_arity(name))
            }
        };
        let cmd = match name {
            "get" => {
                exact(1)?;
                Command::Read(Read::Get(rest[0].clone()))
            }
            "set" => {
                at_least(2)?;
                let mut condition = SetCondition::Always;
                for opt in &rest[2..] {
                    match opt.to_ascii_uppercase().as_slice() {
                        b"NX" if condition == SetCondition::Always => condition = SetCondition::IfAbsent,
                        b"XX" if condition == SetCondition::Always => condition = SetCondition::IfPresent,
                        b"EX" | b"PX" | b"EXAT" | b"PXAT" | b"KEEPTTL" => {
                            return Err("ERR key expiry (EX/PX/EXAT/PXAT/KEEPTTL) is not supported by Chorus".into())
                        }
                        b"GET" => return Err("ERR SET ... GET is not supported by Chorus".into()),
                        _ => return Err(syntax_error()),
                    }
                }
                Command::Write(Write::Set {
                    key: rest[0].clone(),
                    value: rest[1].clone(),
                    condition,
                    reply_as_int: false,
                })
            }
            "setnx" => {
                exact(2)?;
                Command::Write(Write::Set {
                    key: rest[0].clone(),
                    value: rest[1].clone(),
                    condition: SetCondition::IfAbsent,
                    reply_as_int: true,
                })
            }
            "del" | "unlink" => {
                at_least(1)?;
                Command::Write(Write::Del(rest.to_vec()))
            }
            "exists" => {
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
            _ => return Ok(None),
        };
        Ok(Some(cmd))
    }
}

pub(crate) const ARGS_VERSION: u8 = 1;
/// A write with its RIFL envelope: `[2][envelope]` then the argument list as in version 1.
pub(crate) const ENVELOPE_VERSION: u8 = 2;
/// Control commands. RIFL's leases: `[3][1]` registers an incarnation; `[3][2][incarnation u64]
/// [forgotten_below u64]` renews one. CURP: `[3][3][term u64]` ends the recovery of the leader
/// of `term`.
const CONTROL_VERSION: u8 = 3;
const REGISTER: u8 = 1;
const RENEW: u8 = 2;
const CURP_RECOVERED: u8 = 3;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<Bytes> {
        s.split(' ').map(|p| Bytes::copy_from_slice(p.as_bytes())).collect()
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
                reply_as_int: false
            }))
        );
        assert_eq!(
            Command::parse(&args("get")).unwrap_err(),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(Command::parse(&args("SET k v NX XX")).unwrap_err(), "ERR syntax error");
        assert!(Command::parse(&args("SET k v EX 10")).is_err());
        assert!(Command::parse(&args("INCRBY k nope")).is_err());
        assert!(Command::parse(&args("MSET a 1 b")).is_err());
        assert!(Command::parse(&args("DECRBY k -9223372036854775808")).is_err());
        assert_eq!(Command::parse(&args("FLUSHALL")).unwrap(), None);
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
        for whole in [encoded, renew, recovered] {
            for cut in 0..whole.len() {
                assert!(decode_logged(&whole[..cut]).is_err(), "cut at {cut}");
            }
        }
    }
}
