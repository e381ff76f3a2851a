//! UniCache preprocessing of key-value commands as they sit in the log (argument lists).
//!
//! The command word, the key's template (the key with its digit runs taken out: `user:{}:name`)
//! and the remaining arguments (hash field names and values, string values) are cacheable; the
//! digit runs of the key (unique ids) are sent verbatim. Values under a configured key prefix can
//! be handed to another preprocessor (CSV records, SQL statements), e.g. `email:` keys holding
//! CSV email headers.

use std::sync::Arc;

use bytes::Bytes;
use chorus_unicache::{
    varint_part, CsvPreprocessor, Error, Fnv, OpaquePreprocessor, Part, PartReader, Preprocessor, SqlParams,
    SqlPreprocessor,
};

use chorus_curp::rifl::{ClientId, Envelope, ENVELOPE_BYTES};

use crate::command::{ARGS_VERSION, ENVELOPE_VERSION};

/// A preprocessor for the values stored under keys starting with `prefix`.
#[derive(Clone)]
pub struct Keyspace {
    pub prefix: Bytes,
    pub preprocessor: Arc<dyn Preprocessor>,
}

#[derive(Clone, Default)]
pub struct KvPreprocessor {
    keyspaces: Vec<Keyspace>,
}

/// Placeholder of a digit run inside a key template.
const ID: u8 = 0;
/// The first part of an encoded command says what it is: `MODE_OPAQUE`, `MODE_ENVELOPED` (a RIFL
/// envelope follows: the client id cacheable, since a connection sends many writes; the sequence
/// number and how far behind it the acknowledgement is as varints; then the arguments as in the
/// plain mode), or `MODE_ARGS + count` for a plain argument list.
const MODE_OPAQUE: u64 = 0;
const MODE_ENVELOPED: u64 = 1;
const MODE_ARGS: u64 = 2;

/// A logged write taken apart: its envelope, if any, and its arguments as slices of it; `None`
/// if it is neither kind of argument list.
fn split_command(command: &Bytes) -> Option<(Option<Envelope>, Vec<Bytes>)> {
    let (&version, rest) = command.split_first()?;
    match version {
        ARGS_VERSION => Some((None, split_args(command, 1)?)),
        ENVELOPE_VERSION => {
            let envelope = Envelope::decode(rest).ok()?;
            Some((Some(envelope), split_args(command, 1 + ENVELOPE_BYTES)?))
        }
        _ => None,
    }
}

