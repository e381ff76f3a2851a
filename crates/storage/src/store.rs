//! The store: the key-value state as reduced segments on disk, an in-memory index of where each
//! live key's latest record is, and a bounded object cache of values.
//!
//! A write updates the index at once — its value held in the index entry until a segment holds
//! it — and lands in the batch being built (a `Reducer`). A cut hands the reduced batch to a
//! writer thread (one per data directory, taking batches in turn), which persists it as a
//! segment; the store then points the index at the segments' records in log order, a slice per
//! applied entry, and values it points at move into the object cache. A read is therefore one index lookup, then the value in memory or a positioned read of
//! the segment.
//!
//! Which segments hold the state at an index is a `Manifest`; the raft snapshot carries it, and
//! start-up opens exactly the segments it lists (deleting any other segment, which a replay of
//! the raft log past the manifest rewrites).
//!
//! A cleaner thread merges a run of consecutive segments into one once enough of their bytes are
//! dead — the run that frees the most per byte it moves, so mostly-live segments are not
//! rewritten by every merge; the store repoints the index at the merged segment a slice at a
//! time, and deletes the replaced files once a persisted manifest no longer names them and no
//! shipment to a lagging follower reads them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::ops::{Bound, Range};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;
use std::time::Instant;

use bytes::Bytes;
use foldhash::{HashMap, HashSet};

use crate::cache::{CacheSlots, CacheStats, ObjectCache, ValueSlot};
use crate::manifest::Manifest;
use crate::reduce::{CutBatch, ReducedBatch, Reducer};
use crate::retirer::Retirer;
use crate::scan_map::{no_groups, GroupOf, ScanMap};
use crate::segment::{
    create_dir_durably, decode_record, in_file, io_error, parse_spare_name, read_segment_index, record_len,
    segment_bytes_per_record, segment_file_name, spare_file_name, sync_dir, verify_segment, write_segment, IndexEntry,
    Record, RecordStream, SegmentError, SegmentIndex, SegmentWriter, FOOTER_BYTES, HEADER_BYTES, RECORD_OVERHEAD_BYTES,
};
use crate::startup_index::{
    deleted_since_start_up, index_records, IndexBuild, LiveTally, SegmentLiveness, DELETED_SINCE_START_UP,
};

/// What a segment keeps of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageMode {
    /// The last write of each key (the log reduction), merged further by the cleaner; start-up
    /// reads segment indexes, not values.
    Reduced,
    /// Every write in log order, never cleaned, replayed whole at start-up: the standard log the
    /// reduction is measured against, in the same code.
    Full,
}

impl std::str::FromStr for StorageMode {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "reduced" => Ok(StorageMode::Reduced),
            "full" => Ok(StorageMode::Full),
            other => Err(format!("unknown storage mode {other:?}: reduced or full")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Where segments are written, merged and installed.
    pub dir: PathBuf,
    /// Further directories (ideally on other devices) the writer's segments are spread over, one
    /// writer thread each: the paper's parallel logging. A directory may be added between runs,
    /// never taken away.
    pub more_dirs: Vec<PathBuf>,
    pub mode: StorageMode,
    /// Bytes of memory the object cache may take: its values, keys and per-object bookkeeping.
    pub cache_bytes: usize,
    /// Extra µs each value read off the caller's thread (`locate`'s `DiskRead`) waits, as on a
    /// slower device (a network-attached volume): for experiments, 0 otherwise.
    pub emulated_device_read_us: u64,
    /// A batch is cut once it holds this many writes or this many key and value bytes.
    pub batch_writes: u64,
    pub batch_bytes: u64,
    /// Cut batches waiting for the writer before a cut waits for it (bounds memory).
    pub max_unwritten_batches: usize,
    /// Which keys form groups that are kept together and scanned together (see `ScanMap`).
    pub group_of: GroupOf,
    /// The cleaner merges the segments once this share of their bytes is dead (overwritten or
    /// deleted records, tombstones), at least `min_cleanable_dead_bytes` are, and there are at
    /// least `cleaner_min_segments` segments. The floor in bytes is Bitcask's dead-bytes
    /// trigger: a small live set is otherwise cleaned again and again while its segments are
    /// still half live (each merge rewriting that half); given room, old segments die almost
    /// whole first, and merging them moves next to nothing.
    pub min_cleanable_dirty_ratio: f64,
    pub min_cleanable_dead_bytes: u64,
    pub cleaner_min_segments: usize,
    /// Once more than `consolidate_above_segments` segments are smaller than half
    /// `consolidated_segment_bytes`, the cleaner also merges runs of them into one of about
    /// that size, dead bytes or not, so that start-up, catch-up and the directory deal with
    /// a bounded number of files rather than one per batch (0 bytes: never). Below that count
    /// segments are left to die: under overwrites most soon would, and consolidating them would
    /// rewrite (and repoint, on the raft loop) what the dirty-ratio merge later drops anyway.
    /// While writes keep coming, consolidation waits for a tick with none, unless the small
    /// segments reach twice the bound.
    /// Tiny segments (see `gathered_tiny_bytes`) are merged whatever their number.
    pub consolidated_segment_bytes: u64,
    pub consolidate_above_segments: usize,
    /// Most bytes a merge of dirty segments keeps, and so about the largest segment it writes:
    /// a merge holds the index of what it keeps in memory, and the raft loop repoints it.
    pub max_merged_segment_bytes: u64,
    /// Most bytes per second the cleaner reads, so it does not starve the foreground.
    pub cleaner_read_bytes_per_sec: u64,
    /// Records of a written segment indexed, and index entries a finished merge repoints, per
    /// applied entry: both are spread over entries rather than pausing the raft loop for all of
    /// a segment at once.
    pub adoption_step_records: usize,
    pub merge_adoption_step_records: usize,
    /// Read values that are not in the cache past the page cache (`O_DIRECT`) where the file
    /// system allows it: a miss is then a device read, as on a machine whose data does not fit
    /// its memory, and the object cache is the only cache of values.
    pub value_direct_io: bool,
    /// Which keys' values this store caches when they are written or read from disk (LDC: the
    /// keys this node owns); a value already cached is always kept up to date.
    pub caches: CachePolicy,
}

/// Which keys a store caches (`StoreOptions::caches`).
#[derive(Clone, Default)]
pub struct CachePolicy(Option<Arc<OwnsKey>>);

/// Whether a key is this store's to cache.
type OwnsKey = dyn Fn(&[u8]) -> bool + Send + Sync;

impl CachePolicy {
    /// Caches only the keys `owns` says yes to.
    pub fn only(owns: impl Fn(&[u8]) -> bool + Send + Sync + 'static) -> CachePolicy {
        CachePolicy(Some(Arc::new(owns)))
    }

    pub fn caches(&self, key: &[u8]) -> bool {
        self.0.as_ref().is_none_or(|owns| owns(key))
    }

    /// Whether some keys are not cached (then a miss may be worth serving from elsewhere).
    pub fn is_selective(&self) -> bool {
        self.0.is_some()
    }
}

impl std::fmt::Debug for CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "CachePolicy(some keys)"
        } else {
            "CachePolicy(every key)"
        })
    }
}

impl StoreOptions {
    /// `dir`, then `more_dirs`.
    pub fn all_dirs(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.dir).chain(&self.more_dirs)
    }

    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StoreOptions {
            dir: dir.into(),
            more_dirs: Vec::new(),
            mode: StorageMode::Reduced,
            cache_bytes: 256 << 20,
            emulated_device_read_us: 0,
            batch_writes: 1_000,
            batch_bytes: 4 << 20,
            max_unwritten_batches: 8,
            group_of: no_groups,
            min_cleanable_dirty_ratio: 0.5,
            min_cleanable_dead_bytes: 0,
            cleaner_min_segments: 4,
            consolidated_segment_bytes: 8 << 20,
            consolidate_above_segments: 512,
            max_merged_segment_bytes: 64 << 20,
            cleaner_read_bytes_per_sec: 64 << 20,
            adoption_step_records: 256,
            merge_adoption_step_records: 1_024,
            value_direct_io: false,
            caches: CachePolicy::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Segment(#[from] SegmentError),
    #[error("{0}")]
    Inconsistent(String),
}

/// Where a live key's latest record is, and its value when in memory. One per live key, so its
/// size is most of the index's: 32 bytes.
#[derive(Debug, Clone)]
pub(crate) struct Location {
    /// Id of the segment in `Store::segments` holding the latest write, `UNWRITTEN` while only
    /// a batch holds it (its value is then held in `value`), or `DELETED_SINCE_START_UP`.
    pub(crate) segment: u64,
    pub(crate) record_offset: u64,
    /// Log index of the latest write.
    pub(crate) version: u64,
    pub(crate) value_len: u32,
    /// The value in memory, unwritten or cached.
    pub(crate) value: Option<ValueSlot>,
}

const _: () = assert!(std::mem::size_of::<Location>() == 32);

/// About what one live record costs the index in memory, its value aside: a 32-byte key handle,
/// its `Location` and a control byte, in a table kept 60–87% full (for a record in a group, an
/// ordered map's entry of two handles and a `Location`, about as much).
pub const INDEX_BYTES_PER_RECORD: u64 = 96;

/// Segment ids start at 1.
const UNWRITTEN: u64 = 0;

impl CacheSlots for ScanMap<Location> {
    fn slot(&mut self, key: &[u8]) -> Option<&mut Option<ValueSlot>> {
        self.get_mut(key).map(|location| &mut location.value)
    }
}

struct SegmentFile {
    first_index: u64,
    last_index: u64,
    path: PathBuf,
    file_bytes: u64,
    /// Records in the segment that are still the latest of their key, and the bytes they and
    /// their index entries take.
    live_records: u64,
    live_bytes: u64,
    /// Bytes the segment's tombstones take: a merge keeps them unless it starts at the oldest
    /// segment (an older one could still hold their keys).
    tombstone_bytes: u64,
    /// Which of its records are live: what a merge keeps of it.
    live: LiveRecords,
}

/// Which of a segment's records are live (the latest write of their key), by record offset. A
/// record is longer than `LIVE_SLOT_BYTES`, so no two start in one slot. The cleaner keeps
/// exactly these, so it reads nothing but the segments it merges, in memory bounded however
/// large they are; the cost is a bit per 16 bytes of segment, under 1% of the data.
#[derive(Debug, Clone)]
pub(crate) struct LiveRecords(Vec<u64>);

const LIVE_SLOT_BYTES: u64 = 16;
const _: () = assert!(RECORD_OVERHEAD_BYTES as u64 > LIVE_SLOT_BYTES);

impl LiveRecords {
    pub(crate) fn new(file_bytes: u64) -> LiveRecords {
        LiveRecords(vec![0; (file_bytes / LIVE_SLOT_BYTES / 64 + 1) as usize])
    }

    fn bit(offset: u64) -> (usize, u64) {
        let slot = offset / LIVE_SLOT_BYTES;
        ((slot / 64) as usize, 1 << (slot % 64))
    }

    pub(crate) fn set(&mut self, offset: u64) {
        let (word, bit) = LiveRecords::bit(offset);
        assert_eq!(self.0[word] & bit, 0, "a record becomes live once");
        self.0[word] |= bit;
    }

    pub(crate) fn clear(&mut self, offset: u64) {
        let (word, bit) = LiveRecords::bit(offset);
        assert_ne!(self.0[word] & bit, 0, "only a live record dies");
        self.0[word] &= !bit;
    }

    fn contains(&self, offset: u64) -> bool {
        let (word, bit) = LiveRecords::bit(offset);
        self.0.get(word).is_some_and(|w| w & bit != 0)
    }
}

/// The segments that make up the state, by id (which grows with each one added), in log order,
/// and their byte totals, kept as they change: the dirty ratio costs the same however many
/// segments there are, and choosing a merge never sorts them.
struct SegmentSet {
    by_id: BTreeMap<u64, SegmentFile>,
    /// (first index, id) of every segment. While a merge is adopted, the merged segment and the
    /// first one it replaces share a first index.
    in_log_order: BTreeSet<(u64, u64)>,
    /// (first index, id) of the segments smaller than `small_below_bytes`: what consolidation
    /// merges.
    small: BTreeSet<(u64, u64)>,
    small_below_bytes: u64,
    /// (first index, id) of the segments smaller than `tiny_below_bytes`, a subset of `small`.
    tiny: BTreeSet<(u64, u64)>,
    tiny_below_bytes: u64,
    /// Segments ever inserted: how the cleaner tells that the set changed since it last looked.
    inserted: u64,
    file_bytes: u64,
    live_bytes: u64,
}

impl SegmentSet {
    /// A set whose small and tiny segments are those of consolidation towards
    /// `consolidated_segment_bytes`.
    fn new(consolidated_segment_bytes: u64) -> SegmentSet {
        SegmentSet {
            by_id: BTreeMap::new(),
            in_log_order: BTreeSet::new(),
            small: BTreeSet::new(),
            small_below_bytes: small_below_bytes(consolidated_segment_bytes),
            tiny: BTreeSet::new(),
            tiny_below_bytes: small_below_bytes(gathered_tiny_bytes(consolidated_segment_bytes)),
            inserted: 0,
            file_bytes: 0,
            live_bytes: 0,
        }
    }

    fn insert(&mut self, id: u64, segment: SegmentFile) {
        assert_eq!(
            segment.live_records, 0,
            "a segment is added before its records are live"
        );
        self.file_bytes += segment.file_bytes;
        self.inserted += 1;
        self.in_log_order.insert((segment.first_index, id));
        if segment.file_bytes < self.small_below_bytes {
            self.small.insert((segment.first_index, id));
        }
        if segment.file_bytes < self.tiny_below_bytes {
            self.tiny.insert((segment.first_index, id));
        }
        assert!(self.by_id.insert(id, segment).is_none(), "segment ids are not reused");
    }

    fn remove(&mut self, id: u64) -> SegmentFile {
        let segment = self.by_id.remove(&id).expect("a removed segment is the store's");
        self.in_log_order.remove(&(segment.first_index, id));
        self.small.remove(&(segment.first_index, id));
        self.tiny.remove(&(segment.first_index, id));
        self.file_bytes -= segment.file_bytes;
        self.live_bytes -= segment.live_bytes;
        segment
    }

    /// The id of the segment whose records start at `first_index` (none is being adopted).
    fn starting_at(&self, first_index: u64) -> Option<u64> {
        let mut found = self.in_log_order.range((first_index, 0)..=(first_index, u64::MAX));
        let (_, id) = *found.next()?;
        assert!(found.next().is_none(), "segments start at distinct indexes");
        Some(id)
    }

    /// Ids of the segments in log order, from the oldest of `from` (`small` or `tiny`), at most
    /// `count`: where a consolidation run can start (everything older is too large to be in one).
    fn onward_from_oldest(&self, from: &BTreeSet<(u64, u64)>, count: usize) -> Vec<u64> {
        let Some(&oldest) = from.first() else {
            return Vec::new();
        };
        self.in_log_order
            .range(oldest..)
            .take(count)
            .map(|&(_, id)| id)
            .collect()
    }

    /// The record at `offset` of segment `id`, `bytes` long, became the latest of its key.
    fn record_live(&mut self, id: u64, offset: u64, bytes: u64) {
        let segment = self.by_id.get_mut(&id).expect("a live record's segment is the store's");
        segment.live.set(offset);
        segment.live_records += 1;
        segment.live_bytes += bytes;
        self.live_bytes += bytes;
    }

    /// The record at `offset` of segment `id`, `bytes` long, stopped being the latest of its key.
    fn record_dead(&mut self, id: u64, offset: u64, bytes: u64) {
        let segment = self.by_id.get_mut(&id).expect("a dead record's segment is the store's");
        segment.live.clear(offset);
        segment.live_records -= 1;
        segment.live_bytes -= bytes;
        self.live_bytes -= bytes;
    }

    /// Segment `id`'s live records as the index built at start-up found them: none was live
    /// before.
    fn set_live(&mut self, id: u64, liveness: SegmentLiveness) {
        let segment = self.by_id.get_mut(&id).expect("a start-up segment is the store's");
        assert_eq!(segment.live_records, 0, "a start-up segment's records are counted once");
        segment.live = liveness.live;
        segment.live_records = liveness.live_records;
        segment.live_bytes = liveness.live_bytes;
        self.live_bytes += liveness.live_bytes;
    }

    /// Which records of segment `id` are live, to mark those a merge moved into it (`move_live`
    /// settles the counts).
    fn live_mut(&mut self, id: u64) -> &mut LiveRecords {
        &mut self.by_id.get_mut(&id).expect("a merged segment is the store's").live
    }

    /// `records` live records of segment `from`, `bytes` long in all, are now in segment `to`.
    fn move_live(&mut self, from: u64, to: u64, records: u64, bytes: u64) {
        let from = self
            .by_id
            .get_mut(&from)
            .expect("a moved record's segment is the store's");
        from.live_records -= records;
        from.live_bytes -= bytes;
        let to = self
            .by_id
            .get_mut(&to)
            .expect("a moved record's segment is the store's");
        to.live_records += records;
        to.live_bytes += bytes;
    }

    fn dead_bytes(&self) -> u64 {
        self.file_bytes - self.live_bytes
    }

    fn dirty_ratio(&self) -> f64 {
        if self.file_bytes == 0 {
            0.0
        } else {
            1.0 - self.live_bytes as f64 / self.file_bytes as f64
        }
    }

    fn get(&self, id: u64) -> &SegmentFile {
        &self.by_id[&id]
    }

    fn len(&self) -> usize {
        self.by_id.len()
    }
}

impl LiveTally for SegmentSet {
    fn live(&mut self, id: u64, record_offset: u64, bytes: u64) {
        self.record_live(id, record_offset, bytes);
    }

    fn dead(&mut self, id: u64, record_offset: u64, bytes: u64) {
        self.record_dead(id, record_offset, bytes);
    }
}

/// Start-up reads this many listed segments at once, then indexes them in log order. Reading is
/// bound by the device's latency (an open and a few reads per file), which reads in flight
/// together overlap.
const OPEN_WINDOW_SEGMENTS: usize = 256;
const OPEN_READER_THREADS: usize = 8;

/// Most segments a read searches while the start-up index is built (a binary search in each);
/// with more, a store waits for the index before it serves. Consolidation keeps a store's small
/// segments to about `consolidate_above_segments` (512 by default).
const SEARCHED_AT_START_UP_SEGMENTS: usize = 2_048;

/// A segment read at start-up: its path and index.
type LoadedSegment = (PathBuf, SegmentIndex);

/// Reads the segments `window` lists, in parallel; their paths and indexes in the same order.
/// Each listed range with where its segment is (`dir` when it was not found, which loading then
/// reports as missing).
fn locate(dir: &Path, ranges: &[(u64, u64)], found: &HashMap<(u64, u64), PathBuf>) -> Vec<LocatedSegment> {
    ranges
        .iter()
        .map(|range| {
            let path = found
                .get(range)
                .cloned()
                .unwrap_or_else(|| dir.join(segment_file_name(range.0, range.1)));
            (*range, path)
        })
        .collect()
}

/// A listed segment's range and path.
type LocatedSegment = ((u64, u64), PathBuf);

fn load_segments(mode: StorageMode, window: &[LocatedSegment]) -> Result<Vec<LoadedSegment>, StoreError> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let loaded: Vec<Mutex<Option<Result<LoadedSegment, StoreError>>>> =
        window.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..OPEN_READER_THREADS.min(window.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((range, path)) = window.get(i) else {
                    return;
                };
                *loaded[i].lock().expect("not poisoned") = Some(load_segment(mode, *range, path));
            });
        }
    });
    loaded
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .expect("not poisoned")
                .expect("every segment was read")
        })
        .collect()
}

