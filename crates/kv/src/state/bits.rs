//! Bitmaps: SETBIT, GETBIT, BITCOUNT, BITPOS and BITOP on strings, bit 0 being the first byte's most
//! significant bit, with Redis's ranges (in bytes, or in bits with `BIT`; negative from the end).

use bytes::Bytes;
use chorus_resp::Value;

use super::KvState;
use crate::command::{BitOp, BitRange, CommandError};
use crate::keyspace_events;

/// The bit at `offset` of `value` (0 past its end).
fn bit_at(value: &[u8], offset: u64) -> bool {
    usize::try_from(offset / 8)
        .ok()
        .and_then(|byte| value.get(byte))
        .is_some_and(|byte| byte & (0x80 >> (offset % 8)) != 0)
}

/// The bits `range` names in a string of `len` bytes, first and last inclusive (`None`: none).
/// Without a range, the whole string; without an end (BITPOS), up to the string's end.
fn bit_span(range: Option<&BitRange>, len: usize) -> Option<(u64, u64)> {
    let (start, end, in_bits) = match range {
        None => (0, -1, false),
        Some(range) => (range.start, range.end.unwrap_or(-1), range.in_bits),
    };
    let total = if in_bits { len as i64 * 8 } else { len as i64 };
    let from_end = |i: i64| if i < 0 { (total + i).max(0) } else { i };
    let (start, end) = (from_end(start), from_end(end).min(total - 1));
    if start > end {
        return None;
    }
    let (start, end) = (start as u64, end as u64);
    Some(if in_bits {
        (start, end)
    } else {
        (start * 8, end * 8 + 7)
    })
}

/// The bits of `byte` (at byte index `at`) that lie within `first..=last`, as a mask.
fn mask_within(at: u64, first: u64, last: u64) -> u8 {
    let (lo, hi) = (at * 8, at * 8 + 7);
    let head = if first > lo { 0xff >> (first - lo) } else { 0xff };
    let tail = if last < hi { 0xff << (hi - last) } else { 0xff };
    head & tail
}

/// BITCOUNT: the set bits of `value` in `range`.
fn count_set_bits(value: &[u8], range: Option<&BitRange>) -> i64 {
    // Redis counts nothing for two negative bounds the wrong way round, before clamping them.
    if range.is_some_and(|r| r.start < 0 && r.end.is_some_and(|end| end < 0 && r.start > end)) {
        return 0;
    }
    let Some((first, last)) = bit_span(range, value.len()) else {
        return 0;
    };
    (first / 8..=last / 8)
        .map(|at| (value[at as usize] & mask_within(at, first, last)).count_ones() as i64)
        .sum()
}

/// BITPOS: the first bit equal to `bit` in `range`, or -1. Looking for a clear bit with no end
/// given, the string counts as followed by clear bits, as in Redis.
fn first_bit(value: &[u8], bit: bool, range: Option<&BitRange>) -> i64 {
    let Some((first, last)) = bit_span(range, value.len()) else {
        return -1;
    };
    for at in first / 8..=last / 8 {
        let byte = value[at as usize];
        let wanted = if bit { byte } else { !byte } & mask_within(at, first, last);
        if wanted != 0 {
            return (at * 8 + u64::from(wanted.leading_zeros())) as i64;
        }
    }
    let end_given = range.is_some_and(|r| r.end.is_some());
    if bit || end_given {
        -1
    } else {
        last as i64 + 1
    }
}

/// BITOP's result: the sources combined byte by byte, each padded with zero bytes to the
/// longest.
fn combine(op: BitOp, sources: &[Option<Bytes>]) -> Vec<u8> {
    let len = sources.iter().flatten().map(Bytes::len).max().unwrap_or(0);
    let byte_of = |source: &Option<Bytes>, at: usize| source.as_ref().and_then(|s| s.get(at)).copied().unwrap_or(0);
    (0..len)
        .map(|at| {
            let first = byte_of(&sources[0], at);
            let rest = sources[1..].iter().map(|source| byte_of(source, at));
            match op {
                BitOp::And => rest.fold(first, |acc, byte| acc & byte),
                BitOp::Or => rest.fold(first, |acc, byte| acc | byte),
                BitOp::Xor => rest.fold(first, |acc, byte| acc ^ byte),
                BitOp::Not => !first,
            }
        })
        .collect()
}

