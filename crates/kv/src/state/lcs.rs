//! LCS: the longest common subsequence of two strings, its length, or the ranges that match —
//! Redis 7.0's dynamic programme and walk back, so ties resolve to the same subsequence.

use bytes::Bytes;
use chorus_resp::Value;

use super::{KeyType, KvState};
use crate::command::{CommandError, LcsOptions};

/// The most memory the table may take, as Redis bounds it (proto-max-bulk-len).
const MAX_TABLE_BYTES: u64 = 512 * 1024 * 1024;

impl KvState {
    pub(super) fn lcs(
        &mut self,
        keys: &[Bytes; 2],
        options: &Result<LcsOptions, CommandError>,
    ) -> Result<Value, Value> {
        let strings_only = || Value::error("ERR The specified keys must contain string values");
        let mut values = Vec::with_capacity(2);
        for key in keys {
            match self.key_type(key) {
                None => values.push(Bytes::new()),
                Some(KeyType::String) => values.push(self.string(key)?.unwrap_or_default()),
                Some(_) => return Err(strings_only()),
            }
        }
        let options = *options.as_ref().map_err(|e| Value::error(e.clone()))?;
        let (a, b) = (&values[0], &values[1]);
        let table_bytes = (a.len() as u64 + 1) * (b.len() as u64 + 1) * 4;
        if table_bytes > MAX_TABLE_BYTES {
            return Err(Value::error(
                "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len",
            ));
        }
        let width = b.len() + 1;
        let mut table = vec![0u32; (a.len() + 1) * width];
        for i in 1..=a.len() {
            for j in 1..=b.len() {
                table[i * width + j] = if a[i - 1] == b[j - 1] {
                    table[(i - 1) * width + j - 1] + 1
                } else {
                    table[(i - 1) * width + j].max(table[i * width + j - 1])
                };
            }
        }
        let len = table[a.len() * width + b.len()];
        if options.len_only {
            return Ok(Value::Integer(i64::from(len)));
        }
        // Walk back from the end, collecting the subsequence and the ranges where both strings
        // match contiguously (a range is emitted when it ends or reaches either start).
        let mut result = vec![0u8; len as usize];
        let mut ranges = Vec::new();
        let mut left = len as usize;
        let (mut i, mut j) = (a.len(), b.len());
        let mut open: Option<(usize, usize, usize, usize)> = None;
        while i > 0 && j > 0 {
            let mut emit = false;
            if a[i - 1] == b[j - 1] {
                result[left - 1] = a[i - 1];
                open = Some(match open {
                    None => (i - 1, i - 1, j - 1, j - 1),
                    Some((a_start, a_end, b_start, b_end)) if a_start == i && b_start == j => {
                        (a_start - 1, a_end, b_start - 1, b_end)
                    }
                    Some(range) => {
                        emit = true;
                        range
                    }
                });
                let (a_start, _, b_start, _) = open.expect("just set");
                emit |= a_start == 0 || b_start == 0;
                left -= 1;
                i -= 1;
                j -= 1;
            } else {
                if table[(i - 1) * width + j] > table[i * width + j - 1] {
                    i -= 1;
                } else {
                    j -= 1;
                }
                emit |= open.is_some();
            }
            if emit {
                let (a_start, a_end, b_start, b_end) = open.take().expect("a range is open when one ends");
                let match_len = (a_end - a_start + 1) as u64;
                if options.min_match_len == 0 || match_len >= options.min_match_len {
                    let mut range = vec![
                        Value::array(vec![Value::Integer(a_start as i64), Value::Integer(a_end as i64)]),
                        Value::array(vec![Value::Integer(b_start as i64), Value::Integer(b_end as i64)]),
                    ];
                    if options.with_match_len {
                        range.push(Value::Integer(match_len as i64));
                    }
                    ranges.push(Value::array(range));
                }
            }
        }
        Ok(if options.ranges {
            Value::Map(vec![
                (Value::bulk("matches"), Value::array(ranges)),
                (Value::bulk("len"), Value::Integer(i64::from(len))),
            ])
        } else {
            Value::bulk(result)
        })
    }
}