/// Reads a segment a manifest lists: its index, or in `full` mode every record (a standard log is
/// replayed whole, every record read and checked).
fn load_segment(mode: StorageMode, (first, last): (u64, u64), path: &Path) -> Result<LoadedSegment, StoreError> {
    if !path.exists() {
        return Err(StoreError::Inconsistent(format!(
            "{}: listed in the snapshot's manifest but missing",
            path.display()
        )));
    }
    let index = match mode {
        StorageMode::Reduced => read_segment_index(path)?,
        StorageMode::Full => {
            let bytes = std::fs::read(path).map_err(io_error(path))?;
            verify_segment(&bytes).map_err(in_file(path))?
        }
    };
    if (index.header.first_index, index.header.last_index) != (first, last) {
        return Err(StoreError::Inconsistent(format!(
            "{}: header says [{}, {}]",
            path.display(),
            index.header.first_index,
            index.header.last_index
        )));
    }
    Ok((path.to_path_buf(), index))
}

/// Segment files kept open for value reads; more are opened (and one closed) on demand.
const MAX_OPEN_SEGMENTS: usize = 64;

/// A segment the writer made durable whose records the index is being pointed at, a slice at a
/// time.
struct Adoption {
    id: u64,
    entries: Vec<IndexEntry>,
    next: usize,
}

/// A finished merge whose records are being pointed at, a slice at a time.
struct MergeAdoption {
    merged_id: u64,
    /// The job's `horizon`: until no manifest with an older `through` may still list segments,
    /// the merged segment does not replace the others in what manifests list.
    horizon: u64,
    /// Each replaced segment's id → its slot in `moved`.
    replaced: HashMap<u64, usize>,
    /// Live records and bytes moved so far from each replaced segment to the merged one, settled
    /// into the segment totals per slice rather than per record.
    moved: Vec<(u64, u64)>,
    entries: Vec<IndexEntry>,
    next: usize,
}

/// A segment made durable (by the writer, the cleaner, or before start-up), with its tombstone
/// bytes summed where it was written, off the raft loop.
struct Written {
    first_index: u64,
    path: PathBuf,
    index: SegmentIndex,
    tombstone_bytes: u64,
}

impl Written {
    fn new(first_index: u64, path: PathBuf, index: SegmentIndex) -> Written {
        let tombstone_bytes = index
            .entries
            .iter()
            .filter(|entry| entry.is_tombstone)
            .map(|entry| entry.segment_bytes() as u64)
            .sum();
        Written {
            first_index,
            path,
            index,
            tombstone_bytes,
        }
    }
}

impl SegmentFile {
    /// A segment none of whose records is live yet; its entries go to the adoption.
    fn new(written: Written) -> (SegmentFile, Vec<IndexEntry>) {
        let segment = SegmentFile {
            first_index: written.first_index,
            last_index: written.index.header.last_index,
            path: written.path,
            file_bytes: written.index.file_bytes,
            live_records: 0,
            live_bytes: 0,
            tombstone_bytes: written.tombstone_bytes,
            live: LiveRecords::new(written.index.file_bytes),
        };
        (segment, written.index.entries)
    }
}

/// A segment the cleaner made durable from the segments starting at `replaces`.
struct Merged {
    replaces: Vec<u64>,
    written: Written,
    /// The job's `horizon`.
    horizon: u64,
}

/// A manifest that has yet to list segments, registered in `Durable::listing` until it has or
/// is dropped unlisted.
struct WaitingToList {
    shared: Arc<Shared>,
    through: u64,
    listed: bool,
}

impl WaitingToList {
    fn listed(&mut self, durable: &mut Durable) {
        durable.stop_listing(self.through);
        self.listed = true;
    }
}

impl Drop for WaitingToList {
    fn drop(&mut self) {
        if !self.listed {
            self.shared
                .durable
                .lock()
                .expect("not poisoned")
                .stop_listing(self.through);
        }
    }
}

/// What the writer has written, for those who wait on it from other threads.
#[derive(Default)]
struct Durable {
    /// Last index of the newest written segment.
    written_through: u64,
    /// First indices of the batches cut and not yet written: writers run in parallel, so one may
    /// finish a later batch before an earlier one.
    in_flight: std::collections::BTreeSet<u64>,
    /// `first → last` of the written segments that make up the state.
    segments: BTreeMap<u64, u64>,
    /// Those of them not yet synced, and where they are: a manifest syncs what it lists, so
    /// segment writes cost no fsync each and the raft log's fsyncs do not queue behind them.
    unsynced: HashMap<(u64, u64), PathBuf>,
    /// `through` of the manifests that have yet to list segments, and how many have each.
    listing: BTreeMap<u64, usize>,
}

impl Durable {
    fn stop_listing(&mut self, through: u64) {
        let waiting = self
            .listing
            .get_mut(&through)
            .expect("a manifest waiting to list is registered");
        *waiting -= 1;
        if *waiting == 0 {
            self.listing.remove(&through);
        }
    }

    /// Every index up to this one is in a written segment.
    fn through(&self) -> u64 {
        self.in_flight
            .first()
            .map_or(self.written_through, |first| self.written_through.min(first - 1))
    }
}

#[derive(Default)]
struct Shared {
    durable: Mutex<Durable>,
    changed: Condvar,
    /// Set when the store closes: the writer stops retrying a failing write (what it has not
    /// written is past every manifest, so the raft log replays it) and the cleaner stops.
    closing: AtomicBool,
    /// A segment write is failing for want of space (see `Store::out_of_space`).
    out_of_space: AtomicBool,
    spares: Mutex<Spares>,
}

/// Files of retired segments, kept for new segments to overwrite (see `write_segment`), with
/// their sizes.
#[derive(Default)]
struct Spares {
    files: Vec<(PathBuf, u64)>,
    /// Bytes of spare files kept at most (`spare_budget_bytes`); past that a retired segment's
    /// file is deleted.
    budget_bytes: u64,
    next_number: u64,
}

/// Spare files kept at most, whatever their size.
const MAX_SPARE_FILES: usize = 4096;

/// The least room spares may take. They get as much as the cleaner lets die before it merges
/// (`min_cleanable_dead_bytes`): a merge retires about that much at once, and the writers write
/// about as much again before the next one, so with that many bytes of spares they create no
/// file in between. Creating one is what the spares are for avoiding: on ext4 without a journal
/// a new inode is never one deleted in the last minutes, and finding one scans past every
/// segment a merge just deleted (with 64 spare files at most, under 100% writes, a fifth of a
/// segment writer's time went there).
const SPARE_BYTES_FLOOR: u64 = 16 << 20;

fn spare_budget_bytes(options: &StoreOptions) -> u64 {
    options.min_cleanable_dead_bytes.max(SPARE_BYTES_FLOOR)
}

impl Spares {
    fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, file_bytes)| file_bytes).sum()
    }
}

impl Shared {
    /// Takes spare files found at start-up (their contents are garbage) as spares, within the
    /// budget; returns those past it, to delete.
    fn keep_spares(&self, mut found: Vec<FoundSpare>) -> Vec<PathBuf> {
        found.sort_unstable_by_key(|spare| spare.number);
        let mut spares = self.spares.lock().expect("not poisoned");
        let mut kept_bytes = spares.bytes();
        let mut excess = Vec::new();
        for FoundSpare {
            number,
            file_bytes,
            path,
        } in found
        {
            spares.next_number = spares.next_number.max(number + 1);
            if spares.files.len() < MAX_SPARE_FILES && kept_bytes + file_bytes <= spares.budget_bytes {
                kept_bytes += file_bytes;
                spares.files.push((path, file_bytes));
            } else {
                excess.push(path);
            }
        }
        excess
    }

    /// A spare file in `dir`, if there is one.
    fn take_spare(&self, dir: &Path) -> Option<PathBuf> {
        let mut spares = self.spares.lock().expect("not poisoned");
        let position = spares.files.iter().position(|(path, _)| path.parent() == Some(dir))?;
        Some(spares.files.swap_remove(position).0)
    }

    /// Retires segment files no manifest lists: renamed to spares while there is room, deleted
    /// past it; durable once each directory is synced.
    fn retire_files(&self, paths: &[PathBuf]) -> Result<(), StoreError> {
        let mut spares = self.spares.lock().expect("not poisoned");
        for path in paths {
            let file_bytes = std::fs::metadata(path).map_err(io_error(path))?.len();
            if spares.files.len() < MAX_SPARE_FILES && spares.bytes() + file_bytes <= spares.budget_bytes {
                let spare = path.with_file_name(spare_file_name(spares.next_number, file_bytes));
                spares.next_number += 1;
                std::fs::rename(path, &spare).map_err(io_error(path))?;
                spares.files.push((spare, file_bytes));
            } else {
                std::fs::remove_file(path).map_err(io_error(path))?;
            }
        }
        drop(spares);
        sync_parent_dirs(paths)
    }
}

/// The number and size in a spare file's name (see `spare_file_name`).
fn spare_name(path: &Path) -> Option<(u64, u64)> {
    parse_spare_name(path.file_name()?.to_str()?)
}

/// A spare file start-up found, and what its name says.
struct FoundSpare {
    number: u64,
    file_bytes: u64,
    path: PathBuf,
}

/// How many shipments read each segment, by `(first, last)`.
type Pins = Arc<Mutex<HashMap<(u64, u64), usize>>>;

/// Segments being shipped to a follower (see `Store::pin_segments`); dropping it unpins them,
/// and the next persisted manifest deletes those a merge replaced.
pub struct PinnedSegments {
    pins: Pins,
    ranges: Vec<(u64, u64)>,
    /// Each segment's file name and path, in log order.
    pub files: Vec<(String, PathBuf)>,
}

impl Drop for PinnedSegments {
    fn drop(&mut self) {
        let mut pins = self.pins.lock().expect("not poisoned");
        for range in &self.ranges {
            let count = pins.get_mut(range).expect("a pinned segment is counted");
            *count -= 1;
            if *count == 0 {
                pins.remove(range);
            }
        }
    }
}

/// Counters of what reduction did, since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Writes applied, and their key and value bytes.
    pub writes_in: u64,
    pub bytes_in: u64,
    /// Records persisted in segments, and the segments' bytes.
    pub records_out: u64,
    pub bytes_out: u64,
    /// Segments the writer wrote (the cleaner's merges not counted).
    pub segments_out: u64,
    pub segments: usize,
    /// Bytes of the segment files the state uses.
    pub segment_bytes: u64,
    pub live_keys: usize,
    /// Bytes the index of live keys has allocated.
    pub index_bytes: usize,
    /// Cleaner merges finished, and segment bytes they wrote.
    pub merges: u64,
    pub merged_bytes: u64,
    pub unwritten_batches: usize,
    pub cache: CacheStats,
}

pub struct Store {
    options: StoreOptions,
    building: Reducer,
    /// First indices of the cut batches not yet adopted, oldest first: the first
    /// `adopting.len()` are written and being adopted, the rest are with the writer.
    unwritten: VecDeque<u64>,
    adopting: VecDeque<Adoption>,
    index: ScanMap<Location>,
    segments: SegmentSet,
    next_segment_id: u64,
    /// Last log index of the newest segment adopted from the writer.
    newest_last_index: u64,
    merge_adoption: Option<MergeAdoption>,
    /// While the index of the segments found at start-up is built: `index` then holds only what
    /// was written since (see `startup_index`).
    index_build: Option<IndexBuild>,
    open_segments: HashMap<u64, SegmentReader>,
    cache: ObjectCache,
    /// One writer per directory, handed cut batches in turn.
    to_writers: Vec<mpsc::Sender<CutBatch>>,
    next_writer: usize,
    from_writers: mpsc::Receiver<Written>,
    /// Segments written ahead of an older batch still being written, by first index.
    arrived: BTreeMap<u64, Written>,
    writers: Vec<std::thread::JoinHandle<()>>,
    to_cleaner: Option<mpsc::Sender<MergeJob>>,
    from_cleaner: mpsc::Receiver<Merged>,
    cleaner: Option<std::thread::JoinHandle<()>>,
    cleaning: bool,
    /// After a look for a merge found none, the next waits until `segments.inserted` reaches
    /// this: a look costs up to one pass over the segments, so it is paid once per so many new
    /// ones, not after every one.
    look_for_merge_at_inserted: u64,
    /// Whether no write came in between the last two ticks and no batch was cut since (or the
    /// store is settling). While writes come in, consolidation waits for this unless twice the
    /// bound of small segments is reached: it is work a burst can leave for later, and
    /// repointing what it moves costs the raft loop's thread.
    quiet: bool,
    writes_in_at_last_tick: u64,
    /// Segments a merge replaced, deleted once a persisted manifest no longer lists them and no
    /// shipment reads them.
    retired: Vec<((u64, u64), PathBuf)>,
    /// Renames or deletes what `retired` gives up, off the applying thread.
    retirer: Retirer,
    /// Local segments an install set aside, with the installed manifest's applied index.
    set_aside: Vec<(u64, PathBuf)>,
    pins: Pins,
    shared: Arc<Shared>,
    stats: StoreStats,
}

/// A file in the state directory: a segment's `(first, last)` range, or `None` for a temporary
/// file a crash left behind (deleted at start-up) or a spare (kept as one).
type StateFile = (Option<(u64, u64)>, PathBuf);

fn segment_files(dir: &Path) -> Result<Vec<StateFile>, StoreError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(".seg.tmp") || name.ends_with(".spare") {
            found.push((None, path));
            continue;
        }
        let Some(stem) = name.strip_suffix(".seg") else {
            continue;
        };
        let range = stem
            .split_once('-')
            .and_then(|(first, last)| Some((first.parse().ok()?, last.parse().ok()?)));
        match range {
            Some((first, last)) if segment_file_name(first, last) == name => found.push((Some((first, last)), path)),
            _ => {
                return Err(StoreError::Inconsistent(format!(
                    "{}: not a segment name this store writes; move it out of the data directory",
                    path.display()
                )))
            }
        }
    }
    Ok(found)
}

/// The name a local segment is set aside under while an install at `install_index` is not yet
/// persisted.
fn set_aside_name(segment_name: &str, install_index: u64) -> String {
    format!("{segment_name}.before-install-{install_index}")
}

/// The segment name and install index of a set-aside file's name.
fn parse_set_aside_name(name: &str) -> Option<(&str, u64)> {
    let (segment_name, index) = name.split_once(".before-install-")?;
    Some((segment_name, index.parse().ok()?))
}

/// Finishes what an interrupted install left, before a start-up at `applied_index` reads the
/// segments: if the install's manifest was persisted (`applied_index` reached it), the segments
/// it set aside go; if not, the segments it moved into their names go and the set-aside ones
/// come back, so the old manifest finds the files it lists.
fn settle_set_aside(options: &StoreOptions, applied_index: u64) -> Result<(), StoreError> {
    let mut restore = Vec::new();
    let mut obsolete = Vec::new();
    for dir in options.all_dirs() {
        if !dir.exists() {
            continue;
        }
        for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
            let path = entry.map_err(io_error(dir))?.path();
            let Some((segment_name, install_index)) =
                path.file_name().and_then(|n| n.to_str()).and_then(parse_set_aside_name)
            else {
                continue;
            };
            if install_index <= applied_index {
                obsolete.push(path);
            } else {
                restore.push((dir.join(segment_name), path));
            }
        }
    }
    let installed: HashSet<PathBuf> = restore
        .iter()
        .flat_map(|(segment, _)| {
            let name = segment.file_name().expect("a segment path names a file").to_owned();
            options.all_dirs().map(move |dir| dir.join(&name))
        })
        .filter(|path| path.exists())
        .collect();
    let installed: Vec<PathBuf> = installed.into_iter().collect();
    remove_durably(&installed)?;
    for (segment, aside) in &restore {
        std::fs::rename(aside, segment).map_err(io_error(aside))?;
        sync_dir(segment.parent().expect("a segment is in a directory"))?;
    }
    remove_durably(&obsolete)
}

impl Store {
    /// `open`, with the index build waiting for `hold_index_build` (tests serve while it waits).
    fn open_holding_index_build(
        options: StoreOptions,
        manifest: Option<&Manifest>,
        hold_index_build: Option<mpsc::Receiver<()>>,
    ) -> Result<Store, StoreError> {
        let empty = Manifest::default();
        let manifest = manifest.unwrap_or(&empty);
        settle_set_aside(&options, manifest.applied_index)?;
        let listed: HashSet<(u64, u64)> = manifest.segments.iter().copied().collect();
        // Where each listed segment is. Two copies of one range in two directories are what an
        // install by an earlier version, interrupted by a crash, could leave (installs now set
        // local copies aside first); the earlier directory's stays.
        let mut found: HashMap<(u64, u64), PathBuf> = HashMap::default();
        let mut unlisted = Vec::new();
        let mut spares = Vec::new();
        for dir in options.all_dirs() {
            create_dir_durably(dir)?;
            for (range, path) in segment_files(dir)? {
                match range {
                    Some(range) if listed.contains(&range) && !found.contains_key(&range) => {
                        found.insert(range, path);
                    }
                    None => match spare_name(&path) {
                        Some((number, file_bytes)) => spares.push(FoundSpare {
                            number,
                            file_bytes,
                            path,
                        }),
                        None => unlisted.push(path),
                    },
                    _ => unlisted.push(path),
                }
            }
        }
        let located = locate(&options.dir, &manifest.segments, &found);
        let mut store = Store::empty(options, manifest.applied_index);
        // Spares are kept for the writers to overwrite, as before the restart: deleting hundreds
        // of them cost a start-up more than reading the segments' indexes.
        unlisted.extend(store.shared.keep_spares(spares));
        remove_durably(&unlisted)?;
        // A reduced store serves while its index is built (see `startup_index`), which needs every
        // segment's entries at once; a full one's hold every write, so it indexes a window at a
        // time, as its entries arrive.
        let mut for_index_build = Vec::new();
        for window in located.chunks(OPEN_WINDOW_SEGMENTS) {
            let loaded = load_segments(store.options.mode, window)?;
            let loaded = window
                .iter()
                .zip(loaded)
                .map(|(((first, _), _), (path, index))| (*first, path, index));
            match store.options.mode {
                StorageMode::Reduced => for_index_build.extend(loaded),
                StorageMode::Full => store.adopt_all(loaded.collect()),
            }
        }
        store.index_whole_segments(for_index_build, hold_index_build);
        Ok(store)
    }

    /// Opens the store in `options.dir` at the state `manifest` describes (empty when `None`).
    /// Segments the manifest does not list — written after it, or torn by a crash — are deleted;
    /// a listed segment that is missing or corrupt is an error. A reduced store serves as soon as
    /// the segments' indexes are read; its in-memory index is built meanwhile.
    pub fn open(options: StoreOptions, manifest: Option<&Manifest>) -> Result<Store, StoreError> {
        Store::open_holding_index_build(options, manifest, None)
    }

