//! Serving before the index is built. Start-up reads the index blocks of the segments a manifest
//! lists (its I/O), and the store serves at once while another thread builds the in-memory index
//! from those blocks — most of a start-up's time is that table taking one key at a time. Until it
//! is built, a key not written since start-up is looked up in the blocks themselves: a reduced
//! segment holds one record per key in key order, so that is a binary search per segment, newest
//! first. Writes made meanwhile are newer than every record in those segments; when the built
//! index arrives they are laid over it (see `Store::absorb_built_index`).

use std::sync::{mpsc, Arc};

use crate::scan_map::{GroupOf, ScanMap};
use crate::segment::{segment_bytes_per_record, IndexEntry};
use crate::store::{LiveRecords, Location};

/// Where indexing whole segments records which of their records the index points at.
pub(crate) trait LiveTally {
    fn live(&mut self, id: u64, record_offset: u64, bytes: u64);
    fn dead(&mut self, id: u64, record_offset: u64, bytes: u64);
}

/// Points `index` at the records of segment `id`, which follows in log order every segment
/// indexed before it and nothing unwritten: each record becomes its key's latest (a tombstone
/// removes the key), and the record it replaces dies.
pub(crate) fn index_records(
    index: &mut ScanMap<Location>,
    tally: &mut impl LiveTally,
    id: u64,
    entries: impl IntoIterator<Item = IndexEntry>,
) {
    for entry in entries {
        let (key_len, version, record_offset, segment_bytes) = (
            entry.key.len(),
            entry.version,
            entry.record_offset,
            entry.segment_bytes() as u64,
        );
        let replaced = if entry.is_tombstone {
            index.remove(&entry.key)
        } else {
            let location = Location {
                segment: id,
                record_offset,
                value_len: entry.value_len,
                version,
                value: None,
            };
            index.insert(entry.key, location)
        };
        if let Some(replaced) = replaced {
            assert!(replaced.version < version, "a key's versions only grow");
            assert!(
                replaced.value.is_none(),
                "nothing is in memory while segments are indexed whole"
            );
            tally.dead(
                replaced.segment,
                replaced.record_offset,
                segment_bytes_per_record(key_len, replaced.value_len) as u64,
            );
        }
        if !entry.is_tombstone {
            tally.live(id, record_offset, segment_bytes);
        }
    }
}

/// The index entries of the segments found at start-up, oldest first; their ids are consecutive
/// from `first_id`. Each segment's entries are in key order, one per key.
pub(crate) struct StartupSegments {
    first_id: u64,
    entries: Vec<Vec<IndexEntry>>,
}

impl StartupSegments {
    /// The newest record of `key` in these segments, and its segment's id.
    pub(crate) fn find(&self, key: &[u8]) -> Option<(u64, &IndexEntry)> {
        self.entries.iter().enumerate().rev().find_map(|(slot, entries)| {
            let at = entries.binary_search_by(|entry| entry.key.as_ref().cmp(key)).ok()?;
            Some((self.first_id + slot as u64, &entries[at]))
        })
    }

    /// Entries of keys that start with `prefix`, segment by segment (a key may repeat).
    pub(crate) fn with_prefix<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = &'a IndexEntry> + 'a {
        self.entries.iter().flat_map(move |entries| {
            let start = entries.partition_point(|entry| entry.key.as_ref() < prefix);
            entries[start..]
                .iter()
                .take_while(move |entry| entry.key.starts_with(prefix))
        })
    }

    /// Whether the newest record of `key` in these segments is a value.
    pub(crate) fn holds_value(&self, key: &[u8]) -> bool {
        self.find(key).is_some_and(|(_, entry)| !entry.is_tombstone)
    }
}

/// One start-up segment's records that the built index points at.
pub(crate) struct SegmentLiveness {
    pub(crate) live_records: u64,
    pub(crate) live_bytes: u64,
    pub(crate) live: LiveRecords,
}

/// The liveness of every start-up segment, by id.
pub(crate) struct StartupLiveness {
    first_id: u64,
    segments: Vec<SegmentLiveness>,
}