impl KvState {
    /// BITOP's sources, each a string or missing; WRONGTYPE if one holds something else.
    fn bit_op_sources(&mut self, sources: &[Bytes]) -> Result<Vec<Option<Bytes>>, Value> {
        sources.iter().map(|key| self.string_to_update(key)).collect()
    }

    /// BITOP: the destination's length. A result replaces whatever `dest` held, deadline
    /// included; an empty one deletes it.
    pub(super) fn bit_op(&mut self, index: u64, op: BitOp, dest: &Bytes, sources: &[Bytes]) -> Value {
        let sources = match self.bit_op_sources(sources) {
            Err(e) => return e,
            Ok(sources) => sources,
        };
        let result = combine(op, &sources);
        let len = result.len() as i64;
        if result.is_empty() {
            if self.delete(index, dest) {
                self.notify(keyspace_events::GENERIC, "del", dest);
            }
        } else {
            self.set_string(index, dest, Bytes::from(result));
            self.set_deadline(index, dest, None);
            self.notify(keyspace_events::STRING, "set", dest);
        }
        Value::Integer(len)
    }

    /// What BITOP will answer, before it applies.
    pub(super) fn preview_bit_op(&mut self, sources: &[Bytes]) -> Value {
        match self.bit_op_sources(sources) {
            Err(e) => e,
            Ok(sources) => Value::Integer(sources.iter().flatten().map(Bytes::len).max().unwrap_or(0) as i64),
        }
    }

    /// SETBIT: the bit's old value. A string that grows or a bit that changes is a write (and
    /// an event); setting a bit to what it holds changes nothing.
    pub(super) fn set_bit(&mut self, index: u64, key: &Bytes, offset: u64, on: bool) -> Value {
        let current = match self.string_to_update(key) {
            Err(e) => return e,
            Ok(current) => current,
        };
        let was = current.as_deref().is_some_and(|value| bit_at(value, offset));
        let byte = (offset / 8) as usize;
        let grows = current.as_ref().is_none_or(|value| value.len() <= byte);
        if grows || was != on {
            let mut updated = current.map_or_else(Vec::new, |value| value.to_vec());
            if updated.len() <= byte {
                updated.resize(byte + 1, 0);
            }
            let mask = 0x80 >> (offset % 8);
            if on {
                updated[byte] |= mask;
            } else {
                updated[byte] &= !mask;
            }
            self.set_string(index, key, Bytes::from(updated));
            self.notify(keyspace_events::STRING, "setbit", key);
        }
        Value::Integer(i64::from(was))
    }

    /// What SETBIT will answer, before it applies.
    pub(super) fn preview_set_bit(&mut self, key: &[u8], offset: u64) -> Value {
        match self.string_to_update(key) {
            Err(e) => e,
            Ok(current) => Value::Integer(i64::from(current.as_deref().is_some_and(|v| bit_at(v, offset)))),
        }
    }

    pub(super) fn get_bit(&mut self, key: &[u8], offset: u64) -> Result<Value, Value> {
        let value = self.string(key)?;
        Ok(Value::Integer(i64::from(
            value.as_deref().is_some_and(|v| bit_at(v, offset)),
        )))
    }

    /// BITCOUNT: a missing key counts 0 and a key of another type is refused before the range
    /// is looked at, as in Redis 7.0.
    pub(super) fn bit_count(
        &mut self,
        key: &[u8],
        range: &Result<Option<BitRange>, CommandError>,
    ) -> Result<Value, Value> {
        let Some(value) = self.string(key)? else {
            return Ok(Value::Integer(0));
        };
        let range = range.as_ref().map_err(|e| Value::error(e.clone()))?;
        Ok(Value::Integer(count_set_bits(&value, range.as_ref())))
    }