    fn empty(options: StoreOptions, applied_index: u64) -> Store {
        let shared = Arc::new(Shared::default());
        shared.durable.lock().expect("not poisoned").written_through = applied_index;
        shared.spares.lock().expect("not poisoned").budget_bytes = spare_budget_bytes(&options);
        let (writer_tx, from_writers) = mpsc::channel();
        let mut to_writers = Vec::new();
        let mut writers = Vec::new();
        for dir in options.all_dirs() {
            let (to_writer, writer_rx) = mpsc::channel::<CutBatch>();
            let (dir, shared, writer_tx) = (dir.clone(), shared.clone(), writer_tx.clone());
            let writer = std::thread::Builder::new()
                .name("segment-writer".into())
                .spawn(move || write_segments(&dir, &writer_rx, &writer_tx, &shared))
                .expect("spawn segment writer");
            to_writers.push(to_writer);
            writers.push(writer);
        }
        let (to_cleaner, cleaner_rx) = mpsc::channel();
        let (cleaner_tx, from_cleaner) = mpsc::channel();
        let cleaner = {
            let dir = options.dir.clone();
            let shared = shared.clone();
            let read_bytes_per_sec = options.cleaner_read_bytes_per_sec;
            std::thread::Builder::new()
                .name("segment-cleaner".into())
                .spawn(move || clean_segments(&dir, read_bytes_per_sec, &cleaner_rx, &cleaner_tx, &shared))
                .expect("spawn segment cleaner")
        };
        let segments = SegmentSet::new(options.consolidated_segment_bytes);
        Store {
            cache: ObjectCache::new(options.cache_bytes),
            building: match options.mode {
                StorageMode::Reduced => Reducer::after(applied_index),
                StorageMode::Full => Reducer::keeping_every_write(applied_index),
            },
            unwritten: VecDeque::new(),
            adopting: VecDeque::new(),
            index: ScanMap::new(options.group_of),
            options,
            segments,
            look_for_merge_at_inserted: 0,
            quiet: false,
            writes_in_at_last_tick: 0,
            next_segment_id: 1,
            newest_last_index: 0,
            merge_adoption: None,
            index_build: None,
            open_segments: HashMap::default(),
            to_writers,
            next_writer: 0,
            from_writers,
            arrived: BTreeMap::new(),
            writers,
            to_cleaner: Some(to_cleaner),
            from_cleaner,
            cleaner: Some(cleaner),
            cleaning: false,
            retired: Vec::new(),
            retirer: {
                let shared = shared.clone();
                Retirer::start(move |paths| shared.retire_files(paths))
            },
            set_aside: Vec::new(),
            pins: Pins::default(),
            shared,
            stats: StoreStats::default(),
        }
    }

    /// Records that the entry at `index` set `key` to `value`, or deleted it (`None`); whether
    /// `key` had a value before.
    pub fn write(&mut self, index: u64, key: Bytes, value: Option<Bytes>) -> bool {
        self.stats.writes_in += 1;
        self.stats.bytes_in += (key.len() + value.as_ref().map_or(0, Bytes::len)) as u64;
        // While the start-up segments' index is built, a key not written since may have a value
        // only they hold.
        let held_at_start_up =
            |store: &Store, key: &[u8]| store.index_build.as_ref().is_some_and(|b| b.segments.holds_value(key));
        let had_value = match &value {
            Some(value) => match self.index.get_mut(&key) {
                // An overwrite keeps the key's index entry, and its value's slot in the cache.
                Some(location) if location.segment != DELETED_SINCE_START_UP => {
                    assert!(location.version <= index, "a key's versions only grow");
                    supersede(&mut self.segments, &key, location);
                    self.cache
                        .overwrite(&mut location.value, location.segment == UNWRITTEN, value.clone());
                    location.segment = UNWRITTEN;
                    location.record_offset = 0;
                    location.version = index;
                    location.value_len = value.len() as u32;
                    true
                }
                deleted_or_absent => {
                    let had_value = deleted_or_absent.is_none() && held_at_start_up(self, &key);
                    let location = Location {
                        segment: UNWRITTEN,
                        record_offset: 0,
                        version: index,
                        value_len: value.len() as u32,
                        value: Some(self.cache.hold_unwritten(value.clone())),
                    };
                    if let Some(marker) = self.index.insert(key.clone(), location) {
                        assert!(marker.version <= index, "a key's versions only grow");
                    }
                    had_value
                }
            },
            None => {
                let held = held_at_start_up(self, &key);
                let had_value = match self.index.remove(&key) {
                    Some(deleted) if deleted.segment == DELETED_SINCE_START_UP => false,
                    Some(mut deleted) => {
                        assert!(deleted.version <= index, "a key's versions only grow");
                        supersede(&mut self.segments, &key, &deleted);
                        self.cache.release(&mut deleted.value, deleted.segment == UNWRITTEN);
                        true
                    }
                    None => held,
                };
                if held {
                    self.index.insert(key.clone(), deleted_since_start_up(index));
                }
                had_value
            }
        };
        self.building.write(index, key, value);
        had_value
    }

    /// Notes that every write of the entry at `index` has been made; cuts the batch when full.
    pub fn entry_applied(&mut self, index: u64) {
        self.absorb_built_index(false);
        self.building.note_index(index);
        if self.cut_due() {
            self.cut();
        }
        self.absorb_written(self.options.adoption_step_records);
        self.absorb_cleaned();
    }

    /// Whether the batch being built is full: the next `entry_applied` cuts it. Writes made
    /// before that, at the entry's index, still join it.
    pub fn cut_due(&self) -> bool {
        self.building.writes_in() >= self.options.batch_writes || self.building.bytes_in() >= self.options.batch_bytes
    }

    /// Goes on adopting what the writers and the cleaner finished without waiting for another
    /// entry: on an idle node a finished merge would otherwise hold its replaced segments on
    /// disk, its records in memory and the cleaner's next merge back until the next write.
    pub fn tick(&mut self) {
        let quiet = self.stats.writes_in == self.writes_in_at_last_tick;
        self.writes_in_at_last_tick = self.stats.writes_in;
        let became_quiet = quiet && !self.quiet;
        self.quiet = quiet;
        if became_quiet {
            self.look_for_merge_at_inserted = 0;
            self.maybe_clean();
        }
        self.absorb_built_index(false);
        self.absorb_written(self.options.adoption_step_records);
        self.absorb_cleaned();
    }

    /// Hands the building batch to the writer, waiting for it when too many are unwritten.
    pub fn cut(&mut self) {
        if let Some(batch) = self.building.cut() {
            self.quiet = false;
            self.unwritten.push_back(batch.first_index);
            self.shared
                .durable
                .lock()
                .expect("not poisoned")
                .in_flight
                .insert(batch.first_index);
            self.to_writers[self.next_writer % self.to_writers.len()]
                .send(batch)
                .expect("segment writer thread vanished");
            self.next_writer += 1;
        }
        // Bounded memory: wait for the writers to catch up — unless they are out of space, when
        // waiting would stop the node; the node refuses writes then (`out_of_space`), which
        // bounds what piles up.
        while self.unwritten.len() > self.options.max_unwritten_batches {
            if !self.finish_oldest_unwritten(true) {
                break;
            }
        }
    }

    /// Whether the store still has work of its own under way — a cut batch not yet written and
    /// adopted, a merge running or being adopted, the start-up index being built — which ticks
    /// carry on with an idle node. Once it is done, what that work used is free.
    pub fn background_work(&self) -> bool {
        self.cleaning || !self.unwritten.is_empty() || self.index_build.is_some()
    }

    /// Whether segment writes are failing for want of space: what is applied meanwhile waits in
    /// memory (and in the raft log), and the node should take no more writes until it clears.
    pub fn out_of_space(&self) -> bool {
        self.shared.out_of_space.load(Ordering::Relaxed)
    }

