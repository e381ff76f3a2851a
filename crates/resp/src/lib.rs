//! RESP2, the Redis serialization protocol: values, an incremental parser with size limits,
//! and a writer. Shared by the server front end and the client; knows nothing about commands.

use std::borrow::Cow;
use std::ops::Range;

use bytes::{Bytes, BytesMut};

/// One RESP2 value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Mostly a constant ("OK", "PONG"), which costs no allocation.
    Simple(Cow<'static, str>),
    Error(String),
    Integer(i64),
    /// `None` is the null bulk string (`$-1`).
    Bulk(Option<Bytes>),
    /// `None` is the null array (`*-1`).
    Array(Option<Vec<Value>>),
    /// Field-value pairs: a RESP3 map (`%`); in RESP2, a flat array of its pairs. Only replies
    /// carry it; the decoder never makes one.
    Map(Vec<(Value, Value)>),
    /// Distinct members (SMEMBERS, a tracking client's flags): a RESP3 set (`~`), in RESP2 an
    /// array. Only replies carry it; the decoder never makes one.
    Set(Vec<Value>),
    /// Pairs (a member and its score, a field and its value): in RESP3 an array of two-element
    /// arrays, in RESP2 a flat array, as Redis 7 answers WITHSCORES and WITHVALUES.
    Pairs(Vec<(Value, Value)>),
    /// Keys and what each holds: a RESP3 map, in RESP2 an array of `[key, value]` arrays, as
    /// Redis 7 answers XREAD.
    KeyedPairs(Vec<(Value, Value)>),
    /// A double (a sorted set's score): RESP3's `,`, in RESP2 a bulk string, both written as
    /// Redis 7.0 writes them (see `format_double`).
    Double(Double),
    /// A double in Redis's "human" form (GEOPOS's coordinates; see `format_human_double`):
    /// RESP3's `,`, in RESP2 a bulk string.
    HumanDouble(Double),
    /// Out-of-band data (pub/sub messages and confirmations): RESP3's push (`>`), in RESP2 an
    /// array.
    Push(Vec<Value>),
    /// Several replies to one command, written one after another (SUBSCRIBE confirms each
    /// channel with a reply of its own).
    Replies(Vec<Value>),
}

/// A double that equals another when their bits do, so replies compare exactly (a NaN equals
/// itself, 0 and -0 differ: both print differently).
#[derive(Debug, Clone, Copy)]
pub struct Double(pub f64);

impl PartialEq for Double {
    fn eq(&self, other: &Double) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Double {}

/// The protocol a connection speaks: RESP2 until a client asks for RESP3 (`HELLO 3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

impl Value {
    pub fn ok() -> Value {
        Value::Simple(Cow::Borrowed("OK"))
    }
    pub fn bulk(bytes: impl Into<Bytes>) -> Value {
        Value::Bulk(Some(bytes.into()))
    }
    pub fn null() -> Value {
        Value::Bulk(None)
    }
    pub fn error(message: impl Into<String>) -> Value {
        Value::Error(message.into())
    }
    pub fn map(pairs: Vec<(Value, Value)>) -> Value {
        Value::Map(pairs)
    }
    pub fn array(values: Vec<Value>) -> Value {
        Value::Array(Some(values))
    }
    pub fn is_error(&self) -> bool {
        matches!(self, Value::Error(_))
    }
}

/// Bounds that keep a hostile or broken peer from making us allocate without limit.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bulk_bytes: usize,
    pub max_array_len: usize,
    pub max_inline_bytes: usize,
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_bytes: 64 * 1024 * 1024,
            max_array_len: 1024 * 1024,
            max_inline_bytes: 64 * 1024,
            max_depth: 8,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("Protocol error: {0}")]
    Protocol(String),
    #[error("Protocol error: {what} of {size} exceeds the limit of {limit}")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
}

fn protocol(message: impl Into<String>) -> Error {
    Error::Protocol(message.into())
}

/// Parses one complete value from the front of `buf`.
/// Returns `Ok(None)` when more bytes are needed, or the value and the bytes it used.
pub fn parse_value(buf: &[u8], limits: &Limits) -> Result<Option<(Value, usize)>, Error> {
    parse_at(buf, 0, limits, 0)
}

