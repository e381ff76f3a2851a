//! The key-value store's figures on the metrics endpoint: how much reduction saves (writes in,
//! records and bytes persisted), how the object cache does, and what the cleaner has to do.

use std::sync::Arc;

use chorus_metrics::{counter, gauge, Counter, Gauge};
use chorus_storage::{Store, StoreStats};

pub struct StorageMetrics {
    writes: Arc<Counter>,
    write_bytes: Arc<Counter>,
    records_persisted: Arc<Counter>,
    segment_bytes_written: Arc<Counter>,
    merges: Arc<Counter>,
    merged_bytes: Arc<Counter>,
    cache_hits: Arc<Counter>,
    cache_misses: Arc<Counter>,
    segments: Arc<Gauge>,
    segment_bytes: Arc<Gauge>,
    live_keys: Arc<Gauge>,
    index_bytes: Arc<Gauge>,
    dead_bytes_percent: Arc<Gauge>,
    cache_bytes: Arc<Gauge>,
    /// What was last added to the counters.
    published: StoreStats,
}

impl StorageMetrics {
    pub fn new() -> Self {
        StorageMetrics {
            writes: counter(
                "chorus_storage_writes_total",
                "Committed writes applied, before reduction",
            ),
            write_bytes: counter(
                "chorus_storage_write_bytes_total",
                "Key and value bytes of committed writes, before reduction",
            ),
            records_persisted: counter(
                "chorus_storage_records_persisted_total",
                "Records written to segments after per-batch reduction",
            ),
            segment_bytes_written: counter(
                "chorus_storage_segment_bytes_written_total",
                "Bytes of segments written for reduced batches",
            ),
            merges: counter("chorus_storage_merges_total", "Cleaner merges finished"),
            merged_bytes: counter(
                "chorus_storage_merged_bytes_total",
                "Bytes of segments the cleaner wrote",
            ),
            cache_hits: counter(
                "chorus_storage_cache_hits_total",
                "Durable values served from the object cache",
            ),
            cache_misses: counter(
                "chorus_storage_cache_misses_total",
                "Durable values read from a segment file",
            ),
            segments: gauge("chorus_storage_segments", "Segment files making up the state"),
            segment_bytes: gauge(
                "chorus_storage_segment_bytes",
                "Bytes of the segment files making up the state",
            ),
            live_keys: gauge(
                "chorus_storage_live_keys",
                "Keys (hash fields count one each) in segments",
            ),
            index_bytes: gauge(
                "chorus_storage_index_bytes",
                "Bytes the in-memory index of live keys has allocated",
            ),
            dead_bytes_percent: gauge(
                "chorus_storage_dead_bytes_percent",
                "Share of segment bytes no read can reach (the cleaner merges above its threshold)",
            ),
            cache_bytes: gauge("chorus_storage_cache_bytes", "Bytes charged to the object cache"),
            published: StoreStats::default(),
        }
    }

    /// Publishes the store's figures; none while its index is built after a start-up (they
    /// count every key, and waiting for them would stall the raft loop).
    pub fn publish(&mut self, store: &mut Store) {
        if !store.index_ready() {
            return;
        }
        let now = store.stats();
        let before = self.published;
        // A restored or installed store counts from where the old one left off, never back.
        let delta = |now: u64, before: u64| now.saturating_sub(before);
        self.writes.add(delta(now.writes_in, before.writes_in));
        self.write_bytes.add(delta(now.bytes_in, before.bytes_in));
        self.records_persisted.add(delta(now.records_out, before.records_out));
        self.segment_bytes_written.add(delta(now.bytes_out, before.bytes_out));
        self.merges.add(delta(now.merges, before.merges));
        self.merged_bytes.add(delta(now.merged_bytes, before.merged_bytes));
        self.cache_hits.add(delta(now.cache.hits, before.cache.hits));
        self.cache_misses.add(delta(now.cache.misses, before.cache.misses));
        self.segments.set(now.segments as i64);
        self.segment_bytes.set(now.segment_bytes as i64);
        self.live_keys.set(now.live_keys as i64);
        self.index_bytes.set(now.index_bytes as i64);
        self.dead_bytes_percent
            .set((store.dirty_ratio() * 100.0).round() as i64);
        self.cache_bytes.set(now.cache.bytes as i64);
        self.published = now;
    }
}