    /// Cuts the building batch and returns what waits, on any thread, until everything applied
    /// so far is in written segments, syncs them, and then names them.
    ///
    /// A failed sync panics: after a failed fsync the kernel may have dropped the pages, so no
    /// retry can be trusted, while a restart replays the raft log — not compacted behind these
    /// segments yet — and rewrites them.
    pub fn manifest_later(&mut self) -> impl FnOnce() -> Manifest + Send + 'static {
        self.cut();
        let through = self.building.last_index();
        let shared = self.shared.clone();
        *shared
            .durable
            .lock()
            .expect("not poisoned")
            .listing
            .entry(through)
            .or_default() += 1;
        let mut waiting = WaitingToList {
            shared: shared.clone(),
            through,
            listed: false,
        };
        move || {
            let (manifest, to_sync) = {
                let mut durable = shared.durable.lock().expect("not poisoned");
                while durable.through() < through {
                    durable = shared.changed.wait(durable).expect("not poisoned");
                }
                waiting.listed(&mut durable);
                let segments: Vec<(u64, u64)> = durable
                    .segments
                    .range(..=through)
                    .map(|(first, last)| (*first, *last))
                    .filter(|(_, last)| *last <= through)
                    .collect();
                let to_sync: Vec<((u64, u64), PathBuf)> = segments
                    .iter()
                    .filter_map(|range| Some((*range, durable.unsynced.get(range)?.clone())))
                    .collect();
                let manifest = Manifest {
                    applied_index: through,
                    segments,
                };
                (manifest, to_sync)
            };
            if to_sync.is_empty() {
                return manifest;
            }
            // Listed segments stay on disk at least until a manifest not listing them is
            // persisted, which cannot happen before this one is: snapshots are taken one at a time.
            let mut dirs = HashSet::default();
            for (_, path) in &to_sync {
                if let Err(e) = File::open(path).and_then(|file| file.sync_data()) {
                    panic!("cannot sync {}, which a manifest will list: {e}", path.display());
                }
                dirs.insert(path.parent().expect("a segment is in a directory"));
            }
            for dir in dirs {
                if let Err(e) = sync_dir(dir) {
                    panic!("cannot sync the state directory: {e}");
                }
            }
            let mut durable = shared.durable.lock().expect("not poisoned");
            for (range, _) in &to_sync {
                durable.unsynced.remove(range);
            }
            manifest
        }
    }

    /// The latest value of `key`, or `None` when it has none: from memory, else read from its
    /// segment and cached.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        let Some(location) = self.index.get_mut(key) else {
            return self.read_start_up_segments(key);
        };
        if location.segment == DELETED_SINCE_START_UP {
            return Ok(None);
        }
        if let Some(value) = self.cache.get(location.value) {
            return Ok(Some(value));
        }
        let segment = self.segments.get(location.segment);
        let value = read_value(
            &mut self.open_segments,
            self.options.value_direct_io,
            segment,
            location.segment,
            key,
            location,
        )?;
        if self.options.caches.caches(key) {
            self.cache.admit(key, &mut location.value, value.clone());
            self.cache.evict(&mut self.index);
        }
        Ok(Some(value))
    }

    /// `key`'s value if it is in memory (or when reading it is only a copy from the page cache
    /// and every key is cached here: then it is read now), or where to read it, for a caller that
    /// takes the slow read off its own thread and hands the value back (`admit_read`).
    pub fn locate(&mut self, key: &[u8]) -> Result<Located, StoreError> {
        if !self.options.value_direct_io && !self.options.caches.is_selective() {
            return self.get(key).map(Located::Ready);
        }
        let Some(location) = self.index.get_mut(key) else {
            return self.read_start_up_segments(key).map(Located::Ready);
        };
        if location.segment == DELETED_SINCE_START_UP {
            return Ok(Located::Ready(None));
        }
        if let Some(value) = self.cache.get(location.value) {
            return Ok(Located::Ready(Some(value)));
        }
        Ok(Located::OnDisk(DiskRead {
            path: self.segments.get(location.segment).path.clone(),
            direct: self.options.value_direct_io,
            emulated_delay: (self.options.emulated_device_read_us > 0)
                .then(|| Duration::from_micros(self.options.emulated_device_read_us)),
            key: Bytes::copy_from_slice(key),
            version: location.version,
            record_offset: location.record_offset,
            value_len: location.value_len,
        }))
    }

    /// `key`'s value if it is in memory at `version` (which counts as reading it), without
    /// reading the disk.
    pub fn cached(&mut self, key: &[u8], version: u64) -> Option<Bytes> {
        let location = self.index.get_mut(key)?;
        if location.version != version || location.segment == DELETED_SINCE_START_UP {
            return None;
        }
        location.value.and_then(|slot| self.cache.get(Some(slot)))
    }

    /// Caches `value`, which a `DiskRead` of `key` at `version` read, if that is still the key's
    /// latest write and its value is not in memory meanwhile.
    pub fn admit_read(&mut self, key: &[u8], version: u64, value: Bytes) {
        let Some(location) = self.index.get_mut(key) else {
            return;
        };
        if location.version != version
            || location.value.is_some()
            || location.segment == DELETED_SINCE_START_UP
            || !self.options.caches.caches(key)
        {
            return;
        }
        assert_eq!(
            location.value_len as usize,
            value.len(),
            "a read value is the one indexed"
        );
        self.cache.admit(key, &mut location.value, value);
        self.cache.evict(&mut self.index);
    }

    /// The value of a key not written since start-up while the index of the segments found then
    /// is built: read from the newest of them holding the key, not cached (the index has no entry
    /// to hold it yet).
    fn read_start_up_segments(&mut self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        let Some(build) = &self.index_build else {
            return Ok(None);
        };
        let Some((id, entry)) = build.segments.find(key) else {
            return Ok(None);
        };
        if entry.is_tombstone {
            return Ok(None);
        }
        let location = Location {
            segment: id,
            record_offset: entry.record_offset,
            version: entry.version,
            value_len: entry.value_len,
            value: None,
        };
        read_value(
            &mut self.open_segments,
            self.options.value_direct_io,
            self.segments.get(id),
            id,
            key,
            &location,
        )
        .map(Some)
    }

    /// Live keys of the group whose prefix is `group` (see `StoreOptions::group_of`) and their
    /// values, in key order.
    pub fn scan_group(&mut self, group: &[u8]) -> Result<Vec<(Bytes, Bytes)>, StoreError> {
        self.wait_for_index();
        let mut values: Vec<(Bytes, Option<Bytes>)> = Vec::with_capacity(self.index.group_len(group));
        for (key, location) in self.index.group_mut(group) {
            values.push((key.clone(), self.cache.get(location.value)));
        }
        let mut scanned = Vec::with_capacity(values.len());
        for (key, value) in values {
            let value = match value {
                Some(value) => value,
                None => self.get(&key)?.expect("an indexed key has a value"),
            };
            scanned.push((key, value));
        }
        Ok(scanned)
    }

    /// Whether `key` has a value, without reading it.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self.index.get(key) {
            Some(location) => location.segment != DELETED_SINCE_START_UP,
            None => self.index_build.as_ref().is_some_and(|b| b.segments.holds_value(key)),
        }
    }

    /// Live keys of the group whose prefix is `group`, in key order.
    pub fn group_keys(&mut self, group: &[u8]) -> Vec<Bytes> {
        self.wait_for_index();
        self.index.group(group).map(|(key, _)| key.clone()).collect()
    }

    /// Up to `take` live keys of the group whose prefix is `group`, after skipping `skip`, in key
    /// order from the first key, or (`from_end`) from the last one backwards.
    pub fn group_keys_range(&mut self, group: &[u8], skip: usize, take: usize, from_end: bool) -> Vec<Bytes> {
        self.wait_for_index();
        let keys = self.index.group(group).map(|(key, _)| key);
        if from_end {
            keys.rev().skip(skip).take(take).cloned().collect()
        } else {
            keys.skip(skip).take(take).cloned().collect()
        }
    }

    /// Up to `take` live keys of the group whose prefix is `group` whose rest (after the prefix)
    /// lies between `from` and `to`, after skipping `skip`, in key order or (`from_end`)
    /// backwards from the last.
    pub fn group_keys_between(
        &mut self,
        group: &[u8],
        (from, to): (Bound<&[u8]>, Bound<&[u8]>),
        skip: usize,
        take: usize,
        from_end: bool,
    ) -> Vec<Bytes> {
        self.wait_for_index();
        let keys = self.index.group_range(group, from, to).map(|(key, _)| key);
        if from_end {
            keys.rev().skip(skip).take(take).cloned().collect()
        } else {
            keys.skip(skip).take(take).cloned().collect()
        }
    }

    /// How many live keys of the group whose prefix is `group` have a rest between `from` and
    /// `to` (see `group_keys_between`).
    pub fn group_count_between(&mut self, group: &[u8], (from, to): (Bound<&[u8]>, Bound<&[u8]>)) -> usize {
        self.wait_for_index();
        self.index.group_range(group, from, to).count()
    }

    /// Whether the group whose prefix is `group` holds a live key; while the start-up index is
    /// built, without waiting for it.
    pub fn group_has_keys(&self, group: &[u8]) -> bool {
        let mut written_since = self.index.group(group);
        if written_since.any(|(_, location)| location.segment != DELETED_SINCE_START_UP) {
            return true;
        }
        let Some(build) = &self.index_build else {
            return false;
        };
        // A key written since start-up is in the index, live or not: only the others are the
        // segments' to answer for.
        build
            .segments
            .with_prefix(group)
            .any(|entry| self.index.get(&entry.key).is_none() && build.segments.holds_value(&entry.key))
    }

    /// How many live keys the group whose prefix is `group` holds.
    /// The key and value bytes of `key`'s live record, from the index alone (no value is read).
    pub fn record_bytes(&mut self, key: &[u8]) -> Option<u64> {
        self.wait_for_index();
        self.index
            .get(key)
            .filter(|location| location.segment != DELETED_SINCE_START_UP)
            .map(|location| key.len() as u64 + u64::from(location.value_len))
    }

    /// How many live records the group whose prefix is `group` has, and their key and value
    /// bytes, from the index alone.
    pub fn group_record_bytes(&mut self, group: &[u8]) -> (u64, u64) {
        self.wait_for_index();
        self.index
            .group(group)
            .filter(|(_, location)| location.segment != DELETED_SINCE_START_UP)
            .fold((0, 0), |(records, bytes), (key, location)| {
                (records + 1, bytes + key.len() as u64 + u64::from(location.value_len))
            })
    }

    pub fn group_len(&mut self, group: &[u8]) -> usize {
        self.wait_for_index();
        self.index.group_len(group)
    }

    /// Every live key in no group, in no particular order (for what needs them all: listing
    /// every key, deleting every key).
    pub fn ungrouped_key_list(&mut self) -> Vec<Bytes> {
        self.wait_for_index();
        self.index.ungrouped_keys().map(Bytes::copy_from_slice).collect()
    }

    /// The prefix of every group holding a live key, in no particular order.
    pub fn group_prefixes(&mut self) -> Vec<Bytes> {
        self.wait_for_index();
        self.index.group_prefixes().cloned().collect()
    }

    /// Live keys in no group.
    pub fn ungrouped_keys(&mut self) -> usize {
        self.wait_for_index();
        self.index.ungrouped_len()
    }

    /// Groups with at least one live key.
    pub fn groups(&mut self) -> usize {
        self.wait_for_index();
        self.index.groups_len()
    }

    /// Objects the cache would hold at the mean size of those it holds now (`None` while it holds
    /// none), and the live keys (`None` while the index is built after a start-up).
    pub fn cache_shape(&self) -> (Option<f64>, Option<usize>) {
        let cache = self.cache.stats();
        let capacity_objects =
            (cache.objects > 0).then(|| self.options.cache_bytes as f64 * cache.objects as f64 / cache.bytes as f64);
        (capacity_objects, self.index_ready().then(|| self.index.len()))
    }

    pub fn stats(&mut self) -> StoreStats {
        self.wait_for_index();
        StoreStats {
            segments: self.segments.len(),
            segment_bytes: self.segments.file_bytes,
            live_keys: self.index.len(),
            index_bytes: self.index.allocated_bytes(),
            unwritten_batches: self.unwritten.len(),
            cache: self.cache.stats(),
            ..self.stats
        }
    }

    /// The index everything applied so far reaches.
    pub fn applied_index(&self) -> u64 {
        self.building.last_index()
    }

    /// Pins the segments `manifest` lists for shipping to a follower: none of them is deleted
    /// while the returned value lives, even once a merge replaced it. Returns each file's name and
    /// path with the pin.
    pub fn pin_segments(&self, manifest: &Manifest) -> Result<PinnedSegments, StoreError> {
        let known: HashMap<(u64, u64), &PathBuf> = self
            .segments
            .by_id
            .values()
            .map(|s| ((s.first_index, s.last_index), &s.path))
            .chain(self.retired.iter().map(|(range, path)| (*range, path)))
            .collect();
        let mut files = Vec::with_capacity(manifest.segments.len());
        for range in &manifest.segments {
            let name = segment_file_name(range.0, range.1);
            // Written but not yet adopted: the writers' directories hold it.
            let path = known.get(range).map(|path| path.to_path_buf()).or_else(|| {
                self.options
                    .all_dirs()
                    .map(|dir| dir.join(&name))
                    .find(|path| path.exists())
            });
            let Some(path) = path.filter(|path| path.exists()) else {
                return Err(StoreError::Inconsistent(format!(
                    "{name}: listed in the manifest to ship but not in the store"
                )));
            };
            files.push((name, path));
        }
        let mut pins = self.pins.lock().expect("not poisoned");
        for range in &manifest.segments {
            *pins.entry(*range).or_default() += 1;
        }
        Ok(PinnedSegments {
            pins: self.pins.clone(),
            ranges: manifest.segments.clone(),
            files,
        })
    }

    /// Replaces the state with the one `manifest` describes, whose segments were received into
    /// `from_dir` and synced there: checks each as start-up would, moves them into the store's
    /// directory and opens them. Files of the old state stay until the next `open`, because the
    /// caller's record of the old manifest is replaced only after this returns.
    pub fn install(&mut self, manifest: &Manifest, from_dir: &Path) -> Result<(), StoreError> {
        let received = locate(from_dir, &manifest.segments, &HashMap::default());
        let mut loaded = Vec::with_capacity(manifest.segments.len());
        for window in received.chunks(OPEN_WINDOW_SEGMENTS) {
            loaded.extend(load_segments(self.options.mode, window)?);
        }
        self.finish_unwritten();
        // A queued retirement must not rename a received segment moved in under the same name.
        self.retirer.wait_idle();
        // A local segment with a received one's name covers the same log range but need not hold
        // the same records (what a merge keeps depends on the segments after it). Until the
        // installed manifest is persisted the old one may be the state a restart reopens, so the
        // local file is set aside rather than replaced, and deleted once that manifest is
        // persisted (`manifest_persisted`) or put back by `open`.
        let mut set_aside = std::mem::take(&mut self.set_aside);
        for (first, last) in &manifest.segments {
            let name = segment_file_name(*first, *last);
            for dir in self.options.all_dirs() {
                let local = dir.join(&name);
                if local.exists() {
                    let aside = dir.join(set_aside_name(&name, manifest.applied_index));
                    std::fs::rename(&local, &aside).map_err(io_error(&local))?;
                    set_aside.push((manifest.applied_index, aside));
                }
            }
        }
        for dir in self.options.all_dirs() {
            sync_dir(dir)?;
        }
        for (first, last) in &manifest.segments {
            let name = segment_file_name(*first, *last);
            move_file(&from_dir.join(&name), &self.options.dir.join(&name))?;
        }
        sync_dir(&self.options.dir)?;
        let options = self.options.clone();
        let stats = self.stats;
        *self = Store::empty(options, manifest.applied_index);
        self.stats = stats;
        self.set_aside = set_aside;
        let loaded = manifest
            .segments
            .iter()
            .zip(loaded)
            .map(|((first, last), (_, index))| (*first, self.options.dir.join(segment_file_name(*first, *last)), index))
            .collect();
        self.index_whole_segments(loaded, None);
        Ok(())
    }

    /// Starts adopting what the writer finished, and adopts up to `step` records.
    fn absorb_written(&mut self, step: usize) {
        while let Ok(written) = self.from_writers.try_recv() {
            self.arrived.insert(written.first_index, written);
        }
        self.absorb_in_order();
        self.continue_adoptions(step);
    }

    /// Starts adopting the arrived segments that are next in log order.
    fn absorb_in_order(&mut self) {
        while let Some(next) = self.unwritten.get(self.adopting.len()) {
            let Some(written) = self.arrived.remove(next) else {
                return;
            };
            self.absorb(written);
        }
    }

    /// Cuts the building batch and waits until every batch is written and adopted.
    fn finish_unwritten(&mut self) {
        self.cut();
        while !self.unwritten.is_empty() {
            self.finish_oldest_unwritten(false);
        }
    }

    /// Waits until the oldest unwritten batch is written and adopted; with `unless_out_of_space`,
    /// returns `false` instead of waiting while the writers are out of space.
    fn finish_oldest_unwritten(&mut self, unless_out_of_space: bool) -> bool {
        const OUT_OF_SPACE_CHECK: Duration = Duration::from_millis(50);
        while self.adopting.is_empty() {
            if unless_out_of_space && self.out_of_space() {
                return false;
            }
            let written = match self.from_writers.recv_timeout(OUT_OF_SPACE_CHECK) {
                Ok(written) => written,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!("segment writer thread vanished"),
            };
            self.arrived.insert(written.first_index, written);
            self.absorb_in_order();
        }
        let before = self.unwritten.len();
        while self.unwritten.len() == before {
            self.continue_adoptions(usize::MAX);
        }
        true
    }

    fn absorb(&mut self, written: Written) {
        assert_eq!(
            self.unwritten[self.adopting.len()],
            written.first_index,
            "segments are written in order"
        );
        self.stats.bytes_out += written.index.file_bytes;
        self.stats.records_out += written.index.entries.len() as u64;
        self.stats.segments_out += 1;
        let adoption = self.begin_adoption(written);
        self.adopting.push_back(adoption);
    }

    /// Adopts up to `step` records of the segments being adopted, oldest first; a batch leaves
    /// memory once its segment is fully indexed.
    fn continue_adoptions(&mut self, mut step: usize) {
        while let Some(mut adoption) = self.adopting.pop_front() {
            let before = adoption.next;
            let done = self.adopt_written_records(&mut adoption, step);
            step -= adoption.next - before;
            if !done {
                self.adopting.push_front(adoption);
                return;
            }
            self.unwritten.pop_front().expect("an adopted batch was unwritten");
            if self.adopting.is_empty() {
                self.maybe_clean();
            }
            if step == 0 {
                return;
            }
        }
    }

    /// Indexes whole durable segments at once, in log order — opening, installing: the index
    /// then holds only older segments' records and the cache nothing — and makes them part of
    /// what manifests list (the writer does that for the segments it writes).
    fn adopt_all(&mut self, loaded: Vec<(u64, PathBuf, SegmentIndex)>) {
        self.index.reserve_for(
            loaded
                .iter()
                .flat_map(|(_, _, index)| &index.entries)
                .map(|entry| entry.key.as_ref()),
        );
        for (first_index, path, index) in loaded {
            self.adopt(first_index, path, index);
        }
    }

    fn adopt(&mut self, first_index: u64, path: PathBuf, index: SegmentIndex) {
        let last_index = index.header.last_index;
        let adoption = self.begin_adoption(Written::new(first_index, path, index));
        // The keys move into the index: a clone would cost an allocation per key.
        index_records(&mut self.index, &mut self.segments, adoption.id, adoption.entries);
        self.note_durable(first_index, last_index);
    }

    /// Makes a durable segment found at start-up or installed part of what manifests list.
    fn note_durable(&mut self, first_index: u64, last_index: u64) {
        let mut durable = self.shared.durable.lock().expect("not poisoned");
        durable.segments.insert(first_index, last_index);
        durable.written_through = durable.written_through.max(last_index);
    }

    /// Indexes the segments found at start-up or installed: a reduced store's on another thread
    /// while it serves (see `startup_index`). Segments a `full` store wrote hold their writes in
    /// log order, which cannot be searched by key, and a read among very many segments would cost
    /// more than waiting for the index: those are indexed before the store serves.
    fn index_whole_segments(&mut self, loaded: Vec<(u64, PathBuf, SegmentIndex)>, hold: Option<mpsc::Receiver<()>>) {
        if self.options.mode == StorageMode::Full
            || loaded.len() > SEARCHED_AT_START_UP_SEGMENTS
            || loaded.iter().any(|(_, _, index)| index.header.log_order)
        {
            self.adopt_all(loaded);
        } else {
            self.start_index_build(loaded, hold);
        }
    }

    /// Adds the segments found at start-up and builds their index on another thread; meanwhile
    /// reads search their entries (see `startup_index`).
    fn start_index_build(&mut self, loaded: Vec<(u64, PathBuf, SegmentIndex)>, hold: Option<mpsc::Receiver<()>>) {
        if loaded.is_empty() {
            return;
        }
        let first_id = self.next_segment_id;
        let mut segments = Vec::with_capacity(loaded.len());
        for (first_index, path, index) in loaded {
            let last_index = index.header.last_index;
            let adoption = self.begin_adoption(Written::new(first_index, path, index));
            segments.push((self.segments.get(adoption.id).file_bytes, adoption.entries));
            self.note_durable(first_index, last_index);
        }
        self.index_build = Some(IndexBuild::start(first_id, segments, self.options.group_of, hold));
    }

    /// Takes in the index built from the start-up segments once it is ready (`wait`: waiting for
    /// it), laying over it what was written since, which is newer than anything in them.
    fn absorb_built_index(&mut self, wait: bool) {
        let Some(build) = &self.index_build else {
            return;
        };
        let built = if wait {
            build.built()
        } else {
            let Some(built) = build.try_built() else {
                return;
            };
            built
        };
        self.index_build = None;
        for (id, liveness) in built.liveness.into_segments() {
            self.segments.set_live(id, liveness);
        }
        let mut index = built.index;
        let written_since = std::mem::replace(&mut self.index, ScanMap::new(self.options.group_of));
        for (key, location) in written_since.into_entries() {
            if let Some(older) = index.remove(&key) {
                assert!(older.version < location.version, "a key's versions only grow");
                supersede(&mut self.segments, &key, &older);
            }
            if location.segment != DELETED_SINCE_START_UP {
                index.insert(key, location);
            }
        }
        self.index = index;
        self.maybe_clean();
    }

    /// Waits for the index of the start-up segments (what needs every key: counts, groups, the
    /// cleaner's figures).
    fn wait_for_index(&mut self) {
        self.absorb_built_index(true);
    }

    /// Whether the index holds every key yet (see `startup_index`).
    pub fn index_ready(&self) -> bool {
        self.index_build.is_none()
    }

    /// Adds a durable segment, none of its records indexed yet.
    fn begin_adoption(&mut self, written: Written) -> Adoption {
        assert!(
            written.first_index > self.newest_last_index,
            "segments are adopted in log order: [{}, ..] after one ending at {}",
            written.first_index,
            self.newest_last_index
        );
        self.newest_last_index = written.index.header.last_index;
        let id = self.next_segment_id;
        self.next_segment_id += 1;
        let (segment, entries) = SegmentFile::new(written);
        self.segments.insert(id, segment);
        Adoption { id, entries, next: 0 }
    }

    /// Points the index at up to `step` more records of a segment the writer wrote, where they
    /// are still a key's latest write (the index took every write when it was applied), and
    /// moves their values from the index entry into the cache; whether all are done.
    fn adopt_written_records(&mut self, adoption: &mut Adoption, step: usize) -> bool {
        let end = adoption.next.saturating_add(step).min(adoption.entries.len());
        for entry in &adoption.entries[adoption.next..end] {
            // A deleted key has no entry to point (or one that hides a start-up segment's value).
            if entry.is_tombstone {
                continue;
            }
            // Deleted or overwritten since: the index no longer has this version.
            let Some(location) = self.index.get_mut(&entry.key) else {
                continue;
            };
            if location.version != entry.version {
                assert!(location.version > entry.version, "a key's versions only grow");
                continue;
            }
            assert_eq!(location.segment, UNWRITTEN, "a written record is adopted once");
            let cache_new = self.options.caches.caches(&entry.key);
            self.cache
                .written(&entry.key, &mut location.value, entry.value_len as usize, cache_new);
            location.segment = adoption.id;
            location.record_offset = entry.record_offset;
            self.segments
                .record_live(adoption.id, entry.record_offset, entry.segment_bytes() as u64);
        }
        adoption.next = end;
        self.cache.evict(&mut self.index);
        end == adoption.entries.len()
    }

    /// Returns once the segments retired by every `manifest_persisted` so far are renamed to
    /// spares or deleted, durably.
    pub fn wait_for_retirements(&self) {
        self.retirer.wait_idle();
    }

    /// Writes and adopts every cut batch, then lets the cleaner merge until it has nothing left
    /// to do: the state as it is once the store is idle (what benchmarks and tests measure).
    pub fn settle(&mut self) {
        self.settle_reporting(Duration::MAX, |_| {});
    }

    /// `settle`, calling `report` with the store about every `every` while the cleaner works
    /// (a long settle shows its progress).
    pub fn settle_reporting(&mut self, every: Duration, mut report: impl FnMut(&mut Store)) {
        self.wait_for_index();
        self.finish_unwritten();
        self.quiet = true;
        self.look_for_merge_at_inserted = 0;
        self.maybe_clean();
        let mut report_at = Instant::now().checked_add(every);
        while self.cleaning {
            if report_at.is_some_and(|at| Instant::now() >= at) {
                report(self);
                report_at = Instant::now().checked_add(every);
            }
            if self.merge_adoption.is_some() {
                if !self.continue_merge_adoption(usize::MAX) {
                    // Held back by a manifest that has yet to list (see `continue_merge_adoption`).
                    std::thread::sleep(Duration::from_millis(1));
                }
            } else {
                let merged = self.from_cleaner.recv().expect("segment cleaner thread vanished");
                self.start_merge_adoption(merged);
            }
        }
    }

    /// Bytes of the segments that no read needs: overwritten or deleted records, tombstones,
    /// headers and indexes.
    pub fn dead_bytes(&mut self) -> u64 {
        self.wait_for_index();
        self.segments.dead_bytes()
    }

    /// Share of the segments' bytes that no read can reach any more.
    pub fn dirty_ratio(&mut self) -> f64 {
        self.wait_for_index();
        self.segments.dirty_ratio()
    }

    /// Starts a merge when enough of the segments' bytes are dead — of the run of consecutive
    /// segments that frees the most bytes per byte the merge moves (see `merge_window`) — or
    /// else when enough small segments follow one another (see `consolidation_window`).
    fn maybe_clean(&mut self) {
        if self.cleaning
            || self.index_build.is_some()
            || self.options.mode == StorageMode::Full
            || !self.adopting.is_empty()
            || self.segments.inserted < self.look_for_merge_at_inserted
        {
            return;
        }
        let dirty = self.segments.len() >= self.options.cleaner_min_segments.max(2)
            && self.segments.dirty_ratio() >= self.options.min_cleanable_dirty_ratio
            && self.segments.dead_bytes() >= self.options.min_cleanable_dead_bytes;
        let bound = self.options.consolidate_above_segments;
        let may_consolidate = self.segments.small.len() > if self.quiet { bound } else { bound.saturating_mul(2) };
        let may_gather_tiny = self.segments.tiny.len() >= 2;
        // Called after every adopted segment: the cheap checks come before a pass over them.
        if !dirty && !may_consolidate && !may_gather_tiny {
            return;
        }
        let target_bytes = self.options.consolidated_segment_bytes;
        let run = dirty
            .then(|| self.dirt_run())
            .flatten()
            .or_else(|| {
                may_consolidate
                    .then(|| self.consolidation_run(&self.segments.small, target_bytes))
                    .flatten()
            })
            .or_else(|| {
                may_gather_tiny
                    .then(|| self.consolidation_run(&self.segments.tiny, gathered_tiny_bytes(target_bytes)))
                    .flatten()
            });
        let Some(run) = run else {
            self.look_for_merge_at_inserted =
                self.segments.inserted + (self.segments.len() / LOOKS_FOR_MERGE_PER_PASS).max(1) as u64;
            return;
        };
        let run: Vec<&SegmentFile> = run.iter().map(|&id| self.segments.get(id)).collect();
        let drop_tombstones = self
            .segments
            .in_log_order
            .first()
            .is_some_and(|&(first_index, _)| first_index == run[0].first_index);
        tracing::debug!(
            segments = self.segments.len(),
            merged = run.len(),
            dirty_ratio = self.segments.dirty_ratio(),
            read_bytes = run.iter().map(|s| s.file_bytes).sum::<u64>(),
            live_bytes = run.iter().map(|s| s.live_bytes).sum::<u64>(),
            "merging segments"
        );
        let job = MergeJob {
            segments: run
                .iter()
                .map(|s| ((s.first_index, s.last_index), s.path.clone()))
                .collect(),
            // A segment with nothing the merge keeps is not read.
            live: run
                .iter()
                .map(|s| (s.live_records > 0 || (!drop_tombstones && s.tombstone_bytes > 0)).then(|| s.live.clone()))
                .collect(),
            drop_tombstones,
            horizon: self.building.last_index(),
        };
        self.cleaning = true;
        self.to_cleaner
            .as_ref()
            .expect("cleaner runs while the store is open")
            .send(job)
            .expect("segment cleaner thread vanished");
    }

    /// Ids of the run `merge_window` chooses, in log order: one pass over the segments.
    fn dirt_run(&self) -> Option<Vec<u64>> {
        let (ids, costs): (Vec<u64>, Vec<MergeCost>) = self
            .segments
            .in_log_order
            .iter()
            .map(|&(_, id)| {
                let s = self.segments.get(id);
                let cost = MergeCost {
                    file_bytes: s.file_bytes,
                    live_bytes: s.live_bytes,
                    tombstone_bytes: s.tombstone_bytes,
                };
                (id, cost)
            })
            .unzip();
        let window = merge_window(&costs, self.options.max_merged_segment_bytes)?;
        Some(ids[window].to_vec())
    }

    /// Ids of the run `consolidation_window` chooses towards `target_bytes` among the segments
    /// from the oldest of `from`, looking at no more than `CONSOLIDATION_LOOKAHEAD_SEGMENTS`.
    fn consolidation_run(&self, from: &BTreeSet<(u64, u64)>, target_bytes: u64) -> Option<Vec<u64>> {
        let ids = self.segments.onward_from_oldest(from, CONSOLIDATION_LOOKAHEAD_SEGMENTS);
        let file_bytes: Vec<u64> = ids.iter().map(|&id| self.segments.get(id).file_bytes).collect();
        let window = consolidation_window(&file_bytes, target_bytes)?;
        Some(ids[window].to_vec())
    }

    fn absorb_cleaned(&mut self) {
        if self.merge_adoption.is_none() {
            if let Ok(merged) = self.from_cleaner.try_recv() {
                self.start_merge_adoption(merged);
            }
        }
        self.continue_merge_adoption(self.options.merge_adoption_step_records);
    }

    /// Adds the merged segment beside the ones it replaces; `continue_merge_adoption` then points
    /// every key whose latest record the merge copied at it, and the replaced segments go.
    fn start_merge_adoption(&mut self, merged: Merged) {
        let Merged {
            replaces,
            written,
            horizon,
        } = merged;
        let replaced: HashMap<u64, usize> = replaces
            .iter()
            .enumerate()
            .map(|(slot, first_index)| {
                let id = self
                    .segments
                    .starting_at(*first_index)
                    .expect("merged segments are the store's");
                (id, slot)
            })
            .collect();
        let merged_id = self.next_segment_id;
        self.next_segment_id += 1;
        self.stats.merges += 1;
        self.stats.merged_bytes += written.index.file_bytes;
        let (segment, entries) = SegmentFile::new(written);
        self.segments.insert(merged_id, segment);
        self.merge_adoption = Some(MergeAdoption {
            merged_id,
            horizon,
            moved: vec![(0, 0); replaced.len()],
            replaced,
            entries,
            next: 0,
        });
    }

    /// Repoints up to `step` index entries of the merge being adopted; the last slice retires the
    /// replaced segments. Whether the merge is adopted whole.
    fn continue_merge_adoption(&mut self, step: usize) -> bool {
        let Some(adoption) = &mut self.merge_adoption else {
            return true;
        };
        let end = adoption.next.saturating_add(step).min(adoption.entries.len());
        let merged_live = self.segments.live_mut(adoption.merged_id);
        for entry in &adoption.entries[adoption.next..end] {
            let Some(location) = self.index.get_mut(&entry.key) else {
                continue;
            };
            let Some(&slot) = adoption.replaced.get(&location.segment) else {
                continue;
            };
            if location.version != entry.version {
                continue;
            }
            let moved = &mut adoption.moved[slot];
            moved.0 += 1;
            moved.1 += entry.segment_bytes() as u64;
            location.segment = adoption.merged_id;
            location.record_offset = entry.record_offset;
            // A live record of a replaced segment; `move_live` below settles the counts.
            merged_live.set(entry.record_offset);
        }
        adoption.next = end;
        for (&id, &slot) in &adoption.replaced {
            let (records, bytes) = std::mem::take(&mut adoption.moved[slot]);
            self.segments.move_live(id, adoption.merged_id, records, bytes);
        }
        if end < adoption.entries.len() {
            return false;
        }
        let mut durable = self.shared.durable.lock().expect("not poisoned");
        // The merge left out records that writes up to `horizon` superseded, which a manifest
        // with an older `through` may not hold: such a manifest lists the replaced segments.
        if durable
            .listing
            .first_key_value()
            .is_some_and(|(through, _)| *through < adoption.horizon)
        {
            return false;
        }
        let adoption = self.merge_adoption.take().expect("present");
        for id in adoption.replaced.keys() {
            let replaced = self.segments.remove(*id);
            assert_eq!(
                replaced.live_records, 0,
                "a merge keeps every live record of the segments it replaces"
            );
            self.open_segments.remove(id);
            durable.segments.remove(&replaced.first_index);
            durable.unsynced.remove(&(replaced.first_index, replaced.last_index));
            self.retired
                .push(((replaced.first_index, replaced.last_index), replaced.path));
        }
        let merged = self.segments.get(adoption.merged_id);
        durable.segments.insert(merged.first_index, merged.last_index);
        durable
            .unsynced
            .insert((merged.first_index, merged.last_index), merged.path.clone());
        drop(durable);
        self.cleaning = false;
        // A finished merge changes which runs there are: look again even if the last look found
        // none and few segments were added since (an idle store adds none).
        self.look_for_merge_at_inserted = 0;
        self.maybe_clean();
        true
    }

    /// A manifest is now the durable description of the state: segments a merge replaced that it
    /// does not list are retired, by the retirer's thread (`wait_for_retirements` waits for it).
    pub fn manifest_persisted(&mut self, manifest: &Manifest) -> Result<(), StoreError> {
        let listed: HashSet<&(u64, u64)> = manifest.segments.iter().collect();
        let pins = self.pins.lock().expect("not poisoned");
        let (keep, delete): (Vec<_>, Vec<_>) = self
            .retired
            .iter()
            .cloned()
            .partition(|(range, _)| listed.contains(range) || pins.contains_key(range));
        drop(pins);
        self.retirer.retire(delete.into_iter().map(|(_, path)| path).collect());
        self.retired = keep;
        let (done, pending): (Vec<_>, Vec<_>) = std::mem::take(&mut self.set_aside)
            .into_iter()
            .partition(|(install_index, _)| *install_index <= manifest.applied_index);
        self.set_aside = pending;
        remove_durably(&done.into_iter().map(|(_, path)| path).collect::<Vec<_>>())?;
        Ok(())
    }
}

