//! Durable raft storage: a segmented write-ahead log plus snapshot files.
//!
//! Layout of a data directory:
//! - `wal-<seq>.log`: segments. Each starts with a magic header and the full raft state (truncation
//!   point, hard state, conf state), then records `[len u32][crc32 u32][kind u8][payload]`, then
//!   zeros up to the end of the file: a segment is zero-filled to its full size before it is
//!   used, so appending a record and fdatasync-ing it writes data blocks only — the file's size
//!   and extent map never change, and the fsync that every acknowledged write waits for needs no
//!   inode update (about a third faster here, and cheaper in CPU). A length field of zero where
//!   a record should start, with nothing but zeros after it, is the end of the records.
//!   A new segment starts when the active one passes `segment_size_bytes`; segments whose entries
//!   are all covered by a snapshot are deleted on compaction, by a thread of their own
//!   (`compactor`).
//!   Preallocated segments are written with direct I/O and `O_DSYNC` where the file system allows
//!   it: whole blocks go from an aligned buffer to the device and each write returns durable, one
//!   system call instead of a page-cache copy, a write-back and an fdatasync (about a third less
//!   CPU per durable append here).
//!   Appends are written by a thread of their own (`wal_writer`), in the order they were
//!   queued: `start_persist` returns at once with a sequence number that `durable_seq` reaches
//!   once the write is on disk; `persist` waits for it.
//! - `wal-spare.prealloc`: the next segment, zero-filled by a background thread while the
//!   active one fills (`wal-spare.tmp` while it is being written), renamed into place on a roll.
//!   A node's first segment is a plain file, rolled as soon as the spare is ready.
//! - `snapshot-<index>.snap`: the latest state machine snapshot, checksummed, written to a
//!   temporary file, fsynced and renamed into place.
//!
//! Recovery replays the segments in order. A record that fails its length or checksum in the last
//! segment is a torn tail: its bytes are zeroed, durably. The same failure anywhere else is
//! corruption and opening fails loudly.
//!
//! Everything is also held in memory (entries between the truncation point and the tail), which
//! is what `raft::Storage` reads; compaction keeps that bounded.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protobuf::{Message as _, ProtobufEnum};
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState};

use crate::compactor::Compactor;
use crate::error::{io_error, DecodeError, StorageError};
use crate::membership::{decode_members, encode_members, Addresses, Members};
use crate::wal_writer::WalWriter;
use crate::wire::{put_blob, put_u32, put_u64, Reader};

const WAL_MAGIC: &[u8; 8] = b"CHWAL002";
/// Segments of builds before membership records: read, never written.
const WAL_MAGIC_V1: &[u8; 8] = b"CHWAL001";
const SNAPSHOT_MAGIC: &[u8; 8] = b"CHSNP001";
const RECORD_HEADER_BYTES: usize = 8;
/// No single record may exceed this; a larger length field is treated as garbage.
const MAX_RECORD_BYTES: usize = 1 << 30;

const KIND_ENTRIES: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
const KIND_CONF_STATE: u8 = 3;
const KIND_TRUNCATED: u8 = 4;
/// The configuration with its index and the members' addresses (`membership`); since CHWAL002.
const KIND_MEMBERS: u8 = 5;

const SPARE_NAME: &str = "wal-spare.prealloc";
const SPARE_TMP_NAME: &str = "wal-spare.tmp";
/// Zeros are written in chunks of this size when a spare segment is prepared.
const ZERO_CHUNK_BYTES: usize = 1024 * 1024;
/// A snapshot file is written and synced in chunks of this size.
const SNAPSHOT_CHUNK_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone)]
pub struct StorageOptions {
    pub segment_size_bytes: u64,
    /// Zero-fill segments ahead of use on a background thread (see the module comment). Off, every
    /// segment is a plain file that grows as records are appended.
    pub preallocate: bool,
    /// Write preallocated segments with `O_DIRECT | O_DSYNC` (see the module comment); buffered
    /// writes and fdatasync where the file system refuses it, or when off.
    pub direct_io: bool,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            segment_size_bytes: 64 * 1024 * 1024,
            preallocate: true,
            direct_io: true,
        }
    }
}

/// What recovery found, for logs and metrics.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    pub fresh: bool,
    pub segments: usize,
    pub records: u64,
    pub torn_tail_bytes: u64,
    pub snapshot_index: u64,
}

struct Segment {
    seq: u64,
    path: PathBuf,
    /// Highest entry index written into this segment (0 if none).
    max_entry_index: u64,
}

pub struct DiskStorage {
    dir: PathBuf,
    options: StorageOptions,
    hard_state: HardState,
    members: Members,
    /// Index and term of the entry just before `entries[0]` (the compaction point).
    truncated_index: u64,
    truncated_term: u64,
    entries: VecDeque<Entry>,
    snapshot: Snapshot,
    segments: Vec<Segment>,
    /// The last segment, shared with the writer thread's queued writes.
    active: Arc<File>,
    active_path: Arc<Path>,
    /// Where the active segment's records end (its file may be longer: zeros).
    active_len: u64,
    /// Whether the active segment was zero-filled to its full size before use.
    active_preallocated: bool,
    /// Whether the active segment is open with `O_DIRECT | O_DSYNC`: every write is durable
    /// when it returns.
    active_direct: bool,
    /// The active segment's bytes from the start of the block holding `active_len` up to it.
    tail_block: Vec<u8>,
    /// Writes the records in order, off the caller's thread (see `start_persist`).
    writer: WalWriter,
    /// Deletes covered segments off the caller's thread.
    compactor: Compactor,
    /// Covered segments, by the sequence number of the write of the truncation record that
    /// covers them: handed to the compactor once that write is durable.
    covered: VecDeque<(u64, Vec<PathBuf>)>,
    spare: Spare,
    /// Records encoded but not yet written to the active segment.
    pending: Vec<u8>,
    /// The commit index moved since a hard state was last encoded. It is written with the next
    /// records, not on its own: after a crash it is recomputed from a quorum anyway.
    commit_unwritten: bool,
}

/// The zero-filled segment that the next roll renames into place.
enum Spare {
    None,
    Preparing(JoinHandle<std::io::Result<()>>),
    Ready,
    /// Preparing it failed (a full disk); tried again from this time on.
    Failed {
        retry_at: Instant,
    },
}

/// How long after a failed preallocation the next one starts.
const SPARE_RETRY: Duration = Duration::from_secs(1);

/// Room kept in the active segment beyond what a write needs, for what raft appends on its own
/// (hard states, a new leader's empty entry, configuration changes) while the disk is full.
const RESERVED_ROOM_BYTES: u64 = 64 * 1024;

/// An append's failure: `NoSpace` when the file system is full, which the caller may retry.
pub(crate) fn append_error(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |source| match source.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => StorageError::NoSpace {
            path: path.to_path_buf(),
        },
        _ => io_error(path)(source),
    }
}

/// Writes `wal-spare.tmp` full of zeros, makes it durable, and renames it to `wal-spare.prealloc`.
fn prepare_spare(dir: &Path, size_bytes: u64, direct_io: bool) -> std::io::Result<()> {
    let tmp = dir.join(SPARE_TMP_NAME);
    let (file, direct) = open_for_writing(&tmp, true, direct_io)?;
    let mut zeros = BlockBuf::default();
    let zeros = zeros.aligned(ZERO_CHUNK_BYTES);
    zeros.fill(0);
    let mut written = 0u64;
    while written < size_bytes {
        let n = (size_bytes - written).min(ZERO_CHUNK_BYTES as u64) as usize;
        file.write_all_at(&zeros[..n], written)?;
        // Flush as we go: tens of MiB written back at once would queue ahead of the active
        // segment's fsyncs and stall every write for as long.
        if !direct {
            file.sync_data()?;
        }
        written += n as u64;
    }
    file.sync_all()?;
    fs::rename(&tmp, dir.join(SPARE_NAME))
}

