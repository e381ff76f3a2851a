//! Per-batch reduction: a batch of committed writes becomes the last write of each key it touched.
//! Or, for the `full` storage mode (the standard log the reduction is measured against), every
//! write in log order.

use bytes::Bytes;
use foldhash::HashMap;

use crate::segment::Record;

/// Collects one batch of committed writes, keeping only the latest per key (or every write, see
/// `keeping_every_write`). Reads never look here: the store's index already holds every write's
/// value.
#[derive(Debug)]
pub struct Reducer {
    kept: Kept,
    first_index: Option<u64>,
    last_index: u64,
    writes_in: u64,
    bytes_in: u64,
}

#[derive(Debug)]
enum Kept {
    LatestPerKey(HashMap<Bytes, (u64, Option<Bytes>)>),
    /// Every write in log order, and where the current entry's keys sit in it: one entry's
    /// writes are one command, and only its resulting value of a key is recorded.
    EveryWrite {
        records: Vec<Record>,
        this_entry: HashMap<Bytes, usize>,
    },
}

/// What a batch reduced to, ready to become a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReducedBatch {
    pub first_index: u64,
    pub last_index: u64,
    /// Sorted by key, one per key, so equal batches encode to equal bytes on every replica; or,
    /// when `log_order`, every write of the batch in log order (at most one per key and entry).
    pub records: Vec<Record>,
    pub log_order: bool,
    /// Writes the batch received before reduction, and their key and value bytes.
    pub writes_in: u64,
    pub bytes_in: u64,
}

impl Default for Reducer {
    fn default() -> Self {
        Reducer::after(0)
    }
}

impl Reducer {
    pub fn new() -> Self {
        Reducer::default()
    }

    /// A reducer whose first entry will come after `index` (the state it extends is at `index`).
    pub fn after(index: u64) -> Self {
        Reducer {
            kept: Kept::LatestPerKey(HashMap::default()),
            first_index: None,
            last_index: index,
            writes_in: 0,
            bytes_in: 0,
        }
    }

    /// A reducer that reduces nothing: the `full` storage mode, the paper's standard log.
    pub fn keeping_every_write(index: u64) -> Self {
        Reducer {
            kept: Kept::EveryWrite {
                records: Vec::new(),
                this_entry: HashMap::default(),
            },
            ..Reducer::after(index)
        }
    }

    /// Notes that log entry `index` was applied, whether or not it wrote anything, so the batch's
    /// range covers it. Indices never go backward.
    pub fn note_index(&mut self, index: u64) {
        assert!(
            index >= self.last_index,
            "log indices never go backward: batch at {}, entry {index}",
            self.last_index
        );
        self.first_index.get_or_insert(index);
        self.last_index = index;
    }

    /// Records that the entry at `index` set `key` to `value`, or deleted it (`None`).
    pub fn write(&mut self, index: u64, key: Bytes, value: Option<Bytes>) {
        self.note_index(index);
        self.writes_in += 1;
        self.bytes_in += (key.len() + value.as_ref().map_or(0, Bytes::len)) as u64;
        match &mut self.kept {
            Kept::LatestPerKey(latest) => {
                latest.insert(key, (index, value));
            }
            Kept::EveryWrite { records, this_entry } => {
                if records.last().is_some_and(|last| last.version != index) {
                    this_entry.clear();
                }
                let record = Record {
                    key: key.clone(),
                    value,
                    version: index,
                };
                match this_entry.get(&key) {
                    Some(position) => records[*position] = record,
                    None => {
                        this_entry.insert(key, records.len());
                        records.push(record);
                    }
                }
            }
        }
    }