/// Removes segment files and makes the removals durable, syncing each directory once.
fn remove_durably(paths: &[PathBuf]) -> Result<(), StoreError> {
    for path in paths {
        std::fs::remove_file(path).map_err(io_error(path))?;
    }
    sync_parent_dirs(paths)
}

/// Syncs each directory holding one of `paths` once, making creations, renames and removals in
/// them durable.
fn sync_parent_dirs(paths: &[PathBuf]) -> Result<(), StoreError> {
    let dirs: HashSet<&Path> = paths
        .iter()
        .map(|path| path.parent().expect("a segment is in a directory"))
        .collect();
    for dir in dirs {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Moves a received segment into place: a rename, or where `to` is on another file system than
/// `from` a copy made durable before the original goes.
fn move_file(from: &Path, to: &Path) -> Result<(), StoreError> {
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => {
            std::fs::copy(from, to)
                .and_then(|_| File::open(to)?.sync_data())
                .map_err(io_error(to))?;
            std::fs::remove_file(from).map_err(io_error(from))?;
            Ok(())
        }
        Err(e) => Err(io_error(from)(e).into()),
    }
}

/// Notes that a newer write or a delete replaces `location`'s record: it no longer counts as live
/// in its segment.
fn supersede(segments: &mut SegmentSet, key: &[u8], location: &Location) {
    if location.segment != UNWRITTEN {
        segments.record_dead(
            location.segment,
            location.record_offset,
            segment_bytes_per_record(key.len(), location.value_len) as u64,
        );
    }
}

/// What `Store::locate` found.
pub enum Located {
    /// The value (or that there is none), at once.
    Ready(Option<Bytes>),
    /// Only on the device: read it with the `DiskRead`.
    OnDisk(DiskRead),
}

/// A value's record to read from its segment, on any thread (past the page cache with
/// `value_direct_io`).
pub struct DiskRead {
    path: PathBuf,
    direct: bool,
    /// Added to the read (`StoreOptions::emulated_device_read_us`).
    emulated_delay: Option<Duration>,
    key: Bytes,
    version: u64,
    record_offset: u64,
    value_len: u32,
}

impl DiskRead {
    /// Reads and verifies the record. An error means it is not where it was (a merge retired
    /// its segment meanwhile, and the file may be gone or reused): ask the store again.
    pub fn read(&self) -> Result<Bytes, StoreError> {
        if let Some(delay) = self.emulated_delay {
            std::thread::sleep(delay);
        }
        let reader = SegmentReader::open(&self.path, self.direct).map_err(io_error(&self.path))?;
        let entry = IndexEntry {
            key: self.key.clone(),
            version: self.version,
            is_tombstone: false,
            record_offset: self.record_offset,
            value_len: self.value_len,
        };
        reader.read_put(&self.path, &entry)
    }

    pub fn key(&self) -> &Bytes {
        &self.key
    }

    pub fn version(&self) -> u64 {
        self.version
    }
}

/// A segment file open for reading values, past the page cache if `direct`.
struct SegmentReader {
    file: File,
    direct: bool,
}

/// The unit `O_DIRECT` reads are aligned to (in offset, length and memory); any logical block
/// size up to it works.
const DIRECT_IO_ALIGNMENT: usize = 4096;

impl SegmentReader {
    /// Opens `path`, with `O_DIRECT` if `direct` and the file system allows it.
    fn open(path: &Path, direct: bool) -> std::io::Result<SegmentReader> {
        if direct {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(file) => return Ok(SegmentReader { file, direct: true }),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(SegmentReader {
            file: File::open(path)?,
            direct: false,
        })
    }

    /// The value of the put record `entry` names in the segment at `path`, checked against it.
    fn read_put(&self, path: &Path, entry: &IndexEntry) -> Result<Bytes, StoreError> {
        let mut buf = vec![0; entry.record_len()];
        self.read_exact_at(&mut buf, entry.record_offset)
            .map_err(io_error(path))?;
        let record = decode_record(&buf, entry).map_err(in_file(path))?;
        Ok(record
            .value
            .expect("a record that matches a put's index entry is a put"))
    }

    /// Fills `buf` from `offset`; directly, through whole aligned blocks around it.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if !self.direct {
            return self.file.read_exact_at(buf, offset);
        }
        let align = DIRECT_IO_ALIGNMENT as u64;
        let start = offset - offset % align;
        let skip = (offset - start) as usize;
        let span = (skip + buf.len()).div_ceil(DIRECT_IO_ALIGNMENT) * DIRECT_IO_ALIGNMENT;
        let mut blocks = vec![0u8; span + DIRECT_IO_ALIGNMENT];
        let lead = blocks.as_ptr().align_offset(DIRECT_IO_ALIGNMENT);
        let blocks = &mut blocks[lead..lead + span];
        let mut filled = 0;
        // The last block may run past the end of the file: a short read then.
        while filled < skip + buf.len() {
            match self.file.read_at(&mut blocks[filled..], start + filled as u64)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => filled += n,
            }
        }
        buf.copy_from_slice(&blocks[skip..skip + buf.len()]);
        Ok(())
    }
}

/// Reads and verifies the record `location` names, opening its segment file if needed.
fn read_value(
    open_segments: &mut HashMap<u64, SegmentReader>,
    direct: bool,
    segment: &SegmentFile,
    segment_id: u64,
    key: &[u8],
    location: &Location,
) -> Result<Bytes, StoreError> {
    if !open_segments.contains_key(&segment_id) {
        if open_segments.len() >= MAX_OPEN_SEGMENTS {
            let any = *open_segments.keys().next().expect("full");
            open_segments.remove(&any);
        }
        let reader = SegmentReader::open(&segment.path, direct).map_err(io_error(&segment.path))?;
        open_segments.insert(segment_id, reader);
    }
    let entry = IndexEntry {
        key: Bytes::copy_from_slice(key),
        version: location.version,
        is_tombstone: false,
        record_offset: location.record_offset,
        value_len: location.value_len,
    };
    open_segments[&segment_id].read_put(&segment.path, &entry)
}

impl Drop for Store {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        self.to_writers.clear();
        self.to_cleaner = None;
        for thread in self.writers.drain(..).chain(self.cleaner.take()) {
            let _ = thread.join();
        }
    }
}

/// The writer thread: persists each cut batch in order. A failed write (a full disk, an I/O error)
/// is retried until it succeeds — nothing acknowledged is lost, the node stalls instead.
fn write_segments(dir: &Path, batches: &mpsc::Receiver<CutBatch>, written: &mpsc::Sender<Written>, shared: &Shared) {
    while let Ok(batch) = batches.recv() {
        // Reduced here rather than on the applying thread, which is the one a node runs short of.
        let batch = batch.reduce();
        let Some((path, index)) = write_until_done(dir, &batch, shared) else {
            return;
        };
        {
            let mut durable = shared.durable.lock().expect("not poisoned");
            durable.segments.insert(batch.first_index, batch.last_index);
            durable
                .unsynced
                .insert((batch.first_index, batch.last_index), path.clone());
            durable.in_flight.remove(&batch.first_index);
            durable.written_through = durable.written_through.max(batch.last_index);
        }
        shared.changed.notify_all();
        let done = Written::new(batch.first_index, path, index);
        if written.send(done).is_err() {
            return;
        }
    }
}

