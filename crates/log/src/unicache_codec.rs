//! UniCache on the replication stream: append entries go to followers as encodings against a
//! cache every replica derives from the committed log.
//!
//! Consistency by construction:
//! - A replica's cache is a pure function of the committed prefix [1..v]; `v` is its version.
//!   Every replica feeds the cache the commands of each committed entry exactly once, in index
//!   order, as it applies them.
//! - The leader encodes with its cache at version v = its commit index (absorbing committed
//!   entries before it applies them, so no follower learns of a commit its cache lacks), and
//!   only for a follower
//!   whose log provably holds [1..v]: v ≤ the append's `index` (the entry the follower must already
//!   have), and v ≥ the follower's last reported version. Every encoded entry carries v, a
//!   fingerprint of the settings and a CRC-32 of the original bytes.
//! - A follower behind v first feeds its cache the entries (its version, v] from its own log —
//!   committed, since v ≤ the leader's commit index and the follower's log matches the leader's
//!   at `index` (checked via `log_term`). Ahead of v (possible right after a leader change), or
//!   unable to verify the match, it answers "cannot decode" with a rejection carrying its version;
//!   raft resends from the follower's match point and the leader sends raw until its version
//!   catches up. A CRC mismatch after decoding is rejected, counted and logged, never applied.
//! - The cache and its version are saved with every snapshot, so restarts and snapshot installs
//!   resume from a consistent point.
//! - The cache runs only between a "resume" and a "pause" entry in the log, which the leader
//!   proposes; resuming starts an empty cache (a new epoch, part of the fingerprint). A replica
//!   starts paused. So the cache is a function of the committed log even across pauses, and a
//!   paused cache costs nothing: no preprocessing, no absorbing.
//!
//! Preprocessing happens off the raft loop: the task submitting a write splits it into parts
//! (`preparer`), and the loop keeps them by request id for encoding and absorbing; only commands
//! proposed elsewhere are preprocessed on the loop.
//!
//! Auto-tuning: per follower, encoding is switched on when it saves at least 25% of the bytes and
//! the link is slow (round trip of the transport's pings ≥ 5 ms), and off again when savings fall
//! under 15% or the round trip under 2 ms; decisions are at least 2 s apart, and a link starts encoding. While
//! off, every 8th append is encoded (but sent raw) to keep measuring what encoding would save.
//! When no link has encoded for 30 s the leader pauses the cache; while paused it resumes as soon
//! as some link's round trip says encoding could pay, at most once per back-off period (30 s,
//! doubling up to 10 min while resuming keeps not paying). Without auto-tune the cache is
//! resumed at once and every link encodes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_metrics::{gauge, labeled_counter, labeled_gauge, Counter, Gauge};
use chorus_unicache::varint::{self, Reader};
use chorus_unicache::{absorb_command, decode_command, encode_command, CacheConfig, ItemCache, Part, Preprocessor};
use raft::eraftpb::{Entry, EntryType, Message, MessageType};

use crate::batch::{self, Origin, BATCH_VERSION};
use crate::codec::{CodecError, EntryCodec, LogView, Prepared, Preparer, CODEC_ENTRY};

const MAGIC: u8 = 0xEC;
const FORMAT: u8 = 2;
/// Feedback in the `context` of a rejection: MAGIC, FEEDBACK, kind, varint version.
const FEEDBACK: u8 = b'F';
const FEEDBACK_AHEAD: u8 = 1;
const FEEDBACK_BEHIND: u8 = 2;
const FEEDBACK_CORRUPT: u8 = 3;
const FEEDBACK_SETTINGS: u8 = 4;