    /// Last index noted, in this batch or an earlier one.
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// Key and value bytes written to the batch before reduction.
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in
    }

    /// Whether any entry has been noted since the last `take`.
    pub fn is_empty(&self) -> bool {
        self.first_index.is_none()
    }

    /// Writes collected so far (before reduction).
    pub fn writes_in(&self) -> u64 {
        self.writes_in
    }

    /// The reduced batch, or `None` when no entry was noted; the reducer starts a new batch.
    pub fn take(&mut self) -> Option<ReducedBatch> {
        self.cut().map(CutBatch::reduce)
    }

    /// The batch as collected, or `None` when no entry was noted; the reducer starts a new batch.
    /// Cheap: reducing it (`CutBatch::reduce`, a sort) is left to whoever writes it.
    pub fn cut(&mut self) -> Option<CutBatch> {
        let first_index = self.first_index.take()?;
        let kept = match &mut self.kept {
            Kept::EveryWrite { records, this_entry } => {
                this_entry.clear();
                Kept::EveryWrite {
                    records: std::mem::take(records),
                    this_entry: HashMap::default(),
                }
            }
            // The next batch is likely as large: room for it now costs no rehashing as it grows.
            Kept::LatestPerKey(latest) => {
                let room = HashMap::with_capacity_and_hasher(latest.len(), Default::default());
                Kept::LatestPerKey(std::mem::replace(latest, room))
            }
        };
        Some(CutBatch {
            first_index,
            last_index: self.last_index,
            kept,
            writes_in: std::mem::take(&mut self.writes_in),
            bytes_in: std::mem::take(&mut self.bytes_in),
        })
    }
}

/// A batch cut from a `Reducer`, not yet reduced.
#[derive(Debug)]
pub struct CutBatch {
    pub first_index: u64,
    pub last_index: u64,
    kept: Kept,
    writes_in: u64,
    bytes_in: u64,
}

impl CutBatch {
    /// The last write of each key in key order, or every write in log order.
    pub fn reduce(self) -> ReducedBatch {
        let (records, log_order) = match self.kept {
            Kept::EveryWrite { records, .. } => (records, true),
            Kept::LatestPerKey(latest) => {
                let mut records: Vec<Record> = latest
                    .into_iter()
                    .map(|(key, (version, value))| Record { key, value, version })
                    .collect();
                records.sort_unstable_by(|a, b| a.key.cmp(&b.key));
                (records, false)
            }
        };
        ReducedBatch {
            first_index: self.first_index,
            last_index: self.last_index,
            log_order,
            records,
            writes_in: self.writes_in,
            bytes_in: self.bytes_in,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str, version: u64) -> Record {
        Record {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            version,
        }
    }

    fn tombstone(key: &str, version: u64) -> Record {
        Record {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: None,
            version,
        }
    }

    #[test]
    fn only_the_last_write_of_each_key_survives_and_deletes_leave_tombstones() {
        let mut r = Reducer::new();
        r.write(10, "b".into(), Some("1".into()));
        r.write(11, "a".into(), Some("1".into()));
        r.note_index(12); // a read, or a write that changed nothing
        r.write(13, "b".into(), Some("2".into()));
        r.write(14, "c".into(), Some("1".into()));
        r.write(15, "c".into(), None);
        let batch = r.take().unwrap();
        assert_eq!((batch.first_index, batch.last_index), (10, 15));
        assert_eq!(batch.writes_in, 5);
        assert_eq!(
            batch.records,
            vec![put("a", "1", 11), put("b", "2", 13), tombstone("c", 15),]
        );
        assert!(r.is_empty());
        assert_eq!(r.take(), None);
    }

    #[test]
    fn keeping_every_write_keeps_them_in_log_order_with_one_per_key_and_entry() {
        let mut r = Reducer::keeping_every_write(9);
        r.write(10, "b".into(), Some("1".into()));
        r.write(11, "a".into(), Some("1".into()));
        r.write(11, "a".into(), Some("2".into())); // MSET a 1 a 2: the command's result
        r.write(12, "b".into(), Some("2".into()));
        r.write(13, "b".into(), None);
        let batch = r.take().unwrap();
        assert!(batch.log_order);
        assert_eq!((batch.first_index, batch.last_index, batch.writes_in), (10, 13, 5));
        assert_eq!(
            batch.records,
            vec![
                put("b", "1", 10),
                put("a", "2", 11),
                put("b", "2", 12),
                tombstone("b", 13),
            ]
        );
        r.write(14, "a".into(), Some("3".into()));
        assert_eq!(r.take().unwrap().records, vec![put("a", "3", 14)]);
    }

    #[test]
    fn a_batch_of_reads_covers_its_range_with_no_records() {
        let mut r = Reducer::new();
        r.note_index(7);
        r.note_index(9);
        let batch = r.take().unwrap();
        assert_eq!((batch.first_index, batch.last_index, batch.records.len()), (7, 9, 0));
    }

    #[test]
    #[should_panic(expected = "never go backward")]
    fn indices_going_backward_is_a_bug() {
        let mut r = Reducer::new();
        r.note_index(9);
        r.note_index(8);
    }
}
