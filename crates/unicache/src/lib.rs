//! UniCache: a cache every replica derives from the committed log, used to send commands as
//! small encodings (Ng, Wu, Carbone: "UniCache: Efficient Log Replication through Learning
//! Workload Patterns").
//!
//! - A `Preprocessor` splits a command into parts, some cacheable (a command word, a key
//!   template, a SQL template, a CSV column) and some not (unique ids, timestamps); `recreate`
//!   is its exact inverse.
//! - An `ItemCache` maps cacheable parts to slot numbers, deterministically (LRU, LFU, LeCaR).
//! - `encode_command` replaces every cached part by its slot; `decode_command` restores it with
//!   the same cache; `absorb_command` feeds a committed command into the cache.
//!
//! This crate knows nothing of networking or raft: keeping replicas' caches equal (a cache is a
//! pure function of the committed log prefix) is the replication layer's job.

pub mod cache;
mod fixed;
pub mod preprocess;
pub mod varint;

use bytes::Bytes;

pub use cache::{Access, CacheConfig, Fnv, ItemCache, Policy};
pub use preprocess::{CsvPreprocessor, OpaquePreprocessor, SqlParams, SqlPreprocessor, SqlRule};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("truncated input")]
    Truncated,
    #[error("malformed input: {0}")]
    Malformed(&'static str),
    #[error("slot {0} is empty in this replica's cache")]
    UnknownSlot(u32),
    #[error("the encoded data was made with different UniCache settings")]
    SettingsDiffer,
}

/// A piece of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Worth caching: likely to recur.
    Cacheable(Bytes),
    /// Sent as it is: unique or too cheap to cache.
    Verbatim(Bytes),
}

impl Part {
    pub fn bytes(&self) -> &Bytes {
        match self {
            Part::Cacheable(b) | Part::Verbatim(b) => b,
        }
    }
}

/// Hands the parts of one command, in order, to `Preprocessor::recreate`.
pub struct PartReader<'a> {
    parts: &'a [Bytes],
    next: usize,
}

impl<'a> PartReader<'a> {
    pub fn new(parts: &'a [Bytes]) -> PartReader<'a> {
        PartReader { parts, next: 0 }
    }

    pub fn next_part(&mut self) -> Result<&'a Bytes, Error> {
        let part = self
            .parts
            .get(self.next)
            .ok_or(Error::Malformed("fewer parts than the command needs"))?;
        self.next += 1;
        Ok(part)
    }

    /// Reads a part holding one varint (counts and modes that preprocessors emit).
    pub fn next_varint(&mut self) -> Result<u64, Error> {
        let mut r = varint::Reader::new(self.next_part()?);
        let v = r.varint()?;
        r.finish()?;
        Ok(v)
    }

    pub fn is_done(&self) -> bool {
        self.next == self.parts.len()
    }
}

/// A verbatim part holding one varint.
pub fn varint_part(v: u64) -> Part {
    let mut out = Vec::with_capacity(2);
    varint::put(&mut out, v);
    Part::Verbatim(Bytes::from(out))
}

/// PREPROCESS and RECREATE of the paper: `recreate(preprocess(c)) == c` for every command `c`,
/// including commands the preprocessor does not understand (those become one verbatim part).
pub trait Preprocessor: Send + Sync + 'static {
    fn preprocess(&self, command: &Bytes, parts: &mut Vec<Part>);

    /// Appends the command rebuilt from the parts `preprocess` produced.
    fn recreate(&self, parts: &mut PartReader<'_>, out: &mut Vec<u8>) -> Result<(), Error>;

    /// Identifies the preprocessor and its settings (replicas must agree on them).
    fn fingerprint(&self) -> u64;
}

/// Part headers pack a kind into the low two bits of one varint.
const VERBATIM: u64 = 0;
const LITERAL: u64 = 1;
const SLOT: u64 = 2;

/// What encoding one command found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncodeStats {
    pub cacheable: u32,
    pub hits: u32,
}