const DECISION_INTERVAL: Duration = Duration::from_secs(2);
const SAMPLE_EVERY: u64 = 8;
const ON_SAVINGS: f64 = 0.25;
const OFF_SAVINGS: f64 = 0.15;
/// Link round trips as the transport's pings measure them (network and send queues, no disk):
/// well under a millisecond inside a data center, tens of ms between data centers, and growing
/// on any link that cannot keep up with what it is asked to carry.
const ON_RTT_MS: f64 = 5.0;
const OFF_RTT_MS: f64 = 2.0;
const BEHIND_COOLDOWN: Duration = Duration::from_millis(200);
const CORRUPT_COOLDOWN: Duration = Duration::from_secs(60);
const MAX_MEMO_ENTRIES: usize = 65_536;
const MAX_STASHED: usize = 65_536;
/// Control entries: CODEC_ENTRY, CONTROL, kind.
const CONTROL: u8 = b'U';
const RESUME: u8 = 1;
const PAUSE: u8 = 2;
const PAUSE_AFTER: Duration = Duration::from_secs(30);
const FIRST_RESUME_BACKOFF: Duration = Duration::from_secs(30);
const MAX_RESUME_BACKOFF: Duration = Duration::from_secs(600);
/// How long a proposed control entry may take to apply before proposing again.
const CONTROL_PENDING: Duration = Duration::from_secs(5);
/// Limits what a malformed encoded entry can make a follower allocate.
const MAX_COMMANDS: u64 = 1 << 20;

#[derive(Debug, Clone, Copy)]
pub struct UniCacheSettings {
    pub cache: CacheConfig,
    /// Switch encoding per follower by measured savings and round trip; off means always on.
    pub autotune: bool,
}

#[derive(Clone)]
struct LinkMetrics {
    bytes_before: Arc<Counter>,
    bytes_after: Arc<Counter>,
    encoding: Arc<Gauge>,
}

/// What the leader knows about one follower.
#[derive(Clone)]
struct Link {
    follower_version: u64,
    cooldown_until: Option<Instant>,
    encoding: bool,
    decided_at: Instant,
    appends: u64,
    /// The link's round trip, from the transport.
    rtt_ms: Option<f64>,
    window_before: u64,
    window_after: u64,
    metrics: LinkMetrics,
}

#[derive(Clone)]
struct CodecMetrics {
    version: Arc<Gauge>,
    active: Arc<Gauge>,
    items: Arc<Gauge>,
    bytes: Arc<Gauge>,
    hits: Arc<Counter>,
    misses: Arc<Counter>,
    decoded_entries: Arc<Counter>,
    rejected_ahead: Arc<Counter>,
    rejected_behind: Arc<Counter>,
    rejected_corrupt: Arc<Counter>,
    rejected_settings: Arc<Counter>,
}

impl CodecMetrics {
    fn new() -> CodecMetrics {
        let rejected = |reason| {
            labeled_counter(
                "chorus_unicache_decode_failures_total",
                "Encoded appends a follower could not decode, by reason",
                Some(("reason", reason)),
            )
        };
        let items = |result| {
            labeled_counter(
                "chorus_unicache_items_total",
                "Cacheable parts the leader encoded, by whether the cache held them",
                Some(("result", result)),
            )
        };
        CodecMetrics {
            version: gauge("chorus_unicache_version", "Committed index the cache reflects"),
            active: gauge(
                "chorus_unicache_active",
                "Whether the cache runs (1) or is paused by the log (0)",
            ),
            items: gauge("chorus_unicache_cache_items", "Items in the cache"),
            bytes: gauge("chorus_unicache_cache_bytes", "Bytes of items in the cache"),
            hits: items("hit"),
            misses: items("miss"),
            decoded_entries: chorus_metrics::counter(
                "chorus_unicache_decoded_entries_total",
                "Encoded entries this node decoded as a follower",
            ),
            rejected_ahead: rejected("ahead"),
            rejected_behind: rejected("behind"),
            rejected_corrupt: rejected("checksum"),
            rejected_settings: rejected("settings"),
        }
    }
}

