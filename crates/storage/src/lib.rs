//! The key-value state's durable form (issue 11, "the log is the database"): committed writes are
//! reduced per batch — only the last write of each key survives, a delete leaves a tombstone —
//! and each reduced batch is persisted as one immutable segment covering a [first, last] range of
//! log indices.
//!
//! Storage knows keys, values and log indices, not commands: the `kv` crate decides what a command
//! writes (a non-idempotent command is recorded as its resulting value) and how a hash maps onto
//! keys, and it must not know raft.

mod cache;
mod manifest;
mod reduce;
mod retirer;
mod scan_map;
mod segment;
mod sharded_map;
mod startup_index;
mod store;

pub use cache::{CacheStats, OBJECT_OVERHEAD_BYTES};
pub use manifest::Manifest;
pub use reduce::{CutBatch, ReducedBatch, Reducer};
pub use scan_map::{no_groups, GroupOf};
pub use segment::{
    decode_footer, decode_header, decode_index, decode_record, decode_segment, encode_segment, read_segment,
    read_segment_index, segment_bytes_per_record, segment_file_name, verify_segment, write_segment, IndexEntry, Record,
    RecordStream, SegmentError, SegmentHeader, SegmentIndex, FOOTER_BYTES, HEADER_BYTES,
};
pub use store::{
    CachePolicy, DiskRead, Located, PinnedSegments, StorageMode, Store, StoreError, StoreOptions, StoreStats,
    INDEX_BYTES_PER_RECORD,
};
