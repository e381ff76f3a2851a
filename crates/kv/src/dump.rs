//! DUMP and RESTORE payloads in Redis's format: one value in RDB's object encoding, then the RDB
//! version (2 bytes) and a CRC-64 (Jones, reflected; 8 bytes), both little endian, so values move
//! between Chorus and Redis with DUMP and RESTORE and the tools built on them.
//!
//! Chorus writes the plain encodings every Redis since 2.x reads (a string; a list, set or hash
//! as its count and elements; a sorted set with binary scores). It reads those and the compact
//! ones Redis 7.0 and earlier write: integer and LZF strings, intsets, listpacks, ziplists and
//! quicklists of either. A payload comes from a client: every malformed one is an error, never a
//! panic (fuzz target `dump`).

use bytes::Bytes;

/// The RDB version Chorus writes, and the newest it reads: Redis 7.0's.
const RDB_VERSION: u16 = 10;
const FOOTER_BYTES: usize = 10;

const TYPE_STRING: u8 = 0;
const TYPE_LIST: u8 = 1;
const TYPE_SET: u8 = 2;
const TYPE_ZSET: u8 = 3;
const TYPE_HASH: u8 = 4;
const TYPE_ZSET_2: u8 = 5;
const TYPE_LIST_ZIPLIST: u8 = 10;
const TYPE_SET_INTSET: u8 = 11;
const TYPE_ZSET_ZIPLIST: u8 = 12;
const TYPE_HASH_ZIPLIST: u8 = 13;
const TYPE_LIST_QUICKLIST: u8 = 14;
const TYPE_HASH_LISTPACK: u8 = 16;
const TYPE_ZSET_LISTPACK: u8 = 17;
const TYPE_LIST_QUICKLIST_2: u8 = 18;

/// A quicklist node holding one element as it is, not a listpack.
const QUICKLIST_PLAIN: u64 = 1;

/// A value as a payload carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum DumpValue {
    String(Bytes),
    List(Vec<Bytes>),
    Set(Vec<Bytes>),
    Zset(Vec<(Bytes, f64)>),
    Hash(Vec<(Bytes, Bytes)>),
}

/// Why a payload cannot be restored, as Redis words it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpError {
    VersionOrChecksum,
    BadFormat,
}

impl DumpError {
    pub fn message(self) -> &'static str {
        match self {
            DumpError::VersionOrChecksum => "ERR DUMP payload version or checksum are wrong",
            DumpError::BadFormat => "ERR Bad data format",
        }
    }
}

const CRC64_TABLE: [u64; 256] = {
    // The Jones polynomial, reflected.
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut table = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u64;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ POLY } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// Redis's CRC-64 (`crc64(0, bytes)`).
fn crc64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |crc, &b| {
        CRC64_TABLE[((crc ^ u64::from(b)) & 0xff) as usize] ^ (crc >> 8)
    })
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    let len = len as u64;
    if len < 1 << 6 {
        out.push(len as u8);
    } else if len < 1 << 14 {
        out.extend_from_slice(&[0x40 | (len >> 8) as u8, len as u8]);
    } else if len <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// An object's encoding with the footer Chorus writes after it: the RDB version and the