/// Cloning gives an independent codec in the same state (the fuzzer starts each input from one).
#[derive(Clone)]
pub struct UniCacheCodec {
    settings: UniCacheSettings,
    preprocessor: Arc<dyn Preprocessor>,
    /// Fingerprint of the settings and the preprocessor.
    settings_fingerprint: u64,
    /// What encoded entries carry: the settings and `epoch` together.
    fingerprint: u32,
    cache: ItemCache,
    /// The index after which this cache started absorbing (0 from the beginning of the log).
    /// Replicas whose caches started at different points cannot share encodings, so the epoch
    /// is part of the fingerprint.
    epoch: u64,
    version: u64,
    /// Whether the cache runs (between a resume and a pause entry); shared with the preparer.
    active: bool,
    active_flag: Arc<AtomicBool>,
    /// Leader side: pausing and resuming.
    control: Control,
    links: HashMap<u64, Link>,
    /// Encodings of entries at a cache version, shared by all followers.
    memo: HashMap<u64, (u64, Option<Bytes>)>,
    /// Parts of this node's own commands, preprocessed by the submitting tasks, by request id.
    stash: HashMap<u64, Vec<Part>>,
    stash_order: VecDeque<u64>,
    own_origin: Option<Origin>,
    parts: Vec<Part>,
    metrics: CodecMetrics,
}

/// The leader's pausing and resuming of the cache.
#[derive(Clone)]
struct Control {
    /// A control entry is on its way through the log until then.
    pending_until: Option<Instant>,
    /// Since when no link has been encoding.
    all_off_since: Option<Instant>,
    resume_not_before: Instant,
    resume_backoff: Duration,
}

/// A control entry for the log: resume (a fresh cache from here) or pause.
pub fn control_entry(resume: bool) -> Bytes {
    Bytes::from(vec![CODEC_ENTRY, CONTROL, if resume { RESUME } else { PAUSE }])
}

fn control_kind(entry: &Entry) -> Option<u8> {
    match entry.data.as_ref() {
        [CODEC_ENTRY, CONTROL, kind] if entry.get_entry_type() == EntryType::EntryNormal => Some(*kind),
        _ => None,
    }
}

/// Why decoding failed, and what to tell the leader.
struct Failure {
    kind: u8,
    reason: String,
}

fn failure(kind: u8, reason: impl Into<String>) -> Failure {
    Failure {
        kind,
        reason: reason.into(),
    }
}

struct Header {
    fingerprint: u32,
    version: u64,
    crc: u32,
}

fn read_header(reader: &mut Reader<'_>) -> Result<Header, chorus_unicache::Error> {
    if reader.u8()? != MAGIC || reader.u8()? != FORMAT {
        return Err(chorus_unicache::Error::Malformed("not a UniCache entry"));
    }
    Ok(Header {
        fingerprint: reader.u32()?,
        version: reader.varint()?,
        crc: reader.u32()?,
    })
}

fn is_encoded(entry: &Entry) -> bool {
    entry.get_entry_type() == EntryType::EntryNormal && entry.data.first() == Some(&MAGIC)
}

fn is_batch(entry: &Entry) -> bool {
    entry.get_entry_type() == EntryType::EntryNormal && entry.data.first() == Some(&BATCH_VERSION)
}

fn fold_fingerprint(settings: u64, epoch: u64) -> u32 {
    let mixed = settings ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed ^ (mixed >> 32)) as u32
}

/// Seed for the cache's coin flips: the same on every replica for the same command.
fn seed(index: u64, position: usize) -> u64 {
    index.rotate_left(20) ^ (position as u64) << 40
}

impl UniCacheCodec {
    pub fn new(settings: UniCacheSettings, preprocessor: Arc<dyn Preprocessor>) -> UniCacheCodec {
        let settings_fingerprint = settings.cache.fingerprint() ^ preprocessor.fingerprint().rotate_left(17);
        UniCacheCodec {
            cache: ItemCache::new(settings.cache),
            settings,
            preprocessor,
            settings_fingerprint,
            fingerprint: fold_fingerprint(settings_fingerprint, 0),
            epoch: 0,
            version: 0,
            active: false,
            active_flag: Arc::new(AtomicBool::new(false)),
            control: Control {
                pending_until: None,
                all_off_since: None,
                resume_not_before: Instant::now(),
                resume_backoff: FIRST_RESUME_BACKOFF,
            },
            links: HashMap::new(),
            memo: HashMap::new(),
            stash: HashMap::new(),
            stash_order: VecDeque::new(),
            own_origin: None,
            parts: Vec::new(),
            metrics: CodecMetrics::new(),
        }
    }

    /// The committed index the cache reflects.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Digest of the cache state (replicas at equal versions have equal digests).
    pub fn digest(&self) -> u64 {
        self.cache.digest()
    }

