//! Bitmaps: SETBIT, GETBIT, BITCOUNT, BITPOS and BITOP on strings, bit 0 being the first byte's most
//! significant bit, with Redis's ranges (in bytes, or in bits with `BIT`; negative from the end).

use bytes::Bytes;
use chorus_resp::Value;

use super::KvState;
use crate::command::{BitField, BitFieldOp, BitOp, BitRange, CommandError, Overflow};
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

/// A field's bits as an unsigned number, most significant first (bits past `value`'s end read 0).
fn field_bits(value: &[u8], offset: u64, bits: u32) -> u64 {
    (0..u64::from(bits)).fold(0, |acc, i| acc << 1 | u64::from(bit_at(value, offset + i)))
}

/// A field's value: unsigned, or signed (two's complement in `bits` bits).
fn field_value(value: &[u8], field: &BitField) -> i64 {
    let raw = field_bits(value, field.offset, field.bits);
    if field.signed && field.bits < 64 && raw & 1 << (field.bits - 1) != 0 {
        (raw | u64::MAX << field.bits) as i64
    } else {
        raw as i64
    }
}

/// Writes a field's low `bits` bits into `value` (long enough already).
fn set_field(value: &mut [u8], offset: u64, bits: u32, new: u64) {
    for i in 0..u64::from(bits) {
        let on = new & 1 << (u64::from(bits) - 1 - i) != 0;
        let at = offset + i;
        let mask = 0x80 >> (at % 8);
        let byte = &mut value[(at / 8) as usize];
        *byte = if on { *byte | mask } else { *byte & !mask };
    }
}

/// What a SET of `value` or an INCRBY of `increment` onto `value` leaves in an unsigned field of
/// `bits` bits, as Redis 7.0's `checkUnsignedBitfieldOverflow` decides: `None` when it overflows
/// and the policy is FAIL.
fn unsigned_result(value: u64, increment: i64, bits: u32, overflow: Overflow) -> Option<u64> {
    let max = (1u64 << bits) - 1;
    let max_increment = max.wrapping_sub(value) as i64;
    let min_increment = value.wrapping_neg() as i64;
    let wrapped = || value.wrapping_add(increment as u64) & !(u64::MAX << bits);
    if value > max || (increment > 0 && increment > max_increment) {
        match overflow {
            Overflow::Wrap => Some(wrapped()),
            Overflow::Sat => Some(max),
            Overflow::Fail => None,
        }
    } else if increment < 0 && increment < min_increment {
        match overflow {
            Overflow::Wrap => Some(wrapped()),
            Overflow::Sat => Some(0),
            Overflow::Fail => None,
        }
    } else {
        Some(value.wrapping_add(increment as u64))
    }
}

/// The signed counterpart of `unsigned_result` (Redis's `checkSignedBitfieldOverflow`).
fn signed_result(value: i64, increment: i64, bits: u32, overflow: Overflow) -> Option<i64> {
    let max = if bits == 64 { i64::MAX } else { (1i64 << (bits - 1)) - 1 };
    let min = -max - 1;
    let max_increment = (max as u64).wrapping_sub(value as u64) as i64;
    let min_increment = min.wrapping_sub(value);
    let wrapped = || {
        let sum = (value as u64).wrapping_add(increment as u64);
        if bits == 64 {
            sum as i64
        } else if sum & 1 << (bits - 1) != 0 {
            (sum | u64::MAX << bits) as i64
        } else {
            (sum & !(u64::MAX << bits)) as i64
        }
    };
    if value > max
        || (bits != 64 && increment > max_increment)
        || (value >= 0 && increment > 0 && increment > max_increment)
    {
        match overflow {
            Overflow::Wrap => Some(wrapped()),
            Overflow::Sat => Some(max),
            Overflow::Fail => None,
        }
    } else if value < min
        || (bits != 64 && increment < min_increment)
        || (value < 0 && increment < 0 && increment < min_increment)
    {
        match overflow {
            Overflow::Wrap => Some(wrapped()),
            Overflow::Sat => Some(min),
            Overflow::Fail => None,
        }
    } else {
        Some(value.wrapping_add(increment))
    }
}