/// Opens `path` for writing (creating it if `create`), with `O_DIRECT | O_DSYNC` if `direct_io`
/// and the file system accepts it. Returns whether it did.
fn open_for_writing(path: &Path, create: bool, direct_io: bool) -> std::io::Result<(File, bool)> {
    let mut options = OpenOptions::new();
    options.write(true).create(create);
    if direct_io {
        match options.clone().custom_flags(libc::O_DIRECT | libc::O_DSYNC).open(path) {
            Ok(file) => return Ok((file, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(path = %path.display(), "the file system refuses direct I/O; writing through the page cache");
            }
            Err(e) => return Err(e),
        }
    }
    Ok((options.open(path)?, false))
}

/// Direct I/O writes whole blocks, so segments must be a whole number of them.
fn direct_io_allowed(options: &StorageOptions) -> bool {
    options.direct_io && options.segment_size_bytes.is_multiple_of(WRITE_BLOCK_BYTES)
}

/// A reusable buffer whose slices start on a `WRITE_BLOCK_BYTES` boundary in memory, as direct
/// I/O requires (a `Vec<u8>` is only byte-aligned, so it is over-allocated and sliced).
#[derive(Default)]
pub(crate) struct BlockBuf {
    bytes: Vec<u8>,
}

impl BlockBuf {
    /// An aligned slice of `len` bytes, holding whatever an earlier use left there.
    pub(crate) fn aligned(&mut self, len: usize) -> &mut [u8] {
        let block = WRITE_BLOCK_BYTES as usize;
        if self.bytes.len() < len + block {
            self.bytes.resize(len + block, 0);
        }
        let start = self.bytes.as_ptr().align_offset(block);
        &mut self.bytes[start..start + len]
    }
}

/// The unit of segment writes: a file-system block (and page).
const WRITE_BLOCK_BYTES: u64 = 4096;

/// Where the block holding byte `offset` starts.
fn block_start(offset: u64) -> u64 {
    offset - offset % WRITE_BLOCK_BYTES
}

/// Whether `buf` holds nothing but zeros from `offset` on: the unused end of a segment.
fn zero_tail(buf: &[u8], offset: usize) -> bool {
    buf[offset..].iter().all(|b| *b == 0)
}

/// A roll renames the spare into place (or creates a plain file) and then writes the segment's
/// header durably before any record goes in, so a crash in between leaves a last segment holding
/// nothing but zeros. It never held anything: it is removed (durably), and the segment before
/// it is the active one again. Returns whether `seq` was such a segment.
fn remove_unstarted_segment(dir: &Path, seq: u64) -> Result<bool, StorageError> {
    let path = segment_path(dir, seq);
    let mut buf = Vec::new();
    File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut buf))
        .map_err(io_error(&path))?;
    if !zero_tail(&buf, 0) {
        return Ok(false);
    }
    tracing::warn!(path = %path.display(), "removing a raft log segment that a crash left before its header was written");
    fs::remove_file(&path).map_err(io_error(&path))?;
    sync_dir(dir)?;
    Ok(true)
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("wal-{seq:020}.log"))
}

fn snapshot_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("snapshot-{index:020}.snap"))
}

fn parse_numbered(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?.strip_suffix(suffix)?.parse().ok()
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error(dir))
}

/// Creates `dir` and its missing parents, each new entry synced into its parent: files synced
/// into a directory whose own entry a power cut can take away are not durable.
pub fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    create_dir_durably(parent)?;
    match fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    File::open(parent)?.sync_all()
}

fn encode_record(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[kind]);
    hasher.update(payload);
    let len = u32::try_from(payload.len() + 1).expect("record larger than 4 GiB");
    put_u32(out, len);
    put_u32(out, hasher.finalize());
    out.push(kind);
    out.extend_from_slice(payload);
}

fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.iter().map(|e| e.data.len() + 32).sum());
    put_u32(&mut out, entries.len() as u32);
    for e in entries {
        put_u64(&mut out, e.index);
        put_u64(&mut out, e.term);
        out.push(e.get_entry_type().value() as u8);
        put_blob(&mut out, &e.data);
        put_blob(&mut out, &e.context);
    }
    out
}

fn decode_entries(payload: &[u8]) -> Result<Vec<Entry>, DecodeError> {
    let mut r = Reader::new(payload);
    let count = r.u32()? as usize;
    let mut entries = Vec::with_capacity(count.min(r.remaining() / 25 + 1));
    for _ in 0..count {
        let mut e = Entry {
            index: r.u64()?,
            term: r.u64()?,
            ..Default::default()
        };
        let kind = EntryType::from_i32(i32::from(r.u8()?)).ok_or(DecodeError::Invalid("entry type"))?;
        e.set_entry_type(kind);
        e.data = Bytes::copy_from_slice(r.blob()?);
        e.context = Bytes::copy_from_slice(r.blob()?);
        entries.push(e);
    }
    r.finish()?;
    for pair in entries.windows(2) {
        if pair[1].index != pair[0].index + 1 {
            return Err(DecodeError::Invalid("entry indices not contiguous"));
        }
    }
    Ok(entries)
}

fn encode_hard_state(hs: &HardState) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    put_u64(&mut out, hs.term);
    put_u64(&mut out, hs.vote);
    put_u64(&mut out, hs.commit);
    out
}

fn decode_hard_state(payload: &[u8]) -> Result<HardState, DecodeError> {
    let mut r = Reader::new(payload);
    let hs = HardState {
        term: r.u64()?,
        vote: r.u64()?,
        commit: r.u64()?,
        ..Default::default()
    };
    r.finish()?;
    Ok(hs)
}

fn encode_conf_state(cs: &ConfState) -> Vec<u8> {
    cs.write_to_bytes().expect("encoding a ConfState cannot fail")
}

fn decode_conf_state(payload: &[u8]) -> Result<ConfState, DecodeError> {
    ConfState::parse_from_bytes(payload).map_err(|_| DecodeError::Invalid("conf state"))
}

fn encode_truncated(index: u64, term: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    put_u64(&mut out, index);
    put_u64(&mut out, term);
    out
}

/// One record read back from a segment.
enum Record {
    Entries(Vec<Entry>),
    HardState(HardState),
    Members(Members),
    Truncated { index: u64, term: u64 },
}

/// Reads the record at the front of `buf`. `Ok(None)` means `buf` ends inside the record.
fn read_record(buf: &[u8]) -> Result<Option<(Record, usize)>, DecodeError> {
    if buf.len() < RECORD_HEADER_BYTES {
        return Ok(None);
    }
    let mut header = Reader::new(&buf[..RECORD_HEADER_BYTES]);
    let len = header.u32()? as usize;
    let stored = header.u32()?;
    if len == 0 || len > MAX_RECORD_BYTES {
        return Err(DecodeError::TooLarge {
            size: len,
            limit: MAX_RECORD_BYTES,
        });
    }
    let end = RECORD_HEADER_BYTES + len;
    if buf.len() < end {
        return Ok(None);
    }
    let body = &buf[RECORD_HEADER_BYTES..end];
    let computed = crc32fast::hash(body);
    if computed != stored {
        return Err(DecodeError::Checksum { stored, computed });
    }
    let payload = &body[1..];
    let record = match body[0] {
        KIND_ENTRIES => Record::Entries(decode_entries(payload)?),
        KIND_HARD_STATE => Record::HardState(decode_hard_state(payload)?),
        KIND_CONF_STATE => Record::Members(Members {
            conf_state: decode_conf_state(payload)?,
            ..Members::default()
        }),
        KIND_MEMBERS => Record::Members(decode_members(payload)?),
        KIND_TRUNCATED => {
            let mut r = Reader::new(payload);
            let (index, term) = (r.u64()?, r.u64()?);
            r.finish()?;
            Record::Truncated { index, term }
        }
        _ => return Err(DecodeError::Invalid("record kind")),
    };
    Ok(Some((record, end)))
}

/// Whether a complete, checksummed record starts somewhere after the bad one at `bad`. A torn
/// write only damages the end of the file; anything valid after the damage means the damage is
/// corruption, which recovery must not paper over by truncating (that would drop acknowledged
/// entries and votes). The record boundary after an intact length field is tried first; failing
/// that, every later position is.
fn valid_record_follows(buf: &[u8], bad: usize) -> bool {
    let complete_at = |at: usize| {
        buf.get(at..)
            .is_some_and(|rest| matches!(read_record(rest), Ok(Some(_))))
    };
    if let Some(header) = buf.get(bad..bad + RECORD_HEADER_BYTES) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if complete_at(bad + RECORD_HEADER_BYTES + len) {
            return true;
        }
    }
    (bad + 1..buf.len().saturating_sub(RECORD_HEADER_BYTES)).any(|at| {
        // Cheap filter before the checksum: a known record kind behind a length that fits.
        let kind = buf[at + RECORD_HEADER_BYTES];
        let len = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        (KIND_ENTRIES..=KIND_TRUNCATED).contains(&kind)
            && len > 0
            && at + RECORD_HEADER_BYTES + len <= buf.len()
            && complete_at(at)
    })
}

/// Writes a snapshot durably: temporary file, fsync, rename, directory fsync.
/// Runs on a background thread for locally created snapshots, so it takes no `&self`.
pub fn write_snapshot_file(dir: &Path, snapshot: &Snapshot) -> Result<PathBuf, StorageError> {
    let meta = snapshot.get_metadata();
    let mut header = Vec::with_capacity(64);
    header.extend_from_slice(SNAPSHOT_MAGIC);
    put_u64(&mut header, meta.index);
    put_u64(&mut header, meta.term);
    put_blob(&mut header, &encode_conf_state(meta.get_conf_state()));
    put_u64(&mut header, snapshot.data.len() as u64);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header);
    hasher.update(&snapshot.data);
    let crc = hasher.finalize();

    let path = snapshot_path(dir, meta.index);
    let tmp = path.with_extension("snap.tmp");
    let mut file = File::create(&tmp).map_err(io_error(&tmp))?;
    let written = file.write_all(&header).and_then(|_| {
        // Flushed a chunk at a time, like a spare segment: megabytes written back at once would
        // queue ahead of the log appends that every write waits for.
        for chunk in snapshot.data.chunks(SNAPSHOT_CHUNK_BYTES) {
            file.write_all(chunk)?;
            file.sync_data()?;
        }
        file.write_all(&crc.to_le_bytes())?;
        file.sync_all()
    });
    written.map_err(io_error(&tmp))?;
    fs::rename(&tmp, &path).map_err(io_error(&path))?;
    sync_dir(dir)?;
    Ok(path)
}

