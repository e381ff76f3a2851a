//! MULTI/EXEC: a transaction is one log entry, so it runs whole, in log order, on every
//! replica alike. WATCH is optimistic: the client's node reads each watched key's fingerprint
//! (a hash of its type, value and deadline) when the client watches it, the EXEC entry carries
//! them, and the transaction runs only if every fingerprint is still the same when the entry
//! applies. Unlike Redis, a key written and then restored to what it held before does not abort
//! the transaction: what is compared is the key's content, not whether it was written.

use bytes::Bytes;
use chorus_resp::Value;

use super::{KvState, Stored};
use crate::command::{Blocking, Command, Write};

/// FNV-1a over 128 bits: the same on every node and in every version, and wide enough that two
/// contents sharing a fingerprint by chance is not a practical concern.
struct Fnv128(u128);

impl Fnv128 {
    const OFFSET_BASIS: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

    fn new() -> Fnv128 {
        Fnv128(Self::OFFSET_BASIS)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u128::from(*byte)).wrapping_mul(Self::PRIME);
        }
    }

    /// An item of a sequence: its length first, so that item boundaries count.
    fn item(&mut self, item: &[u8]) {
        self.bytes(&(item.len() as u64).to_be_bytes());
        self.bytes(item);
    }
}

impl KvState {
    /// What `key` holds, as WATCH compares it: its type, content and deadline, hashed (a key
    /// that holds nothing, or has expired, has the fingerprint of nothing).
    pub(super) fn fingerprint(&mut self, key: &[u8]) -> Bytes {
        let mut hash = Fnv128::new();
        match self.stored(key) {
            None => hash.bytes(b"-"),
            Some(Stored::String(value)) => {
                hash.bytes(b"s");
                hash.item(&value);
            }
            Some(Stored::Hash(fields)) => {
                hash.bytes(b"h");
                for (field, value) in fields {
                    hash.item(&field);
                    hash.item(&value);
                }
            }
            Some(Stored::Set(members)) => {
                hash.bytes(b"S");
                members.iter().for_each(|m| hash.item(m));
            }
            Some(Stored::List(elements)) => {
                hash.bytes(b"L");
                elements.iter().for_each(|e| hash.item(e));
            }
            Some(Stored::Stream(records)) => {
                hash.bytes(b"X");
                for (record, value) in records {
                    hash.item(&record);
                    hash.item(&value);
                }
            }
            Some(Stored::Zset(members)) => {
                hash.bytes(b"Z");
                for (member, score) in members {
                    hash.item(&member);
                    hash.bytes(&score.to_be_bytes());
                }
            }
        }
        if let Some(deadline) = self.deadlines.get(key).filter(|_| self.exists(key)) {
            hash.bytes(&deadline.to_be_bytes());
        }
        Bytes::copy_from_slice(&hash.0.to_be_bytes())
    }

    /// A blocking command inside a transaction or a script, where it does not wait, as in Redis:
    /// its attempt once, and its timeout's reply if that found nothing.
    pub(super) fn attempt_once(&mut self, index: u64, blocking: &Blocking) -> Value {
        let attempt = match Command::parse(&blocking.attempt) {
            Ok(Some(Command::Write(write))) => self.execute_write(index, write),
            // XREAD's: `$` (not resolved here) reads nothing, as Redis answers inside MULTI.
            Ok(Some(Command::Read(read))) => self.read_now(&read),
            Err(e) => Value::error(e),
            Ok(_) => Value::error("ERR a blocking command's attempt is neither a write nor a read"),
        };
        blocking
            .reply
            .from_attempt(attempt)
            .unwrap_or_else(|| blocking.reply.timed_out())
    }

    /// Runs a transaction from the entry at `index`: each queued command in order, unless a
    /// watched key's fingerprint changed since it was watched.
    pub(super) fn execute_exec(&mut self, index: u64, watched: &[(Bytes, Bytes)], commands: Vec<Vec<Bytes>>) -> Value {
        if watched.iter().any(|(key, seen)| self.fingerprint(key) != *seen) {
            return Value::Array(None);
        }
        let replies = commands
            .into_iter()
            .map(|args| match Command::parse(&args) {
                Ok(Some(Command::Write(Write::Exec { .. }))) => Value::error("ERR EXEC inside MULTI is not allowed"),
                Ok(Some(Command::Write(write))) => self.execute_write(index, write),
                Ok(Some(Command::Read(read))) => self.read_now(&read),
                Ok(Some(Command::Blocking(blocking))) => self.attempt_once(index, &blocking),
                Err(e) => Value::error(e),
                Ok(None) => Value::error("ERR only data commands run inside MULTI on Chorus"),
            })
            .collect();
        Value::array(replies)
    }
}