/// Parses one client command: a RESP array of bulk strings, or an inline command line.
/// Returns `Ok(None)` when more bytes are needed. An empty inline line yields an empty command.
/// Each argument is copied out of `buf`; a server reading into a `BytesMut` uses
/// [`take_command`], which shares one buffer between the arguments instead.
pub fn parse_command(buf: &[u8], limits: &Limits) -> Result<Option<(Vec<Bytes>, usize)>, Error> {
    let mut args = Vec::new();
    let used = parse_command_with(buf, limits, |range| args.push(Bytes::copy_from_slice(&buf[range])))?;
    Ok(used.map(|used| (args, used)))
}

/// Takes one complete client command off the front of `input`. Its arguments are slices of one
/// frozen frame, so parsing allocates only the argument vector and cloning an argument is a
/// reference count. Returns `Ok(None)`, consuming nothing, when more bytes are needed.
pub fn take_command(input: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, Error> {
    let mut count = 0;
    let Some(used) = parse_command_with(&input[..], limits, |_| count += 1)? else {
        return Ok(None);
    };
    // A second walk over the frame's few length lines slices the arguments out of the frozen
    // frame; that is cheaper than allocating a list of ranges on the first walk.
    let frame = input.split_to(used).freeze();
    let mut args = Vec::with_capacity(count);
    let reparsed = parse_command_with(&frame, limits, |range| args.push(frame.slice(range)));
    assert_eq!(
        reparsed,
        Ok(Some(used)),
        "a command frame must parse the same way twice"
    );
    Ok(Some(args))
}

/// Finds the arguments of one command at the front of `buf`, handing each one's byte range to
/// `on_arg` in order, and returns how many bytes the command used.
fn parse_command_with(
    buf: &[u8],
    limits: &Limits,
    mut on_arg: impl FnMut(Range<usize>),
) -> Result<Option<usize>, Error> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first != b'*' {
        return parse_inline(buf, limits, on_arg);
    }
    let Some((len, mut pos)) = parse_line_int(buf, 1, limits.max_inline_bytes)? else {
        return Ok(None);
    };
    if len < 0 {
        return Ok(Some(pos));
    }
    let len = len as usize;
    if len > limits.max_array_len {
        return Err(Error::TooLarge {
            what: "command array",
            size: len,
            limit: limits.max_array_len,
        });
    }
    for _ in 0..len {
        match buf.get(pos) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(other) => {
                return Err(protocol(format!(
                    "expected '$', got '{}'",
                    char::from(*other).escape_default()
                )))
            }
        }
        let Some((bulk, next)) = parse_bulk(buf, pos + 1, limits)? else {
            return Ok(None);
        };
        match bulk {
            Some(bytes) => on_arg(range_within(buf, bytes)),
            None => return Err(protocol("null bulk string in command")),
        }
        pos = next;
    }
    Ok(Some(pos))
}