/// Writes a segment, retrying a failure (a full disk, an I/O error) until it succeeds — nothing
/// acknowledged is lost, the store stalls instead. `None` when the store closed meanwhile.
fn write_until_done(dir: &Path, batch: &ReducedBatch, shared: &Shared) -> Option<(PathBuf, SegmentIndex)> {
    const RETRY_START: Duration = Duration::from_millis(50);
    const RETRY_MAX: Duration = Duration::from_secs(5);
    let mut retry = RETRY_START;
    loop {
        match write_segment(dir, batch, shared.take_spare(dir)) {
            Ok(done) => {
                shared.out_of_space.store(false, Ordering::Relaxed);
                return Some(done);
            }
            Err(_) if shared.closing.load(Ordering::Relaxed) => return None,
            Err(e) => {
                if e.is_out_of_space() {
                    shared.out_of_space.store(true, Ordering::Relaxed);
                }
                tracing::error!(
                    error = %e, first = batch.first_index, last = batch.last_index,
                    retry_ms = retry.as_millis() as u64,
                    "writing a segment failed; retrying until it succeeds"
                );
                std::thread::sleep(retry);
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

/// The cleaner competes with the foreground for the same cores: it runs at the lowest priority.
fn lower_thread_priority() {
    // SAFETY: plain system calls on this thread's own id.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    if result != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the cleaner's priority");
    }
}

/// What merging one segment reads, keeps and frees, for choosing what the cleaner merges.
#[derive(Debug, Clone, Copy)]
struct MergeCost {
    file_bytes: u64,
    live_bytes: u64,
    tombstone_bytes: u64,
}

/// A merge window may start or end at every segment when there are at most this many, at evenly
/// spaced ones otherwise: choosing then costs the same however many segments there are.
const MERGE_WINDOW_BOUNDARIES: usize = 128;

/// Most segments a merge reads, each open with its own buffer while it runs (segments it keeps
/// nothing of are not read, and do not count).
const MAX_MERGE_READ_SEGMENTS: usize = 256;

/// The run of consecutive segments (in log order) the cleaner merges next: among runs of two or
/// more that keep at most `max_kept_bytes`, read at most `MAX_MERGE_READ_SEGMENTS` segments and
/// free at least half of what the best such run would, the one that frees the most bytes per byte it reads and writes. This is the
/// cost-benefit choice of log-structured file systems: segments that are still mostly live —
/// the newest ones, or cold data under a skewed workload — are left alone instead of being
/// rewritten by every merge. A run that starts at the oldest segment drops its tombstones, so
/// they free bytes there; any other run keeps them. The bound on what a run keeps bounds the
/// merged segment, and with it what the merge holds in memory (its index) and what adopting it
/// repoints. `None` when no merge frees anything.
fn merge_window(segments: &[MergeCost], max_kept_bytes: u64) -> Option<Range<usize>> {
    let count = segments.len();
    if count < 2 {
        return None;
    }
    let prefix = |bytes: fn(&MergeCost) -> u64| -> Vec<u64> {
        std::iter::once(0)
            .chain(segments.iter().scan(0, |sum, s| {
                *sum += bytes(s);
                Some(*sum)
            }))
            .collect()
    };
    let (file, live, tombstones, kept_from) = (
        prefix(|s| s.file_bytes),
        prefix(|s| s.live_bytes),
        prefix(|s| s.tombstone_bytes),
        prefix(|s| u64::from(s.live_bytes > 0 || s.tombstone_bytes > 0)),
    );
    let kept = |run: &Range<usize>| {
        let tombstones_kept = if run.start == 0 {
            0
        } else {
            tombstones[run.end] - tombstones[run.start]
        };
        live[run.end] - live[run.start] + tombstones_kept + (HEADER_BYTES + FOOTER_BYTES) as u64
    };
    let read = |run: &Range<usize>| file[run.end] - file[run.start];
    let freed = |run: &Range<usize>| read(run).saturating_sub(kept(run));
    let within_bounds = |run: &Range<usize>| {
        kept(run) <= max_kept_bytes && kept_from[run.end] - kept_from[run.start] <= MAX_MERGE_READ_SEGMENTS as u64
    };
    // Starts at evenly spaced segments; from each, ends at evenly spaced segments up to the
    // furthest that keeps the run within the bounds (what a run keeps and reads grow with its
    // end).
    let stride = count.div_ceil(MERGE_WINDOW_BOUNDARIES);
    let mut candidates = Vec::new();
    for start in (0..count - 1).step_by(stride) {
        if !within_bounds(&(start..start + 2)) {
            continue;
        }
        let (mut reach, mut beyond) = (start + 2, count);
        while reach < beyond {
            let end = (reach + beyond).div_ceil(2);
            if within_bounds(&(start..end)) {
                reach = end;
            } else {
                beyond = end - 1;
            }
        }
        let ends = reach - start - 1;
        let end_stride = ends.div_ceil(MERGE_WINDOW_BOUNDARIES);
        candidates.extend(
            (start + 2..=reach)
                .step_by(end_stride)
                .chain(std::iter::once(reach))
                .map(|end| start..end),
        );
    }
    let most_freed = candidates.iter().map(freed).max().filter(|&most| most > 0)?;
    let mut best: Option<(f64, Range<usize>)> = None;
    for run in candidates {
        if 2 * freed(&run) < most_freed {
            continue;
        }
        let gain = freed(&run) as f64 / (read(&run) + kept(&run)) as f64;
        if !matches!(&best, Some((best_gain, _)) if *best_gain >= gain) {
            best = Some((gain, run));
        }
    }
    best.map(|(_, run)| run)
}

/// A look for a merge that finds none is repeated once a 1/this share of the segments is new.
const LOOKS_FOR_MERGE_PER_PASS: usize = 64;

/// Most segments a look for a consolidation run goes through, from the oldest small one.
const CONSOLIDATION_LOOKAHEAD_SEGMENTS: usize = 16_384;

/// Most segments one consolidation merges: with batches far smaller than the target, outputs are
/// themselves consolidated later, so each record is rewritten about log_64(target / batch) times.
const MAX_CONSOLIDATED_SEGMENTS: usize = 64;

/// Segments smaller than this, half the consolidation target, are the ones consolidation merges
/// (the store keeps them apart in `SegmentSet::small`).
fn small_below_bytes(target_bytes: u64) -> u64 {
    target_bytes / 2
}

/// What runs of tiny segments — smaller than half this — are merged into whatever their number:
/// a file that small costs a start-up or a catch-up more in its open and its device read (tens
/// of µs here) than in its bytes, and merging it moves next to nothing. A 128th of the
/// consolidation target (64 KiB of the default 8 MiB): each record is rewritten once more at
/// most, and only those of batches under 32 KiB.
fn gathered_tiny_bytes(consolidated_segment_bytes: u64) -> u64 {
    consolidated_segment_bytes / 128
}

/// A segment this many times smaller than the first of a consolidation run ends the run.
const CONSOLIDATION_TIER_RATIO: u64 = 8;

/// The oldest run of consecutive segments, each smaller than half of `target_bytes` and none
/// `CONSOLIDATION_TIER_RATIO` times smaller than the run's first, that holds `target_bytes`
/// between them or `MAX_CONSOLIDATED_SEGMENTS` segments: merged into one, they make one file of
/// about the target instead of many. A shorter run waits for more segments, so the newest ones
/// are not rewritten again and again; and a merged segment is not merged again with the next few
/// small ones, but once there are enough of its own size (tiers, as in an LSM tree). `None` when
/// there is no such run or the target is 0.
fn consolidation_window(file_bytes: &[u64], target_bytes: u64) -> Option<Range<usize>> {
    if target_bytes == 0 {
        return None;
    }
    let small = |bytes: u64| bytes < small_below_bytes(target_bytes);
    let mut start = 0;
    while start < file_bytes.len() {
        if !small(file_bytes[start]) {
            start += 1;
            continue;
        }
        let (mut end, mut run_bytes) = (start, 0);
        while end < file_bytes.len()
            && small(file_bytes[end])
            && file_bytes[end] * CONSOLIDATION_TIER_RATIO >= file_bytes[start]
            && run_bytes < target_bytes
            && end - start < MAX_CONSOLIDATED_SEGMENTS
        {
            run_bytes += file_bytes[end];
            end += 1;
        }
        if end - start >= 2 && (run_bytes >= target_bytes || end - start == MAX_CONSOLIDATED_SEGMENTS) {
            return Some(start..end);
        }
        start = end;
    }
    None
}

/// Consecutive segments, in log order, for the cleaner to merge into one.
struct MergeJob {
    segments: Vec<LocatedSegment>,
    /// Beside `segments`: which of the segment's records are live, or `None` where the merge
    /// keeps nothing of it and does not read it. Under overwrites most old segments end up so,
    /// and a merge of them costs a few deletions instead of reading them whole.
    live: Vec<Option<LiveRecords>>,
    /// The run starts at the oldest segment: no older one can still hold a tombstone's key.
    drop_tombstones: bool,
    /// The last index applied when the job was made: the live records are those of the state
    /// at that index.
    horizon: u64,
}

/// Bytes each segment a merge reads (at most its size), and the one it writes, buffer.
const MERGE_BUFFER_BYTES: usize = 64 << 10;

/// The cleaner thread: merges each job's segments into one (see `merge_segments`), retrying a
/// failed write (a full disk, an I/O error) until it succeeds, as the writer does.
fn clean_segments(
    dir: &Path,
    read_bytes_per_sec: u64,
    jobs: &mpsc::Receiver<MergeJob>,
    merged: &mpsc::Sender<Merged>,
    shared: &Shared,
) {
    const RETRY_START: Duration = Duration::from_millis(50);
    const RETRY_MAX: Duration = Duration::from_secs(5);
    lower_thread_priority();
    while let Ok(job) = jobs.recv() {
        assert_eq!(
            job.live.len(),
            job.segments.len(),
            "a merge says of each segment what it keeps"
        );
        let mut retry = RETRY_START;
        let written = loop {
            match merge_segments(dir, read_bytes_per_sec, &job, shared) {
                Ok(Some(written)) => break written,
                Ok(None) => return,
                Err(_) if shared.closing.load(Ordering::Relaxed) => return,
                Err(e) => {
                    tracing::error!(
                        error = %e, retry_ms = retry.as_millis() as u64,
                        "writing a merged segment failed; retrying until it succeeds"
                    );
                    std::thread::sleep(retry);
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        };
        let done = Merged {
            replaces: job.segments.iter().map(|((first, _), _)| *first).collect(),
            written,
            horizon: job.horizon,
        };
        if merged.send(done).is_err() {
            return;
        }
    }
}

/// One segment a merge reads: its records in key order, and which of them are live.
struct MergeSource {
    records: MergeRecords,
    live: LiveRecords,
    head: Option<(u64, Record)>,
}

enum MergeRecords {
    Streamed(RecordStream),
    /// The newest record of each key of a log-order segment (a `full` segment the store opened
    /// in `reduced` mode, at most a batch), sorted.
    Sorted(std::vec::IntoIter<(u64, Record)>),
}

impl MergeSource {
    /// Opens `path`; a segment the store lists that cannot be read is corruption.
    fn open(path: &Path, live: LiveRecords) -> MergeSource {
        let read = || -> Result<MergeSource, SegmentError> {
            let mut stream = RecordStream::open(path, MERGE_BUFFER_BYTES)?;
            let records = if stream.header().log_order {
                let mut newest: HashMap<Bytes, (u64, Record)> = HashMap::default();
                while let Some((offset, record)) = stream.next_record()? {
                    newest.insert(record.key.clone(), (offset, record));
                }
                let mut sorted: Vec<(u64, Record)> = newest.into_values().collect();
                sorted.sort_unstable_by(|a, b| a.1.key.cmp(&b.1.key));
                MergeRecords::Sorted(sorted.into_iter())
            } else {
                MergeRecords::Streamed(stream)
            };
            let mut source = MergeSource {
                records,
                live,
                head: None,
            };
            source.advance();
            Ok(source)
        };
        read().unwrap_or_else(|e| panic!("the cleaner cannot read a durable segment: {e}"))
    }

    /// Moves to the next record; the bytes read for it.
    fn advance(&mut self) -> u64 {
        self.head = match &mut self.records {
            MergeRecords::Streamed(stream) => stream
                .next_record()
                .unwrap_or_else(|e| panic!("the cleaner cannot read a durable segment: {e}")),
            MergeRecords::Sorted(records) => records.next(),
        };
        self.head.as_ref().map_or(0, |(_, record)| {
            record_len(record.key.len(), record.value.as_ref().map_or(0, Bytes::len) as u32) as u64
        })
    }
}

/// Merges a job's segments into one, reading and writing a record at a time: each live record
/// they hold and, unless the job drops them, each key's newest tombstone among them, in key
/// order. Memory is a buffer per segment and the merged segment's index. `Ok(None)` when the
/// store closed meanwhile.
fn merge_segments(
    dir: &Path,
    read_bytes_per_sec: u64,
    job: &MergeJob,
    shared: &Shared,
) -> Result<Option<Written>, SegmentError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let first_index = job.segments.first().expect("a merge has segments").0 .0;
    let last_index = job.segments.last().expect("a merge has segments").0 .1;
    let started = Instant::now();
    let mut read_bytes = 0u64;
    let mut sources: Vec<MergeSource> = job
        .segments
        .iter()
        .zip(&job.live)
        .filter_map(|((_, path), live)| Some(MergeSource::open(path, live.clone()?)))
        .collect();
    let mut out = SegmentWriter::create(dir, first_index, last_index, shared.take_spare(dir), MERGE_BUFFER_BYTES)?;
    // Smallest key first; among equal keys the newest segment (highest number) first.
    let mut heads: BinaryHeap<(Reverse<Bytes>, usize)> = sources
        .iter()
        .enumerate()
        .filter_map(|(number, source)| Some((Reverse(source.head.as_ref()?.1.key.clone()), number)))
        .collect();
    let mut decided: Option<Bytes> = None;
    while let Some((Reverse(key), number)) = heads.pop() {
        if shared.closing.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let source = &mut sources[number];
        let (offset, record) = source.head.take().expect("a queued segment has a head");
        let keep = match &record.value {
            Some(_) => source.live.contains(offset),
            None => !job.drop_tombstones,
        };
        read_bytes += source.advance();
        if let Some((_, next)) = &source.head {
            heads.push((Reverse(next.key.clone()), number));
        }
        // A key's newest record among the segments decides; a live one is its newest anywhere.
        if decided.as_ref() == Some(&key) {
            assert!(record.value.is_none() || !keep, "a live record is its key's newest");
            continue;
        }
        decided = Some(key);
        if keep {
            out.push(&record)?;
        }
        // Rate limit: never ahead of `read_bytes_per_sec` since the merge began.
        let due = Duration::from_secs_f64(read_bytes as f64 / read_bytes_per_sec.max(1) as f64);
        if let Some(early) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(early);
        }
    }
    let (path, index) = out.finish()?;
    Ok(Some(Written::new(first_index, path, index)))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// xorshift64*: deterministic randomness without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// One log entry's writes.
    type Entry = Vec<(Bytes, Option<Bytes>)>;

    fn random_entry(rng: &mut Rng, keys: u64) -> Entry {
        (0..rng.below(4))
            .map(|_| {
                let key = Bytes::from(format!("k{:03}", rng.below(keys)));
                let value =
                    (rng.below(5) > 0).then(|| Bytes::from(vec![b'a' + rng.below(26) as u8; rng.below(300) as usize]));
                (key, value)
            })
            .collect()
    }

    /// Appends `entries` random entries over 50 keys to `log`, applying each to `store`.
    fn apply_random(store: &mut Store, log: &mut Vec<Entry>, rng: &mut Rng, entries: usize) {
        for _ in 0..entries {
            log.push(random_entry(rng, 50));
            apply(store, log.len() as u64, log.last().expect("just pushed"));
        }
    }

    fn apply(store: &mut Store, index: u64, entry: &Entry) {
        for (key, value) in entry {
            store.write(index, key.clone(), value.clone());
        }
        store.entry_applied(index);
    }

    fn model_at(log: &[Entry], index: u64) -> HashMap<Bytes, Bytes> {
        let mut model = HashMap::new();
        for entry in &log[..index as usize] {
            for (key, value) in entry {
                match value {
                    Some(v) => model.insert(key.clone(), v.clone()),
                    None => model.remove(key),
                };
            }
        }
        model
    }

    /// Test keys "kNNN" group by their first digit.
    fn by_first_digit(key: &[u8]) -> Option<usize> {
        (key.first() == Some(&b'k') && key.len() >= 2).then_some(2)
    }

    /// Every key reads as in `model`: what a store serves, also while its index is built.
    fn assert_reads_match(store: &mut Store, model: &HashMap<Bytes, Bytes>, keys: u64, context: &str) {
        for k in 0..keys {
            let key = Bytes::from(format!("k{k:03}"));
            assert_eq!(
                store.get(&key).unwrap().as_ref(),
                model.get(&key),
                "{context}: key {key:?}"
            );
            assert_eq!(store.contains(&key), model.contains_key(&key), "{context}: {key:?}");
        }
        for digit in 0..10 {
            let group = format!("k{digit}");
            assert_eq!(
                store.group_has_keys(group.as_bytes()),
                model.keys().any(|k| k.starts_with(group.as_bytes())),
                "{context}: group {group} has keys"
            );
        }
    }

    fn assert_matches(store: &mut Store, model: &HashMap<Bytes, Bytes>, keys: u64, context: &str) {
        store.wait_for_index();
        let segments = &store.segments;
        let live: u64 = segments.by_id.values().map(|s| s.live_bytes).sum();
        let file: u64 = segments.by_id.values().map(|s| s.file_bytes).sum();
        assert_eq!(
            (segments.live_bytes, segments.file_bytes),
            (live, file),
            "{context}: byte totals"
        );
        // Each segment's live records and bytes are exactly what the index points at in it: the
        // cleaner's choice of what to merge rests on them.
        let mut pointed: HashMap<u64, (u64, u64)> = HashMap::new();
        for (key, location) in store.index.iter() {
            if location.segment != UNWRITTEN {
                let counts = pointed.entry(location.segment).or_default();
                counts.0 += 1;
                counts.1 += segment_bytes_per_record(key.len(), location.value_len) as u64;
            }
        }
        for (id, segment) in &segments.by_id {
            assert_eq!(
                (segment.live_records, segment.live_bytes),
                pointed.get(id).copied().unwrap_or_default(),
                "{context}: live records and bytes of segment {id}"
            );
        }
        assert_reads_match(store, model, keys, context);
        for digit in 0..10 {
            let group = format!("k{digit}");
            let mut live: Vec<_> = model
                .iter()
                .filter(|(k, _)| k.starts_with(group.as_bytes()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            live.sort();
            let keys: Vec<_> = live.iter().map(|(k, _)| k.clone()).collect();
            assert_eq!(
                store.scan_group(group.as_bytes()).unwrap(),
                live,
                "{context}: group {group}"
            );
            assert_eq!(
                store.group_keys(group.as_bytes()),
                keys,
                "{context}: keys of group {group}"
            );
        }
    }

    const SECOND_DIR: &str = "second";

    /// Half the stores spread their segments over a second directory, chosen when the store is
    /// first opened (a directory may be added between runs, never taken away).
    fn more_dirs(dir: &Path, rng: &mut Rng) -> Vec<PathBuf> {
        let second = dir.join(SECOND_DIR);
        let fresh = std::fs::read_dir(dir).map_or(true, |mut entries| entries.next().is_none());
        if second.exists() || (fresh && rng.below(2) == 0) {
            vec![second]
        } else {
            Vec::new()
        }
    }

    /// Options drawn at random, the mode too: a restart may switch it.
    fn options(dir: &Path, rng: &mut Rng) -> StoreOptions {
        StoreOptions {
            more_dirs: more_dirs(dir, rng),
            mode: if rng.below(4) == 0 {
                StorageMode::Full
            } else {
                StorageMode::Reduced
            },
            cache_bytes: [0, 2_000, 1 << 20][rng.below(3) as usize],
            batch_writes: 1 + rng.below(20),
            batch_bytes: 1 + rng.below(4_000),
            max_unwritten_batches: 1 + rng.below(3) as usize,
            min_cleanable_dirty_ratio: [0.1, 0.3, 0.5, 2.0][rng.below(4) as usize],
            min_cleanable_dead_bytes: [0, 0, 3_000][rng.below(3) as usize],
            cleaner_min_segments: 2 + rng.below(4) as usize,
            consolidated_segment_bytes: [0, 2_000, 30_000, 8 << 20][rng.below(4) as usize],
            consolidate_above_segments: [0, 4, 20][rng.below(3) as usize],
            max_merged_segment_bytes: [500, 5_000, 64 << 20][rng.below(3) as usize],
            group_of: by_first_digit,
            adoption_step_records: 1 + rng.below(4) as usize,
            merge_adoption_step_records: 1 + rng.below(8) as usize,
            value_direct_io: rng.below(2) == 0,
            ..StoreOptions::new(dir)
        }
    }

    /// What the node does with a snapshot: wait for its manifest, persist it, tell the store.
    fn snapshot(store: &mut Store) -> Manifest {
        let manifest = store.manifest_later()();
        store.manifest_persisted(&manifest).unwrap();
        store.wait_for_retirements();
        manifest
    }

    /// Files past the last manifest may be torn anywhere, in either directory: cut each at a
    /// random length.
    fn tear_unlisted(dir: &Path, manifest: &Manifest, rng: &mut Rng) {
        let listed: Vec<String> = manifest
            .segments
            .iter()
            .map(|(f, l)| segment_file_name(*f, *l))
            .collect();
        for dir in [dir.to_path_buf(), dir.join(SECOND_DIR)] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_str().unwrap().to_string();
                if path.is_file() && !listed.contains(&name) {
                    let len = std::fs::metadata(&path).unwrap().len();
                    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                    file.set_len(rng.below(len + 1)).unwrap();
                }
            }
        }
    }

    #[test]
    fn random_writes_cuts_crashes_and_replays_always_match_a_plain_map() {
        const KEYS: u64 = 40;
        let mut merges = 0;
        for seed in 1..=30u64 {
            let dir = tempfile::tempdir().unwrap();
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut log: Vec<Entry> = Vec::new();
            let mut manifest = Manifest::default();
            let mut store = Store::open(options(dir.path(), &mut rng), None).unwrap();
            for step in 0..400 {
                let entry = random_entry(&mut rng, KEYS);
                log.push(entry);
                let index = log.len() as u64;
                apply(&mut store, index, &log[index as usize - 1]);
                match rng.below(40) {
                    0..=2 => manifest = snapshot(&mut store),
                    3 => {
                        // A crash: the raft log (here `log`) survives; so do segments the last
                        // manifest lists. The rest may be torn, and is replayed.
                        merges += store.stats().merges;
                        drop(store);
                        tear_unlisted(dir.path(), &manifest, &mut rng);
                        // The index is built only once the replay is done, part way through it,
                        // or whenever its thread gets to it.
                        let (release_index_build, hold) = mpsc::channel();
                        let release_after = manifest.applied_index + rng.below(index - manifest.applied_index + 2);
                        store =
                            Store::open_holding_index_build(options(dir.path(), &mut rng), Some(&manifest), Some(hold))
                                .unwrap();
                        let context = format!("seed {seed} step {step}: reopened at {}", manifest.applied_index);
                        assert_reads_match(&mut store, &model_at(&log, manifest.applied_index), KEYS, &context);
                        for i in manifest.applied_index + 1..=index {
                            if i == release_after {
                                let _ = release_index_build.send(());
                            }
                            apply(&mut store, i, &log[i as usize - 1]);
                            if rng.below(8) == 0 {
                                manifest = snapshot(&mut store);
                            }
                            let context = format!("{context}, replayed to {i}");
                            assert_reads_match(&mut store, &model_at(&log, i), KEYS, &context);
                        }
                        drop(release_index_build);
                        assert_matches(&mut store, &model_at(&log, index), KEYS, &context);
                    }
                    _ => {}
                }
                if step % 50 == 0 {
                    let context = format!("seed {seed} step {step}");
                    assert_matches(&mut store, &model_at(&log, index), KEYS, &context);
                }
            }
            assert_matches(
                &mut store,
                &model_at(&log, log.len() as u64),
                KEYS,
                &format!("seed {seed} end"),
            );
            merges += store.stats().merges;
        }
        assert!(merges >= 30, "the cleaner ran {merges} times");
    }

    #[test]
    fn the_cleaner_merges_dead_bytes_away_and_retires_what_it_replaced_once_a_manifest_is_persisted() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            batch_writes: 50,
            cleaner_min_segments: 4,
            min_cleanable_dirty_ratio: 0.5,
            ..StoreOptions::new(dir.path())
        };
        let mut store = Store::open(options.clone(), None).unwrap();
        let mut index = 0;
        for round in 0..40u64 {
            for k in 0..50u64 {
                index += 1;
                let value = (k % 10 != 0 || round % 2 == 0).then(|| Bytes::from(format!("{round}-{k}")));
                store.write(index, Bytes::from(format!("k{k:03}")), value);
                store.entry_applied(index);
            }
        }
        store.settle();
        assert!(store.stats().merges > 0);
        let manifest_after = snapshot(&mut store);
        assert!(
            manifest_after.segments.len() < 40,
            "{} segments",
            manifest_after.segments.len()
        );
        let names = |dir: &Path, suffix: &str| {
            std::fs::read_dir(dir)
                .unwrap()
                .filter(|entry| entry.as_ref().unwrap().file_name().to_str().unwrap().ends_with(suffix))
                .count()
        };
        assert_eq!(
            names(dir.path(), ".seg"),
            manifest_after.segments.len(),
            "replaced segments are retired"
        );
        let spares = names(dir.path(), ".spare");
        assert!((1..=MAX_SPARE_FILES).contains(&spares), "{spares} spare files");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            manifest_after.segments.len() + spares
        );
        assert!(
            store.dirty_ratio() < 0.5 || store.segments.len() < 4,
            "idle with dirty ratio {} over {} segments",
            store.dirty_ratio(),
            store.segments.len()
        );
        let check = |store: &mut Store| {
            for k in 0..50u64 {
                let expected = (k % 10 != 0).then(|| Bytes::from(format!("39-{k}")));
                assert_eq!(store.get(format!("k{k:03}").as_bytes()).unwrap(), expected, "k{k}");
            }
        };
        check(&mut store);
        drop(store);
        let mut store = Store::open(options, Some(&manifest_after)).unwrap();
        check(&mut store);
        assert_eq!(names(dir.path(), ".spare"), spares, "start-up keeps the spares");
    }

    /// 2,000 writes, entries 1 to 2,000: 40 rounds over keys k000..k049, the round as the value.
    fn overwrite_50_keys_40_times(store: &mut Store) {
        let mut index = 0;
        for round in 0..40u64 {
            for k in 0..50u64 {
                index += 1;
                store.write(
                    index,
                    Bytes::from(format!("k{k:03}")),
                    Some(Bytes::from(format!("{round}"))),
                );
                store.entry_applied(index);
            }
        }
    }

    #[test]
    fn ticks_finish_the_writers_and_cleaners_work_once_writes_stop() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            batch_writes: 50,
            cleaner_min_segments: 4,
            ..StoreOptions::new(dir.path())
        };
        let mut store = Store::open(options, None).unwrap();
        overwrite_50_keys_40_times(&mut store);
        assert!(store.background_work(), "the last batch is still being written");
        let deadline = Instant::now() + Duration::from_secs(20);
        // The second tick without writes is the one that finds the store quiet and starts the
        // merge: until then, nothing in flight does not mean the work is done.
        let mut ticks = 0;
        while store.background_work() || ticks < 2 {
            assert!(
                Instant::now() < deadline,
                "still cleaning or writing after 20 s of ticks: {:?}",
                store.stats()
            );
            std::thread::sleep(Duration::from_millis(5));
            store.tick();
            ticks += 1;
        }
        assert!(store.stats().merges > 0);
        assert_eq!(store.stats().unwritten_batches, 0);
        // Done by the cleaner's own rules, which the timing of writes and merges does not change
        // (a run of merges can end with fewer segments than `cleaner_min_segments` and dirt left).
        let merges = store.stats().merges;
        store.settle();
        assert_eq!(store.stats().merges, merges, "the ticks left a merge undone");
    }

    #[test]
    fn retired_segments_are_kept_as_spares_up_to_the_byte_budget() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Shared::default();
        shared.spares.lock().unwrap().budget_bytes = 3000;
        let retire = |names: std::ops::Range<u64>| {
            let paths: Vec<PathBuf> = names
                .map(|n| {
                    let path = dir.path().join(segment_file_name(n, n));
                    std::fs::write(&path, vec![0u8; 1000]).unwrap();
                    path
                })
                .collect();
            shared.retire_files(&paths).unwrap();
            assert!(paths.iter().all(|path| !path.exists()), "retired files are gone");
        };
        let spare_files = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter(|entry| {
                    entry
                        .as_ref()
                        .unwrap()
                        .file_name()
                        .to_str()
                        .unwrap()
                        .ends_with(".spare")
                })
                .count()
        };
        retire(1..6);
        assert_eq!(spare_files(), 3, "three 1000-byte files fit a 3000-byte budget");
        assert_eq!(shared.spares.lock().unwrap().bytes(), 3000);
        let taken = shared.take_spare(dir.path()).expect("a spare");
        assert_eq!(shared.spares.lock().unwrap().bytes(), 2000);
        std::fs::remove_file(taken).unwrap();
        retire(6..8);
        assert_eq!(spare_files(), 3, "a taken spare's room is refilled, no more");
        assert!(
            shared.take_spare(Path::new("/elsewhere")).is_none(),
            "spares stay in their directory"
        );
    }

    #[test]
    fn a_restart_keeps_spares_within_the_budget_and_numbers_new_ones_after_them() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            min_cleanable_dead_bytes: 0,
            ..StoreOptions::new(dir.path())
        };
        let budget = spare_budget_bytes(&options);
        drop(Store::open(options.clone(), None).unwrap());
        let spare_bytes = budget / 3 + 1;
        for number in [4, 9, 2] {
            std::fs::write(
                dir.path().join(spare_file_name(number, spare_bytes)),
                vec![0u8; spare_bytes as usize],
            )
            .unwrap();
        }
        // A spare named as before its name held its size.
        std::fs::write(dir.path().join("00000000000000000007.spare"), b"old").unwrap();
        std::fs::write(
            dir.path().join("00000000000000000001-00000000000000000002.seg.tmp"),
            b"torn",
        )
        .unwrap();
        let store = Store::open(options, None).unwrap();
        let spares = store.shared.spares.lock().unwrap();
        let kept: Vec<u64> = spares
            .files
            .iter()
            .map(|(path, _)| spare_name(path).unwrap().0)
            .collect();
        assert_eq!(kept, vec![2, 4], "the two that fit the budget, oldest first");
        assert_eq!(spares.next_number, 10, "new spares are numbered after every one found");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![spare_file_name(2, spare_bytes), spare_file_name(4, spare_bytes)],
            "the rest is deleted"
        );
    }

    #[test]
    fn the_cleaner_waits_for_its_floor_of_dead_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let options = |min_cleanable_dead_bytes| StoreOptions {
            batch_writes: 50,
            cleaner_min_segments: 4,
            min_cleanable_dirty_ratio: 0.5,
            min_cleanable_dead_bytes,
            // Only the dirty ratio's merges: these segments are tiny enough to be gathered.
            consolidated_segment_bytes: 0,
            ..StoreOptions::new(dir.path())
        };
        let floor = 1 << 30;
        let mut store = Store::open(options(floor), None).unwrap();
        overwrite_50_keys_40_times(&mut store);
        store.settle();
        assert_eq!(store.stats().merges, 0, "merged under the floor");
        assert!(store.dirty_ratio() > 0.9, "dirty ratio {}", store.dirty_ratio());
        assert!(store.dead_bytes() < floor);
        let manifest = snapshot(&mut store);
        drop(store);
        let mut store = Store::open(options(0), Some(&manifest)).unwrap();
        store.settle();
        assert!(
            store.stats().merges > 0,
            "without the floor the same segments are merged"
        );
        assert!(store.dirty_ratio() < 0.5, "dirty ratio {}", store.dirty_ratio());
    }

    #[test]
    fn small_segments_are_consolidated_once_a_run_of_them_reaches_the_target() {
        let window = |sizes: &[u64], target| consolidation_window(sizes, target);
        assert_eq!(window(&[10, 10, 10], 100), None, "a short run waits for more segments");
        assert_eq!(window(&[30, 30, 30, 30, 30], 100), Some(0..4));
        assert_eq!(
            window(&[30, 30, 60, 30, 40, 40], 100),
            Some(3..6),
            "a segment of half the target or more breaks a run"
        );
        assert_eq!(window(&[1; 100], 1 << 20), Some(0..MAX_CONSOLIDATED_SEGMENTS));
        assert_eq!(window(&[30; 10], 0), None, "a target of 0 turns consolidation off");
        assert_eq!(window(&[200, 300], 100), None);
        let mut merged_then_new = vec![640];
        merged_then_new.extend([10; 63]);
        assert_eq!(
            window(&merged_then_new, 1 << 20),
            None,
            "a merged segment waits for segments of its size, not the next small ones"
        );
        merged_then_new.push(10);
        assert_eq!(window(&merged_then_new, 1 << 20), Some(1..65));
        assert_eq!(window(&[10, 640, 640, 640], 1500), Some(0..4), "larger ones join a run");
    }

    /// Segments of 20 writes, consolidated towards 16 KiB once more than `above` are small; no
    /// dirty-ratio merges, so consolidation is the only merge.
    fn consolidating_options(dir: &Path, above: usize) -> StoreOptions {
        StoreOptions {
            batch_writes: 20,
            consolidated_segment_bytes: 16 << 10,
            consolidate_above_segments: above,
            min_cleanable_dirty_ratio: 2.0,
            ..StoreOptions::new(dir)
        }
    }

    #[test]
    fn a_store_of_many_small_segments_becomes_a_few_and_reopens_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let options = consolidating_options(dir.path(), 0);
        const KEYS: u64 = 4_000;
        let value = |k: u64| (!k.is_multiple_of(7)).then(|| Bytes::from(format!("value of {k}")));
        let mut store = Store::open(options.clone(), None).unwrap();
        for k in 0..KEYS {
            store.write(k + 1, Bytes::from(format!("k{k:05}")), Some(Bytes::from("first")));
            store.entry_applied(k + 1);
        }
        for k in 0..KEYS {
            store.write(KEYS + k + 1, Bytes::from(format!("k{k:05}")), value(k));
            store.entry_applied(KEYS + k + 1);
        }
        store.settle();
        let manifest = snapshot(&mut store);
        assert!(
            store.stats().segments_out >= 400,
            "{} segments written",
            store.stats().segments_out
        );
        assert!(
            manifest.segments.len() * 10 <= store.stats().segments_out as usize,
            "{} segments of {} after consolidation",
            manifest.segments.len(),
            store.stats().segments_out
        );
        assert!(
            manifest.segments.windows(2).all(|pair| pair[0].1 < pair[1].0),
            "consolidated segments cover disjoint ranges in log order: {:?}",
            manifest.segments
        );
        let check = |store: &mut Store| {
            for k in 0..KEYS {
                assert_eq!(store.get(format!("k{k:05}").as_bytes()).unwrap(), value(k), "k{k}");
            }
        };
        check(&mut store);
        drop(store);
        let mut store = Store::open(options, Some(&manifest)).unwrap();
        check(&mut store);
    }

    #[test]
    fn tiny_segments_are_gathered_whatever_their_number() {
        let dir = tempfile::tempdir().unwrap();
        // Segments of 20 writes (about 1.4 KB) are tiny below 2 KiB: gathered into about 4 KiB.
        let options = StoreOptions {
            consolidated_segment_bytes: 512 << 10,
            consolidate_above_segments: usize::MAX,
            ..consolidating_options(dir.path(), 0)
        };
        let mut store = Store::open(options.clone(), None).unwrap();
        for k in 0..2_000u64 {
            store.write(k + 1, Bytes::from(format!("k{k:05}")), Some(Bytes::from("a value")));
            store.entry_applied(k + 1);
        }
        store.settle();
        assert_eq!(store.stats().segments_out, 100);
        assert!(store.stats().merges > 0, "tiny segments gathered");
        assert!(
            store.segments.tiny.len() <= 2,
            "only the newest tiny segments wait for more: {} of {} are tiny",
            store.segments.tiny.len(),
            store.segments.len()
        );
        assert!(store.segments.len() <= 40, "{} segments", store.segments.len());
        let manifest = snapshot(&mut store);
        drop(store);
        let mut store = Store::open(options, Some(&manifest)).unwrap();
        for k in 0..2_000u64 {
            assert_eq!(
                store.get(format!("k{k:05}").as_bytes()).unwrap(),
                Some(Bytes::from("a value")),
                "k{k}"
            );
        }
    }

    #[test]
    fn segments_are_consolidated_only_while_there_are_more_than_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let options = consolidating_options(dir.path(), 100);
        let mut store = Store::open(options, None).unwrap();
        let write_segments = |store: &mut Store, from: u64, segments: u64| {
            for k in from * 20..(from + segments) * 20 {
                store.write(k + 1, Bytes::from(format!("k{k:05}")), Some(Bytes::from("a value")));
                store.entry_applied(k + 1);
            }
            store.settle();
        };
        write_segments(&mut store, 0, 100);
        assert_eq!(store.stats().merges, 0, "100 small segments are within the bound");
        assert_eq!(store.segments.len(), 100);
        write_segments(&mut store, 100, 60);
        assert!(store.stats().merges > 0);
        assert!(
            store.segments.len() <= 100,
            "consolidated back within the bound: {} segments",
            store.segments.len()
        );
    }

    #[test]
    fn consolidation_waits_for_a_quiet_tick_until_twice_the_bound_of_segments() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(consolidating_options(dir.path(), 100), None).unwrap();
        let mut index = 0;
        let mut write_segments = |store: &mut Store, segments: u64| {
            for _ in 0..segments * 20 {
                index += 1;
                store.write(index, Bytes::from(format!("k{index:05}")), Some(Bytes::from("a value")));
                store.entry_applied(index);
            }
            store.finish_unwritten();
        };
        write_segments(&mut store, 150);
        store.tick();
        assert!(
            !store.cleaning && store.stats().merges == 0,
            "150 small segments, more than the bound, wait while writes come in"
        );
        store.tick();
        assert!(
            store.cleaning,
            "a tick with no writes since the last starts consolidation"
        );
        store.settle();
        assert!(
            store.segments.small.len() <= 100,
            "{} small segments",
            store.segments.small.len()
        );
        let merges_when_quiet = store.stats().merges;
        write_segments(&mut store, 120);
        assert!(
            store.cleaning || store.stats().merges > merges_when_quiet,
            "past twice the bound consolidation does not wait: {} segments",
            store.segments.len()
        );
    }

    #[test]
    fn a_manifest_begun_before_a_merge_lists_the_segments_the_merge_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            batch_writes: 10,
            cleaner_min_segments: 2,
            min_cleanable_dirty_ratio: 2.0,
            consolidated_segment_bytes: 0,
            ..StoreOptions::new(dir.path())
        };
        let mut store = Store::open(options.clone(), None).unwrap();
        let key = |i: u64| Bytes::from(format!("k{}", i % 10));
        let value = |i: u64| Bytes::from(format!("value {i}"));
        for i in 1..=60 {
            store.write(i, key(i), Some(value(i)));
            store.entry_applied(i);
        }
        store.finish_unwritten();
        let begun = store.manifest_later();
        let six_segments: Vec<(u64, u64)> = (0..6).map(|n| (10 * n + 1, 10 * n + 10)).collect();
        // A write past that manifest supersedes records the merge then leaves out.
        store.write(61, key(1), Some(value(61)));
        store.entry_applied(61);
        store.options.min_cleanable_dirty_ratio = 0.1;
        store.maybe_clean();
        assert!(store.cleaning, "the segments are mostly dead");
        let merged = store.from_cleaner.recv().unwrap();
        store.start_merge_adoption(merged);
        assert!(!store.continue_merge_adoption(usize::MAX), "held back");
        let manifest = begun();
        assert_eq!(manifest.segments, six_segments, "what the merge replaces");
        store.manifest_persisted(&manifest).unwrap();
        assert!(
            store.continue_merge_adoption(usize::MAX),
            "no manifest holds it back any more"
        );
        let manifest = snapshot(&mut store);
        assert!(manifest.segments.len() < 6, "{:?}", manifest.segments);
        drop(store);
        let mut store = Store::open(options, Some(&manifest)).unwrap();
        for i in 52..=61 {
            assert_eq!(store.get(&key(i)).unwrap(), Some(value(i)));
        }
    }

    #[test]
    fn the_cleaner_merges_the_run_that_frees_most_per_byte_moved() {
        let cost = |file_bytes, live_bytes, tombstone_bytes| MergeCost {
            file_bytes,
            live_bytes,
            tombstone_bytes,
        };
        // An old segment a third live, four half dead, four newest nearly all live: the newest
        // are left alone.
        let mut segments = vec![cost(3_000, 1_000, 0)];
        segments.extend((0..4).map(|_| cost(1_000, 500, 0)));
        segments.extend((0..4).map(|_| cost(1_000, 950, 0)));
        let run = merge_window(&segments, u64::MAX).expect("dead bytes to free");
        assert!(run.start == 0 && run.end <= 5, "{run:?}");
        // A live cold segment first, then dead ones: the cold one is not rewritten.
        let segments = [
            cost(10_000, 9_900, 0),
            cost(1_000, 100, 0),
            cost(1_000, 100, 0),
            cost(1_000, 200, 0),
        ];
        assert_eq!(merge_window(&segments, u64::MAX).map(|run| run.start), Some(1));
        // Tombstones free bytes only in a run from the oldest segment.
        let segments = [cost(1_000, 900, 0), cost(1_000, 0, 900), cost(1_000, 0, 900)];
        assert_eq!(merge_window(&segments, u64::MAX), Some(0..3));
        // Nothing to merge with.
        assert_eq!(merge_window(&[cost(1_000, 0, 0)], u64::MAX), None);
        // Many segments cost no more to choose from than a few, and a run is still found.
        let many: Vec<MergeCost> = (0..10_000).map(|i| cost(1_000, (i % 1_000) as u64, 0)).collect();
        let run = merge_window(&many, u64::MAX).expect("dead bytes to free");
        assert!(run.len() >= 2 && run.end <= many.len(), "{run:?}");
        // What a run keeps is bounded, though a longer run would free more; where no two
        // segments fit, nothing is merged.
        let keeps = |run: &Range<usize>| 400 * run.len() as u64 + (HEADER_BYTES + FOOTER_BYTES) as u64;
        let uniform: Vec<MergeCost> = (0..1_000).map(|_| cost(1_000, 400, 0)).collect();
        let run = merge_window(&uniform, 10_000).expect("dead bytes to free");
        assert!(run.len() >= 12 && keeps(&run) <= 10_000, "{run:?}");
        let run = merge_window(&many, 10_000).expect("dead bytes to free");
        let kept: u64 = many[run.clone()].iter().map(|s| s.live_bytes).sum();
        assert!(kept + 60 <= 10_000, "{run:?} keeps {kept}");
        assert_eq!(merge_window(&[cost(1_000, 900, 0), cost(1_000, 900, 0)], 1_000), None);
        // A merge opens every segment it reads at once: a run of many small segments is cut to
        // a bounded number of them, while segments it keeps nothing of cost nothing.
        let reads = |segments: &[MergeCost], run: &Range<usize>| {
            segments[run.clone()]
                .iter()
                .filter(|s| s.live_bytes > 0 || s.tombstone_bytes > 0)
                .count()
        };
        let small: Vec<MergeCost> = (0..100_000).map(|_| cost(200, 50, 0)).collect();
        let run = merge_window(&small, u64::MAX).expect("dead bytes to free");
        assert!(
            reads(&small, &run) <= MAX_MERGE_READ_SEGMENTS && run.len() >= MAX_MERGE_READ_SEGMENTS / 2,
            "{run:?}"
        );
        let mostly_dead: Vec<MergeCost> = (0..100_000)
            .map(|i| cost(200, if i % 1_000 == 0 { 50 } else { 0 }, 0))
            .collect();
        let run = merge_window(&mostly_dead, u64::MAX).expect("dead bytes to free");
        assert!(reads(&mostly_dead, &run) <= MAX_MERGE_READ_SEGMENTS, "{run:?}");
        assert!(run.len() > 10 * MAX_MERGE_READ_SEGMENTS, "{run:?}");
    }

    #[test]
    fn cold_segments_are_left_alone_and_deleted_keys_stay_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            batch_writes: 100,
            cleaner_min_segments: 2,
            min_cleanable_dirty_ratio: 0.2,
            ..StoreOptions::new(dir.path())
        };
        let mut store = Store::open(options.clone(), None).unwrap();
        let mut index = 0;
        let mut write = |store: &mut Store, key: String, value: Option<String>| {
            index += 1;
            store.write(index, Bytes::from(key), value.map(Bytes::from));
            store.entry_applied(index);
        };
        for k in 0..1_000 {
            write(&mut store, format!("cold{k:04}"), Some(format!("cold value {k:0200}")));
        }
        store.settle();
        // Hot keys rewritten over and over, cold keys deleted among them.
        for round in 0..500 {
            for k in 0..10 {
                write(&mut store, format!("hot{k}"), Some(format!("{round:0200}")));
            }
            if round % 50 == 0 {
                write(&mut store, format!("cold{:04}", round / 50), None);
            }
        }
        store.settle();
        assert!(store.stats().merges > 0, "the cleaner merged");
        assert!(
            dir.path().join(segment_file_name(1, 100)).exists(),
            "the oldest segment, nearly all live, was not rewritten"
        );
        let manifest = snapshot(&mut store);
        let check = |store: &mut Store| {
            for k in 0..10 {
                assert_eq!(
                    store.get(format!("cold{k:04}").as_bytes()).unwrap(),
                    None,
                    "cold{k} deleted"
                );
            }
            assert_eq!(
                store.get(b"cold0010").unwrap(),
                Some(Bytes::from(format!("cold value {:0200}", 10)))
            );
            assert_eq!(store.get(b"hot3").unwrap(), Some(Bytes::from(format!("{:0200}", 499))));
        };
        check(&mut store);
        drop(store);
        let mut store = Store::open(options, Some(&manifest)).unwrap();
        check(&mut store);
    }

    /// Runs one job through the cleaner thread's loop and reads back what it merged.
    fn merge_once(dir: &Path, job: MergeJob) -> Vec<Record> {
        let (to_cleaner, jobs) = mpsc::channel();
        let (merged_tx, merged_rx) = mpsc::channel();
        to_cleaner.send(job).unwrap();
        drop(to_cleaner);
        clean_segments(dir, u64::MAX, &jobs, &merged_tx, &Shared::default());
        let merged = merged_rx.recv().expect("the cleaner merged");
        crate::segment::read_segment(&merged.written.path).unwrap().1
    }

    fn test_record(key: &str, value: Option<&str>, version: u64) -> Record {
        Record {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            version,
        }
    }

    /// Writes one segment per entry of `batches` (first index, records) and returns each one's
    /// range, path and index.
    fn write_test_segments(dir: &Path, batches: Vec<(u64, Vec<Record>)>) -> Vec<(LocatedSegment, SegmentIndex)> {
        let shared = Shared::default();
        batches
            .into_iter()
            .map(|(first, records)| {
                let batch = ReducedBatch {
                    first_index: first,
                    last_index: first,
                    records,
                    log_order: false,
                    writes_in: 1,
                    bytes_in: 0,
                };
                let (path, index) = write_until_done(dir, &batch, &shared).unwrap();
                (((first, first), path), index)
            })
            .collect()
    }

    /// What a leader ships in an install: into a new directory `dir`, one segment per range holding
    /// the one record `new{first}` = "new", so that a test can tell received segments from local
    /// ones of the same names.
    fn ship_segments(dir: &Path, ranges: &[(u64, u64)]) {
        std::fs::create_dir(dir).unwrap();
        let shared = Shared::default();
        for &(first, last) in ranges {
            let batch = ReducedBatch {
                first_index: first,
                last_index: last,
                records: vec![test_record(&format!("new{first}"), Some("new"), last)],
                log_order: false,
                writes_in: 1,
                bytes_in: 0,
            };
            write_until_done(dir, &batch, &shared).unwrap();
        }
    }

    /// The records of a segment whose key `is_live` names as live.
    fn live_where(index: &SegmentIndex, is_live: impl Fn(&[u8]) -> bool) -> LiveRecords {
        let mut live = LiveRecords::new(index.file_bytes);
        for entry in index.entries.iter().filter(|e| !e.is_tombstone && is_live(&e.key)) {
            live.set(entry.record_offset);
        }
        live
    }

    #[test]
    fn a_merge_keeps_live_records_in_key_order_and_tombstones_unless_it_starts_at_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_test_segments(
            dir.path(),
            vec![
                (1, vec![test_record("a", Some("1"), 1), test_record("b", Some("1"), 1)]),
                (2, vec![test_record("a", None, 2), test_record("c", Some("2"), 2)]),
                (3, vec![test_record("d", Some("3"), 3)]),
            ],
        );
        // "c" was overwritten since (by a newer segment or a write not yet in one): not live.
        let job = |drop_tombstones| MergeJob {
            segments: written.iter().map(|(located, _)| located.clone()).collect(),
            live: vec![
                Some(live_where(&written[0].1, |key| key == b"b")),
                Some(live_where(&written[1].1, |_| false)),
                Some(live_where(&written[2].1, |_| true)),
            ],
            drop_tombstones,
            horizon: 9,
        };
        assert_eq!(
            merge_once(dir.path(), job(false)),
            vec![
                test_record("a", None, 2),
                test_record("b", Some("1"), 1),
                test_record("d", Some("3"), 3)
            ],
            "the tombstone of \"a\" hides it from older segments"
        );
        std::fs::remove_file(dir.path().join(segment_file_name(1, 3))).unwrap();
        assert_eq!(
            merge_once(dir.path(), job(true)),
            vec![test_record("b", Some("1"), 1), test_record("d", Some("3"), 3)]
        );
    }

    #[test]
    fn a_merge_does_not_read_a_segment_it_keeps_nothing_of() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_test_segments(
            dir.path(),
            vec![
                (1, vec![test_record("a", Some("1"), 1), test_record("b", Some("1"), 1)]),
                (2, vec![test_record("a", Some("2"), 2)]),
            ],
        );
        // The second segment's only record was overwritten since: it is not read (its file is
        // gone).
        std::fs::remove_file(&written[1].0 .1).unwrap();
        let job = MergeJob {
            segments: written.iter().map(|(located, _)| located.clone()).collect(),
            live: vec![Some(live_where(&written[0].1, |key| key == b"b")), None],
            drop_tombstones: true,
            horizon: 9,
        };
        assert_eq!(merge_once(dir.path(), job), vec![test_record("b", Some("1"), 1)]);
    }

    #[test]
    fn a_merge_writes_what_it_keeps_in_key_order_and_takes_each_keys_newest_tombstone() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_test_segments(
            dir.path(),
            vec![
                (
                    1,
                    vec![
                        test_record("a", Some("1"), 1),
                        test_record("b", Some("1"), 1),
                        test_record("d", Some("1"), 1),
                    ],
                ),
                (2, vec![test_record("b", None, 2), test_record("c", Some("2"), 2)]),
                (3, vec![test_record("a", Some("3"), 3), test_record("c", None, 3)]),
            ],
        );
        let job = MergeJob {
            segments: written.iter().map(|(located, _)| located.clone()).collect(),
            live: vec![
                Some(live_where(&written[0].1, |key| key == b"d")),
                Some(live_where(&written[1].1, |_| false)),
                Some(live_where(&written[2].1, |_| true)),
            ],
            drop_tombstones: false,
            horizon: 9,
        };
        assert_eq!(
            merge_once(dir.path(), job),
            vec![
                test_record("a", Some("3"), 3),
                test_record("b", None, 2),
                test_record("c", None, 3),
                test_record("d", Some("1"), 1),
            ]
        );
    }

    /// What a shipment does with pinned segments: copies each into the follower's staging
    /// directory.
    fn ship(pinned: &PinnedSegments, to: &Path) {
        for (name, path) in &pinned.files {
            std::fs::copy(path, to.join(name)).unwrap();
        }
    }

    #[test]
    fn shipped_segments_install_elsewhere_survive_a_restart_and_outlive_a_merge_while_pinned() {
        let mut rng = Rng(7);
        let leader_dir = tempfile::tempdir().unwrap();
        let leader_options = StoreOptions {
            batch_writes: 20,
            cleaner_min_segments: 2,
            ..StoreOptions::new(leader_dir.path())
        };
        let mut leader = Store::open(leader_options, None).unwrap();
        let mut log = Vec::new();
        apply_random(&mut leader, &mut log, &mut rng, 300);
        let manifest = snapshot(&mut leader);
        assert_eq!(manifest.applied_index, 300);
        let pinned = leader.pin_segments(&manifest).unwrap();
        assert_eq!(pinned.files.len(), manifest.segments.len());

        // While the shipment runs the cleaner replaces the pinned segments and a manifest that
        // does not list them is persisted: they stay until the shipment ends.
        let merges_before = leader.stats().merges;
        apply_random(&mut leader, &mut log, &mut rng, 300);
        leader.settle();
        let newer = snapshot(&mut leader);
        assert!(leader.stats().merges > merges_before, "the test meant to merge");
        let replaced: Vec<&PathBuf> = pinned
            .files
            .iter()
            .filter(|(name, _)| !newer.segments.iter().any(|(f, l)| segment_file_name(*f, *l) == *name))
            .map(|(_, path)| path)
            .collect();
        assert!(!replaced.is_empty(), "the merge replaced shipped segments");
        let staged = tempfile::tempdir().unwrap();
        ship(&pinned, staged.path());
        let replaced: Vec<PathBuf> = replaced.into_iter().cloned().collect();
        drop(pinned);
        snapshot(&mut leader);
        assert!(replaced.iter().all(|path| !path.exists()), "unpinned segments go");

        let follower_dir = tempfile::tempdir().unwrap();
        let mut follower = Store::open(options(follower_dir.path(), &mut rng), None).unwrap();
        apply(&mut follower, 1, &log[0]);
        follower.install(&manifest, staged.path()).unwrap();
        assert_matches(&mut follower, &model_at(&log, 300), 50, "installed");
        apply(&mut follower, 301, &log[300]);
        drop(follower);
        let mut follower = Store::open(options(follower_dir.path(), &mut rng), Some(&manifest)).unwrap();
        assert_matches(&mut follower, &model_at(&log, 300), 50, "reopened");
    }

    #[test]
    fn a_retirement_queued_before_an_install_leaves_the_received_segments_of_its_names_alone() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            batch_writes: 10,
            cleaner_min_segments: 2,
            min_cleanable_dirty_ratio: 0.1,
            ..StoreOptions::new(dir.path().join("state"))
        };
        let mut store = Store::open(options.clone(), None).unwrap();
        for index in 1..=40u64 {
            store.write(index, Bytes::from(format!("k{}", index % 5)), Some(Bytes::from("old")));
            store.entry_applied(index);
        }
        store.settle();
        assert!(store.stats().merges > 0, "the test meant to merge");
        let merged = store.manifest_later()();
        let replaced: Vec<(u64, u64)> = [(1, 10), (11, 20), (21, 30), (31, 40)]
            .into_iter()
            .filter(|range| !merged.segments.contains(range))
            .collect();
        assert!(!replaced.is_empty(), "{:?}", merged.segments);
        // The retirer is held up, as a slow disk would, while its job is queued and the install runs.
        let spares = store.shared.clone();
        let (held, hold) = mpsc::channel();
        let holder = std::thread::spawn(move || {
            let _spares = spares.spares.lock().unwrap();
            held.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        hold.recv().unwrap();
        store.manifest_persisted(&merged).unwrap();
        let received = dir.path().join("received");
        ship_segments(&received, &replaced);
        let installed = Manifest {
            applied_index: replaced.last().unwrap().1,
            segments: replaced.clone(),
        };
        store.install(&installed, &received).unwrap();
        holder.join().unwrap();
        store.manifest_persisted(&installed).unwrap();
        store.wait_for_retirements();
        for &(first, last) in &replaced {
            assert!(
                options.dir.join(segment_file_name(first, last)).exists(),
                "the installed segment {first}-{last} is in place"
            );
        }
        drop(store);
        let mut store = Store::open(options, Some(&installed)).unwrap();
        for &(first, _) in &replaced {
            assert_eq!(
                store.get(format!("new{first}").as_bytes()).unwrap(),
                Some(Bytes::from("new"))
            );
        }
    }

    #[test]
    fn an_install_that_was_not_persisted_leaves_the_old_state_whole() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            batch_writes: 10,
            ..StoreOptions::new(dir.path().join("state"))
        };
        let mut store = Store::open(options.clone(), None).unwrap();
        for index in 1..=30u64 {
            store.write(index, Bytes::from(format!("k{index}")), Some(Bytes::from("old")));
            store.entry_applied(index);
        }
        let old = snapshot(&mut store);
        assert_eq!(old.segments, vec![(1, 10), (11, 20), (21, 30)]);
        // What a leader ships: segments of the same names holding other records, and one more.
        let ship = |to: &Path| ship_segments(to, &[(1, 10), (11, 20), (21, 30), (31, 40)]);
        let received = dir.path().join("received");
        ship(&received);
        let new = Manifest {
            applied_index: 40,
            segments: vec![(1, 10), (11, 20), (21, 30), (31, 40)],
        };
        store.install(&new, &received).unwrap();
        assert_eq!(store.get(b"new31").unwrap(), Some(Bytes::from("new")));
        assert_eq!(store.get(b"k5").unwrap(), None);
        // A crash before the installed manifest is persisted: the old manifest reopens the old
        // state, not the received files that took its segments' names.
        drop(store);
        let mut store = Store::open(options.clone(), Some(&old)).unwrap();
        for index in 1..=30u64 {
            assert_eq!(
                store.get(format!("k{index}").as_bytes()).unwrap(),
                Some(Bytes::from("old"))
            );
        }
        assert_eq!(store.get(b"new1").unwrap(), None);
        // The same install, persisted this time: the set-aside files go.
        let received_again = dir.path().join("received-again");
        ship(&received_again);
        drop(store);
        let mut store = Store::open(options.clone(), Some(&old)).unwrap();
        store.install(&new, &received_again).unwrap();
        store.manifest_persisted(&new).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&options.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let expected: Vec<String> = new.segments.iter().map(|(f, l)| segment_file_name(*f, *l)).collect();
        assert_eq!(
            names, expected,
            "nothing set aside is left once the manifest is persisted"
        );
        drop(store);
        let mut store = Store::open(options, Some(&new)).unwrap();
        assert_eq!(store.get(b"new1").unwrap(), Some(Bytes::from("new")));
        assert_eq!(store.get(b"k5").unwrap(), None);
    }

    #[test]
    fn segments_spread_over_two_directories_reopen_in_log_order() {
        let mut rng = Rng(5);
        let dir = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        let two_dirs = || StoreOptions {
            batch_writes: 5,
            min_cleanable_dirty_ratio: 2.0,
            group_of: by_first_digit,
            more_dirs: vec![second.path().to_path_buf()],
            ..StoreOptions::new(dir.path())
        };
        let mut store = Store::open(two_dirs(), None).unwrap();
        let mut log = Vec::new();
        apply_random(&mut store, &mut log, &mut rng, 200);
        let manifest = snapshot(&mut store);
        assert_eq!(manifest.applied_index, 200);
        let segments_in = |dir: &Path| {
            std::fs::read_dir(dir)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "seg"))
                .count()
        };
        let (first, other) = (segments_in(dir.path()), segments_in(second.path()));
        assert!(
            first > 5 && other > 5,
            "both directories hold segments: {first} and {other}"
        );
        assert_eq!(first + other, manifest.segments.len());
        drop(store);
        let mut store = Store::open(two_dirs(), Some(&manifest)).unwrap();
        assert_matches(&mut store, &model_at(&log, 200), 50, "reopened over two directories");
        let alone = Store::open(StoreOptions::new(dir.path()), Some(&manifest));
        assert!(alone.is_err(), "a directory taken away is noticed, not ignored");
    }

    #[test]
    fn a_damaged_shipment_is_refused_naming_the_file_and_changes_nothing() {
        let mut rng = Rng(11);
        let leader_dir = tempfile::tempdir().unwrap();
        let mut leader = Store::open(options(leader_dir.path(), &mut rng), None).unwrap();
        let mut log = Vec::new();
        apply_random(&mut leader, &mut log, &mut rng, 100);
        let manifest = snapshot(&mut leader);
        let pinned = leader.pin_segments(&manifest).unwrap();
        let staged = tempfile::tempdir().unwrap();
        ship(&pinned, staged.path());
        let (name, _) = pinned.files.last().unwrap();
        let damaged = staged.path().join(name);
        let mut bytes = std::fs::read(&damaged).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&damaged, &bytes).unwrap();

        let follower_dir = tempfile::tempdir().unwrap();
        let mut follower = Store::open(options(follower_dir.path(), &mut rng), None).unwrap();
        for index in 1..=10 {
            apply(&mut follower, index, &log[index as usize - 1]);
        }
        let message = follower.install(&manifest, staged.path()).unwrap_err().to_string();
        assert!(message.contains(name.as_str()), "{message}");
        assert_matches(&mut follower, &model_at(&log, 10), 50, "after a refused install");
    }

    #[test]
    fn a_missing_or_corrupt_listed_segment_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(StoreOptions::new(dir.path()), None).unwrap();
        store.write(1, "a".into(), Some("1".into()));
        store.entry_applied(1);
        let manifest = store.manifest_later()();
        drop(store);
        let path = dir.path().join(segment_file_name(1, 1));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_BYTES_FOR_TEST] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let message = Store::open(StoreOptions::new(dir.path()), Some(&manifest))
            .err()
            .unwrap()
            .to_string();
        assert!(
            message.contains("00000000000000000001-00000000000000000001.seg"),
            "{message}"
        );
        std::fs::remove_file(&path).unwrap();
        let message = Store::open(StoreOptions::new(dir.path()), Some(&manifest))
            .err()
            .unwrap()
            .to_string();
        assert!(message.contains("missing"), "{message}");
    }

    const HEADER_BYTES_FOR_TEST: usize = crate::segment::HEADER_BYTES + 30;

    #[test]
    fn full_mode_persists_every_write_and_reduced_mode_the_last_of_each_key() {
        for (mode, records_out) in [(StorageMode::Full, 100), (StorageMode::Reduced, 2)] {
            let dir = tempfile::tempdir().unwrap();
            let options = StoreOptions {
                mode,
                ..StoreOptions::new(dir.path())
            };
            let mut store = Store::open(options.clone(), None).unwrap();
            for index in 1..=100u64 {
                let key = if index % 2 == 0 { "even" } else { "odd" };
                store.write(index, key.into(), Some(Bytes::from(index.to_string())));
                store.entry_applied(index);
            }
            let manifest = snapshot(&mut store);
            store.finish_unwritten();
            assert_eq!(store.stats().records_out, records_out, "{mode:?}");
            drop(store);
            let mut store = Store::open(options, Some(&manifest)).unwrap();
            assert_eq!(store.get(b"even").unwrap(), Some(Bytes::from("100")), "{mode:?}");
            assert_eq!(store.get(b"odd").unwrap(), Some(Bytes::from("99")), "{mode:?}");
        }
    }

    #[test]
    fn a_reopened_store_serves_groups_and_deletes_before_its_index_is_built() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            group_of: by_first_digit,
            batch_writes: 3,
            ..StoreOptions::new(dir.path())
        };
        let mut store = Store::open(options.clone(), None).unwrap();
        for (index, key) in ["k10", "k11", "k12", "k20"].into_iter().enumerate() {
            apply(
                &mut store,
                index as u64 + 1,
                &vec![(Bytes::from(key), Some(Bytes::from("v")))],
            );
        }
        let manifest = snapshot(&mut store);
        drop(store);

        let (release, hold) = mpsc::channel();
        let mut store = Store::open_holding_index_build(options, Some(&manifest), Some(hold)).unwrap();
        assert!(!store.index_ready());
        assert!(store.group_has_keys(b"k1") && store.group_has_keys(b"k2"));
        let deletes: Entry = ["k10", "k11", "k12"]
            .iter()
            .map(|key| (Bytes::from(*key), None))
            .collect();
        apply(&mut store, 5, &deletes);
        assert!(
            !store.group_has_keys(b"k1"),
            "every key of the group was deleted since start-up"
        );
        assert!(store.get(b"k11").unwrap().is_none() && !store.contains(b"k12"));
        assert!(
            !store.write(6, Bytes::from("k11"), Some(Bytes::from("w"))),
            "k11 was deleted"
        );
        store.entry_applied(6);
        assert!(store.group_has_keys(b"k1"));
        assert!(
            store.write(7, Bytes::from("k20"), None),
            "k20 had a value in the segments"
        );
        store.entry_applied(7);
        assert!(!store.group_has_keys(b"k2"));
        release.send(()).unwrap();
        let model = HashMap::from([(Bytes::from("k11"), Bytes::from("w"))]);
        assert_matches(&mut store, &model, 30, "after the index was built");
        assert_eq!(store.group_len(b"k1"), 1);
    }

    #[test]
    fn values_beyond_the_cache_come_from_disk() {
        values_beyond_the_cache_come_from_disk_read(false);
    }

    #[test]
    fn values_beyond_the_cache_come_from_the_device_past_the_page_cache() {
        values_beyond_the_cache_come_from_disk_read(true);
    }

    /// With `value_direct_io`, a value only on disk is located rather than read; the read runs
    /// anywhere, and caches the value only if the key was not written meanwhile.
    #[test]
    fn a_located_value_reads_off_the_store_and_is_cached_only_if_still_current() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_of_written_keys(dir.path(), 200, 10, true);
        let on_disk = |store: &mut Store, key: &str| match store.locate(key.as_bytes()).unwrap() {
            Located::OnDisk(read) => read,
            Located::Ready(_) => panic!("{key} is in memory"),
        };
        let read = on_disk(&mut store, "key3");
        let value = std::thread::spawn(move || (read.read().unwrap(), read)).join().unwrap();
        assert_eq!(value.0, vec![3u8; 100]);
        store.admit_read(value.1.key(), value.1.version(), value.0);
        assert!(matches!(store.locate(b"key3").unwrap(), Located::Ready(Some(v)) if v == vec![3u8; 100]));
        // Written while the read ran: the old value is not cached over the new one.
        let read = on_disk(&mut store, "key7");
        let old = read.read().unwrap();
        store.write(300, Bytes::from("key7"), Some(Bytes::from("new")));
        store.entry_applied(300);
        store.finish_unwritten();
        store.admit_read(read.key(), read.version(), old);
        assert_eq!(store.get(b"key7").unwrap().unwrap(), Bytes::from("new"));
        assert!(matches!(store.locate(b"absent").unwrap(), Located::Ready(None)));
    }

    /// A store with a 4 KiB cache holding `keys` keys `key<i>` of 100 bytes `i`, one write per
    /// entry, every batch written.
    fn store_of_written_keys(dir: &Path, keys: u64, batch_writes: u64, value_direct_io: bool) -> Store {
        let mut store = Store::open(
            StoreOptions {
                cache_bytes: 4_096,
                batch_writes,
                value_direct_io,
                ..StoreOptions::new(dir)
            },
            None,
        )
        .unwrap();
        for i in 0..keys {
            store.write(
                i + 1,
                Bytes::from(format!("key{i}")),
                Some(Bytes::from(vec![i as u8; 100])),
            );
            store.entry_applied(i + 1);
        }
        // Not `manifest_later`: the writer makes a segment durable before it tells the store.
        store.finish_unwritten();
        store
    }

    fn values_beyond_the_cache_come_from_disk_read(value_direct_io: bool) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_of_written_keys(dir.path(), 2_000, 100, value_direct_io);
        let stats = store.stats();
        assert_eq!(stats.live_keys, 2_000);
        assert!(stats.cache.bytes <= 4_096);
        for i in 0..2_000u64 {
            assert_eq!(
                store.get(format!("key{i}").as_bytes()).unwrap().unwrap(),
                vec![i as u8; 100]
            );
        }
        assert!(store.stats().cache.misses >= 1_900, "{:?}", store.stats().cache);
    }
}