/// Appends the encoding of a preprocessed command: cached parts become slot numbers. Reads the
/// cache only, so it can run for any number of followers without changing anything.
pub fn encode_command(cache: &ItemCache, parts: &[Part], out: &mut Vec<u8>) -> EncodeStats {
    let mut stats = EncodeStats::default();
    varint::put(out, parts.len() as u64);
    for part in parts {
        match part {
            Part::Verbatim(b) => {
                varint::put(out, (b.len() as u64) << 2 | VERBATIM);
                out.extend_from_slice(b);
            }
            Part::Cacheable(b) => {
                stats.cacheable += 1;
                match cache.lookup(b) {
                    Some(slot) => {
                        stats.hits += 1;
                        varint::put(out, u64::from(slot) << 2 | SLOT);
                    }
                    None => {
                        varint::put(out, (b.len() as u64) << 2 | LITERAL);
                        out.extend_from_slice(b);
                    }
                }
            }
        }
    }
    stats
}

/// Limits what a malformed encoding can make us allocate.
const MAX_PARTS: u64 = 1 << 20;

/// Decodes one command encoded by `encode_command` against an equal cache.
pub fn decode_command(
    cache: &ItemCache,
    preprocessor: &dyn Preprocessor,
    reader: &mut varint::Reader<'_>,
    out: &mut Vec<u8>,
) -> Result<(), Error> {
    let count = reader.varint()?;
    if count > MAX_PARTS {
        return Err(Error::Malformed("too many parts"));
    }
    let mut parts = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let header = reader.varint()?;
        let value = header >> 2;
        match header & 3 {
            VERBATIM | LITERAL => {
                let len = usize::try_from(value).map_err(|_| Error::Truncated)?;
                parts.push(Bytes::copy_from_slice(reader.take(len)?));
            }
            SLOT => {
                let slot = u32::try_from(value).map_err(|_| Error::Malformed("slot out of range"))?;
                parts.push(cache.get(slot).ok_or(Error::UnknownSlot(slot))?.clone());
            }
            _ => return Err(Error::Malformed("unknown part kind")),
        }
    }
    let mut parts_reader = PartReader::new(&parts);
    preprocessor.recreate(&mut parts_reader, out)?;
    if !parts_reader.is_done() {
        return Err(Error::Malformed("more parts than the command uses"));
    }
    Ok(())
}

/// Feeds a committed command's cacheable parts into the cache. `seed` identifies the command's
/// place in the log (e.g. index × 2^16 + position), so every replica draws the same coins.
pub fn absorb_command(cache: &mut ItemCache, parts: &[Part], seed: u64) {
    let mut position = 0u64;
    for part in parts {
        if let Part::Cacheable(b) = part {
            cache.access(b, seed.wrapping_add(position));
            position += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_never_panics_the_decoder() {
        let mut cache = ItemCache::new(CacheConfig {
            policy: Policy::LeCaR,
            max_items: 8,
            max_bytes: 256,
        });
        cache.access(&Bytes::from_static(b"cached"), 1);
        let preprocessors: [&dyn Preprocessor; 3] = [
            &OpaquePreprocessor,
            &CsvPreprocessor::new(b',', &[0], &[(1, b' ')]),
            &SqlPreprocessor {
                rules: Vec::new(),
                default: SqlParams::All,
            },
        ];
        let mut state = 0x1234_5678_9abc_def0u64;
        for len in 0..2_000usize {
            let bytes: Vec<u8> = (0..len % 64)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    // Mostly small values, so counts and lengths are often plausible.
                    if state.is_multiple_of(3) {
                        (state >> 8) as u8
                    } else {
                        (state % 8) as u8
                    }
                })
                .collect();
            for p in preprocessors {
                let mut out = Vec::new();
                let _ = decode_command(&cache, p, &mut varint::Reader::new(&bytes), &mut out);
            }
        }
    }
}
