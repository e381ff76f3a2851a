//! What INFO commandstats, latencystats and errorstats and LATENCY HISTOGRAM show, in Redis's
//! forms: per command its calls, their time, how many failed or were refused, and a latency
//! distribution; per error code how many replies carried it. A command's time is the slow log's:
//! from when the node read it to when its reply was ready, so a write's includes its commit on a
//! majority. Blocking commands and WAIT are counted without a time (Redis leaves their waiting
//! out too). Each node keeps its own, in memory; CONFIG RESETSTAT starts them afresh, and the
//! Prometheus counters (`chorus_commands_total`) are not touched by it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use chorus_resp::Value;
use foldhash::HashMap;

/// Each power of two of microseconds is split in 2^3 buckets: a percentile is within 12.5%.
const SUB_BUCKET_BITS: u32 = 3;
const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Below this every microsecond has a bucket of its own.
const EXACT_BELOW_US: u64 = 2 * SUB_BUCKETS as u64;
const FIRST_SPLIT_EXPONENT: u32 = EXACT_BELOW_US.trailing_zeros();
const BUCKETS: usize = EXACT_BELOW_US as usize + (64 - FIRST_SPLIT_EXPONENT as usize) * SUB_BUCKETS;
/// Error codes tracked at most, as Redis: a client sending ever new ones cannot grow the table.
const MAX_ERROR_CODES: usize = 128;

fn bucket_of(us: u64) -> usize {
    if us < EXACT_BELOW_US {
        return us as usize;
    }
    let exponent = 63 - us.leading_zeros();
    let sub = (us >> (exponent - SUB_BUCKET_BITS)) as usize & (SUB_BUCKETS - 1);
    EXACT_BELOW_US as usize + (exponent - FIRST_SPLIT_EXPONENT) as usize * SUB_BUCKETS + sub
}

/// The least value bucket `i` holds.
fn bucket_floor_us(i: usize) -> u64 {
    if i < EXACT_BELOW_US as usize {
        return i as u64;
    }
    let split = i - EXACT_BELOW_US as usize;
    let exponent = (split / SUB_BUCKETS) as u32 + FIRST_SPLIT_EXPONENT;
    (1u64 << exponent) + (((split % SUB_BUCKETS) as u64) << (exponent - SUB_BUCKET_BITS))
}

/// The greatest value bucket `i` holds.
fn bucket_ceiling_us(i: usize) -> u64 {
    if i + 1 < BUCKETS {
        bucket_floor_us(i + 1) - 1
    } else {
        u64::MAX
    }
}

#[derive(Default)]
struct CommandEntry {
    calls: AtomicU64,
    timed_calls: AtomicU64,
    usec: AtomicU64,
    failed_calls: AtomicU64,
    rejected_calls: AtomicU64,
    /// Made at the command's first timed call: most commands are never called.
    histogram: OnceLock<Box<[AtomicU64]>>,
}

impl CommandEntry {
    fn histogram(&self) -> &[AtomicU64] {
        self.histogram
            .get_or_init(|| (0..BUCKETS).map(|_| AtomicU64::new(0)).collect())
    }

    /// The counts by bucket, if it was ever timed.
    fn buckets(&self) -> Option<Vec<u64>> {
        let histogram = self.histogram.get()?;
        Some(histogram.iter().map(|b| b.load(Ordering::Relaxed)).collect())
    }