    fn absorb(&mut self, entry: &Entry) {
        assert_eq!(
            entry.index,
            self.version + 1,
            "the cache absorbs committed entries one at a time, in order"
        );
        match control_kind(entry) {
            Some(kind) => self.switch(kind == RESUME, entry.index),
            None if self.active && is_batch(entry) => {
                if let Ok(batch) = batch::decode(&entry.data) {
                    let own = Some(batch.origin) == self.own_origin;
                    for (position, (request_id, command)) in batch.commands.iter().enumerate() {
                        let seed = seed(entry.index, position);
                        match own.then(|| self.stash.remove(request_id)).flatten() {
                            Some(parts) => absorb_command(&mut self.cache, &parts, seed),
                            None => {
                                self.parts.clear();
                                self.preprocessor.preprocess(command, &mut self.parts);
                                absorb_command(&mut self.cache, &self.parts, seed);
                            }
                        }
                    }
                }
            }
            None => {}
        }
        self.version = entry.index;
        self.memo.remove(&entry.index);
        self.metrics.version.set(self.version as i64);
        self.metrics.items.set(self.cache.len() as i64);
        self.metrics.bytes.set(self.cache.bytes() as i64);
    }

    /// Resumes (an empty cache, a new epoch) or pauses the cache at log index `index`.
    fn switch(&mut self, resume: bool, index: u64) {
        self.cache = ItemCache::new(self.settings.cache);
        self.memo.clear();
        self.stash.clear();
        self.stash_order.clear();
        self.active = resume;
        self.active_flag.store(resume, Ordering::Relaxed);
        self.metrics.active.set(i64::from(resume));
        let now = Instant::now();
        if resume {
            self.epoch = index;
            self.fingerprint = fold_fingerprint(self.settings_fingerprint, index);
        }
        for link in self.links.values_mut() {
            link.restart(now, resume);
        }
        self.control.pending_until = None;
        self.control.all_off_since = None;
        tracing::info!(
            index,
            resume,
            "UniCache {} at this log index",
            if resume { "resumed" } else { "paused" }
        );
    }

    /// The encoding of a raw batch at the current version, or `None` when it would not be smaller.
    fn encode_entry(&mut self, index: u64, data: &Bytes) -> Option<Bytes> {
        if let Some((version, encoded)) = self.memo.get(&index) {
            if *version == self.version {
                return encoded.clone();
            }
        }
        let batch = batch::decode(data).ok()?;
        let mut out = Vec::with_capacity(data.len() / 2 + 32);
        out.push(MAGIC);
        out.push(FORMAT);
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        varint::put(&mut out, self.version);
        out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
        varint::put(&mut out, batch.leader_time_ms);
        varint::put(&mut out, batch.origin.node_id);
        varint::put(&mut out, batch.origin.incarnation);
        varint::put(&mut out, batch.commands.len() as u64);
        let (mut hits, mut cacheable) = (0u64, 0u64);
        let own = Some(batch.origin) == self.own_origin;
        for (request_id, command) in &batch.commands {
            varint::put(&mut out, *request_id);
            let parts: &[Part] = match own.then(|| self.stash.get(request_id)).flatten() {
                Some(parts) => parts,
                None => {
                    self.parts.clear();
                    self.preprocessor.preprocess(command, &mut self.parts);
                    &self.parts
                }
            };
            let stats = encode_command(&self.cache, parts, &mut out);
            hits += u64::from(stats.hits);
            cacheable += u64::from(stats.cacheable);
        }
        self.metrics.hits.add(hits);
        self.metrics.misses.add(cacheable - hits);
        let encoded = (out.len() < data.len()).then(|| Bytes::from(out));
        if self.memo.len() >= MAX_MEMO_ENTRIES {
            self.memo.clear();
        }
        self.memo.insert(index, (self.version, encoded.clone()));
        encoded
    }

