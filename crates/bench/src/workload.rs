//! YCSB core workloads A–F plus AW and AWL (100% writes, uniform and latest; from the
//! log-reduction paper §5.2), and the per-client operation stream they produce.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::bail;

use crate::generator::{Distribution, KeyChooser};
use crate::rng::Rng;

/// Operation proportions and key distribution of a workload.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Workload {
    pub name: String,
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub read_modify_write: f64,
    pub distribution: Distribution,
    /// Scans read a uniform number of consecutive records in [1, scan_max_records].
    pub scan_max_records: u64,
}

pub const WORKLOAD_NAMES: &[&str] = &["A", "B", "C", "D", "E", "F", "AW", "AWL"];

const DEFAULT_THETA: f64 = 0.99;

impl Workload {
    /// A named workload as YCSB defines it (AW and AWL as the log-reduction paper does).
    pub fn named(name: &str) -> anyhow::Result<Workload> {
        let zipfian = Distribution::Zipfian { theta: DEFAULT_THETA };
        let latest = Distribution::Latest { theta: DEFAULT_THETA };
        let mix = |read, update, insert, scan, rmw, distribution| Workload {
            name: name.to_ascii_uppercase(),
            read,
            update,
            insert,
            scan,
            read_modify_write: rmw,
            distribution,
            scan_max_records: 100,
        };
        Ok(match name.to_ascii_uppercase().as_str() {
            "A" => mix(0.5, 0.5, 0.0, 0.0, 0.0, zipfian),
            "B" => mix(0.95, 0.05, 0.0, 0.0, 0.0, zipfian),
            "C" => mix(1.0, 0.0, 0.0, 0.0, 0.0, zipfian),
            "D" => mix(0.95, 0.0, 0.05, 0.0, 0.0, latest),
            "E" => mix(0.0, 0.0, 0.05, 0.95, 0.0, zipfian),
            "F" => mix(0.5, 0.0, 0.0, 0.0, 0.5, zipfian),
            "AW" => mix(0.0, 1.0, 0.0, 0.0, 0.0, Distribution::Uniform),
            "AWL" => mix(0.0, 1.0, 0.0, 0.0, 0.0, latest),
            other => bail!("unknown workload '{other}'; known: {}", WORKLOAD_NAMES.join(", ")),
        })
    }

    /// Replaces the key distribution, keeping the workload's operation mix.
    pub fn with_distribution(mut self, distribution: Distribution) -> Workload {
        self.distribution = distribution;
        self
    }

    /// Whether any operation writes (a read-only workload needs no write target).
    pub fn writes(&self) -> bool {
        self.update + self.insert + self.read_modify_write > 0.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

impl OpKind {
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Update => "update",
            OpKind::Insert => "insert",
            OpKind::Scan => "scan",
            OpKind::ReadModifyWrite => "read_modify_write",
        }
    }
}

/// One operation to issue; keys are record numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Read { key: u64 },
    Update { key: u64, field: usize },
    Insert { key: u64 },
    Scan { first_key: u64, records: u64 },
    ReadModifyWrite { key: u64, field: usize },
}

impl Op {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Read { .. } => OpKind::Read,
            Op::Update { .. } => OpKind::Update,
            Op::Insert { .. } => OpKind::Insert,
            Op::Scan { .. } => OpKind::Scan,
            Op::ReadModifyWrite { .. } => OpKind::ReadModifyWrite,
        }
    }
}

/// Record numbers handed out to inserts, shared by every client of a run. Reads choose among
/// records whose insert was acknowledged, so they rarely ask for a key still in flight.
#[derive(Debug)]
pub struct KeySpace {
    next_insert: AtomicU64,
    acknowledged: AtomicU64,
}

impl KeySpace {
    pub fn new(records: u64) -> Arc<KeySpace> {
        Arc::new(KeySpace {
            next_insert: AtomicU64::new(records),
            acknowledged: AtomicU64::new(records),
        })
    }

    pub fn allocate(&self) -> u64 {
        self.next_insert.fetch_add(1, Ordering::Relaxed)
    }

    pub fn acknowledge(&self) {
        self.acknowledged.fetch_add(1, Ordering::Relaxed);
    }

    pub fn inserted(&self) -> u64 {
        self.acknowledged.load(Ordering::Relaxed)
    }
}