    fn reset(&self) {
        for counter in [
            &self.calls,
            &self.timed_calls,
            &self.usec,
            &self.failed_calls,
            &self.rejected_calls,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
        if let Some(histogram) = self.histogram.get() {
            for bucket in histogram.iter() {
                bucket.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// The microseconds under which a fraction `q` of the samples in `buckets` fall.
fn percentile_us(buckets: &[u64], q: f64) -> u64 {
    let total: u64 = buckets.iter().sum();
    let wanted = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, count) in buckets.iter().enumerate() {
        seen += count;
        if seen >= wanted {
            return bucket_ceiling_us(i);
        }
    }
    0
}

pub struct CommandStats {
    /// Every command of the table, in its order (commands outside it are not counted, as Redis
    /// counts none).
    names: Vec<&'static str>,
    by_name: HashMap<&'static str, CommandEntry>,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl CommandStats {
    pub fn new(names: impl IntoIterator<Item = &'static str>) -> CommandStats {
        let names: Vec<&'static str> = names.into_iter().collect();
        CommandStats {
            by_name: names.iter().map(|&name| (name, CommandEntry::default())).collect(),
            names,
            errors: Mutex::new(BTreeMap::new()),
        }
    }

    /// A call of `name` (a name `new` was given) that ran, taking `took` (none for a blocking
    /// command's wait), and whether its reply was an error.
    pub fn executed(&self, name: &'static str, took: Option<Duration>, failed: bool) {
        let Some(entry) = self.by_name.get(name) else {
            return;
        };
        entry.calls.fetch_add(1, Ordering::Relaxed);
        if failed {
            entry.failed_calls.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(took) = took {
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            entry.timed_calls.fetch_add(1, Ordering::Relaxed);
            entry.usec.fetch_add(us, Ordering::Relaxed);
            entry.histogram()[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A call of `name` refused before it ran (wrong arity, no permission).
    pub fn rejected(&self, name: &'static str) {
        if let Some(entry) = self.by_name.get(name) {
            entry.rejected_calls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An error reply: counted by its code, the message's first word.
    pub fn error_replied(&self, message: &str) {
        let code = message.split(' ').next().unwrap_or_default();
        let mut errors = self.errors.lock().expect("not poisoned");
        if let Some(count) = errors.get_mut(code) {
            *count += 1;
        } else if errors.len() < MAX_ERROR_CODES {
            errors.insert(code.to_string(), 1);
        }
    }

    /// CONFIG RESETSTAT.
    pub fn reset(&self) {
        for entry in self.by_name.values() {
            entry.reset();
        }
        self.errors.lock().expect("not poisoned").clear();
    }

    /// Failed and refused calls of every command, and error replies of every code.
    pub fn totals(&self) -> (u64, u64, u64) {
        let sum = |field: fn(&CommandEntry) -> &AtomicU64| -> u64 {
            self.by_name.values().map(|e| field(e).load(Ordering::Relaxed)).sum()
        };
        let errors = self.errors.lock().expect("not poisoned").values().sum();
        (sum(|e| &e.failed_calls), sum(|e| &e.rejected_calls), errors)
    }

    /// INFO's Commandstats lines.
    pub fn write_commandstats(&self, out: &mut String) {
        for (name, entry) in self.in_order() {
            let calls = entry.calls.load(Ordering::Relaxed);
            let rejected = entry.rejected_calls.load(Ordering::Relaxed);
            if calls == 0 && rejected == 0 {
                continue;
            }
            let (timed, usec) = (
                entry.timed_calls.load(Ordering::Relaxed),
                entry.usec.load(Ordering::Relaxed),
            );
            let per_call = if timed == 0 { 0.0 } else { usec as f64 / timed as f64 };
            out.push_str(&format!(
                "cmdstat_{name}:calls={calls},usec={usec},usec_per_call={per_call:.2},rejected_calls={rejected},failed_calls={}\r\n",
                entry.failed_calls.load(Ordering::Relaxed)
            ));
        }
    }

    /// INFO's Latencystats lines: the 50th, 99th and 99.9th percentiles in µs, as Redis's
    /// default `latency-tracking-info-percentiles`.
    pub fn write_latencystats(&self, out: &mut String) {
        for (name, entry) in self.in_order() {
            let Some(buckets) = entry.buckets().filter(|b| b.iter().any(|&c| c > 0)) else {
                continue;
            };
            let [p50, p99, p999] = [0.5, 0.99, 0.999].map(|q| percentile_us(&buckets, q) as f64);
            out.push_str(&format!(
                "latency_percentiles_usec_{name}:p50={p50:.3},p99={p99:.3},p99.9={p999:.3}\r\n"
            ));
        }
    }

    /// INFO's Errorstats lines.
    pub fn write_errorstats(&self, out: &mut String) {
        for (code, count) in self.errors.lock().expect("not poisoned").iter() {
            out.push_str(&format!("errorstat_{code}:count={count}\r\n"));
        }
    }

    /// LATENCY HISTOGRAM: for each command asked for (all timed ones if none is) that has been
    /// timed, its calls and the cumulative count of calls that took less than each power of two
    /// of microseconds, listed where the count grows, as Redis lists them.
    pub fn histograms(&self, asked: &[String]) -> Value {
        let mut out = Vec::new();
        for (name, entry) in self.in_order() {
            if !asked.is_empty() && !asked.iter().any(|a| a == name) {
                continue;
            }
            let Some(buckets) = entry.buckets() else {
                continue;
            };
            let timed: u64 = buckets.iter().sum();
            if timed == 0 {
                continue;
            }
            let mut points = Vec::new();
            let (mut below, mut last) = (0u64, 0u64);
            let mut bucket = 0;
            for exponent in 0..64u32 {
                let bound = 1u64 << exponent;
                while bucket < BUCKETS && bucket_floor_us(bucket) < bound {
                    below += buckets[bucket];
                    bucket += 1;
                }
                if below > last {
                    points.push((Value::Integer(bound as i64), Value::Integer(below as i64)));
                    last = below;
                }
                if below == timed {
                    break;
                }
            }
            out.push((
                Value::bulk(name),
                Value::map(vec![
                    (Value::bulk("calls"), Value::Integer(timed as i64)),
                    (Value::bulk("histogram_usec"), Value::map(points)),
                ]),
            ));
        }
        Value::map(out)
    }

    fn in_order(&self) -> impl Iterator<Item = (&'static str, &CommandEntry)> {
        self.names.iter().map(|name| (*name, &self.by_name[name]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order_within_an_eighth() {
        let mut last_bucket = 0;
        for us in (0..100_000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let bucket = bucket_of(us);
            assert!(bucket < BUCKETS);
            assert!(bucket >= last_bucket, "buckets grow with values");
            last_bucket = bucket;
            let (floor, ceiling) = (bucket_floor_us(bucket), bucket_ceiling_us(bucket));
            assert!(floor <= us && us <= ceiling, "{us} in [{floor}, {ceiling}]");
            assert!(
                (ceiling - floor) as f64 <= (floor as f64 / 8.0).max(0.0),
                "{us}: [{floor}, {ceiling}]"
            );
        }
    }

    #[test]
    fn percentiles_and_histograms_read_what_was_recorded() {
        let stats = CommandStats::new(["get", "set"]);
        for us in 1..=1000u64 {
            stats.executed("set", Some(Duration::from_micros(us)), us % 100 == 0);
        }
        stats.executed("get", None, false);
        stats.rejected("get");
        let mut out = String::new();
        stats.write_commandstats(&mut out);
        assert_eq!(
            out,
            "cmdstat_get:calls=1,usec=0,usec_per_call=0.00,rejected_calls=1,failed_calls=0\r\n\
             cmdstat_set:calls=1000,usec=500500,usec_per_call=500.50,rejected_calls=0,failed_calls=10\r\n"
        );
        let mut out = String::new();
        stats.write_latencystats(&mut out);
        // 500 lies in [480, 511], 990 in [960, 1023], 999 too.
        assert_eq!(
            out,
            "latency_percentiles_usec_set:p50=511.000,p99=1023.000,p99.9=1023.000\r\n"
        );
        let Value::Map(histograms) = stats.histograms(&[]) else {
            panic!("a map")
        };
        assert_eq!(histograms.len(), 1, "get was never timed");
        let Value::Map(fields) = &histograms[0].1 else {
            panic!("a map")
        };
        let Value::Map(points) = &fields[1].1 else {
            panic!("a map")
        };
        let points: Vec<(i64, i64)> = points
            .iter()
            .map(|(k, v)| match (k, v) {
                (Value::Integer(k), Value::Integer(v)) => (*k, *v),
                _ => panic!("integers"),
            })
            .collect();
        assert_eq!(
            points,
            [
                (2, 1),
                (4, 3),
                (8, 7),
                (16, 15),
                (32, 31),
                (64, 63),
                (128, 127),
                (256, 255),
                (512, 511),
                (1024, 1000)
            ]
        );
        stats.reset();
        let mut out = String::new();
        stats.write_commandstats(&mut out);
        stats.write_latencystats(&mut out);
        assert_eq!(out, "", "RESETSTAT forgets everything");
    }

    #[test]
    fn error_codes_are_counted_up_to_the_cap() {
        let stats = CommandStats::new(["get"]);
        stats.error_replied("WRONGTYPE Operation against a key holding the wrong kind of value");
        stats.error_replied("ERR syntax error");
        stats.error_replied("ERR unknown command");
        for n in 0..200 {
            stats.error_replied(&format!("CODE{n} x"));
        }
        let mut out = String::new();
        stats.write_errorstats(&mut out);
        assert!(out.starts_with("errorstat_CODE0:count=1\r\n"), "{out}");
        assert!(out.contains("errorstat_ERR:count=2\r\n"));
        assert!(out.contains("errorstat_WRONGTYPE:count=1\r\n"));
        assert_eq!(out.lines().count(), MAX_ERROR_CODES);
    }
}