/// checksum.
pub fn seal(object: &[u8]) -> Vec<u8> {
    let mut out = object.to_vec();
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A value's payload.
pub fn encode(value: &DumpValue) -> Vec<u8> {
    let mut out = Vec::new();
    match value {
        DumpValue::String(bytes) => {
            out.push(TYPE_STRING);
            put_string(&mut out, bytes);
        }
        DumpValue::List(items) | DumpValue::Set(items) => {
            out.push(if matches!(value, DumpValue::List(_)) {
                TYPE_LIST
            } else {
                TYPE_SET
            });
            put_len(&mut out, items.len());
            items.iter().for_each(|item| put_string(&mut out, item));
        }
        DumpValue::Zset(members) => {
            out.push(TYPE_ZSET_2);
            put_len(&mut out, members.len());
            for (member, score) in members {
                put_string(&mut out, member);
                out.extend_from_slice(&score.to_le_bytes());
            }
        }
        DumpValue::Hash(fields) => {
            out.push(TYPE_HASH);
            put_len(&mut out, fields.len());
            for (field, value) in fields {
                put_string(&mut out, field);
                put_string(&mut out, value);
            }
        }
    }
    seal(&out)
}

/// A payload's value: its version and checksum checked first, as Redis checks them.
pub fn decode(payload: &[u8]) -> Result<DumpValue, DumpError> {
    let mut reader = Reader {
        bytes: checked_body(payload)?,
    };
    let value = reader.object()?;
    Ok(value)
}

/// A payload's body, once its version and checksum are found good.
fn checked_body(payload: &[u8]) -> Result<&[u8], DumpError> {
    if payload.len() < FOOTER_BYTES {
        return Err(DumpError::VersionOrChecksum);
    }
    let (body, footer) = payload.split_at(payload.len() - FOOTER_BYTES);
    let version = u16::from_le_bytes([footer[0], footer[1]]);
    let crc = u64::from_le_bytes(footer[2..].try_into().expect("8 bytes"));
    if version > RDB_VERSION || crc64(&payload[..payload.len() - 8]) != crc {
        return Err(DumpError::VersionOrChecksum);
    }
    Ok(body)
}

/// A function library, as RDB and FUNCTION DUMP hold one: its code, metadata line included.
const OPCODE_FUNCTION_2: u8 = 245;
/// Redis 7.0's release candidates' form: name, engine, an optional description, the code
/// without its metadata line.
const OPCODE_FUNCTION: u8 = 246;

/// FUNCTION DUMP's payload of the libraries whose code is given.
pub fn encode_libraries(codes: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::new();
    for code in codes {
        out.push(OPCODE_FUNCTION_2);
        put_string(&mut out, code);
    }
    seal(&out)
}

/// The libraries' code a FUNCTION RESTORE payload holds, or Redis's error for it.
pub fn decode_libraries(payload: &[u8]) -> Result<Vec<Bytes>, &'static str> {
    let body = checked_body(payload).map_err(DumpError::message)?;
    let mut reader = Reader { bytes: body };
    let mut codes = Vec::new();
    while !reader.bytes.is_empty() {
        let failed = |what: &'static str| move |_| what;
        match reader.byte().map_err(failed("ERR can not read data type"))? {
            OPCODE_FUNCTION_2 => codes.push(reader.string().map_err(failed("ERR Failed loading library payload"))?),
            OPCODE_FUNCTION => {
                let name = reader.string().map_err(failed("ERR Failed loading library name"))?;
                let engine = reader.string().map_err(failed("ERR Failed loading engine name"))?;
                let has_description = reader
                    .len()
                    .map_err(failed("ERR Failed loading library description indicator"))?;
                if has_description != 0 {
                    reader
                        .string()
                        .map_err(failed("ERR Failed loading library description"))?;
                }
                let blob = reader.string().map_err(failed("ERR Failed loading library blob"))?;
                let mut code = b"#!".to_vec();
                code.extend_from_slice(&engine);
                code.extend_from_slice(b" name=");
                code.extend_from_slice(&name);
                code.push(b'\n');
                code.extend_from_slice(&blob);
                codes.push(Bytes::from(code));
            }
            _ => return Err("ERR given type is not a function"),
        }
    }
    Ok(codes)
}

/// A cursor over an object's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
}