fn read_snapshot_file(path: &Path) -> Result<Snapshot, StorageError> {
    let buf = fs::read(path).map_err(io_error(path))?;
    decode_snapshot(&buf).map_err(|reason| StorageError::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        reason,
    })
}

/// Checks a file's 8-byte magic: five letters naming the format, three digits its version. A
/// file of the format in another version is refused as such, not as garbage.
/// A raft log segment's magic, of this version or the one before it.
fn check_wal_magic(buf: &[u8]) -> Result<(), DecodeError> {
    if buf.get(..WAL_MAGIC_V1.len()) == Some(WAL_MAGIC_V1.as_slice()) {
        return Ok(());
    }
    check_magic(buf, WAL_MAGIC, "raft log segment")
}

fn check_magic(buf: &[u8], magic: &[u8; 8], what: &'static str) -> Result<(), DecodeError> {
    let Some(found) = buf.get(..8) else {
        return Err(DecodeError::BadMagic);
    };
    if found == magic {
        return Ok(());
    }
    let version = |m: &[u8]| std::str::from_utf8(&m[5..]).ok().and_then(|v| v.parse::<u64>().ok());
    match (found[..5] == magic[..5], version(found), version(magic)) {
        (true, Some(found), Some(supported)) => Err(DecodeError::UnsupportedVersion { what, found, supported }),
        _ => Err(DecodeError::BadMagic),
    }
}

/// Decodes a snapshot file's bytes, checksum first.
pub fn decode_snapshot(buf: &[u8]) -> Result<Snapshot, DecodeError> {
    check_magic(buf, SNAPSHOT_MAGIC, "raft snapshot file")?;
    if buf.len() < SNAPSHOT_MAGIC.len() + 4 {
        return Err(DecodeError::BadMagic);
    }
    let (body, crc) = buf.split_at(buf.len() - 4);
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    let mut r = Reader::new(&body[8..]);
    let mut meta = SnapshotMetadata {
        index: r.u64()?,
        term: r.u64()?,
        ..Default::default()
    };
    meta.set_conf_state(decode_conf_state(r.blob()?)?);
    let len = r.u64()? as usize;
    let data = Bytes::copy_from_slice(r.bytes(len)?);
    r.finish()?;
    let mut snapshot = Snapshot::default();
    snapshot.set_metadata(meta);
    snapshot.data = data;
    Ok(snapshot)
}

/// Decodes the records of a segment's bytes the way recovery reads them, stopping at the first
/// incomplete or bad record; returns how many decoded. Recovery's reader, for fuzzing.
pub fn decode_segment(buf: &[u8]) -> Result<u64, DecodeError> {
    check_wal_magic(buf)?;
    let mut offset = WAL_MAGIC.len();
    let mut records = 0;
    while !zero_tail(buf, offset) {
        let Some((_, used)) = read_record(&buf[offset..])? else {
            break;
        };
        offset += used;
        records += 1;
    }
    Ok(records)
}