/// The argument list at `start` in `command`, which it must fill exactly.
fn split_args(command: &Bytes, start: usize) -> Option<Vec<Bytes>> {
    let u32_at = |pos: usize| -> Option<usize> {
        let b = command.get(pos..pos + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = u32_at(start)?;
    let mut pos = start + 4;
    let mut args = Vec::with_capacity(count.min(command.len() / 4));
    for _ in 0..count {
        let len = u32_at(pos)?;
        let start = pos + 4;
        let end = start.checked_add(len).filter(|e| *e <= command.len())?;
        args.push(command.slice(start..end));
        pos = end;
    }
    (pos == command.len()).then_some(args)
}

/// (template, ids): digit runs become placeholders and are listed comma-separated. Keys without
/// digits, or with a placeholder byte of their own, are their own template with no ids.
fn key_template(key: &Bytes) -> (Bytes, Bytes) {
    if key.contains(&ID) || !key.iter().any(u8::is_ascii_digit) {
        return (key.clone(), Bytes::new());
    }
    let mut template = Vec::with_capacity(key.len());
    let mut ids = Vec::with_capacity(key.len());
    let mut in_run = false;
    for &b in key.iter() {
        if b.is_ascii_digit() {
            if !in_run {
                if !ids.is_empty() {
                    ids.push(b',');
                }
                template.push(ID);
                in_run = true;
            }
            ids.push(b);
        } else {
            template.push(b);
            in_run = false;
        }
    }
    (Bytes::from(template), Bytes::from(ids))
}

fn recreate_key(template: &[u8], ids: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    if ids.is_empty() {
        out.extend_from_slice(template);
        return Ok(());
    }
    let mut runs = ids.split(|b| *b == b',');
    for &b in template {
        if b == ID {
            out.extend_from_slice(runs.next().ok_or(Error::Malformed("fewer ids than placeholders"))?);
        } else {
            out.push(b);
        }
    }
    if runs.next().is_some() {
        return Err(Error::Malformed("more ids than placeholders"));
    }
    Ok(())
}

impl KvPreprocessor {
    pub fn new(keyspaces: Vec<Keyspace>) -> KvPreprocessor {
        KvPreprocessor { keyspaces }
    }

    /// The preprocessor for argument `position` of a command, when it is a value stored under a
    /// configured key prefix (SET/SETNX/APPEND values, HSET/HMSET field values).
    fn value_preprocessor(&self, word: &[u8], key: &[u8], position: usize) -> Option<&Arc<dyn Preprocessor>> {
        let keyspace = self.keyspaces.iter().find(|k| key.starts_with(&k.prefix))?;
        let is_value = if word.eq_ignore_ascii_case(b"set")
            || word.eq_ignore_ascii_case(b"setnx")
            || word.eq_ignore_ascii_case(b"append")
        {
            position == 2
        } else if word.eq_ignore_ascii_case(b"hset") || word.eq_ignore_ascii_case(b"hmset") {
            position >= 3 && (position - 3).is_multiple_of(2)
        } else {
            false
        };
        is_value.then_some(&keyspace.preprocessor)
    }
}

impl KvPreprocessor {
    fn preprocess_args(&self, args: &[Bytes], parts: &mut Vec<Part>) {
        for (i, arg) in args.iter().enumerate() {
            match i {
                0 => parts.push(Part::Cacheable(arg.clone())),
                1 => {
                    let (template, ids) = key_template(arg);
                    parts.push(Part::Cacheable(template));
                    parts.push(Part::Verbatim(ids));
                }
                _ => match self.value_preprocessor(&args[0], &args[1], i) {
                    Some(sub) => sub.preprocess(arg, parts),
                    None => parts.push(Part::Cacheable(arg.clone())),
                },
            }
        }
    }

    fn recreate_args(&self, count: u64, parts: &mut PartReader<'_>, out: &mut Vec<u8>) -> Result<(), Error> {
        let count = u32::try_from(count).map_err(|_| Error::Malformed("argument count"))?;
        out.extend_from_slice(&count.to_le_bytes());
        let mut word = Bytes::new();
        let mut key = Vec::new();
        let mut arg = Vec::new();
        for i in 0..count as usize {
            arg.clear();
            match i {
                0 => {
                    word = parts.next_part()?.clone();
                    arg.extend_from_slice(&word);
                }
                1 => {
                    let template = parts.next_part()?;
                    let ids = parts.next_part()?;
                    recreate_key(template, ids, &mut arg)?;
                    key = arg.clone();
                }
                _ => match self.value_preprocessor(&word, &key, i) {
                    Some(sub) => sub.recreate(parts, &mut arg)?,
                    None => arg.extend_from_slice(parts.next_part()?),
                },
            }
            let len = u32::try_from(arg.len()).map_err(|_| Error::Malformed("argument too long"))?;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&arg);
        }
        Ok(())
    }
}

impl Preprocessor for KvPreprocessor {
    fn preprocess(&self, command: &Bytes, parts: &mut Vec<Part>) {
        match split_command(command) {
            None => {
                parts.push(varint_part(MODE_OPAQUE));
                parts.push(Part::Verbatim(command.clone()));
            }
            Some((None, args)) => {
                parts.push(varint_part(MODE_ARGS + args.len() as u64));
                self.preprocess_args(&args, parts);
            }
            Some((Some(envelope), args)) => {
                parts.push(varint_part(MODE_ENVELOPED));
                // The envelope's first 16 bytes: incarnation and connection, as logged.
                parts.push(Part::Cacheable(command.slice(1..17)));
                parts.push(varint_part(envelope.seq));
                parts.push(varint_part(envelope.seq - envelope.first_unacked));
                parts.push(varint_part(args.len() as u64));
                self.preprocess_args(&args, parts);
            }
        }
    }

    fn recreate(&self, parts: &mut PartReader<'_>, out: &mut Vec<u8>) -> Result<(), Error> {
        match parts.next_varint()? {
            MODE_OPAQUE => {
                out.extend_from_slice(parts.next_part()?);
                Ok(())
            }
            MODE_ENVELOPED => {
                let client: [u8; 16] = parts
                    .next_part()?
                    .as_ref()
                    .try_into()
                    .map_err(|_| Error::Malformed("client id"))?;
                let seq = parts.next_varint()?;
                let behind = parts.next_varint()?;
                let envelope = Envelope {
                    client: ClientId {
                        incarnation: u64::from_le_bytes(client[..8].try_into().expect("eight bytes")),
                        connection: u64::from_le_bytes(client[8..].try_into().expect("eight bytes")),
                    },
                    seq,
                    first_unacked: seq.checked_sub(behind).ok_or(Error::Malformed("acknowledgement"))?,
                };
                out.push(ENVELOPE_VERSION);
                envelope.encode(out);
                let count = parts.next_varint()?;
                self.recreate_args(count, parts, out)
            }
            mode => {
                out.push(ARGS_VERSION);
                self.recreate_args(mode - MODE_ARGS, parts, out)
            }
        }
    }

    fn fingerprint(&self) -> u64 {
        let mut h = Fnv::new();
        h.write(b"kv+rifl");
        for k in &self.keyspaces {
            h.write(&k.prefix);
            h.write(&k.preprocessor.fingerprint().to_le_bytes());
        }
        h.finish()
    }
}

/// Parses keyspace rules: `PREFIX=KIND[:ARGS]` separated by `;`, with KIND `csv`, `sql` or
/// `opaque`. CSV takes its cacheable columns and optionally a column split into words:
/// `email:=csv:1,2,3:4` (columns from 0; column 4 split at spaces). SQL caches each statement's
/// template and its string literals.
pub fn parse_keyspaces(spec: &str) -> Result<Vec<Keyspace>, String> {
    let mut keyspaces = Vec::new();
    for rule in spec.split(';').map(str::trim).filter(|r| !r.is_empty()) {
        let (prefix, kind) = rule
            .split_once('=')
            .ok_or_else(|| format!("keyspace rule '{rule}' is not PREFIX=KIND[:ARGS]"))?;
        let mut words = kind.split(':');
        let preprocessor: Arc<dyn Preprocessor> = match words.next().unwrap_or("") {
            "opaque" => Arc::new(OpaquePreprocessor),
            "sql" => Arc::new(SqlPreprocessor {
                rules: Vec::new(),
                default: SqlParams::Strings,
            }),
            "csv" => {
                let columns = |text: &str| -> Result<Vec<usize>, String> {
                    text.split(',')
                        .filter(|c| !c.is_empty())
                        .map(|c| {
                            c.trim()
                                .parse()
                                .map_err(|_| format!("'{c}' in rule '{rule}' is not a column number"))
                        })
                        .collect()
                };
                let cacheable = columns(words.next().unwrap_or(""))?;
                let split: Vec<(usize, u8)> = columns(words.next().unwrap_or(""))?
                    .into_iter()
                    .map(|c| (c, b' '))
                    .collect();
                Arc::new(CsvPreprocessor::new(b',', &cacheable, &split))
            }
            other => {
                return Err(format!(
                    "unknown keyspace kind '{other}' in '{rule}'; use csv, sql or opaque"
                ))
            }
        };
        keyspaces.push(Keyspace {
            prefix: Bytes::from(prefix.to_string()),
            preprocessor,
        });
    }
    Ok(keyspaces)
}

#[cfg(test)]
mod tests {
    use chorus_unicache::{decode_command, encode_command, varint, CacheConfig, ItemCache, Policy};

    use super::*;
    use crate::command::encode_args;

    fn command(args: &[&[u8]]) -> Bytes {
        encode_args(&args.iter().map(|a| Bytes::copy_from_slice(a)).collect::<Vec<_>>())
    }

    fn round_trip(p: &KvPreprocessor, cache: &mut ItemCache, cmd: &Bytes) -> usize {
        let mut parts = Vec::new();
        p.preprocess(cmd, &mut parts);
        let mut encoded = Vec::new();
        encode_command(cache, &parts, &mut encoded);
        let mut decoded = Vec::new();
        decode_command(cache, p, &mut varint::Reader::new(&encoded), &mut decoded).unwrap();
        assert_eq!(decoded, cmd.as_ref());
        chorus_unicache::absorb_command(cache, &parts, 1);
        encoded.len()
    }

    #[test]
    fn commands_round_trip_and_shrink_once_cached() {
        let p = KvPreprocessor::new(parse_keyspaces("email:=csv:1,2:3").unwrap());
        let mut cache = ItemCache::new(CacheConfig {
            policy: Policy::LeCaR,
            max_items: 1024,
            max_bytes: 1 << 20,
        });
        let value = vec![b'v'; 256];
        let set = command(&[b"SET", b"user000000001234", &value]);
        let first = round_trip(&p, &mut cache, &set);
        let again = command(&[b"SET", b"user000000009876", &value]);
        let second = round_trip(&p, &mut cache, &again);
        assert!(
            first > 256 && second < 30,
            "first {first} B, then {second} B for {} B",
            again.len()
        );
        for cmd in [
            command(&[b"HSET", b"h:1:x", b"f1", b"v1", b"f2", b"v2"]),
            command(&[b"SET", b"email:77", b"1,bob@x.org,inbox,hello there world,2001"]),
            command(&[b"HSET", b"email:78", b"hdr", b"2,bob@x.org,sent,re: hello,2002"]),
            command(&[b"SET", b"k\0ey12", b"v"]),
            command(&[b"SET", b"12", b""]),
            command(&[b"PING"]),
            command(&[]),
            crate::command::encode_enveloped(
                &Envelope {
                    client: ClientId {
                        incarnation: 9 << 16,
                        connection: 4,
                    },
                    seq: 300,
                    first_unacked: 298,
                },
                &[Bytes::from_static(b"INCR"), Bytes::from_static(b"user:12:visits")],
            ),
            crate::command::encode_register(),
            crate::command::encode_renew(1, 2),
            Bytes::from_static(b"\x07not an argument list"),
            Bytes::new(),
        ] {
            round_trip(&p, &mut cache, &cmd);
        }
    }

    #[test]
    fn key_templates_take_out_digit_runs() {
        let (t, ids) = key_template(&Bytes::from_static(b"user:42:post:7"));
        assert_eq!(
            (t.as_ref(), ids.as_ref()),
            (b"user:\0:post:\0".as_ref(), b"42,7".as_ref())
        );
        let mut out = Vec::new();
        recreate_key(&t, &ids, &mut out).unwrap();
        assert_eq!(out, b"user:42:post:7");
        assert!(recreate_key(&t, b"1", &mut Vec::new()).is_err());
        assert!(recreate_key(&t, b"1,2,3", &mut Vec::new()).is_err());
    }

    #[test]
    fn keyspace_rules_parse_or_explain() {
        assert_eq!(parse_keyspaces("a:=csv:1,2:3; b:=sql ;c=opaque").unwrap().len(), 3);
        assert!(parse_keyspaces("a:=zip").is_err_and(|e| e.contains("unknown keyspace kind")));
        assert!(parse_keyspaces("nokind").is_err());
        assert!(parse_keyspaces("a=csv:x").is_err());
    }
}