const BAD: DumpError = DumpError::BadFormat;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DumpError> {
        if n > self.bytes.len() {
            return Err(BAD);
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, DumpError> {
        Ok(self.take(1)?[0])
    }

    /// A length, or (`Err(kind)` inside `Ok`) a special string encoding's kind.
    fn len_or_encoding(&mut self) -> Result<Result<u64, u8>, DumpError> {
        let first = self.byte()?;
        Ok(match first >> 6 {
            0 => Ok(u64::from(first & 0x3f)),
            1 => Ok(u64::from(first & 0x3f) << 8 | u64::from(self.byte()?)),
            2 => match first {
                0x80 => Ok(u64::from(u32::from_be_bytes(
                    self.take(4)?.try_into().expect("4 bytes"),
                ))),
                0x81 => Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes"))),
                _ => return Err(BAD),
            },
            _ => Err(first & 0x3f),
        })
    }

    fn len(&mut self) -> Result<usize, DumpError> {
        match self.len_or_encoding()? {
            Ok(len) => usize::try_from(len).map_err(|_| BAD),
            Err(_) => Err(BAD),
        }
    }

    fn string(&mut self) -> Result<Bytes, DumpError> {
        match self.len_or_encoding()? {
            Ok(len) => Ok(Bytes::copy_from_slice(
                self.take(usize::try_from(len).map_err(|_| BAD)?)?,
            )),
            Err(0) => Ok(integer_text(i64::from(self.byte()? as i8))),
            Err(1) => Ok(integer_text(i64::from(i16::from_le_bytes(
                self.take(2)?.try_into().expect("2 bytes"),
            )))),
            Err(2) => Ok(integer_text(i64::from(i32::from_le_bytes(
                self.take(4)?.try_into().expect("4 bytes"),
            )))),
            Err(3) => {
                let compressed_len = self.len()?;
                let len = self.len()?;
                let compressed = self.take(compressed_len)?;
                lzf_decompress(compressed, len).map(Bytes::from)
            }
            Err(_) => Err(BAD),
        }
    }

    /// A score written as text (RDB's old sorted sets): a length byte, or 253-255 for NaN
    /// and the infinities.
    fn text_score(&mut self) -> Result<f64, DumpError> {
        match self.byte()? {
            253 => Ok(f64::NAN),
            254 => Ok(f64::INFINITY),
            255 => Ok(f64::NEG_INFINITY),
            len => std::str::from_utf8(self.take(usize::from(len))?)
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or(BAD),
        }
    }

    fn count(&mut self) -> Result<usize, DumpError> {
        let count = self.len()?;
        // Each element takes at least one byte: a count beyond what is left is malformed (and
        // would otherwise reserve memory for nothing).
        if count > self.bytes.len() {
            return Err(BAD);
        }
        Ok(count)
    }

    fn object(&mut self) -> Result<DumpValue, DumpError> {
        let value = match self.byte()? {
            TYPE_STRING => DumpValue::String(self.string()?),
            TYPE_LIST => {
                let count = self.count()?;
                DumpValue::List((0..count).map(|_| self.string()).collect::<Result<_, _>>()?)
            }
            TYPE_SET => {
                let count = self.count()?;
                DumpValue::Set((0..count).map(|_| self.string()).collect::<Result<_, _>>()?)
            }
            kind @ (TYPE_ZSET | TYPE_ZSET_2) => {
                let count = self.count()?;
                let mut members = Vec::with_capacity(count);
                for _ in 0..count {
                    let member = self.string()?;
                    let score = if kind == TYPE_ZSET_2 {
                        f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"))
                    } else {
                        self.text_score()?
                    };
                    members.push((member, score));
                }
                DumpValue::Zset(members)
            }
            TYPE_HASH => {
                let count = self.count()?;
                let mut fields = Vec::with_capacity(count);
                for _ in 0..count {
                    fields.push((self.string()?, self.string()?));
                }
                DumpValue::Hash(fields)
            }
            TYPE_SET_INTSET => DumpValue::Set(intset(&self.string()?)?),
            TYPE_LIST_ZIPLIST => DumpValue::List(ziplist(&self.string()?)?),
            TYPE_ZSET_ZIPLIST => DumpValue::Zset(scored(ziplist(&self.string()?)?)?),
            TYPE_HASH_ZIPLIST => DumpValue::Hash(paired(ziplist(&self.string()?)?)?),
            TYPE_HASH_LISTPACK => DumpValue::Hash(paired(listpack(&self.string()?)?)?),
            TYPE_ZSET_LISTPACK => DumpValue::Zset(scored(listpack(&self.string()?)?)?),
            TYPE_LIST_QUICKLIST => {
                let nodes = self.count()?;
                let mut items = Vec::new();
                for _ in 0..nodes {
                    items.extend(ziplist(&self.string()?)?);
                }
                DumpValue::List(items)
            }
            TYPE_LIST_QUICKLIST_2 => {
                let nodes = self.count()?;
                let mut items = Vec::new();
                for _ in 0..nodes {
                    let container = self.len()? as u64;
                    let node = self.string()?;
                    if container == QUICKLIST_PLAIN {
                        items.push(node);
                    } else {
                        items.extend(listpack(&node)?);
                    }
                }
                DumpValue::List(items)
            }
            _ => return Err(BAD),
        };
        if !self.bytes.is_empty() {
            return Err(BAD);
        }
        validate(&value)?;
        Ok(value)
    }
}

/// What Redis refuses even without deep checks: a set, sorted set or hash naming a member
/// twice, a NaN score, an empty container.
fn validate(value: &DumpValue) -> Result<(), DumpError> {
    let distinct = |mut names: Vec<&Bytes>| {
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        names.len() == count && count > 0
    };
    let valid = match value {
        DumpValue::String(_) => true,
        DumpValue::List(items) => !items.is_empty(),
        DumpValue::Set(items) => distinct(items.iter().collect()),
        DumpValue::Zset(members) => {
            members.iter().all(|(_, s)| !s.is_nan()) && distinct(members.iter().map(|(m, _)| m).collect())
        }
        DumpValue::Hash(fields) => distinct(fields.iter().map(|(f, _)| f).collect()),
    };
    if valid {
        Ok(())
    } else {
        Err(BAD)
    }
}

fn integer_text(n: i64) -> Bytes {
    Bytes::from(n.to_string())
}

/// LZF, as Redis compresses long strings: literal runs and back references.
fn lzf_decompress(input: &[u8], len: usize) -> Result<Vec<u8>, DumpError> {
    let mut out = Vec::with_capacity(len.min(input.len().saturating_mul(8)));
    let mut at = 0;
    while at < input.len() {
        let control = usize::from(input[at]);
        at += 1;
        if control < 32 {
            let run = control + 1;
            let literal = input.get(at..at + run).ok_or(BAD)?;
            out.extend_from_slice(literal);
            at += run;
        } else {
            let mut run = control >> 5;
            if run == 7 {
                run += usize::from(*input.get(at).ok_or(BAD)?);
                at += 1;
            }
            let back = ((control & 0x1f) << 8) + usize::from(*input.get(at).ok_or(BAD)?) + 1;
            at += 1;
            let from = out.len().checked_sub(back).ok_or(BAD)?;
            for i in 0..run + 2 {
                out.push(out[from + i]);
            }
        }
        if out.len() > len {
            return Err(BAD);
        }
    }
    if out.len() == len {
        Ok(out)
    } else {
        Err(BAD)
    }
}

fn le_uint(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0, |n, &b| n << 8 | u64::from(b))
}