    fn decode_entry(&self, data: &[u8]) -> Result<Bytes, Failure> {
        let malformed = |e: chorus_unicache::Error| failure(FEEDBACK_CORRUPT, format!("malformed encoded entry: {e}"));
        let mut reader = Reader::new(data);
        let header = read_header(&mut reader).map_err(malformed)?;
        if header.version != self.version {
            return Err(failure(
                FEEDBACK_CORRUPT,
                "entries of one append carry different versions",
            ));
        }
        let leader_time_ms = reader.varint().map_err(malformed)?;
        let origin = Origin {
            node_id: reader.varint().map_err(malformed)?,
            incarnation: reader.varint().map_err(malformed)?,
        };
        let count = reader.varint().map_err(malformed)?;
        if count > MAX_COMMANDS {
            return Err(failure(FEEDBACK_CORRUPT, "too many commands"));
        }
        let mut commands = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let request_id = reader.varint().map_err(malformed)?;
            let mut command = Vec::new();
            decode_command(&self.cache, self.preprocessor.as_ref(), &mut reader, &mut command).map_err(malformed)?;
            commands.push((request_id, Bytes::from(command)));
        }
        reader.finish().map_err(malformed)?;
        let rebuilt = batch::encode(origin, leader_time_ms, &commands);
        let crc = crc32fast::hash(&rebuilt);
        if crc != header.crc {
            return Err(failure(
                FEEDBACK_CORRUPT,
                format!(
                    "decoded entry fails its checksum (stored {:#010x}, computed {crc:#010x})",
                    header.crc
                ),
            ));
        }
        Ok(rebuilt)
    }

    fn try_decode(&mut self, msg: &mut Message, log: &dyn LogView) -> Result<bool, Failure> {
        let Some(first) = msg.entries.iter().find(|e| is_encoded(e)) else {
            return Ok(false);
        };
        let header = read_header(&mut Reader::new(&first.data))
            .map_err(|e| failure(FEEDBACK_CORRUPT, format!("malformed encoded entry: {e}")))?;
        if header.version < self.version {
            return Err(failure(
                FEEDBACK_AHEAD,
                format!(
                    "our cache is at {}, the entries were encoded at {}",
                    self.version, header.version
                ),
            ));
        }
        if header.version > self.version {
            let matches = header.version <= msg.index && log.term(msg.index) == Some(msg.log_term);
            let entries = matches
                .then(|| log.entries(self.version + 1, header.version + 1))
                .flatten()
                .ok_or_else(|| {
                    failure(
                        FEEDBACK_BEHIND,
                        format!(
                            "cannot bring the cache from {} to {}: the log does not provably hold those entries",
                            self.version, header.version
                        ),
                    )
                })?;
            for entry in &entries {
                self.absorb(entry);
            }
        }
        // Same version now; the same settings and epoch must give the same fingerprint.
        if !self.active || header.fingerprint != self.fingerprint {
            return Err(failure(
                FEEDBACK_SETTINGS,
                "the leader's UniCache settings or epoch differ from ours (policy, sizes, preprocessor)",
            ));
        }
        let mut decoded = 0;
        for entry in msg.entries.iter_mut().filter(|e| is_encoded(e)) {
            entry.data = self.decode_entry(&entry.data)?;
            decoded += 1;
        }
        self.metrics.decoded_entries.add(decoded);
        Ok(true)
    }

    fn link(&mut self, peer: u64) -> &mut Link {
        let active = self.active;
        self.links.entry(peer).or_insert_with(|| {
            let p = peer.to_string();
            let label = Some(("peer", p.as_str()));
            let metrics = LinkMetrics {
                bytes_before: labeled_counter(
                    "chorus_unicache_bytes_before_total",
                    "Entry payload bytes in appends to a peer, before encoding",
                    label,
                ),
                bytes_after: labeled_counter(
                    "chorus_unicache_bytes_after_total",
                    "Entry payload bytes in appends to a peer, as sent",
                    label,
                ),
                encoding: labeled_gauge(
                    "chorus_unicache_encoding",
                    "Whether appends to a peer are encoded (auto-tune decision)",
                    label,
                ),
            };
            // While the cache runs, a link starts encoding: on a slow link that pays from the
            // first append, and on a fast one the first decision turns it off.
            metrics.encoding.set(i64::from(active));
            Link {
                follower_version: 0,
                cooldown_until: None,
                encoding: active,
                decided_at: Instant::now(),
                appends: 0,
                rtt_ms: None,
                window_before: 0,
                window_after: 0,
                metrics,
            }
        })
    }
}