/// The operation stream of one client.
pub struct OpStream {
    rng: Rng,
    chooser: KeyChooser,
    /// Cumulative thresholds for read, update, insert, scan; read-modify-write takes the rest.
    thresholds: [f64; 4],
    fields: usize,
    scan_max_records: u64,
    keys: Arc<KeySpace>,
}

impl OpStream {
    pub fn new(workload: &Workload, records: u64, fields: usize, keys: Arc<KeySpace>, seed: u64) -> OpStream {
        let total = workload.read + workload.update + workload.insert + workload.scan + workload.read_modify_write;
        assert!(total > 0.0, "workload {} has no operations", workload.name);
        let mut cumulative = 0.0;
        let mut thresholds = [0.0; 4];
        for (t, p) in thresholds
            .iter_mut()
            .zip([workload.read, workload.update, workload.insert, workload.scan])
        {
            cumulative += p / total;
            *t = cumulative;
        }
        OpStream {
            rng: Rng::new(seed),
            chooser: KeyChooser::new(workload.distribution, records),
            thresholds,
            fields,
            scan_max_records: workload.scan_max_records.max(1),
            keys,
        }
    }

    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    pub fn next_op(&mut self) -> Op {
        let u = self.rng.next_f64();
        let kind = self.thresholds.iter().position(|t| u < *t).unwrap_or(4);
        let inserted = self.keys.inserted().max(1);
        let field = self.rng.below(self.fields as u64) as usize;
        match kind {
            0 => Op::Read {
                key: self.chooser.next(&mut self.rng, inserted),
            },
            1 => Op::Update {
                key: self.chooser.next(&mut self.rng, inserted),
                field,
            },
            2 => Op::Insert {
                key: self.keys.allocate(),
            },
            3 => {
                let first_key = self.chooser.next(&mut self.rng, inserted);
                let records = (1 + self.rng.below(self.scan_max_records)).min(inserted - first_key);
                Op::Scan { first_key, records }
            }
            _ => Op::ReadModifyWrite {
                key: self.chooser.next(&mut self.rng, inserted),
                field,
            },
        }
    }
}

/// The key of record `n`, as YCSB names them (zero-padded so keys sort by number).
pub fn record_key(n: u64) -> String {
    format!("user{n:012}")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn operation_mix_is_within_one_percent_of_the_spec() {
        for name in WORKLOAD_NAMES {
            let workload = Workload::named(name).unwrap();
            let records = 10_000;
            let mut stream = OpStream::new(&workload, records, 10, KeySpace::new(records), 11);
            let samples = 100_000;
            let mut counts: HashMap<OpKind, u64> = HashMap::new();
            for _ in 0..samples {
                let op = stream.next_op();
                if let Op::Scan { first_key, records: n } = op {
                    assert!(n >= 1 && first_key + n <= records, "{op:?}");
                }
                *counts.entry(op.kind()).or_default() += 1;
            }
            for (kind, expected) in [
                (OpKind::Read, workload.read),
                (OpKind::Update, workload.update),
                (OpKind::Insert, workload.insert),
                (OpKind::Scan, workload.scan),
                (OpKind::ReadModifyWrite, workload.read_modify_write),
            ] {
                let share = *counts.get(&kind).unwrap_or(&0) as f64 / samples as f64;
                assert!(
                    (share - expected).abs() < 0.01,
                    "workload {name}: {kind:?} share {share:.4}, spec {expected}"
                );
            }
        }
    }

    #[test]
    fn inserts_get_fresh_keys_and_reads_see_them_once_acknowledged() {
        let workload = Workload::named("D").unwrap();
        let keys = KeySpace::new(100);
        let mut stream = OpStream::new(&workload, 100, 1, keys.clone(), 2);
        let mut inserted = Vec::new();
        for _ in 0..10_000 {
            match stream.next_op() {
                Op::Insert { key } => {
                    inserted.push(key);
                    keys.acknowledge();
                }
                Op::Read { key } => assert!(key < keys.inserted()),
                other => panic!("workload D issued {other:?}"),
            }
        }
        let expected: Vec<u64> = (100..100 + inserted.len() as u64).collect();
        assert_eq!(inserted, expected);
    }

    #[test]
    fn unknown_workload_is_a_clear_error() {
        let err = Workload::named("Z").unwrap_err().to_string();
        assert!(err.contains("AWL"), "{err}");
    }
}
