//! Key expiry: when each key with a time to live expires, and the log's clock that decides it.
//!
//! Deadlines are milliseconds since the Unix epoch. A replica never reads its own clock while it
//! applies a write: the log's clock is the largest time a leader fixed for an entry so far
//! (`StateMachine::entry_time`), so it never goes backwards, and every replica that applies the
//! same entries has the same clock. Reads, which change nothing, take the later of the local wall
//! clock and the log's clock; see `docs/reliability.md` for the clock bound this gives.

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use foldhash::HashMap;

/// Every key with a deadline, by key and by deadline (for removing the ones due).
#[derive(Default)]
pub(crate) struct Deadlines {
    by_key: HashMap<Bytes, u64>,
    by_time: BTreeSet<(u64, Bytes)>,
}

impl Deadlines {
    /// Keys with a deadline (expired ones too, until their deletion applies).
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<u64> {
        if self.by_key.is_empty() {
            return None;
        }
        self.by_key.get(key).copied()
    }

    /// Sets `key`'s deadline; the one it had, if any.
    pub(crate) fn set(&mut self, key: Bytes, deadline_ms: u64) -> Option<u64> {
        let previous = self.by_key.insert(key.clone(), deadline_ms);
        if let Some(previous) = previous {
            self.by_time.remove(&(previous, key.clone()));
        }
        self.by_time.insert((deadline_ms, key));
        previous
    }

    /// Removes `key`'s deadline; the one it had, if any.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<u64> {
        // Every SET asks, and most stores have no deadline at all: no hashing then.
        if self.by_key.is_empty() {
            return None;
        }
        let (key, previous) = self.by_key.remove_entry(key)?;
        self.by_time.remove(&(previous, key));
        Some(previous)
    }

    /// Whether `key` has a deadline at or before `now_ms`.
    pub(crate) fn expired(&self, key: &[u8], now_ms: u64) -> bool {
        !self.by_key.is_empty() && self.by_key.get(key).is_some_and(|deadline| *deadline <= now_ms)
    }

    /// Up to `limit` keys whose deadline is at or before `now_ms`, earliest first.
    pub(crate) fn due(&self, now_ms: u64, limit: usize) -> Vec<Bytes> {
        self.by_time
            .iter()
            .take_while(|(deadline, _)| *deadline <= now_ms)
            .take(limit)
            .map(|(_, key)| key.clone())
            .collect()
    }
}

/// The local wall clock in milliseconds since the Unix epoch.
pub(crate) fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// When an expiry given to a command takes effect: relative to the log's clock, or absolute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpireAt {
    AfterMs(i64),
    UnixMs(i64),
}

impl ExpireAt {
    /// The deadline in milliseconds since the Unix epoch at `now_ms`; `None` when it overflows.
    /// It may be at or before `now_ms` (or negative): the key is then expired at once.
    pub fn resolve(self, now_ms: u64) -> Option<i64> {
        match self {
            ExpireAt::AfterMs(ms) => ms.checked_add(i64::try_from(now_ms).ok()?),
            ExpireAt::UnixMs(ms) => Some(ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_are_found_by_key_and_by_time() {
        let mut d = Deadlines::default();
        assert!(d.is_empty());
        assert_eq!(d.set(Bytes::from("a"), 30), None);
        d.set(Bytes::from("b"), 10);
        d.set(Bytes::from("c"), 20);
        assert_eq!(d.set(Bytes::from("a"), 5), Some(30));
        assert_eq!(d.due(15, 10), vec![Bytes::from("a"), Bytes::from("b")]);
        assert_eq!(d.due(100, 1), vec![Bytes::from("a")]);
        assert!(d.expired(b"c", 20) && !d.expired(b"c", 19) && !d.expired(b"zz", 100));
        assert_eq!(d.remove(b"a"), Some(5));
        assert_eq!(d.remove(b"a"), None);
        assert_eq!(d.due(100, 10), vec![Bytes::from("b"), Bytes::from("c")]);
        assert_eq!(d.get(b"c"), Some(20));
    }

    #[test]
    fn expiry_resolves_against_the_given_clock() {
        assert_eq!(ExpireAt::AfterMs(500).resolve(1_000), Some(1_500));
        assert_eq!(ExpireAt::UnixMs(7).resolve(1_000), Some(7));
        assert_eq!(ExpireAt::AfterMs(i64::MAX).resolve(1), None);
    }
}