/// An intset: encoding (bytes per integer), count, then the integers, little endian.
fn intset(blob: &[u8]) -> Result<Vec<Bytes>, DumpError> {
    let header = blob.get(..8).ok_or(BAD)?;
    let width = le_uint(&header[..4]) as usize;
    let count = le_uint(&header[4..]) as usize;
    if ![2, 4, 8].contains(&width) || blob.len() - 8 != count.checked_mul(width).ok_or(BAD)? {
        return Err(BAD);
    }
    Ok(blob[8..]
        .chunks_exact(width)
        .map(|chunk| {
            let raw = le_uint(chunk);
            let shift = 64 - 8 * width as u32;
            integer_text(((raw << shift) as i64) >> shift)
        })
        .collect())
}

/// A listpack: total bytes, element count, entries (each followed by its length backwards),
/// and 0xFF.
fn listpack(blob: &[u8]) -> Result<Vec<Bytes>, DumpError> {
    if blob.len() < 7 || le_uint(&blob[..4]) as usize != blob.len() || blob[blob.len() - 1] != 0xff {
        return Err(BAD);
    }
    let declared = le_uint(&blob[4..6]) as usize;
    let mut at = 6;
    let mut items = Vec::new();
    while blob[at] != 0xff {
        let rest = &blob[at..];
        let first = rest[0];
        let int = |n: usize| rest.get(1..1 + n).map(|b| sign_extend(le_uint(b), n * 8)).ok_or(BAD);
        let (item, entry_len) = if first & 0x80 == 0 {
            (integer_text(i64::from(first)), 1)
        } else if first & 0xc0 == 0x80 {
            let len = usize::from(first & 0x3f);
            (Bytes::copy_from_slice(rest.get(1..1 + len).ok_or(BAD)?), 1 + len)
        } else if first & 0xe0 == 0xc0 {
            let raw = u64::from(first & 0x1f) << 8 | u64::from(*rest.get(1).ok_or(BAD)?);
            (integer_text(sign_extend(raw, 13)), 2)
        } else if first & 0xf0 == 0xe0 {
            let len = usize::from(first & 0x0f) << 8 | usize::from(*rest.get(1).ok_or(BAD)?);
            (Bytes::copy_from_slice(rest.get(2..2 + len).ok_or(BAD)?), 2 + len)
        } else {
            match first {
                0xf0 => {
                    let len = le_uint(rest.get(1..5).ok_or(BAD)?) as usize;
                    let end = 5usize.checked_add(len).ok_or(BAD)?;
                    (Bytes::copy_from_slice(rest.get(5..end).ok_or(BAD)?), end)
                }
                0xf1 => (integer_text(int(2)?), 3),
                0xf2 => (integer_text(int(3)?), 4),
                0xf3 => (integer_text(int(4)?), 5),
                0xf4 => (integer_text(int(8)?), 9),
                _ => return Err(BAD),
            }
        };
        let back_len = match entry_len {
            0..=127 => 1,
            128..=16_383 => 2,
            16_384..=2_097_151 => 3,
            2_097_152..=268_435_455 => 4,
            _ => 5,
        };
        at += entry_len + back_len;
        if at >= blob.len() {
            return Err(BAD);
        }
        items.push(item);
    }
    ended_whole(blob, at, declared, items)
}