/// The range `part` occupies in `buf`, of which it is a subslice.
fn range_within(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

fn parse_inline(buf: &[u8], limits: &Limits, mut on_arg: impl FnMut(Range<usize>)) -> Result<Option<usize>, Error> {
    let Some(end) = find_crlf_or_lf(buf, 0) else {
        if buf.len() > limits.max_inline_bytes {
            return Err(Error::TooLarge {
                what: "inline command",
                size: buf.len(),
                limit: limits.max_inline_bytes,
            });
        }
        return Ok(None);
    };
    let (line_end, next) = end;
    let line = &buf[..line_end];
    if line.len() > limits.max_inline_bytes {
        return Err(Error::TooLarge {
            what: "inline command",
            size: line.len(),
            limit: limits.max_inline_bytes,
        });
    }
    line.split(|b| b.is_ascii_whitespace())
        .filter(|part| !part.is_empty())
        .for_each(|part| on_arg(range_within(buf, part)));
    Ok(Some(next))
}

/// Finds the end of a line terminated by "\r\n" or a bare "\n" (inline commands only).
fn find_crlf_or_lf(buf: &[u8], from: usize) -> Option<(usize, usize)> {
    let n = buf[from..].iter().position(|b| *b == b'\n')? + from;
    if n > from && buf[n - 1] == b'\r' {
        Some((n - 1, n + 1))
    } else {
        Some((n, n + 1))
    }
}

fn find_crlf(buf: &[u8], from: usize, max_line: usize) -> Result<Option<usize>, Error> {
    let window_end = buf.len().min(from.saturating_add(max_line + 2));
    match buf[from..window_end].windows(2).position(|w| w == b"\r\n") {
        Some(n) => Ok(Some(from + n)),
        None if buf.len() - from > max_line + 1 => Err(Error::TooLarge {
            what: "line",
            size: buf.len() - from,
            limit: max_line,
        }),
        None => Ok(None),
    }
}

/// Parses "<int>\r\n" starting at `pos`; returns the integer and the position after the CRLF.
fn parse_line_int(buf: &[u8], pos: usize, max_line: usize) -> Result<Option<(i64, usize)>, Error> {
    let Some(end) = find_crlf(buf, pos, max_line.min(32))? else {
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[pos..end]).map_err(|_| protocol("invalid length"))?;
    let n: i64 = text
        .parse()
        .map_err(|_| protocol(format!("invalid length '{}'", text.escape_default())))?;
    Ok(Some((n, end + 2)))
}

type Bulk<'a> = Option<&'a [u8]>;

/// Parses the body of a bulk string whose '$' is just before `pos`.
fn parse_bulk<'a>(buf: &'a [u8], pos: usize, limits: &Limits) -> Result<Option<(Bulk<'a>, usize)>, Error> {
    let Some((len, start)) = parse_line_int(buf, pos, limits.max_inline_bytes)? else {
        return Ok(None);
    };
    if len == -1 {
        return Ok(Some((None, start)));
    }
    if len < 0 {
        return Err(protocol("invalid bulk length"));
    }
    let len = len as usize;
    if len > limits.max_bulk_bytes {
        return Err(Error::TooLarge {
            what: "bulk string",
            size: len,
            limit: limits.max_bulk_bytes,
        });
    }
    let end = start + len;
    if buf.len() < end + 2 {
        return Ok(None);
    }
    if &buf[end..end + 2] != b"\r\n" {
        return Err(protocol("bulk string not terminated by CRLF"));
    }
    Ok(Some((Some(&buf[start..end]), end + 2)))
}