impl StartupLiveness {
    fn segment(&mut self, id: u64) -> &mut SegmentLiveness {
        let slot = id.checked_sub(self.first_id).expect("a start-up segment's id") as usize;
        &mut self.segments[slot]
    }

    /// Each segment's id and liveness.
    pub(crate) fn into_segments(self) -> impl Iterator<Item = (u64, SegmentLiveness)> {
        (self.first_id..).zip(self.segments)
    }
}

impl LiveTally for StartupLiveness {
    fn live(&mut self, id: u64, record_offset: u64, bytes: u64) {
        let segment = self.segment(id);
        segment.live.set(record_offset);
        segment.live_records += 1;
        segment.live_bytes += bytes;
    }

    fn dead(&mut self, id: u64, record_offset: u64, bytes: u64) {
        let segment = self.segment(id);
        segment.live.clear(record_offset);
        segment.live_records -= 1;
        segment.live_bytes -= bytes;
    }
}

/// The index of the start-up segments and which of their records it points at.
pub(crate) struct BuiltIndex {
    pub(crate) index: ScanMap<Location>,
    pub(crate) liveness: StartupLiveness,
}

/// An index being built from the start-up segments on a thread of its own.
pub(crate) struct IndexBuild {
    pub(crate) segments: Arc<StartupSegments>,
    built: mpsc::Receiver<BuiltIndex>,
}

impl IndexBuild {
    /// Starts building the index of `segments` — each segment's file size and entries, oldest
    /// first, ids consecutive from `first_id`. The thread waits for `hold` (tests) before it begins.
    pub(crate) fn start(
        first_id: u64,
        segments: Vec<(u64, Vec<IndexEntry>)>,
        group_of: GroupOf,
        hold: Option<mpsc::Receiver<()>>,
    ) -> IndexBuild {
        let (file_bytes, entries): (Vec<u64>, Vec<Vec<IndexEntry>>) = segments.into_iter().unzip();
        let segments = Arc::new(StartupSegments { first_id, entries });
        let (done, built) = mpsc::sync_channel(1);
        let to_index = segments.clone();
        std::thread::Builder::new()
            .name("index-builder".into())
            .spawn(move || {
                if let Some(hold) = hold {
                    let _ = hold.recv();
                }
                let mut index = ScanMap::new(group_of);
                index.reserve_for(to_index.entries.iter().flatten().map(|entry| entry.key.as_ref()));
                let mut liveness = StartupLiveness {
                    first_id,
                    segments: file_bytes
                        .into_iter()
                        .map(|file_bytes| SegmentLiveness {
                            live_records: 0,
                            live_bytes: 0,
                            live: LiveRecords::new(file_bytes),
                        })
                        .collect(),
                };
                for (id, entries) in (first_id..).zip(&to_index.entries) {
                    index_records(&mut index, &mut liveness, id, entries.iter().cloned());
                }
                drop(to_index);
                // The store may have closed meanwhile; then nobody wants it.
                let _ = done.send(BuiltIndex { index, liveness });
            })
            .expect("spawn index builder");
        IndexBuild { segments, built }
    }

    /// The built index, if it is ready.
    pub(crate) fn try_built(&self) -> Option<BuiltIndex> {
        match self.built.try_recv() {
            Ok(built) => Some(built),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => panic!("index builder thread vanished"),
        }
    }

    /// The built index, once it is ready.
    pub(crate) fn built(&self) -> BuiltIndex {
        self.built.recv().expect("index builder thread vanished")
    }
}

/// A key's entry in the index while the start-up segments' index is built, for a key deleted
/// since start-up whose newest record in those segments is a value: it hides that value until
/// the built index arrives, and then takes it out.
pub(crate) const DELETED_SINCE_START_UP: u64 = u64::MAX;

pub(crate) fn deleted_since_start_up(version: u64) -> Location {
    Location {
        segment: DELETED_SINCE_START_UP,
        record_offset: 0,
        version,
        value_len: 0,
        value: None,
    }
}
