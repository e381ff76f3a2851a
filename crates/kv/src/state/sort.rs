//! SORT and SORT_RO: a list's, set's or sorted set's elements sorted as numbers or strings,
//! by themselves or by keys their patterns name, limited, looked up through GET patterns, and
//! answered or stored as a list — Redis 7.0's `sortCommandGeneric`, step by step.

use std::cmp::Ordering;

use bytes::Bytes;
use chorus_resp::Value;

use super::{KeyType, KvState, Stored, WRONGTYPE};
use crate::command::SortArgs;
use crate::keyspace_events;

/// A number as C's `strtod` reads one for SORT: leading white space allowed, the whole rest
/// consumed, no NaN, nothing out of range (an overflow to infinity or an underflow to zero of a
/// number that is neither).
fn sort_score(text: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(text).ok()?;
    let trimmed = text.trim_start_matches([' ', '\t', '\n', '\u{b}', '\u{c}', '\r']);
    if trimmed.is_empty() {
        // strtod reads nothing and Redis sees no trailing characters: 0.
        return (trimmed.len() == text.len()).then_some(0.0);
    }
    let score: f64 = trimmed.parse().ok()?;
    let digits = trimmed.trim_start_matches(['+', '-']);
    let spelled_infinite = digits.eq_ignore_ascii_case("inf") || digits.eq_ignore_ascii_case("infinity");
    let mantissa = digits.split(['e', 'E']).next().unwrap_or_default();
    let spelled_zero = !mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b));
    let out_of_range =
        (score.is_infinite() && !spelled_infinite) || ((score == 0.0 || score.is_subnormal()) && !spelled_zero);
    (!score.is_nan() && !out_of_range).then_some(score)
}

/// What `strcoll` compares in the C locale: the bytes up to the first NUL.
fn c_string(bytes: &[u8]) -> &[u8] {
    bytes.split(|&b| b == 0).next().unwrap_or(bytes)
}

/// An element and what it sorts by.
struct Item {
    element: Bytes,
    score: f64,
    by: Option<Bytes>,
}

impl KvState {
    /// What a pattern names for `element`: the element itself for `#`; else the string (or,
    /// with `->field`, the hash field) at the key the pattern makes by putting `element` at its
    /// first `*`. Nothing when the pattern has no `*` or the key holds something else.
    fn sort_lookup(&mut self, pattern: &[u8], element: &[u8]) -> Option<Bytes> {
        if pattern == b"#" {
            return Some(Bytes::copy_from_slice(element));
        }
        let pattern = c_string(pattern);
        let star = pattern.iter().position(|&b| b == b'*')?;
        let after = &pattern[star + 1..];
        let arrow = after
            .windows(2)
            .position(|w| w == b"->")
            .filter(|at| at + 2 < after.len());
        let (suffix, field) = match arrow {
            Some(at) => (&after[..at], Some(&after[at + 2..])),
            None => (after, None),
        };
        let key = [&pattern[..star], element, suffix].concat();
        match (field, self.key_type(&key)) {
            (None, Some(KeyType::String)) => self.string(&key).ok().flatten(),
            (Some(field), Some(KeyType::Hash)) => self.field(&key, field).ok().flatten(),
            _ => None,
        }
    }