/// Runs BITFIELD's operations in order on `value`: each one's reply, whether any changed a
/// field, and whether any write was made (did not fail).
fn run_bit_fields(value: &mut [u8], fields: &[BitField]) -> (Vec<Value>, bool, bool) {
    let (mut changed, mut written) = (false, false);
    let replies = fields
        .iter()
        .map(|field| {
            let old = field_value(value, field);
            let (new, reply) = match (field.op, field.signed) {
                (BitFieldOp::Get, _) => return Value::Integer(old),
                (BitFieldOp::Set(set), true) => (signed_result(set, 0, field.bits, field.overflow), old),
                (BitFieldOp::IncrBy(by), true) => {
                    let new = signed_result(old, by, field.bits, field.overflow);
                    (new, new.unwrap_or(0))
                }
                (BitFieldOp::Set(set), false) => (
                    unsigned_result(set as u64, 0, field.bits, field.overflow).map(|n| n as i64),
                    old,
                ),
                (BitFieldOp::IncrBy(by), false) => {
                    let new = unsigned_result(old as u64, by, field.bits, field.overflow).map(|n| n as i64);
                    (new, new.unwrap_or(0))
                }
            };
            match new {
                None => Value::null(),
                Some(new) => {
                    changed |= new != old;
                    written = true;
                    set_field(value, field.offset, field.bits, new as u64);
                    Value::Integer(reply)
                }
            }
        })
        .collect();
    (replies, changed, written)
}

impl KvState {
    /// BITFIELD that only reads.
    pub(super) fn bit_field_get(&mut self, key: &[u8], fields: &[BitField]) -> Result<Value, Value> {
        let value = self.string(key)?.unwrap_or_default();
        let replies = fields.iter().map(|field| Value::Integer(field_value(&value, field)));
        Ok(Value::array(replies.collect()))
    }

    /// BITFIELD with writes: the value to store (`None`: unchanged), whether to notify, and
    /// the reply. As in Redis, the string first grows (or is made) to hold the farthest field
    /// written, even if every write then fails; an event is sent when a write was made to a
    /// string that grew, or changed a field.
    fn bit_fields_written(&mut self, key: &[u8], fields: &[BitField]) -> Result<(Option<Vec<u8>>, bool, Value), Value> {
        let current = self.string_to_update(key)?;
        let farthest_bit = fields
            .iter()
            .filter(|f| f.op != BitFieldOp::Get)
            .map(|f| f.offset + u64::from(f.bits) - 1)
            .max()
            .unwrap_or(0);
        let len = (farthest_bit / 8 + 1) as usize;
        let grew = current.as_ref().is_none_or(|value| value.len() < len);
        let mut value = current.map_or_else(Vec::new, |value| value.to_vec());
        if value.len() < len {
            value.resize(len, 0);
        }
        let (replies, changed, written) = run_bit_fields(&mut value, fields);
        let stored = (grew || changed).then_some(value);
        Ok((stored, changed || (grew && written), Value::array(replies)))
    }

    /// BITFIELD with a SET or INCRBY.
    pub(super) fn bit_field(&mut self, index: u64, key: &Bytes, fields: &[BitField]) -> Value {
        match self.bit_fields_written(key, fields) {
            Err(e) => e,
            Ok((stored, notify, reply)) => {
                if let Some(value) = stored {
                    self.set_string(index, key, Bytes::from(value));
                }
                if notify {
                    self.notify(keyspace_events::STRING, "setbit", key);
                }
                reply
            }
        }
    }

    /// What BITFIELD will answer, before it applies.
    pub(super) fn preview_bit_field(&mut self, key: &[u8], fields: &[BitField]) -> Value {
        self.bit_fields_written(key, fields)
            .map_or_else(|e| e, |(_, _, reply)| reply)
    }

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