impl Link {
    /// After a resume (encode, and measure afresh) or a pause (nothing to encode with).
    fn restart(&mut self, now: Instant, resume: bool) {
        self.encoding = resume;
        self.metrics.encoding.set(i64::from(resume));
        self.decided_at = now;
        self.window_before = 0;
        self.window_after = 0;
        self.follower_version = 0;
    }

    /// Auto-tune: revisit the decision once per interval, with hysteresis.
    fn maybe_decide(&mut self, peer: u64, now: Instant, autotune: bool) {
        if !autotune || now.duration_since(self.decided_at) < DECISION_INTERVAL || self.window_before == 0 {
            return;
        }
        let savings = 1.0 - self.window_after as f64 / self.window_before as f64;
        let rtt_ms = self.rtt_ms.unwrap_or(0.0);
        let encode = if self.encoding {
            savings >= OFF_SAVINGS && rtt_ms >= OFF_RTT_MS
        } else {
            savings >= ON_SAVINGS && rtt_ms >= ON_RTT_MS
        };
        if encode != self.encoding {
            tracing::info!(
                peer,
                encoding = encode,
                savings_percent = (savings * 100.0).round(),
                rtt_ms,
                "UniCache auto-tune switched encoding"
            );
            self.encoding = encode;
            self.metrics.encoding.set(i64::from(encode));
        }
        self.decided_at = now;
        self.window_before = 0;
        self.window_after = 0;
    }
}

impl EntryCodec for UniCacheCodec {
    fn preparer(&self) -> Option<Preparer> {
        let preprocessor = self.preprocessor.clone();
        let active = self.active_flag.clone();
        Some(Arc::new(move |command: &Bytes| {
            if !active.load(Ordering::Relaxed) {
                return Box::new(()) as Prepared;
            }
            let mut parts = Vec::new();
            preprocessor.preprocess(command, &mut parts);
            Box::new(parts) as Prepared
        }))
    }

    fn take_proposal(&mut self) -> Option<Bytes> {
        let now = Instant::now();
        let control = &mut self.control;
        if control.pending_until.is_some_and(|until| now < until) {
            return None;
        }
        let propose = |control: &mut Control, resume: bool| {
            control.pending_until = Some(now + CONTROL_PENDING);
            Some(control_entry(resume))
        };
        if !self.settings.autotune {
            return if self.active { None } else { propose(control, true) };
        }
        if !self.active {
            let could_pay = self
                .links
                .values()
                .any(|l| l.rtt_ms.is_some_and(|rtt| rtt >= ON_RTT_MS));
            return (could_pay && now >= control.resume_not_before)
                .then(|| propose(control, true))
                .flatten();
        }
        let all_off = !self.links.is_empty() && self.links.values().all(|l| !l.encoding);
        if !all_off {
            control.all_off_since = None;
            control.resume_backoff = FIRST_RESUME_BACKOFF;
            return None;
        }
        let since = *control.all_off_since.get_or_insert(now);
        if now.duration_since(since) < PAUSE_AFTER {
            return None;
        }
        control.resume_not_before = now + control.resume_backoff;
        control.resume_backoff = (control.resume_backoff * 2).min(MAX_RESUME_BACKOFF);
        propose(control, false)
    }

    fn proposed(&mut self, origin: Origin, request_id: u64, prepared: Prepared) {
        let Ok(parts) = prepared.downcast::<Vec<Part>>() else {
            return;
        };
        self.own_origin = Some(origin);
        self.stash.insert(request_id, *parts);
        self.stash_order.push_back(request_id);
        // Commands that never commit (dropped by a leader change) age out.
        while self.stash_order.len() > MAX_STASHED {
            if let Some(old) = self.stash_order.pop_front() {
                self.stash.remove(&old);
            }
        }
    }