    /// SORT's answer: the elements (or GET values) it selects, in order.
    pub(super) fn sorted(&mut self, args: &SortArgs) -> Result<Vec<Option<Bytes>>, Value> {
        let (mut alpha, mut by) = (args.alpha, args.by.clone());
        let mut unsorted = args.unsorted;
        let elements: Vec<Bytes> = match self.key_type(&args.key) {
            None => Vec::new(),
            Some(KeyType::List) => self.list_elements(&args.key)?.into_iter().map(|(_, e)| e).collect(),
            Some(KeyType::Set) => {
                // Redis leaves a set in its hash order, which only its own process knows; Chorus
                // sorts it as strings, as Redis does when storing or in a script.
                if unsorted {
                    (unsorted, alpha, by) = (false, true, None);
                }
                self.set_members(&args.key)?
            }
            Some(KeyType::Zset) => self.zset_members(&args.key).into_iter().map(|(m, _)| m).collect(),
            Some(_) => return Err(Value::error(WRONGTYPE)),
        };
        let len = elements.len() as i64;
        let (offset, count) = args.limit.unwrap_or((0, -1));
        let mut start = offset.max(0).min(len);
        let count = count.max(-1).min(len);
        let mut end = if count < 0 { len - 1 } else { start + count - 1 };
        if start >= len {
            (start, end) = (len - 1, len - 2);
        }
        end = end.min(len - 1);
        let mut items: Vec<Item> = if unsorted {
            // Lists and sorted sets keep their order (reversed by DESC), cut to the limit first.
            let ordered: Box<dyn Iterator<Item = Bytes>> = if args.descending {
                Box::new(elements.into_iter().rev())
            } else {
                Box::new(elements.into_iter())
            };
            let taken = ordered
                .skip(start.max(0) as usize)
                .take((end - start + 1).max(0) as usize);
            let items = taken
                .map(|element| Item {
                    element,
                    score: 0.0,
                    by: None,
                })
                .collect();
            (end, start) = (end - start, 0);
            items
        } else {
            let mut not_a_number = false;
            let mut items = Vec::with_capacity(elements.len());
            for element in elements {
                let by_value = match &by {
                    Some(pattern) => self.sort_lookup(pattern, &element),
                    None => Some(element.clone()),
                };
                let mut item = Item {
                    element,
                    score: 0.0,
                    by: None,
                };
                if let Some(value) = by_value {
                    if alpha {
                        item.by = by.is_some().then_some(value);
                    } else {
                        match sort_score(&value) {
                            Some(score) => item.score = score,
                            None => not_a_number = true,
                        }
                    }
                }
                items.push(item);
            }
            let storing = args.store.is_some();
            let compare = |a: &Item, b: &Item| -> Ordering {
                let order = if !alpha {
                    a.score
                        .partial_cmp(&b.score)
                        .unwrap_or(Ordering::Equal)
                        .then_with(|| a.element.cmp(&b.element))
                } else if by.is_some() {
                    match (&a.by, &b.by) {
                        (None, None) => Ordering::Equal,
                        (None, Some(_)) => Ordering::Less,
                        (Some(_), None) => Ordering::Greater,
                        (Some(x), Some(y)) if storing => x.cmp(y),
                        (Some(x), Some(y)) => c_string(x).cmp(c_string(y)),
                    }
                } else if storing {
                    a.element.cmp(&b.element)
                } else {
                    c_string(&a.element).cmp(c_string(&b.element))
                };
                if args.descending {
                    order.reverse()
                } else {
                    order
                }
            };
            items.sort_by(compare);
            if not_a_number {
                return Err(Value::error("ERR One or more scores can't be converted into double"));
            }
            items
        };
        let selected = if end >= start {
            items.drain(start as usize..=end as usize).collect()
        } else {
            Vec::new()
        };
        let mut out = Vec::new();
        for item in selected {
            if args.gets.is_empty() {
                out.push(Some(item.element));
                continue;
            }
            for pattern in &args.gets {
                out.push(self.sort_lookup(pattern, &item.element));
            }
        }
        Ok(out)
    }

    pub(super) fn sort_reply(&mut self, args: &SortArgs) -> Result<Value, Value> {
        let out = self.sorted(args)?;
        Ok(Value::array(out.into_iter().map(Value::Bulk).collect()))
    }

    /// SORT ... STORE: the destination becomes the list (a missing GET value as an empty
    /// string), or is deleted when there is none; answers its length.
    pub(super) fn sort_store(&mut self, index: u64, args: &SortArgs) -> Value {
        let out = match self.sorted(args) {
            Err(e) => return e,
            Ok(out) => out,
        };
        let destination = args.store.as_ref().expect("a storing sort has a destination");
        let stored = out.len() as i64;
        if out.is_empty() {
            if self.delete(index, destination) {
                self.notify(keyspace_events::GENERIC, "del", destination);
            }
        } else {
            let list = out.into_iter().map(Option::unwrap_or_default).collect();
            self.put_stored(index, destination, Stored::List(list), None);
            self.notify(keyspace_events::LIST, "sortstore", destination);
        }
        Value::Integer(stored)
    }

    /// What SORT ... STORE will answer, before it applies.
    pub(super) fn preview_sort_store(&mut self, args: &SortArgs) -> Value {
        self.sorted(args)
            .map_or_else(|e| e, |out| Value::Integer(out.len() as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_reads_numbers_as_strtod_does() {
        assert_eq!(sort_score(b"1.5"), Some(1.5));
        assert_eq!(sort_score(b"  2"), Some(2.0), "leading white space is skipped");
        assert_eq!(sort_score(b""), Some(0.0), "nothing read, nothing left over");
        assert_eq!(sort_score(b"2 "), None);
        assert_eq!(sort_score(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(sort_score(b"nan"), None);
        assert_eq!(sort_score(b"1e400"), None, "overflow");
        assert_eq!(sort_score(b"1e-400"), None, "underflow");
        assert_eq!(sort_score(b"0e5"), Some(0.0));
        assert_eq!(sort_score(b"abc"), None);
    }
}