impl DiskStorage {
    /// Opens (or creates, with `initial_voters` as the membership) the storage in `dir`.
    pub fn open(
        dir: &Path,
        initial_voters: &[u64],
        options: StorageOptions,
    ) -> Result<(DiskStorage, RecoveryReport), StorageError> {
        create_dir_durably(dir).map_err(io_error(dir))?;
        let mut segment_seqs = Vec::new();
        let mut snapshot_indices = Vec::new();
        for dirent in fs::read_dir(dir).map_err(io_error(dir))? {
            let name = dirent.map_err(io_error(dir))?.file_name();
            let name = name.to_string_lossy();
            if let Some(seq) = parse_numbered(&name, "wal-", ".log") {
                segment_seqs.push(seq);
            } else if let Some(index) = parse_numbered(&name, "snapshot-", ".snap") {
                snapshot_indices.push(index);
            } else if name.ends_with(".snap.tmp") || name == SPARE_TMP_NAME {
                // A snapshot or spare segment that never reached its rename; never relied upon.
                let _ = fs::remove_file(dir.join(&*name));
            }
        }
        segment_seqs.sort_unstable();
        snapshot_indices.sort_unstable();
        if let Some(&last) = segment_seqs.last() {
            if remove_unstarted_segment(dir, last)? {
                segment_seqs.pop();
            }
        }

        let mut report = RecoveryReport::default();
        if segment_seqs.is_empty() {
            if !snapshot_indices.is_empty() {
                return Err(StorageError::Inconsistent(format!(
                    "{} holds snapshots but no log segments",
                    dir.display()
                )));
            }
            report.fresh = true;
            let members = Members {
                conf_state: ConfState {
                    voters: initial_voters.to_vec(),
                    ..Default::default()
                },
                ..Members::default()
            };
            let storage = Self::create_fresh(dir, options, members)?;
            return Ok((storage, report));
        }

        let snapshot = match snapshot_indices.last() {
            Some(index) => read_snapshot_file(&snapshot_path(dir, *index))?,
            None => Snapshot::default(),
        };
        report.snapshot_index = snapshot.get_metadata().index;

        let mut hard_state = HardState::default();
        let mut members = Members::default();
        let (mut truncated_index, mut truncated_term) = (0u64, 0u64);
        let mut entries: VecDeque<Entry> = VecDeque::new();
        let mut segments = Vec::new();
        let last_seq = *segment_seqs.last().expect("non-empty");
        let mut active_len = 0;
        let mut active_file_len = 0;
        let mut active_tail = Vec::new();
        let mut gap_seen = false;
        let mut unconfirmed_truncation: Option<u64> = None;

        for seq in &segment_seqs {
            let path = segment_path(dir, *seq);
            let mut buf = Vec::new();
            File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut buf))
                .map_err(io_error(&path))?;
            let is_last = *seq == last_seq;
            let corrupt = |offset: usize, reason| StorageError::Corrupt {
                path: path.clone(),
                offset: offset as u64,
                reason,
            };
            check_wal_magic(&buf).map_err(|e| corrupt(0, e))?;
            let mut offset = WAL_MAGIC.len();
            let mut max_entry_index = 0;
            loop {
                if zero_tail(&buf, offset) {
                    break;
                }
                let outcome = read_record(&buf[offset..]);
                let (record, used) = match outcome {
                    Ok(Some(found)) => found,
                    Ok(None) | Err(_) if is_last && !valid_record_follows(&buf, offset) => {
                        // Zero the damaged bytes in place: the file keeps its size (and, if it
                        // was preallocated, its allocation) and the next record overwrites them.
                        let damaged_end = buf
                            .iter()
                            .rposition(|b| *b != 0)
                            .map_or(offset, |i| (i + 1).max(offset));
                        let torn = damaged_end - offset;
                        tracing::warn!(
                            path = %path.display(), offset, torn_bytes = torn,
                            "zeroing the torn tail of the raft log ({outcome_kind})",
                            outcome_kind = if outcome.is_err() { "bad record" } else { "incomplete record" },
                        );
                        let file = OpenOptions::new().write(true).open(&path).map_err(io_error(&path))?;
                        file.write_all_at(&vec![0u8; torn], offset as u64)
                            .and_then(|_| file.sync_all())
                            .map_err(io_error(&path))?;
                        report.torn_tail_bytes = torn as u64;
                        buf.truncate(offset);
                        break;
                    }
                    Ok(None) => return Err(corrupt(offset, DecodeError::Invalid("record cut short"))),
                    Err(reason) => return Err(corrupt(offset, reason)),
                };
                report.records += 1;
                match record {
                    Record::Entries(new) => {
                        let first = new[0].index;
                        let last_index = entries.back().map_or(truncated_index, |e| e.index);
                        if first > last_index + 1 && entries.is_empty() && !gap_seen {
                            // The segments before this one were deleted by compaction; the
                            // truncation record that allowed it must still come later.
                            gap_seen = true;
                            unconfirmed_truncation = Some(first - 1);
                            truncated_index = first - 1;
                            truncated_term = 0;
                        } else if first > last_index + 1 {
                            return Err(StorageError::Inconsistent(format!(
                                "{}: entries start at {first} but the log ends at {last_index}",
                                path.display()
                            )));
                        }
                        while entries.back().is_some_and(|e| e.index >= first) {
                            entries.pop_back();
                        }
                        max_entry_index = max_entry_index.max(new.last().expect("non-empty").index);
                        entries.extend(new.into_iter().filter(|e| e.index > truncated_index));
                    }
                    Record::HardState(hs) => hard_state = hs,
                    Record::Members(recorded) => members = recorded,
                    Record::Truncated { index, term } => {
                        if unconfirmed_truncation.is_some_and(|gap| index >= gap) {
                            unconfirmed_truncation = None;
                        }
                        if index >= truncated_index {
                            truncated_index = index;
                            truncated_term = term;
                            while entries.front().is_some_and(|e| e.index <= index) {
                                entries.pop_front();
                            }
                            if entries.front().is_some_and(|e| e.index != index + 1) {
                                entries.clear();
                            }
                        }
                    }
                }
                offset += used;
            }
            if is_last {
                active_len = offset as u64;
                active_file_len = buf.len() as u64;
                active_tail = buf[block_start(active_len) as usize..offset].to_vec();
            }
            segments.push(Segment {
                seq: *seq,
                path,
                max_entry_index,
            });
        }
        report.segments = segments.len();
        if let Some(gap) = unconfirmed_truncation {
            if snapshot.get_metadata().index < gap {
                return Err(StorageError::Inconsistent(format!(
                    "the log starts after index {gap} but no truncation record or snapshot covers it"
                )));
            }
        }

        // A snapshot is durable before the log records that refer to it, so after a crash the
        // snapshot may be ahead of the log; bring the log in line with it.
        let snap_meta = snapshot.get_metadata().clone();
        if snap_meta.index > truncated_index {
            let matches = entries
                .iter()
                .find(|e| e.index == snap_meta.index)
                .is_some_and(|e| e.term == snap_meta.term);
            if !matches {
                entries.clear();
            }
            while entries.front().is_some_and(|e| e.index <= snap_meta.index) {
                entries.pop_front();
            }
            truncated_index = snap_meta.index;
            truncated_term = snap_meta.term;
            // The addresses stay those last recorded: the node takes the snapshot's own.
            members.conf_index = snap_meta.index;
            members.conf_state = snap_meta.get_conf_state().clone();
        }
        hard_state.commit = hard_state.commit.max(snap_meta.index);
        let last_index = entries.back().map_or(truncated_index, |e| e.index);
        // Commit index records are written without fsync; a crash can leave it past the tail
        // only if the entries it covers were lost, which fsync-before-ack rules out.
        if hard_state.commit > last_index {
            return Err(StorageError::Inconsistent(format!(
                "commit index {} is past the last durable entry {last_index}",
                hard_state.commit
            )));
        }

        let active_path = segment_path(dir, last_seq);
        let active_preallocated = active_file_len >= options.segment_size_bytes;
        let (active, active_direct) =
            open_for_writing(&active_path, false, active_preallocated && direct_io_allowed(&options))
                .map_err(io_error(&active_path))?;
        let spare = Self::find_spare(dir, &options);
        let mut storage = DiskStorage {
            dir: dir.to_path_buf(),
            options,
            hard_state,
            members,
            truncated_index,
            truncated_term,
            entries,
            snapshot,
            segments,
            active: Arc::new(active),
            active_path: active_path.into(),
            active_len,
            active_preallocated,
            active_direct,
            tail_block: active_tail,
            writer: WalWriter::start()?,
            compactor: Compactor::start(dir).map_err(io_error(dir))?,
            covered: VecDeque::new(),
            spare,
            pending: Vec::new(),
            commit_unwritten: false,
        };
        storage.prepare_spare_if_missing();
        Ok((storage, report))
    }

    /// A spare left by an earlier run is kept if it is complete; anything else is removed.
    fn find_spare(dir: &Path, options: &StorageOptions) -> Spare {
        let path = dir.join(SPARE_NAME);
        match fs::metadata(&path) {
            Ok(meta) if options.preallocate && meta.len() == options.segment_size_bytes => Spare::Ready,
            Ok(_) => {
                let _ = fs::remove_file(&path);
                Spare::None
            }
            Err(_) => Spare::None,
        }
    }

    fn prepare_spare_if_missing(&mut self) {
        let due = match self.spare {
            Spare::None => true,
            Spare::Failed { retry_at } => Instant::now() >= retry_at,
            Spare::Preparing(_) | Spare::Ready => false,
        };
        if !self.options.preallocate || !due {
            return;
        }
        let (dir, size_bytes) = (self.dir.clone(), self.options.segment_size_bytes);
        let direct_io = direct_io_allowed(&self.options);
        let spawned = std::thread::Builder::new()
            .name("wal-prealloc".into())
            .spawn(move || prepare_spare(&dir, size_bytes, direct_io));
        match spawned {
            Ok(handle) => self.spare = Spare::Preparing(handle),
            Err(e) => tracing::warn!(error = %e, "cannot start the segment preallocation thread"),
        }
    }

    /// Whether a zero-filled spare is ready to become the active segment (never waits).
    fn spare_ready(&mut self) -> bool {
        if let Spare::Preparing(handle) = &self.spare {
            if !handle.is_finished() {
                return false;
            }
            let Spare::Preparing(handle) = std::mem::replace(&mut self.spare, Spare::None) else {
                unreachable!("matched above");
            };
            match handle.join() {
                Ok(Ok(())) => self.spare = Spare::Ready,
                Ok(Err(e)) => {
                    tracing::warn!(
                        error = %e, retry_ms = SPARE_RETRY.as_millis() as u64,
                        "preallocating a raft log segment failed; writes stop when the active segment is full"
                    );
                    // Give back whatever the attempt took: a full disk is the likely cause.
                    let _ = fs::remove_file(self.dir.join(SPARE_TMP_NAME));
                    self.spare = Spare::Failed {
                        retry_at: Instant::now() + SPARE_RETRY,
                    };
                }
                Err(_) => tracing::warn!("the segment preallocation thread panicked"),
            }
        }
        self.prepare_spare_if_missing();
        matches!(self.spare, Spare::Ready)
    }

    /// Whether `bytes` more of records can be appended without the file system allocating
    /// space: they fit in the rest of the preallocated active segment with room to spare, after
    /// rolling to a ready spare if they do not. A node stops taking writes when this says no,
    /// rather than fail an append half-way when the disk is full. Always yes for a plain
    /// segment, which grows as it is written, and for writes too big for any one segment.
    pub fn has_room_for(&mut self, bytes: u64) -> Result<bool, StorageError> {
        let segment_bytes = self.options.segment_size_bytes;
        let needed = bytes.saturating_add(RESERVED_ROOM_BYTES);
        if !self.active_preallocated || needed > segment_bytes / 2 {
            return Ok(true);
        }
        let used = self.active_len + self.pending.len() as u64;
        if used + needed <= segment_bytes {
            return Ok(true);
        }
        if !self.pending.is_empty() || !self.spare_ready() {
            return Ok(false);
        }
        self.roll_segment()?;
        Ok(self.active_len + needed <= segment_bytes)
    }

    fn create_fresh(dir: &Path, options: StorageOptions, members: Members) -> Result<DiskStorage, StorageError> {
        let path = segment_path(dir, 1);
        let active = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .map_err(io_error(&path))?;
        let spare = Self::find_spare(dir, &options);
        let mut storage = DiskStorage {
            dir: dir.to_path_buf(),
            options,
            hard_state: HardState::default(),
            members,
            truncated_index: 0,
            truncated_term: 0,
            entries: VecDeque::new(),
            snapshot: Snapshot::default(),
            segments: vec![Segment {
                seq: 1,
                path: path.clone(),
                max_entry_index: 0,
            }],
            active: Arc::new(active),
            active_path: path.into(),
            active_len: 0,
            active_preallocated: false,
            active_direct: false,
            tail_block: Vec::new(),
            writer: WalWriter::start()?,
            compactor: Compactor::start(dir).map_err(io_error(dir))?,
            covered: VecDeque::new(),
            spare,
            pending: Vec::new(),
            commit_unwritten: false,
        };
        storage.write_segment_header()?;
        sync_dir(dir)?;
        storage.prepare_spare_if_missing();
        Ok(storage)
    }

    /// Writes magic and the full raft state at the start of a new active segment, durably.
    fn write_segment_header(&mut self) -> Result<(), StorageError> {
        assert!(self.pending.is_empty(), "segment header after unwritten records");
        self.pending.extend_from_slice(WAL_MAGIC);
        encode_record(
            &mut self.pending,
            KIND_TRUNCATED,
            &encode_truncated(self.truncated_index, self.truncated_term),
        );
        encode_record(&mut self.pending, KIND_HARD_STATE, &encode_hard_state(&self.hard_state));
        encode_record(&mut self.pending, KIND_MEMBERS, &encode_members(&self.members));
        self.active_len = 0;
        self.tail_block.clear();
        self.submit_pending(true);
        self.writer.wait_all()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub fn conf_state(&self) -> &ConfState {
        &self.members.conf_state
    }

    /// The configuration in force, with its index and the members' addresses.
    pub fn members(&self) -> &Members {
        &self.members
    }

    /// The latest durable snapshot (default/empty if none).
    pub fn latest_snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    pub fn first_entry_index(&self) -> u64 {
        self.truncated_index + 1
    }

    pub fn last_entry_index(&self) -> u64 {
        self.entries.back().map_or(self.truncated_index, |e| e.index)
    }

    /// Appends entries, replacing any conflicting suffix. Durable after `persist(true)`.
    pub fn append(&mut self, new: &[Entry]) -> Result<(), StorageError> {
        let Some(first) = new.first() else {
            return Ok(());
        };
        assert!(
            first.index > self.truncated_index,
            "append at {} would overwrite compacted entries (truncated at {})",
            first.index,
            self.truncated_index
        );
        assert!(
            first.index <= self.last_entry_index() + 1,
            "append at {} leaves a gap after {}",
            first.index,
            self.last_entry_index()
        );
        while self.entries.back().is_some_and(|e| e.index >= first.index) {
            self.entries.pop_back();
        }
        self.entries.extend(new.iter().cloned());
        let last = new.last().expect("non-empty").index;
        let active = self.segments.last_mut().expect("active segment");
        active.max_entry_index = active.max_entry_index.max(last);
        encode_record(&mut self.pending, KIND_ENTRIES, &encode_entries(new));
        Ok(())
    }

    pub fn set_hard_state(&mut self, hs: &HardState) {
        assert!(
            hs.term >= self.hard_state.term,
            "term went backward: {} -> {}",
            self.hard_state.term,
            hs.term
        );
        if hs.term == self.hard_state.term && hs.vote == self.hard_state.vote {
            self.set_commit(hs.commit);
            return;
        }
        self.hard_state = hs.clone();
        self.commit_unwritten = false;
        encode_record(&mut self.pending, KIND_HARD_STATE, &encode_hard_state(hs));
    }

    pub fn set_commit(&mut self, commit: u64) {
        assert!(commit >= self.hard_state.commit, "commit index went backward");
        if commit != self.hard_state.commit {
            self.hard_state.commit = commit;
            self.commit_unwritten = true;
        }
    }

    /// Records a new configuration; durable with the next persist.
    pub fn set_members(&mut self, members: Members) {
        assert!(
            members.conf_index >= self.members.conf_index,
            "configuration index went backward: {} after {}",
            members.conf_index,
            self.members.conf_index
        );
        encode_record(&mut self.pending, KIND_MEMBERS, &encode_members(&members));
        self.members = members;
    }

    /// Drops the write buffers a burst grew, when no write is waiting to be written: the
    /// writer's spare buffers and the room of the pending one, which otherwise stay at the size
    /// of the busiest moment (about 14 MiB after a pipelined load).
    pub fn release_idle_buffers(&mut self) {
        if self.pending.is_empty() {
            self.writer.drop_spare_buffers();
            self.pending = Vec::new();
        }
    }

    /// Whether records that must become durable are waiting to be written.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes pending records, with the latest commit index, in one write; with `sync`, also
    /// fsyncs so they survive a crash. Returns once they are written.
    pub fn persist(&mut self, sync: bool) -> Result<(), StorageError> {
        self.start_persist(sync)?;
        self.writer.wait_all()
    }

    /// `persist` without waiting: the write is queued for the writer thread. Returns its sequence
    /// number (or the last one submitted, if there was nothing to write), durable once
    /// `durable_seq` reaches it. Writes become durable in the order they are submitted.
    pub fn start_persist(&mut self, sync: bool) -> Result<u64, StorageError> {
        if self.commit_unwritten && (sync || !self.pending.is_empty()) {
            encode_record(&mut self.pending, KIND_HARD_STATE, &encode_hard_state(&self.hard_state));
            self.commit_unwritten = false;
        }
        let seq = if !self.pending.is_empty() || (sync && !self.active_direct) {
            self.submit_pending(sync)
        } else {
            self.writer.submitted_seq()
        };
        if self.active_len >= self.options.segment_size_bytes || (!self.active_preallocated && self.spare_ready()) {
            self.roll_segment()?;
        }
        Ok(seq)
    }

    /// The sequence number of the last write `start_persist` queued.
    pub fn submitted_seq(&self) -> u64 {
        self.writer.submitted_seq()
    }

    /// Every write up to this sequence number is durable. Does not wait. An error is a write that
    /// failed: what the log holds past it is unknown.
    pub fn durable_seq(&mut self) -> Result<u64, StorageError> {
        let durable = self.writer.durable_seq()?;
        while self.covered.front().is_some_and(|(seq, _)| *seq <= durable) {
            let (_, paths) = self.covered.pop_front().expect("checked");
            self.compactor.remove_segments(paths);
        }
        Ok(durable)
    }

    /// Woken whenever queued writes become durable.
    pub fn write_notify(&self) -> Arc<tokio::sync::Notify> {
        self.writer.notify()
    }

    /// How long each group of writes that completed since the last call took to become durable.
    pub fn take_write_times(&mut self) -> Vec<Duration> {
        self.writer.take_write_times()
    }

    /// Queues `pending` for the active segment (and, with `sync`, an fdatasync of a segment not
    /// written with `O_DSYNC`). In a preallocated segment the write covers whole blocks: it starts
    /// with the tail block's bytes (from memory) and ends with the zeros already on disk. A write
    /// ending mid-block would make the kernel read that block first whenever it has left the page
    /// cache, a synchronous disk read inside every append. The writer thread writes in order, so a
    /// later write of the same tail block lands after this one.
    fn submit_pending(&mut self, sync: bool) -> u64 {
        let start = self.active_len;
        let end = start + self.pending.len() as u64;
        let (write_buf, len, offset) = if self.active_preallocated {
            let first_block = block_start(start);
            assert_eq!(
                self.tail_block.len() as u64,
                start - first_block,
                "tail block out of step"
            );
            // Direct I/O needs whole blocks; through the page cache, the last block may be cut at
            // a segment size that is not a multiple of it.
            let padded_end = end.next_multiple_of(WRITE_BLOCK_BYTES);
            let write_end = if self.active_direct {
                padded_end
            } else {
                padded_end.min(self.options.segment_size_bytes.max(end))
            };
            let len = (write_end - first_block) as usize;
            let mut write_buf = self.writer.buffer();
            let buf = write_buf.aligned(len);
            let (tail, rest) = buf.split_at_mut(self.tail_block.len());
            let (records, padding) = rest.split_at_mut(self.pending.len());
            tail.copy_from_slice(&self.tail_block);
            records.copy_from_slice(&self.pending);
            padding.fill(0);
            let tail_from = (block_start(end) - first_block) as usize;
            self.tail_block.clear();
            self.tail_block
                .extend_from_slice(&buf[tail_from..(end - first_block) as usize]);
            (write_buf, len, first_block)
        } else {
            let len = self.pending.len();
            let mut write_buf = self.writer.buffer();
            write_buf.aligned(len).copy_from_slice(&self.pending);
            let tail_from = block_start(end).max(start);
            if tail_from > start {
                self.tail_block.clear();
            }
            self.tail_block
                .extend_from_slice(&self.pending[(tail_from - start) as usize..]);
            (write_buf, len, start)
        };
        self.active_len = end;
        self.pending.clear();
        let sync = sync && !self.active_direct;
        self.writer
            .submit(&self.active, &self.active_path, write_buf, len, offset, sync)
    }

    /// Starts the next segment: the zero-filled spare if one is ready, else a plain file (which is
    /// rolled again as soon as a spare is ready).
    fn roll_segment(&mut self) -> Result<(), StorageError> {
        assert!(self.pending.is_empty(), "roll with unwritten records");
        self.writer.wait_all()?;
        self.active.sync_data().map_err(io_error(&self.dir))?;
        let seq = self.segments.last().expect("active segment").seq + 1;
        let path = segment_path(&self.dir, seq);
        let preallocated = self.spare_ready();
        if preallocated {
            let spare = self.dir.join(SPARE_NAME);
            fs::rename(&spare, &path).map_err(io_error(&spare))?;
            self.spare = Spare::None;
        }
        let (active, active_direct) = if preallocated {
            open_for_writing(&path, false, direct_io_allowed(&self.options)).map_err(io_error(&path))?
        } else {
            let file = OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(&path)
                .map_err(io_error(&path))?;
            (file, false)
        };
        self.active = Arc::new(active);
        self.active_path = path.as_path().into();
        self.active_direct = active_direct;
        self.active_preallocated = preallocated;
        self.segments.push(Segment {
            seq,
            path,
            max_entry_index: 0,
        });
        self.write_segment_header()?;
        sync_dir(&self.dir)?;
        self.prepare_spare_if_missing();
        Ok(())
    }

    /// Installs a snapshot received from the leader: durable file first, then the log is reset to it.
    /// Installs a leader's snapshot; `addresses` are the members' it carries.
    pub fn apply_snapshot(&mut self, snapshot: Snapshot, addresses: Addresses) -> Result<(), StorageError> {
        let meta = snapshot.get_metadata().clone();
        assert!(
            meta.index >= self.truncated_index,
            "snapshot at {} is older than the compaction point {}",
            meta.index,
            self.truncated_index
        );
        write_snapshot_file(&self.dir, &snapshot)?;
        self.entries.clear();
        self.truncated_index = meta.index;
        self.truncated_term = meta.term;
        encode_record(
            &mut self.pending,
            KIND_TRUNCATED,
            &encode_truncated(meta.index, meta.term),
        );
        let mut hs = self.hard_state.clone();
        hs.term = hs.term.max(meta.term);
        hs.commit = hs.commit.max(meta.index);
        self.set_hard_state(&hs);
        self.set_members(Members {
            conf_index: meta.index,
            conf_state: meta.get_conf_state().clone(),
            addresses,
        });
        self.persist(true)?;
        self.replace_snapshot(snapshot);
        self.delete_covered_segments(self.writer.submitted_seq())
    }

    /// Adopts a snapshot this node wrote itself (already durable via `write_snapshot_file`).
    pub fn adopt_local_snapshot(&mut self, snapshot: Snapshot) {
        assert!(
            snapshot.get_metadata().index >= self.snapshot.get_metadata().index,
            "snapshot index went backward"
        );
        self.replace_snapshot(snapshot);
    }

    fn replace_snapshot(&mut self, snapshot: Snapshot) {
        let old_index = self.snapshot.get_metadata().index;
        let new_index = snapshot.get_metadata().index;
        self.snapshot = snapshot;
        if old_index != new_index && old_index != 0 {
            self.compactor.remove_snapshot(snapshot_path(&self.dir, old_index));
        }
    }

    /// Discards entries before `compact_index` (which becomes the first index). Only entries covered
    /// by the latest snapshot may be discarded.
    pub fn compact(&mut self, compact_index: u64) -> Result<(), StorageError> {
        if compact_index <= self.first_entry_index() {
            return Ok(());
        }
        let snapshot_index = self.snapshot.get_metadata().index;
        assert!(
            compact_index <= snapshot_index + 1,
            "compaction to {compact_index} would drop entries not covered by snapshot {snapshot_index}"
        );
        assert!(compact_index <= self.last_entry_index() + 1);
        let new_truncated = compact_index - 1;
        let term = raft::Storage::term(self, new_truncated).expect("term of a retained entry");
        let compacted = self.entries.partition_point(|e| e.index <= new_truncated);
        self.compactor.free(self.entries.drain(..compacted).collect());
        self.truncated_index = new_truncated;
        self.truncated_term = term;
        encode_record(
            &mut self.pending,
            KIND_TRUNCATED,
            &encode_truncated(new_truncated, term),
        );
        // Not waited for: the segments it covers are deleted once it is durable.
        let seq = self.start_persist(true)?;
        self.delete_covered_segments(seq)
    }

    /// Deletes the oldest segments whose entries are all at or below the truncation point, on
    /// the compactor's thread, once the write `truncation_seq` (the truncation record's) is
    /// durable. The active segment always stays; each segment header restates the full raft
    /// state.
    fn delete_covered_segments(&mut self, truncation_seq: u64) -> Result<(), StorageError> {
        let covered = self
            .segments
            .iter()
            .take(self.segments.len() - 1)
            .take_while(|segment| segment.max_entry_index <= self.truncated_index)
            .count();
        if covered > 0 {
            let paths = self.segments.drain(..covered).map(|segment| segment.path).collect();
            self.covered.push_back((truncation_seq, paths));
        }
        self.durable_seq().map(|_| ())
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

impl Drop for DiskStorage {
    /// The spare's preparation ends with the storage, so a reopened directory never sees a
    /// thread of the old instance still writing.
    fn drop(&mut self) {
        if let Spare::Preparing(handle) = std::mem::replace(&mut self.spare, Spare::None) {
            let _ = handle.join();
        }
    }
}

impl raft::Storage for DiskStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.members.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.truncated_index {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        assert!(
            high <= self.last_entry_index() + 1,
            "entries up to {high} requested, last is {}",
            self.last_entry_index()
        );
        let offset = self.truncated_index + 1;
        let (lo, hi) = ((low - offset) as usize, (high - offset) as usize);
        let max_size = max_size.into();
        let mut out = Vec::with_capacity(hi - lo);
        let mut size = 0u64;
        for e in self.entries.range(lo..hi) {
            size += e.compute_size() as u64;
            if !out.is_empty() && max_size.is_some_and(|max| size > max) {
                break;
            }
            out.push(e.clone());
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.truncated_index {
            return Ok(self.truncated_term);
        }
        if idx < self.truncated_index {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        if idx > self.last_entry_index() {
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        Ok(self.entries[(idx - self.truncated_index - 1) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first_entry_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_entry_index())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let meta = self.snapshot.get_metadata();
        // A node the snapshot's configuration does not name would not install it: it is a new
        // member, and the leader takes a newer snapshot for it.
        let names_to = crate::membership::member_ids(meta.get_conf_state()).contains(&to);
        if meta.index < request_index.max(1) || !names_to {
            return Err(raft::Error::Store(raft::StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage;
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn entry(index: u64, term: u64, data: &str) -> Entry {
        Entry {
            index,
            term,
            data: Bytes::copy_from_slice(data.as_bytes()),
            ..Default::default()
        }
    }

    /// Plain segments: these tests place bytes in known files, which a roll to a spare that a
    /// background thread finished at some moment would move.
    fn plain(segment_size_bytes: u64) -> StorageOptions {
        StorageOptions {
            segment_size_bytes,
            preallocate: false,
            direct_io: false,
        }
    }

    fn open(dir: &Path) -> (DiskStorage, RecoveryReport) {
        DiskStorage::open(dir, &[1, 2, 3], plain(64 * 1024 * 1024)).unwrap()
    }

    fn snapshot_at(index: u64, term: u64, data: &str) -> Snapshot {
        let mut s = Snapshot::default();
        s.mut_metadata().index = index;
        s.mut_metadata().term = term;
        s.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        s.data = Bytes::copy_from_slice(data.as_bytes());
        s
    }

    #[test]
    fn a_file_of_another_format_version_is_refused_as_such() {
        let refused = decode_segment(b"CHWAL003 and then records").unwrap_err();
        assert_eq!(
            refused,
            DecodeError::UnsupportedVersion {
                what: "raft log segment",
                found: 3,
                supported: 2
            }
        );
        assert!(refused.to_string().contains("upgrade"), "{refused}");
        assert_eq!(decode_segment(b"NOTAWAL1 records").unwrap_err(), DecodeError::BadMagic);
        assert_eq!(decode_segment(b"CHW").unwrap_err(), DecodeError::BadMagic);
        let snapshot = decode_snapshot(b"CHSNP007 with a body and a crc").unwrap_err();
        assert!(
            snapshot
                .to_string()
                .starts_with("raft snapshot file version 7; this build reads version 1"),
            "{snapshot}"
        );
    }

    #[test]
    fn entries_and_hard_state_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, report) = open(dir.path());
            assert!(report.fresh);
            s.append(&[entry(1, 1, "a"), entry(2, 1, "b"), entry(3, 1, "c")])
                .unwrap();
            // A conflicting suffix from a new leader replaces entries 3.. .
            s.append(&[entry(3, 2, "c2"), entry(4, 2, "d")]).unwrap();
            let hs = HardState {
                term: 2,
                vote: 3,
                commit: 4,
                ..Default::default()
            };
            s.set_hard_state(&hs);
            s.persist(true).unwrap();
        }
        let (s, report) = open(dir.path());
        assert!(!report.fresh);
        assert_eq!(s.initial_state().unwrap().hard_state.vote, 3);
        assert_eq!(s.initial_state().unwrap().conf_state.voters, vec![1, 2, 3]);
        assert_eq!((s.first_entry_index(), s.last_entry_index()), (1, 4));
        let es = s.entries(1, 5, None, GetEntriesContext::empty(false)).unwrap();
        let data: Vec<_> = es.iter().map(|e| e.data.clone()).collect();
        assert_eq!(data, vec!["a", "b", "c2", "d"]);
        assert_eq!(s.term(3).unwrap(), 2);
    }

    #[test]
    fn the_membership_survives_reopen_and_segment_rolls_and_old_segments_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let grown = Members {
            conf_index: 7,
            conf_state: ConfState {
                voters: vec![1, 2, 3],
                learners: vec![4],
                ..Default::default()
            },
            addresses: (1..=4)
                .map(|id| (id, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7000 + id as u16).into()))
                .collect(),
        };
        {
            let (mut s, _) = DiskStorage::open(dir.path(), &[1, 2, 3], plain(4096)).unwrap();
            assert_eq!(s.members().conf_index, 0);
            s.set_members(grown.clone());
            // Enough entries to roll to new segments: each new one restates the membership.
            for index in 1..=64 {
                s.append(&[entry(index, 1, &"x".repeat(200))]).unwrap();
                s.persist(true).unwrap();
            }
            assert!(s.segments.len() > 3, "segments rolled");
            s.compact(1).unwrap();
        }
        let (s, _) = DiskStorage::open(dir.path(), &[1, 2, 3], plain(4096)).unwrap();
        assert_eq!(*s.members(), grown);
        assert_eq!(s.initial_state().unwrap().conf_state.learners, vec![4]);

        // A segment written before membership records: CHWAL001 with a bare ConfState.
        let old = tempfile::tempdir().unwrap();
        let mut bytes = WAL_MAGIC_V1.to_vec();
        let cs = ConfState {
            voters: vec![1, 2],
            ..Default::default()
        };
        encode_record(&mut bytes, KIND_CONF_STATE, &encode_conf_state(&cs));
        std::fs::write(segment_path(old.path(), 1), &bytes).unwrap();
        let (s, _) = DiskStorage::open(old.path(), &[9], plain(4096)).unwrap();
        assert_eq!(s.members().conf_state.voters, vec![1, 2]);
        assert_eq!(s.members().conf_index, 0);
        assert!(
            s.members().addresses.is_empty(),
            "the node fills them in from its configuration"
        );
    }

    #[test]
    fn appends_queued_without_waiting_become_durable_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let direct_io = direct_io_works(dir.path());
        let value = |index: u64| format!("{index:064}");
        let mut last_seq = 0;
        {
            // Small preallocated segments: queued writes share tail blocks and cross rolls.
            let (mut s, _) = open_preallocated(dir.path(), 8192, direct_io);
            for index in 1..=400u64 {
                s.append(&[entry(index, 1, &value(index))]).unwrap();
                let seq = s.start_persist(true).unwrap();
                assert!(seq > last_seq, "write sequence numbers only grow");
                last_seq = seq;
                assert!(s.durable_seq().unwrap() <= s.submitted_seq());
            }
            // A conflicting suffix queued behind the writes it replaces.
            s.append(&[entry(400, 2, "replaced")]).unwrap();
            last_seq = s.start_persist(true).unwrap();
            s.persist(true).unwrap();
            assert!(s.durable_seq().unwrap() >= last_seq);
            assert!(s.segment_count() > 2, "the test crosses segment rolls");
        }
        let (s, _) = open(dir.path());
        assert_eq!((s.first_entry_index(), s.last_entry_index()), (1, 400));
        let es = s.entries(1, 401, None, GetEntriesContext::empty(false)).unwrap();
        for (e, index) in es.iter().zip(1u64..) {
            let want = if index == 400 {
                "replaced".to_string()
            } else {
                value(index)
            };
            assert_eq!(e.data, want.as_bytes());
        }
        assert_eq!(s.term(400).unwrap(), 2);
    }

    #[test]
    fn a_burst_s_write_buffers_are_given_back_and_writing_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = open(dir.path());
        let big = "x".repeat(256 * 1024);
        for index in 1..=8u64 {
            s.append(&[entry(index, 1, &big)]).unwrap();
            s.persist(true).unwrap();
        }
        assert!(s.pending.capacity() >= big.len(), "the pending buffer grew");
        assert!(!s.writer.spare_buffers_empty(), "written buffers are kept for reuse");
        s.release_idle_buffers();
        assert_eq!(s.pending.capacity(), 0);
        assert!(s.writer.spare_buffers_empty());
        s.append(&[entry(9, 1, "after")]).unwrap();
        s.persist(true).unwrap();
        drop(s);
        let (s, _) = open(dir.path());
        assert_eq!(s.last_entry_index(), 9);
        let es = s.entries(8, 10, None, GetEntriesContext::empty(false)).unwrap();
        assert_eq!((es[0].data.len(), &es[1].data[..]), (big.len(), &b"after"[..]));
    }

    #[test]
    fn a_torn_tail_is_zeroed_and_earlier_records_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 1);
        {
            let (mut s, _) = open(dir.path());
            s.append(&[entry(1, 1, "a")]).unwrap();
            s.persist(true).unwrap();
            s.append(&[entry(2, 1, "b")]).unwrap();
            s.persist(true).unwrap();
        }
        let full = fs::read(&path).unwrap();
        // Cut the last record in half, as a crash mid-write would.
        fs::write(&path, &full[..full.len() - 5]).unwrap();
        let (s, report) = open(dir.path());
        assert!(report.torn_tail_bytes > 0);
        assert_eq!(s.last_entry_index(), 1);
        // The truncation itself is durable: reopening finds a clean file.
        let (_, report) = open(dir.path());
        assert_eq!(report.torn_tail_bytes, 0);
    }

    #[test]
    fn flipped_bit_in_tail_record_is_detected_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 1);
        {
            let (mut s, _) = open(dir.path());
            s.append(&[entry(1, 1, "aaaa")]).unwrap();
            s.persist(true).unwrap();
        }
        let mut bytes = fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 2] ^= 0x01;
        fs::write(&path, &bytes).unwrap();
        let (s, report) = open(dir.path());
        assert!(report.torn_tail_bytes > 0);
        assert_eq!(s.last_entry_index(), 0, "a corrupt entry must never be returned");
    }

    #[test]
    fn a_flipped_bit_before_valid_records_of_the_last_segment_is_corruption_not_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, _) = open(dir.path());
            for i in 1..=20 {
                s.append(&[entry(i, 1, "some data")]).unwrap();
                s.persist(true).unwrap();
            }
        }
        let path = segment_path(dir.path(), 1);
        let mut bytes = fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x04;
        fs::write(&path, &bytes).unwrap();
        match DiskStorage::open(dir.path(), &[1], plain(64 * 1024 * 1024)) {
            Err(StorageError::Corrupt { .. }) => {}
            Err(other) => panic!("wrong error: {other}"),
            Ok(_) => panic!("a corrupt log opened"),
        }
        assert_eq!(fs::read(&path).unwrap(), bytes, "nothing was truncated");
    }

    #[test]
    fn corruption_in_an_older_segment_fails_loudly() {
        let dir = tempfile::tempdir().unwrap();
        let options = plain(200);
        {
            let (mut s, _) = DiskStorage::open(dir.path(), &[1], options.clone()).unwrap();
            for i in 1..=20 {
                s.append(&[entry(i, 1, "0123456789012345678901234567890123456789")])
                    .unwrap();
                s.persist(true).unwrap();
            }
            assert!(s.segment_count() > 2);
        }
        let first = segment_path(dir.path(), 1);
        let mut bytes = fs::read(&first).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 0x40;
        fs::write(&first, &bytes).unwrap();
        match DiskStorage::open(dir.path(), &[1], options) {
            Err(StorageError::Corrupt { .. }) => {}
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("corruption in a sealed segment was accepted"),
        }
    }

    #[test]
    fn a_newer_snapshot_replaces_the_older_ones_file() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, _) = DiskStorage::open(dir.path(), &[1], plain(300)).unwrap();
            for i in 1..=10 {
                s.append(&[entry(i, 1, "x")]).unwrap();
            }
            s.persist(true).unwrap();
            s.set_commit(10);
            for index in [5, 8] {
                let snap = snapshot_at(index, 1, "state");
                write_snapshot_file(dir.path(), &snap).unwrap();
                s.adopt_local_snapshot(snap);
                s.compact(index).unwrap();
            }
        }
        assert!(
            !snapshot_path(dir.path(), 5).exists(),
            "the replaced snapshot's file is deleted"
        );
        let (s, report) = DiskStorage::open(dir.path(), &[1], plain(300)).unwrap();
        assert_eq!(report.snapshot_index, 8);
        assert_eq!(s.first_entry_index(), 9);
    }

    #[test]
    fn compaction_deletes_covered_segments_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let options = plain(300);
        let (after, saved);
        {
            let (mut s, _) = DiskStorage::open(dir.path(), &[1], options.clone()).unwrap();
            for i in 1..=40 {
                s.append(&[entry(i, 1, "0123456789012345678901234567890123456789")])
                    .unwrap();
                s.persist(true).unwrap();
            }
            s.set_commit(40);
            let before = s.segment_count();
            saved = segment_file_bytes(dir.path());
            let snap = snapshot_at(30, 1, "state@30");
            write_snapshot_file(dir.path(), &snap).unwrap();
            s.adopt_local_snapshot(snap);
            s.compact(26).unwrap();
            assert!(s.segment_count() < before);
            assert_eq!(s.first_entry_index(), 26);
            assert_eq!(s.term(25).unwrap(), 1);
            assert!(s.term(24).is_err());
            // The covered segments go once the truncation record is durable (and the compactor
            // finishes by the time the storage drops).
            s.persist(true).unwrap();
            s.durable_seq().unwrap();
            after = s.segment_count();
        }
        assert_eq!(
            segment_file_bytes(dir.path()).len(),
            after,
            "covered segment files are deleted"
        );

        let reopen = |options: StorageOptions| {
            let (s, report) = DiskStorage::open(dir.path(), &[1], options).unwrap();
            assert_eq!(report.snapshot_index, 30);
            // The snapshot is newer than the compaction point, so recovery starts the log after it.
            assert_eq!(s.first_entry_index(), 31);
            assert_eq!(s.last_entry_index(), 40);
            assert_eq!(s.latest_snapshot().data, "state@30");
        };
        reopen(options.clone());
        // A crash before the deletions: the covered segments are read past.
        for (path, bytes) in saved {
            if !path.exists() {
                fs::write(path, bytes).unwrap();
            }
        }
        reopen(options);
    }

    /// The raft log's segment files in `dir` and their bytes.
    fn segment_file_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
            .map(|path| {
                let bytes = fs::read(&path).unwrap();
                (path, bytes)
            })
            .collect()
    }

    #[test]
    fn installed_snapshot_replaces_the_log() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, _) = open(dir.path());
            s.append(&[entry(1, 1, "a"), entry(2, 1, "b")]).unwrap();
            s.persist(true).unwrap();
            s.apply_snapshot(snapshot_at(100, 3, "state@100"), Addresses::new())
                .unwrap();
            assert_eq!(s.last_entry_index(), 100);
            s.append(&[entry(101, 3, "x")]).unwrap();
            s.persist(true).unwrap();
        }
        let (s, _) = open(dir.path());
        assert_eq!((s.first_entry_index(), s.last_entry_index()), (101, 101));
        assert_eq!(s.hard_state().commit, 100);
        assert_eq!(s.snapshot(0, 2).unwrap().get_metadata().index, 100);
    }

    #[test]
    fn corrupt_snapshot_file_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, _) = open(dir.path());
            s.apply_snapshot(snapshot_at(5, 1, "state"), Addresses::new()).unwrap();
        }
        let path = snapshot_path(dir.path(), 5);
        let mut bytes = fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            DiskStorage::open(dir.path(), &[1, 2, 3], plain(64 * 1024 * 1024)),
            Err(StorageError::Corrupt { .. })
        ));
    }

    /// Opens with preallocation and waits until the spare is ready, so the first persist rolls to
    /// a zero-filled segment.
    fn open_preallocated(dir: &Path, segment_size_bytes: u64, direct_io: bool) -> (DiskStorage, RecoveryReport) {
        let options = StorageOptions {
            segment_size_bytes,
            preallocate: true,
            direct_io,
        };
        let (mut s, report) = DiskStorage::open(dir, &[1], options).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !s.spare_ready() {
            assert!(std::time::Instant::now() < deadline, "spare segment never became ready");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        (s, report)
    }

    /// Whether the file system under `dir` accepts direct I/O (tmpfs, for one, does not).
    fn direct_io_works(dir: &Path) -> bool {
        let probe = dir.join("direct-io-probe");
        let works = open_for_writing(&probe, true, true).unwrap().1;
        fs::remove_file(probe).unwrap();
        works
    }

    #[test]
    fn room_runs_out_without_a_spare_and_returns_with_one() {
        let dir = tempfile::tempdir().unwrap();
        let size = 256 * 1024;
        let (mut s, _) = open_preallocated(dir.path(), size, false);
        let data = "x".repeat(1000);
        let append = |s: &mut DiskStorage| {
            let index = s.last_entry_index() + 1;
            s.append(&[entry(index, 1, &data)]).unwrap();
            s.persist(true).unwrap();
        };
        // With a spare at hand the log rolls before a write would grow a segment.
        for _ in 0..600 {
            while !s.spare_ready() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(s.has_room_for(1100).unwrap());
            append(&mut s);
        }
        assert!(s.segment_count() > 2);
        for segment in &s.segments[1..] {
            assert_eq!(
                fs::metadata(&segment.path).unwrap().len(),
                size,
                "a preallocated segment grew"
            );
        }
        // No spare (as when preallocating fails on a full disk): room runs out with the segment.
        fs::remove_file(dir.path().join(SPARE_NAME)).unwrap();
        s.spare = Spare::Failed {
            retry_at: Instant::now() + Duration::from_secs(3600),
        };
        let segments = s.segment_count();
        while s.has_room_for(1100).unwrap() {
            append(&mut s);
        }
        assert_eq!(s.segment_count(), segments, "no roll without a spare");
        assert!(s.active_len + 1100 + RESERVED_ROOM_BYTES > size);
        assert!(s.active_len + RESERVED_ROOM_BYTES / 2 < size, "the reserve is left");
        assert_eq!(fs::metadata(&s.segments.last().unwrap().path).unwrap().len(), size);
        // The next attempt to preallocate succeeds: room again, in a new segment.
        s.spare = Spare::Failed {
            retry_at: Instant::now(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !s.has_room_for(1100).unwrap() {
            assert!(Instant::now() < deadline, "room never came back");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(s.segment_count(), segments + 1);
        let last = s.last_entry_index();
        append(&mut s);
        drop(s);
        let (s, report) = open_preallocated(dir.path(), size, false);
        assert_eq!(report.torn_tail_bytes, 0);
        assert_eq!(s.last_entry_index(), last + 1);
    }

    #[test]
    fn preallocated_segments_keep_their_size_and_give_back_every_record() {
        for direct_io in [false, true] {
            preallocated_segments_round_trip(direct_io);
        }
    }

    fn preallocated_segments_round_trip(direct_io: bool) {
        let dir = tempfile::tempdir().unwrap();
        let size = 4096;
        let expect_direct = direct_io && direct_io_works(dir.path());
        {
            let (mut s, _) = open_preallocated(dir.path(), size, direct_io);
            for i in 1..=200 {
                s.append(&[entry(i, 1, "0123456789012345678901234567890123456789")])
                    .unwrap();
                s.persist(true).unwrap();
                // Each roll starts the next spare; wait for it so every roll finds one ready.
                while !s.spare_ready() {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            s.set_commit(90);
            s.persist(true).unwrap();
            assert!(s.segment_count() > 3);
            // Every segment after the first plain one was zero-filled to its full size up front.
            for segment in &s.segments[1..s.segments.len()] {
                assert!(fs::metadata(&segment.path).unwrap().len() >= size);
            }
            assert!(s.active_preallocated);
            assert_eq!(s.active_direct, expect_direct);
        }
        let (s, report) = open_preallocated(dir.path(), size, direct_io);
        assert_eq!(report.torn_tail_bytes, 0, "zeros after the records are no torn tail");
        assert_eq!((s.first_entry_index(), s.last_entry_index()), (1, 200));
        assert_eq!(s.hard_state().commit, 90);
        let es = s.entries(1, 201, None, GetEntriesContext::empty(false)).unwrap();
        assert!(es.iter().enumerate().all(|(i, e)| e.index == i as u64 + 1));
    }

    #[test]
    fn a_roll_cut_short_before_its_header_leaves_a_log_that_opens_and_keeps_writing() {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 * 1024;
        let next_path = {
            let (mut s, _) = open_preallocated(dir.path(), size, false);
            for i in 1..=3 {
                s.append(&[entry(i, 1, "payload")]).unwrap();
                s.persist(true).unwrap();
            }
            segment_path(dir.path(), s.segments.last().unwrap().seq + 1)
        };
        // A crash right after the spare was renamed into place (all zeros), and, in a second
        // crash, right after a plain segment was created (empty).
        for (last, unstarted) in [(3, vec![0u8; size as usize]), (4, Vec::new())] {
            fs::write(&next_path, &unstarted).unwrap();
            let (mut s, report) = open_preallocated(dir.path(), size, false);
            assert!(!next_path.exists(), "the segment that never started is removed");
            assert_eq!((s.first_entry_index(), s.last_entry_index()), (1, last));
            assert_eq!(report.torn_tail_bytes, 0);
            s.append(&[entry(last + 1, 1, "after")]).unwrap();
            s.persist(true).unwrap();
        }
        let (s, _) = open_preallocated(dir.path(), size, false);
        let after = s.entries(4, 6, None, GetEntriesContext::empty(false)).unwrap();
        assert!(after.iter().all(|e| e.data == "after") && after.len() == 2);
        drop(s);
        // A last segment with anything but zeros before its magic is still corruption.
        fs::write(&next_path, b"garbage").unwrap();
        assert!(matches!(
            DiskStorage::open(dir.path(), &[1], plain(size)),
            Err(StorageError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_torn_record_in_a_preallocated_segment_is_zeroed_and_later_writes_survive() {
        for direct_io in [false, true] {
            torn_record_in_preallocated_segment(direct_io);
        }
    }

    fn torn_record_in_preallocated_segment(direct_io: bool) {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 * 1024;
        let active_path = {
            let (mut s, _) = open_preallocated(dir.path(), size, direct_io);
            for i in 1..=3 {
                s.append(&[entry(i, 1, "payload")]).unwrap();
                s.persist(true).unwrap();
            }
            assert!(s.active_preallocated);
            s.segments.last().unwrap().path.clone()
        };
        let mut bytes = fs::read(&active_path).unwrap();
        let records_end = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
        // A crash mid-write: the last record's final bytes never reached the disk.
        bytes[records_end - 6..records_end].fill(0);
        fs::write(&active_path, &bytes).unwrap();
        {
            let (mut s, report) = open_preallocated(dir.path(), size, direct_io);
            assert!(report.torn_tail_bytes > 0);
            assert_eq!(s.last_entry_index(), 2, "the torn entry is gone, the earlier ones stay");
            assert_eq!(
                fs::metadata(&active_path).unwrap().len(),
                size,
                "the file keeps its size"
            );
            s.append(&[entry(3, 2, "rewritten"), entry(4, 2, "new")]).unwrap();
            s.persist(true).unwrap();
        }
        let (s, report) = open_preallocated(dir.path(), size, direct_io);
        assert_eq!(report.torn_tail_bytes, 0);
        let es = s.entries(1, 5, None, GetEntriesContext::empty(false)).unwrap();
        let data: Vec<_> = es.iter().map(|e| e.data.clone()).collect();
        assert_eq!(data, vec!["payload", "payload", "rewritten", "new"]);
    }

    #[test]
    fn an_unfinished_spare_is_discarded_and_prepared_again() {
        let dir = tempfile::tempdir().unwrap();
        drop(open_preallocated(dir.path(), 8192, true));
        // A spare cut short (a crash while it was being written, or a size setting changed).
        fs::write(dir.path().join(SPARE_NAME), [0u8; 100]).unwrap();
        fs::write(dir.path().join(SPARE_TMP_NAME), [0u8; 100]).unwrap();
        let (_s, _) = open_preallocated(dir.path(), 8192, true);
        assert!(!dir.path().join(SPARE_TMP_NAME).exists());
        assert_eq!(fs::metadata(dir.path().join(SPARE_NAME)).unwrap().len(), 8192);
    }

    #[test]
    fn garbage_records_never_panic_the_reader() {
        let mut state = 0x1234_5678_9abc_def0u64;
        for _ in 0..5000 {
            let mut buf = Vec::new();
            let kind = (state % 6) as u8;
            let payload: Vec<u8> = (0..(state % 64)).map(|i| (state >> (i % 56)) as u8).collect();
            encode_record(&mut buf, kind, &payload);
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let _ = read_record(&buf);
            if !buf.is_empty() {
                let i = (state as usize) % buf.len();
                buf[i] ^= 0x10;
            }
            let _ = read_record(&buf);
        }
    }
}