fn parse_at(buf: &[u8], pos: usize, limits: &Limits, depth: usize) -> Result<Option<(Value, usize)>, Error> {
    if depth > limits.max_depth {
        return Err(protocol("nesting too deep"));
    }
    let Some(&tag) = buf.get(pos) else {
        return Ok(None);
    };
    let body = pos + 1;
    match tag {
        b'+' | b'-' => {
            let Some(end) = find_crlf(buf, body, limits.max_inline_bytes)? else {
                return Ok(None);
            };
            let text = String::from_utf8_lossy(&buf[body..end]).into_owned();
            let value = if tag == b'+' {
                Value::Simple(text.into())
            } else {
                Value::Error(text)
            };
            Ok(Some((value, end + 2)))
        }
        b':' => Ok(parse_line_int(buf, body, limits.max_inline_bytes)?.map(|(n, next)| (Value::Integer(n), next))),
        b'$' => Ok(parse_bulk(buf, body, limits)?.map(|(b, next)| (Value::Bulk(b.map(Bytes::copy_from_slice)), next))),
        b'*' => {
            let Some((len, mut next)) = parse_line_int(buf, body, limits.max_inline_bytes)? else {
                return Ok(None);
            };
            if len < 0 {
                return Ok(Some((Value::Array(None), next)));
            }
            let len = len as usize;
            if len > limits.max_array_len {
                return Err(Error::TooLarge {
                    what: "array",
                    size: len,
                    limit: limits.max_array_len,
                });
            }
            let mut items = Vec::with_capacity(len.min(64));
            for _ in 0..len {
                let Some((item, after)) = parse_at(buf, next, limits, depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                next = after;
            }
            Ok(Some((Value::Array(Some(items)), next)))
        }
        other => Err(protocol(format!(
            "unexpected type byte '{}'",
            char::from(other).escape_default()
        ))),
    }
}

/// Appends the RESP2 encoding of `value` to `out`.
pub fn write_value(value: &Value, out: &mut Vec<u8>) {
    write_value_as(value, Protocol::Resp2, out)
}

/// Appends the encoding of `value` in `protocol` to `out`. RESP3 differs where Redis 7 differs:
/// maps are maps, and a null is `_` whatever its RESP2 type.
pub fn write_value_as(value: &Value, protocol: Protocol, out: &mut Vec<u8>) {
    match value {
        Value::Simple(s) => {
            out.push(b'+');
            out.extend_from_slice(single_line(s).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Value::Error(s) => {
            out.push(b'-');
            out.extend_from_slice(single_line(s).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Value::Integer(n) => {
            out.push(b':');
            out.extend_from_slice(n.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Value::Bulk(None) | Value::Array(None) if protocol == Protocol::Resp3 => out.extend_from_slice(b"_\r\n"),
        Value::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
        Value::Bulk(Some(b)) => {
            out.push(b'$');
            out.extend_from_slice(b.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Value::Array(None) => out.extend_from_slice(b"*-1\r\n"),
        Value::Array(Some(items)) => {
            out.push(b'*');
            out.extend_from_slice(items.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            for item in items {
                write_value_as(item, protocol, out);
            }
        }
        Value::Double(Double(d)) | Value::HumanDouble(Double(d)) => {
            let text = match value {
                Value::HumanDouble(_) => format_human_double(*d),
                _ => format_double(*d),
            };
            match protocol {
                Protocol::Resp2 => write_value_as(&Value::bulk(text), protocol, out),
                Protocol::Resp3 => {
                    out.push(b',');
                    out.extend_from_slice(text.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
        Value::Push(items) => {
            out.push(match protocol {
                Protocol::Resp2 => b'*',
                Protocol::Resp3 => b'>',
            });
            out.extend_from_slice(items.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            for item in items {
                write_value_as(item, protocol, out);
            }
        }
        Value::Replies(replies) => {
            for reply in replies {
                write_value_as(reply, protocol, out);
            }
        }
        Value::Pairs(pairs) => {
            let len = match protocol {
                Protocol::Resp2 => pairs.len() * 2,
                Protocol::Resp3 => pairs.len(),
            };
            out.push(b'*');
            out.extend_from_slice(len.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            for (first, second) in pairs {
                if protocol == Protocol::Resp3 {
                    out.extend_from_slice(b"*2\r\n");
                }
                write_value_as(first, protocol, out);
                write_value_as(second, protocol, out);
            }
        }
        Value::KeyedPairs(pairs) => match protocol {
            Protocol::Resp2 => {
                out.push(b'*');
                out.extend_from_slice(pairs.len().to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                for (key, value) in pairs {
                    out.extend_from_slice(b"*2\r\n");
                    write_value_as(key, protocol, out);
                    write_value_as(value, protocol, out);
                }
            }
            Protocol::Resp3 => {
                out.push(b'%');
                out.extend_from_slice(pairs.len().to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                for (key, value) in pairs {
                    write_value_as(key, protocol, out);
                    write_value_as(value, protocol, out);
                }
            }
        },
        Value::Set(members) => {
            out.push(if protocol == Protocol::Resp3 { b'~' } else { b'*' });
            out.extend_from_slice(members.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            for member in members {
                write_value_as(member, protocol, out);
            }
        }
        Value::Map(pairs) => {
            let (tag, len) = match protocol {
                Protocol::Resp2 => (b'*', pairs.len() * 2),
                Protocol::Resp3 => (b'%', pairs.len()),
            };
            out.push(tag);
            out.extend_from_slice(len.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            for (field, value) in pairs {
                write_value_as(field, protocol, out);
                write_value_as(value, protocol, out);
            }
        }
    }
}

/// A double as C's `%.17g` writes it, which is how Redis 7.0 answers scores: 17 significant
/// digits, trailing zeros dropped, an exponent below 1e-4 or from 1e17; `inf`, `-inf`, `nan`.
pub fn format_double(d: f64) -> String {
    const SIGNIFICANT_DIGITS: i32 = 17;
    if d.is_nan() {
        return "nan".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "inf" } else { "-inf" }.into();
    }
    let scientific = format!("{:.*e}", (SIGNIFICANT_DIGITS - 1) as usize, d);
    let (mantissa, exponent) = scientific.split_once('e').expect("`{:e}` writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
    if (-4..SIGNIFICANT_DIGITS).contains(&exponent) {
        let fixed = format!("{:.*}", (SIGNIFICANT_DIGITS - 1 - exponent) as usize, d);
        trim_fraction(&fixed).to_string()
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_fraction(mantissa), exponent.abs())
    }
}

/// A double as Redis 7.0's "human" long double form writes it: 17 decimals (of the double's
/// exact value, rounded), trailing zeros and a bare point dropped, `-0` as `0`.
pub fn format_human_double(d: f64) -> String {
    let fixed = format!("{d:.17}");
    match trim_fraction(&fixed) {
        "-0" => "0".to_string(),
        trimmed => trimmed.to_string(),
    }
}

/// A decimal number without the zeros that end its fraction (and without the point, if that
/// leaves nothing after it).
fn trim_fraction(number: &str) -> &str {
    if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.')
    } else {
        number
    }
}

/// Appends a command (array of bulk strings) to `out`.
pub fn write_command<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        let arg = arg.as_ref();
        out.push(b'$');
        out.extend_from_slice(arg.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Simple strings and errors cannot carry line breaks; replace them rather than corrupt the stream.
fn single_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(['\r', '\n']) {
        s.replace(['\r', '\n'], " ").into()
    } else {
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    #[test]
    fn doubles_are_written_as_printf_writes_them_with_17_significant_digits() {
        let cases = [
            (1.1, "1.1000000000000001"),
            (1.0, "1"),
            (0.5, "0.5"),
            (1e17, "1e+17"),
            (1.5e-5, "1.5e-05"),
            (-0.0, "-0"),
            (123_456_789_012_345_678.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.0003, "0.00029999999999999997"),
            (-2.5, "-2.5"),
            (1e16, "10000000000000000"),
            (1.0 / 3.0, "0.33333333333333331"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (d, text) in cases {
            assert_eq!(format_double(d), text, "{d:?}");
        }
    }

    #[test]
    fn pairs_and_doubles_nest_in_resp3_and_flatten_in_resp2() {
        let reply = Value::Pairs(vec![(Value::bulk("m"), Value::Double(Double(1.5)))]);
        let mut resp2 = Vec::new();
        write_value_as(&reply, Protocol::Resp2, &mut resp2);
        assert_eq!(resp2, b"*2\r\n$1\r\nm\r\n$3\r\n1.5\r\n");
        let mut resp3 = Vec::new();
        write_value_as(&reply, Protocol::Resp3, &mut resp3);
        assert_eq!(resp3, b"*1\r\n*2\r\n$1\r\nm\r\n,1.5\r\n");
    }

    #[test]
    fn maps_and_nulls_are_written_as_each_protocol_writes_them() {
        let reply = Value::array(vec![
            Value::map(vec![(Value::bulk("f"), Value::Integer(1))]),
            Value::null(),
            Value::Array(None),
        ]);
        let mut resp2 = Vec::new();
        write_value_as(&reply, Protocol::Resp2, &mut resp2);
        assert_eq!(resp2, b"*3\r\n*2\r\n$1\r\nf\r\n:1\r\n$-1\r\n*-1\r\n");
        let mut resp3 = Vec::new();
        write_value_as(&reply, Protocol::Resp3, &mut resp3);
        assert_eq!(resp3, b"*3\r\n%1\r\n$1\r\nf\r\n:1\r\n_\r\n_\r\n");
        let mut default = Vec::new();
        write_value(&reply, &mut default);
        assert_eq!(default, resp2, "RESP2 unless asked");
    }

    #[test]
    fn parses_array_command_and_reports_consumed_bytes() {
        let buf = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n";
        let (args, used) = parse_command(buf, &limits()).unwrap().unwrap();
        assert_eq!(args, vec![Bytes::from("GET"), Bytes::from("k")]);
        assert_eq!(used, 20);
        assert_eq!(parse_command(&buf[used..], &limits()).unwrap(), None);
    }

    #[test]
    fn needs_more_bytes_for_every_proper_prefix() {
        let buf = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n";
        for cut in 0..buf.len() {
            assert_eq!(parse_command(&buf[..cut], &limits()).unwrap(), None, "cut {cut}");
        }
        assert!(parse_command(buf, &limits()).unwrap().is_some());
    }

    #[test]
    fn parses_inline_commands() {
        let (args, used) = parse_command(b"PING  hello\r\n", &limits()).unwrap().unwrap();
        assert_eq!(args, vec![Bytes::from("PING"), Bytes::from("hello")]);
        assert_eq!(used, 13);
        let (args, _) = parse_command(b"\r\n", &limits()).unwrap().unwrap();
        assert!(args.is_empty());
    }

    #[test]
    fn take_command_slices_one_frame_and_leaves_the_rest() {
        let mut input = BytesMut::from(&b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\nGET k\r\n*2\r\n$3"[..]);
        let args = take_command(&mut input, &limits()).unwrap().unwrap();
        assert_eq!(args, vec![Bytes::from("SET"), Bytes::from("k"), Bytes::from("value")]);
        // All three point into one frame: the key sits right after "SET\r\n$1\r\n".
        assert_eq!(args[1].as_ptr() as usize - args[0].as_ptr() as usize, 3 + 2 + 2 + 2);
        let args = take_command(&mut input, &limits()).unwrap().unwrap();
        assert_eq!(args, vec![Bytes::from("GET"), Bytes::from("k")]);
        assert_eq!(take_command(&mut input, &limits()).unwrap(), None);
        assert_eq!(&input[..], b"*2\r\n$3", "an incomplete command stays in the buffer");
    }

    #[test]
    fn rejects_oversized_and_malformed_input() {
        let small = Limits {
            max_bulk_bytes: 4,
            ..Limits::default()
        };
        assert!(matches!(
            parse_command(b"*1\r\n$5\r\nhello\r\n", &small),
            Err(Error::TooLarge { .. })
        ));
        assert!(parse_command(b"*1\r\n$x\r\n", &limits()).is_err());
        assert!(parse_command(b"*1\r\n:1\r\n", &limits()).is_err());
        assert!(parse_command(b"*1\r\n$2\r\nabcd\r\n", &limits()).is_err());
        assert!(parse_command(b"*99999999999\r\n", &limits()).is_err());
        let endless = vec![b'a'; 70 * 1024];
        assert!(parse_command(&endless, &limits()).is_err());
    }

    #[test]
    fn values_round_trip() {
        let value = Value::array(vec![
            Value::ok(),
            Value::error("ERR bad"),
            Value::Integer(-42),
            Value::bulk("x\r\ny"),
            Value::null(),
            Value::Array(None),
            Value::array(vec![Value::Integer(1)]),
        ]);
        let mut out = Vec::new();
        write_value(&value, &mut out);
        let (parsed, used) = parse_value(&out, &limits()).unwrap().unwrap();
        assert_eq!(parsed, value);
        assert_eq!(used, out.len());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A small deterministic generator stands in for the fuzzer in unit tests.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let alphabet = b"*$+-:\r\n0123456789-abc";
        for _ in 0..20_000 {
            let mut buf = Vec::new();
            for _ in 0..(state % 40) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                buf.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let copied = parse_command(&buf, &limits());
            let mut input = BytesMut::from(&buf[..]);
            let taken = take_command(&mut input, &limits());
            let taken_len = buf.len() - input.len();
            assert_eq!(taken, copied.clone().map(|c| c.map(|(args, _)| args)), "{buf:?}");
            assert_eq!(
                taken_len,
                copied.map_or(0, |c| c.map_or(0, |(_, used)| used)),
                "{buf:?}"
            );
            let _ = parse_value(&buf, &limits());
        }
    }
}