/// A listpack's or ziplist's items, if its walk ended at its last byte (the 0xFF) with as many
/// items as its header declares (65,535: too many to count there).
fn ended_whole(blob: &[u8], at: usize, declared: usize, items: Vec<Bytes>) -> Result<Vec<Bytes>, DumpError> {
    if at != blob.len() - 1 || (declared != 65_535 && declared != items.len()) {
        return Err(BAD);
    }
    Ok(items)
}

fn sign_extend(raw: u64, bits: usize) -> i64 {
    let shift = 64 - bits as u32;
    ((raw << shift) as i64) >> shift
}

/// A ziplist (Redis before 7.0): total bytes, offset of the last entry, count, entries (each
/// preceded by the previous one's length), and 0xFF.
fn ziplist(blob: &[u8]) -> Result<Vec<Bytes>, DumpError> {
    if blob.len() < 11 || le_uint(&blob[..4]) as usize != blob.len() || blob[blob.len() - 1] != 0xff {
        return Err(BAD);
    }
    let declared = le_uint(&blob[8..10]) as usize;
    let mut at = 10;
    let mut items = Vec::new();
    while blob[at] != 0xff {
        let rest = &blob[at..];
        let prev_len_bytes = if rest[0] == 0xfe { 5 } else { 1 };
        let rest = rest.get(prev_len_bytes..).ok_or(BAD)?;
        let first = *rest.first().ok_or(BAD)?;
        let int = |n: usize| rest.get(1..1 + n).map(|b| sign_extend(le_uint(b), n * 8)).ok_or(BAD);
        let (item, entry_len) = match first >> 6 {
            0 => {
                let len = usize::from(first & 0x3f);
                (Bytes::copy_from_slice(rest.get(1..1 + len).ok_or(BAD)?), 1 + len)
            }
            1 => {
                let len = usize::from(first & 0x3f) << 8 | usize::from(*rest.get(1).ok_or(BAD)?);
                (Bytes::copy_from_slice(rest.get(2..2 + len).ok_or(BAD)?), 2 + len)
            }
            2 => {
                let len = rest
                    .get(1..5)
                    .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
                    .ok_or(BAD)? as usize;
                let end = 5usize.checked_add(len).ok_or(BAD)?;
                (Bytes::copy_from_slice(rest.get(5..end).ok_or(BAD)?), end)
            }
            _ => match first {
                0xc0 => (integer_text(int(2)?), 3),
                0xd0 => (integer_text(int(4)?), 5),
                0xe0 => (integer_text(int(8)?), 9),
                0xf0 => (integer_text(int(3)?), 4),
                0xfe => (integer_text(int(1)?), 2),
                0xf1..=0xfd => (integer_text(i64::from(first & 0x0f) - 1), 1),
                _ => return Err(BAD),
            },
        };
        at += prev_len_bytes + entry_len;
        if at >= blob.len() {
            return Err(BAD);
        }
        items.push(item);
    }
    ended_whole(blob, at, declared, items)
}