    /// BITPOS: a missing key is all clear bits (0 for a clear bit, -1 for a set one).
    pub(super) fn bit_pos(
        &mut self,
        key: &[u8],
        bit: bool,
        range: &Result<Option<BitRange>, CommandError>,
    ) -> Result<Value, Value> {
        let Some(value) = self.string(key)? else {
            return Ok(Value::Integer(if bit { -1 } else { 0 }));
        };
        let range = range.as_ref().map_err(|e| Value::error(e.clone()))?;
        Ok(Value::Integer(first_bit(&value, bit, range.as_ref())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(start: i64, end: i64) -> Option<BitRange> {
        Some(BitRange {
            start,
            end: Some(end),
            in_bits: false,
        })
    }

    fn from_byte(start: i64) -> Option<BitRange> {
        Some(BitRange {
            start,
            end: None,
            in_bits: false,
        })
    }

    fn bits(start: i64, end: Option<i64>) -> Option<BitRange> {
        Some(BitRange {
            start,
            end,
            in_bits: true,
        })
    }

    #[test]
    fn bits_count_over_bytes_and_bit_ranges_as_redis_counts_them() {
        let value = b"foobar";
        assert_eq!(count_set_bits(value, None), 26);
        assert_eq!(count_set_bits(value, bytes(0, 0).as_ref()), 4);
        assert_eq!(count_set_bits(value, bytes(1, 1).as_ref()), 6);
        assert_eq!(count_set_bits(value, bytes(-2, -1).as_ref()), 7);
        assert_eq!(
            count_set_bits(value, bytes(-1, -2).as_ref()),
            0,
            "negative bounds the wrong way"
        );
        assert_eq!(
            count_set_bits(value, bytes(-100, -50).as_ref()),
            4,
            "both clamp to the first byte"
        );
        assert_eq!(count_set_bits(value, bits(5, Some(30)).as_ref()), 17);
        assert_eq!(count_set_bits(value, bits(0, Some(-1)).as_ref()), 26);
        assert_eq!(count_set_bits(value, bits(7, Some(7)).as_ref()), 0);
        assert_eq!(count_set_bits(b"", None), 0);
    }

    #[test]
    fn the_first_set_or_clear_bit_is_found_as_redis_finds_it() {
        assert_eq!(first_bit(b"\xff\xf0\x00", false, None), 12);
        assert_eq!(first_bit(b"\x00\xff\xf0", true, from_byte(0).as_ref()), 8);
        assert_eq!(first_bit(b"\x00\xff\xf0", true, from_byte(2).as_ref()), 16);
        assert_eq!(first_bit(b"\x00\xff\xf0", true, bytes(2, -1).as_ref()), 16);
        assert_eq!(first_bit(b"\x00\x00\x00", true, bits(7, Some(-3)).as_ref()), -1);
        assert_eq!(first_bit(b"\x00\x00\x00", true, None), -1);
        assert_eq!(
            first_bit(b"\xff\xff\xff", false, None),
            24,
            "clear bits follow the string"
        );
        assert_eq!(first_bit(b"\xff\xff\xff", false, bits(3, None).as_ref()), 24);
        assert_eq!(
            first_bit(b"\xff\xff\xff", false, bytes(0, -1).as_ref()),
            -1,
            "not past an end given"
        );
        assert_eq!(first_bit(b"\x00\xff\xf0", true, bits(7, Some(15)).as_ref()), 8);
        assert_eq!(first_bit(b"\x01", true, bits(0, Some(6)).as_ref()), -1);
        assert_eq!(first_bit(b"", false, None), -1, "an empty string has no bits");
    }

    #[test]
    fn sources_combine_padded_with_zero_bytes() {
        let sources = [
            Some(Bytes::from_static(b"\xf0\x0f")),
            None,
            Some(Bytes::from_static(b"\x3c")),
        ];
        assert_eq!(combine(BitOp::And, &sources), b"\x00\x00");
        assert_eq!(combine(BitOp::Or, &sources), b"\xfc\x0f");
        assert_eq!(combine(BitOp::Xor, &sources), b"\xcc\x0f");
        assert_eq!(combine(BitOp::Not, &sources[..1]), b"\x0f\xf0");
        assert_eq!(combine(BitOp::Or, &[None, None]), b"");
    }

    #[test]
    fn a_bit_past_the_end_is_clear() {
        assert!(bit_at(b"\x80", 0));
        assert!(!bit_at(b"\x80", 1));
        assert!(!bit_at(b"\x80", 8));
        assert!(!bit_at(b"", u64::MAX));
    }
}