    fn encode(&mut self, msg: &mut Message, log: &dyn LogView, commit: u64) {
        if msg.entries.is_empty() {
            return;
        }
        // Catch up with the commit index first: the follower may learn it from this very
        // message and apply up to it, and its cache must not get ahead of ours.
        if commit > self.version {
            if let Some(entries) = log.entries(self.version + 1, commit + 1) {
                for entry in &entries {
                    self.absorb(entry);
                }
            }
        }
        let now = Instant::now();
        let (version, peer, active) = (self.version, msg.to, self.active);
        let autotune = self.settings.autotune;
        let link = self.link(peer);
        link.appends += 1;
        let raw_bytes: u64 = msg.entries.iter().map(|e| e.data.len() as u64).sum();
        let safe = active
            && version <= msg.index
            && version >= link.follower_version
            && link.cooldown_until.is_none_or(|until| now >= until);
        let measure = active && (link.encoding || link.appends.is_multiple_of(SAMPLE_EVERY));
        let send_encoded = safe && link.encoding;
        if !safe || !measure {
            link.metrics.bytes_before.add(raw_bytes);
            link.metrics.bytes_after.add(raw_bytes);
            return;
        }
        let mut after = 0u64;
        for i in 0..msg.entries.len() {
            let entry = &msg.entries[i];
            if !is_batch(entry) {
                after += entry.data.len() as u64;
                continue;
            }
            let (index, data) = (entry.index, entry.data.clone());
            match self.encode_entry(index, &data) {
                Some(encoded) => {
                    after += encoded.len() as u64;
                    if send_encoded {
                        msg.entries[i].data = encoded;
                    }
                }
                None => after += data.len() as u64,
            }
        }
        let link = self.links.get_mut(&peer).expect("link created above");
        link.window_before += raw_bytes;
        link.window_after += after;
        link.metrics.bytes_before.add(raw_bytes);
        link.metrics
            .bytes_after
            .add(if send_encoded { after } else { raw_bytes });
        link.maybe_decide(peer, now, autotune);
    }

    fn decode(&mut self, msg: &mut Message, log: &dyn LogView) -> Result<(), CodecError> {
        let failure = match self.try_decode(msg, log) {
            Ok(_) => return Ok(()),
            Err(f) => f,
        };
        let counter = match failure.kind {
            FEEDBACK_AHEAD => &self.metrics.rejected_ahead,
            FEEDBACK_BEHIND => &self.metrics.rejected_behind,
            FEEDBACK_SETTINGS => &self.metrics.rejected_settings,
            _ => &self.metrics.rejected_corrupt,
        };
        counter.inc();
        if failure.kind == FEEDBACK_CORRUPT || failure.kind == FEEDBACK_SETTINGS {
            tracing::error!(from = msg.from, reason = %failure.reason, "UniCache entry rejected; asking for raw entries");
        }
        // A rejection like raft's own, so the leader resends from our match point.
        let hint = msg.index.min(log.last_index());
        let mut reply = Message::default();
        reply.set_msg_type(MessageType::MsgAppendResponse);
        reply.to = msg.from;
        reply.from = msg.to;
        reply.term = msg.term;
        reply.index = msg.index;
        reply.reject = true;
        reply.reject_hint = hint;
        reply.log_term = log.term(hint).unwrap_or(0);
        let mut context = vec![MAGIC, FEEDBACK, failure.kind];
        varint::put(&mut context, self.version);
        reply.context = Bytes::from(context);
        Err(CodecError {
            from: msg.from,
            reason: failure.reason,
            reply: Some(Box::new(reply)),
        })
    }

    fn observe_response(&mut self, msg: &Message) {
        let context = &msg.context;
        if !msg.reject || context.len() < 3 || context[0] != MAGIC || context[1] != FEEDBACK {
            return;
        }
        let Some(link) = self.links.get_mut(&msg.from) else {
            return;
        };
        let Ok(version) = Reader::new(&context[3..]).varint() else {
            return;
        };
        let now = Instant::now();
        match context[2] {
            FEEDBACK_AHEAD => link.follower_version = link.follower_version.max(version),
            FEEDBACK_BEHIND => link.cooldown_until = Some(now + BEHIND_COOLDOWN),
            _ => {
                tracing::error!(
                    peer = msg.from,
                    "follower rejected UniCache entries; sending raw for 60 s"
                );
                link.cooldown_until = Some(now + CORRUPT_COOLDOWN);
            }
        }
    }