fn paired(items: Vec<Bytes>) -> Result<Vec<(Bytes, Bytes)>, DumpError> {
    if !items.len().is_multiple_of(2) {
        return Err(BAD);
    }
    let mut items = items.into_iter();
    Ok(std::iter::from_fn(|| Some((items.next()?, items.next()?))).collect())
}

fn scored(items: Vec<Bytes>) -> Result<Vec<(Bytes, f64)>, DumpError> {
    paired(items)?
        .into_iter()
        .map(|(member, score)| {
            let score = std::str::from_utf8(&score)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or(BAD)?;
            Ok((member, score))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_redis_s_crc64() {
        assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    #[test]
    fn every_value_round_trips() {
        for value in [
            DumpValue::String(Bytes::from("hello")),
            DumpValue::String(Bytes::from(vec![7u8; 20_000])),
            DumpValue::List(vec![Bytes::from("a"), Bytes::from("")]),
            DumpValue::Set(vec![Bytes::from("x"), Bytes::from("y")]),
            DumpValue::Zset(vec![(Bytes::from("m"), 1.5), (Bytes::from("n"), f64::NEG_INFINITY)]),
            DumpValue::Hash(vec![(Bytes::from("f"), Bytes::from("v"))]),
        ] {
            assert_eq!(decode(&encode(&value)), Ok(value));
        }
    }

    #[test]
    fn a_damaged_payload_is_refused() {
        let mut payload = encode(&DumpValue::String(Bytes::from("hello")));
        assert_eq!(decode(&payload[..5]), Err(DumpError::VersionOrChecksum));
        payload[2] ^= 1;
        assert_eq!(decode(&payload), Err(DumpError::VersionOrChecksum));
        let mut newer = encode(&DumpValue::String(Bytes::from("x")));
        let at = newer.len() - FOOTER_BYTES;
        newer[at] = 11;
        assert_eq!(decode(&newer), Err(DumpError::VersionOrChecksum));
    }

    /// A payload of `body` with a valid footer of RDB `version`.
    fn payload(body: &[u8], version: u16) -> Vec<u8> {
        let mut payload = body.to_vec();
        payload.extend_from_slice(&version.to_le_bytes());
        let crc = crc64(&payload);
        payload.extend_from_slice(&crc.to_le_bytes());
        payload
    }

    #[test]
    fn a_redis_6_ziplist_list_is_read() {
        // "a" (a 1-byte string), 5 (an immediate), 300 (an int16), written as Redis 6 does.
        let entries = [&[0x00, 0x01, b'a'][..], &[0x03, 0xf6], &[0x02, 0xc0, 0x2c, 0x01]].concat();
        let total = 10 + entries.len() + 1;
        let mut blob = (total as u32).to_le_bytes().to_vec();
        blob.extend_from_slice(&15u32.to_le_bytes());
        blob.extend_from_slice(&3u16.to_le_bytes());
        blob.extend_from_slice(&entries);
        blob.push(0xff);
        let mut body = vec![TYPE_LIST_ZIPLIST];
        put_string(&mut body, &blob);
        assert_eq!(
            decode(&payload(&body, 9)),
            Ok(DumpValue::List(vec![
                Bytes::from("a"),
                Bytes::from("5"),
                Bytes::from("300")
            ]))
        );
    }

    #[test]
    fn containers_that_name_a_member_twice_or_hold_nothing_are_refused() {
        let set = [TYPE_SET, 2, 1, b'x', 1, b'x'];
        assert_eq!(decode(&payload(&set, 10)), Err(BAD));
        assert_eq!(decode(&payload(&[TYPE_LIST, 0], 10)), Err(BAD));
        assert_eq!(
            decode(&payload(&[TYPE_STRING, 1, b'x', 0], 10)),
            Err(BAD),
            "bytes left over"
        );
    }

    #[test]
    fn function_libraries_are_read_and_written_as_redis_dumps_them() {
        // `FUNCTION DUMP` of redis-server 7.0.15 holding one library.
        let hex = "f5404423216c7561206e616d653d6c69620a72656469732e72656769737465725f66756e6374696f6e28\
                   2266222c2066756e6374696f6e28292072657475726e203120656e64290a003902a1f9225522f7";
        let from_redis: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let code = Bytes::from_static(b"#!lua name=lib\nredis.register_function(\"f\", function() return 1 end)");
        assert_eq!(decode_libraries(&from_redis).unwrap(), std::slice::from_ref(&code));
        assert_eq!(encode_libraries(&[code]), from_redis);

        // Redis 7.0's release candidates kept the name and engine apart from the code.
        let mut old = vec![OPCODE_FUNCTION];
        for part in [&b"lib"[..], b"LUA"] {
            put_string(&mut old, part);
        }
        put_len(&mut old, 1);
        put_string(&mut old, b"a description");
        put_string(&mut old, b"return");
        assert_eq!(
            decode_libraries(&seal(&old)).unwrap(),
            [Bytes::from_static(b"#!LUA name=lib\nreturn")]
        );

        assert_eq!(
            decode_libraries(&seal(&[TYPE_STRING])),
            Err("ERR given type is not a function")
        );
        assert_eq!(
            decode_libraries(&seal(&[OPCODE_FUNCTION_2, 5, b'a'])),
            Err("ERR Failed loading library payload")
        );
        assert_eq!(
            decode_libraries(b"short"),
            Err("ERR DUMP payload version or checksum are wrong")
        );
    }

    #[test]
    fn lzf_back_references_may_overlap() {
        // "a" literal, then a back reference of 8 bytes at distance 1.
        assert_eq!(lzf_decompress(&[0, b'a', 6 << 5, 0], 9), Ok(b"aaaaaaaaa".to_vec()));
        assert_eq!(lzf_decompress(&[0, b'a', 6 << 5, 5], 9), Err(BAD));
    }
}