    fn observe_link_rtt(&mut self, peer: u64, rtt_ms: f64) {
        self.link(peer).rtt_ms = Some(rtt_ms);
    }

    fn applied(&mut self, entry: &Entry) {
        if entry.index > self.version {
            self.absorb(entry);
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.cache.bytes() + 1024);
        varint::put(&mut out, self.epoch);
        varint::put(&mut out, self.version);
        out.push(u8::from(self.active));
        if self.active {
            self.cache.serialize(&mut out);
        }
        out
    }

    fn restore(&mut self, data: &[u8], snapshot_index: u64) -> Result<(), String> {
        let (epoch, version, cache) = if data.is_empty() {
            // A snapshot from before UniCache was enabled: paused after it, until the leader
            // resumes it.
            (0, snapshot_index, None)
        } else {
            let bad = |e: chorus_unicache::Error| {
                format!("UniCache snapshot: {e} (UniCache settings must be the same on every node and across restarts)")
            };
            let mut reader = Reader::new(data);
            let epoch = reader.varint().map_err(bad)?;
            let version = reader.varint().map_err(bad)?;
            let cache = match reader.u8().map_err(bad)? {
                0 => None,
                1 => Some(ItemCache::deserialize(self.settings.cache, &mut reader).map_err(bad)?),
                _ => return Err("UniCache snapshot: bad active flag".into()),
            };
            reader.finish().map_err(bad)?;
            if version < epoch || version < snapshot_index {
                return Err(format!(
                    "UniCache snapshot: cache version {version} is behind its snapshot ({snapshot_index}) or epoch ({epoch})"
                ));
            }
            (epoch, version, cache)
        };
        if version <= self.version {
            return Ok(());
        }
        self.active = cache.is_some();
        self.active_flag.store(self.active, Ordering::Relaxed);
        self.metrics.active.set(i64::from(self.active));
        self.cache = cache.unwrap_or_else(|| ItemCache::new(self.settings.cache));
        self.epoch = epoch;
        self.version = version;
        self.fingerprint = fold_fingerprint(self.settings_fingerprint, epoch);
        self.memo.clear();
        self.metrics.version.set(version as i64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use chorus_unicache::{OpaquePreprocessor, Policy};

    use super::*;

    struct EmptyLog;

    impl LogView for EmptyLog {
        fn term(&self, index: u64) -> Option<u64> {
            (index == 0).then_some(0)
        }

        fn last_index(&self) -> u64 {
            0
        }

        fn entries(&self, low: u64, high: u64) -> Option<Vec<Entry>> {
            (low >= high).then(Vec::new)
        }
    }

    #[test]
    fn malformed_encoded_entries_are_rejected_never_applied_and_never_panic() {
        let mut codec = UniCacheCodec::new(
            UniCacheSettings {
                cache: CacheConfig {
                    policy: Policy::Lru,
                    max_items: 16,
                    max_bytes: 1024,
                },
                autotune: false,
            },
            Arc::new(OpaquePreprocessor),
        );
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..5_000u64 {
            let len = (round % 48) as usize;
            let mut data = vec![MAGIC, FORMAT];
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                data.push(if state.is_multiple_of(4) {
                    (state >> 16) as u8
                } else {
                    (state % 3) as u8
                });
            }
            let mut entry = Entry {
                index: 1,
                term: 1,
                ..Default::default()
            };
            entry.set_entry_type(EntryType::EntryNormal);
            entry.data = Bytes::from(data);
            let mut msg = Message::default();
            msg.set_msg_type(MessageType::MsgAppend);
            msg.from = 1;
            msg.to = 2;
            msg.entries = vec![entry].into();
            let outcome = codec.decode(&mut msg, &EmptyLog);
            let error = outcome.expect_err("garbage must not decode");
            let reply = error.reply.expect("the leader is told");
            assert!(reply.reject);
            assert_eq!(msg.entries[0].data[0], MAGIC, "a rejected message is left as it came");
        }
    }
}
